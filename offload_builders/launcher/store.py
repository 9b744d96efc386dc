"""The on-disk cache of ``offload-cache``: one entry per job of an offload compile, under a key of what it reads.

Everything lives in one private directory (:func:`offload_builders.private_dirs.private_directory`: what is read
back from it becomes a build's objects, so no other user may write it):

* ``<key[:2]>/<key>/``: an entry: its files, each under the caller's name, and ``@manifest`` (each name and
  size, then the caller's opaque ``meta``). An entry appears whole or not at all: it is written in ``tmp/`` and
  renamed into place in one step, and it is removed the same way (renamed into ``tmp/``, then deleted), so a
  reader never sees half of one. Its directory's mtime is the LRU clock, set by each hit.
* ``stats/0`` ... ``stats/15``: counters, ``name value`` lines. A launcher updates the shard of its process id
  under that file's own ``flock``, so concurrent compiles seldom wait for one another. The cache's ``size`` and
  ``entries`` are counters too, added to by each store, so a store never walks the tree; :meth:`CacheStore.evict`
  walks it and sets them right.
* ``lists/<key[:2]>/<key>``: the file lists of a key's earlier runs (the launcher's direct mode: which files a
  compile read is known after it ran), each replaced whole by the last writer; small, outside the size limit, gone
  with :meth:`CacheStore.clear`. One name a line, with what the caller recorded with it after a NUL (the file's
  stamp and digest: :mod:`offload_builders.launcher.keys`); lists are apart by an empty line.
* ``config``: ``max_size = <bytes>`` (``offload-cache -M``).
* ``lock``: taken by eviction and clearing, so that two of them never walk and remove at once.

Where ``$OFFLOAD_REMOTE`` names a REAPI server, it is a second level (:meth:`CacheStore.remote`,
:mod:`offload_builders.launcher.remote_level`): a lookup that misses here asks it, and a hit there is downloaded
into an entry here (:meth:`CacheStore.fetch`, counted as ``remote-hits``); each store is uploaded too, packed into
one file (:func:`_pack`: a line, the manifest's length, the manifest, the files). A hit here asks no server and
imports nothing of it.

The launcher starts for every compile, so this module imports only cheap standard modules (no ``typing``,
``dataclasses`` or ``pathlib`` of its own): what a compile that is a cache hit costs is mostly start-up.
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat
import sys
import time

from offload_builders.errors import ToolchainError
from offload_builders.private_dirs import (
    UnsafeDirectoryError,
    private_path,
    replace_private_file,
    trusted_file_text,
)

TYPE_CHECKING = False  # typing costs every compile's start-up: for type checkers only
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from types import TracebackType

    from offload_builders.launcher.remote_level import RemoteLevel

#: The cache's size limit unless ``config`` says otherwise (``offload-cache -M``).
DEFAULT_MAX_SIZE = 5 << 30

#: Statistics files: a launcher updates ``stats/<pid % _STAT_SHARDS>`` only.
_STAT_SHARDS = 16
#: Counters that describe the cache's contents rather than its use: :meth:`CacheStore.zero_stats` keeps them.
_CONTENT_COUNTERS = ("size", "entries")
#: An entry used this recently is never evicted: a running command may still be about to read it.
_RECENT_SECONDS = 60
#: Eviction brings the size down to this share of the limit, so that it does not run again at the next store.
_EVICT_TO_PERCENT = 90
#: Temporary directories older than this were left by killed launchers: eviction removes them.
_STALE_TEMP_SECONDS = 3600

#: The directory of the kept images of the links the launcher runs (``$OFFLOAD_KEPT_IMAGES_DIR`` for them).
KEPT_IMAGES = "kept-images"
#: The file lists kept per key (the most recent first), and the largest such file read.
_MAX_FILE_LISTS = 8
_MAX_FILE_LISTS_BYTES = 4 << 20

_MANIFEST = "@manifest"  # "@" is not allowed in the callers' names: no file can take its place
_MANIFEST_MAGIC = b"offload-cache-entry 1\n"
_MAX_MANIFEST_BYTES = 64 << 20
_MAX_STATS_BYTES = 1 << 20
_CHUNK = 1 << 20

_HEX_DIGITS = frozenset("0123456789abcdef")
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_DIGITS = frozenset("0123456789")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_NO_FOLLOW = os.O_CLOEXEC | os.O_NOFOLLOW
#: copy_file_range errors that mean "not here" (another file system, an old kernel): copied with pread instead.
_NO_COPY_RANGE = frozenset({errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM, errno.EBADF})


class CacheStore:
    """The cache directory of one user: entries, statistics and the size limit. Make it with :meth:`open`.

    Every method that a compile runs (:meth:`lookup`, :meth:`store`, :meth:`count`) fails soft: a cache that
    cannot be read or written is a miss, never a failed build."""

    __slots__ = ("_remote", "_remote_known", "max_size", "read_only", "root")

    def __init__(self, root: str, *, read_only: bool = False) -> None:
        self.root = root
        #: ``OFFLOAD_CACHE_READONLY=1``: lookups only (a shared, pre-filled cache); counters are still kept.
        self.read_only = read_only
        #: The size limit in bytes (``config``); 0: no limit.
        self.max_size = self._read_max_size()
        #: The second level (:meth:`remote`), once a miss asked for it (``_remote_known``).
        self._remote: RemoteLevel | None = None
        self._remote_known = False

    @classmethod
    def open(cls, root: str | None = None) -> CacheStore | None:
        """The cache at ``root``, else ``$OFFLOAD_CACHE_DIR``, else ``offload-cache`` in the per-user cache
        directory (``$OFFLOAD_BUILDERS_CACHE_DIR``, else XDG's), made private (0700) if missing. None where the
        cache is off, and the launcher then runs the command as it is: a variable set empty turns it off; a
        directory that cannot be made or written (a read-only home, a sandbox) turns it off silently; one another
        user may write turns it off with one warning on stderr."""
        read_only = os.environ.get("OFFLOAD_CACHE_READONLY", "") not in ("", "0")
        if root is None:
            root = _configured_root()
            if root is None:
                return None
        root = os.path.abspath(root)
        try:
            private_path(root, create=not read_only)
        except UnsafeDirectoryError as error:
            sys.stderr.write(f"offload-cache: warning: cache off: {error}\n")
            return None
        except ToolchainError:
            return None
        needed = os.R_OK | os.X_OK if read_only else os.R_OK | os.W_OK | os.X_OK
        if not os.access(root, needed):
            return None
        return cls(root, read_only=read_only)

    # Entries.

    def lookup(self, key: str, *, remote: bool = True) -> Entry | None:
        """The entry of ``key`` with all its files open, or None (a miss). The files are opened before this
        returns, so an eviction meanwhile cannot take the bytes from the reader. A damaged entry (no manifest,
        a file missing or of another size than the manifest says) is a miss and is removed. A hit marks the
        entry used: its directory's mtime is what eviction sorts by. A miss asks the second level, where there is
        one and ``remote`` (:meth:`fetch`); a hit here never does."""
        entry = self._lookup_here(key)
        if entry is None and remote:
            entry = self.fetch(key)
        return entry

    def _lookup_here(self, key: str) -> Entry | None:
        """:meth:`lookup` in this directory only."""
        path = self._entry_dir(key)
        entry, info, found = _open_entry(path, key, mark_used=not self.read_only)
        if entry is None and found != "missing" and not self.read_only:
            freed = self._discard(path, info)  # something else where an entry should be (a file, a link)
            if freed is not None and found == "damaged":
                self._add({"size": -freed, "entries": -1})
        return entry

    def store(self, key: str, files: Mapping[str, str], meta: bytes = b"") -> bool:
        """Copy ``files`` (name -> path) into the entry of ``key`` with ``meta`` (opaque bytes the caller gets
        back: diagnostics to replay, a depfile). Written in a private temporary directory and renamed into place
        in one step; where the entry exists already it stays (the first writer wins). False, with nothing
        written, in read-only mode or on any OSError (a full disk): the cache never fails a build. Over the size
        limit afterwards, it evicts. Raises ValueError for a key or name that is not allowed (the caller's bug)."""
        path = self._entry_dir(key)
        for name in files:
            _check_name(name)
        if self.read_only:
            return False
        if os.path.lexists(path):
            return True
        stored = self._store_here(path, files, meta)
        level = self.remote()
        if level is not None and level.uploads:
            self._upload(level, key, files, meta)
        return stored

    def _store_here(self, path: str, files: Mapping[str, str], meta: bytes) -> bool:
        """:meth:`store` in this directory only."""
        try:
            temp = self._make_temp("store")
        except OSError:
            return False
        try:
            listed = []
            total = 0
            for name, source in files.items():
                size = _copy_in(source, os.path.join(temp, name))
                listed.append((name, size))
                total += size
            manifest = _manifest(listed, meta)
            _write_new(os.path.join(temp, _MANIFEST), manifest)
            total += len(manifest)
            if not self._install(temp, path):
                return True
        except OSError:
            remove_tree(temp)
            return False
        self._added({"stores": 1, "entries": 1, "size": total})
        return True

    def _install(self, temp: str, path: str) -> bool:
        """Rename the entry made in ``temp`` into place at ``path`` in one step; False (and ``temp`` removed) where
        another launcher put one there first, which stays. Raises OSError."""
        try:
            os.mkdir(os.path.dirname(path), 0o700)
        except FileExistsError:
            pass
        try:
            os.rename(temp, path)  # an empty directory there (never an entry) is replaced
        except OSError as error:
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            remove_tree(temp)  # another launcher stored it first: keep theirs
            return False
        return True

    def _added(self, counts: dict[str, int]) -> None:
        """Count an entry added; evict where the cache is now over its limit."""
        self._add(counts)
        if self.max_size and self.stats().get("size", 0) > self.max_size:
            self.evict()

    # The second level: the REAPI cache of $OFFLOAD_REMOTE (offload_builders.launcher.remote_level).

    def remote(self) -> RemoteLevel | None:
        """The second level where ``$OFFLOAD_REMOTE`` names a server, else None. Made, and its modules imported,
        at the first call: only a miss calls it, so a hit here costs no import and asks no server."""
        if not self._remote_known:  # two threads may both get here: remote_level gives them one level
            url = os.environ.get("OFFLOAD_REMOTE", "").strip()
            if url:
                from offload_builders.launcher.remote_level import remote_level

                self._remote = remote_level(url, read_only=self.read_only)
            self._remote_known = True
        return self._remote

    def fetch(self, key: str) -> Entry | None:
        """The entry of ``key`` from the second level (:meth:`remote`), downloaded into this cache and returned as
        a hit here (in read-only mode into a private scratch directory, removed once its files are open), and
        counted as a remote hit. None: no second level, ``OFFLOAD_CACHE_RECACHE``, a miss there, or anything that
        failed (warned about by the second level: the remote never fails a compile)."""
        path = self._entry_dir(key)
        level = self.remote()
        if level is None or not level.fetches:
            return None
        try:
            download = scratch_directory() if self.read_only else self._make_temp("download")
        except OSError:
            return None
        entry: Entry | None = None
        try:
            pack = os.path.join(download, "entry")
            if not level.fetch_entry(key, pack):
                return None
            if self.read_only:
                unpacked = os.path.join(download, "entry.d")
                os.mkdir(unpacked, 0o700)
                _unpack(pack, unpacked)
                entry = _open_entry(unpacked, key, mark_used=False)[0]
            else:
                unpacked = self._make_temp("remote")
                try:
                    total = _unpack(pack, unpacked)
                    installed = self._install(unpacked, path)
                except BaseException:
                    remove_tree(unpacked)
                    raise
                if installed:
                    self._added({"entries": 1, "size": total})
                entry = self._lookup_here(key)
        except ValueError as error:  # not a packed entry: the server's (or its writer's) fault
            level.damaged(key, error)
        except OSError:  # no room here: a miss
            pass
        finally:
            remove_tree(download)
        if entry is not None:
            self._add({"remote-hits": 1})
        return entry

    def _upload(self, level: RemoteLevel, key: str, files: Mapping[str, str], meta: bytes) -> None:
        """Give the second level the entry :meth:`store` was given (packed into one file: :func:`_pack`)."""
        try:
            temp = self._make_temp("upload")
        except OSError:
            return
        try:
            pack = os.path.join(temp, "entry")
            _pack(files, meta, pack)
            level.store_entry(key, pack)
        except OSError:  # a file gone meanwhile, no room for the pack: not shared
            pass
        finally:
            remove_tree(temp)

    def evict(self) -> int:
        """Remove least-recently-used entries until the size is at most 90% of :attr:`max_size`, never one used in
        the last minute (a running command may be about to read it); return the bytes freed. Walks the whole
        cache (the only method that does) and sets the ``size`` and ``entries`` counters to what it found. Does
        nothing in read-only mode, or while another process evicts."""
        if self.read_only:
            return 0
        try:
            lock = self._lock(blocking=False)
        except OSError:
            return 0
        if lock is None:
            return 0
        try:
            return self._evict_locked()
        finally:
            os.close(lock)

    def _evict_locked(self) -> int:
        now = time.time()
        self._remove_stale_temp(now)
        found = self._walk()
        lists = [*self._walk_file_lists(), *self._walk_kept_images()]
        total = sum(size for _, size, _ in found) + sum(size for _, size, _ in lists)
        entries = len(found)
        freed = evicted = 0
        if self.max_size:
            limit = self.max_size * _EVICT_TO_PERCENT // 100
            recent = now - _RECENT_SECONDS
            listed = {path for _, _, path in lists}
            candidates = sorted([*found, *lists], key=lambda item: item[0])
            for mtime, size, path in candidates:
                if total <= limit or mtime > recent:
                    break  # sorted by mtime: all that follow were used as recently
                try:
                    info = os.lstat(path)
                except OSError:
                    continue
                if info.st_mtime > recent:  # a hit since the walk
                    continue
                if path in listed:  # a key's file lists (its next lookup is a miss) or a link's kept images
                    if stat.S_ISREG(info.st_mode):
                        try:
                            os.unlink(path)
                        except OSError:
                            continue
                    elif self._discard(path, info) is None:
                        continue
                    total -= size
                    freed += size
                    continue
                if self._discard(path, info) is None:
                    continue
                total -= size
                freed += size
                entries -= 1
                evicted += 1
        self._set_content_counters(total, entries)
        if evicted:
            self.count("evictions", evicted)
        return freed

    # File lists (the direct mode's manifests).

    def file_lists(self, key: str) -> list[list[tuple[str, str]]]:
        """The lists of files that earlier runs behind ``key`` read, the most recent first ([]: none): each file as
        its name and what was recorded with it (the caller's opaque text, "" where none)."""
        text = trusted_file_text(self._file_lists_path(key), _MAX_FILE_LISTS_BYTES)
        if not text:
            return []
        return [[_listed(line) for line in block.split("\n")] for block in text.split("\n\n") if block]

    def add_file_list(self, key: str, files: Sequence[tuple[str, str]]) -> None:
        """Record ``files`` (read by a run behind ``key``: each name with what to record with it, "" for nothing)
        first among its lists, in place of an earlier list of the same names, keeping the most recent
        :data:`_MAX_FILE_LISTS`; fails soft (a list that cannot be written is a later miss)."""
        files = list(files)
        if self.read_only or not files or any(_unlistable(name, recorded) for name, recorded in files):
            return
        names = [name for name, _ in files]
        lists = [files, *(known for known in self.file_lists(key)
                          if [name for name, _ in known] != names)][:_MAX_FILE_LISTS]
        texts = ["\n".join(f"{name}\0{recorded}" if recorded else name for name, recorded in known)
                 for known in lists]
        while len(texts) > 1 and sum(len(text.encode("utf-8", "surrogateescape")) + 2 for text in texts) \
                > _MAX_FILE_LISTS_BYTES:
            texts.pop()  # the oldest go first: a file :meth:`file_lists` would refuse to read hits nothing
        if len(texts[0].encode("utf-8", "surrogateescape")) > _MAX_FILE_LISTS_BYTES:
            return  # a list too long to be read back: a miss, as without it
        path = self._file_lists_path(key)
        try:
            os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)
            replace_private_file(path, "\n\n".join(texts))
        except OSError:
            pass

    def touch_file_lists(self, key: str) -> None:
        """Mark ``key``'s file lists used now: eviction removes the least recently used lists with the entries."""
        if self.read_only:
            return
        try:
            os.utime(self._file_lists_path(key))
        except OSError:
            pass

    def _file_lists_path(self, key: str) -> str:
        self._entry_dir(key)  # checks the key
        return os.path.join(self.root, "lists", key[:2], key)

    def clear(self) -> None:
        """Remove every entry (and what killed launchers left in ``tmp/``); statistics other than the size and
        entry count stay, as ``ccache -C`` keeps them."""
        lock = self._lock(blocking=True)
        if lock is None:  # only a lock that does not wait is ever refused
            return
        try:
            try:
                with os.scandir(self.root) as items:
                    shards = [item.path for item in items if _is_shard_name(item.name)]
            except OSError:
                shards = []
            for shard in shards:
                try:
                    doomed = self._temp_name("cleared")
                    os.rename(shard, doomed)  # gone at once for readers, deleted below
                except OSError:
                    continue
            for kept in ("lists", KEPT_IMAGES):
                try:
                    os.rename(os.path.join(self.root, kept), self._temp_name("cleared"))
                except OSError:
                    pass
            remove_tree(os.path.join(self.root, "tmp"))
            self._set_content_counters(0, 0)
        finally:
            os.close(lock)

    def set_max_size(self, size: int) -> None:
        """Keep ``size`` (bytes; 0: no limit) as the limit in ``config``. Raises ValueError where it is negative,
        OSError where ``config`` cannot be written."""
        if size < 0:
            raise ValueError(f"a cache size cannot be negative: {size}")
        replace_private_file(os.path.join(self.root, "config"), f"max_size = {size}\n")
        self.max_size = size

    # Statistics.

    def count(self, name: str, amount: int = 1) -> None:
        """Add ``amount`` to the counter ``name`` (in this process's shard, under that file's lock only, so many
        launchers count at once). Never fails on I/O: statistics are best-effort. Raises ValueError where ``name``
        is empty or has white space (the caller's bug)."""
        self._add({name: amount})

    def stats(self) -> dict[str, int]:
        """Every counter, summed over the shards (``size`` and ``entries`` describe the contents)."""
        totals: dict[str, int] = {}
        for shard in range(_STAT_SHARDS):
            try:
                fd = os.open(self._shard_path(shard), os.O_RDONLY | _NO_FOLLOW)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
                counts = _read_counts(fd)
            except OSError:
                continue
            finally:
                os.close(fd)
            for name, value in counts.items():
                totals[name] = totals.get(name, 0) + value
        return totals

    def zero_stats(self) -> None:
        """Set every counter of use (hits, misses, ...) to zero; the size and entry count stay."""
        for shard in range(_STAT_SHARDS):
            try:
                fd = os.open(self._shard_path(shard), os.O_RDWR | _NO_FOLLOW)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                counts = _read_counts(fd)
                _write_counts(fd, {name: counts[name] for name in _CONTENT_COUNTERS if name in counts})
            except OSError:
                pass
            finally:
                os.close(fd)

    def show_stats(self) -> str:
        """The statistics as ``ccache -s`` shows its own: one ``label value`` line each; ``remote hits`` (entries
        downloaded from the second level: whole commands, jobs, ``-###`` records) where ``$OFFLOAD_REMOTE`` is set or
        there were any."""
        counts = self.stats()
        hits, misses = counts.get("hits", 0), counts.get("misses", 0)
        lines = [("cache directory", self.root)]
        if self.read_only:
            lines.append(("read only", "yes"))
        for name in ("hits", "misses", "stores", "pass-through", "errors", "evictions"):
            lines.append((name, str(counts.get(name, 0))))
            if name == "hits" and ("remote-hits" in counts or os.environ.get("OFFLOAD_REMOTE", "").strip()):
                lines.append(("remote hits", str(counts.get("remote-hits", 0))))
        if hits + misses:
            lines.append(("hit rate", f"{100 * hits / (hits + misses):.1f} %"))
        lines.append(("entries", str(counts.get("entries", 0))))
        size = counts.get("size", 0)
        if self.max_size:
            shown = f"{_format_size(size)} / {_format_size(self.max_size)} ({100 * size / self.max_size:.0f} %)"
        else:
            shown = f"{_format_size(size)} / no limit"
        lines.append(("cache size", shown))
        known = {"hits", "remote-hits", "misses", "stores", "pass-through", "errors", "evictions", "entries", "size"}
        lines.extend((name, str(counts[name])) for name in sorted(counts) if name not in known)
        return "".join(f"{label:<20}{value}\n" for label, value in lines)

    # The rest.

    def _entry_dir(self, key: str) -> str:
        if not (16 <= len(key) <= 128 and _HEX_DIGITS.issuperset(key)):
            raise ValueError(f"a cache key is 16 to 128 lowercase hexadecimal digits, not {key!r}")
        return os.path.join(self.root, key[:2], key)

    def _read_max_size(self) -> int:
        text = trusted_file_text(os.path.join(self.root, "config"), 4096)
        for line in (text or "").splitlines():
            name, equals, value = line.partition("=")
            if equals and name.strip() == "max_size":
                try:
                    return parse_size(value)
                except ValueError:
                    break
        return DEFAULT_MAX_SIZE

    def _temp_name(self, purpose: str) -> str:
        """A new name in ``tmp/`` (made if missing), on this cache's file system: renames into it are atomic."""
        temp = os.path.join(self.root, "tmp")
        try:
            os.mkdir(temp, 0o700)
        except FileExistsError:
            pass
        return os.path.join(temp, f"{purpose}.{os.getpid()}.{os.urandom(6).hex()}")

    def _make_temp(self, purpose: str) -> str:
        path = self._temp_name(purpose)
        os.mkdir(path, 0o700)
        return path

    def _discard(self, path: str, expected: os.stat_result | None) -> int | None:
        """Remove the entry at ``path`` (renamed away first: readers see it whole or not at all), only where it is
        still ``expected`` (not an entry stored since); its bytes, or None where it was not removed."""
        try:
            if expected is not None:
                current = os.lstat(path)
                if (current.st_dev, current.st_ino) != (expected.st_dev, expected.st_ino):
                    return None
            doomed = self._temp_name("evicted")
            os.rename(path, doomed)
        except OSError:
            return None
        return remove_tree(doomed)

    def _walk(self) -> list[tuple[float, int, str]]:
        """Every entry as (last use, bytes, path)."""
        try:
            with os.scandir(self.root) as items:
                shards = [item.path for item in items if _is_shard_name(item.name)
                          and item.is_dir(follow_symlinks=False)]
        except OSError:
            return []
        return [found for shard in shards for found in _sized_directories(shard)]

    def _walk_kept_images(self) -> list[tuple[float, int, str]]:
        """The slots of the images ``offload-link`` keeps for the links this launcher runs (``kept-images/``, see
        :mod:`offload_builders.linking.kept_images`) as (last use, bytes, path): within the size limit too."""
        return _sized_directories(os.path.join(self.root, KEPT_IMAGES))

    def _walk_file_lists(self) -> list[tuple[float, int, str]]:
        """Every key's file lists as (last use, bytes, path): within the size limit, as the entries are."""
        found = []
        try:
            with os.scandir(os.path.join(self.root, "lists")) as items:
                shards = [item.path for item in items if item.is_dir(follow_symlinks=False)]
        except OSError:
            return []
        for shard in shards:
            try:
                with os.scandir(shard) as items:
                    for item in items:
                        info = item.stat(follow_symlinks=False)
                        if stat.S_ISREG(info.st_mode):
                            found.append((info.st_mtime, info.st_size, item.path))
            except OSError:
                continue
        return found

    def _remove_stale_temp(self, now: float) -> None:
        try:
            with os.scandir(os.path.join(self.root, "tmp")) as items:
                stale = [item.path for item in items if item.stat(follow_symlinks=False).st_mtime
                         < now - _STALE_TEMP_SECONDS]
        except OSError:
            return
        for path in stale:
            remove_tree(path)

    def _lock(self, *, blocking: bool) -> int | None:
        """The cache-wide lock's file descriptor (closing it unlocks), or None where another process holds it
        and ``blocking`` is false."""
        fd = os.open(os.path.join(self.root, "lock"), os.O_RDWR | os.O_CREAT | _NO_FOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _shard_path(self, shard: int) -> str:
        return os.path.join(self.root, "stats", str(shard))

    def _open_shard(self, shard: int) -> int:
        path = self._shard_path(shard)
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | _NO_FOLLOW, 0o600)
        except FileNotFoundError:
            try:
                os.mkdir(os.path.dirname(path), 0o700)
            except FileExistsError:
                pass
            return os.open(path, os.O_RDWR | os.O_CREAT | _NO_FOLLOW, 0o600)

    def _add(self, amounts: dict[str, int]) -> None:
        for name in amounts:
            if not name or name.split() != [name]:
                raise ValueError(f"a counter's name is one word, not {name!r}")
        try:
            fd = self._open_shard(os.getpid() % _STAT_SHARDS)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            counts = _read_counts(fd)
            for name, amount in amounts.items():
                counts[name] = counts.get(name, 0) + amount
            _write_counts(fd, counts)
        except OSError:
            pass
        finally:
            os.close(fd)  # and the lock with it

    def _set_content_counters(self, size: int, entries: int) -> None:
        """Set ``size`` and ``entries`` to what a walk found: shard 0 holds them, the others' share is zeroed,
        all shards locked at once (:meth:`count` holds one lock at a time, so this cannot deadlock with it)."""
        fds = []
        try:
            for shard in range(_STAT_SHARDS):
                try:
                    fd = self._open_shard(shard) if shard == 0 else os.open(self._shard_path(shard),
                                                                             os.O_RDWR | _NO_FOLLOW)
                except OSError:
                    continue
                fds.append(fd)
                fcntl.flock(fd, fcntl.LOCK_EX)
            for index, fd in enumerate(fds):
                counts = _read_counts(fd)
                counts["size"], counts["entries"] = (size, entries) if index == 0 else (0, 0)
                _write_counts(fd, counts)
        except OSError:
            pass
        finally:
            for fd in fds:
                os.close(fd)


class Entry:
    """A cache hit: the entry's files, open (so an eviction meanwhile cannot take them), and its ``meta``.
    Close it (or use it as a context manager) when its files are copied out."""

    __slots__ = ("_files", "key", "meta", "names")

    def __init__(self, key: str, meta: bytes, files: dict[str, tuple[int, int]]) -> None:
        self.key = key
        self.meta = meta
        self.names: tuple[str, ...] = tuple(files)
        self._files: dict[str, tuple[int, int]] | None = files

    def size(self, name: str) -> int:
        """The size of the file ``name`` in bytes."""
        return self._file(name)[1]

    def copy_to(self, name: str, destination: str) -> None:
        """Copy the file ``name`` to ``destination``: written as ``destination + ".partial"`` and renamed over it,
        so a launcher killed meanwhile leaves no half-written output that a later build would trust. Mode
        ``0o644`` less the umask, as the compiler's own output would have. Raises OSError on failure (the
        partial file is removed) and KeyError for a name the entry does not have."""
        fd, size = self._file(name)
        partial = destination + ".partial"
        try:
            os.unlink(partial)  # a killed launcher's: its mode would survive an O_TRUNC
        except FileNotFoundError:
            pass
        out = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_FOLLOW, 0o644)
        try:
            try:
                _copy_fd(fd, out, size)
            finally:
                os.close(out)
            os.replace(partial, destination)
        except BaseException:
            try:
                os.unlink(partial)
            except OSError:
                pass
            raise

    def read(self, name: str) -> bytes:
        """The bytes of the file ``name``."""
        fd, size = self._file(name)
        chunks = []
        offset = 0
        while offset < size:
            chunk = os.pread(fd, min(_CHUNK << 4, size - offset), offset)
            if not chunk:
                raise OSError(errno.EIO, f"cache file {name} is shorter than its manifest says")
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        """Close the entry's files (again: nothing)."""
        files, self._files = self._files, None
        for fd, _ in (files or {}).values():
            os.close(fd)

    def __enter__(self) -> Entry:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def _file(self, name: str) -> tuple[int, int]:
        if self._files is None:
            raise ValueError(f"cache entry {self.key} is closed")
        return self._files[name]


