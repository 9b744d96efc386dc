"""Static libraries of bundles (``clang-offload-bundler -type=a``, unbundling only): one GNU archive per target.

Apart from :mod:`offload_builders.formats.bundle` because only ``-type=a`` needs it: the archive reader and
writer, the member symbols of its symbol table (ELF, and LLVM bitcode through its embedded symbol table) and
Clang's names for extracted members, none of which an unbundling of a single bundle loads.  Each member is
read as a bundle by that module.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from contextlib import ExitStack

from offload_builders.errors import BundleFormatError, OffloadError, TargetIDError
from offload_builders.formats._record import Record
from offload_builders.formats.bundle import (
    ELF_MAGIC,
    BundleInput,
    Outputs,
    UnbundleResult,
    copy_range,
    open_input,
    read_bundle_input,
    spool_region,
    strip_bundles,
)
from offload_builders.formats.bundle_id import (
    clang19_target_id_field,
    find_target_conflict,
    is_code_object_compatible,
    parse_bundle_entry_id,
    validate_targets,
)
from offload_builders.formats.compressed import FileRegion

# typing is imported for type checkers only: it costs the command line ~3 ms of start-up.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final


class ArchiveMember(Record):
    """A member of an ``ar`` archive: name and where its data is."""

    __slots__ = ("name", "offset", "size")
    name: str
    offset: int
    size: int

    def __init__(self, name: str, offset: int, size: int) -> None:
        self._init(name, offset, size)


def read_archive(region: FileRegion, *, label: str) -> list[ArchiveMember]:
    """The members of a GNU or BSD archive (symbol tables skipped), each checked against the file."""
    from offload_builders.formats import _archive  # only -type=a needs it: not at start-up

    head = region.pread(8, 0)
    if head == _archive.THIN_MAGIC:
        raise BundleFormatError("thin archives are not supported", path=label, offset=0)
    if head != _archive.AR_MAGIC:
        raise BundleFormatError("not an archive (no !<arch> magic)", path=label, offset=0)
    members: list[ArchiveMember] = []
    for name, header_at, offset, size in _archive.iter_members(
            region.pread, 0, region.size, lambda message, at: BundleFormatError(message, path=label, offset=at)):
        try:
            text = name.decode("utf-8")
        except UnicodeDecodeError:
            raise BundleFormatError("archive member name is not valid UTF-8", path=label,
                                   offset=header_at) from None
        members.append(ArchiveMember(text, offset, size))
    return members


def llvm_path_stem(name: str) -> tuple[str, str]:
    """``(sys::path::stem, sys::path::extension)`` of a file name, LLVM's way (``.x`` has stem ``""``)."""
    base = name.rsplit("/", 1)[-1]
    dot = base.rfind(".")
    if dot < 0 or base in (".", ".."):
        return base, ""
    return base[:dot], base[dot:]


def archive_member_name(member_name: str, bundle_id: str) -> str:
    """Clang's name for an extracted entry: ``<stem>-<id><stem><ext>`` with ':' as '_'.

    ``<ext>`` is ``.bc`` when the ID's target ID mentions ``gfx``, ``.cubin`` for ``sm_``, and the
    member's own extension otherwise.
    """
    stem, extension = llvm_path_stem(member_name)
    target_field = clang19_target_id_field(bundle_id)
    if "gfx" in target_field:
        extension = ".bc"
    elif "sm_" in target_field:
        extension = ".cubin"
    return f"{stem}-{bundle_id}{stem}{extension}".replace(":", "_")


class _OutMember:
    """A member of an output archive: its name and where its bytes are.

    A plain class, not a dataclass: building a frozen dataclass costs ~0.3 ms of the command line's
    start-up, and this record needs none of what it generates.
    """

    __slots__ = ("name", "fd", "offset", "size")

    def __init__(self, name: str, fd: int, offset: int, size: int) -> None:
        self.name, self.fd, self.offset, self.size = name, fd, offset, size

    def copy_to(self, fd: int) -> None:
        """Stream the member's bytes to ``fd`` (what the archive writer asks of a member)."""
        copy_range(self.fd, self.offset, fd, self.size)


