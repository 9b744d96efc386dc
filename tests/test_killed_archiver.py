"""A killed ``ar`` or ``ranlib`` leaves nothing in the static library's directory (issue 38, item 10).

GNU ``ar`` and ``ranlib`` write the new archive to ``stXXXXXX`` in the directory of the archive they are given and
then put it in place; killed in between, they leave it there, under a name no node can claim. The real tools are
killed here at that very point, deterministically: ``strace`` fault injection sends them SIGKILL at their first
``unlink`` or ``rename`` (binutils 2.40 copies the temporary over the archive and unlinks it; others rename it).
Then either the whole build is killed too (SIGKILL to SCons' process group, as a killed build is), or SCons goes
on and fails the node (the tool alone was killed, as the out-of-memory killer may do).
``OffloadStaticLibrary`` runs both in ``<library>.ar/``, so the temporary is left there, and the next build (or
``scons -c``) removes it; a failed node removes it at once.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from test_scons_tool import BEFORE_VERSIONED_ACTIONS, SCONS, checkout_of, run_scons

pytestmark = pytest.mark.slow

#: A library of one OpenMP object, in a directory of its own (``build/lib``), its object elsewhere (``lib.o``).
#: ``ranlib=0`` leaves ``$RANLIB`` unset when the tool is loaded; ``AR``, ``ARFLAGS`` and ``RANLIB`` are taken
#: from the command line.
SCONSTRUCT = textwrap.dedent("""
    import offload_builders.scons
    env = Environment(tools=["default"], OFFLOAD_ARCHS="x86_64")
    if ARGUMENTS.get("ranlib") == "0":
        del env["RANLIB"]
    env.Tool("offload", toolpath=[offload_builders.scons.toolpath()])
    env.Replace(**{name: ARGUMENTS[name] for name in ("AR", "ARFLAGS", "RANLIB") if name in ARGUMENTS})
    env.OffloadStaticLibrary("build/lib/thrice", ["lib.cpp"])
""")
LIBRARY = textwrap.dedent("""
    int thrice(int v) {
      int r = 0;
      #pragma omp target map(from : r)
      r = 3 * v;
      return r;
    }
