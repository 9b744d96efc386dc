"""The remote cache ($OFFLOAD_REMOTE) with a real BuildGrid server on loopback: a second checkout at another path
gets the first one's HIP and CUDA device code instead of compiling it, byte for byte; OpenMP's nodes, whose
target-region names hold the source's inode, are built locally (the identity rule); faults (a server stopped
mid-build, a corrupted blob, a wrong instance name) give a local build with one warning and nothing stale.

Processes are counted from an exec trace (``strace -ff -e trace=execve``), as in ``test_process_counts.py``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from test_process_counts import Process, read_trace
from test_scons_tool import SCONS, Build

REPO_ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow

#: The sample's HIP + CUDA + OpenMP program (sample_project/cuda/src: OpenMP x86_64/gfx90a/sm_80, HIP gfx90a,
#: CUDA sm_80, plain and relocatable device code, stub HIP and CUDA runtimes), built and run.
SAMPLE_TARGET = "build/cuda"

#: Outputs of the HIP and CUDA sources' nodes (objects, fat binaries, packages, cubins): identical in both
#: checkouts. The OpenMP source's (omp_part) and the program's device links, which hold OpenMP code, are not.
HIP_CUDA_OUTPUTS = ["plain_hip.o", "scale_hip.o", "rescale_hip.o", "scale.o", "shift.o", "offset.o",
                    "scale.fatbin", "shift.offload.pkg", "offset.offload.pkg", "shift.sm_80.cubin",
                    "offset.sm_80.cubin", "scale.sm_80.cubin"]


def copy_sample(destination: Path) -> Path:
    """The parts of sample_project the HIP + CUDA + OpenMP program reads, at ``destination``."""
    sample = REPO_ROOT / "sample_project"
    destination.mkdir(parents=True)
    shutil.copy(sample / "SConstruct", destination)
    for part in ("src", "include", "mixed", "cuda", "hip/include"):
        shutil.copytree(sample / part, destination / part)
    return destination


class Traced:
    """``scons`` under ``strace -ff`` with a given environment; the processes it started."""

    def __init__(self, tmp_path: Path, strace: str) -> None:
        self.tmp_path = tmp_path
        self.strace = strace
        self.runs = 0

    def __call__(self, root: Path, *args: str, env: dict[str, str]) -> tuple[Build, list[Process]]:
        self.runs += 1
        log = self.tmp_path / f"trace{self.runs}" / "pid"
        log.parent.mkdir()
        done = subprocess.run([self.strace, "-ff", "-ttt", "-qq", "-v", "-s", "65536", "-e", "trace=execve", "-e",
                               "status=successful", "-e", "signal=none", "-o", str(log), SCONS, "-Q", *args],
                              cwd=root, capture_output=True, text=True, env=env, check=False)
        build = Build(done.returncode, done.stdout + done.stderr)
        assert done.returncode == 0, build.output
        return build, [p for p in read_trace(log) if p.path != SCONS]


@pytest.fixture
def traced(tmp_path) -> Traced:
    found = shutil.which("strace")
    if not found:
        pytest.fail("strace is missing: run scripts/bootstrap (it installs it) or apt-get install strace")
    return Traced(tmp_path, found)


def build_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    """The environment of a build: one per-user cache for the test (one user on one machine), the settings."""
    return dict(os.environ, OFFLOAD_BUILDERS_CACHE_DIR=str(tmp_path / "user-cache"), **settings)


def hip_cuda_compiles(processes: list[Process]) -> list[Process]:
    """HIP and CUDA front-end jobs (device and host side) and the CUDA sources' ptxas runs."""
    found = []
    for process in processes:
        args = process.argv
        language = args[args.index("-x") + 1] if "-x" in args[:-1] else None
        if "-cc1" in args and ("-fcuda-is-device" in args or language in ("hip", "cuda")):
            found.append(process)
        elif process.program == "ptxas" and any(name in " ".join(args) for name in ("shift.", "offset.", "scale.")):
            found.append(process)
    return found


def openmp_jobs(processes: list[Process]) -> list[Process]:
    """The OpenMP source's host front end and device compiles."""
    return [p for p in processes if "-cc1" in p.argv and "omp_part.cpp" in " ".join(p.argv)
            and ("-emit-llvm-bc" in p.argv or "-fopenmp-is-target-device" in p.argv)]


def warnings(build: Build) -> list[str]:
    return [line for line in build.output.splitlines() if "warning" in line and "remote" in line]


