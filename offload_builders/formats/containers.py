"""Finding offload binaries where Clang puts them, and writing the archives ``--archive`` produces.

:func:`extract_offload_binaries` follows LLVM 19's ``object::extractOffloadBinaries`` (which is what
``clang-offload-packager <input>`` and ``clang-linker-wrapper`` use), dispatching on the magic bytes:

* a raw OffloadBinary (``10 FF 10 AD``): the back-to-back binaries filling the file;
* an ELF relocatable object, executable or shared object: every section of type
  ``SHT_LLVM_OFFLOADING`` (``0x6fff4c0b``), found in the section table (:mod:`.elf`);
* a COFF object (no section types there): every section whose name starts with ``.llvm.offloading``;
* an ``ar`` archive (GNU, BSD or thin; nested archives too): every member, recursively, a thin archive's
  read from the files it names, relative to its directory, as the host linker reads them;
* LLVM bitcode (a host object compiled with ``-flto``): each global named by the ``!llvm.embedded.objects``
  metadata with section string ``.llvm.offloading``, read through llvmlite (whose LLVM 22 reads the
  bitcode Clang 19 writes) in a child process, since damaged bitcode can make that LLVM abort, the
  initializer bytes parsed as binaries;
* anything else: nothing, and no error (as in LLVM).

Binaries in files are never loaded: each result records its file and absolute offsets, and
:meth:`FoundBinary.copy_image` streams the image out. Only bitcode initializers live in memory.

Every malformed container ends in :class:`~offload_builders.errors.OffloadFormatError` naming the file
(and archive member) and the byte offset; malformed binaries in
:class:`~offload_builders.errors.OffloadBinaryFormatError`.
"""
from __future__ import annotations

import atexit
import codecs
import enum
import errno
import os
import re
import stat
import struct
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from offload_builders.errors import OffloadError, OffloadFormatError
from offload_builders.formats import _archive
from offload_builders.formats._io import atomic_output, copy_file_range_stream, write_all
from offload_builders.formats.elf import file_reader, read_sections
from offload_builders.formats.offload_binary import MAGIC, OffloadBinary, iter_offload_binaries

__all__ = [
    "SHT_LLVM_OFFLOADING",
    "ArchiveMember",
    "ContainerKind",
    "FoundBinary",
    "Origin",
    "StoredMember",
    "archive_members",
    "archive_symbols",
    "extract_member_binaries",
    "extract_offload_binaries",
    "identify",
    "printable_name",
    "write_archive",
]

SHT_LLVM_OFFLOADING = 0x6FFF4C0B
_MAX_DEPTH = 16  # archives nested (or thin archives referring to archives) deeper than this are refused

_ELF_MAGIC = b"\x7fELF"
_BC_MAGIC = b"BC\xc0\xde"
_BC_WRAPPER_MAGIC = b"\xde\xc0\x17\x0b"
# identify_magic's COFF object machine types (little-endian IMAGE_FILE_MACHINE_*): i386, ARMNT, PA-RISC,
# m68k, AMD64, ARM64, ARM64EC, ARM64X.
_COFF_MAGICS = {b"\x4c\x01", b"\x4c\x02", b"\xc4\x01", b"\xc4\x02", b"\x90\x02", b"\x68\x02", b"\x64\x86",
                b"\x64\xaa", b"\x41\xa6", b"\x4e\xa6"}


class ContainerKind(enum.Enum):
    """What kind of file holds the binaries (LLVM's ``identify_magic`` classes that matter here)."""

    OFFLOAD_BINARY = "offload binary"
    ELF_RELOCATABLE = "ELF relocatable"
    ELF_EXECUTABLE = "ELF executable"
    ELF_SHARED_OBJECT = "ELF shared object"
    COFF_OBJECT = "COFF object"
    ARCHIVE = "archive"
    THIN_ARCHIVE = "thin archive"
    BITCODE = "LLVM bitcode"
    OTHER = "other"


def identify(head: bytes) -> ContainerKind:
    """Classify a file by its first bytes (at least 18 are needed to tell ELF types apart).

    ELF ``ET_DYN`` is reported as a shared object here, as ``identify_magic`` does; the extractor
    refines it to an executable when the file has a ``PT_INTERP`` segment (a PIE).
    """
    if head.startswith(MAGIC):
        return ContainerKind.OFFLOAD_BINARY
    if head.startswith(_archive.AR_MAGIC):
        return ContainerKind.ARCHIVE
    if head.startswith(_archive.THIN_MAGIC):
        return ContainerKind.THIN_ARCHIVE
    if head.startswith(_BC_MAGIC) or head.startswith(_BC_WRAPPER_MAGIC):
        return ContainerKind.BITCODE
    if head.startswith(_ELF_MAGIC) and len(head) >= 18:
        little = head[5] != 2
        e_type = head[16] | (head[17] << 8) if little else (head[16] << 8) | head[17]
        return {1: ContainerKind.ELF_RELOCATABLE, 2: ContainerKind.ELF_EXECUTABLE,
                3: ContainerKind.ELF_SHARED_OBJECT}.get(e_type, ContainerKind.OTHER)
    if head[:2] in _COFF_MAGICS and len(head) >= 20:
        return ContainerKind.COFF_OBJECT
    return ContainerKind.OTHER


