"""Installing into one's own project, as ``docs/install.md`` says: a wheel built from this checkout, installed with
``[nvptx]`` into a fresh virtualenv from local wheels only (``--no-index --find-links .wheelhouse``, which
``./scripts/bootstrap`` fills), then the page's own ``SConstruct`` and ``CMakeLists.txt`` built in a directory outside
the checkout, with nothing of the checkout on ``sys.path`` or ``PATH``; the ``site_scons`` shim copied into a project;
and the one-line errors where an extra or the package is missing."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT

pytestmark = pytest.mark.slow

WHEELHOUSE = REPO_ROOT / ".wheelhouse"
INSTALL_DOC = REPO_ROOT / "docs" / "install.md"
#: The cmake and ninja the build uses: the test venv's wheels (any CMake 3.20+ would do; they carry no package).
BUILD_TOOLS = Path(sys.executable).parent
#: PATH without this checkout's venv: the installed venv's tools must be found without it.
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def doc_block(language: str, after_heading: str) -> str:
    """The first fenced ``language`` block after the heading ``after_heading`` in docs/install.md."""
    text = INSTALL_DOC.read_text()
    start = text.index(f"\n{after_heading}\n")
    found = re.search(rf"```{language}\n(.*?)```", text[start:], re.S)
    assert found, f"no ```{language} block after {after_heading!r} in {INSTALL_DOC}"
    return found.group(1)


def clean_environ(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH, no virtualenv of this checkout on PATH."""
    environ = {key: value for key, value in os.environ.items()
               if key not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") and not key.startswith("PYTEST")}
    environ["PATH"] = SYSTEM_PATH
    environ.update(extra)
    return environ


def run(argv: list[str], cwd: Path, check: bool = True, **extra: str) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=cwd, env=clean_environ(**extra), capture_output=True, text=True)
    if check:
        assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}"
    return done


def base_python() -> str:
    """The interpreter the checkout's venv was made from (a fresh venv must not inherit this one's packages)."""
    return getattr(sys, "_base_executable", sys.executable)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel of this checkout, built with the build backend from the wheelhouse."""
    if not (WHEELHOUSE / ".offload-builders-wheelhouse").is_file():
        pytest.fail(f"{WHEELHOUSE} is missing or incomplete: run ./scripts/bootstrap, which fills it")
    work = tmp_path_factory.mktemp("wheel")
    # Build from a copy of the tracked files: a build in the checkout would leave build/ and egg-info behind.
    source = work / "source"
    tracked = subprocess.run(["git", "ls-files", "-z", "pyproject.toml", "README.md", "offload_builders"],
                             cwd=REPO_ROOT, check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, source / name)
    dist = work / "dist"
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index", "--find-links", str(WHEELHOUSE),
         "-w", str(dist), str(source)], cwd=work)
    wheels = list(dist.glob("offload_builders-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def fresh_venv(directory: Path, *requirements: str) -> Path:
    """A new virtualenv in ``directory`` with ``requirements`` installed from local wheels only."""
    run([base_python(), "-m", "venv", str(directory)], cwd=directory.parent)
    run([str(directory / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", "--find-links",
         str(WHEELHOUSE), *requirements], cwd=directory.parent)
    return directory


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh virtualenv with the wheel and its ``[nvptx]`` extra."""
    return fresh_venv(tmp_path_factory.mktemp("install") / "venv", f"{wheel}[nvptx]")


@pytest.fixture
def project(tmp_path) -> Path:
    """A user's project: the sample program's sources and header, no SConstruct or CMakeLists.txt yet."""
    root = tmp_path / "project"
    for part in ("src/zaxpy.cpp", "src/norm.cpp", "include/sample.hpp"):
        (root / part).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / "sample_project" / part, root / part)
    return root


def copy_shim(project: Path) -> None:
    """The repository's ``site_scons/site_tools/offload/``, copied as docs/install.md says."""
    shutil.copytree(REPO_ROOT / "site_scons" / "site_tools" / "offload",
                    project / "site_scons" / "site_tools" / "offload", ignore=shutil.ignore_patterns("__pycache__"))


def run_program(program: Path) -> subprocess.CompletedProcess:
    done = run([str(program)], cwd=program.parent, OMP_TARGET_OFFLOAD="MANDATORY",
               LD_LIBRARY_PATH="/usr/lib/llvm-19/lib")
    assert "target regions ran on an offload device: yes" in done.stdout and "PASSED" in done.stdout, done.stdout
    return done


def test_the_installed_package_is_the_wheel_not_the_checkout(installed, tmp_path):
    done = run([str(installed / "bin" / "python"), "-c",
                "import offload_builders, SCons, elftools, llvmlite, zstandard; print(offload_builders.__file__)"],
               cwd=tmp_path)
    location = Path(done.stdout.strip())
    assert installed in location.parents and REPO_ROOT not in location.parents
    for script in ("offload-compile", "offload-link", "offload-bundler", "offload-packager", "offload-inspect",
                   "offload-select", "scons"):
        assert (installed / "bin" / script).is_file(), script
    # [nvptx]: the CUDA 12 tools the OpenMP runtime's cubins need.
    done = run([str(installed / "bin" / "python"), "-c",
                "from offload_builders import nvptx_tools, toolchain; "
                "tools = nvptx_tools.openmp_tools(toolchain.find_toolchain()); print(tools.origin)"], cwd=tmp_path)
    assert "the CUDA 12 wheels" in done.stdout, done.stdout


