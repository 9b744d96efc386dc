"""Which NVPTX tools (``ptxas``, ``nvlink``, libdevice) build OpenMP images, so the OpenMP runtime loads them.

The OpenMP runtime (libomptarget, from the toolchain's own ``lib`` directory) reads the cubin ELF header in
the layout of its LLVM version (:mod:`offload_builders.formats.cubin`): libomptarget 19 reads ABI 7 only,
and CUDA 13's ``ptxas`` and ``nvlink`` write ABI 8. So the tools are a choice of their own, apart from the
CUDA installation whose headers, ``fatbinary`` and runtime the CUDA model uses (``$CUDA_PATH``):

1. ``$OFFLOAD_NVPTX_TOOLS``: a directory laid out as a CUDA installation (``bin/ptxas``, ``bin/nvlink``,
   ``nvvm/libdevice``), the user's choice; it must write an ABI the runtime loads.
2. ``$CUDA_PATH`` (default ``/usr/local/cuda``), where its tools write an ABI the runtime loads.
3. CUDA 12 from PyPI (``nvidia-cuda-nvcc-cu12``: ``ptxas`` 12.9 and libdevice; ``nvidia-nvjitlink-cu12``:
   ``libnvJitLink.so.12``), installed by ``pip install offload-builders[nvptx]`` and the set-up: no wheel
   has ``nvlink``, so the directory composed here (in the per-user cache, private to the user) links with
   nvJitLink behind ``nvlink``'s command line (:mod:`offload_builders.cli.nvlink`).

Which ABI a directory's tools write is read from a probe cubin's header (``ptxas`` of a one-kernel PTX, then
``nvlink``, which re-stamps its output), kept in the per-user cache by the tools' stamps. Where no choice
fits, the build stops before any compile with one line naming the runtime, the tools, the upstream issue
and the fix. The chosen directory is what OpenMP NVPTX device compiles, device links and the device
runtime's link get as ``--cuda-path``.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from offload_builders.errors import OffloadError, ToolchainError
from offload_builders.formats import cubin
from offload_builders.private_dirs import private_directory
from offload_builders.toolchain import Toolchain, binary_stamp, user_cache, user_cache_dir

VARIABLE = "OFFLOAD_NVPTX_TOOLS"
#: The wheels of the CUDA 12 configuration (the ``nvptx`` extra of the package).
WHEELS = ("nvidia-cuda-nvcc-cu12", "nvidia-nvjitlink-cu12")
LIBDEVICE = Path("nvvm") / "libdevice" / "libdevice.10.bc"
INSTALL_HINT = ("pip install 'offload-builders[nvptx]' (the CUDA 12 wheels nvidia-cuda-nvcc-cu12 and"
                " nvidia-nvjitlink-cu12; ./scripts/bootstrap installs them), or point $OFFLOAD_NVPTX_TOOLS at a"
                " CUDA 12 installation")
# A kernel every ptxas from CUDA 11.8 to 13 assembles (sm_75: the oldest CUDA 13 keeps).
_PROBE_PTX = ".version 7.8\n.target sm_75\n.address_size 64\n.visible .entry offload_builders_probe() { ret; }\n"
_PROBE_ARCH = "sm_75"


@dataclass(frozen=True)
class NvptxTools:
    """A directory laid out as a CUDA installation whose tools build the OpenMP NVPTX images."""

    root: Path
    origin: str          # where the choice came from, for messages
    abi: int             # the cubin ELF ABI its ptxas and nvlink write

    def tool(self, name: str) -> Path:
        """``ptxas`` or ``nvlink`` of this directory."""
        path = self.root / "bin" / name
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ToolchainError(f"{name} not found in {self.root / 'bin'} ({self.origin})")
        return path


def runtime_version(toolchain: Toolchain) -> tuple[int, int, int]:
    """The LLVM version of the OpenMP runtime the toolchain's programs load: its own (``lib`` beside it)."""
    return toolchain.version


def wheel_directories() -> tuple[Path, Path] | None:
    """``(cuda_nvcc directory, libnvJitLink.so.12)`` of the CUDA 12 wheels in this Python, or None."""
    import importlib.util

    found = []
    for module, relative in (("nvidia.cuda_nvcc", Path("bin") / "ptxas"),
                             ("nvidia.nvjitlink", Path("lib") / "libnvJitLink.so.12")):
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return None
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        match = next((Path(place) / relative for place in locations if (Path(place) / relative).is_file()), None)
        if match is None:
            return None
        found.append(match)
    return found[0].parent.parent, found[1]


