"""The keys of ``offload-cache``: what a command's or a job's output depends on, hashed.

A key holds everything that can change the output and nothing that cannot, or two builds that should share miss:

* the compiler: the real file behind the command's ``clang`` (path, size, modification time, as ccache's
  ``compiler_check=mtime``), the ``*.cfg`` configuration files Clang reads from its own directories, and the
  environment variables the driver reads (:data:`ENVIRONMENT`);
* the command's words (response files read), or a job's words with the driver's temporary file names and the
  output's name replaced by placeholders;
* the working directory only where the output records it: debug information (``-g``) or coverage;
* the files a compile reads (the source, its headers, system headers included), by content, and, for the jobs
  whose output names OpenMP target regions, by identity too: Clang names each region after the device and inode
  numbers of the file that holds it (:func:`~offload_builders.source_identity.file_identity`), so such an output
  is right only for those very files (a second build tree of one checkout shares it; another checkout does not).

Which files a compile reads is known after it ran: each key's first part (:func:`Key`) leads to a manifest of the
file lists its earlier runs read, and each list, hashed as the files are now, to an entry (ccache's direct mode).

A file is hashed only where it may have changed since a list recorded it (a hit reads no header). Each list keeps,
next to each file, its digest and its *stamp*: device, inode, size, modification and change times
(``st_ctime_ns``), as :func:`os.stat` gave them before the file was read. Where the file's stamp is the same now,
its recorded digest is taken as it is. This is sound because no one can set a change time: every write, rename,
``chmod`` or ``touch -d`` sets it to the kernel's clock, so changed bytes show as another stamp, a file put in its
place too (another inode, or the same inode number with a new change time). What it cannot see is a change within
the tick of the file system's clock in which the file was read (Git's "racily clean" files): so a file whose
modification or change time was less than :data:`RACY_SECONDS` before it was read is recorded without a stamp and
hashed at every lookup, until a lookup finds it settled and records its stamp (:func:`lookup_by_files`). (The
change time is the kernel's on the file systems a build writes; a read-only image, such as squashfs, reports the
times it was made with, and a network file system may show a stat its client cached: as for the compiler's own
identity, which is its size and modification time, the stamp trusts them.)
"""
from __future__ import annotations

import os
import time

from offload_builders.launcher import PROGRAM
from offload_builders.source_identity import RACY_SECONDS, settled, stat_stamp

try:  # BLAKE2 is built into CPython: no OpenSSL to load, which hashlib does (milliseconds of every compile)
    from _blake2 import blake2b
except ImportError:  # another Python
    from hashlib import blake2b

TYPE_CHECKING = False  # typing costs every compile's start-up: for type checkers only
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from offload_builders.launcher.store import CacheStore, Entry

#: Bumped whenever what a key holds or what an entry stores changes: every entry of an older launcher then misses.
SCHEME = "offload-cache 1"
#: The environment variables Clang's driver reads that can change a compile's jobs or outputs.
ENVIRONMENT = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH", "LIBRARY_PATH", "ROCM_PATH",
               "HIP_PATH", "HIP_DEVICE_LIB_PATH", "CUDA_PATH", "CCC_OVERRIDE_OPTIONS", "SOURCE_DATE_EPOCH",
               "CLANG_CONFIG_FILE_SYSTEM_DIR", "CLANG_CONFIG_FILE_USER_DIR", "COMPILER_PATH", "GCC_EXEC_PREFIX")
#: Where Clang may read default configuration files besides the compiler's own directory.
CONFIG_DIRECTORIES = ("/etc/clang", "~/.config/clang")
#: Driver options whose output records the working directory (debug information, coverage, profiles).
_RECORDS_DIRECTORY = ("-g", "--coverage", "-fprofile-", "-ftest-coverage", "-fcoverage-mapping")
#: The same, as a ``-cc1`` job spells them.
_JOB_RECORDS_DIRECTORY = ("-debug-info-kind=", "-fcoverage-mapping", "-fprofile-instrument", "-coverage-",
                          "-ftest-coverage", "-fprofile-arcs")


#: What this process knows of each file: (digest or None where it cannot be read, stamp or "" where racy, identity
#: as :func:`~offload_builders.source_identity.file_identity` writes it). Each is one file's state at one moment.
_FILES: dict[str, tuple[str | None, str, str]] = {}


class Key:
    """A key being built: each part is written with its length, so no two sequences of parts hash alike."""

    __slots__ = ("_hash",)

    def __init__(self, *parts: str) -> None:
        self._hash = blake2b(digest_size=20)
        self.add(SCHEME, *parts)

    def add(self, *parts: str) -> Key:
        for part in parts:
            data = os.fsencode(part)
            self._hash.update(len(data).to_bytes(8, "little"))
            self._hash.update(data)
        return self

    def copy(self) -> Key:
        key = Key.__new__(Key)
        key._hash = self._hash.copy()
        return key

    def hex(self) -> str:
        return self._hash.hexdigest()


