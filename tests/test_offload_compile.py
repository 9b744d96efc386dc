"""``offload-compile``: one phase per command gives the SCons tool's and the driver's fat objects, with one
depfile per node, untouched unchanged outputs (Ninja's ``restat``) and a guard for the source identity."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO_ROOT, driver_library_flags, which_or_fail
from offload_builders.models.hip import default_compression_version, default_cuid
from offload_builders.targets import parse_offload_archs
from offload_builders.toolchain import find_toolchain

OFFLOAD_COMPILE = [sys.executable, "-m", "offload_builders.cli.compile"]
SCONS = str(Path(sys.executable).with_name("scons"))

SOURCE = textwrap.dedent("""\
    #include "k.hpp"
    double sum(const double *x, int n) {
      double s = 0;
    #pragma omp target teams distribute parallel for reduction(+ : s) map(to : x[0 : n])
      for (int i = 0; i < n; ++i) s += scaled(x[i]);
      return s;
    }
""")
HEADER = "inline double scaled(double v) { return 3 * v; }\n"
FLAGS = ["-O2", "-Iinc"]


@pytest.fixture
def work(tmp_path) -> Path:
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "k.hpp").write_text(HEADER)
    (tmp_path / "k.cpp").write_text(SOURCE)
    (tmp_path / "k.hip").write_text("__attribute__((global)) void k(float *x) { *x = 1; }\n")
    (tmp_path / "k.cu").write_text("__attribute__((global)) void k(float *x) { *x = 1; }\n")
    return tmp_path


def oc(work: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([*OFFLOAD_COMPILE, *args], cwd=work, capture_output=True, text=True)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def build_by_commands(work: Path, archs: str, stem: str = "k") -> Path:
    """The whole object, one command per phase and target, as a Ninja build would run them."""
    oc(work, "host", "k.cpp", "-o", f"{stem}.host.bc", "--", *FLAGS)
    images, targets = [], [str(target) for target in parse_offload_archs(archs)][::-1]  # any order works
    for target in targets:
        image = f"{stem}.{target.replace(':', '_')}.dev"
        oc(work, "device", "k.cpp", "--host-bc", f"{stem}.host.bc", "--target", target, "-o", image, "--", *FLAGS)
        images.append(image)
    oc(work, "package", "k.cpp", "--targets", ",".join(targets), "-o", f"{stem}.pkg", *images, "--", *FLAGS)
    oc(work, "embed", "k.cpp", "--host-bc", f"{stem}.host.bc", "--package", f"{stem}.pkg", "-o", f"{stem}.o",
       "--", *FLAGS)
    return work / f"{stem}.o"


def test_commands_give_the_scons_tools_fat_object(work):
    """Same source file (its inode names the target regions), same directory: byte for byte."""
    (work / "SConstruct").write_text(textwrap.dedent("""\
        import offload_builders.scons
        env = Environment(tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()],
                          OFFLOAD_ARCHS=["x86_64", "gfx90a"], OFFLOAD_FLAGS=["-O2"], CPPPATH=["inc"])
        env.OffloadObject("scons/k.o", "k.cpp")
    """))
    subprocess.run([SCONS, "-Q"], cwd=work, check=True, capture_output=True)
    ours = build_by_commands(work, "x86_64,gfx90a")
    assert ours.read_bytes() == (work / "scons" / "k.o").read_bytes()


def test_commands_give_the_drivers_fat_object(work):
    ours = build_by_commands(work, "gfx90a")
    targets = parse_offload_archs("gfx90a")
    subprocess.run([str(find_toolchain().clangxx), "-fopenmp", "--offload-arch=gfx90a",
                    *driver_library_flags(targets, FLAGS), *FLAGS, "-c", "k.cpp", "-o", "mono.o"],
                   cwd=work, check=True, capture_output=True)
    assert ours.read_bytes() == (work / "mono.o").read_bytes()


def depfile_rule(path: Path) -> tuple[str, list[str]]:
    target, _, rest = path.read_text().replace("\\\n", " ").partition(":")
    return target, rest.split()


def test_each_node_writes_its_own_depfile_with_headers_and_compilers(work):
    oc(work, "host", "k.cpp", "-o", "k.host.bc", "--depfile", "k.host.d", "--", *FLAGS)
    oc(work, "device", "k.cpp", "--host-bc", "k.host.bc", "--target", "x86_64", "-o", "k.x86_64.o",
       "--depfile", "k.x86_64.d", "--", *FLAGS)
    oc(work, "package", "k.cpp", "--targets", "x86_64", "-o", "k.pkg", "k.x86_64.o", "--depfile", "k.pkg.d",
       "--", *FLAGS)
    oc(work, "embed", "k.cpp", "--host-bc", "k.host.bc", "--package", "k.pkg", "-o", "k.o", "--depfile", "k.o.d",
       "--", *FLAGS)
    toolchain = find_toolchain()
    clang = os.path.realpath(toolchain.clang)
    host_target, host_deps = depfile_rule(work / "k.host.d")
    assert host_target == "k.host.bc"                                    # Ninja rejects any other output
    assert host_deps[:2] == ["k.cpp", "inc/k.hpp"] and clang in host_deps
    device_target, device_deps = depfile_rule(work / "k.x86_64.d")
    assert device_target == "k.x86_64.o"
    assert device_deps[:2] == ["k.cpp", "inc/k.hpp"] and "k.host.bc" in device_deps and clang in device_deps
    assert depfile_rule(work / "k.pkg.d")[1][0] == "k.x86_64.o"
    embed_target, embed_deps = depfile_rule(work / "k.o.d")
    assert embed_target == "k.o" and embed_deps[:2] == ["k.host.bc", "k.pkg"] and clang in embed_deps
    # No node left the driver's shared dependency file behind, and no partial output.
    assert not list(work.glob("*.partial")) and sorted(p.name for p in work.glob("*.d")) == \
        ["k.host.d", "k.o.d", "k.pkg.d", "k.x86_64.d"]


def test_an_unchanged_output_keeps_its_file_and_mtime(work):
    build_by_commands(work, "x86_64")
    old = 1_000_000_000
    for name in ("k.host.bc", "k.x86_64.dev", "k.pkg", "k.o"):
        os.utime(work / name, (old, old))
    inode = (work / "k.x86_64.dev").stat().st_ino
    # A comment-only change in place (same inode): the device code is the same bytes, so it stays untouched.
    with open(work / "k.cpp", "a") as f:
        f.write("// a comment\n")
    oc(work, "device", "k.cpp", "--host-bc", "k.host.bc", "--target", "x86_64", "-o", "k.x86_64.dev", "--", *FLAGS)
    assert (work / "k.x86_64.dev").stat().st_mtime == old and (work / "k.x86_64.dev").stat().st_ino == inode
    build_by_commands(work, "x86_64")
    assert all((work / name).stat().st_mtime == old for name in ("k.x86_64.dev", "k.pkg", "k.o"))
    # A real change rewrites it.
    (work / "inc" / "k.hpp").write_text(HEADER.replace("3 *", "4 *"))
    build_by_commands(work, "x86_64")
    assert (work / "k.x86_64.dev").stat().st_mtime != old and (work / "k.o").stat().st_mtime != old


def test_a_recreated_source_stops_the_device_compile_until_the_host_runs_again(work):
    oc(work, "host", "k.cpp", "-o", "k.host.bc", "--", *FLAGS)
    temporary = work / "k.cpp.tmp"
    shutil.copy2(work / "k.cpp", temporary)
    os.replace(temporary, work / "k.cpp")                   # same bytes, new inode (a safe-save, a branch switch)
    done = oc(work, "device", "k.cpp", "--host-bc", "k.host.bc", "--target", "x86_64", "-o", "k.x86_64.dev",
              "--", *FLAGS, check=False)
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert "'k.cpp' is not the file 'k.host.bc' was made from" in done.stderr
    assert not (work / "k.host.bc.identity").exists() and not (work / "k.x86_64.dev").exists()
    oc(work, "host", "k.cpp", "-o", "k.host.bc", "--", *FLAGS)
    oc(work, "device", "k.cpp", "--host-bc", "k.host.bc", "--target", "x86_64", "-o", "k.x86_64.dev", "--", *FLAGS)


#: sample_project/hip's stub configuration: its OFFLOAD_FLAGS, CPPPATH and OFFLOAD_HIP_FLAGS.
HIP_FLAGS = ["-O2", "-Iinclude", "-nogpulib", "-nogpuinc"]


def test_hip_commands_give_the_scons_tools_fat_binary_and_object(tmp_path):
    """A .hip source: per target a device node (compile + link to the code object), the fat binary, the
    host compile; ``--source-root`` the SCons top directory, so the default CUID is the SCons tool's."""
    sample = tmp_path / "hip"
    shutil.copytree(REPO_ROOT / "sample_project" / "hip", sample, ignore=shutil.ignore_patterns("build", ".sconsign*"))
    subprocess.run([SCONS, "-Q", "offload_archs=gfx90a,gfx942", "build/saxpy.o"], cwd=sample, check=True,
                   capture_output=True)
    targets = ["gfx942", "gfx90a"]                                     # any order works
    for target in targets:
        oc(sample, "device", "src/saxpy.hip", "--target", target, "-o", f"saxpy.{target}.hsaco",
           "--depfile", f"saxpy.{target}.d", "--source-root", ".", "--", *HIP_FLAGS)
    oc(sample, "bundle", "src/saxpy.hip", "--targets", ",".join(targets), "-o", "saxpy.hipfb",
       *(f"saxpy.{target}.hsaco" for target in targets), "--", *HIP_FLAGS)
    oc(sample, "host", "src/saxpy.hip", "--fatbin", "saxpy.hipfb", "-o", "saxpy.o", "--depfile", "saxpy.d",
       "--source-root", ".", "--", *HIP_FLAGS)
    llvm_objcopy = find_toolchain().tool("llvm-objcopy")
    for obj in ("saxpy.o", "build/saxpy.o"):
        subprocess.run([str(llvm_objcopy), f"--dump-section=.hip_fatbin={obj}.fatbin", obj, os.devnull], cwd=sample,
                       check=True, capture_output=True)
    assert (sample / "saxpy.o.fatbin").read_bytes() == (sample / "build" / "saxpy.o.fatbin").read_bytes()
    assert (sample / "saxpy.hipfb").read_bytes() == (sample / "build" / "saxpy.hipfb").read_bytes()
    assert (sample / "saxpy.o").read_bytes() == (sample / "build" / "saxpy.o").read_bytes()
    # Each node names what it read; the device node also the device linker.
    target, deps = depfile_rule(sample / "saxpy.gfx90a.d")
    assert target == "saxpy.gfx90a.hsaco" and deps[:2] == ["src/saxpy.hip", "include/kernels.h"]
    assert any(os.path.basename(path) == "lld" for path in deps)
    target, deps = depfile_rule(sample / "saxpy.d")
    assert target == "saxpy.o" and "saxpy.hipfb" in deps and deps[0] == "src/saxpy.hip"
    # Run again: nothing changed, so nothing is rewritten (Ninja's restat stops there).
    old = 1_000_000_000
    for name in ("saxpy.gfx90a.hsaco", "saxpy.hipfb", "saxpy.o"):
        os.utime(sample / name, (old, old))
    oc(sample, "device", "src/saxpy.hip", "--target", "gfx90a", "-o", "saxpy.gfx90a.hsaco", "--source-root", ".",
       "--", *HIP_FLAGS)
    oc(sample, "host", "src/saxpy.hip", "--fatbin", "saxpy.hipfb", "-o", "saxpy.o", "--source-root", ".",
       "--", *HIP_FLAGS)
    assert (sample / "saxpy.gfx90a.hsaco").stat().st_mtime == old and (sample / "saxpy.o").stat().st_mtime == old
    # Another CUID is another object (its host and device code must share it: pass it to both).
    oc(sample, "host", "src/saxpy.hip", "--fatbin", "saxpy.hipfb", "-o", "saxpy.o", "--cuid", "other_cuid",
       "--", *HIP_FLAGS)
    assert (sample / "saxpy.o").read_bytes() != (sample / "build" / "saxpy.o").read_bytes()


