"""Clang's OffloadBinary (magic ``0x10FF10AD``, version 1): hardened reader and streaming writer.

The layout is the one ``llvm/Object/OffloadBinary.h`` declares for LLVM 15 to 22 (all write version 1)::

    Header      {Magic[4], u32 Version, u64 Size, u64 EntryOffset, u64 EntrySize}      32 bytes
    Entry       {u16 TheImageKind, u16 TheOffloadKind, u32 Flags, u64 StringOffset,
                 u64 NumStrings, u64 ImageOffset, u64 ImageSize}                        40 bytes
    StringEntry {u64 KeyOffset, u64 ValueOffset} x NumStrings                           16 bytes each
    string table (``StringTableBuilder(ELF)``: leading NUL, tail-merged), zero pad to 8
    image, zero pad to 8 (``Size`` is a multiple of 8; binaries are concatenated back to back)

All offsets are relative to the start of the binary. Little-endian throughout.

Reading never trusts a field: every offset and size is checked against the binary and the buffer or file
before it is used, counts are bounded before anything is allocated, and every failure is an
:class:`~offload_builders.errors.OffloadBinaryFormatError` that names the byte offset (absolute in the
file). Images are never loaded while parsing: :class:`OffloadBinary` records where the image lies, and
:meth:`OffloadBinary.copy_image` streams it out.

Writing streams image bytes from their files to the output with ``copy_file_range``/``sendfile`` into a
temporary file next to the output, renamed into place only when everything succeeded.

The numeric values of the kind enums changed between LLVM releases (``OFK_HIP`` is 3 up to LLVM 20 and 4
from 21, ``OFK_SYCL`` = 8 from 21, ``IMG_SPIRV`` = 6 from 22), so everything that maps names to numbers
takes the LLVM version explicitly: see :func:`kind_table`.

Clang's packager orders the string entries by ``DenseMap<StringRef, StringRef>`` iteration order (its
``getImageArguments``), which depends on LLVM's ``hash_value(StringRef)``; :func:`packager_arguments`
reproduces that order exactly (verified against clang-offload-packager 19 and llvm-offload-binary 22), so
our output is byte-identical to Clang's.
"""
from __future__ import annotations

import collections
import enum
import errno
import os
import stat
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, BinaryIO, Union

from offload_builders.errors import OffloadBinaryFormatError

# atomic_output, copy_file_range_stream and write_all stay importable from here (they are in __all__).
from offload_builders.formats._io import CHUNK, atomic_output, copy_file_range_stream, write_all

__all__ = [
    "ALIGNMENT",
    "ENTRY",
    "HEADER",
    "MAGIC",
    "MAX_NUM_STRINGS",
    "MAX_STRING_BYTES",
    "STRING_ENTRY",
    "VERSION",
    "ImageKind",
    "KindTable",
    "OffloadBinary",
    "OffloadKind",
    "OffloadingImage",
    "Record",
    "atomic_output",
    "build_string_table",
    "copy_file_range_stream",
    "densemap_order",
    "encode_offload_binary",
    "iter_offload_binaries",
    "kind_table",
    "llvm_hash_value",
    "offload_binary_prefix",
    "packager_arguments",
    "parse_offload_binary",
    "read_offload_binaries",
    "write_all",
    "write_offload_binaries",
]

MAGIC = b"\x10\xff\x10\xad"
VERSION = 1
ALIGNMENT = 8

#: Upper bound on ``NumStrings`` the reader accepts. Clang's packager takes the strings from one
#: command-line argument, which Linux caps at 128 KiB, so it cannot produce more than ~43k entries;
#: the bound keeps a hostile count from making us allocate millions of tuples.
MAX_NUM_STRINGS = 1 << 16
#: Upper bound on the key and value bytes decoded from one binary (distinct string offsets counted once),
#: so that many entries pointing into one long string cannot blow up time or memory.
MAX_STRING_BYTES = 16 << 20


# --------------------------------------------------------------------------------------------------
# Record layouts, declared once.


class Record:
    """A little-endian on-disk record: one ``struct.Struct`` plus a named tuple with LLVM's field names."""

    def __init__(self, name: str, fields: Sequence[tuple[str, str]]) -> None:
        self.name = name
        self.struct = struct.Struct("<" + "".join(code for _, code in fields))
        self.size = self.struct.size
        self.tuple: type[Any] = collections.namedtuple(name, [f for f, _ in fields])  # type: ignore[misc]
        self.fields = tuple(f for f, _ in fields)
        self.offsets: dict[str, int] = {}
        pos = 0
        for f, c in fields:
            self.offsets[f] = pos
            pos += struct.calcsize("<" + c)

    def unpack(self, data: bytes, offset: int = 0) -> Any:
        """Decode one record from ``data`` at ``offset`` (the caller checked the bounds)."""
        return self.tuple._make(self.struct.unpack_from(data, offset))

    def pack(self, **values: Any) -> bytes:
        """Encode one record; every field must be given, by its LLVM name."""
        return self.struct.pack(*(values[f] for f in self.fields))


HEADER = Record("Header", (("Magic", "4s"), ("Version", "I"), ("Size", "Q"), ("EntryOffset", "Q"), ("EntrySize", "Q")))
ENTRY = Record(
    "Entry",
    (
        ("TheImageKind", "H"),
        ("TheOffloadKind", "H"),
        ("Flags", "I"),
        ("StringOffset", "Q"),
        ("NumStrings", "Q"),
        ("ImageOffset", "Q"),
        ("ImageSize", "Q"),
    ),
)
STRING_ENTRY = Record("StringEntry", (("KeyOffset", "Q"), ("ValueOffset", "Q")))
_MIN_BINARY = HEADER.size + ENTRY.size  # 72: what LLVM's OffloadBinary::create requires at least


