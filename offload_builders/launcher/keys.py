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
"""
from __future__ import annotations

import os

try:  # BLAKE2 is built into CPython: no OpenSSL to load, which hashlib does (milliseconds of every compile)
    from _blake2 import blake2b
except ImportError:  # another Python
    from hashlib import blake2b

from offload_builders.source_identity import file_identity

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

_FILE_DIGESTS: dict[str, str | None] = {}


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
    if path in _FILE_DIGESTS:
        return _FILE_DIGESTS[path]
    digest: str | None
    try:
        with open(path, "rb") as f:
            hashed = blake2b(digest_size=20)
            while block := f.read(1 << 20):
                hashed.update(block)
            digest = hashed.hexdigest()
    except OSError:
        digest = None
    _FILE_DIGESTS[path] = digest
    return digest


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


#: Marks a program in a file list: it is checked by :func:`program_identity` (size, mtime), not hashed whole (a
#: linker is tens of megabytes). No path holds a NUL, so no file name can look like it.
PROGRAM = "\0program "


def program_entry(program: str) -> str:
    """A program a command's jobs ran (``lld``, ``ptxas``, the packager), as its file list names it."""
    return PROGRAM + program


def files_part(paths: Iterable[str], identity: bool) -> list[str] | None:
    """Each file's digest (and identity, for outputs that name target regions by it), or None where one cannot
    be read now (a file of that list is gone: that list cannot match); a program (:func:`program_entry`) by its
    identity."""
    parts: list[str] = []
    for path in paths:
        if path.startswith(PROGRAM):
            parts.append("program " + program_identity(path[len(PROGRAM):]))
            continue
        digest = file_digest(path)
        if digest is None:
            return None
        parts.append(f"{path} {digest}")
        if identity:
            parts.append(file_identity(path))
    return parts


def lookup_by_files(store: CacheStore, base: str) -> Entry | None:
    """The entry behind ``base`` (a key's first part): that of the first of its file lists, the most recent first,
    whose files, hashed as they are now, name a stored entry (ccache's direct mode). None: a miss."""
    for files in store.file_lists(base):
        parts = files_part(files, identity=True)
        if parts is not None and (entry := store.lookup(Key("result", base, *parts).hex())) is not None:
            return entry
    return None


def store_by_files(store: CacheStore, base: str, read: Sequence[str], files: Mapping[str, str], meta: bytes) -> None:
    """Store ``files`` and ``meta`` as the entry behind ``base`` for the files a run read (``read``, hashed now),
    and record that list among ``base``'s, so that :func:`lookup_by_files` finds it."""
    parts = files_part(read, identity=True)
    if parts is not None:
        store.add_file_list(base, read)
        store.store(Key("result", base, *parts).hex(), files, meta)


__all__ = ["ENVIRONMENT", "PROGRAM", "SCHEME", "Key", "command_key", "compiler_parts", "file_digest", "files_part",
           "job_records_directory", "lookup_by_files", "program_entry", "program_identity",
           "records_directory", "store_by_files"]