@dataclass(frozen=True)
class Origin:
    """Where a binary was found, for messages and for naming what is extracted."""

    file: str  # the file on disk whose bytes hold it (binary offsets are absolute in this file)
    container: ContainerKind  # the innermost container the binary sits in
    members: tuple[str, ...] = ()  # archive member names, outermost first
    section: str | None = None  # ELF section name, or ".llvm.offloading" for bitcode
    symbol: str | None = None  # bitcode: the global whose initializer holds the binary
    display: str | None = None  # how the user named ``file`` (e.g. "-" for standard input)

    @property
    def identifier(self) -> str:
        """LLVM's buffer identifier: the innermost member name, else the input name as given."""
        if self.members:
            return self.members[-1]
        return self.display if self.display is not None else self.file

    def __str__(self) -> str:
        text = _label(self.file, self.members, self.display)
        if self.symbol is not None:
            text += f": global @{printable_name(self.symbol)}"
        if self.section is not None:
            text += f": section {printable_name(self.section)}"
        return text


@dataclass(frozen=True)
class FoundBinary:
    """One offload binary and where it came from."""

    binary: OffloadBinary
    origin: Origin

    @property
    def offset(self) -> int:
        """Absolute offset of the binary in ``origin.file`` (in the initializer, for bitcode)."""
        return self.binary.offset

    def describe(self) -> str:
        """A one-line location, e.g. ``lib.a(x.o): section .llvm.offloading: offset 0x1f8``."""
        where = "initializer offset" if self.binary.data is not None else "offset"
        return f"{self.origin}: {where} {self.binary.offset:#x}"

    def read_image(self) -> bytes:
        """The image bytes (in memory)."""
        return self.binary.read_image(self._source())

    def copy_image(self, dst: BinaryIO | int) -> None:
        """Stream the image into ``dst`` (a binary file or a file descriptor)."""
        self.binary.copy_image(dst, self._source())

    def _source(self) -> Any:
        return self.binary.data if self.binary.data is not None else self.origin.file


# --------------------------------------------------------------------------------------------------
# A window onto part of a file, so pyelftools can read an archive member in place.


class _Window:
    """A read-only, seekable view of ``[start, start + size)`` of an open file."""

    def __init__(self, f: BinaryIO, start: int, size: int) -> None:
        self._f = f
        self._start = start
        self._size = size
        self._pos = 0

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, count: int = -1) -> bytes:
        left = max(0, self._size - self._pos)
        count = left if count is None or count < 0 else min(count, left)
        if count == 0:
            return b""
        self._f.seek(self._start + self._pos)
        data = self._f.read(count)
        self._pos += len(data)
        return data


# --------------------------------------------------------------------------------------------------
# Extraction.


@dataclass
class _Walk:
    include_shared_objects: bool
    results: list[FoundBinary] = field(default_factory=list)


