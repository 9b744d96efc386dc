"""Compile databases for offload sources: SCons' ``compilation_db`` tool, CMake's CMAKE_EXPORT_COMPILE_COMMANDS and
Meson list every offload source once, as the one driver command its nodes stand for, in the host view
(``offload_builders.compile_database``), merged with each build's own entries. The real ``clangd-19 --check``
parses them: no driver diagnostic (``drv_*``) and no more errors than for the plain driver's entry with the same
flags (which, for GPU targets, names no device library). ``$OFFLOAD_TEST_SCONS`` runs the SCons tests with another
SCons (``scons`` of SCons 4.5, the oldest supported, with this checkout on ``PYTHONPATH``).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT, copy_sample_for_ninja
from offload_builders.compile_database import (
    HOST_VIEW,
    added_arguments,
    entry_arguments,
    entry_command,
    option_groups,
    shell_groups,
)
from offload_builders.device_libraries import one_command_flags
from offload_builders.errors import OffloadError
from offload_builders.models.hip import default_flags as hip_default_flags
from offload_builders.targets import TargetID, parse_offload_archs
from offload_builders.toolchain import find_toolchain
from test_meson import run as run_with_checkout_tools

CLANGD = os.environ.get("OFFLOAD_CLANGD", "/usr/bin/clangd-19")
BIN = Path(sys.executable).parent
SCONS = os.environ.get("OFFLOAD_TEST_SCONS") or str(BIN / "scons")


@pytest.fixture(scope="module")
def clangd() -> str:
    if not os.access(CLANGD, os.X_OK):
        pytest.fail(f"{CLANGD} is missing: run ./scripts/bootstrap, which installs it (apt-get install clangd-19)")
    return CLANGD


def check(clangd: str, source: Path, directory: Path) -> tuple[int, list[str]]:
    """``clangd --check`` of ``source`` with the database in ``directory``: its error count and diagnostics."""
    done = subprocess.run([clangd, f"--check={source}", f"--compile-commands-dir={directory}"], capture_output=True,
                          text=True, timeout=300)
    output = done.stdout + done.stderr
    total = re.search(r"All checks completed, (\d+) errors", output)
    assert total is not None, output
    return int(total.group(1)), re.findall(r"^E\[[^]]*\] \[(\w+)\]", output, re.MULTILINE)


def driver_baseline(clangd: str, tmp_path: Path, directory: Path, source: Path, argv: list[str]) -> int:
    """clangd's error count for the plain driver's own entry for ``source`` (``argv``: the driver's command)."""
    database = tmp_path / f"driver-{source.name}"
    database.mkdir()
    (database / "compile_commands.json").write_text(json.dumps(
        [{"directory": str(directory), "file": str(source), "arguments": [*argv, "-c", str(source)]}]))
    return check(clangd, source, database)[0]


def assert_parses(clangd: str, tmp_path: Path, directory: Path, database: Path, source: Path,
                  driver_argv: list[str]) -> tuple[int, int]:
    """Our entry for ``source`` parses with no driver diagnostic and no more errors than the driver's own entry
    with the same flags; (ours, driver's)."""
    ours, codes = check(clangd, source, database)
    assert not [code for code in codes if code.startswith("drv_")], codes
    driver = driver_baseline(clangd, tmp_path, directory, source, driver_argv)
    assert ours <= driver, (source, ours, driver, codes)
    return ours, driver


# --------------------------------------------------------------------------------------------------
# The entries, from the models
# --------------------------------------------------------------------------------------------------
def test_an_entry_is_the_driver_command_of_the_nodes_in_the_host_view():
    toolchain = find_toolchain()
    gpus = parse_offload_archs("gfx90a,gfx942,sm_80")
    argv = entry_command(toolchain, "src/k.cpp", "openmp", gpus, ["-O2", "-Iinclude"], "build/k.o")
    assert argv[0] == str(toolchain.clangxx) and argv[-5:] == [HOST_VIEW, "-c", "src/k.cpp", "-o", "build/k.o"]
    assert argv[1:5] == ["-fopenmp", "-O2", "-Iinclude", "--offload-arch=gfx90a,gfx942,sm_80"]
    # the device-library flags the device nodes get, as one command takes them (gfx942's are not installed)
    assert argv[5:-5] == one_command_flags(toolchain, gpus, ["-O2", "-Iinclude"]) and "-Xarch_gfx942" in argv
    # the host CPU and GPUs: the driver cannot combine -fopenmp-targets with --offload-arch; the host view needs
    # only the triples, as the host front end has them
    mixed = entry_arguments(toolchain, "k.c", "openmp", parse_offload_archs("x86_64,sm_80"), [])
    assert "-fopenmp-targets=nvptx64-nvidia-cuda,x86_64-unknown-linux-gnu" in mixed
    assert entry_command(toolchain, "k.c", "openmp", [TargetID("x86_64")], [], "k.o")[0] == str(toolchain.clang)

    # HIP: its own targets only; ROCm's device libraries as the nodes get them; RDC's new offload driver
    hip = entry_arguments(toolchain, "k.hip", "hip", parse_offload_archs("x86_64,gfx90a,sm_80"), ["-fgpu-rdc"])
    assert hip == ["-x", "hip", "-fgpu-rdc", "--offload-arch=gfx90a",
                   *hip_default_flags(toolchain, TargetID("gfx90a"), ["-fgpu-rdc"]), "--offload-new-driver", HOST_VIEW]
    assert entry_arguments(toolchain, "k.hip", "hip", [TargetID("gfx90a")], ["-nogpulib", "-nogpuinc"]) == [
        "-x", "hip", "-nogpulib", "-nogpuinc", "--offload-arch=gfx90a", HOST_VIEW]
    # CUDA: the installation the model compiles with, and Clang 19's -nocudainc -nocudalib
    cuda = entry_arguments(toolchain, "k.cu", "cuda", parse_offload_archs("sm_80,sm_90"), ["-O2"])
    assert cuda[:5] == ["-x", "cuda", "-O2", f"--cuda-path={toolchain.cuda_path}", "--offload-arch=sm_80,sm_90"]
    if toolchain.major <= 19:
        assert cuda[5:7] == ["-nocudainc", "-nocudalib"]
    assert added_arguments(toolchain, "k.cu", "cuda", [TargetID("sm_80")], ["-O2"]) == [
        arg for arg in entry_arguments(toolchain, "k.cu", "cuda", [TargetID("sm_80")], ["-O2"]) if arg != "-O2"]
    with pytest.raises(OffloadError, match="no"):
        entry_arguments(toolchain, "k.cu", "cuda", [TargetID("gfx90a")], [])
    assert option_groups(["-x", "hip", "-Xarch_gfx942", "-nogpulib", "-O2", "-isystem", "/a b"]) == [
        ["-x", "hip"], ["-Xarch_gfx942", "-nogpulib"], ["-O2"], ["-isystem", "/a b"]]
    assert shell_groups(["-isystem", "/a b"]) == ["-isystem '/a b'"]


def test_offload_compile_compdb_args_prints_what_an_entry_adds(tmp_path):
    (tmp_path / "k.hip").write_text("")

    def compdb_args(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "offload_builders.cli.compile", "compdb-args", *args],
                              cwd=tmp_path, capture_output=True, text=True)

    done = compdb_args("k.hip", "--targets", "gfx90a,gfx942", "--", "-O2")
    assert done.returncode == 0, done.stderr
    added = added_arguments(find_toolchain(), "k.hip", "hip", parse_offload_archs("gfx90a,gfx942"), ["-O2"])
    assert done.stdout.splitlines() == added
    grouped = compdb_args("k.hip", "--targets", "gfx90a,gfx942", "--groups", "--", "-O2")
    assert grouped.stdout.splitlines() == shell_groups(added) and "-x hip" in grouped.stdout.splitlines()
    refused = compdb_args("k.hip", "--targets", "sm_80")
    assert refused.returncode == 1 and "compdb-args:" in refused.stderr and "gfx" in refused.stderr
    assert "--targets is required" in compdb_args("k.hip").stderr


