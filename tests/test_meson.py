"""``sample_project/meson``: real Meson and Ninja build the sample with one node per phase and target through
``offload-compile`` and link through ``offload-link``; commands are counted from ``ninja -v``."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT, copy_sample_for_ninja
from offload_builders.toolchain import find_toolchain

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
MESON, NINJA = str(BIN / "meson"), str(BIN / "ninja")


@pytest.fixture
def project(tmp_path) -> Path:
    """A copy of the sample (its Meson project, sources and headers), with the tools of this checkout on PATH."""
    return copy_sample_for_ninja(tmp_path, "meson")


def environ(project: Path) -> dict[str, str]:
    return dict(os.environ, PATH=f"{project.parent / 'bin'}:{BIN}:{os.environ['PATH']}",
                CXX=str(find_toolchain().clangxx), PYTHONPATH=str(REPO_ROOT))


def run(project: Path, *argv: str) -> str:
    done = subprocess.run(argv, cwd=project, env=environ(project), capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def ninja(project: Path) -> list[str]:
    """The commands one ``ninja -v`` runs (Meson's own regeneration left out)."""
    out = run(project, NINJA, "-C", "build", "-v")
    return [line.split("] ", 1)[1] for line in out.splitlines()
            if line.startswith("[") and "] " in line and "--internal regenerate" not in line]


def phases(commands: list[str], phase: str, source: str = "") -> list[str]:
    return [c for c in commands if f"offload-compile {phase} " in c and source in c]


def links(commands: list[str]) -> list[str]:
    return [c for c in commands if " -o zaxpy " in c and "--offload-link" in c]


def test_meson_builds_the_sample_and_it_runs_on_the_offload_device(project):
    run(project, MESON, "setup", "build", "meson")
    first = ninja(project)
    assert len(phases(first, "host")) == 2 and len(phases(first, "device")) == 2 and len(links(first)) == 1
    assert not [c for c in first if "plain.hip" in c]               # x86_64 is no HIP target: no HIP nodes
    assert "Ok:                1" in run(project, MESON, "test", "-C", "build")     # OMP_TARGET_OFFLOAD=MANDATORY
    assert ninja(project) == []                                      # a no-op runs nothing


def test_meson_adds_a_target_without_host_front_ends_and_rebuilds_only_what_changed(project):
    run(project, MESON, "setup", "build", "meson")
    ninja(project)
    run(project, MESON, "configure", "build", "-Doffload_archs=x86_64,gfx90a")
    # The first gfx target also brings the HIP sources' nodes (tested below): count the OpenMP program's.
    added = [c for c in ninja(project) if "plain" not in c and "hip_check" not in c and "rdc" not in c]
    assert phases(added, "host") == []
    device = phases(added, "device")
    assert len(device) == 2 and all("--target gfx90a" in c for c in device)
    assert len(phases(added, "package")) == 2 and len(phases(added, "embed")) == 2 and len(links(added)) == 1
    assert len(added) == 7
    assert ninja(project) == []

    # Touching a header one source includes runs that source's host and device compiles only, and stops there:
    # their outputs are the same bytes, left untouched, so Ninja's restat skips package, embed and link.
    os.utime(project / "include" / "norm_only.hpp")
    touched = ninja(project)
    assert touched and all("norm.cpp" in c for c in touched)
    assert len(phases(touched, "host")) == 1 and len(phases(touched, "device")) == 2 and len(touched) == 3

    # A comment-only change to a source: its compiles run, their outputs do not change, nothing else runs.
    with open(project / "src" / "zaxpy.cpp", "a") as f:
        f.write("// only a comment\n")
    commented = ninja(project)
    assert len(phases(commented, "host", "zaxpy.cpp")) == 1 and len(phases(commented, "device", "zaxpy.cpp")) == 2
    assert len(commented) == 3
    assert ninja(project) == []
    assert "Ok:" in run(project, MESON, "test", "-C", "build")


def test_meson_builds_the_hip_source_for_each_gfx_target_and_adds_one_alone(project):
    """The HIP source gets one device node per gfx target of offload_archs, the fat binary and the host compile;
    its test (a stand-in HIP runtime) checks the fat binary holds one code object per gfx target and the kernel
    is registered and launched. Adding a gfx target runs that target's HIP device node, the bundle, the host
    compile and the link, and no other HIP work; the default CUID is the same in another build directory.
    The HIP relocatable-device-code sources (one kernel calls the other's device function) link through
    offload-link, which registers their code objects in a HIP fat binary: one entry per gfx target."""
    run(project, MESON, "setup", "build", "meson", "-Doffload_archs=x86_64,gfx90a")
    first = ninja(project)
    device = phases(first, "device", "plain.hip")
    assert len(device) == 1 and "--target gfx90a" in device[0]
    assert len(phases(first, "bundle", "plain.hip")) == 1 and len(phases(first, "host", "plain.hip")) == 1
    tested = run(project, MESON, "test", "-C", "build", "-v")
    assert "gfx90a: 1 code object(s)" in tested and "launched 1; 2 fat binary entries: Ok" in tested
    rdc = [c for c in first if "rdc" in c]
    assert len(phases(rdc, "device")) == 2 and len(phases(rdc, "package")) == 2 and len(phases(rdc, "host")) == 2
    assert "entries=2" in tested and "HIP kernel _Z14rescale_kernelPi: registered 1, launched 1" in tested

    run(project, MESON, "configure", "build", "-Doffload_archs=x86_64,gfx90a,gfx1030")
    added = ninja(project)
    hip = [c for c in added if "plain" in c]
    device = phases(hip, "device")
    assert len(device) == 1 and "--target gfx1030" in device[0]
    assert len(phases(hip, "bundle")) == 1 and len(phases(hip, "host")) == 1
    assert len([c for c in hip if " -o hip_check " in c]) == 1 and len(hip) == 4
    assert phases(added, "host", ".cpp") == []
    rdc = [c for c in added if "rdc" in c]
    assert len(phases(rdc, "device")) == 2 and all("--target gfx1030" in c for c in phases(rdc, "device"))
    assert len(phases(rdc, "package")) == 2 and len(phases(rdc, "host")) == 2 and len(rdc) == 7  # and the link
    tested = run(project, MESON, "test", "-C", "build", "-v")
    assert "gfx90a: 1 code object(s)" in tested and "gfx1030: 1 code object(s)" in tested
    assert "launched 1; 3 fat binary entries: Ok" in tested and "Ok:                3" in tested
    assert "entries=3" in tested and "HIP kernels each registered once and launched once: yes" in tested
    assert ninja(project) == []

    # Another build directory, deeper (the source is ../../meson/../mixed/src/plain.hip there): the same object.
    run(project, MESON, "setup", "other/deeper", "meson", "-Doffload_archs=x86_64,gfx90a,gfx1030")
    run(project, NINJA, "-C", "other/deeper", "plain.o")
    assert (project / "other" / "deeper" / "plain.o").read_bytes() == (project / "build" / "plain.o").read_bytes()


def test_meson_builds_the_cuda_source_for_each_sm_target_and_adds_one_alone(project):
    """The CUDA source gets one device node per sm target (device compile and ptxas), the fat binary (the toolkit's
    fatbinary) and the host compile; its test (a stand-in CUDA runtime) reads the fat binary the object registers:
    one cubin and one PTX per sm target, the kernel registered and launched once. Adding an sm target runs that
    target's device node, the fat binary, the host compile and the test's link, and no other CUDA work."""
    run(project, MESON, "setup", "build", "meson", "-Doffload_archs=x86_64,sm_80")
    first = ninja(project)
    device = phases(first, "device", "scale.cu")
    assert len(device) == 1 and "--target sm_80" in device[0]
    assert len(phases(first, "bundle", "scale.cu")) == 1 and len(phases(first, "host", "scale.cu")) == 1
    tested = run(project, MESON, "test", "-C", "build", "-v", "cuda")
    assert "sm_80: 1 cubin(s), 1 PTX" in tested and "launched 1; 1 cubins: Ok" in tested

    run(project, MESON, "configure", "build", "-Doffload_archs=x86_64,sm_80,sm_90")
    added = ninja(project)
    cuda = [c for c in added if "scale.cu " in c or " -o cuda_check " in c]
    device = phases(cuda, "device")
    assert len(device) == 1 and "--target sm_90" in device[0]
    assert len(phases(cuda, "bundle")) == 1 and len(phases(cuda, "host")) == 1 and len(cuda) == 4, cuda
    tested = run(project, MESON, "test", "-C", "build", "-v", "cuda")
    assert "sm_80: 1 cubin(s), 1 PTX" in tested and "sm_90: 1 cubin(s), 1 PTX" in tested
    assert "launched 1; 2 cubins: Ok" in tested
    assert ninja(project) == []


def test_meson_rejects_a_bad_target_list_at_configure_time(project):
    done = subprocess.run([MESON, "setup", "build", "meson", "-Doffload_archs=gfx90a,gfx90a:xnack+"], cwd=project,
                          env=environ(project), capture_output=True, text=True)
    assert done.returncode != 0
    assert "conflicting offload target IDs 'gfx90a' and 'gfx90a:xnack+'" in done.stdout + done.stderr
