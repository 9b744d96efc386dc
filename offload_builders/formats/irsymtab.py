"""The symbol table LLVM writes into every bitcode file (``irsymtab``), read without LLVM.

Since LLVM 5, ``WriteBitcodeToFile`` ends a bitcode file with a ``SYMTAB_BLOCK`` holding a binary symbol
table (``llvm/Object/IRSymtab.h``, ``storage::Header``, format version 3) and a ``STRTAB_BLOCK`` holding
its strings. ``clang-linker-wrapper`` decides which device bitcode to link from exactly this table
(``getSymbolsFromBitcode``: ``irsymtab::readBitcode``), and LTO links read it instead of parsing the
module. Reading it here costs a few hundred microseconds a file; parsing the module with LLVM costs a
process and about 50 ms. Only the two blocks are decoded: the bitstream's top-level blocks carry their
length, so the module itself is skipped.

:func:`read_symbols` returns None where a file has no such table, or one of another format version (LLVM
then builds the table from the module, as the caller must).
"""
from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from offload_builders.errors import OffloadFormatError

#: ``storage::Header::kCurrentVersion`` of LLVM 5 to 22.
SYMTAB_VERSION = 3

_WRAPPER_MAGIC = b"\xde\xc0\x17\x0b"  # 0x0B17C0DE, little-endian: the bitcode wrapper header
_BITCODE_MAGIC = b"BC\xc0\xde"
_STRTAB_BLOCK_ID = 23  # bitc::STRTAB_BLOCK_ID
_SYMTAB_BLOCK_ID = 25  # bitc::SYMTAB_BLOCK_ID
_BLOB_RECORD = 1       # bitc::STRTAB_BLOB and bitc::SYMTAB_BLOB
_HEADER = struct.Struct("<I2I2I2I2I2I")  # Version, Producer, Modules, Comdats, Symbols, Uncommons
_SYMBOL = struct.Struct("<6I")            # Name (offset, size), IRName (offset, size), ComdatIndex, Flags


class SymbolFlag(enum.IntFlag):
    """``storage::Symbol::FlagBits`` (after the two visibility bits)."""

    HAS_UNCOMMON = 1 << 2
    UNDEFINED = 1 << 3
    WEAK = 1 << 4
    COMMON = 1 << 5
    INDIRECT = 1 << 6
    USED = 1 << 7
    TLS = 1 << 8
    MAY_OMIT = 1 << 9
    GLOBAL = 1 << 10
    FORMAT_SPECIFIC = 1 << 11
    UNNAMED_ADDR = 1 << 12
    EXECUTABLE = 1 << 13


class Visibility(enum.IntEnum):
    """``GlobalValue::VisibilityTypes``, the low two bits of a symbol's flags."""

    DEFAULT = 0
    HIDDEN = 1
    PROTECTED = 2


@dataclass(frozen=True)
class IRSymbol:
    """One ``storage::Symbol``: its name as the linker sees it and its flags."""

    name: str
    flags: int

    @property
    def visibility(self) -> Visibility:
        return Visibility(self.flags & 3)

    def has(self, flag: SymbolFlag) -> bool:
        return bool(self.flags & flag.value)  # on the plain int: IntFlag's own ``&`` costs ten times as much


