"""Offload models chosen per source, in one environment, with the real toolchain.

* ``.hip`` sources are HIP and C++ sources OpenMP (``$OFFLOAD_MODEL``'s default), side by side in one
  ``Environment``: the HIP object carries a ``.hip_fatbin`` section, the OpenMP object an
  ``.llvm.offloading`` section of OpenMP images; ``.cu`` sources are CUDA (an ``.nv_fatbin`` section).
* ``$OFFLOAD_MODEL`` is read per source: set after the tool loads, or per builder call, a ``.cpp`` source
  compiles as HIP (``-x hip``).
* One target list: each model takes the targets of ``$OFFLOAD_ARCHS`` it can compile (OpenMP all, HIP
  the AMDGPU ones, CUDA the NVPTX ones), counted in DEVICE commands per source; a source whose model gets
  none is one error.
* ``$OFFLOAD_RDC`` selects relocatable device code, ``$OFFLOAD_HIP_RDC`` is its alias, and the two
  disagreeing is an error.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from offload_builders.formats.offload_binary import read_offload_binaries
from test_cuda import CUDA_MIN_H, SCALE_CU
from test_scons_tool import Build as LabelledBuild, run_scons

pytestmark = pytest.mark.slow

PHASES = ("HOST", "DEVICE", "ASSEMBLE", "DEVICELINK", "BUNDLE", "PACKAGE", "EMBED", "EXTRACT", "WRAP", "LINK")

SCONSTRUCT = textwrap.dedent("""
    import offload_builders.scons
    env = Environment(
        tools=["default", "offload"],
        toolpath=[offload_builders.scons.toolpath()],
        OFFLOAD_ARCHS=ARGUMENTS.get("archs", "x86_64,gfx90a"),
        OFFLOAD_FLAGS=["-O2"],
        CPPPATH=["#"],
        # HIP without ROCm's headers and device libraries: sample_project/hip's declarations.
        OFFLOAD_HIP_FLAGS=["-nogpulib", "-nogpuinc", "-I%(hip_include)s"],
        **({"OFFLOAD_MODEL": ARGUMENTS["load_model"]} if ARGUMENTS.get("load_model") else {}),
    )
    for key in ("OFFLOAD_RDC", "OFFLOAD_HIP_RDC"):
        if key.lower() in ARGUMENTS:
            env[key] = bool(int(ARGUMENTS[key.lower()]))
    if not ARGUMENTS.get("verbose"):
        for phase in %(phases)r:
            env["OFFLOAD_%%sCOMSTR" %% phase] = "@@%%s $TARGET" %% phase
    sources = ARGUMENTS.get("sources", "omp.cpp,kern.hip").split(",")
    if ARGUMENTS.get("late"):        # the model chosen after the tool loaded, as any SCons variable
        env["OFFLOAD_MODEL"] = ARGUMENTS["late"]
    objects = [env.OffloadObject(source) for source in sources]
    if ARGUMENTS.get("per_call"):    # one source's model chosen by its builder call
        objects.append(env.OffloadObject(ARGUMENTS["per_call"], OFFLOAD_MODEL="hip"))
    if ARGUMENTS.get("program"):     # the OpenMP objects linked alone
        env.OffloadProgram("omp_prog", ["omp.cpp"])
""")

OMP_CPP = textwrap.dedent("""
    #include <cstdio>
    #include <omp.h>
    int main() {
      int on_device = 0;
      #pragma omp target map(from : on_device)
      on_device = !omp_is_initial_device();
      std::printf("on_device=%d\\n", on_device);
      return on_device ? 0 : 1;
    }
""")

KERNEL = textwrap.dedent("""
    #include "hip_min.h"
    __global__ void twice(int n, float *x) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) x[i] *= 2.0f;
    }
    void launch_twice(int n, float *x) { twice<<<(n + 255) / 256, 256, 0, nullptr>>>(n, x); }
