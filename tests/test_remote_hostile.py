# mypy: disable-error-code="import-untyped"
"""A hostile REAPI server must not hang a build, fill its disk, exhaust its memory or write to its terminal, and
the URL's credentials are never printed.

The server (:class:`HostileServer`) runs in this process on loopback: Capabilities, ActionCache, CAS, ByteStream
and Execution. It is an honest cache until a test turns it: its action results then name each output by a digest
of a size it declares (its bytes never exist), and its ByteStream reads send a few bytes and stall, or send more
than declared, or fail with escape sequences in their status. Each test reproduces one defect:

* a stalling server and ``OFFLOAD_REMOTE_TIMEOUT=2``: a clean SCons build of a two-source OpenMP program takes
  seconds (one stall, one warning line, a local build, the program runs), not a stall per node;
* a blob declared larger than ``OFFLOAD_REMOTE_MAX_BLOB`` is refused before a byte is read or written; one that
  sends more than its digest's size is cut off there;
* a failed remote command's stderr is read from its end (64 KiB), not whole;
* the server's words (a stderr line, a status message, output names) reach the terminal with no control
  character;
* ``grpc://user:SECRET@...`` and ``?token=SECRET`` never appear in ``offload-compile``'s or SCons' output;
* a download killed by SIGTERM leaves a temporary file that the next run of the step removes.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from buildgrid.common.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as re_pb2,
    remote_execution_pb2_grpc as re_grpc,
)
from buildgrid.common.protos.google.bytestream import bytestream_pb2, bytestream_pb2_grpc
from buildgrid.common.protos.google.longrunning import operations_pb2
from buildgrid.common.protos.google.rpc import code_pb2, status_pb2

from offload_builders.errors import RemoteIntegrityError
from offload_builders.remote.actions import NodeJob, command_action
from offload_builders.remote.cache import RemoteCache
from offload_builders.remote.cli_jobs import RemoteSteps
from offload_builders.remote.client import RemoteCallError, RemoteClient, RemoteSettings
from offload_builders.remote.digests import Digest
from test_remote_cache import build_env
from test_remote_cli import OPENMP_COMMANDS, openmp_checkout
from test_scons_tool import SCONS, Build, Project

MiB = 1 << 20
#: What a hostile action result declares each output to be.
DECLARED = 64 * MiB
#: Characters a terminal acts on: C0 controls but the newline ending each line, DEL, C1 controls.
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")
#: Escape sequences: a window title, clear screen, cursor home, erase line, and a C1 CSI.
ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[H\x1b[2K\x9b31m"


def fake_digest(name: str, size: int) -> Digest:
    """A digest whose bytes no one has: what a hostile result names."""
    return Digest(hashlib.sha256(f"hostile {name}".encode()).hexdigest(), size)


class HostileServer:
    """An REAPI server in this process on loopback. ``mode`` is ``"honest"`` (a cache: what is uploaded is
    stored and served), or how it lies: every action result it has names its outputs by :func:`fake_digest` of
    ``declared`` bytes, and a ByteStream read of a blob it lacks then ``"stall"``\\ s (sends ``prefix`` bytes,
    then nothing until ``release``), ``"flood"``\\ s (sends ``flood`` bytes, whatever was declared) or
    ``"abort"``\\ s with ``abort_details``. ``virtual`` blobs (hash -> size, last bytes) are served by offset, made
    up on the fly (a stderr of any size). ``sent`` counts the bytes its reads sent."""

    def __init__(self) -> None:
        self.mode = "honest"
        self.declared = DECLARED
        self.prefix = 1000
        self.flood = 32 * MiB
        self.abort_details = ""
        self.blobs: dict[str, bytes] = {}
        self.results: dict[str, re_pb2.ActionResult] = {}
        self.virtual: dict[str, tuple[int, bytes]] = {}
        self.rewrite: Callable[[re_pb2.ActionResult], re_pb2.ActionResult] | None = None
        self.operation: operations_pb2.Operation | None = None
        self.release = threading.Event()
        self.sent = 0
        self.reads = 0
        self._lock = threading.Lock()
        server = self

        class Capabilities(re_grpc.CapabilitiesServicer):
            def GetCapabilities(self, request: Any, context: Any) -> Any:  # noqa: N802
                return re_pb2.ServerCapabilities(cache_capabilities=re_pb2.CacheCapabilities(
                    digest_function=[re_pb2.DigestFunction.SHA256], max_batch_total_size_bytes=4 * MiB))

        class ActionCache(re_grpc.ActionCacheServicer):
            def GetActionResult(self, request: Any, context: Any) -> Any:  # noqa: N802
                stored = server.results.get(request.action_digest.hash)
                if stored is None:
                    context.abort(grpc.StatusCode.NOT_FOUND, "no result")
                return server.answer(stored)

            def UpdateActionResult(self, request: Any, context: Any) -> Any:  # noqa: N802
                server.results[request.action_digest.hash] = request.action_result
                return request.action_result

        class Cas(re_grpc.ContentAddressableStorageServicer):
            def FindMissingBlobs(self, request: Any, context: Any) -> Any:  # noqa: N802
                return re_pb2.FindMissingBlobsResponse(missing_blob_digests=[
                    digest for digest in request.blob_digests if digest.hash not in server.blobs])

            def BatchUpdateBlobs(self, request: Any, context: Any) -> Any:  # noqa: N802
                for entry in request.requests:
                    server.blobs[entry.digest.hash] = entry.data
                return re_pb2.BatchUpdateBlobsResponse(responses=[
                    re_pb2.BatchUpdateBlobsResponse.Response(digest=entry.digest, status=status_pb2.Status())
                    for entry in request.requests])

            def BatchReadBlobs(self, request: Any, context: Any) -> Any:  # noqa: N802
                answers = []
                for digest in request.digests:
                    data = server.blobs.get(digest.hash)
                    status = status_pb2.Status(code=code_pb2.OK if data is not None else code_pb2.NOT_FOUND)
                    answers.append(re_pb2.BatchReadBlobsResponse.Response(digest=digest, data=data or b"",
                                                                          status=status))
                return re_pb2.BatchReadBlobsResponse(responses=answers)

        class ByteStream(bytestream_pb2_grpc.ByteStreamServicer):
            def Read(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
                yield from server.read(request, context)

            def Write(self, requests: Any, context: Any) -> Any:  # noqa: N802
                data = bytearray()
                name = ""
                for request in requests:
                    name = name or request.resource_name
                    data += request.data
                server.blobs[name.split("/blobs/")[1].split("/")[0]] = bytes(data)
                return bytestream_pb2.WriteResponse(committed_size=len(data))

        class Execution(re_grpc.ExecutionServicer):
            def Execute(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
                assert server.operation is not None
                yield server.operation

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        re_grpc.add_CapabilitiesServicer_to_server(Capabilities(), self.server)
        re_grpc.add_ActionCacheServicer_to_server(ActionCache(), self.server)
        re_grpc.add_ContentAddressableStorageServicer_to_server(Cas(), self.server)
        bytestream_pb2_grpc.add_ByteStreamServicer_to_server(ByteStream(), self.server)
        re_grpc.add_ExecutionServicer_to_server(Execution(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.url = f"grpc://127.0.0.1:{self.port}/main"
        self.server.start()

    def answer(self, stored: re_pb2.ActionResult) -> re_pb2.ActionResult:
        result = re_pb2.ActionResult()
        result.CopyFrom(stored)
        if self.mode != "honest":
            for entry in result.output_files:
                fake = fake_digest(entry.path, self.declared)
                entry.digest.CopyFrom(re_pb2.Digest(hash=fake.hash, size_bytes=fake.size))
        return self.rewrite(result) if self.rewrite else result

    def _send(self, data: bytes) -> bytestream_pb2.ReadResponse:
        with self._lock:
            self.sent += len(data)
        return bytestream_pb2.ReadResponse(data=data)

    def read(self, request: Any, context: Any) -> Iterator[bytestream_pb2.ReadResponse]:
        with self._lock:
            self.reads += 1
        blob_hash = request.resource_name.split("blobs/")[1].split("/")[0]
        start = request.read_offset
        if blob_hash in self.virtual:  # made up by offset: filler, then the last bytes
            size, last = self.virtual[blob_hash]
            end = size if request.read_limit == 0 else min(size, start + request.read_limit)
            while start < end and context.is_active():
                piece = min(end - start, 64 * 1024)
                data = b"x" * piece
                if start + piece > size - len(last):  # the tail
                    data = (b"x" * max(0, size - len(last) - start) + last[max(0, start - (size - len(last))):])[:piece]
                yield self._send(data)
                start += piece
            return
        if blob_hash in self.blobs:
            data = self.blobs[blob_hash][start:]
            for offset in range(0, len(data), MiB):
                yield self._send(data[offset:offset + MiB])
            return
        if self.mode == "abort":
            context.abort(grpc.StatusCode.INTERNAL, self.abort_details)
        if self.mode == "flood":
            for _ in range(self.flood // MiB):
                if not context.is_active():
                    return
                yield self._send(b"f" * MiB)
            return
        if self.mode == "stall":
            yield self._send(b"s" * self.prefix)
            while not self.release.wait(0.05) and context.is_active():
                pass
            return
        context.abort(grpc.StatusCode.NOT_FOUND, "no such blob")

    def stop(self) -> None:
        self.release.set()
        self.server.stop(0)


@pytest.fixture
def hostile() -> Iterator[HostileServer]:
    server = HostileServer()
    yield server
    server.stop()


def remote_warnings(output: str) -> list[str]:
    return [line for line in output.splitlines() if "warning:" in line]


def scons(root: Path, env: dict[str, str], timeout: float = 120) -> tuple[Build, float]:
    """``scons -Q`` in ``root`` and the seconds it took; past ``timeout`` it is killed and the test fails."""
    started = time.monotonic()
    try:
        done = subprocess.run([SCONS, "-Q"], cwd=root, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"the build did not finish in {timeout} s: {error.stdout!r} {error.stderr!r}")
    return Build(done.returncode, done.stdout + done.stderr), time.monotonic() - started


# --- 1. a stalling server does not hang the build ------------------------------------------------------------------


@pytest.mark.slow
def test_a_stalling_server_costs_a_clean_build_one_stall(hostile, tmp_path):
    """The server has the program's nodes (an earlier build stored them) but sends a few bytes of each output
    and stalls. With OFFLOAD_REMOTE_TIMEOUT=2 the first read ends after 2 s without a byte (three tries), the
    build says so in one warning line and builds everything here: seconds, not a stall per node (the declared
    64 MiB would have allowed 66 s a read)."""
    project = Project(tmp_path / "proj")  # OFFLOAD_ARCHS x86_64: main.cpp and scale.cpp
    env = build_env(tmp_path, OFFLOAD_REMOTE=hostile.url, OFFLOAD_REMOTE_TIMEOUT="2")
    first, _ = scons(project.root, env)
    assert first.returncode == 0 and not remote_warnings(first.output), first.output
    assert hostile.results, "the honest build stores its nodes"
    shutil.rmtree(project.root / "build")
    (project.root / ".sconsign.dblite").unlink()

    hostile.mode = "stall"
    build, elapsed = scons(project.root, env)
    print(f"clean build against a stalling server (OFFLOAD_REMOTE_TIMEOUT=2): {elapsed:.1f} s")
    assert build.returncode == 0, build.output
    assert elapsed < 60, f"{elapsed:.1f} s"  # a correctness bound on the hang: docs/remote.md states the real one
    (warning,) = remote_warnings(build.output)
    assert warning.startswith("scons: warning: remote grpc://127.0.0.1:") and "DEADLINE_EXCEEDED" in warning
    assert re.search(r"DEADLINE_EXCEEDED: no bytes came for 2\.\d s \(Read\)", warning), warning
    assert not [line for line in build.output.splitlines() if line.startswith("File ")], build.output
    assert not CONTROL.search(build.output)
    assert build.by_phase == first.by_phase, build.output  # every node built here
    assert hostile.reads >= 1
    assert not [path.name for path in (project.root / "build").iterdir() if path.name.endswith((".tmp", ".partial"))]
    run = subprocess.run([str(project.root / "build" / "prog")], capture_output=True, text=True,
                         env=dict(os.environ, OMP_TARGET_OFFLOAD="MANDATORY", LD_LIBRARY_PATH="/usr/lib/llvm-19/lib"))
    assert run.returncode == 0 and run.stdout == "on_device=1 sum=6048\n", run.stdout + run.stderr


def test_a_read_that_trickles_is_ended_by_the_rate_it_earns(hostile):
    """A byte now and then (never a 2 s gap) is no progress either: a read may fall behind MIN_TRANSFER_RATE by
    the timeout, not more, whatever the declared size would allow."""
    hostile.mode = "stall"
    settings = RemoteSettings.from_url(hostile.url, {"OFFLOAD_REMOTE_TIMEOUT": "1", "OFFLOAD_REMOTE_RETRIES": "0"})
    digest = fake_digest("trickle", DECLARED)

    def trickle(request: Any, context: Any) -> Iterator[bytestream_pb2.ReadResponse]:
        while context.is_active() and not hostile.release.is_set():
            yield hostile._send(b"t")
            time.sleep(0.3)

    hostile.read = trickle  # type: ignore[method-assign]
    with RemoteClient(settings) as client:
        started = time.monotonic()
        with pytest.raises(RemoteCallError, match="DEADLINE_EXCEEDED: .* slower than 1024 KiB/s"):
            client.read_blob(digest)
        assert time.monotonic() - started < 5


# --- 2. a declared size does not fill the disk -------------------------------------------------------------------


class Largest:
    """The largest file seen in a directory while a download runs (polled)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.size = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._done.is_set():
            for entry in os.scandir(self.directory):
                try:
                    self.size = max(self.size, entry.stat().st_size)
                except FileNotFoundError:
                    pass
            time.sleep(0.002)

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.size


