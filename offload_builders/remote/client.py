"""A thin synchronous client of a Remote Execution API v2 server: its CAS (blobs), ActionCache and Execution.

It does what a build needs and no more, and it trusts the server as little as it can: every blob read is checked
against the digest asked for before anyone sees it (:class:`~offload_builders.errors.RemoteIntegrityError`), a
file is written under a temporary name and moved into place only once complete and checked, and every gRPC
failure comes out as one line of :class:`~offload_builders.errors.RemoteError` that names the server, the status
and the call, so that a build can warn about it and go on locally. Nothing the server says is trusted to be
small, quick or printable: a ByteStream read ends when no bytes came for the call's timeout, or when it falls
that far behind :data:`MIN_TRANSFER_RATE` (a deadline earned by the bytes received, not set by the size the
server declares); a blob over :data:`DEFAULT_MAX_BLOB_BYTES` (``OFFLOAD_REMOTE_MAX_BLOB``) or over the space
left beside its destination is refused before a byte is read; a failed command's output is read from its end,
at most :data:`TAIL_BYTES`; every text of the server's goes into a message through
:func:`~offload_builders.remote.text.safe_text` and the URL through
:func:`~offload_builders.remote.text.redact_url`. Transient failures (``UNAVAILABLE``,
``RESOURCE_EXHAUSTED``, ``DEADLINE_EXCEEDED``) are retried a few times with a short backoff; a server that is down
fails fast rather than costing each call its timeout.

Blobs that fit the server's batch limit go by ``BatchUpdateBlobs`` / ``BatchReadBlobs``, larger ones by ByteStream
in pieces, so that no gRPC message exceeds what servers accept (4 MiB by default) and large files are never held
in memory whole. The client is thread-safe: a build's nodes share one.
"""
from __future__ import annotations

import hashlib
import io
import math
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Self, TypeVar
from urllib.parse import urlsplit

from offload_builders import __version__
from offload_builders.errors import RemoteError, RemoteIntegrityError
from offload_builders.remote.digests import CHUNK_SIZE, EMPTY_DIGEST, Digest, digest_of_bytes
from offload_builders.remote.downloads import download_temporary
from offload_builders.remote.protos import (
    bytestream_pb2,
    bytestream_pb2_grpc,
    code_pb2,
    operations_pb2,
    remote_execution_pb2,
    remote_execution_pb2_grpc,
)
from offload_builders.remote.text import redact_url, safe_text

try:
    import grpc
except ImportError as _error:  # pragma: no cover - grpcio comes with the remote extra
    raise RemoteError(f"$OFFLOAD_REMOTE is set, but grpcio cannot be imported ({_error}): "
                      "pip install 'offload-builders[remote]'") from None

T = TypeVar("T")

#: Seconds one call may take (a ByteStream transfer gets more, by size: see :data:`MIN_TRANSFER_RATE`); also how
#: long a ByteStream read may go without a byte.
DEFAULT_TIMEOUT_S = 10.0
#: The largest blob this client reads (``OFFLOAD_REMOTE_MAX_BLOB``): what a download may write to disk, or a read
#: hold in memory, before its digest can be checked. A digest the server names with a larger size is refused.
DEFAULT_MAX_BLOB_BYTES = 1 << 30
#: Seconds a remote execution may take, waiting included (``OFFLOAD_REMOTE_EXECUTE_TIMEOUT``): a server that keeps
#: an operation going for ever must not hold the build.
DEFAULT_EXECUTE_TIMEOUT_S = 3600.0
#: The most bytes of a failed command's stderr read for its last line (its end: ByteStream's read_offset).
TAIL_BYTES = 64 * 1024
#: Retries of a call that failed with a transient status.
DEFAULT_RETRIES = 2
#: The most blob bytes in one batch: servers accept gRPC messages of 4 MiB by default, and a batch message also
#: holds digests and framing. Lowered to what the server announces (``max_batch_total_size_bytes``).
DEFAULT_MAX_BATCH_BYTES = 4 * 1024 * 1024 - 64 * 1024
#: What one blob adds to a batch message besides its bytes (its digest, status and framing), counted against the
#: batch limit so that many small blobs cannot push a batch over it.
BLOB_OVERHEAD = 128
#: Digests per FindMissingBlobs request (about 80 bytes each: well under any message limit).
FIND_MISSING_BATCH = 8192
#: ByteStream pieces: well under the message limit, large enough that framing costs nothing.
STREAM_CHUNK = CHUNK_SIZE
#: Bytes per second a ByteStream transfer is allowed at least, on top of the call's timeout: a large blob gets
#: time in proportion, a stalled transfer still ends. A read earns its time by the bytes it received: it ends
#: when it is more than the timeout behind this rate, whatever size the server declared.
MIN_TRANSFER_RATE = 1 << 20
#: gRPC messages this client accepts (a batch read's answer can exceed gRPC's 4 MiB default a little).
MAX_MESSAGE_BYTES = 64 << 20
#: First retry's wait; it doubles each retry.
RETRY_BACKOFF_S = 0.1
#: Times an Execute/WaitExecution stream may end before its operation is done (servers may close it at will, and
#: do after minutes; each time costs a :data:`RETRY_BACKOFF_S` pause), before the server counts as broken.
MAX_EXECUTION_RECONNECTS = 1000

#: The statuses worth a retry (REAPI: the server is restarting, overloaded, or was slow this once).
RETRIED_CODES = frozenset({"UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"})

#: Path segments REAPI reserves for resource names: an instance name cannot contain them.
RESERVED_INSTANCE_SEGMENTS = frozenset({"blobs", "uploads", "actions", "actionResults", "operations",
                                        "capabilities", "compressed-blobs"})