def _open_entry(path: str, key: str, *, mark_used: bool) -> tuple[Entry | None, os.stat_result | None, str]:
    """The entry in the directory ``path`` with all its files open, its directory's stat, and what was found:
    "entry", "missing", "unopenable" (not a directory: a file, a link) or "damaged" (no manifest, a file missing or
    of another size than the manifest says). ``mark_used``: set its mtime, the LRU clock."""
    try:
        dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _NO_FOLLOW)
    except FileNotFoundError:
        return None, None, "missing"
    except OSError:
        return None, None, "unopenable"
    files: dict[str, tuple[int, int]] = {}
    info: os.stat_result | None = None
    try:
        info = os.fstat(dir_fd)
        listed, meta = _read_manifest(dir_fd)
        for name, size in listed:
            fd = os.open(name, os.O_RDONLY | _NO_FOLLOW, dir_fd=dir_fd)
            files[name] = (fd, size)
            file_info = os.fstat(fd)
            if not stat.S_ISREG(file_info.st_mode) or file_info.st_size != size:
                raise ValueError(f"{name}: not the size the manifest says")
        entry = Entry(key, meta, files)
        if mark_used:
            try:
                os.utime(dir_fd)  # the LRU clock
            except OSError:
                pass
        return entry, info, "entry"
    except (OSError, ValueError):
        for fd, _ in files.values():
            os.close(fd)
        return None, info, "damaged"
    finally:
        os.close(dir_fd)