# --------------------------------------------------------------------------------------------------
# Kind enumerations: symbolic names plus a per-LLVM-version table of numeric values.


class OffloadKind(enum.Enum):
    """The producer of an image (LLVM ``OffloadKind``); the value is LLVM's ``getOffloadKindName``."""

    NONE = "none"
    OPENMP = "openmp"
    CUDA = "cuda"
    HIP = "hip"
    SYCL = "sycl"


class ImageKind(enum.Enum):
    """The kind of image (LLVM ``ImageKind``); the value is the LLVM enumerator's name."""

    NONE = "IMG_None"
    OBJECT = "IMG_Object"
    BITCODE = "IMG_Bitcode"
    CUBIN = "IMG_Cubin"
    FATBINARY = "IMG_Fatbinary"
    PTX = "IMG_PTX"
    SPIRV = "IMG_SPIRV"


# getImageKind(): the extensions the packager maps to a kind; "spv" maps to nothing even in LLVM 22.1.8.
_EXTENSION_KINDS = {"o": ImageKind.OBJECT, "bc": ImageKind.BITCODE, "cubin": ImageKind.CUBIN,
                    "fatbin": ImageKind.FATBINARY, "s": ImageKind.PTX}
# getImageKindName(): the extension extraction uses. LLVM 22.1.8 has IMG_SPIRV but names it "" (checked:
# llvm-offload-binary 22 extracts it as "<stem>-<triple>-<arch>.0."); LLVM's main branch says "spv".
_KIND_EXTENSIONS = {kind: ext for ext, kind in _EXTENSION_KINDS.items()}


@dataclass(frozen=True)
class KindTable:
    """The numeric values of the kind enums in one LLVM release (they differ between releases)."""

    llvm_version: int
    offload_values: Mapping[OffloadKind, int]
    image_values: Mapping[ImageKind, int]
    image_extensions: Mapping[ImageKind, str]

    def offload_value(self, kind: OffloadKind) -> int:
        """Numeric ``TheOffloadKind`` for ``kind``; ``ValueError`` if this LLVM has no such kind."""
        return _lookup(self.offload_values, kind, f"LLVM {self.llvm_version} has no offload kind {kind.value!r}")

    def offload_kind(self, value: int) -> OffloadKind | None:
        """Symbolic kind of a stored ``TheOffloadKind``, or None when this LLVM gives it no meaning."""
        return _reverse(self.offload_values, value)

    def offload_kind_name(self, value: int) -> str:
        """LLVM's ``getOffloadKindName``: "none" for 0 and for values this release does not know."""
        return (self.offload_kind(value) or OffloadKind.NONE).value

    def offload_value_for_name(self, name: str) -> int:
        """LLVM's ``getOffloadKind(StringRef)`` (the packager's ``kind=``): unknown names give 0."""
        kinds = {kind.value: v for kind, v in self.offload_values.items() if kind is not OffloadKind.NONE}
        return kinds.get(name, 0)

    def image_value(self, kind: ImageKind) -> int:
        """Numeric ``TheImageKind`` for ``kind``; ``ValueError`` if this LLVM has no such kind."""
        return _lookup(self.image_values, kind, f"LLVM {self.llvm_version} has no image kind {kind.value}")

    def image_kind(self, value: int) -> ImageKind | None:
        """Symbolic kind of a stored ``TheImageKind``, or None when this LLVM does not define it."""
        return _reverse(self.image_values, value)

    def image_kind_name(self, value: int) -> str:
        """LLVM's ``getImageKindName`` (the extraction file extension): "" for unknown values."""
        kind = self.image_kind(value)
        return self.image_extensions.get(kind, "") if kind is not None else ""

    def image_value_for_extension(self, extension: str) -> int:
        """LLVM's ``getImageKind(StringRef)``: the packager's extension-based guess, 0 when unknown."""
        kind = _EXTENSION_KINDS.get(extension)
        return self.image_values[kind] if kind is not None else 0


def _lookup(values: Mapping[Any, int], kind: Any, message: str) -> int:
    try:
        return values[kind]
    except KeyError:
        raise ValueError(message) from None


def _reverse(values: Mapping[Any, int], value: int) -> Any:
    return next((kind for kind, v in values.items() if v == value), None)


def kind_table(llvm_version: int) -> KindTable:
    """The enum values of LLVM ``llvm_version`` (15 or later: the releases with OffloadBinary).

    LLVM 15-20: OffloadKind None0 OpenMP1 Cuda2 HIP3; 21+: a bit field OpenMP1 Cuda2 HIP4 SYCL8.
    ImageKind None0 Object1 Bitcode2 Cubin3 Fatbinary4 PTX5, plus SPIRV6 from LLVM 22 (named "" by 22's
    tools, "spv" by LLVM's main branch, which is what releases after 22 are assumed to do).
    """
    if not isinstance(llvm_version, int) or isinstance(llvm_version, bool) or llvm_version < 15:
        raise ValueError(f"unsupported LLVM version {llvm_version!r}: OffloadBinary exists from LLVM 15")
    if llvm_version <= 20:
        offload = {OffloadKind.NONE: 0, OffloadKind.OPENMP: 1, OffloadKind.CUDA: 2, OffloadKind.HIP: 3}
    else:
        offload = {OffloadKind.NONE: 0, OffloadKind.OPENMP: 1, OffloadKind.CUDA: 2, OffloadKind.HIP: 4,
                   OffloadKind.SYCL: 8}
    image = {ImageKind.NONE: 0, ImageKind.OBJECT: 1, ImageKind.BITCODE: 2, ImageKind.CUBIN: 3,
             ImageKind.FATBINARY: 4, ImageKind.PTX: 5}
    extensions = dict(_KIND_EXTENSIONS)
    if llvm_version >= 22:
        image[ImageKind.SPIRV] = 6
    if llvm_version >= 23:
        extensions[ImageKind.SPIRV] = "spv"
    return KindTable(llvm_version, offload, image, extensions)


