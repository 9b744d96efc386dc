"""``offload-cache``: the compiler launcher, against the real Clang 19 driver, CMake+Ninja and Make.

The objects and dependency files it writes must be the driver's own, byte for byte, from a run or from the cache;
adding a target must run that target's device compile only, the package and the host object being made in the
launcher's process (the processes are counted with strace); a second build tree of one checkout shares the device
compiles; diagnostics show on hits; what it does not split runs the compiler unchanged.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import LLVM19_BIN, driver_library_flags, which_or_fail
from test_process_counts import read_trace

CLANGXX = str(LLVM19_BIN / "clang++")
LAUNCHER = [sys.executable, "-m", "offload_builders.cli.cache"]
HOST_DEVICE = "-fopenmp-targets=x86_64-unknown-linux-gnu"

KERNEL = """\
#include "kernel.h"
int kernel(int n) {
  int sum = 0;
#pragma omp target map(tofrom: sum)
  for (int i = 0; i < n; ++i) sum += i * SCALE;
  return sum;
}
"""
MAIN = """\
#include <cstdio>
int kernel(int n);
int main() { std::printf("%d\\n", kernel(10)); return 0; }
"""


@pytest.fixture
def tree(tmp_path, monkeypatch) -> Path:
    """A source with a target region and a header, and a private cache for this test."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "kernel.cpp").write_text(KERNEL)
    (src / "kernel.h").write_text("#define SCALE 2\n")
    (src / "main.cpp").write_text(MAIN)
    monkeypatch.setenv("OFFLOAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OFFLOAD_CACHE_LOGFILE", str(tmp_path / "cache.log"))
    monkeypatch.delenv("OFFLOAD_CACHE_DISABLE", raising=False)
    return tmp_path


def run(argv: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, **kwargs)


def compile_both(cwd: Path, flags: list[str], output: str = "kernel.o") -> tuple[bytes, bytes, str, str]:
    """The driver's object and depfile, then the launcher's (from the cache where it hits); stderr of each."""
    driver = run([CLANGXX, *flags], cwd)
    assert driver.returncode == 0, driver.stderr
    expected = ((cwd / output).read_bytes(), (cwd / (output[:-2] + ".d")).read_bytes())
    (cwd / output).unlink()
    (cwd / (output[:-2] + ".d")).unlink()
    ours = run([*LAUNCHER, CLANGXX, *flags], cwd)
    assert ours.returncode == 0, ours.stderr
    assert not list(cwd.glob("*.partial"))
    got = ((cwd / output).read_bytes(), (cwd / (output[:-2] + ".d")).read_bytes())
    assert got == expected, "the launcher's object or depfile differs from the driver's"
    return got[0], got[1], driver.stderr, ours.stderr


def flags_for(archs: str, output: str = "kernel.o") -> list[str]:
    return ["-fopenmp", f"--offload-arch={archs}", "-nogpulib", "-O2", "-MD", "-MF", output[:-2] + ".d", "-c",
            "src/kernel.cpp", "-o", output]


def stats(cwd: Path) -> dict[str, str]:
    shown = run([*LAUNCHER, "--show-stats"], cwd).stdout
    return {line[:20].strip(): line[20:].strip() for line in shown.splitlines()}


def traced(tmp_path: Path, argv: list[str], cwd: Path, name: str) -> list:
    strace = which_or_fail("strace")
    prefix = tmp_path / "traces" / name / "t"
    prefix.parent.mkdir(parents=True)
    done = run([strace, "-ff", "-ttt", "-qq", "-v", "-s", "65536", "-e", "trace=execve", "-e", "status=successful",
                "-e", "signal=none", "-o", str(prefix), *argv], cwd)
    assert done.returncode == 0, done.stderr
    return read_trace(prefix)


def test_objects_and_depfiles_are_the_drivers_from_a_run_and_from_the_cache(tree):
    flags = ["-fopenmp", HOST_DEVICE, "-O2", "-MD", "-MF", "kernel.d", "-c", "src/kernel.cpp", "-o", "kernel.o"]
    compile_both(tree, flags)  # a miss: every job runs
    compile_both(tree, flags)  # a hit: the whole command from the cache
    counts = stats(tree)
    assert (counts["misses"], counts["hits"]) == ("1", "1")
    # and the program links and runs its target region on the host device
    link = run([CLANGXX, "-fopenmp", HOST_DEVICE, "kernel.o", "src/main.cpp", "-o", "prog"], tree)
    assert link.returncode == 0, link.stderr
    env = {**os.environ, "LD_LIBRARY_PATH": str(LLVM19_BIN.parent / "lib"), "OMP_TARGET_OFFLOAD": "MANDATORY"}
    assert run([str(tree / "prog")], tree, env=env).stdout == "90\n"


def test_adding_a_target_runs_only_its_device_compile(tree):
    """The host front end and the old target's compile are hits; the package is written here and the host object
    is the one of the first compile with its package replaced: the back end and the packager do not run, and the
    object is the driver's."""
    compile_both(tree, flags_for("gfx90a"))
    processes = traced(tree, [*LAUNCHER, CLANGXX, *flags_for("gfx90a,gfx1030")], tree, "add")
    cc1 = [p for p in processes if "-cc1" in p.argv]
    device = [p.option("-target-cpu") for p in cc1 if "-fopenmp-is-target-device" in p.argv]
    assert device == ["gfx1030"] and len(cc1) == 1
    assert not [p for p in processes if p.program == "clang-offload-packager"]
    assert "job 3 (clang-offload-packager) made here; job 4 (clang) made here" in (tree / "cache.log").read_text()
    # the object it wrote is the driver's for the two targets
    ours = (tree / "kernel.o").read_bytes()
    assert run([CLANGXX, *flags_for("gfx90a,gfx1030")], tree).returncode == 0
    assert (tree / "kernel.o").read_bytes() == ours