""")


class Build(LabelledBuild):
    """What a build ran (the ``@@<PHASE> <target>`` labels of test_scons_tool's SConstruct), per source."""

    def count(self, phase: str, stem: str | None = None) -> int:  # type: ignore[override]
        """How many ``phase`` commands ran, for the nodes of source ``stem`` (all when None)."""
        return sum(1 for ran, target in self.commands
                   if ran == phase and (stem is None or os.path.basename(target).startswith(stem + ".")))


class Project:
    def __init__(self, root: Path) -> None:
        root.mkdir()
        self.root = root
        hip_include = REPO_ROOT / "sample_project" / "hip" / "include"
        (root / "SConstruct").write_text(SCONSTRUCT % {"phases": PHASES, "hip_include": hip_include})
        (root / "omp.cpp").write_text(OMP_CPP)
        for name in ("kern.hip", "late.cpp", "call.cpp", "other.hip"):
            (root / name).write_text(KERNEL)
        (root / "cuda_min.h").write_text(CUDA_MIN_H)
        (root / "nv.cu").write_text(SCALE_CU)

    def scons(self, *args: str, check: bool = True) -> Build:
        done = run_scons(self.root, *args, check=check)
        return Build(done.returncode, done.output)


@pytest.fixture
def project(tmp_path) -> Project:
    return Project(tmp_path / "models")


def _section_names(llvm19, obj: Path) -> set[str]:
    listed = subprocess.run([str(llvm19("llvm-objdump")), "-h", str(obj)], check=True, capture_output=True,
                            text=True).stdout
    return {line.split()[1] for line in listed.splitlines() if line.split()[:1] and line.split()[0].isdigit()}


def _offloading_images(llvm19, obj: Path) -> list[tuple[str, str, str]]:
    """(offload kind, triple, arch) of each image in the object's ``.llvm.offloading`` section."""
    dumped = obj.with_name(obj.name + ".offloading.bin")
    subprocess.run([str(llvm19("llvm-objcopy")), f"--dump-section=.llvm.offloading={dumped}", str(obj),
                    os.devnull], check=True, capture_output=True)
    return sorted((binary.offload_kind_name(19), binary.triple, binary.arch)
                  for binary in read_offload_binaries(str(dumped)))


def _bundle_ids(llvm19, fatbin: Path) -> list[str]:
    """The device entries of a HIP fat binary, sorted."""
    listed = subprocess.run([str(llvm19("clang-offload-bundler")), "-list", "-type=o", f"-input={fatbin}"],
                            check=True, capture_output=True, text=True).stdout.split()
    return sorted(entry for entry in listed if not entry.startswith("host-"))


def test_an_openmp_and_a_hip_source_build_in_one_environment(project, llvm19):
    """The default model is OpenMP; the .hip source is HIP whatever $OFFLOAD_MODEL says."""
    build = project.scons()
    assert build.count("DEVICE", "omp") == 2 and build.count("EMBED", "omp") == 1
    assert build.count("DEVICE", "kern") == 1 and build.count("DEVICELINK", "kern") == 1
    assert build.count("BUNDLE", "kern") == 1 and build.count("HOST", "kern") == 1
    assert build.count("EMBED", "kern") == 0 and build.count("PACKAGE", "kern") == 0

    omp, kern = project.root / "omp.o", project.root / "kern.o"
    assert ".llvm.offloading" in _section_names(llvm19, omp)
    assert _offloading_images(llvm19, omp) == [("openmp", "amdgcn-amd-amdhsa", "gfx90a"),
                                               ("openmp", "x86_64-unknown-linux-gnu", "")]
    sections = _section_names(llvm19, kern)
    assert ".hip_fatbin" in sections and ".llvm.offloading" not in sections
    assert _bundle_ids(llvm19, project.root / "kern.hipfb") == ["hipv4-amdgcn-amd-amdhsa--gfx90a"]
    assert project.scons().commands == []  # and nothing runs again


def test_each_model_takes_its_targets_of_one_list(project, llvm19):
    """x86_64,gfx90a,sm_80: the OpenMP source compiles for all three, the HIP source for gfx90a only;
    adding gfx942 runs one device compile per source of each model that takes it, nothing else device-side."""
    first = project.scons("archs=x86_64,gfx90a,sm_80")
    assert first.count("DEVICE", "omp") == 3 and first.count("ASSEMBLE", "omp") == 1
    assert first.count("DEVICE", "kern") == 1
    assert [target for phase, target in first.commands if phase == "DEVICE" and "kern" in target] == [
        "kern.gfx90a.hsaco"]
    assert _bundle_ids(llvm19, project.root / "kern.hipfb") == ["hipv4-amdgcn-amd-amdhsa--gfx90a"]

    added = project.scons("archs=x86_64,gfx90a,sm_80,gfx942")
    assert sorted(target for phase, target in added.commands if phase == "DEVICE") == [
        "kern.gfx942.hsaco", "omp.gfx942.dev.bc"]
    assert added.count("DEVICELINK", "kern") == 1 and added.count("ASSEMBLE") == 0
    assert _bundle_ids(llvm19, project.root / "kern.hipfb") == ["hipv4-amdgcn-amd-amdhsa--gfx90a",
                                                                 "hipv4-amdgcn-amd-amdhsa--gfx942"]
    assert ("openmp", "amdgcn-amd-amdhsa", "gfx942") in _offloading_images(llvm19, project.root / "omp.o")

    # The OpenMP objects still link and run alone (the HIP object plays no part in that program).
    project.scons("archs=x86_64,gfx90a,sm_80,gfx942", "program=1")
    env = dict(os.environ, LD_LIBRARY_PATH="/usr/lib/llvm-19/lib", OMP_TARGET_OFFLOAD="MANDATORY")
    ran = subprocess.run([str(project.root / "omp_prog")], env=env, capture_output=True, text=True)
    assert ran.returncode == 0 and "on_device=1" in ran.stdout, ran.stdout + ran.stderr


def test_a_source_whose_model_gets_no_target_is_one_error(project):
    build = project.scons("archs=x86_64,sm_80", check=False)
    assert build.returncode != 0
    assert ("kern.hip: the hip model compiles for AMDGPU (e.g. gfx90a) targets, and OFFLOAD_ARCHS"
            " (sm_80,x86_64) has none; add one to OFFLOAD_ARCHS") in build.output, build.output
    assert build.commands == []


def test_a_cuda_source_builds_beside_openmp_and_hip_sources(project, llvm19):
    """x86_64,gfx90a,sm_80: the .cu source is CUDA and compiles for sm_80 only (PTX, ptxas, fat binary, host
    compile); the OpenMP and HIP sources build as before, in the same environment."""
    build = project.scons("sources=omp.cpp,kern.hip,nv.cu", "archs=x86_64,gfx90a,sm_80")
    # one node, whose second target is the PTX
    nv_device = [(phase, target) for phase, target in build.commands
                 if phase in ("DEVICE", "ASSEMBLE") and "nv" in target]
    assert nv_device == [("DEVICE", "nv.sm_80.cubin"), ("ASSEMBLE", "nv.sm_80.cubin")]
    assert build.count("BUNDLE", "nv") == 1 and build.count("HOST", "nv") == 1 and build.count("EMBED", "nv") == 0
    assert build.count("DEVICE", "omp") == 3 and build.count("DEVICE", "kern") == 1
    sections = _section_names(llvm19, project.root / "nv.o")
    assert ".nv_fatbin" in sections and ".hip_fatbin" not in sections and ".llvm.offloading" not in sections


@pytest.mark.parametrize("how", ["late=hip", "per_call=late.cpp"])
def test_offload_model_is_read_per_source(project, llvm19, how):
    """After the tool loaded (env['OFFLOAD_MODEL'] = 'hip'), or per call: the .cpp source compiles as HIP,
    the source the call does not name stays OpenMP."""
    sources = "late.cpp" if how.startswith("late") else "omp.cpp"
    listed = project.scons(f"sources={sources}", how, "verbose=1", "-n").output
    late_lines = [line for line in listed.splitlines() if "-cc1" in line and line.rstrip().endswith("late.cpp")]
    assert late_lines and all(" -x hip " in line for line in late_lines), listed
    build = project.scons(f"sources={sources}", how)
    assert build.count("BUNDLE", "late") == 1 and build.count("EMBED", "late") == 0
    sections = _section_names(llvm19, project.root / "late.o")
    assert ".hip_fatbin" in sections and ".llvm.offloading" not in sections
    if sources == "omp.cpp":
        assert build.count("EMBED", "omp") == 1
        assert ".llvm.offloading" in _section_names(llvm19, project.root / "omp.o")


@pytest.mark.parametrize("setting", ["offload_rdc=1", "offload_hip_rdc=1", "offload_rdc=1 offload_hip_rdc=1"])
def test_offload_rdc_and_its_alias_select_relocatable_device_code(project, llvm19, setting):
    build = project.scons("sources=kern.hip", "archs=gfx90a", *setting.split())
    assert build.count("PACKAGE", "kern") == 1 and build.count("BUNDLE", "kern") == 0
    assert [target for phase, target in build.commands if phase == "DEVICE"] == ["kern.gfx90a.dev.bc"]
    kern = project.root / "kern.o"
    assert ".hip_fatbin" not in _section_names(llvm19, kern)
    assert _offloading_images(llvm19, kern) == [("hip", "amdgcn-amd-amdhsa", "gfx90a")]


def test_offload_rdc_and_its_alias_disagreeing_is_an_error(project):
    build = project.scons("sources=kern.hip", "archs=gfx90a", "offload_rdc=1", "offload_hip_rdc=0", check=False)
    assert build.returncode != 0
    assert ("OFFLOAD_RDC=True and OFFLOAD_HIP_RDC=False disagree; OFFLOAD_HIP_RDC is the old name of OFFLOAD_RDC:"
            " set only OFFLOAD_RDC") in build.output, build.output
    assert build.commands == []
    plain = project.scons("sources=kern.hip", "archs=gfx90a", "offload_rdc=0")  # off, as without either
    assert plain.count("BUNDLE", "kern") == 1 and plain.count("PACKAGE", "kern") == 0


#: A Python program that declares ``count`` objects of one model with the tool (outside the ``scons`` command),
#: asks every node for its description and signature as a no-op does, and prints how many nodes that was, how
#: many command templates the models derived from the driver's jobs meanwhile, and how many function actions
#: SCons made (of the in-process steps' functions).
COUNT_TEMPLATES = textwrap.dedent("""
    import sys

    import SCons.Action
    import SCons.Environment

    import offload_builders.scons
    from offload_builders.models import cuda as cuda_phases
    from offload_builders.models import hip as hip_phases
    from offload_builders.models import openmp as phases

    made = []
    for module in (phases, cuda_phases, hip_phases):
        def counting(*args, _derive=module.job_template, **kwargs):
            made.append(args[0])
            return _derive(*args, **kwargs)
        module.job_template = counting
    actions = []
    make_action = SCons.Action.FunctionAction.__init__
    def counting_action(self, *args, **kwargs):
        actions.append(self)
        make_action(self, *args, **kwargs)
    SCons.Action.FunctionAction.__init__ = counting_action

    suffix, archs, count, hip_include = sys.argv[1:]
    env = SCons.Environment.Environment(
        tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()], OFFLOAD_ARCHS=archs,
        OFFLOAD_FLAGS=["-O2"], CPPPATH=["#"], OFFLOAD_HIP_FLAGS=["-nogpulib", "-nogpuinc", "-I" + hip_include])
    objects = [node for i in range(int(count)) for node in env.OffloadObject(f"k{i}{suffix}")]
    made_reading, actions_reading = len(made), len(actions)
    seen, stack = set(), list(objects)
    while stack:
        node = stack.pop()
        if node in seen or not node.has_builder():
            continue
        seen.add(node)
        str(node.get_executor())  # its action's description, which SCons records
        node.get_executor().get_contents()
        stack.extend(node.children(scan=0))
    print(len(seen), len(made), len(actions) - actions_reading)
""")


@pytest.mark.parametrize(("suffix", "archs"), [(".cpp", "x86_64,sm_80,gfx90a"), (".hip", "gfx90a,gfx942"),
                                              (".cu", "sm_80,sm_90")])
def test_each_model_derives_its_command_templates_and_actions_once_a_build_not_once_a_node(
        tmp_path, llvm19, cuda, suffix, archs):
    """A model's command templates depend on the toolchain, the flags and the target only, and the action of an
    in-process step on its function only: every node of every source with the same flags renders from the same
    ones, so a no-op costs no template or action work per node. (The HIP and CUDA models made their templates
    again for each node's every rendering, and SCons made HIP's bundle action again, hashing the function's
    code, each time it asked a bundle node anything: together a third of a HIP no-op at 64 sources.)"""
    (tmp_path / "cuda_min.h").write_text(CUDA_MIN_H)
    program = tmp_path / "count_templates.py"
    program.write_text(COUNT_TEMPLATES)
    counts = []
    for count in (1, 4):
        for i in range(count):
            (tmp_path / f"k{i}{suffix}").write_text({".cu": SCALE_CU, ".hip": KERNEL, ".cpp": OMP_CPP}[suffix])
        done = subprocess.run([sys.executable, str(program), suffix, archs, str(count),
                               str(REPO_ROOT / "sample_project" / "hip" / "include")], cwd=tmp_path,
                              capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
        assert done.returncode == 0, done.stdout + done.stderr
        counts.append(tuple(int(word) for word in done.stdout.split()[-3:]))
    (one_nodes, one_templates, one_actions), (four_nodes, four_templates, four_actions) = counts
    assert four_nodes == 4 * one_nodes and one_templates > 0, counts
    assert (four_templates, four_actions) == (one_templates, one_actions), counts


#: A Python program that declares one object with the tool (outside the ``scons`` command), then appends a
#: define to the model's flags, and prints whether the object's and a device node's signature and command have it.
LATE_FLAGS = textwrap.dedent("""
    import sys

    import SCons.Environment

    import offload_builders.scons

    suffix, archs, variable, device_name, hip_include = sys.argv[1:]
    env = SCons.Environment.Environment(
        tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()], OFFLOAD_ARCHS=archs,
        OFFLOAD_HIP_FLAGS=["-nogpulib", "-nogpuinc", "-I" + hip_include])
    obj = env.OffloadObject("k" + suffix)[0]
    env.Append(**{variable: ["-DLATE_FLAG=1"]})
    device = env.File(device_name)  # a device node of the object's
    for node, command in ((obj, "$_OFFLOAD_HOST_CC1"), (device, "$_OFFLOAD_DEVICE_CC1")):
        executor = node.get_executor()
        rendered = node.get_build_env().subst(command, target=executor.get_all_targets(),
                                              source=executor.get_all_sources())
        print(b"LATE_FLAG=1" in executor.get_contents(), "LATE_FLAG=1" in rendered)
""")


@pytest.mark.parametrize(("suffix", "archs", "variable", "device"), [
    (".hip", "gfx90a,gfx942", "OFFLOAD_HIP_FLAGS", "k.gfx90a.hsaco"),
    (".cu", "sm_80,sm_90", "OFFLOAD_CUDA_FLAGS", "k.sm_80.cubin")])
def test_flags_appended_after_the_declaration_reach_signature_and_command_alike(tmp_path, llvm19, cuda, suffix,
                                                                                 archs, variable, device):
    """As in any SCons build, a node is rendered with its environment as it is when the node is built: a flag
    appended after ``OffloadObject`` reaches the object's and the device nodes' signatures and commands
    alike (an emitter that kept the flags it substituted per node would give the command the old ones)."""
    (tmp_path / "cuda_min.h").write_text(CUDA_MIN_H)
    (tmp_path / f"k{suffix}").write_text({".cu": SCALE_CU, ".hip": KERNEL}[suffix])
    program = tmp_path / "late_flags.py"
    program.write_text(LATE_FLAGS)
    done = subprocess.run([sys.executable, str(program), suffix, archs, variable, device,
                           str(REPO_ROOT / "sample_project" / "hip" / "include")], cwd=tmp_path,
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == ["True"] * 4, done.stdout