def parse_size(text: str) -> int:
    """Bytes from a size as ``ccache -M`` takes it: a number with an optional binary unit, ``k``, ``M``, ``G`` or
    ``T`` (also ``KiB``, ``MB``, ...; all powers of 1024), e.g. ``5G``, ``1.5G``, ``500M``, ``1073741824``. Raises
    ValueError for anything else."""
    body = text.strip()
    unit_start = len(body)
    while unit_start and body[unit_start - 1] not in _DIGITS:
        unit_start -= 1
    number, unit = body[:unit_start], body[unit_start:].strip().lower()
    if unit.endswith("b"):
        unit = unit[:-1]
    if unit.endswith("i") and len(unit) == 2:
        unit = unit[:-1]
    whole, point, fraction = number.partition(".")
    if (unit not in _UNITS or not whole or not _DIGITS.issuperset(whole) or not _DIGITS.issuperset(fraction)
            or (point and not fraction)):
        raise ValueError(f"not a size (a number with an optional unit k, M, G or T): {text!r}")
    return int(whole + fraction) * _UNITS[unit] // 10 ** len(fraction)


def _configured_root() -> str | None:
    """``$OFFLOAD_CACHE_DIR``, else ``offload-cache`` in the per-user cache directory, chosen by the rule of
    :func:`offload_builders.toolchain.default_cache_dir` (which is not imported: it costs start-up). None where a
    variable set empty turns the cache off."""
    root = os.environ.get("OFFLOAD_CACHE_DIR")
    if root is not None:
        return root or None
    base = os.environ.get("OFFLOAD_BUILDERS_CACHE_DIR")
    if base is None:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "offload-builders")
    return os.path.join(base, "offload-cache") if base else None


