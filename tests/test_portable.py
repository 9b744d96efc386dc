"""Portable commands: another checkout of a project, or the same checkout moved, keeps the first one's
``CacheDir`` entries and up-to-date nodes wherever the output cannot name the checkout.

The driver's ``-cc1`` jobs name their working directory (``-fdebug-compilation-dir=<top>``); it reaches
the output only through debug info, coverage mapping and a few other flags. The checks, against the real
Clang 19:

* core: a compile's build signature is the same in two checkouts exactly where the object it produces is
  byte-identical there (no debug info, ``-ffile-compilation-dir=.``, ``-ffile-prefix-map=<top>=.``), and
  names the checkout where it is not (``-g``, coverage mapping, gcov);
* HIP: a second checkout with the same ``CacheDir`` runs no command, objects or RDC program alike, and
  its program behaves as the first one's; with ``-g`` it compiles again (its debug info names it), with
  ``-ffile-compilation-dir=.`` it does not;
* OpenMP: the second checkout's program runs on the x86_64 offload device and no file of its build names
  the first checkout (which compiles it takes from the cache is the source-identity rule's business:
  target-region names hold the source's inode); a moved checkout rebuilds nothing.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from offload_builders.driver import CommandTemplate, Slot
from offload_builders.models.hip import HipPhaseModel
from offload_builders.models.openmp import SIGNATURE_TOP, ProbeError, portable_signature
from offload_builders.targets import TargetID
from offload_builders.toolchain import find_toolchain
from test_hip import Sample
from test_scons_tool import Project

pytestmark = pytest.mark.slow

KERNEL = """\
#include "hip_min.h"
static __device__ int twice(int x) { return 2 * x; }
__global__ void kernel(int *out) { out[0] = twice(21); }
int host_value() { return __LINE__; }
"""

#: Run the x86_64 offload image through the installed libomptarget.
DEVICE_ENV = dict(os.environ, LD_LIBRARY_PATH="/usr/lib/llvm-19/lib", OMP_TARGET_OFFLOAD="MANDATORY")


def _names(root: Path, other: Path) -> list[str]:
    """The files under ``root`` whose bytes contain the path of ``other``."""
    needle = str(other).encode()
    return [str(path.relative_to(root)) for path in sorted(root.rglob("*"))
            if path.is_file() and not path.name.startswith(".sconsign") and needle in path.read_bytes()]


# --------------------------------------------------------------------------------------------------
# The core rule: equal signatures exactly where the outputs are equal
# --------------------------------------------------------------------------------------------------
def _checkout(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "src" / "k.hip").write_text(KERNEL)
    shutil.copy(Path(__file__).resolve().parent.parent / "sample_project" / "hip" / "include" / "hip_min.h",
                root / "include")
    (root / "k.hipfb").write_bytes(b"not a real fat binary, embedded as it is")
    return root


def _compile(root: Path, flags: tuple[str, ...]) -> tuple[list[str], list[str], bytes, bytes]:
    """Render and run, in ``root``, the device and host compiles of ``src/k.hip`` as the SCons tool does;
    their portable signatures and the objects they wrote."""
    model = HipPhaseModel(find_toolchain(), root)
    flags = ("-Iinclude", "-nogpulib", "-nogpuinc", *flags)
    device_template = model.device_steps(TargetID("gfx942"), flags).compile
    device_values = {"source": "src/k.hip", "main_file_name": "k.hip", "output": "k.dev.o", "cuid": "0123456789abcdef"}
    host_template = model.host_steps(flags).compile
    host_values = {"source": "src/k.hip", "main_file_name": "k.hip", "output": "k.o", "fatbin": "k.hipfb",
                   "cuid": "0123456789abcdef"}
    device, host = device_template.render(**device_values), host_template.render(**host_values)
    for argv in (device, host):
        subprocess.run(argv, cwd=root, check=True, capture_output=True)
    # what the SCons tool signs: the template's fixed words made portable once, then filled
    assert device_template.signature(str(root), **device_values) == portable_signature(device, str(root))
    assert host_template.signature(str(root), **host_values) == portable_signature(host, str(root))
    return (portable_signature(device, str(root)), portable_signature(host, str(root)),
            (root / "k.dev.o").read_bytes(), (root / "k.o").read_bytes())


@pytest.mark.parametrize("flags, portable", [
    ((), True),
    (("-O2",), True),
    (("-g",), False),
    (("-g", "-ffile-compilation-dir=."), True),
    (("-g", "-fdebug-compilation-dir=."), True),
    (("-g", "-ffile-prefix-map=TOP=."), True),
    (("-gline-tables-only", "-fdebug-prefix-map=TOP=/src"), True),
    (("-g", "-ffile-prefix-map=PARENT=."), False),  # the checkout's own name stays in the debug info
    (("-fprofile-instr-generate", "-fcoverage-mapping"), False),
    (("-fprofile-instr-generate", "-fcoverage-mapping", "-ffile-prefix-map=TOP=."), True),
    (("-fprofile-instr-generate",), True),
], ids=lambda value: " ".join(value) if isinstance(value, tuple) else None)
def test_signatures_are_equal_in_two_checkouts_exactly_where_the_objects_are(tmp_path, flags, portable):
    first, second = _checkout(tmp_path / "one" / "proj"), _checkout(tmp_path / "two" / "deeper" / "copy")
    results = []
    for root in (first, second):
        spelled = tuple(flag.replace("TOP", str(root)).replace("PARENT", str(root.parent)) for flag in flags)
        results.append(_compile(root, spelled))
    (device1, host1, device_obj1, host_obj1), (device2, host2, device_obj2, host_obj2) = results
    assert (device_obj1 == device_obj2 and host_obj1 == host_obj2) is portable
    assert (device1 == device2 and host1 == host2) is portable
    if portable:
        assert not any(str(first) in word for word in device1 + host1)
    else:  # the signature names the checkout the output records
        assert any(str(first) in word for word in host1)


@pytest.mark.parametrize("value, rewritten", [
    ("src/k.cpp", False),  # the debug info records the top directory: nothing is rewritten
    ("-fdebug-compilation-dir=.", True),  # the last one wins: the debug info records another directory
    ("-fdebug-prefix-map=/top/proj=.", True),  # the debug info records the top directory as "."
])
def test_a_template_signature_is_the_portable_signature_of_its_words_whatever_its_slots_hold(value, rewritten):
    """:meth:`CommandTemplate.signature` rewrites the fixed words once per top directory; a slot whose word
    is one of the flags :func:`portable_signature` decides by gets the words' own signature."""
    template = CommandTemplate(("clang", "-cc1", "-fdebug-compilation-dir=/top/proj", "-debug-info-kind=constructor",
                                Slot("input"), Slot("map", "-fdebug-prefix-map="), "-o", Slot("output")))
    values = {"input": value, "map": "/elsewhere=/src", "output": "/top/proj/k.o"}
    expected = portable_signature(template.render(**values), "/top/proj")
    assert template.signature("/top/proj", **values) == expected
    assert ("-fdebug-compilation-dir=#" in expected) is rewritten
    assert template.bind(**values).signature("/top/proj") == expected
    assert template.bind(**values).words() == template.render(**values)


