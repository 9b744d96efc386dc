"""The remote cache ($OFFLOAD_REMOTE) for ``offload-compile`` and ``offload-link``, as a Meson, Ninja or CMake build
runs them (one command per phase), with a real BuildGrid server on loopback: a second checkout at another path
gets the first one's HIP and CUDA outputs instead of compiling them (only the preprocessor-only dependency scans
run), byte for byte, and writes the same depfiles; a relocatable HIP program's device links and wrapper object
come from the cache too; OpenMP's inode-named phases share only with the same files; a wrong instance name is one
warning and a local build; without $OFFLOAD_REMOTE nothing changes.

Processes are counted from an exec trace (``strace -ff -e trace=execve``), as in ``test_remote_cache.py``.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from test_process_counts import Process, read_trace
from test_remote_cache import build_env

OFFLOAD_COMPILE = [sys.executable, "-m", "offload_builders.cli.compile"]

HIP_FLAGS = ["-O2", "-Ihip/include", "-nogpulib", "-nogpuinc"]
CUDA_FLAGS = ["-O2", "-Icuda/include"]


def oc(*args: str) -> list[str]:
    return [*OFFLOAD_COMPILE, *args]


#: A Ninja build's commands for a HIP source (two gfx targets) and a CUDA source (two sm targets), without
#: relocatable device code: per target the device node, the fat binary, the host compile (the object). The
#: root is the checkout (the working directory, and --source-root for the CUID); outputs go to out/.
GPU_COMMANDS = [
    *(oc("device", "hip/src/saxpy.hip", "--target", target, "-o", f"out/saxpy.{target}.hsaco", "--depfile",
         f"out/saxpy.{target}.d", "--source-root", ".", "--", *HIP_FLAGS) for target in ("gfx90a", "gfx942")),
    oc("bundle", "hip/src/saxpy.hip", "--targets", "gfx90a,gfx942", "-o", "out/saxpy.hipfb", "out/saxpy.gfx90a.hsaco",
       "out/saxpy.gfx942.hsaco", "--depfile", "out/saxpy.hipfb.d", "--", *HIP_FLAGS),
    oc("host", "hip/src/saxpy.hip", "--fatbin", "out/saxpy.hipfb", "-o", "out/saxpy.o", "--depfile", "out/saxpy.d",
       "--source-root", ".", "--", *HIP_FLAGS),
    *(oc("device", "cuda/src/scale.cu", "--target", target, "-o", f"out/scale.{target}.cubin", "--depfile",
         f"out/scale.{target}.d", "--source-root", ".", "--", *CUDA_FLAGS) for target in ("sm_80", "sm_90")),
    oc("bundle", "cuda/src/scale.cu", "--targets", "sm_80,sm_90", "-o", "out/scale.fatbin", "out/scale.sm_80.cubin",
       "out/scale.sm_90.cubin", "--depfile", "out/scale.fatbin.d", "--", *CUDA_FLAGS),
    oc("host", "cuda/src/scale.cu", "--fatbin", "out/scale.fatbin", "-o", "out/scale.o", "--depfile", "out/scale.d",
       "--source-root", ".", "--", *CUDA_FLAGS),
]
#: The compiles among them (each a -cc1 job, and its dependency scan with a remote).
GPU_COMPILES = 6


def gpu_checkout(root: Path) -> Path:
    """sample_project's HIP saxpy and CUDA scale sources with their headers, at ``root``."""
    sample = REPO_ROOT / "sample_project"
    for model, source in (("hip", "saxpy.hip"), ("cuda", "scale.cu")):
        (root / model / "src").mkdir(parents=True)
        shutil.copy(sample / model / "src" / source, root / model / "src")
        shutil.copytree(sample / model / "include", root / model / "include")
    (root / "out").mkdir()
    return root