def extract_offload_binaries(path: str | os.PathLike[str], *, include_shared_objects: bool = True,
                             display: str | None = None) -> list[FoundBinary]:
    """Every offload binary in the file at ``path``, in the order LLVM 19 finds them.

    ``include_shared_objects=False`` skips ELF shared objects (not PIE executables), as
    ``clang-linker-wrapper`` does for its inputs. ``display`` is the name to report instead of ``path``
    (e.g. "<stdin>" when the data came from standard input, as LLVM names it). Files that hold no offload
    data give ``[]``.
    """
    fspath = os.fspath(path)
    walk = _Walk(include_shared_objects)
    with open(fspath, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        _extract_region(walk, f, fspath, 0, size, (), display, 0)
    return walk.results


def _extract_region(walk: _Walk, f: BinaryIO, file: str, start: int, size: int, members: tuple[str, ...],
                    display: str | None, depth: int) -> None:
    f.seek(start)
    head = f.read(min(size, 64))
    kind = identify(head)
    if kind is ContainerKind.OFFLOAD_BINARY:
        origin = Origin(file, kind, members, None, None, display)
        for binary in iter_offload_binaries(f, start, start + size, path=_label(file, members, display)):
            walk.results.append(FoundBinary(_with_path(binary, file), origin))
    elif kind in (ContainerKind.ELF_RELOCATABLE, ContainerKind.ELF_EXECUTABLE, ContainerKind.ELF_SHARED_OBJECT):
        _extract_elf(walk, f, file, start, size, members, display, kind)
    elif kind is ContainerKind.COFF_OBJECT:
        _extract_coff(walk, f, file, start, size, members, display)
    elif kind in (ContainerKind.ARCHIVE, ContainerKind.THIN_ARCHIVE):
        if depth >= _MAX_DEPTH:
            raise OffloadFormatError(f"archives nested more than {_MAX_DEPTH} deep",
                                     path=_label(file, members, display), offset=start)
        _extract_archive(walk, f, file, start, size, members, display, depth, kind is ContainerKind.THIN_ARCHIVE)
    elif kind is ContainerKind.BITCODE:
        f.seek(start)
        _extract_bitcode(walk, f.read(size), file, start, members, display)


def _label(file: str, members: tuple[str, ...], display: str | None) -> str:
    """``lib.a(member.o)``: the file as the user named it, then the archive members, outermost first."""
    text = display if display is not None else file
    for member in members:
        text += f"({printable_name(member)})"
    return text


def printable_name(name: str) -> str:
    """A name read from a file (an archive member's, a symbol's), as messages show it: with a control character
    (which could forge a line of output or drive the terminal) or an undecodable byte, escaped as Python does."""
    return name if name.isprintable() else name.encode("unicode_escape", "backslashreplace").decode("ascii")


def _with_path(binary: OffloadBinary, file: str) -> OffloadBinary:
    """The binary with ``path`` set to the real file, so its image can be read from there."""
    return OffloadBinary(binary.offset, binary.header, binary.entry, binary.strings, file, binary.data)


def _extract_elf(walk: _Walk, f: BinaryIO, file: str, start: int, size: int, members: tuple[str, ...],
                 display: str | None, kind: ContainerKind) -> None:
    label = _label(file, members, display)
    table = read_sections(file_reader(f.fileno(), start), size, path=label, base=start)
    if kind is ContainerKind.ELF_SHARED_OBJECT and table.has_interpreter:
        kind = ContainerKind.ELF_EXECUTABLE
    if kind is ContainerKind.ELF_SHARED_OBJECT and not walk.include_shared_objects:
        return
    for section in table.sections:
        if section.sh_type != SHT_LLVM_OFFLOADING:
            continue
        offset, length = section.sh_offset, section.sh_size
        if offset > size or length > size - offset:
            raise OffloadFormatError(f"section {section.name} [{offset:#x}, {offset + length:#x}) runs past the end "
                                     f"of the file ({size:#x} bytes)", path=label, offset=start + offset)
        origin = Origin(file, kind, members, section.name, None, display)
        for binary in iter_offload_binaries(f, start + offset, start + offset + length, path=label):
            walk.results.append(FoundBinary(_with_path(binary, file), origin))


# --- COFF objects -----------------------------------------------------------------------------------

_COFF_HEADER = struct.Struct("<HHIIIHH")  # Machine, NumberOfSections, TimeDateStamp, PointerToSymbolTable,
#                                           NumberOfSymbols, SizeOfOptionalHeader, Characteristics
_COFF_SECTION = struct.Struct("<8sIIIIIIHHI")  # Name, VirtualSize, VirtualAddress, SizeOfRawData,
#                          PointerToRawData, PointerToRelocations, PointerToLinenumbers, NumberOf..., Characteristics
_BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _extract_coff(walk: _Walk, f: BinaryIO, file: str, start: int, size: int, members: tuple[str, ...],
                  display: str | None) -> None:
    """Sections named ``.llvm.offloading*`` of a COFF object (LLVM's ``extractFromObject``)."""
    label = _label(file, members, display)
    f.seek(start)
    _machine, count, _stamp, symbols_at, symbol_count, optional, _flags = _COFF_HEADER.unpack(f.read(_COFF_HEADER.size))
    table = _COFF_HEADER.size + optional
    if table > size or count > (size - table) // _COFF_SECTION.size:
        raise OffloadFormatError(f"COFF section table ({count} sections) runs past the end of the file", path=label,
                                 offset=start + table)
    strings_at = symbols_at + 18 * symbol_count  # the string table follows the symbol table
    f.seek(start + table)
    raw_table = f.read(count * _COFF_SECTION.size)
    for index in range(count):
        at = start + table + index * _COFF_SECTION.size
        raw_name, _vsize, _vaddr, length, offset, *_rest = _COFF_SECTION.unpack_from(raw_table,
                                                                                     index * _COFF_SECTION.size)
        name = _coff_section_name(f, raw_name, start, size, strings_at, label, at)
        if not name.startswith(b".llvm.offloading"):
            continue
        if offset > size or length > size - offset:
            raise OffloadFormatError(f"section {name.decode(errors='replace')} data "
                                     f"[{offset:#x}, {offset + length:#x}) runs past the end of the file",
                                     path=label, offset=at + 20)
        section_name = name.decode("utf-8", "surrogateescape")
        origin = Origin(file, ContainerKind.COFF_OBJECT, members, section_name, None, display)
        for binary in iter_offload_binaries(f, start + offset, start + offset + length, path=label):
            walk.results.append(FoundBinary(_with_path(binary, file), origin))


def _coff_section_name(f: BinaryIO, raw: bytes, start: int, size: int, strings_at: int, label: str, at: int) -> bytes:
    """A section name: inline (8 bytes, NUL-padded) or ``/decimal`` / ``//base64`` into the string table."""
    if not raw.startswith(b"/"):
        return raw.rstrip(b"\0")
    text = raw[1:].rstrip(b"\0").decode("latin-1")
    try:
        if text.startswith("/"):
            index = 0
            for char in text[1:]:
                index = index * 64 + _BASE64.index(char)
        else:
            index = int(text)
    except ValueError:
        raise OffloadFormatError(f"bad COFF long section name {raw!r}", path=label, offset=at) from None
    position = strings_at + index
    if position >= size:
        raise OffloadFormatError(f"COFF section name offset {index} is past the end of the file", path=label, offset=at)
    f.seek(start + position)
    chunk = f.read(min(4096, size - position))
    end = chunk.find(b"\0")
    if end < 0:
        raise OffloadFormatError("COFF section name is not NUL-terminated", path=label, offset=start + position)
    return chunk[:end]


# --- ar archives ----------------------------------------------------------------------------------


def _iter_archive(f: BinaryIO, file: str, start: int, size: int, members: tuple[str, ...], display: str | None,
                  thin: bool) -> Iterator[tuple[str, int, int, int]]:
    """``(name, header offset, data offset, size)`` of the regular members of the archive at
    ``[start, start + size)``, with bounds checked."""
    label = _label(file, members, display)

    def pread(count: int, offset: int) -> bytes:
        f.seek(offset)
        return f.read(count)

    def fail(message: str, offset: int) -> OffloadFormatError:
        return OffloadFormatError(message, path=label, offset=offset)

    for name, header_offset, data_offset, length in _archive.iter_members(pread, start, start + size, fail, thin=thin):
        yield name.decode("utf-8", "surrogateescape"), header_offset, data_offset, length


def _extract_archive(walk: _Walk, f: BinaryIO, file: str, start: int, size: int, members: tuple[str, ...],
                     display: str | None, depth: int, thin: bool) -> None:
    for member in _archive_contents(f, file, start, size, members, display, thin):
        _extract_member(walk, f, member, members, display, depth)


@dataclass(frozen=True)
class StoredMember:
    """One member of an archive as the host linker reads it: ``size`` bytes at ``offset`` of ``file``, which
    is the archive itself, or, in a thin archive, the file the member names."""

    archive: str  # the archive's label, as the user named it (``lib.a``, or ``outer.a(lib.a)``)
    name: str  # the member's name in the archive (a path, in a thin archive)
    file: str
    offset: int
    size: int
    thin: bool = False

    @property
    def label(self) -> str:
        """``lib.a(x.o)``, as the linkers name a member in their messages."""
        return f"{self.archive}({printable_name(self.name)})"


def _archive_contents(f: BinaryIO, file: str, start: int, size: int, members: tuple[str, ...], display: str | None,
                      thin: bool) -> list[StoredMember]:
    """The members of the archive at ``[start, start + size)`` of ``file``, a thin one's resolved to its files."""
    label = _label(file, members, display)
    contents = []
    for name, header_offset, data_offset, length in list(_iter_archive(f, file, start, size, members, display, thin)):
        if thin:
            target, length = _thin_member_file(file, name, label, header_offset)
            contents.append(StoredMember(label, name, target, 0, length, thin=True))
        else:
            contents.append(StoredMember(label, name, file, data_offset, length))
    return contents


def _thin_member_file(archive: str, name: str, label: str, header_offset: int) -> tuple[str, int]:
    """Where a thin archive's member is (LLVM's ``getFullName``: its path, relative to the archive's directory)
    and its size; a member that is missing or no regular file is one error naming the archive and the member."""
    target = name if os.path.isabs(name) else os.path.join(os.path.dirname(archive), name)
    try:
        with _open_regular(target) as f:
            return target, os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        problem = f"is missing (no file {target!r})"
    except OSError as exc:
        problem = f"cannot be read ({target!r}: {exc.strerror})"
    raise OffloadFormatError(f"thin archive member {name!r} {problem}", path=label, offset=header_offset)


def _open_regular(path: str) -> BinaryIO:
    """``path`` opened for reading if it is a regular file: a FIFO or a device named by a thin archive would
    block or never end (opened without blocking, then checked, so a file swapped in between is caught)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _extract_member(walk: _Walk, f: BinaryIO, member: StoredMember, members: tuple[str, ...], display: str | None,
                    depth: int) -> None:
    """The binaries of one member: a regular archive's in place in ``f`` (named after it), a thin one's in its file."""
    if member.thin:
        _extract_thin_member(walk, member, depth)
    else:
        _extract_region(walk, f, member.file, member.offset, member.size, members + (member.name,), display, depth + 1)


def _extract_thin_member(walk: _Walk, member: StoredMember, depth: int) -> None:
    try:
        inner = _open_regular(member.file)
    except OSError as exc:  # removed or replaced since it was listed
        raise OffloadFormatError(f"thin archive member {member.name!r} cannot be read ({exc.strerror})",
                                 path=member.archive) from None
    with inner:
        _extract_region(walk, inner, member.file, 0, os.fstat(inner.fileno()).st_size, (), None, depth + 1)


def archive_members(path: str | os.PathLike[str]) -> list[StoredMember]:
    """The members of the archive at ``path``, as the host linker reads them: a regular archive's in place, a
    thin archive's in the files they name (relative to the archive's directory). Member archives are not
    opened. Not an archive, a damaged one, or a thin member whose file is missing: OffloadFormatError."""
    fspath = os.fspath(path)
    with open(fspath, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        kind = identify(f.read(64))
        if kind not in (ContainerKind.ARCHIVE, ContainerKind.THIN_ARCHIVE):
            raise OffloadFormatError("not an archive (no !<arch> or !<thin> magic)", path=fspath, offset=0)
        return _archive_contents(f, fspath, 0, size, (), None, kind is ContainerKind.THIN_ARCHIVE)


def extract_member_binaries(member: StoredMember, *, include_shared_objects: bool = True) -> list[FoundBinary]:
    """The offload binaries of one member that :func:`archive_members` listed, exactly as
    :func:`extract_offload_binaries` finds them in the whole archive (so a caller can tell which member each
    binary came from). Only for members of an archive named by its path (not one nested in another)."""
    walk = _Walk(include_shared_objects)
    if member.thin:
        _extract_thin_member(walk, member, 0)
    else:
        with open(member.file, "rb") as f:
            _extract_member(walk, f, member, (), None, 0)
    return walk.results


# --- LLVM bitcode ---------------------------------------------------------------------------------

_NAMED_MD = re.compile(r"^!llvm\.embedded\.objects = !\{(.*)\}$", re.M)
_MD_NODE = re.compile(r"^!(\d+) = (?:distinct )?!\{(.*)\}$", re.M)
_GLOBAL_NAME = r'@(?:"(?:[^"\\]|\\[0-9A-Fa-f]{2})*"|[-a-zA-Z$._0-9]+)'
_EMBED_OPERANDS = re.compile(r'^ptr (' + _GLOBAL_NAME + r'), !"((?:[^"\\]|\\[0-9A-Fa-f]{2})*)"(?:,|$)')
_INT_ARRAY = re.compile(r"^\[(\d+) x i(8|16|32|64)\] \[(.*)\]")


def _unescape_ir(text: str) -> bytes:
    """Decode LLVM's printed string escapes (``\\XX`` hex; everything else is printable ASCII)."""
    raw = text.encode("latin-1")
    if b"\\" not in raw:
        return raw
    return codecs.escape_decode(raw.replace(b"\\", b"\\x"))[0]