# --------------------------------------------------------------------------------------------------
# Reproducing Clang's string-entry order: LLVM's hash_value(StringRef) and DenseMap iteration.

_M64 = (1 << 64) - 1
_K0 = 0xC3A5C85C97CB3127
_K1 = 0xB492B66FBE98F273
_K2 = 0x9AE16A3B2F90404F
_K3 = 0xC949D7C7509E6557
_SEED = 0xFF51AFD7ED558CCD  # get_execution_seed() in builds without LLVM_ENABLE_ABI_BREAKING_CHECKS


def _f64(s: bytes, i: int) -> int:
    return int.from_bytes(s[i:i + 8], "little")


def _f32(s: bytes, i: int) -> int:
    return int.from_bytes(s[i:i + 4], "little")


def _rotr(v: int, n: int) -> int:
    return v if n == 0 else ((v >> n) | (v << (64 - n))) & _M64


def _shift_mix(v: int) -> int:
    return v ^ (v >> 47)


def _hash_16(lo: int, hi: int) -> int:
    mul = 0x9DDFEA08EB382D69
    a = ((lo ^ hi) * mul) & _M64
    a ^= a >> 47
    b = ((hi ^ a) * mul) & _M64
    b ^= b >> 47
    return (b * mul) & _M64


def _hash_short(s: bytes, n: int, seed: int) -> int:
    if 4 <= n <= 8:
        return _hash_16((n + (_f32(s, 0) << 3)) & _M64, seed ^ _f32(s, n - 4))
    if 8 < n <= 16:
        a, b = _f64(s, 0), _f64(s, n - 8)
        return _hash_16(seed ^ a, _rotr((b + n) & _M64, n)) ^ b
    if 16 < n <= 32:
        a = (_f64(s, 0) * _K1) & _M64
        b = _f64(s, 8)
        c = (_f64(s, n - 8) * _K2) & _M64
        d = (_f64(s, n - 16) * _K0) & _M64
        return _hash_16((_rotr((a - b) & _M64, 43) + _rotr(c ^ seed, 30) + d) & _M64,
                        (a + _rotr(b ^ _K3, 20) - c + n + seed) & _M64)
    if n > 32:
        z = _f64(s, 24)
        a = (_f64(s, 0) + (n + _f64(s, n - 16)) * _K0) & _M64
        b = _rotr((a + z) & _M64, 52)
        c = _rotr(a, 37)
        a = (a + _f64(s, 8)) & _M64
        c = (c + _rotr(a, 7)) & _M64
        a = (a + _f64(s, 16)) & _M64
        vf = (a + z) & _M64
        vs = (b + _rotr(a, 31) + c) & _M64
        a = (_f64(s, 16) + _f64(s, n - 32)) & _M64
        z = _f64(s, n - 8)
        b = _rotr((a + z) & _M64, 52)
        c = _rotr(a, 37)
        a = (a + _f64(s, n - 24)) & _M64
        c = (c + _rotr(a, 7)) & _M64
        a = (a + _f64(s, n - 16)) & _M64
        wf = (a + z) & _M64
        ws = (b + _rotr(a, 31) + c) & _M64
        r = _shift_mix(((vf + ws) * _K2 + (wf + vs) * _K0) & _M64)
        return (_shift_mix(((seed ^ ((r * _K0) & _M64)) + vs) & _M64) * _K2) & _M64
    if n:
        y = (s[0] + (s[n >> 1] << 8)) & 0xFFFFFFFF
        z = (n + (s[n - 1] << 2)) & 0xFFFFFFFF
        return (_shift_mix((y * _K2 ^ z * _K3 ^ seed) & _M64) * _K2) & _M64
    return _K2 ^ seed


def _mix_32(s: bytes, i: int, a: int, b: int) -> tuple[int, int]:
    a = (a + _f64(s, i)) & _M64
    c = _f64(s, i + 24)
    b = _rotr((b + a + c) & _M64, 21)
    d = a
    a = (a + _f64(s, i + 8) + _f64(s, i + 16)) & _M64
    b = (b + _rotr(a, 44) + d) & _M64
    return (a + c) & _M64, b


def _mix(h: list[int], s: bytes, i: int) -> None:
    h0, h1, h2, h3, h4, h5, h6 = h
    h0 = (_rotr((h0 + h1 + h3 + _f64(s, i + 8)) & _M64, 37) * _K1) & _M64
    h1 = (_rotr((h1 + h4 + _f64(s, i + 48)) & _M64, 42) * _K1) & _M64
    h0 ^= h6
    h1 = (h1 + h3 + _f64(s, i + 40)) & _M64
    h2 = (_rotr((h2 + h5) & _M64, 33) * _K1) & _M64
    h3 = (h4 * _K1) & _M64
    h4 = (h0 + h5) & _M64
    h3, h4 = _mix_32(s, i, h3, h4)
    h5 = (h2 + h6) & _M64
    h6 = (h1 + _f64(s, i + 16)) & _M64
    h5, h6 = _mix_32(s, i + 32, h5, h6)
    h[:] = [h2, h1, h0, h3, h4, h5, h6]  # std::swap(h2, h0)