def test_a_second_checkout_gets_hip_and_cuda_device_code_from_the_remote_cache(buildgrid, tmp_path, traced):
    first = copy_sample(tmp_path / "first" / "checkout")
    second = copy_sample(tmp_path / "elsewhere" / "second-checkout")
    env = build_env(tmp_path, OFFLOAD_REMOTE=buildgrid.remote)

    build, processes = traced(first, SAMPLE_TARGET, env=env)
    assert hip_cuda_compiles(processes), "the first checkout compiles its HIP and CUDA sources"
    assert not warnings(build), build.output

    build, processes = traced(second, SAMPLE_TARGET, env=env)
    assert not warnings(build), build.output
    assert hip_cuda_compiles(processes) == [], "the second checkout must take HIP and CUDA code from the cache"
    assert "remote cache:" in build.output
    # OpenMP: the host front end and every device compile run here (their region names hold the inode).
    omp = openmp_jobs(processes)
    assert len([p for p in omp if "-emit-llvm-bc" in p.argv and "-fopenmp-is-target-device" not in p.argv]) == 1
    assert len([p for p in omp if "-fopenmp-is-target-device" in p.argv]) == 3, omp
    # The program ran (its run log is the last node) and printed what the first one did.
    ours, theirs = first / SAMPLE_TARGET, second / SAMPLE_TARGET
    assert (theirs / "hetero.run.log").read_text() == (ours / "hetero.run.log").read_text()
    for name in HIP_CUDA_OUTPUTS:
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
    # What only the inode tells apart: the OpenMP host bitcode of each checkout names its own file.
    assert (ours / "omp_part.host.bc").read_bytes() != (theirs / "omp_part.host.bc").read_bytes()

    # Up to date afterwards: SCons recorded the downloaded outputs as its own.
    again, processes = traced(second, SAMPLE_TARGET, env=env)
    assert [p for p in processes if "-cc1" in p.argv or p.program in ("ptxas", "ld.lld")] == [], again.output


def test_a_hip_program_from_the_remote_cache_is_byte_identical(buildgrid, tmp_path, traced):
    """Without OpenMP nothing names a file's inode: the second checkout compiles nothing, and its program
    (relocatable device code: per-target device links, the wrapper, the host link) is the first's, byte for
    byte."""
    sample = REPO_ROOT / "sample_project" / "hip"
    first, second = tmp_path / "a" / "hip", tmp_path / "b" / "c" / "hip"
    for checkout in (first, second):
        shutil.copytree(sample, checkout, ignore=shutil.ignore_patterns("build", ".sconsign*"))
    env = build_env(tmp_path, OFFLOAD_REMOTE=buildgrid.remote)
    traced(first, "program=1", "rdc=1", env=env)
    build, processes = traced(second, "program=1", "rdc=1", env=env)
    assert not warnings(build), build.output
    assert hip_cuda_compiles(processes) == [], build.output
    assert [p for p in processes if "-cc1" in p.argv or p.program == "ld.lld" and ".hsaco" in " ".join(p.argv)] == []
    outputs = sorted(path.relative_to(first) for path in (first / "build").rglob("*") if path.is_file()
                     and not path.name.startswith(".sconsign"))
    assert (first / "build" / "prog").is_file() and outputs
    for relative in outputs:
        assert (first / relative).read_bytes() == (second / relative).read_bytes(), relative


FAULT_SCONSTRUCT = """
import os, signal
import offload_builders.scons
env = Environment(tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()],
                  OFFLOAD_ARCHS=["gfx90a", "gfx942"], OFFLOAD_FLAGS=["-O2"], OFFLOAD_MODEL="hip",
                  OFFLOAD_HIP_FLAGS=["-nogpulib", "-nogpuinc"], CPPPATH=["#include"])
first = env.OffloadObject("build/saxpy", "src/saxpy.hip")
if "stop_pid" in ARGUMENTS:
    # Between the two sources: stop the server (its pid given), as a crash or a network cut would.
    def stop(target, source, env):
        os.kill(int(ARGUMENTS["stop_pid"]), signal.SIGKILL)
        open(str(target[0]), "w").close()
    stopped = env.Command("build/stopped", first, stop)
    env.Depends(["build/scale.o"], stopped)
second = env.OffloadObject("build/scale", "src/scale.hip")
"""


def hip_checkout(root: Path) -> Path:
    """Two HIP sources of sample_project/hip, built as objects for two targets (FAULT_SCONSTRUCT)."""
    sample = REPO_ROOT / "sample_project" / "hip"
    (root / "src").mkdir(parents=True)
    shutil.copytree(sample / "include", root / "include")
    for name in ("saxpy.hip", "scale.hip"):
        shutil.copy(sample / "src" / name, root / "src")
    (root / "SConstruct").write_text(FAULT_SCONSTRUCT)
    return root


