"""Compressed offload bundles (magic ``CCOB``), format versions 1, 2 and 3.

A compressed bundle wraps one whole uncompressed bundle (binary or text) in a single zlib or zstd
stream behind a small header.  Clang writes the header integers in host byte order; every host
Clang targets for this is little-endian, so we read and write little-endian.

Layouts (``CompressedOffloadBundle`` in clang/lib/Driver/OffloadBundler.cpp):

* v1 (LLVM 18): magic, u16 version, u16 method, u32 uncompressed_size, u64 hash   (20 bytes)
* v2 (LLVM 19, its default): magic, u16 version, u16 method, u32 total_file_size, u32
  uncompressed_size, u64 hash                                                       (24 bytes)
* v3 (LLVM 20 opt-in, LLVM 22 default): the two sizes widened to u64                  (32 bytes)

``hash`` is the first eight bytes of the MD5 of the uncompressed bundle.  Clang 19 never checks it;
we do, since a mismatch can only mean corruption.  ``total_file_size`` (v2+) is what lets several
compressed bundles sit back to back in one ``.hip_fatbin`` section.

Everything here streams: compression reads its input piecewise and patches the header at the end,
decompression writes to a file with bounded output per step, so memory stays flat whatever the
size (apart from zstd's window, at most 128 MiB by zstd's default limit).

Decompression can also be lazy (:func:`open_decompressed`): a :class:`DecompressedRegion` decompresses
only as far as a reader has read, so listing the entries of a compressed bundle (whose header is at the
start of the decompressed data) or reading the first bytes of an image costs what they need, not the
declared size, which a few bytes of zstd can make a gigabyte.  A reader that needs far more than that
says so first through the ``notify`` callback (see :data:`ANNOUNCE_BYTES`).
"""
from __future__ import annotations

import enum
import io
import os
import struct

from offload_builders.errors import BundleFormatError
from offload_builders.formats._io import CHUNK, write_all
from offload_builders.formats._record import Record

# typing is imported for type checkers only: it costs the command line ~3 ms of start-up.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import IO, Final, Protocol

    class Compressor(Protocol):
        """A streaming compressor: a zlib or zstandard ``compressobj``, or any stream with these two methods."""

        def compress(self, data: bytes, /) -> bytes: ...

        def flush(self) -> bytes: ...


# hashlib, zlib and zstandard are imported where they are used: reading and writing uncompressed
# bundles (the common case) should not pay for them at start-up.

MAGIC: Final = b"CCOB"

_PREFIX: Final = struct.Struct("<4sHH")  # magic, version, method
_V1: Final = struct.Struct("<4sHHIQ")  # + uncompressed_size, hash
_V2: Final = struct.Struct("<4sHHIIQ")  # + total_file_size, uncompressed_size, hash
_V3: Final = struct.Struct("<4sHHQQQ")  # the same with 64-bit sizes
LAYOUTS: Final[dict[int, struct.Struct]] = {1: _V1, 2: _V2, 3: _V3}
SUPPORTED_VERSIONS: Final = tuple(LAYOUTS)
DEFAULT_VERSION: Final = 2
_U32_MAX: Final = (1 << 32) - 1
#: zstd clamps levels into this range (ZSTD_minCLevel() .. ZSTD_maxCLevel()).
_ZSTD_LEVELS: Final = (-(1 << 17), 22)
#: A lazy reader that must decompress at least this many more bytes in one go says so first (its ``notify``).
ANNOUNCE_BYTES = 64 << 20


class Method(enum.IntEnum):
    """``llvm::compression::Format``: the value stored in the header."""

    ZLIB = 0
    ZSTD = 1

    @property
    def default_level(self) -> int:
        """Clang 19's defaults: zstd level 3 (with long-distance matching), zlib level 6."""
        return 3 if self is Method.ZSTD else 6


class CompressionOptions(Record):
    """How to compress: Clang 19 writes zstd level 3 with long-distance matching, format v2."""

    __slots__ = ("method", "level", "version")
    method: Method
    level: int | None
    version: int

    def __init__(self, method: Method = Method.ZSTD, level: int | None = None, version: int = DEFAULT_VERSION) -> None:
        self._init(method, level, version)
        if self.version not in SUPPORTED_VERSIONS:
            raise ValueError(f"compressed bundle format version {self.version} is not one of 1, 2, 3")
        if self.method is Method.ZLIB and self.level is not None and not -1 <= self.level <= 9:
            raise ValueError(f"zlib compression level {self.level} is outside -1..9")

    @property
    def effective_level(self) -> int:
        if self.level is None:
            return self.method.default_level
        if self.method is Method.ZSTD:
            return min(max(self.level, _ZSTD_LEVELS[0]), _ZSTD_LEVELS[1])
        return self.level


