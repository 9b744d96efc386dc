"""What a build really runs: every process SCons starts, counted from an exec trace, and the fat objects
compared byte for byte with the one-command driver's.

``test_scons_tool.py`` counts commands by their ``$OFFLOAD_<PHASE>COMSTR`` labels, which cannot see a
command an action runs without a label (a device action that quietly runs the host front end again).
Here ``strace -f -e trace=execve`` records every program started, and each is classified by its own
arguments (a ``-cc1`` job with ``-fopenmp-is-target-device`` is a device compile, ...). A label cannot
say what flags a compile used either, so the objects SCons builds are compared with the driver's.
"""
from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import driver_library_flags
from offload_builders.targets import parse_offload_archs
from test_scons_tool import SCONS, Build, Project

pytestmark = pytest.mark.slow

ARCHS = "archs=x86_64,sm_80,gfx90a"

#: Processes that are not ours to count: SCons' own compiler detection for its default tools.
SCONS_DETECTION = {("gcc", "--version"), ("g++", "--version")}


@dataclass(frozen=True)
class Process:
    """One successful ``execve`` of the trace."""

    path: str
    argv: tuple[str, ...]

    @property
    def program(self) -> str:
        return os.path.basename(self.path)

    def option(self, name: str) -> str | None:
        """The value after ``name`` (``-target-cpu gfx90a``), or None."""
        args = self.argv
        return next((args[i + 1] for i in range(len(args) - 1) if args[i] == name), None)

    @property
    def kind(self) -> str:
        """The phase the process belongs to, read from its arguments alone (not from any label)."""
        args, program = self.argv, self.program
        if "-###" in args or (program.startswith("clang") and args[1:] in (("--version",), ("-print-resource-dir",))):
            return "probe"  # the driver asked about the toolchain or a command line
        if any("/offload-nvptx-probe-" in a for a in args):
            return "probe"  # which cubin ELF ABI the NVPTX tools write (offload_builders.nvptx_tools)
        if "-cc1" in args:
            if "-fopenmp-is-target-device" in args:
                return "device compile"
            if any(a.startswith("-fembed-offload-object=") for a in args):
                return "embed"
            if "-emit-llvm-bc" in args:
                return "host front end"
            return "other -cc1"
        if program == "ptxas":
            if "--gpu-name" in args:
                return "assemble"
            return "device runtime: ptxas" if any(a.endswith("devicertl.s") for a in args) else "device link: ptxas"
        if program == "clang-nvlink-wrapper" and "--lto-emit-asm" in args:
            return "device runtime: LTO"  # the NVPTX device runtime's own node (offload_builders.linking.nvptx_runtime)
        if program in ("clang-nvlink-wrapper", "nvlink"):
            return f"device link: {program}"
        if program == "ld.lld":
            return "device link: ld.lld" if any(".img" in a for a in args) else "host link"
        if program == "clang-offload-packager":
            return "package"
        if program.startswith("python") and "-c" in args and "llvmlite" in args[-1]:
            return "bitcode reader"  # formats.containers' child for LLVM bitcode: kept by a per-user cache
        if program.startswith("clang"):
            return f"driver ({program})"
        return f"other ({program})"

    @property
    def target(self) -> str:
        """The offload target of a device compile: its ``-target-cpu`` (the host CPU device has none)."""
        triple = self.option("-triple") or ""
        return self.option("-target-cpu") if triple.startswith(("amdgcn", "nvptx")) else triple.split("-")[0]


_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
_EXECVE = re.compile(r'^(?:(\d+\.\d+) )?execve\("((?:[^"\\]|\\.)*)", \[(.*)\], ')
_UNNAMED = re.compile(r'^(?:\d+\.\d+ )?\?\?\?\(')


def _unescape(text: str) -> str:
    return text.encode("latin-1", "backslashreplace").decode("unicode_escape")