def _replace(path: Path, make: str, content: str) -> None:
    """Make ``path`` a symlink to ``content`` (``make='link'``) or an executable script with that text, atomically,
    unless it already is."""
    try:
        if make == "link" and os.readlink(path) == content:
            return
        if make == "script" and not path.is_symlink() and path.read_text() == content:
            return
    except OSError:
        pass
    partial = Path(tempfile.mktemp(prefix=f".{path.name}.", dir=path.parent))
    if make == "link":
        os.symlink(content, partial)
    else:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755)
        with os.fdopen(fd, "w") as f:
            f.write(content)
    os.replace(partial, path)


def compose_wheel_tools(nvcc: Path, jitlink: Path, into: Path | None = None) -> Path:
    """The CUDA-like directory of the CUDA 12 wheels: ``bin/ptxas`` and ``nvvm``/``include`` (links into the
    ``nvidia-cuda-nvcc-cu12`` wheel), ``bin/nvlink`` (this Python's :mod:`offload_builders.cli.nvlink` with
    ``libnvJitLink.so.12``). Made in ``into``, else the per-user cache, else this Python's prefix; checked to
    be private to the user every time (:func:`private_directory`)."""
    python = os.path.abspath(sys.executable)
    nvlink = (f"#!/bin/sh\n# nvlink through libnvJitLink.so.12 (offload-builders): keeps cubin ELF ABI 7.\n"
              f"OFFLOAD_NVJITLINK={shlex.quote(str(jitlink))} exec {shlex.quote(python)} -P"
              " -m offload_builders.cli.nvlink \"$@\"\n")
    if into is None:
        # The script's text is part of the key: a version of the package that writes another script uses another
        # directory, so two versions in one cache never rewrite each other's nvlink (whose stamp the links take).
        key = hashlib.sha256(json.dumps([str(nvcc), str(jitlink), python, nvlink]).encode()).hexdigest()[:12]
        base = user_cache_dir() or os.path.join(sys.prefix, "share", "offload-builders")
        into = Path(base) / f"nvptx-tools-{key}"
    root = private_directory(into)
    private_directory(root / "bin")
    _replace(root / "bin" / "ptxas", "link", str(nvcc / "bin" / "ptxas"))
    _replace(root / "nvvm", "link", str(nvcc / "nvvm"))
    _replace(root / "include", "link", str(nvcc / "include"))
    _replace(root / "bin" / "nvlink", "script", nvlink)
    return root


def nvlink_library(nvlink: Path) -> Path | None:
    """The ``libnvJitLink`` that an ``nvlink`` script of :func:`compose_wheel_tools` runs (what decides the cubins
    it writes, with this package's code), or None for another ``nvlink``."""
    try:
        with open(nvlink, "rb") as stream:
            head = stream.read(4096)
    except OSError:
        return None
    for line in head.decode("utf-8", "replace").splitlines():
        if line.startswith("OFFLOAD_NVJITLINK="):
            words = shlex.split(line)
            return Path(words[0].partition("=")[2]) if words else None
    return None


def written_abi(root: Path) -> int | None:
    """The cubin ELF ABI the tools of ``root`` write (``ptxas``, then ``nvlink`` where there is one), from a probe
    cubin kept in the per-user cache by the tools' stamps; None where ``root`` has no ``ptxas``."""
    ptxas, nvlink = root / "bin" / "ptxas", root / "bin" / "nvlink"
    if not ptxas.is_file():
        return None
    stamps = [binary_stamp(str(ptxas))] + ([binary_stamp(str(nvlink))] if nvlink.is_file() else [])
    if nvlink.is_file() and not nvlink.resolve().read_bytes().startswith(b"\x7fELF"):
        stamps.append([nvlink.read_text()])  # a script: its text names what it runs
    return _written_abi(json.dumps(stamps), str(ptxas), str(nvlink) if nvlink.is_file() else "")


@functools.lru_cache(maxsize=16)
def _written_abi(key: str, ptxas: str, nvlink: str) -> int:
    cache = user_cache("nvptx-tools.json", max_entries=64)
    if cache is not None and (entry := cache.get(key)) and entry[0][:1] and entry[0][0].isdigit():
        return int(entry[0][0])
    with tempfile.TemporaryDirectory(prefix="offload-nvptx-probe-") as scratch:
        source, relocatable, linked = (os.path.join(scratch, name) for name in ("p.ptx", "p.o", "p.cubin"))
        with open(source, "w") as f:
            f.write(_PROBE_PTX)
        commands = [[ptxas, "-c", "-arch", _PROBE_ARCH, source, "-o", relocatable]]
        if nvlink:
            commands.append([nvlink, "-arch", _PROBE_ARCH, "-o", linked, relocatable])
        for argv in commands:
            done = subprocess.run(argv, capture_output=True, text=True, errors="surrogateescape")
            if done.returncode != 0:
                raise ToolchainError(f"{' '.join(argv)} failed while probing the NVPTX tools: "
                                     f"{(done.stderr or done.stdout).strip()}")
        try:
            abi = cubin.read_file_header(linked if nvlink else relocatable).ei_abiversion
        except OffloadError as error:
            raise ToolchainError(f"the NVPTX tools in {os.path.dirname(ptxas)} wrote no cubin: {error}") from None
    if cache is not None:
        cache.put(key, ((str(abi),),))
        cache.save()
    return abi