@pytest.mark.parametrize(("environ", "declared"), [({"OFFLOAD_REMOTE_MAX_BLOB": "8M"}, DECLARED),
                                                   ({}, 2 << 30)])
def test_a_blob_larger_than_the_cap_is_refused_before_a_byte_is_written(hostile, tmp_path, environ, declared):
    hostile.mode = "flood"  # sends 32 MiB, whatever was declared
    out = tmp_path / "out"
    out.mkdir()
    settings = RemoteSettings.from_url(hostile.url, {"OFFLOAD_REMOTE_TIMEOUT": "5", "OFFLOAD_REMOTE_RETRIES": "0",
                                                     **environ})
    largest = Largest(out)
    with RemoteClient(settings) as client:
        try:
            with pytest.raises(RemoteIntegrityError) as error:
                client.download_to(fake_digest("huge", declared), out / "huge.o.partial")
        finally:
            written = largest.stop()
    assert (written, hostile.sent) == (0, 0), f"{written} bytes written, {hostile.sent} sent"
    assert re.search(r"larger than the \d+ bytes read at most \(OFFLOAD_REMOTE_MAX_BLOB\)", str(error.value))
    assert list(out.iterdir()) == []


def test_more_bytes_than_the_digest_says_stop_the_read_there(hostile, tmp_path):
    hostile.mode = "flood"
    out = tmp_path / "out"
    out.mkdir()
    largest = Largest(out)
    with RemoteClient(RemoteSettings.from_url(hostile.url, {"OFFLOAD_REMOTE_RETRIES": "0"})) as client:
        try:
            with pytest.raises(RemoteIntegrityError, match=f"more than {5 * MiB} bytes came"):
                client.download_to(fake_digest("five", 5 * MiB), out / "five.o.partial")
        finally:
            written = largest.stop()
    assert written <= 5 * MiB and list(out.iterdir()) == []


