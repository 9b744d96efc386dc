"""One OffloadProgram from OpenMP and HIP objects (plain and relocatable device code), a static library of
both and plain host objects, linked without clang-linker-wrapper as Clang 19's wrapper links them.

The project is sample_project's heterogeneous program (sample_project/mixed, targets x86_64 and gfx90a):
its OpenMP regions run on the x86_64 host device and its stub HIP runtime counts registrations and launches.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO_ROOT

pytestmark = pytest.mark.slow

SCONS = str(Path(sys.executable).with_name("scons"))
LLVM = Path("/usr/lib/llvm-19/bin")
RUN_ENV = dict(os.environ, OMP_TARGET_OFFLOAD="MANDATORY", LD_LIBRARY_PATH="/usr/lib/llvm-19/lib")


def _copy_sample(root: Path) -> Path:
    copy = root / "sample_project"
    shutil.copytree(REPO_ROOT / "sample_project", copy, ignore=shutil.ignore_patterns("build", ".sconsign*"))
    return copy


def _traced_scons(cwd: Path, log: Path, *args: str) -> tuple[str, list[str]]:
    """Run scons under ``strace -f``; its output and the path of every program started."""
    strace = shutil.which("strace")
    if not strace:
        pytest.fail("strace is missing: run scripts/bootstrap (it installs it) or apt-get install strace")
    done = subprocess.run([strace, "-f", "-qq", "-e", "trace=execve", "-e", "status=successful", "-o", str(log),
                           SCONS, *args], cwd=cwd, capture_output=True, text=True)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    programs = re.findall(r'execve\("([^"]+)"', log.read_text(errors="replace"))
    return output, programs


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """sample_project's mixed program, built (and run by its SConscript) under strace."""
    root = tmp_path_factory.mktemp("mixed")
    sample = _copy_sample(root)
    output, programs = _traced_scons(sample, root / "strace.log", "build/mixed")
    return sample / "build" / "mixed", output, programs


def _registrations(output: str) -> list[str]:
    return sorted(line for line in output.splitlines() if line.startswith(("kernel ", "variable ")))


def test_mixed_program_links_without_the_linker_wrapper_and_runs(mixed):
    build, output, programs = mixed
    assert not [p for p in programs if "clang-linker-wrapper" in p]
    assert "OpenMP target regions ran on an offload device: yes" in output
    for kernel in ("_Z12plain_kernelPi", "_Z14rescale_kernelPi", "_Z10lib_kernelPi"):
        assert f"HIP kernel {kernel}: registered 1, launched 1" in output
    assert "HIP kernels each registered once and launched once: yes" in output
    assert (build / "mixed.run.log").read_text().endswith("PASSED\n")
    # Each registered once: the plain object's own fat binary, and the wrapper's for the RDC code.
    assert _registrations(output) == ["kernel _Z10lib_kernelPi", "kernel _Z12plain_kernelPi",
                                      "kernel _Z14rescale_kernelPi", "variable scale_factor"]


def test_one_device_link_per_target_for_both_kinds(mixed):
    """Clang 19 groups device code by (triple, arch) across offload kinds: one gfx90a image holds the OpenMP
    regions and the HIP RDC kernels (library members included), registered by both kinds."""
    build, output, _ = mixed
    links = re.findall(r"^device link \[[^]]+\]: (\S+)$", output, re.M)
    assert sorted(link for link in links if "/mixed." in link) == ["build/mixed/mixed.gfx90a.img",
                                                                   "build/mixed/mixed.x86_64.img"]
    symbols = subprocess.run([LLVM / "llvm-nm", build / "mixed.gfx90a.img"], capture_output=True, text=True,
                             check=True).stdout
    for name in ("_Z14rescale_kernelPi", "_Z10lib_kernelPi", "scale_factor", "lib_offset", "_Z7omp_sumi"):
        assert name in symbols, name
    assert "_Z12plain_kernelPi" not in symbols  # the plain object's code is in its own fat binary
    wrapper = build / "mixed.offload.wrapper.o"
    sections = subprocess.run([LLVM / "llvm-readelf", "-S", "-W", wrapper], capture_output=True, text=True,
                              check=True).stdout
    for section in (".llvm.offloading", ".hip_fatbin", ".hipFatBinSegment", ".init_array.101"):
        assert section in sections, section


