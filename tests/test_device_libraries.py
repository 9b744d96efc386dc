"""GPU device libraries (ROCm's ocml/oclc, CUDA's libdevice, the NVPTX OpenMP runtime) and the device link's
level, with the real toolchain: math in target regions builds for every target as the one-command driver
builds it, the user's own library flags win, a target without its libraries says what to install.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import driver_library_flags
from offload_builders import linking
from offload_builders.device_libraries import DEBIAN_ROCM_BITCODE, device_library_flags
from offload_builders.targets import parse_offload_archs, parse_target_id
from offload_builders.toolchain import find_toolchain

pytestmark = pytest.mark.slow

SCONS = str(Path(sys.executable).with_name("scons"))
OFFLOAD_LINK = str(Path(sys.executable).with_name("offload-link"))
LLVM = Path("/usr/lib/llvm-19/bin")
RUN_ENV = dict(os.environ, OMP_TARGET_OFFLOAD="MANDATORY", LD_LIBRARY_PATH="/usr/lib/llvm-19/lib")
#: What the CUDA driver resolves when it loads an image (printf, malloc): undefined in the driver's images too.
CUDA_RUNTIME_CALLS = {"vprintf", "malloc", "free"}

#: sin, cos, sqrt and atan2 in double and float on the device, each printed exactly (%a) beside the host's.
MATH_CPP = textwrap.dedent("""
    #include <cmath>
    #include <cstdio>
    #include <omp.h>
    #define N 8
    int main() {
      double xd[N], d[N][4];
      float xf[N], f[N][4];
      for (int i = 0; i < N; ++i) { xd[i] = 0.37 * i - 1.1; xf[i] = 0.29f * i - 0.9f; }
      int on_device = 0;
      #pragma omp target map(to : xd, xf) map(from : d, f, on_device)
      {
        on_device = !omp_is_initial_device();
        for (int i = 0; i < N; ++i) {
          d[i][0] = sin(xd[i]); d[i][1] = cos(xd[i]); d[i][2] = sqrt(xd[i] * xd[i] + 1.0); d[i][3] = atan2(xd[i], 0.7);
          f[i][0] = sinf(xf[i]); f[i][1] = cosf(xf[i]); f[i][2] = sqrtf(xf[i] * xf[i] + 1.0f);
          f[i][3] = atan2f(xf[i], 0.7f);
        }
      }
      std::printf("on_device=%d\\n", on_device);
      for (int i = 0; i < N; ++i) {
        double hd[4] = {sin(xd[i]), cos(xd[i]), sqrt(xd[i] * xd[i] + 1.0), atan2(xd[i], 0.7)};
        float hf[4] = {sinf(xf[i]), cosf(xf[i]), sqrtf(xf[i] * xf[i] + 1.0f), atan2f(xf[i], 0.7f)};
        for (int k = 0; k < 4; ++k) std::printf("%a %a %a %a\\n", d[i][k], hd[k], (double)f[i][k], (double)hf[k]);
      }
      return 0;
    }
""")
PLAIN_CPP = textwrap.dedent("""
    int main() {
      int x = 20;
      #pragma omp target map(tofrom : x)
      x += 22;
      return x == 42 ? 0 : 1;
    }