def _listed(line: str) -> tuple[str, str]:
    """A file-list line: the name, and what was recorded with it after a NUL (no name holds one; a name that
    starts with NUL, a program's, holds no other)."""
    if line.startswith("\0"):
        return line, ""
    name, _, recorded = line.partition("\0")
    return name, recorded


def _unlistable(name: str, recorded: str) -> bool:
    """Whether a file list cannot hold ``name`` with ``recorded`` so that :func:`_listed` reads them back."""
    return (not name or "\n" in name or "\n" in recorded or "\0" in name[1:] or "\0" in recorded
            or (name.startswith("\0") and bool(recorded)))


def _check_name(name: str) -> str:
    if not name or name in (".", "..") or not _NAME_CHARS.issuperset(name):
        raise ValueError(f"a cache entry's file name is made of A-Z, a-z, 0-9, '.', '_' and '-', not {name!r}")
    return name


def _is_shard_name(name: str) -> bool:
    return len(name) == 2 and _HEX_DIGITS.issuperset(name)


def _manifest(listed: Sequence[tuple[str, int]], meta: bytes) -> bytes:
    """An entry's ``@manifest``: each file's size and name, then ``meta``."""
    lines = [b"%d %s\n" % (size, name.encode()) for name, size in listed]
    return b"".join([_MANIFEST_MAGIC, b"%d\n" % len(lines), *lines, b"%d\n" % len(meta), meta])