def _images_per_kind(program: Path, hip_bundle: Path, tmp: Path) -> dict[str, list[str]]:
    """OpenMP: the (triple, arch) of each image in ``program``'s ``.llvm.offloading``; HIP: the entries of
    the fat binary ``hip_bundle``."""
    listing = subprocess.run([LLVM / "llvm-objdump", "--offloading", program], capture_output=True, text=True,
                             check=True).stdout
    arches = re.findall(r"^arch\s*(\S*)\s*$", listing, re.M)
    triples = re.findall(r"^triple\s+(\S+)", listing, re.M)
    bundle = subprocess.run([LLVM / "clang-offload-bundler", "-list", "-type=o", f"-input={hip_bundle}"],
                            capture_output=True, text=True, check=True).stdout.split()
    return {"openmp": sorted(f"{t}/{a}" for t, a in zip(triples, arches)), "hip": sorted(bundle)}


def test_the_same_images_per_kind_as_clang_linker_wrapper(mixed, tmp_path):
    """clang++ -fopenmp --offload-arch=gfx90a over the same objects (clang-linker-wrapper --save-temps):
    the same images registered per kind, and the same registrations at run time."""
    build, output, _ = mixed
    objects = [build / name for name in ("omp_part.o", "plain.o", "scale.o", "rescale.o", "main.o", "hip_stub.o")]
    reference = tmp_path / "reference"
    subprocess.run([LLVM / "clang++", "-fopenmp", "--offload-arch=gfx90a", *objects, build / "libmixedlib.a",
                    "-o", reference, "-Wl,--save-temps"], cwd=tmp_path, check=True, capture_output=True)
    ours_bundle = tmp_path / "ours.hipfb"
    subprocess.run([LLVM / "llvm-objcopy", f"--dump-section=.hip_fatbin={ours_bundle}",
                    build / "mixed.offload.wrapper.o", os.devnull], check=True)
    theirs = _images_per_kind(reference, tmp_path / "reference.hipfb", tmp_path)
    ours = _images_per_kind(build / "mixed", ours_bundle, tmp_path)
    assert ours == theirs == {"openmp": ["amdgcn-amd-amdhsa/gfx90a", "x86_64-unknown-linux-gnu/"],
                              "hip": ["hip-amdgcn-amd-amdhsa--gfx90a", "host-x86_64-unknown-linux--"]}
    ran = subprocess.run([reference], env=RUN_ENV, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert _registrations(ran.stdout) == _registrations(output)


def test_offload_link_registers_each_kind_as_the_scons_link_does(mixed, tmp_path):
    """The same objects and library linked by the driver with ``offload-link`` in clang-linker-wrapper's place
    (``clang++ -fopenmp --offload-arch=gfx90a -B<shim dir>``): the gfx90a image registered by both kinds, as
    an OpenMP image and in the HIP fat binary (the SCons program's ``.hip_fatbin`` byte for byte), the x86_64
    image by OpenMP; the program runs, with the SCons program's registrations."""
    build, output, _ = mixed
    objects = [build / name for name in ("omp_part.o", "plain.o", "scale.o", "rescale.o", "main.o", "hip_stub.o")]
    shim = subprocess.run([Path(sys.executable).with_name("offload-link"), "--print-shim-dir"], capture_output=True,
                          text=True, check=True).stdout.strip()
    ours = tmp_path / "ours"
    linked = subprocess.run([LLVM / "clang++", f"-B{shim}", "-fopenmp", "--offload-arch=gfx90a", *objects,
                             build / "libmixedlib.a", "-o", ours], cwd=tmp_path, capture_output=True, text=True)
    assert linked.returncode == 0, linked.stderr
    bundles = []
    for program in (ours, build / "mixed"):
        bundles.append(tmp_path / f"{program.name}.hipfb")
        subprocess.run([LLVM / "llvm-objcopy", f"--dump-section=.hip_fatbin={bundles[-1]}", program, os.devnull],
                       check=True)
    assert bundles[0].read_bytes() == bundles[1].read_bytes()
    assert _images_per_kind(ours, bundles[0], tmp_path) == {
        "openmp": ["amdgcn-amd-amdhsa/gfx90a", "x86_64-unknown-linux-gnu/"],
        "hip": ["hip-amdgcn-amd-amdhsa--gfx90a", "host-x86_64-unknown-linux--"]}
    ran = subprocess.run([ours], env=RUN_ENV, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "OpenMP target regions ran on an offload device: yes" in ran.stdout
    assert "HIP kernels each registered once and launched once: yes" in ran.stdout
    assert _registrations(ran.stdout) == _registrations(output)


PLAIN_SCONSTRUCT = textwrap.dedent("""
    import offload_builders.scons
    env = Environment(tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()],
                      OFFLOAD_ARCHS=["x86_64", "gfx90a"], OFFLOAD_FLAGS=["-O2"], CPPPATH=["hip/include"],
                      OFFLOAD_HIP_FLAGS=["-nogpulib", "-nogpuinc"])
    host = env.Clone(CXX=env["OFFLOAD_CXX"])
    objects = [env.OffloadObject("mixed/src/omp_part.cpp"), env.OffloadObject("mixed/src/plain.hip"),
               host.Object("main.cpp"), host.Object("mixed/src/hip_stub.cpp")]
    env.OffloadProgram("prog", objects, OFFLOAD_HIP_RUNTIME=[])
    env.OffloadProgram("prog_rt", objects)  # the HIP runtime by default: libamdhip64 of the installation
""")

PLAIN_MAIN = textwrap.dedent("""
    #include <cstdio>
    int omp_sum(int n);
    void launch_plain(int *out);
    int hip_stub_check();
    int main() {
      int sum = omp_sum(10);
      launch_plain(nullptr);
      int ok = hip_stub_check() && sum == 55;
      std::printf("%s\\n", ok ? "PASSED" : "FAILED");
      return !ok;
    }
""")


def test_openmp_with_plain_hip_objects_only(tmp_path):
    """No RDC code: the plain HIP object registers itself, the wrapper holds OpenMP's registration only (as
    clang-linker-wrapper makes no HIP wrapper then), the program runs both, and links both runtimes."""
    sample = _copy_sample(tmp_path)
    (sample / "SConstruct").write_text(PLAIN_SCONSTRUCT)
    (sample / "main.cpp").write_text(PLAIN_MAIN)
    _, programs = _traced_scons(sample, tmp_path / "strace.log", "-Q", "prog", "prog_rt")
    assert not [p for p in programs if "clang-linker-wrapper" in p]
    sections = subprocess.run([LLVM / "llvm-readelf", "-S", "-W", sample / "prog.offload.wrapper.o"],
                              capture_output=True, text=True, check=True).stdout
    assert ".llvm.offloading" in sections and ".hip_fatbin" not in sections
    ran = subprocess.run([sample / "prog"], env=RUN_ENV, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "HIP kernel _Z12plain_kernelPi: registered 1, launched 1" in ran.stdout
    assert ran.stdout.endswith("PASSED\n")
    # The host link has the runtime of each kind present: OpenMP's, and HIP's for the plain HIP object.
    dynamic = subprocess.run([LLVM / "llvm-readelf", "-d", sample / "prog_rt"], capture_output=True, text=True,
                             check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^]]+)\]", dynamic)
    assert any(name.startswith("libomptarget.so") for name in needed), needed
    assert any(name.startswith("libamdhip64.so") for name in needed), needed
