"""The SCons tool end to end, with the real toolchain: incrementality is counted in commands.

Every phase prints ``@@<PHASE> <target>`` through its ``$OFFLOAD_<PHASE>COMSTR``, so a test reads
exactly which nodes a build ran.
"""
from __future__ import annotations

import ast
import collections
import os
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import LLVM19_BIN, REPO_ROOT

pytestmark = pytest.mark.slow

SCONS = str(Path(sys.executable).with_name("scons"))
PHASES = ("HOST", "DEVICE", "ASSEMBLE", "PACKAGE", "EMBED", "EXTRACT", "DEVICELINK", "WRAP", "LINK", "AR")
#: The link of one program: extract and device-link per target, then one wrap and the host link.
LINK_SIDE = ("EXTRACT", "DEVICELINK", "WRAP", "LINK")

SCONSTRUCT = textwrap.dedent("""
    import offload_builders.scons
    env = Environment(
        tools=["default", "offload"],
        toolpath=[offload_builders.scons.toolpath()],
        OFFLOAD_ARCHS=ARGUMENTS.get("archs", "x86_64"),
        CPPPATH=["#include"],
        OFFLOAD_FLAGS=["-O1"],
        # The device link would follow the compile's -O1, where Clang 19's AMDGPU back end crashes on this
        # program (ld.lld, "Function register usage analysis"; `clang++ -O1` linking it crashes the same way).
        OFFLOAD_DEVICE_LINKFLAGS=["-O2"],
    )
    for phase in %(phases)r if not ARGUMENTS.get("commands") else ():
        env["OFFLOAD_%%sCOMSTR" %% phase] = "@@%%s $TARGET" %% phase
    if ARGUMENTS.get("runtime_phases"):  # the NVPTX device runtime's nodes (offload_builders.linking.nvptx_runtime)
        for phase in ("RUNTIMESYMS", "RUNTIMELINK"):
            env["OFFLOAD_%%sCOMSTR" %% phase] = "@@%%s $TARGET" %% phase
    if ARGUMENTS.get("groups"):
        env["OFFLOAD_IMAGE_GROUPS"] = True
    if ARGUMENTS.get("nvptx_runtime_node"):
        env["OFFLOAD_NVPTX_RUNTIME_NODE"] = ARGUMENTS["nvptx_runtime_node"] == "1"
    if ARGUMENTS.get("target_flags"):
        target, _, flags = ARGUMENTS["target_flags"].partition("=")
        env["OFFLOAD_TARGET_FLAGS"] = {target: flags.split()}
    if ARGUMENTS.get("linkflags"):
        env.Append(LINKFLAGS=ARGUMENTS["linkflags"].split())
    if ARGUMENTS.get("greeting"):  # a define quoted for the shell, the way SCons users write them
        env.Append(CPPDEFINES=[("GREETING", '\\\\"%%s\\\\"' %% ARGUMENTS["greeting"])])
    if ARGUMENTS.get("cxx"):
        env["OFFLOAD_CXX"] = ARGUMENTS["cxx"]
    if ARGUMENTS.get("link_via_driver"):  # the same line, but not our default value: SCons runs it as it is
        env["OFFLOAD_DRIVER_LINKCOM"] = env["OFFLOAD_LINKCOM"]
        env["OFFLOAD_LINKCOM"] = "$OFFLOAD_DRIVER_LINKCOM"
    if ARGUMENTS.get("ccflags"):
        env.Append(CCFLAGS=ARGUMENTS["ccflags"].split())
    if ARGUMENTS.get("package_tool"):
        env["OFFLOAD_PACKAGECOM"] = "$_OFFLOAD_PACKAGE_CMD"
    if ARGUMENTS.get("cache"):
        CacheDir(ARGUMENTS["cache"])
    if ARGUMENTS.get("launcher"):
        env["OFFLOAD_LAUNCHER"] = ARGUMENTS["launcher"]
        env["OFFLOAD_DEVICECOM"] = "$OFFLOAD_LAUNCHER $_OFFLOAD_DEVICE_CC1"
    SConscript("src/SConscript", variant_dir="build", duplicate=False, exports="env")
    if ARGUMENTS.get("check_render"):
        exec(open(ARGUMENTS["check_render"]).read())
""") % {"phases": PHASES}

#: Run inside the SConstruct (before a check that uses it): every phase command action of the program's
#: nodes whose variable is our renderer, with what SCons would render it for.
PHASE_COMMANDS = textwrap.dedent("""
    import SCons.Action
    from offload_builders.scons import actions

    def phase_commands(top="build/prog"):
        seen, stack = set(), [File(top)]
        while stack:
            node = stack.pop()
            if node in seen or not node.has_builder():
                continue
            seen.add(node)
            stack.extend(node.children())
            executor = node.get_executor()
            env_ = executor.get_build_env()
            targets, sources = executor.get_all_targets(), executor.get_all_sources()
            for listed in executor.get_action_list():
                while isinstance(listed, SCons.Action.CommandGeneratorAction):  # OffloadObject's, per suffix
                    listed = SCons.Action.Action(listed.generator(target=targets, source=sources, env=env_,
                                                                  for_signature=False))
                for action in getattr(listed, "list", [listed]):
                    if isinstance(action, actions.PhaseCommandAction) and action.renderer(env_) is not None:
                        yield node, action, targets, sources, env_, executor
""")

#: Run inside the SConstruct: each phase command rendered without Subst must be what SCons' own
#: substitution gives (signature, argv and its shell escaping), for every node of the program.
CHECK_RENDER = PHASE_COMMANDS + textwrap.dedent("""
    import SCons.Action, SCons.Platform.posix
    checked = 0
    for node, action, targets, sources, env_, executor in phase_commands():
        fast = action.get_presig(targets, sources, env_, executor)
        slow = SCons.Action.LazyAction.get_presig(action, targets, sources, env_, executor)
        assert fast == slow, (str(node), fast, slow)
        fast_argv = action.process(targets, sources, env_, executor)[0][0]
        slow_argv = SCons.Action.CommandAction.process(
            action, targets, [SCons.Action.rfile(s) for s in sources], env_, executor)[0][0]
        escape = SCons.Platform.posix.escape
        assert [a.escape(escape) for a in fast_argv] == [a.escape(escape) for a in slow_argv], str(node)
        checked += 1
    print("render-check", checked)
""")

SCONSCRIPT = textwrap.dedent("""
    Import("env")
    env.OffloadProgram("prog", ["main.cpp", "scale.cpp"])
""")

MAIN_CPP = textwrap.dedent("""
    #include "main.hpp"
    #include <cstdio>
    #include <omp.h>
    int main() {
      int on_device = 0;
      #pragma omp target map(from : on_device)
      on_device = !omp_is_initial_device();
      double x[64];
      for (int i = 0; i < 64; ++i) x[i] = i;
      scale(x, 64, FACTOR);
      double sum = 0;
      for (int i = 0; i < 64; ++i) sum += x[i];
      std::printf("on_device=%d sum=%g\\n", on_device, sum);
    #ifdef GREETING
      std::printf("%s\\n", GREETING);
    #endif
      return on_device && sum == FACTOR * 2016 ? 0 : 1;
    }
""")

