"""``sample_project/cmake``: real CMake (the ``cmake`` wheel, 4.x, and Debian's 3.25) builds the sample with one custom
command per phase and target through ``offload-compile`` (``find_package(OffloadBuilders)`` from ``offload-compile
--cmake-dir``) and links through ``offload-link``, under Ninja, Unix Makefiles and Ninja Multi-Config. What each
build runs is counted from an exec trace (``strace -ff``), each process classified by its own arguments."""
from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO_ROOT, copy_sample_for_ninja, write_cli_shims
from offload_builders import __version__
from offload_builders.toolchain import find_toolchain
from test_process_counts import Process, read_trace

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
SCONS = str(BIN / "scons")
#: Debian's CMake (3.25, the oldest CMake this is tested with); ./scripts/bootstrap installs it.
SYSTEM_CMAKE = "/usr/bin/cmake"
#: What CMake and the build tool run for their own bookkeeping (regeneration checks, CMake's depfile rewriting).
BOOKKEEPING = {"cmake", "ninja", "make", "gmake", "sh", "dash", "bash"}
PROGRAMS = ("zaxpy", "hip_check", "hip_rdc", "cuda_check")


def cmake(which: str = "wheel") -> str:
    """The ``cmake`` wheel's (the venv's, else the first on PATH), or Debian's (``which="system"``)."""
    if which == "system":
        if not os.access(SYSTEM_CMAKE, os.X_OK):
            pytest.fail(f"{SYSTEM_CMAKE} (Debian's CMake 3.25) is missing: run ./scripts/bootstrap, which installs it")
        return SYSTEM_CMAKE
    found = shutil.which("cmake", path=f"{BIN}:{os.environ['PATH']}")
    if not found:
        pytest.fail("cmake is missing: pip install 'cmake>=3.25' (the test extras) or apt-get install cmake")
    return found


def ctest(cmake_path: str) -> str:
    """The ``ctest`` beside ``cmake_path``."""
    return str(Path(cmake_path).with_name("ctest"))


@pytest.fixture
def project(tmp_path) -> Path:
    """A copy of the sample (its CMake project, the Meson sample's test programs, sources and headers), with the
    tools of this checkout on PATH; ``norm.cpp`` also includes a header beside it (``src/norm_local.hpp``), which
    Clang's depfile names from where the compile runs (the sample's top directory, OFFLOAD_SOURCE_ROOT)."""
    root = copy_sample_for_ninja(tmp_path, "cmake", "meson")
    (root / "src" / "norm_local.hpp").write_text("#pragma once\n")
    norm = root / "src" / "norm.cpp"
    norm.write_text('#include "norm_local.hpp"\n' + norm.read_text())
    return root


def environ(project: Path, **extra: str) -> dict[str, str]:
    return dict(os.environ, PATH=f"{project.parent / 'bin'}:{BIN}:{os.environ['PATH']}",
                CXX=str(find_toolchain().clangxx), PYTHONPATH=str(REPO_ROOT), **extra)


def cmake_dir() -> str:
    done = subprocess.run([sys.executable, "-m", "offload_builders.cli.compile", "--cmake-dir"], check=True,
                          capture_output=True, text=True)
    return done.stdout.strip()


def run(project: Path, *argv: str, check: bool = True, **extra: str) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=project, env=environ(project, **extra), capture_output=True, text=True)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def configure(project: Path, generator: str, archs: str, *options: str, tool: str | None = None) -> None:
    run(project, tool or cmake(), "-G", generator, "-S", "cmake", "-B", "build", f"-DOffloadBuilders_DIR={cmake_dir()}",
        f"-DOFFLOAD_ARCHS={archs}", *options)


