#!/usr/bin/env python3
"""Phase-split build vs the monolithic driver, measured side by side in one run.

Generates N synthetic OpenMP offload sources, then builds them two ways with SCons at the same ``-j``:

* ``ours``: ``OffloadProgram`` (one node per phase and target, our own link nodes);
* ``mono``: one ``clang++ -fopenmp --offload-arch=<all> -c`` per source (what CMake/Meson do today),
  linked by the driver.

and prints wall-clock times and the ratio ours/mono for: full build at -j1 and -j2, editing one source's
device code (a target region) or only its host code and rebuilding, at -j1 and -j2, adding one target
to a 4-target build, removing one, and a no-op rebuild. The modes take turns within each of the
``--repeat`` rounds; the table gives the best times, their ratio and the median of the rounds' ratios.
Timings on a shared machine are noisy: run several rounds before believing a small difference.

``--scale`` measures instead how the two sides grow with sources x targets (``--points``, default
``8x4,64x4,256x8``): full builds (-j1, -j2), the edit loop (edit one source's device code, rebuild the
program, -j2) and the no-op (-j2), with the no-op's peak memory (the SCons process's own). Points with more
than ``--real-up-to`` sources (default 64), and every point with ``--no-op-only``, get a *generated* tree
instead of a compiled one: both sides compile one kernel and ``main.cpp`` for real (the template), then
SCons builds the whole graph once with a ``$SPAWN`` that copies the template's output of each command
instead of running it (kernel_<n>'s file from kernel_0's). ``$SPAWN`` is in no signature, so SCons records
exactly the signatures a real build would, and the timed no-ops run with SCons' own ``$SPAWN`` over real
files and real signatures. (Such a tree cannot be edited and relinked: its objects define the same symbols;
the edit loop is measured on compiled points only.) Each point also has two "SCons floor" rows: the no-op of
a trivial tree with as many nodes as ours built (each copies a seed file in-process), one input each, and of
one whose nodes also have as many inputs as ours have on average (seed files and value nodes, which every
node shares), against the driver's no-op: what SCons itself costs for a graph of that size and shape, which
no code of ours can cut. It writes the table
and a plot (``scale.txt``, ``scale.png``: needs matplotlib, ``pip install .[bench]``) to ``--output-dir``.

``--scale --cmake`` adds CMake+Ninja rows to each point (``--cmake-only``: those alone): the same generated
sources built by the package's CMake module (``find_package(OffloadBuilders)``, ``offload_add_executable``: one
custom command per phase and target) and by CMake+Ninja driving the one-command driver (one ``clang++ -fopenmp
--offload-arch=<all> -c`` per source, with the device-library flags the driver's side gets above, a plain
``add_executable``), both at ``-j2``: the no-op (``cmake --build`` of an up-to-date tree) and, without
``--no-op-only``, a clean build and adding a target (the reconfigure with ``-DOFFLOAD_ARCHS`` and the build). Up
to ``--real-up-to`` sources these trees are compiled for real (Ninja trusts only its own log: a real build of both
sides); larger points get *generated* CMake trees, no-op only: every command runs through a stand-in
(:data:`STAND_IN`, kept in the commands Ninja logs) that runs kernel_0's and main.cpp's commands for real and
writes kernel_0's outputs and depfiles under kernel_<n>'s names for the others, so Ninja's log and deps log have
a compiled tree's entries (the same sizes, checked at 8 x 2), without hours of device links. In the table,
``ours`` is our CMake module and ``mono`` the driver under CMake.

``--headers N`` has each kernel source include a chain of N headers, as a project's sources include its
headers: every phase node of a source depends on them (both sides).

``--model hip`` or ``cuda`` (with ``--scale --no-op-only``) measures the no-op of HIP or CUDA sources instead,
each a kernel and its launch (declared by the samples' ``hip_min.h`` / ``cuda_min.h``), built into objects
(no program): ours with ``OffloadObject``, the driver's side one ``clang++ -x hip`` (Clang 19) or ``-x cuda``
(Clang 22, whose driver runs CUDA 13's ``fatbinary``) per source. CUDA has seven targets (``--points
64x4,256x7``).

    .venv/bin/python bench/bench_build.py [--sources 8] [--repeat 1] [--headers 0]
    .venv/bin/python bench/bench_build.py --scale [--points 8x4,64x4,256x8] [--no-op-only] [--output-dir DIR]
    .venv/bin/python bench/bench_build.py --scale --no-op-only --model hip|cuda [--points 64x4,256x7]
    .venv/bin/python bench/bench_build.py --scale --cmake[-only] [--no-op-only] [--points 64x4] [--targets T1,T2,...]
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
from typing import NamedTuple

from offload_builders.content_records import SETTLED_NS

SCONS = str(Path(sys.executable).with_name("scons"))
BASE_TARGETS = ["sm_80", "sm_90", "gfx90a", "gfx942"]
ADDED_TARGET = "gfx1030"
REMOVED_TARGET = "gfx942"
#: The targets of the scale points, the first N for N targets.
SCALE_TARGETS = ["sm_80", "sm_90", "gfx90a", "gfx942", "sm_75", "sm_86", "gfx908", "gfx1030"]
#: ``--model``: the scale points' targets of each model (CUDA: the NVPTX targets both Clang 19 and CUDA 13 know).
MODEL_TARGETS = {"openmp": SCALE_TARGETS,
                 "hip": ["gfx90a", "gfx942", "gfx908", "gfx1030", "gfx906", "gfx1100", "gfx1010", "gfx900"],
                 "cuda": ["sm_80", "sm_90", "sm_75", "sm_86", "sm_89", "sm_87", "sm_90a"]}

SCONSTRUCT = textwrap.dedent("""
    import offload_builders.scons
    archs = ARGUMENTS["archs"]
    model = ARGUMENTS.get("model", "openmp")  # hip, cuda (bench --model): kernels only, no program
    sources = sorted(Glob("src/*.cpp") + Glob("src/*.hip") + Glob("src/*.cu"))
    if ARGUMENTS["mode"] in ("ours", "groups"):  # groups: ours with $OFFLOAD_IMAGE_GROUPS (bench --groups)
        env = Environment(tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()],
                          OFFLOAD_ARCHS=archs, OFFLOAD_FLAGS=["-O2"],
                          OFFLOAD_IMAGE_GROUPS=ARGUMENTS["mode"] == "groups",
                          OFFLOAD_HIP_FLAGS=["-nogpulib", "-nogpuinc"])  # hip_min.h, as sample_project/hip
        objects = [env.OffloadObject(source) for source in sources]
        if model == "openmp":
            env.OffloadProgram("prog", objects)
    elif model != "openmp":
        # One driver command per source: HIP with Clang 19; CUDA with Clang 22, whose driver runs CUDA 13's
        # fatbinary (Clang 19's cannot; our side's nodes run it themselves).
        import SCons.Defaults, SCons.Tool

        if model == "hip":
            cxx, flags = "clang++-19", ["-x", "hip", "--offload-arch=" + archs, "-nogpulib", "-nogpuinc", "-O2"]
        else:
            cxx, flags = "clang++-22", ["-x", "cuda", *("--cuda-gpu-arch=" + arch for arch in archs.split(",")),
                                        "--cuda-path=/usr/local/cuda", "-nocudainc", "-nocudalib", "-O2"]
        env = Environment(tools=["default"], CXX=cxx)
        static_objects, _ = SCons.Tool.createObjBuilders(env)
        for suffix in (".hip", ".cu"):
            static_objects.add_action(suffix, SCons.Defaults.CXXAction)
            static_objects.add_emitter(suffix, SCons.Defaults.StaticObjectEmitter)
            SCons.Tool.SourceFileScanner.add_scanner(suffix, SCons.Tool.CScanner)
        objects = [env.Object(source, CXXFLAGS=flags) for source in sources]
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
    if "decider" in ARGUMENTS:  # --decider: the project's choice, the same on both sides
        env.Decider(ARGUMENTS["decider"])
    Alias("objects", objects)
    if model != "openmp":
        Default("objects")
    if "report_memory" in ARGUMENTS:  # this process's own peak (the driver's side runs clang probes, larger)
        import atexit, resource
        atexit.register(lambda: print("peak-memory-kb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
    if "template" in ARGUMENTS:  # a generated tree (bench_build --scale): copy the template's outputs
        import os, re, shlex, shutil

        def copy_from_template(sh, escape, cmd, args, spawn_env, template=ARGUMENTS["template"]):
            words = shlex.split(" ".join(args))  # the words as the shell would pass them
            output = os.path.relpath(words[words.index("-o") + 1] if "-o" in words
                                     else next(word for word in words if word.endswith(".partial")))
            if ".partial." in os.path.basename(output):  # a node's side file (OpenMP's NVPTX PTX, HIP's device
                open(output, "w").close()                   # object), which its next step (a copy too) ignores
                return 0
            output = output[:-len(".partial")] if output.endswith(".partial") else output
            shutil.copyfile(os.path.join(template, re.sub(r"kernel_[0-9]+", "kernel_0", output)), output)
            return 0
        env["SPAWN"] = copy_from_template
""")

SOURCE = textwrap.dedent("""
    #include <cstddef>
    #pragma omp declare target
    double weight_{i} = {i}.5;
    #pragma omp end declare target
    double host_only_{i}() {{ return {host}; }}
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
      return sum + host_only_{i}();
    }}