def test_gcov_coverage_is_one_clear_error_not_a_probe_path_in_a_command(tmp_path):
    """``--coverage`` derives ``.gcno``/``.gcda`` names from the probe's output: no node could reproduce
    them, so the probe says so (and a plain compile stays portable)."""
    root = _checkout(tmp_path / "proj")
    model = HipPhaseModel(find_toolchain(), root)
    with pytest.raises(ProbeError, match=r"-coverage-notes-file=.*__offload_probe__\.gcno"):
        model.host_steps(("-nogpulib", "-nogpuinc", "--coverage"))
    plain = model.host_steps(("-nogpulib", "-nogpuinc")).compile.render(
        source="src/k.hip", main_file_name="k.hip", output="k.o", fatbin="k.hipfb", cuid="0123456789abcdef")
    assert f"-fdebug-compilation-dir={SIGNATURE_TOP}" in portable_signature(plain, str(root))


# --------------------------------------------------------------------------------------------------
# HIP: a second checkout with the same CacheDir runs no command
# --------------------------------------------------------------------------------------------------
def _hip_checkout(root: Path, cache: Path) -> Sample:
    sample = Sample(root)
    with open(root / "SConstruct", "a") as f:
        f.write(f"\nCacheDir({str(cache)!r})\n")
    return sample


