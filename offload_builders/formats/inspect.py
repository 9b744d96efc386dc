"""Every offload payload in a file, wherever Clang put it: the library behind ``offload-inspect``.

No single LLVM 19 tool sees all of them: ``llvm-objdump --offloading`` reads only OffloadBinaries in ELF
sections (not bitcode, not bundles), ``clang-offload-bundler -list`` reads only bundles, and of several
bundles back to back it lists the first (uncompressed) or fails ("Src size is incorrect", compressed).
This module combines

* **offload binaries** (magic ``10 FF 10 AD``; the new driver's ``.llvm.offloading`` sections, archives of
  fat objects, ``-flto`` bitcode host objects, package files), found by
  :func:`~offload_builders.formats.containers.extract_offload_binaries`, so they come out in LLVM's order;
* **bundles** of ``clang-offload-bundler``: whole files (binary, text, ``CCOB`` compressed v1-v3, and any
  number of them back to back, each found from its own header's extent, never by searching for a magic),
  ELF ``.hip_fatbin`` sections (the HIP fat binary of a non-RDC object, and the concatenation of many after
  linking, 4096-aligned with zero padding), and ELF ``__CLANG_OFFLOAD_BUNDLE__<id>`` sections (object
  bundles, e.g. ``-fgpu-rdc`` objects);
* **NVIDIA fat binaries** (magic ``0xBA55ED50``) in ELF ``.nv_fatbin`` sections or as whole files; their
  entries (ELF cubin or PTX, per ``sm_``) are decoded from the entry headers as far as their layout is
  known publicly (kind, architecture, payload offset and size, compression flag).

Archives (GNU, BSD, thin, nested) are searched member by member. Nothing is loaded whole: ELF files are
read through their section tables (:mod:`.elf`) on file windows, bundle headers are parsed in place, and
compressed bundles are decompressed into temporary files that live as long as the :class:`Inspection`.

Every malformed structure ends in :class:`~offload_builders.errors.OffloadFormatError` naming the file
(``lib.a(member.o)``, plus the section) and the absolute byte offset of the damage.
"""
from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any

from offload_builders.errors import BundleFormatError, OffloadError, OffloadFormatError
from offload_builders.formats._io import llvm_stem
from offload_builders.formats.bundle import (
    MAGIC as BUNDLE_MAGIC,
    TEXT_COMMENTS,
    BundleEntry,
    copy_range,
    parse_binary_bundle,
    parse_object_bundle,
    parse_text_bundle,
)
from offload_builders.formats.bundle_archive import read_archive
from offload_builders.formats.compressed import MAGIC as CCOB_MAGIC, FileRegion, open_decompressed
from offload_builders.formats.containers import ContainerKind, FoundBinary, extract_offload_binaries, identify
from offload_builders.formats.elf import SHT_NOBITS, read_sections
from offload_builders.formats.llvm_objcopy import find_llvm_objcopy
from offload_builders.formats.offload_binary import ImageKind, kind_table

__all__ = [
    "FATBIN_MAGIC",
    "CompressionInfo",
    "FatbinEntry",
    "Inspection",
    "Payload",
    "inspect_file",
    "printable",
    "safe_file_name",
    "split_bundle_id",
    "unique_names",
]

#: ``fatBinaryHeader.magic`` of an NVIDIA fat binary (``50 ED 55 BA`` in the file).
FATBIN_MAGIC = 0xBA55ED50
_FATBIN_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries that follow
#: The start of an entry header: kind (1 PTX, 2 ELF), version, header size, payload size. Where the header
#: is at least 64 bytes: u32 compressed size, u32 (unknown), u16 minor, u16 major, u32 arch, u32 name
#: offset, u32 name length, u64 flags, u64 (zero), u64 uncompressed size. Checked against CUDA 13's
#: ``fatbinary --image3=...`` output.
_FATBIN_ENTRY = struct.Struct("<HHIQ")
_FATBIN_ENTRY_FULL = struct.Struct("<HHIQIIHHIIIQQQ")
_FATBIN_KINDS = {1: "ptx", 2: "elf"}
_FATBIN_COMPRESSED_FLAGS = 0x2000 | 0x8000  # 0x2000: CUDA 11-12 compression; 0x8000: zstd (CUDA 13)

