"""``sample_project/cmake``: real CMake (the ``cmake`` wheel, or Debian's) builds the sample with one custom command
per phase and target through ``offload-compile`` (``find_package(OffloadBuilders)`` from ``offload-compile
--cmake-dir``) and links through ``offload-link``, under Ninja and Unix Makefiles. What each build runs is counted
from an exec trace (``strace -ff``), each process classified by its own arguments."""
from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO_ROOT, copy_sample_for_ninja
from offload_builders.toolchain import find_toolchain
from test_process_counts import Process, read_trace

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
SCONS = str(BIN / "scons")
GENERATORS = ["Ninja", "Unix Makefiles"]
#: What CMake and the build tool run for their own bookkeeping (regeneration checks, depfile rewriting).
BOOKKEEPING = {"cmake", "ninja", "make", "gmake", "sh", "dash", "bash"}
PROGRAMS = ("zaxpy", "hip_check", "hip_rdc", "cuda_check")


def cmake() -> str:
    found = shutil.which("cmake", path=f"{BIN}:{os.environ['PATH']}")
    if not found:
        pytest.fail("cmake is missing: pip install 'cmake>=3.25' (the test extras) or apt-get install cmake")
    return found


@pytest.fixture
def project(tmp_path) -> Path:
    """A copy of the sample (its CMake project, the Meson sample's test programs, sources and headers), with the
    tools of this checkout on PATH."""
    return copy_sample_for_ninja(tmp_path, "cmake", "meson")


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