def unbundle_archive(input: str | os.PathLike[str], targets: Sequence[str],
                     outputs: Sequence[str | os.PathLike[str]], *, allow_missing_bundles: bool = False,
                     hip_openmp_compatible: bool = False, check_input_archive: bool = False,
                     llvm_version: int = 19, print_external_commands: bool = False) -> UnbundleResult:
    """Split a static library of bundles into one GNU archive per target, as Clang 19 does.

    Every entry of every member goes to *every* compatible target (in ``-targets`` order), named by
    :func:`archive_member_name`; compressed members are decompressed first.  A target with nothing
    compatible is an error, or an empty archive with ``allow_missing_bundles``.
    ``check_input_archive`` first rejects members whose IDs break the target-ID conflict rule.
    ``print_external_commands`` (``-###``): a host entry of an object-bundle member is not stripped
    with llvm-objcopy but the command printed, and the member is empty, as with Clang 19.
    """
    if len(outputs) != len(targets):
        raise OffloadError("number of output files and targets should match in unbundling mode")
    ids = validate_targets(targets, bundling=False, llvm_version=llvm_version)
    names = [str(entry) for entry in ids]
    path = os.fspath(input)
    collected: dict[str, list[_OutMember]] = {name: [] for name in names}
    with ExitStack() as stack:
        opened = open_input(path, stack)
        archive = FileRegion(opened.fd, 0, opened.size)
        members = read_archive(archive, label=path)
        for member in members:
            label = f"{path}({member.name})"
            region = FileRegion(archive.fd, member.offset, member.size)
            data = read_bundle_input(path, "a", stack, region=region, label=label)
            if check_input_archive:
                _check_member_conflicts(data, member.name, path)
            member_file = member.name.rsplit("/", 1)[-1]
            for part, entry in data.entries:
                code_object = parse_bundle_entry_id(entry.id, strict=False)
                matches = [name for entry_id, name in zip(ids, names) if is_code_object_compatible(
                    code_object, entry_id, hip_openmp_compatible=hip_openmp_compatible,
                    llvm_version=llvm_version)]
                if not matches:
                    continue
                if entry.host_object:
                    import tempfile

                    spool = stack.enter_context(tempfile.TemporaryFile(prefix="offload-bundler-"))
                    strip_bundles(part.elf_path or spool_region(part.region, stack), spool.fileno(),
                                   print_only=print_external_commands)
                    fd, offset, size = spool.fileno(), 0, os.fstat(spool.fileno()).st_size
                else:
                    fd, offset, size = part.region_of(entry)
                out_name = archive_member_name(member_file, entry.id)
                for name in matches:
                    collected[name].append(_OutMember(out_name, fd, offset, size))
        for name in names:
            if not collected[name] and not allow_missing_bundles:
                raise OffloadError(f"no compatible code object found for the target '{name}' in heterogeneous "
                                   f"archive library: {path}")
        symbols: dict[tuple[int, int, int], list[bytes] | None] = {}
        with Outputs() as out:
            for name, output in zip(names, outputs):
                write_archive(out.create(output), collected[name], symbols)
    return UnbundleResult({os.fspath(o): None for o in outputs})


def _check_member_conflicts(data: BundleInput, member: str, archive: str) -> None:
    entries = []
    for _, entry in data.entries:
        entries.append(parse_bundle_entry_id(entry.id, strict=False))
    try:
        conflict = find_target_conflict(entries)
    except TargetIDError as exc:
        raise BundleFormatError(f"{member} of {archive}: {exc}") from None
    if conflict is not None:
        raise OffloadError(f"conflicting TargetIDs [{conflict[0]}, {conflict[1]}] found in {member} of {archive}")


