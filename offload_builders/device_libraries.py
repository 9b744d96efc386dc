"""The GPU device libraries a device compile links, found where the driver looks and where Debian puts them.

Math in a target region (``sin``, ``sqrtf``, ``atan2``) compiles to calls into the vendors' device
libraries, which the Clang 19 driver links into each device compile with ``-mlink-builtin-bitcode``:

* AMDGPU: ROCm's ``ocml.bc`` and the ``oclc_*.bc`` control libraries for the ISA and ABI (HIP adds
  ``ockl.bc`` and ``hip.bc``), from ``--rocm-device-lib-path``, ``$HIP_DEVICE_LIB_PATH``, ``--rocm-path``,
  ``$ROCM_PATH`` or ``<candidate>/amdgcn/bitcode`` for its built-in candidates. Debian's
  ``rocm-device-libs`` puts them in ``/usr/lib/x86_64-linux-gnu/amdgcn/bitcode``, where Clang 19 never
  looks, so there the tool passes ``--rocm-device-lib-path`` itself.
* NVPTX (OpenMP): CUDA's ``libdevice.10.bc`` and the OpenMP device runtime for the architecture,
  ``libomptarget-nvptx-<sm>.bc`` (``libomp-19-dev`` has them in the LLVM ``lib`` directory, which the
  driver does not search either: ``--libomptarget-nvptx-bc-path``).

Nothing is linked at device-link time for these: the driver resolves the math at compile time. Where a
library is missing the device compile gets ``-nogpulib`` (as before), and a device link that then fails
on a math symbol says which library it needs (:func:`missing_library_hint`). Flags the user gives for
device libraries (``-nogpulib`` included) always win: the tool then adds nothing.

This module has no SCons imports.
"""
from __future__ import annotations

import functools
import itertools
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from offload_builders import nvptx_tools
from offload_builders.targets import TargetID
from offload_builders.toolchain import Toolchain

#: Where Debian's ``rocm-device-libs`` installs the ROCm device libraries (not searched by Clang 19).
DEBIAN_ROCM_BITCODE = "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode"
#: The roots Clang 19 searches for ``amdgcn/bitcode`` besides its own prefix and resource directory.
ROCM_ROOT_CANDIDATES = ("/opt/rocm", "/usr/local", "/usr")
#: Where a CUDA installation keeps libdevice.
LIBDEVICE = "nvvm/libdevice/libdevice.10.bc"

#: User flags that choose the device libraries (or none): with one of them we add nothing.
_USER_CHOICE_PREFIXES = {
    "amdgpu": ("-nogpulib", "--rocm-device-lib-path=", "--rocm-path=", "--hip-device-lib="),
    "nvptx": ("-nogpulib", "-nocudalib"),
}
#: Environment variables through which the driver finds ROCm's libraries itself.
_ROCM_ENVIRONMENT = ("HIP_DEVICE_LIB_PATH", "ROCM_PATH")


def _is_rocm_bitcode_dir(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, "ocml.bc"))


@functools.lru_cache(maxsize=16)
def rocm_bitcode_dir(toolchain: Toolchain) -> Path | None:
    """The directory of ROCm's device libraries as the driver finds them (its prefix, resource directory,
    ``/opt/rocm``, ``/usr/local``, ``/usr``), else Debian's multiarch directory; None without one."""
    candidates = [toolchain.bin_dir.parent, toolchain.resource_dir, *map(Path, ROCM_ROOT_CANDIDATES)]
    for root in candidates:
        if _is_rocm_bitcode_dir(str(root / "amdgcn" / "bitcode")):
            return root / "amdgcn" / "bitcode"
    return Path(DEBIAN_ROCM_BITCODE) if _is_rocm_bitcode_dir(DEBIAN_ROCM_BITCODE) else None


