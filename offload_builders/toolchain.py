"""Finding the Clang offload toolchain and the CUDA tools it calls.

Discovery runs once per (environment, search path) and is memoized: build tools call it at
configuration time, never inside an action. A missing piece is one :class:`ToolchainError` naming
what is missing and the Debian package that provides it.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from offload_builders.errors import ToolchainError
from offload_builders.private_dirs import (
    UnsafeDirectoryError,
    private_directory,
    replace_private_file,
    trusted_file_text,
)

TYPE_CHECKING = False  # typing costs every command line milliseconds: for type checkers only
if TYPE_CHECKING:
    from typing import TypeGuard

#: Where Debian's versioned LLVM packages put their tools, newest supported first.
DEBIAN_LLVM_PREFIXES: tuple[str, ...] = ("/usr/lib/llvm-19",)
DEFAULT_CUDA_PATH = "/usr/local/cuda"

#: Which Debian package provides each tool we may need (for error messages).
DEBIAN_PACKAGES: Mapping[str, str] = {
    "clang": "clang-19",
    "clang++": "clang-19",
    "clang-offload-packager": "clang-tools-19",
    "clang-offload-bundler": "clang-tools-19",
    "clang-linker-wrapper": "clang-tools-19",
    "clang-nvlink-wrapper": "clang-tools-19",
    "ld.lld": "lld-19",
    "llvm-objcopy": "llvm-19",
    "llvm-ar": "llvm-19",
    "llvm-readelf": "llvm-19",
    "libomptarget.so": "libomp-19-dev",
    "libomptarget.devicertl.a": "libomp-19-dev",
    "ptxas": "the CUDA toolkit (set $CUDA_PATH, default /usr/local/cuda)",
    "nvlink": "the CUDA toolkit (set $CUDA_PATH, default /usr/local/cuda)",
    "fatbinary": "the CUDA toolkit (set $CUDA_PATH, default /usr/local/cuda)",
}

_VERSION_RE = re.compile(r"clang version (\d+)\.(\d+)\.(\d+)")


def install_hint(tool: str) -> str:
    """Say how to get ``tool`` on Debian, for error messages."""
    package = DEBIAN_PACKAGES.get(tool)
    if package is None:
        return ""
    if package.startswith("the CUDA"):
        return f"; it comes with {package}"
    return f"; install it with: apt-get install {package}"


@dataclass(frozen=True)
class Toolchain:
    """The resolved paths and facts of one Clang installation.

    ``clang`` and ``clangxx`` are what runs (a wrapper script, ccache's or Spack's, stays in front);
    ``bin_dir`` and ``lib_dir`` are where the driver itself finds its tools and the OpenMP runtime: its
    ``InstalledDir`` and the ``lib`` beside it, which need not be next to a wrapper.
    """

    clang: Path
    clangxx: Path
    version: tuple[int, int, int]
    resource_dir: Path
    bin_dir: Path                   # the driver's InstalledDir: clang-offload-packager, ld.lld, ... live here
    lib_dir: Path                   # InstalledDir/../lib, where the driver finds libomptarget (its -L)
    cuda_path: Path | None
    search_path: str = ""           # the PATH the CUDA tools are looked up in, after $CUDA_PATH/bin
    clangxx_args: tuple[str, ...] = ()  # ("--driver-mode=g++",) where clangxx is a wrapper with no C++ twin

    @property
    def major(self) -> int:
        return self.version[0]

    @property
    def cxx_command(self) -> tuple[str, ...]:
        """The C++ driver as a command: ``clang++``, or the wrapper in g++ mode."""
        return (str(self.clangxx), *self.clangxx_args)

    def tool(self, name: str) -> Path:
        """Return the LLVM tool ``name`` from the driver's InstalledDir, or raise naming its package."""
        candidate = self.bin_dir / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
        raise ToolchainError(f"{name} not found in {self.bin_dir} (the InstalledDir of {self.clang})"
                             f"{install_hint(name)}")

    def optional_tool(self, name: str) -> Path | None:
        try:
            return self.tool(name)
        except ToolchainError:
            return None

    def cuda_tool(self, name: str) -> Path:
        """Return ``ptxas``/``nvlink``/``fatbinary`` from the CUDA toolkit, or raise."""
        searched = []
        if self.cuda_path is not None:
            candidate = self.cuda_path / "bin" / name
            searched.append(str(candidate))
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
        found = shutil.which(name, path=self.search_path or None) if self.search_path else None
        if found:
            return Path(found)
        searched.append(f"{name} on PATH")
        raise ToolchainError(
            f"{name} is needed for NVPTX targets but was not found (looked at {', '.join(searched)})"
            f"{install_hint(name)}"
        )

    def runtime_library(self, name: str) -> Path:
        """Return an OpenMP runtime file such as ``libomptarget.devicertl.a``, or raise."""
        candidate = self.lib_dir / name
        if candidate.exists():
            return candidate
        raise ToolchainError(f"{name} not found in {self.lib_dir} (beside the InstalledDir of {self.clang})"
                             f"{install_hint(name)}")


