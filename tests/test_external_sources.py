"""Offload sources outside the project compile beside the target that links them, never into their own tree."""
from __future__ import annotations

import os
import subprocess
import textwrap

import pytest

from test_scons_tool import SCONS

pytestmark = pytest.mark.slow

KERNEL = textwrap.dedent("""
    int twice(int v) {
      int r = 0;
      #pragma omp target map(from : r)
      r = 2 * v;
      return r;
    }
""")
MAIN = textwrap.dedent("""
    #include <cstdio>
    int twice(int);
    int thrice(int);
    int main() {
      std::printf("%d %d\\n", twice(21), thrice(3));
      return twice(21) == 42 && thrice(3) == 9 ? 0 : 1;
    }
""")
LIBRARY = textwrap.dedent("""
    int thrice(int v) {
      int r = 0;
      #pragma omp target map(from : r)
      r = 3 * v;
      return r;
    }
""")
SCONSTRUCT = textwrap.dedent("""
    import offload_builders.scons
    env = Environment(tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()],
                      OFFLOAD_ARCHS="x86_64,gfx90a")
    library = env.OffloadStaticLibrary("build/lib/thrice", ["../third_party/library.cpp"])
    env.OffloadProgram("build/app", [%(kernel)r, "main.cpp"], LIBS=[library])
""")


def test_sources_outside_the_project_compile_beside_the_target(tmp_path):
    third_party = tmp_path / "third_party"
    third_party.mkdir()
    (third_party / "kernel.cpp").write_text(KERNEL)
    (third_party / "library.cpp").write_text(LIBRARY)
    third_party.chmod(0o555)  # a read-only tree, as an installed or vendored one often is
    project = tmp_path / "proj"
    project.mkdir()
    (project / "main.cpp").write_text(MAIN)
    (project / "SConstruct").write_text(SCONSTRUCT % {"kernel": str(third_party / "kernel.cpp")})
    try:
        done = subprocess.run([SCONS, "-Q"], cwd=project, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        assert sorted(os.listdir(third_party)) == ["kernel.cpp", "library.cpp"]
        built = set(os.listdir(project / "build"))
        assert {"kernel.o", "kernel.host.bc", "kernel.x86_64.dev.o", "kernel.gfx90a.dev.bc", "app"} <= built
        assert {"library.o", "library.host.bc"} <= set(os.listdir(project / "build" / "lib"))
        run = subprocess.run([str(project / "build" / "app")], capture_output=True, text=True,
                             env=dict(os.environ, OMP_TARGET_OFFLOAD="MANDATORY"))
        assert run.returncode == 0 and run.stdout == "42 9\n", run.stdout + run.stderr
        again = subprocess.run([SCONS, "-Q"], cwd=project, capture_output=True, text=True)
        assert again.returncode == 0 and "is up to date" in again.stdout, again.stdout + again.stderr
        clean = subprocess.run([SCONS, "-Q", "-c"], cwd=project, capture_output=True, text=True)
        assert clean.returncode == 0, clean.stdout + clean.stderr
        assert not [p for p in (project / "build").rglob("*") if p.is_file()]
    finally:
        third_party.chmod(0o755)