def test_a_blob_larger_than_the_free_space_is_refused(hostile, tmp_path, monkeypatch):
    hostile.mode = "flood"
    real = os.statvfs(tmp_path)

    class Full:
        f_bavail = 10
        f_frsize = real.f_frsize

    monkeypatch.setattr(os, "statvfs", lambda path: Full())
    with RemoteClient(RemoteSettings.from_url(hostile.url, {})) as client:
        with pytest.raises(RemoteIntegrityError) as error:
            client.download_to(fake_digest("big", 5 * MiB), tmp_path / "big.o.partial")
    assert hostile.sent == 0 and list(tmp_path.iterdir()) == []
    assert "bytes free beside" in str(error.value)


# --- 3. a failed action's stderr is read from its end --------------------------------------------------------------


def action(tmp_path: Path):  # noqa: ANN201 - ActionMessages
    job = NodeJob(root=str(tmp_path), steps=("true",), inputs={}, salt_lines=(), outputs=("out.o.partial",))
    return command_action(["/bin/true"], job)


def executed(result: re_pb2.ActionResult) -> operations_pb2.Operation:
    operation = operations_pb2.Operation(name="operations/1", done=True)
    operation.response.Pack(re_pb2.ExecuteResponse(result=result, status=status_pb2.Status()))
    return operation