class Build:
    """The processes one ``cmake --build`` started, read from an exec trace."""

    def __init__(self, processes: list[Process]) -> None:
        self.processes = processes

    def nodes(self, phase: str = "", source: str = "") -> list[tuple[str, str, str | None]]:
        """(phase, source file name, --target) of each offload-compile command."""
        found = []
        for p in self.processes:
            if p.program != "offload-compile":
                continue
            args = list(p.argv[1:])
            words = [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] != "--depfile")]
            node = (args[0], os.path.basename(words[1]), p.option("--target"))
            if phase in ("", node[0]) and source in ("", node[1]):
                found.append(node)
        return found

    def links(self) -> list[str]:
        """The programs linked (the driver's link command, naming ``-o <program>``)."""
        return [os.path.basename(p.option("-o") or "") for p in self.processes
                if p.program.startswith("clang++") and "-c" not in p.argv
                and os.path.basename(p.option("-o") or "") in PROGRAMS]

    def device_links(self) -> list[str]:
        """The GPU target of each device link run (inside the links' offload-link), sorted."""
        linked = []
        for p in self.processes:
            if p.kind == "device link: ld.lld":
                linked += [a.removeprefix("-plugin-opt=mcpu=") for a in p.argv if a.startswith("-plugin-opt=mcpu=")]
            elif p.kind == "device link: clang-nvlink-wrapper":
                linked.append(p.option("-arch") or "sm_?")
        return sorted(linked)

    def others(self) -> list[Process]:
        """Processes that are neither bookkeeping nor an offload-compile node nor what a node or link runs."""
        return [p for p in self.processes if p.program not in BOOKKEEPING]


def build(project: Path, tmp_path: Path, *targets: str, tool: str | None = None, config: str | None = None) -> Build:
    strace = shutil.which("strace")
    if not strace:
        pytest.fail("strace is missing: run scripts/bootstrap (it installs it) or apt-get install strace")
    trace = tmp_path / f"trace{len(list(tmp_path.glob('trace*')))}"
    trace.mkdir()
    argv = [tool or cmake(), "--build", "build", *(["--target", *targets] if targets else []),
            *(["--config", config] if config else []), "--", "-j2"]
    run(project, strace, "-ff", "-ttt", "-qq", "-v", "-s", "65536", "-e", "trace=execve", "-e", "status=successful",
        "-e", "signal=none", "-o", str(trace / "pid"), *argv)
    processes = read_trace(trace / "pid")
    assert processes and processes[0].program == "cmake"
    return Build(processes[1:])


def assert_no_op(built: Build) -> None:
    assert built.nodes() == [] and built.links() == [] and built.others() == [], built.others() or built.nodes()


#: (generator, cmake): each generator with the cmake wheel (4.x), and Ninja with Debian's CMake 3.25 too.
BUILDS = [("Ninja", "wheel"), ("Unix Makefiles", "wheel"), ("Ninja Multi-Config", "wheel"), ("Ninja", "system")]
#: The configurations of the Ninja Multi-Config build: the first is what a plain ``cmake --build`` builds.
CONFIGS = "Release;Debug"


