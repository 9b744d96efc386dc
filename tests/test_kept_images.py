"""``offload-link`` keeps each GPU target's image of an output's last link and takes it again where that target's
device link would be the same (:mod:`offload_builders.linking.kept_images`): adding a target to a CMake or Meson
build links that target's image alone. Real objects from the Clang 19 driver, real device links, every process
counted from an exec trace."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import driver_library_flags
from offload_builders.linking.kept_images import DIRECTORY, MAX_SLOTS, kept_images
from offload_builders.targets import parse_offload_archs
from offload_builders.toolchain import find_toolchain
from test_process_counts import read_trace

pytestmark = pytest.mark.slow

KERNEL = """#include <cstddef>
double kernel(double *x, std::size_t n) {
  double sum = 0;
#pragma omp target teams distribute parallel for reduction(+ : sum) map(tofrom : x[0 : n])
  for (std::size_t k = 0; k < n; ++k) sum += x[k] * 2;
  return sum;
}
"""
MAIN = """#include <cstddef>
#include <cstdio>
double kernel(double *, std::size_t);
int main() { static double x[64]; std::printf("%g\\n", kernel(x, 64)); }
"""


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """``k.cpp`` (a target region) and ``main.cpp``, and a per-user cache of this test's own."""
    monkeypatch.setenv("OFFLOAD_BUILDERS_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "k.cpp").write_text(KERNEL)
    (tmp_path / "main.cpp").write_text(MAIN)
    clangxx = str(find_toolchain().clangxx)
    subprocess.run([clangxx, "-O2", "-c", "main.cpp"], cwd=tmp_path, check=True)
    return tmp_path


def compile_kernel(project: Path, archs: str) -> None:
    """``k.o`` for ``archs`` with the driver (one command, the device libraries the tool gives each target)."""
    clangxx = str(find_toolchain().clangxx)
    flags = driver_library_flags(parse_offload_archs(archs), ["-O2"])
    subprocess.run([clangxx, "-fopenmp", f"--offload-arch={archs}", *flags, "-O2", "-c", "k.cpp"], cwd=project,
                   check=True)


def link(project: Path, *options: str, env: dict[str, str] | None = None, wrapper_options: tuple[str, ...] = ()
         ) -> list[str]:
    """Link ``prog`` through ``offload-link`` (in clang-linker-wrapper's place, as the CMake module links; with
    ``wrapper_options``, the wrapper command the driver would run, run with them); the targets whose device link
    ran."""
    link_args = subprocess.run([sys.executable, "-m", "offload_builders.cli.link", "--print-link-args"],
                               check=True, capture_output=True, text=True).stdout.split()
    command = [str(find_toolchain().clangxx), *link_args, *options, "k.o", "main.o", "-o", "prog"]
    if wrapper_options:
        jobs = subprocess.run([*command, "-###"], cwd=project, capture_output=True, text=True, check=True).stderr
        (job,) = [shlex.split(line) for line in jobs.splitlines() if "clang-linker-wrapper" in line]
        command = [job[0], *wrapper_options, *job[1:]]
    trace = project / "trace" / "t"
    shutil.rmtree(trace.parent, ignore_errors=True)
    trace.parent.mkdir()
    subprocess.run(["strace", "-ff", "-ttt", "-qq", "-e", "trace=execve", "-e", "status=successful", "-s", "4096", "-o",
                    str(trace), *command], cwd=project, check=True, env=env)
    linked = []
    for process in read_trace(trace):
        if process.kind == "device link: ld.lld":
            linked += [arg.removeprefix("-plugin-opt=mcpu=") for arg in process.argv
                       if arg.startswith("-plugin-opt=mcpu=")]
        elif process.kind == "device link: clang-nvlink-wrapper":
            linked.append(process.option("-arch") or "sm_?")
    return sorted(linked)


def test_a_relink_takes_each_unchanged_image_and_links_only_a_new_or_damaged_one(project):
    if not shutil.which("strace"):
        pytest.fail("strace is missing: run scripts/bootstrap (it installs it) or apt-get install strace")
    compile_kernel(project, "sm_80,gfx90a")
    assert link(project) == ["gfx90a", "sm_80"]
    first = (project / "prog").read_bytes()

    # The same link again: no device link runs, and the program is the first's byte for byte.
    assert link(project) == []
    assert (project / "prog").read_bytes() == first

    # A third target: its device link alone (the driver's sm_80 and gfx90a device code is the same bytes).
    compile_kernel(project, "sm_80,gfx90a,gfx908")
    assert link(project) == ["gfx908"]
    added = (project / "prog").read_bytes()
    assert added != first

    # A kept image whose bytes are not the recorded ones is linked again; the program is the same.
    slot = next((project / "cache" / DIRECTORY).iterdir())
    image = next(slot.glob("*.gfx90a.img"))
    data = bytearray(image.read_bytes())
    data[len(data) // 2] ^= 0xFF
    image.write_bytes(bytes(data))
    assert link(project) == ["gfx90a"]
    assert (project / "prog").read_bytes() == added

    # Another device-link word (-Xoffload-linker: the device links' arguments) is another key for every target.
    assert link(project, "-Xoffload-linker", "-O3") == ["gfx908", "gfx90a", "sm_80"]

    # --no-keep-images (offload-link's own option, on the wrapper command the driver runs) links every image.
    assert link(project, wrapper_options=("--no-keep-images",)) == ["gfx908", "gfx90a", "sm_80"]
    assert (project / "prog").read_bytes() == added

    # With the per-user caches off, every device link runs, and the program is the same.
    assert link(project, env=dict(os.environ, OFFLOAD_BUILDERS_CACHE_DIR="")) == ["gfx908", "gfx90a", "sm_80"]
    assert (project / "prog").read_bytes() == added


def test_slots_beyond_the_limit_go_least_recently_used_first(tmp_path, monkeypatch):
    """One slot per output path; the least recently used beyond MAX_SLOTS are removed when another is taken."""
    monkeypatch.setenv("OFFLOAD_BUILDERS_CACHE_DIR", str(tmp_path / "cache"))
    image = tmp_path / "image"
    image.write_bytes(b"image bytes")
    slots = []
    for number in range(MAX_SLOTS + 3):
        kept = kept_images(str(tmp_path / f"prog{number}"))
        assert kept is not None
        kept.keep("prog.t", "key", str(image))
        os.utime(kept.slot, ns=(number * 10**9, number * 10**9))  # the order they were used in
        slots.append(Path(kept.slot))
    # Taking the last one's slot again left MAX_SLOTS - 1 others, the most recently used.
    assert kept_images(str(tmp_path / f"prog{MAX_SLOTS + 2}")) is not None
    left = sorted((tmp_path / "cache" / DIRECTORY).iterdir())
    assert left == sorted(slots[-MAX_SLOTS:])
    out = tmp_path / "out"
    kept = kept_images(str(tmp_path / f"prog{MAX_SLOTS + 2}"))
    assert kept is not None and kept.fetch("prog.t", "key", str(out)) and out.read_bytes() == b"image bytes"
    assert not kept.fetch("prog.t", "other key", str(tmp_path / "other")) and not (tmp_path / "other").exists()