""")


#: ``--model hip`` / ``cuda``: a kernel and its launch per source, declared by the samples' headers.
KERNEL_SOURCE = textwrap.dedent("""
    #include "{header}"
    __global__ void kernel_{i}(float *x, float a) {{ x[0] = x[0] * a + {i}; }}
    void launch_{i}(float *x) {{ kernel_{i}<<<1, 1>>>(x, 2.0f); }}
""")
#: Per model: the sources' suffix, and the header they include (a sample's, copied beside them).
MODEL_SOURCES = {"hip": (".hip", Path(__file__).parent.parent / "sample_project" / "hip" / "include" / "hip_min.h"),
                 "cuda": (".cu", Path(__file__).parent.parent / "sample_project" / "cuda" / "include" / "cuda_min.h")}


def source_text(i: int, device_edits: int = 0, host_edits: int = 0) -> str:
    """kernel_<i>.cpp after some edits of its target region (the loop count) and of its host-only function."""
    text = SOURCE.format(i=i, rounds=3 + i % 5 + device_edits, host=f"{i}.{host_edits}")
    return '#include "h0.h"\n' + text if HEADERS else text


def header_text(h: int) -> str:
    """``h<h>.h`` of ``--headers``: an inline function, and the next header of the chain."""
    return (f'#include "h{h + 1}.h"\n' if h + 1 < HEADERS else "") + f"inline int header_{h}() {{ return {h}; }}\n"


def generate(root: Path, count: int) -> None:
    """Write ``count`` synthetic sources plus a main that calls every kernel (``--model hip``/``cuda``: the
    kernels and their header)."""
    src = root / "src"
    src.mkdir(parents=True)
    if MODEL != "openmp":
        suffix, header = MODEL_SOURCES[MODEL]
        shutil.copyfile(header, src / header.name)
        for i in range(count):
            (src / f"kernel_{i}{suffix}").write_text(KERNEL_SOURCE.format(i=i, header=header.name))
        (root / "SConstruct").write_text(SCONSTRUCT)
        return
    for i in range(count):
        (src / f"kernel_{i}.cpp").write_text(source_text(i))
    for h in range(HEADERS):
        (src / f"h{h}.h").write_text(header_text(h))
    calls = "\n".join(f"  double kernel_{i}(double *, std::size_t); total += kernel_{i}(x, 256);" for i in range(count))
    (src / "main.cpp").write_text(
        "#include <cstddef>\n#include <cstdio>\nint main() {\n  static double x[256];\n  double total = 0;\n"
        f"{calls}\n  std::printf(\"%g\\n\", total);\n}}\n")
    (root / "SConstruct").write_text(SCONSTRUCT)


#: ``--decider``: passed to both sides' SConstruct (``env.Decider``); None: SCons' default (content).
DECIDER: str | None = None
#: ``--headers``: each kernel source includes ``h0.h``, which includes ``h1.h``, and so on (a project's
#: headers: every phase node of a source depends on them); 0: none.
HEADERS = 0
#: ``--groups``: our side links with ``$OFFLOAD_IMAGE_GROUPS`` (one image per group of sources and target).
OURS_MODE = "ours"
#: ``--model``: the offload model of the sources (``--scale --no-op-only`` only for hip and cuda).
MODEL = "openmp"

#: The environment of the SCons runs: Python's bytecode cache on, as in an installed package (with
#: PYTHONDONTWRITEBYTECODE, every run would compile our modules from source: about 0.1 s a run on one side).
ENVIRON = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}


def scons_command(mode: str, archs: list[str], jobs: int, *extra: str) -> list[str]:
    decider = [f"decider={DECIDER}"] if DECIDER else []
    model = [f"model={MODEL}"] if MODEL != "openmp" else []
    mode = OURS_MODE if mode == "ours" else mode
    return [SCONS, "-Q", f"-j{jobs}", f"mode={mode}", f"archs={','.join(archs)}", *decider, *model, *extra]


def scons(root: Path, mode: str, archs: list[str], jobs: int, *extra: str) -> float:
    start = time.perf_counter()
    subprocess.run(scons_command(mode, archs, jobs, *extra), cwd=root, check=True, stdout=subprocess.DEVNULL,
                   env=ENVIRON)
    return time.perf_counter() - start


def peak_memory_mb(root: Path, mode: str, archs: list[str], jobs: int) -> float:
    """The SCons process's own peak resident memory in a run (MB), as the SConstruct reports it at exit
    (``ru_maxrss``, which Linux counts in KB)."""
    done = subprocess.run(scons_command(mode, archs, jobs, "report_memory=1"), cwd=root, check=True,
                          capture_output=True, text=True, env=ENVIRON)
    reported = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("peak-memory-kb ")]
    return int(reported[-1]) / 1024


def clean(root: Path) -> None:
    for path in root.iterdir():
        if path.name not in ("src", "SConstruct"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    for path in (root / "src").iterdir():
        if path.suffix != ".cpp":
            path.unlink()


class Editor:
    """Edits kernel_0.cpp of a tree, each time a real change: its target region, or only its host code."""

    def __init__(self, root: Path) -> None:
        self.path, self.device, self.host = root / "src" / "kernel_0.cpp", 0, 0

    def edit(self, device: bool) -> None:
        if device:
            self.device += 1
        else:
            self.host += 1
        self.path.write_text(source_text(0, self.device, self.host))


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


Row = tuple[str, dict[str, float]]


def best(roots: dict[str, Path], repeat: int, scenario: Callable[[str, Path], float]) -> dict[str, float]:
    ours, mono, ratio = paired(lambda: scenario("ours", roots["ours"]), lambda: scenario("mono", roots["mono"]), repeat)
    return {"ours": ours, "mono": mono, "ratio": ratio}


def full_build(archs: list[str], jobs: int, *targets: str) -> Callable[[str, Path], float]:
    def run(mode: str, root: Path) -> float:
        clean(root)
        return scons(root, mode, archs, jobs, *targets)
    return run


def edit_rebuild(editors: dict[Path, Editor], archs: list[str], jobs: int, device: bool,
                 *targets: str) -> Callable[[str, Path], float]:
    """Bring the tree up to date (not timed), edit kernel_0.cpp, time the rebuild."""
    def run(mode: str, root: Path) -> float:
        scons(root, mode, archs, jobs, *targets)
        editors.setdefault(root, Editor(root)).edit(device)
        return scons(root, mode, archs, jobs, *targets)
    return run


def noop(archs: list[str], jobs: int, *targets: str) -> Callable[[str, Path], float]:
    """Bring the tree up to date, let its files settle and run once more (not timed), time a no-op: the
    state of a tree between edits. (Our side records its outputs' content signatures in the first run
    whose outputs are :data:`~offload_builders.content_records.SETTLED_NS` old, and hashes none of them
    after; SCons hashes every file younger than two days on each run.)"""
    def run(mode: str, root: Path) -> float:
        scons(root, mode, archs, jobs, *targets)
        time.sleep(SETTLED_NS / 1e9)
        scons(root, mode, archs, jobs, *targets)
        return scons(root, mode, archs, jobs, *targets)
    return run


def measure(roots: dict[str, Path], repeat: int, *targets: str) -> list[Row]:
    """Each scenario for both modes; ``targets`` limits the builds (``objects``: stop at the fat objects)."""
    rows: list[Row] = []
    grown = BASE_TARGETS + [ADDED_TARGET]
    shrunk = [t for t in grown if t != REMOVED_TARGET]
    for jobs in (1, 2):
        rows.append((f"full build, 4 targets, -j{jobs}", best(roots, repeat, full_build(BASE_TARGETS, jobs, *targets))))
    editors: dict[Path, Editor] = {}
    for device, what in ((True, "edit one source's device code"), (False, "edit one source's host code only")):
        for jobs in (1, 2):
            rows.append((f"{what}, -j{jobs}", best(roots, repeat, edit_rebuild(editors, BASE_TARGETS, jobs, device,
                                                                                 *targets))))

    def add(mode, root):
        scons(root, mode, BASE_TARGETS, 2, *targets)
        return scons(root, mode, grown, 2, *targets)
    rows.append((f"add {ADDED_TARGET} to 4 targets, -j2", best(roots, repeat, add)))

    def remove(mode, root):
        scons(root, mode, grown, 2, *targets)
        return scons(root, mode, shrunk, 2, *targets)
    rows.append((f"remove {REMOVED_TARGET} from 5 targets, -j2", best(roots, repeat, remove)))
    rows.append(("no-op rebuild, -j2", best(roots, repeat, noop(shrunk, 2, *targets))))
    return rows


def generated_build(scratch: Path, roots: dict[str, Path], archs: list[str]) -> None:
    """Build each side's tree as a generated one (see the module's docstring): compile a one-kernel template
    for real, then let SCons build the whole graph with a ``$SPAWN`` that copies the template's outputs."""
    for mode, root in roots.items():
        template = scratch / f"template-{mode}-{len(archs)}"
        if not template.exists():
            generate(template, 1)
            scons(template, mode, archs, 2)
        scons(root, mode, archs, 2, f"template={template}")


