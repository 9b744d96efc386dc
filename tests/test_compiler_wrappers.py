"""A compiler wrapper as $OFFLOAD_CLANG (Spack's compiler wrappers, ccache's masquerade directory, a logging
script): the wrapper is the driver the build asks, the driver's InstalledDir is where its tools and the
OpenMP runtime are found. End to end with SCons and the real toolchain.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCONS = str(Path(sys.executable).with_name("scons"))

SCONSTRUCT = textwrap.dedent("""
    import offload_builders.scons
    env = Environment(tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()],
                      OFFLOAD_ARCHS=ARGUMENTS["archs"], OFFLOAD_CLANG=ARGUMENTS["clang"])
    env.OffloadProgram("prog", ["main.cpp"])
""")

#: FROM_WRAPPER is defined only by the wrapper (as Spack's wrappers add flags): the program compiles only
#: when the host and device compile jobs are the ones the wrapper asked for.
MAIN_CPP = textwrap.dedent("""
    #include <cstdio>
    #include <string>
    #include <omp.h>
    int main() {
      int on_device = 0;
      #pragma omp target map(from : on_device)
      on_device = !omp_is_initial_device() && FROM_WRAPPER == 42;
      std::string text = std::to_string(FROM_WRAPPER);  // needs libstdc++ at the link
      std::printf("on_device=%d from_wrapper=%s\\n", on_device, text.c_str());
      return on_device ? 0 : 1;
    }
""")


def _wrapper(path: Path, log: Path, real: str) -> Path:
    """A logging wrapper that adds a define to compiles and execs the real driver."""
    path.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "{path.name} $*" >> {log}
        case " $* " in *" -c "*) exec {real} -DFROM_WRAPPER=42 "$@";; esac
        exec {real} "$@"
    """))
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("names", [("clang", "clang++"), ("mycc", None)], ids=["clang-and-clang++", "mycc-alone"])
def test_a_wrapper_in_another_directory_builds_and_runs(tmp_path, names):
    """The issue's failure: 'libomptarget.devicertl.a not found in /tmp/lib', because the library directory
    was derived from the wrapper's location. A wrapper with no clang++ beside it links in g++ mode."""
    c_name, cxx_name = names
    wrappers = tmp_path / "wrappers"
    wrappers.mkdir()
    log = tmp_path / "wrapper.log"
    clang = _wrapper(wrappers / c_name, log, "/usr/lib/llvm-19/bin/clang")
    if cxx_name:
        _wrapper(wrappers / cxx_name, log, "/usr/lib/llvm-19/bin/clang++")
    project = tmp_path / "proj"
    project.mkdir()
    (project / "SConstruct").write_text(SCONSTRUCT)
    (project / "main.cpp").write_text(MAIN_CPP)
    environ = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "OFFLOAD_CLANG")}
    done = subprocess.run([SCONS, "-Q", "archs=x86_64,gfx90a", f"clang={clang}"], cwd=project, check=False,
                          capture_output=True, text=True, env=environ)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (project / "prog.gfx90a.img").is_file()  # AMDGPU: compiled and device-linked with the driver's ld.lld

    run = subprocess.run([str(project / "prog")], capture_output=True, text=True, check=False,
                         env=dict(environ, OMP_TARGET_OFFLOAD="MANDATORY"))  # libomptarget found by the rpath
    assert (run.returncode, run.stdout) == (0, "on_device=1 from_wrapper=42\n"), run.stderr

    calls = [line.split() for line in log.read_text().splitlines()]
    cxx = cxx_name or c_name
    cxx_mode = [] if cxx_name else ["--driver-mode=g++"]
    # The C++ compile jobs were asked of the (C++) wrapper, for the host and for each target ...
    compile_probes = [call for call in calls if call[0] == cxx and "-###" in call and "-c" in call
                      and "-fopenmp" in call]
    assert any("--offload-arch=gfx90a" in call for call in compile_probes), calls
    assert any("-fopenmp-targets=x86_64-unknown-linux-gnu" in call for call in compile_probes), calls
    # ... the device links of the wrapper in C mode, and the host link of the C++ driver.
    assert any(call[0] == c_name and "--target=amdgcn-amd-amdhsa" in call for call in calls), calls
    assert any(call[:1 + len(cxx_mode)] == [cxx, *cxx_mode] and "-###" in call and "-c" not in call
               and "prog.partial" in call for call in calls), calls


def test_offload_link_with_a_wrapper_links_against_the_drivers_runtime(tmp_path):
    """``offload-link`` finds its toolchain the same way: the device link is the driver's ld.lld job with the
    driver's library directory (it was ``-L<wrapper's directory>/../lib`` and the system ``ld``)."""
    (tmp_path / "main.c").write_text("int main(void) {\n  int x = 0;\n#pragma omp target map(from : x)\n"
                                     "  x = 1;\n  return !x;\n}\n")
    subprocess.run(["/usr/lib/llvm-19/bin/clang", "-fopenmp", "-fopenmp-targets=x86_64-unknown-linux-gnu",
                    "-c", "main.c", "-o", "main.o"], cwd=tmp_path, check=True)
    (tmp_path / "wrappers").mkdir()
    clang = _wrapper(tmp_path / "wrappers" / "clang", tmp_path / "wrapper.log", "/usr/lib/llvm-19/bin/clang")
    done = subprocess.run([str(Path(sys.executable).with_name("offload-link")), "--dry-run",
                           "--linker-path=/usr/lib/llvm-19/bin/ld.lld", "--", "-o", "prog", "main.o"],
                          cwd=tmp_path, capture_output=True, text=True, check=False,
                          env=dict(os.environ, OFFLOAD_CLANG=str(clang)))
    assert done.returncode == 0, done.stderr
    device_link = done.stderr.splitlines()[0].split()
    assert device_link[0] == "/usr/lib/llvm-19/bin/ld.lld" and "-shared" in device_link, device_link
    assert "-L/usr/lib/llvm-19/lib" in device_link and f"-L{tmp_path}/lib" not in device_link, device_link
    assert "--target=x86_64-unknown-linux-gnu" in (tmp_path / "wrapper.log").read_text()  # asked of the wrapper