_URL_FORM = "expected grpc://HOST:PORT[/INSTANCE] or grpcs://HOST:PORT[/INSTANCE] (TLS)"
_HEX_HASH = re.compile(r"[0-9a-f]{64}\Z")
_HEADER_NAME = re.compile(r"[0-9a-z][0-9a-z_.-]*\Z")
_REQUEST_METADATA_KEY = "build.bazel.remote.execution.v2.requestmetadata-bin"


class RemoteCallError(RemoteError):
    """A call the server answered with a non-OK gRPC status; ``code`` is its name (``"UNAVAILABLE"``), ``method``
    the call's (``"FindMissingBlobs"``), for callers that treat some statuses apart."""

    def __init__(self, message: str, code: str, method: str) -> None:
        super().__init__(message)
        self.code = code
        self.method = method


class BlobNotFoundError(RemoteIntegrityError):
    """Blobs asked for are not in the server's CAS (evicted, or never uploaded although an action result names
    them): what refers to them cannot be used, but the server itself works (an integrity error, not an outage)."""

    def __init__(self, message: str, digests: Sequence[Digest]) -> None:
        super().__init__(message)
        self.digests = tuple(digests)


class _Stalled(Exception):
    """A ByteStream read the watchdog ended (:class:`_Watchdog`): its message says why."""


class _Watchdog:
    """Ends a ByteStream read (cancels its call) that received no bytes for ``stall_s`` seconds, or fell more
    than ``stall_s`` behind :data:`MIN_TRANSFER_RATE`: its deadline is earned by the bytes received, never set by
    the size the server declared (a server that sends a few bytes, then nothing, or a byte now and then, holds a
    read ``stall_s`` seconds, not for the time its declared size would take)."""

    def __init__(self, call: object, stall_s: float) -> None:
        self._call = call
        self._stall_s = stall_s
        self._start = self._last = time.monotonic()
        self._received = 0
        #: Why the read was ended (None while it was not).
        self.reason: str | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="offload-remote-read-watchdog", daemon=True)
        self._thread.start()

    def received(self, size: int) -> None:
        self._received += size
        self._last = time.monotonic()

    def _watch(self) -> None:
        while True:
            stalled_at = self._last + self._stall_s
            behind_at = self._start + self._stall_s + self._received / MIN_TRANSFER_RATE
            wait = min(stalled_at, behind_at) - time.monotonic()
            if wait <= 0:
                now = time.monotonic()
                # Both rules end a read that stalls at its start: it is named by what the server did.
                self.reason = (f"no bytes came for {now - self._last:.1f} s" if now - self._last >= self._stall_s / 2
                               else f"{self._received} bytes came in {now - self._start:.1f} s, slower than "
                               f"{MIN_TRANSFER_RATE >> 10} KiB/s")
                cancel = getattr(self._call, "cancel", None)
                if callable(cancel):
                    cancel()
                return
            if self._done.wait(wait):
                return

    def stop(self) -> None:
        self._done.set()


def to_proto(digest: Digest) -> remote_execution_pb2.Digest:
    return remote_execution_pb2.Digest(hash=digest.hash, size_bytes=digest.size)


def from_proto(message: remote_execution_pb2.Digest) -> Digest:
    """A digest the server sent; a malformed one (not SHA-256 hex, negative size) is the server's answer being
    unusable, hence :class:`RemoteIntegrityError` (it must never reach a resource name or a path)."""
    if not _HEX_HASH.match(message.hash) or message.size_bytes < 0:
        raise RemoteIntegrityError(f"the server named a malformed digest {safe_text(message.hash, 80)!r}/"
                                   f"{message.size_bytes}")
    return Digest(message.hash, message.size_bytes)


def verify_blob(digest: Digest, data: bytes, source: str = "the server") -> bytes:
    """``data`` if it is the blob ``digest`` names, else :class:`RemoteIntegrityError` naming the digest: the one
    check between the server's bytes and anything that uses them."""
    if len(data) != digest.size or hashlib.sha256(data).hexdigest() != digest.hash:
        raise RemoteIntegrityError(f"blob {digest} from {source} does not match its digest: got {len(data)} bytes "
                                   f"with SHA-256 {hashlib.sha256(data).hexdigest()}")
    return data


def _status_name(code: int) -> str:
    try:
        return str(code_pb2.Code.Name(code))
    except ValueError:
        return f"status {code}"


def _check_instance(instance: str, source: str) -> str:
    segments = instance.split("/") if instance else []
    if any(not segment for segment in segments) or RESERVED_INSTANCE_SEGMENTS.intersection(segments):
        raise RemoteError(f"{source}: instance name {instance!r} has an empty segment or one REAPI reserves "
                          f"({', '.join(sorted(RESERVED_INSTANCE_SEGMENTS))})")
    return instance


_SIZE = re.compile(r"(\d+)\s*(?:([kmgt])(?:i?b)?|b)?", re.IGNORECASE)


def parse_size(text: str, source: str) -> int:
    """Bytes from ``text``: a count, or one with a binary unit (``512M``, ``2GiB``, ``64k``)."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise RemoteError(f"{source}={text!r}: expected a size in bytes, e.g. 1073741824, 512M or 2G")
    unit = (match[2] or "").lower()
    return int(match[1]) << (10 * ("kmgt".index(unit) + 1) if unit else 0)


def parse_headers(text: str, source: str) -> tuple[tuple[str, str], ...]:
    """gRPC metadata from ``NAME=VALUE`` (or ``NAME: VALUE``) entries, one a line, or comma-separated when the
    text is one line; blank lines and ``#`` comments are skipped. Errors never show a value (it is a credential)."""
    entries = text.splitlines() if "\n" in text.strip() else text.split(",")
    headers: list[tuple[str, str]] = []
    for number, entry in enumerate(entries, 1):
        entry = entry.strip()
        if not entry or entry.startswith("#"):
            continue
        cut = min((entry.find(separator) for separator in "=:" if separator in entry), default=-1)
        name, value = entry[:cut].strip().lower(), entry[cut + 1:].strip()
        if cut < 0 or not _HEADER_NAME.match(name) or name.startswith("grpc-") or name.endswith("-bin"):
            raise RemoteError(f"{source}: entry {number} is not NAME=VALUE with a lower-case gRPC metadata name "
                              "(letters, digits, '-', '_', '.'; not grpc-*, not binary *-bin), e.g. "
                              "authorization=Bearer TOKEN (the entry is not shown: it may hold a credential)")
        if not value or not all(" " <= character <= "~" for character in value):
            raise RemoteError(f"{source}: the value of header {name!r} (entry {number}) is empty or not printable "
                              "ASCII (not shown: it may hold a credential)")
        headers.append((name, value))
    return tuple(headers)