@pytest.mark.parametrize("args", [(), ("rdc=1", "program=1"), ("program=1",)], ids=["objects", "rdc-program",
                                                                                      "program"])
def test_hip_second_checkout_compiles_no_node(tmp_path, args):
    first = _hip_checkout(tmp_path / "hip", tmp_path / "cache")
    second = _hip_checkout(tmp_path / "elsewhere" / "deeper" / "hip", tmp_path / "cache")
    built = first.scons(*args)
    assert built.by_phase["DEVICE"] and built.by_phase["HOST"]
    again = second.scons(*args)
    assert again.commands == [], again.output
    assert "Retrieved `build/saxpy.o' from cache" in again.output
    assert _names(second.root / "build", first.root) == []
    if "program=1" in args:
        runs = [subprocess.run([str(sample.root / "build" / "prog")], capture_output=True, text=True, check=True)
                for sample in (first, second)]
        assert runs[1].stdout == runs[0].stdout and runs[1].stdout


def test_hip_debug_info_names_each_checkout_unless_the_compilation_dir_is_relative(tmp_path):
    first = _hip_checkout(tmp_path / "hip", tmp_path / "cache")
    second = _hip_checkout(tmp_path / "elsewhere" / "hip", tmp_path / "cache")
    first.scons("flags=-g")
    debug = second.scons("flags=-g")
    assert debug.by_phase["DEVICE"] == 4 and debug.by_phase["HOST"] == 2, debug.output
    assert _names(second.root / "build", first.root) == []
    assert _names(second.root / "build", second.root) != []  # DW_AT_comp_dir: where it was compiled
    relocatable = "flags=-g -ffile-compilation-dir=."
    first.scons(relocatable)
    again = second.scons(relocatable)
    assert again.commands == [], again.output
    assert _names(second.root / "build", first.root) == []


# --------------------------------------------------------------------------------------------------
# OpenMP: the second checkout's program is right; a moved checkout rebuilds nothing
# --------------------------------------------------------------------------------------------------
def _run(project: Project) -> subprocess.CompletedProcess:
    return subprocess.run([str(project.root / "build" / "prog")], capture_output=True, text=True, env=DEVICE_ENV)


@pytest.mark.parametrize("ccflags", ["", "-g", "-g -ffile-compilation-dir=."])
def test_openmp_second_checkout_runs_on_the_device_and_names_no_other_checkout(tmp_path, ccflags):
    cache = f"cache={tmp_path / 'cache'}"
    first, second = Project(tmp_path / "proj"), Project(tmp_path / "elsewhere" / "deeper" / "proj")
    args = ("archs=x86_64", cache, *([f"ccflags={ccflags}"] if ccflags else []))
    first.scons(*args)
    second.scons(*args)
    run = _run(second)
    assert (run.returncode, run.stdout) == (0, "on_device=1 sum=6048\n"), run.stdout + run.stderr
    assert _names(second.root / "build", first.root) == []


@pytest.mark.parametrize("ccflags, recompiles", [("", False), ("-g -ffile-compilation-dir=.", False),
                                                 ("-g", True)])
def test_a_moved_checkout_rebuilds_only_what_records_its_place(tmp_path, ccflags, recompiles):
    project = Project(tmp_path / "proj")
    args = ("archs=x86_64", *([f"ccflags={ccflags}"] if ccflags else []))
    project.scons(*args)
    moved = tmp_path / "moved" / "proj"
    moved.parent.mkdir()
    project.root.rename(moved)
    project.root = moved
    again = project.scons(*args)
    if recompiles:  # the debug info named the old place
        assert again.by_phase["HOST"] == 2 and again.by_phase["DEVICE"] == 2, again.output
        assert _names(moved / "build", tmp_path / "proj") == []
    else:
        assert again.commands == [], again.output
    run = _run(project)
    assert (run.returncode, run.stdout) == (0, "on_device=1 sum=6048\n"), run.stdout + run.stderr