#: The layout of cache entries, part of every key as it is stored: an entry of another layout is a miss. Raised
#: whenever what an entry holds changes meaning or checks; entries of other layouts stay in the file (another
#: installed version may share it) until they are trimmed as the oldest.
CACHE_FORMAT = 2

#: A cache's check of one entry, given the key asked for and the value found (already a list of lists of
#: strings): whether to use it. An entry that fails is a miss, asked again and replaced.
EntryCheck = Callable[[str, list], bool]

#: The start of a key made by :meth:`ProbeCache.key` (the driver's jobs), before the language and a colon.
DRIVER_JOBS_KEY = "driver-jobs/"


class ProbeCache:
    """Answers that cost a process, kept on disk: driver probes (so a no-op rebuild spawns no
    ``clang -###`` at all), the toolchain's version, device bitcode symbols.

    Values are lists of lists of strings. Keys name the driver binary by path, size and modification
    time (:meth:`key`), so an upgraded compiler is probed again, or hash what was read. The file is
    rewritten at exit only when something was added.

    What is read is not trusted: driver jobs from here are run as they are, and a damaged answer kept would
    fail every build. A damaged file is empty; an entry is used only where it is a list of lists of strings
    (no NUL), stored under this :data:`CACHE_FORMAT`, and passes the cache's ``check`` (by default
    :func:`driver_jobs_check`); anything else is a miss, so it is asked again and replaced, in this file
    and in every file the answer is copied to. A ``private`` cache (a per-user one) also reads only a file
    of this user's that no one else may write, and writes its file ``0600``.

    Several processes (two projects building at once) share one file: a save re-reads the file under a
    lock on its directory and merges what others wrote with what this process added (its own answers
    win), then replaces the file through a temporary one, so no writer loses another's entries and no
    reader sees half a file.
    """

    #: Entries kept at most unless the constructor says otherwise: the oldest go first.
    MAX_ENTRIES = 4096

    def __init__(self, path: str | os.PathLike[str], max_entries: int | None = None, *,
                 check: EntryCheck | None = None, private: bool = False) -> None:
        self.path = Path(path)
        self.max_entries = self.MAX_ENTRIES if max_entries is None else max_entries
        self.check: EntryCheck = driver_jobs_check if check is None else check
        self.private = private
        self._lock = threading.Lock()
        self._added: dict[str, None] = {}  # stored keys put since the last save, oldest first
        self._entries: dict[str, object] = self._read()
        atexit.register(self.save)

    def _read(self) -> dict[str, object]:
        if self.private:
            text = trusted_file_text(self.path)
            if text is None:
                return {}
        else:
            try:
                text = self.path.read_text()
            except (OSError, ValueError):
                return {}
        try:
            loaded = json.loads(text)
        except ValueError:
            return {}
        return loaded if isinstance(loaded, dict) else {}

    @staticmethod
    def key(driver: str, language: str, flags: tuple[str, ...], cwd: str) -> str:
        # The invoked name matters (clang and clang++ are one binary in two driver modes), and so
        # does the binary behind it (behind a wrapper script: the compiler it runs, see _probe_toolchain).
        # The language leads (DRIVER_JOBS_KEY), so the check of an entry knows what a probe of it answers.
        return f"{DRIVER_JOBS_KEY}{language}:" + json.dumps(
            [*_binary_stamp(driver), language, flags, cwd, _driver_search_stamp(),
             *_COMPILER_BEHIND.get(os.path.abspath(driver), ())])

    def get(self, key: str) -> tuple[tuple[str, ...], ...] | None:
        value = self._entries.get(_stored_key(key))
        if not _rows_of_strings(value) or not self.check(key, value):
            return None
        return tuple(tuple(row) for row in value)

    def put(self, key: str, jobs: tuple[tuple[str, ...], ...]) -> None:
        value = [list(job) for job in jobs]
        if not _rows_of_strings(value) or not self.check(key, value):
            return  # never read back as it is: not worth a line in the file
        stored = _stored_key(key)
        with self._lock:
            self._entries.pop(stored, None)
            self._entries[stored] = value
            self._added.pop(stored, None)
            self._added[stored] = None
            self._trim(self._entries)

    def _trim(self, entries: dict[str, object]) -> None:
        while len(entries) > self.max_entries:
            del entries[next(iter(entries))]

    def save(self) -> None:
        """Merge this process's new entries into the file (a no-op when nothing was added)."""
        with self._lock:
            if not self._added:
                return
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with _locked_directory(self.path.parent):
                    merged = self._read()  # what other processes saved since we loaded
                    for key in self._added:
                        if key in self._entries:  # (else trimmed again)
                            merged.pop(key, None)
                            merged[key] = self._entries[key]
                    self._trim(merged)
                    if self.private:
                        replace_private_file(self.path, json.dumps(merged), 0o600)
                    else:
                        _replace_atomically(self.path, json.dumps(merged))
            except OSError:
                return  # a read-only tree only loses the cache, never the build
            self._entries = merged
            self._added.clear()


