"""The CUDA model with the real toolchain: Clang 19 (whose own driver cannot build CUDA with CUDA 13) and CUDA 13.

* ``.cu`` sources become per-target device nodes (the compile to PTX and ``ptxas``), one fat binary written by
  CUDA 13's ``fatbinary`` (``--image3``) and the host compile embedding it (``.nv_fatbin``); a program of
  two sources, linked with a stub CUDA runtime, registers each kernel once and launches each once.
* Adding a target compiles and assembles only that target; removing one compiles nothing (Clang 19, which
  defines no ``__CUDA_ARCH_LIST__``; with Clang 22 a source's other device compiles rerun only where the list
  can change their output: ``tests/test_cuda_arch_list.py``).
* With Clang 22 and CUDA 13's headers, each object's ``.nv_fatbin`` is the one-command compile's, byte for byte.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from offload_builders.formats.inspect import inspect_file
from offload_builders.scons.hip import default_cuid
from test_scons_tool import SCONS, Build, run_scons

pytestmark = pytest.mark.slow

PHASES = ("HOST", "DEVICE", "ASSEMBLE", "BUNDLE", "PACKAGE", "EXTRACT", "DEVICELINK", "WRAP", "LINK")

SCONSTRUCT = textwrap.dedent("""
    import offload_builders.scons
    env = Environment(
        tools=["default", "offload"],
        toolpath=[offload_builders.scons.toolpath()],
        OFFLOAD_ARCHS=ARGUMENTS.get("archs", "sm_80,sm_90"),
        OFFLOAD_FLAGS=["-O2"],
        CPPPATH=["#"],
    )
    if ARGUMENTS.get("clang"):
        env["OFFLOAD_CLANG"] = ARGUMENTS["clang"]
    if ARGUMENTS.get("cuda_flags"):
        env["OFFLOAD_CUDA_FLAGS"] = ARGUMENTS["cuda_flags"].split(",")
    if "offload_rdc" in ARGUMENTS:
        env["OFFLOAD_RDC"] = bool(int(ARGUMENTS["offload_rdc"]))
    for phase in () if ARGUMENTS.get("verbose") else %(phases)r:
        env["OFFLOAD_%%sCOMSTR" %% phase] = "@@%%s $TARGET" %% phase
    objects = [env.OffloadObject(source) for source in ("scale.cu", "shift.cu")]
    host = [env.Object(source, CXX="%(clangxx)s", CXXCOMSTR="@@CXX $TARGET") for source in ("main.cpp",
                                                                                             "stub_runtime.cpp")]
    if ARGUMENTS.get("program", "1") == "1":
        # Plain (non-RDC) CUDA objects register their own fat binary: they link as host objects.
        env.Program("prog", objects + host, CXX="%(clangxx)s", LINKCOM="$CXX -o $TARGET $SOURCES",
                    LINKCOMSTR="@@LINK $TARGET")
    if ARGUMENTS.get("rdc_program"):
        env.OffloadProgram("rdc_prog", objects + host)
""")

#: What Clang 19 needs declared without CUDA's headers (-nocudainc); with headers the wrapper defines it all.
CUDA_MIN_H = textwrap.dedent("""
    #pragma once
    #ifndef __global__
    #define __global__ __attribute__((global))
    #define __device__ __attribute__((device))
    struct dim3 {
      unsigned x, y, z;
      dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
    };
    typedef struct CUstream_st *cudaStream_t;
    // The host side launches through these (the driver passes -target-sdk-version, so the new launch API)...
    extern "C" unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, unsigned long shared = 0,
                                                    void *stream = 0);
    extern "C" int cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, unsigned long shared,
                                    cudaStream_t stream);
    // ...and the device side, which has no SDK version, checks the legacy one is declared.
    extern "C" int cudaConfigureCall(dim3 grid, dim3 block, unsigned long shared = 0, cudaStream_t stream = 0);
    #endif
""")

SCALE_CU = textwrap.dedent("""
    #include "cuda_min.h"
    __global__ void scale(float *x, float a) { x[0] *= a; }
    void launch_scale(float *x) { scale<<<1, 1>>>(x, 2.0f); }
