"""Clang's zstd: compressed bundles (``CCOB``) whose bytes are the ones Clang 19's bundler writes.

LLVM compresses with the system libzstd (long-distance matching on, the whole size pledged); the zstd
bundled with the ``zstandard`` wheel is another release and compresses differently. :func:`compress_file`
therefore streams through the system libzstd where it is installed (Debian: ``libzstd.so.1``, which
Clang's libLLVM links) and falls back to ``zstandard`` elsewhere. Shared by the SCons tool's HIP fat
binaries and ``offload-compile bundle``.
"""
from __future__ import annotations

import ctypes
import functools
import os

from offload_builders.errors import OffloadError
from offload_builders.formats.compressed import CompressedWriter, CompressionOptions, Method


class ZstdBuffer(ctypes.Structure):
    """``ZSTD_inBuffer`` / ``ZSTD_outBuffer``."""

    _fields_ = [("data", ctypes.c_void_p), ("size", ctypes.c_size_t), ("pos", ctypes.c_size_t)]


@functools.cache
def libzstd() -> ctypes.CDLL | None:
    """The system libzstd, which Clang's libLLVM links (Debian: libzstd.so.1); None when absent."""
    try:
        lib = ctypes.CDLL("libzstd.so.1")
    except OSError:
        return None
    lib.ZSTD_createCCtx.restype = ctypes.c_void_p
    lib.ZSTD_freeCCtx.argtypes = [ctypes.c_void_p]
    lib.ZSTD_CCtx_setParameter.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.ZSTD_CCtx_setParameter.restype = ctypes.c_size_t
    lib.ZSTD_CCtx_setPledgedSrcSize.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong]
    lib.ZSTD_CCtx_setPledgedSrcSize.restype = ctypes.c_size_t
    lib.ZSTD_compressStream2.argtypes = [ctypes.c_void_p, ctypes.POINTER(ZstdBuffer), ctypes.POINTER(ZstdBuffer),
                                         ctypes.c_int]
    lib.ZSTD_compressStream2.restype = ctypes.c_size_t
    lib.ZSTD_isError.argtypes = [ctypes.c_size_t]
    lib.ZSTD_getErrorName.argtypes = [ctypes.c_size_t]
    lib.ZSTD_getErrorName.restype = ctypes.c_char_p
    return lib


class ClangZstd:
    """zstd as LLVM 19's ``compression::zstd::compress`` runs it: the system libzstd, long-distance matching
    on, the level set, the whole size pledged. Streaming with the size pledged gives ``ZSTD_compress2``'s
    bytes; the zstd bundled with the ``zstandard`` wheel is another release and compresses differently,
    so this is what makes a compressed ``.hip_fatbin`` byte-identical to Clang's. It stands in for the
    ``compressobj`` of :class:`~offload_builders.formats.compressed.CompressedWriter` (same two methods).
    """

    _LEVEL, _LDM = 100, 160          # ZSTD_c_compressionLevel, ZSTD_c_enableLongDistanceMatching
    _CONTINUE, _END = 0, 2           # ZSTD_e_continue, ZSTD_e_end

    def __init__(self, lib: ctypes.CDLL, level: int, size: int) -> None:
        self.lib = lib
        self.cctx = lib.ZSTD_createCCtx()
        if not self.cctx:
            raise MemoryError("ZSTD_createCCtx failed")
        for call in (lambda: lib.ZSTD_CCtx_setParameter(self.cctx, self._LDM, 1),
                     lambda: lib.ZSTD_CCtx_setParameter(self.cctx, self._LEVEL, level),
                     lambda: lib.ZSTD_CCtx_setPledgedSrcSize(self.cctx, size)):
            self._check(call())
        self.out = ctypes.create_string_buffer(1 << 17)

    def _check(self, code: int) -> int:
        if self.lib.ZSTD_isError(code):
            raise OffloadError(f"zstd: {self.lib.ZSTD_getErrorName(code).decode()}")
        return code

    def _run(self, data: bytes, directive: int) -> bytes:
        source = ctypes.create_string_buffer(data, len(data))
        inb = ZstdBuffer(ctypes.cast(source, ctypes.c_void_p), len(data), 0)
        produced = bytearray()
        while True:
            outb = ZstdBuffer(ctypes.cast(self.out, ctypes.c_void_p), len(self.out), 0)
            remaining = self._check(self.lib.ZSTD_compressStream2(self.cctx, outb, inb, directive))
            produced += self.out.raw[:outb.pos]
            if (remaining == 0 if directive == self._END else inb.pos == inb.size):
                return bytes(produced)

    def compress(self, data: bytes) -> bytes:
        return self._run(data, self._CONTINUE)

    def flush(self) -> bytes:
        try:
            return self._run(b"", self._END)
        finally:
            self.lib.ZSTD_freeCCtx(self.cctx)
            self.cctx = None


def compress_file(plain: str, output: str, options: CompressionOptions) -> None:
    """Wrap the uncompressed bundle ``plain`` into a ``CCOB`` bundle at ``output`` (header, MD5 and size
    checks from :class:`CompressedWriter`; the zstd stream from the system libzstd when it is there)."""
    with open(plain, "rb") as src, open(output, "wb") as out:
        size = os.fstat(src.fileno()).st_size
        lib = libzstd()
        zstd = ClangZstd(lib, options.effective_level, size) if lib is not None and options.method is Method.ZSTD \
            else None
        writer = CompressedWriter(out.fileno(), size, options, zstd=zstd)
        writer.copy_from(src.fileno(), 0, size)
        writer.finish()


__all__ = ["ClangZstd", "ZstdBuffer", "compress_file", "libzstd"]