def hip_sample(tmp_path: Path, *scons_args: str) -> Path:
    """sample_project/hip, its saxpy.o built by the SCons tool with ``scons_args``."""
    sample = tmp_path / "hip"
    shutil.copytree(REPO_ROOT / "sample_project" / "hip", sample, ignore=shutil.ignore_patterns("build", ".sconsign*"))
    subprocess.run([SCONS, "-Q", "offload_archs=gfx90a,gfx942", *scons_args, "build/saxpy.o"], cwd=sample, check=True,
                   capture_output=True)
    return sample


def test_hip_compressed_fat_binary_is_the_scons_tools(tmp_path):
    """``--offload-compress`` (and a level) in the flags: the bundle step writes the SCons tool's CCOB bytes."""
    compress = ["--offload-compress", "--offload-compression-level=9"]
    sample = hip_sample(tmp_path, f"flags={' '.join(compress)}")
    flags = [HIP_FLAGS[0], *compress, *HIP_FLAGS[1:]]                    # the SCons tool's order
    cuid = default_cuid("src/saxpy.hip")                                  # the SCons tool's
    for target in ("gfx90a", "gfx942"):
        oc(sample, "device", "src/saxpy.hip", "--target", target, "-o", f"saxpy.{target}.hsaco",
           "--cuid", cuid, "--", *flags)
    oc(sample, "bundle", "src/saxpy.hip", "--targets", "gfx90a,gfx942", "-o", "saxpy.hipfb", "saxpy.gfx90a.hsaco",
       "saxpy.gfx942.hsaco", "--", *flags)
    oc(sample, "host", "src/saxpy.hip", "--fatbin", "saxpy.hipfb", "-o", "saxpy.o", "--cuid", cuid,
       "--", *flags)
    assert (sample / "saxpy.hipfb").read_bytes()[:4] == b"CCOB"
    assert (sample / "saxpy.hipfb").read_bytes() == (sample / "build" / "saxpy.hipfb").read_bytes()
    assert (sample / "saxpy.o").read_bytes() == (sample / "build" / "saxpy.o").read_bytes()