# llvmlite's LLVM is built with assertions, and damaged bitcode that passes the reader's own checks can
# fail one (``SmallVector`` index out of range, a flipped bit in a type table): ``abort()`` kills the
# whole process, which no ``except`` can catch.  So bitcode is never parsed in our process: a child
# Python parses it with llvmlite and sends back what we need (the printed module, or the archive symbol
# names), and a child that dies becomes an OffloadFormatError.  No in-process fast path is kept: the
# aborts come from bit flips deep inside structurally valid bitstreams (the cheap checks below cannot
# rule them out), and the child costs about what the in-process path did, because importing llvmlite
# (~40 ms) dominates both; the child adds one interpreter start-up (~20 ms) per process, since it
# stays up and serves every later request (an archive of many -flto members starts it once).

#: The child's program (standard library and llvmlite only, so it starts fast and needs no path set-up).
#: Request: 1 byte ("M" printed module, "S" symbol names, "L" linker symbols), u64 size, the bitcode; reply:
#: u64 size, then
#: ``marshal`` of ``(True, result)`` or ``(False, LLVM's error message)``.
_BITCODE_CHILD = r"""
import marshal, sys
import llvmlite.binding as llvm
source, sink = sys.stdin.buffer, sys.stdout.buffer
sys.stdout = sys.stderr  # nothing but replies may reach the pipe
local = (llvm.Linkage.internal, llvm.Linkage.private, llvm.Linkage.available_externally)

def symbols(module):
    # what LLVM's archive writer lists (ModuleSymbolTable): defined, non-local, not llvm.*
    names = []
    for value in list(module.functions) + list(module.global_variables):
        if value.is_declaration or value.linkage in local or value.name.startswith("llvm."):
            continue
        if not value.is_function and 'section "llvm.metadata"' in str(value):
            continue
        names.append(value.name.removeprefix("\x01"))
    return names

weak = (llvm.Linkage.weak_any, llvm.Linkage.weak_odr, llvm.Linkage.linkonce_any, llvm.Linkage.linkonce_odr,
        llvm.Linkage.common, llvm.Linkage.external_weak)

def linker_symbols(module):
    # what the device-code selection needs: (name, undefined, weak, hidden) of each non-local global
    return [(v.name, v.is_declaration, v.linkage in weak, v.visibility == llvm.Visibility.hidden)
            for v in list(module.functions) + list(module.global_variables)
            if v.linkage not in local and v.name and not v.name.startswith("llvm.")]

readers = {b"M": str, b"S": symbols, b"L": linker_symbols}

while True:
    head = source.read(9)
    if len(head) < 9:
        break
    data = source.read(int.from_bytes(head[1:], "little"))
    context = llvm.create_context()
    try:
        module = llvm.parse_bitcode(data, context=context)
        try:
            reply = (True, readers[head[:1]](module))
        finally:
            module.close()
    except Exception as exc:
        reply = (False, " ".join(str(exc).split("\n")[1:] or [str(exc)]).strip())
    finally:
        context.close()
    payload = marshal.dumps(reply)
    sink.write(len(payload).to_bytes(8, "little") + payload)
    sink.flush()
"""