""")

SHIFT_CU = textwrap.dedent("""
    #include "cuda_min.h"
    __global__ void shift(float *x, float b) { x[0] += b; }
    __global__ void negate(float *x) { x[0] = -x[0]; }
    void launch_shift(float *x) { shift<<<1, 1>>>(x, 1.0f); negate<<<1, 1>>>(x); }
""")

MAIN_CPP = textwrap.dedent("""
    void launch_scale(float *);
    void launch_shift(float *);
    int check_runtime(int kernels);
    int main() {
      float x = 1.0f;
      launch_scale(&x);
      launch_shift(&x);
      return check_runtime(3);
    }
""")

#: The CUDA runtime entry points Clang's code calls, recording what it registers and launches.
STUB_RUNTIME_CPP = textwrap.dedent("""
    #include <cstdio>
    #include <cstring>
    struct dim3 { unsigned x, y, z; };
    struct FatbinWrapper { int magic; int version; const void *data; void *unused; };
    static const void *registered[16]; static const char *names[16]; static int n_registered, n_binaries;
    static const void *launched[16]; static int n_launched, bad;
    extern "C" void **__cudaRegisterFatBinary(void *wrapper) {
      const FatbinWrapper *w = static_cast<const FatbinWrapper *>(wrapper);
      unsigned magic; std::memcpy(&magic, w->data, 4);
      if (w->magic != 0x466243b1 || magic != 0xBA55ED50u) bad++;
      n_binaries++;
      return reinterpret_cast<void **>(wrapper);
    }
    extern "C" void __cudaRegisterFatBinaryEnd(void **) {}
    extern "C" void __cudaUnregisterFatBinary(void **) {}
    extern "C" void __cudaRegisterFunction(void **, const void *host, char *, const char *name, int, void *,
                                           void *, void *, void *, int *) {
      registered[n_registered] = host; names[n_registered++] = name;
    }
    extern "C" void __cudaRegisterVar(void **, char *, char *, const char *, int, unsigned long, int, int) {}
    extern "C" unsigned __cudaPushCallConfiguration(dim3, dim3, unsigned long, void *) { return 0; }
    extern "C" int __cudaPopCallConfiguration(dim3 *, dim3 *, unsigned long *, void *) { return 0; }
    extern "C" int cudaLaunchKernel(const void *func, dim3, dim3, void **, unsigned long, void *) {
      launched[n_launched++] = func; return 0;
    }
    int check_runtime(int kernels) {
      int ok = bad == 0 && n_binaries > 0 && n_registered == kernels && n_launched == kernels;
      for (int i = 0; i < n_registered; i++) {
        int seen = 0;
        for (int j = 0; j < n_launched; j++) seen += launched[j] == registered[i];
        std::printf("kernel %s registered once, launched %d time(s)\\n", names[i], seen);
        ok = ok && seen == 1;
      }
      std::printf("binaries=%d registered=%d launched=%d: %s\\n", n_binaries, n_registered, n_launched,
                  ok ? "ok" : "FAILED");
      return ok ? 0 : 1;
    }