@pytest.mark.parametrize(("generator", "which"), BUILDS, ids=[f"{g}-{w}".replace(" ", "_") for g, w in BUILDS])
def test_cmake_builds_the_sample_and_rebuilds_only_what_changed(project, tmp_path, generator, which):
    """One node per phase and target; the programs run (OpenMP on the host device, stand-in HIP/CUDA runtimes);
    a no-op starts nothing; adding a target runs only that target's device nodes, the packages and fat binaries,
    the embeds and host compiles that take them, and the links (which link that target's device image alone); a
    header edit reruns only the compiles of the
    source that includes it (a header found through -I, and one beside the source, which Clang names from the
    directory the compile runs in); removing a target compiles no device code and no OpenMP host front end.
    Ninja Multi-Config: the same for its default configuration (Release), then Debug has outputs and flags of its
    own (every node runs once, with CMAKE_CXX_FLAGS_DEBUG) and leaves Release built."""
    tool = cmake(which)
    multi = generator == "Ninja Multi-Config"
    options = [f"-DCMAKE_CONFIGURATION_TYPES={CONFIGS}"] if multi else []

    def configure_for(archs: str) -> None:
        configure(project, generator, archs, *options, tool=tool)

    def tests_passed(config: str = "Release", *verbose: str) -> str:
        tested = run(project, ctest(tool), "--test-dir", "build", "-C", config, *verbose).stdout
        assert "100% tests passed" in tested and "out of 4" in tested, tested
        return tested

    configure_for("x86_64,gfx90a,sm_80")
    first = build(project, tmp_path, tool=tool)
    nodes = collections.Counter((phase, source) for phase, source, _ in first.nodes())
    assert nodes == {
        ("host", "zaxpy.cpp"): 1, ("host", "norm.cpp"): 1, ("device", "zaxpy.cpp"): 3, ("device", "norm.cpp"): 3,
        ("package", "zaxpy.cpp"): 1, ("package", "norm.cpp"): 1, ("embed", "zaxpy.cpp"): 1, ("embed", "norm.cpp"): 1,
        ("device", "plain.hip"): 1, ("bundle", "plain.hip"): 1, ("host", "plain.hip"): 1,
        ("device", "scale.hip"): 1, ("package", "scale.hip"): 1, ("host", "scale.hip"): 1,
        ("device", "rescale.hip"): 1, ("package", "rescale.hip"): 1, ("host", "rescale.hip"): 1,
        ("device", "scale.cu"): 1, ("bundle", "scale.cu"): 1, ("host", "scale.cu"): 1,
    }
    assert sorted(first.links()) == sorted(PROGRAMS)
    tested = tests_passed("Release", "-V")
    assert "gfx90a: 1 code object(s)" in tested and "launched 1; 2 fat binary entries: Ok" in tested
    assert "HIP kernels each registered once and launched once: yes" in tested
    assert "sm_80: 1 cubin(s), 1 PTX" in tested and "launched 1; 1 cubins: Ok" in tested
    assert_no_op(build(project, tmp_path, tool=tool))

    # Add gfx1030: its device nodes alone (OpenMP, HIP, HIP RDC), then what takes the new image.
    configure_for("x86_64,gfx90a,sm_80,gfx1030")
    added = build(project, tmp_path, tool=tool)
    assert {target for _, _, target in added.nodes("device")} == {"gfx1030"}
    assert sorted(source for _, source, _ in added.nodes("device")) == \
        ["norm.cpp", "plain.hip", "rescale.hip", "scale.hip", "zaxpy.cpp"]
    assert added.nodes("host", "zaxpy.cpp") == [] and added.nodes("host", "norm.cpp") == []   # no host front end
    assert len(added.nodes("package")) == 4 and len(added.nodes("embed")) == 2
    assert added.nodes("bundle") == [("bundle", "plain.hip", None)]
    assert sorted(source for _, source, _ in added.nodes("host")) == ["plain.hip", "rescale.hip", "scale.hip"]
    assert len(added.nodes()) == 5 + 4 + 2 + 1 + 3 and not added.nodes(source="scale.cu")
    assert sorted(added.links()) == ["hip_check", "hip_rdc", "zaxpy"]
    # zaxpy's and hip_rdc's links link gfx1030's image alone: offload-link keeps the others' images.
    assert added.device_links() == ["gfx1030", "gfx1030"]
    assert_no_op(build(project, tmp_path, tool=tool))

    # A header only norm.cpp includes: norm.cpp's host front end and device compiles. Under Ninja nothing else
    # (their outputs' bytes did not change, so they keep their mtimes and restat stops there); make has no restat
    # across its passes, so there each node's outputs take its time and norm.cpp's package, embed and the link run.
    for header in ("include/norm_only.hpp", "src/norm_local.hpp"):
        os.utime(project / header)
        touched = build(project, tmp_path, tool=tool)
        phases = collections.Counter(phase for phase, _, _ in touched.nodes())
        assert {source for _, source, _ in touched.nodes()} == {"norm.cpp"}, header
        if generator.startswith("Ninja"):
            assert phases == {"host": 1, "device": 4} and touched.links() == [], header
        else:
            assert phases == {"host": 1, "device": 4, "package": 1, "embed": 1} and touched.links() == ["zaxpy"]
        assert_no_op(build(project, tmp_path, tool=tool))

    # Remove gfx90a: no device compile and no OpenMP host front end; packages, fat binary, embeds, links.
    configure_for("x86_64,sm_80,gfx1030")
    removed = build(project, tmp_path, tool=tool)
    assert removed.nodes("device") == [] and removed.nodes("host", "zaxpy.cpp") == []
    assert len(removed.nodes("package")) == 4 and len(removed.nodes("embed")) == 2
    assert sorted(removed.links()) == ["hip_check", "hip_rdc", "zaxpy"] and removed.device_links() == []
    assert_no_op(build(project, tmp_path, tool=tool))
    tests_passed()

    if multi:
        debug = build(project, tmp_path, tool=tool, config="Debug")
        assert collections.Counter((phase, source) for phase, source, _ in debug.nodes()) == nodes
        compiles = [p for p in debug.processes if p.program == "offload-compile"]
        assert all("/build/" in (p.option("-o") or "") and "/Debug/" in (p.option("-o") or "") for p in compiles)
        assert all("-g" in p.argv for p in compiles if p.argv[1] in ("host", "device"))
        assert sorted(debug.links()) == sorted(PROGRAMS)
        tests_passed("Debug")
        assert_no_op(build(project, tmp_path, tool=tool))   # Release
        assert_no_op(build(project, tmp_path, tool=tool, config="Debug"))