#: Seconds a child may take over one bitcode file before it is killed (LLVM reads tens of MB/s).
BITCODE_TIMEOUT = 300.0


class _BitcodeChild:
    """The child process that parses bitcode, started on first use and kept for the next request.

    One per process (a forked process starts its own), requests serialized by a lock (SCons builds
    with threads); it exits when our end of its standard input closes, at the latest when we exit.
    """

    _lock = threading.Lock()
    _current: _BitcodeChild | None = None

    def __init__(self) -> None:
        import subprocess
        import tempfile

        if not sys.executable:
            raise OSError("no Python interpreter (sys.executable is empty) to read LLVM bitcode with")
        self.pid = os.getpid()
        self.errors = tempfile.TemporaryFile()  # LLVM's assertion message, read only after a crash
        self.process = subprocess.Popen([sys.executable, "-P", "-c", _BITCODE_CHILD], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.errors, close_fds=True)

    @classmethod
    def request(cls, op: bytes, data: bytes) -> tuple[bool, Any]:
        """``(True, result)``, ``(False, LLVM's message)``; raises ``_ChildDied`` with the reason."""
        with cls._lock:
            child = cls._current
            if child is None or child.pid != os.getpid() or child.process.poll() is not None:
                child = cls._current = cls()
            try:
                return child._exchange(op, data)
            except _ChildDied:
                cls._current = None
                child.close()
                raise

    def _exchange(self, op: bytes, data: bytes) -> tuple[bool, Any]:
        import marshal

        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(op + len(data).to_bytes(8, "little"))
            self.process.stdin.write(data)
            self.process.stdin.flush()
        except BrokenPipeError:
            raise self._death() from None
        head = self._read(8)
        reply = marshal.loads(self._read(int.from_bytes(head, "little")))
        return bool(reply[0]), reply[1]

    def _read(self, count: int) -> bytes:
        import select

        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        chunks: list[bytes] = []
        while count:
            ready, _, _ = select.select([fd], [], [], BITCODE_TIMEOUT)
            if not ready:
                self.process.kill()
                raise _ChildDied(f"LLVM did not finish reading it in {BITCODE_TIMEOUT:g} s", crashed=True)
            chunk = os.read(fd, min(count, 1 << 20))
            if not chunk:
                raise self._death()
            chunks.append(chunk)
            count -= len(chunk)
        return b"".join(chunks)

    def _death(self) -> _ChildDied:
        """Why the child stopped: the signal, and LLVM's last message (its assertion) if it wrote one."""
        import signal

        status = self.process.wait()
        self.errors.seek(0)
        lines = [line.strip() for line in self.errors.read()[-4096:].decode("utf-8", "replace").splitlines()]
        lines = [line for line in lines if line and not line.startswith(("#", "Stack dump", "0x"))]
        if status < 0:
            try:
                how = f"LLVM crashed ({signal.Signals(-status).name})"
            except ValueError:
                how = f"LLVM crashed (signal {-status})"
        else:  # not the bitcode's fault: llvmlite missing, out of memory, ...
            how = f"the bitcode reader ({sys.executable} with llvmlite) exited with status {status}"
        # "python3: <path>/SmallVector.h:297: <signature>: Assertion `idx < size()' failed."
        last = next((line[line.index("Assertion"):] for line in reversed(lines) if "Assertion" in line),
                    lines[-1] if lines else "")
        return _ChildDied(f"{how}: {last}" if last else how, crashed=status < 0)

    def close(self) -> None:
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        try:
            self.process.wait(timeout=5)
        except Exception:  # noqa: BLE001 - a child that ignores end of input is killed
            self.process.kill()
            self.process.wait()
        self.errors.close()

    @classmethod
    def shutdown(cls) -> None:
        with cls._lock:
            child, cls._current = cls._current, None
        if child is not None and child.pid == os.getpid():
            child.close()


