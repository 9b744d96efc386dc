"""The ELF section and symbol tables: the parts of an ELF file the offload scanners and the linker read; and
LLVM's ELF writer's layout, by which an object is had with one section's bytes replaced.

Finding ``.llvm.offloading``, ``__CLANG_OFFLOAD_BUNDLE__*``, ``.hip_fatbin`` or ``omp_offloading_entries``
needs each section's name, type, offset and size, nothing else. pyelftools builds a full ``construct``
parser for every file it opens (about 1.5 ms each: 70 ms for the 46 members of
``libomptarget.devicertl.a``, which every OpenMP link scans), so the scans read the file header and
section headers here with :mod:`struct`, and the symbol table the device-code selection reads (name,
binding, visibility, defined or not) too. Everything else stays with pyelftools.

Field names are the ELF specification's (as in pyelftools' ``structs.py``); each record is declared
once per class (32/64-bit) and byte order. A damaged file is an :class:`OffloadFormatError` (or the
subclass the caller names) with the offset of the field that is wrong, never an ``IndexError``.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

from offload_builders.errors import OffloadFormatError

#: ``pread(length, offset)``: up to ``length`` bytes at ``offset`` from the start of the ELF file.
Reader = Callable[[int, int], bytes]

ELFCLASS32, ELFCLASS64 = 1, 2
ELFDATA2LSB, ELFDATA2MSB = 1, 2
ET_DYN = 3
PT_INTERP = 3
SHT_SYMTAB = 2
SHT_NOBITS = 8
STB_LOCAL, STB_WEAK = 0, 2
STT_SECTION, STT_FILE = 3, 4
STV_INTERNAL, STV_HIDDEN = 1, 2
SHN_UNDEF, SHN_XINDEX = 0, 0xFFFF
PN_XNUM = 0xFFFF
_IDENT_SIZE = 16


@dataclass(frozen=True)
class _Layout:
    """The struct formats of one ELF class and byte order (after the 16-byte ``e_ident``)."""

    header: struct.Struct  # e_type, e_machine, e_version, e_entry, e_phoff, e_shoff, e_flags, e_ehsize,
    #                        e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx
    section: struct.Struct  # sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, sh_info,
    #                         sh_addralign, sh_entsize
    p_type: struct.Struct  # the first field of a program header, the same in both classes
    symbol: struct.Struct  # Elf64_Sym: st_name, st_info, st_other, st_shndx, st_value, st_size;
    #                        Elf32_Sym: st_name, st_value, st_size, st_info, st_other, st_shndx


def _layout(order: str, address: str) -> _Layout:
    symbol = struct.Struct(f"{order}IBBHQQ" if address == "Q" else f"{order}IIIBBH")
    return _Layout(struct.Struct(f"{order}HHI{address * 3}IHHHHHH"),
                   struct.Struct(f"{order}II{address * 4}II{address * 2}"), struct.Struct(f"{order}I"), symbol)


_LAYOUTS = {
    (ELFCLASS32, ELFDATA2LSB): _layout("<", "I"),  # Elf32_Ehdr / Elf32_Shdr, little-endian
    (ELFCLASS32, ELFDATA2MSB): _layout(">", "I"),  # Elf32, big-endian
    (ELFCLASS64, ELFDATA2LSB): _layout("<", "Q"),  # Elf64_Ehdr / Elf64_Shdr, little-endian (x86_64, GPUs)
    (ELFCLASS64, ELFDATA2MSB): _layout(">", "Q"),  # Elf64, big-endian
}


@dataclass(frozen=True)
class ElfSection:
    """One section header, with its name read from the section name table."""

    index: int
    raw_name: bytes
    sh_type: int
    sh_offset: int
    sh_size: int
    sh_link: int
    header_at: int  # where this section's header is, from the start of the ELF file

    @property
    def name(self) -> str:
        """The name as text (UTF-8, undecodable bytes replaced, as pyelftools gives it)."""
        return self.raw_name.decode("utf-8", "replace")

    @property
    def file_size(self) -> int:
        """The bytes the section occupies in the file (``SHT_NOBITS`` occupies none)."""
        return 0 if self.sh_type == SHT_NOBITS else self.sh_size


@dataclass(frozen=True)
class ElfSections:
    """The file header fields the scanners use and every section, in section-table order."""

    elfclass: int  # 32 or 64
    little_endian: bool
    e_type: int
    e_shoff: int
    e_shentsize: int
    has_interpreter: bool  # a PT_INTERP program header: an ET_DYN file that is a PIE executable
    sections: tuple[ElfSection, ...]

    def named(self, name: str) -> ElfSection | None:
        """The first section called ``name``, if any."""
        raw = name.encode()
        return next((section for section in self.sections if section.raw_name == raw), None)


def read_sections(pread: Reader, size: int, *, path: str | None = None, base: int = 0,
                  error: type[OffloadFormatError] = OffloadFormatError) -> ElfSections:
    """The section table of the ELF file of ``size`` bytes that ``pread`` reads.

    ``path`` and ``base`` (where the ELF file starts in it) locate errors, which are ``error``
    instances. Every offset and count is checked against ``size`` before it is used.
    """
    def fail(message: str, at: int) -> OffloadFormatError:
        return error(f"malformed ELF file: {message}", path=path, offset=base + at)

    ident = pread(_IDENT_SIZE, 0)
    if len(ident) < _IDENT_SIZE or ident[:4] != b"\x7fELF":
        raise fail("the file is shorter than an ELF identification or lacks the ELF magic", 0)
    layout = _LAYOUTS.get((ident[4], ident[5]))
    if layout is None:
        raise fail(f"unknown ELF class {ident[4]} or data encoding {ident[5]}", 4)
    raw = pread(layout.header.size, _IDENT_SIZE)
    if len(raw) < layout.header.size:
        raise fail(f"the file ends inside the ELF header ({size} bytes)", len(ident) + len(raw))
    (e_type, _machine, _version, _entry, e_phoff, e_shoff, _flags, _ehsize, e_phentsize, e_phnum, e_shentsize,
     e_shnum, e_shstrndx) = layout.header.unpack(raw)
    elfclass = 64 if ident[4] == ELFCLASS64 else 32
    shentsize_at, shstrndx_at = (58, 62) if elfclass == 64 else (46, 50)  # where the fields are, for messages

    def section_header(index: int) -> tuple[int, ...]:
        at = e_shoff + index * e_shentsize
        if at > size:  # checked before the read: an offset such as 2**63 is no file position at all
            raise fail(f"section header {index} starts past the end of the file ({size:#x} bytes)", at)
        data = pread(layout.section.size, at)
        if len(data) < layout.section.size:
            raise fail(f"section header {index} runs past the end of the file ({size:#x} bytes)", at)
        return layout.section.unpack(data)

    count = 0
    if e_shoff:
        if e_shentsize < layout.section.size:
            if e_shnum:
                raise fail(f"e_shentsize {e_shentsize} is smaller than a section header ({layout.section.size})",
                           shentsize_at)
        else:
            count = e_shnum or section_header(0)[5]  # over 0xff00 sections: section 0's sh_size counts them
    if count and (e_shoff > size or count > (size - e_shoff) // e_shentsize):
        raise fail(f"section header table ({count} entries) runs past the end of the file ({size:#x} bytes)",
                   e_shoff)
    headers = [section_header(index) for index in range(count)]
    if e_shstrndx == SHN_XINDEX and headers:
        e_shstrndx = headers[0][6]  # sh_link of section 0
    names: bytes | None = None
    if count and e_shstrndx != SHN_UNDEF:
        if e_shstrndx >= count:
            raise fail(f"e_shstrndx {e_shstrndx} names no section (the file has {count})", shstrndx_at)
        strings = headers[e_shstrndx]
        names = b""
        if strings[1] != SHT_NOBITS and strings[5]:
            if strings[4] > size or strings[5] > size - strings[4]:
                raise fail(f"the section name table [{strings[4]:#x}, {strings[4] + strings[5]:#x}) runs past the "
                           f"end of the file ({size:#x} bytes)", e_shoff + e_shstrndx * e_shentsize)
            names = pread(strings[5], strings[4])
    sections = []
    for index, (sh_name, sh_type, _flags, _addr, sh_offset, sh_size, sh_link, *_rest) in enumerate(headers):
        header_at = e_shoff + index * e_shentsize
        name = b""
        if names is not None and sh_name:
            if sh_name >= len(names):
                raise fail(f"section {index}'s name offset {sh_name} is outside the section name table", header_at)
            end = names.find(b"\0", sh_name)
            name = names[sh_name:end if end >= 0 else len(names)]
        sections.append(ElfSection(index, name, sh_type, sh_offset, sh_size, sh_link, header_at))
    return ElfSections(elfclass, ident[5] == ELFDATA2LSB, e_type, e_shoff, e_shentsize,
                       e_type == ET_DYN and _has_interpreter(pread, size, layout, e_phoff, e_phentsize, e_phnum, fail),
                       tuple(sections))


def _has_interpreter(pread: Reader, size: int, layout: _Layout, e_phoff: int, e_phentsize: int, e_phnum: int,
                     fail: Callable[[str, int], OffloadFormatError]) -> bool:
    if e_phnum == 0 or e_phnum >= PN_XNUM:
        return False
    if e_phentsize < layout.p_type.size or e_phoff > size or e_phnum > (size - e_phoff) // e_phentsize:
        raise fail(f"program header table ({e_phnum} entries) runs past the end of the file ({size:#x} bytes)",
                   e_phoff)
    return any(layout.p_type.unpack(pread(layout.p_type.size, e_phoff + index * e_phentsize))[0] == PT_INTERP
               for index in range(e_phnum))


@dataclass(frozen=True)
class ElfSymbol:
    """One symbol table entry, with the fields the device-code selection looks at."""

    name: bytes
    binding: int  # STB_*
    symbol_type: int  # STT_*
    visibility: int  # STV_*
    st_shndx: int  # 0 (SHN_UNDEF): undefined
    st_value: int
    st_size: int

    @property
    def undefined(self) -> bool:
        return self.st_shndx == SHN_UNDEF


def read_symbols(pread: Reader, size: int, table: ElfSections, *, path: str | None = None, base: int = 0,
                 error: type[OffloadFormatError] = OffloadFormatError) -> list[ElfSymbol]:
    """The entries of the first ``SHT_SYMTAB`` section (as LLVM reads it), after the null entry."""
    def fail(message: str, at: int) -> OffloadFormatError:
        return error(f"malformed ELF file: {message}", path=path, offset=base + at)

    symtab = next((section for section in table.sections if section.sh_type == SHT_SYMTAB), None)
    if symtab is None:
        return []
    layout = _LAYOUTS[(ELFCLASS64 if table.elfclass == 64 else ELFCLASS32,
                       ELFDATA2LSB if table.little_endian else ELFDATA2MSB)]
    entry = layout.symbol
    if symtab.sh_offset > size or symtab.sh_size > size - symtab.sh_offset:
        raise fail(f"the symbol table [{symtab.sh_offset:#x}, {symtab.sh_offset + symtab.sh_size:#x}) runs past "
                   f"the end of the file ({size:#x} bytes)", symtab.header_at)
    if symtab.sh_link >= len(table.sections):
        raise fail(f"the symbol table's sh_link {symtab.sh_link} names no section", symtab.header_at)
    strings_section = table.sections[symtab.sh_link]
    if strings_section.sh_offset > size or strings_section.file_size > size - strings_section.sh_offset:
        raise fail("the symbol string table runs past the end of the file", strings_section.header_at)
    strings = pread(strings_section.file_size, strings_section.sh_offset)
    raw = pread(symtab.sh_size, symtab.sh_offset)
    symbols = []
    for at in range(entry.size, len(raw) - entry.size + 1, entry.size):
        fields = entry.unpack_from(raw, at)
        if table.elfclass == 64:
            st_name, st_info, st_other, st_shndx, st_value, st_size = fields
        else:
            st_name, st_value, st_size, st_info, st_other, st_shndx = fields
        if st_name >= len(strings) and st_name:
            raise fail(f"symbol {at // entry.size}'s name offset {st_name} is outside its string table",
                       symtab.sh_offset + at)
        end = strings.find(b"\0", st_name)
        symbols.append(ElfSymbol(strings[st_name:end if end >= 0 else len(strings)], st_info >> 4, st_info & 0xF,
                                 st_other & 0x3, st_shndx, st_value, st_size))
    return symbols


def file_reader(fd: int, start: int = 0) -> Reader:
    """A :data:`Reader` over the descriptor ``fd`` for an ELF file that starts at ``start``."""
    return lambda length, offset: os.pread(fd, max(0, length), start + offset)


# LLVM's ELF object writer (``ELFWriter::writeObject``) lays a relocatable object out in phases: the file header,
# the sections of the assembler in order, the groups, the symbol table (its SHT_SYMTAB_SHNDX straight after), the
# relocation sections, ``.llvm_addrsig``, ``.strtab`` (section 1, which also names the sections), then the section
# header table. Each section starts at the next multiple of its alignment, padded with zeros, but for the three the
# writer puts where it stands; the header table at the next multiple of the address size. Within a phase sections
# are written in the order of their indices.
SHT_RELA, SHT_REL, SHT_GROUP, SHT_SYMTAB_SHNDX = 4, 9, 17, 18
SHT_CREL, SHT_LLVM_ADDRSIG = 0x40000014, 0x6FFF4C03
ET_REL = 1
_WRITER_PHASES = {SHT_GROUP: 1, SHT_SYMTAB: 2, SHT_SYMTAB_SHNDX: 3, SHT_RELA: 4, SHT_REL: 4, SHT_CREL: 4,
                  SHT_LLVM_ADDRSIG: 5}
_UNALIGNED_PHASES = (3, 5, 6)
_STRTAB_PHASE = 6


def llvm_object_with_section(data: bytes, name: str, content: bytes) -> bytes | None:
    """The relocatable object ``data`` that LLVM's ELF writer wrote, with the bytes of its one section called
    ``name`` replaced by ``content``, laid out as that writer lays it out: every later section moves to its
    alignment, the section header table after them, the section's size and the offsets rewritten.

    So an object the back end would write with other contents for that section (the host object of an offload
    compile, whose ``.llvm.offloading`` holds the package of device images and is referenced by nothing) is had
    without running the back end again. None where the object is not one whose layout the rule explains exactly:
    its own bytes laid out by the rule must give ``data`` back (every offset, the zero padding, the header table at
    the end), and ``name`` must name one section with contents."""
    if len(data) < _IDENT_SIZE or data[:4] != b"\x7fELF":
        return None
    layout = _LAYOUTS.get((data[4], data[5]))
    if layout is None or len(data) < _IDENT_SIZE + layout.header.size:
        return None
    (e_type, _machine, _version, _entry, _phoff, e_shoff, _flags, e_ehsize, _phentsize, e_phnum, e_shentsize,
     e_shnum, e_shstrndx) = layout.header.unpack_from(data, _IDENT_SIZE)
    entry = layout.section.size
    if (e_type != ET_REL or e_phnum or e_shentsize != entry or not 1 < e_shnum < 0xFF00
            or not 0 < e_shstrndx < e_shnum or e_shoff + e_shnum * entry != len(data)):
        return None
    headers = [list(layout.section.unpack_from(data, e_shoff + index * entry)) for index in range(e_shnum)]
    names_at, names_size = headers[e_shstrndx][4], headers[e_shstrndx][5]
    names = data[names_at:names_at + names_size]
    wanted = name.encode() + b"\0"  # a name is NUL-terminated in the table: one without is no match
    chosen = [index for index in range(1, e_shnum)
              if names[headers[index][0]:headers[index][0] + len(wanted)] == wanted]
    if len(chosen) != 1 or headers[chosen[0]][1] == SHT_NOBITS:
        return None
    replaced = chosen[0]

    def phase(index: int) -> int:
        return _STRTAB_PHASE if index == e_shstrndx else _WRITER_PHASES.get(headers[index][1], 0)

    order = sorted(range(1, e_shnum), key=lambda index: (phase(index), index))
    word = 8 if data[4] == ELFCLASS64 else 4
    # The object's own layout first: where the rule puts each section must be where it is, with zeros between.
    cursor = e_ehsize
    for index in order:
        start = cursor if phase(index) in _UNALIGNED_PHASES else _align_to(cursor, headers[index][8])
        if start != headers[index][4] or data[cursor:start].strip(b"\0"):
            return None
        cursor = start + (0 if headers[index][1] == SHT_NOBITS else headers[index][5])
    if _align_to(cursor, word) != e_shoff or data[cursor:e_shoff].strip(b"\0"):
        return None
    out = bytearray(data[:e_ehsize])
    for index in order:
        old_at, size = headers[index][4], headers[index][5]
        if phase(index) not in _UNALIGNED_PHASES:
            out += bytes(_align_to(len(out), headers[index][8]) - len(out))
        headers[index][4] = len(out)
        if index == replaced:
            out += content
            headers[index][5] = len(content)
        elif headers[index][1] != SHT_NOBITS:
            out += data[old_at:old_at + size]
    out += bytes(_align_to(len(out), word) - len(out))
    shoff = len(out)
    for fields in headers:
        out += layout.section.pack(*fields)
    header = list(layout.header.unpack_from(data, _IDENT_SIZE))
    header[5] = shoff
    out[_IDENT_SIZE:_IDENT_SIZE + layout.header.size] = layout.header.pack(*header)
    return bytes(out)


def _align_to(offset: int, alignment: int) -> int:
    alignment = max(1, alignment)
    return (offset + alignment - 1) // alignment * alignment