def llvm_hash_value(data: bytes) -> int:
    """LLVM's 64-bit ``hash_value(StringRef)`` (``hash_combine_range`` of the bytes, fixed seed).

    ``DenseMapInfo<StringRef>::getHashValue`` is its low 32 bits in LLVM 19 and 22 (checked against the
    exported functions of libLLVM 19.1 and 22.1), which is what decides Clang's string-entry order.
    """
    n = len(data)
    if n <= 64:
        return _hash_short(data, n, _SEED)
    seed = _SEED
    h4 = (seed * _K1) & _M64
    h5 = _shift_mix(seed)
    h = [0, seed, _hash_16(seed, _K1), _rotr(seed ^ _K1, 49), h4, h5, _hash_16(h4, h5)]
    _mix(h, data, 0)
    end = n & ~63
    for i in range(64, end, 64):
        _mix(h, data, i)
    if n & 63:
        _mix(h, data, n - 64)
    h0, h1, h2, h3, h4, h5, h6 = h
    return _hash_16((_hash_16(h3, h5) + _shift_mix(h1) * _K1 + h2) & _M64,
                    (_hash_16(h4, h6) + _shift_mix(n) * _K1 + h0) & _M64)


def densemap_order(keys: Iterable[bytes]) -> list[bytes]:
    """Iteration order of an ``llvm::DenseMap<StringRef, ...>`` after inserting ``keys`` in order.

    Models LLVM 19's DenseMap exactly: 64 buckets at first, quadratic probing on the low 32 bits of
    :func:`llvm_hash_value`, doubling (re-inserting in old bucket order) when 3/4 full, no erasures.
    Repeated keys keep their first slot.
    """
    buckets: list[bytes | None] = []
    count = 0

    def slot(table: list[bytes | None], key: bytes) -> int:
        mask = len(table) - 1
        b = (llvm_hash_value(key) & 0xFFFFFFFF) & mask
        probe = 1
        while table[b] is not None and table[b] != key:
            b = (b + probe) & mask
            probe += 1
        return b

    for key in keys:
        if buckets and buckets[slot(buckets, key)] == key:
            continue
        if (count + 1) * 4 >= len(buckets) * 3:
            grown: list[bytes | None] = [None] * max(64, len(buckets) * 2)
            for old in buckets:
                if old is not None:
                    grown[slot(grown, old)] = old
            buckets = grown
        buckets[slot(buckets, key)] = key
        count += 1
    return [k for k in buckets if k is not None]


def packager_arguments(spec: str) -> list[tuple[str, str]]:
    """Parse one ``--image=k=v,...`` the way ``clang-offload-packager`` does, in Clang's order.

    Splits on every ``,`` (empty pieces kept), splits each piece at its first ``=`` (no ``=``: empty
    value), joins the values of a repeated key with ``,``, and returns the pairs in the iteration order
    of Clang's ``DenseMap`` -- the order in which the packager stores the string entries.
    """
    values: dict[str, str] = {}
    order: list[str] = []
    for piece in spec.split(","):
        key, _, value = piece.partition("=")
        if key in values:
            values[key] = values[key] + "," + value
        else:
            values[key] = value
            order.append(key)
    encoded = {_encode_arg(k): k for k in order}
    return [(encoded[k], values[encoded[k]]) for k in densemap_order(list(encoded))]


def _encode_arg(text: str) -> bytes:
    """Bytes of a command-line string as the OS passed them (argv may hold non-UTF-8 bytes)."""
    return text.encode("utf-8", "surrogateescape")


# --------------------------------------------------------------------------------------------------
# StringTableBuilder(ELF) with tail merging.


def build_string_table(strings: Iterable[bytes]) -> tuple[bytes, dict[bytes, int]]:
    """LLVM's ``StringTableBuilder(ELF)`` after ``finalize()``: the table and each string's offset.

    The table starts with a NUL (offset 0 is the empty string). Strings are sorted by their reversed
    bytes, descending (LLVM's multikey radix sort, whose result does not depend on insertion order), and
    a string that is a suffix of the previously placed one shares its bytes (tail merging).
    """
    unique = {s for s in strings if s}
    offsets: dict[bytes, int] = {b"": 0}
    table = bytearray(b"\0")
    previous = b""
    for s in sorted(unique, key=lambda item: item[::-1], reverse=True):
        if previous.endswith(s):
            offsets[s] = len(table) - len(s) - 1
            continue
        offsets[s] = len(table)
        table += s + b"\0"
        previous = s
    return bytes(table), offsets


# --------------------------------------------------------------------------------------------------
# Reading.

Source = Union[bytes, bytearray, memoryview, BinaryIO, str, "os.PathLike[str]"]