def _abi_version(toolchain: Toolchain, flags: Sequence[str]) -> int:
    """The code object version the driver picks the ``oclc_abi_version`` library for (``-mcode-object-version``,
    else Clang 19's library choice for its default: 4; newer Clang defaults to 6)."""
    for flag in reversed(flags):
        if flag.startswith("-mcode-object-version="):
            value = flag.partition("=")[2]
            if value.isdigit():
                return int(value)
    return 4 if toolchain.major <= 19 else 6


def missing_rocm_libraries(directory: Path, target: TargetID, abi_version: int) -> list[str]:
    """The libraries the driver needs from ``directory`` for ``target`` that are not there."""
    isa = re.sub(r"^gfx", "", target.processor)
    needed = ["ocml.bc", f"oclc_isa_version_{isa}.bc", f"oclc_abi_version_{abi_version}00.bc"]
    return [name for name in needed if not (directory / name).is_file()]


def user_chooses(target: TargetID, flags: Iterable[str], environ: Mapping[str, str] | None = None) -> bool:
    """Whether the user's flags (or, for AMDGPU, the environment) already choose ``target``'s device libraries."""
    prefixes = _USER_CHOICE_PREFIXES.get(target.kind, ())
    if any(flag.startswith(prefixes) for flag in flags):
        return True
    environ = os.environ if environ is None else environ
    return target.kind == "amdgpu" and any(environ.get(name) for name in _ROCM_ENVIRONMENT)


def _offload_lto(flags: Sequence[str]) -> bool:
    """Whether ``flags`` make device code bitcode for link-time optimization (the last of ``-foffload-lto[=...]``,
    ``-fopenmp-target-jit`` and ``-fno-offload-lto``): NVPTX then links the OpenMP runtime only at link time."""
    lto = False
    for flag in flags:
        if flag.startswith("-foffload-lto") or flag == "-fopenmp-target-jit":
            lto = True
        elif flag == "-fno-offload-lto":
            lto = False
    return lto


