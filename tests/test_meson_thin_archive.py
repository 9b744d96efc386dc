"""A Meson project with its own static library of OpenMP code (issue 28, defect 6).

Meson makes a project's internal static libraries thin archives (``!<thin>``: the members' names, not their
bytes). ``offload-link`` read no device code from them, the link succeeded, and the program died at start
("Failed to load kernel ... heat_step", SIGSEGV). The project here is written the way the README's Meson
section and ``sample_project/meson`` build OpenMP sources (``offload-compile`` per phase and target, the link
through ``offload-link --print-link-args``), with the two library sources in a ``static_library()``; real Meson
and Ninja build it, and ``meson test`` runs it on the x86_64 host device with offloading mandatory.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO_ROOT, write_cli_shims
from offload_builders.toolchain import find_toolchain

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
MESON, NINJA = str(BIN / "meson"), str(BIN / "ninja")

MESON_BUILD = textwrap.dedent("""\
    project('heat-thin', 'cpp', meson_version: '>=1.0')

    if meson.get_compiler('cpp').get_id() != 'clang'
      error('link with Clang (CXX=clang++-19 meson setup ...): it runs offload-link as its linker wrapper')
    endif
    oc = find_program('offload-compile')
    checked = run_command(oc, 'check', ','.join(get_option('offload_archs')), check: false)
    if checked.returncode() != 0
      error('offload_archs: ' + checked.stderr().strip())
    endif
    archs = checked.stdout().strip().split(',')
    offload_link = find_program('offload-link')
    link_args = run_command(offload_link, '--print-link-args', check: true).stdout().strip().split('\\n')
    runtime_dir = run_command(offload_link, '--print-runtime-dir', check: true).stdout().strip()
    flags = ['-O2']

    # One fat object per source, as sample_project/meson makes them: host bitcode, a device compile per target,
    # the package, the embed.
    fat = {}
    foreach name : ['heat.cpp', 'total.cpp', 'main.cpp']
      src = files(name)
      path = meson.current_source_dir() / name
      host = custom_target(name + '.host', input: src, output: [name + '.host.bc', name + '.host.bc.identity'],
        depfile: name + '.host.d',
        command: [oc, 'host', '@INPUT@', '-o', '@OUTPUT0@', '--depfile', '@DEPFILE@', '--', flags])
      images = []
      foreach arch : archs
        token = arch.replace(':', '_')
        images += custom_target(name + '.' + token, input: [src, host], output: name + '.' + token + '.dev',
          depfile: name + '.' + token + '.d',
          command: [oc, 'device', '@INPUT0@', '--host-bc', '@INPUT1@', '--target', arch, '-o', '@OUTPUT@',
                    '--depfile', '@DEPFILE@', '--', flags])
      endforeach
      package = custom_target(name + '.pkg', input: images, output: name + '.offload.pkg',
        command: [oc, 'package', path, '@INPUT@', '--targets', ','.join(archs), '-o', '@OUTPUT@', '--', flags])
      fat += {name: custom_target(name + '.o', input: [host[0], package], output: name + '.o',
        depfile: name + '.o.d',
        command: [oc, 'embed', path, '--host-bc', '@INPUT0@', '--package', '@INPUT1@', '-o', '@OUTPUT@',
                  '--depfile', '@DEPFILE@', '--', flags])}
    endforeach

    # The project's own library of the two OpenMP sources: Meson archives it thin (!<thin>).
    heat = static_library('heat', fat['heat.cpp'], fat['total.cpp'])
    prog = executable('heat_prog', fat['main.cpp'], link_with: heat, link_args: link_args, link_language: 'cpp',
      build_rpath: runtime_dir)
    test('heat', prog, env: ['OMP_TARGET_OFFLOAD=MANDATORY'])
""")

MESON_OPTIONS = textwrap.dedent("""\
    option('offload_archs', type: 'array', value: ['x86_64'],
           description: 'offload target IDs (x86_64 runs on this CPU)')
""")

SOURCES = {
    "heat.cpp": """
        #include <cstddef>
        void heat_step(double *u, double *next, std::size_t n) {
        #pragma omp target teams distribute parallel for map(to : u[0 : n]) map(from : next[0 : n])
          for (std::size_t i = 0; i < n; ++i)
            next[i] = i == 0 || i + 1 == n ? u[i] : u[i] + 0.25 * (u[i - 1] - 2 * u[i] + u[i + 1]);
        }
    """,
    "total.cpp": """
        #include <cstddef>
        double total(const double *u, std::size_t n) {
          double sum = 0;
        #pragma omp target teams distribute parallel for reduction(+ : sum) map(to : u[0 : n])
          for (std::size_t i = 0; i < n; ++i)
            sum += u[i];
          return sum;
        }
    """,
    "main.cpp": """
        #include <cmath>
        #include <cstddef>
        #include <cstdio>
        #include <omp.h>
        void heat_step(double *u, double *next, std::size_t n);
        double total(const double *u, std::size_t n);
        int main() {
          constexpr std::size_t N = 64;
          static double u[N], next[N];
          u[N / 2] = 100.0;  // heat in the middle spreads; the ends stay at 0, and nothing reaches them here
          for (int step = 0; step < 10; ++step) {
            heat_step(u, next, N);
            for (std::size_t i = 0; i < N; ++i) u[i] = next[i];
          }
          int on_device = 0;
        #pragma omp target map(from : on_device)
          on_device = !omp_is_initial_device();
          const double sum = total(u, N);
          std::printf("on_device=%d total=%g\\n", on_device, sum);
          return on_device && std::fabs(sum - 100.0) < 1e-9 ? 0 : 1;
        }
    """,
}


@pytest.fixture
def project(tmp_path) -> Path:
    """The project's sources, and ``offload-compile``/``offload-link`` of this checkout on PATH."""
    root = tmp_path / "heat"
    root.mkdir()
    (root / "meson.build").write_text(MESON_BUILD)
    (root / "meson_options.txt").write_text(MESON_OPTIONS)
    for name, text in SOURCES.items():
        (root / name).write_text(textwrap.dedent(text).lstrip())
    write_cli_shims(tmp_path / "bin")
    return root


def _run(project: Path, *argv: str) -> subprocess.CompletedProcess:
    environ = dict(os.environ, PATH=f"{project.parent / 'bin'}:{BIN}:{os.environ['PATH']}",
                   CXX=str(find_toolchain().clangxx), PYTHONPATH=str(REPO_ROOT))
    return subprocess.run(argv, cwd=project, env=environ, capture_output=True, text=True)


def test_a_program_linked_with_its_own_thin_static_library_runs(project):
    for argv in ((MESON, "setup", "build"), (NINJA, "-C", "build")):
        done = _run(project, *argv)
        assert done.returncode == 0, done.stdout + done.stderr
    library = project / "build" / "libheat.a"
    assert library.read_bytes().startswith(b"!<thin>\n")  # what the fix is about: Meson's internal libraries
    done = _run(project, MESON, "test", "-C", "build", "--print-errorlogs")
    assert done.returncode == 0 and "Ok:                1" in done.stdout, done.stdout + done.stderr
    run = subprocess.run([str(project / "build" / "heat_prog")], capture_output=True, text=True,
                         env=dict(os.environ, OMP_TARGET_OFFLOAD="MANDATORY"))
    assert (run.returncode, run.stdout) == (0, "on_device=1 total=100\n"), run.stderr