def local_reference(tmp_path: Path, traced: Traced) -> Path:
    """The same checkout built with no remote: what every faulty build must give."""
    reference = hip_checkout(tmp_path / "reference")
    traced(reference, env=build_env(tmp_path))
    return reference


def same_outputs(ours: Path, reference: Path) -> None:
    names = sorted(path.name for path in (reference / "build").iterdir() if path.name != "stopped")
    assert names and names == sorted(path.name for path in (ours / "build").iterdir() if path.name != "stopped")
    for name in names:
        assert (ours / "build" / name).read_bytes() == (reference / "build" / name).read_bytes(), name
    assert not [path for path in (ours / "build").iterdir() if ".partial" in path.name]


def test_a_server_stopped_mid_build_gives_a_local_build_and_one_warning(buildgrid, tmp_path, traced):
    reference = local_reference(tmp_path, traced)
    checkout = hip_checkout(tmp_path / "checkout")
    stop = f"stop_pid={buildgrid.pid}"
    env = build_env(tmp_path, OFFLOAD_REMOTE=buildgrid.remote)
    build, processes = traced(checkout, "-j1", stop, env=env)
    assert len(warnings(build)) == 1, build.output
    assert not buildgrid.running
    same_outputs(checkout, reference)
    # Nothing stale, nothing half-written: the next build (the server still down) runs nothing.
    again, processes = traced(checkout, "-j1", stop, env=env)
    assert [p for p in processes if "-cc1" in p.argv or p.program == "ld.lld"] == [], again.output
    assert not warnings(again), again.output


def test_a_corrupted_blob_is_rejected_and_the_node_built_here(tmp_path, traced):
    from remote_servers import start_buildgrid

    reference = local_reference(tmp_path, traced)
    with start_buildgrid(tmp_path / "server", disk=True) as server:
        env = build_env(tmp_path, OFFLOAD_REMOTE=server.remote)
        traced(hip_checkout(tmp_path / "first"), env=env)
        # Damage the stored code object of one node (same size: only its digest can tell).
        code_object = reference / "build" / "saxpy.gfx90a.hsaco"
        from offload_builders.remote.digests import digest_of_file

        blob = server.blob_path(digest_of_file(code_object).hash)
        assert blob.is_file()
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0xFF
        blob.write_bytes(bytes(data))
        checkout = hip_checkout(tmp_path / "second")
        build, processes = traced(checkout, env=env)
    assert len(warnings(build)) == 1 and "saxpy.gfx90a.hsaco" in warnings(build)[0], build.output
    compiled = [p for p in hip_cuda_compiles(processes) if "-fcuda-is-device" in p.argv]
    assert [p.option("-target-cpu") for p in compiled] == ["gfx90a"], build.output
    same_outputs(checkout, reference)


def test_a_wrong_instance_name_gives_a_local_build_and_one_warning(buildgrid, tmp_path, traced):
    reference = local_reference(tmp_path, traced)
    checkout = hip_checkout(tmp_path / "checkout")
    env = build_env(tmp_path, OFFLOAD_REMOTE=buildgrid.url + "/no-such-instance")
    build, processes = traced(checkout, env=env)
    assert len(warnings(build)) == 1 and "no-such-instance" in warnings(build)[0], build.output
    assert len([p for p in processes if "-fcuda-is-device" in p.argv]) == 4
    same_outputs(checkout, reference)


