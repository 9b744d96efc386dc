#!/usr/bin/env python3
"""Benchmark: what one cached compile command costs through ``offload-cache``, two versions side by side.

A whole-command hit (the direct mode) reads the command, makes its key, follows the lists of files its last runs
read (the source and every header, system headers included: about 130 for a small OpenMP source that includes
``<cstdio>``, ``<vector>`` and ``<omp.h>``) and copies the object out. This times that hit for two trees of the
package, each with its own empty cache, filled by two runs first, the sides taking turns within each of
``--runs`` rounds; ``python -c pass`` (the interpreter's start-up, the floor of any Python launcher) takes its
turn too. It prints the median and the fastest run of each and the ratio of the medians, new over old.

Each tree is ``git archive <rev> offload_builders`` (``--old``, ``--new``), or the checkout's working tree for
``--new .`` (the default; ``--old`` defaults to ``HEAD``). Python's bytecode cache is enabled in a private
directory (this environment may set ``PYTHONDONTWRITEBYTECODE``, which would add the compilation of every module
to each run) and warmed by the filling runs.

Usage: ``.venv/bin/python bench/bench_hit.py [--runs 41] [--old HEAD] [--new .] [--compiler clang++-19]
[--offload-arch gfx90a]
[--device-libraries]``; bench_launcher.py's hit row: ``--offload-arch sm_80,sm_90,gfx90a,gfx942,sm_75
--device-libraries``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SOURCE = """\
#include <cstdio>
#include <vector>
#include <omp.h>

int main() {
  std::vector<double> values(1024, 1.0);
  double *data = values.data();
  double sum = 0;
#pragma omp target teams distribute parallel for map(to: data[0:1024]) reduction(+: sum)
  for (int i = 0; i < 1024; ++i) sum += data[i];
  std::printf("%f %d\\n", sum, omp_get_max_threads());
  return 0;
}
"""

#: The launcher as its console script runs it.
LAUNCHER = "import sys; from offload_builders.cli.cache import main; sys.exit(main())"


def _timed(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(list(argv), env=dict(env), cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"bench_hit: {' '.join(argv)} failed:\n{done.stderr.decode(errors='replace')}")
    return elapsed


def _device_library_flags(archs: str) -> list[str]:
    """The flags that link each target's device libraries (found as bench_launcher.py finds them)."""
    sys.path.insert(0, str(ROOT))
    from offload_builders.device_libraries import one_command_flags
    from offload_builders.targets import parse_offload_archs
    from offload_builders.toolchain import find_toolchain

    return one_command_flags(find_toolchain(), parse_offload_archs(archs), ["-O2"])


def _tree(rev: str, scratch: Path, name: str) -> Path:
    """The directory to put on ``PYTHONPATH`` for ``rev`` ("." for the working tree)."""
    if rev == ".":
        return ROOT
    tree = scratch / name
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "offload_builders"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def _commit(rev: str) -> str:
    if rev == ".":
        return "working tree"
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True, capture_output=True,
                          text=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=41, help="timed hits per side")
    parser.add_argument("--old", default="HEAD", help="the tree measured first: a git revision, or '.'")
    parser.add_argument("--new", default=".", help="the tree compared with it: a git revision, or '.'")
    parser.add_argument("--compiler", default="clang++-19")
    parser.add_argument("--offload-arch", default="gfx90a")
    parser.add_argument("--device-libraries", action="store_true",
                        help="link the GPU device libraries as bench_launcher.py's hit row does (else -nogpulib)")
    args = parser.parse_args(argv)
    compiler = shutil.which(args.compiler)
    if compiler is None:
        raise SystemExit(f"bench_hit: {args.compiler} not found")
    with tempfile.TemporaryDirectory(prefix="bench-hit-") as name:
        scratch = Path(name)
        work = scratch / "work"
        work.mkdir()
        (work / "hit.cpp").write_text(SOURCE)
        libraries = _device_library_flags(args.offload_arch) if args.device_libraries else ["-nogpulib"]
        command = [compiler, "-fopenmp", f"--offload-arch={args.offload_arch}", *libraries, "-O2", "-MD", "-MF",
                   "hit.d", "-c", "hit.cpp", "-o", "hit.o"]
        base = {key: value for key, value in os.environ.items()
                if key not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH") and not key.startswith("OFFLOAD_CACHE_")}
        base["PYTHONPYCACHEPREFIX"] = str(scratch / "pycache")
        sides: dict[str, tuple[list[str], dict[str, str]]] = {"python -c pass": ([sys.executable, "-c", "pass"], base)}
        for side, rev in (("old", args.old), ("new", args.new)):
            tree = _tree(rev, scratch, side)
            env = dict(base, PYTHONPATH=str(tree), OFFLOAD_CACHE_DIR=str(scratch / f"cache-{side}"))
            sides[f"{side} ({_commit(rev)})"] = ([sys.executable, "-c", LAUNCHER, *command], env)
        for launched, env in list(sides.values())[1:]:  # fill each cache: a miss, then a hit
            for _ in range(2):
                _timed(launched, env, work)
        times: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(args.runs):
            for side, (launched, env) in sides.items():
                times[side].append(_timed(launched, env, work))
    medians = {side: statistics.median(values) for side, values in times.items()}
    print(f"one cached compile command (--offload-arch={args.offload_arch}"
          f"{', device libraries' if args.device_libraries else ', -nogpulib'}), {args.runs} runs each, "
          f"nproc {os.cpu_count()}")
    for side, values in times.items():
        print(f"  {side:32s} median {medians[side] * 1000:7.2f} ms   fastest {min(values) * 1000:7.2f} ms")
    old, new = (medians[side] for side in list(sides)[1:])
    print(f"  new / old: {new / old:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