class _Reader:
    """Bounded random access to a byte buffer or a seekable binary file, without loading the file."""

    def __init__(self, source: Any) -> None:
        self._owned: BinaryIO | None = None
        self._data: bytes | memoryview | None = None
        self._file: BinaryIO | None = None
        if isinstance(source, (bytes, bytearray, memoryview)):
            self._data = source if isinstance(source, bytes) else memoryview(source).cast("B")
            self.size = len(self._data)
        elif isinstance(source, (str, os.PathLike)):
            self._owned = open(source, "rb")
            self._file = self._owned
            self.size = os.fstat(self._file.fileno()).st_size
        else:
            self._file = source
            self.size = source.seek(0, os.SEEK_END)

    def close(self) -> None:
        if self._owned is not None:
            self._owned.close()

    def read(self, offset: int, count: int) -> bytes:
        """Exactly ``count`` bytes at ``offset``; callers have checked ``offset + count <= size``."""
        if self._data is not None:
            return bytes(self._data[offset:offset + count])
        assert self._file is not None
        self._file.seek(offset)
        data = self._file.read(count)
        if len(data) != count:
            raise OffloadBinaryFormatError(f"file shrank while reading: wanted {count} bytes", offset=offset)
        return data

    def cstring(self, start: int, bound: int, limit: int) -> bytes | None:
        """The bytes from ``start`` up to the first NUL before ``bound``; None if none within ``limit``."""
        stop = min(bound, start + limit + 1)
        if self._data is not None:
            if isinstance(self._data, bytes):
                end = self._data.find(b"\0", start, stop)
                return None if end < 0 else self._data[start:end]
            chunk = bytes(self._data[start:stop])
            end = chunk.find(b"\0")
            return None if end < 0 else chunk[:end]
        parts: list[bytes] = []
        pos = start
        while pos < stop:
            chunk = self.read(pos, min(4096, stop - pos))
            end = chunk.find(b"\0")
            if end >= 0:
                parts.append(chunk[:end])
                return b"".join(parts)
            parts.append(chunk)
            pos += len(chunk)
        return None


@dataclass(frozen=True)
class OffloadBinary:
    """One parsed OffloadBinary: its raw records and decoded strings; the image stays where it is.

    ``offset`` is where the binary starts in its source (a file, or ``data`` when it lives in memory, as
    for bitcode initializers); ``image_offset`` is absolute in that same source.
    """

    offset: int
    header: Any  # HEADER.tuple: Magic, Version, Size, EntryOffset, EntrySize
    entry: Any  # ENTRY.tuple: TheImageKind, TheOffloadKind, Flags, StringOffset, NumStrings, ImageOffset, ImageSize
    strings: tuple[tuple[str, str], ...]
    path: str | None = None
    data: bytes | None = field(default=None, repr=False, compare=False)

    @property
    def size(self) -> int:
        return int(self.header.Size)

    @property
    def end(self) -> int:
        return self.offset + self.size

    @property
    def version(self) -> int:
        return int(self.header.Version)

    @property
    def image_kind(self) -> int:
        return int(self.entry.TheImageKind)

    @property
    def offload_kind(self) -> int:
        return int(self.entry.TheOffloadKind)

    @property
    def flags(self) -> int:
        return int(self.entry.Flags)

    @property
    def image_offset(self) -> int:
        """Absolute offset of the image in the source."""
        return self.offset + int(self.entry.ImageOffset)

    @property
    def image_size(self) -> int:
        return int(self.entry.ImageSize)

    @property
    def string_map(self) -> dict[str, str]:
        """Key to value as LLVM's ``MapVector`` builds it: first position wins, last value wins."""
        result: dict[str, str] = {}
        for key, value in self.strings:
            result[key] = value
        return result

    def string(self, key: str) -> str:
        """LLVM's ``getString``: the value of ``key``, "" when absent."""
        return self.string_map.get(key, "")

    @property
    def triple(self) -> str:
        return self.string("triple")

    @property
    def arch(self) -> str:
        return self.string("arch")

    def image_kind_name(self, llvm_version: int) -> str:
        """The extension LLVM ``llvm_version`` gives this image kind ("" when unknown)."""
        return kind_table(llvm_version).image_kind_name(self.image_kind)

    def offload_kind_name(self, llvm_version: int) -> str:
        """The producer name LLVM ``llvm_version`` gives this offload kind ("none" when unknown)."""
        return kind_table(llvm_version).offload_kind_name(self.offload_kind)

    def _source(self, source: Source | None) -> Any:
        if source is not None:
            return source
        if self.data is not None:
            return self.data
        if self.path is not None:
            return self.path
        raise ValueError("this binary has no recorded source: pass source=")

    def read_image(self, source: Source | None = None) -> bytes:
        """The image bytes, loaded into memory (use :meth:`copy_image` for large images)."""
        src = self._source(source)
        if isinstance(src, (bytes, bytearray, memoryview)):
            return bytes(memoryview(src).cast("B")[self.image_offset:self.image_offset + self.image_size])
        reader = _Reader(src)
        try:
            if self.image_offset + self.image_size > reader.size:
                raise OffloadBinaryFormatError("image runs past the end of the file", path=self.path,
                                               offset=self.image_offset)
            return reader.read(self.image_offset, self.image_size)
        finally:
            reader.close()

    def copy_image(self, dst: BinaryIO | int, source: Source | None = None) -> None:
        """Stream the image into ``dst`` (a binary file or a file descriptor) without loading it."""
        src = self._source(source)
        dst_fd = dst if isinstance(dst, int) else _flushed_fileno(dst)
        if isinstance(src, (bytes, bytearray, memoryview)):
            write_all(dst_fd, memoryview(src).cast("B")[self.image_offset:self.image_offset + self.image_size])
        elif isinstance(src, (str, os.PathLike)):
            with open(src, "rb") as f:
                copy_file_range_stream(f.fileno(), dst_fd, self.image_offset, self.image_size)
        else:
            try:
                src_fd = _flushed_fileno(src)
            except (AttributeError, OSError, ValueError):  # an in-memory stream: copy it in chunks
                src.seek(self.image_offset)
                remaining = self.image_size
                while remaining:
                    chunk = src.read(min(remaining, CHUNK))
                    if not chunk:
                        raise OSError(errno.EIO, "input ended early (did it shrink while being copied?)") from None
                    write_all(dst_fd, chunk)
                    remaining -= len(chunk)
                return
            copy_file_range_stream(src_fd, dst_fd, self.image_offset, self.image_size)


