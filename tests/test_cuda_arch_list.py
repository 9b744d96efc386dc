"""``__CUDA_ARCH_LIST__`` and CUDA 13's ``include/cccl``, with the real Clang 19 and 22 and CUDA 13.

From Clang 20 the driver defines ``-D__CUDA_ARCH_LIST__=<every target's number>`` in every job of a CUDA
compile, host and device, and CUB, Thrust and libcu++ name their inline namespace after it
(``cub::CUB_300001_SM_800_900``). A host object compiled with another list than its cubins launches kernels
they do not define ("named symbol not found" on a GPU). So every compile of a source gets the value the
driver gives the source's whole target list:

* the rendered commands carry the driver's value (the RDC host compile too), and with Clang 19 there is none;
* a CUB program's host object registers the same CUB kernels as the driver's one-command object, and every
  cubin defines each of them (the fat binary is the driver's, byte for byte);
* with Clang 22, adding a target reruns the host compile of each source, and only the device compiles whose
  preprocessed text (or, through a ``#pragma`` or flags that record macros, output) the list can change: each
  device node depends on a list check, ``<stem>.<target>.archlist``;
* ``offload-compile device``/``host`` take the list as ``--targets``, required where the toolchain defines it.

Clang 22 does not add CUDA 13's ``include/cccl`` (where CUB lives), which ``nvcc`` adds with ``-isystem``:
the tool adds it where the compile uses the real headers.
"""
from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from offload_builders.models.cuda import (
    ARCH_LIST_SLOT,
    CudaPhaseModel,
    check_arch_list,
    default_flags,
    records_arch_list,
)
from offload_builders.scons.hip import default_cuid
from offload_builders.targets import parse_target_id
from offload_builders.toolchain import find_toolchain
from test_cuda import CUDA_MIN_H, Project, _nv_fatbin, curand_include, targets_of
from test_scons_tool import SCONS, run_scons

pytestmark = pytest.mark.slow

CUDA_PATH = Path(os.environ.get("CUDA_PATH") or "/usr/local/cuda")  # as the toolchain names it
ARCH_LIST = "-D__CUDA_ARCH_LIST__="
OFFLOAD_COMPILE = [sys.executable, "-m", "offload_builders.cli.compile"]


def driver_arch_list(clangxx: Path, targets: list[str], flags: tuple[str, ...] = ()) -> str:
    """The one value of ``-D__CUDA_ARCH_LIST__`` the driver's own one-command compile of ``targets`` gives its
    jobs (asked with ``-###``; none of our code involved)."""
    probe = subprocess.run([str(clangxx), "-###", "-x", "cuda", *(f"--cuda-gpu-arch={t}" for t in targets),
                            f"--cuda-path={CUDA_PATH}", *flags, "-c", os.devnull, "-o", os.devnull],
                           capture_output=True, text=True, check=True)
    jobs = [line for line in probe.stderr.splitlines() if line.startswith(' "')]
    values = {word.strip('"')[len(ARCH_LIST):] for job in jobs for word in job.split()
              if word.strip('"').startswith(ARCH_LIST)}
    assert len(values) == 1 and len(jobs) >= 3, probe.stderr
    return values.pop()


def compile_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if " -cc1 " in line]


def arch_list_words(line: str) -> list[str]:
    return [word[len(ARCH_LIST):] for word in line.split() if word.startswith(ARCH_LIST)]


# --- the rendered commands --------------------------------------------------------------------------------

