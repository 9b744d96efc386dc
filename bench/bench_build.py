#!/usr/bin/env python3
"""Phase-split build vs the monolithic driver, measured side by side in one run.

Generates N synthetic OpenMP offload sources, then builds them two ways with SCons at the same ``-j``:

* ``ours``: ``OffloadProgram`` (one node per phase and target, our own link nodes);
* ``mono``: one ``clang++ -fopenmp --offload-arch=<all> -c`` per source (what CMake/Meson do today),
  linked by the driver.

and prints wall-clock times and the ratio ours/mono for: full build at -j1 and -j2, adding one target
to a 4-target build, removing one, and a no-op rebuild. The modes take turns within each of the
``--repeat`` rounds; the table gives the best times, their ratio and the median of the rounds' ratios.
Timings on a shared machine are noisy: run several rounds before believing a small difference.

    .venv/bin/python bench/bench_build.py [--sources 8] [--repeat 1]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

SCONS = str(Path(sys.executable).with_name("scons"))
BASE_TARGETS = ["sm_80", "sm_90", "gfx90a", "gfx942"]
ADDED_TARGET = "gfx1030"
REMOVED_TARGET = "gfx942"

SCONSTRUCT = textwrap.dedent("""
    import offload_builders.scons
    archs = ARGUMENTS["archs"]
    sources = sorted(Glob("src/*.cpp"))
    if ARGUMENTS["mode"] == "ours":
        env = Environment(tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()],
                          OFFLOAD_ARCHS=archs, OFFLOAD_FLAGS=["-O2"])
        objects = [env.OffloadObject(source) for source in sources]
        env.OffloadProgram("prog", objects)
    else:
        from offload_builders.device_libraries import one_command_flags
        from offload_builders.targets import parse_offload_archs
        from offload_builders.toolchain import find_toolchain

        env = Environment(tools=["default"], CXX="clang++-19")
        # the device libraries our nodes link (math in target regions), so both sides compile the same
        libraries = one_command_flags(find_toolchain(), parse_offload_archs(archs), ["-O2"])
        offload = ["-fopenmp", "--offload-arch=" + archs, *libraries, "-O2"]
        objects = [env.Object(source, CXXFLAGS=offload) for source in sources]
        env.Program("prog", objects, LINKFLAGS=["-fopenmp", "--offload-arch=" + archs, "-fuse-ld=lld"])
    Alias("objects", objects)
""")

SOURCE = textwrap.dedent("""
    #include <cstddef>
    #pragma omp declare target
    double weight_{i} = {i}.5;
    #pragma omp end declare target
    double kernel_{i}(double *x, std::size_t n) {{
      double sum = 0;
    #pragma omp target teams distribute parallel for reduction(+ : sum) map(tofrom : x[0 : n])
      for (std::size_t k = 0; k < n; ++k) {{
        x[k] = x[k] * weight_{i} + {i};
        for (int r = 0; r < {rounds}; ++r) x[k] = x[k] * 0.5 + r;
        sum += x[k];
      }}
    #pragma omp target teams distribute parallel for map(tofrom : x[0 : n])
      for (std::size_t k = 0; k < n; ++k) x[k] -= sum / n;
      return sum;
    }}