_ELF_MAGIC = b"\x7fELF"
_BC_MAGICS = (b"BC\xc0\xde", b"\xde\xc0\x17\x0b")
_EM_CUDA = 190
_MAX_DEPTH = 16  # nested archives deeper than this are refused (as in containers)
_OBJECT_BUNDLE_PREFIX = BUNDLE_MAGIC.decode()
#: llvm-objdump's names for the image kinds (``getImageName`` in OffloadDump.cpp); "<none>" otherwise.
_OBJDUMP_IMAGE_NAMES = {ImageKind.OBJECT: "elf", ImageKind.BITCODE: "llvm ir", ImageKind.CUBIN: "cubin",
                        ImageKind.FATBINARY: "fatbinary", ImageKind.PTX: "ptx", ImageKind.SPIRV: "spir-v"}
_PROCESSOR = re.compile(r"^(gfx|sm_|amdgcnspirv|generic)")


# --------------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class CompressionInfo:
    """The ``CCOB`` header a bundle entry was decompressed from (offsets absolute in the file)."""

    offset: int
    version: int
    method: str
    total_size: int
    uncompressed_size: int

    def as_dict(self) -> dict[str, Any]:
        return {"offset": self.offset, "version": self.version, "method": self.method,
                "total_size": self.total_size, "uncompressed_size": self.uncompressed_size}


@dataclass(frozen=True)
class FatbinEntry:
    """One entry of an NVIDIA fat binary: a cubin (``elf``) or PTX for one architecture."""

    kind: str  # "elf", "ptx", or "unknown(<n>)"
    arch: str  # "sm_80" for ELF, "compute_80" for PTX, "" when the header is too short to say
    offset: int  # absolute offset of the payload in the file
    size: int  # payload bytes as stored (padded; compressed when ``compressed``)
    compressed: bool
    uncompressed_size: int | None

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "arch": self.arch, "offset": self.offset, "size": self.size,
                "compressed": self.compressed, "uncompressed_size": self.uncompressed_size}


@dataclass(frozen=True)
class Payload:
    """One device payload and where it lies.

    ``offset`` is where the payload's bytes start: absolute in the file, except inside a compressed
    bundle (then in the decompressed bundle, see ``compression``) and inside a bitcode host object
    (then in the initializer of the global ``symbol``); ``offset_in`` says which.
    """

    file: str  # the input as the user named it
    container: str  # innermost file kind: "ELF relocatable", "archive"..., "bundle file"
    members: tuple[str, ...]  # archive members, outermost first
    section: str | None
    format: str  # "offload binary", "bundle", "text bundle", "object bundle", "nvidia fatbin"
    index: int  # position among the records of that format in its section or file (binary/bundle number)
    header_offset: int | None  # where the binary/bundle/fatbin record starts (same space as ``offset``)
    kind: str  # offload kind (openmp, cuda, hip, none) or bundle kind (host, hip, hipv4, openmp)
    triple: str
    arch: str  # the arch string or bundle target ID
    image_kind: str
    size: int
    offset: int
    offset_in: str  # "file", "decompressed bundle", "global @<name>"
    default_name: str  # the file name ``--extract`` uses before collisions are resolved
    bundle_id: str | None = None
    compression: CompressionInfo | None = None
    strings: tuple[tuple[str, str], ...] = ()
    entries: tuple[FatbinEntry, ...] = ()
    symbol: str | None = None
    _copy: Callable[[int], None] | None = field(default=None, repr=False, compare=False)
    _sort_key: tuple[int, int, int] = field(default=(0, 0, 0), repr=False, compare=False)
    _head: Callable[[int], bytes] | None = field(default=None, repr=False, compare=False)

    @property
    def origin(self) -> str:
        """``lib.a(x.o): section .hip_fatbin`` (the file as named, members, section or global)."""
        text = self.file + "".join(f"({m})" for m in self.members)
        if self.symbol is not None:
            text += f": global @{self.symbol}"
        if self.section is not None:
            text += f": section {self.section}"
        return text

    def copy_to(self, fd: int) -> None:
        """Write the payload's bytes (decompressed, for compressed bundles) to the descriptor ``fd``."""
        if self._copy is None:
            raise OffloadError(f"{self.origin}: this payload cannot be extracted")
        self._copy(fd)

    def head(self, size: int) -> bytes:
        """The payload's first ``size`` bytes (fewer if it is shorter).

        Read in place where the payload lies in a file or a compressed bundle (which is decompressed only
        that far); otherwise the payload is copied out first."""
        if self._head is not None:
            return self._head(max(0, min(size, self.size)))
        import tempfile

        with tempfile.TemporaryFile(prefix="offload-inspect-") as spool:
            self.copy_to(spool.fileno())
            return os.pread(spool.fileno(), size, 0)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready description (everything but the bytes)."""
        return {
            "file": self.file, "origin": self.origin, "container": self.container, "members": list(self.members),
            "section": self.section, "format": self.format, "index": self.index,
            "header_offset": self.header_offset, "kind": self.kind, "triple": self.triple, "arch": self.arch,
            "bundle_id": self.bundle_id, "image_kind": self.image_kind, "size": self.size, "offset": self.offset,
            "offset_in": self.offset_in,
            "compression": self.compression.as_dict() if self.compression is not None else None,
            "strings": dict(self.strings) if self.format == "offload binary" else None,
            "entries": [e.as_dict() for e in self.entries] if self.format == "nvidia fatbin" else None,
        }


class Inspection:
    """The payloads of one file; holds the temporary files that decompressed bundles live in.

    Close it (or use it as a context manager) once the payloads have been copied out.
    """

    def __init__(self, file: str, payloads: list[Payload], stack: ExitStack) -> None:
        self.file = file
        self.payloads = payloads
        self._stack = stack

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> Inspection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------------
# Names


def split_bundle_id(text: str) -> tuple[str, str, str]:
    """``(kind, triple, target ID)`` of a bundle entry ID, for display.

    Positional, like LLVM 21+'s parser, rather than Clang 19's (which reads ``--gfx10-3-generic`` as an
    environment ``-gfx10-3`` and the target ID ``generic``): the kind is up to the first ``-``; a ``--``
    ends a four-field triple with an empty environment (``amdgcn-amd-amdhsa--gfx90a:xnack+``); otherwise a
    trailing ``-`` means no target ID, and a fifth field or a last field naming a processor is the target ID.
    """
    kind, _, rest = text.partition("-")
    if "--" in rest:
        triple, _, target = rest.partition("--")
        return kind, triple, target
    if rest.endswith("-"):
        return kind, rest[:-1], ""
    fields = rest.split("-")
    if len(fields) >= 5:
        return kind, "-".join(fields[:4]), "-".join(fields[4:])
    if len(fields) >= 2 and (_PROCESSOR.match(fields[-1]) or ":" in fields[-1]):
        return kind, "-".join(fields[:-1]), fields[-1]
    return kind, rest, ""


def printable(text: str) -> str:
    """``text`` with every character that is not printable (control and format characters, line breaks,
    lone surrogates) as a Python escape (``\\n``, ``\\x1b``, ``\\u202e``): names come from the file being
    read, and must not forge lines of a listing or drive the terminal that shows it."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