def test_a_failed_remote_command_s_stderr_is_read_from_its_end_only(hostile, tmp_path):
    """A 64 MiB stderr blob: its last 64 KiB are read (ByteStream read_offset), its last line shown."""
    stderr = fake_digest("stderr", DECLARED)
    hostile.virtual[stderr.hash] = (stderr.size, b"noise\nerror: the real reason\n")
    hostile.operation = executed(re_pb2.ActionResult(
        exit_code=1, stderr_digest=re_pb2.Digest(hash=stderr.hash, size_bytes=stderr.size)))
    warnings: list[str] = []
    cache = RemoteCache(hostile.url, {}, warnings.append)
    assert not cache.execute(action(tmp_path), {}, {"out.o.partial": str(tmp_path / "out.o.partial")})
    assert warnings == ["remote execution of out.o.partial exited with status 1: error: the real reason; "
                        "running it here"]
    assert hostile.sent <= 64 * 1024


# --- 4. the server's words reach the terminal escaped --------------------------------------------------------------


def printed(capsys: pytest.CaptureFixture[str], run: Callable[[RemoteCache], object], url: str) -> str:
    """What ``offload-compile`` prints (its warnings, on stderr) while a fresh cache of ``url`` does ``run``."""
    steps = RemoteSteps("offload-compile", url)
    run(RemoteCache(url, {"OFFLOAD_REMOTE_RETRIES": "0"}, steps.warn))
    return capsys.readouterr().err


