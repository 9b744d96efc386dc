"""The second level of ``offload-cache``: the REAPI cache that ``$OFFLOAD_REMOTE`` names, behind the local store.

Where ``$OFFLOAD_REMOTE=grpc://HOST:PORT/INSTANCE`` is set, a miss in the local store
(:class:`~offload_builders.launcher.store.CacheStore`) of any entry (a job's, the whole command's, the cached
``-###`` record) asks the server; a hit there is downloaded into the local store and used from it as a local hit
(counted as ``remote hits``). Every entry stored locally is uploaded too. A local hit asks the server nothing:
the server is asked only after the local store missed, and this module is imported only then.

The mapping (:class:`RemoteLevel`):

* An entry of local key ``K`` is the REAPI action whose only "step" is the text ``offload-cache entry K`` (a
  :class:`~offload_builders.remote.actions.NodeJob` with no inputs, salted with :data:`REMOTE_SCHEME`): its digest
  is a function of ``K`` alone. Its one output, ``entry``, is the entry packed into one file (its ``@manifest``,
  then its files: :func:`offload_builders.launcher.store._pack`), since which files an entry has (``out``,
  ``stderr``, ``deps``, none for a ``-###`` record) is not known before it is found.
* The file lists of a key's first part ``B`` (the direct mode: which files each of ``B``'s runs read) are the
  action ``offload-cache file-lists B``, whose output is the lists as names only, the most recent first, at most
  eight, merged as the local store merges them (a new list first, in place of one of the same names): without
  them another cache could not find an entry keyed by the files read. They travel without the local store's
  stamps (device, inode, times): a store trusts only stamps it recorded itself, so a fetched list's files are
  hashed, and a hit records them with this machine's stamps. A lookup that misses locally first asks the server
  for the entries of its local lists, then for the server's lists (once per process and key part); a store
  uploads its entry, then the lists (the new one, the local ones and those fetched, merged).

What a second cache can hit. A key holds everything the entry depends on (:mod:`offload_builders.launcher.keys`),
so a hit from the server is as sound as a local one, and for the same reasons as narrow:

* every program by its real path, size and modification time (Clang's ``clang``, ``lld``, ``ptxas``, the
  packager), as ccache's ``compiler_check=mtime``: another machine hits only with the same installation at the
  same path (the same package build, with the times it shipped); another build of Clang misses;
* the compiler's ``*.cfg`` files, the GCC installations' listing and the driver's environment variables;
* every entry reached through file lists (the whole command, each compile of the source) by each file read: its
  path as the compile named it, its content and its identity (device and inode numbers, which name OpenMP target
  regions): those entries hit only on the same machine's same files, e.g. a second build tree, or a second cache,
  of the same checkout; another checkout, or another machine, compiles the source again;
* the jobs that read only earlier jobs' outputs (the packager, the embedding back end, ``ptxas``, ``lld``, the
  bundler, ``fatbinary``) by those outputs' digests, and the ``-###`` record by the command's words: these can hit
  on another machine with the same installation, once its own compiles of the source gave the same bytes.

The server is trusted as the local store is: whoever may write its action cache decides what the builds that read
it run and get (``OFFLOAD_REMOTE_UPLOAD=0`` makes a machine a reader only, as for ``offload-compile``). What it
sends is checked against its digest, and a packed entry that does not unpack whole is a miss with a warning.

The remote never fails a compile: a server that cannot be reached or errs is one warning per process and the
rest of the compile is local (:class:`~offload_builders.remote.cli_jobs.RemoteSteps`). ``OFFLOAD_CACHE_READONLY=1``
uploads nothing (a hit is kept in a scratch directory, not in the read-only store); ``OFFLOAD_CACHE_RECACHE=1``
fetches nothing (it runs every job) but uploads what it stores.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from offload_builders.launcher import PROGRAM
from offload_builders.remote.cli_jobs import remote_steps

if TYPE_CHECKING:
    from offload_builders.remote.cli_jobs import CachedStep, RemoteSteps

PROG = "offload-cache"
#: The salt of every action of this module: bumped whenever what a remote entry holds changes (the packed form, the
#: lists' form); the local keys' own scheme is in each key.
REMOTE_SCHEME = "offload-cache remote 1"
#: The one output of each action.
OUTPUT = "entry"
#: The lists kept per key part, and the most bytes of them read (as the local store's).
MAX_FILE_LISTS = 8
MAX_FILE_LISTS_BYTES = 4 << 20


class RemoteLevel:
    """One process's second level: ``$OFFLOAD_REMOTE``'s server, through the remote steps of ``offload-cache``."""

    def __init__(self, steps: RemoteSteps, *, fetches: bool, uploads: bool) -> None:
        self.steps = steps
        #: Whether a local miss asks the server (not with ``OFFLOAD_CACHE_RECACHE=1``).
        self.fetches = fetches
        #: Whether a local store is uploaded (not with ``OFFLOAD_CACHE_READONLY=1``).
        self.uploads = uploads
        #: The lists fetched in this process, by key part, for :meth:`store_file_lists` to merge.
        self._lists: dict[str, list[list[str]]] = {}
        self._lock = threading.Lock()

    def _step(self, what: str, key: str, path: str) -> CachedStep | None:
        """The action of ``key``'s entry or lists (``what``), whose one output is the file ``path``."""
        from offload_builders.remote.actions import NodeJob

        job = NodeJob(root="", steps=(f"{PROG} {what} {key}",), inputs={}, salt_lines=(REMOTE_SCHEME,),
                      outputs=(OUTPUT,))
        return self.steps.keyed(job, [path])

    def fetch_entry(self, key: str, destination: str) -> bool:
        """Download the packed entry of ``key`` to ``destination``; False: a miss (or the server is not used)."""
        step = self._step("entry", key, destination)
        return step is not None and step.fetch(lambda path: path)

    def store_entry(self, key: str, pack: str) -> None:
        """Upload ``pack`` (a packed entry) as the entry of ``key``."""
        if not self.uploads:
            return
        step = self._step("entry", key, pack)
        if step is not None:
            step.store()

    def damaged(self, key: str, error: Exception) -> None:
        """A fetched entry that does not unpack (the server's fault, or its writer's): a miss, warned about."""
        self.steps.warn(f"remote cache {self.steps.cache.url}: entry {key} is not a packed cache entry ({error}); "
                        "compiling without it")

    def file_lists(self, base: str) -> list[list[str]]:
        """The lists of files the server holds for ``base`` (names only), the most recent first; [] where it holds
        none, or it is not asked. Asked once per process and key part."""
        if not self.fetches:
            return []
        with self._lock:
            known = self._lists.get(base)
        if known is not None:
            return known
        lists: list[list[str]] = []
        directory = tempfile.mkdtemp(prefix="offload-cache-lists-")
        try:
            path = os.path.join(directory, "lists")
            step = self._step("file-lists", base, path)
            if step is not None and step.fetch(lambda name: name):
                try:
                    lists = _read_lists(path)
                except (OSError, ValueError) as error:
                    self.steps.warn(f"remote cache {self.steps.cache.url}: the file lists of {base} are not "
                                    f"offload-cache's ({error}); not using them")
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        with self._lock:
            self._lists[base] = lists
        return lists

    def store_file_lists(self, base: str, lists: Sequence[Sequence[str]]) -> None:
        """Upload ``base``'s lists: ``lists`` (the new one first, then the local store's), then those fetched in
        this process, each set of names once, at most :data:`MAX_FILE_LISTS`."""
        if not self.uploads:
            return
        with self._lock:
            fetched = self._lists.get(base, [])
        merged: dict[tuple[str, ...], None] = {}
        for names in [*lists, *fetched]:
            if names and not any(_unlistable(name) for name in names):
                merged.setdefault(tuple(names), None)
        kept = [list(names) for names in merged][:MAX_FILE_LISTS]
        data = "\n\n".join("\n".join(names) for names in kept).encode(errors="surrogateescape")
        if not kept or len(data) > MAX_FILE_LISTS_BYTES:
            return
        directory = tempfile.mkdtemp(prefix="offload-cache-lists-")
        try:
            path = os.path.join(directory, "lists")
            with open(path, "wb") as f:
                f.write(data)
            step = self._step("file-lists", base, path)
            if step is not None:
                step.store()
        except OSError:
            pass
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        with self._lock:
            self._lists[base] = kept