def openmp_tools(toolchain: Toolchain, environ: Mapping[str, str] | None = None) -> NvptxTools | None:
    """The NVPTX tools of OpenMP images (see the module's docstring), or None where there are none at all
    (no ``ptxas``: NVPTX device code is then compiled without libdevice, as before). Raises
    :class:`ToolchainError` where tools exist but none writes an ABI the runtime loads."""
    environ = os.environ if environ is None else environ
    return _openmp_tools(toolchain, environ.get(VARIABLE) or "")


@functools.lru_cache(maxsize=16)
def _openmp_tools(toolchain: Toolchain, explicit: str) -> NvptxTools | None:
    runtime = runtime_version(toolchain)
    loads = cubin.runtime_abis(runtime)
    tried: list[str] = []
    candidates: list[tuple[Path, str]] = []
    if explicit:
        candidates.append((Path(explicit), f"${VARIABLE}"))
    else:
        if toolchain.cuda_path is not None:
            candidates.append((toolchain.cuda_path, "the CUDA installation ($CUDA_PATH)"))
        wheels = wheel_directories()
        if wheels is not None:
            candidates.append((compose_wheel_tools(*wheels), "the CUDA 12 wheels (" + ", ".join(WHEELS) + ")"))
    for root, origin in candidates:
        abi = written_abi(root)
        if abi is None:
            if explicit:
                raise ToolchainError(f"${VARIABLE}={explicit} has no bin/ptxas: it must be laid out as a CUDA"
                                     " installation (bin/ptxas, bin/nvlink, nvvm/libdevice)")
            continue
        if abi in loads:
            return NvptxTools(root, origin, abi)
        tried.append(f"{root / 'bin'} ({origin}) writes ABI {abi}")
    if not tried:
        return None
    raise _unloadable(toolchain, tried)


def _unloadable(toolchain: Toolchain, tried: list[str]) -> ToolchainError:
    """The error for NVPTX tools whose cubins the toolchain's OpenMP runtime would not load."""
    runtime = runtime_version(toolchain)
    return ToolchainError(
        f"libomptarget {cubin.version_text(runtime)} (in {toolchain.lib_dir}) loads NVPTX images with cubin ELF"
        f" ABI {' or '.join(map(str, cubin.runtime_abis(runtime)))} only, but {'; '.join(tried)}: its images would"
        f" not load ({cubin.UPSTREAM_ISSUE}, fixed in LLVM 22 and 21.1.2); {INSTALL_HINT}")




def openmp_cuda_path(toolchain: Toolchain) -> Path | None:
    """What OpenMP NVPTX compiles and links get as ``--cuda-path``: the chosen tools' directory."""
    tools = openmp_tools(toolchain)
    return tools.root if tools is not None else toolchain.cuda_path


def openmp_tool(toolchain: Toolchain, name: str) -> Path:
    """``ptxas`` or ``nvlink`` of the chosen tools (the toolchain's lookup, and its error, where none are)."""
    tools = openmp_tools(toolchain)
    if tools is not None:
        return tools.tool(name)
    try:
        found = toolchain.cuda_tool(name)
    except ToolchainError as error:  # no CUDA anywhere: the extra is what an OpenMP build is missing
        raise ToolchainError(f"{error}; for OpenMP NVPTX images: {INSTALL_HINT}") from None
    # Found on PATH only (no CUDA installation, no wheels): its pair must also write cubins the runtime loads.
    root = found.parent.parent
    abi = written_abi(root)
    if abi is not None and abi not in cubin.runtime_abis(runtime_version(toolchain)):
        raise _unloadable(toolchain, [f"{found.parent} (on PATH) writes ABI {abi}"])
    return found


__all__ = ["INSTALL_HINT", "LIBDEVICE", "VARIABLE", "WHEELS", "NvptxTools", "compose_wheel_tools", "nvlink_library",
           "openmp_cuda_path", "openmp_tool", "openmp_tools", "private_directory", "runtime_version",
           "wheel_directories", "written_abi"]