def _stored_key(key: str) -> str:
    """``key`` as the file holds it: with the layout it was written in (:data:`CACHE_FORMAT`)."""
    return f"v{CACHE_FORMAT}:{key}"


def _rows_of_strings(value: object) -> TypeGuard[list[list[str]]]:
    """Whether ``value`` is a list of lists of strings none of which holds a NUL (no argument, path or name can)."""
    return isinstance(value, list) and all(
        isinstance(row, list) and all(isinstance(word, str) and "\0" not in word for word in row) for row in value)


def driver_jobs_check(key: str, value: list) -> bool:
    """The check of an answer of the driver (a key made by :meth:`ProbeCache.key`): jobs, each a program and
    its arguments. A compile probe has at least one job (none would fail every build of it); a device-link
    or host-link probe may have none (its answer "run the driver instead"), a host-link probe at most one.
    A key not made by :meth:`ProbeCache.key` is not checked further."""
    if not key.startswith(DRIVER_JOBS_KEY):
        return True
    language = key[len(DRIVER_JOBS_KEY):].partition(":")[0]
    if not all(job and job[0] for job in value):
        return False
    if language == "host-link":
        return len(value) <= 1
    return language == "device-link" or bool(value)


def _toolchain_check(key: str, value: list) -> bool:
    """``toolchains.json`` (:func:`_driver_facts`): (version line, InstalledDir, resource directory) and
    (the $PATH of a wrapper or '', the stamp of the compiler found)."""
    return (len(value) == 2 and len(value[0]) == 3 and len(value[1]) >= 2
            and _VERSION_RE.search(value[0][0]) is not None and all(os.path.isabs(path) for path in value[0][1:]))