atexit.register(_BitcodeChild.shutdown)


class _ChildDied(Exception):
    """The bitcode child stopped without replying; the message says why.  ``crashed``: LLVM died on the
    input (a signal, or our time limit), rather than the child failing to start or run at all."""

    def __init__(self, message: str, *, crashed: bool) -> None:
        super().__init__(message)
        self.crashed = crashed


def _check_bitcode_framing(data: bytes, label: str, offset: int) -> None:
    """What can be checked without LLVM: the wrapper header's bounds and the bitcode magic after it."""
    start = 0
    if data.startswith(_BC_WRAPPER_MAGIC):
        if len(data) < 20:
            raise OffloadFormatError(f"malformed LLVM bitcode: the wrapper header needs 20 bytes, the file has "
                                     f"{len(data)}", path=label, offset=offset)
        start, size = struct.unpack_from("<II", data, 8)
        if start + size > len(data):
            raise OffloadFormatError(f"malformed LLVM bitcode: the wrapper header puts the bitcode at "
                                     f"[{start:#x}, {start + size:#x}), past the end ({len(data):#x} bytes)",
                                     path=label, offset=offset + 8)
    if data[start:start + 4] != _BC_MAGIC:
        raise OffloadFormatError("malformed LLVM bitcode: no 'BC' 0xC0DE magic", path=label, offset=offset + start)


