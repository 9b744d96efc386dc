"""Benchmark: ``offload-bundler`` against ``cat`` and clang-offload-bundler 19 on four 128 MiB images.

One run prints, for bundling the four images (a HIP fat binary: ``-type=o``, host ``/dev/null``,
``-bundle-align=4096``) and for unbundling one of them:

* the median wall time of each tool over ``--runs`` runs, and its ratio to ``cat`` over the same
  bytes (``cat img0 img1 img2 img3 > out`` for bundling, ``cat img2 > out`` for unbundling);
* the peak resident memory of each tool, from GNU time's ``%M`` (a parent's ``ru_maxrss`` would
  also count the pages of the forked benchmark process before ``exec``);
* for reference, ``python -c pass`` with the same interpreter and environment: the start-up floor of
  any Python tool (in a development install, about 12 ms of it is the editable-install finder that
  ``site`` loads), which decides the ratio for small inputs.

Goals: ours <= 1.5x cat and faster than Clang, peak memory < 100 MiB.  Ours runs as a CLI
subprocess (``python -m offload_builders.cli.bundler``) with Python's bytecode cache enabled in a
private directory (this environment sets ``PYTHONDONTWRITEBYTECODE``, which would add the
compilation of every module to each run), warmed up once before timing.

Usage: ``.venv/bin/python bench/bench_bundler.py [--size-mib 128] [--runs 5] [--keep]``
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

LLVM19_BIN = Path(os.environ.get("OFFLOAD_LLVM19_BIN", "/usr/lib/llvm-19/bin"))
GNU_TIME = "/usr/bin/time"
HOST = "host-x86_64-unknown-linux"
DEVICES = ("hipv4-amdgcn-amd-amdhsa--gfx908", "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+",
           "hipv4-amdgcn-amd-amdhsa--gfx942", "hipv4-amdgcn-amd-amdhsa--gfx1030")
PICK = 2  # the image unbundling extracts


@dataclass(frozen=True)
class Command:
    """One measured command: argv, and the file its output goes to (stdout for cat)."""

    tool: str
    argv: tuple[str, ...]
    output: Path
    stdout_to_output: bool = False


def _run(command: Command, env: dict[str, str], *, prefix: Sequence[str] = ()) -> subprocess.CompletedProcess[bytes]:
    command.output.unlink(missing_ok=True)
    if command.stdout_to_output:
        with open(command.output, "wb") as out:
            return subprocess.run([*prefix, *command.argv], stdout=out, stderr=subprocess.PIPE, env=env)
    return subprocess.run([*prefix, *command.argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)


def time_once(command: Command, env: dict[str, str]) -> float:
    os.sync()  # start each run with no dirty pages from the previous one
    start = time.perf_counter()
    result = _run(command, env)
    elapsed = time.perf_counter() - start
    if result.returncode:
        raise SystemExit(f"{command.tool} failed: {result.stderr.decode().strip()}")
    return elapsed


def peak_mib(command: Command, env: dict[str, str]) -> float | None:
    """Peak RSS in MiB through GNU time, or None where it is not installed."""
    if not os.access(GNU_TIME, os.X_OK):
        return None
    with tempfile.NamedTemporaryFile("r") as report:
        result = _run(command, env, prefix=(GNU_TIME, "-f", "%M", "-o", report.name))
        if result.returncode:
            raise SystemExit(f"{command.tool} failed: {result.stderr.decode().strip()}")
        return int(report.read().split()[-1]) / 1024


def make_images(work: Path, size_mib: int) -> list[Path]:
    """Four images of pseudo-random bytes (incompressible, no holes, like real code objects)."""
    rng = random.Random(2024)
    paths = []
    for index in range(4):
        path = work / f"img{index}"
        with open(path, "wb") as f:
            for _ in range(size_mib):
                f.write(rng.randbytes(1 << 20))
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=128, help="size of each image (default 128)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per command (default 5)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    clang = LLVM19_BIN / "clang-offload-bundler"
    if not os.access(clang, os.X_OK):
        raise SystemExit(f"{clang} is missing (set OFFLOAD_LLVM19_BIN)")

    work = Path(tempfile.mkdtemp(prefix="bench-bundler-", dir="/tmp"))
    try:
        images = make_images(work, args.size_mib)
        env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
        ours = (sys.executable, "-m", "offload_builders.cli.bundler")
        targets = "-targets=" + ",".join((HOST, *DEVICES))
        bundle_args = ("-type=o", targets, "-input=/dev/null", *[f"-input={p}" for p in images], "-bundle-align=4096")
        fatbin = work / "fatbin.clang"
        pick = f"-targets={DEVICES[PICK]}"
        operations = {
            f"bundle 4 x {args.size_mib} MiB": [
                Command("cat", ("cat", *map(str, images)), work / "cat.out", stdout_to_output=True),
                Command("python", (sys.executable, "-c", "pass"), work / "python.out"),
                Command("ours", (*ours, *bundle_args, f"-output={work / 'fatbin.ours'}"), work / "fatbin.ours"),
                Command("clang-19", (str(clang), *bundle_args, f"-output={fatbin}"), fatbin),
            ],
            f"unbundle 1 x {args.size_mib} MiB": [
                Command("cat", ("cat", str(images[PICK])), work / "cat1.out", stdout_to_output=True),
                Command("python", (sys.executable, "-c", "pass"), work / "python.out"),
                Command("ours", (*ours, "-unbundle", "-type=o", pick, f"-input={work / 'fatbin.ours'}",
                                 f"-output={work / 'one.ours'}"), work / "one.ours"),
                Command("clang-19", (str(clang), "-unbundle", "-type=o", pick, f"-input={fatbin}",
                                     f"-output={work / 'one.clang'}"), work / "one.clang"),
            ],
        }
        rows = []
        for operation, commands in operations.items():
            for command in commands:  # warm-up: page cache, bytecode cache, and the inputs of the next step
                time_once(command, env)
            if operation.startswith("bundle"):
                if (work / "fatbin.ours").read_bytes() != fatbin.read_bytes():
                    raise SystemExit("our fat binary differs from Clang's")
            elif (work / "one.ours").read_bytes() != images[PICK].read_bytes():
                raise SystemExit("our unbundled image differs from the input")
            times: dict[str, list[float]] = {c.tool: [] for c in commands}
            for _ in range(args.runs):
                for command in commands:
                    times[command.tool].append(time_once(command, env))
            medians = {tool: statistics.median(values) for tool, values in times.items()}
            for command in commands:
                rows.append((operation, command.tool, medians[command.tool], medians[command.tool] / medians["cat"],
                             peak_mib(command, env)))

        print(f"offload-bundler benchmark: 4 images of {args.size_mib} MiB, median of {args.runs} runs, {work}")
        print(f"{'operation':<22} {'tool':<9} {'time s':>8} {'x cat':>7} {'peak MiB':>9}")
        for operation, tool, seconds, ratio, peak in rows:
            shown = f"{peak:9.1f}" if peak is not None else f"{'n/a':>9}"
            print(f"{operation:<22} {tool:<9} {seconds:8.3f} {ratio:7.2f} {shown}")
        for operation in operations:
            mine = next(r for r in rows if r[0] == operation and r[1] == "ours")
            theirs = next(r for r in rows if r[0] == operation and r[1] == "clang-19")
            verdict = [f"{'<=' if mine[3] <= 1.5 else '>'} 1.5x cat",
                       f"{theirs[2] / mine[2]:.1f}x faster than Clang" if mine[2] < theirs[2] else "slower than Clang",
                       f"peak {'<' if mine[4] is not None and mine[4] < 100 else '>='} 100 MiB"]
            print(f"{operation}: ours {', '.join(verdict)}")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