def configure(project: Path, generator: str, archs: str, *options: str) -> None:
    run(project, cmake(), "-G", generator, "-S", "cmake", "-B", "build", f"-DOffloadBuilders_DIR={cmake_dir()}",
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
        return [p.option("-o") or "" for p in self.processes
                if p.program.startswith("clang++") and "-c" not in p.argv and p.option("-o") in PROGRAMS]

    def others(self) -> list[Process]:
        """Processes that are neither bookkeeping nor an offload-compile node nor what a node or link runs."""
        return [p for p in self.processes if p.program not in BOOKKEEPING]


def build(project: Path, tmp_path: Path, *targets: str) -> Build:
    strace = shutil.which("strace")
    if not strace:
        pytest.fail("strace is missing: run scripts/bootstrap (it installs it) or apt-get install strace")
    trace = tmp_path / f"trace{len(list(tmp_path.glob('trace*')))}"
    trace.mkdir()
    argv = [cmake(), "--build", "build", *(["--target", *targets] if targets else []), "--", "-j2"]
    run(project, strace, "-ff", "-qq", "-v", "-s", "65536", "-e", "trace=execve", "-e", "status=successful",
        "-e", "signal=none", "-o", str(trace / "pid"), *argv)
    processes = read_trace(trace / "pid")
    assert processes and processes[0].program == "cmake"
    return Build(processes[1:])


def assert_no_op(built: Build) -> None:
    assert built.nodes() == [] and built.links() == [] and built.others() == [], built.others() or built.nodes()


@pytest.mark.parametrize("generator", GENERATORS)
def test_cmake_builds_the_sample_and_rebuilds_only_what_changed(project, tmp_path, generator):
    """One node per phase and target; the programs run (OpenMP on the host device, stand-in HIP/CUDA runtimes);
    a no-op starts nothing; adding a target runs only that target's device nodes, the packages and fat binaries,
    the embeds and host compiles that take them, and the links; a header edit reruns only the compiles of the
    source that includes it; removing a target compiles no device code and no OpenMP host front end."""
    configure(project, generator, "x86_64,gfx90a,sm_80")
    first = build(project, tmp_path)
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
    tested = run(project, "ctest", "--test-dir", "build", "-V").stdout
    assert "100% tests passed" in tested and "out of 4" in tested
    assert "gfx90a: 1 code object(s)" in tested and "launched 1; 2 fat binary entries: Ok" in tested
    assert "HIP kernels each registered once and launched once: yes" in tested
    assert "sm_80: 1 cubin(s), 1 PTX" in tested and "launched 1; 1 cubins: Ok" in tested
    assert_no_op(build(project, tmp_path))

    # Add gfx1030: its device nodes alone (OpenMP, HIP, HIP RDC), then what takes the new image.
    configure(project, generator, "x86_64,gfx90a,sm_80,gfx1030")
    added = build(project, tmp_path)
    assert {target for _, _, target in added.nodes("device")} == {"gfx1030"}
    assert sorted(source for _, source, _ in added.nodes("device")) == \
        ["norm.cpp", "plain.hip", "rescale.hip", "scale.hip", "zaxpy.cpp"]
    assert added.nodes("host", "zaxpy.cpp") == [] and added.nodes("host", "norm.cpp") == []   # no host front end
    assert len(added.nodes("package")) == 4 and len(added.nodes("embed")) == 2
    assert added.nodes("bundle") == [("bundle", "plain.hip", None)]
    assert sorted(source for _, source, _ in added.nodes("host")) == ["plain.hip", "rescale.hip", "scale.hip"]
    assert len(added.nodes()) == 5 + 4 + 2 + 1 + 3 and not added.nodes(source="scale.cu")
    assert sorted(added.links()) == ["hip_check", "hip_rdc", "zaxpy"]
    assert_no_op(build(project, tmp_path))

    # A header only norm.cpp includes: norm.cpp's host front end and device compiles. Under Ninja nothing else
    # (their outputs' bytes did not change, so they keep their mtimes and restat stops there); make has no restat
    # across its passes, so there each node's outputs take its time and norm.cpp's package, embed and the link run.
    os.utime(project / "include" / "norm_only.hpp")
    touched = build(project, tmp_path)
    phases = collections.Counter(phase for phase, _, _ in touched.nodes())
    assert {source for _, source, _ in touched.nodes()} == {"norm.cpp"}
    if generator == "Ninja":
        assert phases == {"host": 1, "device": 4} and touched.links() == []
    else:
        assert phases == {"host": 1, "device": 4, "package": 1, "embed": 1} and touched.links() == ["zaxpy"]
    assert_no_op(build(project, tmp_path))

    # Remove gfx90a: no device compile and no OpenMP host front end; packages, fat binary, embeds, links.
    configure(project, generator, "x86_64,sm_80,gfx1030")
    removed = build(project, tmp_path)
    assert removed.nodes("device") == [] and removed.nodes("host", "zaxpy.cpp") == []
    assert len(removed.nodes("package")) == 4 and len(removed.nodes("embed")) == 2
    assert sorted(removed.links()) == ["hip_check", "hip_rdc", "zaxpy"]
    assert_no_op(build(project, tmp_path))
    tested = run(project, "ctest", "--test-dir", "build").stdout
    assert "100% tests passed" in tested and "out of 4" in tested


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
    """The same sources, flags and targets as the SCons tool: with OFFLOAD_SOURCE_ROOT the SCons top directory (the
    HIP/CUDA default CUID), the plain HIP and CUDA objects are the SCons tool's byte for byte, and so is every
    device image that is an object (x86_64, the sm_80 cubin). Device images that are LLVM bitcode (OpenMP gfx90a,
    HIP RDC), and so the OpenMP and HIP RDC objects that embed them, differ in one string: the bitcode's
    source_filename, the source's path as the compile named it (CMake: absolute; SCons: from its top directory)."""
    (project / "SConstruct").write_text(SCONSTRUCT)
    run(project, SCONS, "-Q")
    configure(project, "Ninja", "x86_64,gfx90a,sm_80", f"-DOFFLOAD_SOURCE_ROOT={project}")
    run(project, cmake(), "--build", "build")
    build, scons = project / "build", project / "scons"
    for name, ours in {"plain.hip": "hip_check.offload/__/mixed/src/plain.hip.o",
                       "scale.cu": "cuda_check.offload/__/cuda/src/scale.cu.o"}.items():
        assert (build / ours).read_bytes() == (scons / f"{name}.o").read_bytes(), name
    for source in ("zaxpy.cpp", "norm.cpp"):
        ours = build / "zaxpy.offload" / "__" / "src" / source
        assert Path(f"{ours}.x86_64.dev").read_bytes() == (scons / f"{source}.x86_64.dev.o").read_bytes()
        assert Path(f"{ours}.sm_80.dev").read_bytes() == (scons / f"{source}.sm_80.dev.cubin.o").read_bytes()
        assert bitcode_text(Path(f"{ours}.gfx90a.dev")) == bitcode_text(scons / f"{source}.gfx90a.dev.bc")
    for source in ("scale.hip", "rescale.hip"):
        ours = build / "hip_rdc.offload" / "__" / "mixed" / "src" / f"{source}.gfx90a.bc"
        assert bitcode_text(ours) == bitcode_text(scons / f"{source}.gfx90a.dev.bc")


def bitcode_text(path: Path) -> list[str]:
    """The module's text, without its ModuleID and source_filename (the names it was compiled from and to)."""
    done = subprocess.run([str(find_toolchain().tool("llvm-dis")), str(path), "-o", "-"], check=True,
                          capture_output=True, text=True)
    return [line for line in done.stdout.splitlines() if not line.startswith(("; ModuleID", "source_filename"))]


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
    line = configure_error(project, OFFLOAD_CLANG="/nonexistent/clang")
    assert line.startswith("OffloadBuilders: offload-link: error: no Clang found") and "/nonexistent/clang" in line