# --------------------------------------------------------------------------------------------------
# SCons: the compilation_db tool's database
# --------------------------------------------------------------------------------------------------
#: HIP with ROCm's real headers (Debian's libamdhip64-dev) and device libraries (gfx942's are not installed).
ROCM_KERNEL = """\
#include <hip/hip_runtime.h>
#include <cmath>

__global__ void k(double *a, float *b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    a[i] = sin(a[i]) + sqrt(a[i]);
    b[i] = cosf(b[i]);
  }
}

int launch(double *a, float *b, int n) {
  double *da;
  if (hipMalloc(&da, n * sizeof(double)) != hipSuccess) return 1;
  k<<<1, 64>>>(a, b, n);
  return 0;
}
"""

#: What the sample's SConstruct gets: the compilation_db tool (loaded before or after offload, before the objects are
#: declared), the database, and a HIP object with ROCm.
SCONSTRUCT_AFTER = """
if ARGUMENTS.get("order") == "after":
    env.Tool("compilation_db")
"""
SCONSTRUCT_TAIL = """
env["COMPILATIONDB_USE_ABSPATH"] = bool(int(ARGUMENTS.get("abspath", "0")))
env["COMPILATIONDB_PATH_FILTER"] = ARGUMENTS.get("filter", "")
rocm = env.Clone(OFFLOAD_ARCHS=["gfx90a", "gfx942"])
rocm.OffloadObject("build/rocm/k", "rocm/k.hip")
env.CompilationDatabase()
"""