FLOOR_SCONSTRUCT = textwrap.dedent("""
    # SCons' own no-op cost for a graph of N nodes: each copies a seed file with a Python function action
    # (nothing to spawn), in an environment with the default tools, as the driver's side has. Each node has
    # `files` seed files as sources and depends on `values` value nodes (ours: a source, its host bitcode and
    # headers; the stamps of the programs and device libraries a command runs), all shared by every node.
    import shutil

    def copy(target, source, env):
        shutil.copyfile(str(source[0]), str(target[0]))

    env = Environment(tools=["default"])
    action = Action(copy, "copy $TARGET")
    seeds = [f"seed{j}.txt" for j in range(int(ARGUMENTS.get("files", 1)))]
    values = [Value(f"stamp {j}") for j in range(int(ARGUMENTS.get("values", 0)))]
    for i in range(int(ARGUMENTS["nodes"])):
        node = env.Command(f"out/n{i}.txt", seeds, action)
        if values:
            env.Depends(node, values)
""")


class BuiltGraph(NamedTuple):
    """What SCons built in a tree, from its ``.sconsign``: the file nodes with an action (a built target
    records its action's description; a source, a value or a program records none), and the inputs they
    recorded (sources, dependencies and scanned ones), files and value nodes apart."""

    nodes: int
    file_inputs: int
    value_inputs: int

    def inputs_per_node(self) -> tuple[int, int]:
        """The average file and value inputs of a node, rounded: a floor tree's shape (at least one file)."""
        return max(1, round(self.file_inputs / self.nodes)), round(self.value_inputs / self.nodes)