def _abi_check(key: str, value: list) -> bool:
    """``nvptx-tools.json``: the cubin ELF ABI the tools write, one number."""
    return len(value) == 1 and len(value[0]) == 1 and re.fullmatch(r"[0-9]{1,3}", value[0][0]) is not None


def _kinds_check(key: str, value: list) -> bool:
    """``link-input-kinds.json``: one row of offload kind names (none: no device code)."""
    return len(value) == 1 and all(re.fullmatch(r"[a-z][a-z0-9_-]*", kind) for kind in value[0])


def _empty_check(key: str, value: list) -> bool:
    """``host-libraries.json``: an entry is only ever empty (this library has no offload code)."""
    return value == []


def _symbols_check(key: str, value: list) -> bool:
    """``device-symbols.json``: (symbol name, flags among 'u' undefined, 'w' weak, 'h' hidden) pairs."""
    return all(len(row) == 2 and row[0] and re.fullmatch("u?w?h?", row[1]) for row in value)


#: The check of each per-user cache file's entries (what its writer puts there). Files not named here
#: (``driver-probes.json``, ``link-probes.json``: driver jobs) get :func:`driver_jobs_check`.
CACHE_CHECKS: Mapping[str, EntryCheck] = {
    "toolchains.json": _toolchain_check,
    "nvptx-tools.json": _abi_check,
    "link-input-kinds.json": _kinds_check,
    "host-libraries.json": _empty_check,
    "device-symbols.json": _symbols_check,
}