class Commands:
    """Commands run in a checkout, one shell, under ``strace -ff``: their output and every process started."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.strace = shutil.which("strace")
        if not self.strace:
            pytest.fail("strace is missing: run scripts/bootstrap (it installs it) or apt-get install strace")
        self.runs = 0

    def __call__(self, root: Path, commands: list[list[str]], env: dict[str, str]) -> tuple[str, list[Process]]:
        self.runs += 1
        log = self.tmp_path / f"trace{self.runs}" / "pid"
        log.parent.mkdir()
        script = " && ".join(shlex.join(command) for command in commands)
        assert self.strace is not None
        done = subprocess.run([self.strace, "-ff", "-ttt", "-qq", "-v", "-s", "65536", "-e", "trace=execve", "-e",
                               "status=successful", "-e", "signal=none", "-o", str(log), "/bin/sh", "-c", script],
                              cwd=root, capture_output=True, text=True, env=env, check=False)
        output = done.stdout + done.stderr
        assert done.returncode == 0, output
        return output, read_trace(log)


@pytest.fixture
def commands(tmp_path) -> Commands:
    return Commands(tmp_path)


def compiles(processes: list[Process]) -> list[Process]:
    """The compile jobs (``-cc1``) other than dependency scans."""
    return [p for p in processes if "-cc1" in p.argv and "-Eonly" not in p.argv]


def scans(processes: list[Process]) -> list[Process]:
    return [p for p in processes if "-cc1" in p.argv and "-Eonly" in p.argv]


def device_tools(processes: list[Process]) -> list[Process]:
    """ptxas, CUDA's fatbinary, lld (HIP's device link), the offload packager."""
    return [p for p in processes if p.program in ("ptxas", "fatbinary", "lld", "clang-offload-packager")
            or p.program == "ld.lld" and any(arg.endswith(".img") for arg in p.argv)]


def warnings(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(("offload-compile: warning:",
                                                                     "offload-link: warning:"))]


def files_of(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted((root / "out").rglob("*"))
            if path.is_file()}


def cache_counts(root: Path, commands: list[list[str]], url: str, monkeypatch) -> dict[str, int]:
    """Run ``offload-compile`` commands in this process (so that its remote cache's counts can be read), in
    ``root`` with ``$OFFLOAD_REMOTE=url``: what the cache answered (hits, misses, stored), the in-process steps
    (a HIP fat binary, an OpenMP package) included, which no trace shows."""
    from offload_builders.cli import compile as cli
    from offload_builders.remote.cli_jobs import remote_steps

    monkeypatch.chdir(root)
    monkeypatch.setenv("OFFLOAD_REMOTE", url)
    steps = remote_steps(cli.PROG)
    assert steps is not None
    before = dict(steps.cache.counts)
    for command in commands:
        assert command[:3] == OFFLOAD_COMPILE and cli.main(command[3:]) == 0, command
    return {name: count - before.get(name, 0) for name, count in steps.cache.counts.items()
            if count != before.get(name, 0)}


def depfile_rule(path: Path) -> tuple[str, list[str]]:
    target, _, rest = path.read_text().replace("\\\n", " ").partition(":")
    return target, rest.split()


@pytest.mark.slow
def test_a_second_checkout_gets_hip_and_cuda_outputs_from_the_remote_cache(buildgrid, tmp_path, commands, monkeypatch):
    first = gpu_checkout(tmp_path / "first" / "checkout")
    second = gpu_checkout(tmp_path / "elsewhere" / "deeper" / "second-checkout")
    env = build_env(tmp_path, OFFLOAD_REMOTE=buildgrid.remote)

    output, processes = commands(first, GPU_COMMANDS, env)
    assert not warnings(output), output
    assert len(compiles(processes)) == GPU_COMPILES and len(scans(processes)) == GPU_COMPILES
    assert {p.program for p in device_tools(processes)} == {"lld", "ptxas", "fatbinary"}

    output, processes = commands(second, GPU_COMMANDS, env)
    assert not warnings(output), output
    assert compiles(processes) == [], "the second checkout must take its HIP and CUDA code from the cache"
    assert device_tools(processes) == []
    assert len(scans(processes)) == GPU_COMPILES  # what a lookup costs: one preprocessor-only run per compile
    ours, theirs = files_of(first), files_of(second)
    assert sorted(ours) == sorted(theirs) and "out/scale.sm_80.cubin.ptx" in ours
    for name in ours:
        assert ours[name] == theirs[name], name  # the depfiles too: as a local run writes them
    assert not [name for name in theirs if ".partial" in name]
    # The depfiles name what the nodes read: the source and its headers, the tools that ran.
    target, deps = depfile_rule(second / "out" / "saxpy.gfx90a.d")
    assert target == "out/saxpy.gfx90a.hsaco"
    assert deps[:3] == ["hip/src/saxpy.hip", "hip/include/kernels.h", "hip/include/hip_min.h"]
    assert any(os.path.basename(path) == "lld" for path in deps)
    target, deps = depfile_rule(second / "out" / "scale.sm_80.d")
    assert target == "out/scale.sm_80.cubin" and deps[:2] == ["cuda/src/scale.cu", "cuda/include/cuda_min.h"]
    assert any(os.path.basename(path) == "ptxas" for path in deps)
    target, deps = depfile_rule(second / "out" / "saxpy.d")
    assert target == "out/saxpy.o" and deps[0] == "hip/src/saxpy.hip" and "out/saxpy.hipfb" in deps
    # In a third checkout every step is a hit, the HIP fat binary (written in-process: no trace shows it) too.
    third = gpu_checkout(tmp_path / "third")
    assert cache_counts(third, GPU_COMMANDS, buildgrid.remote, monkeypatch) == {"hits": len(GPU_COMMANDS)}
    assert files_of(third) == ours

    # A hit whose bytes the output already has leaves it untouched (Ninja's restat stops there).
    old = 1_000_000_000
    for name in theirs:
        os.utime(second / name, (old, old))
    output, processes = commands(second, GPU_COMMANDS, env)
    assert compiles(processes) == [] and not warnings(output), output
    assert [name for name in theirs if (second / name).stat().st_mtime != old] == []

    # A header changed: the compiles that read it run (their keys changed), and are stored for the next checkout.
    for checkout in (first, second):
        with open(checkout / "cuda" / "include" / "cuda_min.h", "a") as f:
            f.write("// changed\n")
    output, processes = commands(second, GPU_COMMANDS, env)
    assert [p.option("-triple") for p in compiles(processes)] == ["nvptx64-nvidia-cuda"] * 2 + ["x86_64-pc-linux-gnu"]
    output, processes = commands(first, GPU_COMMANDS, env)
    assert compiles(processes) == [], output


#: HIP relocatable device code (sample_project/mixed: a kernel calling another object's device function) and the
#: Meson sample's check with its stand-in HIP runtime: device bitcode per target, package, host compile per
#: source; the link runs offload-link in clang-linker-wrapper's place.
RDC_FLAGS = ["-O2", "-Iinclude", "-nogpulib", "-nogpuinc", "-fgpu-rdc"]
RDC_COMMANDS = [
    command for source in ("scale", "rescale") for command in (
        *(oc("device", f"src/{source}.hip", "--target", target, "-o", f"out/{source}.{target}.bc", "--depfile",
             f"out/{source}.{target}.d", "--", *RDC_FLAGS) for target in ("gfx90a", "gfx942")),
        oc("package", f"src/{source}.hip", "--targets", "gfx90a,gfx942", "-o", f"out/{source}.pkg",
           f"out/{source}.gfx90a.bc", f"out/{source}.gfx942.bc", "--", *RDC_FLAGS),
        oc("host", f"src/{source}.hip", "--package", f"out/{source}.pkg", "-o", f"out/{source}.o", "--depfile",
           f"out/{source}.d", "--", *RDC_FLAGS))]


def rdc_checkout(root: Path, clangxx: Path) -> Path:
    sample = REPO_ROOT / "sample_project"
    (root / "src").mkdir(parents=True)
    for name in ("scale.hip", "rescale.hip", "hip_stub.cpp"):
        shutil.copy(sample / "mixed" / "src" / name, root / "src")
    shutil.copy(sample / "meson" / "hip_rdc_check.cpp", root / "src")
    shutil.copytree(sample / "hip" / "include", root / "include")
    (root / "out").mkdir()
    for name in ("hip_stub", "hip_rdc_check"):  # host-only objects, compiled before the traced build
        subprocess.run([str(clangxx), "-O2", "-Iinclude", "-c", f"src/{name}.cpp", "-o", f"out/{name}.o"], cwd=root,
                       check=True)
    return root


def offload_link_command(root: Path, clangxx: Path) -> list[str]:
    """The offload-link command the driver runs (in clang-linker-wrapper's place) to link the program, with
    ``--wrapper-verbose``, which also names what came from the remote cache."""
    shim = subprocess.run([sys.executable, "-m", "offload_builders.cli.link", "--print-shim-dir"],
                          capture_output=True, text=True, check=True).stdout.strip()
    driver = [str(clangxx), "-fuse-ld=lld", "out/scale.o", "out/rescale.o", "out/hip_rdc_check.o", "out/hip_stub.o",
              "--offload-link", f"-B{shim}", "-o", "out/prog", "-###"]
    jobs = subprocess.run(driver, cwd=root, capture_output=True, text=True, check=True).stderr.splitlines()
    (job,) = [shlex.split(line) for line in jobs if "clang-linker-wrapper" in line]
    return [job[0], "--wrapper-verbose", *job[1:]]


@pytest.mark.slow
def test_a_relocatable_hip_program_links_from_the_remote_cache(buildgrid, tmp_path, commands, llvm19):
    """offload-link takes each GPU target's device link and the wrapper object from the cache too: the second
    checkout runs no compile, no packager, no device link; its program is the first's, byte for byte, and runs."""
    clangxx = llvm19("clang++")
    env = build_env(tmp_path, OFFLOAD_REMOTE=buildgrid.remote)
    first = rdc_checkout(tmp_path / "a" / "rdc", clangxx)
    second = rdc_checkout(tmp_path / "b" / "c" / "rdc", clangxx)

    def build(root: Path) -> tuple[str, list[Process]]:
        output, processes = commands(root, RDC_COMMANDS, env)
        linked, more = commands(root, [offload_link_command(root, clangxx), ["out/prog"]], env)
        return output + linked, processes + more

    output, processes = build(first)
    assert not warnings(output), output
    assert len([p for p in device_tools(processes) if p.program == "ld.lld"]) == 2  # gfx90a, gfx942
    assert "remote cache:" not in output

    output, processes = build(second)
    assert not warnings(output), output
    assert compiles(processes) == [] and device_tools(processes) == [], output
    assert len(scans(processes)) == 6
    fetched = sorted(line.rsplit(".", 2)[-2:][0] for line in output.splitlines() if line.startswith("remote cache: "))
    assert fetched == ["gfx90a", "gfx942", "wrapper"], output  # both device links and the wrapper object
    assert "HIP kernels each registered once and launched once: yes" in output
    ours, theirs = files_of(first), files_of(second)
    assert sorted(ours) == sorted(theirs)
    for name in ours:
        assert ours[name] == theirs[name], name


#: An OpenMP source (x86_64 offload target): host front end, device compile, package, embed.
OPENMP_SOURCE = """#include "k.hpp"
double sum(const double *x, int n) {
  double s = 0;
#pragma omp target teams distribute parallel for reduction(+ : s) map(to : x[0 : n])
  for (int i = 0; i < n; ++i) s += scaled(x[i]);
  return s;
}
"""
OPENMP_COMMANDS = [
    oc("host", "k.cpp", "-o", "out/k.host.bc", "--depfile", "out/k.host.d", "--", "-O2", "-Iinc"),
    oc("device", "k.cpp", "--host-bc", "out/k.host.bc", "--target", "x86_64", "-o", "out/k.x86_64.dev", "--depfile",
       "out/k.dev.d", "--", "-O2", "-Iinc"),
    oc("package", "k.cpp", "--targets", "x86_64", "-o", "out/k.pkg", "out/k.x86_64.dev", "--", "-O2", "-Iinc"),
    oc("embed", "k.cpp", "--host-bc", "out/k.host.bc", "--package", "out/k.pkg", "-o", "out/k.o", "--depfile",
       "out/k.o.d", "--", "-O2", "-Iinc"),
]


def openmp_checkout(root: Path) -> Path:
    (root / "inc").mkdir(parents=True)
    (root / "inc" / "k.hpp").write_text("inline double scaled(double v) { return 3 * v; }\n")
    (root / "k.cpp").write_text(OPENMP_SOURCE)
    (root / "out").mkdir()
    return root


@pytest.mark.slow
def test_openmp_phases_share_only_the_files_their_region_names_hold(buildgrid, tmp_path, commands, monkeypatch):
    """The host front end and device compiles are keyed with the inode of every file they read: the same files
    (a removed build directory) get everything from the cache, the .identity file and depfiles included; a
    source re-created with the same bytes (another inode), or another checkout, compiles again."""
    env = build_env(tmp_path, OFFLOAD_REMOTE=buildgrid.remote)
    checkout = openmp_checkout(tmp_path / "omp")
    commands(checkout, OPENMP_COMMANDS, env)
    built = files_of(checkout)
    shutil.rmtree(checkout / "out")
    (checkout / "out").mkdir()
    output, processes = commands(checkout, OPENMP_COMMANDS, env)
    assert compiles(processes) == [] and not warnings(output), output
    assert files_of(checkout) == built
    assert cache_counts(checkout, OPENMP_COMMANDS, buildgrid.remote, monkeypatch) == {"hits": 4}  # the package too

    shutil.copy(checkout / "k.cpp", checkout / "k.cpp.new")
    os.replace(checkout / "k.cpp.new", checkout / "k.cpp")  # same bytes, new inode (a safe-save, a checkout)
    shutil.rmtree(checkout / "out")
    (checkout / "out").mkdir()
    output, processes = commands(checkout, OPENMP_COMMANDS, env)
    ran = compiles(processes)
    assert ["-fopenmp-is-target-device" in p.argv for p in ran if "-emit-llvm-bc" in p.argv] == [False]
    assert len([p for p in ran if "-fopenmp-is-target-device" in p.argv]) == 1
    assert (checkout / "out" / "k.host.bc").read_bytes() != built["out/k.host.bc"]

    other = openmp_checkout(tmp_path / "other" / "omp")
    output, processes = commands(other, OPENMP_COMMANDS, env)
    assert len([p for p in compiles(processes) if "-fopenmp-is-target-device" in p.argv]) == 1


@pytest.mark.slow
def test_a_wrong_instance_name_gives_one_warning_and_a_local_build(buildgrid, tmp_path, commands):
    reference = gpu_checkout(tmp_path / "reference")
    commands(reference, GPU_COMMANDS, build_env(tmp_path))
    checkout = gpu_checkout(tmp_path / "checkout")
    env = build_env(tmp_path, OFFLOAD_REMOTE=buildgrid.url + "/no-such-instance")
    output, processes = commands(checkout, GPU_COMMANDS[:1], env)
    (warning,) = warnings(output)
    assert "no-such-instance" in warning and warning.startswith("offload-compile: warning: remote "), output
    assert len(compiles(processes)) == 1
    # Every command warns once (each is a process of its own) and builds what a build without a remote builds.
    output, processes = commands(checkout, GPU_COMMANDS, env)
    assert len(warnings(output)) == len(GPU_COMMANDS), output
    assert len(compiles(processes)) == GPU_COMPILES
    assert files_of(checkout) == files_of(reference)


@pytest.mark.slow
def test_without_offload_remote_nothing_changes(tmp_path, commands):
    """No scan, no lookup, no REAPI client imported: the processes and outputs of a build before the remote."""
    checkout = gpu_checkout(tmp_path / "checkout")
    env = build_env(tmp_path)
    env.pop("OFFLOAD_REMOTE", None)
    output, processes = commands(checkout, GPU_COMMANDS, env)
    assert scans(processes) == [] and len(compiles(processes)) == GPU_COMPILES and not warnings(output)
    assert len([p for p in processes if p.program.startswith("python")]) == len(GPU_COMMANDS)
    imported = subprocess.run([*OFFLOAD_COMPILE[:1], "-X", "importtime", *OFFLOAD_COMPILE[1:], *GPU_COMMANDS[-1][3:]],
                              cwd=checkout, env=env, capture_output=True, text=True, check=True).stderr
    assert " offload_builders.toolchain\n" in imported
    assert not [name for name in ("offload_builders.remote.actions", "offload_builders.remote.cache", "grpc")
                if f" {name}\n" in imported]


# --- the key (no server) ----------------------------------------------------------------------------------------

def test_the_key_does_not_depend_on_the_checkout_or_the_scratch_directory(tmp_path):
    from offload_builders.remote.actions import cache_key
    from offload_builders.remote.cli_jobs import SCRATCH_TOKEN, step_job

    keys = []
    for root in (tmp_path / "a", tmp_path / "b" / "c"):
        (root / "src").mkdir(parents=True)
        (root / "src" / "k.hip").write_text("// k\n")
        scratch = tmp_path / f"scratch-{len(keys)}"
        job = step_job(str(root), [["/usr/bin/true", f"-fdebug-compilation-dir={root}", "-o", f"{scratch}/k.o",
                                    str(root / "src" / "k.hip")], ["/usr/bin/true", f"{scratch}/k.o", "-o", "out.o"]],
                       inputs=["/usr/bin/true", str(root / "src" / "k.hip")], outputs=[str(root / "out.o")],
                       scratch=str(scratch), cwd=False)
        assert job is not None and job.inputs.keys() == {"src/k.hip"} and job.outputs == ("out.o",)
        assert SCRATCH_TOKEN in job.steps[0] and str(scratch) not in job.steps[0]
        keys.append(cache_key(job).action_digest)
    assert keys[0] == keys[1]


def test_a_file_named_outside_the_root_by_a_relative_path_is_not_cached(tmp_path):
    from offload_builders.remote.cli_jobs import step_job

    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "shared.h").write_text("")
    (root / "k.hip").write_text("")
    here = os.getcwd()
    os.chdir(root / "sub")
    try:
        assert step_job(str(root), [["true"]], inputs=["../k.hip"], outputs=["k.o"]) is not None
        assert step_job(str(root), [["true"]], inputs=["../../shared.h"], outputs=["k.o"]) is None
        assert step_job(str(root), [["true"]], inputs=["../k.hip"], outputs=["../../k.o"]) is None
        outside = step_job(str(root), [["true"]], inputs=[str(tmp_path / "shared.h")], outputs=["k.o"])
        shared = os.path.realpath(tmp_path / "shared.h")
        assert outside is not None and any(line.startswith(f"file {shared} ") for line in outside.salt_lines)
        assert "cwd sub" in outside.salt_lines
    finally:
        os.chdir(here)


def test_a_compile_naming_its_files_by_absolute_path_keys_the_checkout(tmp_path):
    """``__FILE__`` spells a file as the compile names it: by an absolute path under the checkout (as CMake names
    sources), the object holds the checkout's path, so the key does too, unless -ffile-prefix-map rewrites it."""
    from offload_builders.cli.phase_runs import file_names_hold_root

    root = str(tmp_path / "checkout")
    relative = ["src/k.hip", "include/k.h", "/usr/include/stdio.h"]
    assert not file_names_hold_root(relative, root, ["clang", "-cc1"])
    absolute = [f"{root}/src/k.hip", "include/k.h"]
    assert file_names_hold_root(absolute, root, ["clang", "-cc1"])
    assert not file_names_hold_root(absolute, root, ["clang", "-cc1", f"-fmacro-prefix-map={root}=."])
    assert file_names_hold_root(absolute, root, ["clang", "-cc1", "-fmacro-prefix-map=/elsewhere=."])