""")


class Project:
    def __init__(self, root: Path, clangxx: Path) -> None:
        root.mkdir()
        self.root = root
        (root / "SConstruct").write_text(SCONSTRUCT % {"phases": PHASES, "clangxx": clangxx})
        for name, text in (("cuda_min.h", CUDA_MIN_H), ("scale.cu", SCALE_CU), ("shift.cu", SHIFT_CU),
                           ("main.cpp", MAIN_CPP), ("stub_runtime.cpp", STUB_RUNTIME_CPP)):
            (root / name).write_text(text)

    def scons(self, *args: str, check: bool = True) -> Build:
        return run_scons(self.root, *args, check=check)


@pytest.fixture
def project(tmp_path, llvm19, cuda) -> Project:
    return Project(tmp_path / "cuda", llvm19("clang++"))


def fatbin_entries(path: Path) -> list[tuple[str, str]]:
    """(kind, arch) of every entry of the NVIDIA fat binaries in ``path`` (an object or a fat binary)."""
    payloads = inspect_file(path).payloads
    return [(entry.kind, entry.arch) for payload in payloads if payload.format == "nvidia fatbin"
            for entry in payload.entries]


def targets_of(build: Build, phase: str) -> list[str]:
    return sorted(target for ran, target in build.commands if ran == phase)


def test_clang19_cuda_program_registers_and_launches_each_kernel_once(project):
    build = project.scons()
    # one node per source and target compiles the PTX and assembles the cubin (its first target, which both
    # steps' messages name); the fat binary takes both files
    cubins = ["scale.sm_80.cubin", "scale.sm_90.cubin", "shift.sm_80.cubin", "shift.sm_90.cubin"]
    assert targets_of(build, "DEVICE") == targets_of(build, "ASSEMBLE") == cubins
    assert all((project.root / cubin.replace(".cubin", ".dev.s")).is_file() for cubin in cubins)
    assert targets_of(build, "BUNDLE") == ["scale.fatbin", "shift.fatbin"]
    assert targets_of(build, "HOST") == ["scale.o", "shift.o"]
    # Clang 19's fatbinary job embeds each target's cubin and PTX; CUDA 13's fatbinary wrote them.
    expected = [("elf", "sm_80"), ("ptx", "compute_80"), ("elf", "sm_90"), ("ptx", "compute_90")]
    for stem in ("scale", "shift"):
        assert fatbin_entries(project.root / f"{stem}.fatbin") == expected
        assert fatbin_entries(project.root / f"{stem}.o") == expected  # the .nv_fatbin section
    ran = subprocess.run([str(project.root / "prog")], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "binaries=2 registered=3 launched=3: ok" in ran.stdout, ran.stdout
    for kernel in ("scale", "shift", "negate"):  # the device names Clang registers (mangled)
        assert any(line.startswith("kernel _Z") and kernel in line and line.endswith("registered once, launched 1"
                                                                                      " time(s)")
                   for line in ran.stdout.splitlines()), ran.stdout
    assert project.scons().commands == []  # and nothing runs again


def test_adding_a_target_compiles_only_that_target_and_removing_one_compiles_nothing(project):
    project.scons("program=0")
    added = project.scons("archs=sm_80,sm_90,sm_86", "program=0")
    assert targets_of(added, "DEVICE") == targets_of(added, "ASSEMBLE") == ["scale.sm_86.cubin", "shift.sm_86.cubin"]
    assert targets_of(added, "BUNDLE") == ["scale.fatbin", "shift.fatbin"]
    assert targets_of(added, "HOST") == ["scale.o", "shift.o"]
    assert [arch for kind, arch in fatbin_entries(project.root / "scale.o") if kind == "elf"] == [
        "sm_80", "sm_86", "sm_90"]
    removed = project.scons("archs=sm_90,sm_86", "program=0")
    assert targets_of(removed, "DEVICE") == [] and targets_of(removed, "ASSEMBLE") == []
    assert targets_of(removed, "BUNDLE") == ["scale.fatbin", "shift.fatbin"]
    assert [arch for kind, arch in fatbin_entries(project.root / "scale.o") if kind == "elf"] == ["sm_86", "sm_90"]


def test_a_cuda_source_without_an_nvptx_target_is_one_error(project):
    build = project.scons("archs=x86_64,gfx90a", "program=0", check=False)
    assert build.returncode != 0
    assert ("scale.cu: the cuda model compiles for NVPTX (e.g. sm_90) targets, and OFFLOAD_ARCHS (gfx90a,x86_64)"
            " has none; add one to OFFLOAD_ARCHS") in build.output, build.output
    assert "Traceback" not in build.output and build.commands == []


def test_cuda_flags_and_cuda_path_reach_the_driver(project, tmp_path):
    """$OFFLOAD_CUDA_FLAGS reach every compile; $CUDA_PATH is the installation the driver gets (its ptxas and
    fatbinary run from there); a flag that would fight the split is one error."""
    linked = tmp_path / "cuda-link"
    linked.symlink_to(os.path.realpath("/usr/local/cuda"))
    done = subprocess.run([SCONS, "-Q", "-n", "program=0", "verbose=1", "cuda_flags=-DFROM_CUDA_FLAGS"],
                          cwd=project.root, capture_output=True, text=True, env=dict(os.environ, CUDA_PATH=str(linked)))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    compiles = [line for line in lines if " -cc1 " in line]
    assert len(compiles) == 6 and all("-D FROM_CUDA_FLAGS" in line for line in compiles), done.stdout
    tools = [line.split()[0] for line in lines if "/bin/ptxas " in line or "/bin/fatbinary " in line]
    assert sorted(tools) == sorted([f"{linked}/bin/ptxas"] * 4 + [f"{linked}/bin/fatbinary"] * 2), done.stdout
    bad = project.scons("cuda_flags=--cuda-gpu-arch=sm_70", "program=0", check=False)
    assert bad.returncode != 0 and "CUDA compile flags must not contain --cuda-gpu-arch=sm_70" in bad.output
    assert "Traceback" not in bad.output and bad.commands == []



def test_clang19_rdc_program_links_through_our_nodes(project, llvm19):
    """$OFFLOAD_RDC: relocatable cubins in offload binaries (kind cuda); the program's nodes extract them per
    target, link them (nvlink), put the linked cubins in one CUDA 13 fat binary registered by
    __cudaRegisterFatBinary; the stub runtime sees each kernel of both sources registered once, launched once."""
    build = project.scons("offload_rdc=1", "program=0", "rdc_program=1")
    assert targets_of(build, "PACKAGE") == ["scale.offload.pkg", "shift.offload.pkg"]
    assert targets_of(build, "BUNDLE") == []
    assert targets_of(build, "EXTRACT") == ["rdc_prog.sm_80.devin", "rdc_prog.sm_90.devin"]
    assert targets_of(build, "DEVICELINK") == ["rdc_prog.sm_80.img", "rdc_prog.sm_90.img"]
    assert targets_of(build, "WRAP") == ["rdc_prog.offload.wrapper.o"]
    images = [(p.kind, p.triple, p.arch) for p in inspect_file(project.root / "scale.o").payloads]
    assert images == [("cuda", "nvptx64-nvidia-cuda", "sm_80"), ("cuda", "nvptx64-nvidia-cuda", "sm_90")]
    assert fatbin_entries(project.root / "rdc_prog.offload.wrapper.o") == [("elf", "sm_80"), ("elf", "sm_90")]
    ran = subprocess.run([str(project.root / "rdc_prog")], capture_output=True, text=True,
                         env=dict(os.environ, LD_LIBRARY_PATH=str(llvm19("clang").parent.parent / "lib")))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "binaries=1 registered=3 launched=3: ok" in ran.stdout, ran.stdout
    added = project.scons("offload_rdc=1", "program=0", "rdc_program=1", "archs=sm_80,sm_90,sm_86")
    assert targets_of(added, "DEVICE") == ["scale.sm_86.cubin", "shift.sm_86.cubin"]
    assert targets_of(added, "DEVICELINK") == ["rdc_prog.sm_86.img"]


OFFLOAD_LINK = str(Path(sys.executable).with_name("offload-link"))


def test_offload_link_registers_cuda_rdc_code_as_the_scons_link_does(project, llvm19):
    """``offload-link``, run by the driver in clang-linker-wrapper's place with the flags a Meson build links
    with (``--print-link-args``), registers the linked cubins as the SCons link does: one CUDA 13 fat binary
    (the SCons program's ``.nv_fatbin`` byte for byte) behind ``__cudaRegisterFatBinary``, not as OpenMP
    images (the OpenMP device runtime's members it links register with libomptarget, in both links, as with
    Clang); the stub CUDA runtime sees each kernel registered once and launched once. Without OpenMP's flags
    the program registers the CUDA fat binary alone and needs no libomptarget."""
    project.scons("offload_rdc=1", "program=0", "rdc_program=1")
    link_args = subprocess.run([OFFLOAD_LINK, "--print-link-args"], capture_output=True, text=True,
                               check=True).stdout.split()
    shim = next(arg for arg in link_args if arg.startswith("-B"))
    objects = [f"{stem}.o" for stem in ("scale", "shift", "main", "stub_runtime")]
    theirs = project.root / "rdc_prog"
    for name, flags in (("ours", link_args), ("cuda_only", ["--offload-link", shim])):
        linked = subprocess.run([str(llvm19("clang++")), "-fuse-ld=lld", *objects, *flags, "-o", name],
                                cwd=project.root, capture_output=True, text=True)
        assert linked.returncode == 0, linked.stderr
        ours = project.root / name
        assert fatbin_entries(ours) == [("elf", "sm_80"), ("elf", "sm_90")]
        payloads = [(p.format, p.kind) for p in inspect_file(ours).payloads]
        if name == "ours":  # the same device files (the device runtime's members too): the same cubins
            assert _nv_fatbin(llvm19, ours) == _nv_fatbin(llvm19, theirs)
            assert payloads == [(p.format, p.kind) for p in inspect_file(theirs).payloads]
            runtime = dict(os.environ, LD_LIBRARY_PATH=str(llvm19("clang").parent.parent / "lib"))
        else:
            assert payloads == [("nvidia fatbin", "cuda")]
            runtime = dict(os.environ)
        ran = subprocess.run([str(ours)], capture_output=True, text=True, env=runtime)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert "binaries=1 registered=3 launched=3: ok" in ran.stdout, ran.stdout


def curand_include() -> Path:
    """The include directory with ``curand_mtgp32_kernel.h`` (Clang 22's CUDA wrapper includes it; CUDA 13
    lacks it): ``$OFFLOAD_CURAND_INCLUDE``, else the ``nvidia-curand`` wheel's (a test dependency)."""
    named = os.environ.get("OFFLOAD_CURAND_INCLUDE")
    candidates = [Path(named)] if named else []
    spec = importlib.util.find_spec("nvidia")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidates += sorted(Path(location).glob("*/include"))
    for directory in candidates:
        if (directory / "curand_mtgp32_kernel.h").is_file():
            return directory
    pytest.fail("curand_mtgp32_kernel.h not found: install the test dependencies (pip install -e .[test], which"
                " brings nvidia-curand) or point $OFFLOAD_CURAND_INCLUDE at a directory holding it")


def _nv_fatbin(llvm22, obj: Path) -> bytes:
    dumped = obj.with_name(obj.name + ".nv_fatbin")
    subprocess.run([str(llvm22("llvm-objcopy")), f"--dump-section=.nv_fatbin={dumped}", str(obj), os.devnull],
                   check=True, capture_output=True)
    return dumped.read_bytes()


def test_clang22_objects_carry_the_one_command_compiles_fat_binary(tmp_path, llvm22, cuda):
    """Clang 22 with CUDA 13's own headers: each object's .nv_fatbin equals, byte for byte, the one that
    ``clang++ -x cuda --cuda-gpu-arch=sm_90 --cuda-gpu-arch=sm_80 -cuid=<same>`` embeds (its fatbinary job
    writes cubins only, sorted by architecture)."""
    include = curand_include()
    project = Project(tmp_path / "cuda22", llvm22("clang++"))
    build = project.scons(f"clang={llvm22('clang')}", "archs=sm_90,sm_80", f"cuda_flags=-I{include}", "program=0")
    assert targets_of(build, "ASSEMBLE") == ["scale.sm_80.cubin", "scale.sm_90.cubin",
                                             "shift.sm_80.cubin", "shift.sm_90.cubin"]
    for stem in ("scale", "shift"):
        obj = project.root / f"{stem}.o"
        assert fatbin_entries(obj) == [("elf", "sm_80"), ("elf", "sm_90")]
        reference = project.root / f"{stem}.reference.o"
        subprocess.run([str(llvm22("clang++")), "-x", "cuda", "--cuda-gpu-arch=sm_90", "--cuda-gpu-arch=sm_80",
                        f"-cuid={default_cuid(f'{stem}.cu')}", f"--cuda-path={Path(str(cuda('ptxas'))).parent.parent}",
                        "-O2", "-I.", f"-I{include}", "-c", f"{stem}.cu", "-o", str(reference)],
                       cwd=project.root, check=True, capture_output=True)
        assert _nv_fatbin(llvm22, obj) == _nv_fatbin(llvm22, reference), stem