def test_a_stored_host_object_whose_package_is_not_its_own_is_not_rewritten(tree):
    """The object an added target's compile rewrites must hold exactly the package it was stored with: one
    changed in the cache (here: its package's bytes altered in place) makes the back end run, and the object is
    still the driver's."""
    compile_both(tree, flags_for("gfx90a"))
    cache = tree / "cache"
    objects = [path for path in cache.rglob("out") if path.read_bytes().startswith(b"\x7fELF")
               and b".llvm.offloading" in path.read_bytes() and b"\x10\xff\x10\xad" in path.read_bytes()]
    assert len(objects) == 2  # the command's and its embedding job's
    for stored in objects:
        data = bytearray(stored.read_bytes())
        at = data.index(b"\x10\xff\x10\xad")  # the package's magic: alter its header's EntrySize
        data[at + 4 + 4 + 8 + 8] ^= 0xFF
        stored.chmod(0o600)
        stored.write_bytes(bytes(data))
    processes = traced(tree, [*LAUNCHER, CLANGXX, *flags_for("gfx90a,gfx1030")], tree, "add")
    embed = [p for p in processes if "-cc1" in p.argv and any(a.startswith("-fembed-offload-object=") for a in p.argv)]
    assert len(embed) == 1
    ours = (tree / "kernel.o").read_bytes()
    assert run([CLANGXX, *flags_for("gfx90a,gfx1030")], tree).returncode == 0
    assert (tree / "kernel.o").read_bytes() == ours


def test_clang_22_whose_packager_is_llvm_offload_binary(tree, llvm22):
    clangxx = str(llvm22("clang++"))

    def both(archs: str) -> None:
        flags = flags_for(archs)
        assert run([clangxx, *flags], tree).returncode == 0
        expected = ((tree / "kernel.o").read_bytes(), (tree / "kernel.d").read_bytes())
        ours = run([*LAUNCHER, clangxx, *flags], tree)
        assert ours.returncode == 0, ours.stderr
        assert ((tree / "kernel.o").read_bytes(), (tree / "kernel.d").read_bytes()) == expected

    both("gfx90a")
    processes = traced(tree, [*LAUNCHER, clangxx, *flags_for("gfx90a,gfx1030")], tree, "clang22")
    device = [p.option("-target-cpu") for p in processes if "-fopenmp-is-target-device" in p.argv]
    assert device == ["gfx1030"] and "llvm-offload-binary" not in [p.program for p in processes]
    assert not [p for p in processes if any(a.startswith("-fembed-offload-object=") for a in p.argv)]
    both("gfx90a,gfx1030")


def test_an_nvptx_target_added_runs_its_compile_and_ptxas_only(tree):
    """NVPTX device code goes through ptxas (``--output-file``, not ``-o``): followed as the other jobs are."""
    def flags(archs: str) -> list[str]:
        from offload_builders.targets import parse_offload_archs

        return ["-fopenmp", f"--offload-arch={archs}", *driver_library_flags(parse_offload_archs(archs), ["-O2"]),
                "-O2", "-MD", "-MF", "kernel.d", "-c", "src/kernel.cpp", "-o", "kernel.o"]

    compile_both(tree, flags("sm_80"))
    processes = traced(tree, [*LAUNCHER, CLANGXX, *flags("sm_80,sm_90")], tree, "nvptx")
    device = [p.option("-target-cpu") for p in processes if "-fopenmp-is-target-device" in p.argv]
    assembled = [p.option("--gpu-name") for p in processes if p.program == "ptxas"]
    assert device == ["sm_90"] and assembled == ["sm_90"]
    ours = (tree / "kernel.o").read_bytes()
    assert run([CLANGXX, *flags("sm_80,sm_90")], tree).returncode == 0
    assert (tree / "kernel.o").read_bytes() == ours


HIP_SOURCE = """\
#include "hip_min.h"
__global__ void scale(int n, float a, float *y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * y[i];
}
void launch_scale(int n, float a, float *y, hipStream_t stream) { scale<<<(n + 255) / 256, 256, 0, stream>>>(n, a, y); }
"""


def test_hip_sources_with_a_pinned_cuid_are_split_so_a_target_is_added_alone(tree, repo_root):
    """HIP: device compile, lld, clang-offload-bundler, host compile, split where the command pins the CUID."""
    shutil.copy(repo_root / "sample_project" / "hip" / "include" / "hip_min.h", tree / "src")
    (tree / "src" / "scale.hip").write_text(HIP_SOURCE)

    def flags(archs: str, *cuid: str) -> list[str]:
        return ["-x", "hip", f"--offload-arch={archs}", "-nogpulib", "-nogpuinc", "-O2", *cuid, "-MD", "-MF",
                "scale.d", "-c", "src/scale.hip", "-o", "scale.o"]

    compile_both(tree, flags("gfx90a", "-cuid=5eed"), "scale.o")
    compile_both(tree, flags("gfx90a", "-cuid=5eed"), "scale.o")  # from the cache
    assert stats(tree)["hits"] == "1"
    processes = traced(tree, [*LAUNCHER, CLANGXX, *flags("gfx90a,gfx1030", "-cuid=5eed")], tree, "hip-add")
    device = [p.option("-target-cpu") for p in processes if "-fcuda-is-device" in p.argv]
    linked = [p for p in processes if p.program in ("lld", "ld.lld")]
    assert device == ["gfx1030"] and len(linked) == 1
    ours = (tree / "scale.o").read_bytes()
    assert run([CLANGXX, *flags("gfx90a,gfx1030", "-cuid=5eed")], tree).returncode == 0
    assert (tree / "scale.o").read_bytes() == ours
    # The driver's own CUID hashes its whole command line (-### too): without -cuid= the command runs unchanged.
    compile_both(tree, flags("gfx90a"), "scale.o")
    assert stats(tree)["pass-through"] == "1"
    # After a failed HIP job the driver runs no other offloading job (OpenMP's go on): one error, as its.
    source = tree / "src" / "scale.hip"
    source.write_text("#if defined(__gfx1030__) || defined(__gfx90a__)\n#error no\n#endif\n" + source.read_text())
    failed = run([CLANGXX, *flags("gfx90a,gfx1030", "-cuid=5eed")], tree)
    assert failed.returncode != 0 and failed.stderr.count("error: no") == 1
    ours = run([*LAUNCHER, CLANGXX, *flags("gfx90a,gfx1030", "-cuid=5eed")], tree)
    assert (ours.returncode, ours.stderr) == (failed.returncode, failed.stderr)
    # HIP's device link fails: the driver names it "amdgcn-link", not after the lld it runs.
    source.write_text(HIP_SOURCE)
    words = [*flags("gfx90a", "-cuid=5eed"), "-Xoffload-linker", "--no-such-option"]
    failed = run([CLANGXX, *words], tree)
    assert failed.returncode == 1 and "error: amdgcn-link command failed with exit code 1" in failed.stderr
    ours = run([*LAUNCHER, CLANGXX, *words], tree)
    assert (ours.returncode, ours.stderr) == (failed.returncode, failed.stderr)