def test_clang22_host_and_device_compiles_carry_the_drivers_arch_list(tmp_path, llvm22, cuda):
    """Every -cc1 job of a two-target build (each source's host compile and both device compiles) defines
    ``__CUDA_ARCH_LIST__`` as the driver's one command for both targets does (``sm_90a`` counts as 900), and
    includes CUDA 13's ``include/cccl``; before, the host had 800 (its probe target's) and each device its own."""
    project = Project(tmp_path / "cuda22", llvm22("clang++"))
    done = subprocess.run([SCONS, "-Q", "-n", f"clang={llvm22('clang')}", "archs=sm_90a,sm_80", "program=0",
                           "verbose=1"], cwd=project.root, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    expected = driver_arch_list(llvm22("clang++"), ["sm_90a", "sm_80"])
    assert expected == "800,900"
    lines = compile_lines(done.stdout)
    checks = [line for line in lines if " -E -dD " in line]  # each device compile's list check
    lines = [line for line in lines if line not in checks]
    assert len(lines) == 6 and len(checks) == 4, done.stdout  # 2 sources x (host + 2 device compiles)
    assert [arch_list_words(line) for line in lines + checks] == [[expected]] * 10, done.stdout
    assert all(f"-isystem {CUDA_PATH / 'include' / 'cccl'}" in line for line in lines), done.stdout


def test_clang22_rdc_host_compile_takes_the_drivers_arch_list(tmp_path, llvm22, cuda):
    """Relocatable device code (``-fgpu-rdc``, the new driver) has the macro too: the host compile's template
    has the slot, and the model's value for a target list is the driver's own. (Clang 22's RDC device steps,
    which package with ``llvm-offload-binary``, are not supported yet; the host compile is.)"""
    toolchain = find_toolchain({"OFFLOAD_CLANG": str(llvm22("clang")), "PATH": os.environ.get("PATH", ""),
                                "CUDA_PATH": str(CUDA_PATH)})
    model = CudaPhaseModel(toolchain, str(tmp_path))
    flags = ("-O2", "-fgpu-rdc", *default_flags(toolchain, ["-O2", "-fgpu-rdc"]))
    targets = [parse_target_id(text, llvm_version=22) for text in ("sm_100", "sm_90a", "sm_75", "sm_90")]
    template = model.host_steps(flags).compile
    assert ARCH_LIST_SLOT in template.slots
    values = model.arch_list_values(template, targets, flags)
    expected = driver_arch_list(llvm22("clang++"), [str(t) for t in targets], ("-fgpu-rdc", "--offload-new-driver"))
    assert values == {ARCH_LIST_SLOT: expected} and expected == "750,900,1000"
    argv = template.render(source="k.cu", main_file_name="k.cu", output="k.o", package="k.pkg", **values)
    assert arch_list_words(" ".join(argv)) == [expected]


def test_clang19_compiles_define_no_arch_list_and_add_no_cccl(project19):
    """Clang 19 defines no ``__CUDA_ARCH_LIST__`` and cannot parse CUDA 13's headers (``-nocudainc``): its
    commands are as before, each device compile depending on its own target alone."""
    done = subprocess.run([SCONS, "-Q", "-n", "archs=sm_90a,sm_80", "program=0", "verbose=1"], cwd=project19.root,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = compile_lines(done.stdout)
    assert len(lines) == 6 and not any(ARCH_LIST in line or "cccl" in line for line in lines), done.stdout


@pytest.fixture
def project19(tmp_path, llvm19, cuda) -> Project:
    return Project(tmp_path / "cuda19", llvm19("clang++"))


def test_cccl_is_added_where_the_real_headers_are_used(tmp_path, llvm19, llvm22):
    """``-isystem <CUDA_PATH>/include/cccl`` (as nvcc's profile adds it) with Clang 22 and the real headers; not
    with -nocudainc or -nogpuinc (no CUDA headers), nor where the installation has no include/cccl, nor where
    the flags name it already; Clang 19 gets -nocudainc -nocudalib as before."""
    def toolchain(clang: Path, cuda_path: Path = CUDA_PATH):
        return find_toolchain({"OFFLOAD_CLANG": str(clang), "PATH": os.environ.get("PATH", ""),
                               "CUDA_PATH": str(cuda_path)})

    cccl = str(CUDA_PATH / "include" / "cccl")
    clang22 = toolchain(llvm22("clang"))
    assert default_flags(clang22, ["-O2"]) == ("-isystem", cccl)
    assert default_flags(clang22, ["-nocudalib"]) == ("-isystem", cccl)  # libdevice only: headers still used
    assert default_flags(clang22, ["-nocudainc"]) == default_flags(clang22, ["-nogpuinc"]) == ()
    assert default_flags(clang22, [f"-isystem{cccl}"]) == ()
    old = tmp_path / "cuda-12"
    (old / "include").mkdir(parents=True)
    assert default_flags(toolchain(llvm22("clang"), old), []) == ()
    assert default_flags(toolchain(llvm19("clang")), []) == ("-nocudainc", "-nocudalib")


# --- CUB: the host launches what the cubins define --------------------------------------------------------

REDUCE_CU = textwrap.dedent("""
    #include <cub/cub.cuh>
    // A device-wide reduction: the host code picks and launches CUB's kernels, named in CUB's inline namespace
    // (cub::CUB_<version>_SM_<__CUDA_ARCH_LIST__>), which the cubins must define under the same names.
    cudaError_t reduce(const float *in, float *out, int n, void *temp, size_t *bytes) {
      return cub::DeviceReduce::Sum(temp, *bytes, in, out, n);
    }
""")

CUB_SCONSTRUCT = textwrap.dedent("""
    import offload_builders.scons
    env = Environment(tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()],
                      OFFLOAD_CLANG=ARGUMENTS["clang"], OFFLOAD_ARCHS=ARGUMENTS["archs"], OFFLOAD_FLAGS=["-O2"],
                      OFFLOAD_CUDA_FLAGS=["-I" + ARGUMENTS["include"]])
    for phase in ("HOST", "DEVICE", "ASSEMBLE", "BUNDLE"):
        env["OFFLOAD_%sCOMSTR" % phase] = "@@%s $TARGET" % phase
    env.OffloadObject("reduce.cu")
""")


def registered_kernels(obj: Path) -> set[str]:
    """The device names a host object registers (``__cudaRegisterFunction``'s name arguments: the mangled names
    among its string constants)."""
    with obj.open("rb") as f:
        elf = ELFFile(f)
        strings = [word.decode() for section in elf.iter_sections() if section.name.startswith(".rodata.str")
                   for word in section.data().split(b"\0")]
    return {word for word in strings if word.startswith("_Z")}


def cubin_kernels(cubin: Path) -> set[str]:
    """The functions a cubin defines (its FUNC symbols with a section: ``.text.<name>``)."""
    with cubin.open("rb") as f:
        elf = ELFFile(f)
        return {symbol.name for symbol in elf.get_section_by_name(".symtab").iter_symbols()
                if symbol["st_info"]["type"] == "STT_FUNC" and symbol["st_shndx"] != "SHN_UNDEF"}


def test_cub_kernels_the_host_registers_are_the_drivers_and_each_cubin_defines_them(tmp_path, llvm22, cuda):
    """A CUB reduction built with Clang 22 and CUDA 13's own CUB: for sm_90 and for sm_80,sm_90, the CUB kernels
    the host object registers (and launches) are those of the driver's one-command object
    (``cub::CUB_300001_SM_900``, ``..._SM_800_900``), and every cubin defines each registered kernel; the fat
    binary is the driver's, byte for byte. Before, the host compile had ``__CUDA_ARCH_LIST__=800`` whatever the
    targets (``..._SM_800``) and each device compile its own target's, so the sm_90 cubin defined none of the
    CUB kernels the host launched ("named symbol not found" on an H100)."""
    root = tmp_path / "cub"
    root.mkdir()
    (root / "SConstruct").write_text(CUB_SCONSTRUCT)
    (root / "reduce.cu").write_text(REDUCE_CU)
    include = curand_include()
    clangxx = llvm22("clang++")
    for archs, namespace in (("sm_90", "SM_900"), ("sm_80,sm_90", "SM_800_900")):
        targets = archs.split(",")
        build = run_scons(root, f"clang={llvm22('clang')}", f"archs={archs}", f"include={include}")
        # CUB's namespace is named after the list: adding a target reruns every device compile of the source
        assert sorted(t for p, t in build.commands if p == "DEVICE") == [f"reduce.{t}.cubin" for t in targets]
        reference = root / "reduce.reference.o"
        subprocess.run([str(clangxx), "-x", "cuda", *(f"--cuda-gpu-arch={t}" for t in targets),
                        f"-cuid={default_cuid('reduce.cu')}", f"--cuda-path={CUDA_PATH}", "-O2", f"-I{include}",
                        "-isystem", str(CUDA_PATH / "include" / "cccl"), "-c", "reduce.cu", "-o", str(reference)],
                       cwd=root, check=True, capture_output=True)
        ours, theirs = registered_kernels(root / "reduce.o"), registered_kernels(reference)
        cub = {name for name in ours if "CUB_" in name}
        assert cub and cub == {name for name in theirs if "CUB_" in name}, (sorted(ours), sorted(theirs))
        assert all(re.search(rf"CUB_\d+_{namespace}\d", name) for name in cub), sorted(cub)
        assert ours == theirs
        for target in targets:
            defined = cubin_kernels(root / f"reduce.{target}.cubin")
            assert ours <= defined, (target, sorted(ours - defined))
        assert _nv_fatbin(llvm22, root / "reduce.o") == _nv_fatbin(llvm22, reference), archs


# --- incremental: adding a target reruns only the device compiles whose text the list changes (Clang 22) ----

def test_clang22_adding_or_removing_a_target_reruns_only_the_device_compiles_the_list_changes(tmp_path, llvm22,
                                                                                              cuda):
    """Neither plain source's preprocessed device text sees ``__CUDA_ARCH_LIST__``: adding a target compiles and
    assembles that target alone (plus the fat binary and the host compile, which embeds it and sees the list),
    removing one compiles nothing; a no-op runs nothing. Each device node depends on its list check
    (``<stem>.<target>.archlist``), which reruns whenever the list changes."""
    include = curand_include()
    project = Project(tmp_path / "cuda22", llvm22("clang++"))
    common = (f"clang={llvm22('clang')}", f"cuda_flags=-I{include}", "program=0")
    first = project.scons(*common, "archs=sm_80")
    assert targets_of(first, "DEVICE") == ["scale.sm_80.cubin", "shift.sm_80.cubin"]
    added = project.scons(*common, "archs=sm_80,sm_90")
    assert targets_of(added, "DEVICE") == targets_of(added, "ASSEMBLE") == ["scale.sm_90.cubin",
                                                                            "shift.sm_90.cubin"], added.output
    assert targets_of(added, "BUNDLE") == ["scale.fatbin", "shift.fatbin"]
    assert targets_of(added, "HOST") == ["scale.o", "shift.o"]
    assert project.scons(*common, "archs=sm_80,sm_90").commands == []
    removed = project.scons(*common, "archs=sm_90")
    assert targets_of(removed, "DEVICE") == [], removed.output
    assert targets_of(removed, "HOST") == ["scale.o", "shift.o"]


def _kind(process) -> str:
    args = process.argv
    if "-cc1" in args:
        if "-E" in args:
            return "list check"
        return "device compile" if "-fcuda-is-device" in args else "host compile"
    return process.program if process.program in ("ptxas", "fatbinary") else f"other ({process.program})"


def test_clang22_adding_a_target_starts_two_device_compiles_not_six(tmp_path, llvm22, cuda):
    """Counted from an exec trace (``strace -ff``): two plain sources built for sm_80,sm_90, then sm_86 added.
    Before, the build ran 6 device compiles and 6 ``ptxas`` (every target of both sources: the list is in every
    device command); now 2 and 2 (sm_86's), and one list check (a ``-cc1 -E``, no ``ptxas``) per device compile
    the list could change. Each object's ``.nv_fatbin`` (sm_80 and sm_90 cubins kept from the build before)
    equals, byte for byte, the driver's one command for all three targets."""
    from test_process_counts import read_trace

    strace = shutil.which("strace")
    if not strace:
        pytest.fail("strace is missing: run scripts/bootstrap (it installs it) or apt-get install strace")
    include = curand_include()
    project = Project(tmp_path / "cuda22", llvm22("clang++"))
    common = (f"clang={llvm22('clang')}", f"cuda_flags=-I{include}", "program=0")
    env = dict(os.environ, OFFLOAD_BUILDERS_CACHE_DIR=str(tmp_path / "user-cache"))
    project.scons(*common, "archs=sm_80,sm_90")
    log = tmp_path / "trace" / "pid"
    log.parent.mkdir()
    done = subprocess.run([strace, "-ff", "-ttt", "-qq", "-v", "-s", "65536", "-e", "trace=execve", "-e",
                           "status=successful", "-e", "signal=none", "-o", str(log), SCONS, "-Q", *common,
                           "archs=sm_80,sm_90,sm_86"], cwd=project.root, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    processes = [p for p in read_trace(log) if p.path != SCONS and "-###" not in p.argv
                 and p.argv[1:] not in (("--version",), ("-print-resource-dir",))]
    kinds = collections.Counter(_kind(p) for p in processes)
    assert kinds == {"device compile": 2, "ptxas": 2, "list check": 6, "fatbinary": 2, "host compile": 2}, processes
    compiled = {p.argv[p.argv.index("-target-cpu") + 1] for p in processes if _kind(p) == "device compile"}
    assert compiled == {"sm_86"}
    for stem in ("scale", "shift"):
        reference = project.root / f"{stem}.reference.o"
        subprocess.run([str(llvm22("clang++")), "-x", "cuda", "--cuda-gpu-arch=sm_80", "--cuda-gpu-arch=sm_90",
                        "--cuda-gpu-arch=sm_86", f"-cuid={default_cuid(f'{stem}.cu')}", f"--cuda-path={CUDA_PATH}",
                        "-O2", "-I.", f"-I{include}", "-isystem", str(CUDA_PATH / "include" / "cccl"), "-c",
                        f"{stem}.cu", "-o", str(reference)], cwd=project.root, check=True, capture_output=True)
        assert _nv_fatbin(llvm22, project.root / f"{stem}.o") == _nv_fatbin(llvm22, reference), stem


#: A source that sees the list only where ``-E`` prints it unexpanded: ``#pragma unroll UNROLL`` (the compiler
#: expands UNROLL, and with it the list; ``-E`` prints the pragma as written).
PRAGMA_CU = '#include "cuda_min.h"\n' + textwrap.dedent("""
    #define SECOND(a, b, ...) b
    #define ONE_TARGET(...) SECOND(__VA_ARGS__, 1, 0)
    #define UNROLL (ONE_TARGET(__CUDA_ARCH_LIST__) == 1 ? 2 : 4)
    __global__ void k(float *x) {
    #pragma unroll UNROLL
      for (int i = 0; i < 64; i++) x[i] = x[i] * 2 + 1;
    }
""")

#: Sources reaching the list through an include, #if, defined() and token pasting; and one that does not.
REACH_H = textwrap.dedent("""
    #pragma once
    #define CAT2(a, b) a##b
    #define CAT(a, b) CAT2(a, b)
    #define LIST_NAME CAT(__CUDA_ARCH_, LIST__)
    #define SECOND(a, b, ...) b
    #define ONE_TARGET(...) SECOND(__VA_ARGS__, 1, 0)
""")
REACHES = {
    "include.cu": '#include "reach.h"\n__attribute__((device)) int n = LIST_NAME;\n',
    "if.cu": '#include "reach.h"\n#if ONE_TARGET(__CUDA_ARCH_LIST__) == 1\n__attribute__((device)) int n = 1;\n'
             '#endif\n',
    "defined.cu": '#include "reach.h"\n#if defined(__CUDA_ARCH_LIST__) && ONE_TARGET(__CUDA_ARCH_LIST__) != 1\n'
                  '__attribute__((device)) int n;\n#endif\n',
    "paste.cu": '#include "reach.h"\nint CAT(v_, ONE_TARGET(LIST_NAME));\n',
}
UNREACHED = '#include "reach.h"\n#ifdef __CUDA_ARCH_LIST__\n__attribute__((device)) int n = 1;\n#endif\n'


def _record(model, toolchain, work: Path, source: str, targets: list[str], flags: tuple[str, ...]) -> str:
    tids = [parse_target_id(text, llvm_version=22) for text in targets]
    steps = model.device_steps(tids[0], flags)
    values = model.arch_list_values(steps.compile, tids, flags)
    words = steps.compile.render(source=str(work / source), main_file_name=source, output="-", cuid="c", **values)
    record = check_arch_list(words, flags, values[ARCH_LIST_SLOT])
    assert "failed" not in record, record
    return record


def test_the_list_check_sees_includes_if_defined_and_pasting_and_pragmas(tmp_path, llvm22, cuda):
    """The check's record (the real Clang 22 preprocessing each source's sm_80 device compile, with sm_80 alone
    and with sm_80,sm_90) changes with the list for each way a source can reach it, and for a pragma that
    names a macro reaching it, and for flags that record macros or the command line; not for a source that only
    asks whether it is defined."""
    work = tmp_path / "reach"
    work.mkdir()
    (work / "reach.h").write_text(REACH_H)
    (work / "cuda_min.h").write_text(CUDA_MIN_H)
    (work / "pragma.cu").write_text(PRAGMA_CU)
    (work / "unreached.cu").write_text(UNREACHED)
    for name, text in REACHES.items():
        (work / name).write_text(text)
    toolchain = find_toolchain({"OFFLOAD_CLANG": str(llvm22("clang")), "PATH": os.environ.get("PATH", ""),
                                "CUDA_PATH": str(CUDA_PATH)})
    model = CudaPhaseModel(toolchain, str(work))
    plain = ("-nocudainc", "-nocudalib", "-I.")
    for name in [*REACHES, "pragma.cu", "unreached.cu"]:
        one, two = (_record(model, toolchain, work, name, targets, plain) for targets in (["sm_80"],
                                                                                        ["sm_80", "sm_90"]))
        assert (one == two) == (name == "unreached.cu"), (name, one, two)
    assert "a #pragma names UNROLL" in _record(model, toolchain, work, "pragma.cu", ["sm_80"], plain)
    # (the model refuses -grecord-command-line and -frecord-command-line: they record the probe's paths)
    assert all(records_arch_list([flag], []) for flag in ("-grecord-command-line", "-frecord-command-line"))
    assert all(records_arch_list([], [word]) for word in ("-debug-info-macro", "-dwarf-debug-flags"))
    assert records_arch_list(["-g", "-O2"], ["-debug-info-kind=constructor"]) is None
    for flag in ("-g3", "-fdebug-macro"):
        records = {_record(model, toolchain, work, "unreached.cu", targets, (*plain, flag))
                   for targets in (["sm_80"], ["sm_80", "sm_90"])}
        assert len(records) == 2 and all(flag in record for record in records), (flag, records)


PRAGMA_SCONSTRUCT = textwrap.dedent("""
    import offload_builders.scons
    env = Environment(tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()],
                      OFFLOAD_CLANG=ARGUMENTS["clang"], OFFLOAD_ARCHS=ARGUMENTS["archs"], OFFLOAD_FLAGS=["-O2"],
                      CPPPATH=["."],
                      OFFLOAD_CUDA_FLAGS=["-nocudainc", "-nocudalib"] + ARGUMENTS.get("flags", "").split())
    for phase in ("HOST", "DEVICE", "ASSEMBLE", "BUNDLE"):
        env["OFFLOAD_%sCOMSTR" % phase] = "@@%s $TARGET" % phase
    env["OFFLOAD_ARCHLISTCOMSTR"] = "@@ARCHLIST $TARGET"
    env.OffloadObject("pragma.cu")
    env.OffloadObject("plain.cu")
""")


def test_clang22_a_source_the_list_reaches_through_a_pragma_or_recording_flags_reruns(tmp_path, llvm22, cuda):
    """Adding sm_90 reruns pragma.cu's sm_80 device compile (its ``#pragma unroll`` expands the list), whose
    cubin is the driver's one-command one for both targets; plain.cu's sm_80 cubin is kept. With
    ``-g3`` (macros recorded) both rerun. An edit that starts using the list in a header reruns the device
    compiles too."""
    work = tmp_path / "pragma"
    work.mkdir()
    (work / "SConstruct").write_text(PRAGMA_SCONSTRUCT)
    (work / "cuda_min.h").write_text(CUDA_MIN_H)
    (work / "pragma.cu").write_text(PRAGMA_CU)
    (work / "plain.h").write_text("#pragma once\n#define VALUE 2\n")
    (work / "plain.cu").write_text('#include "cuda_min.h"\n#include "plain.h"\n'
                                   "__global__ void k(float *x) { x[0] = VALUE; }\n")
    clang = f"clang={llvm22('clang')}"

    def device(build) -> list[str]:
        return sorted(target for phase, target in build.commands if phase == "DEVICE")

    run_scons(work, clang, "archs=sm_80")
    added = run_scons(work, clang, "archs=sm_80,sm_90")
    assert device(added) == ["plain.sm_90.cubin", "pragma.sm_80.cubin", "pragma.sm_90.cubin"], added.output
    reference = work / "pragma.reference.o"
    subprocess.run([str(llvm22("clang++")), "-x", "cuda", "--cuda-gpu-arch=sm_80", "--cuda-gpu-arch=sm_90",
                    f"-cuid={default_cuid('pragma.cu')}", f"--cuda-path={CUDA_PATH}", "-O2", "-I.", "-nocudainc",
                    "-nocudalib", "-c", "pragma.cu", "-o", str(reference)], cwd=work, check=True, capture_output=True)
    assert _nv_fatbin(llvm22, work / "pragma.o") == _nv_fatbin(llvm22, reference)
    # the header starts using the list: the next list change reruns plain.cu's device compiles too
    (work / "plain.h").write_text("#pragma once\n#define VALUE (__CUDA_ARCH_LIST__ > 850)\n")
    edited = run_scons(work, clang, "archs=sm_80,sm_90")
    assert device(edited) == ["plain.sm_80.cubin", "plain.sm_90.cubin"], edited.output
    added = run_scons(work, clang, "archs=sm_80,sm_90,sm_86")
    assert device(added) == [f"{stem}.{t}.cubin" for stem in ("plain", "pragma") for t in ("sm_80", "sm_86", "sm_90")]
    (work / "plain.h").write_text("#pragma once\n#define VALUE 2\n")
    run_scons(work, clang, "archs=sm_80,sm_90,sm_86")
    recorded = run_scons(work, clang, "archs=sm_80,sm_90,sm_86", "flags=-g3")
    assert len(device(recorded)) == 6
    removed = run_scons(work, clang, "archs=sm_80,sm_90", "flags=-g3")
    assert device(removed) == [f"{stem}.{t}.cubin" for stem in ("plain", "pragma") for t in ("sm_80", "sm_90")]


# --- offload-compile ----------------------------------------------------------------------------------------

#: Where each side's __CUDA_ARCH_LIST__ ends up as bytes: the device side's in every cubin, the host's in the object.
LIST_CU = '#include "cuda_min.h"\n' + textwrap.dedent("""
    #define OFFLOAD_STR2(...) #__VA_ARGS__
    #define OFFLOAD_STR(x) OFFLOAD_STR2(x)
    #ifdef __CUDA_ARCH__
    __device__ char device_list[] = "device_list=" OFFLOAD_STR(__CUDA_ARCH_LIST__);
    #else
    extern "C" const char host_list[] = "host_list=" OFFLOAD_STR(__CUDA_ARCH_LIST__);
    #endif
    __global__ void k(char *x, int i) {
    #ifdef __CUDA_ARCH__
      x[0] = device_list[i];
    #endif
    }
""")

LIST_SCONSTRUCT = textwrap.dedent("""
    import offload_builders.scons
    env = Environment(tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()],
                      OFFLOAD_CLANG=ARGUMENTS["clang"], OFFLOAD_ARCHS=["sm_90", "sm_80"], CPPPATH=["."],
                      OFFLOAD_CUDA_FLAGS=["-nocudainc", "-nocudalib"])
    env.OffloadObject("build/k.o", "k.cu")
""")
#: The flags of that SConstruct as offload-compile takes them (CPPPATH, then $OFFLOAD_CUDA_FLAGS).
LIST_FLAGS = ("-I.", "-nocudainc", "-nocudalib")


@pytest.fixture
def list_source(tmp_path) -> Path:
    work = tmp_path / "list"
    work.mkdir()
    (work / "cuda_min.h").write_text(CUDA_MIN_H)
    (work / "k.cu").write_text(LIST_CU)
    (work / "k.hip").write_text("__attribute__((global)) void k(float *x) { *x = 1; }\n")
    (work / "SConstruct").write_text(LIST_SCONSTRUCT)
    return work


def oc(work: Path, clang: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([*OFFLOAD_COMPILE, *args], cwd=work, capture_output=True, text=True,
                          env=dict(os.environ, OFFLOAD_CLANG=str(clang)))
    if check:
        assert done.returncode == 0, done.stderr
    return done


def test_offload_compile_cuda_device_and_host_take_the_drivers_arch_list(list_source, llvm22, cuda):
    """``device`` and ``host`` with ``--targets`` (all the source's targets, in any order): each cubin and the
    object define the driver's ``__CUDA_ARCH_LIST__`` for the whole list, and all are the SCons tool's, byte
    for byte."""
    work, clang = list_source, llvm22("clang")
    expected = driver_arch_list(llvm22("clang++"), ["sm_90", "sm_80"], ("-nocudainc", "-nocudalib"))
    for target in ("sm_90", "sm_80"):
        oc(work, clang, "device", "k.cu", "--target", target, "--targets", "sm_90,sm_80", "-o", f"k.{target}.cubin",
           "--source-root", ".", "--", *LIST_FLAGS)
        assert f"device_list={expected}\0".encode() in (work / f"k.{target}.cubin").read_bytes()
    oc(work, clang, "bundle", "k.cu", "--targets", "sm_90,sm_80", "-o", "k.fatbin", "k.sm_90.cubin",
       "k.sm_80.cubin", "--", *LIST_FLAGS)
    oc(work, clang, "host", "k.cu", "--targets", "sm_80,sm_90", "--fatbin", "k.fatbin", "-o", "k.o",
       "--source-root", ".", "--", *LIST_FLAGS)
    assert f"host_list={expected}\0".encode() in (work / "k.o").read_bytes()
    run_scons(work, f"clang={clang}")
    for name in ("k.sm_90.cubin", "k.sm_80.cubin", "k.fatbin", "k.o"):
        assert (work / name).read_bytes() == (work / "build" / name).read_bytes(), name


@pytest.mark.parametrize("args, message", [
    (["device", "k.cu", "--target", "sm_90", "-o", "x", "--", *LIST_FLAGS],
     "device: --targets is required with Clang 22: its CUDA compiles define __CUDA_ARCH_LIST__"),
    (["host", "k.cu", "--fatbin", "k.cu", "-o", "x", "--", *LIST_FLAGS],
     "host: --targets is required with Clang 22: its CUDA compiles define __CUDA_ARCH_LIST__"),
    (["host", "k.cu", "--package", "k.cu", "-o", "x", "--", *LIST_FLAGS, "-fgpu-rdc"], "host: --targets is required"),
    (["device", "k.cu", "--target", "sm_90", "--targets", "sm_80", "-o", "x", "--", *LIST_FLAGS],
     "device: --targets 'sm_80' does not name --target sm_90"),
    (["device", "k.cu", "--target", "sm_90", "--targets", "sm_90,gfx90a", "-o", "x", "--", *LIST_FLAGS],
     "--targets: CUDA offload targets must be NVPTX"),
    (["device", "k.hip", "--target", "gfx90a", "--targets", "gfx90a", "-o", "x", "--", "-nogpulib", "-nogpuinc"],
     "device: --targets is for `device` of CUDA (.cu) sources"),
])
def test_offload_compile_without_the_list_is_one_line_naming_the_option(list_source, llvm22, args, message):
    done = oc(list_source, llvm22("clang"), *args, check=False)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("offload-compile: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


def test_offload_compile_with_clang19_needs_no_list_and_ignores_one(list_source, llvm19, cuda):
    """Clang 19 defines no ``__CUDA_ARCH_LIST__``: ``device`` runs without ``--targets``, and with it gives the
    same cubin (a build that passes the list anyway gets what it got before)."""
    work, clang = list_source, llvm19("clang")
    oc(work, clang, "device", "k.cu", "--target", "sm_90", "-o", "a.cubin", "--cuid", "c", "--", *LIST_FLAGS)
    oc(work, clang, "device", "k.cu", "--target", "sm_90", "--targets", "sm_80,sm_90", "-o", "b.cubin", "--cuid", "c",
       "--", *LIST_FLAGS)
    assert (work / "a.cubin").read_bytes() == (work / "b.cubin").read_bytes()