SCALE_CPP = textwrap.dedent("""
    #include "scale.hpp"
    void scale(double *x, int n, double factor) {
      #pragma omp target teams distribute parallel for map(tofrom : x[0 : n])
      for (int i = 0; i < n; ++i) x[i] *= factor * SCALE_ONE;
    }
""")


@dataclass
class Build:
    returncode: int
    output: str

    @property
    def commands(self) -> list[tuple[str, str]]:
        found = []
        for line in self.output.splitlines():
            if line.startswith("@@"):
                phase, _, target = line[2:].partition(" ")
                found.append((phase, target.strip()))
        return found

    def count(self, phase: str, contains: str = "") -> int:
        return sum(1 for p, t in self.commands if p == phase and contains in t)

    @property
    def by_phase(self) -> collections.Counter:
        return collections.Counter(p for p, _ in self.commands)

    @property
    def retrieved(self) -> list[str]:
        return [line for line in self.output.splitlines() if line.startswith("Retrieved")]


def run_scons(root: Path, *args: str, env: dict[str, str] | None = None, check: bool = True) -> Build:
    """``scons -Q`` in ``root``; unless ``check`` is false, a failed build fails the test with its output."""
    done = subprocess.run([SCONS, "-Q", *args], cwd=root, capture_output=True, text=True,
                          env=env or os.environ.copy())
    build = Build(done.returncode, done.stdout + done.stderr)
    if check:
        assert done.returncode == 0, build.output
    return build


class Project:
    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "src").mkdir(parents=True)
        (root / "include").mkdir()
        (root / "SConstruct").write_text(SCONSTRUCT)
        (root / "src" / "SConscript").write_text(SCONSCRIPT)
        (root / "src" / "main.cpp").write_text(MAIN_CPP)
        (root / "src" / "scale.cpp").write_text(SCALE_CPP)
        (root / "include" / "main.hpp").write_text("void scale(double *, int, double);\n#define FACTOR 3.0\n")
        (root / "include" / "scale.hpp").write_text("#define SCALE_ONE 1.0\n")

    def scons(self, *args: str, env: dict[str, str] | None = None, check: bool = True) -> Build:
        return run_scons(self.root, *args, env=env, check=check)

    def run_program(self) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.root / "build" / "prog")], capture_output=True, text=True,
                              env=dict(os.environ, OMP_TARGET_OFFLOAD="MANDATORY"))


@pytest.fixture
def project(tmp_path) -> Project:
    return Project(tmp_path / "proj")


def test_builds_and_runs_on_the_offload_device(project):
    build = project.scons()
    assert build.by_phase == {"HOST": 2, "DEVICE": 2, "PACKAGE": 2, "EMBED": 2,
                              "EXTRACT": 1, "DEVICELINK": 1, "WRAP": 1, "LINK": 1}
    run = project.run_program()
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout == "on_device=1 sum=6048\n"


def test_image_groups_build_a_program_whose_sconscript_is_in_a_variant_directory(project):
    """The wrap of an image-group program reads the plan node, named as SCons names it at build time (its path
    taken while the SConscript was read, relative to the variant directory, was not found)."""
    build = project.scons("groups=1")
    assert build.count("WRAP") == 1 and build.count("LINK") == 1, build.output
    run = project.run_program()
    assert run.returncode == 0 and run.stdout == "on_device=1 sum=6048\n", run.stdout + run.stderr
    assert project.scons("groups=1").commands == []


def test_no_op_rebuild_runs_no_command(project):
    project.scons("archs=x86_64,sm_80,gfx90a")
    again = project.scons("archs=x86_64,sm_80,gfx90a")
    assert again.commands == []
    assert "is up to date" in again.output


#: Run inside the SConstruct: print each file SCons hashes for its content signature (one it has none for yet).
LOG_HASHES = textwrap.dedent("""
    import SCons.Node.FS
    def _logged_csig(node, _csig=SCons.Node.FS.File.get_csig):
        if not hasattr(node.get_ninfo(), "csig") and not node.get_max_drift_csig():
            print("hashed", node.get_internal_path())
        return _csig(node)
    SCons.Node.FS.File.get_csig = _logged_csig
""")


def _hashed(build: Build) -> list[str]:
    return [line.split(" ", 1)[1] for line in build.output.splitlines() if line.startswith("hashed ")]


def test_a_no_op_hashes_no_output_whose_file_is_the_one_hashed_before(project, tmp_path):
    """SCons hashes every output younger than --max-drift (two days) on each run; our nodes' content
    signatures are recorded with their files' identity (inode, size, modification and change time), so
    once a run has hashed a settled file, the next no-op reads none of the build's outputs, only sources."""
    from offload_builders.content_records import SETTLED_NS

    hook = tmp_path / "log_hashes.py"
    hook.write_text(LOG_HASHES)
    archs = "archs=x86_64,sm_80,gfx90a"
    project.scons(archs)
    time.sleep(SETTLED_NS / 1e9 + 0.2)
    first = project.scons(archs, f"check_render={hook}")
    assert first.commands == [] and "build/scale.host.bc" in _hashed(first), first.output
    assert (project.root / ".sconsign.offload-contents").exists()
    second = project.scons(archs, f"check_render={hook}")
    assert second.commands == [], second.output
    # only the sources and headers (build/*.cpp: the variant directory's name of src/*.cpp, not duplicated)
    assert sorted(_hashed(second)) == ["build/main.cpp", "build/scale.cpp", "include/main.hpp",
                                       "include/scale.hpp"], second.output