def test_device_compiles_run_on_a_remote_executor(casd_execution, tmp_path, traced):
    """$OFFLOAD_REMOTE_EXECUTE: buildbox-casd's execution service (bubblewrap sandboxes rooted at each
    Action's input root, the host's /usr bound read-only) runs the HIP and CUDA device compiles and assembles;
    OpenMP's device compiles stay here (a sandbox's copy of the source has another inode). The outputs are
    those of a local build, byte for byte, and the program runs."""
    reference = copy_sample(tmp_path / "reference")
    traced(reference, SAMPLE_TARGET, env=build_env(tmp_path))
    checkout = copy_sample(tmp_path / "checkout")
    env = build_env(tmp_path, OFFLOAD_REMOTE_EXECUTE=casd_execution.remote, OFFLOAD_REMOTE_PLATFORM="OSFamily=linux")
    build, processes = traced(checkout, SAMPLE_TARGET, env=env)
    assert not warnings(build), build.output
    assert [p for p in hip_cuda_compiles(processes) if "-fcuda-is-device" in p.argv or p.program == "ptxas"] == []
    executed = {line.split()[2] for line in build.output.splitlines() if line.startswith("remote execution: ")}
    # Every HIP and CUDA device compile (with its link or ptxas) ran there; so did their host compiles.
    device = {f"{SAMPLE_TARGET}/{name}" for name in ("plain_hip.gfx90a.hsaco", "scale_hip.gfx90a.dev.bc",
                                                     "rescale_hip.gfx90a.dev.bc", "scale.sm_80.cubin",
                                                     "shift.sm_80.cubin", "offset.sm_80.cubin")}
    assert device <= executed, sorted(executed)
    assert {f"{SAMPLE_TARGET}/{name}.o" for name in ("plain_hip", "scale", "shift")} <= executed
    assert not [name for name in executed if "omp_part" in name], sorted(executed)
    assert len([p for p in processes if "-fopenmp-is-target-device" in p.argv]) == 3
    ours, theirs = checkout / SAMPLE_TARGET, reference / SAMPLE_TARGET
    for name in HIP_CUDA_OUTPUTS:
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
    assert (ours / "hetero.run.log").read_text() == (theirs / "hetero.run.log").read_text()


def test_an_executor_without_matching_workers_gives_a_local_build_and_one_warning(casd_execution, tmp_path, traced):
    """A platform no worker has: the server refuses the Action; the build says so once and compiles here."""
    reference = local_reference(tmp_path, traced)
    checkout = hip_checkout(tmp_path / "checkout")
    env = build_env(tmp_path, OFFLOAD_REMOTE_EXECUTE=casd_execution.remote, OFFLOAD_REMOTE_PLATFORM="ISA=riscv64")
    build, processes = traced(checkout, env=env)
    assert len(warnings(build)) == 1, build.output
    assert len([p for p in processes if "-fcuda-is-device" in p.argv]) == 4
    same_outputs(checkout, reference)


def test_a_server_that_never_answers_costs_one_timeout_and_one_warning(tmp_path, traced):
    """A listening socket that never speaks gRPC (a hung server, a firewall that drops): the first call
    times out ($OFFLOAD_REMOTE_TIMEOUT), the build warns once and asks no more."""
    import socket

    reference = local_reference(tmp_path, traced)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        checkout = hip_checkout(tmp_path / "checkout")
        env = build_env(tmp_path, OFFLOAD_REMOTE=f"grpc://127.0.0.1:{port}/main", OFFLOAD_REMOTE_TIMEOUT="1",
                        OFFLOAD_REMOTE_RETRIES="0")
        build, processes = traced(checkout, env=env)
    assert len(warnings(build)) == 1 and "DEADLINE_EXCEEDED" in warnings(build)[0], build.output
    same_outputs(checkout, reference)


def test_without_the_remote_extra_the_build_is_local_with_one_warning(tmp_path, traced):
    """$OFFLOAD_REMOTE set where the REAPI client cannot be imported (here a `buildgrid` package without the
    stubs shadows buildgrid-common): one warning naming the extra, a local build."""
    reference = local_reference(tmp_path, traced)
    shadow = tmp_path / "shadow" / "buildgrid"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    checkout = hip_checkout(tmp_path / "checkout")
    env = build_env(tmp_path, OFFLOAD_REMOTE="grpc://127.0.0.1:9/main", PYTHONPATH=str(shadow.parent))
    build, _ = traced(checkout, env=env)
    assert len(warnings(build)) == 1 and "offload-builders[remote]" in warnings(build)[0], build.output
    same_outputs(checkout, reference)


def test_a_read_only_cache_is_read_and_never_written(buildgrid, tmp_path, traced):
    """OFFLOAD_REMOTE_UPLOAD=0 (a developer against a cache CI fills): a build uploads nothing, so a second
    checkout compiles everything; once a writing build has filled the cache, a read-only one takes from it."""
    env = build_env(tmp_path, OFFLOAD_REMOTE=buildgrid.remote, OFFLOAD_REMOTE_UPLOAD="0")
    traced(hip_checkout(tmp_path / "reader1"), env=env)
    build, processes = traced(hip_checkout(tmp_path / "reader2"), env=env)
    assert len([p for p in processes if "-fcuda-is-device" in p.argv]) == 4 and not warnings(build)
    traced(hip_checkout(tmp_path / "writer"), env=build_env(tmp_path, OFFLOAD_REMOTE=buildgrid.remote))
    build, processes = traced(hip_checkout(tmp_path / "reader3"), env=env)
    assert hip_cuda_compiles(processes) == [] and not warnings(build), build.output