def test_hip_relocatable_device_code_gives_the_scons_tools_package_and_object(tmp_path):
    """-fgpu-rdc: per target the device bitcode, the offload package (kind hip), the host compile embedding it."""
    sample = hip_sample(tmp_path, "rdc=1")
    flags = [*HIP_FLAGS, "-fgpu-rdc"]
    for target in ("gfx942", "gfx90a"):
        oc(sample, "device", "src/saxpy.hip", "--target", target, "-o", f"saxpy.{target}.bc", "--", *flags)
    oc(sample, "package", "src/saxpy.hip", "--targets", "gfx942,gfx90a", "-o", "saxpy.pkg", "saxpy.gfx942.bc",
       "saxpy.gfx90a.bc", "--depfile", "saxpy.pkg.d", "--", *flags)
    oc(sample, "host", "src/saxpy.hip", "--package", "saxpy.pkg", "-o", "saxpy.o", "--", *flags)
    assert (sample / "saxpy.pkg").read_bytes() == (sample / "build" / "saxpy.offload.pkg").read_bytes()
    assert (sample / "saxpy.o").read_bytes() == (sample / "build" / "saxpy.o").read_bytes()
    assert depfile_rule(sample / "saxpy.pkg.d")[1][:2] == ["saxpy.gfx90a.bc", "saxpy.gfx942.bc"]