def test_an_output_rewritten_in_place_with_its_modification_time_restored_is_hashed_again(project, tmp_path):
    """The change time, which no tool can set, is part of a recorded file's identity: an intermediate changed
    in place (same inode and size, its modification time put back) is hashed again and its consumers rerun."""
    from offload_builders.content_records import SETTLED_NS

    archs = "archs=x86_64,sm_80"
    project.scons(archs)
    time.sleep(SETTLED_NS / 1e9 + 0.2)
    assert project.scons(archs).commands == []  # records the outputs' signatures
    device = project.root / "build" / "scale.x86_64.dev.o"
    before = device.stat()
    data = device.read_bytes()
    assert b"clang version" in data
    with device.open("r+b") as stream:  # the same bytes but for the compiler's name in .comment
        stream.write(data.replace(b"clang version", b"CLANG version"))
    os.utime(device, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = device.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    rebuilt = project.scons(archs)
    assert rebuilt.count("EMBED", "scale.o") == 1 and rebuilt.count("EXTRACT", "x86_64") == 1, rebuilt.output
    assert project.run_program().returncode == 0


def test_content_signatures_recorded_under_one_hash_format_are_not_reused_under_another(project, tmp_path):
    """SCons sets ``--hash-format`` only after reading the SConscripts, so the records' format must be the
    option's, not the hash function in use while reading (always the default): otherwise a build with
    ``--hash-format=sha256`` records its SHA-256 signatures as MD5 ones, and the next default build gives
    them to our nodes, where their consumers' MD5 records cannot match: everything after them reruns. And
    ``--max-drift=-1`` (hash every file, trust no recorded signature) hashes our outputs too."""
    from offload_builders.content_records import SETTLED_NS

    archs = "archs=x86_64"
    for options in ([], ["--hash-format=sha256"]):  # the default (MD5), then SHA-256
        project.scons(archs, *options)  # each format has its own .sconsign: the first build of each builds all
        time.sleep(SETTLED_NS / 1e9 + 0.2)
        assert project.scons(archs, *options).commands == []  # records the settled outputs' signatures
    assert (project.root / ".sconsign_sha256.dblite").exists()
    assert project.scons(archs).commands == []  # the default format: MD5, up to date since its build
    hook = tmp_path / "log_hashes.py"
    hook.write_text(LOG_HASHES)
    sources = ["build/main.cpp", "build/scale.cpp", "include/main.hpp", "include/scale.hpp"]
    assert sorted(_hashed(project.scons(archs, f"check_render={hook}"))) == sources  # and no output
    untrusting = project.scons(archs, "--max-drift=-1", f"check_render={hook}")
    assert untrusting.commands == [] and "build/main.host.bc" in _hashed(untrusting), untrusting.output


#: Run inside the SConstruct, after the SConscripts declared the program: whether the tool's nodes are out of
#: the cyclic garbage collector's generations (``gc.freeze()``), and whether what is made after is not.
CHECK_FROZEN = textwrap.dedent("""
    import gc
    tracked = {id(o) for o in gc.get_objects()}
    node = File("build/scale.o")
    declared = [node, node.get_executor(), node.get_build_env(), File("build/scale.host.bc").get_executor()]
    later = [[]]
    later.append(later)
    print("frozen", gc.get_freeze_count() > 0, [id(o) in tracked for o in declared],
          id(later) in {id(o) for o in gc.get_objects()})
""")


#: A Python program that declares an offload program with the tool, outside the ``scons`` command.
PROGRAM_USING_THE_TOOL = textwrap.dedent("""
    import gc

    import SCons.Environment

    import offload_builders.scons

    env = SCons.Environment.Environment(tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()],
                                        OFFLOAD_ARCHS="x86_64")
    objects = env.OffloadObject("out/k.o", "k.cpp")
    program = env.OffloadProgram("out/prog", objects)
    print("declared", [str(node) for node in objects + program], "frozen", gc.get_freeze_count())
""")


def test_the_declared_graph_is_out_of_the_garbage_collectors_reach(project, tmp_path):
    """The nodes, executors and environments the SConscripts declare live until exit: the tool freezes them
    while the SConscripts are read, so CPython's full collections (one at exit) do not walk the whole graph
    again (0.1-0.25 s of a 1.2-1.5 s no-op at 256 sources x 8 targets, ``bench/bench_build.py``); what is
    made after is collected as before. A Python program that uses the tool outside the ``scons`` command
    freezes nothing (and, where SCons' options all read as None, declares its nodes as before)."""
    hook = tmp_path / "check_frozen.py"
    hook.write_text(CHECK_FROZEN)
    build = project.scons("archs=x86_64", f"check_render={hook}")
    assert "frozen True [False, False, False, False] True" in build.output, build.output
    assert project.run_program().returncode == 0
    program = tmp_path / "declare.py"
    program.write_text(PROGRAM_USING_THE_TOOL)
    (tmp_path / "k.cpp").write_text("int main() { return 0; }\n")
    done = subprocess.run([sys.executable, str(program)], cwd=tmp_path, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    assert done.stdout.strip() == "declared ['out/k.o', 'out/prog'] frozen 0", done.stdout + done.stderr


#: The last commit whose in-process steps (the commit and sweep every node runs, the package, extract, wrap...)
#: SCons signed by their bytecode: every tree, ``CacheDir`` entry and REAPI key it made misses once under the
#: declared versions (offload_builders.scons.versioned_actions). Before it, trees were kept up to date across
#: each change of the nodes' code; since, a node's signature changes only with its command or a step's version.
BEFORE_VERSIONED_ACTIONS = "767601a"


def checkout_of(commit: str, root: Path) -> dict[str, str]:
    """The package as it was at ``commit`` (``git archive`` of this repository) under ``root``; the process
    environment that makes ``scons`` import it."""
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", commit], capture_output=True, check=False)
    if archive.returncode != 0:
        pytest.fail(f"git archive {commit} failed ({archive.stderr.decode().strip()}): the test needs the "
                    "repository's history")
    root.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    return dict(os.environ, PYTHONPATH=str(root))


def with_cuda_12_tools(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` with ``$CUDA_PATH`` at the CUDA 12 tools directory the tool composes (offload_builders.nvptx_tools):
    code from before issue 27 took the OpenMP NVPTX tools from ``$CUDA_PATH``, and this code takes them from
    there when the runtime loads what they write, so both run the same commands (CUDA 13's tools, which the
    earlier code used by default, write images libomptarget 19 cannot load: those trees rebuild once)."""
    from offload_builders import nvptx_tools

    wheels = nvptx_tools.wheel_directories()
    assert wheels is not None, "the CUDA 12 wheels (offload-builders[nvptx]) are missing"
    return dict(env or os.environ, CUDA_PATH=str(nvptx_tools.compose_wheel_tools(*wheels)))


def _lines(build: Build) -> list[str]:
    """The messages and commands a build printed (not SCons' own lines)."""
    return [line for line in build.output.splitlines() if line.strip() and not line.startswith("scons:")]


def _built_files(root: Path) -> dict[str, bytes]:
    """Every file a build wrote under ``root`` (SCons' own state and the probe cache left out)."""
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*"))
            if path.is_file() and not path.name.startswith(".sconsign") and "__pycache__" not in path.parts}


@pytest.mark.parametrize("tree", ["openmp", "openmp image groups", "openmp runtime node", "hip", "cuda"])
def test_a_tree_built_before_versioned_actions_rebuilds_once_then_is_up_to_date(project, tmp_path, llvm19, tree):
    """A tree the code before the declared versions built (OpenMP for the host CPU, NVPTX and AMDGPU, with image
    groups or the NVPTX runtime's nodes; HIP and CUDA objects and programs) reruns every node once: the steps'
    signatures changed, not their commands, so each writes the same bytes; then it is up to date, and SCons'
    question mode agrees."""
    import test_cuda
    from test_hip import Sample

    earlier = checkout_of(BEFORE_VERSIONED_ACTIONS, tmp_path / "earlier")
    openmp = ("archs=x86_64,sm_80,gfx90a",)
    root, args, then, now = {
        "openmp": (project.root, openmp, with_cuda_12_tools(earlier), with_cuda_12_tools()),
        "openmp image groups": (project.root, (*openmp, "groups=1"), with_cuda_12_tools(earlier),
                                with_cuda_12_tools()),
        "openmp runtime node": (project.root, (*openmp, "nvptx_runtime_node=1", "runtime_phases=1"),
                                with_cuda_12_tools(earlier), with_cuda_12_tools()),
        "hip": (tmp_path / "hip", ("program=1",), earlier, None),
        "cuda": (tmp_path / "cuda", (), earlier, None),
    }[tree]
    if tree == "hip":
        Sample(root)
    elif tree == "cuda":
        test_cuda.Project(root, llvm19("clang++"))
    first = run_scons(root, *args, env=then)
    built = _built_files(root)
    upgraded = run_scons(root, *args, env=now)
    # Each of the tool's nodes runs again (SCons' own, a plain Object or Program, need not): what ran is some of
    # what the first build ran, each once.
    ran, reran = collections.Counter(_lines(first)), collections.Counter(_lines(upgraded))
    assert reran and not reran - ran and max(reran.values()) == 1, upgraded.output
    assert _built_files(root) == built
    assert run_scons(root, "-q", *args, env=now, check=False).returncode == 0, root
    again = run_scons(root, *args, env=now)
    assert again.commands == [] and "is up to date" in again.output, again.output


def test_a_dry_run_on_a_clean_tree_prints_every_command(project):
    """``scons -n`` before anything is built: the device links print the driver's job (their inputs, which
    the extract node would unpack, as a pattern) and the dry run succeeds."""
    shown = project.scons("archs=x86_64,sm_80", "commands=1", "-n")
    links = [line for line in shown.output.splitlines() if ".img.partial" in line]
    assert len(links) == 2 and all(".img.inputs/*.o" in line for line in links), shown.output
    assert not (project.root / "build").exists() or not any((project.root / "build").iterdir())


def test_adding_a_target_compiles_only_that_target(project):
    project.scons("archs=x86_64,sm_80,gfx90a")
    added = project.scons("archs=x86_64,sm_80,gfx90a,sm_90")
    assert added.count("HOST") == 0
    assert added.count("DEVICE") == 2 and added.count("DEVICE", ".sm_90.") == 2
    assert added.count("ASSEMBLE") == 2 and added.count("ASSEMBLE", ".sm_90.") == 2
    assert (added.count("PACKAGE"), added.count("EMBED"), added.count("LINK")) == (2, 2, 1)
    # Every target's device files are extracted again (cheap, in-process), but only the new target's
    # image is linked: the others' extracted inputs are byte-identical, so SCons keeps their images.
    assert added.count("EXTRACT") == 4
    assert added.count("DEVICELINK") == 1 and added.count("DEVICELINK", ".sm_90.") == 1
    assert added.count("WRAP") == 1
    assert len(added.commands) == 9 + 4 + 1 + 1
    assert project.run_program().returncode == 0


def test_a_kernel_edit_skips_the_nvptx_device_runtime_node(project):
    """The sm_80 image's device runtime part (its LTO and ptxas) is a node of its own whose inputs are what the
    cubins take from the runtime: a kernel edit reruns the cheap in-process interface node, which writes the
    same bytes, so SCons skips the runtime's link; the image is the one-step device link's, byte for byte."""
    archs = "archs=x86_64,sm_80"
    first = project.scons(archs, "runtime_phases=1")
    assert (first.count("RUNTIMESYMS", ".sm_80."), first.count("RUNTIMELINK", ".sm_80.")) == (1, 1), first.output
    assert first.count("RUNTIMESYMS") == 1  # none for x86_64
    scale = project.root / "src" / "scale.cpp"
    scale.write_text(scale.read_text().replace("x[i] *= factor * SCALE_ONE;", "x[i] = x[i] * factor + 1e-300;"))
    edited = project.scons(archs, "runtime_phases=1")
    assert edited.count("ASSEMBLE") == 1 and edited.count("DEVICELINK", ".sm_80.") == 1
    assert edited.count("RUNTIMESYMS") == 1 and edited.count("RUNTIMELINK") == 0, edited.output
    assert project.run_program().returncode == 0
    image = project.root / "build" / "prog.sm_80.img"
    split = image.read_bytes()
    one_step = project.scons(archs, "runtime_phases=1", "nvptx_runtime_node=0")
    assert one_step.count("DEVICELINK", ".sm_80.") == 1 and "RUNTIME" not in one_step.output
    assert image.read_bytes() == split


def test_the_nvptx_device_runtime_node_depends_on_the_programs_it_runs(project):
    """The runtime's link (its LTO through clang-nvlink-wrapper, then ptxas) names both programs by stamp, as the
    compile nodes do: a CUDA or LLVM update, which rebuilds the user's cubins, relinks the runtime with them,
    although the interface and the runtime's bitcode are unchanged."""
    project.scons("archs=x86_64,sm_80")
    tree = project.scons("archs=x86_64,sm_80", "--tree=prune", "build/prog.sm_80.devicertl.pkg").output
    children = [line for line in tree.splitlines() if line.startswith("  +-")]
    assert any("/ptxas size=" in line for line in children), tree
    assert any("/clang-nvlink-wrapper size=" in line for line in children), tree


def test_device_code_calling_the_nvptx_runtime_links_it_once(project):
    """With ``nvptx_runtime.link_time_runtime_flags()`` the device compiles leave the runtime out, so the cubins
    call it: its node links what they call (seconds of LTO and ptxas) once; a kernel edit runs nvlink alone, and
    the image is still the one-step device link's."""
    from offload_builders.linking.nvptx_runtime import link_time_runtime_flags

    archs, flags = "archs=x86_64,sm_80", "target_flags=sm_80=" + " ".join(link_time_runtime_flags())
    first = project.scons(archs, flags, "runtime_phases=1")
    assert first.count("RUNTIMELINK", ".sm_80.") == 1
    needed = (project.root / "build" / "prog.sm_80.devicertl.syms").read_text()
    assert "__kmpc_parallel_51 U" in needed and "__kmpc_target_init U" in needed, needed
    scale = project.root / "src" / "scale.cpp"
    scale.write_text(scale.read_text().replace("x[i] *= factor * SCALE_ONE;", "x[i] = x[i] * factor + 1e-300;"))
    edited = project.scons(archs, flags, "runtime_phases=1")
    assert edited.count("DEVICELINK", ".sm_80.") == 1 and edited.count("RUNTIMELINK") == 0, edited.output
    assert project.run_program().returncode == 0
    image = project.root / "build" / "prog.sm_80.img"
    split = image.read_bytes()
    project.scons(archs, flags, "runtime_phases=1", "nvptx_runtime_node=0")
    assert image.read_bytes() == split


def test_removing_a_target_compiles_nothing(project):
    project.scons("archs=x86_64,sm_80,gfx90a")
    removed = project.scons("archs=x86_64,gfx90a")
    assert removed.by_phase == {"PACKAGE": 2, "EMBED": 2, "EXTRACT": 2, "WRAP": 1, "LINK": 1}


def test_one_targets_flags_rebuild_only_that_target(project):
    project.scons("archs=x86_64,sm_80,gfx90a")
    changed = project.scons("archs=x86_64,sm_80,gfx90a", "target_flags=gfx90a=-O3")
    assert changed.count("DEVICE") == 2 and changed.count("DEVICE", ".gfx90a.") == 2
    assert changed.count("HOST") == 0 and changed.count("ASSEMBLE") == 0
    assert (changed.count("PACKAGE"), changed.count("EMBED"), changed.count("LINK")) == (2, 2, 1)
    assert changed.count("DEVICELINK") == 1 and changed.count("DEVICELINK", ".gfx90a.") == 1
    # The same per-target flags again: nothing is out of date.
    same = project.scons("archs=x86_64,sm_80,gfx90a", "target_flags=gfx90a=-O3")
    assert same.commands == []


def test_touching_a_header_rebuilds_only_its_sources_nodes(project):
    project.scons("archs=x86_64,sm_80")
    (project.root / "include" / "scale.hpp").write_text("#define SCALE_ONE (2.0 / 2.0)\n")
    rebuilt = project.scons("archs=x86_64,sm_80")
    assert rebuilt.commands, rebuilt.output
    assert all("scale" in target or phase in LINK_SIDE for phase, target in rebuilt.commands), rebuilt.commands
    assert rebuilt.count("HOST") == 1 and rebuilt.count("DEVICE") == 2
    # The new spelling compiles to the same code: the object is byte-identical, so nothing is linked again.
    assert rebuilt.count("LINK") == 0


def test_device_compiles_are_scanned_for_headers(project):
    project.scons("archs=x86_64")
    tree = project.scons("--tree=prune", "build/scale.x86_64.dev.o").output
    assert "include/scale.hpp" in tree


#: Run inside the SConstruct: count SCons' C scanner's reads of each file's includes, printed at exit.
COUNT_SCANS = textwrap.dedent("""
    import atexit, collections, SCons.Tool
    scans = collections.Counter()
    unwrapped_scan = SCons.Tool.CScanner.scan
    def counting_scan(node, path=()):
        scans[node.name] += 1
        return unwrapped_scan(node, path)
    SCons.Tool.CScanner.scan = counting_scan
    atexit.register(lambda: print("scans", sorted(scans.items())))
""")


def test_the_phase_nodes_of_a_source_share_one_walk_through_its_includes(project, tmp_path):
    """A source compiled for three targets has five nodes that SCons scans (host front end, three device
    compiles, the object); SCons would walk its includes once per node's environment (six scans a file).
    The walk is shared: at most twice a build (the no-op included), because SCons empties a file's memo
    when it visits the file itself, which may come between the object's scan and the phase nodes'."""
    counter = tmp_path / "count_scans.py"
    counter.write_text(COUNT_SCANS)
    for build in (project.scons("archs=x86_64,sm_80,gfx90a", f"check_render={counter}"),
                  project.scons("archs=x86_64,sm_80,gfx90a", f"check_render={counter}")):
        scans = dict(ast.literal_eval(build.output.split("scans ", 1)[1].splitlines()[0]))
        assert set(scans) == {"main.cpp", "main.hpp", "scale.cpp", "scale.hpp"}, scans
        assert max(scans.values()) <= 2, scans


GENERATED_HEADER_SCONSCRIPT = textwrap.dedent("""
    Import("env")
    env = env.Clone()
    env.Append(CPPPATH=["#generated"])
    env.Command("#generated/generated.hpp", "#include/generated.hpp.in", Copy("$TARGET", "$SOURCE"))
    env.OffloadProgram("prog", ["main.cpp", "scale.cpp"])
""")


def test_a_file_only_a_generated_header_includes_is_a_dependency_of_every_phase_node(project):
    """The phase nodes of a source share one walk through its includes (SharedSourceScanner), but not through
    a header some node builds: SCons walks that one once it is built. From the first build on, a file only
    the generated header includes is a dependency of the host front end and of every device compile."""
    root = project.root
    (root / "src" / "SConscript").write_text(GENERATED_HEADER_SCONSCRIPT)
    (root / "src" / "scale.cpp").write_text('#include "generated.hpp"\n' + SCALE_CPP)
    (root / "include" / "generated.hpp.in").write_text('#include "deep.hpp"\n')
    (root / "include" / "deep.hpp").write_text("#define DEEP_ONE 1\n")
    project.scons("archs=x86_64,sm_80")
    assert project.scons("archs=x86_64,sm_80").commands == []  # the walk after generating was recorded
    (root / "include" / "deep.hpp").write_text("#define DEEP_ONE (2 - 1)\n")
    rebuilt = project.scons("archs=x86_64,sm_80")
    assert rebuilt.count("HOST") == 1 and rebuilt.count("DEVICE") == 2, rebuilt.output
    assert all("scale" in target or phase in LINK_SIDE for phase, target in rebuilt.commands), rebuilt.commands
    for node in ("build/scale.x86_64.dev.o", "build/scale.sm_80.dev.cubin.o", "build/scale.host.bc"):
        assert "include/deep.hpp" in project.scons("archs=x86_64,sm_80", "--tree=prune", node).output, node


def test_unsigned_flags_do_not_rebuild(project):
    project.scons()
    again = project.scons("ccflags=-fcolor-diagnostics")
    assert again.commands == []


def test_cache_dir_gives_back_every_node_and_per_target_hits(project, tmp_path):
    cache = f"cache={tmp_path / 'cache'}"
    project.scons("archs=x86_64,sm_80,gfx90a", cache)
    project.scons("-c", "archs=x86_64,sm_80,gfx90a", cache)
    assert not (project.root / "build" / "prog").exists()
    again = project.scons("archs=x86_64,sm_80,gfx90a", cache)
    assert again.commands == [], again.output
    # per source the host bitcode, 3 device nodes (sm_80's with its ptxas) and the object; per target extract and
    # image; sm_80's device runtime interface (two files) and link; wrapper and program
    assert len(again.retrieved) == 2 * (1 + 3 + 1) + 3 * 2 + 3 + 1 + 1, again.retrieved
    # A build for a subset of the targets takes every device node from the cache.
    project.scons("-c", "archs=x86_64,sm_80,gfx90a", cache)
    subset = project.scons("archs=x86_64,gfx90a", cache)
    assert subset.count("HOST") == 0 and subset.count("DEVICE") == 0, subset.output
    assert any("gfx90a.dev.bc" in line for line in subset.retrieved)
    assert project.run_program().returncode == 0


@pytest.mark.parametrize("variable", ["OFFLOAD_TARGET_FLAGS", "OFFLOAD_TARGET_LINKFLAGS"])
def test_target_flag_keys_that_match_no_target_are_a_warning(project, variable):
    """A key for another spelling of a target (``gfx90a:xnack+`` while building ``gfx90a``) or for a target
    not in this build: one warning naming the key, the targets and the likely one; the build goes on."""
    table = '{"gfx90a:xnack+": ["-O3"], "sm_90": ["-O3"], "x86_64": []}'
    (project.root / "SConstruct").write_text(project.root.joinpath("SConstruct").read_text().replace(
        "SConscript(", f'env["{variable}"] = {table}\nSConscript('))
    build = project.scons("archs=x86_64,gfx90a")
    warnings = [line for line in build.output.splitlines() if "matches no target" in line]
    assert len(warnings) == 2, build.output
    xnack, sm_90 = sorted(warnings)
    assert f"{variable} key 'gfx90a:xnack+'" in xnack and "(gfx90a, x86_64)" in xnack
    assert "did you mean 'gfx90a'" in xnack
    assert f"{variable} key 'sm_90'" in sm_90 and "did you mean" not in sm_90
    assert project.run_program().returncode == 0


@pytest.mark.parametrize("flag", ["--offload-arch=sm_80", "-fopenmp-targets=nvptx64-nvidia-cuda"])
def test_target_selection_in_the_compile_flags_is_one_clear_error(project, flag):
    failed = project.scons(f"ccflags={flag}", check=False)
    assert failed.returncode != 0 and failed.commands == []
    errors = [line for line in failed.output.splitlines() if line.startswith("scons: ***")]
    assert len(errors) == 1 and flag in errors[0] and "belong in $OFFLOAD_ARCHS" in errors[0], failed.output
    assert "Traceback" not in failed.output


@pytest.mark.parametrize("archs, expected", [
    ("x86_64,gfx9999", "unknown"),
    ("x86_64,sm_80,gfx90a:xnack", "gfx90a:xnack"),
    ("gfx90a:foo+", "foo"),
    ("gfx90a,gfx90a:xnack+", "'gfx90a' and 'gfx90a:xnack+'"),
    ("gfx908:sramecc+:xnack+,gfx908:xnack+", "'gfx908:sramecc+:xnack+' and 'gfx908:xnack+'"),
])
def test_bad_target_ids_fail_before_any_compile(project, archs, expected):
    failed = project.scons(f"archs={archs}", check=False)
    assert failed.returncode != 0
    assert failed.commands == []
    assert "OFFLOAD_ARCHS" in failed.output and expected in failed.output
    assert "Traceback" not in failed.output
    assert not (project.root / "build").exists() or not any((project.root / "build").iterdir())


def test_missing_toolchain_fails_before_any_compile(project):
    env = dict(os.environ, OFFLOAD_CLANG="/nonexistent/clang-19")
    failed = project.scons(env=env, check=False)
    assert failed.returncode != 0 and failed.commands == []
    assert "/nonexistent/clang-19" in failed.output and "apt-get install clang-19" in failed.output
    assert "Traceback" not in failed.output


def test_missing_ptxas_fails_before_any_compile(project, tmp_path):
    env = dict(os.environ, CUDA_PATH=str(tmp_path / "no-cuda"), PATH="/usr/bin:/bin")
    failed = project.scons("archs=x86_64,sm_80", env=env, check=False)
    assert failed.returncode != 0 and failed.commands == []
    assert "ptxas" in failed.output and "CUDA" in failed.output


def test_a_failed_compile_leaves_no_output_that_looks_up_to_date(project):
    project.scons()
    good = (project.root / "src" / "scale.cpp").read_text()
    (project.root / "src" / "scale.cpp").write_text(good + "\nthis is not C++;\n")
    failed = project.scons(check=False)
    assert failed.returncode != 0
    assert not (project.root / "build" / "scale.host.bc").exists()
    assert not list((project.root / "build").glob("*.partial"))
    (project.root / "src" / "scale.cpp").write_text(good)
    fixed = project.scons()
    assert fixed.count("HOST") == 1
    assert project.run_program().returncode == 0


def test_program_matches_the_one_command_driver_build(project):
    project.scons()
    ours = project.run_program()
    mono = project.root / "mono"
    subprocess.run(["clang++-19", "-fopenmp", "-fopenmp-targets=x86_64-unknown-linux-gnu", "-O1",
                    "-Iinclude", "src/main.cpp", "src/scale.cpp", "-o", str(mono)],
                   cwd=project.root, check=True)
    theirs = subprocess.run([str(mono)], capture_output=True, text=True,
                            env=dict(os.environ, OMP_TARGET_OFFLOAD="MANDATORY",
                                     LD_LIBRARY_PATH="/usr/lib/llvm-19/lib"))
    assert (ours.returncode, ours.stdout) == (theirs.returncode, theirs.stdout) == (0, "on_device=1 sum=6048\n")


def test_static_library_of_fat_objects(project):
    (project.root / "src" / "SConscript").write_text(textwrap.dedent("""
        Import("env")
        lib = env.OffloadStaticLibrary("scale", ["scale.cpp"])
        env.OffloadProgram("prog", ["main.cpp"], LIBS=[lib])
    """))
    build = project.scons("archs=x86_64")
    assert build.count("AR") == 1
    assert project.run_program().returncode == 0


def test_site_scons_shim_loads_the_tool(project):
    site = project.root / "site_scons" / "site_tools"
    site.mkdir(parents=True)
    shutil.copytree(REPO_ROOT / "site_scons" / "site_tools" / "offload", site / "offload")
    (project.root / "SConstruct").write_text(
        SCONSTRUCT.replace("toolpath=[offload_builders.scons.toolpath()],", "")
                  .replace('tools=["default", "offload"]', 'tools=["default"]')
                  .replace("SConscript(", 'env.Tool("offload")\nSConscript(')
    )
    build = project.scons()
    assert build.count("LINK") == 1
    assert project.run_program().returncode == 0


def test_generate_keeps_what_the_user_set(project):
    (project.root / "SConstruct").write_text(textwrap.dedent("""
        import offload_builders.scons
        env = Environment(tools=["default"], OFFLOAD_ARCHS="sm_80", OFFLOAD_LINKFLAGS=["-Wl,-O1"],
                          OFFLOAD_DEVICECOMSTR="mine", OFFLOAD_RPATH=[])
        env.Tool("offload", toolpath=[offload_builders.scons.toolpath()])
        print("ARCHS=%s LINKFLAGS=%s COMSTR=%s RPATH=%s" % (env["OFFLOAD_ARCHS"], env["OFFLOAD_LINKFLAGS"],
              env["OFFLOAD_DEVICECOMSTR"], env["OFFLOAD_RPATH"]))
    """))
    output = project.scons("-n").output
    assert "ARCHS=sm_80 LINKFLAGS=['-Wl,-O1'] COMSTR=mine RPATH=[]" in output


def test_link_runs_no_clang_linker_wrapper(project):
    """The driver's ``-v`` prints every process it starts: the host link must not start the wrapper."""
    build = project.scons("linkflags=-v")
    link_output = build.output[build.output.index("@@LINK"):]
    assert "ld.lld" in link_output
    assert "clang-linker-wrapper" not in build.output
    assert project.run_program().returncode == 0


def test_the_host_link_runs_the_drivers_linker_job(project, tmp_path):
    """Our default ``$OFFLOAD_LINKCOM`` runs the driver's own ``ld.lld`` job, asked once with ``-###`` and
    kept in the probe cache, and links the same program the driver does."""
    log = tmp_path / "driver.log"
    driver = tmp_path / "clang++"
    driver.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec /usr/lib/llvm-19/bin/clang++ "$@"\n')
    driver.chmod(0o755)
    program = project.root / "build" / "prog"

    def driver_runs() -> list[str]:
        runs = log.read_text().splitlines() if log.exists() else []
        log.unlink(missing_ok=True)
        return runs

    project.scons(f"cxx={driver}")
    probes = driver_runs()
    assert len(probes) == 1 and probes[0].endswith(" -###"), probes
    direct = program.read_bytes()
    assert project.run_program().returncode == 0
    program.unlink()
    assert project.scons(f"cxx={driver}").count("LINK") == 1
    assert driver_runs() == []  # the remembered job ran, no driver
    assert program.read_bytes() == direct
    program.unlink()
    assert project.scons(f"cxx={driver}", "link_via_driver=1").count("LINK") == 1
    runs = driver_runs()
    assert len(runs) == 1 and "-###" not in runs[0], runs
    assert program.read_bytes() == direct  # byte for byte what the driver links
    assert project.scons(f"cxx={driver}").commands == []  # the same command line to SCons: nothing to do


def test_changing_one_source_relinks_every_target_and_compiles_nothing_else(project):
    project.scons("archs=x86_64,sm_80,gfx90a")
    source = project.root / "src" / "scale.cpp"
    source.write_text(source.read_text().replace("x[i] *= factor * SCALE_ONE", "x[i] = x[i] * factor + 0.5 - 0.5"))
    rebuilt = project.scons("archs=x86_64,sm_80,gfx90a")
    assert rebuilt.count("HOST") == 1 and rebuilt.count("HOST", "scale") == 1
    assert rebuilt.count("DEVICE") == 3 and rebuilt.count("DEVICE", "scale") == 3
    assert rebuilt.count("EMBED") == 1
    assert rebuilt.count("DEVICELINK") == 3 and rebuilt.count("WRAP") == 1 and rebuilt.count("LINK") == 1
    assert project.run_program().returncode == 0


def test_unchanged_device_code_is_not_relinked(project):
    """A host-only edit re-embeds the same device code: no device link runs, only wrap-free host link."""
    project.scons("archs=x86_64,sm_80")
    main = project.root / "src" / "main.cpp"
    main.write_text(main.read_text().replace("double sum = 0;", "double sum = -0.0;"))  # same line numbers
    rebuilt = project.scons("archs=x86_64,sm_80")
    assert rebuilt.count("DEVICELINK") == 0 and rebuilt.count("WRAP") == 0
    assert rebuilt.count("LINK") == 1


FOREIGN_CPP = textwrap.dedent("""
    int foreign(int v) {
      int r = 0;
      #pragma omp target map(from : r)
      r = v + 1;
      return r;
    }
""")


def test_object_without_device_code_for_a_target_is_a_link_error(project):
    """Clang links this and the program crashes at run time; we stop the link and name object and target."""
    (project.root / "src" / "foreign.cpp").write_text(FOREIGN_CPP)
    subprocess.run(["clang++-19", "-fopenmp", "-fopenmp-targets=x86_64-unknown-linux-gnu", "-c", "src/foreign.cpp",
                    "-o", "foreign.o"], cwd=project.root, check=True)
    (project.root / "src" / "SConscript").write_text(textwrap.dedent("""
        Import("env")
        env.OffloadProgram("prog", ["main.cpp", "scale.cpp", File("#foreign.o")])
    """))
    failed = project.scons("archs=x86_64,sm_80", check=False)
    assert failed.returncode != 0
    assert "foreign.o: has offload entries but no device code for sm_80" in failed.output
    assert "Traceback" not in failed.output
    assert not (project.root / "build" / "prog").exists()
    assert project.scons("archs=x86_64").count("LINK") == 1


def test_target_without_any_device_code_is_a_warning(project):
    (project.root / "src" / "plain.cpp").write_text("int main() { return 0; }\n")
    subprocess.run(["clang++-19", "-c", "src/plain.cpp", "-o", "plain.o"], cwd=project.root, check=True)
    (project.root / "src" / "SConscript").write_text(textwrap.dedent("""
        Import("env")
        env.OffloadProgram("prog", [File("#plain.o")])
    """))
    build = project.scons("archs=x86_64")
    assert "no device code for x86_64" in build.output and "warning" in build.output.lower()
    assert project.run_program().returncode == 0


def test_deployment_devices_are_checked_at_link_time(project):
    """Each listed device must find an image it can load, or the link fails and leaves no program."""
    (project.root / "SConstruct").write_text(project.root.joinpath("SConstruct").read_text().replace(
        'SConscript(', 'env["OFFLOAD_DEPLOY_DEVICES"] = ARGUMENTS.get("deploy", "").split(",")\nSConscript('))
    assert project.scons("archs=x86_64,gfx90a:xnack+", "deploy=gfx90a:sramecc+:xnack+").count("LINK") == 1
    failed = project.scons("archs=x86_64,gfx90a:xnack+", "deploy=gfx90a:sramecc+:xnack+,gfx90a:xnack-", check=False)
    assert failed.returncode != 0 and "not deployable" in failed.output and "xnack" in failed.output
    assert "Traceback" not in failed.output
    assert not (project.root / "build" / "prog").exists()
    bad = project.scons("archs=x86_64", "deploy=gfx9999", check=False)
    assert bad.returncode != 0 and "OFFLOAD_DEPLOY_DEVICES" in bad.output and bad.commands == []


def test_a_program_that_is_not_deployable_leaves_no_partial_file(project):
    (project.root / "SConstruct").write_text(project.root.joinpath("SConstruct").read_text().replace(
        'SConscript(', 'env["OFFLOAD_DEPLOY_DEVICES"] = ["gfx90a:xnack-"]\nSConscript('))
    failed = project.scons("archs=x86_64,gfx90a:xnack+", check=False)
    assert failed.returncode != 0 and "not deployable" in failed.output
    assert sorted(p.name for p in (project.root / "build").glob("prog*") if not p.name.startswith("prog.")) == []
    assert not list((project.root / "build").glob("*.partial")), list((project.root / "build").iterdir())


def _embedded_packages(build: Path) -> dict[str, bytes]:
    """Each object's ``.llvm.offloading`` section: the package its embed step read."""
    packages = {}
    for obj in sorted(build.glob("*.o")):
        if obj.name.endswith((".dev.o", ".cubin.o", ".wrapper.o")):
            continue
        section = obj.with_suffix(".section")
        subprocess.run([str(LLVM19_BIN / "llvm-objcopy"), f"--dump-section=.llvm.offloading={section}", str(obj),
                        str(obj.with_suffix(".copy"))], check=True)
        packages[obj.name] = section.read_bytes()
        section.unlink()
        obj.with_suffix(".copy").unlink()
    return packages


def test_in_process_package_is_byte_identical_to_clang_offload_packager(project):
    """The object's package step, in the SCons process, against clang-offload-packager run on the same
    ``--image=`` specs: the objects embed the same bytes. The package is the object node's own file,
    removed once embedded."""
    project.scons("archs=x86_64,sm_80,gfx90a:xnack+")
    build = project.root / "build"
    ours = _embedded_packages(build)
    rebuilt = project.scons("archs=x86_64,sm_80,gfx90a:xnack+", "package_tool=1")
    assert rebuilt.count("PACKAGE") == 2 and rebuilt.count("EMBED") == 2 and rebuilt.count("DEVICE") == 0
    theirs = _embedded_packages(build)
    assert sorted(ours) == ["main.o", "scale.o"] and ours == theirs
    assert all(package[:4] == b"\x10\xff\x10\xad" for package in ours.values())
    assert not [p.name for p in build.iterdir() if p.name.endswith((".package", ".offload.pkg"))]


def test_target_link_flags_reach_only_that_targets_device_link(project):
    (project.root / "SConstruct").write_text(project.root.joinpath("SConstruct").read_text().replace(
        'SConscript(', 'env["OFFLOAD_TARGET_LINKFLAGS"] = {"gfx90a": ["-Wl,--no-such-linker-option"]}\nSConscript('))
    project.scons("archs=x86_64")  # gfx90a is not built: its flags change nothing
    failed = project.scons("archs=x86_64,gfx90a", check=False)
    assert failed.returncode != 0 and "no-such-linker-option" in failed.output
    assert failed.count("DEVICELINK") == 1 and failed.count("DEVICELINK", ".gfx90a.") == 1


def test_compile_nodes_depend_on_the_programs_they_run(project):
    """The compile nodes skip SCons' implicit command scan (it renders every command once more) and name
    the probed clang and ptxas binaries as dependencies instead, so a compiler update still rebuilds."""
    project.scons("archs=x86_64,sm_80")

    def tree(node: str) -> str:
        return project.scons("archs=x86_64,sm_80", "--tree=prune", node).output

    clang = os.path.realpath("/usr/lib/llvm-19/bin/clang")
    for node in ("build/scale.host.bc", "build/scale.sm_80.dev.cubin.o", "build/scale.x86_64.dev.o"):
        assert f"+-{clang} size=" in tree(node), node
    assembled = tree("build/scale.sm_80.dev.cubin.o")
    ptxas = [line for line in assembled.splitlines() if line.startswith("  +-") and "/ptxas size=" in line]
    assert len(ptxas) == 1, assembled  # a direct child, named by path, size and mtime (not its 37 MiB hashed)


@pytest.fixture
def private_clang(tmp_path) -> Path:
    """An LLVM 19 bin directory of our own whose clang is a copy (so its mtime is ours to change)."""
    llvm = Path("/usr/lib/llvm-19")
    root = tmp_path / "llvm"
    (root / "bin").mkdir(parents=True)
    (root / "lib").symlink_to(llvm / "lib")
    clang = root / "bin" / "clang"
    shutil.copy2(os.path.realpath(llvm / "bin" / "clang"), clang)
    for name in ("clang++", "clang-19"):
        (root / "bin" / name).symlink_to("clang")
    for tool in (llvm / "bin").iterdir():
        if not os.path.lexists(root / "bin" / tool.name):
            (root / "bin" / tool.name).symlink_to(tool)
    return clang


def test_a_compiler_update_rebuilds_the_compile_nodes(project, private_clang):
    env = dict(os.environ, OFFLOAD_CLANG=str(private_clang))
    project.scons(env=env)
    assert project.scons(env=env).commands == []
    status = private_clang.stat()
    os.utime(private_clang, ns=(status.st_atime_ns, status.st_mtime_ns + 10**9))  # what a package update does
    rebuilt = project.scons("--debug=explain", env=env)
    # the package step is part of the object's action (in the SCons process): it runs with the embed
    assert rebuilt.by_phase == {"HOST": 2, "DEVICE": 2, "PACKAGE": 2, "EMBED": 2}, rebuilt.output
    assert f"{private_clang} size=" in rebuilt.output  # --debug=explain names the changed compiler


def test_rendered_commands_are_what_scons_substitution_gives(project, tmp_path):
    check = tmp_path / "check_render.py"
    check.write_text(CHECK_RENDER)
    project.scons("archs=x86_64,sm_80,gfx90a")
    checked = project.scons("archs=x86_64,sm_80,gfx90a", f"check_render={check}", "-n").output
    # main and scale: host, embed, and per target a device compile, plus the sm_80 assemble (12);
    # the program: one device link per target (3).
    assert "render-check 15" in checked, checked


def test_a_wrapped_phase_command_runs_through_scons_substitution(project, tmp_path):
    """``$OFFLOAD_DEVICECOM`` with a launcher in front (ccache-style): SCons' own path, same objects."""
    log = tmp_path / "launched.log"
    launcher = tmp_path / "launcher"
    launcher.write_text(f'#!/bin/sh\necho "$1" >> {log}\nexec "$@"\n')
    launcher.chmod(0o755)
    project.scons()
    plain = (project.root / "build" / "scale.o").read_bytes()
    wrapped = project.scons(f"launcher={launcher}")
    assert wrapped.by_phase["DEVICE"] == 2  # the command changed, so its signature did
    assert log.read_text().splitlines() == [os.path.realpath("/usr/lib/llvm-19/bin/clang")] * 2 or \
        log.read_text().splitlines() == ["/usr/lib/llvm-19/bin/clang"] * 2
    assert (project.root / "build" / "scale.o").read_bytes() == plain
    assert project.run_program().returncode == 0


def test_flags_written_for_the_shell_reach_the_compiler_as_scons_means_them(project):
    """Phase commands run without ``sh -c`` where no word needs it; a define quoted for the shell (with
    a space and a quote in it) still reaches the compiler the way SCons' own ``$CXXCOM`` passes it."""
    project.scons("greeting=it's a fine day")
    run = project.run_program()
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[1] == "it's a fine day"


def test_device_links_run_the_drivers_own_job(project):
    """Each device link runs the one job the driver would (ld.lld, clang-nvlink-wrapper), probed when the
    program is declared, instead of starting the driver for it."""
    project.scons("archs=x86_64,sm_80,gfx90a")
    for image in (project.root / "build").glob("prog.*.img"):
        image.unlink()
    shown = project.scons("archs=x86_64,sm_80,gfx90a", "commands=1", "-n").output.splitlines()
    links = {line.split(" -o ")[1].split()[0]: line.split()[0] for line in shown if ".img.partial" in line}
    assert links == {"build/prog.x86_64.img.partial": "/usr/lib/llvm-19/bin/ld.lld",
                     "build/prog.gfx90a.img.partial": "/usr/lib/llvm-19/bin/ld.lld",
                     "build/prog.sm_80.img.partial": "/usr/lib/llvm-19/bin/clang-nvlink-wrapper"}, shown
    rebuilt = project.scons("archs=x86_64,sm_80,gfx90a")
    assert rebuilt.by_phase["DEVICELINK"] == 3 and rebuilt.count("LINK") == 0  # the same images again
    assert project.run_program().returncode == 0


def test_scons_ninja_generator_is_refused_with_one_clear_error(tmp_path):
    """Under ``--experimental=ninja`` our phases would be Ninja edges with no header dependencies: a header
    change would rebuild nothing. The tool refuses to load there instead of going silently stale."""
    (tmp_path / "SConstruct").write_text(textwrap.dedent("""
        import offload_builders.scons
        env = Environment(tools=["default", "ninja", "offload"], toolpath=[offload_builders.scons.toolpath()])
        env.OffloadObject("k.cpp")
    """))
    (tmp_path / "k.cpp").write_text("int f() { return 1; }\n")
    done = subprocess.run([SCONS, "-Q", "--experimental=ninja"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode != 0
    assert "does not support SCons' Ninja generator (--experimental=ninja)" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "k.o").exists() and not (tmp_path / "build.ninja").exists()


def test_link_input_kinds_are_remembered_per_user_by_path_size_and_mtime(tmp_path):
    """The host link's runtime depends on the offload kinds its inputs carry; a no-op must not read every
    object for them again. A later process answers from the per-user cache while an input's path, size and
    modification time are unchanged (even though its bytes were swapped here behind the stamp's back), and
    reads the file again once its modification time moves."""
    hip_object = tmp_path / "k.o"
    hip_object.write_bytes(b"\0" * 64 + b".hipFatBinSegment" + b"\0" * 64)  # a plain HIP object's section name
    cache = tmp_path / "cache"
    script = ("import sys; from offload_builders.scons.link_nodes import input_offload_kinds; "
              "print(sorted(input_offload_kinds([sys.argv[1]], 19)))")

    def kinds() -> str:
        environ = dict(os.environ, OFFLOAD_BUILDERS_CACHE_DIR=str(cache), PYTHONPATH=str(REPO_ROOT))
        return subprocess.run([sys.executable, "-c", script, str(hip_object)], env=environ, check=True,
                              capture_output=True, text=True).stdout.strip()

    assert kinds() == "['hip']"
    stamp = hip_object.stat()
    hip_object.write_bytes(b"\0" * stamp.st_size)  # no HIP code any more, same size ...
    os.utime(hip_object, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # ... and the same time stamp
    assert kinds() == "['hip']"  # remembered: the file was not read
    os.utime(hip_object, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1_000_000))
    assert kinds() == "[]"
