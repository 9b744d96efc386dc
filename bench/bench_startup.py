#!/usr/bin/env python3
"""Benchmark: what an ``offload-compile`` phase command costs beyond the compiler job it runs.

A build that runs a command per phase (Ninja under CMake or Meson) pays, for every phase and target, one Python
start-up of ``offload-compile`` on top of the ``-cc1`` job the driver would have run in its own process. This
measures that overhead on a small OpenMP source (one target region), side by side in one run, the commands
taking turns within each of ``--runs`` rounds:

* ``python -c pass``: the start-up floor of any Python tool with this interpreter and environment;
* ``stdlib``: importing the standard-library modules an OpenMP phase command imports (found by importing it),
  without ours: what any Python tool that uses them pays, which no change of ours can cut;
* ``import``: ``python -c "import offload_builders.cli.compile"`` and its OpenMP phases, the package's import
  alone;
* ``host`` and ``device``: ``offload-compile host`` and ``offload-compile device --target T`` with a depfile, as
  the CMake module and the Meson sample run them;
* ``host job`` and ``device job``: the very jobs those commands run (rendered by the same phase model), run alone.

It prints the median of each and the own cost of each phase command: its median minus its job's. Python's
bytecode cache is enabled in a private directory (this environment may set ``PYTHONDONTWRITEBYTECODE``, which
would add the compilation of every module to each run) and warmed once before timing.

Usage: ``.venv/bin/python bench/bench_startup.py [--runs 9] [--target x86_64-unknown-linux-gnu] [--modules M1,M2]``
(an earlier version of the package: ``PYTHONPATH=<its tree>`` and ``--modules offload_builders.cli.compile``).
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

SOURCE = """\
int kernel(int n) {
  int sum = 0;
#pragma omp target map(tofrom: sum)
  for (int i = 0; i < n; ++i) sum += i;
  return sum;
}
"""
FLAGS = ("-O2", "-std=c++17")


def _timed(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(list(argv), env=dict(env), cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"bench_startup: {' '.join(argv)} failed:\n{done.stderr.decode(errors='replace')}")
    return elapsed


def _jobs(work: Path, target: str) -> tuple[list[str], list[list[str]]]:
    """The host front end's job and the device phase's jobs, as ``offload-compile`` renders them in ``work``."""
    from offload_builders.models.openmp import PhaseModel, language_of
    from offload_builders.targets import parse_target_id
    from offload_builders.toolchain import find_toolchain, user_cache

    model = PhaseModel(find_toolchain(), str(work), user_cache("driver-probes.json", max_entries=256))
    host = model.host_steps(language_of("k.cpp"), FLAGS).frontend.render(
        source="k.cpp", main_file_name="k.cpp", output="job.host.bc")
    steps = model.device_steps(parse_target_id(target), language_of("k.cpp"), FLAGS)
    compiled = "job.dev" + steps.compile_suffix if steps.assemble else "job.dev.o"
    device = [steps.compile.render(source="k.cpp", main_file_name="k.cpp", host_bc="k.host.bc", output=compiled)]
    if steps.assemble is not None:
        device.append(steps.assemble.render(input=compiled, output="job.dev.o"))
    return host, device


PHASE_MODULES = "offload_builders.cli.compile, offload_builders.cli.openmp_phases"


def _stdlib_modules(python: str, env: Mapping[str, str], modules: str) -> list[str]:
    """The top-level standard-library modules that importing ``modules`` adds to a bare start-up."""
    script = ("import sys; before = set(sys.modules); import " + modules + "; print(' '.join(sorted("
              "name for name in set(sys.modules) - before if '.' not in name and not name.startswith('_')"
              " and name != 'offload_builders')))")
    done = subprocess.run([python, "-c", script], env=dict(env), capture_output=True, text=True, check=True)
    return done.stdout.split()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="rounds (the commands take turns within each)")
    parser.add_argument("--target", default="x86_64-unknown-linux-gnu", help="the device phase's target")
    parser.add_argument("--modules", default=PHASE_MODULES,
                        help="what an OpenMP phase command imports (another version of the package: its modules)")
    args = parser.parse_args(argv)
    python = sys.executable
    tool = [python, "-c", "import sys; from offload_builders.cli.compile import main; sys.exit(main())"]
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as scratch:
        work = Path(scratch)
        (work / "k.cpp").write_text(SOURCE)
        env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
        host_job, device_jobs = _jobs(work, args.target)
        host = [*tool, "host", "k.cpp", "-o", "k.host.bc", "--depfile", "k.host.d", "--", *FLAGS]
        device = [*tool, "device", "k.cpp", "--host-bc", "k.host.bc", "--target", args.target, "-o", "k.dev.o",
                  "--depfile", "k.dev.d", "--", *FLAGS]
        stdlib = _stdlib_modules(python, env, args.modules)
        commands: dict[str, list[list[str]]] = {
            "python -c pass": [[python, "-c", "pass"]],
            f"stdlib: import {len(stdlib)} modules": [[python, "-c", "import " + ", ".join(stdlib)]],
            "import (stdlib + ours)": [[python, "-c", "import " + args.modules]],
            "offload-compile host": [host],
            "host job (-cc1) alone": [host_job],
            "offload-compile device": [device],
            "device jobs alone": device_jobs,
        }
        for sequence in commands.values():  # warm up: bytecode cache, probe cache, page cache
            for command in sequence:
                _timed(command, env, work)
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, sequence in commands.items():
                times[name].append(sum(_timed(command, env, work) for command in sequence))
        shutil.rmtree(work / "pycache", ignore_errors=True)
    median = {name: statistics.median(values) * 1000 for name, values in times.items()}
    print(f"bench_startup: {os.cpu_count()} CPUs, median of {args.runs} interleaved rounds, OpenMP source,"
          f" device target {args.target}, flags {' '.join(FLAGS)}")
    print(f"{'command':40s} {'median (ms)':>12s}")
    for name, value in median.items():
        print(f"{name:40s} {value:12.1f}")
    print(f"{'own cost of host (command - job)':40s}"
          f" {median['offload-compile host'] - median['host job (-cc1) alone']:12.1f}")
    print(f"{'own cost of device (command - jobs)':40s}"
          f" {median['offload-compile device'] - median['device jobs alone']:12.1f}")
    stdlib_cost = median[f"stdlib: import {len(stdlib)} modules"] - median["python -c pass"]
    print(f"{'import cost (import - pass)':40s} {median['import (stdlib + ours)'] - median['python -c pass']:12.1f}")
    print(f"{'  of which the stdlib modules':40s} {stdlib_cost:12.1f}")
    print(f"stdlib modules: {' '.join(stdlib)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