def read_trace(prefix: Path) -> list[Process]:
    """The programs ``strace -ff -o prefix`` saw started (one file per process, so no line of one is cut
    by another's), in the order they started: by ``strace -ttt``'s time stamp where the trace has one
    (process ids wrap around on a busy machine, so the first program need not have the smallest id), else
    by process id. A process that ``exec``s again (a script such as the CUDA 12 tools' ``nvlink``, which
    execs Python) is one process, named by its first program."""
    started: list[tuple[float, int, Process]] = []
    for log in prefix.parent.glob(prefix.name + ".*"):
        for line in log.read_text(errors="replace").splitlines():
            if _UNNAMED.match(line):
                continue  # a thread caught mid-syscall as its process ended or exec'd: strace cannot name it
            match = _EXECVE.match(line)
            assert match, f"unexpected strace line in {log}: {line[:200]}"
            argv = tuple(_unescape(arg) for arg in _STRING.findall(match.group(3)))
            when = float(match.group(1)) if match.group(1) else 0.0
            started.append((when, int(log.suffix[1:]), Process(_unescape(match.group(2)), argv)))
            break
    return [process for _, _, process in sorted(started, key=lambda entry: entry[:2])]


@dataclass
class TracedBuild:
    build: Build
    processes: list[Process]  # every process the build started, except SCons itself and its detection

    def kinds(self, *, ignore: tuple[str, ...] = ("bitcode reader",)) -> collections.Counter:
        return collections.Counter(p.kind for p in self.processes if p.kind not in ignore)

    def of_kind(self, kind: str) -> list[Process]:
        return [p for p in self.processes if p.kind == kind]


@pytest.fixture
def strace() -> str:
    found = shutil.which("strace")
    if not found:
        pytest.fail("strace is missing: run scripts/bootstrap (it installs it) or apt-get install strace")
    return found


@pytest.fixture
def traced(tmp_path, strace):
    """Run scons in a project under ``strace -f``; the per-user caches start empty for each test, so
    which probes a build runs does not depend on the tests before it."""
    env = dict(os.environ, OFFLOAD_BUILDERS_CACHE_DIR=str(tmp_path / "user-cache"))
    runs = iter(range(1000))

    def run(project: Project, *args: str) -> TracedBuild:
        log = tmp_path / f"trace{next(runs)}" / "pid"
        log.parent.mkdir()
        done = subprocess.run([strace, "-ff", "-ttt", "-qq", "-v", "-s", "65536", "-e", "trace=execve",
                               "-e", "status=successful", "-e", "signal=none", "-o", str(log), SCONS, "-Q", *args],
                              cwd=project.root, capture_output=True, text=True, env=env, check=False)
        build = Build(done.returncode, done.stdout + done.stderr)
        assert done.returncode == 0, build.output
        processes = read_trace(log)
        assert [p.path for p in processes].count(SCONS) == 1, processes
        started = [p for p in processes if p.path != SCONS and (p.program, *p.argv[1:]) not in SCONS_DETECTION]
        return TracedBuild(build, started)

    return run


@pytest.fixture
def project(tmp_path) -> Project:
    return Project(tmp_path / "proj")


def test_a_full_build_starts_each_phase_once_per_node(project, traced):
    """Two sources, three targets: one host front end per source, never one per target."""
    built = traced(project, ARCHS)
    assert built.kinds(ignore=("bitcode reader", "probe")) == {
        "host front end": 2, "device compile": 6, "assemble": 2, "embed": 2,
        # the program: x86_64 and gfx90a through ld.lld; sm_80: the device runtime's node (LTO, ptxas: main.cpp's
        # generic kernel calls into it), then clang-nvlink-wrapper runs nvlink alone
        "device link: ld.lld": 2, "device runtime: LTO": 1, "device runtime: ptxas": 1,
        "device link: clang-nvlink-wrapper": 1, "device link: nvlink": 1, "host link": 1,
    }, built.processes
    compiled = collections.Counter((p.option("-main-file-name"), p.target) for p in built.of_kind("device compile"))
    assert compiled == {(source, target): 1 for source in ("main.cpp", "scale.cpp")
                        for target in ("x86_64", "sm_80", "gfx90a")}
    assert all(p.option("-main-file-name") in ("main.cpp", "scale.cpp") for p in built.of_kind("host front end"))


def test_a_no_op_rebuild_starts_no_process(project, traced):
    traced(project, ARCHS)
    again = traced(project, ARCHS)
    assert "is up to date" in again.build.output
    assert again.processes == []  # no probe, no compile, no link, not even the bitcode reader


def test_adding_a_target_starts_only_that_targets_processes(project, traced):
    traced(project, ARCHS)
    added = traced(project, ARCHS + ",sm_90")
    assert added.kinds(ignore=("bitcode reader", "probe")) == {
        "device compile": 2, "assemble": 2, "embed": 2, "device runtime: LTO": 1, "device runtime: ptxas": 1,
        "device link: clang-nvlink-wrapper": 1, "device link: nvlink": 1, "host link": 1,
    }, added.processes
    assert {p.target for p in added.of_kind("device compile")} == {"sm_90"}
    assert {p.option("--gpu-name") for p in added.of_kind("assemble")} == {"sm_90"}
    # The driver is asked only about the new target (its compile and its device link).
    probes = added.of_kind("probe")
    assert probes and all(any("sm_90" in a for a in p.argv) for p in probes), probes