CUDA_SOURCE = """\
#include "cuda_min.h"
__global__ void cuda_scale(float *x, float a) { x[0] *= a; }
void launch(float *x) { cuda_scale<<<1, 1>>>(x, 2.0f); }
"""


def test_cuda_sources_with_a_pinned_cuid_are_split_and_the_arch_list_reruns_each_device_compile(
        tree, repo_root, llvm22, cuda):
    """CUDA (Clang 22; Clang 19 cannot drive CUDA 13's fatbinary): device compile and ptxas per target, fatbinary
    (``--create``), host compile, split where the command pins the CUID. Clang 22 puts every target in
    ``__CUDA_ARCH_LIST__`` on each device compile, so adding a target compiles the old ones again; their PTX is the
    same, so their ptxas jobs are hits. A second build tree runs nothing."""
    clangxx = str(llvm22("clang++"))
    shutil.copy(repo_root / "sample_project" / "cuda" / "include" / "cuda_min.h", tree / "src")
    (tree / "src" / "scale.cu").write_text(CUDA_SOURCE)

    cuda_path = Path(cuda("ptxas")).parent.parent

    def flags(archs: str, *cuid: str) -> list[str]:
        return [f"--offload-arch={archs}", "-nocudalib", "-nocudainc", f"--cuda-path={cuda_path}", "-O2", *cuid,
                "-MD", "-MF", "scale.d", "-c", "src/scale.cu", "-o", "scale.o"]

    def both(cwd: Path, words: list[str]) -> None:
        driver = run([clangxx, *words], cwd)
        assert driver.returncode == 0, driver.stderr
        expected = ((cwd / "scale.o").read_bytes(), (cwd / "scale.d").read_bytes())
        ours = run([*LAUNCHER, clangxx, *words], cwd)
        assert ours.returncode == 0 and ours.stderr == driver.stderr, ours.stderr
        assert ((cwd / "scale.o").read_bytes(), (cwd / "scale.d").read_bytes()) == expected

    both(tree, flags("sm_80", "-cuid=5eed"))
    processes = traced(tree, [*LAUNCHER, clangxx, *flags("sm_80,sm_90", "-cuid=5eed")], tree, "cuda-add")
    device = [p.option("-target-cpu") for p in processes if "-fcuda-is-device" in p.argv]
    assembled = [p.option("--gpu-name") for p in processes if p.program == "ptxas"]
    assert sorted(device) == ["sm_80", "sm_90"] and assembled == ["sm_90"]
    assert len([p for p in processes if p.program == "fatbinary"]) == 1
    ours = (tree / "scale.o").read_bytes()
    assert run([clangxx, *flags("sm_80,sm_90", "-cuid=5eed")], tree).returncode == 0
    assert (tree / "scale.o").read_bytes() == ours
    # A second build tree of the checkout: every job a hit, no compiler started.
    second = tree / "second"
    second.mkdir()
    (second / "src").symlink_to(tree / "src")
    processes = traced(tree, [*LAUNCHER, clangxx, *flags("sm_80,sm_90", "-cuid=5eed")], second, "cuda-second")
    assert not [p for p in processes if p.program in ("clang", "clang-22", "ptxas", "fatbinary")]
    assert (second / "scale.o").read_bytes() == ours
    # Without -cuid= the driver's CUID hashes its whole command line: the command runs unchanged.
    before = stats(tree)["pass-through"]
    both(tree, flags("sm_80"))
    assert int(stats(tree)["pass-through"]) == int(before) + 1
    # After a failed CUDA job the driver runs no other offloading job: one error, as its.
    source = tree / "src" / "scale.cu"
    source.write_text("#ifdef __CUDA_ARCH__\n#error no\n#endif\n" + CUDA_SOURCE)
    failed = run([clangxx, *flags("sm_80,sm_90", "-cuid=5eed")], tree)
    assert failed.returncode != 0 and failed.stderr.count("error: no") == 1
    ours_failed = run([*LAUNCHER, clangxx, *flags("sm_80,sm_90", "-cuid=5eed")], tree)
    assert (ours_failed.returncode, ours_failed.stderr) == (failed.returncode, failed.stderr)
    # A tool that fails (not a front end): the driver names it by its tool's name and the exit status.
    source.write_text(CUDA_SOURCE)
    failing = tree / "ptxas-that-fails"
    failing.write_text("#!/bin/sh\necho boom >&2\nexit 3\n")
    failing.chmod(0o755)
    words = [*flags("sm_80", "-cuid=5eed"), f"--ptxas-path={failing}"]
    failed = run([clangxx, *words], tree)
    assert failed.returncode == 3 and "error: ptxas command failed with exit code 3" in failed.stderr
    ours_failed = run([*LAUNCHER, clangxx, *words], tree)
    assert (ours_failed.returncode, ours_failed.stderr) == (failed.returncode, failed.stderr)