@contextlib.contextmanager
def _locked_directory(directory: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``directory`` (no lock file to leave behind). Where the file system
    refuses it, go on without: the write itself stays atomic, only a concurrent merge may lose entries."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _replace_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file unique to this process and thread, then rename it over ``path``
    (keeping the file's mode, see :func:`_file_mode`). The temporary file is removed on any failure."""
    replace_private_file(path, text, _file_mode(path))


def _file_mode(path: Path) -> int:
    """The mode a rewritten file keeps: the old file's, else what ``open`` would give under the umask
    (mkstemp creates 0600)."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        pass
    try:
        with open("/proc/self/status") as status:
            umask = next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        umask = 0o022
    return 0o666 & ~umask


def _binary_stamp(program: str) -> list:
    """What identifies a program for the caches: its path as given, the binary behind it, size and mtime."""
    real = os.path.realpath(program)
    stat = os.stat(real)
    return [os.path.abspath(program), real, stat.st_size, stat.st_mtime_ns]


#: The stamp of a program as the caches key it (path as given, the binary behind it, size, mtime).
binary_stamp = _binary_stamp


#: For a driver that is a wrapper (its InstalledDir is not its own directory): the stamp of the compiler
#: it runs, added to the probe keys of that driver so that upgrading that compiler probes again.
_COMPILER_BEHIND: dict[str, list] = {}


_PROBE_CACHES: dict[str, ProbeCache] = {}


def probe_cache(path: str | os.PathLike[str], max_entries: int | None = None, *,
                check: EntryCheck | None = None, private: bool = False) -> ProbeCache:
    """One :class:`ProbeCache` per file per process (``max_entries``: its size limit, if not the default;
    ``check`` and ``private``: see the class). The first call for a file decides."""
    key = os.path.abspath(path)
    if key not in _PROBE_CACHES:
        _PROBE_CACHES[key] = ProbeCache(key, max_entries, check=check, private=private)
    return _PROBE_CACHES[key]


#: Where the driver finds the GCC installation (crt files, libstdc++) and the CUDA toolkit that its jobs
#: name. Installing or removing a version there changes these directories, so the probes are asked again.
_DRIVER_SEARCHED = ("/usr/lib/gcc", "/usr/lib64/gcc", "/usr/include/c++", DEFAULT_CUDA_PATH)


@functools.cache
def _driver_search_stamp() -> list[list]:
    stamp: list[list] = []
    for top in _DRIVER_SEARCHED:
        directories = [top]
        try:
            directories += sorted(entry.path for entry in os.scandir(top) if entry.is_dir())  # the triples
        except OSError:
            pass
        for directory in directories:
            try:
                stamp.append([directory, os.path.realpath(directory), os.stat(directory).st_mtime_ns])
            except OSError:
                stamp.append([directory])
    return stamp


def configured_cache_dir() -> str | None:
    """The per-user cache directory as configured (``$OFFLOAD_BUILDERS_CACHE_DIR``, else
    :func:`default_cache_dir`), unchecked; None where ``OFFLOAD_BUILDERS_CACHE_DIR=`` (empty) turns the caches
    off."""
    directory = os.environ.get("OFFLOAD_BUILDERS_CACHE_DIR")
    if directory is None:
        directory = default_cache_dir()
    return directory or None


def default_cache_dir() -> str:
    """``offload-builders`` in the XDG cache directory (``$XDG_CACHE_HOME``, else ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "offload-builders")


#: The cache directories warned about in this process (once each).
_WARNED_CACHE_DIRS: set[str] = set()


def user_cache_dir() -> str | None:
    """The per-user cache directory (:func:`configured_cache_dir`), made ``0700`` if missing and checked on
    every call to be private to the user (:func:`offload_builders.private_dirs.private_directory`): what is
    read from there is run or trusted. None where the caches are off: turned off, or the directory cannot be
    made (a read-only home: silently, as the caches never stop a build), or it is not private (another
    user's, or writable by others: one warning per process on stderr, naming the directory and the fix)."""
    directory = configured_cache_dir()
    if directory is None:
        return None
    try:
        private_directory(directory)
    except UnsafeDirectoryError as error:
        if directory not in _WARNED_CACHE_DIRS:
            _WARNED_CACHE_DIRS.add(directory)
            sys.stderr.write("offload-builders: warning: the per-user caches are off ($OFFLOAD_BUILDERS_CACHE_DIR"
                             f" chooses their directory): {error}\n")
        return None
    except ToolchainError:
        return None
    return directory


def user_cache(name: str, max_entries: int | None = None, check: EntryCheck | None = None) -> ProbeCache | None:
    """A per-user cache file (``<name>`` in :func:`user_cache_dir`), private to the user; None where the
    caches are off. ``check``: its entries' check, by default the one :data:`CACHE_CHECKS` names for ``name``.

    ``OFFLOAD_BUILDERS_CACHE_DIR=`` (empty) turns these caches off.
    """
    directory = user_cache_dir()
    if not directory:
        return None
    return probe_cache(os.path.join(directory, name), max_entries, check=check or CACHE_CHECKS.get(name),
                       private=True)


def user_probe_cache() -> ProbeCache | None:
    """The per-user cache of toolchain probes.

    Asking the driver for its version, InstalledDir and resource directory costs a process (10 to 20 ms)
    in every SCons run and every ``offload-link``; the answers change only with the binary, which is
    part of the key (and, behind a wrapper, with the compiler it runs: see :func:`_driver_facts`).
    """
    return user_cache("toolchains.json")


def _candidate_compilers(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """The places we look for clang, in order, each with how we found it (for error messages)."""
    candidates: list[tuple[str, str]] = []
    if environ.get("OFFLOAD_CLANG"):
        candidates.append((environ["OFFLOAD_CLANG"], "$OFFLOAD_CLANG"))
        return candidates
    path = environ.get("PATH", os.defpath)
    found = shutil.which("clang-19", path=path)
    if found:
        candidates.append((found, "clang-19 on PATH"))
    for prefix in DEBIAN_LLVM_PREFIXES:
        candidates.append((f"{prefix}/bin/clang", prefix))
    found = shutil.which("clang", path=path)
    if found:
        candidates.append((found, "clang on PATH"))
    return candidates


#: The one probe of a compiler: its version and InstalledDir (the header ``-###`` prints) and its resource
#: directory (in the cc1 job). Nothing is compiled.
_TOOLCHAIN_PROBE = ("-###", "-c", "-x", "c", os.devnull)
_INSTALLED_DIR_RE = re.compile(r"^InstalledDir: (.*)$", re.MULTILINE)


def _probe_driver(clang: Path) -> tuple[str, str, str]:
    """``clang -### -c -x c /dev/null``: (version line, InstalledDir, resource directory)."""
    argv = [str(clang), *_TOOLCHAIN_PROBE]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="surrogateescape", check=False, timeout=60)
    except OSError as error:
        raise ToolchainError(f"cannot run {clang}: {error.strerror}") from None
    if done.returncode != 0:
        raise ToolchainError(f"{shlex.join(argv)} failed: {done.stderr.strip() or done.stdout.strip()}")
    text = done.stderr
    version = next((line for line in text.splitlines() if _VERSION_RE.search(line)), "")
    installed = _INSTALLED_DIR_RE.search(text)
    resource = ""
    for line in text.splitlines():
        if line.startswith(' "'):
            job = shlex.split(line)
            if "-resource-dir" in job[:-1]:
                resource = job[job.index("-resource-dir") + 1]
                break
    if not version or installed is None or not resource:
        first = text.strip().splitlines()[:1]
        raise ToolchainError(f"{clang} does not look like clang: {shlex.join(argv)} printed {first}")
    return version, installed.group(1).strip(), resource


def _installed_stamp(installed_dir: str) -> list[str]:
    """What identifies the compiler in an InstalledDir: its ``clang`` (resolved), size and mtime, else the
    directory's mtime (a package update replaces files there)."""
    for candidate in (os.path.join(installed_dir, "clang"), installed_dir):
        try:
            real = os.path.realpath(candidate)
            stat = os.stat(real)
        except OSError:
            continue
        return [real, str(stat.st_size), str(stat.st_mtime_ns)]
    return [installed_dir]


def _is_wrapper(clang: Path, installed_dir: str) -> bool:
    """Whether ``clang`` is not the driver itself (a script or ccache that runs it from elsewhere)."""
    return os.path.dirname(os.path.realpath(clang)) != os.path.realpath(installed_dir)


def _driver_facts(clang: Path) -> tuple[str, str, str]:
    """(version line, InstalledDir, resource directory) of ``clang``, from the per-user cache if still valid.

    The entry is keyed by the binary named (for a wrapper: the script) and records the compiler found
    behind it: it holds while that compiler is the same file and, for a wrapper (which may pick its
    compiler from $PATH, as ccache does), while $PATH is the same.
    """
    cache = user_probe_cache()
    key = json.dumps([*_binary_stamp(str(clang)), "toolchain", list(_TOOLCHAIN_PROBE)]) if cache else ""
    answers = cache.get(key) if cache else None
    if answers is not None and len(answers) == 2 and len(answers[0]) == 3 and len(answers[1]) >= 2:
        version, installed, resource = answers[0]
        recorded_path, *recorded_stamp = answers[1]
        wrapper = _is_wrapper(clang, installed)
        if recorded_stamp == _installed_stamp(installed) and recorded_path == (_path() if wrapper else ""):
            return version, installed, resource
    version, installed, resource = _probe_driver(clang)
    if cache:
        path = _path() if _is_wrapper(clang, installed) else ""
        cache.put(key, ((version, installed, resource), (path, *_installed_stamp(installed))))
    return version, installed, resource


def _path() -> str:
    return os.environ.get("PATH", os.defpath)


def _cxx_driver(clang: Path, installed_dir: str, wrapper: bool) -> tuple[Path, tuple[str, ...]]:
    """The C++ driver for ``clang``: its ``clang++`` twin beside it as named (clang-19 -> clang++-19,
    x86_64-linux-gnu-clang -> x86_64-linux-gnu-clang++: how ccache's and Spack's wrapper directories pair
    them), else the driver's own ``clang++``, else, for a wrapper, the same wrapper with
    ``--driver-mode=g++`` (a wrapper stays in front of every compile)."""
    name = clang.name
    match = re.fullmatch(r"(.*clang)(-\d+(?:\.\d+)*)?", name)
    if match and not name.endswith("++"):
        twin = clang.with_name(f"{match.group(1)}++{match.group(2) or ''}")
        if twin.is_file() and os.access(twin, os.X_OK):
            return twin, ()
    if not wrapper:
        for twin in (clang.with_name("clang++"), Path(installed_dir) / "clang++"):
            if twin.is_file() and os.access(twin, os.X_OK):
                return twin, ()
    return clang, ("--driver-mode=g++",)


@functools.lru_cache(maxsize=8)
def _probe_toolchain(clang_text: str, cuda_text: str, search_path: str) -> Toolchain:
    clang = Path(clang_text)
    version_text, installed, resource_text = _driver_facts(clang)
    match = _VERSION_RE.search(version_text)
    if not match:
        raise ToolchainError(f"{clang} does not look like clang: it printed {version_text!r}")
    version = (int(match.group(1)), int(match.group(2)), int(match.group(3)))
    bin_dir = Path(os.path.normpath(installed))
    wrapper = _is_wrapper(clang, installed)
    clangxx, clangxx_args = _cxx_driver(clang, installed, wrapper)
    if wrapper:
        behind = ["behind", *_installed_stamp(installed)]
        _COMPILER_BEHIND[os.path.abspath(clang)] = behind
        _COMPILER_BEHIND.setdefault(os.path.abspath(clangxx), behind)
    cuda_path = Path(cuda_text) if cuda_text and Path(cuda_text).is_dir() else None
    return Toolchain(
        clang=clang,
        clangxx=clangxx,
        version=version,
        resource_dir=Path(resource_text),
        bin_dir=bin_dir,
        lib_dir=bin_dir.parent / "lib",  # the driver's own -L for libomp, libomptarget and its device runtime
        cuda_path=cuda_path,
        search_path=search_path,
        clangxx_args=clangxx_args,
    )


def find_toolchain(environ: Mapping[str, str] | None = None) -> Toolchain:
    """Find Clang: ``$OFFLOAD_CLANG``, else ``clang-19``, ``/usr/lib/llvm-19/bin/clang``, ``clang`` on PATH.

    Memoized on the variables it reads, so build tools can call it for every node: the search of PATH
    runs once per distinct environment, and the compiler is asked for its version once per binary.
    """
    environ = os.environ if environ is None else environ
    return _find_toolchain(environ.get("OFFLOAD_CLANG", ""), environ.get("PATH"),
                           environ.get("CUDA_PATH") or environ.get("CUDA_HOME") or DEFAULT_CUDA_PATH)


@functools.lru_cache(maxsize=32)
def _find_toolchain(offload_clang: str, path: str | None, cuda_text: str) -> Toolchain:
    environ = {} if path is None else {"PATH": path}
    if offload_clang:
        environ["OFFLOAD_CLANG"] = offload_clang
    tried: list[str] = []
    for candidate, origin in _candidate_compilers(environ):
        binary = Path(candidate)
        if binary.is_file() and os.access(binary, os.X_OK):
            return _probe_toolchain(str(binary), cuda_text, environ.get("PATH", ""))
        tried.append(f"{candidate} ({origin})")
    raise ToolchainError(
        "no Clang found for offload compilation (tried " + ", ".join(tried or ["nothing: PATH is empty"]) + ")"
        "; install it with: apt-get install clang-19 clang-tools-19 lld-19 llvm-19 libomp-19-dev,"
        " or point $OFFLOAD_CLANG at a clang binary"
    )
