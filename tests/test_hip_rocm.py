"""HIP with ROCm installed (Debian's ``libamdhip64-dev`` and ``rocm-device-libs``, which the set-up installs).

* The defaults are the driver's: ROCm's headers where it finds a HIP installation (``-nogpuinc`` only
  where there is none), ROCm's device libraries through ``--rocm-device-lib-path`` (Clang 19 never looks
  in Debian's multiarch directory), ``-nogpulib`` where a target's are missing, nothing where the user's
  flags choose.
* A HIP program with ``<hip/hip_runtime.h>`` (``hipMalloc``, ``hipMemcpy``, ``<<<>>>``, ``sin``, ``cosf``)
  builds with no HIP flags: its object (and so its ``.hip_fatbin``) is byte-identical to ``clang++ -x hip``
  in one command with the same ``-cuid`` and device-library path, its code object has no undefined symbol,
  and the program needs ``libamdhip64.so.5`` as ``clang++ --hip-link`` links it. The RDC variant links
  through our extract, device-link and wrap nodes. Nothing runs: there is no GPU here.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

from conftest import REPO_ROOT
from offload_builders.device_libraries import DEBIAN_ROCM_BITCODE
from offload_builders.models.hip import (
    default_flags,
    hip_installation,
    hip_runtime_library,
    include_flags,
)
from offload_builders.scons.hip import default_cuid
from offload_builders.targets import TargetID
from offload_builders.toolchain import find_toolchain

pytestmark = pytest.mark.slow

SCONS = str(Path(sys.executable).with_name("scons"))
ROCM_LIBS = f"--rocm-device-lib-path={DEBIAN_ROCM_BITCODE}"

KERNEL = """\
#include <hip/hip_runtime.h>
#include <cmath>
#include <cstdio>

__global__ void k(double *a, float *b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    a[i] = sin(a[i]) + sqrt(a[i]) + atan2(a[i], 2.0);
    b[i] = cosf(b[i]) + sqrtf(b[i]);
  }
}

int main() {
  const int n = 64;
  double ha[n];
  float hb[n];
  for (int i = 0; i < n; ++i) { ha[i] = i * 0.1; hb[i] = i * 0.2f; }
  double *da;
  float *db;
  if (hipMalloc(&da, n * sizeof(double)) != hipSuccess || hipMalloc(&db, n * sizeof(float)) != hipSuccess) return 1;
  (void)hipMemcpy(da, ha, n * sizeof(double), hipMemcpyHostToDevice);
  (void)hipMemcpy(db, hb, n * sizeof(float), hipMemcpyHostToDevice);
  k<<<1, 64>>>(da, db, n);
  (void)hipMemcpy(ha, da, n * sizeof(double), hipMemcpyDeviceToHost);
  printf("%f\\n", ha[10]);
  return 0;
}
"""

#: A user's SConstruct, from the README: no HIP flags at all.
SCONSTRUCT = """\
import offload_builders.scons
env = Environment(tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()],
                  OFFLOAD_MODEL="hip", OFFLOAD_ARCHS="gfx90a", OFFLOAD_FLAGS=["-O2"],
                  OFFLOAD_HIP_RDC=bool(int(ARGUMENTS.get("rdc", "0"))))
