"""A per-user memo of what is computed from files outside a checkout (tools, device libraries): content digests,
an ELF program's dynamic entries, a library's identity, kept across processes by each file's stat identity.

``offload-link`` keys each GPU target's device link by the programs it runs and the files it reads outside the
checkout (:func:`~offload_builders.remote.actions.outside_file_line`): hashing ``ld.lld``, ``ptxas``, ``nvlink``
and the device libraries again in every link process costs more than the rest of its key. Here each file's results
are kept in one small file per path (its name: a hash of the path) in ``file-digests/`` of the per-user cache
(:func:`~offload_builders.toolchain.user_cache_dir`), a directory checked private to this user as
:mod:`offload_builders.private_dirs` says; where it cannot be made or is not private there is no memo and every
file is read as without one. An entry holds the path, the file's *stamp* (device, inode, size, modification and
change times, from an ``fstat`` before it was read) and what was computed from it; it is used only while the file's
stamp is still that. No one can set a change time (every write, rename, ``chmod`` or ``touch -d`` moves it to the
kernel's clock), so changed bytes show as another stamp, as for ``offload-cache``'s file lists
(:mod:`offload_builders.launcher.keys`): and as there, a file modified or changed less than
:data:`~offload_builders.source_identity.RACY_SECONDS` before it was read is not recorded (a write in the same clock
tick could leave its stamp as it was).

Many links run at once: an entry is written whole (a new file renamed over it,
:func:`~offload_builders.private_dirs.replace_private_file`), never locked; one that is damaged, another user's or
another path's reads as a miss and is written anew. At most :data:`MAX_ENTRIES` are kept: a process that adds one
drops the oldest (by modification time) beyond that, once.
"""
from __future__ import annotations

import hashlib
import json
import os
import time

from offload_builders.errors import ToolchainError
from offload_builders.private_dirs import private_path, replace_private_file, trusted_file_text
from offload_builders.remote.digests import Digest, digest_of_file, digest_of_stream
from offload_builders.source_identity import RACY_SECONDS, settled, stat_stamp

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: The memo's directory in the per-user cache.
DIRECTORY = "file-digests"
#: Entries kept at most; beyond it the oldest go.
MAX_ENTRIES = 4096
#: Bumped when an entry's form or meaning changes: older entries then miss.
_VERSION = 1
#: An entry is this small; anything larger is not one.
_MAX_ENTRY_BYTES = 1 << 16


class FileMemo:
    """The memo in ``directory`` (private, checked by the caller)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._pruned = False

    def _entry_path(self, path: str) -> str:
        return os.path.join(self.directory, hashlib.sha256(os.fsencode(path)).hexdigest()[:32])

    def _read(self, path: str) -> dict[str, Any] | None:
        text = trusted_file_text(self._entry_path(path), _MAX_ENTRY_BYTES)
        if text is None:
            return None
        try:
            entry = json.loads(text)
        except ValueError:
            return None
        if (not isinstance(entry, dict) or entry.get("version") != _VERSION or entry.get("path") != path
                or not isinstance(entry.get("stamp"), str) or not isinstance(entry.get("values"), dict)):
            return None
        return entry

    def lookup(self, path: str, status: os.stat_result, field: str) -> Any:
        """What ``field`` recorded for ``path`` while its stamp was ``status``'s; None where nothing was."""
        entry = self._read(path)
        if entry is None or entry["stamp"] != stat_stamp(status):
            return None
        return entry["values"].get(field)

    def record(self, path: str, status: os.stat_result, settled_before: int, field: str, value: Any) -> None:
        """Record ``value`` as ``path``'s ``field`` while its stamp is ``status``'s (an ``fstat`` made before it was
        read, after ``settled_before`` was taken), unless the file was modified or changed after
        ``settled_before``. Never fails: a memo that cannot be written is one that misses."""
        if not settled(status, settled_before):
            return
        stamp = stat_stamp(status)
        entry = self._read(path)
        values = dict(entry["values"]) if entry is not None and entry["stamp"] == stamp else {}
        values[field] = value
        target = self._entry_path(path)
        existed = os.path.lexists(target)
        try:
            replace_private_file(target, json.dumps({"version": _VERSION, "path": path, "stamp": stamp,
                                                     "values": values}, separators=(",", ":")))
        except (OSError, ValueError):
            return
        if not existed:
            self.prune()

    def prune(self) -> None:
        """Drop the oldest entries beyond :data:`MAX_ENTRIES` (once per process)."""
        if self._pruned:
            return
        self._pruned = True
        try:
            with os.scandir(self.directory) as entries:
                names = [entry for entry in entries if not entry.name.startswith(".")]
            if len(names) <= MAX_ENTRIES:
                return
            dated = []
            for entry in names:
                try:
                    dated.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.path))
                except OSError:
                    continue
        except OSError:
            return
        dated.sort()
        for _, path in dated[:len(dated) - MAX_ENTRIES]:
            try:
                os.unlink(path)
            except OSError:
                pass


#: This process's memo: unset, None (none: off, or not private) or the memo.
_MEMO: list[FileMemo | None] = []


def memo() -> FileMemo | None:
    """The per-user memo, found once per process; None where the per-user caches are off or its directory cannot
    be made or is not private to this user."""
    if not _MEMO:
        from offload_builders.toolchain import user_cache_dir

        cache = user_cache_dir()
        found = None
        if cache is not None:
            try:
                found = FileMemo(private_path(os.path.join(cache, DIRECTORY)))
            except ToolchainError:
                found = None
        _MEMO.append(found)
    return _MEMO[0]


def settled_before() -> int:
    """The time before which a file's modification and change must lie for its stamp to be recorded: take it
    before the ``fstat`` whose stamp is recorded."""
    return time.time_ns() - int(RACY_SECONDS * 1e9)


def content_digest(path: str) -> Digest:
    """``path``'s content digest (:func:`~offload_builders.remote.digests.digest_of_file`), from the memo where
    the file's stamp is the one recorded with it, else read (and recorded). Raises :class:`OSError` where the
    file cannot be read."""
    found = memo()
    if found is None:
        return digest_of_file(path)
    before = settled_before()
    with open(path, "rb") as stream:
        status = os.fstat(stream.fileno())  # the stamp of the bytes read below: before they are
        recorded = found.lookup(path, status, "digest")
        if (isinstance(recorded, list) and len(recorded) == 2 and isinstance(recorded[0], str)
                and isinstance(recorded[1], int)):
            return Digest(recorded[0], recorded[1])
        digest = digest_of_stream(stream)
    found.record(path, status, before, "digest", [digest.hash, digest.size])
    return digest


__all__ = ["DIRECTORY", "MAX_ENTRIES", "FileMemo", "content_digest", "memo", "settled_before"]