@pytest.mark.parametrize("clang", ["19", "22"])
def test_a_target_of_a_new_triple_reuses_the_old_device_compiles(tree, clang, llvm22):
    """Adding a target of a new triple: the host front end's words change (its triples, and the new triple's
    include directories), its bitcode does not, so the old targets' device compiles are hits; the object is the
    driver's."""
    clangxx = CLANGXX if clang == "19" else str(llvm22("clang++"))

    def flags(triples: str) -> list[str]:
        return ["-fopenmp", f"-fopenmp-targets={triples}", "-Xopenmp-target=amdgcn-amd-amdhsa", "-march=gfx90a",
                "-nogpulib", "-O2", "-c", "src/kernel.cpp", "-o", "kernel.o"]

    first = run([*LAUNCHER, clangxx, *flags("amdgcn-amd-amdhsa")], tree)
    assert first.returncode == 0, first.stderr
    added = flags("amdgcn-amd-amdhsa,x86_64-unknown-linux-gnu")
    processes = traced(tree, [*LAUNCHER, clangxx, *added], tree, f"new-triple-{clang}")
    cc1 = [p for p in processes if "-cc1" in p.argv]
    # The host front end runs again (the new triple adds its include directories), writes the same bitcode, so
    # the AMDGPU device compile, which reads it, is a hit.
    assert [p.option("-triple") for p in cc1 if "-fopenmp-is-target-device" in p.argv] == ["x86_64-unknown-linux-gnu"]
    ours = (tree / "kernel.o").read_bytes()
    assert run([clangxx, *added], tree).returncode == 0
    assert (tree / "kernel.o").read_bytes() == ours


def test_a_changed_device_library_is_a_miss(tree):
    """The GPU device libraries reach a device compile by -mlink-builtin-bitcode, which no dependency file lists:
    their content is part of its key, so an updated library (same path, other bytes) gives the driver's new
    object, not the old one from the cache."""
    libraries = tree / "bitcode"
    shutil.copytree("/usr/lib/x86_64-linux-gnu/amdgcn/bitcode", libraries)
    flags = ["-fopenmp", "--offload-arch=gfx90a", f"--rocm-device-lib-path={libraries}", "-O2", "-MD", "-MF",
             "kernel.d", "-c", "src/kernel.cpp", "-o", "kernel.o"]
    compile_both(tree, flags)
    # A package update: the daz-off library's path now holds the daz-on library's bytes.
    shutil.copyfile(libraries / "oclc_daz_opt_on.bc", libraries / "oclc_daz_opt_off.bc")
    processes = traced(tree, [*LAUNCHER, CLANGXX, *flags], tree, "library")
    assert [p.option("-target-cpu") for p in processes if "-fopenmp-is-target-device" in p.argv] == ["gfx90a"]
    assert stats(tree)["hits"] == "0"
    compile_both(tree, flags)  # and the object is the driver's


def test_an_updated_tool_is_a_miss(tree):
    """The programs a command's jobs run besides the compiler (ptxas here, from the CUDA tools directory the flags
    name) are in its key by their identity: an update compiles again, from the whole command down to that job."""
    from offload_builders.targets import parse_offload_archs

    flags = [*driver_library_flags(parse_offload_archs("sm_80"), ["-O2"])]
    cuda = next(flag.split("=", 1)[1] for flag in flags if flag.startswith("--cuda-path="))
    tools = tree / "cuda"
    shutil.copytree(cuda, tools, symlinks=True)
    ptxas = tools / "bin" / "ptxas"
    real = ptxas.resolve()
    ptxas.unlink()
    shutil.copy2(real, ptxas)
    flags = ["-fopenmp", "--offload-arch=sm_80", *(f"--cuda-path={tools}" if flag.startswith("--cuda-path=") else flag
                                                   for flag in flags),
             "-O2", "-MD", "-MF", "kernel.d", "-c", "src/kernel.cpp", "-o", "kernel.o"]
    compile_both(tree, flags)
    compile_both(tree, flags)
    assert stats(tree)["hits"] == "1"
    mtime = ptxas.stat().st_mtime_ns
    os.utime(ptxas, ns=(mtime + 10**9, mtime + 10**9))  # the tool updated in place
    processes = traced(tree, [*LAUNCHER, CLANGXX, *flags], tree, "tool")
    assert [p.program for p in processes].count("ptxas") == 1
    assert stats(tree)["hits"] == "1"


def test_a_second_build_tree_of_the_same_checkout_runs_no_device_compile(tree):
    source = str(tree / "src" / "kernel.cpp")  # CMake names sources by absolute path, objects relatively
    flags = ["-fopenmp", "--offload-arch=gfx90a", "-nogpulib", "-O2", "-MD", "-MT", "obj/kernel.o", "-MF",
             "obj/kernel.d", "-c", source, "-o", "obj/kernel.o"]
    for build in ("build1", "build2"):
        (tree / build / "obj").mkdir(parents=True)
    first = run([*LAUNCHER, CLANGXX, *flags], tree / "build1")
    assert first.returncode == 0, first.stderr
    processes = traced(tree, [*LAUNCHER, CLANGXX, *flags], tree / "build2", "second")
    assert not [p for p in processes if "-cc1" in p.argv or p.program == "clang-offload-packager"]
    assert (tree / "build2/obj/kernel.o").read_bytes() == (tree / "build1/obj/kernel.o").read_bytes()
    assert run([CLANGXX, *flags], tree / "build2").returncode == 0  # the driver's, in that tree
    assert (tree / "build2/obj/kernel.o").read_bytes() == (tree / "build1/obj/kernel.o").read_bytes()


def test_warnings_show_on_hits_as_the_driver_prints_them(tree):
    kernel = tree / "src" / "kernel.cpp"
    kernel.write_text("#warning from the kernel\n" + kernel.read_text())
    flags = ["-fopenmp", HOST_DEVICE, "-L/nowhere", "-O2", "-MD", "-MF", "kernel.d", "-c", "src/kernel.cpp", "-o",
             "kernel.o"]
    _, _, driver, miss = compile_both(tree, flags)
    _, _, _, hit = compile_both(tree, flags)
    assert driver.count("warning: from the kernel") == 2  # the host front end and the device compile each say it
    assert "argument unused during compilation: '-L/nowhere'" in driver  # the driver's own, from -### too
    assert miss == driver and hit == driver
    (tree / "src" / "kernel.h").write_text("#define SCALE 5\n")  # every job again, the jobs from the -### cache
    _, _, driver, again = compile_both(tree, flags)
    assert again == driver


