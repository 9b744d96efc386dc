"""Content signatures of build outputs, remembered with each file's whole stat identity.

SCons hashes every dependency younger than ``--max-drift`` (two days) on every run, a no-op included, and
in an offload build that is every intermediate: host bitcode, device code, cubins, objects, link inputs,
images; several times the bytes of a plain build. Git's index answers the same question without reading
the file: a file whose device, inode, size, modification time and change time are those it had when it
was hashed still has that content. No user or tool can set the change time (``touch``, ``cp -p``, a
cache retrieval, a checkout and an editor's rewrite all give a new one, and a new inode for a new file), so
a rewrite with a restored modification time is caught too.

A signature is recorded only for a file whose identity at the end of the run is the one it had at its
start, before anything was hashed (so a change during the run, whatever a network file system's clock
stamps it with, is never recorded), and whose last change was :data:`SETTLED_NS` or more before the run
started (so a rewrite within the clock tick of that change, keeping the size, cannot pass for it: the
racy case of Git's index). A file changed since is recorded by a later run.

This module has no SCons imports: :mod:`offload_builders.scons.content_signatures` applies it to our nodes.
"""
from __future__ import annotations

import marshal
import os
from typing import Any

#: How much older than the run's start a file's last change must be for its hash to be recorded: far more
#: than a file-system clock tick (1-10 ms on Linux), and than the skew of a network file system's clock.
SETTLED_NS = 2_000_000_000

#: The record file's layout; a file of another version (or unreadable) is ignored and rewritten.
_VERSION = 1

#: A file's identity as recorded: device, inode, size, modification and change time (ns).
Identity = tuple[int, int, int, int, int]


def identity(stat: os.stat_result) -> Identity:
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


class ContentRecords:
    """Path -> (identity, content signature) for one project, kept in one file between runs.

    ``hash_format`` names the signature's algorithm (SCons' ``--hash-format``); records made with another one
    are not used. Thread-safe for lookups (dictionary reads); :meth:`note` runs after the build.
    """

    def __init__(self, path: str, hash_format: str, started_ns: int) -> None:
        self.path = path
        self.hash_format = hash_format
        self.started_ns = started_ns
        self._records: dict[str, tuple[Identity, str]] = {}
        self._changed = False
        try:
            with open(path, "rb") as stream:
                version, recorded_format, records = marshal.load(stream)
            if version == _VERSION and recorded_format == hash_format and isinstance(records, dict):
                self._records = records
        except (OSError, EOFError, ValueError, TypeError):
            pass

    def known(self, path: str, stat: os.stat_result) -> str | None:
        """The content signature recorded for ``path`` if the file is still the one that was hashed."""
        entry = self._records.get(path)
        return entry[1] if entry is not None and entry[0] == identity(stat) else None

    def note(self, path: str, before: os.stat_result | None, after: os.stat_result | None, signature: Any) -> None:
        """Record ``signature`` as the content of ``path`` if the file had the same identity before the
        signature could have been computed (``before``: at the start of the run) and after (``after``: at its
        end), and was last changed well before the run started; otherwise forget the path, unless its record
        still matches the file. (With ``before`` the record needs no trust in clocks for a change during the
        run; the settling time covers a change within the clock tick before it.)"""
        now = identity(after) if after is not None else None
        if self._settled(after) and before is not None and identity(before) == now and \
                isinstance(signature, str) and signature:
            assert now is not None
            entry = (now, signature)
            if self._records.get(path) != entry:
                self._records[path] = entry
                self._changed = True
        elif path in self._records and self._records[path][0] != now:
            del self._records[path]
            self._changed = True

    def _settled(self, stat: os.stat_result | None) -> bool:
        return stat is not None and max(stat.st_mtime_ns, stat.st_ctime_ns) <= self.started_ns - SETTLED_NS

    def save(self) -> None:
        """Write the records if they changed (through a temporary file, so a killed run leaves the old ones)."""
        if not self._changed:
            return
        temporary = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(temporary, "wb") as stream:
                marshal.dump((_VERSION, self.hash_format, self._records), stream)
            os.replace(temporary, self.path)
        except OSError:
            try:
                os.unlink(temporary)
            except OSError:
                pass
        self._changed = False