@dataclass(frozen=True)
class RemoteSettings:
    """Where the server is and how to talk to it: what ``$OFFLOAD_REMOTE`` and ``$OFFLOAD_REMOTE_*`` say."""

    #: ``host:port`` (``[::1]:port`` for IPv6), as gRPC takes it.
    target: str
    #: TLS (``grpcs://``).
    secure: bool = False
    #: The REAPI instance name ("" is the server's default instance).
    instance: str = ""
    #: PEM files: the CAs to trust (None: the system's), and a client certificate and key for mutual TLS.
    root_certificates: str | None = None
    client_certificate: str | None = None
    client_key: str | None = None
    #: gRPC metadata sent with every call, e.g. ``(("authorization", "Bearer TOKEN"),)``; kept out of ``repr``.
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    timeout_s: float = DEFAULT_TIMEOUT_S
    retries: int = DEFAULT_RETRIES
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    #: The largest blob read (see :data:`DEFAULT_MAX_BLOB_BYTES`).
    max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES
    #: The longest a remote execution may take, waiting included.
    execute_timeout_s: float = DEFAULT_EXECUTE_TIMEOUT_S

    def __post_init__(self) -> None:
        if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)) or self.retries < 0:
            raise ValueError(f"timeout_s must be positive and retries not negative: {self.timeout_s}, {self.retries}")
        if self.max_blob_bytes < 0 or not (self.execute_timeout_s > 0 and math.isfinite(self.execute_timeout_s)):
            raise ValueError(f"max_blob_bytes must not be negative and execute_timeout_s positive: "
                             f"{self.max_blob_bytes}, {self.execute_timeout_s}")
        if self.max_batch_bytes <= BLOB_OVERHEAD:
            raise ValueError(f"max_batch_bytes must exceed {BLOB_OVERHEAD}: {self.max_batch_bytes}")
        if (self.client_certificate is None) != (self.client_key is None):
            raise ValueError("a client certificate needs its key and a key its certificate")

    @property
    def url(self) -> str:
        """The server as a URL (no credentials), for messages."""
        return f"{'grpcs' if self.secure else 'grpc'}://{self.target}{'/' + self.instance if self.instance else ''}"

    @classmethod
    def from_url(cls, url: str, environ: Mapping[str, str]) -> RemoteSettings:
        """Settings from ``$OFFLOAD_REMOTE`` (``url``) and the ``OFFLOAD_REMOTE_*`` variables of ``environ``:
        ``_INSTANCE`` (overrides the URL's path), ``_CA``, ``_CERT``, ``_KEY`` (PEM files; ``grpcs://`` only),
        ``_HEADERS`` (``name=value`` entries, newline- or comma-separated), ``_HEADER_FILE`` (a file of such
        lines, which keeps a token out of the environment), ``_TIMEOUT`` (seconds), ``_RETRIES``, ``_MAX_BLOB``
        (bytes, or with a unit: ``2G``) and ``_EXECUTE_TIMEOUT`` (seconds). An empty variable counts as unset. A
        bad value is one :class:`RemoteError` line naming the variable; the URL is shown only redacted
        (:func:`~offload_builders.remote.text.redact_url`: it may hold a password or a token)."""
        stripped = url.strip()
        shown = f"OFFLOAD_REMOTE={redact_url(url)!r}"
        bad_url = RemoteError(f"{shown}: {_URL_FORM} (no user, password or query: give credentials by "
                              "OFFLOAD_REMOTE_HEADERS or OFFLOAD_REMOTE_HEADER_FILE)")
        try:
            parts = urlsplit(stripped)
            port = parts.port
        except ValueError:
            raise bad_url from None
        if (parts.scheme not in ("grpc", "grpcs") or not parts.hostname or port is None or port == 0
                or "@" in parts.netloc or parts.query or parts.fragment or "?" in stripped or "#" in stripped):
            raise bad_url
        instance = _check_instance(parts.path.strip("/"), shown)
        secure = parts.scheme == "grpcs"

        def variable(name: str) -> str | None:
            value = environ.get(name, "").strip()
            return value or None

        if (override := variable("OFFLOAD_REMOTE_INSTANCE")) is not None:
            instance = _check_instance(override.strip("/"), f"OFFLOAD_REMOTE_INSTANCE={override!r}")
        tls = {name: variable(name) for name in ("OFFLOAD_REMOTE_CA", "OFFLOAD_REMOTE_CERT", "OFFLOAD_REMOTE_KEY")}
        given = [name for name, value in tls.items() if value is not None]
        if given and not secure:
            raise RemoteError(f"{', '.join(given)} set, but {shown} is not TLS: use grpcs://")
        if (tls["OFFLOAD_REMOTE_CERT"] is None) != (tls["OFFLOAD_REMOTE_KEY"] is None):
            raise RemoteError("OFFLOAD_REMOTE_CERT and OFFLOAD_REMOTE_KEY go together (a client certificate and "
                              f"its key, PEM files); only {given[-1]} is set")
        headers: tuple[tuple[str, str], ...] = ()
        if (text := variable("OFFLOAD_REMOTE_HEADERS")) is not None:
            headers += parse_headers(text, "OFFLOAD_REMOTE_HEADERS")
        if (header_file := variable("OFFLOAD_REMOTE_HEADER_FILE")) is not None:
            try:
                content = Path(header_file).read_text()
            except (OSError, UnicodeDecodeError) as error:
                raise RemoteError(f"OFFLOAD_REMOTE_HEADER_FILE={header_file!r}: cannot read it "
                                  f"({getattr(error, 'strerror', None) or error})") from None
            headers += parse_headers(content + "\n", f"OFFLOAD_REMOTE_HEADER_FILE {header_file}")
        timeout_s = DEFAULT_TIMEOUT_S
        if (text := variable("OFFLOAD_REMOTE_TIMEOUT")) is not None:
            try:
                timeout_s = float(text)
            except ValueError:
                timeout_s = math.nan
            if not (timeout_s > 0 and math.isfinite(timeout_s)):
                raise RemoteError(f"OFFLOAD_REMOTE_TIMEOUT={text!r}: expected seconds per call, a positive number")
        retries = DEFAULT_RETRIES
        if (text := variable("OFFLOAD_REMOTE_RETRIES")) is not None:
            if not text.isdigit():
                raise RemoteError(f"OFFLOAD_REMOTE_RETRIES={text!r}: expected a count, 0 or more")
            retries = int(text)
        max_blob_bytes = DEFAULT_MAX_BLOB_BYTES
        if (text := variable("OFFLOAD_REMOTE_MAX_BLOB")) is not None:
            max_blob_bytes = parse_size(text, "OFFLOAD_REMOTE_MAX_BLOB")
        execute_timeout_s = DEFAULT_EXECUTE_TIMEOUT_S
        if (text := variable("OFFLOAD_REMOTE_EXECUTE_TIMEOUT")) is not None:
            try:
                execute_timeout_s = float(text)
            except ValueError:
                execute_timeout_s = math.nan
            if not (execute_timeout_s > 0 and math.isfinite(execute_timeout_s)):
                raise RemoteError(f"OFFLOAD_REMOTE_EXECUTE_TIMEOUT={text!r}: expected seconds a remote execution "
                                  "may take, a positive number")
        return cls(target=parts.netloc, secure=secure, instance=instance,
                   root_certificates=tls["OFFLOAD_REMOTE_CA"], client_certificate=tls["OFFLOAD_REMOTE_CERT"],
                   client_key=tls["OFFLOAD_REMOTE_KEY"], headers=headers, timeout_s=timeout_s, retries=retries,
                   max_blob_bytes=max_blob_bytes, execute_timeout_s=execute_timeout_s)