def in_a_terminal(argv: list[str], cwd: Path) -> bytes:
    """What ``argv`` writes to standard error when that is a terminal (a pseudo-terminal here)."""
    import pty

    leader, follower = pty.openpty()
    try:
        done = subprocess.run(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=follower)
        assert done.returncode == 0
        os.close(follower)
        follower = -1
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal has no writer left
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)


def test_diagnostics_are_coloured_in_a_terminal_as_the_drivers(tree):
    """The driver colours diagnostics where its standard error is a terminal; the launcher keeps them coloured and
    shows them so there, from a run and from the cache, and plain elsewhere (the other tests)."""
    kernel = tree / "src" / "kernel.cpp"
    kernel.write_text("#warning from the kernel\n" + kernel.read_text())
    flags = ["-fopenmp", HOST_DEVICE, "-O2", "-c", "src/kernel.cpp", "-o", "kernel.o"]
    driver = in_a_terminal([CLANGXX, *flags], tree)
    assert b"\x1b[" in driver and b"from the kernel" in driver
    assert in_a_terminal([*LAUNCHER, CLANGXX, *flags], tree) == driver  # a run
    assert in_a_terminal([*LAUNCHER, CLANGXX, *flags], tree) == driver  # the cache
    assert stats(tree)["hits"] == "1"


def test_device_jobs_in_parallel_print_and_fail_as_the_driver_does(tree, monkeypatch):
    """``OFFLOAD_CACHE_JOBS=3``: the device compiles run at once; diagnostics still come in the driver's order."""
    monkeypatch.setenv("OFFLOAD_CACHE_JOBS", "3")
    kernel = tree / "src" / "kernel.cpp"
    kernel.write_text("#warning from the kernel\n" + kernel.read_text())
    _, _, driver, ours = compile_both(tree, flags_for("gfx90a,gfx1030,gfx942"))
    assert driver.count("warning: from the kernel") == 4 and ours == driver
    kernel.write_text("#ifdef __AMDGPU__\n#error the device side\n#endif\n" + kernel.read_text())
    failed = run([CLANGXX, *flags_for("gfx90a,gfx1030,gfx942")], tree)
    assert failed.returncode != 0 and failed.stderr.count("error: the device side") == 3  # it goes on after one
    for jobs in ("3", "1"):
        monkeypatch.setenv("OFFLOAD_CACHE_JOBS", jobs)
        ours = run([*LAUNCHER, CLANGXX, *flags_for("gfx90a,gfx1030,gfx942")], tree)
        assert (ours.returncode, ours.stderr) == (failed.returncode, failed.stderr)


def device_compiles_at_once(tree: Path, argv: list[str], name: str) -> int:
    """The most device compiles that ran at the same time under ``argv``, read from an exec and exit trace."""
    strace = which_or_fail("strace")
    prefix = tree / "traces" / name / "t"
    prefix.parent.mkdir(parents=True)
    done = run([strace, "-ff", "-ttt", "-q", "-v", "-s", "65536", "-e", "trace=execve", "-e", "status=successful",
                "-e", "signal=none", "-o", str(prefix), *argv], tree)
    assert done.returncode == 0, done.stdout + done.stderr
    spans = []
    for log in prefix.parent.glob("t.*"):
        lines = log.read_text(errors="replace").splitlines()
        started = [line for line in lines if " execve(" in line]
        ended = [line for line in lines if "+++ exited" in line]
        if started and ended and "-fopenmp-is-target-device" in started[0]:
            spans.append((float(started[0].split()[0]), float(ended[-1].split()[0])))
    assert len(spans) == 3, spans
    return max(sum(1 for start, end in spans if start <= moment < end) for moment, _ in spans)


def test_device_jobs_run_at_once_only_on_the_builds_jobserver_slots(tree, monkeypatch):
    """Under make's jobserver (a ``+`` recipe: make 4.3 gives it the jobserver's pipe) a compile's device jobs run
    at once on the build's slots, never more than ``-j`` allows; where make closed the pipe (a plain recipe, as
    CMake's Makefiles run compiles) they run one after another, as the driver runs them."""
    monkeypatch.delenv("OFFLOAD_CACHE_JOBS", raising=False)
    monkeypatch.setenv("OFFLOAD_CACHE_RECACHE", "1")  # every job runs: what is counted is how they run
    make = which_or_fail("make")
    compile_words = " ".join([*LAUNCHER, CLANGXX, *flags_for("gfx90a,gfx1030,gfx942")])
    (tree / "Makefile").write_text(f"slots:\n\t+{compile_words}\nplain:\n\t{compile_words}\n")
    assert device_compiles_at_once(tree, [make, "-j2", "slots"], "slots") == 2  # this slot and one token
    assert device_compiles_at_once(tree, [make, "-j2", "plain"], "plain") == 1
    assert device_compiles_at_once(tree, [make, "-j4", "plain"], "plain-j4") == 1


def test_a_recreated_source_is_compiled_again_as_the_driver_would(tree):
    """Target regions are named after the source's inode: the same bytes in a new file are another object."""
    flags = ["-fopenmp", HOST_DEVICE, "-O2", "-MD", "-MF", "kernel.d", "-c", "src/kernel.cpp", "-o", "kernel.o"]
    before, _, _, _ = compile_both(tree, flags)
    kernel = tree / "src" / "kernel.cpp"
    saved = tree / "src" / "kernel.cpp.new"
    saved.write_bytes(kernel.read_bytes())
    saved.replace(kernel)  # an editor's safe-save: same bytes, another inode
    after, _, _, _ = compile_both(tree, flags)
    assert after != before
    assert stats(tree)["hits"] == "0"


def test_a_changed_header_is_a_miss_and_a_failed_compile_stores_nothing(tree):
    flags = ["-fopenmp", HOST_DEVICE, "-O2", "-MD", "-MF", "kernel.d", "-c", "src/kernel.cpp", "-o", "kernel.o"]
    compile_both(tree, flags)
    (tree / "src" / "kernel.h").write_text("#define SCALE 3\n")
    compile_both(tree, flags)
    assert stats(tree)["hits"] == "0"
    (tree / "src" / "kernel.h").write_text("#define SCALE (\n")
    driver = run([CLANGXX, *flags], tree)
    ours = run([*LAUNCHER, CLANGXX, *flags], tree)
    assert driver.returncode != 0 and ours.returncode == driver.returncode
    assert ours.stderr == driver.stderr
    again = run([*LAUNCHER, CLANGXX, *flags], tree)
    assert again.returncode == driver.returncode and again.stderr == driver.stderr