SCONSTRUCT = textwrap.dedent("""\
    import offload_builders.scons
    env = Environment(tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()],
                      OFFLOAD_ARCHS=["x86_64", "gfx90a", "sm_80"], OFFLOAD_FLAGS=["-O2"], CPPPATH=["include"])
    for name in ("zaxpy", "norm"):
        env.OffloadObject(f"scons/{name}.cpp.o", f"src/{name}.cpp")
    hip = env.Clone(OFFLOAD_ARCHS=["gfx90a"], CPPPATH=["hip/include"], OFFLOAD_HIP_FLAGS=["-nogpulib", "-nogpuinc"])
    hip.OffloadObject("scons/plain.hip.o", "mixed/src/plain.hip")
    rdc = hip.Clone(OFFLOAD_RDC=True)
    for name in ("scale", "rescale"):
        rdc.OffloadObject(f"scons/{name}.hip.o", f"mixed/src/{name}.hip")
    cuda = env.Clone(OFFLOAD_ARCHS=["sm_80"], CPPPATH=["cuda/include"])
    cuda.OffloadObject("scons/scale.cu.o", "cuda/src/scale.cu")
""")


def test_cmake_objects_are_the_scons_tools_byte_for_byte(project):
    """The same sources, flags and targets as the SCons tool: offload-compile runs in OFFLOAD_SOURCE_ROOT (the
    sample sets it to its top directory, the SCons tool's) and names each source from there, so every object, device
    image (LLVM bitcode included: its source_filename is that name), package, fat binary and PTX is the SCons
    tool's byte for byte; the HIP/CUDA CUID is the MD5 of that name, as the SCons tool's."""
    (project / "SConstruct").write_text(SCONSTRUCT)
    run(project, SCONS, "-Q")
    configure(project, "Ninja", "x86_64,gfx90a,sm_80")
    run(project, cmake(), "--build", "build")
    build, scons = project / "build", project / "scons"
    pairs = {}
    for source in ("zaxpy.cpp", "norm.cpp"):
        ours = f"zaxpy.offload/__/src/{source}"
        pairs |= {f"{ours}.host.bc": f"{source}.host.bc", f"{ours}.x86_64.dev": f"{source}.x86_64.dev.o",
                  f"{ours}.sm_80.dev": f"{source}.sm_80.dev.cubin.o", f"{ours}.gfx90a.dev": f"{source}.gfx90a.dev.bc",
                  f"{ours}.o": f"{source}.o"}
    ours = "hip_check.offload/__/mixed/src/plain.hip"
    pairs |= {f"{ours}.gfx90a.hsaco": "plain.hip.gfx90a.hsaco", f"{ours}.fatbin": "plain.hip.hipfb",
              f"{ours}.o": "plain.hip.o"}
    for source in ("scale.hip", "rescale.hip"):
        ours = f"hip_rdc.offload/__/mixed/src/{source}"
        pairs |= {f"{ours}.gfx90a.bc": f"{source}.gfx90a.dev.bc", f"{ours}.pkg": f"{source}.offload.pkg",
                  f"{ours}.o": f"{source}.o"}
    ours = "cuda_check.offload/__/cuda/src/scale.cu"
    pairs |= {f"{ours}.sm_80.cubin": "scale.cu.sm_80.cubin", f"{ours}.sm_80.cubin.ptx": "scale.cu.sm_80.dev.s",
              f"{ours}.fatbin": "scale.cu.fatbin", f"{ours}.o": "scale.cu.o"}
    differ = [name for name, theirs in pairs.items() if (build / name).read_bytes() != (scons / theirs).read_bytes()]
    assert differ == []
    # The sources as the commands name them: from the source root, where the commands run.
    commands = offload_commands(project)
    assert all(line.startswith(f"cd {project} && ") for line in commands)
    assert " src/zaxpy.cpp " in " ".join(commands) and " mixed/src/plain.hip " in " ".join(commands)
    assert f" {project}/src/" not in " ".join(commands)