""")

#: GNU ar's temporary (``make_tempname``: ``mkstemp`` of ``stXXXXXX``).
AR_TEMPORARY = re.compile(r"st[A-Za-z0-9]{6}")

#: The syscalls with which ``ar`` and ``ranlib`` put the temporary in place: the first one is the kill.
PUT_IN_PLACE = "unlink,unlinkat,rename,renameat,renameat2"


def _project(root: Path) -> Path:
    root.mkdir()
    (root / "SConstruct").write_text(SCONSTRUCT)
    (root / "lib.cpp").write_text(LIBRARY)
    return root


#: Runs a command, then kills its own process group: the build that ran it (see :func:`_scons_in_its_own_group`).
KILL_THE_BUILD = '#!/bin/sh\n"$@"\nkill -KILL 0\n'


def _killed_at_put_in_place(tool: str, tmp_path: Path, whole_build: bool) -> str:
    """``tool`` (``ar``, ``ranlib``) as a command killed by SIGKILL once its temporary is written, and with it,
    where ``whole_build``, the build that runs it."""
    strace = shutil.which("strace")
    if not strace:
        pytest.fail("strace is missing: run scripts/bootstrap (it installs it) or apt-get install strace")
    program = shutil.which(tool)
    if not program or "GNU" not in subprocess.run([program, "--version"], capture_output=True, text=True).stdout:
        pytest.skip(f"{tool} is not GNU binutils'")
    command = f"{strace} -o /dev/null -qq -e trace={PUT_IN_PLACE} -e inject={PUT_IN_PLACE}:signal=KILL {program}"
    if not whole_build:
        return command
    script = tmp_path / "kill-the-build"
    script.write_text(KILL_THE_BUILD)
    script.chmod(0o755)
    return f"{script} {command}"


def _scons_in_its_own_group(root: Path, *args: str) -> subprocess.CompletedProcess:
    """``scons -Q`` in a process group of its own, which :data:`KILL_THE_BUILD` may kill (never the tests')."""
    return subprocess.run([SCONS, "-Q", *args], cwd=root, capture_output=True, text=True, start_new_session=True)


def _expected_archive(root: Path, directory: Path, arflags: str = "rc", ranlib: bool = True) -> bytes:
    """The library's bytes as ``ar`` (and ``ranlib``) write them in ``directory``, made by hand from the built
    object (a thin archive's member paths are relative to the directory)."""
    expected = directory / "expected.a"
    directory.mkdir(exist_ok=True)
    name = os.path.relpath(expected, root)  # as SCons names it: GNU ar takes a thin member relative to the name
    try:
        subprocess.run(["ar", arflags, name, "lib.o"], cwd=root, check=True)
        if ranlib:
            subprocess.run(["ranlib", name], cwd=root, check=True)
        return expected.read_bytes()
    finally:
        expected.unlink(missing_ok=True)


def _names(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


@pytest.mark.parametrize("tool", ["AR", "RANLIB"])
def test_a_build_killed_in_the_archiver_leaves_its_temporary_in_the_scratch_directory_alone(tmp_path, tool):
    """The build killed while ``ar`` (or ``ranlib``) writes: its ``stXXXXXX`` is in ``libthrice.a.ar/``, never in
    ``build/lib``; the next build removes it and writes the archive ``ar`` and ``ranlib`` write beside the
    library; killed again, ``scons -c`` removes it."""
    root = _project(tmp_path / "proj")
    library_dir = root / "build" / "lib"
    scratch = library_dir / "libthrice.a.ar"
    killer = f"{tool}={_killed_at_put_in_place(tool.lower(), tmp_path, whole_build=True)}"

    killed = _scons_in_its_own_group(root, killer)
    assert killed.returncode == -9, killed.stdout + killed.stderr
    strays = [name for name in _names(library_dir) if AR_TEMPORARY.fullmatch(name)]
    assert strays == [], f"{tool.lower()}'s temporary left in the library's directory: {_names(library_dir)}"
    assert any(AR_TEMPORARY.fullmatch(name) for name in _names(scratch)), _names(scratch)  # killed at that point

    run_scons(root)
    assert _names(library_dir) == ["libthrice.a"]  # the scratch directory went, with the temporary
    assert (library_dir / "libthrice.a").read_bytes() == _expected_archive(root, tmp_path)
    assert "is up to date" in run_scons(root).output

    assert _scons_in_its_own_group(root, killer).returncode == -9
    assert any(AR_TEMPORARY.fullmatch(name) for name in _names(scratch)), _names(scratch)
    cleaned = run_scons(root, "-c", killer)
    assert _names(library_dir) == [], cleaned.output


@pytest.mark.parametrize("tool", ["AR", "RANLIB"])
def test_an_archiver_killed_alone_fails_its_node_and_leaves_nothing(tmp_path, tool):
    """``ar`` (or ``ranlib``) killed while SCons goes on: the node fails, and the scratch directory goes with the
    temporary at once; the library's directory holds neither."""
    root = _project(tmp_path / "proj")
    library_dir = root / "build" / "lib"
    killer = f"{tool}={_killed_at_put_in_place(tool.lower(), tmp_path, whole_build=False)}"
    killed = _scons_in_its_own_group(root, killer)
    assert killed.returncode == 2 and "build/lib/libthrice.a" in killed.stdout + killed.stderr, killed
    assert [name for name in _names(library_dir) if name != "libthrice.a"] == [], _names(library_dir)
    run_scons(root)
    assert (library_dir / "libthrice.a").read_bytes() == _expected_archive(root, tmp_path)


@pytest.mark.parametrize("ranlib", [True, False])
def test_a_library_leaves_no_scratch_directory_and_keeps_its_bytes(tmp_path, ranlib):
    """A normal build (with or without ``$RANLIB``) leaves only the library in its directory, byte for byte what
    ``ar`` (and ``ranlib``) write beside it; a dry run prints the commands in the scratch directory and makes it
    not."""
    root = _project(tmp_path / "proj")
    args = () if ranlib else ("ranlib=0",)
    library_dir = root / "build" / "lib"
    built = run_scons(root, *args)
    assert "ar rc build/lib/libthrice.a.ar/archive lib.o" in built.output, built.output
    assert ("ranlib build/lib/libthrice.a.ar/archive" in built.output) == ranlib, built.output
    assert _names(library_dir) == ["libthrice.a"]
    assert (library_dir / "libthrice.a").read_bytes() == _expected_archive(root, tmp_path, ranlib=ranlib)

    (library_dir / "libthrice.a").unlink()
    dry = run_scons(root, "-n", *args)
    assert "ar rc build/lib/libthrice.a.ar/archive lib.o" in dry.output, dry.output
    assert _names(library_dir) == []


def test_a_thin_archive_is_written_beside_the_library(tmp_path):
    """A thin archive names its members relative to its own directory: written in the scratch directory, it is
    written again beside the library, where its member paths are right (``lib.o`` is ``../../lib.o``)."""
    root = _project(tmp_path / "proj")
    library_dir = root / "build" / "lib"
    run_scons(root, "ARFLAGS=rcT")
    assert _names(library_dir) == ["libthrice.a"]
    library = (library_dir / "libthrice.a").read_bytes()
    assert library.startswith(b"!<thin>\n") and b"../../lib.o/" in library
    assert library == _expected_archive(root, library_dir, arflags="rcT")


@pytest.mark.parametrize("ranlib", [True, False])
def test_a_library_built_before_versioned_actions_is_rebuilt_once(tmp_path, ranlib):
    """A library the code of :data:`test_scons_tool.BEFORE_VERSIONED_ACTIONS` built (with ``ranlib`` after the
    commit, or none) is archived once more, byte for byte as before, and is then up to date."""
    root = _project(tmp_path / "proj")
    args = () if ranlib else ("ranlib=0",)
    run_scons(root, *args, env=checkout_of(BEFORE_VERSIONED_ACTIONS, tmp_path / "earlier"))
    libraries = {path: path.read_bytes() for path in root.rglob("*.a")}
    assert libraries
    assert run_scons(root, "-q", *args, env=dict(os.environ), check=False).returncode != 0
    run_scons(root, *args)
    assert {path: path.read_bytes() for path in root.rglob("*.a")} == libraries
    assert run_scons(root, *args).output.strip() == "scons: `.' is up to date."