@pytest.mark.parametrize("children", [1, 3, 5], ids=["at -###", "at a device compile", "at the embedding"])
def test_a_killed_launcher_leaves_nothing_a_later_build_trusts(tree, children):
    """Killed (with its jobs) while its n-th child runs: the object is the earlier one or none, never a new one
    half written, and the next compile gives the driver's object."""
    flags = flags_for("gfx90a,gfx1030")
    (tree / "kernel.o").write_bytes(b"the object of an earlier build")
    launcher = subprocess.Popen([*LAUNCHER, CLANGXX, *flags], cwd=tree, start_new_session=True,
                                stderr=subprocess.DEVNULL)
    listed = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children")
    seen: set[str] = set()
    deadline = time.monotonic() + 120
    while len(seen) < children and launcher.poll() is None and time.monotonic() < deadline:
        try:
            seen.update(listed.read_text().split())
        except OSError:
            break
        time.sleep(0.002)
    assert launcher.poll() is None, "the launcher ended before it was killed"
    os.killpg(launcher.pid, signal.SIGKILL)
    launcher.wait()
    assert (tree / "kernel.o").read_bytes() == b"the object of an earlier build"
    (tree / "kernel.o").unlink()
    compile_both(tree, flags_for("gfx90a,gfx1030"))  # and what the cache kept of the killed run is right


@pytest.mark.parametrize("args", [
    pytest.param(["-O2", "-c", "src/main.cpp", "-o", "main.o"], id="no-offloading"),
    pytest.param(["-fopenmp", HOST_DEVICE, "src/kernel.cpp", "src/main.cpp", "-o", "prog"], id="compile-and-link"),
    pytest.param(["-fopenmp", HOST_DEVICE, "-E", "src/kernel.cpp", "-o", "kernel.i"], id="preprocess"),
    pytest.param(["-fopenmp", HOST_DEVICE, "-c", "src/kernel.cpp", "src/main.cpp"], id="two-sources"),
    pytest.param(["--version"], id="version"),
    pytest.param(["-fopenmp", HOST_DEVICE, "-fsave-optimization-record", "-c", "src/kernel.cpp", "-o", "kernel.o"],
                 id="optimization-records"),
    pytest.param(["-fopenmp", HOST_DEVICE, "-save-stats=obj", "-c", "src/kernel.cpp", "-o", "kernel.o"],
                 id="statistics"),
    pytest.param(["-fopenmp", HOST_DEVICE, "-g", "-gsplit-dwarf", "-c", "src/kernel.cpp", "-o", "kernel.o"],
                 id="split-dwarf"),
    pytest.param(["-fopenmp", HOST_DEVICE, "-MJ", "kernel.json", "-c", "src/kernel.cpp", "-o", "kernel.o"],
                 id="compilation-database-entry"),
    pytest.param(["-fopenmp", HOST_DEVICE, "--serialize-diagnostics", "kernel.dia", "-c", "src/kernel.cpp", "-o",
                  "kernel.o"], id="serialized-diagnostics"),
])
def test_what_it_does_not_split_runs_the_compiler_unchanged(tree, args):
    def outputs() -> dict[Path, bytes | None]:  # objects, preprocessed text, and the files written beside them
        # (-MJ's entry names the driver's temporary files, different in every run: only that it is written counts)
        return {path: None if path.suffix == ".json" else path.read_bytes() for path in tree.iterdir()
                if path.suffix in (".o", ".i", ".yaml", ".stats", ".dwo", ".json", ".dia")}

    driver = run([CLANGXX, *args], tree)
    produced = outputs()
    for path in produced:
        path.unlink()
    ours = run([*LAUNCHER, CLANGXX, *args], tree)
    assert (ours.returncode, ours.stdout, ours.stderr) == (driver.returncode, driver.stdout, driver.stderr)
    assert outputs() == produced
    assert stats(tree)["pass-through"] == "1"


def test_chained_with_ccache_in_either_order_the_objects_are_the_drivers(tree, monkeypatch):
    ccache = which_or_fail("ccache")
    monkeypatch.setenv("CCACHE_DIR", str(tree / "ccache"))
    flags = ["-fopenmp", HOST_DEVICE, "-O2", "-MD", "-MF", "kernel.d", "-c", "src/kernel.cpp", "-o", "kernel.o"]
    assert run([CLANGXX, *flags], tree).returncode == 0
    expected = (tree / "kernel.o").read_bytes()
    shim = tree / "bin" / "offload-cache"  # ccache runs the launcher as its compiler: a program on disk
    shim.parent.mkdir()
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m offload_builders.cli.cache \"$@\"\n")
    shim.chmod(0o755)
    for chained in ([*LAUNCHER, ccache, CLANGXX], [ccache, str(shim), CLANGXX]):
        for _ in range(2):  # a miss, then a hit of the outer cache
            (tree / "kernel.o").unlink()
            done = run([*chained, *flags], tree)
            assert done.returncode == 0, done.stderr
            assert (tree / "kernel.o").read_bytes() == expected


def test_a_cache_that_cannot_be_written_means_compiling_without_it(tree, monkeypatch):
    readonly = tree / "readonly"
    readonly.mkdir()
    monkeypatch.setenv("OFFLOAD_CACHE_DIR", str(readonly / "cache"))
    flags = ["-fopenmp", HOST_DEVICE, "-O2", "-MD", "-MF", "kernel.d", "-c", "src/kernel.cpp", "-o", "kernel.o"]
    readonly.chmod(0o500)
    try:
        if os.access(readonly, os.W_OK):  # root writes anyway: make the cache a file, which no one can enter
            readonly.chmod(0o700)
            (readonly / "cache").write_text("not a directory")
        compile_both(tree, flags)
    finally:
        readonly.chmod(0o700)