_UNSAFE = re.compile(r"[\x00-\x1f\x7f/\\]")


def safe_file_name(name: str) -> str:
    """``name`` with path separators and control characters as ``_``: IDs and triples come from the
    file being inspected, and must not steer where extraction writes."""
    name = _UNSAFE.sub("_", name)
    return "_" + name if name in ("", ".", "..") else name


def unique_names(names: Iterable[str], taken: set[str]) -> list[str]:
    """Each name, or ``<name>.<n>`` (n = 1, 2, ...) when an earlier payload already has it.

    ``<n>`` goes before the extension of names that have one from a known list (``.0.o`` stays last),
    so the result is deterministic and every payload gets its own file. ``taken`` is updated.
    """
    result = []
    for name in names:
        candidate = name
        stem, ext = name, ""
        match = re.search(r"\.(o|bc|cubin|fatbin|s|spv)$", name)
        if match:
            stem, ext = name[:match.start()], match.group(0)
        n = 0
        while candidate in taken:
            n += 1
            candidate = f"{stem}.{n}{ext}"
        taken.add(candidate)
        result.append(candidate)
    return result


# --------------------------------------------------------------------------------------------------
# The walk


@dataclass
class _Context:
    """Where the walk is: the file on disk, how to name it, the archive members leading here."""

    path: str  # readable path of the file whose descriptor regions point into
    display: str  # the name to report
    members: tuple[str, ...]
    container: str
    file_stem: str | None = None  # the stem for names of payloads outside archive members

    @property
    def label(self) -> str:
        return self.display + "".join(f"({m})" for m in self.members)

    @property
    def stem(self) -> str:
        if self.members:
            return llvm_stem(self.members[-1])
        return self.file_stem if self.file_stem is not None else llvm_stem(self.display)

    def holding(self, container: str) -> _Context:
        return replace(self, container=container)

    def member(self, name: str) -> _Context:
        return replace(self, members=self.members + (name,))


