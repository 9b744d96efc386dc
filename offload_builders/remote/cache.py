"""A build's remote cache: look a node's Action up before it runs, store its outputs after.

A hit writes every output to the place the caller names (its ``.partial`` path), each checked against its
digest before it is written; only when all are there does the caller move them into place, so a failed or
interrupted download never leaves an output a later build takes as up to date. A miss, a server that cannot
be reached or answers out of protocol, or a blob that does not match its digest is never an error: the node
is built locally. An unusable server is warned about once and not asked again in this process (a down or
slow server would otherwise cost every node its timeout); a bad blob is warned about each time. Every warning
is made safe to print (:func:`~offload_builders.remote.text.safe_text`: the server's words are in it), and the
URL is shown redacted (:func:`~offload_builders.remote.text.redact_url`).
"""
from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from offload_builders.errors import RemoteError, RemoteIntegrityError
from offload_builders.remote.actions import ActionMessages
from offload_builders.remote.digests import Digest, digest_of_file
from offload_builders.remote.text import MESSAGE_LIMIT, redact_url, safe_names, safe_text

if TYPE_CHECKING:  # imported when a remote is configured: it needs the extra 'remote' (grpcio)
    from offload_builders.remote.client import RemoteClient
    from offload_builders.remote.protos import remote_execution_pb2


class RemoteCache:
    """One server's cache, shared by a build's nodes (thread-safe: SCons runs nodes in threads under ``-j``)."""

    def __init__(self, url: str, environ: Mapping[str, str], warn: Callable[[str], None]) -> None:
        #: The server's URL as messages show it (redacted: it may hold a credential).
        self.url = redact_url(url)
        self._url = url
        self._environ = dict(environ)
        #: ``OFFLOAD_REMOTE_UPLOAD=0``: read the cache, never write it (a developer's machine against a cache
        #: that only CI fills: whoever can write to a shared cache decides what every build that reads it gets).
        self.uploads = environ.get("OFFLOAD_REMOTE_UPLOAD", "1").strip().lower() not in ("0", "false", "no", "off")
        self._warn_to = warn
        self._client: RemoteClient | None = None
        self._lock = threading.Lock()
        #: Why the server is no longer asked (None while it is).
        self.disabled: str | None = None
        #: hits, misses, stored, integrity (bad blobs), errors.
        self.counts: Counter[str] = Counter()

    def _warn(self, message: str) -> None:
        """One warning, made safe to print whatever server text it holds."""
        self._warn_to(safe_text(message, MESSAGE_LIMIT))

    def _connection(self) -> RemoteClient | None:
        with self._lock:
            if self.disabled is not None:
                return None
            if self._client is None:
                try:
                    from offload_builders.remote.client import RemoteClient, RemoteSettings

                    self._client = RemoteClient(RemoteSettings.from_url(self._url, self._environ))
                except RemoteError as error:
                    self._give_up(error)
                    return None
            return self._client

    def _give_up(self, error: RemoteError) -> None:
        """Called with the lock held or from a node's thread: warn once, stop asking."""
        if self.disabled is None:
            self.disabled = str(error)
            self.counts["errors"] += 1
            self._warn(f"remote {self.url} not used for the rest of this build ({error}); building locally")

    def give_up(self, error: RemoteError) -> None:
        """Stop asking the server for the rest of this process, with one warning naming ``error``."""
        with self._lock:
            self._give_up(error)

    def fetch(self, messages: ActionMessages, destinations: Mapping[str, str]) -> bool:
        """On a hit, write each output (relative path -> where to write it) and answer True. Anything else
        (miss, error, bad blob) leaves none of the destinations behind and answers False."""
        client = self._connection()
        if client is None:
            return False
        from offload_builders.remote.client import BlobNotFoundError
        try:
            result = client.get_action_result(messages.action_digest)
            if result is None:
                self.counts["misses"] += 1
                return False
            if result.exit_code != 0:
                raise RemoteIntegrityError(f"the cached result of action {messages.action_digest} is a failure "
                                           f"(exit status {result.exit_code})")
            _download_outputs(client, messages, result, destinations)
            self.counts["hits"] += 1
            return True
        except BlobNotFoundError:  # the result outlived its blobs (evicted): a miss
            self.counts["misses"] += 1
        except RemoteIntegrityError as error:
            self.counts["integrity"] += 1
            self._warn(f"remote cache: {error}; building {', '.join(sorted(destinations))} locally")
        except RemoteError as error:
            self.give_up(error)
        except (OSError, ValueError) as error:  # no room or no permission to write; a message that does not parse
            self.give_up(RemoteError(f"{type(error).__name__}: {error}"))
        return False

    def execute(self, messages: ActionMessages, inputs: Mapping[Digest, str], destinations: Mapping[str, str]
                ) -> bool:
        """Run the Action on the server's workers (REAPI ``Execute``): upload what it reads (``inputs``: the input
        files by digest, then the Action, Command and input tree), wait, and write each output to its
        destination, checked. False, with nothing left behind, where it could not run there or failed: the
        caller runs it here, which shows the tool's own diagnostics. A failure to reach the server is warned
        about once; a command that fails there is warned about each time, with its exit status."""
        client = self._connection()
        if client is None:
            return False
        try:
            missing = client.find_missing([*messages.blobs, *inputs])
            client.upload_files({digest: Path(path) for digest, path in inputs.items() if digest in missing})
            client.upload_blobs({digest: data for digest, data in messages.blobs.items() if digest in missing})
            result = client.execute(messages.action_digest, timeout_s=client.settings.execute_timeout_s).result
            if result.exit_code != 0:
                self.counts["failed"] += 1
                self._warn(f"remote execution of {', '.join(sorted(destinations))} exited with status "
                           f"{result.exit_code}{_last_error_line(client, result)}; running it here")
                return False
            _download_outputs(client, messages, result, destinations)
            self.counts["executed"] += 1
            return True
        except RemoteIntegrityError as error:
            self.counts["integrity"] += 1
            self._warn(f"remote execution: {error}; running it here")
        except RemoteError as error:
            self.give_up(error)
        except (OSError, ValueError) as error:
            self.give_up(RemoteError(f"{type(error).__name__}: {error}"))
        return False

    def store(self, messages: ActionMessages, outputs: Mapping[str, str], executable: frozenset[str] = frozenset()
              ) -> None:
        """Upload a locally built node's outputs (relative path -> file) and its Action, Command and input tree,
        then its result. Errors are warned about (once) and otherwise ignored: the build has its outputs.
        Nothing with ``OFFLOAD_REMOTE_UPLOAD=0``."""
        client = self._connection() if self.uploads else None
        if client is None:
            return
        from offload_builders.remote.client import to_proto
        from offload_builders.remote.protos import remote_execution_pb2

        try:
            files = {path: digest_of_file(local) for path, local in outputs.items()}
            missing = client.find_missing([*messages.blobs, *files.values()])
            client.upload_blobs({digest: data for digest, data in messages.blobs.items() if digest in missing})
            by_digest: dict[Digest, Path] = {digest: Path(outputs[path]) for path, digest in files.items()}
            client.upload_files({digest: local for digest, local in by_digest.items() if digest in missing})
            result = remote_execution_pb2.ActionResult(exit_code=0)
            for path in sorted(files):
                result.output_files.add(path=path, digest=to_proto(files[path]), is_executable=path in executable)
            client.update_action_result(messages.action_digest, result)
            self.counts["stored"] += 1
        except RemoteIntegrityError as error:  # an output changed while it was uploaded: not shared
            self._warn(f"remote cache: not storing {', '.join(sorted(outputs))}: {error}")
        except RemoteError as error:
            # A cache this client may read but not write (PERMISSION_DENIED, UNAUTHENTICATED), or a server gone:
            # stop writing, keep reading (a server gone fails the next read, which stops that too).
            with self._lock:
                if self.uploads:
                    self.uploads = False
                    self._warn(f"remote cache: not uploading for the rest of this build ({error})")
        except OSError as error:  # an output removed under us: nothing to share
            self._warn(f"remote cache: not storing {', '.join(sorted(outputs))}: {error}")


