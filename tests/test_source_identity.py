"""Source identity: a host bitcode and every device compile that reads it must have seen the same file.

Clang 19 names OpenMP target regions after the device and inode numbers of the file holding them, so a
file re-created with identical bytes (branch switch, ``git stash pop``, rsync, an editor's safe-save) must
run the host front end again; and a program whose objects register entries that a target's image lacks
must not link (Clang links it, and it fails with ``Failed to load kernel`` and a segfault).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from offload_builders import linking
from test_scons_tool import Project

pytestmark = pytest.mark.slow


def recreate(*paths: Path) -> None:
    """Same bytes, new inode: what ``cp f f.tmp && mv f.tmp f`` (and every safe-save) does."""
    for path in paths:
        before = path.stat().st_ino
        temporary = path.with_name(path.name + ".tmp")
        shutil.copy2(path, temporary)
        os.replace(temporary, path)
        assert path.stat().st_ino != before


@pytest.fixture
def project(tmp_path) -> Project:
    return Project(tmp_path / "proj")


def test_recreated_sources_rerun_the_host_front_end_and_the_program_runs(project):
    project.scons("archs=gfx90a")
    recreate(project.root / "src" / "main.cpp", project.root / "src" / "scale.cpp")
    build = project.scons("archs=gfx90a,x86_64")
    # The host front ends run again (their file is another), and so does every device compile reading them.
    assert build.count("HOST") == 2 and build.count("DEVICE", "x86_64") == 2 and build.count("DEVICE", "gfx90a") == 2
    run = project.run_program()
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout == "on_device=1 sum=6048\n"
    assert project.scons("archs=gfx90a,x86_64").commands == []


def test_a_recreated_header_with_a_target_region_reruns_the_host_front_ends_that_include_it(project):
    (project.root / "include" / "twice.hpp").write_text(textwrap.dedent("""
        inline int twice(int v) {
          int r = 0;
          #pragma omp target map(from : r)
          r = 2 * v;
          return r;
        }
    """))
    main = project.root / "src" / "main.cpp"
    main.write_text('#include "twice.hpp"\n'
                    + main.read_text().replace("return on_device", "return twice(2) == 4 && on_device"))
    project.scons("archs=gfx90a")
    recreate(project.root / "include" / "twice.hpp")
    build = project.scons("archs=gfx90a,x86_64")
    assert build.count("HOST", "main") == 1 and build.count("HOST", "scale") == 0
    run = project.run_program()
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_cached_host_bitcode_is_reused_only_with_the_file_it_was_made_from(project, tmp_path):
    cache = f"cache={tmp_path / 'cache'}"
    project.scons("archs=gfx90a", cache)
    project.scons("-c", "archs=gfx90a", cache)
    same_file = project.scons("archs=gfx90a", cache)
    assert same_file.count("HOST") == 0 and len(same_file.retrieved) > 0  # same inode: from the cache
    project.scons("-c", "archs=gfx90a", cache)
    recreate(project.root / "src" / "main.cpp", project.root / "src" / "scale.cpp")
    build = project.scons("archs=gfx90a,x86_64", cache)
    assert build.count("HOST") == 2, build.output
    assert not any("host.bc" in line for line in build.retrieved)
    run = project.run_program()
    assert run.returncode == 0, run.stdout + run.stderr


LAUNCHER = """#!/bin/sh
# A file replaced while the build runs: every device compile sees another inode than its host front end.
for f in src/main.cpp src/scale.cpp; do cp "$f" "$f.tmp" && mv "$f.tmp" "$f"; done
exec "$@"
"""


def test_the_link_stops_when_an_object_registers_entries_its_device_image_lacks(project):
    launcher = project.root / "recreate-sources"
    launcher.write_text(LAUNCHER)
    launcher.chmod(0o755)
    failed = project.scons("archs=x86_64", f"launcher={launcher}", check=False)
    assert failed.returncode != 0
    assert "registers the offload entry __omp_offloading_" in failed.output, failed.output
    assert "which the x86_64 device image build/prog.x86_64.img does not define" in failed.output
    assert not (project.root / "build" / "prog").exists()
    # The next build sees new identities, compiles again, and links a program that runs.
    again = project.scons("archs=x86_64")
    assert again.count("HOST") == 2
    run = project.run_program()
    assert run.returncode == 0, run.stdout + run.stderr


def test_registered_entries_and_image_symbols_agree_with_the_driver(tmp_path, llvm19):
    """The names read from a driver-built fat object are the kernels and globals of its x86_64 image."""
    source = tmp_path / "k.cpp"
    source.write_text(textwrap.dedent("""
        #pragma omp declare target
        int counter = 0;
        #pragma omp end declare target
        void bump(int *x) {
          #pragma omp target map(tofrom : x[0 : 1])
          x[0] += ++counter;
        }
    """))
    obj, library = tmp_path / "k.o", tmp_path / "k.so"
    offload = ["-fopenmp", "-fopenmp-targets=x86_64-unknown-linux-gnu", "-fPIC"]
    subprocess.run([str(llvm19("clang++")), *offload, "-c", str(source), "-o", str(obj)], check=True)
    entries = linking.registered_entries(str(obj))
    assert "counter" in entries and len(entries) == 2
    kernel = next(name for name in entries if name != "counter")
    assert kernel.startswith("__omp_offloading_") and "_Z4bumpPi_l" in kernel
    # clang-linker-wrapper keeps the x86_64 image it linked: k.so.x86_64.native.img
    subprocess.run([str(llvm19("clang++")), *offload, "-shared", str(obj), "-o", str(library), "-Wl,--save-temps"],
                   check=True, cwd=tmp_path)
    image = tmp_path / "k.so.x86_64.native.img"
    assert linking.missing_entries([str(obj)], [("x86_64", str(image))]) == []
    # The host library defines `counter` but no kernel: exactly the kernel is reported, naming all three.
    problems = linking.missing_entries([str(obj)], [("x86_64", str(library))])
    assert len(problems) == 1 and f"{obj}: registers the offload entry {kernel}, which the x86_64" in problems[0]