class _Bits:
    """LLVM's bitstream: fields packed from the least significant bit of little-endian 32-bit words."""

    def __init__(self, data: bytes, label: str, base: int) -> None:
        self.data, self.label, self.base = data, label, base
        self.pos = 0  # in bits

    def fixed(self, width: int) -> int:
        if width == 0:
            return 0
        end = self.pos + width
        if end > len(self.data) * 8:
            raise OffloadFormatError("bitcode ends inside a field", path=self.label, offset=self.base + self.pos // 8)
        first, last = self.pos // 8, (end + 7) // 8
        value = (int.from_bytes(self.data[first:last], "little") >> (self.pos % 8)) & ((1 << width) - 1)
        self.pos = end
        return value

    def vbr(self, width: int) -> int:
        value, shift, high = 0, 0, 1 << (width - 1)
        while True:
            piece = self.fixed(width)
            value |= (piece & (high - 1)) << shift
            if not piece & high:
                return value
            shift += width - 1
            if shift > 64:
                raise OffloadFormatError("bitcode has an oversized number", path=self.label,
                                         offset=self.base + self.pos // 8)

    def align32(self) -> None:
        self.pos = (self.pos + 31) // 32 * 32

    def skip_bytes(self, count: int) -> None:
        self.pos += count * 8

    def take_bytes(self, count: int) -> bytes:
        start = self.pos // 8
        if start + count > len(self.data):
            raise OffloadFormatError("bitcode ends inside a blob", path=self.label, offset=self.base + start)
        self.pos += count * 8
        return self.data[start:start + count]

    def at_end(self) -> bool:
        return self.pos + 32 > len(self.data) * 8


def _blob(bits: _Bits, width: int) -> bytes | None:
    """The blob of the first blob record of the block just entered (its own abbreviations only)."""
    abbrevs: list[list[tuple[str, int]]] = []
    found: bytes | None = None
    while True:
        code = bits.fixed(width)
        if code == 0:  # END_BLOCK
            bits.align32()
            return found
        if code == 1:  # ENTER_SUBBLOCK: not expected here; skip it whole
            bits.vbr(8)
            bits.vbr(4)
            bits.align32()
            bits.skip_bytes(4 * bits.fixed(32))
        elif code == 2:  # DEFINE_ABBREV
            ops: list[tuple[str, int]] = []
            for _ in range(bits.vbr(5)):
                if bits.fixed(1):
                    ops.append(("literal", bits.vbr(8)))
                else:
                    encoding = bits.fixed(3)
                    kind = {1: "fixed", 2: "vbr", 3: "array", 4: "char6", 5: "blob"}.get(encoding)
                    if kind is None:
                        raise OffloadFormatError(f"bitcode abbreviation with unknown encoding {encoding}",
                                                 path=bits.label, offset=bits.base + bits.pos // 8)
                    size = bits.vbr(5) if kind in ("fixed", "vbr") else 0
                    if size > 32:  # LLVM's MaxChunkSize
                        raise OffloadFormatError(f"bitcode abbreviation with a {size}-bit field", path=bits.label,
                                                 offset=bits.base + bits.pos // 8)
                    # a zero-width field is a literal zero, as LLVM reads it
                    ops.append(("literal", 0) if kind in ("fixed", "vbr") and size == 0 else (kind, size))
            abbrevs.append(ops)
        elif code == 3:  # UNABBREV_RECORD
            bits.vbr(6)
            for _ in range(bits.vbr(6)):
                bits.vbr(6)
        else:
            if code - 4 >= len(abbrevs):
                raise OffloadFormatError(f"bitcode record with undefined abbreviation {code}", path=bits.label,
                                         offset=bits.base + bits.pos // 8)
            values: list[int] = []
            blob: bytes | None = None
            ops = abbrevs[code - 4]
            index = 0
            while index < len(ops):
                kind, width_ = ops[index]
                if kind == "literal":
                    values.append(width_)
                elif kind == "fixed":
                    values.append(bits.fixed(width_))
                elif kind == "vbr":
                    values.append(bits.vbr(width_))
                elif kind == "char6":
                    values.append(bits.fixed(6))
                elif kind == "blob":
                    size = bits.vbr(6)
                    bits.align32()
                    blob = bits.take_bytes(size)
                    bits.align32()
                else:  # array: a count, then that many elements of the next operand's encoding
                    element, element_width = ops[index + 1] if index + 1 < len(ops) else ("", 0)
                    if element not in ("fixed", "vbr", "char6", "literal"):
                        raise OffloadFormatError("bitcode array abbreviation without an element encoding",
                                                 path=bits.label, offset=bits.base + bits.pos // 8)
                    count = bits.vbr(6)
                    for _ in range(count if element != "literal" else 0):  # (literal elements take no bits)
                        bits.fixed(element_width) if element == "fixed" else (
                            bits.vbr(element_width) if element == "vbr" else bits.fixed(6))
                    index += 1
                index += 1
            if values and values[0] == _BLOB_RECORD and blob is not None and found is None:
                found = blob


def _tables(data: bytes, label: str) -> tuple[bytes, bytes] | None:
    """The last symbol table blob and the string table blob after it, or None."""
    base = 0
    if data[:4] == _WRAPPER_MAGIC:
        if len(data) < 20:
            raise OffloadFormatError("bitcode wrapper header is truncated", path=label)
        offset, size = struct.unpack_from("<II", data, 8)
        if offset + size > len(data):
            raise OffloadFormatError("bitcode wrapper names bytes past the end of the file", path=label)
        data, base = data[offset:offset + size], offset
    if data[:4] != _BITCODE_MAGIC:
        raise OffloadFormatError("not LLVM bitcode (no 'BC' 0xC0DE magic)", path=label)
    bits = _Bits(data, label, base)
    bits.skip_bytes(4)
    symtab: bytes | None = None
    strtab: bytes | None = None
    while not bits.at_end():
        if bits.fixed(2) != 1:  # top level: only ENTER_SUBBLOCK (the rest is padding)
            break
        block, width = bits.vbr(8), bits.vbr(4)
        bits.align32()
        words = bits.fixed(32)
        end = bits.pos + 32 * words
        if end > len(data) * 8:
            raise OffloadFormatError(f"bitcode block {block} runs past the end", path=label,
                                     offset=base + bits.pos // 8)
        if block == _SYMTAB_BLOCK_ID:
            symtab, strtab = _blob(bits, width), None
        elif block == _STRTAB_BLOCK_ID:
            strtab = _blob(bits, width)
        bits.pos = end
    return (symtab, strtab) if symtab is not None and strtab is not None else None


def read_symbols(data: bytes, label: str = "<bitcode>") -> list[IRSymbol] | None:
    """Every symbol of the bitcode's symbol table, in its order; None where the file has no table of
    format version :data:`SYMTAB_VERSION`. Malformed bitcode raises :class:`OffloadFormatError`."""
    tables = _tables(data, label)
    if tables is None:
        return None
    symtab, strtab = tables
    if len(symtab) < _HEADER.size:
        return None
    version, _, _, _, _, _, _, symbols_offset, symbols_count, _, _ = _HEADER.unpack_from(symtab)
    if version != SYMTAB_VERSION:
        return None
    if symbols_offset + symbols_count * _SYMBOL.size > len(symtab):
        raise OffloadFormatError("bitcode symbol table is truncated", path=label)
    symbols = []
    for index in range(symbols_count):
        name_offset, name_size, _, _, _, flags = _SYMBOL.unpack_from(symtab, symbols_offset + index * _SYMBOL.size)
        if name_offset + name_size > len(strtab):
            raise OffloadFormatError("bitcode symbol name lies outside the string table", path=label)
        if flags & 3 == 3:  # GlobalValue has three visibilities
            raise OffloadFormatError(f"bitcode symbol {index} has an unknown visibility ({flags & 3})", path=label)
        symbols.append(IRSymbol(strtab[name_offset:name_offset + name_size].decode("utf-8", "surrogateescape"),
                                flags))
    return symbols