def test_an_nvptx_device_code_edit_relinks_with_nvlink_alone(project, traced):
    """Editing one source's device code: its host front end, device compile, ptxas and embed, then the device
    link, which is nvlink alone. The device runtime's LTO and ptxas (main.cpp's generic kernel calls into the
    runtime) do not run again: what the cubins take from the runtime did not change."""
    traced(project, "archs=sm_80")
    scale = project.root / "src" / "scale.cpp"
    scale.write_text(scale.read_text().replace("x[i] *= factor * SCALE_ONE;", "x[i] = x[i] * factor + 1e-300;"))
    edited = traced(project, "archs=sm_80")
    assert edited.kinds(ignore=("bitcode reader", "probe")) == {
        "host front end": 1, "device compile": 1, "assemble": 1, "embed": 1,
        "device link: clang-nvlink-wrapper": 1, "device link: nvlink": 1, "host link": 1,
    }, edited.processes
    assert [p.option("-main-file-name") for p in edited.of_kind("device compile")] == ["scale.cpp"]


def test_the_nvptx_device_runtime_links_again_when_the_cubins_need_other_symbols(project, traced):
    """Whether main.cpp's kernel needs the runtime at link time (a generic kernel) or not (``target parallel``,
    SPMD) changes what the cubins take from it: the runtime's node runs again, and links only when needed."""
    traced(project, "archs=sm_80")
    main = project.root / "src" / "main.cpp"
    generic = main.read_text()
    main.write_text(generic.replace("#pragma omp target map(", "#pragma omp target parallel num_threads(1) map("))
    spmd = traced(project, "archs=sm_80").kinds(ignore=("bitcode reader", "probe"))
    assert not any(kind.startswith("device runtime") or kind == "device link: ptxas" for kind in spmd), spmd
    assert spmd["device link: nvlink"] == 1
    main.write_text(generic)
    again = traced(project, "archs=sm_80").kinds(ignore=("bitcode reader", "probe"))
    assert (again["device runtime: LTO"], again["device runtime: ptxas"], again["device link: nvlink"]) == (1, 1, 1)
    assert "device link: ptxas" not in again, again


def test_removing_a_target_starts_no_compile_and_no_probe(project, traced):
    traced(project, ARCHS)
    removed = traced(project, "archs=x86_64,gfx90a")
    assert removed.kinds(ignore=("bitcode reader",)) == {"embed": 2, "host link": 1}, removed.processes


# --------------------------------------------------------------------------------------------------
# The fat objects: byte for byte the driver's
# --------------------------------------------------------------------------------------------------
#: What the project's SConstruct passes to every compile (test_scons_tool.SCONSTRUCT).
PROJECT_FLAGS = ("-O1", "-Iinclude")


@pytest.mark.parametrize("archs", ["x86_64", "gfx90a,sm_80", "sm_90,gfx90a:xnack+,gfx942"])
def test_fat_objects_are_byte_identical_to_the_one_command_driver(project, archs):
    """SCons compiles ``src/<stem>.cpp`` from the project's top directory into ``build/``; the driver
    compiles the same file, from the same directory, into ``driver/`` with the same flags."""
    project.scons(f"archs={archs}", "build/main.o", "build/scale.o")
    if archs == "x86_64":  # the driver takes the host CPU device only as a triple
        selection = ["-fopenmp-targets=x86_64-unknown-linux-gnu"]
    else:
        selection = [f"--offload-arch={archs}", *driver_library_flags(parse_offload_archs(archs), PROJECT_FLAGS)]
    (project.root / "driver").mkdir()
    for stem in ("main", "scale"):
        subprocess.run(["/usr/lib/llvm-19/bin/clang++", "-fopenmp", *selection, *PROJECT_FLAGS, "-c",
                        f"src/{stem}.cpp", "-o", f"driver/{stem}.o"], cwd=project.root, check=True)
        ours = (project.root / "build" / f"{stem}.o").read_bytes()
        assert ours == (project.root / "driver" / f"{stem}.o").read_bytes(), f"build/{stem}.o differs"