def built_graph(root: Path) -> BuiltGraph:
    import pickle

    import SCons.dblite
    import SCons.Node.Python
    import SCons.SConsign  # noqa: F401  (the classes the entries unpickle to)

    database = SCons.dblite.open(str(root / ".sconsign"), "r")
    nodes = files = values = 0
    for directory in database.keys():
        for entry in pickle.loads(database[directory]).values():
            binfo = entry.binfo
            if not getattr(binfo, "bact", None):
                continue
            nodes += 1
            for kind in ("bsourcesigs", "bdependsigs", "bimplicitsigs"):
                for ninfo in getattr(binfo, kind, None) or ():
                    if isinstance(ninfo, SCons.Node.Python.ValueNodeInfo):
                        values += 1
                    else:
                        files += 1
    return BuiltGraph(nodes, files, values)


def floor_tree(root: Path, nodes: int, files: int = 1, values: int = 0) -> None:
    """A trivial SCons tree of ``nodes`` nodes, each with ``files`` and ``values`` inputs, built once (see
    :data:`FLOOR_SCONSTRUCT`)."""
    root.mkdir(parents=True)
    for j in range(files):
        (root / f"seed{j}.txt").write_text(f"seed {j}\n")
    (root / "SConstruct").write_text(FLOOR_SCONSTRUCT)
    subprocess.run([SCONS, "-Q", "-j2", *floor_arguments(nodes, files, values)], cwd=root, check=True,
                   stdout=subprocess.DEVNULL, env=ENVIRON)


def floor_arguments(nodes: int, files: int = 1, values: int = 0) -> list[str]:
    return [f"nodes={nodes}", f"files={files}", f"values={values}"]


def floor_noop(nodes: int, archs: list[str], files: int = 1, values: int = 0) -> Callable[[str, Path], float]:
    """The no-op of a floor tree (``ours``' side), or of the driver's tree (``mono``), at -j2."""
    def run(mode: str, root: Path) -> float:
        if mode == "mono":
            return noop(archs, 2)(mode, root)
        command = [SCONS, "-Q", "-j2", *floor_arguments(nodes, files, values)]
        subprocess.run(command, cwd=root, check=True, stdout=subprocess.DEVNULL, env=ENVIRON)  # up to date
        start = time.perf_counter()
        subprocess.run(command, cwd=root, check=True, stdout=subprocess.DEVNULL, env=ENVIRON)
        return time.perf_counter() - start
    return run