_BITCODE_REQUESTS = {"module": b"M", "symbols": b"S", "linker symbols": b"L"}


def _read_bitcode(what: str, data: bytes, label: str, offset: int | None) -> Any:
    """Read in the child: the printed module (``what="module"``), the symbol names an archive's symbol
    table lists (``"symbols"``), or ``(name, undefined, weak, hidden)`` of each global (``"linker symbols"``)."""
    _check_bitcode_framing(data, label, offset or 0)
    try:
        ok, result = _BitcodeChild.request(_BITCODE_REQUESTS[what], data)
    except _ChildDied as exc:
        kind = "malformed LLVM bitcode" if exc.crashed else "cannot read LLVM bitcode"
        raise OffloadFormatError(f"{kind}: {exc}", path=label, offset=offset) from None
    if not ok:
        raise OffloadFormatError(f"malformed LLVM bitcode: {result}", path=label, offset=offset)
    return result


def _embedded_objects(data: bytes, label: str, offset: int) -> list[tuple[str, bytes]]:
    """``(global name, initializer bytes)`` for each ``!llvm.embedded.objects`` entry naming
    ``.llvm.offloading``, skipping what LLVM's ``extractFromBitcode`` skips."""
    text = _read_bitcode("module", data, label, offset)
    named = _NAMED_MD.search(text)
    if named is None:
        return []
    nodes = {int(m.group(1)): m.group(2) for m in _MD_NODE.finditer(text)}
    result: list[tuple[str, bytes]] = []
    for ref in re.findall(r"!(\d+)", named.group(1)):
        operands = nodes.get(int(ref))
        if operands is None:
            continue
        m = _EMBED_OPERANDS.match(operands)
        if m is None or _unescape_ir(m.group(2)) != b".llvm.offloading":
            continue
        printed = m.group(1)
        definition = re.search("^" + re.escape(printed) + r" = (.*)$", text, re.M)
        if definition is None:
            continue
        initializer = _initializer(definition.group(1), printed, label, offset)
        if initializer is not None:
            name = printed[1:]
            if name.startswith('"'):
                name = _unescape_ir(name[1:-1]).decode("utf-8", "surrogateescape")
            result.append((name, initializer))
    return result


def _initializer(definition: str, name: str, label: str, offset: int) -> bytes | None:
    """The bytes of a ``ConstantDataSequential`` initializer, None where LLVM's ``dyn_cast`` fails."""
    m = re.search(r"\b(?:global|constant) (.*)$", definition)
    if m is None:
        return None
    rest = m.group(1)
    cstring = re.match(r'\[\d+ x i8\] c"([^"]*)"', rest)
    if cstring is not None:
        return _unescape_ir(cstring.group(1))
    ints = _INT_ARRAY.match(rest)
    if ints is not None:
        width = int(ints.group(2)) // 8
        values = [int(v.split()[1]) for v in ints.group(3).split(", ")]
        return b"".join((v % (1 << (8 * width))).to_bytes(width, "little") for v in values)
    if re.match(r"\[\d+ x [^\]]+\] (?:zeroinitializer|undef|poison)\b", rest) or not rest.startswith(("[", "<")):
        return None  # not a ConstantDataSequential: LLVM skips it too
    raise OffloadFormatError(f"unsupported initializer of {name} in the embedded-object metadata", path=label,
                             offset=offset)


def _extract_bitcode(walk: _Walk, data: bytes, file: str, start: int, members: tuple[str, ...],
                     display: str | None) -> None:
    label = _label(file, members, display)
    for symbol, blob in _embedded_objects(data, label, start):
        origin = Origin(file, ContainerKind.BITCODE, members, ".llvm.offloading", symbol, display)
        for binary in iter_offload_binaries(blob, path=f"{label}: global @{symbol}"):
            walk.results.append(FoundBinary(binary, origin))