@pytest.fixture
def scons_project(tmp_path) -> Path:
    root = tmp_path / "sample"
    root.mkdir()
    for part in ("SConstruct", "src", "include", "hip", "mixed", "cuda"):
        copy = shutil.copytree if (REPO_ROOT / "sample_project" / part).is_dir() else shutil.copy
        copy(REPO_ROOT / "sample_project" / part, root / part)
    text = (root / "SConstruct").read_text()
    tools = 'tools=["default", "offload"]'
    assert tools in text
    text = text.replace(tools, 'tools=["default", "offload"] if ARGUMENTS.get("order") == "after" else '
                               '["default", "compilation_db", "offload"]')
    declarations = '\nif not ARGUMENTS.get("verbose"):'
    assert declarations in text
    text = text.replace(declarations, SCONSTRUCT_AFTER + declarations)
    (root / "SConstruct").write_text(text + SCONSTRUCT_TAIL)
    (root / "rocm").mkdir()
    (root / "rocm" / "k.hip").write_text(ROCM_KERNEL)
    return root


#: The oldest SCons the tool supports, whose compilation_db tool keeps its entries otherwise (nodes, not tuples).
OLDEST_SCONS = "4.5.2"


@pytest.fixture(scope="module")
def oldest_scons(tmp_path_factory) -> Path:
    """SCons 4.5.2 installed into a directory of its own from the wheelhouse (``./scripts/bootstrap`` fills it),
    run by this Python with that directory first on its path."""
    wheelhouse = REPO_ROOT / ".wheelhouse"
    if not list(wheelhouse.glob(f"[sS][cC]ons-{OLDEST_SCONS}-*.whl")):
        pytest.fail(f"no SCons {OLDEST_SCONS} wheel in {wheelhouse}: run ./scripts/bootstrap, which downloads it")
    target = tmp_path_factory.mktemp("scons-oldest")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheelhouse),
                    "--no-deps", "--target", str(target), f"scons=={OLDEST_SCONS}"], check=True, capture_output=True)
    return target


def scons_database(root: Path, *args: str, scons_dir: Path | None = None) -> list[dict]:
    """The database SCons writes (the venv's SCons, or the one installed in ``scons_dir``)."""
    path = [str(REPO_ROOT)] if scons_dir is None else [str(scons_dir), str(REPO_ROOT)]
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    scons = [SCONS] if scons_dir is None else [sys.executable, str(scons_dir / "bin" / "scons")]
    (root / "compile_commands.json").unlink(missing_ok=True)
    done = subprocess.run([*scons, "-Q", "offload_archs=gfx90a,sm_80", *args, "compile_commands.json"], cwd=root,
                          env=environ, capture_output=True, text=True)
    if scons_dir is not None:
        assert f"SCons: v{OLDEST_SCONS}" in subprocess.run([*scons, "--version"], env=environ, capture_output=True,
                                                           text=True).stdout
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((root / "compile_commands.json").read_text())