@pytest.mark.parametrize("level, version", [([], ""), (["--offload-compression-level=9"], ""), ([], "2")],
                         ids=["default-level", "level-9", "format-2-from-the-environment"])
def test_hip_compressed_fat_binary_with_clang_22_is_its_bundlers(tmp_path, llvm22, level, version):
    """With a Clang 22 toolchain (``$OFFLOAD_CLANG``) the driver gives the bundler ``--compress`` and
    ``--compression-level=`` (Clang 19: ``-compress``), and Clang 22's bundler writes compressed format 3
    by default, or the one ``COMPRESSED_BUNDLE_FORMAT_VERSION`` names (for HIP runtimes that read only 2):
    the bundle step's fat binary is byte for byte ``clang-offload-bundler`` 22's, run with the job
    ``clang++ -###`` prints, on the same code objects, in the same environment."""
    sample = hip_sample(tmp_path)
    flags = [*HIP_FLAGS, "--offload-compress", *level]
    for target in ("gfx90a", "gfx942"):  # code objects by Clang 19 (no lld of Clang 22 here); the bundle is 22's
        oc(sample, "device", "src/saxpy.hip", "--target", target, "-o", f"saxpy.{target}.hsaco", "--", *flags)
    environ = dict(os.environ, COMPRESSED_BUNDLE_FORMAT_VERSION=version) if version else dict(os.environ)
    clang22 = dict(environ, OFFLOAD_CLANG=str(llvm22("clang")))
    done = subprocess.run([*OFFLOAD_COMPILE, "bundle", "src/saxpy.hip", "--targets", "gfx90a,gfx942", "-o",
                           "ours.hipfb", "saxpy.gfx90a.hsaco", "saxpy.gfx942.hsaco", "--", *flags],
                          cwd=sample, env=clang22, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    printed = subprocess.run([str(llvm22("clang++")), "-###", "-x", "hip", "--offload-arch=gfx90a,gfx942", *flags,
                              "-c", "src/saxpy.hip"], cwd=sample, capture_output=True, text=True, check=True).stderr
    (job,) = [shlex.split(line) for line in printed.splitlines() if "clang-offload-bundler" in line]
    assert "--compress" in job and "-compress" not in job
    inputs = ["-input=/dev/null", "-input=saxpy.gfx90a.hsaco", "-input=saxpy.gfx942.hsaco"]
    argv = [arg for arg in job if not arg.startswith(("-input=", "-output="))] + inputs + ["-output=theirs.hipfb"]
    subprocess.run(argv, cwd=sample, check=True, env=environ)
    ours = (sample / "ours.hipfb").read_bytes()
    assert ours[:6] == b"CCOB" + (b"\x02\x00" if version == "2" else b"\x03\x00")
    assert ours == (sample / "theirs.hipfb").read_bytes()


def test_the_compressed_bundle_format_follows_the_toolchain_and_its_environment_variable():
    """Clang 19's bundler writes format 2 and ignores COMPRESSED_BUNDLE_FORMAT_VERSION (the shared reference,
    checked with 19.1.7); from LLVM 20 the variable chooses 2 or 3, and LLVM 22 writes 3 without it (its
    bundler, above); another value is ignored, as the bundler ignores it with a warning."""
    variable = "COMPRESSED_BUNDLE_FORMAT_VERSION"
    assert [default_compression_version(19), default_compression_version(19, {variable: "3"})] == [2, 2]
    assert [default_compression_version(21), default_compression_version(20, {variable: "3"})] == [2, 3]
    assert [default_compression_version(22), default_compression_version(22, {variable: "2"})] == [3, 2]
    assert [default_compression_version(22, {variable: value}) for value in ("4", "x")] == [3, 3]


CUDA_SCONSTRUCT = textwrap.dedent("""\
    import offload_builders.scons
    env = Environment(tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()],
                      OFFLOAD_ARCHS=["sm_80", "sm_90"], OFFLOAD_FLAGS=["-O2"], CPPPATH=["include"],
                      OFFLOAD_RDC=bool(int(ARGUMENTS.get("rdc", "0"))))
    env.OffloadObject("build/scale.o", "src/scale.cu")
""")


@pytest.mark.parametrize("rdc", [False, True], ids=["plain", "rdc"])
def test_cuda_commands_give_the_scons_tools_fat_binary_and_object(tmp_path, cuda, rdc):
    """A .cu source: per target the device compile and ptxas (one node; the PTX kept beside the cubin), the fat
    binary (CUDA 13's fatbinary) or, with -fgpu-rdc, the offload package, and the host compile."""
    sample = tmp_path / "cuda"
    shutil.copytree(REPO_ROOT / "sample_project" / "cuda", sample)
    (sample / "SConstruct").write_text(CUDA_SCONSTRUCT)
    subprocess.run([SCONS, "-Q", f"rdc={int(rdc)}"], cwd=sample, check=True, capture_output=True)
    flags = ["-O2", "-Iinclude", *(["-fgpu-rdc"] if rdc else [])]
    root = [] if rdc else ["--source-root", "."]
    for target in ("sm_90", "sm_80"):
        oc(sample, "device", "src/scale.cu", "--target", target, "-o", f"scale.{target}.cubin",
           "--depfile", f"scale.{target}.d", *root, "--", *flags)
        cubin = f"scale.{target}.cubin"
        assert (sample / cubin).read_bytes() == (sample / "build" / cubin).read_bytes()
    if rdc:
        assert not (sample / "scale.sm_80.cubin.ptx").exists()
        oc(sample, "package", "src/scale.cu", "--targets", "sm_90,sm_80", "-o", "scale.pkg", "scale.sm_90.cubin",
           "scale.sm_80.cubin", "--", *flags)
        assert (sample / "scale.pkg").read_bytes() == (sample / "build" / "scale.offload.pkg").read_bytes()
        oc(sample, "host", "src/scale.cu", "--package", "scale.pkg", "-o", "scale.o", "--", *flags)
    else:
        assert (sample / "scale.sm_80.cubin.ptx").read_bytes() == (sample / "build" / "scale.sm_80.dev.s").read_bytes()
        oc(sample, "bundle", "src/scale.cu", "--targets", "sm_90,sm_80", "-o", "scale.fatbin", "scale.sm_90.cubin",
           "scale.sm_80.cubin", "--depfile", "scale.fatbin.d", "--", *flags)
        assert (sample / "scale.fatbin").read_bytes() == (sample / "build" / "scale.fatbin").read_bytes()
        fatbin_deps = depfile_rule(sample / "scale.fatbin.d")[1]
        assert "scale.sm_80.cubin.ptx" in fatbin_deps and os.path.realpath(cuda("fatbinary")) in fatbin_deps
        oc(sample, "host", "src/scale.cu", "--fatbin", "scale.fatbin", "-o", "scale.o", *root, "--", *flags)
    assert (sample / "scale.o").read_bytes() == (sample / "build" / "scale.o").read_bytes()
    target, deps = depfile_rule(sample / "scale.sm_80.d")
    assert target == "scale.sm_80.cubin" and deps[:2] == ["src/scale.cu", "include/cuda_min.h"]
    assert os.path.realpath(cuda("ptxas")) in deps


def test_the_default_cuid_does_not_depend_on_the_directory_commands_run_in(tmp_path):
    """Without --cuid, two build directories of one source tree (the source named ``../src/x.hip`` from one,
    ``../../src/x.hip`` from the other) give the same objects."""
    sample = hip_sample(tmp_path)
    objects = []
    for build in (sample / "b1", sample / "deeper" / "b2"):
        build.mkdir(parents=True)
        source = os.path.relpath(sample / "src" / "saxpy.hip", build)
        flags = [HIP_FLAGS[0], f"-I{sample / 'include'}", *HIP_FLAGS[2:]]
        oc(build, "device", source, "--target", "gfx90a", "-o", "saxpy.hsaco", "--", *flags)
        oc(build, "bundle", source, "--targets", "gfx90a", "-o", "saxpy.hipfb", "saxpy.hsaco", "--", *flags)
        oc(build, "host", source, "--fatbin", "saxpy.hipfb", "-o", "saxpy.o", "--", *flags)
        objects.append((build / "saxpy.o").read_bytes())
    assert objects[0] == objects[1]


def test_check_prints_the_canonical_list(work):
    assert oc(work, "check", "gfx90a:xnack+:sramecc-,x86_64", "sm_90").stdout == "gfx90a:sramecc-:xnack+,sm_90,x86_64\n"


@pytest.mark.parametrize("args, message", [
    (["check", "gfx90a,gfx90a:xnack+"], "check: conflicting offload target IDs 'gfx90a' and 'gfx90a:xnack+'"),
    (["check", "gfx9999"], "check: "),
    (["check"], "check: no target IDs given"),
    (["frobnicate"], "unknown subcommand 'frobnicate'"),
    (["host", "k.cpp", "-o", "x", "-O2"], "unknown option '-O2' (compile flags go after '--'"),
    (["host", "missing.cpp", "-o", "x"], "source file 'missing.cpp' not found"),
    (["host", "k.cpp"], "host: -o is required"),
    (["host", "k.cpp", "-o", "x", "--", "-MMD"], "the compile flag '-MMD' writes a dependency file"),
    (["host", "k.cpp", "-o", "x", "--", "--offload-arch=gfx90a"], "'--offload-arch=gfx90a' selects offload targets"),
    (["host", "k.cpp", "-o", "x", "--", "--offload-targets=amdgcn-amd-amdhsa"],
     "'--offload-targets=amdgcn-amd-amdhsa' selects offload targets"),
    (["device", "k.cpp", "--host-bc", "k.cpp", "-o", "x", "--target", "gfx90a:bogus+"], "--target: "),
    (["device", "k.cpp", "--host-bc", "nope.bc", "-o", "x", "--target", "x86_64"], "--host-bc: 'nope.bc' not found"),
    (["package", "k.cpp", "--targets", "x86_64,gfx90a", "-o", "p", "k.cpp"], "--targets names 2 targets but 1"),
    (["host", "k.txt", "-o", "x"], "source file 'k.txt' not found"),
    (["bundle", "k.cpp", "--targets", "gfx90a", "-o", "x", "k.cpp"], "bundle: 'k.cpp' is neither HIP (.hip) nor CUDA"),
    (["host", "k.cpp", "-o", "x", "--cuid", "abc"], "host: --cuid is for HIP (.hip) and CUDA (.cu) sources"),
    (["device", "k.hip", "--target", "x86_64", "-o", "x"], "--target: HIP offload targets must be AMDGPU"),
    (["device", "k.hip", "--target", "gfx90a", "-o", "x", "--cuid", "a-b"], "--cuid: 'a-b' is not a CUID"),
    (["host", "k.hip", "-o", "x"], "host: --fatbin is required"),
    (["device", "k.hip", "--target", "gfx90a", "-o", "x", "--cuid", "c", "--", "-fgpu-rdc"],
     "device: --cuid is for compiles without -fgpu-rdc"),
    (["host", "k.hip", "--fatbin", "k.cpp", "-o", "x", "--", "-fgpu-rdc"], "host: --fatbin is for compiles without"),
    (["host", "k.hip", "--package", "k.cpp", "-o", "x"], "host: --package is for -fgpu-rdc compiles"),
    (["bundle", "k.hip", "--targets", "gfx90a", "-o", "x", "k.cpp", "--", "-fgpu-rdc"], "bundle: with -fgpu-rdc"),
    (["package", "k.hip", "--targets", "gfx90a", "-o", "x", "k.cpp"], "package: 'k.hip' is HIP without -fgpu-rdc"),
    (["device", "k.hip", "--target", "gfx90a", "-o", "x", "--source-root", "inc"], "--source-root: 'k.hip' is not"),
    (["host", "k.hip", "--fatbin", "k.cpp", "-o", "x", "--", "-cuid=abc"], "the compile flag '-cuid=abc' sets the"),
    (["device", "k.cu", "--target", "gfx90a", "-o", "x"], "--target: CUDA offload targets must be NVPTX"),
    (["embed", "k.cu", "--host-bc", "k.cpp", "--package", "k.cpp", "-o", "x"], "embed: 'k.cu' is CUDA"),
    (["device", "k.cu", "--target", "sm_90", "--targets", "sm_90", "--targets-file", "k.cpp", "-o", "x"],
     "device: --targets and --targets-file both give the target list"),
    (["host", "k.cu", "--fatbin", "k.cpp", "--targets-file", "k.cpp", "-o", "x"],
     "host: --targets-file is for `device` of CUDA (.cu) sources"),
    (["device", "k.hip", "--target", "gfx90a", "--targets-file", "k.cpp", "-o", "x"],
     "device: --targets-file is for CUDA (.cu) sources"),
    (["device", "k.cu", "--target", "sm_90", "--targets-file", "nope", "-o", "x"],
     "--targets-file: cannot read 'nope'"),
    (["device", "k.cu", "--target", "sm_90", "--targets-file", "inc/k.hpp", "-o", "x"],
     "--targets-file: 'inc/k.hpp': --targets: invalid target ID"),
    (["device", "k.cu", "--target", "sm_90", "--archlist-record", "k.cpp", "-o", "x"],
     "device: --archlist-record is for `device` of CUDA (.cu) sources with --targets-file"),
    (["arch-list-check", "k.hip", "--target", "gfx90a", "-o", "x"], "arch-list-check: 'k.hip' is not CUDA (.cu)"),
    (["arch-list-check", "k.cu", "--target", "sm_90"], "arch-list-check: -o is required"),
    (["arch-list-check", "k.cu", "--target", "sm_90", "-o", "x", "--fatbin", "k.cpp"],
     "arch-list-check: --fatbin is not for arch-list-check"),
])
def test_bad_input_is_one_line_naming_it(work, args, message):
    done = oc(work, *args, check=False)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("offload-compile: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert message in done.stderr


# --- CUDA: the list check (arch-list-check) and a device compile taking the list from a file (Clang 22) -------

def test_cuda_arch_list_check_records_what_the_list_changes(tmp_path, llvm22, cuda):
    """``arch-list-check`` (Clang 22): a plain source's record keeps its bytes and mtime when a target is added,
    so a device command depending on it does not rerun; a source whose device code holds the list gets a new
    record. Its depfile names the output, the source and the header the preprocessing read, and the compiler.
    ``device --targets-file`` (the list in a file, off the command line) gives the cubin ``--targets`` gives.
    With Clang 19, which defines no list, the record does not depend on it."""
    from test_cuda import CUDA_MIN_H
    from test_cuda_arch_list import LIST_CU

    (tmp_path / "cuda_min.h").write_text(CUDA_MIN_H)
    (tmp_path / "plain.cu").write_text('#include "cuda_min.h"\n__global__ void k(float *x) { x[0] = 2; }\n')
    (tmp_path / "list.cu").write_text(LIST_CU)
    flags = ["-I.", "-nocudainc", "-nocudalib"]
    clang22 = dict(os.environ, OFFLOAD_CLANG=str(llvm22("clang")))

    def check(source: str, targets: str, environ: dict[str, str] = clang22) -> Path:
        record = tmp_path / f"{source}.sm_80.archlist"
        done = subprocess.run([*OFFLOAD_COMPILE, "arch-list-check", source, "--target", "sm_80", "--targets",
                               targets, "-o", record.name, "--depfile", f"{record.name}.d", "--source-root", ".",
                               "--", *flags], cwd=tmp_path, capture_output=True, text=True, env=environ)
        assert done.returncode == 0, done.stderr
        return record

    old = 1_000_000_000
    records = {}
    for source in ("plain.cu", "list.cu"):
        record = check(source, "sm_80,sm_90")
        records[source] = record.read_text()
        assert records[source].startswith("offload __CUDA_ARCH_LIST__ check 1\npreprocessed: sha256:")
        os.utime(record, (old, old))
        target, deps = depfile_rule(tmp_path / f"{record.name}.d")
        assert target == record.name and deps[:2] == [source, "cuda_min.h"]
        assert os.path.realpath(llvm22("clang")) in deps
        check(source, "sm_90,sm_80")  # the same list: the same record, untouched
        assert record.stat().st_mtime == old
    plain = check("plain.cu", "sm_80,sm_90,sm_86")
    assert plain.read_text() == records["plain.cu"] and plain.stat().st_mtime == old
    listed = check("list.cu", "sm_80,sm_90,sm_86")
    assert listed.read_text() != records["list.cu"] and listed.stat().st_mtime != old
    assert not list(tmp_path.glob("*.partial"))

    (tmp_path / "list.txt").write_text("sm_90,sm_80\n")
    for option in (["--targets", "sm_80,sm_90"], ["--targets-file", "list.txt"]):
        name = f"list.{option[0].strip('-')}.cubin"
        subprocess.run([*OFFLOAD_COMPILE, "device", "list.cu", "--target", "sm_80", *option, "-o", name,
                        "--depfile", f"{name}.d", "--cuid", "c", "--", *flags], cwd=tmp_path, check=True, env=clang22)
        assert "list.txt" not in (tmp_path / f"{name}.d").read_text()
    assert (tmp_path / "list.targets.cubin").read_bytes() == (tmp_path / "list.targets-file.cubin").read_bytes()

    clang19 = dict(os.environ, OFFLOAD_CLANG=str(find_toolchain().clang))
    if find_toolchain().major < 20:
        first = check("list.cu", "sm_80", clang19).read_text()
        assert check("list.cu", "sm_80,sm_90", clang19).read_text() == first and "defines no" in first


def test_cuda_device_keeps_its_outputs_where_its_record_and_command_are_as_they_were(tmp_path, llvm22, cuda):
    """``device --archlist-record`` (make, which compares times only): run again after a target was added, a device
    compile whose list check's record is unchanged starts no compiler and leaves its cubin and PTX as they were;
    a changed record, other flags, or a missing output compile again, and each result is ``--targets``' own."""
    from test_cuda import CUDA_MIN_H

    (tmp_path / "cuda_min.h").write_text(CUDA_MIN_H)
    (tmp_path / "plain.cu").write_text('#include "cuda_min.h"\n__global__ void k(float *x) { x[0] = 2; }\n')
    clang22 = dict(os.environ, OFFLOAD_CLANG=str(llvm22("clang")))

    def device(targets: str, *flags: str, record: str = "plain.archlist") -> bool:
        """Run the device command; whether it started a compiler (a ``-cc1`` or ``ptxas``, traced)."""
        (tmp_path / "list.txt").write_text(targets + "\n")
        trace = tmp_path / "trace.txt"
        subprocess.run([which_or_fail("strace"), "-f", "-qq", "-e", "trace=execve", "-e", "status=successful",
                        "-s", "256", "-o", str(trace), *OFFLOAD_COMPILE, "device", "plain.cu", "--target", "sm_80",
                        "--targets-file", "list.txt", "--archlist-record", record, "--cuid", "c", "-o", "plain.cubin",
                        "--depfile", "plain.d", "--", "-I.", "-nocudainc", "-nocudalib", *flags],
                       cwd=tmp_path, check=True, env=clang22)
        return any('"-cc1"' in line or "ptxas" in line for line in trace.read_text().splitlines())

    (tmp_path / "plain.archlist").write_text("record one\n")
    assert device("sm_80,sm_90")
    cubin = (tmp_path / "plain.cubin").read_bytes()
    assert not device("sm_80,sm_90,sm_86")  # the record as it was: no compile
    assert (tmp_path / "plain.cubin").read_bytes() == cubin
    (tmp_path / "plain.archlist").write_text("record two\n")
    assert device("sm_80,sm_90,sm_86")  # the list changes this compile's text
    assert not device("sm_80,sm_90,sm_86")
    assert device("sm_80,sm_90,sm_86", "-O1")  # other flags, the same record
    (tmp_path / "plain.cubin").unlink()
    assert device("sm_80,sm_90,sm_86", "-O1")
    subprocess.run([*OFFLOAD_COMPILE, "device", "plain.cu", "--target", "sm_80", "--targets", "sm_80,sm_90,sm_86",
                    "--cuid", "c", "-o", "reference.cubin", "--", "-I.", "-nocudainc", "-nocudalib", "-O1"],
                   cwd=tmp_path, check=True, env=clang22)
    assert (tmp_path / "plain.cubin").read_bytes() == (tmp_path / "reference.cubin").read_bytes()