def scale_point(scratch: Path, sources: int, targets: int, repeat: int, real: bool) -> list[Row]:
    """The scale rows of one point (sources x targets): see the module's docstring."""
    archs = MODEL_TARGETS[MODEL][:targets]
    roots = {mode: scratch / f"{mode}-{sources}x{targets}" for mode in ("ours", "mono")}
    for root in roots.values():
        generate(root, sources)
    rows: list[Row] = []
    if real:
        for jobs in (1, 2):
            rows.append((f"full build, -j{jobs}", best(roots, repeat, full_build(archs, jobs))))
        rows.append(("edit one source's device code, -j2", best(roots, repeat, edit_rebuild({}, archs, 2, True))))
    else:
        generated_build(scratch, roots, archs)
    rows.append(("no-op rebuild, -j2", best(roots, repeat, noop(archs, 2))))
    memory = {mode: peak_memory_mb(root, mode, archs, 2) for mode, root in roots.items()}  # the tree is up to date
    rows.append((PEAK_MEMORY_ROW, {**memory, "ratio": memory["ours"] / memory["mono"]}))
    # What SCons alone costs for as many nodes as ours built (one input each), and for as many with our nodes'
    # inputs (as many files and value nodes as ours have on average): the part of our no-op no code of ours
    # can cut while the graph has this shape.
    graph = built_graph(roots["ours"])
    files, values = graph.inputs_per_node()
    floors = {scratch / f"floor-{sources}x{targets}": (1, 0),
              scratch / f"floor-{sources}x{targets}-inputs": (files, values)}
    for floor, (floor_files, floor_values) in floors.items():
        floor_tree(floor, graph.nodes, floor_files, floor_values)
        shape = "" if (floor_files, floor_values) == (1, 0) else f" x {floor_files}+{floor_values} inputs"
        rows.append((f"SCons floor, {graph.nodes} nodes{shape}, -j2",
                     best({"ours": floor, "mono": roots["mono"]}, repeat,
                          floor_noop(graph.nodes, archs, floor_files, floor_values))))
    for root in (*roots.values(), *floors):
        shutil.rmtree(root)
    return rows


#: ``--cmake``: the CMake+Ninja rows. One CMakeLists.txt for both sides (``-DBENCH_SIDE``): ``ours``, the
#: package's CMake module (``offload_add_executable``: one custom command per phase and target, each through
#: ``offload-compile`` with its depfile, the link through ``offload-link``); ``mono``, the one-command driver
#: (one ``clang++ -fopenmp --offload-arch=<all> -c`` per source with the device-library flags the SCons driver
#: side gets, a plain ``add_executable`` linked by the driver with those flags too: its NVPTX device links then run
#: the CUDA tools whose images the runtime loads, as ours do; without them they ran CUDA 13's, whose ``nvlink``
#: has no sm_70 or sm_72). ``SHELL:`` keeps CMake from de-duplicating the driver's flags.
CMAKELISTS = textwrap.dedent("""
    cmake_minimum_required(VERSION 3.20...4.4)
    project(bench CXX)
    set(BENCH_SIDE "ours" CACHE STRING "ours: the OffloadBuilders module; mono: the one-command driver")
    set(BENCH_STAND_IN "" CACHE FILEPATH "generated trees: the stand-in that runs each command (see STAND_IN)")
    if(BENCH_STAND_IN)
      set(CMAKE_CXX_COMPILER_LAUNCHER "${BENCH_STAND_IN}")
      set_property(GLOBAL PROPERTY RULE_LAUNCH_LINK "${BENCH_STAND_IN}")
    endif()
    file(GLOB sources "${CMAKE_CURRENT_SOURCE_DIR}/src/*.cpp")
    list(SORT sources)
    if(BENCH_SIDE STREQUAL "ours")
      find_package(OffloadBuilders REQUIRED)
      offload_add_executable(prog ${sources} FLAGS -O2)
    else()
      set(OFFLOAD_ARCHS "" CACHE STRING "comma-separated offload targets")
      set(BENCH_DRIVER_FLAGS "" CACHE STRING "the driver's device-library flags (a shell-quoted string)")
      add_executable(prog ${sources})
      set(driver "-fopenmp --offload-arch=${OFFLOAD_ARCHS} ${BENCH_DRIVER_FLAGS}")
      target_compile_options(prog PRIVATE "SHELL:${driver} -O2")
      target_link_options(prog PRIVATE "SHELL:${driver} -fuse-ld=lld")
    endif()
""")
CMAKE = str(Path(sys.executable).with_name("cmake"))
CMAKE_HEADER = ("; CMake+Ninja rows (ours: our CMake module; mono: the driver under CMake), compiled for real up to"
                " --real-up-to sources, generated trees above")
NINJA = str(Path(sys.executable).with_name("ninja"))


def cmake_environ() -> dict[str, str]:
    """The CMake runs' environment: the venv's tools (``offload-compile``, ``offload-link``) first on PATH, the
    toolchain's clang++ as CXX (both sides)."""
    from offload_builders.toolchain import find_toolchain

    return dict(ENVIRON, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
                CXX=str(find_toolchain().clangxx))


def cmake_tree(root: Path, sources: int) -> None:
    """A tree of ``sources`` kernels and main.cpp (the SCons trees' generator) with :data:`CMAKELISTS`."""
    generate(root, sources)
    (root / "CMakeLists.txt").write_text(CMAKELISTS)


