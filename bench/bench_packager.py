"""Benchmark: packaging four 128 MiB images with ``offload-packager`` vs ``cat`` vs clang-offload-packager 19.

Why: the packager is a pure copy plus a few hundred bytes of metadata, so ``cat`` over the same bytes is
the floor. Goals: ours <= 1.5x cat, faster than Clang's (which reads every image into memory and builds
the whole output in memory), peak RSS under 100 MiB.

Usage: ``python bench/bench_packager.py [--size-mib 128] [--repeat 3] [--keep]``

One invocation measures everything: each tool runs ``--repeat`` times, interleaved (after unmeasured
warm-up runs of ``cat`` and ours that fill the page cache and our bytecode cache, and an ``os.sync()``
before every run), and the median wall time and the largest peak RSS (``/usr/bin/time -f %M``) are
reported. Outputs are deleted after each run so
dirty pages do not pile up. The outputs of ours and Clang's are checked to be byte-identical.
"""
from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLANG_PACKAGER = Path(os.environ.get("OFFLOAD_LLVM19_BIN", "/usr/lib/llvm-19/bin")) / "clang-offload-packager"
TRIPLES = [("nvptx64-nvidia-cuda", "sm_80"), ("nvptx64-nvidia-cuda", "sm_90"), ("amdgcn-amd-amdhsa", "gfx90a"),
           ("amdgcn-amd-amdhsa", "gfx942")]


def make_images(directory: Path, size: int) -> list[Path]:
    """Four distinct, incompressible-looking images (a random 1 MiB block, varied per MiB)."""
    block = bytearray(os.urandom(1 << 20))
    paths = []
    for index in range(4):
        path = directory / f"image{index}.o"
        with open(path, "wb") as f:
            for mib in range(size >> 20):
                block[0:8] = (index << 32 | mib).to_bytes(8, "little")
                f.write(block)
        paths.append(path)
    return paths


TIME = Path("/usr/bin/time")


def measure(cmd: list[str], stdout_path: Path | None = None, env: dict[str, str] | None = None) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB) of one child process.

    The peak comes from ``/usr/bin/time -f %M`` when it exists: Linux keeps a process's RSS high-water
    mark across ``exec``, so ``wait4`` on a child forked from this (bigger) Python process would report
    at least our own RSS. Without it, ``wait4``'s ``ru_maxrss`` (an upper bound) is used.
    """
    os.sync()  # settle dirty pages from earlier runs so writeback does not land in this measurement
    out = open(stdout_path, "wb") if stdout_path is not None else subprocess.DEVNULL
    handle, name = tempfile.mkstemp(prefix="bench_packager_time.")
    os.close(handle)
    report = Path(name)
    full = [str(TIME), "-f", "%M", "-o", str(report), *cmd] if TIME.exists() else cmd
    try:
        start = time.perf_counter()
        proc = subprocess.Popen(full, stdout=out, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if stdout_path is not None:
            out.close()  # type: ignore[union-attr]
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed with status {proc.returncode}")
    peak = usage.ru_maxrss
    text = report.read_text().split()
    report.unlink()
    if text:
        peak = int(text[-1])
    return elapsed, peak


def ours_command() -> list[str]:
    script = Path(sys.executable).with_name("offload-packager")
    return [str(script)] if script.exists() else [sys.executable, "-m", "offload_builders.cli.packager"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    if not CLANG_PACKAGER.exists():
        raise SystemExit(f"{CLANG_PACKAGER} is missing")

    work = Path(tempfile.mkdtemp(prefix="bench_packager.", dir="/tmp"))
    try:
        images = make_images(work, args.size_mib << 20)
        specs = [f"--image=file={p},triple={t},arch={a},kind=openmp" for p, (t, a) in zip(images, TRIPLES)]
        out = work / "out.pkg"
        # An installed package has its bytecode compiled; this environment may forbid writing it
        # (PYTHONDONTWRITEBYTECODE), which would charge ~10 ms of compiling to every run. Give our
        # process a private bytecode cache instead, filled by the warm-up run.
        env = dict(os.environ, PYTHONPYCACHEPREFIX=str(work / "pycache"))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        commands = {
            "cat": (["cat", *map(str, images)], out, None),
            "ours": (ours_command() + ["-o", str(out), *specs], None, env),
            "clang19": ([str(CLANG_PACKAGER), "-o", str(out), *specs], None, None),
        }
        for name in ("cat", "ours"):  # warm the page cache and the bytecode cache
            cmd, stdout_path, child_env = commands[name]
            measure(cmd, stdout_path, child_env)
            out.unlink()
        times: dict[str, list[float]] = {name: [] for name in commands}
        peaks: dict[str, int] = {name: 0 for name in commands}
        for _ in range(args.repeat):
            for name, (cmd, stdout_path, child_env) in commands.items():
                elapsed, peak = measure(cmd, stdout_path, child_env)
                times[name].append(elapsed)
                peaks[name] = max(peaks[name], peak)
                kept = work / f"{name}.pkg"
                if name != "cat" and not kept.exists():
                    os.replace(out, kept)  # the first output of each packager, compared below
                out.unlink(missing_ok=True)
        identical = filecmp.cmp(work / "ours.pkg", work / "clang19.pkg", shallow=False)
        (work / "ours.pkg").unlink()
        (work / "clang19.pkg").unlink()

        total = 4 * args.size_mib
        cat = statistics.median(times["cat"])
        print(f"4 x {args.size_mib} MiB images ({total} MiB), median of {args.repeat} runs, /tmp on "
              f"{_filesystem('/tmp')}, {os.cpu_count()} CPUs")
        print(f"{'tool':<10}{'wall s':>9}{'x cat':>8}{'MiB/s':>9}{'peak RSS MiB':>14}")
        for name in commands:
            wall = statistics.median(times[name])
            print(f"{name:<10}{wall:>9.3f}{wall / cat:>8.2f}{total / wall:>9.0f}{peaks[name] / 1024:>14.1f}")
        print(f"ours/cat = {statistics.median(times['ours']) / cat:.2f}, "
              f"clang/cat = {statistics.median(times['clang19']) / cat:.2f}, "
              f"ours byte-identical to clang: {identical}")
        return 0 if identical else 1
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _filesystem(path: str) -> str:
    try:
        result = subprocess.run(["stat", "-f", "-c", "%T", path], capture_output=True, text=True, check=True)
        return result.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