#: The sample's objects (the rocm one added), in the database: offload sources and the build's own C++ ones.
OFFLOAD_OBJECTS = {
    "build/zaxpy.o": "src/zaxpy.cpp", "build/norm.o": "src/norm.cpp",
    "build/mixed/lib_kernel.o": "mixed/src/lib_kernel.hip", "build/mixed/omp_lib.o": "mixed/src/omp_lib.cpp",
    "build/mixed/omp_part.o": "mixed/src/omp_part.cpp", "build/mixed/plain.o": "mixed/src/plain.hip",
    "build/mixed/scale.o": "mixed/src/scale.hip", "build/mixed/rescale.o": "mixed/src/rescale.hip",
    "build/cuda/omp_part.o": "mixed/src/omp_part.cpp", "build/cuda/plain_hip.o": "mixed/src/plain.hip",
    "build/cuda/scale_hip.o": "mixed/src/scale.hip", "build/cuda/rescale_hip.o": "mixed/src/rescale.hip",
    "build/cuda/scale.o": "cuda/src/scale.cu", "build/cuda/shift.o": "cuda/src/shift.cu",
    "build/cuda/offset.o": "cuda/src/offset.cu", "build/rocm/k.o": "rocm/k.hip",
}
PLAIN_OBJECTS = {
    "build/mixed/main.o": "mixed/src/main.cpp", "build/mixed/hip_stub.o": "mixed/src/hip_stub.cpp",
    "build/cuda/main.o": "cuda/src/main.cpp", "build/cuda/hip_stub.o": "mixed/src/hip_stub.cpp",
    "build/cuda/cuda_stub.o": "cuda/src/cuda_stub.cpp",
}


@pytest.mark.slow
@pytest.mark.parametrize("version", ["current", OLDEST_SCONS])
def test_scons_compilation_db_lists_every_offload_object_with_the_builds_own(scons_project, version, request):
    root = scons_project
    scons_dir = None if version == "current" else request.getfixturevalue("oldest_scons")
    for order in ("before", "after"):  # compilation_db loaded before the offload tool, or after it
        entries = scons_database(root, f"order={order}", scons_dir=scons_dir)
        assert {entry["output"]: entry["file"] for entry in entries} == {**OFFLOAD_OBJECTS, **PLAIN_OBJECTS}, order
        assert len(entries) == len(OFFLOAD_OBJECTS) + len(PLAIN_OBJECTS)  # one entry per object
        assert all(entry["directory"] == str(root) for entry in entries)
        by_output = {entry["output"]: entry["command"].split() for entry in entries}
        for output, source in OFFLOAD_OBJECTS.items():
            argv = by_output[output]
            assert argv[-5:] == [HOST_VIEW, "-c", source, "-o", output], argv
        for output in PLAIN_OBJECTS:
            assert HOST_VIEW not in by_output[output] and "-fopenmp" not in by_output[output]

    zaxpy = by_output["build/zaxpy.o"]
    assert zaxpy[1:5] == ["-fopenmp", "-O2", "-fcx-limited-range", "-Iinclude"]  # $OFFLOAD_FLAGS, $CPPPATH
    assert "--offload-arch=gfx90a,sm_80" in zaxpy and any(arg.startswith("--rocm-device-lib-path=") for arg in zaxpy)
    # the mixed program's own list (x86_64, gfx90a): the host front end's triples
    assert "-fopenmp-targets=amdgcn-amd-amdhsa,x86_64-unknown-linux-gnu" in by_output["build/mixed/omp_part.o"]
    scale = by_output["build/mixed/scale.o"]  # HIP RDC with the stub configuration ($OFFLOAD_HIP_FLAGS)
    assert scale[1:3] == ["-x", "hip"] and "-nogpulib" in scale and "-fgpu-rdc" in scale
    assert "--offload-new-driver" in scale and "--offload-arch=gfx90a" in scale and "-Ihip/include" in scale
    assert by_output["build/cuda/scale.o"][1:3] == ["-x", "cuda"] and "--offload-arch=sm_80" in by_output[
        "build/cuda/scale.o"]
    assert "-Xarch_gfx942" in by_output["build/rocm/k.o"]  # Debian's ROCm has no gfx942 device libraries

    absolute = scons_database(root, "abspath=1", "filter=*build/cuda/*", scons_dir=scons_dir)
    assert {entry["output"] for entry in absolute} == {
        str(root / output) for output in [*OFFLOAD_OBJECTS, *PLAIN_OBJECTS] if output.startswith("build/cuda/")}
    assert all(Path(entry["file"]).is_absolute() for entry in absolute)