def _read_manifest(dir_fd: int) -> tuple[list[tuple[str, int]], bytes]:
    """An entry's files (name, size) and meta; ValueError where the manifest is not one this module writes."""
    fd = os.open(_MANIFEST, os.O_RDONLY | _NO_FOLLOW, dir_fd=dir_fd)
    try:
        size = os.fstat(fd).st_size
        if size > _MAX_MANIFEST_BYTES:
            raise ValueError("manifest too large")
        data = os.pread(fd, size + 1, 0)
    finally:
        os.close(fd)
    return _parse_manifest(data)


def _parse_manifest(data: bytes) -> tuple[list[tuple[str, int]], bytes]:
    """:func:`_read_manifest` of a manifest's bytes."""
    if not data.startswith(_MANIFEST_MAGIC):
        raise ValueError("not a manifest")
    position = len(_MANIFEST_MAGIC)

    def line() -> str:
        nonlocal position
        end = data.index(b"\n", position)
        text = data[position:end].decode("ascii")
        position = end + 1
        return text

    count = _unsigned(line())
    files: list[tuple[str, int]] = []
    for _ in range(count):
        size_text, _, name = line().partition(" ")
        files.append((_check_name(name), _unsigned(size_text)))
    if len({name for name, _ in files}) != len(files):
        raise ValueError("a name twice in the manifest")
    meta_size = _unsigned(line())
    if position + meta_size != len(data):
        raise ValueError("manifest length")
    return files, data[position:]