def _flushed_fileno(f: IO[bytes]) -> int:
    flush = getattr(f, "flush", None)
    if flush is not None:
        flush()
    return f.fileno()


def _check_region(start: int, size: int, limit: int, what: str, field_offset: int, base: int,
                  path: str | None) -> None:
    if start > limit or size > limit - start:
        raise OffloadBinaryFormatError(
            f"{what} [{start:#x}, {start + size:#x}) runs past the end of the binary (Size {limit:#x})",
            path=path, offset=base + field_offset)


def _parse_at(reader: _Reader, offset: int, end: int, path: str | None) -> OffloadBinary:
    """Parse and check the binary at ``offset``; ``end`` bounds it (end of section, member or file)."""
    available = end - offset
    if available < _MIN_BINARY:
        raise OffloadBinaryFormatError(
            f"truncated offload binary: {available} bytes left, a header and entry need {_MIN_BINARY}",
            path=path, offset=offset)
    header = HEADER.unpack(reader.read(offset, HEADER.size))
    if header.Magic != MAGIC:
        raise OffloadBinaryFormatError(f"bad magic {header.Magic.hex()} (expected 10ff10ad)", path=path,
                                       offset=offset)
    if header.Version != VERSION:
        raise OffloadBinaryFormatError(f"unsupported offload binary version {header.Version} (only {VERSION})",
                                       path=path, offset=offset + HEADER.offsets["Version"])
    size = header.Size
    if size < _MIN_BINARY or size > available:
        raise OffloadBinaryFormatError(
            f"Size {size:#x} is outside [{_MIN_BINARY:#x}, {available:#x}] (the bytes left)",
            path=path, offset=offset + HEADER.offsets["Size"])
    if header.EntryOffset < HEADER.size or header.EntryOffset > size - ENTRY.size:
        raise OffloadBinaryFormatError(
            f"EntryOffset {header.EntryOffset:#x} does not leave room for the header and a 40-byte entry "
            f"in Size {size:#x}", path=path, offset=offset + HEADER.offsets["EntryOffset"])
    if header.EntrySize < ENTRY.size or header.EntrySize > size - header.EntryOffset:
        raise OffloadBinaryFormatError(
            f"EntrySize {header.EntrySize:#x} is below 40 or runs past Size {size:#x}",
            path=path, offset=offset + HEADER.offsets["EntrySize"])
    entry_at = header.EntryOffset
    entry = ENTRY.unpack(reader.read(offset + entry_at, ENTRY.size))
    eo = ENTRY.offsets

    count = entry.NumStrings
    table_size = 0
    if count:
        if entry.StringOffset > size:
            raise OffloadBinaryFormatError(f"StringOffset {entry.StringOffset:#x} is past Size {size:#x}",
                                           path=path, offset=offset + entry_at + eo["StringOffset"])
        if count > (size - entry.StringOffset) // STRING_ENTRY.size:
            raise OffloadBinaryFormatError(
                f"NumStrings {count} does not fit: {count} 16-byte entries from StringOffset "
                f"{entry.StringOffset:#x} run past Size {size:#x}", path=path,
                offset=offset + entry_at + eo["NumStrings"])
        if count > MAX_NUM_STRINGS:
            raise OffloadBinaryFormatError(f"NumStrings {count} exceeds the limit of {MAX_NUM_STRINGS}",
                                           path=path, offset=offset + entry_at + eo["NumStrings"])
        table_size = count * STRING_ENTRY.size
    _check_region(entry.ImageOffset, entry.ImageSize, size, "image", entry_at + eo["ImageOffset"], offset, path)

    # The records must not overlap one another (LLVM's writer never does that; a reader that allowed it
    # would let one field silently reinterpret another).
    regions = [(0, HEADER.size, "header", None), (entry_at, header.EntrySize, "entry", HEADER.offsets["EntryOffset"])]
    if table_size:
        regions.append((entry.StringOffset, table_size, "string entries", entry_at + eo["StringOffset"]))
    if entry.ImageSize:
        regions.append((entry.ImageOffset, entry.ImageSize, "image", entry_at + eo["ImageOffset"]))
    for i, (a_start, a_size, a_name, _a_field) in enumerate(regions):
        for b_start, b_size, b_name, b_field in regions[i + 1:]:
            if a_start < b_start + b_size and b_start < a_start + a_size:
                raise OffloadBinaryFormatError(
                    f"{b_name} [{b_start:#x}, {b_start + b_size:#x}) would overlap the {a_name} "
                    f"[{a_start:#x}, {a_start + a_size:#x})", path=path, offset=offset + (b_field or 0))

    strings = _read_strings(reader, offset, size, entry, count, regions, path) if count else ()
    return OffloadBinary(offset=offset, header=header, entry=entry, strings=strings, path=path)


