"""``native`` in a target list: this machine's GPUs, asked of the toolchain's ``amdgpu-arch`` and ``nvptx-arch`` at
every read (:mod:`offload_builders.native_targets`), in the SCons tool, ``offload-compile`` and the CMake module.

The GPUs are stand-in ``amdgpu-arch``/``nvptx-arch`` scripts named by ``$OFFLOAD_AMDGPU_ARCH_TOOL`` /
``$OFFLOAD_NVPTX_ARCH_TOOL`` (Clang's ``--amdgpu-arch-tool=``/``--nvptx-arch-tool=``), or put where the lookup
(the toolchain's InstalledDir, then PATH) finds them; the builds are real, with Clang 19 and 22. The no-GPU error is
checked with stand-ins that find nothing and with the real tools of this machine (which has no GPU: should it have
one, those tests check that its GPUs are what ``native`` stands for instead).
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import LLVM19_BIN, LLVM22_BIN, REPO_ROOT, copy_sample_for_ninja
from offload_builders.errors import NativeTargetError, OffloadError, TargetIDError
from offload_builders.native_targets import (
    expand_native,
    find_arch_tools,
    names_native,
    resolve_native,
    system_gpu_names,
)
from offload_builders.targets import parse_offload_archs, parse_target_id
from offload_builders.toolchain import find_toolchain

SCONS = str(Path(sys.executable).with_name("scons"))
OFFLOAD_COMPILE = [sys.executable, "-m", "offload_builders.cli.compile"]
NO_GPU_HINT = "Name the targets instead, e.g. OFFLOAD_ARCHS=sm_90,gfx90a"


def stand_in(path: Path, *names: str, status: int = 0, stderr: str = "") -> Path:
    """A GPU-listing tool that prints ``names`` one a line (and ``stderr``) and exits with ``status``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(f"echo {shlex.quote(name)}\n" for name in names)
    said = f"echo {shlex.quote(stderr)} >&2\n" if stderr else ""
    path.write_text(f"#!/bin/sh\n{lines}{said}exit {status}\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def gpus(tmp_path):
    """``set(amd=[...], nv=[...])`` makes the stand-ins answer so (None: that tool fails as with no driver);
    ``environ`` names them for subprocesses."""
    class Gpus:
        amd = tmp_path / "tools" / "amdgpu-arch"
        nv = tmp_path / "tools" / "nvptx-arch"
        environ = dict(os.environ, OFFLOAD_AMDGPU_ARCH_TOOL=str(amd), OFFLOAD_NVPTX_ARCH_TOOL=str(nv))

        def set(self, amd: list[str] | None, nv: list[str] | None) -> None:
            if amd is None:
                stand_in(self.amd, status=1, stderr="Failed to get device count")
            else:
                stand_in(self.amd, *amd)
            if nv is None:
                stand_in(self.nv, status=1, stderr="Failed to 'dlopen' libcuda.so.1")
            else:
                stand_in(self.nv, *nv)

    return Gpus()


def real_gpus(bin_dir: Path) -> tuple[str, ...]:
    """What the real tools of ``bin_dir`` find here (nothing on this GPU-less machine), asked as Clang asks."""
    names: list[str] = []
    for tool in ("amdgpu-arch", "nvptx-arch"):
        done = subprocess.run([str(bin_dir / tool)], capture_output=True, text=True, timeout=60, check=False)
        if done.returncode == 0:
            names += [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return tuple(dict.fromkeys(names))


def toolchain(bin_dir: Path = LLVM19_BIN):
    return find_toolchain(dict(os.environ, OFFLOAD_CLANG=str(bin_dir / "clang")))


# --- the core: expansion, lookup, the tools' answers ---------------------------------------------------------------

def test_native_is_replaced_in_place_and_the_list_then_canonicalized():
    assert names_native("x86_64, native") and names_native(["sm_80", "native,x86_64"]) and names_native("native:xnack+")
    assert not names_native("x86_64,sm_90") and not names_native(["nativex"])
    words = expand_native("x86_64, native ,sm_80", ["gfx90a", "sm_90"])
    assert words == ("x86_64", "gfx90a", "sm_90", "sm_80")
    assert [str(t) for t in parse_offload_archs(words)] == ["gfx90a", "sm_80", "sm_90", "x86_64"]
    # The same processor named and found: one target (the list's dedup).
    assert [str(t) for t in parse_offload_archs(expand_native(["gfx90a", "native"], ["gfx90a"]))] == ["gfx90a"]
    with pytest.raises(NativeTargetError, match="'native' takes no target-ID features"):
        expand_native("native:xnack+", ["gfx90a"])
    # Where nothing replaced it, the parser says where native belongs.
    with pytest.raises(TargetIDError, match="'native' .* is taken by target lists only"):
        parse_target_id("native")


def test_tools_are_found_as_clangs_driver_finds_them(tmp_path):
    """The variable's tool (a path, or a name on PATH), else the InstalledDir's, else PATH's."""
    installed, on_path = tmp_path / "bin", tmp_path / "path"
    stand_in(installed / "amdgpu-arch", "gfx90a")
    stand_in(on_path / "amdgpu-arch", "gfx942")
    stand_in(on_path / "nvptx-arch", "sm_90")
    stand_in(on_path / "my-nvptx-arch", "sm_80")
    amd, nv = find_arch_tools(installed, str(on_path), {})
    assert (amd.name, amd.path) == ("amdgpu-arch", str(installed / "amdgpu-arch"))  # InstalledDir first
    assert (nv.name, nv.path) == ("nvptx-arch", str(on_path / "nvptx-arch"))  # then PATH
    assert system_gpu_names((amd, nv)) == ("gfx90a", "sm_90")
    amd, nv = find_arch_tools(installed, str(on_path), {"OFFLOAD_AMDGPU_ARCH_TOOL": str(on_path / "amdgpu-arch"),
                                                        "OFFLOAD_NVPTX_ARCH_TOOL": "my-nvptx-arch"})
    assert system_gpu_names((amd, nv)) == ("gfx942", "sm_80")
    amd, nv = find_arch_tools(tmp_path / "empty", "", {})
    assert amd.path is None and nv.path is None
    with pytest.raises(NativeTargetError) as caught:
        system_gpu_names((amd, nv))
    assert f"amdgpu-arch was not found (looked at {tmp_path / 'empty'})" in str(caught.value)


def test_names_are_deduplicated_in_order_and_one_vendor_is_enough(tmp_path):
    amd = stand_in(tmp_path / "amd", "gfx90a", "gfx90a", "", "gfx942", "gfx90a")  # four GPUs, two kinds
    nv = stand_in(tmp_path / "nv", status=1, stderr="Failed to 'dlopen' libcuda.so.1")  # no NVIDIA driver
    tools = find_arch_tools(tmp_path, "", {"OFFLOAD_AMDGPU_ARCH_TOOL": str(amd), "OFFLOAD_NVPTX_ARCH_TOOL": str(nv)})
    assert system_gpu_names(tools) == ("gfx90a", "gfx942")
    # As in Clang, a tool that fails found nothing, whatever it printed.
    stand_in(amd, "gfx90a", status=2)
    stand_in(nv, "sm_90", "sm_90")
    assert system_gpu_names(tools) == ("sm_90",)


def test_no_gpu_is_one_error_naming_the_tools_what_they_said_and_what_to_do(tmp_path):
    amd = stand_in(tmp_path / "amd")  # exit 0, no line: Clang 22's amdgpu-arch without a GPU
    nv = stand_in(tmp_path / "nv", status=1, stderr="Failed to 'dlopen' libcuda.so.1")
    environ = {"OFFLOAD_AMDGPU_ARCH_TOOL": str(amd), "OFFLOAD_NVPTX_ARCH_TOOL": str(nv)}
    with pytest.raises(NativeTargetError) as caught:
        resolve_native("x86_64,native", toolchain(), environ)
    message = str(caught.value)
    assert message == (f"'native' found no GPU on this machine: amdgpu-arch ({amd}) printed no GPU; nvptx-arch ({nv})"
                       f" exited with status 1 (\"Failed to 'dlopen' libcuda.so.1\"). {NO_GPU_HINT}")
    assert isinstance(caught.value, OffloadError) and "\n" not in message
    assert resolve_native("x86_64,sm_90", toolchain(), environ) is None  # no native: no tool runs


@pytest.mark.parametrize("bin_dir", [LLVM19_BIN, LLVM22_BIN], ids=["clang19", "clang22"])
def test_the_real_tools_of_each_toolchain_on_this_machine(bin_dir):
    """Clang 19's tools fail here (exit 1: "Failed to get device count", "Failed to 'dlopen' libcuda.so.1"); Clang
    22's amdgpu-arch (offload-arch) prints nothing and exits 0, its nvptx-arch exits 1 silently."""
    found = real_gpus(bin_dir)
    if found:  # a machine with a GPU: native is its GPUs
        assert resolve_native("native", toolchain(bin_dir), {}) == found
        return
    with pytest.raises(NativeTargetError) as caught:
        resolve_native("native", toolchain(bin_dir), {})
    message = str(caught.value)
    assert f"amdgpu-arch ({bin_dir}/amdgpu-arch) " in message and f"nvptx-arch ({bin_dir}/nvptx-arch) " in message
    assert message.endswith(NO_GPU_HINT)
    if bin_dir == LLVM19_BIN:
        assert "exited with status 1 (\"Failed to get device count\")" in message
        assert "exited with status 1 (\"Failed to 'dlopen' libcuda.so.1\")" in message
    else:
        assert "amdgpu-arch) printed no GPU" in message and "nvptx-arch) exited with status 1 and printed nothing" \
            in message


def test_every_read_asks_again(tmp_path):
    amd, nv = stand_in(tmp_path / "amd", "gfx90a"), stand_in(tmp_path / "nv", "sm_90")
    environ = {"OFFLOAD_AMDGPU_ARCH_TOOL": str(amd), "OFFLOAD_NVPTX_ARCH_TOOL": str(nv)}
    assert resolve_native("native", toolchain(), environ) == ("gfx90a", "sm_90")
    stand_in(amd, "gfx942")
    stand_in(nv, status=1)
    assert resolve_native("native", toolchain(), environ) == ("gfx942",)


# --- SCons ---------------------------------------------------------------------------------------------------------

SCONSTRUCT = textwrap.dedent("""
    import offload_builders.scons
    from offload_builders.scons.variables import target_flags
    env = Environment(tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()],
                      OFFLOAD_ARCHS=ARGUMENTS.get("archs", "native").split(","), OFFLOAD_FLAGS=["-O1"],
                      CPPPATH=["#"], OFFLOAD_HIP_FLAGS=["-nogpulib", "-nogpuinc"])
    for name in ("OFFLOAD_CLANG", "OFFLOAD_AMDGPU_ARCH_TOOL", "OFFLOAD_NVPTX_ARCH_TOOL"):
        if ARGUMENTS.get(name):
            env[name] = ARGUMENTS[name]
    if ARGUMENTS.get("cuda_flags"):
        env["OFFLOAD_CUDA_FLAGS"] = ARGUMENTS["cuda_flags"].split()
    if ARGUMENTS.get("native_flags"):
        env["OFFLOAD_TARGET_FLAGS"] = {"native": ARGUMENTS["native_flags"].split()}
    for phase in ("HOST", "DEVICE", "ASSEMBLE", "PACKAGE", "EMBED", "BUNDLE"):
        env["OFFLOAD_%sCOMSTR" % phase] = "@@%s $TARGET" % phase
    for source in ARGUMENTS.get("sources", "k.cpp,h.hip,c.cu").split(","):
        env.OffloadObject(source)
    targets = env.OffloadSelectedTargets()
    print("TARGETS", ",".join(str(t) for t in targets))
    print("FLAGS", ";".join("%s=%s" % (t, " ".join(target_flags(env, t))) for t in targets))
""")

K_CPP = textwrap.dedent("""
    double sum(const double *x, int n) {
      double s = 0;
    #pragma omp target teams distribute parallel for reduction(+ : s) map(to : x[0 : n])
      for (int i = 0; i < n; ++i) s += x[i];
      return s;
    }
""")


@pytest.fixture
def scons_project(tmp_path) -> Path:
    """An OpenMP, a HIP and a CUDA source (HIP and CUDA with the stand-in runtimes' headers, as the sample's)."""
    from test_cuda import CUDA_MIN_H, SCALE_CU

    root = tmp_path / "proj"
    root.mkdir()
    (root / "SConstruct").write_text(SCONSTRUCT)
    (root / "k.cpp").write_text(K_CPP)
    shutil.copy(REPO_ROOT / "sample_project" / "hip" / "include" / "hip_min.h", root)
    shutil.copy(REPO_ROOT / "sample_project" / "mixed" / "src" / "plain.hip", root / "h.hip")
    (root / "cuda_min.h").write_text(CUDA_MIN_H)
    (root / "c.cu").write_text(SCALE_CU)
    return root


def scons(root: Path, *args: str, environ: dict[str, str], check: bool = True) -> tuple[list[tuple[str, str]], str]:
    """``scons -Q``: the phases it ran (``@@<PHASE> <target>``) and its whole output."""
    done = subprocess.run([SCONS, "-Q", *args], cwd=root, capture_output=True, text=True, env=environ)
    output = done.stdout + done.stderr
    assert (done.returncode == 0) == check, output
    commands = [tuple(line[2:].split(" ", 1)) for line in output.splitlines() if line.startswith("@@")]
    return [(phase, target.strip()) for phase, target in commands], output


def devices(commands: list[tuple[str, str]]) -> list[str]:
    return sorted(target for phase, target in commands if phase == "DEVICE")


def line_starting(output: str, prefix: str) -> str:
    return next(line for line in output.splitlines() if line.startswith(prefix))


@pytest.mark.slow
def test_scons_builds_the_gpus_native_stands_for_and_asks_again_at_every_run(scons_project, tmp_path, gpus):
    """OFFLOAD_ARCHS=['native'] with an AMD and an NVIDIA GPU: OpenMP compiles for both, HIP for the gfx one, CUDA
    for the sm one; a run whose GPUs did not change runs nothing; new GPUs, new targets. The answer is in no probe
    cache or signature file (what SCons keeps are the resolved targets' own nodes)."""
    gpus.set(amd=["gfx90a", "gfx90a"], nv=["sm_90"])
    commands, output = scons(scons_project, environ=gpus.environ)
    assert line_starting(output, "TARGETS") == "TARGETS gfx90a,sm_90"
    assert devices(commands) == ["c.sm_90.cubin", "h.gfx90a.hsaco", "k.gfx90a.dev.bc", "k.sm_90.dev.cubin.o"]
    for name in ("k.o", "h.o", "c.o", "h.gfx90a.hsaco", "c.sm_90.cubin"):
        assert (scons_project / name).is_file(), name
    assert scons(scons_project, environ=gpus.environ)[0] == []

    gpus.set(amd=["gfx942"], nv=["sm_80", "sm_90"])
    commands, output = scons(scons_project, environ=gpus.environ)
    assert line_starting(output, "TARGETS") == "TARGETS gfx942,sm_80,sm_90"
    assert devices(commands) == ["c.sm_80.cubin", "h.gfx942.hsaco", "k.gfx942.dev.bc", "k.sm_80.dev.cubin.o"]

    for kept in (scons_project / ".sconsign.offload-probes.json", scons_project / ".sconsign.dblite",
                 *Path(os.environ["OFFLOAD_BUILDERS_CACHE_DIR"]).rglob("*.json")):
        text = kept.read_bytes().replace(os.fsencode(tmp_path.parent), b"")  # (test directories' names)
        assert b"native" not in text, kept


@pytest.mark.slow
def test_scons_native_with_clang_22(scons_project, gpus):
    """Clang 22 (whose OpenMP, unlike Clang 19's, takes --offload-arch=native, but the tool resolves it all the
    same), a CUDA source, the stand-ins named by construction variables: an NVIDIA-only machine is enough."""
    gpus.set(amd=None, nv=["sm_90", "sm_80", "sm_90"])
    args = ("sources=c.cu", "cuda_flags=-nocudainc -nocudalib", f"OFFLOAD_CLANG={LLVM22_BIN / 'clang'}",
            f"OFFLOAD_AMDGPU_ARCH_TOOL={gpus.amd}", f"OFFLOAD_NVPTX_ARCH_TOOL={gpus.nv}")
    commands, output = scons(scons_project, *args, environ=dict(os.environ))
    assert line_starting(output, "TARGETS") == "TARGETS sm_80,sm_90"
    assert devices(commands) == ["c.sm_80.cubin", "c.sm_90.cubin"]
    assert (scons_project / "c.o").is_file()


def test_scons_native_key_of_a_target_flags_table(scons_project, gpus):
    """{'native': flags}: the flags of the targets native stands for; with no native in OFFLOAD_ARCHS, a warning."""
    gpus.set(amd=["gfx90a"], nv=["sm_90"])
    _, output = scons(scons_project, "-n", "sources=k.cpp", "archs=x86_64,native", "native_flags=-DNATIVE",
                      environ=gpus.environ)
    assert line_starting(output, "FLAGS") == "FLAGS gfx90a=-DNATIVE;sm_90=-DNATIVE;x86_64="
    _, output = scons(scons_project, "-n", "sources=k.cpp", "archs=x86_64,sm_90", "native_flags=-DNATIVE",
                      environ=gpus.environ)
    assert line_starting(output, "FLAGS") == "FLAGS sm_90=;x86_64="
    assert "OFFLOAD_TARGET_FLAGS key 'native' matches no target of this build" in output


def test_scons_errors_name_native(scons_project, gpus):
    gpus.set(amd=[], nv=None)  # no GPU: amdgpu-arch prints nothing, nvptx-arch fails
    _, output = scons(scons_project, "-n", environ=gpus.environ, check=False)
    error = line_starting(output, "scons: ***")
    assert error == (f"scons: *** OFFLOAD_ARCHS: 'native' found no GPU on this machine: amdgpu-arch ({gpus.amd})"
                     f" printed no GPU; nvptx-arch ({gpus.nv}) exited with status 1 (\"Failed to 'dlopen'"
                     f" libcuda.so.1\"). {NO_GPU_HINT}"), output
    assert "Traceback" not in output
    gpus.set(amd=None, nv=["sm_90"])  # the HIP source has no target on an NVIDIA-only machine
    _, output = scons(scons_project, "-n", environ=gpus.environ, check=False)
    error = line_starting(output, "scons: ***")
    assert "h.hip: the hip model compiles for AMDGPU" in error
    assert "('native' stands for sm_90 on this machine)" in error
    gpus.set(amd=["gfx1999"], nv=None)  # a processor the tools know and this package does not
    _, output = scons(scons_project, "-n", environ=gpus.environ, check=False)
    assert line_starting(output, "scons: ***").startswith(
        "scons: *** OFFLOAD_ARCHS (native = gfx1999): invalid target ID 'gfx1999': unknown processor")


def test_scons_native_with_the_real_tools_of_this_machine(scons_project):
    found = real_gpus(LLVM19_BIN)
    _, output = scons(scons_project, "-n", "sources=k.cpp", environ=dict(os.environ), check=bool(found))
    if found:
        assert line_starting(output, "TARGETS") == "TARGETS " + ",".join(map(str, parse_offload_archs(found)))
        return
    error = line_starting(output, "scons: ***")
    assert error.startswith("scons: *** OFFLOAD_ARCHS: 'native' found no GPU on this machine: amdgpu-arch"
                            f" ({LLVM19_BIN}/amdgpu-arch) exited with status 1") and error.endswith(NO_GPU_HINT)


# --- offload-compile -----------------------------------------------------------------------------------------------

def offload_compile(cwd: Path, *args: str, environ: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([*OFFLOAD_COMPILE, *args], cwd=cwd, capture_output=True, text=True, env=environ)


def test_offload_compile_check_resolves_native_at_every_command(tmp_path, gpus):
    gpus.set(amd=["gfx90a"], nv=["sm_90", "sm_90"])
    done = offload_compile(tmp_path, "check", "x86_64,native", environ=gpus.environ)
    assert (done.returncode, done.stdout, done.stderr) == (0, "gfx90a,sm_90,x86_64\n", "")
    gpus.set(amd=None, nv=["sm_80"])
    assert offload_compile(tmp_path, "check", "native", environ=gpus.environ).stdout == "sm_80\n"
    gpus.set(amd=[], nv=None)
    done = offload_compile(tmp_path, "check", "native", environ=gpus.environ)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("offload-compile: error: check: 'native' found no GPU on this machine: amdgpu-arch")
    assert done.stderr.endswith(f"{NO_GPU_HINT}\n") and done.stderr.count("\n") == 1
    gpus.set(amd=["gfx1999"], nv=None)  # a processor the tools know and this package does not
    done = offload_compile(tmp_path, "check", "native", environ=gpus.environ)
    assert done.stderr.startswith("offload-compile: error: check (native = gfx1999): invalid target ID 'gfx1999'")


def test_offload_compile_check_model_keeps_the_targets_that_model_takes(tmp_path, gpus):
    """``check --model`` (the CMake module's offload_archs(<var> HIP|CUDA)): the one model-to-kinds rule, the list's
    canonical order; a model with none of the targets gets an empty line, ``native`` too (a machine with NVIDIA
    GPUs only has no HIP target: no error); an unknown model, or --model on another subcommand, one line."""
    listed = "x86_64,sm_80,gfx90a:xnack+,gfx942"
    for model, expected in (("openmp", "gfx90a:xnack+,gfx942,sm_80,x86_64"), ("HIP", "gfx90a:xnack+,gfx942"),
                            ("cuda", "sm_80")):
        done = offload_compile(tmp_path, "check", "--model", model, listed, environ=gpus.environ)
        assert (done.returncode, done.stdout, done.stderr) == (0, expected + "\n", ""), model
    gpus.set(amd=None, nv=["sm_90"])
    done = offload_compile(tmp_path, "check", "--model", "hip", "native", environ=gpus.environ)
    assert (done.returncode, done.stdout, done.stderr) == (0, "\n", "")
    done = offload_compile(tmp_path, "check", "--model", "cuda", "native,x86_64", environ=gpus.environ)
    assert (done.returncode, done.stdout) == (0, "sm_90\n")
    done = offload_compile(tmp_path, "check", "--model", "fortran", listed, environ=gpus.environ)
    assert done.returncode == 1 and done.stderr == ("offload-compile: error: --model: unknown offload model"
                                                    " 'fortran'; use openmp, hip or cuda\n")
    done = offload_compile(tmp_path, "compdb-args", "--model", "hip", "x.hip", "--targets", "gfx90a",
                           environ=gpus.environ)
    assert done.returncode == 1 and "--model is for check" in done.stderr


@pytest.mark.parametrize("bin_dir", [LLVM19_BIN, LLVM22_BIN], ids=["clang19", "clang22"])
def test_offload_compile_check_with_the_real_tools_of_this_machine(tmp_path, bin_dir):
    done = offload_compile(tmp_path, "check", "native", environ=dict(os.environ, OFFLOAD_CLANG=str(bin_dir / "clang")))
    found = real_gpus(bin_dir)
    if found:
        assert done.stdout == ",".join(map(str, parse_offload_archs(found))) + "\n"
        return
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"offload-compile: error: check: 'native' found no GPU on this machine: amdgpu-arch"
                                  f" ({bin_dir}/amdgpu-arch) ")


def test_offload_compile_target_options_take_native_per_model(tmp_path, gpus):
    """--target native: the one GPU the source's model compiles for (HIP: the gfx one); --targets native: those of
    the model (a HIP bundle of one code object); two of a kind for --target is an error naming them."""
    gpus.set(amd=["gfx90a"], nv=["sm_90"])
    shutil.copy(REPO_ROOT / "sample_project" / "hip" / "include" / "hip_min.h", tmp_path)
    shutil.copy(REPO_ROOT / "sample_project" / "mixed" / "src" / "plain.hip", tmp_path / "h.hip")
    flags = ("--", "-O1", "-I.", "-nogpulib", "-nogpuinc")
    done = offload_compile(tmp_path, "device", "h.hip", "--target", "native", "-o", "h.hsaco", *flags,
                           environ=gpus.environ)
    assert done.returncode == 0, done.stderr
    named = offload_compile(tmp_path, "device", "h.hip", "--target", "gfx90a", "-o", "h.gfx90a.hsaco", *flags,
                            environ=gpus.environ)
    assert named.returncode == 0, named.stderr
    assert (tmp_path / "h.hsaco").read_bytes() == (tmp_path / "h.gfx90a.hsaco").read_bytes()
    done = offload_compile(tmp_path, "bundle", "h.hip", "--targets", "native", "-o", "h.hipfb", "h.hsaco", *flags,
                           environ=gpus.environ)
    assert done.returncode == 0 and (tmp_path / "h.hipfb").is_file(), done.stderr

    gpus.set(amd=["gfx90a", "gfx942"], nv=None)
    done = offload_compile(tmp_path, "device", "h.hip", "--target", "native", "-o", "h.hsaco", *flags,
                           environ=gpus.environ)
    assert done.returncode == 1 and done.stderr == (
        "offload-compile: error: --target: 'native' stands for 2 targets here (gfx90a, gfx942), and --target takes"
        " one: name it, or give them all to a list (offload-compile check native)\n")
    gpus.set(amd=None, nv=["sm_90"])
    done = offload_compile(tmp_path, "device", "h.hip", "--target", "native", "-o", "h.hsaco", *flags,
                           environ=gpus.environ)
    assert done.returncode == 1 and "'native' found sm_90 on this machine, and the hip model compiles for none" \
        in done.stderr


# --- CMake ---------------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_cmake_configure_resolves_native_at_every_configure_and_caches_only_the_word(tmp_path, gpus):
    from test_cmake import cmake, cmake_dir, environ, offload_commands

    project = copy_sample_for_ninja(tmp_path, "cmake", "meson")

    def configure() -> subprocess.CompletedProcess:
        extra = {name: gpus.environ[name] for name in ("OFFLOAD_AMDGPU_ARCH_TOOL", "OFFLOAD_NVPTX_ARCH_TOOL")}
        argv = [cmake(), "-G", "Ninja", "-S", "cmake", "-B", "build", f"-DOffloadBuilders_DIR={cmake_dir()}",
                "-DOFFLOAD_ARCHS=native"]
        return subprocess.run(argv, cwd=project, env=environ(project, **extra), capture_output=True, text=True)

    def targets() -> set[str]:
        found = set()
        for line in offload_commands(project):
            words = line.split()
            found.update(words[i + 1] for i, word in enumerate(words[:-1]) if word == "--target")
        return found

    gpus.set(amd=["gfx90a"], nv=["sm_90"])
    done = configure()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OffloadBuilders: OFFLOAD_ARCHS 'native' is gfx90a,sm_90 on this machine" in done.stdout
    assert targets() == {"gfx90a", "sm_90"}  # zaxpy (OpenMP) both, hip_check gfx90a, cuda_check sm_90
    entries = [line for line in (project / "build" / "CMakeCache.txt").read_text().splitlines()
               if not line.startswith(("//", "#"))]  # (the help strings name example targets)
    assert "OFFLOAD_ARCHS:STRING=native" in entries
    assert not [line for line in entries if "gfx90a" in line or "sm_90" in line or "native" in line.split("=")[0]]

    gpus.set(amd=["gfx942"], nv=None)  # another machine's GPUs: the next configure asks again
    done = configure()
    assert done.returncode == 0, done.stdout + done.stderr
    assert targets() == {"gfx942"}

    gpus.set(amd=[], nv=None)
    done = configure()
    lines = [line.strip() for line in (done.stdout + done.stderr).splitlines()]
    errors = [i for i, line in enumerate(lines) if line.startswith("CMake Error")]
    assert done.returncode != 0 and len(errors) == 1, lines
    message = lines[errors[0] + 1]
    assert message.startswith("OFFLOAD_ARCHS 'native': offload-compile: error: check: 'native' found no GPU on this"
                              f" machine: amdgpu-arch ({gpus.amd}) printed no GPU") and message.endswith(NO_GPU_HINT)