# --------------------------------------------------------------------------------------------
# Writing GNU archives the way llvm::writeArchive does (deterministic, with a symbol table)
# --------------------------------------------------------------------------------------------
def write_archive(fd: int, members: Sequence[_OutMember],
                  symbols_cache: dict[tuple[int, int, int], list[bytes] | None] | None = None) -> None:
    """Write a GNU archive byte-identical to ``writeArchive(..., NormalSymtab, K_GNU, Deterministic)``
    (:func:`~offload_builders.formats._archive.write_archive`).

    The symbol table lists the defined global symbols of ELF and LLVM bitcode members (bitcode through
    its embedded symbol table); ``symbols_cache`` lets several archives that share members read each
    member's symbols once.
    """
    from offload_builders.formats import _archive  # only -type=a needs it: not at start-up

    cache = {} if symbols_cache is None else symbols_cache
    symbols: list[list[bytes] | None] = []
    for member in members:
        key = (member.fd, member.offset, member.size)
        if key not in cache:
            cache[key] = member_symbols(FileRegion(*key))
        symbols.append(cache[key])
    _archive.write_archive(fd, members, symbols)


def member_symbols(region: FileRegion) -> list[bytes] | None:
    """The archive symbols of a member (defined, global, not format-specific), or None when the
    member is not a symbolic file (then it adds nothing to the symbol table)."""
    head = region.pread(4, 0)
    if head == ELF_MAGIC:
        return _elf_symbols(region)
    if head in (b"BC\xc0\xde", b"\xde\xc0\x17\x0b"):
        return _bitcode_symbols(region)
    return None


def _elf_symbols(region: FileRegion) -> list[bytes] | None:
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    try:
        elf = ELFFile(region.as_binary_io())
        table = next((s for s in elf.iter_sections() if isinstance(s, SymbolTableSection)
                      and s["sh_type"] == "SHT_SYMTAB"), None)
        if table is None:
            return []
        found = []
        for index, symbol in enumerate(table.iter_symbols()):
            info = symbol["st_info"]
            if (index == 0 or info["type"] in ("STT_FILE", "STT_SECTION") or info["bind"] == "STB_LOCAL"
                    or symbol["st_shndx"] == "SHN_UNDEF"):
                continue
            found.append(symbol.name.encode("latin-1"))
        return found
    except (ELFError, struct.error, ValueError, KeyError, IndexError, UnicodeError) as exc:
        raise BundleFormatError(f"malformed ELF archive member: {exc}") from None


# LLVM bitcode: just enough of the bitstream container to find the symbol table the writer embeds
# (SYMTAB_BLOCK, an irsymtab::storage blob, and STRTAB_BLOCK), which lists the same symbols, with
# the same flags, that llvm::writeArchive gets by loading the module.
_BC_STRTAB_BLOCK: Final = 23
_BC_SYMTAB_BLOCK: Final = 25
_IRSYM_HEADER: Final = struct.Struct("<I" + "II" * 9)
_IRSYM_SYMBOL: Final = struct.Struct("<IIIIII")
_FB_UNDEFINED, _FB_GLOBAL, _FB_FORMAT_SPECIFIC = 3, 10, 11