def _download_outputs(client: RemoteClient, messages: ActionMessages, result: remote_execution_pb2.ActionResult,
                      destinations: Mapping[str, str]) -> None:
    """Write each output the result names to its destination, checked against its digest, where the result
    names exactly the declared outputs (as files); on any error, remove what was written and raise."""
    from offload_builders.remote.client import from_proto

    files = {entry.path: entry for entry in result.output_files}
    if (set(files) != set(destinations) or len(files) != len(result.output_files) or result.output_directories
            or result.output_file_symlinks or result.output_symlinks):
        named = [*files, *(entry.path for entry in result.output_directories),
                 *(entry.path for entry in result.output_file_symlinks),
                 *(entry.path for entry in result.output_symlinks)]
        raise RemoteIntegrityError(f"the result of action {messages.action_digest} names outputs "
                                   f"{safe_names(sorted(set(named)))}; the node declares {sorted(destinations)}")
    # Every digest checked (well-formed, not larger than the client reads) before anything is written.
    digests = {path: from_proto(entry.digest) for path, entry in files.items()}
    for path, digest in digests.items():
        client.check_size(digest, Path(destinations[path]))
    written: list[str] = []
    try:
        for path, entry in files.items():
            written.append(destinations[path])
            client.download_to(digests[path], Path(destinations[path]))
            if entry.is_executable:
                os.chmod(destinations[path], os.stat(destinations[path]).st_mode | 0o111)
    except BaseException:
        for destination in written:
            try:
                os.unlink(destination)
            except FileNotFoundError:
                pass
        raise


def _last_error_line(client: RemoteClient, result: remote_execution_pb2.ActionResult) -> str:
    """``: <the last line the command wrote to stderr>``, inline or by digest ('' where there is none): read from
    its end, at most :data:`~offload_builders.remote.client.TAIL_BYTES` of it, and made safe to print (it is the
    server's)."""
    from offload_builders.remote.client import TAIL_BYTES, from_proto

    data = result.stderr_raw[-TAIL_BYTES:]
    if not data and result.stderr_digest.hash:
        try:
            data = client.read_tail(from_proto(result.stderr_digest), TAIL_BYTES)
        except RemoteError:
            return ""
    lines = data.decode(errors="replace").strip().splitlines()
    return f": {safe_text(lines[-1])}" if lines else ""


_CACHES: dict[tuple[str, tuple[tuple[str, str], ...]], RemoteCache] = {}
_CACHES_LOCK = threading.Lock()


def remote_cache(url: str, environ: Mapping[str, str], warn: Callable[[str], None]) -> RemoteCache:
    """The process's cache for ``url`` (and the ``OFFLOAD_REMOTE_*`` settings in ``environ``): one per build, so
    that a server found unusable is warned about once."""
    settings = tuple(sorted((name, value) for name, value in environ.items() if name.startswith("OFFLOAD_REMOTE")))
    with _CACHES_LOCK:
        cache = _CACHES.get((url, settings))
        if cache is None:
            cache = _CACHES[(url, settings)] = RemoteCache(url, environ, warn)
        return cache


__all__ = ["RemoteCache", "remote_cache"]