def _read_strings(reader: _Reader, offset: int, size: int, entry: Any, count: int,
                  regions: list[tuple[int, int, str, int | None]], path: str | None) -> tuple[tuple[str, str], ...]:
    table = reader.read(offset + entry.StringOffset, count * STRING_ENTRY.size)
    starts = sorted(r[0] for r in regions)
    cache: dict[int, str] = {}
    budget = [MAX_STRING_BYTES]

    def string_at(rel: int, field_at: int, what: str) -> str:
        if rel in cache:
            return cache[rel]
        if rel >= size:
            raise OffloadBinaryFormatError(f"{what} offset {rel:#x} is past Size {size:#x}", path=path,
                                           offset=offset + field_at)
        for r_start, r_size, r_name, _ in regions:
            if r_start <= rel < r_start + r_size:
                raise OffloadBinaryFormatError(f"{what} offset {rel:#x} points into the {r_name}", path=path,
                                               offset=offset + field_at)
        bound = min([s for s in starts if s > rel] + [size])
        raw = reader.cstring(offset + rel, offset + bound, budget[0])
        if raw is None:
            if budget[0] < bound - rel:
                message = f"{what} at {rel:#x}: the strings exceed the limit of {MAX_STRING_BYTES} bytes"
            else:
                message = f"{what} at {rel:#x} is not NUL-terminated before {bound:#x}"
            raise OffloadBinaryFormatError(message, path=path, offset=offset + rel)
        budget[0] -= len(raw) + 1
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise OffloadBinaryFormatError(f"{what} at {rel:#x} is not valid UTF-8 ({exc.reason})", path=path,
                                           offset=offset + rel + exc.start) from None
        cache[rel] = text
        return text

    pairs: list[tuple[str, str]] = []
    for i in range(count):
        se = STRING_ENTRY.unpack(table, i * STRING_ENTRY.size)
        at = entry.StringOffset + i * STRING_ENTRY.size
        key = string_at(se.KeyOffset, at + STRING_ENTRY.offsets["KeyOffset"], f"key {i}")
        value = string_at(se.ValueOffset, at + STRING_ENTRY.offsets["ValueOffset"], f"value {i}")
        pairs.append((key, value))
    return tuple(pairs)


def parse_offload_binary(source: Source, offset: int = 0, end: int | None = None, *,
                         path: str | None = None) -> OffloadBinary:
    """Parse the one binary at ``offset``; ``end`` (default: end of source) bounds it.

    ``source`` is a bytes-like object, a seekable binary file, or a path. Raises
    :class:`OffloadBinaryFormatError` (with the absolute byte offset) for anything malformed.
    """
    source = _as_bytes(source)
    reader = _Reader(source)
    try:
        path = path if path is not None else _path_of(source)
        stop = _bounded_end(reader, offset, end, path)
        return _attach(_parse_at(reader, offset, stop, path), source)
    finally:
        reader.close()


def iter_offload_binaries(source: Source, offset: int = 0, end: int | None = None, *,
                          path: str | None = None) -> Iterator[OffloadBinary]:
    """Parse the back-to-back binaries filling ``[offset, end)`` (a package file or an ELF section).

    Like LLVM 19's ``extractOffloadFiles``: the next binary starts ``Size`` bytes after the previous one,
    and anything that is not a binary there (padding, garbage, a short tail) is an error.
    """
    source = _as_bytes(source)
    reader = _Reader(source)
    try:
        path = path if path is not None else _path_of(source)
        stop = _bounded_end(reader, offset, end, path)
        pos = offset
        while pos < stop:
            binary = _parse_at(reader, pos, stop, path)
            yield _attach(binary, source)
            pos = binary.end
    finally:
        reader.close()


def read_offload_binaries(source: Source, *, path: str | None = None) -> list[OffloadBinary]:
    """All binaries of a package file (or buffer): the concatenation filling the whole source."""
    return list(iter_offload_binaries(source, path=path))


def _path_of(source: Any) -> str | None:
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    name = getattr(source, "name", None)
    return name if isinstance(name, str) else None


def _bounded_end(reader: _Reader, offset: int, end: int | None, path: str | None) -> int:
    stop = reader.size if end is None else end
    if offset < 0 or stop > reader.size or offset > stop:
        raise OffloadBinaryFormatError(f"range [{offset:#x}, {stop:#x}) is outside the {reader.size}-byte input",
                                       path=path, offset=offset)
    return stop


def _as_bytes(source: Any) -> Any:
    """Buffers become ``bytes`` once, so every binary parsed from them can keep a reference, not a copy."""
    if isinstance(source, (bytearray, memoryview)):
        return bytes(source)
    return source


def _attach(binary: OffloadBinary, source: Any) -> OffloadBinary:
    """Keep the buffer of a binary parsed from memory, so its image can be read later."""
    if isinstance(source, bytes):
        return OffloadBinary(binary.offset, binary.header, binary.entry, binary.strings, binary.path, source)
    return binary


# --------------------------------------------------------------------------------------------------
# Writing.

ImageSource = Union[str, "os.PathLike[str]", bytes]


@dataclass(frozen=True)
class OffloadingImage:
    """What to package (LLVM's ``OffloadBinary::OffloadingImage``).

    ``image`` is a path (streamed, never loaded) or the bytes themselves; ``strings`` are the key/value
    pairs in the order the string entries are written (see :func:`packager_arguments` for Clang's).
    """

    image: ImageSource
    image_kind: int
    offload_kind: int
    flags: int = 0
    strings: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for name, value, bits in (("image_kind", self.image_kind, 16), ("offload_kind", self.offload_kind, 16),
                                  ("flags", self.flags, 32)):
            if not isinstance(value, int) or not 0 <= value < (1 << bits):
                raise ValueError(f"{name} {value!r} does not fit in u{bits}")
        keys = [k for k, _ in self.strings]
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate string keys (join repeated values with ',' first)")
        for key, text in self.strings:
            if "\0" in key or "\0" in text:
                raise ValueError(f"string {key!r}={text!r} contains a NUL byte, which version 1 cannot store")