#: A packed entry (what the second level holds, one file): this line, the manifest's length, the manifest, then
#: each file's bytes in the manifest's order.
_PACK_MAGIC = b"offload-cache-pack 1\n"


def _pack(files: Mapping[str, str], meta: bytes, destination: str) -> None:
    """Write ``files`` (name -> path) and ``meta`` as one packed entry to the new file ``destination``."""
    sources: list[tuple[str, int, int]] = []
    try:
        for name, path in files.items():
            _check_name(name)
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            sources.append((name, fd, 0))
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise OSError(errno.EINVAL, f"{path} is not a regular file")
            sources[-1] = (name, fd, info.st_size)
        manifest = _manifest([(name, size) for name, _, size in sources], meta)
        out = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_FOLLOW, 0o600)
        try:
            _write_all(out, b"%s%d\n%s" % (_PACK_MAGIC, len(manifest), manifest))
            for _, fd, size in sources:
                _copy_fd(fd, out, size)
        finally:
            os.close(out)
    finally:
        for _, fd, _ in sources:
            os.close(fd)


def _unpack(pack: str, directory: str) -> int:
    """Write the packed entry ``pack`` into the empty ``directory`` as an entry (its files and ``@manifest``);
    the bytes written. ValueError where ``pack`` is not a packed entry whole (a name not allowed, a size that does
    not add up); OSError where it cannot be read or written."""
    fd = os.open(pack, os.O_RDONLY | _NO_FOLLOW | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, len(_PACK_MAGIC) + 24, 0)
        if not head.startswith(_PACK_MAGIC) or b"\n" not in head[len(_PACK_MAGIC):]:
            raise ValueError("not a packed cache entry")
        length_text, _, _ = head[len(_PACK_MAGIC):].partition(b"\n")
        length = _unsigned(length_text.decode("ascii"))
        start = len(_PACK_MAGIC) + len(length_text) + 1
        if length > _MAX_MANIFEST_BYTES or start + length > size:
            raise ValueError("a packed cache entry's manifest is cut short or too large")
        manifest = os.pread(fd, length, start)
        listed, _ = _parse_manifest(manifest)
        offset = start + length
        if offset + sum(file_size for _, file_size in listed) != size:
            raise ValueError("a packed cache entry is not the size its manifest says")
        for name, file_size in listed:
            out = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_FOLLOW, 0o600)
            try:
                _copy_fd(fd, out, file_size, offset)
            finally:
                os.close(out)
            offset += file_size
    finally:
        os.close(fd)
    _write_new(os.path.join(directory, _MANIFEST), manifest)
    return size - start