def test_escape_sequences_from_the_server_never_reach_the_terminal(hostile, tmp_path, capsys):
    messages = action(tmp_path)
    destinations = {"out.o.partial": str(tmp_path / "out.o.partial")}

    # A failed command's stderr line.
    hostile.operation = executed(re_pb2.ActionResult(exit_code=1, stderr_raw=f"error: {ESCAPES}bad\n".encode()))
    err = printed(capsys, lambda cache: cache.execute(messages, {}, destinations), hostile.url)
    assert "exited with status 1: error: \\x1b]0;owned\\x07\\x1b[2J" in err and not CONTROL.search(err), repr(err)

    # An execution's status message and the operation's name.
    hostile.operation = operations_pb2.Operation(name=f"op{ESCAPES}", done=True,
                                                 error=status_pb2.Status(code=code_pb2.INTERNAL, message=ESCAPES))
    err = printed(capsys, lambda cache: cache.execute(messages, {}, destinations), hostile.url)
    assert "failed: INTERNAL: \\x1b]0;owned" in err and not CONTROL.search(err), repr(err)

    # A ByteStream read's status, and an action result's output names.
    hostile.results[messages.action_digest.hash] = re_pb2.ActionResult(output_files=[
        re_pb2.OutputFile(path="out.o.partial", digest=re_pb2.Digest(hash="0" * 64, size_bytes=10 * MiB))])
    hostile.mode, hostile.abort_details = "abort", f"storage {ESCAPES} failed"
    err = printed(capsys, lambda cache: cache.fetch(messages, destinations), hostile.url)
    assert "INTERNAL: storage \\x1b]0;owned" in err and not CONTROL.search(err), repr(err)

    def renamed(result: re_pb2.ActionResult) -> re_pb2.ActionResult:
        result.output_files[0].path = f"out{ESCAPES}.o"
        return result

    hostile.rewrite = renamed
    err = printed(capsys, lambda cache: cache.fetch(messages, destinations), hostile.url)
    assert "names outputs ['out\\x1b]0;owned" in err and not CONTROL.search(err), repr(err)