#: A generated CMake tree's stand-in (``-DBENCH_STAND_IN``): it prefixes the driver side's compiles and both
#: sides' links, and is our side's ``OFFLOAD_COMPILE``, so Ninja records the same commands in its log for the
#: build and for the timed no-ops, where nothing runs. kernel_0's and main.cpp's commands run for real, and
#: their outputs and depfiles are kept as templates; kernel_<n>'s write kernel_0's with the name changed (a
#: depfile names kernel_<n>.cpp and the same headers, so Ninja's deps log has the real shape); a link only
#: touches its output. Only the no-op is measured on such a tree.
STAND_IN = textwrap.dedent("""
    import re, shutil, subprocess, sys
    from pathlib import Path

    PHASES = ("host", "device", "package", "embed")
    TEMPLATES = Path(__file__).with_name("stand-in-templates")
    args = sys.argv[1:]
    if args and args[0] in (*PHASES, "check"):  # our side's OFFLOAD_COMPILE
        command = [str(Path(sys.executable).with_name("offload-compile")), *args]
    else:  # the compiler or the linker, after the launcher
        command = args
    output = args[args.index("-o") + 1] if "-o" in args else None
    if output is None:
        sys.exit(subprocess.call(command))
    if args[0] not in PHASES and "-c" not in args:  # a link
        Path(output).touch()
        sys.exit(0)
    kernel = re.search(r"kernel_([0-9]+)[.]cpp", output)
    out = Path(output)
    if kernel is None or kernel.group(1) == "0":
        status = subprocess.call(command)
        if status == 0 and kernel is not None:
            TEMPLATES.mkdir(exist_ok=True)
            for made in out.parent.glob(out.name + "*"):
                shutil.copyfile(made, TEMPLATES / made.name)
        sys.exit(status)
    n = kernel.group(1)
    for template in TEMPLATES.glob(out.name.replace(f"kernel_{n}.", "kernel_0.", 1) + "*"):
        target = out.parent / template.name.replace("kernel_0.", f"kernel_{n}.", 1)
        if template.suffix == ".d":
            target.write_text(template.read_text().replace("kernel_0.", f"kernel_{n}."))
        else:
            shutil.copyfile(template, target)
""")


def cmake_configure(root: Path, mode: str, archs: list[str], generated: bool = False) -> float:
    """Configure (or reconfigure with other targets) ``root/build`` for one side with Ninja; the time it took.
    ``generated``: through :data:`STAND_IN`."""
    import shlex

    from offload_builders.device_libraries import one_command_flags
    from offload_builders.targets import parse_offload_archs
    from offload_builders.toolchain import find_toolchain

    joined = ",".join(archs)
    if mode == "ours":
        done = subprocess.run([sys.executable, "-m", "offload_builders.cli.compile", "--cmake-dir"], check=True,
                              capture_output=True, text=True, env=ENVIRON)
        options = [f"-DOffloadBuilders_DIR={done.stdout.strip()}"]
    else:
        flags = one_command_flags(find_toolchain(), parse_offload_archs(joined), ["-O2"])
        options = [f"-DBENCH_DRIVER_FLAGS={shlex.join(flags)}"]
    if generated:
        stand_in = root / "stand_in.py"
        stand_in.write_text(f"#!{sys.executable}{STAND_IN}")
        stand_in.chmod(0o755)
        options += [f"-DBENCH_STAND_IN={stand_in}", *([f"-DOFFLOAD_COMPILE={stand_in}"] if mode == "ours" else [])]
    command = [CMAKE, "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={NINJA}", "-S", str(root), "-B", str(root / "build"),
               f"-DBENCH_SIDE={mode}", f"-DOFFLOAD_ARCHS={joined}", *options]
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=cmake_environ())
    return time.perf_counter() - start