def scratch_directory() -> str:
    """A new private directory in ``$TMPDIR`` (else ``/tmp``), as ``tempfile.mkdtemp`` makes one (a random name,
    ``0700``, never an existing one) without importing ``tempfile`` and ``shutil`` into every compile: a
    command's temporary files, and what a read-only cache cannot hold."""
    base = os.environ.get("TMPDIR") or "/tmp"
    for _ in range(100):
        path = os.path.join(base, f"offload-cache-{os.urandom(8).hex()}")
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no new directory could be made in {base}")


def _unsigned(text: str) -> int:
    if not text or not _DIGITS.issuperset(text):
        raise ValueError(f"not a size: {text!r}")
    return int(text)


def _read_counts(fd: int) -> dict[str, int]:
    """A stats shard's counters (lines that are not ``name integer``, left by a write cut short, are skipped)."""
    data = os.pread(fd, _MAX_STATS_BYTES, 0)
    counts: dict[str, int] = {}
    for line in data.decode("ascii", "replace").splitlines():
        words = line.split()
        if len(words) == 2:
            try:
                counts[words[0]] = int(words[1])
            except ValueError:
                pass
    return counts


def _write_counts(fd: int, counts: dict[str, int]) -> None:
    data = "".join(f"{name} {value}\n" for name, value in sorted(counts.items())).encode("ascii", "replace")
    _pwrite_all(fd, data, 0)
    os.ftruncate(fd, len(data))


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _write_new(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_FOLLOW, 0o600)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)