class CompressedHeader(Record):
    """A parsed ``CCOB`` header; ``total_size`` of a v1 bundle is everything up to the end of the data."""

    __slots__ = ("version", "method", "total_size", "uncompressed_size", "hash")
    version: int
    method: Method
    total_size: int
    uncompressed_size: int
    hash: bytes

    def __init__(self, version: int, method: Method, total_size: int, uncompressed_size: int, hash: bytes) -> None:
        self._init(version, method, total_size, uncompressed_size, hash)

    @property
    def header_size(self) -> int:
        return LAYOUTS[self.version].size

    @property
    def compressed_size(self) -> int:
        return self.total_size - self.header_size


class CompressionStats(Record):
    """What ``-verbose`` reports about one compressed bundle."""

    __slots__ = ("header",)
    header: CompressedHeader

    def __init__(self, header: CompressedHeader) -> None:
        self._init(header)

    def describe(self, *, compressing: bool, level: int | None = None) -> list[str]:
        """The lines clang-offload-bundler 19 prints with ``-verbose`` (without timings)."""
        h = self.header
        rate = h.uncompressed_size / h.compressed_size if h.compressed_size else 0.0
        ratio = 100.0 / rate if rate else float("inf")  # C's 100.0 / 0.0, printed "inf" by %.2lf
        method = "zstd" if h.method is Method.ZSTD else "zlib"
        digest = f"{int.from_bytes(h.hash, 'little'):#016x}"  # llvm::format_hex(hash, 16): "0x" counts
        if compressing:
            return [f"Compressed bundle format version: {h.version}",
                    f"Total file size (including headers): {h.total_size:,} bytes",
                    f"Compression method used: {method}",
                    f"Compression level: {level}",
                    f"Binary size before compression: {h.uncompressed_size:,} bytes",
                    f"Binary size after compression: {h.compressed_size:,} bytes",
                    f"Compression rate: {rate:.2f}", f"Compression ratio: {ratio:.2f}%",
                    f"Truncated MD5 hash: {digest}"]
        lines = [f"Compressed bundle format version: {h.version}"]
        if h.version >= 2:
            lines.append(f"Total file size (from header): {h.total_size:,} bytes")
        return lines + [f"Decompression method: {method}",
                        f"Size before decompression: {h.compressed_size:,} bytes",
                        f"Size after decompression: {h.uncompressed_size:,} bytes",
                        f"Compression rate: {rate:.2f}", f"Compression ratio: {ratio:.2f}%",
                        f"Stored hash: {digest}", f"Recalculated hash: {digest}", "Hashes match: Yes"]


def is_compressed(prefix: bytes) -> bool:
    """Does data starting with ``prefix`` claim to be a compressed bundle?"""
    return prefix[:4] == MAGIC


