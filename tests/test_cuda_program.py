"""CUDA programs that link themselves: ``env.OffloadProgram('app', ['main.cu'])`` with the real Clang 19 or 22 and
CUDA 13, plain and relocatable device code.

* A program without OpenMP code needs no OpenMP device runtime (Clang 22 has none here) and links none of
  OpenMP's runtime; it links the CUDA runtime, ``$OFFLOAD_CUDA_RUNTIME`` (default ``-L<CUDA_PATH>/lib64
  -lcudart``): its ``DT_NEEDED`` names ``libcudart.so.13``. ``[]`` links none (the project's own stand-in here),
  and an installation without ``libcudart`` is a warning.
* A program of OpenMP and CUDA code still links OpenMP's way (``libomptarget``) and the CUDA runtime beside it.
* The NVPTX device runtime's nodes print a message by default, not the repr of their in-process functions.

No GPU here: the link and the dynamic section are the test; a program that runs finds no device and says so.
"""
from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

from test_cuda import curand_include
from test_scons_tool import Build, run_scons

pytestmark = pytest.mark.slow

PHASES = ("HOST", "DEVICE", "ASSEMBLE", "BUNDLE", "PACKAGE", "EMBED", "EXTRACT", "DEVICELINK", "WRAP", "LINK")

SCONSTRUCT = textwrap.dedent("""
    import offload_builders.scons
    env = Environment(
        tools=["default", "offload"],
        toolpath=[offload_builders.scons.toolpath()],
        OFFLOAD_ARCHS=ARGUMENTS.get("archs", "sm_80"),
        OFFLOAD_FLAGS=["-O2"],
        CPPPATH=["#"],
        # as the tool loads, so that the host link runs this Clang's driver too
        **({"OFFLOAD_CLANG": ARGUMENTS["clang"]} if ARGUMENTS.get("clang") else {}),
    )
    if ARGUMENTS.get("model"):
        env["OFFLOAD_MODEL"] = ARGUMENTS["model"]
    if ARGUMENTS.get("cuda_flags"):
        env["OFFLOAD_CUDA_FLAGS"] = ARGUMENTS["cuda_flags"].split(",")
    if ARGUMENTS.get("rdc"):
        env["OFFLOAD_RDC"] = True
    if ARGUMENTS.get("libpath"):
        env.Append(LIBPATH=[ARGUMENTS["libpath"]])
    if "cuda_runtime" in ARGUMENTS:
        env["OFFLOAD_CUDA_RUNTIME"] = [name for name in ARGUMENTS["cuda_runtime"].split(",") if name]
    for phase in %(phases)r:
        env["OFFLOAD_%%sCOMSTR" %% phase] = "@@%%s $TARGET" %% phase
    sources = ARGUMENTS.get("sources", "main.cu").split(",")
    env.OffloadProgram("app", [File(s) if s.endswith(".o") else s for s in sources])
""")

#: What Clang 19 needs declared without CUDA's headers (-nocudainc), sample_project/cuda/include/cuda_min.h's
#: declarations and the two runtime calls main.cu makes; with CUDA's headers (Clang 22) the wrapper defines it all.
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
    extern "C" unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, unsigned long shared = 0,
                                                    void *stream = 0);
    extern "C" int cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, unsigned long shared,
                                    cudaStream_t stream);
    extern "C" int cudaConfigureCall(dim3 grid, dim3 block, unsigned long shared = 0, cudaStream_t stream = 0);
    extern "C" int cudaGetDeviceCount(int *count);
    extern "C" int cudaDeviceSynchronize();
    #endif
""")

#: A kernel and a host main that launches it where the CUDA runtime finds a device (none here).
MAIN_CU = textwrap.dedent("""
    #include <cstdio>
    #include "cuda_min.h"
    __global__ void touch() {}
    int main() {
      int devices = 0;
      int status = cudaGetDeviceCount(&devices);
      if (status != 0 || devices == 0) {
        std::printf("no CUDA device (status %d)\\n", status);
        return 0;
      }
      touch<<<1, 1>>>();
      return cudaDeviceSynchronize();
    }