class _Walker:
    """Finds bundles and NVIDIA fat binaries; collects them as :class:`Payload` objects."""

    def __init__(self, stack: ExitStack, notify: Callable[[str], None] | None = None) -> None:
        self.stack = stack
        self.notify = notify
        self.payloads: list[Payload] = []
        self.ordinals: dict[tuple[str, tuple[str, ...]], int] = {}
        self.fatbin_count: dict[tuple[str, tuple[str, ...]], int] = {}

    def ordinal(self, ctx: _Context) -> int:
        return self.ordinals.setdefault((ctx.path, ctx.members), len(self.ordinals))

    # --- files and archive members -------------------------------------------------------------
    def region(self, region: FileRegion, ctx: _Context, depth: int) -> None:
        self.ordinal(ctx)
        head = region.pread(64, 0)
        kind = identify(head)
        if kind is ContainerKind.ARCHIVE:
            self._archive(region, ctx, depth)
        elif kind is ContainerKind.THIN_ARCHIVE:
            self._thin_archive(region, ctx, depth)
        elif kind in (ContainerKind.ELF_RELOCATABLE, ContainerKind.ELF_EXECUTABLE, ContainerKind.ELF_SHARED_OBJECT):
            self._elf(region, ctx, kind)
        elif head[:4] == CCOB_MAGIC or head[:len(BUNDLE_MAGIC)] == BUNDLE_MAGIC:
            container = "compressed bundle file" if head[:4] == CCOB_MAGIC else "bundle file"
            self._bundles(region, ctx.holding(container), None, text_ok=True)
        elif _text_comment(head) is not None:
            self._bundles(region, ctx.holding("text bundle file"), None, text_ok=True)
        elif len(head) >= 4 and struct.unpack_from("<I", head)[0] == FATBIN_MAGIC:
            self._fatbins(region, ctx.holding("nvidia fatbin file"), None)

    def _archive(self, region: FileRegion, ctx: _Context, depth: int) -> None:
        if depth >= _MAX_DEPTH:
            raise OffloadFormatError(f"archives nested more than {_MAX_DEPTH} deep", path=ctx.label,
                                     offset=region.start)
        for member in read_archive(region, label=ctx.label):
            sub = FileRegion(region.fd, region.start + member.offset, member.size)
            self.region(sub, ctx.member(member.name), depth + 1)

    def _thin_archive(self, region: FileRegion, ctx: _Context, depth: int) -> None:
        """Thin archives name their members' files; each is searched as a file of its own."""
        if depth >= _MAX_DEPTH:
            raise OffloadFormatError(f"archives nested more than {_MAX_DEPTH} deep", path=ctx.label,
                                     offset=region.start)
        for name, header_at in _thin_members(region, ctx.label):
            target = name if os.path.isabs(name) else os.path.join(os.path.dirname(ctx.path), name)
            try:
                fd = os.open(target, os.O_RDONLY)
            except FileNotFoundError:
                raise OffloadFormatError(f"thin archive member {name!r} is missing", path=ctx.label,
                                         offset=region.start + header_at) from None
            self.stack.callback(os.close, fd)
            size = os.fstat(fd).st_size
            self.region(FileRegion(fd, 0, size), _Context(target, target, (), ctx.container), depth + 1)

    # --- ELF -------------------------------------------------------------------------------------
    def _elf(self, region: FileRegion, ctx: _Context, kind: ContainerKind) -> None:
        label = ctx.label
        wanted: list[tuple[str, int, int, int]] = []  # name, offset, size, section header offset
        object_bundle = False
        table = read_sections(region.pread, region.size, path=label, base=region.start)
        if kind is ContainerKind.ELF_SHARED_OBJECT and table.has_interpreter:
            kind = ContainerKind.ELF_EXECUTABLE
        for section in table.sections:
            name = section.name
            if name.startswith(_OBJECT_BUNDLE_PREFIX):
                object_bundle = True
            elif name in (".hip_fatbin", ".nv_fatbin") and section.sh_type != SHT_NOBITS:
                wanted.append((name, section.sh_offset, section.sh_size, region.start + section.header_at))
        elf_ctx = ctx.holding(kind.value)
        for name, offset, size, header_at in wanted:
            if offset > region.size or size > region.size - offset:
                raise OffloadFormatError(f"section {name} [{offset:#x}, {offset + size:#x}) runs past the end of "
                                         f"the file ({region.size:#x} bytes)", path=label, offset=header_at)
            sub = FileRegion(region.fd, region.start + offset, size)
            if name == ".hip_fatbin":
                self._bundles(sub, elf_ctx, name, text_ok=False)
            else:
                self._fatbins(sub, elf_ctx, name)
        if object_bundle:
            self._object_bundle(region, elf_ctx)

    def _object_bundle(self, region: FileRegion, ctx: _Context) -> None:
        entries = parse_object_bundle(region, label=ctx.label, base=region.start)
        order = self.ordinal(ctx)
        for index, entry in enumerate(entries):
            kind, triple, target = split_bundle_id(entry.id)
            section = _OBJECT_BUNDLE_PREFIX + entry.id
            absolute = region.start + entry.offset
            if entry.host_object:
                image_kind = "host object"
                copy = self._host_object_copier(region, ctx)
            else:
                image_kind = _sniff(region, entry.offset, entry.size)
                copy = _range_copier(region.fd, absolute, entry.size)
            self.payloads.append(Payload(
                ctx.display, ctx.container, ctx.members, section, "object bundle", index, None, kind, triple,
                target, image_kind, entry.size, absolute, "file", f"{ctx.stem}-{entry.id}".replace(":", "_"),
                bundle_id=entry.id, _copy=copy, _sort_key=(order, absolute, index)))

    def _host_object_copier(self, region: FileRegion, ctx: _Context) -> Callable[[int], None]:
        """The host entry of an object bundle is the object itself: Clang's unbundler writes it with the
        bundle sections removed by ``llvm-objcopy``, and so do we."""
        def copy(fd: int) -> None:
            import subprocess
            import tempfile

            with tempfile.TemporaryDirectory(prefix="offload-inspect-") as tmp:
                source = os.path.join(tmp, "in.o")
                stripped = os.path.join(tmp, "out.o")
                with open(source, "wb") as f:
                    copy_range(region.fd, region.start, f.fileno(), region.size)
                result = subprocess.run([find_llvm_objcopy(), "--regex", f"--remove-section={_OBJECT_BUNDLE_PREFIX}.*",
                                         "--", source, stripped], capture_output=True, text=True,
                                        errors="surrogateescape")
                if result.returncode != 0:
                    detail = (result.stderr.strip().splitlines() or ["no message"])[-1]
                    raise OffloadError(f"{ctx.label}: 'llvm-objcopy' failed on the host object: {detail}")
                with open(stripped, "rb") as f:
                    copy_range(f.fileno(), 0, fd, os.fstat(f.fileno()).st_size)
        return copy

    # --- bundles ---------------------------------------------------------------------------------
    def _bundles(self, region: FileRegion, ctx: _Context, section: str | None, *, text_ok: bool) -> None:
        """The bundles filling ``region`` back to back, zero padding allowed between them."""
        label = ctx.label + (f": section {section}" if section else "")
        order = self.ordinal(ctx)
        position, index = 0, 0
        while position < region.size:
            absolute = region.start + position
            sub = FileRegion(region.fd, absolute, region.size - position)
            head = sub.pread(len(BUNDLE_MAGIC), 0)
            if head[:4] == CCOB_MAGIC:
                import tempfile

                # Decompressed only as far as it is read: the header and the first bytes of each entry,
                # unless the payloads are extracted.
                spool = self.stack.enter_context(tempfile.TemporaryFile(prefix="offload-inspect-"))
                header, inner = open_decompressed(sub, spool.fileno(), path=label, base_offset=absolute,
                                                  verify_hash=False, notify=self.notify)
                info = CompressionInfo(absolute, header.version, header.method.name.lower(), header.total_size,
                                       header.uncompressed_size)
                inner_label = f"{label} (the data decompressed from the bundle at offset {absolute:#x})"
                self._one_bundle(inner, ctx, section, index, inner_label, info, order, absolute, text_ok=True)
                end = position + header.total_size
            elif head == BUNDLE_MAGIC:
                end = position + self._one_bundle(sub, ctx, section, index, label, None, order, absolute,
                                                  text_ok=False)
            elif text_ok and index == 0 and _text_comment(head + sub.pread(64, len(head))) is not None:
                self._one_bundle(sub, ctx, section, index, label, None, order, absolute, text_ok=True)
                end = region.size
            else:
                what = ("neither zero padding nor another bundle follows the bundle before it" if index else
                        "no bundle here (expected __CLANG_OFFLOAD_BUNDLE__ or CCOB)")
                raise BundleFormatError(what, path=label, offset=absolute)
            index += 1
            position = _skip_zeros(region, end)

    def _one_bundle(self, region: FileRegion, ctx: _Context, section: str | None, index: int, label: str,
                    info: CompressionInfo | None, order: int, sort_at: int, *, text_ok: bool) -> int:
        """Record the entries of the (binary or text) bundle at the start of ``region``; returns its extent."""
        head = region.pread(len(BUNDLE_MAGIC) + 64, 0)
        base = 0 if info is not None else region.start
        comment = _text_comment(head) if text_ok else None
        entries: Sequence[BundleEntry]
        if head[:len(BUNDLE_MAGIC)] == BUNDLE_MAGIC:
            bundle = parse_binary_bundle(region, label=label, base=base)
            entries, extent, fmt = bundle.entries, bundle.end, "bundle"
        elif comment is not None:
            region.ensure(region.size, "find the entries of a text bundle")
            entries = parse_text_bundle(region, comment, label=label, base=base)
            extent, fmt = region.size, "text bundle"
        else:
            raise BundleFormatError("the decompressed data is not a bundle", path=label, offset=0)
        for number, entry in enumerate(entries):
            kind, triple, target = split_bundle_id(entry.id)
            image_kind = "text" if fmt == "text bundle" else _sniff(region, entry.offset, entry.size)
            self.payloads.append(Payload(
                ctx.display, ctx.container, ctx.members, section, "compressed " + fmt if info else fmt, index,
                base if info is None else 0, kind, triple, target, image_kind, entry.size,
                entry.offset + base if info is None else entry.offset,
                "file" if info is None else "decompressed bundle", f"{ctx.stem}-{entry.id}".replace(":", "_"),
                bundle_id=entry.id, compression=info, _copy=_region_copier(region, entry.offset, entry.size),
                _sort_key=(order, sort_at, number), _head=_head_reader(region, entry.offset)))
        return extent

    # --- NVIDIA fat binaries ---------------------------------------------------------------------
    def _fatbins(self, region: FileRegion, ctx: _Context, section: str | None) -> None:
        label = ctx.label + (f": section {section}" if section else "")
        order = self.ordinal(ctx)
        key = (ctx.path, ctx.members)
        position, index = 0, 0
        while position < region.size:
            absolute = region.start + position
            head = region.pread(_FATBIN_HEADER.size, position)
            if len(head) < 4 or struct.unpack_from("<I", head)[0] != FATBIN_MAGIC:
                what = ("neither zero padding nor another fat binary follows the one before it" if index else
                        "no NVIDIA fat binary here (expected magic 0xba55ed50)")
                raise OffloadFormatError(what, path=label, offset=absolute)
            if len(head) < _FATBIN_HEADER.size:
                raise OffloadFormatError("truncated NVIDIA fat binary header", path=label, offset=absolute)
            _, _version, header_size, body = _FATBIN_HEADER.unpack(head)
            left = region.size - position
            if header_size < _FATBIN_HEADER.size or header_size > left:
                raise OffloadFormatError(f"fat binary header size {header_size} is outside [16, {left}]",
                                         path=label, offset=absolute + 6)
            if body > left - header_size:
                raise OffloadFormatError(f"fat binary of {header_size + body} bytes runs past the end of the data "
                                         f"({left} bytes left)", path=label, offset=absolute + 8)
            total = header_size + body
            entries = _fatbin_entries(region, position + header_size, position + total, label)
            number = self.fatbin_count.get(key, 0)
            self.fatbin_count[key] = number + 1
            archs = ",".join(dict.fromkeys(e.arch for e in entries if e.arch))
            self.payloads.append(Payload(
                ctx.display, ctx.container, ctx.members, section, "nvidia fatbin", index, absolute, "cuda",
                "nvptx64-nvidia-cuda", archs, "fatbinary", total, absolute, "file",
                f"{ctx.stem}-nv_fatbin.{number}.fatbin", entries=tuple(entries),
                _copy=_range_copier(region.fd, absolute, total), _sort_key=(order, absolute, 0)))
            index += 1
            position = _skip_zeros(region, position + total)


