"""Generic AMDGPU targets (``gfx11-generic``: one code object for a family of GPUs), read-time rules.

Clang 19 writes code object version 5 unless told, and its back end stops on a generic target below version 6
("is only available on code object version 6 or better"), late and with a stack dump; the tool names the flag
at read time instead and does not add it (it changes every code object, and Clang 19 warns that version 6 is
"still in development"). Clang 22 writes version 6 by default. LLVM 19 ships no OpenMP device runtime for generic
targets: one read-time error. The runtime's choice among generic and specific images is tests/test_selection.py's.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import LLVM22_BIN
from test_hip_new_driver import run

COMPILE = [sys.executable, "-m", "offload_builders.cli.compile"]
SCONS = str(Path(sys.executable).with_name("scons"))
HIP_FLAGS = ["-O2", "-nogpulib", "-nogpuinc", "-Iinclude"]


def bundle_entries(path: Path) -> list[str]:
    done = subprocess.run([str(LLVM22_BIN / "clang-offload-bundler"), "-list", "-type=o", f"-input={path}"],
                          capture_output=True, text=True, check=True)
    return sorted(done.stdout.split())


def test_a_hip_build_for_a_generic_target_names_the_code_object_version_then_builds_with_it(hip_sample):
    failed = run([SCONS, "-Q", "offload_archs=gfx11-generic,gfx90a"], hip_sample)
    assert failed.returncode != 0
    assert "gfx11-generic: a generic AMDGPU target needs code object version 6" in failed.stdout + failed.stderr
    assert "add -mcode-object-version=6" in failed.stdout + failed.stderr
    assert "Stack dump" not in failed.stdout + failed.stderr  # stopped before the back end
    assert not (hip_sample / "build").exists() or not list((hip_sample / "build").rglob("*.o"))
    built = run([SCONS, "-Q", "offload_archs=gfx11-generic,gfx90a", "flags=-mcode-object-version=6"], hip_sample)
    assert built.returncode == 0, built.stdout + built.stderr
    assert bundle_entries(hip_sample / "build" / "saxpy.hipfb") == [
        "hipv4-amdgcn-amd-amdhsa--gfx11-generic", "hipv4-amdgcn-amd-amdhsa--gfx90a", "host-x86_64-unknown-linux--"]
    # The fat binary is the driver's for the same flags (its CUID as the tool pins it).
    from offload_builders.scons.hip import default_cuid

    reference = hip_sample / "saxpy.reference.o"
    driver = run(["clang++-19", "-x", "hip", *HIP_FLAGS, "-mcode-object-version=6", "--offload-arch=gfx11-generic",
                  "--offload-arch=gfx90a", f"-cuid={default_cuid('src/saxpy.hip')}", "-c", "src/saxpy.hip", "-o",
                  str(reference)], hip_sample)
    assert driver.returncode == 0, driver.stderr
    assert (hip_sample / "build" / "saxpy.o").read_bytes() == reference.read_bytes()


@pytest.mark.parametrize("clang, flags, error", [
    ("19", [], "add -mcode-object-version=6"),
    ("19", ["-mcode-object-version=5"], "add -mcode-object-version=6"),
    ("19", ["-mcode-object-version=6"], None),
    ("22", [], None),  # Clang 22 writes version 6 unless told
    ("22", ["-mcode-object-version=5"], "Clang 22 writes version 5 here"),
])
def test_offload_compile_checks_the_code_object_version_of_a_generic_hip_target(hip_sample, clang, flags, error):
    clang_path = "/usr/lib/llvm-19/bin/clang" if clang == "19" else str(LLVM22_BIN / "clang")
    done = run([*COMPILE, "device", "src/saxpy.hip", "--target", "gfx11-generic", "-o", "saxpy.co", "--",
                *HIP_FLAGS, *flags], hip_sample, OFFLOAD_CLANG=clang_path)
    if error is None:
        assert done.returncode == 0, done.stderr
        assert (hip_sample / "saxpy.co").read_bytes()[:4] == b"\x7fELF"
    else:
        assert done.returncode == 1 and error in done.stderr and "Traceback" not in done.stderr
        assert done.stderr.count("error:") == 1 and not (hip_sample / "saxpy.co").exists()


def test_openmp_for_a_generic_target_is_one_read_time_error_while_the_device_runtime_is_missing(tmp_path):
    (tmp_path / "k.cpp").write_text("int main() {\n  int x = 0;\n#pragma omp target map(tofrom: x)\n  x = 1;\n"
                                    "  return x - 1;\n}\n")
    host = run([*COMPILE, "host", "k.cpp", "-o", "k.bc", "--", "-fopenmp", "-O2"], tmp_path)
    assert host.returncode == 0, host.stderr
    for flags in ([], ["-mcode-object-version=6"]):
        done = run([*COMPILE, "device", "k.cpp", "--host-bc", "k.bc", "--target", "gfx11-generic", "-o", "k.img",
                    "--", "-fopenmp", "-O2", *flags], tmp_path)
        assert done.returncode == 1 and "Traceback" not in done.stderr
        assert "gfx11-generic: this LLVM's OpenMP device runtime has no image for generic targets" in done.stderr
        assert "libomptarget-amdgpu-gfx11-generic.bc" in done.stderr and "gfx1100" in done.stderr
        assert not (tmp_path / "k.img").exists()