def _batches(digests: Sequence[Digest], limit: int) -> Iterator[list[Digest]]:
    """``digests`` in order, cut into groups whose bytes and overhead stay within ``limit``."""
    batch: list[Digest] = []
    total = 0
    for digest in digests:
        cost = digest.size + BLOB_OVERHEAD
        if batch and total + cost > limit:
            yield batch
            batch, total = [], 0
        batch.append(digest)
        total += cost
    if batch:
        yield batch


class _FilePieces:
    """A file's bytes in pieces for a ByteStream Write, hashed on the way: ``problem`` says how the file differs
    from its digest (changed since it was hashed), in which case the write is not finished."""

    def __init__(self, path: Path, digest: Digest) -> None:
        self.path = path
        self.digest = digest
        self.problem: str | None = None

    def __iter__(self) -> Iterator[bytes]:
        self.problem = None
        sha = hashlib.sha256()
        size = 0
        with open(self.path, "rb") as stream:
            while piece := stream.read(STREAM_CHUNK):
                size += len(piece)
                if size > self.digest.size:
                    break
                sha.update(piece)
                yield piece
        if size != self.digest.size or sha.hexdigest() != self.digest.hash:
            self.problem = (f"{self.path} changed since it was hashed: it no longer matches {self.digest}; "
                            "not uploaded")


class _BytesPieces:
    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.problem: str | None = None

    def __iter__(self) -> Iterator[bytes]:
        for start in range(0, len(self.data), STREAM_CHUNK):
            yield bytes(self.data[start:start + STREAM_CHUNK])