class FileRegion(io.RawIOBase):
    """A read-only, seekable window ``[start, start + size)`` of a file descriptor.

    Lets pyelftools and zstd read part of a file (an archive member, one of several concatenated
    bundles) through ``os.pread`` without copying it or moving the descriptor's position.
    """

    def __init__(self, fd: int, start: int, size: int) -> None:
        super().__init__()
        self.fd, self.start, self.size, self._pos = fd, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer) -> int:
        want = min(len(buffer), self.size - self._pos)
        if want <= 0:
            return 0
        data = os.pread(self.fd, want, self.start + self._pos)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def pread(self, size: int, offset: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` within the region."""
        size = max(0, min(size, self.size - offset))
        return os.pread(self.fd, size, self.start + offset) if size else b""

    def window(self, offset: int, size: int | None = None) -> FileRegion:
        """The region ``[offset, offset + size)`` of this one (to its end when ``size`` is None)."""
        return FileRegion(self.fd, self.start + offset, self.size - offset if size is None else size)

    def ensure(self, end: int, purpose: str | None = None) -> None:
        """Make the region's first ``end`` bytes readable through ``fd`` directly: a file's always are (a
        :class:`DecompressedRegion` decompresses that far; ``purpose`` says why, should it announce it)."""

    def as_binary_io(self) -> IO[bytes]:
        """This region for a library whose annotations ask for ``IO[bytes]`` (zstandard's ``stream_reader``,
        pyelftools' ``ELFFile``): they only read, seek and tell, which a raw stream does, but typeshed does not
        count an ``io.RawIOBase`` as an ``IO[bytes]``."""
        from typing import cast  # not at start-up; zstandard and pyelftools import typing anyway

        return cast("IO[bytes]", self)


def read_header(region: FileRegion, *, path: str | None = None, base_offset: int = 0) -> CompressedHeader:
    """Parse and check the ``CCOB`` header at the start of ``region``.

    ``base_offset`` is where the region starts in the file named ``path``, for error messages.
    Unknown versions and methods, and sizes that do not fit the region, are errors here rather than
    a crash or a huge allocation later.
    """
    def fail(message: str, at: int = 0) -> BundleFormatError:
        return BundleFormatError(message, path=path, offset=base_offset + at)

    head = region.pread(_V3.size, 0)
    if len(head) < _PREFIX.size or head[:4] != MAGIC:
        raise fail("not a compressed bundle (no CCOB magic)")
    _, version, method = _PREFIX.unpack_from(head)
    if version not in LAYOUTS:
        raise fail(f"unsupported compressed bundle format version {version} (this reader knows 1, 2 and 3)", 4)
    layout = LAYOUTS[version]
    if len(head) < layout.size:
        raise fail(f"truncated compressed bundle header: version {version} needs {layout.size} bytes, "
                   f"only {len(head)} remain")
    try:
        method_enum = Method(method)
    except ValueError:
        raise fail(f"unknown compression method {method} (0 is zlib, 1 is zstd)", 6) from None
    if version == 1:
        _, _, _, uncompressed, digest = layout.unpack_from(head)
        total = region.size
    else:
        _, _, _, total, uncompressed, digest = layout.unpack_from(head)
        if total < layout.size:
            raise fail(f"total file size {total} is smaller than the {layout.size}-byte header", 8)
        if total > region.size:
            raise fail(f"total file size {total} runs past the end of the data "
                       f"({region.size} bytes from the header on)", 8)
    return CompressedHeader(version, method_enum, total, uncompressed, struct.pack("<Q", digest))


def decompress_to(region: FileRegion, out, *, path: str | None = None, base_offset: int = 0,
                  verify_hash: bool = True) -> CompressedHeader:
    """Decompress the bundle at the start of ``region`` into the binary file object ``out``.

    The output is bounded by the header's uncompressed size: more data is an error as soon as it
    appears, never an allocation.  Less data, trailing bytes after the stream, and (unless
    ``verify_hash`` is false) a wrong MD5 are errors too.
    """
    header = read_header(region, path=path, base_offset=base_offset)
    for piece in _checked_pieces(region, header, path=path, base_offset=base_offset, verify_hash=verify_hash):
        out.write(piece)
    return header


def _checked_pieces(region: FileRegion, header: CompressedHeader, *, path: str | None, base_offset: int,
                    verify_hash: bool) -> Iterator[bytes]:
    """The decompressed data of the bundle at the start of ``region``, at most ``CHUNK`` bytes a piece, with
    :func:`decompress_to`'s checks: the zstd frames are walked before the first piece; a piece that goes past
    the declared size fails at once; the size and the MD5 are checked after the last piece."""
    payload_at = header.header_size
    payload = FileRegion(region.fd, region.start + payload_at, header.compressed_size)
    size_field = 8 if header.version == 1 else 12

    def fail(message: str, at: int = payload_at) -> BundleFormatError:
        return BundleFormatError(message, path=path, offset=base_offset + at)

    if header.method is Method.ZSTD:
        _check_zstd_frames(payload, lambda message, at: fail(message, payload_at + at))
    return _checked_stream(header, payload, fail, size_field, verify_hash)


def _checked_stream(header: CompressedHeader, payload: FileRegion, fail: Callable[..., BundleFormatError],
                    size_field: int, verify_hash: bool) -> Iterator[bytes]:
    import hashlib
    import zlib

    import zstandard

    digest = hashlib.md5()
    written = 0
    try:
        for piece in _decompressed_pieces(header.method, payload):
            written += len(piece)
            if written > header.uncompressed_size:
                raise fail(f"decompressed data exceeds the declared uncompressed size "
                           f"{header.uncompressed_size}", size_field)
            digest.update(piece)
            yield piece
    except (zstandard.ZstdError, zlib.error) as exc:
        raise fail(f"could not decompress the {header.method.name.lower()} data: {exc}") from None
    if written != header.uncompressed_size:
        raise fail(f"declared uncompressed size {header.uncompressed_size} but the data decompresses "
                   f"to {written} bytes", size_field)
    if verify_hash and digest.digest()[:8] != header.hash:
        raise fail(f"MD5 of the decompressed bundle ({digest.digest()[:8].hex()}) does not match the "
                   f"stored hash ({header.hash.hex()})", header.header_size - 8)


class _Inflation:
    """A compressed bundle being decompressed, on demand, into the file ``fd`` (empty at the start).

    ``produced`` bytes are in ``fd`` so far.  Every check of :func:`decompress_to` applies to what is
    decompressed; those that need the whole stream (the size, trailing data, the MD5) run once it has been
    read to its end, which :meth:`ensure` does as soon as a read reaches the declared size.
    """

    def __init__(self, region: FileRegion, header: CompressedHeader, fd: int, *, path: str | None,
                 base_offset: int, verify_hash: bool, notify: Callable[[str], None] | None) -> None:
        self.fd, self.header, self.path, self.base_offset = fd, header, path, base_offset
        self.produced = 0
        self.finished = False
        self.error: BaseException | None = None
        self.notify = notify
        self._pieces = _checked_pieces(region, header, path=path, base_offset=base_offset, verify_hash=verify_hash)

    def ensure(self, end: int, purpose: str | None = None) -> None:
        """Decompress until the first ``end`` bytes (at most the declared size) are in ``fd``; reaching the
        declared size reads the stream to its end and runs the final checks.  A failure is raised again by
        every later call."""
        if self.error is not None:
            raise self.error
        declared = self.header.uncompressed_size
        end = min(end, declared)
        if self.finished or (end <= self.produced and end < declared):
            return
        if self.notify is not None and end - self.produced >= ANNOUNCE_BYTES:
            where = f"{self.path}: " if self.path else ""
            self.notify(f"{where}decompressing {end - self.produced:,} bytes of the compressed bundle at offset "
                        f"{self.base_offset:#x} (declared uncompressed size {declared:,})"
                        + (f" to {purpose}" if purpose else ""))
        try:
            while self.produced < end:
                piece = next(self._pieces, None)
                if piece is None:  # cannot happen: a short stream fails the size check first
                    raise BundleFormatError(f"the data ends after {self.produced} of {declared} bytes",
                                            path=self.path, offset=self.base_offset)
                write_all(self.fd, piece)
                self.produced += len(piece)
            if self.produced == declared:
                for _ in self._pieces:  # the end of the stream and its checks (more data fails as it appears)
                    pass
                self.finished = True
        except Exception as exc:
            self.error = exc
            raise


class DecompressedRegion(FileRegion):
    """A window of a compressed bundle's decompressed data that decompresses as far as it is read.

    ``fd`` is the temporary file the data goes to; :meth:`pread` and reads through the stream interface
    decompress up to the bytes they return, :meth:`ensure` up to a given end (before reading ``fd``
    directly), :meth:`complete` all of it with every check.
    """

    def __init__(self, inflation: _Inflation, start: int = 0, size: int | None = None) -> None:
        whole = inflation.header.uncompressed_size
        super().__init__(inflation.fd, start, whole - start if size is None else size)
        self.inflation = inflation

    @property
    def produced(self) -> int:
        """Bytes decompressed so far (of the whole bundle, not only this window)."""
        return self.inflation.produced

    def ensure(self, end: int, purpose: str | None = None) -> None:
        self.inflation.ensure(self.start + max(0, min(end, self.size)), purpose)

    def complete(self) -> None:
        """Decompress everything and run every check (size, trailing data, MD5 when asked for)."""
        self.inflation.ensure(self.inflation.header.uncompressed_size)

    def readinto(self, buffer) -> int:
        self.ensure(self._pos + len(buffer))
        return super().readinto(buffer)

    def pread(self, size: int, offset: int) -> bytes:
        if size > 0 and offset < self.size:
            self.ensure(offset + size)
        return super().pread(size, offset)

    def window(self, offset: int, size: int | None = None) -> DecompressedRegion:
        return DecompressedRegion(self.inflation, self.start + offset, self.size - offset if size is None else size)


def open_decompressed(region: FileRegion, fd: int, *, path: str | None = None, base_offset: int = 0,
                      verify_hash: bool = True, notify: Callable[[str], None] | None = None,
                      ) -> tuple[CompressedHeader, DecompressedRegion]:
    """The header of the compressed bundle at the start of ``region``, and its decompressed data as a
    :class:`DecompressedRegion` that decompresses into ``fd`` (an empty file the caller keeps open) only as
    far as it is read.

    The header and the zstd frame headers are checked here; the rest of :func:`decompress_to`'s checks
    apply to what is read, and all of them once everything is (``complete()``).  ``notify`` receives one
    line before a single read decompresses :data:`ANNOUNCE_BYTES` or more.
    """
    header = read_header(region, path=path, base_offset=base_offset)
    inflation = _Inflation(region, header, fd, path=path, base_offset=base_offset, verify_hash=verify_hash,
                           notify=notify)
    return header, DecompressedRegion(inflation)


_ZSTD_MAGIC: Final = 0xFD2FB528
_FCS_SIZES: Final = (0, 2, 4, 8)
_DICT_ID_SIZES: Final = (0, 1, 2, 4)


def _check_zstd_frames(payload: FileRegion, fail) -> None:
    """Walk the zstd frame and block headers: the frames must exactly fill the payload.

    zstd's streaming decoder stops quietly at a partial frame after a complete one; walking the
    headers (a few bytes per 128 KiB block, no decompression) catches that and any truncation,
    and reports where, as Clang's "Src size is incorrect" does not.
    """
    position = 0
    while position < payload.size:
        magic_bytes = payload.pread(8, position)
        if len(magic_bytes) < 4:
            raise fail("truncated zstd frame", position)
        magic = int.from_bytes(magic_bytes[:4], "little")
        if magic & 0xFFFFFFF0 == 0x184D2A50:  # skippable frame
            if len(magic_bytes) < 8:
                raise fail("truncated skippable zstd frame", position)
            position += 8 + int.from_bytes(magic_bytes[4:8], "little")
            continue
        if magic != _ZSTD_MAGIC:
            raise fail("no zstd frame here (data after the compressed stream?)", position)
        descriptor_bytes = payload.pread(1, position + 4)
        if not descriptor_bytes:
            raise fail("truncated zstd frame header", position)
        descriptor = descriptor_bytes[0]
        single_segment = bool(descriptor & 0x20)
        fcs = _FCS_SIZES[descriptor >> 6] or (1 if single_segment else 0)
        position += 5 + (0 if single_segment else 1) + _DICT_ID_SIZES[descriptor & 3] + fcs
        while True:
            block = payload.pread(3, position)
            if len(block) < 3:
                raise fail("zstd frame truncated", position)
            value = int.from_bytes(block, "little")
            block_type, block_size = (value >> 1) & 3, value >> 3
            if block_type == 3:
                raise fail("reserved zstd block type", position)
            position += 3 + (1 if block_type == 1 else block_size)
            if value & 1:
                break
        if descriptor & 0x04:
            position += 4
    if position != payload.size:
        raise fail("the zstd frames run past the end of the payload", payload.size)


def _decompressed_pieces(method: Method, payload: FileRegion):
    """Yield the decompressed data at most ``CHUNK`` bytes at a time, whatever the ratio."""
    import zlib

    import zstandard

    if method is Method.ZSTD:
        reader = zstandard.ZstdDecompressor().stream_reader(payload.as_binary_io(), read_across_frames=True,
                                                            closefd=False)
        while piece := reader.read(CHUNK):
            yield piece
        return
    inflater = zlib.decompressobj()
    position = 0
    pending = b""
    while True:
        if not pending:
            if inflater.eof:
                break
            pending = payload.pread(CHUNK, position)
            position += len(pending)
            if not pending:
                raise zlib.error("the zlib stream ends before its end marker")
        piece = inflater.decompress(pending, CHUNK)
        pending = inflater.unconsumed_tail
        if piece:
            yield piece
        if inflater.eof:
            if inflater.unused_data or pending or position < payload.size:
                raise zlib.error("unexpected data after the end of the zlib stream")
            break


class CompressedWriter:
    """Streams an uncompressed bundle of known size into a ``CCOB`` bundle written to ``fd``.

    The header is written as a placeholder first and patched by :meth:`finish`, once the compressed
    size and the MD5 are known.  Sizes that do not fit the chosen version are refused (v1 and v2
    hold 32-bit sizes; LLVM 19 silently truncated them).  ``zstd`` replaces zstandard's stream for the zstd
    method (the HIP tool passes the system libzstd's, whose bytes are Clang's).
    """

    def __init__(self, fd: int, uncompressed_size: int, options: CompressionOptions, *,
                 zstd: Compressor | None = None) -> None:
        if options.version in (1, 2) and uncompressed_size > _U32_MAX:
            raise BundleFormatError(
                f"uncompressed size {uncompressed_size} exceeds the compressed bundle format version "
                f"{options.version} limit of {_U32_MAX} bytes; use version 3")
        import hashlib
        import zlib

        import zstandard

        self.fd, self.options, self.expected = fd, options, uncompressed_size
        self.start = os.lseek(fd, 0, os.SEEK_CUR)
        self.layout = LAYOUTS[options.version]
        write_all(fd, bytes(self.layout.size))
        self.digest = hashlib.md5()
        self.fed = 0
        self.compressed = 0
        level = options.effective_level
        self._zstd: Compressor | None = None
        self._zlib: Compressor | None = None
        if options.method is not Method.ZSTD:
            self._zlib = zlib.compressobj(level)
        elif zstd is not None:
            self._zstd = zstd
        else:
            params = zstandard.ZstdCompressionParameters.from_level(
                level, source_size=uncompressed_size, enable_ldm=True)
            self._zstd = zstandard.ZstdCompressor(compression_params=params).compressobj(size=uncompressed_size)

    def _stream(self) -> Compressor:
        """The zstd stream if there is one, else zlib's (``__init__`` sets exactly one)."""
        stream = self._zstd if self._zstd is not None else self._zlib
        assert stream is not None
        return stream

    def write(self, data: bytes) -> None:
        """Feed the next piece of the uncompressed bundle."""
        if not data:
            return
        self.fed += len(data)
        self.digest.update(data)
        self._emit(self._stream().compress(data))

    def copy_from(self, fd: int, offset: int, size: int) -> None:
        """Feed ``size`` bytes read from ``fd`` at ``offset``, a chunk at a time."""
        end = offset + size
        while offset < end:
            data = os.pread(fd, min(CHUNK, end - offset), offset)
            if not data:
                raise BundleFormatError(f"input ended {end - offset} bytes early while compressing")
            self.write(data)
            offset += len(data)

    def _emit(self, data: bytes) -> None:
        if data:
            write_all(self.fd, data)
            self.compressed += len(data)

    def finish(self) -> CompressionStats:
        """Flush the stream, check the sizes against the version, and write the real header."""
        if self.fed != self.expected:
            raise BundleFormatError(f"compressed {self.fed} bytes but the bundle is {self.expected} bytes")
        self._emit(self._stream().flush())
        total = self.layout.size + self.compressed
        version = self.options.version
        if version == 2 and total > _U32_MAX:
            raise BundleFormatError(f"total file size {total} exceeds the compressed bundle format "
                                    f"version 2 limit of {_U32_MAX} bytes; use version 3")
        digest = self.digest.digest()[:8]
        hash_value = struct.unpack("<Q", digest)[0]
        method = int(self.options.method)
        if version == 1:
            packed = self.layout.pack(MAGIC, 1, method, self.expected, hash_value)
        else:
            packed = self.layout.pack(MAGIC, version, method, total, self.expected, hash_value)
        os.pwrite(self.fd, packed, self.start)
        header = CompressedHeader(version, self.options.method, total, self.expected, digest)
        return CompressionStats(header)


def compress_bytes(data: bytes, options: CompressionOptions = CompressionOptions()) -> bytes:  # noqa: B008 (immutable)
    """Compress a small in-memory bundle (tests and tools; bundling itself streams)."""
    import tempfile

    with tempfile.TemporaryFile() as tmp:
        writer = CompressedWriter(tmp.fileno(), len(data), options)
        writer.write(data)
        writer.finish()
        tmp.seek(0)
        return tmp.read()


def decompress_bytes(data: bytes, *, verify_hash: bool = True) -> bytes:
    """Decompress a small in-memory ``CCOB`` bundle (tests and tools)."""
    import tempfile

    with tempfile.TemporaryFile() as src:
        src.write(data)
        src.flush()
        out = io.BytesIO()
        decompress_to(FileRegion(src.fileno(), 0, len(data)), out, verify_hash=verify_hash)
        return out.getvalue()