def cmake_build(root: Path, jobs: int = 2) -> float:
    """``cmake --build`` (Ninja) of a configured tree; the time it took."""
    start = time.perf_counter()
    done = subprocess.run([CMAKE, "--build", str(root / "build"), "--", f"-j{jobs}"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=cmake_environ())
    took = time.perf_counter() - start
    if done.returncode != 0:  # what failed, before the scratch tree goes
        sys.stderr.write(done.stdout[-4000:])
        done.check_returncode()
    return took


def cmake_generated_build(root: Path, mode: str) -> None:
    """Build a tree configured with :data:`STAND_IN`: kernel_0's commands first (the others copy their outputs),
    then the rest; it is then up to date."""
    first = "prog.offload/src/kernel_0.cpp.o" if mode == "ours" else "CMakeFiles/prog.dir/src/kernel_0.cpp.o"
    subprocess.run([NINJA, "-C", str(root / "build"), first], check=True, stdout=subprocess.DEVNULL,
                   env=cmake_environ())
    cmake_build(root)
    if not cmake_up_to_date(root):
        raise RuntimeError(f"{root}: the generated tree is not up to date after its build")


def forget_target(root: Path, target: str) -> None:
    """Remove what an earlier round's build for ``target`` left (our device outputs, and the image offload-link
    kept), so that each round adds it as the first did: Ninja would find the outputs of an unchanged command in
    its log, and the link the kept image."""
    from offload_builders.linking.kept_images import kept_images

    name = target.replace(":", "_")
    for path in (root / "build").rglob(f"*.{name}.dev*"):
        path.unlink()
    kept = kept_images(str(root / "build" / "prog"))
    if kept is not None:
        for path in Path(kept.slot).glob(f"*.{name}.*"):
            path.unlink()


def cmake_up_to_date(root: Path) -> bool:
    """Ninja's dry run of a configured tree has no work to do (nothing would run, no regeneration either)."""
    done = subprocess.run([NINJA, "-C", str(root / "build"), "-n"], capture_output=True, text=True, check=True,
                          env=cmake_environ())
    return "no work to do" in done.stdout


def added_target(archs: list[str]) -> str:
    """The target the add-a-target rows add to ``archs`` (the first N of the model's list): the next one of that
    list (``--targets``), else the first of :data:`SCALE_TARGETS` and gfx1100 not among them."""
    following = MODEL_TARGETS[MODEL][len(archs):]
    return following[0] if following else next(target for target in [*SCALE_TARGETS, "gfx1100"]
                                                if target not in archs)


def cmake_rows(scratch: Path, sources: int, targets: int, repeat: int, no_op_only: bool,
               generated: bool = False) -> list[Row]:
    """``--cmake``: the CMake+Ninja rows of one point, each side's tree compiled for real (no generated trees:
    Ninja records each command in its log, so only real builds leave a tree up to date). The no-op is
    ``cmake --build`` of an up-to-date tree (Ninja's regeneration check and its stat of every node); the clean
    build is ``cmake --build --target clean`` (not timed) and the build, in interleaved rounds (with many small
    sources it shows what each phase command's own start-up costs); adding a target is the reconfigure with one
    more target (``-DOFFLOAD_ARCHS``) and the build, both timed."""
    archs = MODEL_TARGETS[MODEL][:targets]
    added = added_target(archs)
    roots = {mode: scratch / f"cmake-{mode}-{sources}x{targets}" for mode in ("ours", "mono")}
    full = {}
    for mode, root in roots.items():
        cmake_tree(root, sources)
        cmake_configure(root, mode, archs, generated)
        if generated:
            cmake_generated_build(root, mode)
        else:
            full[mode] = cmake_build(root)

    def noop(mode: str, root: Path) -> float:
        cmake_build(root)  # up to date (after an add-a-target round too)
        return cmake_build(root)

    rows: list[Row] = []
    if full:  # one build each, one after the other (not interleaved rounds)
        rows.append(("CMake+Ninja: full build, -j2 (one)", {**full, "ratio": full["ours"] / full["mono"]}))
    rows.append(("CMake+Ninja: no-op rebuild, -j2", best(roots, repeat, noop)))
    if not no_op_only and not generated:
        def clean_build(mode: str, root: Path) -> float:
            subprocess.run([CMAKE, "--build", str(root / "build"), "--target", "clean"], check=True,
                           stdout=subprocess.DEVNULL, env=cmake_environ())
            return cmake_build(root)
        rows.append(("CMake+Ninja: clean build, -j2", best(roots, repeat, clean_build)))

        def add(mode: str, root: Path) -> float:
            cmake_configure(root, mode, archs)
            cmake_build(root)
            forget_target(root, added)
            return cmake_configure(root, mode, [*archs, added]) + cmake_build(root)
        rows.append((f"CMake+Ninja: add {added} + reconfigure, -j2", best(roots, repeat, add)))
    for root in roots.values():
        shutil.rmtree(root)
    return rows


#: The scale points' memory row (MB, not seconds: not in the plot).
PEAK_MEMORY_ROW = "no-op peak memory (MB), one run"


def print_table(title: str, rows: list[Row], file=None) -> None:
    print(f"\n{title}", file=file)
    print(f"{'scenario':<44} {'ours (s)':>9} {'mono (s)':>9} {'ours/mono':>10} {'median':>7}", file=file)
    for name, times in rows:
        digits = 1 if name == PEAK_MEMORY_ROW else 2
        print(f"{name:<44} {times['ours']:>9.{digits}f} {times['mono']:>9.{digits}f}"
              f" {times['ours'] / times['mono']:>10.2f} {times['ratio']:>7.2f}", file=file)


def plot(results: dict[tuple[int, int], list[Row]], path: Path) -> bool:
    """No-op and edit-loop times against sources x targets, both sides (False: matplotlib is missing)."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for prefix, label, style in (("no-op", "no-op", "o"), ("edit", "edit one kernel, rebuild", "s")):
        for side, line in (("ours", "-"), ("mono", "--")):
            points = sorted((s * t, times[side]) for (s, t), rows in results.items()
                            for name, times in rows if name.startswith(prefix) and name != PEAK_MEMORY_ROW)
            if points:
                axes.plot(*zip(*points), line + style, label=f"{label}: {'ours' if side == 'ours' else 'driver'}")
    axes.set_xscale("log")
    axes.set_yscale("log")
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    points = sorted(results)
    axes.set_xticks([s * t for s, t in points], labels=[f"{s}x{t}" for s, t in points])
    axes.xaxis.set_minor_formatter(NullFormatter())
    axes.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axes.yaxis.set_major_formatter(ScalarFormatter())
    axes.yaxis.set_minor_formatter(NullFormatter())
    axes.set_xlabel("sources x targets (log scale)")
    axes.set_ylabel("wall time (s), SCons -j2")
    axes.set_title("bench_build --scale: ours vs the monolithic driver")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return True


def parse_points(text: str) -> list[tuple[int, int]]:
    points = []
    for item in text.split(","):
        sources, _, targets = item.partition("x")
        most = max(len(targets) for targets in MODEL_TARGETS.values())
        if not (sources.isdigit() and targets.isdigit()) or not 1 <= int(targets) <= most:
            raise argparse.ArgumentTypeError(f"{item!r}: expected <sources>x<targets>, targets 1-{most}")
        points.append((int(sources), int(targets)))
    return points


def scale(args: argparse.Namespace) -> int:
    results: dict[tuple[int, int], list[Row]] = {}
    with tempfile.TemporaryDirectory(prefix="offload-bench-") as scratch:
        for sources, targets in args.points:
            real = not args.no_op_only and sources <= args.real_up_to
            rows = [] if args.cmake_only else scale_point(Path(scratch), sources, targets, args.repeat, real)
            if args.cmake or args.cmake_only:
                rows += cmake_rows(Path(scratch), sources, targets, args.repeat, args.no_op_only,
                                   generated=sources > args.real_up_to)
            results[sources, targets] = rows
            # Each point as it is done (flushed): a large point takes hours, and the table below comes last.
            print_table(f"{sources} x {targets}: done", rows)
            sys.stdout.flush()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    header = (f"bench_build --scale, {os.cpu_count()} CPUs; best of {args.repeat} interleaved rounds, and the median of"
              f" the rounds' ratios;{'' if MODEL == 'openmp' else f' {MODEL} kernels;'}"
              f" targets: the first N of {','.join(MODEL_TARGETS[MODEL])};"
              f" decider: {args.decider or 'SCons default (content)'}"
              f"{'; ours with OFFLOAD_IMAGE_GROUPS' if args.groups else ''}"
              f"{f'; each kernel includes a chain of {HEADERS} headers' if HEADERS else ''}"
              f"{CMAKE_HEADER if args.cmake or args.cmake_only else ''}")
    with open(args.output_dir / "scale.txt", "w") as table:
        for out in (sys.stdout, table):
            print(f"$ {Path(sys.executable).name} bench/bench_build.py {' '.join(sys.argv[1:])}", file=out)
            print(header, file=out)
            for (sources, targets), rows in results.items():
                real = sources <= args.real_up_to and (args.cmake_only or not args.no_op_only)
                what = "sources + main.cpp" if MODEL == "openmp" else f"{MODEL} sources"
                print_table(f"{sources} {what} x {targets} targets"
                            f" ({'compiled' if real else 'generated tree, see --help'})", rows, out)
    print(f"\ntable: {args.output_dir / 'scale.txt'}")
    if args.cmake_only:
        print("no plot: --cmake-only (the plot shows the SCons rows)")
    elif plot(results, args.output_dir / "scale.png"):
        print(f"plot: {args.output_dir / 'scale.png'}")
    else:
        print("no plot: matplotlib is not installed (pip install '.[bench]')")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=8, help="synthetic kernel sources (plus main.cpp)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds per cell (the modes take turns)")
    parser.add_argument("--scale", action="store_true", help="measure growth with sources x targets instead")
    parser.add_argument("--points", type=parse_points, default=parse_points("8x4,64x4,256x8"),
                        help="--scale: <sources>x<targets>,... (default 8x4,64x4,256x8)")
    parser.add_argument("--real-up-to", type=int, default=64,
                        help="--scale: compile points up to this many sources; generate larger ones (default 64)")
    parser.add_argument("--no-op-only", action="store_true", help="--scale: only the no-op, every point generated")
    parser.add_argument("--output-dir", type=Path, default=Path(__file__).parent / "results",
                        help="--scale: where scale.txt and scale.png go (default bench/results)")
    parser.add_argument("--decider", choices=("content", "content-timestamp", "timestamp-newer", "timestamp-match"),
                        help="env.Decider(...) on both sides (default: SCons' own, content); content-timestamp"
                             " hashes only files whose time stamp changed")
    parser.add_argument("--groups", action="store_true",
                        help="our side links with OFFLOAD_IMAGE_GROUPS (one image per group of sources and target;"
                             " not with generated --scale points)")
    parser.add_argument("--headers", type=int, default=0,
                        help="each kernel source includes a chain of this many headers (default 0)")
    parser.add_argument("--model", choices=tuple(MODEL_TARGETS), default="openmp",
                        help="the sources' offload model (default openmp); hip and cuda: --scale --no-op-only only,"
                             " kernels built into objects (CUDA's driver side: Clang 22)")
    parser.add_argument("--cmake", action="store_true",
                        help="--scale: also the CMake+Ninja rows (no-op; without --no-op-only add-a-target too): our"
                             " CMake module against CMake driving the one-command driver, trees compiled for real")
    parser.add_argument("--cmake-only", action="store_true", help="--scale: the CMake+Ninja rows alone")
    parser.add_argument("--targets", type=lambda text: [word for word in text.split(",") if word],
                        help="--scale: the points' targets in order, instead of the model's list; the one after a"
                             " point's N is the target its add-a-target rows add (a compiled 256 x 8 point without"
                             " AMDGPU targets, whose Clang 19 device links of 256 kernels run 20-40 minutes each:"
                             " sm_80,sm_90,sm_75,sm_86,sm_70,sm_89,sm_87,sm_72,sm_61)")
    args = parser.parse_args(argv)
    if args.targets:
        if not args.scale:
            parser.error("--targets: only with --scale")
        MODEL_TARGETS[args.model] = args.targets
    if (args.cmake or args.cmake_only) and not (args.scale and args.model == "openmp"):
        parser.error("--cmake, --cmake-only: only with --scale and the openmp model")
    if args.model != "openmp" and not (args.scale and args.no_op_only and not args.groups and not args.headers):
        parser.error(f"--model {args.model}: only with --scale --no-op-only (and neither --groups nor --headers)")
    for sources, targets in args.points:
        if targets > len(MODEL_TARGETS[args.model]):
            parser.error(f"--points {sources}x{targets}: the {args.model} model has {len(MODEL_TARGETS[args.model])}"
                         f" targets ({','.join(MODEL_TARGETS[args.model])})")
    global DECIDER, OURS_MODE, HEADERS, MODEL
    DECIDER = args.decider
    HEADERS = args.headers
    MODEL = args.model
    OURS_MODE = "groups" if args.groups else "ours"
    if args.scale:
        return scale(args)
    with tempfile.TemporaryDirectory(prefix="offload-bench-") as scratch:
        roots = {}
        for mode in ("ours", "mono"):
            roots[mode] = Path(scratch) / mode
            generate(roots[mode], args.sources)
        tables = {"compile only (up to the fat objects)": measure(roots, args.repeat, "objects"),
                  "whole program (ours: our link nodes; mono: the driver link through clang-linker-wrapper)":
                  measure(roots, args.repeat)}
    print(f"{args.sources} kernel sources + main.cpp, targets {','.join(BASE_TARGETS)}, {os.cpu_count()} CPUs;"
          f" best of {args.repeat} interleaved rounds, and the median of the rounds' ratios"
          f"{'; ours with OFFLOAD_IMAGE_GROUPS' if args.groups else ''}"
          f"{f'; each kernel includes a chain of {HEADERS} headers' if HEADERS else ''}")
    for title, rows in tables.items():
        print_table(title, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
