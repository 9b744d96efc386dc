"""Finding the Clang offload toolchain and the CUDA tools it calls.

Discovery runs once per (environment, search path) and is memoized: build tools call it at
configuration time, never inside an action. A missing piece is one :class:`ToolchainError` naming
what is missing and the Debian package that provides it.
"""
from __future__ import annotations

import atexit
import functools
import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from offload_builders.errors import ToolchainError

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
    """The resolved paths and facts of one Clang installation."""

    clang: Path
    clangxx: Path
    version: tuple[int, int, int]
    resource_dir: Path
    bin_dir: Path
    lib_dir: Path
    cuda_path: Path | None
    search_path: str = ""           # the PATH the CUDA tools are looked up in, after $CUDA_PATH/bin

    @property
    def major(self) -> int:
        return self.version[0]

    def tool(self, name: str) -> Path:
        """Return the sibling LLVM tool ``name`` (next to clang), or raise naming its package."""
        candidate = self.bin_dir / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
        raise ToolchainError(f"{name} not found next to {self.clang}{install_hint(name)}")

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
        raise ToolchainError(f"{name} not found in {self.lib_dir}{install_hint(name)}")


class ProbeCache:
    """Answers that cost a process, kept on disk: driver probes (so a no-op rebuild spawns no
    ``clang -###`` at all), the toolchain's version, device bitcode symbols.

    Values are lists of lists of strings. Keys name the driver binary by path, size and modification
    time (:meth:`key`), so an upgraded compiler is probed again, or hash what was read. The file is
    rewritten (atomically) at exit only when something was added; a damaged file or entry is a miss.
    """

    #: Entries kept at most unless the constructor says otherwise: the oldest go first.
    MAX_ENTRIES = 4096

    def __init__(self, path: str | os.PathLike[str], max_entries: int | None = None) -> None:
        self.path = Path(path)
        self.max_entries = self.MAX_ENTRIES if max_entries is None else max_entries
        self._lock = threading.Lock()
        self._dirty = False
        try:
            loaded = json.loads(self.path.read_text())
            self._entries: dict[str, list[list[str]]] = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            self._entries = {}
        atexit.register(self.save)

    @staticmethod
    def key(driver: str, language: str, flags: tuple[str, ...], cwd: str) -> str:
        # The invoked name matters (clang and clang++ are one binary in two driver modes), and so
        # does the binary behind it.
        real = os.path.realpath(driver)
        stat = os.stat(real)
        return json.dumps([os.path.abspath(driver), real, stat.st_size, stat.st_mtime_ns, language, flags, cwd,
                           _driver_search_stamp()])

    def get(self, key: str) -> tuple[tuple[str, ...], ...] | None:
        jobs = self._entries.get(key)
        if not isinstance(jobs, list) or not all(
                isinstance(job, list) and all(isinstance(arg, str) for arg in job) for job in jobs):
            return None
        return tuple(tuple(job) for job in jobs)

    def put(self, key: str, jobs: tuple[tuple[str, ...], ...]) -> None:
        with self._lock:
            self._entries.pop(key, None)
            self._entries[key] = [list(job) for job in jobs]
            while len(self._entries) > self.max_entries:
                del self._entries[next(iter(self._entries))]
            self._dirty = True

    def save(self) -> None:
        with self._lock:
            if not self._dirty:
                return
            partial = self.path.with_name(f"{self.path.name}.{os.getpid()}.partial")
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                partial.write_text(json.dumps(self._entries))
                os.replace(partial, self.path)
            except OSError:
                return  # a read-only tree only loses the cache, never the build
            self._dirty = False


_PROBE_CACHES: dict[str, ProbeCache] = {}


def probe_cache(path: str | os.PathLike[str], max_entries: int | None = None) -> ProbeCache:
    """One :class:`ProbeCache` per file per process (``max_entries``: its size limit, if not the default)."""
    key = os.path.abspath(path)
    if key not in _PROBE_CACHES:
        _PROBE_CACHES[key] = ProbeCache(key, max_entries)
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


def user_cache(name: str, max_entries: int | None = None) -> ProbeCache | None:
    """A per-user cache file (``$OFFLOAD_BUILDERS_CACHE_DIR/<name>``, else in the XDG cache directory).

    ``OFFLOAD_BUILDERS_CACHE_DIR=`` (empty) turns these caches off.
    """
    directory = os.environ.get("OFFLOAD_BUILDERS_CACHE_DIR")
    if directory is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        directory = os.path.join(base, "offload-builders")
    return probe_cache(os.path.join(directory, name), max_entries) if directory else None


def user_probe_cache() -> ProbeCache | None:
    """The per-user cache of toolchain probes.

    Running ``clang --version`` and ``clang -print-resource-dir`` costs two processes (20 to 40 ms)
    in every SCons run and every ``offload-link``; the answers change only with the binary, which is
    part of the key.
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


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    except OSError as error:
        raise ToolchainError(f"cannot run {argv[0]}: {error.strerror}") from None
    if done.returncode != 0:
        raise ToolchainError(f"{' '.join(argv)} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def _sibling_cxx(clang: Path) -> Path:
    """The C++ driver next to ``clang`` (clang-19 -> clang++-19, clang -> clang++)."""
    name = clang.name
    match = re.fullmatch(r"clang(-\d+)?", name)
    if match:
        candidate = clang.with_name(f"clang++{match.group(1) or ''}")
        if candidate.exists():
            return candidate
    return clang.with_name("clang++") if clang.with_name("clang++").exists() else clang


@functools.lru_cache(maxsize=8)
def _probe_toolchain(clang_text: str, cuda_text: str, search_path: str) -> Toolchain:
    clang = Path(clang_text)
    real = Path(os.path.realpath(clang))
    cache = user_probe_cache()
    key = ProbeCache.key(str(clang), "toolchain", ("--version", "-print-resource-dir"), "") if cache else ""
    answers = cache.get(key) if cache else None
    if answers is None or len(answers) != 2 or len(answers[0]) != 1 or len(answers[1]) != 1:
        answers = ((_run([str(clang), "--version"]),), (_run([str(clang), "-print-resource-dir"]),))
        if cache:
            cache.put(key, answers)
    version_text, resource_text = answers[0][0], answers[1][0]
    match = _VERSION_RE.search(version_text)
    if not match:
        raise ToolchainError(f"{clang} does not look like clang: --version printed {version_text.splitlines()[:1]}")
    version = (int(match.group(1)), int(match.group(2)), int(match.group(3)))
    resource_dir = Path(resource_text.strip())
    bin_dir = real.parent
    lib_dir = bin_dir.parent / "lib"
    cuda_path = Path(cuda_text) if cuda_text and Path(cuda_text).is_dir() else None
    return Toolchain(
        clang=clang,
        clangxx=_sibling_cxx(clang),
        version=version,
        resource_dir=resource_dir,
        bin_dir=bin_dir,
        lib_dir=lib_dir,
        cuda_path=cuda_path,
        search_path=search_path,
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
