"""Interrupted builds leave nothing behind (issue 12: "Never a wrong or stale program").

* A ``-j2`` build of a two-source program for ``x86_64,gfx90a,sm_80``, killed ten times at seeded random
  moments (SIGKILL to the whole process group, or SIGINT to it as Ctrl-C sends it) and then built to the
  end, has exactly the files of a clean build in the same directory, byte for byte, and no temporary;
  the program runs; ``scons -c`` then leaves nothing under ``build/``.
* Leftovers planted with the real tools' naming (Clang's ``-cc1`` temporary, ld.lld's, our writers', the
  partial output, the device link's ``.inputs/``) next to a node's target are gone after the node runs,
  and after ``scons -c``; files whose names are not made from a node's target stay.

``OFFLOAD_INTERRUPT_SEED`` replays another schedule of interruptions.
"""
from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from test_hip import Sample
from test_scons_tool import SCONS, Project

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("OFFLOAD_INTERRUPT_SEED", "12"))
ROUNDS = 10
ARCHS = "archs=x86_64,gfx90a,sm_80"
#: What no finished build may leave anywhere in the project.
LEFTOVER = re.compile(r"\.tmp|\.partial|\.uncompressed|\.package$|\.ptx$|\.inputs$")


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and directory (``None``) under ``root``, by relative path."""
    found: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        found[str(path.relative_to(root))] = None if path.is_dir() else path.read_bytes()
    return found


def _leftovers(root: Path) -> list[str]:
    return [str(path.relative_to(root)) for path in root.rglob("*") if LEFTOVER.search(path.name)]


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs (zombies do not count: nobody may reap them here)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _interrupted_build(project: Project, after: int, delay: float, sig: signal.Signals) -> str:
    """Start ``scons -j2`` in its own process group; ``delay`` seconds after it starts its ``after``-th command,
    send ``sig`` to the group. Returns what happened, for the test's output."""
    proc = subprocess.Popen([SCONS, "-Q", "-j2", ARCHS], cwd=project.root, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    started: list[str] = []
    reached = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(b"@@"):  # the SConstruct's COMSTR: a command starts
                started.append(line[2:].decode().strip())
                if len(started) == after:
                    reached.set()
        reached.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert reached.wait(timeout=600), "the build neither starts commands nor ends"
        if proc.poll() is None:
            time.sleep(delay)
        if proc.poll() is not None:
            return f"finished (rc {proc.returncode}) after {len(started)} commands"
        os.killpg(proc.pid, sig)
        proc.wait(timeout=600)  # SIGINT: SCons waits for the commands that are running
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join()
    deadline = time.monotonic() + 60
    while _group_alive(proc.pid):  # a killed group's last processes may outlive scons by a moment
        assert time.monotonic() < deadline, "the interrupted build's processes do not end"
        time.sleep(0.05)
    return f"{sig.name} {delay:.2f}s after command {after} ({started[-1] if started else 'none'})"


def test_a_build_interrupted_at_random_moments_ends_as_the_clean_build(tmp_path):
    project = Project(tmp_path / "proj")
    project.scons("-j2", ARCHS)
    clean_build = _tree(project.root / "build")
    assert project.run_program().stdout == "on_device=1 sum=6048\n"
    project.scons("-c", ARCHS)
    assert not [p for p, data in _tree(project.root / "build").items() if data is not None]

    rng = random.Random(SEED)
    signals = [signal.SIGKILL] * 7 + [signal.SIGINT] * 3
    rng.shuffle(signals)
    seen = []
    for sig in signals[:ROUNDS]:
        event = _interrupted_build(project, rng.randint(1, 6), rng.uniform(0.0, 0.6), sig)
        left = _leftovers(project.root)
        seen.append(f"{event}: {len(left)} leftovers {left}")
        if event.startswith("finished"):
            project.scons("-c", ARCHS)  # the next round has a whole build to interrupt
    print("\n".join(seen))

    project.scons("-j2", ARCHS)
    final = _tree(project.root / "build")
    assert sorted(final) == sorted(clean_build), "\n".join(seen)
    assert [p for p in final if final[p] != clean_build[p]] == []
    assert _leftovers(project.root) == [], "\n".join(seen)
    run = project.run_program()
    assert run.returncode == 0 and run.stdout == "on_device=1 sum=6048\n", run.stdout + run.stderr

    project.scons("-c", ARCHS)
    assert list((project.root / "build").iterdir()) == []


#: Planted next to targets of the program's nodes: each name is what the real tool writes for that node.
PLANTED = (
    "main.x86_64.dev.o-0123abcd.partial.tmp",  # clang -cc1, killed mid-compile
    "scale.host.bc-89abcdef.partial.tmp",
    "main.host.bc.partial",  # the command finished, the commit did not happen
    "prog.x86_64.img.partial.tmp1a2b3c4",  # ld.lld (llvm::FileOutputBuffer), killed mid-link
    "prog.partial.tmp5d6e7f8",
    ".prog.x86_64.devin.partial.4242.1.tmp",  # our writer (formats' Outputs), killed mid-write
    "prog.x86_64.img.inputs/000.o",  # the device link's unpacked inputs
    "prog.x86_64.img.inputs/offload-tmp-k1ll3d/000-5e1f00.cubin",  # and its $TMPDIR, killed mid-link
    "main.o.partial.package",  # the object's package, written, not yet embedded
    ".scale.o.partial.package.4242.2.tmp",  # our package writer, killed mid-write
    "scale.o.partial.package.tmp9f8e7d6",  # clang-offload-packager ($_OFFLOAD_PACKAGE_CMD), killed mid-write
)
#: Names no node's command writes: they stay.
KEPT = ("notes.txt", "other.o-0123abcd.partial.tmp", "main.x86_64.dev.o-notours.partial.tmp", "main.o.partial.bak",
        "other.o.partial.package")


def _plant(build: Path, names: tuple[str, ...]) -> None:
    for name in names:
        (build / name).parent.mkdir(parents=True, exist_ok=True)
        (build / name).write_bytes(b"left by a killed build\n")


def test_a_nodes_leftovers_are_swept_before_it_runs_and_by_scons_clean(tmp_path):
    project = Project(tmp_path / "proj")
    build = project.root / "build"
    _plant(build, PLANTED + KEPT)
    project.scons()
    assert sorted(p.name for p in build.iterdir() if p.name in KEPT or LEFTOVER.search(p.name)) == sorted(KEPT)
    assert project.run_program().returncode == 0

    _plant(build, PLANTED)
    cleaned = project.scons("-c")
    assert sorted(str(p.relative_to(build)) for p in build.rglob("*")) == sorted(KEPT), cleaned.output


def test_an_nvptx_device_nodes_ptx_is_swept_before_it_runs_and_by_scons_clean(tmp_path):
    """The PTX an NVPTX device node's compile writes for its ptxas step (``<cubin>.partial.ptx``) and Clang's
    temporary of it are the node's leftovers when a build is killed between the two."""
    project = Project(tmp_path / "proj")
    build = project.root / "build"
    planted = ("scale.sm_80.dev.cubin.o.partial.ptx",  # the PTX, written, not yet assembled
               "scale.sm_80.dev.cubin.o.partial-0123abcd.ptx.tmp")  # clang -cc1 writing it, killed
    kept = ("scale.sm_80.dev.cubin.o.ptx", "other.o.partial.ptx", "scale.sm_80.dev.cubin.o.partial-notours.ptx.tmp")
    _plant(build, planted + kept)
    project.scons(ARCHS)
    assert sorted(p.name for p in build.iterdir() if ".ptx" in p.name) == sorted(kept)
    _plant(build, planted)
    cleaned = project.scons("-c", ARCHS)
    assert sorted(str(p.relative_to(build)) for p in build.rglob("*")) == sorted(kept), cleaned.output


def test_hip_nodes_leftovers_are_swept_and_cleaned(tmp_path):
    sample = Sample(tmp_path / "hip")
    planted = ("saxpy.hipfb.partial.uncompressed", ".saxpy.hipfb.partial.uncompressed.4242.3.tmp",
               "saxpy.gfx942.hsaco.partial.tmp89abcde",  # ld.lld, killed mid-link
               "saxpy.gfx942.hsaco.partial.device.o",  # the device object, compiled, not yet linked
               "saxpy.gfx942.hsaco.partial.device-89abcdef.o.tmp",  # clang -cc1 writing it, killed
               "stencil.o-00ff00ff.partial.tmp")
    build = sample.root / "build"
    _plant(build, planted + ("saxpy.hipfb.uncompressed",))
    sample.scons("compress=2")
    assert [name for name in planted if (build / name).exists()] == []
    assert (build / "saxpy.hipfb.uncompressed").exists()
    _plant(build, planted)
    sample.scons("-c", "compress=2")
    assert sorted(p.name for p in build.rglob("*")) == ["saxpy.hipfb.uncompressed"]


def _kill_when(project: Project, line_start: str, *args: str) -> list[str]:
    """Run ``scons`` and SIGKILL its process group once it prints a line starting with ``line_start`` (a
    command's label, ``@@LINK ``: as the command starts; ``Retrieved `...``: as SCons starts to copy that
    node from the CacheDir); the lines seen."""
    proc = subprocess.Popen([SCONS, "-Q", *args], cwd=project.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line.decode().strip())
        if line.startswith(line_start.encode()):
            os.killpg(proc.pid, signal.SIGKILL)
            break
    proc.wait()
    deadline = time.monotonic() + 60
    while _group_alive(proc.pid):
        assert time.monotonic() < deadline, "the killed build's processes do not end"
        time.sleep(0.05)
    assert proc.returncode == -signal.SIGKILL, seen
    return seen


def _kill_while_a_link_has_its_tmpdir(project: Project, tmpdir: Path, *args: str) -> None:
    """Run ``scons`` with ``$TMPDIR`` set to ``tmpdir`` and SIGKILL its process group once a link's private
    ``$TMPDIR`` (``offload-tmp-*``) exists, in ``tmpdir`` or in a node's scratch directory under ``build/``."""
    proc = subprocess.Popen([SCONS, "-Q", *args], cwd=project.root, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, env=dict(os.environ, TMPDIR=str(tmpdir)))
    deadline = time.monotonic() + 600
    while not (list(tmpdir.glob("offload-tmp-*")) or list((project.root / "build").glob("*/offload-tmp-*"))):
        assert proc.poll() is None, "the build ended before a link made its $TMPDIR"
        assert time.monotonic() < deadline, "no link made its $TMPDIR"
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    while _group_alive(proc.pid):
        time.sleep(0.05)


@pytest.mark.parametrize("args", [("archs=sm_80",), ("archs=gfx90a", "groups=1")], ids=["nvptx-runtime", "groups"])
def test_a_killed_runtime_or_group_link_leaves_its_temporaries_in_the_build_not_in_tmpdir(tmp_path, args):
    """The NVPTX device runtime's link (the first link of an sm_80 program with a generic kernel) and an
    image group's link run with a ``$TMPDIR`` inside their node's scratch directory: killed, they leave
    nothing in the user's ``$TMPDIR``, and the next build sweeps what they left and builds the program."""
    project = Project(tmp_path / "proj")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    _kill_while_a_link_has_its_tmpdir(project, tmpdir, *args)
    assert sorted(os.listdir(tmpdir)) == []
    project.scons(*args)
    assert _leftovers(project.root / "build") == []
    assert not list((project.root / "build").rglob("offload-tmp-*"))
    assert (project.root / "build" / "prog").exists()  # (sm_80 and gfx90a programs cannot run here)


def test_cache_retrievals_of_a_killed_build_are_not_taken_as_up_to_date_after_a_branch_switch(tmp_path):
    """A CacheDir retrieval writes an output SCons records only when the build ends, as a command does. Built
    for FACTOR 4.0 (recorded), switched back to 3.0 and killed after the objects were retrieved, switched to
    4.0 again: without the journal, the retrieved 3.0 objects match the 4.0 record and are kept."""
    project = Project(tmp_path / "proj")
    cache = f"cache={tmp_path / 'cache'}"
    header = project.root / "include" / "main.hpp"
    original = header.read_text()
    project.scons(cache)  # FACTOR 3.0, cached
    header.write_text(original.replace("FACTOR 3.0", "FACTOR 4.0"))
    project.scons(cache)  # FACTOR 4.0, cached and recorded
    factor_4 = (project.root / "build" / "main.o").read_bytes()
    header.write_text(original)  # back to 3.0: everything comes from the cache
    seen = _kill_when(project, "Retrieved `build/prog", cache)
    assert any(line.startswith("Retrieved `build/main.o'") for line in seen), seen
    assert (project.root / "build" / "main.o").read_bytes() != factor_4  # the 3.0 object, unrecorded
    header.write_text(original.replace("FACTOR 3.0", "FACTOR 4.0"))
    again = project.scons(cache)
    assert (project.root / "build" / "main.o").read_bytes() == factor_4, again.output
    run = project.run_program()
    assert run.returncode == 0 and run.stdout == "on_device=1 sum=8064\n", run.stdout + run.stderr
    assert not (project.root / ".sconsign.offload-unrecorded").exists()


def test_outputs_of_a_killed_build_are_not_taken_as_up_to_date_after_an_edit_is_undone(tmp_path):
    """SCons records what it built only when the build ends: without the journal of unrecorded outputs,
    the FACTOR 4.0 objects of the killed build match the FACTOR 3.0 record once the edit is undone."""
    project = Project(tmp_path / "proj")
    project.scons()
    header = project.root / "include" / "main.hpp"
    original = header.read_text()
    header.write_text(original.replace("FACTOR 3.0", "FACTOR 4.0"))
    seen = _kill_when(project, "@@LINK ")
    assert "@@EMBED build/main.o" in seen  # the FACTOR 4.0 object was written before the kill
    header.write_text(original)  # the edit undone (or the branch switched back)
    again = project.scons()
    assert again.count("EMBED", "main.o") == 1, again.output
    run = project.run_program()
    assert run.returncode == 0 and run.stdout == "on_device=1 sum=6048\n", run.stdout + run.stderr
    assert not (project.root / ".sconsign.offload-unrecorded").exists()
    assert project.scons().commands == []