def _fatbin_entries(region: FileRegion, start: int, end: int, label: str) -> list[FatbinEntry]:
    entries = []
    position = start
    while position < end:
        absolute = region.start + position
        if end - position < _FATBIN_ENTRY.size:
            raise OffloadFormatError(f"truncated fat binary entry header ({end - position} bytes left)",
                                     path=label, offset=absolute)
        raw = region.pread(min(_FATBIN_ENTRY_FULL.size, end - position), position)
        kind_value, _, header_size, payload = _FATBIN_ENTRY.unpack_from(raw)
        if header_size < _FATBIN_ENTRY.size or header_size > end - position:
            raise OffloadFormatError(f"fat binary entry header size {header_size} is outside "
                                     f"[{_FATBIN_ENTRY.size}, {end - position}]", path=label, offset=absolute + 4)
        if payload > end - position - header_size:
            raise OffloadFormatError(f"fat binary entry payload of {payload} bytes runs past the end of the fat "
                                     f"binary", path=label, offset=absolute + 8)
        kind = _FATBIN_KINDS.get(kind_value, f"unknown({kind_value})")
        arch, compressed, uncompressed = "", False, None
        if header_size >= _FATBIN_ENTRY_FULL.size and len(raw) >= _FATBIN_ENTRY_FULL.size:
            fields = _FATBIN_ENTRY_FULL.unpack_from(raw)
            sm, flags = fields[8], fields[11]
            arch = f"{'compute' if kind == 'ptx' else 'sm'}_{sm}"
            compressed = bool(flags & _FATBIN_COMPRESSED_FLAGS)
            uncompressed = fields[13] if compressed else None
        entries.append(FatbinEntry(kind, arch, absolute + header_size, payload, compressed, uncompressed))
        position += header_size + payload
    return entries


