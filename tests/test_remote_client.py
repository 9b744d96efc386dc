# mypy: disable-error-code="import-untyped"
"""The REAPI client (offload_builders.remote.client) against real servers on loopback: BuildGrid (CAS, ByteStream,
ActionCache; also with TLS and with JWT authorization, from configurations written here) and buildbox-casd
(Execution). What no honest server does (send a blob that does not match its digest, fail an execution in the
protocol's ways) comes from a small gRPC server in this process that lies on purpose.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import shutil
import socket
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

from offload_builders.errors import RemoteError, RemoteIntegrityError
from offload_builders.remote.client import (
    BLOB_OVERHEAD,
    DEFAULT_MAX_BATCH_BYTES,
    BlobNotFoundError,
    RemoteCallError,
    RemoteClient,
    RemoteSettings,
    from_proto,
    parse_headers,
    to_proto,
    verify_blob,
)
from offload_builders.remote.digests import EMPTY_DIGEST, Digest, digest_of_bytes
from offload_builders.remote.text import redact_url
from remote_servers import NO_AUTHORIZATION, BuildGridServer, ExecutionServer, bgd_path, buildgrid_config, free_port

MiB = 1 << 20


def client_for(server: BuildGridServer | ExecutionServer, **settings: Any) -> RemoteClient:
    return RemoteClient(RemoteSettings(target=server.target, instance=server.instance, **settings))


def fresh(size: int) -> bytes:
    """Bytes no other test (nor an earlier run against the session's server) has stored."""
    return os.urandom(size)


class Counting:
    """Wraps one of a client's stub methods and counts its calls (which path a transfer took)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, stub: object, name: str) -> None:
        self.calls = 0
        original = getattr(stub, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(stub, name, counted)


def leftovers(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir() if path.name.startswith("."))


# --- settings ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "target", "secure", "instance"), [
    ("grpc://127.0.0.1:8980", "127.0.0.1:8980", False, ""),
    ("grpc://127.0.0.1:8980/", "127.0.0.1:8980", False, ""),
    ("grpcs://cache.example.com:443/main", "cache.example.com:443", True, "main"),
    ("grpc://[::1]:9000/projects/gpu/", "[::1]:9000", False, "projects/gpu"),
    (" grpc://localhost:1/a \n", "localhost:1", False, "a"),
])
def test_url_forms(url: str, target: str, secure: bool, instance: str) -> None:
    settings = RemoteSettings.from_url(url, {})
    assert (settings.target, settings.secure, settings.instance) == (target, secure, instance)
    assert (settings.timeout_s, settings.retries, settings.headers) == (10.0, 2, ())
    assert settings.max_batch_bytes == DEFAULT_MAX_BATCH_BYTES < 4 * MiB


@pytest.mark.parametrize("url", [
    "http://x", "https://cache:443", "grpc://host", "grpc://:80", "grpc://host:0", "grpc://host:99999",
    "grpc://host:port", "grpc://user:secret@host:80", "grpc://host:80?instance=a", "grpc://host:80#a", "host:80",
    "", "grpc://host:80/a//b", "grpc://host:80/blobs", "grpc://host:80/main/uploads/x",
])
def test_bad_urls_are_one_line_naming_the_variable(url: str) -> None:
    with pytest.raises(RemoteError) as error:
        RemoteSettings.from_url(url, {})
    message = str(error.value)
    # The URL as given, or redacted where it may hold a credential (user information, a query, a fragment).
    assert message.startswith(f"OFFLOAD_REMOTE={redact_url(url)!r}: ") and "\n" not in message
    assert "secret" not in message
    assert "grpc://HOST:PORT[/INSTANCE]" in message or "instance name" in message


def test_environment_settings(tmp_path: Path) -> None:
    header_file = tmp_path / "headers"
    header_file.write_text("# tokens\nx-team=gpu\n\nx-build: 42, with a comma\n")
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("")
    settings = RemoteSettings.from_url("grpcs://cache:443/from-url", {
        "OFFLOAD_REMOTE_INSTANCE": "/from/env/",
        "OFFLOAD_REMOTE_CA": str(tmp_path / "ca.pem"),
        "OFFLOAD_REMOTE_CERT": str(tmp_path / "cert.pem"),
        "OFFLOAD_REMOTE_KEY": str(tmp_path / "key.pem"),
        "OFFLOAD_REMOTE_HEADERS": "Authorization=Bearer abc==, x-client=offload",
        "OFFLOAD_REMOTE_HEADER_FILE": str(header_file),
        "OFFLOAD_REMOTE_TIMEOUT": "2.5",
        "OFFLOAD_REMOTE_RETRIES": "0",
        "OFFLOAD_REMOTE_UNRELATED": "ignored",
    })
    assert settings.instance == "from/env"
    assert (settings.root_certificates, settings.client_certificate, settings.client_key) == (
        str(tmp_path / "ca.pem"), str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))
    assert settings.headers == (("authorization", "Bearer abc=="), ("x-client", "offload"), ("x-team", "gpu"),
                                ("x-build", "42, with a comma"))
    assert (settings.timeout_s, settings.retries) == (2.5, 0)
    assert settings.url == "grpcs://cache:443/from/env"
    assert "abc==" not in repr(settings)
    # Empty variables count as unset.
    assert RemoteSettings.from_url("grpc://h:1/a", {"OFFLOAD_REMOTE_INSTANCE": "", "OFFLOAD_REMOTE_CA": " "}
                                   ) == RemoteSettings(target="h:1", instance="a")


def test_headers_on_separate_lines_may_hold_commas() -> None:
    assert parse_headers("authorization=Bearer a,b\nx-y=1\n", "HEADERS") == (
        ("authorization", "Bearer a,b"), ("x-y", "1"))


@pytest.mark.parametrize(("environ", "expected"), [
    ({"OFFLOAD_REMOTE_TIMEOUT": "soon"}, "OFFLOAD_REMOTE_TIMEOUT='soon': expected seconds"),
    ({"OFFLOAD_REMOTE_TIMEOUT": "-1"}, "OFFLOAD_REMOTE_TIMEOUT='-1'"),
    ({"OFFLOAD_REMOTE_TIMEOUT": "inf"}, "OFFLOAD_REMOTE_TIMEOUT='inf'"),
    ({"OFFLOAD_REMOTE_RETRIES": "-1"}, "OFFLOAD_REMOTE_RETRIES='-1': expected a count"),
    ({"OFFLOAD_REMOTE_RETRIES": "two"}, "OFFLOAD_REMOTE_RETRIES='two'"),
    ({"OFFLOAD_REMOTE_INSTANCE": "a/actions"}, "OFFLOAD_REMOTE_INSTANCE='a/actions': instance name"),
    ({"OFFLOAD_REMOTE_CA": "/ca.pem"}, "OFFLOAD_REMOTE_CA set, but OFFLOAD_REMOTE='grpc://h:1' is not TLS"),
    ({"OFFLOAD_REMOTE_HEADERS": "Bearer s3cret"}, "OFFLOAD_REMOTE_HEADERS: entry 1 is not NAME=VALUE"),
    ({"OFFLOAD_REMOTE_HEADERS": "ok=1,grpc-timeout=s3cret"}, "OFFLOAD_REMOTE_HEADERS: entry 2 is not NAME=VALUE"),
    ({"OFFLOAD_REMOTE_HEADERS": "token-bin=s3cret"}, "entry 1 is not NAME=VALUE"),
    ({"OFFLOAD_REMOTE_HEADERS": "authorization=s3cret\u00e9"}, "the value of header 'authorization' (entry 1)"),
    ({"OFFLOAD_REMOTE_HEADER_FILE": "/nonexistent/headers"},
     "OFFLOAD_REMOTE_HEADER_FILE='/nonexistent/headers': cannot read it (No such file or directory)"),
])
def test_bad_environment_values_name_the_variable(environ: dict[str, str], expected: str) -> None:
    with pytest.raises(RemoteError) as error:
        RemoteSettings.from_url("grpc://h:1", environ)
    message = str(error.value)
    assert expected in message and "\n" not in message
    assert "s3cret" not in message


def test_a_client_certificate_needs_its_key() -> None:
    with pytest.raises(RemoteError, match="OFFLOAD_REMOTE_CERT and OFFLOAD_REMOTE_KEY go together.*only "
                                          "OFFLOAD_REMOTE_CERT is set"):
        RemoteSettings.from_url("grpcs://h:1", {"OFFLOAD_REMOTE_CERT": "/c.pem"})


def test_unreadable_tls_files_are_named(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    with pytest.raises(RemoteError, match=f"cannot read the TLS CA certificates \\(OFFLOAD_REMOTE_CA\\) {ca}: "
                                          "No such file"):
        RemoteClient(RemoteSettings.from_url("grpcs://127.0.0.1:1", {"OFFLOAD_REMOTE_CA": str(ca)}))
    ca.write_text("")
    key = tmp_path / "missing.key"
    with pytest.raises(RemoteError, match=f"client key \\(OFFLOAD_REMOTE_KEY\\) {key}"):
        RemoteClient(RemoteSettings.from_url("grpcs://127.0.0.1:1", {
            "OFFLOAD_REMOTE_CA": str(ca), "OFFLOAD_REMOTE_CERT": str(ca), "OFFLOAD_REMOTE_KEY": str(key)}))


def test_digest_conversions() -> None:
    digest = digest_of_bytes(b"abc")
    assert from_proto(to_proto(digest)) == digest
    assert to_proto(digest).size_bytes == 3
    for bad in (re_pb2.Digest(hash="../../etc/passwd", size_bytes=1), re_pb2.Digest(hash="A" * 64, size_bytes=1),
                re_pb2.Digest(hash=digest.hash, size_bytes=-1)):
        with pytest.raises(RemoteIntegrityError, match="malformed digest"):
            from_proto(bad)


def test_verify_blob_names_the_digest() -> None:
    digest = digest_of_bytes(b"expected")
    assert verify_blob(digest, b"expected") == b"expected"
    for wrong in (b"expectee", b"expected!", b""):
        with pytest.raises(RemoteIntegrityError, match=f"blob {digest} from the server does not match its digest: "
                                                       f"got {len(wrong)} bytes"):
            verify_blob(digest, wrong)


# --- BuildGrid: CAS and ActionCache -----------------------------------------------------------------------------


def test_capabilities_and_the_batch_limit(buildgrid_session: BuildGridServer) -> None:
    with client_for(buildgrid_session) as client:
        capabilities = client.capabilities()
        assert client.capabilities() is capabilities
        announced = capabilities.cache_capabilities.max_batch_total_size_bytes
        # BuildGrid 0.4.4 announces 4 MiB - 1 KiB, its gRPC message limit less a margin.
        assert announced == 4 * MiB - 1024
        assert client.max_batch_bytes == min(DEFAULT_MAX_BATCH_BYTES, announced)
    with client_for(buildgrid_session, max_batch_bytes=8 * MiB) as client:
        assert client.max_batch_bytes == announced  # lowered to what the server takes
    with client_for(buildgrid_session, max_batch_bytes=1000) as client:
        assert client.max_batch_bytes == 1000


def test_small_blobs_round_trip_in_several_batches(buildgrid_session: BuildGridServer,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    blobs = {digest_of_bytes(data): data for data in (fresh(300) for _ in range(20))}
    with client_for(buildgrid_session, max_batch_bytes=4 * (300 + BLOB_OVERHEAD)) as client:
        updates = Counting(monkeypatch, client._cas, "BatchUpdateBlobs")
        reads = Counting(monkeypatch, client._cas, "BatchReadBlobs")
        writes = Counting(monkeypatch, client._bytestream, "Write")
        assert client.find_missing([*blobs, *blobs, EMPTY_DIGEST]) == set(blobs)
        client.upload_blobs(blobs)
        assert (updates.calls, writes.calls) == (5, 0)
        assert client.find_missing(blobs) == set()
        assert client.read_blobs(reversed(list(blobs))) == blobs
        assert reads.calls == 5
        digest, data = next(iter(blobs.items()))
        assert client.read_blob(digest) == data


def test_large_blobs_go_by_bytestream(buildgrid_session: BuildGridServer, monkeypatch: pytest.MonkeyPatch) -> None:
    limit = 64 * 1024
    small, edge, large = fresh(1000), fresh(limit - BLOB_OVERHEAD), fresh(3 * MiB + 17)  # large: 4 pieces
    blobs = {digest_of_bytes(data): data for data in (small, edge, large)}
    with client_for(buildgrid_session, max_batch_bytes=limit) as client:
        writes = Counting(monkeypatch, client._bytestream, "Write")
        reads = Counting(monkeypatch, client._bytestream, "Read")
        updates = Counting(monkeypatch, client._cas, "BatchUpdateBlobs")
        client.upload_blobs(blobs)
        # The edge blob fills a batch on its own (its bytes and overhead are the limit): two batches, one stream.
        assert (writes.calls, updates.calls) == (1, 2)
        assert client.find_missing(blobs) == set()
        assert client.read_blob(digest_of_bytes(large)) == large
        assert reads.calls == 1
        assert client.read_blobs(blobs) == blobs
    # With the server's own limit the 3 MiB blob, written by ByteStream, comes back in a batch.
    with client_for(buildgrid_session) as client:
        reads = Counting(monkeypatch, client._bytestream, "Read")
        assert client.read_blob(digest_of_bytes(large)) == large
        assert reads.calls == 0


def test_files_round_trip_large_ones_streamed(buildgrid_session: BuildGridServer, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    sources = tmp_path / "sources"
    sources.mkdir()
    contents = {"small.o": fresh(5000), "empty.o": b"", "large.o": fresh(5 * MiB + 3)}  # large: > 4 MiB limit
    files = {}
    for name, data in contents.items():
        (sources / name).write_bytes(data)
        files[digest_of_bytes(data)] = sources / name
    with client_for(buildgrid_session) as client:
        writes = Counting(monkeypatch, client._bytestream, "Write")
        reads = Counting(monkeypatch, client._bytestream, "Read")
        assert client.find_missing(files) == set(files) - {EMPTY_DIGEST}
        client.upload_files(files)
        assert writes.calls == 1
        assert client.find_missing(files) == set()
        out = tmp_path / "out"
        out.mkdir()
        for name, data in contents.items():
            client.download_to(digest_of_bytes(data), out / name)
            assert (out / name).read_bytes() == data
        assert reads.calls == 1
        assert sorted(path.name for path in out.iterdir()) == sorted(contents)
        # An existing file is replaced whole; permissions follow the umask, not the temporary file's 0600.
        client.download_to(digest_of_bytes(contents["small.o"]), out / "large.o")
        assert (out / "large.o").read_bytes() == contents["small.o"]
        umask = os.umask(0)
        os.umask(umask)
        assert (out / "small.o").stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_file_changed_since_it_was_hashed_is_not_uploaded(buildgrid_session: BuildGridServer,
                                                            tmp_path: Path) -> None:
    for size in (100, 5 * MiB):
        path = tmp_path / f"changed{size}"
        hashed = fresh(size)
        path.write_bytes(fresh(size))
        digest = digest_of_bytes(hashed)
        with client_for(buildgrid_session) as client:
            with pytest.raises(RemoteIntegrityError, match=f"{path} changed since it was hashed: it no longer "
                                                           f"matches {digest}; not uploaded"):
                client.upload_files({digest: path})
            assert client.find_missing([digest]) == {digest}


def test_blobs_that_are_not_there(buildgrid_session: BuildGridServer, tmp_path: Path) -> None:
    absent = [digest_of_bytes(fresh(10)), digest_of_bytes(fresh(2 * MiB))]
    destination = tmp_path / "kept.o"
    destination.write_bytes(b"old")
    with client_for(buildgrid_session, max_batch_bytes=MiB) as client:
        for digest in absent:  # by batch, then by ByteStream
            with pytest.raises(BlobNotFoundError, match=f"blob {digest} not found") as error:
                client.read_blob(digest)
            assert error.value.digests == (digest,)
            assert isinstance(error.value, RemoteIntegrityError)
            with pytest.raises(BlobNotFoundError):
                client.download_to(digest, destination)
            assert destination.read_bytes() == b"old" and leftovers(tmp_path) == []
        present = fresh(10)
        client.upload_blobs({digest_of_bytes(present): present})
        with pytest.raises(BlobNotFoundError, match="blobs .* not found") as error:
            client.read_blobs([digest_of_bytes(present), *absent])
        assert set(error.value.digests) == set(absent)


def test_the_empty_blob_is_never_asked_for(tmp_path: Path) -> None:
    # Nothing listens on this port: any call would fail.
    with RemoteClient(RemoteSettings(target=f"127.0.0.1:{free_port()}", retries=0)) as client:
        assert client.read_blob(EMPTY_DIGEST) == b""
        assert client.read_blobs([EMPTY_DIGEST]) == {EMPTY_DIGEST: b""}
        assert client.find_missing([EMPTY_DIGEST]) == set()
        client.upload_blobs({EMPTY_DIGEST: b""})
        client.download_to(EMPTY_DIGEST, tmp_path / "empty")
        assert (tmp_path / "empty").read_bytes() == b""


def test_action_results(buildgrid_session: BuildGridServer) -> None:
    action = digest_of_bytes(fresh(64))
    stdout = b"compiled\n"
    output = fresh(100)
    with client_for(buildgrid_session) as client:
        assert client.get_action_result(action) is None
        client.upload_blobs({digest_of_bytes(stdout): stdout, digest_of_bytes(output): output})
        result = re_pb2.ActionResult(exit_code=0, stdout_digest=to_proto(digest_of_bytes(stdout)))
        result.output_files.add(path="obj/a.o", digest=to_proto(digest_of_bytes(output)), is_executable=True)
        client.update_action_result(action, result)
        got = client.get_action_result(action)
        assert got is not None
        assert got.output_files == result.output_files and got.stdout_digest == result.stdout_digest
        inlined = client.get_action_result(action, inline_outputs=True)
        assert inlined is not None and inlined.stdout_raw in (b"", stdout)  # servers may inline it
        assert client.read_blob(from_proto(got.output_files[0].digest)) == output
        assert client.get_action_result(digest_of_bytes(fresh(64))) is None


def test_a_wrong_instance_name_is_an_error(buildgrid_session: BuildGridServer) -> None:
    digest = digest_of_bytes(fresh(10))
    with RemoteClient(RemoteSettings(target=buildgrid_session.target, instance="nope")) as client:
        calls: list[tuple[str, Callable[[], object]]] = [
            ("GetCapabilities", client.capabilities),
            ("FindMissingBlobs", lambda: client.find_missing([digest])),
            ("GetActionResult", lambda: client.get_action_result(digest)),  # not "no result"
            ("UpdateActionResult", lambda: client.update_action_result(digest, re_pb2.ActionResult())),
        ]
        for method, call in calls:
            with pytest.raises(RemoteCallError) as error:
                call()
            assert str(error.value) == (f"remote cache grpc://{buildgrid_session.target}/nope: INVALID_ARGUMENT: "
                                        f"Invalid instance name: [nope] ({method})")
            assert (error.value.code, error.value.method) == ("INVALID_ARGUMENT", method)
        # Uploads and reads ask for the capabilities first (the batch limit).
        with pytest.raises(RemoteError, match=r"INVALID_ARGUMENT: .*\(GetCapabilities\)"):
            client.read_blob(digest)


def test_a_stopped_server_fails_fast_and_is_found_again(buildgrid: BuildGridServer) -> None:
    digest = digest_of_bytes(fresh(10))
    with client_for(buildgrid, timeout_s=2.0, retries=2) as client:
        assert client.find_missing([digest]) == {digest}
        buildgrid.stop()
        started = time.monotonic()
        with pytest.raises(RemoteCallError) as error:
            client.find_missing([digest])
        assert time.monotonic() - started < 3.0
        message = str(error.value)
        assert message.startswith(f"remote cache grpc://127.0.0.1:{buildgrid.port}/main: UNAVAILABLE: ")
        assert message.endswith("(FindMissingBlobs)") and "\n" not in message
        with pytest.raises(RemoteError, match="UNAVAILABLE: .*\\(GetActionResult\\)"):
            client.get_action_result(digest)
        buildgrid.start()
        # The same client reaches it again, once gRPC's reconnection backoff (at most 1 s here) has passed.
        deadline = time.monotonic() + 3.0
        while True:
            try:
                assert client.find_missing([digest]) == {digest}
                break
            except RemoteCallError as error:
                assert error.code == "UNAVAILABLE" and time.monotonic() < deadline
                time.sleep(0.2)


def test_a_silent_server_times_out() -> None:
    # A port that accepts connections (the kernel does) but never speaks HTTP/2.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        target = f"127.0.0.1:{listener.getsockname()[1]}"
        with RemoteClient(RemoteSettings(target=target, timeout_s=0.5, retries=1)) as client:
            started = time.monotonic()
            with pytest.raises(RemoteCallError) as error:
                client.get_action_result(digest_of_bytes(b"x"))
            elapsed = time.monotonic() - started
    assert str(error.value) == f"remote cache grpc://{target}: DEADLINE_EXCEEDED: Deadline Exceeded (GetActionResult)"
    assert 0.9 < elapsed < 5.0  # two tries of 0.5 s and a 0.1 s backoff


# --- a server that lies: integrity checks, Execution's failure modes ----------------------------------------------


class LyingServer:
    """CAS, ByteStream and Execution servicers in this process whose answers the test sets; no Capabilities
    service (the client then keeps its own batch limit)."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}  # hash -> what to send for it
        self.operations: list[operations_pb2.Operation] = []  # what Execute streams
        self.waited: list[operations_pb2.Operation] = []  # what WaitExecution streams
        self.wait_names: list[str] = []
        lying = self

        class Cas(re_grpc.ContentAddressableStorageServicer):
            def BatchReadBlobs(self, request: Any, context: Any) -> Any:  # noqa: N802
                return re_pb2.BatchReadBlobsResponse(responses=[
                    re_pb2.BatchReadBlobsResponse.Response(digest=digest, data=lying.blobs[digest.hash],
                                                           status=status_pb2.Status(code=code_pb2.OK))
                    for digest in request.digests])

        class ByteStream(bytestream_pb2_grpc.ByteStreamServicer):
            def Read(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
                data = lying.blobs[request.resource_name.split("/")[-2]]
                for start in range(0, len(data), 1000):
                    yield bytestream_pb2.ReadResponse(data=data[start:start + 1000])

        class Execution(re_grpc.ExecutionServicer):
            def Execute(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
                yield from lying.operations

            def WaitExecution(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
                lying.wait_names.append(request.name)
                yield from lying.waited

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        re_grpc.add_ContentAddressableStorageServicer_to_server(Cas(), self.server)
        bytestream_pb2_grpc.add_ByteStreamServicer_to_server(ByteStream(), self.server)
        re_grpc.add_ExecutionServicer_to_server(Execution(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def client(self, **settings: Any) -> RemoteClient:
        return RemoteClient(RemoteSettings(target=f"127.0.0.1:{self.port}", **settings))


@pytest.fixture
def lying() -> Iterator[LyingServer]:
    server = LyingServer()
    yield server
    server.server.stop(0)


def test_a_blob_that_does_not_match_its_digest_is_rejected(lying: LyingServer, tmp_path: Path) -> None:
    small, large = digest_of_bytes(b"the real bytes"), digest_of_bytes(b"r" * 5000)
    lying.blobs[small.hash] = b"the fake bytes"  # same size
    lying.blobs[large.hash] = b"f" * 5000
    destination = tmp_path / "out.o"
    with lying.client(max_batch_bytes=1000) as client:
        assert client.max_batch_bytes == 1000  # no Capabilities service: the settings' limit
        for digest in (small, large):  # BatchReadBlobs, then ByteStream
            with pytest.raises(RemoteIntegrityError, match=f"blob {digest} from remote cache grpc://127.0.0.1:"
                                                           f"{lying.port} does not match its digest"):
                client.read_blob(digest)
            with pytest.raises(RemoteIntegrityError):
                client.download_to(digest, destination)
            assert not destination.exists() and leftovers(tmp_path) == []
        # More bytes than the digest says: the stream is cut off there, nothing is written.
        lying.blobs[large.hash] = b"r" * 5000 + b"more"
        with pytest.raises(RemoteIntegrityError, match="more than 5000 bytes came"):
            client.download_to(large, destination)
        assert not destination.exists() and leftovers(tmp_path) == []
        # The honest answer passes the same checks.
        lying.blobs[large.hash] = b"r" * 5000
        client.download_to(large, destination)
        assert destination.read_bytes() == b"r" * 5000


def _operation(name: str, done: bool, response: re_pb2.ExecuteResponse | None = None,
               error: status_pb2.Status | None = None) -> operations_pb2.Operation:
    operation = operations_pb2.Operation(name=name, done=done)
    if response is not None:
        operation.response.Pack(response)
    if error is not None:
        operation.error.CopyFrom(error)
    return operation


def test_execution_failures_and_a_dropped_stream(lying: LyingServer) -> None:
    action = digest_of_bytes(b"action")
    url = f"grpc://127.0.0.1:{lying.port}"
    with lying.client() as client:
        failed = re_pb2.ExecuteResponse(status=status_pb2.Status(code=code_pb2.FAILED_PRECONDITION,
                                                                 message="missing input"))
        lying.operations = [_operation("op/1", False), _operation("op/1", True, failed)]
        with pytest.raises(RemoteError) as error:
            client.execute(action)
        assert str(error.value) == (f"remote execution {url}: {action} failed: FAILED_PRECONDITION: missing input "
                                    "(operation op/1)")

        lying.operations = [_operation("op/2", True, error=status_pb2.Status(code=code_pb2.INTERNAL,
                                                                             message="worker lost"))]
        with pytest.raises(RemoteError, match="failed: INTERNAL: worker lost \\(operation op/2\\)"):
            client.execute(action)

        # A non-zero exit status is a result, returned; a stream that ends early is followed by WaitExecution.
        exited = re_pb2.ExecuteResponse(result=re_pb2.ActionResult(exit_code=3, stderr_raw=b"error: nope\n"))
        lying.operations = [_operation("op/3", False)]
        lying.waited = [_operation("op/3", False), _operation("op/3", True, exited)]
        response = client.execute(action, skip_cache_lookup=True)
        assert response.result.exit_code == 3 and response.result.stderr_raw == b"error: nope\n"
        assert lying.wait_names == ["op/3"]
        assert client.wait_execution("op/3").result.exit_code == 3

        lying.waited = [_operation("op/3", False)]
        with pytest.raises(RemoteError, match="did not finish within 0.5 s"):
            client.wait_execution("op/3", timeout_s=0.5)


def test_execute_on_a_cache_only_server_is_an_error(buildgrid_session: BuildGridServer) -> None:
    with client_for(buildgrid_session) as client, pytest.raises(RemoteCallError) as error:
        client.execute(digest_of_bytes(b"action"))
    assert error.value.code == "UNIMPLEMENTED"
    assert str(error.value).startswith(f"remote execution {buildgrid_session.remote}: UNIMPLEMENTED")


# --- buildbox-casd: Execution -----------------------------------------------------------------------------------


def test_execute_returns_results_and_exit_codes(casd_execution: ExecutionServer, tmp_path: Path) -> None:
    def action_for(script: str) -> tuple[Digest, dict[Digest, bytes]]:
        data = b"input data\n"
        root = re_pb2.Directory(files=[re_pb2.FileNode(name="in.txt", digest=to_proto(digest_of_bytes(data)))])
        root_bytes = root.SerializeToString()
        command = re_pb2.Command(arguments=["/bin/sh", "-c", script], output_paths=["out.txt"],
                                 output_files=["out.txt"]).SerializeToString()
        action = re_pb2.Action(command_digest=to_proto(digest_of_bytes(command)),
                               input_root_digest=to_proto(digest_of_bytes(root_bytes))).SerializeToString()
        blobs = {digest_of_bytes(blob): blob for blob in (data, root_bytes, command, action)}
        return digest_of_bytes(action), blobs

    with client_for(casd_execution, timeout_s=30) as client:
        assert client.capabilities().execution_capabilities.exec_enabled
        action, blobs = action_for("tr a-z A-Z < in.txt > out.txt")
        client.upload_blobs({digest: blob for digest, blob in blobs.items() if digest in client.find_missing(blobs)})
        response = client.execute(action, timeout_s=60)
        assert response.result.exit_code == 0 and not response.cached_result
        [output] = response.result.output_files
        client.download_to(from_proto(output.digest), tmp_path / "out.txt")
        assert (tmp_path / "out.txt").read_bytes() == b"INPUT DATA\n"
        assert client.get_action_result(action) is not None
        assert client.execute(action).cached_result

        failing, blobs = action_for("echo broken >&2; exit 3")
        client.upload_blobs(blobs)
        response = client.execute(failing, timeout_s=60)
        assert response.result.exit_code == 3
        assert client.read_blob(from_proto(response.result.stderr_digest)) == b"broken\n"


# --- BuildGrid with TLS, and with JWT authorization ---------------------------------------------------------------


class ConfiguredBuildGrid:
    """bgd from a configuration of this test's (TLS, authorization), which tests/remote_servers.py does not write;
    ready once ``client`` can read its capabilities."""

    def __init__(self, directory: Path, channel: str, extra: str = "") -> None:
        self.port = free_port()
        config = directory / "buildgrid.yml"
        config.write_text(buildgrid_config(self.port, channel=channel, authorization=extra or NO_AUTHORIZATION))
        self.log = directory / "buildgrid.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen([str(bgd_path()), "server", "start", str(config)], stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=directory,
                                            start_new_session=True)

    def wait_until_ready(self, client: RemoteClient) -> None:
        deadline = time.monotonic() + 60
        while True:
            assert self.process.poll() is None, self.log.read_text()
            try:
                client.capabilities()
                return
            except RemoteError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _openssl(*arguments: str | Path, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    assert openssl, "the TLS test makes its certificates with openssl"
    subprocess.run([openssl, *map(str, arguments)], cwd=cwd, check=True, capture_output=True)


def make_certificates(directory: Path) -> None:
    """ca.pem, and server.pem/server.key (for 127.0.0.1) and client.pem/client.key signed by it."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=offload test CA", cwd=directory)
    (directory / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, extra in (("server", ["-extfile", "server.ext"]), ("client", [])):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
                 f"/CN=offload test {name}", cwd=directory)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", *extra, cwd=directory)


def test_tls_with_client_certificates(tmp_path: Path) -> None:
    make_certificates(tmp_path)
    server = ConfiguredBuildGrid(tmp_path, f"""\
    insecure-mode: false
    credentials:
      tls-server-key: {tmp_path}/server.key
      tls-server-cert: {tmp_path}/server.pem
      tls-client-certs: {tmp_path}/ca.pem""", "authorization:\n  method: none")
    try:
        url = f"grpcs://127.0.0.1:{server.port}/main"
        environ = {"OFFLOAD_REMOTE_CA": str(tmp_path / "ca.pem"), "OFFLOAD_REMOTE_CERT": str(tmp_path / "client.pem"),
                   "OFFLOAD_REMOTE_KEY": str(tmp_path / "client.key")}
        with RemoteClient(RemoteSettings.from_url(url, environ)) as client:
            server.wait_until_ready(client)
            data = fresh(100_000)
            client.upload_blobs({digest_of_bytes(data): data})
            assert client.read_blob(digest_of_bytes(data)) == data
        # Without a client certificate the server refuses the handshake; plain gRPC gets no answer either.
        without = {"OFFLOAD_REMOTE_CA": str(tmp_path / "ca.pem")}
        with RemoteClient(RemoteSettings.from_url(url, without)) as client:
            with pytest.raises(RemoteCallError, match=r"remote cache grpcs://.*: UNAVAILABLE: .*\(FindMissingBlobs\)"):
                client.find_missing([digest_of_bytes(data)])
        with RemoteClient(RemoteSettings.from_url(url.replace("grpcs", "grpc"), {})) as client:
            with pytest.raises(RemoteCallError, match="UNAVAILABLE"):
                client.find_missing([digest_of_bytes(data)])
    finally:
        server.stop()


def jwt_hs256(secret: bytes, claims: dict[str, Any]) -> str:
    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signed = part(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()) + "." + part(json.dumps(claims).encode())
    return signed + "." + part(hmac.new(secret, signed.encode(), hashlib.sha256).digest())


def test_headers_carry_credentials(tmp_path: Path) -> None:
    secret = b"offload test secret"
    (tmp_path / "secret").write_bytes(secret)
    server = ConfiguredBuildGrid(tmp_path, "    insecure-mode: true", f"""\
authorization:
  method: jwt
  secret: {tmp_path}/secret
  algorithm: hs256""")
    try:
        url = f"grpc://127.0.0.1:{server.port}/main"
        token = jwt_hs256(secret, {"sub": "builder", "exp": int(time.time()) + 3600})
        header_file = tmp_path / "headers"
        header_file.write_text(f"authorization=Bearer {token}\n")
        with RemoteClient(RemoteSettings.from_url(url, {"OFFLOAD_REMOTE_HEADER_FILE": str(header_file)})) as client:
            server.wait_until_ready(client)
            data = fresh(1000)
            client.upload_blobs({digest_of_bytes(data): data})
            assert client.read_blob(digest_of_bytes(data)) == data
        environ = {"OFFLOAD_REMOTE_HEADERS": f"authorization=Bearer {token}"}
        with RemoteClient(RemoteSettings.from_url(url, environ)) as client:
            assert client.find_missing([digest_of_bytes(data)]) == set()
        forged = jwt_hs256(b"another secret", {"sub": "builder", "exp": int(time.time()) + 3600})
        for environ in ({}, {"OFFLOAD_REMOTE_HEADERS": f"authorization=Bearer {forged}"}):
            with RemoteClient(RemoteSettings.from_url(url, environ)) as client:
                with pytest.raises(RemoteCallError) as error:
                    client.find_missing([digest_of_bytes(data)])
                assert error.value.code == "UNAUTHENTICATED"
                assert forged not in str(error.value)
    finally:
        server.stop()


def test_one_client_serves_threads(buildgrid_session: BuildGridServer) -> None:
    blobs = [fresh(2000) for _ in range(32)]
    errors: list[BaseException] = []
    with client_for(buildgrid_session) as client:
        def work(data: bytes) -> None:
            try:
                digest = digest_of_bytes(data)
                client.upload_blobs({digest: data})
                assert client.read_blob(digest) == data
            except BaseException as error:  # noqa: BLE001 - reported below
                errors.append(error)

        threads = [threading.Thread(target=work, args=(data,)) for data in blobs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