# --- 5. credentials in the URL are never printed -------------------------------------------------------------------


SECRET_URLS = ["grpc://builder:SECRET@127.0.0.1:9/main", "grpc://127.0.0.1:9/main?token=SECRET"]


@pytest.mark.slow
@pytest.mark.parametrize("url", SECRET_URLS)
def test_a_secret_in_the_url_is_not_printed_by_offload_compile(tmp_path, url):
    checkout = openmp_checkout(tmp_path / "omp")
    done = subprocess.run(OPENMP_COMMANDS[0], cwd=checkout, env=build_env(tmp_path, OFFLOAD_REMOTE=url),
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    (warning,) = remote_warnings(done.stderr)
    assert warning.startswith("offload-compile: warning: remote grpc://")
    assert "***" in warning and "SECRET" not in done.stdout + done.stderr, done.stderr


@pytest.mark.slow
def test_a_secret_in_the_url_is_not_printed_by_scons(tmp_path):
    project = Project(tmp_path / "proj")
    for url in SECRET_URLS:
        build, _ = scons(project.root, build_env(tmp_path, OFFLOAD_REMOTE=url))
        assert build.returncode == 0 and len(remote_warnings(build.output)) == 1, build.output
        assert "SECRET" not in build.output, build.output
        # One line: not followed by SCons' "File ..., line N, in _warn" of the tool's own code.
        assert not [line for line in build.output.splitlines() if line.startswith("File ")], build.output
        shutil.rmtree(project.root / "build")
        (project.root / ".sconsign.dblite").unlink()


# --- 6. a download killed by SIGTERM is swept ----------------------------------------------------------------------


@pytest.mark.slow
def test_a_download_killed_by_sigterm_is_swept_by_the_next_run(hostile, tmp_path):
    checkout = openmp_checkout(tmp_path / "omp")
    command = OPENMP_COMMANDS[0]  # the host front end: out/k.host.bc
    env = build_env(tmp_path, OFFLOAD_REMOTE=hostile.url, OFFLOAD_REMOTE_TIMEOUT="60")
    subprocess.run(command, cwd=checkout, env=env, check=True, capture_output=True)
    built = (checkout / "out" / "k.host.bc").read_bytes()
    temporary = re.compile(r"\.k\.host\.bc\.partial\.[0-9]+\.[0-9]+\.tmp")

    hostile.mode = "stall"
    process = subprocess.Popen(command, cwd=checkout, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not [name for name in os.listdir(checkout / "out") if temporary.fullmatch(name)]:
        assert process.poll() is None and time.monotonic() < deadline, "the download did not start"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == -signal.SIGTERM
    (left,) = [name for name in os.listdir(checkout / "out") if temporary.fullmatch(name)]

    hostile.mode = "honest"
    done = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, check=True)
    assert not remote_warnings(done.stderr), done.stderr
    assert not (checkout / "out" / left).exists()
    assert [name for name in os.listdir(checkout / "out") if ".tmp" in name or ".partial" in name] == []
    assert (checkout / "out" / "k.host.bc").read_bytes() == built