@pytest.mark.slow
def test_clangd_parses_the_scons_entries_of_each_model(scons_project, clangd, tmp_path):
    root = scons_project
    scons_database(root)
    clangxx = str(find_toolchain().clangxx)
    flags = ["-O2", "-fcx-limited-range", "-Iinclude"]
    cases = {
        "openmp": ("src/zaxpy.cpp", [clangxx, "-fopenmp", "--offload-arch=gfx90a,sm_80", *flags]),
        "hip": ("rocm/k.hip", [clangxx, "-x", "hip", "--offload-arch=gfx90a,gfx942", *flags]),
        "cuda": ("cuda/src/scale.cu", [clangxx, "-x", "cuda", "--offload-arch=sm_80", *flags, "-Ihip/include",
                                       "-Icuda/include"]),
    }
    counts = {model: assert_parses(clangd, tmp_path, root, root, root / source, argv)
              for model, (source, argv) in cases.items()}
    assert counts["openmp"][1] > counts["openmp"][0]  # the driver's: no device library found for either target
    print("clangd errors (ours, the driver's):", counts)


# --------------------------------------------------------------------------------------------------
# CMake and Meson: their own databases
# --------------------------------------------------------------------------------------------------
def sample_parses(clangd: str, tmp_path: Path, project: Path, database: Path, rdc: bool = False) -> dict:
    """:func:`assert_parses` for the sample's OpenMP, HIP (and relocatable HIP) and CUDA sources, each against the
    driver's own command with the sample's flags (run in ``project``); the error counts by model."""
    clangxx = str(find_toolchain().clangxx)
    hip = [clangxx, "-x", "hip", "--offload-arch=gfx90a", "-O2", "-nogpulib", "-nogpuinc", "-Ihip/include"]
    sources = {
        "openmp": ("src/zaxpy.cpp", [clangxx, "-fopenmp", "--offload-arch=gfx90a,sm_80", "-O2", "-Iinclude"]),
        "hip": ("mixed/src/plain.hip", hip),
        **({"hip-rdc": ("mixed/src/scale.hip", [*hip, "-fgpu-rdc"])} if rdc else {}),
        "cuda": ("cuda/src/scale.cu", [clangxx, "-x", "cuda", "--offload-arch=sm_80", "-O2", "-Icuda/include"]),
    }
    return {model: assert_parses(clangd, tmp_path, project, database, project / name, argv)
            for model, (name, argv) in sources.items()}


def _run(project: Path, *argv: str) -> str:
    """``argv`` in ``project`` with this checkout's tools on PATH and Clang as CXX (test_meson's environment)."""
    return run_with_checkout_tools(project, *argv)


def _cmake() -> str:
    found = shutil.which("cmake", path=f"{BIN}:{os.environ['PATH']}")
    if not found:
        pytest.fail("cmake is missing: pip install 'cmake>=3.25' (the test extras) or apt-get install cmake")
    return found