def test_the_statistics_and_the_size_limit_are_managed_as_ccaches(tree):
    flags = ["-fopenmp", HOST_DEVICE, "-O2", "-MD", "-MF", "kernel.d", "-c", "src/kernel.cpp", "-o", "kernel.o"]
    compile_both(tree, flags)
    assert run([*LAUNCHER, "-M", "100M"], tree).returncode == 0
    assert "100.0 MiB" in stats(tree)["cache size"]
    assert run([*LAUNCHER, "--zero-stats"], tree).returncode == 0
    assert stats(tree)["misses"] == "0"
    assert run([*LAUNCHER, "--clear"], tree).returncode == 0
    compile_both(tree, flags)
    assert stats(tree)["hits"] == "0"  # cleared: compiled again
    wrong = run([*LAUNCHER, "--max-size", "lots"], tree)
    assert wrong.returncode == 1 and wrong.stderr.count("\n") == 1 and "error:" in wrong.stderr


CMAKE_PROJECT = """\
cmake_minimum_required(VERSION 3.20)
project(plain CXX)
find_package(OpenMP REQUIRED)
add_library(prog OBJECT src/kernel.cpp src/main.cpp)
target_compile_options(prog PRIVATE -fopenmp --offload-arch=${ARCHS} -nogpulib)
"""


def launcher_script(directory: Path) -> Path:
    """``offload-cache`` in ``directory``, running this checkout's launcher: what a build is given."""
    directory.mkdir()
    launcher = directory / "offload-cache"
    launcher.write_text(f"#!/bin/sh\nexec {sys.executable} -m offload_builders.cli.cache \"$@\"\n")
    launcher.chmod(0o755)
    return launcher


def test_an_unchanged_cmake_project_through_the_launcher(tree):
    """A CMake+Ninja project that never names offload-builders: the launcher set as CMake's compiler launcher;
    objects equal to the same project's without it; adding a target runs only that target's device compile."""
    cmake, ninja = which_or_fail("cmake"), which_or_fail("ninja")
    (tree / "CMakeLists.txt").write_text(CMAKE_PROJECT)
    launcher = launcher_script(tree / "bin")

    def configure(build: str, archs: str, *extra: str) -> None:
        done = run([cmake, "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}", f"-DCMAKE_CXX_COMPILER={CLANGXX}",
                    f"-DARCHS={archs}", *extra, "-S", str(tree), "-B", str(tree / build)], tree)
        assert done.returncode == 0, done.stdout + done.stderr

    def objects(build: str) -> dict[str, bytes]:
        return {path.name: path.read_bytes() for path in (tree / build).rglob("*.o")}

    configure("plain", "gfx90a")
    configure("cached", "gfx90a", f"-DCMAKE_CXX_COMPILER_LAUNCHER={launcher}")
    for build in ("plain", "cached"):
        done = run([cmake, "--build", str(tree / build)], tree)
        assert done.returncode == 0, done.stdout
    assert objects("cached") == objects("plain") and objects("plain")
    configure("plain", "gfx90a,gfx1030")
    configure("cached", "gfx90a,gfx1030")
    assert run([cmake, "--build", str(tree / "plain")], tree).returncode == 0
    processes = traced(tree, [cmake, "--build", str(tree / "cached")], tree, "cmake-add")
    device = [p.option("-target-cpu") for p in processes if "-fopenmp-is-target-device" in p.argv]
    front_ends = [p for p in processes if "-cc1" in p.argv and "-emit-llvm-bc" in p.argv
                  and "-fopenmp-is-target-device" not in p.argv]
    assert device == ["gfx1030", "gfx1030"] and not front_ends  # each source's new target alone
    assert objects("cached") == objects("plain")


CMAKE_PROGRAM = """\
cmake_minimum_required(VERSION 3.21)
project(linked CXX)
add_executable(prog src/kernel.cpp src/main.cpp)
set(offload -fopenmp --offload-arch=${ARCHS} ${DEVICE_LIBRARIES})
target_compile_options(prog PRIVATE ${offload})
target_link_options(prog PRIVATE ${offload})
"""


