"""HIP through the new offload driver (``--offload-new-driver``) without relocatable device code.

Clang 19 runs the old driver's jobs then (a device compile and ``lld`` per target, the bundler, the host compile
with ``-fcuda-include-gpubinary``), each ``-cc1`` job with ``--offload-new-driver`` and none with a ``-cuid``: the
SCons tool and the launcher follow them, and the objects are the driver's byte for byte. Clang 22 compiles each
target to bitcode and links them all at compile time in one ``clang-linker-wrapper --emit-fatbin-only``: the
models split that job into a device link per target (the wrapper's own ``clang -flto`` command) and the fat
binary (the wrapper's order and host entry), so adding a target links that target alone; a wrapper option the
split does not follow is one error naming it.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import LLVM19_BIN, LLVM22_BIN
from test_offload_cache import LAUNCHER, stats, traced

SCONS = str(Path(sys.executable).with_name("scons"))
FLAGS = ["-O2", "-Iinclude", "-nogpulib", "-nogpuinc", "--offload-new-driver"]


@pytest.fixture
def sample(hip_sample) -> Path:
    return hip_sample


def run(argv: list[str], cwd: Path, **environ: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env={**os.environ, **environ})


def driver_object(root: Path, stem: str, archs: str) -> bytes:
    out = root / f"{stem}.driver.o"
    done = run([str(LLVM19_BIN / "clang++"), "-x", "hip", *FLAGS, *(f"--offload-arch={a}" for a in archs.split(",")),
                "-c", f"src/{stem}.hip", "-o", str(out)], root)
    assert done.returncode == 0, done.stderr
    return out.read_bytes()


def test_scons_follows_clang_19s_new_driver_jobs_and_adds_a_target_alone(sample):
    archs = "gfx90a:xnack+,gfx942"
    built = run([SCONS, "-Q", f"offload_archs={archs}", "flags=--offload-new-driver"], sample)
    assert built.returncode == 0, built.stdout + built.stderr
    for stem in ("saxpy", "stencil"):
        assert (sample / "build" / f"{stem}.o").read_bytes() == driver_object(sample, stem, archs)
    added = run([SCONS, "-Q", f"offload_archs={archs},gfx1030", "flags=--offload-new-driver"], sample)
    assert added.returncode == 0, added.stdout + added.stderr
    compiled = [line for line in added.stdout.splitlines() if line.startswith("device compile")]
    assert len(compiled) == 2 and all("gfx1030" in line for line in compiled), added.stdout
    for stem in ("saxpy", "stencil"):
        assert (sample / "build" / f"{stem}.o").read_bytes() == driver_object(sample, stem, f"{archs},gfx1030")


def test_the_launcher_splits_clang_19s_new_driver_hip_without_a_cuid(sample, tmp_path, monkeypatch):
    monkeypatch.setenv("OFFLOAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OFFLOAD_CACHE_LOGFILE", str(tmp_path / "cache.log"))

    def words(archs: str) -> list[str]:
        return [str(LLVM19_BIN / "clang++"), "-x", "hip", *FLAGS, f"--offload-arch={archs}", "-c", "src/saxpy.hip",
                "-o", "saxpy.o"]

    first = run([*LAUNCHER, *words("gfx90a")], sample)
    assert first.returncode == 0, first.stderr
    assert (sample / "saxpy.o").read_bytes() == driver_object(sample, "saxpy", "gfx90a")
    processes = traced(tmp_path, [*LAUNCHER, *words("gfx90a,gfx1030")], sample, "new-driver-add")
    device = [p.option("-target-cpu") for p in processes if "-fcuda-is-device" in p.argv]
    assert device == ["gfx1030"] and len([p for p in processes if p.program in ("lld", "ld.lld")]) == 1
    assert (sample / "saxpy.o").read_bytes() == driver_object(sample, "saxpy", "gfx90a,gfx1030")
    assert stats(sample)["pass-through"] == "0"


def driver_22_object(root: Path, stem: str, archs: str, cuid: str) -> bytes:
    out = root / f"{stem}.driver22.o"
    done = run([str(LLVM22_BIN / "clang++"), "-x", "hip", *FLAGS, f"--offload-arch={archs}", f"-cuid={cuid}", "-c",
                f"src/{stem}.hip", "-o", str(out)], root)
    assert done.returncode == 0, done.stderr
    return out.read_bytes()


def test_scons_splits_clang_22s_compile_time_device_link_per_target(sample):
    from offload_builders.scons.hip import default_cuid

    clang22 = {"OFFLOAD_CLANG": str(LLVM22_BIN / "clang")}
    archs = "gfx90a:xnack+,gfx942"
    built = run([SCONS, "-Q", f"offload_archs={archs}", "flags=--offload-new-driver"], sample, **clang22)
    assert built.returncode == 0, built.stdout + built.stderr
    for stem in ("saxpy", "stencil"):
        assert (sample / "build" / f"{stem}.o").read_bytes() == driver_22_object(
            sample, stem, archs, default_cuid(f"src/{stem}.hip"))
    added = run([SCONS, "-Q", f"offload_archs={archs},gfx1030", "flags=--offload-new-driver"], sample, **clang22)
    assert added.returncode == 0, added.stdout + added.stderr
    steps = [line for line in added.stdout.splitlines() if line.startswith(("device compile", "device link"))]
    assert len(steps) == 4 and all("gfx1030" in line for line in steps), added.stdout  # per source: compile, link
    for stem in ("saxpy", "stencil"):
        assert (sample / "build" / f"{stem}.o").read_bytes() == driver_22_object(
            sample, stem, f"{archs},gfx1030", default_cuid(f"src/{stem}.hip"))


def test_offload_compile_and_the_launcher_give_clang_22s_new_driver_objects(sample, tmp_path, monkeypatch):
    clang22 = {"OFFLOAD_CLANG": str(LLVM22_BIN / "clang")}
    compile_ = [sys.executable, "-m", "offload_builders.cli.compile"]
    for index, target in enumerate(("gfx90a:xnack+", "gfx942")):
        done = run([*compile_, "device", "src/saxpy.hip", "--target", target, "-o", f"saxpy.{index}.co", "--cuid",
                    "5eed", "--", *FLAGS], sample, **clang22)
        assert done.returncode == 0, done.stderr
    bundle = ["bundle", "src/saxpy.hip", "--targets", "gfx90a:xnack+,gfx942", "-o", "saxpy.hipfb", "saxpy.0.co",
              "saxpy.1.co"]
    for argv in (bundle, ["host", "src/saxpy.hip", "--fatbin", "saxpy.hipfb", "-o", "saxpy.o", "--cuid", "5eed"]):
        done = run([*compile_, *argv, "--", *FLAGS], sample, **clang22)
        assert done.returncode == 0, done.stderr
    expected = driver_22_object(sample, "saxpy", "gfx90a:xnack+,gfx942", "5eed")
    assert (sample / "saxpy.o").read_bytes() == expected
    # The launcher runs the wrapper's own steps in its place (a device link per target, the bundler): the same
    # object, and adding a target compiles and links that target alone.
    monkeypatch.setenv("OFFLOAD_CACHE_DIR", str(tmp_path / "cache"))

    def launched(archs: str) -> list[str]:
        return [*LAUNCHER, str(LLVM22_BIN / "clang++"), "-x", "hip", *FLAGS, f"--offload-arch={archs}",
                "-cuid=5eed", "-c", "src/saxpy.hip", "-o", "saxpy.o"]

    (sample / "saxpy.o").unlink()
    ours = run(launched("gfx90a:xnack+,gfx942"), sample)
    assert ours.returncode == 0, ours.stderr
    assert (sample / "saxpy.o").read_bytes() == expected
    processes = traced(tmp_path, launched("gfx90a:xnack+,gfx942,gfx1030"), sample, "clang22-add")
    device = [p.option("-target-cpu") for p in processes if "-fcuda-is-device" in p.argv]
    linked = [a for p in processes if "--no-default-config" in p.argv for a in p.argv if a.startswith("-mcpu=")]
    assert device == ["gfx1030"] and linked == ["-mcpu=gfx1030"]
    assert not [p for p in processes if p.program == "clang-linker-wrapper"]
    assert (sample / "saxpy.o").read_bytes() == driver_22_object(sample, "saxpy", "gfx90a:xnack+,gfx942,gfx1030",
                                                                  "5eed")


def test_a_wrapper_option_the_split_does_not_follow_is_one_error_naming_it(sample):
    done = run([sys.executable, "-m", "offload_builders.cli.compile", "device", "src/saxpy.hip", "--target", "gfx90a",
                "-o", "saxpy.co", "--", *FLAGS, "-Xoffload-linker", "--no-such-option"], sample,
               OFFLOAD_CLANG=str(LLVM22_BIN / "clang"))
    assert done.returncode == 1 and "Traceback" not in done.stderr and done.stderr.count("error:") == 1
    assert "--device-linker=--no-such-option" in done.stderr and "--no-offload-new-driver" in done.stderr
    assert "is this Clang 19" not in done.stderr and not (sample / "saxpy.co").exists()
