#!/usr/bin/env python3
"""A cold build with a warm remote cache against a local build of the same tree, measured side by side.

For each tree, a checkout first fills a BuildGrid cache on loopback ($OFFLOAD_REMOTE); then each round builds
two fresh copies of the tree at new paths (nothing built, the per-user caches warm), one with the cache and
one without, taking turns, and prints the best times, their ratio (remote/local) and the median of the
rounds' ratios. Trees:

* ``hetero``: sample_project's HIP + CUDA + OpenMP program (``build/cuda``: OpenMP x86_64/gfx90a/sm_80, HIP
  gfx90a, CUDA sm_80, plain and relocatable device code) and its run. Its OpenMP nodes are built locally on
  both sides (their region names hold the source's inode: README, "Remote cache and execution");
* ``hip``: ``--sources`` generated HIP kernels for four targets (bench_build's ``--model hip`` sources),
  objects only;
* ``hip-rdc``: sample_project/hip with ``program=1 rdc=1`` for gfx90a:xnack+, gfx942 (device links, wrapper,
  host link).

    .venv/bin/python bench/bench_remote.py [--repeat 3] [--sources 32] [--jobs 2] [--remote grpc://HOST:PORT/INSTANCE]

Without ``--remote`` it starts BuildGrid 0.4.4 from ``.venv-buildgrid`` (``./scripts/bootstrap``) with an
in-memory cache, as the tests do.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCONS = str(Path(sys.executable).with_name("scons"))
sys.path.insert(0, str(REPO / "tests"))


def _bench_build():
    spec = importlib.util.spec_from_file_location("bench_build", REPO / "bench" / "bench_build.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_build"] = module
    spec.loader.exec_module(module)
    return module


def hetero_tree(root: Path) -> list[str]:
    sample = REPO / "sample_project"
    root.mkdir(parents=True)
    shutil.copy(sample / "SConstruct", root)
    for part in ("src", "include", "mixed", "cuda", "hip/include"):
        shutil.copytree(sample / part, root / part)
    return ["build/cuda"]


def hip_rdc_tree(root: Path) -> list[str]:
    shutil.copytree(REPO / "sample_project" / "hip", root, ignore=shutil.ignore_patterns("build", ".sconsign*"))
    return ["program=1", "rdc=1"]


def generated_hip_tree(sources: int) -> Callable[[Path], list[str]]:
    bench = _bench_build()
    bench.MODEL = "hip"

    def make(root: Path) -> list[str]:
        root.mkdir(parents=True)
        bench.generate(root, sources)
        return ["mode=ours", "model=hip", "archs=" + ",".join(bench.MODEL_TARGETS["hip"][:4])]

    return make


def build(root: Path, args: list[str], jobs: int, environ: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run([SCONS, "-Q", f"-j{jobs}", *args], cwd=root, env=environ, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0 or "warning" in done.stderr and "remote" in done.stderr:
        raise SystemExit(f"bench_remote: the build in {root} failed or warned:\n{done.stdout}{done.stderr}")
    return elapsed


def measure(name: str, make: Callable[[Path], list[str]], scratch: Path, remote: str, repeat: int, jobs: int
            ) -> tuple[str, float, float, float]:
    local_env = {key: value for key, value in os.environ.items() if not key.startswith("OFFLOAD_REMOTE")}
    local_env["OFFLOAD_BUILDERS_CACHE_DIR"] = str(scratch / "user-cache")
    remote_env = dict(local_env, OFFLOAD_REMOTE=remote)
    args = make(scratch / name / "fill")
    build(scratch / name / "fill", args, jobs, remote_env)      # fills the cache (and the per-user caches)
    times: dict[str, list[float]] = {"local": [], "remote": []}
    for round_ in range(repeat):
        order = ["local", "remote"] if round_ % 2 == 0 else ["remote", "local"]
        for side in order:
            root = scratch / name / f"{side}-{round_}"
            make(root)
            times[side].append(build(root, args, jobs, remote_env if side == "remote" else local_env))
            shutil.rmtree(root)
    ratios = [r / local for r, local in zip(times["remote"], times["local"])]
    return name, min(times["local"]), min(times["remote"]), statistics.median(ratios)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sources", type=int, default=32)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--remote", help="an existing cache (grpc://HOST:PORT/INSTANCE) instead of a new BuildGrid")
    parser.add_argument("--trees", default="hetero,hip,hip-rdc")
    args = parser.parse_args(argv)
    trees = {"hetero": hetero_tree, "hip": generated_hip_tree(args.sources), "hip-rdc": hip_rdc_tree}
    with tempfile.TemporaryDirectory(prefix="bench-remote-") as scratch_dir:
        scratch = Path(scratch_dir)
        server = None
        remote = args.remote
        if remote is None:
            from remote_servers import start_buildgrid

            server = start_buildgrid(scratch / "buildgrid")
            remote = server.remote
        try:
            print(f"cold build, warm remote cache ({remote}) vs local, -j{args.jobs}, {args.repeat} rounds")
            print(f"{'tree':<10} {'local s':>9} {'remote s':>9} {'ratio':>7} {'median':>7}")
            for name in args.trees.split(","):
                tree, local, cached, median = measure(name, trees[name], scratch, remote, args.repeat, args.jobs)
                print(f"{tree:<10} {local:9.2f} {cached:9.2f} {cached / local:7.2f} {median:7.2f}", flush=True)
        finally:
            if server is not None:
                server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