class RemoteClient:
    """A connection to one REAPI server (one gRPC channel; close it, or use ``with``)."""

    def __init__(self, settings: RemoteSettings) -> None:
        self.settings = settings
        self.url = settings.url
        self._prefix = f"{settings.instance}/" if settings.instance else ""
        tool = remote_execution_pb2.RequestMetadata(
            tool_details=remote_execution_pb2.ToolDetails(tool_name="offload-builders", tool_version=__version__))
        self._metadata = (*settings.headers, (_REQUEST_METADATA_KEY, tool.SerializeToString()))
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # gRPC waits 1 s and more (up to 2 min) before it reconnects after a failure, and fails calls at once
            # meanwhile: a server that restarted would stay unreachable. Not grpc.min_reconnect_backoff_ms: it is
            # also the time a connection attempt may take (20 s by default), which a distant TLS server needs.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
            ("grpc.primary_user_agent", f"offload-builders/{__version__}"),
        ]
        if settings.secure:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=self._tls_file(settings.root_certificates, "CA certificates (OFFLOAD_REMOTE_CA)"),
                private_key=self._tls_file(settings.client_key, "client key (OFFLOAD_REMOTE_KEY)"),
                certificate_chain=self._tls_file(settings.client_certificate,
                                                 "client certificate (OFFLOAD_REMOTE_CERT)"))
            self._channel = grpc.secure_channel(settings.target, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(settings.target, options=options)
        self._capabilities_stub = remote_execution_pb2_grpc.CapabilitiesStub(self._channel)
        self._cas = remote_execution_pb2_grpc.ContentAddressableStorageStub(self._channel)
        self._action_cache = remote_execution_pb2_grpc.ActionCacheStub(self._channel)
        self._execution = remote_execution_pb2_grpc.ExecutionStub(self._channel)
        self._bytestream = bytestream_pb2_grpc.ByteStreamStub(self._channel)
        self._lock = threading.Lock()
        self._capabilities: remote_execution_pb2.ServerCapabilities | None = None
        self._batch_limit: int | None = None

    def _tls_file(self, path: str | None, what: str) -> bytes | None:
        if path is None:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as error:
            raise RemoteError(f"remote cache {self.url}: cannot read the TLS {what} {path}: "
                              f"{error.strerror or error}") from None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteClient({self.url})"

    # --- calls, retries, errors ---------------------------------------------------------------------------------

    def _failure(self, method: str, error: grpc.RpcError, service: str = "cache") -> RemoteCallError:
        code_of = getattr(error, "code", None)
        code = code_of() if callable(code_of) else None
        name = str(getattr(code, "name", code or "UNKNOWN"))
        details_of = getattr(error, "details", None)
        details = (details_of() if callable(details_of) else None) or str(error)
        return RemoteCallError(f"remote {service} {self.url}: {safe_text(name, 40)}: {safe_text(details)} ({method})",
                               name, method)

    def _call(self, method: str, attempt: Callable[[], T], service: str = "cache") -> T:
        """``attempt()``, again after a transient failure (up to ``retries`` times); a gRPC error becomes
        :class:`RemoteCallError`. ``attempt`` must start over each time (a fresh request stream, a fresh sink)."""
        tries = 0
        while True:
            try:
                return attempt()
            except grpc.RpcError as error:
                failure = self._failure(method, error, service)
            except _Stalled as stall:
                failure = RemoteCallError(f"remote {service} {self.url}: DEADLINE_EXCEEDED: {stall} ({method})",
                                          "DEADLINE_EXCEEDED", method)
            if failure.code not in RETRIED_CODES or tries >= self.settings.retries:
                raise failure
            time.sleep(RETRY_BACKOFF_S * 2 ** tries)
            tries += 1

    def _unary(self, method: str, stub_method: Callable[..., T], request: object) -> T:
        return self._call(method, lambda: stub_method(request, timeout=self.settings.timeout_s,
                                                       metadata=self._metadata))

    def _transfer_timeout(self, size: int) -> float:
        """A ByteStream call's gRPC deadline: the timeout and the time ``size`` takes at :data:`MIN_TRANSFER_RATE`
        (a read's size is bounded by ``max_blob_bytes`` first, and its watchdog ends it sooner where bytes stop)."""
        return self.settings.timeout_s + size / MIN_TRANSFER_RATE

    def check_size(self, digest: Digest, destination: Path | None = None) -> None:
        """:class:`RemoteIntegrityError` where blob ``digest`` is larger than this client reads
        (``max_blob_bytes``), or than the space left on ``destination``'s file system: refused before a byte is
        read, whatever the server would send."""
        if digest.size > self.settings.max_blob_bytes:
            raise RemoteIntegrityError(f"blob {digest} named by remote cache {self.url} is larger than the "
                                       f"{self.settings.max_blob_bytes} bytes read at most (OFFLOAD_REMOTE_MAX_BLOB); "
                                       "not read")
        if destination is not None and digest.size > 0:
            try:
                status = os.statvfs(destination.parent)
            except OSError:
                return
            free = status.f_bavail * status.f_frsize
            if digest.size > free:
                raise RemoteIntegrityError(f"blob {digest} named by remote cache {self.url} is larger than the "
                                           f"{free} bytes free beside {destination}; not read")

    # --- capabilities -----------------------------------------------------------------------------------------

    def capabilities(self) -> remote_execution_pb2.ServerCapabilities:
        """The server's capabilities for this instance (asked once). A wrong instance name fails here."""
        with self._lock:
            if self._capabilities is None:
                request = remote_execution_pb2.GetCapabilitiesRequest(instance_name=self.settings.instance)
                self._capabilities = self._unary("GetCapabilities", self._capabilities_stub.GetCapabilities,
                                                 request)
            return self._capabilities

    @property
    def max_batch_bytes(self) -> int:
        """The batch limit in use: the settings', lowered to the server's ``max_batch_total_size_bytes`` where it
        announces one. A server without the Capabilities service gets the settings' limit."""
        if self._batch_limit is None:
            limit = self.settings.max_batch_bytes
            try:
                cache = self.capabilities().cache_capabilities
            except RemoteCallError as error:
                if error.code != "UNIMPLEMENTED":
                    raise
            else:
                functions = set(cache.digest_function)
                if functions and remote_execution_pb2.DigestFunction.SHA256 not in functions:
                    raise RemoteError(f"remote cache {self.url}: the server does not offer SHA-256 digests")
                if cache.max_batch_total_size_bytes > 0:
                    limit = min(limit, cache.max_batch_total_size_bytes)
            self._batch_limit = limit
        return self._batch_limit

    def _fits_batch(self, digest: Digest) -> bool:
        return digest.size + BLOB_OVERHEAD <= self.max_batch_bytes

    # --- CAS --------------------------------------------------------------------------------------------------

    def find_missing(self, digests: Iterable[Digest]) -> set[Digest]:
        """Which of ``digests`` the server lacks (the empty blob never: servers always have it)."""
        wanted = list(dict.fromkeys(digest for digest in digests if digest != EMPTY_DIGEST))
        asked = set(wanted)
        missing: set[Digest] = set()
        for start in range(0, len(wanted), FIND_MISSING_BATCH):
            request = remote_execution_pb2.FindMissingBlobsRequest(
                instance_name=self.settings.instance,
                blob_digests=[to_proto(digest) for digest in wanted[start:start + FIND_MISSING_BATCH]])
            response = self._unary("FindMissingBlobs", self._cas.FindMissingBlobs, request)
            missing.update(Digest(entry.hash, entry.size_bytes) for entry in response.missing_blob_digests)
        return missing & asked

    def upload_blobs(self, blobs: Mapping[Digest, bytes]) -> None:
        """Store ``blobs`` (digest -> bytes): in batches, or by ByteStream for those too large for one."""
        digests = [digest for digest in blobs if digest != EMPTY_DIGEST]
        if not digests:
            return
        for batch in _batches([digest for digest in digests if self._fits_batch(digest)], self.max_batch_bytes):
            self._batch_update([(digest, blobs[digest]) for digest in batch])
        for digest in digests:
            if not self._fits_batch(digest):
                self._write(digest, _BytesPieces(blobs[digest]))

    def upload_files(self, files: Mapping[Digest, Path]) -> None:
        """Store files (digest -> path) as blobs: small ones read a batch at a time, large ones streamed. A file
        that no longer matches its digest is not stored (:class:`RemoteIntegrityError` naming it); an unreadable
        one raises its OSError."""
        digests = [digest for digest in files if digest != EMPTY_DIGEST]
        if not digests:
            return
        for batch in _batches([digest for digest in digests if self._fits_batch(digest)], self.max_batch_bytes):
            self._batch_update([(digest, self._read_file(files[digest], digest)) for digest in batch])
        for digest in digests:
            if not self._fits_batch(digest):
                self._write(digest, _FilePieces(Path(files[digest]), digest))

    @staticmethod
    def _read_file(path: Path, digest: Digest) -> bytes:
        data = Path(path).read_bytes()
        if digest_of_bytes(data) != digest:
            raise RemoteIntegrityError(f"{path} changed since it was hashed: it no longer matches {digest}; "
                                       "not uploaded")
        return data

    def _batch_update(self, blobs: Sequence[tuple[Digest, bytes]]) -> None:
        request = remote_execution_pb2.BatchUpdateBlobsRequest(
            instance_name=self.settings.instance,
            requests=[remote_execution_pb2.BatchUpdateBlobsRequest.Request(digest=to_proto(digest), data=data)
                      for digest, data in blobs])
        response = self._unary("BatchUpdateBlobs", self._cas.BatchUpdateBlobs, request)
        statuses = {Digest(entry.digest.hash, entry.digest.size_bytes): entry.status for entry in response.responses}
        for digest, _ in blobs:
            status = statuses.get(digest)
            if status is None:
                raise RemoteError(f"remote cache {self.url}: no answer for blob {digest} (BatchUpdateBlobs)")
            if status.code != code_pb2.OK:
                raise RemoteError(f"remote cache {self.url}: blob {digest} not stored: {_status_name(status.code)}: "
                                  f"{safe_text(status.message)} (BatchUpdateBlobs)")

    def _write(self, digest: Digest, pieces: _FilePieces | _BytesPieces) -> None:
        """One blob by ByteStream Write, in pieces; the last one finishes the write (unless the source turned out
        not to match the digest: the server then discards the upload)."""

        def requests(resource: str) -> Iterator[bytestream_pb2.WriteRequest]:
            offset = 0
            pending: bytes | None = None
            for piece in pieces:
                if pending is not None:
                    yield bytestream_pb2.WriteRequest(resource_name=resource if offset == 0 else "",
                                                      write_offset=offset, data=pending)
                    offset += len(pending)
                pending = piece
            if pieces.problem is None:
                yield bytestream_pb2.WriteRequest(resource_name=resource if offset == 0 else "", write_offset=offset,
                                                  data=pending or b"", finish_write=True)

        def attempt() -> bytestream_pb2.WriteResponse:
            resource = f"{self._prefix}uploads/{uuid.uuid4()}/blobs/{digest.hash}/{digest.size}"
            response: bytestream_pb2.WriteResponse = self._bytestream.Write(
                requests(resource), timeout=self._transfer_timeout(digest.size), metadata=self._metadata)
            return response

        try:
            response = self._call("Write", attempt)
        except RemoteError:
            if pieces.problem is not None:
                raise RemoteIntegrityError(pieces.problem) from None
            raise
        if pieces.problem is not None:
            raise RemoteIntegrityError(pieces.problem)
        # -1: the server had the blob already (REAPI allows it for compressed uploads; some servers use it).
        if response.committed_size not in (digest.size, -1):
            raise RemoteError(f"remote cache {self.url}: blob {digest} written, but the server committed "
                              f"{response.committed_size} bytes (Write)")

    def read_blob(self, digest: Digest) -> bytes:
        """The blob ``digest`` names, checked against it (see :meth:`read_blobs`)."""
        return self.read_blobs([digest])[digest]

    def read_blobs(self, digests: Iterable[Digest]) -> dict[Digest, bytes]:
        """The blobs ``digests`` name, each checked against its digest (:class:`RemoteIntegrityError` naming it
        otherwise): in batches, or by ByteStream for large ones. Blobs the server lacks: :class:`BlobNotFoundError`
        (naming them all). The empty blob is not asked for."""
        wanted = list(dict.fromkeys(digests))
        for digest in wanted:
            self.check_size(digest)
        blobs: dict[Digest, bytes] = {digest: b"" for digest in wanted if digest == EMPTY_DIGEST}
        others = [digest for digest in wanted if digest != EMPTY_DIGEST]
        missing: list[Digest] = []
        if others:
            for batch in _batches([digest for digest in others if self._fits_batch(digest)], self.max_batch_bytes):
                found, lacking = self._batch_read(batch)
                blobs.update(found)
                missing.extend(lacking)
            for digest in others:
                if not self._fits_batch(digest):
                    buffer = io.BytesIO()
                    try:
                        self._read_stream(digest, buffer)
                    except BlobNotFoundError:
                        missing.append(digest)
                        continue
                    blobs[digest] = buffer.getvalue()
        if missing:
            raise self._not_found(missing)
        return {digest: blobs[digest] for digest in wanted}

    def _not_found(self, digests: Sequence[Digest]) -> BlobNotFoundError:
        shown = ", ".join(str(digest) for digest in digests[:3]) + (f" and {len(digests) - 3} more"
                                                                    if len(digests) > 3 else "")
        return BlobNotFoundError(f"remote cache {self.url}: blob{'s' if len(digests) > 1 else ''} {shown} not found",
                                 digests)

    def _batch_read(self, batch: Sequence[Digest]) -> tuple[dict[Digest, bytes], list[Digest]]:
        request = remote_execution_pb2.BatchReadBlobsRequest(instance_name=self.settings.instance,
                                                             digests=[to_proto(digest) for digest in batch])
        response = self._unary("BatchReadBlobs", self._cas.BatchReadBlobs, request)
        answers = {Digest(entry.digest.hash, entry.digest.size_bytes): entry for entry in response.responses}
        found: dict[Digest, bytes] = {}
        missing: list[Digest] = []
        for digest in batch:
            entry = answers.get(digest)
            if entry is None:
                raise RemoteError(f"remote cache {self.url}: no answer for blob {digest} (BatchReadBlobs)")
            if entry.status.code == code_pb2.NOT_FOUND:
                missing.append(digest)
            elif entry.status.code != code_pb2.OK:
                raise RemoteError(f"remote cache {self.url}: blob {digest} not read: "
                                  f"{_status_name(entry.status.code)}: {safe_text(entry.status.message)} "
                                  "(BatchReadBlobs)")
            else:
                found[digest] = verify_blob(digest, entry.data, f"remote cache {self.url}")
        return found, missing

    def _stream(self, digest: Digest, sink: Callable[[bytes], None], *, offset: int = 0, limit: int | None = None
                ) -> int:
        """Read blob ``digest`` by ByteStream (from ``offset``, at most ``limit`` bytes), each piece to ``sink``;
        the bytes received. More bytes than the digest's size (or ``limit``) stop the read before they reach
        ``sink`` (:class:`RemoteIntegrityError`); a read that stalls is ended by a :class:`_Watchdog`."""
        most = digest.size - offset if limit is None else min(limit, digest.size - offset)
        request = bytestream_pb2.ReadRequest(resource_name=f"{self._prefix}blobs/{digest.hash}/{digest.size}",
                                             read_offset=offset, read_limit=0 if limit is None else most)
        call = self._bytestream.Read(request, timeout=self._transfer_timeout(most), metadata=self._metadata)
        watchdog = _Watchdog(call, self.settings.timeout_s)
        size = 0
        try:
            for response in call:
                size += len(response.data)
                watchdog.received(len(response.data))
                if size > most:
                    raise RemoteIntegrityError(f"blob {digest} from remote cache {self.url} does not match its "
                                               f"digest: more than {most} bytes came"
                                               f"{f' from offset {offset}' if offset else ''}")
                sink(response.data)
        except grpc.RpcError:
            if watchdog.reason is not None:
                raise _Stalled(watchdog.reason) from None
            raise
        finally:
            watchdog.stop()
            call.cancel()
        return size

    def _read_stream(self, digest: Digest, out: IO[bytes]) -> None:
        """Blob ``digest`` by ByteStream Read into ``out`` (from its start; rewritten on a retry), checked as it
        comes: more bytes than the digest's size stop the read at once. Its callers have checked the size
        (:meth:`check_size`)."""

        def attempt() -> None:
            out.seek(0)
            out.truncate()
            sha = hashlib.sha256()

            def sink(data: bytes) -> None:
                sha.update(data)
                out.write(data)

            size = self._stream(digest, sink)
            if size != digest.size or sha.hexdigest() != digest.hash:
                raise RemoteIntegrityError(f"blob {digest} from remote cache {self.url} does not match its digest: "
                                           f"got {size} bytes with SHA-256 {sha.hexdigest()}")

        self._read_call(digest, attempt)

    def _read_call(self, digest: Digest, attempt: Callable[[], T]) -> T:
        """A ByteStream read of ``digest`` (:meth:`_call`), the server's ``NOT_FOUND`` as :class:`BlobNotFoundError`."""
        try:
            return self._call("Read", attempt)
        except RemoteCallError as error:
            if error.code == "NOT_FOUND":
                raise self._not_found([digest]) from None
            raise

    def read_tail(self, digest: Digest, limit: int = TAIL_BYTES) -> bytes:
        """The end of blob ``digest``, at most ``limit`` bytes, for a message (a failed command's stderr): a blob
        within ``limit`` is read whole and checked against its digest; of a larger one only the last ``limit``
        bytes are read (ByteStream's ``read_offset``), which no digest can check, so they are only ever shown
        (through :func:`~offload_builders.remote.text.safe_text`)."""
        if digest.size <= limit:
            return self.read_blob(digest)
        pieces: list[bytes] = []

        def attempt() -> bytes:
            pieces.clear()
            self._stream(digest, pieces.append, offset=digest.size - limit, limit=limit)
            return b"".join(pieces)

        return self._read_call(digest, attempt)

    def download_to(self, digest: Digest, path: Path) -> None:
        """Write blob ``digest`` to ``path``: into a temporary file beside it, checked, then moved into place, so
        that ``path`` is either the whole checked blob or untouched (the temporary file never stays; one a
        killed process left is swept by the next run of the node or step: see :mod:`offload_builders.remote`).
        A blob larger than this client reads or than the space left there is refused first (:meth:`check_size`):
        at most the digest's size is ever written."""
        path = Path(path)
        self.check_size(digest, path)
        temporary = download_temporary(path)
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            with os.fdopen(descriptor, "wb") as out:
                if digest == EMPTY_DIGEST:
                    pass
                elif self._fits_batch(digest):
                    out.write(self.read_blob(digest))
                else:
                    self._read_stream(digest, out)
            os.replace(temporary, path)
        except BaseException:
            try:
                os.unlink(temporary)
            except FileNotFoundError:
                pass
            raise

    # --- ActionCache ------------------------------------------------------------------------------------------

    def get_action_result(self, action_digest: Digest, inline_outputs: bool = False
                          ) -> remote_execution_pb2.ActionResult | None:
        """The cached result of the Action (None where there is none); ``inline_outputs`` asks for stdout and
        stderr inline (servers may still send digests only)."""
        request = remote_execution_pb2.GetActionResultRequest(
            instance_name=self.settings.instance, action_digest=to_proto(action_digest),
            inline_stdout=inline_outputs, inline_stderr=inline_outputs)
        try:
            result: remote_execution_pb2.ActionResult = self._unary(
                "GetActionResult", self._action_cache.GetActionResult, request)
            return result
        except RemoteCallError as error:
            if error.code == "NOT_FOUND":
                return None
            raise

    def update_action_result(self, action_digest: Digest, result: remote_execution_pb2.ActionResult) -> None:
        """Store ``result`` as the Action's (its outputs must be in the CAS first: servers may check)."""
        request = remote_execution_pb2.UpdateActionResultRequest(
            instance_name=self.settings.instance, action_digest=to_proto(action_digest), action_result=result)
        self._unary("UpdateActionResult", self._action_cache.UpdateActionResult, request)

    # --- Execution --------------------------------------------------------------------------------------------

    def execute(self, action_digest: Digest, skip_cache_lookup: bool = False, timeout_s: float | None = None
                ) -> remote_execution_pb2.ExecuteResponse:
        """Run the Action (uploaded with its inputs beforehand) and wait for it: the ExecuteResponse, whose
        result may have a non-zero exit code (returned, not raised). An execution the server could not carry out
        (a non-OK status, an operation error) is a :class:`RemoteError` with its message. ``timeout_s`` bounds the
        whole wait (None: as long as the server keeps the operation going). A dropped stream is followed up with
        WaitExecution."""
        request = remote_execution_pb2.ExecuteRequest(instance_name=self.settings.instance,
                                                      action_digest=to_proto(action_digest),
                                                      skip_cache_lookup=skip_cache_lookup)
        return self._follow("", lambda remaining: self._execution.Execute(
            request, timeout=remaining, metadata=self._metadata), str(action_digest), timeout_s)

    def wait_execution(self, name: str, timeout_s: float | None = None) -> remote_execution_pb2.ExecuteResponse:
        """Wait for the execution ``name`` (an operation name :meth:`execute`'s server gave) to finish."""
        return self._follow(name, lambda remaining: iter(()), f"operation {safe_text(name, 200)}", timeout_s)

    def _follow(self, name: str, start: Callable[[float | None], Iterable[operations_pb2.Operation]], what: str,
                timeout_s: float | None) -> remote_execution_pb2.ExecuteResponse:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        tries = 0
        reconnects = 0
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise RemoteError(f"remote execution {self.url}: {what} did not finish within {timeout_s:g} s")
            method = "WaitExecution" if name else "Execute"
            stream: Iterable[operations_pb2.Operation]
            try:
                if name:
                    stream = self._execution.WaitExecution(remote_execution_pb2.WaitExecutionRequest(name=name),
                                                           timeout=remaining, metadata=self._metadata)
                else:
                    stream = start(remaining)
                try:
                    for operation in stream:
                        name = operation.name or name
                        if operation.done:
                            return self._finished(operation, what)
                finally:
                    cancel = getattr(stream, "cancel", None)
                    if callable(cancel):
                        cancel()
            except grpc.RpcError as error:
                failure = self._failure(method, error, "execution")
                if deadline is not None and failure.code == "DEADLINE_EXCEEDED" and time.monotonic() >= deadline:
                    continue  # the whole wait's deadline: reported above as not finished in time
                if failure.code not in RETRIED_CODES or tries >= self.settings.retries:
                    raise failure from None
                time.sleep(RETRY_BACKOFF_S * 2 ** tries)
                tries += 1
                continue
            # The stream ended before the operation was done: servers may close it at will (REAPI); follow it
            # with WaitExecution, after a pause (a server that ends each stream at once would have us spin).
            reconnects += 1
            if not name or reconnects > MAX_EXECUTION_RECONNECTS:
                raise RemoteError(f"remote execution {self.url}: the server stopped answering about {what} before "
                                  f"it finished ({method})")
            time.sleep(RETRY_BACKOFF_S if deadline is None else max(0.0, min(RETRY_BACKOFF_S,
                                                                               deadline - time.monotonic())))

    def _finished(self, operation: operations_pb2.Operation, what: str) -> remote_execution_pb2.ExecuteResponse:
        name = safe_text(operation.name, 200)
        if operation.HasField("error"):
            raise RemoteError(f"remote execution {self.url}: {what} failed: {_status_name(operation.error.code)}: "
                              f"{safe_text(operation.error.message)} (operation {name})")
        response = remote_execution_pb2.ExecuteResponse()
        if not operation.response.Unpack(response):
            raise RemoteError(f"remote execution {self.url}: {what} finished without an ExecuteResponse (operation "
                              f"{name} answered {safe_text(operation.response.type_url, 200) or 'nothing'})")
        if response.status.code != code_pb2.OK:
            message = safe_text(" ".join(part for part in (response.status.message, response.message) if part))
            raise RemoteError(f"remote execution {self.url}: {what} failed: {_status_name(response.status.code)}"
                              f"{': ' + message if message else ''} (operation {name})")
        return response


__all__ = ["BLOB_OVERHEAD", "BlobNotFoundError", "DEFAULT_EXECUTE_TIMEOUT_S", "DEFAULT_MAX_BATCH_BYTES",
           "DEFAULT_MAX_BLOB_BYTES", "DEFAULT_RETRIES", "DEFAULT_TIMEOUT_S", "MIN_TRANSFER_RATE", "TAIL_BYTES",
           "RemoteCallError", "RemoteClient", "RemoteSettings", "from_proto", "parse_headers", "parse_size", "to_proto",
           "verify_blob"]