@pytest.mark.slow
def test_cmake_lists_offload_sources_through_object_libraries_it_never_builds(tmp_path, clangd):
    project = copy_sample_for_ninja(tmp_path, "cmake", "meson")
    cmake_dir = _run(project, sys.executable, "-m", "offload_builders.cli.compile", "--cmake-dir").strip()

    def configure(build: str, *options: str) -> None:
        _run(project, _cmake(), "-G", "Ninja", "-S", "cmake", "-B", build, f"-DOffloadBuilders_DIR={cmake_dir}",
             "-DOFFLOAD_ARCHS=x86_64,gfx90a,sm_80", *options)

    configure("plain")
    assert not (project / "plain" / "compile_commands.json").exists() or "offload-" not in (
        project / "plain" / "compile_commands.json").read_text()
    assert ".offload-" not in _run(project, str(BIN / "ninja"), "-C", "plain", "-t", "targets", "all")

    configure("build", "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON")
    build = project / "build"
    entries = json.loads((build / "compile_commands.json").read_text())
    by_file = {os.path.relpath(entry["file"], project): entry for entry in entries}
    assert len(by_file) == len(entries) == 10
    offload = {name: by_file[name]["command"].split() for name in (
        "src/zaxpy.cpp", "src/norm.cpp", "mixed/src/plain.hip", "mixed/src/scale.hip", "mixed/src/rescale.hip",
        "cuda/src/scale.cu")}
    for name, argv in offload.items():
        assert HOST_VIEW in argv and ".offload-" in by_file[name]["output"], argv
    assert {"meson/hip_check.cpp", "meson/hip_rdc_check.cpp", "mixed/src/hip_stub.cpp", "meson/cuda_check.cpp"} == \
        set(by_file) - set(offload)  # CMake's own entries
    zaxpy = offload["src/zaxpy.cpp"]
    assert "-O2" in zaxpy and "-fopenmp" in zaxpy and f"-I{project}/cmake/../include" in zaxpy  # FLAGS, usage
    plain = offload["mixed/src/plain.hip"]  # -x hip after CMake's own -x c++; LINK_LIBRARIES' include directory
    assert plain[plain.index("-x", plain.index("-x") + 1) + 1] == "hip" and f"-I{project}/cmake/../hip/include" in plain
    assert "-nogpulib" in plain and "--offload-arch=gfx90a" in plain
    assert "-fgpu-rdc" in offload["mixed/src/scale.hip"] and "--offload-new-driver" in offload["mixed/src/scale.hip"]
    assert "--offload-arch=sm_80" in offload["cuda/src/scale.cu"]

    # Nothing builds them: not all, not a program's link.
    everything = _run(project, str(BIN / "ninja"), "-C", "build", "-t", "commands", "all")
    assert ".offload-" not in everything and "zaxpy" in everything

    # the phases run in OFFLOAD_SOURCE_ROOT, the sample's top directory
    print("clangd errors on CMake's entries (ours, the driver's):", sample_parses(clangd, tmp_path, project, build))


