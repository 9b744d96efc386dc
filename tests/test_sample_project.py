"""sample_project, as a user runs it: `scons` builds and runs it; GPU target lists compile and link."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from offload_builders.selection import check_deployment

pytestmark = pytest.mark.slow

SCONS = str(Path(sys.executable).with_name("scons"))


@pytest.fixture
def sample(tmp_path) -> Path:
    copy = tmp_path / "sample_project"
    shutil.copytree(REPO_ROOT / "sample_project", copy, ignore=shutil.ignore_patterns("build", ".sconsign*"))
    return copy


def _scons(cwd: Path, *args: str) -> str:
    done = subprocess.run([SCONS, *args], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def _offload_arches(program: Path) -> list[tuple[str, str]]:
    listing = subprocess.run(["/usr/lib/llvm-19/bin/llvm-objdump", "--offloading", str(program)],
                             capture_output=True, text=True, check=True).stdout
    fields: dict[str, str] = {}
    images = []
    for line in listing.splitlines():
        parts = line.split(None, 1)
        if parts and parts[0] in ("arch", "triple"):
            fields[parts[0]] = parts[1].strip() if len(parts) > 1 else ""
            if parts[0] == "triple":
                images.append((fields["triple"], fields.get("arch", "")))
                fields = {}
    return sorted(images)


def test_scons_builds_and_runs_the_sample(sample):
    output = _scons(sample)
    assert "target regions ran on an offload device: yes" in output
    assert "PASSED" in output
    assert (sample / "build" / "zaxpy.run.log").read_text().endswith("PASSED\n")
    # The heterogeneous program (sample_project/mixed): OpenMP regions ran, each HIP kernel registered and
    # launched once (its stub runtime checks).
    mixed = (sample / "build" / "mixed" / "mixed.run.log").read_text()
    assert "OpenMP target regions ran on an offload device: yes" in mixed
    assert "HIP kernels each registered once and launched once: yes" in mixed and mixed.endswith("PASSED\n")
    # OpenMP, HIP and CUDA (sample_project/cuda), plain and relocatable device code, from one environment: the
    # CUDA stub saw the plain object's fat binary and the program's (linked cubins), each kernel once.
    hetero = (sample / "build" / "cuda" / "hetero.run.log").read_text()
    assert "OpenMP target regions ran on an offload device: yes" in hetero
    assert "HIP kernels each registered once and launched once: yes" in hetero
    assert "CUDA fat binaries registered: 2" in hetero
    assert "CUDA kernels each registered once and launched once: yes" in hetero and hetero.endswith("PASSED\n")
    assert "is up to date" in _scons(sample)
    # Each runtime offers its own modules: an NVIDIA device finds its images in the OpenMP and CUDA modules and
    # is not judged on the HIP fat binaries (AMD code only), an AMD device the other way round.
    program = sample / "build" / "cuda" / "hetero"
    assert check_deployment(program, ["sm_80", "gfx90a", "x86_64"]) == []
    missing = check_deployment(program, ["sm_90 no-ptx-jit"])
    assert missing and all("hip_fatbin" not in line for line in missing), missing
    select = subprocess.run([str(Path(sys.executable).with_name("offload-select")), "--device", "sm_80", "--device",
                             "gfx90a", str(program)], capture_output=True, text=True)
    assert select.returncode == 0, select.stdout + select.stderr
    assert f"sm_80: {program}: section .nv_fatbin" in select.stdout
    assert f"gfx90a: {program}: section .hip_fatbin" in select.stdout
    # offload-inspect reads every CUDA output: a plain object, its fat binary, an RDC object, the program.
    cuda = sample / "build" / "cuda"
    inspect = subprocess.run([str(Path(sys.executable).with_name("offload-inspect")), str(cuda / "scale.o"),
                              str(cuda / "scale.fatbin"), str(cuda / "offset.o"), str(program)],
                             capture_output=True, text=True)
    assert inspect.returncode == 0, inspect.stdout + inspect.stderr
    assert f"{cuda / 'scale.o'}: section .nv_fatbin: nvidia fatbin 0" in inspect.stdout
    assert f"{cuda / 'scale.fatbin'}: nvidia fatbin 0 at 0x0: kind=cuda" in inspect.stdout
    assert f"{cuda / 'offset.o'}: section .llvm.offloading: offload binary 0 at 0x40: kind=cuda" in inspect.stdout
    assert "entry: elf sm_80" in inspect.stdout and "entry: ptx compute_80" in inspect.stdout


def test_gpu_targets_compile_and_link_next_to_x86_64(sample):
    output = _scons(sample, "offload_archs=x86_64,sm_90,gfx90a:xnack+")
    assert "PASSED" in output
    assert _offload_arches(sample / "build" / "zaxpy") == [
        ("amdgcn-amd-amdhsa", "gfx90a:xnack+"), ("nvptx64-nvidia-cuda", "sm_90"), ("x86_64-unknown-linux-gnu", "")]


def test_all_gpu_program_links(sample):
    output = _scons(sample, "offload_archs=sm_80,gfx942,gfx90a:xnack+")
    assert "no GPU here" in output
    assert _offload_arches(sample / "build" / "zaxpy") == [
        ("amdgcn-amd-amdhsa", "gfx90a:xnack+"), ("amdgcn-amd-amdhsa", "gfx942"), ("nvptx64-nvidia-cuda", "sm_80")]
    # The target ID's feature reaches the code object (EF_AMDGPU_FEATURE_XNACK_V4: 0x300 on, 0x100 any),
    # as in the image clang-linker-wrapper links: it comes from the bitcode's target features.
    xnack = {name: int.from_bytes((sample / "build" / name).read_bytes()[48:52], "little") & 0x300
             for name in ("zaxpy.gfx90a_xnack+.img", "zaxpy.gfx942.img")}
    assert xnack == {"zaxpy.gfx90a_xnack+.img": 0x300, "zaxpy.gfx942.img": 0x100}