def test_links_through_cmakes_linker_launcher_link_only_the_added_targets_image(tree):
    """``CMAKE_CXX_LINKER_LAUNCHER``: the link runs with ``offload-link`` in the driver's linker wrapper's place,
    which keeps each target's image, so adding a target links that image alone; the program holds every target's
    image and runs. A link without offloading, or one ``offload-link`` would refuse, runs unchanged."""
    from offload_builders.targets import parse_offload_archs

    cmake, ninja = which_or_fail("cmake"), which_or_fail("ninja")
    (tree / "CMakeLists.txt").write_text(CMAKE_PROGRAM)
    launcher = launcher_script(tree / "bin")
    libraries = ";".join(driver_library_flags(parse_offload_archs("gfx90a,gfx1030"), ["-O2"]))

    def configure(archs: str) -> None:
        done = run([cmake, "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}", f"-DCMAKE_CXX_COMPILER={CLANGXX}",
                    f"-DARCHS={archs}", f"-DDEVICE_LIBRARIES={libraries}", f"-DCMAKE_CXX_COMPILER_LAUNCHER={launcher}",
                    f"-DCMAKE_CXX_LINKER_LAUNCHER={launcher}", "-S", str(tree), "-B", str(tree / "build")], tree)
        assert done.returncode == 0, done.stdout + done.stderr

    def images(*devices: str) -> bool:
        return run([sys.executable, "-m", "offload_builders.cli.select", *(f"--device={d}" for d in devices),
                    str(tree / "build" / "prog")], tree).returncode == 0

    configure("gfx90a")
    processes = traced(tree, [cmake, "--build", str(tree / "build")], tree, "link-first")
    assert [p for p in processes if p.program == "clang-linker-wrapper"]  # the shim, not the driver's
    assert not [p for p in processes if p.argv[0].startswith(str(LLVM19_BIN / "clang-linker-wrapper"))]
    assert images("gfx90a") and not images("gfx1030")
    # The images offload-link keeps are in this cache (its size limit counts them), not in the per-user cache.
    slots = [path for path in (tree / "cache" / "kept-images").iterdir() if path.is_dir()]
    assert len(slots) == 1 and any(slots[0].iterdir())
    configure("gfx90a,gfx1030")
    processes = traced(tree, [cmake, "--build", str(tree / "build")], tree, "link-add")
    linked = [a.removeprefix("-plugin-opt=mcpu=") for p in processes if p.kind == "device link: ld.lld"
              for a in p.argv if a.startswith("-plugin-opt=mcpu=")]
    assert linked == ["gfx1030"]  # gfx90a's image is the one kept from the last link
    assert images("gfx90a") and images("gfx1030")
    ran = run([str(tree / "build" / "prog")], tree, env={**os.environ, "OMP_TARGET_OFFLOAD": "DISABLED",
                                                         "LD_LIBRARY_PATH": str(LLVM19_BIN.parent / "lib")})
    assert (ran.returncode, ran.stdout) == (0, "90\n"), ran.stderr
    log = (tree / "cache.log").read_text()
    assert log.count("link through offload-link") == 2
    # Evicted least recently used with the entries, once old enough.
    from offload_builders.launcher.store import CacheStore

    store = CacheStore(str(tree / "cache"))
    old = time.time() - 5000
    os.utime(slots[0], (old, old))
    store.set_max_size(1)
    assert store.evict() > 0 and not slots[0].exists()
    # A link the driver runs no wrapper for, and one with a wrapper option offload-link refuses: unchanged.
    assert run([*LAUNCHER, CLANGXX, "-fopenmp", "build/CMakeFiles/prog.dir/src/main.cpp.o",
                "build/CMakeFiles/prog.dir/src/kernel.cpp.o", "-o", "host-only"], tree).returncode != 0
    assert "link runs unchanged: the driver runs no linker wrapper" in (tree / "cache.log").read_text()
    objects = ["build/CMakeFiles/prog.dir/src/kernel.cpp.o", "build/CMakeFiles/prog.dir/src/main.cpp.o"]
    refused = [CLANGXX, "-fopenmp", "--offload-arch=gfx90a", *libraries.split(";"), "-mllvm",
               "-inline-threshold=100", *objects]  # the driver hands -mllvm to its wrapper, which offload-link refuses
    driver = run([*refused, "-o", "driver-prog"], tree)
    ours = run([*LAUNCHER, *refused, "-o", "our-prog"], tree)
    assert driver.returncode == 0 and (ours.returncode, ours.stderr) == (driver.returncode, driver.stderr)
    assert (tree / "our-prog").read_bytes() == (tree / "driver-prog").read_bytes()
    assert "link runs unchanged: -mllvm is a clang-linker-wrapper option" in (tree / "cache.log").read_text()


def test_an_unchanged_makefile_through_the_launcher(tree):
    make = which_or_fail("make")
    (tree / "Makefile").write_text(
        "CXXFLAGS = -O2 -fopenmp --offload-arch=$(ARCHS) -nogpulib -MMD\n"
        "kernel.o: src/kernel.cpp\n\t$(CXX) $(CXXFLAGS) -c $< -o $@\n")
    launched = f"{' '.join(LAUNCHER)} {CLANGXX}"
    done = run([make, f"CXX={CLANGXX}", "ARCHS=gfx90a"], tree)
    assert done.returncode == 0, done.stderr
    expected = {name: (tree / name).read_bytes() for name in ("kernel.o", "kernel.d")}
    for name in expected:
        (tree / name).unlink()
    done = run([make, f"CXX={launched}", "ARCHS=gfx90a"], tree)
    assert done.returncode == 0, done.stderr
    assert {name: (tree / name).read_bytes() for name in expected} == expected  # -MMD: the depfile too
    (tree / "kernel.o").unlink()
    processes = traced(tree, [make, f"CXX={launched}", "ARCHS=gfx90a"], tree, "make-again")
    assert not [p for p in processes if "-cc1" in p.argv]
    assert (tree / "kernel.o").read_bytes() == expected["kernel.o"]
    shutil.rmtree(tree / "cache")


MESON_PROJECT = """\
project('plain', 'cpp')
archs = get_option('archs')
static_library('kernels', 'src/kernel.cpp', 'src/main.cpp',
               cpp_args: ['-fopenmp', '--offload-arch=' + archs, '-nogpulib'])
"""


def test_an_unchanged_meson_project_through_the_launcher(tree):
    """Meson takes the launcher in its native file's compiler entry; adding a target recompiles each source's new
    target alone, and the objects equal those of the same project built without it (a release build: with -g an
    object records its build directory, which differs between the two)."""
    bin_dir = Path(sys.executable).parent
    meson, ninja = str(bin_dir / "meson"), str(bin_dir / "ninja")
    (tree / "meson.build").write_text(MESON_PROJECT)
    (tree / "meson_options.txt").write_text("option('archs', type: 'string', value: 'gfx90a')\n")
    launcher = launcher_script(tree / "bin")
    (tree / "plain.ini").write_text(f"[binaries]\ncpp = ['{CLANGXX}']\nar = 'ar'\n")
    (tree / "cached.ini").write_text(f"[binaries]\ncpp = ['{launcher}', '{CLANGXX}']\nar = 'ar'\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def objects(build: str) -> dict[str, bytes]:
        return {path.name: path.read_bytes() for path in (tree / build).rglob("*.o")}

    for build in ("plain", "cached"):
        done = run([meson, "setup", build, "--native-file", f"{build}.ini", "--buildtype=release"], tree, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert run([ninja, "-C", build], tree, env=env).returncode == 0
    assert objects("cached") == objects("plain") and objects("plain")
    for build in ("plain", "cached"):
        done = run([meson, "configure", build, "-Darchs=gfx90a,gfx1030"], tree, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
    assert run([ninja, "-C", "plain"], tree, env=env).returncode == 0
    processes = traced(tree, [ninja, "-C", "cached"], tree, "meson-add")
    device = [p.option("-target-cpu") for p in processes if "-fopenmp-is-target-device" in p.argv]
    assert device == ["gfx1030", "gfx1030"]
    assert objects("cached") == objects("plain")