@pytest.mark.slow
def test_meson_offload_compdb_lists_every_offload_source_with_mesons_own(tmp_path, clangd):
    """``ninja offload-compdb`` (the sample's run target: ``offload-compile compdb``) writes Meson's entries and one
    per source that an ``offload-compile package`` or ``bundle`` command names: OpenMP, HIP (plain and RDC) and
    CUDA, which Meson cannot list itself; Meson's own file stays as Meson wrote it, and the default build runs
    none of it. clangd parses the OpenMP, HIP and CUDA entries."""
    project = copy_sample_for_ninja(tmp_path, "meson")
    _run(project, str(BIN / "meson"), "setup", "build", "meson", "-Doffload_archs=x86_64,gfx90a,sm_80")
    build = project / "build"
    own = json.loads((build / "compile_commands.json").read_text())
    assert "offload-compdb" not in _run(project, str(BIN / "ninja"), "-C", "build", "-t", "commands", "all")
    assert not (build / "offload-compdb").exists()

    _run(project, str(BIN / "ninja"), "-C", "build", "offload-compdb")
    entries = json.loads((build / "offload-compdb" / "compile_commands.json").read_text())
    assert json.loads((build / "compile_commands.json").read_text()) == own == entries[:len(own)]
    by_file = {os.path.relpath(os.path.normpath(os.path.join(entry["directory"], entry["file"])), project): entry
               for entry in entries}
    assert len(by_file) == len(entries) == 10
    offload = {name: by_file[name]["arguments"] for name in (
        "src/zaxpy.cpp", "src/norm.cpp", "mixed/src/plain.hip", "mixed/src/scale.hip", "mixed/src/rescale.hip",
        "cuda/src/scale.cu")}
    assert {"meson/hip_check.cpp", "meson/hip_rdc_check.cpp", "mixed/src/hip_stub.cpp", "meson/cuda_check.cpp"} == \
        set(by_file) - set(offload)  # Meson's own
    toolchain = find_toolchain()
    include = f"-I{project}/meson/../include"
    assert offload["src/zaxpy.cpp"] == entry_command(
        toolchain, str(project / "src" / "zaxpy.cpp"), "openmp", parse_offload_archs("x86_64,gfx90a,sm_80"),
        ["-O2", include], str(build / "offload-compdb" / "zaxpy.cpp.pkg.o"))
    assert "-fopenmp-targets=amdgcn-amd-amdhsa,nvptx64-nvidia-cuda,x86_64-unknown-linux-gnu" in offload["src/norm.cpp"]
    plain = offload["mixed/src/plain.hip"]
    assert plain[1:3] == ["-x", "hip"] and "--offload-arch=gfx90a" in plain and "-nogpuinc" in plain
    assert "-fgpu-rdc" in offload["mixed/src/scale.hip"] and "--offload-new-driver" in offload["mixed/src/rescale.hip"]
    cuda = offload["cuda/src/scale.cu"]
    assert cuda[1:3] == ["-x", "cuda"] and "--offload-arch=sm_80" in cuda
    assert all(HOST_VIEW in argv for argv in offload.values())
    assert len({entry["output"] for entry in entries}) == len(entries)

    counts = sample_parses(clangd, tmp_path, project, build / "offload-compdb", rdc=True)
    print("clangd errors on the offload-compdb entries (ours, the driver's):", counts)


def test_offload_compile_compdb_refuses_what_is_no_meson_build_directory(tmp_path):
    """One line naming the directory, the file it lacks and what to do; a damaged introspection file, one line
    naming it; a custom target whose command the tool refuses, one line naming the target and its meson.build."""
    def compdb(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "offload_builders.cli.compile", "compdb", *args],
                              capture_output=True, text=True, cwd=tmp_path)

    done = compdb(str(tmp_path))
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"'{tmp_path}' is not a Meson build directory" in done.stderr and "meson setup" in done.stderr
    info = tmp_path / "meson-info"
    info.mkdir()
    directories = {"source": str(tmp_path), "build": str(tmp_path)}
    (info / "meson-info.json").write_text(json.dumps({"directories": directories}))
    (info / "intro-targets.json").write_text("[{")
    done = compdb(str(tmp_path))
    assert done.returncode == 1 and "intro-targets.json: cannot read it" in done.stderr, done.stderr
    (info / "intro-targets.json").write_text(json.dumps([{
        "name": "k.pkg", "type": "custom", "defined_in": str(tmp_path / "meson.build"), "filename": ["k.pkg"],
        "target_sources": [{"compiler": ["/x/offload-compile", "package", "k.cpp", "@INPUT@", "--targets",
                                         "gfx90a,gfx90a:xnack+", "-o", "@OUTPUT@"], "parameters": []}]}]))
    done = compdb(str(tmp_path))
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert f"custom target 'k.pkg' ({tmp_path / 'meson.build'})" in done.stderr and "--targets" in done.stderr
    assert not (tmp_path / "offload-compdb").exists()
    done = compdb(str(tmp_path), "--", "-O2")
    assert done.returncode == 1 and "give one Meson build directory" in done.stderr


def test_the_docs_page_names_what_it_documents():
    page = (REPO_ROOT / "docs" / "editors.md").read_text()
    for words in ("env.CompilationDatabase()", "CMAKE_EXPORT_COMPILE_COMMANDS", "--offload-host-only",
                  "--compile-commands-dir", "compdb-args", "offload-compdb"):
        assert words in page, words