def _string_bytes(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # Command-line arguments that are not UTF-8 reach us as surrogate escapes: store the original bytes
        # as Clang does.
        return text.encode("utf-8", "surrogateescape")


def offload_binary_prefix(image: OffloadingImage, image_size: int) -> tuple[bytes, int]:
    """Everything before the image (header, entry, string entries, string table, padding) and the
    number of zero bytes after it -- exactly what LLVM's ``OffloadBinary::write`` produces."""
    if image_size < 0:
        raise ValueError("negative image size")
    encoded = [(_string_bytes(k), _string_bytes(v)) for k, v in image.strings]
    table, where = build_string_table([s for pair in encoded for s in pair])
    entries_size = STRING_ENTRY.size * len(encoded)
    base = HEADER.size + ENTRY.size + entries_size
    data_size = _align(base + len(table))
    total = _align(data_size + image_size)
    header = HEADER.pack(Magic=MAGIC, Version=VERSION, Size=total, EntryOffset=HEADER.size, EntrySize=ENTRY.size)
    entry = ENTRY.pack(TheImageKind=image.image_kind, TheOffloadKind=image.offload_kind, Flags=image.flags,
                       StringOffset=HEADER.size + ENTRY.size, NumStrings=len(encoded), ImageOffset=data_size,
                       ImageSize=image_size)
    entries = b"".join(STRING_ENTRY.pack(KeyOffset=base + where[k], ValueOffset=base + where[v]) for k, v in encoded)
    prefix = header + entry + entries + table
    return prefix + bytes(data_size - len(prefix)), total - data_size - image_size


def _align(value: int) -> int:
    return (value + ALIGNMENT - 1) & ~(ALIGNMENT - 1)


def encode_offload_binary(image: OffloadingImage) -> bytes:
    """One binary in memory (for small images and tests; :func:`write_offload_binaries` streams)."""
    if isinstance(image.image, bytes):
        payload = image.image
    else:
        with open(image.image, "rb") as f:
            payload = f.read()
    prefix, pad = offload_binary_prefix(image, len(payload))
    return prefix + payload + bytes(pad)


def _llvm_extension(path: str) -> str:
    """``sys::path::extension(path).drop_front()``: text after the last '.' of the file name."""
    name = path.rsplit("/", 1)[-1] or "."
    if name in (".", ".."):
        return ""
    dot = name.rfind(".")
    return "" if dot < 0 else name[dot + 1:]


def packager_images(spec: str, table: KindTable, resolve: Callable[[str], str] = lambda name: name
                    ) -> list[OffloadingImage]:
    """The images one ``clang-offload-packager --image=<spec>`` packages, as the packager builds them.

    ``resolve`` maps a ``file=`` name to the path to read (the CLI spools ``-`` from standard input).
    Bitcode is recognised by its magic whatever the extension (Clang names LTO bitcode ``.o``).
    """
    pairs = packager_arguments(spec)
    values = dict(pairs)
    if "triple" not in values or "file" not in values:
        raise ValueError("'file' and 'triple' are required image arguments")
    strings = tuple((k, v) for k, v in pairs if k not in ("file", "kind"))
    offload_kind = table.offload_value_for_name(values["kind"]) if "kind" in values else 0
    images = []
    for name in values["file"].split(","):
        path = resolve(name)
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic in (b"BC\xc0\xde", b"\xde\xc0\x17\x0b"):
            image_kind = table.image_values[ImageKind.BITCODE]
        else:
            image_kind = table.image_value_for_extension(_llvm_extension(name))
        images.append(OffloadingImage(path, image_kind, offload_kind, 0, strings))
    return images


def write_offload_binaries(images: Iterable[OffloadingImage], output: str | os.PathLike[str]) -> int:
    """Write the concatenation of one binary per image to ``output``; returns the bytes written.

    Image files are streamed (``copy_file_range``, else ``sendfile``, else chunked copies), so memory
    stays flat whatever their size. The output appears atomically: a temporary file next to it is
    renamed over it at the end, and removed if anything fails.
    """
    total = 0
    with atomic_output(output) as out_fd:
        for image in images:
            total += _write_one(image, out_fd)
    return total


def _write_one(image: OffloadingImage, out_fd: int) -> int:
    if isinstance(image.image, bytes):
        prefix, pad = offload_binary_prefix(image, len(image.image))
        write_all(out_fd, prefix)
        write_all(out_fd, image.image)
        write_all(out_fd, bytes(pad))
        return len(prefix) + len(image.image) + pad
    with open(image.image, "rb") as src:
        st = os.fstat(src.fileno())
        if not stat.S_ISREG(st.st_mode):
            # A pipe or device: its size is unknown until read, so spool it to an anonymous file first.
            import shutil
            import tempfile

            with tempfile.TemporaryFile() as spool:
                shutil.copyfileobj(src, spool, CHUNK)
                spool.flush()
                return _write_from_fd(image, spool.fileno(), os.fstat(spool.fileno()).st_size, out_fd)
        return _write_from_fd(image, src.fileno(), st.st_size, out_fd)


def _write_from_fd(image: OffloadingImage, src_fd: int, size: int, out_fd: int) -> int:
    prefix, pad = offload_binary_prefix(image, size)
    write_all(out_fd, prefix)
    copy_file_range_stream(src_fd, out_fd, 0, size)
    write_all(out_fd, bytes(pad))
    return len(prefix) + size + pad