# --------------------------------------------------------------------------------------------------
# Writing GNU archives the way LLVM's writeArchive does (for ``--archive``).


@dataclass(frozen=True)
class ArchiveMember:
    """One member to write: ``size`` bytes at ``offset`` of ``source`` (a path or the bytes)."""

    name: str
    source: str | bytes
    offset: int
    size: int

    @classmethod
    def image_of(cls, found: FoundBinary) -> ArchiveMember:
        """The raw image of a found binary, named like Clang names it (the buffer identifier)."""
        source = found.binary.data if found.binary.data is not None else found.origin.file
        return cls(found.origin.identifier, source, found.binary.image_offset, found.binary.image_size)

    def head(self, count: int) -> bytes:
        if isinstance(self.source, bytes):
            return self.source[self.offset:self.offset + min(count, self.size)]
        with open(self.source, "rb") as f:
            f.seek(self.offset)
            return f.read(min(count, self.size))

    def read(self) -> bytes:
        return self.head(self.size)

    def copy_to(self, fd: int) -> None:
        """Stream the member's bytes to ``fd`` (what the archive writer asks of a member)."""
        if isinstance(self.source, bytes):
            write_all(fd, self.source[self.offset:self.offset + self.size])
        else:
            with open(self.source, "rb") as src:
                copy_file_range_stream(src.fileno(), fd, self.offset, self.size)


def archive_symbols(member: ArchiveMember) -> list[bytes]:
    """The names LLVM's archive writer puts in the symbol table for this member.

    ELF: ``.symtab`` symbols that are not local, not undefined, not section/file symbols. Bitcode: the
    module's defined, non-local functions then global variables, minus ``llvm.*`` (LLVM's
    ``ModuleSymbolTable`` flags). Anything else has no symbols.
    """
    kind = identify(member.head(64))
    if kind in (ContainerKind.ELF_RELOCATABLE, ContainerKind.ELF_EXECUTABLE, ContainerKind.ELF_SHARED_OBJECT):
        return _elf_symbols(member)
    if kind is ContainerKind.BITCODE:
        return _bitcode_symbols(member.read(), member.name)
    return []


def _elf_symbols(member: ArchiveMember) -> list[bytes]:
    import io

    from elftools.common.utils import parse_cstring_from_stream
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    try:
        if isinstance(member.source, bytes):
            stream: Any = io.BytesIO(member.source[member.offset:member.offset + member.size])
            handle = None
        else:
            handle = open(member.source, "rb")
            stream = _Window(handle, member.offset, member.size)
        try:
            elf = ELFFile(stream)
            names: list[bytes] = []
            for section in elf.iter_sections():
                # pyelftools makes every SHT_SYMTAB section a SymbolTableSection; the isinstance tells mypy.
                if section["sh_type"] != "SHT_SYMTAB" or not isinstance(section, SymbolTableSection):
                    continue
                strtab = elf.get_section(section["sh_link"])
                for index in range(1, section.num_symbols()):
                    sym = section.get_symbol(index)
                    info = sym["st_info"]
                    if info["bind"] == "STB_LOCAL" or info["type"] in ("STT_SECTION", "STT_FILE"):
                        continue
                    if sym["st_shndx"] == "SHN_UNDEF":
                        continue
                    names.append(parse_cstring_from_stream(stream, strtab["sh_offset"] + sym["st_name"]) or b"")
                break  # LLVM uses the first SHT_SYMTAB
            return names
        finally:
            if handle is not None:
                handle.close()
    except OffloadError:
        raise
    except Exception as exc:
        raise OffloadFormatError(f"malformed ELF archive member: {exc}", path=member.name) from None


def bitcode_linker_symbols(data: bytes, label: str) -> list[tuple[str, bool, bool, bool]]:
    """``(name, undefined, weak, hidden)`` for each non-local global of an LLVM bitcode file, read in the
    child process (damaged bitcode can make LLVM abort): what lazy archive extraction looks at."""
    return _read_bitcode("linker symbols", data, label, None)


def _bitcode_symbols(data: bytes, name: str) -> list[bytes]:
    names: list[str] = _read_bitcode("symbols", data, name, None)
    return [symbol.encode("utf-8", "surrogateescape") for symbol in names]


def write_archive(members: Sequence[ArchiveMember], output: str | os.PathLike[str]) -> None:
    """Write a GNU ``ar`` archive as LLVM's ``writeArchive`` does with ``Deterministic`` on (see
    :func:`~offload_builders.formats._archive.write_archive`); the output appears atomically.

    A member without symbols is passed as no symbolic file (``or None``): this writer has never written
    the empty symbol table llvm-ar 19 writes when object or bitcode members have no symbols, and its
    output stays as it was.
    """
    symbols = [archive_symbols(m) or None for m in members]
    with atomic_output(output) as fd:
        _archive.write_archive(fd, members, symbols)