def _thin_members(region: FileRegion, label: str) -> list[tuple[str, int]]:
    """``(name, header offset)`` of each member of a thin archive (whose data live in other files)."""
    members: list[tuple[str, int]] = []
    names = b""
    position = 8
    while position < region.size:
        raw = region.pread(60, position)
        if len(raw) < 60 or raw[58:60] != b"`\n":
            raise OffloadFormatError("bad thin archive member header", path=label, offset=region.start + position)
        name, digits = raw[:16].rstrip(b" "), raw[48:58].rstrip(b" ")
        if not digits.isdigit():
            raise OffloadFormatError(f"bad archive member size {digits!r}", path=label,
                                     offset=region.start + position + 48)
        size = int(digits)
        data = position + 60
        if name in (b"/", b"/SYM64/", b"//"):
            if size > region.size - data:
                raise OffloadFormatError("archive table runs past the end of the archive", path=label,
                                         offset=region.start + position + 48)
            if name == b"//":
                names = region.pread(size, data)
            position = data + size + (size & 1)
            continue
        if name.startswith(b"/") and name[1:].isdigit():
            at = int(name[1:])
            stop = names.find(b"\n", at)
            if at >= len(names) or stop < 0:
                raise OffloadFormatError(f"long member name /{at} has no entry in the name table", path=label,
                                         offset=region.start + position)
            name = names[at:stop]
        members.append((name.rstrip(b"/").decode("utf-8", "surrogateescape"), position))
        position = data  # a thin archive stores no member data
    return members