env.OffloadProgram("build/app", ["src/k.hip"])
"""


def _project(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "k.hip").write_text(KERNEL)
    (root / "SConstruct").write_text(SCONSTRUCT)
    return root


def _scons(root: Path, *args: str) -> str:
    done = subprocess.run([SCONS, "-Q", *args], cwd=root, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def _needed(program: Path) -> list[str]:
    with open(program, "rb") as f:
        dynamic = next(s for s in ELFFile(f).iter_sections() if isinstance(s, DynamicSection))
        return [tag.needed for tag in dynamic.iter_tags() if tag.entry.d_tag == "DT_NEEDED"]


def _symbols(llvm19, path: Path, *options: str) -> list[str]:
    listing = subprocess.run([str(llvm19("llvm-nm")), *options, str(path)], check=True, capture_output=True,
                             text=True).stdout
    return [line.split()[-1] for line in listing.splitlines() if line.strip()]


def _section(llvm19, obj: Path, name: str) -> bytes:
    dumped = obj.with_name(obj.name + name + ".bin")
    subprocess.run([str(llvm19("llvm-objcopy")), f"--dump-section={name}={dumped}", str(obj), os.devnull],
                   check=True, capture_output=True)
    return dumped.read_bytes()


# --------------------------------------------------------------------------------------------------
# The defaults, found as the driver finds them
# --------------------------------------------------------------------------------------------------
def test_the_hip_installation_is_the_drivers_and_the_defaults_use_it(tmp_path):
    toolchain = find_toolchain()
    (tmp_path / "e.hip").write_text("")
    verbose = subprocess.run([str(toolchain.clangxx), "-###", "-v", "-x", "hip", "--offload-arch=gfx90a", "-nogpulib",
                              "-c", "e.hip"], cwd=tmp_path, capture_output=True, text=True, env={"PATH": "/usr/bin"},
                             check=False)
    found = [line for line in verbose.stderr.splitlines() if line.startswith("Found HIP installation: ")]
    assert found == ["Found HIP installation: /usr, version 5.2.21153"], verbose.stderr
    assert hip_installation(toolchain, environ={}) == Path("/usr")
    assert hip_runtime_library(toolchain, environ={}) == Path("/usr/lib/x86_64-linux-gnu/libamdhip64.so")

    gfx90a, gfx942 = TargetID("gfx90a"), TargetID("gfx942")
    assert default_flags(toolchain, gfx90a, ("-O2",), {}) == (ROCM_LIBS,)  # headers found: no -nogpuinc
    # ROCm 5.2.3 has no oclc_isa_version_942.bc: the driver would stop, so that target builds without.
    assert default_flags(toolchain, gfx942, ("-O2",), {}) == ("-nogpulib",)
    # The user's flags (and the driver's environment variables) win.
    assert default_flags(toolchain, gfx90a, ("-nogpulib", "-nogpuinc"), {}) == ()
    assert default_flags(toolchain, gfx90a, ("-nogpuinc",), {}) == (ROCM_LIBS,)
    assert default_flags(toolchain, gfx90a, ("--rocm-device-lib-path=/elsewhere",), {}) == ()
    assert default_flags(toolchain, gfx90a, ("--rocm-path=/opt/rocm",), {}) == ()
    assert default_flags(toolchain, gfx90a, (), {"HIP_DEVICE_LIB_PATH": "/elsewhere"}) == ()
    # --hip-path names headers and runtime only: the device libraries are still needed (the driver says so).
    assert default_flags(toolchain, gfx90a, ("--hip-path=/usr",), {}) == (ROCM_LIBS,)


def test_without_a_hip_installation_the_default_is_nogpuinc(tmp_path):
    toolchain = find_toolchain()
    bare = tmp_path / "bare"
    bare.mkdir()
    assert hip_installation(toolchain, environ={}, candidates=[bare]) is None
    assert include_flags(toolchain, (), {}, candidates=[bare]) == ("-nogpuinc",)
    assert include_flags(toolchain, ("-nogpuinc",), {}, candidates=[bare]) == ()
    rocm = tmp_path / "rocm"
    (rocm / "share" / "hip").mkdir(parents=True)
    (rocm / "share" / "hip" / "version").write_text("HIP_VERSION_MAJOR=5\n")
    assert hip_installation(toolchain, environ={}, candidates=[bare, rocm]) == rocm
    assert include_flags(toolchain, (), {}, candidates=[bare, rocm]) == ()
    # A named installation that does not exist has no runtime to link.
    assert hip_runtime_library(toolchain, ("--hip-path=/nonexistent",), {}) is None


# --------------------------------------------------------------------------------------------------
# A real HIP program
# --------------------------------------------------------------------------------------------------
def test_a_rocm_hip_program_builds_like_clang_and_links_the_hip_runtime(tmp_path, llvm19):
    root = _project(tmp_path / "app")
    output = _scons(root)
    assert " -lamdhip64" in output and "-nogpuinc" not in output
    obj, program = root / "src" / "k.o", root / "build" / "app"
    reference = root / "reference.o"
    subprocess.run([str(llvm19("clang++")), "-x", "hip", "-O2", "--offload-arch=gfx90a", ROCM_LIBS,
                    f"-cuid={default_cuid('src/k.hip')}", "-c", "src/k.hip", "-o", str(reference)],
                   cwd=root, check=True, capture_output=True)
    assert _section(llvm19, obj, ".hip_fatbin") == _section(llvm19, reference, ".hip_fatbin")
    assert obj.read_bytes() == reference.read_bytes()

    code_object = root / "src" / "k.gfx90a.hsaco"
    assert _symbols(llvm19, code_object, "--undefined-only") == []  # sin, cosf, ... come from ocml
    assert "_Z1kPdPfi" in _symbols(llvm19, code_object, "--defined-only")

    # The device compile depends on the libraries it links (a new ROCm release compiles it again).
    tree = _scons(root, "--tree=prune", "src/k.gfx90a.hsaco")
    assert f"+-{DEBIAN_ROCM_BITCODE}/ocml.bc" in tree and f"+-{DEBIAN_ROCM_BITCODE}/oclc_isa_version_90a.bc" in tree

    assert "libamdhip64.so.5" in _needed(program)
    driver = root / "driver-linked"
    subprocess.run([str(llvm19("clang++")), "--hip-link", str(obj), "-o", str(driver)], check=True, capture_output=True)
    assert set(_needed(driver)) <= set(_needed(program))


def test_the_rdc_variant_links_through_our_nodes_against_the_hip_runtime(tmp_path, llvm19):
    root = _project(tmp_path / "app")
    output = _scons(root, "rdc=1")
    assert "clang-linker-wrapper" not in output and "offload_wrap" in output
    obj = root / "src" / "k.o"
    reference = root / "reference.o"
    subprocess.run([str(llvm19("clang++")), "-x", "hip", "-O2", "--offload-arch=gfx90a", ROCM_LIBS, "-fgpu-rdc",
                    "--offload-new-driver", "-c", "src/k.hip", "-o", str(reference)],
                   cwd=root, check=True, capture_output=True)
    assert _section(llvm19, obj, ".llvm.offloading") == _section(llvm19, reference, ".llvm.offloading")
    code_object = root / "build" / "app.gfx90a.hsaco"
    assert _symbols(llvm19, code_object, "--undefined-only") == []
    assert "_Z1kPdPfi" in _symbols(llvm19, code_object, "--defined-only")
    assert "libamdhip64.so.5" in _needed(root / "build" / "app")


def test_without_a_hip_runtime_a_program_links_without_it_and_says_so(tmp_path):
    """The stub-runtime sample with the runtime left to the default, where no HIP installation is found
    ($HIP_PATH names none): a warning, and the program links (its own stub) and runs."""
    root = tmp_path / "hip"
    shutil.copytree(REPO_ROOT / "sample_project" / "hip", root, ignore=shutil.ignore_patterns("build", ".sconsign*"))
    sconstruct = root / "SConstruct"
    sconstruct.write_text(sconstruct.read_text().replace("    OFFLOAD_HIP_RUNTIME=[],\n", ""))
    done = subprocess.run([SCONS, "-Q", "program=1", "offload_archs=gfx90a"], cwd=root, capture_output=True, text=True,
                          env=dict(os.environ, HIP_PATH=str(tmp_path / "no-hip")), check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    warnings = [line for line in done.stderr.splitlines() if "no HIP runtime" in line]
    assert len(warnings) == 1 and "apt-get install libamdhip64-dev" in warnings[0], done.stderr
    assert "amdhip64" not in done.stdout
    run = subprocess.run([str(root / "build" / "prog")], capture_output=True, text=True, check=True)
    assert "kernel _Z5saxpyifPKfPf" in run.stdout