""")

#: The project's own stand-in for the CUDA runtime (``OFFLOAD_CUDA_RUNTIME=[]``), in a CUDA source of its own:
#: it counts what the program registers and launches.
STUB_CU = textwrap.dedent("""
    #include <cstdio>
    struct dim3 { unsigned x, y, z; };
    static int kernels, launches;
    extern "C" {
    void **__cudaRegisterFatBinary(void *) { static void *handle; return &handle; }
    void __cudaRegisterFatBinaryEnd(void **) {}
    void __cudaUnregisterFatBinary(void **) {}
    void __cudaRegisterFunction(void **, const void *, char *, const char *, int, void *, void *, void *, void *,
                                int *) { ++kernels; }
    void __cudaRegisterVar(void **, char *, char *, const char *, int, unsigned long, int, int) {}
    unsigned __cudaPushCallConfiguration(dim3, dim3, unsigned long, void *) { return 0; }
    int __cudaPopCallConfiguration(dim3 *, dim3 *, unsigned long *, void *) { return 0; }
    int cudaLaunchKernel(const void *, dim3, dim3, void **, unsigned long, void *) { ++launches; return 0; }
    int cudaGetDeviceCount(int *count) { *count = 1; return 0; }
    int cudaDeviceSynchronize() { std::printf("stub: kernels=%d launches=%d\\n", kernels, launches); return 0; }
    }
""")

#: OpenMP code with a generic-mode kernel: for an NVPTX target its link needs the device runtime, so the
#: runtime's own nodes (RUNTIMESYMS, RUNTIMELINK) do work (see offload_builders.linking.nvptx_runtime).
OMP_CPP = textwrap.dedent("""
    #include <omp.h>
    int on_device() {
      int on = 0;
      #pragma omp target map(from : on)
      on = !omp_is_initial_device();
      return on;
    }