def file_digest(path: str) -> str | None:
    """The content digest of ``path`` (None: it cannot be read), once per process and path."""
    return _file(path, "")[0]


def bytes_digest(data: bytes) -> str:
    """The digest :func:`file_digest` gives a file that holds ``data``."""
    return blake2b(data, digest_size=20).hexdigest()


def _file(path: str, recorded: str) -> tuple[str | None, str, str]:
    """``path``'s digest, stamp and identity (:data:`_FILES`): from ``recorded`` (a stamp and digest a list
    holds) where the file's stamp is still that, else hashed; once per process and path."""
    known = _FILES.get(path)
    if known is not None:
        return known
    if recorded:
        try:  # opened, not only stat'ed: an open makes NFS check the file's attributes with the server
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            status = None
        else:
            try:
                status = os.fstat(fd)
            finally:
                os.close(fd)
        if status is not None:
            stamp, _, digest = recorded.rpartition(" ")
            if stamp == stat_stamp(status) and len(digest) == 40:
                known = _FILES[path] = (digest, recorded, _identity(path, status))
                return known
    known = _FILES[path] = _hashed(path)
    return known


def _hashed(path: str) -> tuple[str | None, str, str]:
    """Read and hash ``path``: its digest, its stamp as it was before it was read with that digest ("" where it
    is racy), its identity. Unreadable: (None, "", "")."""
    settled_before = time.time_ns() - int(RACY_SECONDS * 1e9)  # before the stat: the file is read after it
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None, "", ""
    try:
        status = os.fstat(fd)
        hashed = blake2b(digest_size=20)
        # No more than the file holds (and one byte to see its end): a 1 MiB read buffer for a 4 KiB header is
        # memory the kernel maps and zeroes for each file.
        want = min(max(status.st_size + 1, 1 << 12), 1 << 20)
        while block := os.read(fd, want):
            hashed.update(block)
    except OSError:
        return None, "", ""
    finally:
        os.close(fd)
    digest = hashed.hexdigest()
    return (digest, f"{stat_stamp(status)} {digest}" if settled(status, settled_before) else "",
            _identity(path, status))


def _identity(path: str, status: os.stat_result) -> str:
    """:func:`~offload_builders.source_identity.file_identity` from a stat already made."""
    return f"{path} dev={status.st_dev:x} ino={status.st_ino:x}"


def program_identity(program: str, found: str | None = None) -> str:
    """The real file behind ``program`` (``found``, else found on ``PATH`` where it names no directory): path, size,
    mtime."""
    found = found or _located(program)
    if found is None:
        return f"{program} not found"
    real = os.path.realpath(found)
    try:
        status = os.stat(real)
    except OSError:
        return f"{real} missing"
    return f"{real} {status.st_size} {status.st_mtime_ns}"


def _located(program: str) -> str | None:
    return program if os.sep in program else _on_path(program)


def _on_path(name: str) -> str | None:
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


#: Where the driver looks for GCC installations (libstdc++'s headers, the C runtime's objects): a new GCC version
#: there changes its jobs' include directories, so the listing is part of every command's key.
GCC_DIRECTORIES = ("/usr/lib/gcc/x86_64-linux-gnu", "/usr/lib/gcc/x86_64-pc-linux-gnu", "/usr/lib64/gcc")


def compiler_parts(compiler: str, environ: Mapping[str, str]) -> list[str]:
    """What a compile's outputs depend on besides its words and files: the compiler's identity, the
    configuration files Clang may read, and the driver's environment variables."""
    found = _located(compiler)
    parts = [program_identity(compiler, found)]
    directories = list(CONFIG_DIRECTORIES)
    if found is not None:
        directories += [os.path.dirname(os.path.abspath(found)), os.path.dirname(os.path.realpath(found))]
    for directory in dict.fromkeys(os.path.expanduser(entry) for entry in directories):
        try:
            names = sorted(name for name in os.listdir(directory) if name.endswith(".cfg"))
        except OSError:
            continue
        for name in names:
            path = os.path.join(directory, name)
            parts.append(f"config {path} {file_digest(path)}")
    parts += [f"env {name}={environ[name]}" for name in ENVIRONMENT if name in environ]
    for directory in GCC_DIRECTORIES:
        try:
            parts.append(f"gcc {directory} {' '.join(sorted(os.listdir(directory)))}")
        except OSError:
            continue
    return parts


def records_directory(words: Iterable[str]) -> bool:
    """Whether a compile with these words records the working directory in its output (debug information,
    coverage): then the directory is part of the key, as ccache's ``hash_dir`` does."""
    return any(word.startswith(_RECORDS_DIRECTORY) and word not in ("-g0", "-ggdb0", "-gline-directives-only")
               for word in words)


def job_records_directory(words: Iterable[str]) -> bool:
    """:func:`records_directory` for a ``-cc1`` job's words (the driver passes it the directory in any case)."""
    return any(word.startswith(_JOB_RECORDS_DIRECTORY) for word in words)