def offload_commands(project: Path) -> list[str]:
    """The offload-compile command lines of ``build/build.ninja``."""
    text = (project / "build" / "build.ninja").read_text()
    return [line.strip().removeprefix("COMMAND = ") for line in text.splitlines() if "/offload-compile " in line]


def test_cmake_names_sources_outside_the_source_root_by_absolute_path(project):
    """OFFLOAD_SOURCE_ROOT src: zaxpy.cpp is named from there; the HIP and CUDA sources, outside it, by their
    absolute paths (and their CUID is the MD5 of that path: no --source-root). Empty: every source absolute, the
    commands run in the build directory as CMake's default."""
    configure(project, "Ninja", "x86_64,gfx90a,sm_80", f"-DOFFLOAD_SOURCE_ROOT={project}/src")
    commands = offload_commands(project)
    assert commands and all(line.startswith(f"cd {project}/src && ") for line in commands)
    text = " ".join(commands)
    assert " zaxpy.cpp " in text and f" {project}/src/zaxpy.cpp " not in text and "--source-root" not in text
    assert f" {project}/mixed/src/plain.hip " in text and f" {project}/cuda/src/scale.cu " in text
    configure(project, "Ninja", "x86_64,gfx90a,sm_80", "-DOFFLOAD_SOURCE_ROOT=")
    commands = offload_commands(project)
    assert commands and all(line.startswith(f"cd {project}/build && ") for line in commands)
    assert f" {project}/src/zaxpy.cpp " in " ".join(commands)


VERSIONS = textwrap.dedent("""\
    cmake_minimum_required(VERSION 3.20)
    project(versions NONE)
    foreach(request IN LISTS REQUESTS)
      set(OffloadBuilders_DIR "${OFFLOAD_DIR}" CACHE PATH "" FORCE)  # a request not met set it to NOTFOUND
      string(REPLACE " " ";" request "${request}")
      find_package(OffloadBuilders ${request} QUIET)
      message(STATUS "request ${request}: ${OffloadBuilders_FOUND} ${OffloadBuilders_VERSION}")
      unset(OffloadBuilders_VERSION)
    endforeach()
    set(OffloadBuilders_DIR "${OFFLOAD_DIR}" CACHE PATH "" FORCE)
    find_package(OffloadBuilders ${REQUIRED} REQUIRED)
""")


@pytest.mark.parametrize("which", ["wheel", "system"])
def test_cmake_package_version_is_the_python_packages(project, which):
    """OffloadBuildersConfigVersion.cmake: the version is offload_builders.__version__; a request of the same major
    version that is not newer is met (SameMajorVersion), as is a range holding it; a newer one, another major
    version, or EXACT another version is not; find_package(... REQUIRED) of one fails with CMake's own message."""
    major, minor = (int(part) for part in __version__.split(".")[:2])
    met = [f"{major}.{minor}", f"{__version__} EXACT", f"{major}", f"{major}.{minor}...<{major + 1}",
           f"{major}...{__version__}"]
    unmet = [f"{major}.{minor + 1}", f"{major + 1}", f"{__version__}.1 EXACT", f"{major + 1}...{major + 2}",
             f"{major}...<{__version__}", f"{major}...{major}.0.0.1"]
    (project / "versions").mkdir()
    (project / "versions" / "CMakeLists.txt").write_text(VERSIONS)

    def configure_versions(required: str, build_dir: str) -> subprocess.CompletedProcess:
        return run(project, cmake(which), "-S", "versions", "-B", build_dir, f"-DOFFLOAD_DIR={cmake_dir()}",
                   f"-DREQUESTS={';'.join(met + unmet)}", f"-DREQUIRED={required}", check=False)

    done = configure_versions(f"{major}.{minor}", "versions-met")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.rstrip() for line in done.stdout.splitlines()]
    for request in met + unmet:
        found = request in met
        line = f"-- request {request.replace(' ', ';')}: {int(found)} {__version__ if found else ''}".rstrip()
        assert line in lines, (line, done.stdout)
    done = configure_versions("99", "versions-unmet")
    assert done.returncode != 0
    text = " ".join((done.stdout + done.stderr).split())
    assert 'Could not find a configuration file for package "OffloadBuilders" that is compatible with requested ' \
        'version "99".' in text, text
    assert f"{cmake_dir()}/OffloadBuildersConfig.cmake, version: {__version__}" in text, text