def _text_comment(head: bytes) -> str | None:
    """The comment leader of a text bundle starting at ``head``, or None."""
    for comment in dict.fromkeys(TEXT_COMMENTS.values()):
        if head.startswith(f"\n{comment} {_OBJECT_BUNDLE_PREFIX}__START__ ".encode()):
            return comment
    return None


def _skip_zeros(region: FileRegion, position: int) -> int:
    while position < region.size:
        chunk = region.pread(1 << 16, position)
        stripped = chunk.lstrip(b"\0")
        if stripped:
            return position + len(chunk) - len(stripped)
        position += len(chunk)
    return position


def _sniff(region: FileRegion, offset: int, size: int) -> str:
    """What a bundle entry holds, named as llvm-objdump names image kinds."""
    if size == 0:
        return "<none>"
    region.ensure(offset + min(size, 20), "read the first bytes of an entry")
    head = region.pread(min(size, 20), offset)
    if head[:4] == _ELF_MAGIC:
        machine = struct.unpack_from("<H" if head[5:6] != b"\x02" else ">H", head, 18)[0] if len(head) >= 20 else 0
        return "cubin" if machine == _EM_CUDA else "elf"
    if head[:4] in _BC_MAGICS:
        return "llvm ir"
    if len(head) >= 4 and struct.unpack_from("<I", head)[0] == FATBIN_MAGIC:
        return "fatbinary"
    return "data"