def _copy_in(source: str, destination: str) -> int:
    """Copy the regular file ``source`` to the new file ``destination`` (mode 0600); the bytes copied."""
    src = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):
            raise OSError(errno.EINVAL, f"{source} is not a regular file")
        dst = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_FOLLOW, 0o600)
        try:
            return _copy_fd(src, dst, None)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _copy_fd(src: int, dst: int, size: int | None, start: int = 0) -> int:
    """Copy ``src`` from offset ``start`` (its file position untouched: an entry's file is read more than once)
    to ``dst`` at its position: ``size`` bytes (OSError where ``src`` has fewer), or to the end where None. In the
    kernel (``copy_file_range``: a reflink where the file system can) where it can, else with pread."""
    copied = 0
    fast = hasattr(os, "copy_file_range")
    while size is None or copied < size:
        want = _CHUNK << 4 if size is None else min(_CHUNK << 4, size - copied)
        done = 0
        if fast:
            try:
                done = os.copy_file_range(src, dst, want, start + copied)
            except OSError as error:
                if error.errno not in _NO_COPY_RANGE:
                    raise
                fast = False
        if not done:  # the end, or no copy_file_range here (some file systems answer 0 for "cannot")
            chunk = os.pread(src, min(want, _CHUNK), start + copied)
            if not chunk:
                break
            fast = False
            _write_all(dst, chunk)
            done = len(chunk)
        copied += done
    if size is not None and copied != size:
        raise OSError(errno.EIO, "a cache file is shorter than its manifest says")
    return copied


def _sized_directories(parent: str) -> list[tuple[float, int, str]]:
    """Each directory in ``parent`` (an entry of a shard, a kept-images slot) as (last use, bytes of its files,
    path); what cannot be read is left out."""
    found = []
    try:
        with os.scandir(parent) as items:
            entries = list(items)
    except OSError:
        return []
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
            if not stat.S_ISDIR(info.st_mode):
                continue
            with os.scandir(entry.path) as files:
                size = sum(item.stat(follow_symlinks=False).st_size for item in files)
        except OSError:
            continue
        found.append((info.st_mtime, size, entry.path))
    return found


def remove_tree(path: str) -> int:
    """Delete ``path`` and what is in it (an entry, a temporary directory, a shard of entries); the bytes of the
    files deleted. Never raises: what cannot be deleted stays for the next eviction or clearing."""
    try:
        with os.scandir(path) as items:
            found = list(items)
    except NotADirectoryError:
        try:
            size = os.lstat(path).st_size
            os.unlink(path)
        except OSError:
            return 0
        return size
    except OSError:
        return 0
    freed = 0
    for item in found:
        try:
            if item.is_dir(follow_symlinks=False):
                freed += remove_tree(item.path)
            else:
                size = item.stat(follow_symlinks=False).st_size
                os.unlink(item.path)
                freed += size
        except OSError:
            pass
    try:
        os.rmdir(path)
    except OSError:
        pass
    return freed


def _format_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


__all__ = ["DEFAULT_MAX_SIZE", "CacheStore", "Entry", "KEPT_IMAGES", "parse_size", "remove_tree",
           "scratch_directory"]