class _Bits:
    """A little-endian bit reader over bytes (LLVM's bitstream order)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def read(self, width: int) -> int:
        if width == 0:
            return 0
        end = self.pos + width
        if end > len(self.data) * 8:
            raise ValueError("bitstream ends early")
        first, last = self.pos // 8, (end + 7) // 8
        value = int.from_bytes(self.data[first:last], "little") >> (self.pos % 8)
        self.pos = end
        return value & ((1 << width) - 1)

    def vbr(self, width: int) -> int:
        result, shift = 0, 0
        while True:
            piece = self.read(width)
            result |= (piece & ((1 << (width - 1)) - 1)) << shift
            if not piece >> (width - 1):
                return result
            shift += width - 1
            if shift > 64:
                raise ValueError("VBR value too long")

    def align32(self) -> None:
        self.pos = (self.pos + 31) // 32 * 32


def _bitcode_blob(body: bytes, abbrev_width: int) -> bytes | None:
    """The first blob operand of a record in a block body (STRTAB_BLOB / SYMTAB_BLOB)."""
    bits = _Bits(body)
    abbrevs: list[list[tuple[str, int]]] = []
    while bits.pos < len(body) * 8:
        code = bits.read(abbrev_width)
        if code == 0:  # END_BLOCK
            return None
        if code == 1:
            raise ValueError("unexpected sub-block")
        if code == 2:  # DEFINE_ABBREV
            ops: list[tuple[str, int]] = []
            for _ in range(bits.vbr(5)):
                if bits.read(1):
                    ops.append(("literal", bits.vbr(8)))
                    continue
                encoding = bits.read(3)
                kind = {1: "fixed", 2: "vbr", 3: "array", 4: "char6", 5: "blob"}.get(encoding)
                if kind is None:
                    raise ValueError("bad abbreviation encoding")
                ops.append((kind, bits.vbr(5) if kind in ("fixed", "vbr") else 0))
            abbrevs.append(ops)
            continue
        if code == 3:  # UNABBREV_RECORD
            bits.vbr(6)
            for _ in range(bits.vbr(6)):
                bits.vbr(6)
            continue
        ops = abbrevs[code - 4]
        index = 0
        while index < len(ops):
            kind, width = ops[index]
            if kind == "literal":
                pass
            elif kind == "fixed":
                bits.read(width)
            elif kind == "vbr":
                bits.vbr(width)
            elif kind == "char6":
                bits.read(6)
            elif kind == "array":
                element_kind, element_width = ops[index + 1]
                for _ in range(bits.vbr(6)):
                    bits.read(6) if element_kind == "char6" else (
                        bits.read(element_width) if element_kind == "fixed" else bits.vbr(element_width))
                index += 1
            elif kind == "blob":
                length = bits.vbr(6)
                bits.align32()
                start = bits.pos // 8
                if start + length > len(body):
                    raise ValueError("blob runs past the block")
                return body[start:start + length]
            index += 1
    return None


def _bitcode_symbols(region: FileRegion) -> list[bytes] | None:
    """Archive symbols of an LLVM bitcode member from its embedded symbol table.

    None (no symbol-table entry, as llvm-ar does for bitcode it cannot read) when the file has no
    usable table.
    """
    try:
        start = 0
        head = region.pread(20, 0)
        if head[:4] == b"\xde\xc0\x17\x0b":  # wrapper header: magic, version, offset, size, cputype
            start = struct.unpack_from("<I", head, 8)[0]
        if region.pread(4, start) != b"BC\xc0\xde":
            return None
        position = start + 4
        blobs: dict[int, bytes] = {}
        while position + 4 <= region.size:
            prefix = region.pread(16, position)
            bits = _Bits(prefix)
            if bits.read(2) != 1:  # anything but ENTER_SUBBLOCK ends the top level
                break
            block_id = bits.vbr(8)
            width = bits.vbr(4)
            bits.align32()
            words = bits.read(32)
            body_at = position + bits.pos // 8
            if body_at + 4 * words > region.size:
                raise ValueError("block runs past the end of the file")
            if block_id in (_BC_STRTAB_BLOCK, _BC_SYMTAB_BLOCK):
                blob = _bitcode_blob(region.pread(4 * words, body_at), width)
                if blob is not None:
                    blobs[block_id] = blob
            position = body_at + 4 * words
        symtab, strtab = blobs.get(_BC_SYMTAB_BLOCK), blobs.get(_BC_STRTAB_BLOCK)
        if symtab is None or strtab is None or len(symtab) < _IRSYM_HEADER.size:
            return None
        header = _IRSYM_HEADER.unpack_from(symtab)
        if header[0] not in (2, 3):  # irsymtab::storage::Header::kCurrentVersion
            return None
        symbols_at, symbol_count = header[7], header[8]
        if symbols_at + symbol_count * _IRSYM_SYMBOL.size > len(symtab):
            return None
        found = []
        for index in range(symbol_count):
            at = symbols_at + index * _IRSYM_SYMBOL.size
            name_at, name_size, _, _, _, flags = _IRSYM_SYMBOL.unpack_from(symtab, at)
            if not flags >> _FB_GLOBAL & 1 or flags >> _FB_UNDEFINED & 1 or flags >> _FB_FORMAT_SPECIFIC & 1:
                continue
            if name_at + name_size > len(strtab):
                return None
            found.append(strtab[name_at:name_at + name_size])
        return found
    except (ValueError, IndexError, struct.error):
        return None