def configure_error(project: Path, *options: str, **extra: str) -> str:
    builds = len(list(project.glob("build*")))
    done = run(project, cmake(), "-G", "Ninja", "-S", "cmake", "-B", f"build{builds}",
               f"-DOffloadBuilders_DIR={cmake_dir()}", *options, check=False, **extra)
    assert done.returncode != 0
    lines = [line.strip() for line in (done.stdout + done.stderr).splitlines()]
    errors = [i for i, line in enumerate(lines) if line.startswith("CMake Error")]
    assert len(errors) == 1, lines
    return lines[errors[0] + 1]  # the message: one line


def test_cmake_errors_are_one_line_naming_the_target_id_or_the_tool(project):
    line = configure_error(project, "-DOFFLOAD_ARCHS=x86_64,gfx9999")
    assert line.startswith("OFFLOAD_ARCHS 'x86_64,gfx9999': ") and "invalid target ID 'gfx9999'" in line
    line = configure_error(project, "-DOFFLOAD_ARCHS=gfx90a,gfx90a:xnack+")
    assert "conflicting offload target IDs 'gfx90a' and 'gfx90a:xnack+'" in line
    line = configure_error(project, "-DOFFLOAD_COMPILE=/nonexistent/offload-compile")
    assert line.startswith("OffloadBuilders: offload-compile not found (OFFLOAD_COMPILE=/nonexistent/offload-compile)")
    line = configure_error(project, "-DOFFLOAD_SOURCE_ROOT=/nonexistent")
    assert line == "OFFLOAD_SOURCE_ROOT '/nonexistent' is not a directory"
    line = configure_error(project, OFFLOAD_CLANG="/nonexistent/clang")
    assert line.startswith("OffloadBuilders: offload-link: error: no Clang found") and "/nonexistent/clang" in line


# --- CUDA with Clang 22: a target-list change reruns only the device compiles the list changes (Ninja) -------

ARCH_LIST_CMAKE = textwrap.dedent("""
    cmake_minimum_required(VERSION 3.20)
    project(archlist CXX)
    find_package(OffloadBuilders REQUIRED)
    offload_add_library(k STATIC scale.cu shift.cu uses.cu CUDA_FLAGS -O2 -I${CMAKE_SOURCE_DIR} -I${CURAND_INCLUDE})
""")
#: A source whose device code holds the list (an array of its values): its preprocessed text changes with it.
USES_CU = textwrap.dedent("""
    #include "cuda_min.h"
    __device__ int listed[] = {__CUDA_ARCH_LIST__};
    __global__ void uses(int *x) { x[0] = listed[1]; }
    void launch_uses(int *x) { uses<<<1, 1>>>(x); }
""")


def _cuda_kind(process: Process) -> str:
    args = process.argv
    if "-cc1" in args:
        if "-E" in args:
            return "list check"
        return "device compile" if "-fcuda-is-device" in args else "host compile"
    return process.program


ARCH_LIST_BUILDS = [("Ninja", "wheel"), ("Ninja", "system"), ("Unix Makefiles", "wheel")]


@pytest.mark.parametrize(("generator", "which"), ARCH_LIST_BUILDS,
                         ids=[f"{g}-{w}".replace(" ", "_") for g, w in ARCH_LIST_BUILDS])