def _range_copier(fd: int, offset: int, size: int) -> Callable[[int], None]:
    return lambda out: copy_range(fd, offset, out, size)


def _region_copier(region: FileRegion, offset: int, size: int) -> Callable[[int], None]:
    """Copies ``size`` bytes at ``offset`` of ``region``. Compressed data is decompressed whole first, and checked
    as a whole (its size, and nothing after the stream), as extraction always did."""
    def copy(out: int) -> None:
        region.ensure(region.size, "extract its entries")
        copy_range(region.fd, region.start + offset, out, size)
    return copy


def _head_reader(region: FileRegion, offset: int) -> Callable[[int], bytes]:
    """Reads the first bytes of the entry at ``offset`` of ``region`` (decompressing no further)."""
    return lambda size: region.pread(size, offset)


# --------------------------------------------------------------------------------------------------
# Offload binaries (through containers)


def _binary_payloads(found: Sequence[FoundBinary], path: str, display: str, stem: str, llvm_version: int,
                     ordinals: dict[tuple[str, tuple[str, ...]], int]) -> list[Payload]:
    """Payloads for the offload binaries ``containers`` found, named as ``clang-offload-packager
    <file> --image=`` names them: ``<stem>-<triple>-<arch>.<index>.<ext>``, index in LLVM's order."""
    table = kind_table(llvm_version)
    result = []
    per_place: dict[tuple[str, tuple[str, ...], str | None, str | None], int] = {}
    for number, item in enumerate(found):
        binary, origin = item.binary, item.origin
        place = (origin.file, origin.members, origin.section, origin.symbol)
        index = per_place.get(place, 0)
        per_place[place] = index + 1
        image = table.image_kind(binary.image_kind)
        image_name = _OBJDUMP_IMAGE_NAMES.get(image, "<none>") if image is not None else "<none>"
        in_memory = binary.data is not None
        name = f"{stem}-{binary.triple}-{binary.arch}.{number}.{table.image_kind_name(binary.image_kind)}"
        order = ordinals.get((origin.file, origin.members), len(ordinals))
        result.append(Payload(
            display if origin.file == path else origin.file,  # another file: a thin archive's member
            origin.container.value, origin.members, origin.section, "offload binary", index, binary.offset,
            table.offload_kind_name(binary.offload_kind), binary.triple, binary.arch, image_name,
            binary.image_size, binary.image_offset, f"global @{origin.symbol}" if in_memory else "file", name,
            strings=tuple(binary.string_map.items()), symbol=origin.symbol if in_memory else None,
            _copy=item.copy_image, _sort_key=(order, 0 if in_memory else binary.offset, number)))
    return result


# --------------------------------------------------------------------------------------------------
# Entry point


def inspect_file(path: str | os.PathLike[str], *, llvm_version: int = 19, display: str | None = None,
                 stem: str | None = None, notify: Callable[[str], None] | None = None) -> Inspection:
    """Every offload payload in the file at ``path``, in file order (archive members in turn).

    ``display`` is the name to report instead of ``path`` (e.g. ``<stdin>`` for spooled input), ``stem``
    the file-name stem extraction names start with (default: ``display``'s).
    ``llvm_version`` selects the OffloadBinary kind numbering (HIP is 3 before LLVM 21, 4 after).
    A file without offload content gives no payloads; malformed content raises
    :class:`~offload_builders.errors.OffloadFormatError`.

    Compressed bundles are decompressed only as far as their headers and the first bytes of each entry
    (for its image kind); the rest when a payload is copied out. Their hash is not checked, as Clang does not.
    Where much must be decompressed in one go (a compressed text bundle, an entry far into the data),
    ``notify`` hears how much first.
    """
    fspath = os.fspath(path)
    shown = display if display is not None else fspath
    stack = ExitStack()
    try:
        fd = os.open(fspath, os.O_RDONLY)
        stack.callback(os.close, fd)
        size = os.fstat(fd).st_size
        found = extract_offload_binaries(fspath, display=display)
        walker = _Walker(stack, notify)
        walker.region(FileRegion(fd, 0, size), _Context(fspath, shown, (), "file", stem), 0)
        payloads = _binary_payloads(found, fspath, shown, stem if stem is not None else llvm_stem(shown),
                                    llvm_version, walker.ordinals) + walker.payloads
        payloads.sort(key=lambda p: p._sort_key)
        return Inspection(shown, payloads, stack)
    except BaseException:
        stack.close()
        raise
