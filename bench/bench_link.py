#!/usr/bin/env python3
"""Our link side vs the Clang driver's link through clang-linker-wrapper, measured side by side in one run.

For the same fat objects (built once by the SCons tool; they are byte-identical to the driver's), it
times the link only, two pairs side by side:

* through SCons at ``-j1`` and ``-j2``: the tool's link nodes (extract and device link per target, wrap,
  host link), against an SCons ``Program`` whose link command is the Clang driver's, i.e.
  ``clang-linker-wrapper``, which links the device images one after the other (LLVM 19 has no driver
  option to make it parallel). Both start SCons, read the same project (the driver's ``Program`` is
  added to it) and re-run only the link. A third pair (``-j1``) gives the driver side an SConstruct
  that declares only its link, so it skips checking the project's compile nodes that ours checks. A
  driver-against-itself pair shows how far apart two equal links measure (the noise);
* on the command line: ``clang++ -fopenmp <targets> *.o -o prog -fuse-ld=lld`` with ``-B`` pointing at a
  ``clang-linker-wrapper`` that runs ``offload-link --wrapper-jobs=N``, against the same command with
  Clang's own wrapper.

Projects: ``sample_project`` and the synthetic benchmark of ``bench_build.py``. Times are the best of
``--repeat`` rounds in which the two sides take turns; ratios are ours/clang (below 1 is faster), from the
best times and as the median of the rounds' ratios. The machine is shared and noisy.

    .venv/bin/python bench/bench_link.py [--sources 8] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_build import generate, paired  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SCONS = str(BIN / "scons")
CLANGXX = "/usr/lib/llvm-19/bin/clang++"
TRIPLES = {"x86_64": "x86_64-unknown-linux-gnu", "sm": "nvptx64-nvidia-cuda", "gfx": "amdgcn-amd-amdhsa"}
LINK_SUFFIXES = (".devin", ".img", ".offload.wrapper.o")

#: An SConstruct that links the given fat objects with the Clang driver (and so clang-linker-wrapper).
DRIVER_SCONSTRUCT = """
env = Environment(tools=["default"], LINK="%(clangxx)s", LINKFLAGS=%(flags)r)
env.Program("driver.out", [File(p) for p in %(objects)r])
"""

#: The project itself (read, its compile graph checked, as in our link's run) plus that driver link: the
#: two runs then differ only in the link. Without the project, the driver side skips SCons' work for the
#: compile nodes (30 to 80 ms) that ours pays.
PROJECT_DRIVER_SCONSTRUCT = """
SConscript("SConstruct")
""" + DRIVER_SCONSTRUCT


def driver_target_flags(archs: list[str]) -> list[str]:
    """A link line that makes the driver run the wrapper for every device code present in the objects."""
    triples = sorted({TRIPLES["x86_64" if a == "x86_64" else a[:2] if a.startswith("sm") else "gfx"] for a in archs})
    return ["-fopenmp", "-fopenmp-targets=" + ",".join(triples)]


def timed(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr}")
    return time.perf_counter() - start


def remove_link_outputs(program: Path) -> None:
    """Delete what the link nodes made (they sit next to the program), so the next build runs only them."""
    for path in program.parent.iterdir():
        if path.name.startswith(program.name + ".") and path.name.endswith(LINK_SUFFIXES) or path == program:
            path.unlink()


def measure(title: str, root: Path, build: Path, program: str, scons_args: list[str], archs: list[str],
            repeat: int) -> list[tuple[str, float, float, float]]:
    subprocess.run([SCONS, "-Q", "-j2", *scons_args, program], cwd=root, check=True, stdout=subprocess.DEVNULL)
    objects = sorted(str(p) for p in build.glob("*.o") if ".dev." not in p.name and not p.name.endswith(".wrapper.o"))
    link = [CLANGXX, *driver_target_flags(archs), "-O2", "-fuse-ld=lld", *objects, "-o", str(root / "clang.out")]
    shim = root / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "clang-linker-wrapper").write_text(
        f"#!/bin/sh\nexec {BIN / 'offload-link'} --wrapper-jobs=${{OFFLOAD_LINK_JOBS:-1}} \"$@\"\n")
    (shim / "clang-linker-wrapper").chmod(0o755)

    def clang() -> float:
        return timed(link, root)

    values = {"clangxx": CLANGXX, "objects": objects, "flags": [*driver_target_flags(archs), "-O2", "-fuse-ld=lld"]}
    link_only = root / "SConstruct.driver"
    link_only.write_text(DRIVER_SCONSTRUCT % values)
    in_project = root / "SConstruct.project-driver"
    in_project.write_text(PROJECT_DRIVER_SCONSTRUCT % values)
    rows = []
    for jobs, driver_sconstruct, how in ((1, in_project, "in the project"), (2, in_project, "in the project"),
                                         (1, link_only, "vs a link-only SConstruct")):
        def scons_link(jobs=jobs) -> float:
            remove_link_outputs(root / program)
            return timed([SCONS, "-Q", f"-j{jobs}", *scons_args, program], root)

        def scons_driver(jobs=jobs, driver_sconstruct=driver_sconstruct) -> float:
            (root / "driver.out").unlink(missing_ok=True)
            return timed([SCONS, "-Q", f"-j{jobs}", "-f", str(driver_sconstruct), *scons_args, "driver.out"], root)
        rows.append((f"{title}: scons -j{jobs} {how}, our link nodes vs driver link",
                     *paired(scons_link, scons_driver, repeat)))
        if jobs == 1 and driver_sconstruct == in_project:
            # The same command on both sides: how far apart two equal links measure on this machine.
            rows.append((f"{title}: scons -j1 in the project, driver link vs itself (noise)",
                         *paired(scons_driver, scons_driver, repeat)))
    for jobs in (1, 2):
        env = dict(os.environ, OFFLOAD_LINK_JOBS=str(jobs))
        ours = [link[0], f"-B{shim}", *link[1:-1], str(root / "ours.out")]
        rows.append((f"{title}: clang++ -B(offload-link --wrapper-jobs={jobs}) vs clang++",
                     *paired(lambda env=env, ours=ours: timed(ours, root, env), clang, repeat)))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=8, help="synthetic kernel sources (plus main.cpp)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per cell (the sides take turns)")
    args = parser.parse_args(argv)
    rows: list[tuple[str, float, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="offload-bench-link-") as scratch:
        sample = Path(scratch) / "sample_project"
        shutil.copytree(REPO / "sample_project", sample, ignore=shutil.ignore_patterns("build", ".sconsign*"))
        for archs in (["x86_64"], ["x86_64", "sm_80", "gfx90a"], ["sm_80", "sm_90", "gfx90a", "gfx942"]):
            rows += measure(f"sample {','.join(archs)}", sample, sample / "build", "build/zaxpy",
                            [f"offload_archs={','.join(archs)}"], archs, args.repeat)
        synthetic = Path(scratch) / "synthetic"
        generate(synthetic, args.sources)
        archs = ["sm_80", "sm_90", "gfx90a", "gfx942"]
        rows += measure(f"synthetic {args.sources} sources {','.join(archs)}", synthetic, synthetic / "src", "prog",
                        ["mode=ours", f"archs={','.join(archs)}"], archs, args.repeat)
    print(f"link only, best of {args.repeat} interleaved rounds and the median of the rounds' ratios; clang = the"
          f" driver's link through clang-linker-wrapper 19 (serial); {os.cpu_count()} CPUs")
    print(f"{'scenario':<88} {'ours (s)':>9} {'clang (s)':>9} {'ours/clang':>10} {'median':>7}")
    for name, ours, clang, ratio in rows:
        print(f"{name:<88} {ours:>9.2f} {clang:>9.2f} {ours / clang:>10.2f} {ratio:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