def test_cmake_clang22_adding_a_cuda_target_reruns_only_the_device_compiles_the_list_changes(tmp_path, llvm22, cuda,
                                                                                             monkeypatch, generator,
                                                                                             which):
    """OFFLOAD_CUDA_ARCH_LIST with Clang 22: each device command takes the list from a file (``--targets-file``,
    not on its command line) and depends on its ``arch-list-check`` record instead. Adding sm_86 to two plain
    sources built for sm_80,sm_90 runs sm_86's device compile and ptxas alone per source (plus a list check per
    target: one ``-cc1 -E``), the fat binaries and host compiles; a source whose device code holds the list reruns
    all three. Before, every device command carried ``--targets``: 9 device compiles and 9 ptxas. Under Ninja the
    unchanged records stop the other device commands (restat); under make, which compares times only, they run
    and keep their outputs (``--archlist-record``: the record and their command as at their last compile), and
    start no compiler. Each object's ``.nv_fatbin`` is the driver's one command's for all three targets, byte for
    byte; a no-op runs nothing, before and after."""
    from offload_builders.models.gpu import default_cuid
    from test_cuda import CUDA_MIN_H, SCALE_CU, SHIFT_CU, _nv_fatbin, curand_include

    root = tmp_path / "archlist"
    (root / "cmake").mkdir(parents=True)
    (root / "cmake" / "CMakeLists.txt").write_text(ARCH_LIST_CMAKE)
    for name, text in (("cuda_min.h", CUDA_MIN_H), ("scale.cu", SCALE_CU), ("shift.cu", SHIFT_CU),
                       ("uses.cu", USES_CU)):
        (root / "cmake" / name).write_text(text)
    write_cli_shims(tmp_path / "bin")
    monkeypatch.setenv("OFFLOAD_CLANG", str(llvm22("clang")))
    include = curand_include()
    tool = cmake(which)
    project = root

    def configure_for(archs: str) -> None:
        run(project, tool, "-G", generator, "-S", "cmake", "-B", "build", f"-DOffloadBuilders_DIR={cmake_dir()}",
            f"-DOFFLOAD_ARCHS={archs}", "-DOFFLOAD_CUDA_ARCH_LIST=ON", f"-DCURAND_INCLUDE={include}")

    configure_for("sm_80,sm_90")
    first = build(project, tmp_path, tool=tool)
    assert len(first.nodes("arch-list-check")) == len(first.nodes("device")) == 6
    assert_no_op(build(project, tmp_path, tool=tool))
    assert all(p.option("--targets-file") and not p.option("--targets") for p in first.processes
               if p.program == "offload-compile" and p.argv[1] == "device")

    configure_for("sm_80,sm_90,sm_86")
    added = build(project, tmp_path, tool=tool)
    kinds = collections.Counter(_cuda_kind(p) for p in added.processes if _cuda_kind(p) in (
        "device compile", "list check", "host compile", "ptxas", "fatbinary"))
    assert kinds == {"device compile": 5, "ptxas": 5, "list check": 9, "fatbinary": 3, "host compile": 3}, kinds
    if generator == "Ninja":
        assert sorted(added.nodes("device")) == [("device", "scale.cu", "sm_86"), ("device", "shift.cu", "sm_86"),
                                                 ("device", "uses.cu", "sm_80"), ("device", "uses.cu", "sm_86"),
                                                 ("device", "uses.cu", "sm_90")]
    else:  # every device command runs; those whose record is as it was start no compiler (counted above)
        assert len(added.nodes("device")) == 9, added.nodes("device")
    assert_no_op(build(project, tmp_path, tool=tool))
    for stem in ("scale", "shift", "uses"):
        reference = root / f"{stem}.reference.o"
        subprocess.run([str(llvm22("clang++")), "-x", "cuda", "--cuda-gpu-arch=sm_80", "--cuda-gpu-arch=sm_90",
                        "--cuda-gpu-arch=sm_86", f"-cuid={default_cuid(f'{stem}.cu')}", "--cuda-path=/usr/local/cuda",
                        "-O2", "-I.", f"-I{include}", "-isystem", "/usr/local/cuda/include/cccl", "-c", f"{stem}.cu",
                        "-o", str(reference)], cwd=root / "cmake", check=True, capture_output=True)
        ours = root / "build" / "k.offload" / f"{stem}.cu.o"
        assert _nv_fatbin(llvm22, ours) == _nv_fatbin(llvm22, reference), stem
