"""Shared fixtures: the real LLVM tools the differential tests compare against.

A missing tool is a test *failure*, never a skip: the README's set-up command installs them all.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

LLVM19_BIN = Path(os.environ.get("OFFLOAD_LLVM19_BIN", "/usr/lib/llvm-19/bin"))
LLVM22_BIN = Path(os.environ.get("OFFLOAD_LLVM22_BIN", "/usr/lib/llvm-22/bin"))
CUDA_BIN = Path(os.environ.get("OFFLOAD_CUDA_BIN", "/usr/local/cuda/bin"))
REPO_ROOT = Path(__file__).resolve().parent.parent

# The per-user toolchain probe cache goes to a scratch directory, not the home of whoever runs the tests
# (subprocesses inherit it).
if "OFFLOAD_BUILDERS_CACHE_DIR" not in os.environ:
    import atexit
    import tempfile

    os.environ["OFFLOAD_BUILDERS_CACHE_DIR"] = tempfile.mkdtemp(prefix="offload-builders-test-cache-")
    atexit.register(shutil.rmtree, os.environ["OFFLOAD_BUILDERS_CACHE_DIR"], ignore_errors=True)


def _require(path: Path) -> Path:
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"required tool {path} is missing: run the README's test command, which installs it")
    return path


@pytest.fixture(scope="session")
def llvm19():
    """Return a function mapping a tool name (e.g. 'clang-offload-bundler') to its LLVM 19 path."""
    return lambda name: _require(LLVM19_BIN / name)


@pytest.fixture(scope="session")
def llvm22():
    """Return a function mapping a tool name to its LLVM 22 path (compile and format tools only)."""
    return lambda name: _require(LLVM22_BIN / name)


@pytest.fixture(scope="session")
def cuda():
    """Return a function mapping a CUDA tool name ('ptxas', 'nvlink', 'fatbinary') to its path."""
    return lambda name: _require(CUDA_BIN / name)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture
def hip_sample(tmp_path) -> Path:
    """A copy of sample_project/hip, as a user would build it (no build directory, no SCons state)."""
    root = tmp_path / "hip"
    shutil.copytree(REPO_ROOT / "sample_project" / "hip", root, ignore=shutil.ignore_patterns("build", ".sconsign*"))
    return root


def which_or_fail(name: str) -> str:
    found = shutil.which(name)
    if not found:
        pytest.fail(f"required program {name!r} is not on PATH")
    return found


def driver_library_flags(targets, flags=()) -> list[str]:
    """The device-library flags the tool adds to each GPU target's device compile, as one driver command
    for all the targets takes them (see :func:`offload_builders.device_libraries.one_command_flags`)."""
    from offload_builders.device_libraries import one_command_flags
    from offload_builders.toolchain import find_toolchain

    return one_command_flags(find_toolchain(), targets, flags)


def write_cli_shims(directory: Path) -> Path:
    """``offload-compile`` and ``offload-link`` in ``directory``, running this Python's package: what a Meson or
    CMake project of a test finds on ``PATH``."""
    import sys

    directory.mkdir(parents=True, exist_ok=True)
    for name, module in (("offload-compile", "compile"), ("offload-link", "link")):
        (directory / name).write_text(f"#!/bin/sh\nexec {sys.executable} -m offload_builders.cli.{module} \"$@\"\n")
        (directory / name).chmod(0o755)
    return directory


def copy_sample_for_ninja(tmp_path: Path, *build_dirs: str) -> Path:
    """A copy of sample_project's ``build_dirs`` (the Meson or CMake project) and the sources and headers they
    build, with a header only ``norm.cpp`` includes (touching it must rebuild ``norm.cpp``'s nodes alone) and
    this checkout's ``offload-compile``/``offload-link`` in ``tmp_path/bin``."""
    root = tmp_path / "sample"
    for part in (*build_dirs, "src", "include", "hip/include", "mixed/src", "cuda/src", "cuda/include"):
        shutil.copytree(REPO_ROOT / "sample_project" / part, root / part, ignore=shutil.ignore_patterns("build"))
    (root / "include" / "norm_only.hpp").write_text("#pragma once\n")
    norm = root / "src" / "norm.cpp"
    norm.write_text('#include "norm_only.hpp"\n' + norm.read_text())
    write_cli_shims(tmp_path / "bin")
    return root


# REAPI servers for the remote caching and execution tests (tests/remote_servers.py; ./scripts/bootstrap installs
# them). Imported when a test asks for one, so that other tests need neither grpc nor the servers.
def _started(start, directory: Path):
    from remote_servers import ServerToolMissing

    try:
        return start(directory)
    except ServerToolMissing as error:
        pytest.fail(str(error))


@pytest.fixture
def buildgrid(tmp_path):
    """A BuildGrid server of this test's own (CAS, ByteStream, ActionCache; instance ``main``): a
    :class:`remote_servers.BuildGridServer`, started, stopped after the test. The test may stop and start it."""
    from remote_servers import start_buildgrid

    server = _started(start_buildgrid, tmp_path / "buildgrid")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def buildgrid_session(tmp_path_factory):
    """One BuildGrid server for the whole session, for tests that only need a cache (do not stop it)."""
    from remote_servers import start_buildgrid

    server = _started(start_buildgrid, tmp_path_factory.mktemp("buildgrid"))
    yield server
    server.stop()


@pytest.fixture
def casd_execution(tmp_path):
    """A buildbox-casd of this test's own with local execution (CAS, ByteStream, ActionCache, Execution; instance
    ``main``): a :class:`remote_servers.ExecutionServer`, started, stopped after the test. Actions run in a
    bubblewrap sandbox rooted at their input root, with the host's /usr bound read-only."""
    from remote_servers import start_buildbox_casd

    server = _started(start_buildbox_casd, tmp_path / "casd")
    yield server
    server.stop()