def device_library_flags(toolchain: Toolchain, target: TargetID, flags: Sequence[str],
                         environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The flags we add to ``target``'s device compile so that it links the device libraries as the driver
    would, or ``-nogpulib`` where they are not installed; nothing for the host CPU or where ``flags`` choose."""
    if target.kind not in ("amdgpu", "nvptx") or user_chooses(target, flags, environ):
        return ()
    if target.kind == "amdgpu":
        directory = rocm_bitcode_dir(toolchain)
        if directory is None or missing_rocm_libraries(directory, target, _abi_version(toolchain, flags)):
            return ("-nogpulib",)
        if directory.parent.parent in (toolchain.bin_dir.parent, toolchain.resource_dir,
                                       *map(Path, ROCM_ROOT_CANDIDATES)):
            return ()  # the driver finds them itself
        return (f"--rocm-device-lib-path={directory}",)
    # NVPTX: the OpenMP runtime (not with offload LTO: then it is linked at link time) and libdevice. A flag of
    # the user's for one of them means the user chooses: we add the other where found, never -nogpulib.
    user_runtime = any(flag.startswith("--libomptarget-nvptx-bc-path=") for flag in flags)
    user_cuda = any(flag.startswith("--cuda-path=") for flag in flags)
    added = []
    if not user_runtime and not _offload_lto(flags):
        if (toolchain.lib_dir / f"libomptarget-nvptx-{target.processor}.bc").is_file():
            added.append(f"--libomptarget-nvptx-bc-path={toolchain.lib_dir}")
        elif not user_cuda:
            return ("-nogpulib",)
    if not user_cuda:
        tools = nvptx_tools.openmp_cuda_path(toolchain)  # libdevice and ptxas of images the runtime loads
        if tools is not None and (tools / LIBDEVICE).is_file():
            added.append(f"--cuda-path={tools}")
        elif not user_runtime:
            return ("-nogpulib",)
    return tuple(added)


def linked_libraries(argv: Iterable[object]) -> list[str]:
    """The files a ``-cc1`` job links as device libraries (the values of ``-mlink-builtin-bitcode`` and
    ``-mlink-bitcode-file``), in order: what its output depends on besides its sources."""
    words = [arg if isinstance(arg, str) else None for arg in argv]
    return [value for flag, value in itertools.pairwise(words)
            if flag in ("-mlink-builtin-bitcode", "-mlink-bitcode-file") and value is not None]


_ROCM_ADVICE = ("ROCm's device libraries", "apt-get install rocm-device-libs", "--rocm-device-lib-path=DIR")
def one_command_flags(toolchain: Toolchain, targets: Iterable[TargetID], flags: Sequence[str] = ()) -> list[str]:
    """The device-library flags of :func:`device_library_flags` for all ``targets``, as one driver command
    takes them (each once; ``-nogpulib`` only for the targets that get it, through ``-Xarch_<processor>``),
    so that ``clang++ -fopenmp --offload-arch=...`` compiles what the tool's nodes compile: for comparisons
    and benchmarks against the driver."""
    flags = tuple(flags)
    return merged_target_flags(targets, lambda target: device_library_flags(toolchain, target, flags))


def merged_target_flags(targets: Iterable[TargetID], per_target: Callable[[TargetID], Sequence[str]]) -> list[str]:
    """Each target's flags (``per_target``) as one driver command takes them: each flag once, ``-nogpulib`` only
    for the targets that get it, through ``-Xarch_<processor>``."""
    found: list[str] = []
    for target in targets:
        for flag in per_target(target):
            if flag == "-nogpulib":
                found.extend([f"-Xarch_{target.processor}", flag])
            elif flag not in found:
                found.append(flag)
    return found


#: Symbol prefixes of the device libraries: the library that defines them, what installs it, the flag naming it.
_LIBRARY_OF_PREFIX: tuple[tuple[str, str, str, str, str], ...] = (
    ("__ocml_", "ocml.bc", *_ROCM_ADVICE),
    ("__ockl_", "ockl.bc", *_ROCM_ADVICE),
    ("__oclc_", "the oclc_*.bc control libraries", *_ROCM_ADVICE),
    ("__nv_", "libdevice.10.bc", ("CUDA ($CUDA_PATH/nvvm/libdevice) and the OpenMP runtime's "
                                  "libomptarget-nvptx-<sm>.bc"), "a CUDA toolkit and apt-get install libomp-19-dev",
     "--cuda-path=DIR and --libomptarget-nvptx-bc-path=DIR"),
)
#: How the device links name an undefined symbol: ld.lld (AMDGPU, the host CPU) and nvlink.
_UNDEFINED_SYMBOL = re.compile(r"undefined (?:hidden )?symbol: (\S+)|Undefined reference to '([^']+)'")
#: Where an SCons user names a library directory for a device compile.
SCONS_FLAGS_HINT = "$OFFLOAD_TARGET_FLAGS[target]"


def missing_library_hint(linker_output: str, target: str, where: str = SCONS_FLAGS_HINT) -> str | None:
    """For a device link that failed on device-library symbols, one line naming the symbol, the library and
    what to do (``where`` names the flags of the device compile); None when its output names no such symbol."""
    for match in _UNDEFINED_SYMBOL.finditer(linker_output):
        symbol = match.group(1) or match.group(2)
        for prefix, library, package, install, flag in _LIBRARY_OF_PREFIX:
            if symbol.startswith(prefix):
                return (f"{target}: undefined device-library symbol {symbol}, defined in {library} of {package}, "
                        f"which its device code was compiled without (-nogpulib: not found when it was compiled, "
                        f"or turned off). Install them (Debian: {install}), or name their directory in {where} "
                        f"({flag}), then build again")
    return None


__all__ = [
    "DEBIAN_ROCM_BITCODE",
    "device_library_flags",
    "linked_libraries",
    "merged_target_flags",
    "missing_library_hint",
    "missing_rocm_libraries",
    "one_command_flags",
    "rocm_bitcode_dir",
    "user_chooses",
]