def test_the_docs_sconstruct_builds_and_runs_with_the_installed_package(installed, project):
    (project / "SConstruct").write_text(doc_block("python", "## SCons"))
    build = run([str(installed / "bin" / "scons"), "-Q", "-j2"], cwd=project)
    # sm_90's device image was compiled, assembled by the [nvptx] extra's ptxas and linked.
    assert list(project.glob("src/zaxpy.sm_90.*")), build.stdout
    assert (project / "zaxpy").is_file()
    done = run_program(project / "zaxpy")
    assert done.returncode == 0
    # Up to date: a second run builds nothing.
    again = run([str(installed / "bin" / "scons"), "-Q", "-n"], cwd=project)
    assert again.stdout.strip() == "scons: `.' is up to date.", again.stdout


def test_the_site_scons_shim_loads_the_installed_package(installed, project):
    copy_shim(project)
    (project / "SConstruct").write_text(
        'env = Environment(tools=["default", "offload"], OFFLOAD_ARCHS=["x86_64"], OFFLOAD_FLAGS=["-O2"],\n'
        '                  CPPPATH=["include"])\n'
        'env.OffloadProgram("zaxpy", ["src/zaxpy.cpp", "src/norm.cpp"])\n')
    run([str(installed / "bin" / "scons"), "-Q"], cwd=project)
    assert run_program(project / "zaxpy").returncode == 0


def test_the_shim_without_the_package_is_one_error(tmp_path, project):
    """SCons in a Python without offload-builders: the shim says which Python and what to install."""
    venv = fresh_venv(tmp_path / "scons-only", "scons")
    copy_shim(project)
    (project / "SConstruct").write_text('env = Environment(tools=["default", "offload"])\n')
    done = run([str(venv / "bin" / "scons"), "-Q"], cwd=project, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("scons: ***")]
    assert len(error) == 1, done.stderr
    assert "needs the offload-builders package" in error[0] and str(venv / "bin" / "python") in error[0]
    assert "pip install offload-builders" in error[0]
    assert "Traceback" not in done.stderr


def test_the_docs_cmake_project_builds_with_the_installed_package(installed, project):
    (project / "CMakeLists.txt").write_text(doc_block("cmake", "## CMake"))
    cmake_dir = run([str(installed / "bin" / "offload-compile"), "--cmake-dir"], cwd=project).stdout.strip()
    assert Path(cmake_dir).is_relative_to(installed)
    clangxx = shutil.which("clang++-19", path=SYSTEM_PATH) or "/usr/lib/llvm-19/bin/clang++"
    # The venv's bin is not on PATH: the module finds offload-compile and offload-link beside its Python.
    run([str(BUILD_TOOLS / "cmake"), "-G", "Ninja", "-S", ".", "-B", "build",
         f"-DCMAKE_MAKE_PROGRAM={BUILD_TOOLS / 'ninja'}", f"-DOffloadBuilders_DIR={cmake_dir}",
         "-DOFFLOAD_ARCHS=x86_64,sm_90"], cwd=project, CXX=clangxx)
    cache = (project / "build" / "CMakeCache.txt").read_text()
    assert f"OFFLOAD_COMPILE:FILEPATH={installed / 'bin' / 'offload-compile'}" in cache
    run([str(BUILD_TOOLS / "cmake"), "--build", "build"], cwd=project)
    assert run_program(project / "build" / "zaxpy").returncode == 0


def test_a_remote_cache_without_the_remote_extra_is_one_warning(installed, project):
    """``[nvptx]`` only, and $OFFLOAD_REMOTE set: the remote cache is an optimisation, so offload-compile builds
    locally after one line that names the extra to install, with no traceback."""
    done = run([str(installed / "bin" / "offload-compile"), "host", "src/zaxpy.cpp", "-o", "zaxpy.host.bc", "--",
                "-O2", "-Iinclude"], cwd=project, OFFLOAD_REMOTE="grpc://127.0.0.1:1/main")
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "pip install 'offload-builders[remote]'" in lines[0], done.stderr
    assert "building locally" in lines[0]
    assert (project / "zaxpy.host.bc").stat().st_size > 0


@pytest.mark.parametrize("cuda", ["none", "CUDA 13", "CUDA 13 on PATH"])
def test_an_nvptx_target_without_the_nvptx_extra_is_one_error_naming_it(wheel, project, tmp_path, cuda):
    """No ``[nvptx]``: with no CUDA at all, or only CUDA 13 (whose cubins libomptarget 19 cannot load), an OpenMP
    ``sm_90`` target stops the build at read time with one error that names the extra."""
    venv = fresh_venv(tmp_path / "plain", str(wheel))
    (project / "SConstruct").write_text(doc_block("python", "## SCons"))
    # "none": no CUDA_PATH directory and no ptxas on PATH (some machines have one in /usr/local/bin).
    # "CUDA 13 on PATH": no CUDA_PATH directory, only CUDA 13's ptxas on PATH (checked like $CUDA_PATH's).
    extra = {"none": {"CUDA_PATH": str(tmp_path / "no-cuda"), "PATH": "/usr/bin:/bin"},
             "CUDA 13": {"CUDA_PATH": "/usr/local/cuda"},
             "CUDA 13 on PATH": {"CUDA_PATH": str(tmp_path / "no-cuda"), "PATH": "/usr/local/cuda/bin:/usr/bin:/bin"},
             }[cuda]
    done = run([str(venv / "bin" / "scons"), "-Q", "-n"], cwd=project, check=False, **extra)
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("scons: ***")]
    assert len(errors) == 1 and "pip install 'offload-builders[nvptx]'" in errors[0], done.stderr
    assert "Traceback" not in done.stderr
