"""Device-link NVIDIA cubins in process with ``libnvJitLink`` (the ``nvidia-nvjitlink-cu12`` wheel).

CUDA 13's ``nvlink`` stamps every image it writes with cubin ELF ABI 8, even when its inputs have ABI 7, and
has no option for the old layout, which libomptarget 19 cannot load (:mod:`offload_builders.formats.cubin`).
No wheel ships ``nvlink``; CUDA 12's ``libnvJitLink.so.12`` links the relocatable cubins of CUDA 12's
``ptxas`` into an executable cubin that keeps ABI 7. :mod:`offload_builders.cli.nvlink` puts this behind
``nvlink``'s command line, so ``clang-nvlink-wrapper`` runs it unchanged.

The C API is versioned by symbol (``__nvJitLinkCreate_12_0`` ... ``_12_9``); the ``_12_0`` entry points exist
in every 12.x library and are the ones used here.
"""
from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence

from offload_builders.errors import ToolchainError

#: ``nvJitLinkInputType``: what :func:`link` adds each input as.
INPUT_CUBIN, INPUT_PTX, INPUT_ANY = 1, 2, 10
_SUCCESS = 0
_API = "12_0"


class NvJitLinkError(ToolchainError):
    """libnvJitLink refused an input or the link."""


@functools.lru_cache(maxsize=4)
def _library(path: str) -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL(path)
    except OSError as error:
        raise ToolchainError(f"cannot load {path}: {error}") from None
    handle = ctypes.POINTER(ctypes.c_void_p)
    signatures = {
        "Create": [handle, ctypes.c_uint32, ctypes.POINTER(ctypes.c_char_p)],
        "Destroy": [handle],
        "AddData": [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p],
        "Complete": [ctypes.c_void_p],
        "GetLinkedCubinSize": [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)],
        "GetLinkedCubin": [ctypes.c_void_p, ctypes.c_void_p],
        "GetErrorLogSize": [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)],
        "GetErrorLog": [ctypes.c_void_p, ctypes.c_char_p],
    }
    for name, argtypes in signatures.items():
        function = getattr(lib, f"__nvJitLink{name}_{_API}")
        function.argtypes = argtypes
        function.restype = ctypes.c_int
    return lib


def _call(lib: ctypes.CDLL, name: str, *args: object) -> int:
    return int(getattr(lib, f"__nvJitLink{name}_{_API}")(*args))


def link(library: str, arch: str, inputs: Sequence[tuple[str, bytes, int]], options: Sequence[str] = ()) -> bytes:
    """The executable cubin of ``inputs`` (``(name, bytes, INPUT_*)``) for ``arch`` (``sm_90``), linked by the
    ``libnvJitLink`` at ``library`` with the extra ``options`` (``-g``, ``-O3``, ...)."""
    lib = _library(library)
    words = [f"-arch={arch}", *options]
    argv = (ctypes.c_char_p * len(words))(*(word.encode() for word in words))
    handle = ctypes.c_void_p()
    status = _call(lib, "Create", ctypes.byref(handle), len(words), argv)
    if status != _SUCCESS:
        raise NvJitLinkError(f"nvJitLinkCreate({' '.join(words)}) failed with status {status}")
    try:
        for name, data, kind in inputs:
            status = _call(lib, "AddData", handle, kind, data, len(data), name.encode())
            if status != _SUCCESS:
                raise NvJitLinkError(f"{name}: nvJitLink refused this input (status {status}): {_log(lib, handle)}")
        status = _call(lib, "Complete", handle)
        if status != _SUCCESS:
            raise NvJitLinkError(f"nvJitLink failed to link for {arch} (status {status}): {_log(lib, handle)}")
        size = ctypes.c_size_t()
        _call(lib, "GetLinkedCubinSize", handle, ctypes.byref(size))
        buffer = ctypes.create_string_buffer(size.value)
        if _call(lib, "GetLinkedCubin", handle, buffer) != _SUCCESS:
            raise NvJitLinkError(f"nvJitLink linked for {arch} but gave no cubin: {_log(lib, handle)}")
        return buffer.raw
    finally:
        _call(lib, "Destroy", ctypes.byref(handle))


def _log(lib: ctypes.CDLL, handle: ctypes.c_void_p) -> str:
    size = ctypes.c_size_t()
    if _call(lib, "GetErrorLogSize", handle, ctypes.byref(size)) != _SUCCESS or size.value <= 1:
        return "no error log"
    buffer = ctypes.create_string_buffer(size.value)
    _call(lib, "GetErrorLog", handle, buffer)
    return " ".join(buffer.value.decode(errors="replace").split())


__all__ = ["INPUT_ANY", "INPUT_CUBIN", "INPUT_PTX", "NvJitLinkError", "link"]