""")


def _sconstruct(settings: str, build: str = 'env.OffloadProgram("math", ["math.cpp"])') -> str:
    return textwrap.dedent("""
        import offload_builders.scons
        env = Environment(tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()],
                          OFFLOAD_ARCHS=ARGUMENTS.get("archs", "x86_64,gfx90a,sm_80"))
        for phase in ("DEVICE", "DEVICELINK"):
            env["OFFLOAD_%sCOMSTR" % phase] = "@@%s $OFFLOAD_TARGET ${_OFFLOAD_%s}" % (
                phase, "DEVICE_CC1" if phase == "DEVICE" else "DEVICE_LINK_CMD")
    """) + textwrap.dedent(settings) + "\n" + build + "\n"


def _project(root: Path, settings: str = "", build: str = 'env.OffloadProgram("math", ["math.cpp"])') -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "SConstruct").write_text(_sconstruct(settings, build))
    (root / "math.cpp").write_text(MATH_CPP)
    (root / "plain.cpp").write_text(PLAIN_CPP)
    return root


def _scons(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([SCONS, "-Q", *args], cwd=root, capture_output=True, text=True, check=False)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def _lines(done: subprocess.CompletedProcess, phase: str, target: str) -> list[str]:
    """The commands of one phase and target, as the COMSTR prints them (``@@<PHASE> <target> <command>``)."""
    return [line for line in done.stdout.splitlines() if line.startswith(f"@@{phase} {target} ")]


def _symbols(image: Path) -> tuple[set[str], set[str]]:
    """(defined FUNC names, undefined names) of a linked device image, from llvm-readelf."""
    listing = subprocess.run([str(LLVM / "llvm-readelf"), "-sW", str(image)], capture_output=True, text=True,
                             check=True).stdout
    functions, undefined = set(), set()
    for line in listing.splitlines():
        words = line.split()
        if len(words) >= 8 and words[0].endswith(":") and words[0][:-1].isdigit():
            if words[6] == "UND" and words[7:]:
                undefined.add(words[7])
            elif words[3] == "FUNC":
                functions.add(words[7])
    return functions, undefined


@pytest.fixture(scope="module")
def math_build(tmp_path_factory) -> Path:
    """The math program built by the SCons tool for x86_64, gfx90a and sm_80, with no flags at all."""
    root = _project(tmp_path_factory.mktemp("math") / "project")
    _scons(root)
    return root


def test_math_in_target_regions_builds_for_every_target_and_runs_as_on_the_host(math_build):
    """The x86_64 device is the host CPU plugin: its device code calls the same libm, so the values are equal
    to the last bit."""
    run = subprocess.run([str(math_build / "math")], capture_output=True, text=True, env=RUN_ENV, check=False)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "on_device=1" and len(lines) == 1 + 8 * 4
    for line in lines[1:]:
        device, host, device_float, host_float = line.split()
        assert (device, device_float) == (host, host_float), line


@pytest.mark.parametrize("target, driver_name", [("gfx90a", "amdgcn.gfx90a"), ("sm_80", "nvptx64.sm_80")])
def test_gpu_images_resolve_the_math_and_define_what_the_driver_links(math_build, target, driver_name):
    """The one-command driver with the same device-library flags (``-save-temps`` keeps its images) links
    the same functions; neither image leaves a math symbol undefined."""
    driver = math_build.parent / "driver"
    if not driver.exists():
        driver.mkdir()
        flags = driver_library_flags(parse_offload_archs("gfx90a,sm_80"))
        subprocess.run([str(LLVM / "clang++"), "-fopenmp", "--offload-arch=gfx90a,sm_80", *flags, "-save-temps",
                        str(math_build / "math.cpp"), "-o", "math"], cwd=driver, check=True, capture_output=True)
    ours, ours_undefined = _symbols(math_build / f"math.{target}.img")
    theirs, theirs_undefined = _symbols(driver / f"math.{driver_name}.img")
    assert ours == theirs and ours
    assert ours_undefined == theirs_undefined and ours_undefined <= CUDA_RUNTIME_CALLS


def test_the_users_device_library_flags_reach_the_device_commands(tmp_path):
    """Another copy of ROCm's libraries named in $OFFLOAD_TARGET_FLAGS is what the device compile links (and
    depends on: an upgraded library rebuilds only that target's compile); the user's -nogpulib links none."""
    libraries = tmp_path / "bitcode"
    shutil.copytree(DEBIAN_ROCM_BITCODE, libraries)
    root = _project(tmp_path / "project", f"""
        if ARGUMENTS.get("nogpulib"):
            env["OFFLOAD_TARGET_FLAGS"] = {{"gfx90a": ["-nogpulib"]}}
        else:
            env["OFFLOAD_TARGET_FLAGS"] = {{"gfx90a": ["--rocm-device-lib-path={libraries}"]}}
    """, build='env.OffloadObject("math.o", "math.cpp")')
    built = _scons(root, "archs=gfx90a,sm_80")
    (compile_line,) = _lines(built, "DEVICE", "gfx90a")
    assert f"-mlink-builtin-bitcode {libraries}/ocml.bc" in compile_line
    assert f"-mlink-builtin-bitcode {libraries}/oclc_isa_version_90a.bc" in compile_line
    assert DEBIAN_ROCM_BITCODE not in compile_line and "-nogpulib" not in compile_line
    os.utime(libraries / "ocml.bc", ns=(0, (libraries / "ocml.bc").stat().st_mtime_ns + 10**9))
    rebuilt = _scons(root, "archs=gfx90a,sm_80")
    assert [line.split()[:2] for line in rebuilt.stdout.splitlines() if line.startswith("@@DEVICE ")] == \
        [["@@DEVICE", "gfx90a"]]
    (plain,) = _lines(_scons(root, "archs=gfx90a,sm_80", "nogpulib=1"), "DEVICE", "gfx90a")
    assert "-nogpulib" in plain.split() and "-mlink-builtin-bitcode" not in plain


def test_a_target_without_its_libraries_builds_plain_code_and_names_the_library_math_needs(tmp_path):
    """ROCm 5.2.3 has no oclc_isa_version_942.bc: gfx942 compiles with -nogpulib, code without math links,
    and a device link that needs ocml says which symbol, which library and what to install."""
    assert device_library_flags(find_toolchain(), parse_target_id("gfx942"), ()) == ("-nogpulib",), \
        "this test needs a GPU target whose device libraries are not installed (gfx942 with ROCm 5.2.3)"
    root = _project(tmp_path / "project", build='env.OffloadProgram("plain", ["plain.cpp"])\n'
                                                 'env.OffloadProgram("math", ["math.cpp"])')
    _scons(root, "archs=x86_64,gfx942", "plain")
    failed = _scons(root, "archs=x86_64,gfx942", "math", check=False)
    assert failed.returncode != 0
    assert "undefined symbol: __ocml_" in failed.stderr  # the linker's own message still shows
    (hint,) = [line for line in failed.stderr.splitlines() if line.startswith("scons: *** [math.gfx942.img]")]
    assert "gfx942: undefined device-library symbol __ocml_" in hint and "ocml.bc" in hint
    assert "apt-get install rocm-device-libs" in hint and "--rocm-device-lib-path=" in hint


@pytest.mark.parametrize("target, symbol, library", [("gfx90a", "__ocml_", "rocm-device-libs"),
                                                     ("sm_80", "__nv_", "libdevice.10.bc")])
def test_offload_link_names_the_library_a_failed_device_link_needs(tmp_path, target, symbol, library):
    """Objects compiled elsewhere with -nogpulib, linked by the driver through offload-link (``-B``)."""
    (tmp_path / "math.cpp").write_text(MATH_CPP)
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "clang-linker-wrapper").write_text(f"#!/bin/sh\nexec {OFFLOAD_LINK} \"$@\"\n")
    (shim / "clang-linker-wrapper").chmod(0o755)
    clangxx = str(LLVM / "clang++")
    subprocess.run([clangxx, "-fopenmp", f"--offload-arch={target}", "-nogpulib", "-O2", "-c", "math.cpp"],
                   cwd=tmp_path, check=True)
    scratch = tmp_path / "tmp"  # the link's $TMPDIR: a failed link leaves nothing there
    scratch.mkdir()
    done = subprocess.run([clangxx, f"-B{shim}", "-fopenmp", f"--offload-arch={target}", "math.o", "-o", "math"],
                          cwd=tmp_path, capture_output=True, text=True, check=False,
                          env=dict(os.environ, TMPDIR=str(scratch)))
    assert done.returncode != 0
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("offload-link: error:")]
    assert f"{target}: undefined device-library symbol {symbol}" in error and library in error
    assert "the compile flags" in error and "Traceback" not in done.stderr
    assert sorted(os.listdir(scratch)) == []


def test_a_failed_nvptx_device_link_leaves_no_temporaries_in_tmpdir(tmp_path):
    """clang-nvlink-wrapper keeps its temporaries (``000-XXXXXX.cubin``, the LTO's ``.s``) in $TMPDIR when the
    link fails: the SCons tool runs each device link with a $TMPDIR of its own (inside the one in
    ``$ENV``), removed when the link ends. The whole-program NVPTX link (no runtime node) is the one that
    runs the wrapper's LTO."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    root = _project(tmp_path / "project", f"""
        env.Append(OFFLOAD_FLAGS=["-nogpulib"])
        env["OFFLOAD_NVPTX_RUNTIME_NODE"] = False
        env["ENV"]["TMPDIR"] = {str(scratch)!r}
    """)
    done = _scons(root, "archs=sm_80", check=False)
    assert done.returncode != 0 and "scons: *** [math.sm_80.img]" in done.stderr, done.stdout + done.stderr
    assert sorted(os.listdir(scratch)) == []


# --------------------------------------------------------------------------------------------------
# The device link's level
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags", ["", "-O", "-O0", "-O1", "-Og", "-Os", "-Oz", "-O3", "-O4", "-Ofast", "-O3 -O1"])
def test_the_link_lines_level_maps_as_the_driver_maps_it(tmp_path, flags):
    """``clang++ -fopenmp --offload-arch=... <flags> x.o``: the wrapper's --opt-level, or none (its O2)."""
    (tmp_path / "x.o").write_bytes(b"")
    done = subprocess.run([str(LLVM / "clang++"), "-###", "-fopenmp", "--offload-arch=gfx90a", *flags.split(),
                           "x.o", "-o", "x"], cwd=tmp_path, capture_output=True, text=True, check=True)
    (wrapper,) = [line for line in done.stderr.splitlines() if "clang-linker-wrapper" in line]
    levels = [word.strip('"')[len("--opt-level="):] for word in wrapper.split() if "--opt-level=" in word]
    assert linking.driver_opt_level(flags.split()) == (levels[0] if levels else None)
    assert linking.device_link_opt_flag(flags.split()) == "-" + (levels[0] if levels else "O2")


def _device_link_levels(root: Path, *args: str) -> tuple[str, str]:
    """The -O of the gfx90a and sm_80 device links of a build: AMDGPU's LTO (ld.lld's ``-plugin-opt=O<n>``),
    NVPTX's LTO and link-time ptxas (``clang-nvlink-wrapper --plugin-opt=O<n>``)."""
    built = _scons(root, "archs=gfx90a,sm_80", *args)
    (amdgpu,) = _lines(built, "DEVICELINK", "gfx90a")
    (nvptx,) = _lines(built, "DEVICELINK", "sm_80")
    levels = [[word.rpartition("=")[2] for word in line.split() if word.startswith(prefix)]
              for line, prefix in ((amdgpu, "-plugin-opt=O"), (nvptx, "--plugin-opt=O"))]
    assert all(len(found) == 1 for found in levels), (amdgpu, nvptx)
    return levels[0][0], levels[1][0]


@pytest.mark.parametrize("settings, level", [
    ('env["OFFLOAD_FLAGS"] = ["-O3"]', "O3"),                                     # the compile's level
    ('env["OFFLOAD_FLAGS"] = ["-O3"]; env.Append(LINKFLAGS=["-O1"])', "O1"),     # the link line's wins
    ('env["OFFLOAD_FLAGS"] = ["-Ofast"]', "O3"),                                  # mapped as the driver maps it
])
def test_the_device_link_level_follows_the_compile(tmp_path, settings, level):
    """As a one-command ``clang++ -O3 -fopenmp --offload-arch=...`` build links its devices at -O3."""
    root = _project(tmp_path / "project", settings, build='env.OffloadProgram("plain", ["plain.cpp"])')
    assert _device_link_levels(root) == (level, level)


def test_an_explicit_device_link_level_wins(tmp_path):
    root = _project(tmp_path / "project", """
        env["OFFLOAD_FLAGS"] = ["-O3"]
        if ARGUMENTS.get("explicit"):
            env["OFFLOAD_DEVICE_LINKFLAGS"] = ["-O1"]
    """, build='env.OffloadProgram("plain", ["plain.cpp"])')
    assert _device_link_levels(root) == ("O3", "O3")
    assert _device_link_levels(root, "explicit=1") == ("O1", "O1")