""")


def generate(root: Path, count: int) -> None:
    """Write ``count`` synthetic sources plus a main that calls every kernel."""
    src = root / "src"
    src.mkdir(parents=True)
    for i in range(count):
        (src / f"kernel_{i}.cpp").write_text(SOURCE.format(i=i, rounds=3 + i % 5))
    calls = "\n".join(f"  double kernel_{i}(double *, std::size_t); total += kernel_{i}(x, 256);" for i in range(count))
    (src / "main.cpp").write_text(
        "#include <cstddef>\n#include <cstdio>\nint main() {\n  static double x[256];\n  double total = 0;\n"
        f"{calls}\n  std::printf(\"%g\\n\", total);\n}}\n")
    (root / "SConstruct").write_text(SCONSTRUCT)


def scons(root: Path, mode: str, archs: list[str], jobs: int, *extra: str) -> float:
    start = time.perf_counter()
    subprocess.run([SCONS, "-Q", f"-j{jobs}", f"mode={mode}", f"archs={','.join(archs)}", *extra],
                   cwd=root, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def clean(root: Path) -> None:
    for path in root.iterdir():
        if path.name not in ("src", "SConstruct"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    for path in (root / "src").iterdir():
        if path.suffix != ".cpp":
            path.unlink()


def paired(ours: Callable[[], float], theirs: Callable[[], float], repeat: int) -> tuple[float, float, float]:
    """Best time of each side and the median of the per-round ratios ours/theirs.

    The sides run in turns, the first of each round alternating (ABBA), so a change in the shared
    machine's load hits both alike; the median ratio of rounds is what to read when the best times differ
    by less than the noise.
    """
    times: dict[str, list[float]] = {"ours": [], "theirs": []}
    for round_ in range(repeat):
        order = (("ours", ours), ("theirs", theirs)) if round_ % 2 == 0 else (("theirs", theirs), ("ours", ours))
        for side, run in order:
            times[side].append(run())
    ratios = sorted(a / b for a, b in zip(times["ours"], times["theirs"]))
    return min(times["ours"]), min(times["theirs"]), statistics.median(ratios)


def measure(roots: dict[str, Path], repeat: int, *targets: str) -> list[tuple[str, dict[str, float]]]:
    """Each scenario for both modes; ``targets`` limits the builds (``objects``: stop at the fat objects)."""
    rows: list[tuple[str, dict[str, float]]] = []
    grown = BASE_TARGETS + [ADDED_TARGET]
    shrunk = [t for t in grown if t != REMOVED_TARGET]

    def best(scenario):
        ours, mono, ratio = paired(lambda: scenario("ours", roots["ours"]), lambda: scenario("mono", roots["mono"]),
                                   repeat)
        return {"ours": ours, "mono": mono, "ratio": ratio}

    for jobs in (1, 2):
        def full(mode, root, jobs=jobs):
            clean(root)
            return scons(root, mode, BASE_TARGETS, jobs, *targets)
        rows.append((f"full build, 4 targets, -j{jobs}", best(full)))

    def add(mode, root):
        scons(root, mode, BASE_TARGETS, 2, *targets)
        return scons(root, mode, grown, 2, *targets)
    rows.append((f"add {ADDED_TARGET} to 4 targets, -j2", best(add)))

    def remove(mode, root):
        scons(root, mode, grown, 2, *targets)
        return scons(root, mode, shrunk, 2, *targets)
    rows.append((f"remove {REMOVED_TARGET} from 5 targets, -j2", best(remove)))

    def noop(mode, root):
        scons(root, mode, shrunk, 2, *targets)
        return scons(root, mode, shrunk, 2, *targets)
    rows.append(("no-op rebuild, -j2", best(noop)))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=8, help="synthetic kernel sources (plus main.cpp)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds per cell (the modes take turns)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="offload-bench-") as scratch:
        roots = {}
        for mode in ("ours", "mono"):
            roots[mode] = Path(scratch) / mode
            generate(roots[mode], args.sources)
        tables = {"compile only (up to the fat objects)": measure(roots, args.repeat, "objects"),
                  "whole program (ours: our link nodes; mono: the driver link through clang-linker-wrapper)": measure(roots, args.repeat)}
    print(f"{args.sources} kernel sources + main.cpp, targets {','.join(BASE_TARGETS)}, {os.cpu_count()} CPUs;"
          f" best of {args.repeat} interleaved rounds, and the median of the rounds' ratios")
    for title, rows in tables.items():
        print(f"\n{title}")
        print(f"{'scenario':<40} {'ours (s)':>9} {'mono (s)':>9} {'ours/mono':>10} {'median':>7}")
        for name, times in rows:
            print(f"{name:<40} {times['ours']:>9.2f} {times['mono']:>9.2f} {times['ours'] / times['mono']:>10.2f}"
                  f" {times['ratio']:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