""")

#: main.cu's host code calling the OpenMP part too.
MIXED_MAIN_CU = MAIN_CU.replace("int main() {", "int on_device();\nint main() {\n  std::printf(\"openmp on device:"
                                                " %d\\n\", on_device());")


class Project:
    def __init__(self, root: Path) -> None:
        root.mkdir()
        self.root = root
        (root / "SConstruct").write_text(SCONSTRUCT % {"phases": PHASES})
        for name, text in (("cuda_min.h", CUDA_MIN_H), ("main.cu", MAIN_CU), ("stub.cu", STUB_CU),
                           ("omp.cpp", OMP_CPP), ("mixed_main.cu", MIXED_MAIN_CU)):
            (root / name).write_text(text)

    def scons(self, *args: str, env: dict[str, str] | None = None, check: bool = True) -> Build:
        return run_scons(self.root, *args, env=env, check=check)

    def needed(self, name: str = "app") -> list[str]:
        """The program's ``DT_NEEDED`` entries."""
        with open(self.root / name, "rb") as f:
            dynamic = next(s for s in ELFFile(f).iter_sections() if isinstance(s, DynamicSection))
            return [tag.needed for tag in dynamic.iter_tags() if tag.entry.d_tag == "DT_NEEDED"]

    def run(self, name: str = "app") -> str:
        done = subprocess.run([str(self.root / name)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout


def phases(build: Build) -> set[str]:
    return {phase for phase, _ in build.commands}


def openmp_runtimes(needed: list[str]) -> list[str]:
    return [name for name in needed if name.startswith(("libomp", "libomptarget"))]


@pytest.fixture
def project(tmp_path, cuda) -> Project:
    return Project(tmp_path / "app")


def _clang22_args(llvm22) -> list[str]:
    """Clang 22 with CUDA 13's own headers (and curand's, which its wrapper includes and CUDA 13 lacks)."""
    return [f"clang={llvm22('clang')}", f"cuda_flags=-I{curand_include()}"]


@pytest.mark.parametrize("model", ["openmp", "cuda"])
def test_clang22_plain_cuda_program_links_the_cuda_runtime_alone(project, llvm22, model):
    """Clang 22 here has no OpenMP device runtime: a CUDA program needs none, whatever the environment's model.
    The plain object registers its own fat binary, so there is no link side; the host link adds libcudart."""
    build = project.scons(*_clang22_args(llvm22), f"model={model}")
    assert phases(build) == {"DEVICE", "ASSEMBLE", "BUNDLE", "HOST", "LINK"}, build.output
    needed = project.needed()
    assert "libcudart.so.13" in needed and openmp_runtimes(needed) == [], needed
    assert "no CUDA device" in project.run()  # the real libcudart loads; it finds no GPU here
    assert project.scons(*_clang22_args(llvm22), f"model={model}").commands == []


def test_clang22_rdc_cuda_program_links_the_cuda_runtime_alone(project, llvm22, cuda):
    """Relocatable device code from Clang 22's own driver (``-fgpu-rdc``), linked by OffloadProgram: extract,
    device link (nvlink) and registration for sm_80, no OpenMP device runtime, libcudart on the host link."""
    subprocess.run([str(llvm22("clang++")), "-x", "cuda", "--cuda-gpu-arch=sm_80", "-fgpu-rdc", "-O2",
                    f"--cuda-path={Path(str(cuda('ptxas'))).parent.parent}", f"-I{curand_include()}", "-c", "main.cu",
                    "-o", "main.o"], cwd=project.root, check=True, capture_output=True)
    build = project.scons(*_clang22_args(llvm22), "sources=main.o")
    assert sorted(build.commands) == [("DEVICELINK", "app.sm_80.img"), ("EXTRACT", "app.sm_80.devin"),
                                      ("LINK", "app"), ("WRAP", "app.offload.wrapper.o")], build.output
    assert not list(project.root.glob("*devicertl*"))
    needed = project.needed()
    assert "libcudart.so.13" in needed and openmp_runtimes(needed) == [], needed
    assert "no CUDA device" in project.run()


def test_clang22_rdc_cuda_source_builds_into_a_program(project, llvm22):
    """Clang 22's driver packages relocatable device code with llvm-offload-binary (Clang 19's with
    clang-offload-packager): the model takes either job."""
    build = project.scons(*_clang22_args(llvm22), "rdc=1")
    assert "WRAP" in phases(build) and "libcudart.so.13" in project.needed()


@pytest.mark.parametrize("rdc", [False, True])
def test_clang19_cuda_program_links_the_cuda_runtime_and_no_openmp(project, llvm19, rdc):
    """Clang 19 (-nocudainc: the source declares what it uses) has the OpenMP device runtime, but a program of
    CUDA objects alone links as ``clang++`` without ``-fopenmp`` does: none of OpenMP's runtimes."""
    build = project.scons(*(["rdc=1"] if rdc else []))
    ran = phases(build)
    if rdc:
        assert {"PACKAGE", "EXTRACT", "DEVICELINK", "WRAP"} <= ran, build.output
        assert not list(project.root.glob("*devicertl*"))
    else:
        assert ran == {"DEVICE", "ASSEMBLE", "BUNDLE", "HOST", "LINK"}, build.output
    needed = project.needed()
    assert "libcudart.so.13" in needed and openmp_runtimes(needed) == [], needed
    assert "no CUDA device" in project.run()


def test_an_empty_cuda_runtime_links_none_and_a_list_links_each(project, llvm19):
    """``OFFLOAD_CUDA_RUNTIME=[]``: no libcudart; the project's own runtime (here a stand-in) serves the program.
    A list links ``-l`` each, from ``$LIBPATH``."""
    project.scons("sources=main.cu,stub.cu", "cuda_runtime=")
    needed = project.needed()
    assert not [name for name in needed if name.startswith("libcudart")], needed
    assert "stub: kernels=1 launches=1" in project.run()
    project.scons("cuda_runtime=cudart", f"libpath={Path('/usr/local/cuda/lib64').resolve()}")
    assert "libcudart.so.13" in project.needed()


def test_no_cuda_runtime_in_the_installation_is_a_warning(project, llvm19, tmp_path):
    """A CUDA installation without libcudart (``$CUDA_PATH``): the program links without it, and the build says so
    once; ``OFFLOAD_CUDA_RUNTIME=[]`` silences it."""
    real = Path(os.path.realpath("/usr/local/cuda"))
    partial = tmp_path / "cuda-no-lib"
    partial.mkdir()
    for name in ("bin", "include", "nvvm"):
        (partial / name).symlink_to(real / name)
    env = dict(os.environ, CUDA_PATH=str(partial))
    build = project.scons("sources=main.cu,stub.cu", env=env)
    warnings = [line for line in build.output.splitlines() if "no CUDA runtime" in line]
    assert len(warnings) == 1 and f"lib64 or lib of {partial}" in warnings[0], build.output
    assert "OFFLOAD_CUDA_RUNTIME" in warnings[0]
    assert not [name for name in project.needed() if name.startswith("libcudart")]
    quiet = project.scons("sources=main.cu,stub.cu", "cuda_runtime=", "-n", env=env)
    assert "no CUDA runtime" not in quiet.output


def test_an_input_the_tool_did_not_compile_needs_an_openmp_device_runtime_only_where_there_is_one(
        project, llvm19, llvm22, tmp_path):
    """A host object compiled elsewhere may hold OpenMP code. With Clang 19, whose OpenMP device runtime is installed,
    such a program links OpenMP's way as it always did; Clang 22 has none, so the program links without it: the
    sm_80 image is empty (the CUDA object registers itself) and the wrapper registers nothing, needing no
    libomptarget. An input that does hold OpenMP code then stops the link, naming the missing runtime."""
    (project.root / "host.cpp").write_text("int host_helper() { return 1; }\n")
    subprocess.run([str(llvm19("clang++")), "-c", "host.cpp", "-o", "host.o"], cwd=project.root, check=True)
    build = project.scons(*_clang22_args(llvm22), "sources=main.cu,host.o")
    assert {"EXTRACT", "WRAP", "LINK"} <= phases(build) and "no device code" not in build.output, build.output
    needed = project.needed()
    assert "libcudart.so.13" in needed and openmp_runtimes(needed) == [], needed
    assert "no CUDA device" in project.run()
    # The same with Clang 19: OpenMP's link side, the OpenMP device runtime's members and libomptarget.
    before = Project(tmp_path / "clang19")
    (before.root / "host.o").write_bytes((project.root / "host.o").read_bytes())
    before.scons("sources=main.cu,host.o")
    assert any(name.startswith("libomptarget.so") for name in before.needed()), before.needed()
    # OpenMP device code (from Clang 19) in a Clang 22 program: the extract node says what is missing.
    subprocess.run([str(llvm19("clang++")), "-fopenmp", "--offload-arch=sm_80", "-nogpulib", "-c", "omp.cpp", "-o",
                    "omp.o"], cwd=project.root, check=True)
    failed = project.scons(*_clang22_args(llvm22), "sources=main.cu,host.o,omp.o", check=False)
    assert failed.returncode != 0
    assert ("scons: *** [app.sm_80.devin] omp.o: section .llvm.offloading: OpenMP device code for sm_80, but the"
            " program links no OpenMP device runtime: libomptarget.devicertl.a not found in") in failed.output, (
        failed.output)
    assert "Traceback" not in failed.output


def test_openmp_and_cuda_program_links_both_runtimes_and_runtime_nodes_say_what_they_do(project, llvm19):
    """OpenMP code beside CUDA code: OpenMP's link side as before (the device runtime, libomptarget) and libcudart.
    The sm_80 image's device runtime nodes print their default messages, not ``offload_runtime_...(...)``."""
    build = project.scons("archs=x86_64,sm_80", "sources=omp.cpp,mixed_main.cu")
    assert {"EMBED", "EXTRACT", "DEVICELINK", "WRAP", "LINK"} <= phases(build), build.output
    lines = build.output.splitlines()
    assert "device runtime interface [sm_80]: app.sm_80.devicertl.syms" in lines, build.output
    assert "device runtime link [sm_80]: app.sm_80.devicertl.pkg" in lines, build.output
    assert "offload_runtime_" not in build.output
    needed = project.needed()
    assert "libcudart.so.13" in needed and any(name.startswith("libomptarget.so") for name in needed), needed
    output = project.run()
    assert "openmp on device: " in output and "no CUDA device" in output, output