def _unlistable(name: str) -> bool:
    """Whether ``name`` cannot be in a file list: empty, or with a newline or a NUL (a program's mark aside)."""
    if not name or "\n" in name:
        return True
    if name.startswith(PROGRAM):
        return "\0" in name[len(PROGRAM):]
    return "\0" in name


def _read_lists(path: str) -> list[list[str]]:
    """Lists as :meth:`RemoteLevel.store_file_lists` writes them; ValueError where they are not."""
    if os.stat(path).st_size > MAX_FILE_LISTS_BYTES:
        raise ValueError("larger than file lists may be")
    with open(path, "rb") as f:
        text = f.read(MAX_FILE_LISTS_BYTES + 1).decode(errors="surrogateescape")
    lists = [block.split("\n") for block in text.split("\n\n") if block]
    if len(lists) > MAX_FILE_LISTS or any(_unlistable(name) for names in lists for name in names):
        raise ValueError("not file lists")
    return lists


_LEVELS: dict[tuple[str, bool, bool], RemoteLevel | None] = {}
_LEVELS_LOCK = threading.Lock()


def remote_level(url: str, *, read_only: bool) -> RemoteLevel | None:
    """The process's second level for the server ``url`` (``$OFFLOAD_REMOTE``); None where it cannot be set up
    (one warning: the compile goes on with the local store only)."""
    fetches = os.environ.get("OFFLOAD_CACHE_RECACHE", "") in ("", "0")
    with _LEVELS_LOCK:
        if (url, read_only, fetches) not in _LEVELS:
            level: RemoteLevel | None = None
            try:
                steps = remote_steps(PROG)
                if steps is not None:
                    level = RemoteLevel(steps, fetches=fetches, uploads=not read_only)
            except Exception as error:  # noqa: BLE001 - the remote never fails a compile
                from offload_builders.remote.text import MESSAGE_LIMIT, safe_text

                print(f"{PROG}: warning: the remote cache is not used ({type(error).__name__}: "
                      f"{safe_text(str(error), MESSAGE_LIMIT)}); compiling with the local cache only",
                      file=sys.stderr)
            _LEVELS[url, read_only, fetches] = level
        return _LEVELS[url, read_only, fetches]


__all__ = ["MAX_FILE_LISTS", "OUTPUT", "REMOTE_SCHEME", "RemoteLevel", "remote_level"]