def command_key(compiler: str, words: Sequence[str], cwd: str, environ: Mapping[str, str]) -> Key:
    """The first part of a command's key: the compiler and its configuration, the words (response files read),
    and the working directory where the output records it."""
    key = Key("command", *compiler_parts(compiler, environ), *words)
    if records_directory(words):
        key.add("cwd", cwd)
    return key




def program_entry(program: str) -> str:
    """A program a command's jobs ran (``lld``, ``ptxas``, the packager), as its file list names it."""
    return PROGRAM + program


def files_part(paths: Iterable[str], identity: bool) -> list[str] | None:
    """Each file's digest (and identity, for outputs that name target regions by it), or None where one cannot
    be read now (a file of that list is gone: that list cannot match); a program (:func:`program_entry`) by its
    identity."""
    return _listed_part([(path, "") for path in paths], identity)


def _listed_part(listed: Sequence[tuple[str, str]], identity: bool) -> list[str] | None:
    """:func:`files_part` of a list as :meth:`~offload_builders.launcher.store.CacheStore.file_lists` gives it:
    each file with the stamp and digest recorded for it (taken where its stamp is still that)."""
    parts: list[str] = []
    for path, recorded in listed:
        if path.startswith(PROGRAM):
            parts.append("program " + program_identity(path[len(PROGRAM):]))
            continue
        digest, _, known_identity = _file(path, recorded)
        if digest is None:
            return None
        parts.append(f"{path} {digest}")
        if identity:
            parts.append(known_identity)
    return parts


def _recorded(paths: Iterable[str]) -> list[tuple[str, str]]:
    """Each of ``paths`` with its stamp and digest as this process knows them ("" for a program, or where racy)."""
    return [(path, "" if path.startswith(PROGRAM) else _file(path, "")[1]) for path in paths]


def lookup_by_files(store: CacheStore, base: str) -> Entry | None:
    """The entry behind ``base`` (a key's first part): that of the first of its file lists, the most recent first,
    whose files, as they are now, name a stored entry (ccache's direct mode); a file whose stamp is the one
    recorded is not read. None: a miss. Where the list that hit recorded a stamp that is no longer the file's
    (a file touched, or racy then and settled now), the list is recorded anew, so the next hit reads nothing.

    Where the local store misses and has a second level (:meth:`~offload_builders.launcher.store.CacheStore.remote`),
    the server is asked for the entries of the local lists, then of its own lists of ``base``
    (:mod:`offload_builders.launcher.remote_level`); a list that hit there is recorded here. A local hit asks no
    server."""
    local = store.file_lists(base)
    missed: dict[str, list[tuple[str, str]]] = {}  # key -> the list that named it
    for listed in local:
        parts = _listed_part(listed, identity=True)
        if parts is None:
            continue
        key = Key("result", base, *parts).hex()
        if (entry := store.lookup(key, remote=False)) is not None:
            now = _recorded(path for path, _ in listed)
            if any(stamp and stamp != recorded for (_, stamp), (_, recorded) in zip(now, listed)):
                store.add_file_list(base, now)
            else:
                store.touch_file_lists(base)  # the LRU clock of the lists, as a hit's entry has one
            return entry
        missed.setdefault(key, listed)
    remote = store.remote()
    if remote is None or not remote.fetches:
        return None
    for key, listed in missed.items():
        if (entry := store.fetch(key)) is not None:
            store.add_file_list(base, _recorded(path for path, _ in listed))
            return entry
    known = {tuple(path for path, _ in listed) for listed in local}
    for names in remote.file_lists(base):
        if tuple(names) in known:
            continue
        parts = files_part(names, identity=True)
        if parts is None:
            continue
        key = Key("result", base, *parts).hex()
        if key in missed:
            continue
        if (entry := store.lookup(key)) is not None:
            store.add_file_list(base, _recorded(names))
            return entry
        missed[key] = []
    return None


def store_by_files(store: CacheStore, base: str, read: Sequence[str], files: Mapping[str, str], meta: bytes) -> None:
    """Store ``files`` and ``meta`` as the entry behind ``base`` for the files a run read (``read``, hashed now),
    and record that list among ``base``'s, with each file's stamp and digest, so that :func:`lookup_by_files`
    finds it. Where the store has a second level, the entry is uploaded (by the store), then ``base``'s lists."""
    parts = files_part(read, identity=True)
    if parts is not None:
        store.add_file_list(base, _recorded(read))
        store.store(Key("result", base, *parts).hex(), files, meta)
        remote = store.remote()
        if remote is not None and remote.uploads:
            local = [[path for path, _ in listed] for listed in store.file_lists(base)]
            remote.store_file_lists(base, [list(read), *local])


__all__ = ["ENVIRONMENT", "RACY_SECONDS", "SCHEME", "Key", "bytes_digest", "command_key", "compiler_parts",
           "file_digest", "files_part", "job_records_directory", "lookup_by_files", "program_entry", "program_identity",
           "records_directory", "store_by_files"]
