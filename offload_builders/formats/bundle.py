"""clang-offload-bundler's bundles: binary, text and object bundles.

Byte layouts and behaviour follow clang/lib/Driver/OffloadBundler.cpp (LLVM 19); see
docs in ``shared/reference/bundler-and-target-id.md``.  In short:

* **binary** (``-type=bc|gch|ast``, and ``o``/``a`` when the reference input is not an object file):
  the magic ``__CLANG_OFFLOAD_BUNDLE__``, a u64 entry count, one ``(u64 offset, u64 size, u64 id
  length, id)`` record per entry (all little-endian), then the entries in ``-targets`` order, each
  at ``offset`` aligned to ``-bundle-align``, zero padding in between and none at the end.
* **text** (``i ii cui hipi d s ll``): each entry between ``\\n<c> __CLANG_OFFLOAD_BUNDLE____START__ <id>\\n``
  and ``\\n<c> __CLANG_OFFLOAD_BUNDLE____END__ <id>\\n`` lines, ``<c>`` the type's comment leader.
* **object** (``-type=o`` with an ELF host): one ``__CLANG_OFFLOAD_BUNDLE__<id>`` section per entry,
  added by ``llvm-objcopy``; the host's section holds a single zero byte (the object *is* the host).
* **compressed** (``-compress``): see :mod:`offload_builders.formats.compressed`.
* **archive** (``-type=a``, unbundling only): see :mod:`offload_builders.formats.bundle_archive`.

Design points that differ from Clang 19, deliberately:

* Reading is hardened.  Clang 19 stops parsing a damaged header without an error and then uses an
  uninitialized iterator (it segfaults on a truncated bundle); here every offset, size and count is
  checked against the data and any problem is a :class:`BundleFormatError` naming the byte offset.
  Duplicate IDs (Clang: the last one wins), overlapping entries, bad UTF-8 and mismatched text
  markers are errors too.
* Several bundles back to back (a ``.hip_fatbin`` section linked from many objects) are read one after
  another, each found from the previous one's extent (the header's total size for ``CCOB`` v2/v3,
  the furthest entry end for a binary bundle) plus zero padding, never by searching for a magic
  (which can occur inside compressed data).
* Data is streamed: images are copied with ``copy_file_range``/``sendfile`` and never held in
  memory, and every output is written to a temporary file renamed into place only when the whole
  operation succeeded.
"""
from __future__ import annotations

import os
import stat
import struct
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack

from offload_builders.errors import BundleFormatError, OffloadError
from offload_builders.formats import _io
from offload_builders.formats._io import CHUNK, ShortReadError, copy_file_range_stream, write_all
from offload_builders.formats._record import Record
from offload_builders.formats.bundle_id import (
    clang_stringmap_order,
    is_code_object_compatible,
    parse_bundle_entry_id,
    validate_targets,
)
from offload_builders.formats.compressed import (
    CompressedWriter,
    CompressionOptions,
    CompressionStats,
    FileRegion,
    is_compressed,
    open_decompressed,
)
from offload_builders.formats.llvm_objcopy import run_objcopy

# typing is imported for type checkers only: it costs the command line ~3 ms of start-up.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Final, Literal

MAGIC: Final = b"__CLANG_OFFLOAD_BUNDLE__"
MAGIC_STR: Final = MAGIC.decode()
_COUNT: Final = struct.Struct("<24sQ")  # magic, number of entries
_ENTRY: Final = struct.Struct("<QQQ")  # offset, size, id length (the id follows)
ELF_MAGIC: Final = b"\x7fELF"

#: ``-type`` values whose bundles are text, with their comment leader.
TEXT_COMMENTS: Final[dict[str, str]] = {"i": "//", "ii": "//", "cui": "//", "hipi": "//", "d": "#",
                                        "ll": ";", "s": "#"}
BINARY_TYPES: Final = frozenset({"bc", "gch", "ast"})
OBJECT_TYPES: Final = frozenset({"o", "a"})
FILE_TYPES: Final = tuple(TEXT_COMMENTS) + ("bc", "o", "a", "gch", "ast")

#: Bundle headers are tiny in practice (CLR reads only the first 4 KiB); a count above this is damage.
MAX_ENTRIES: Final = 1 << 16
#: An entry ID is never long, nor a header large (CLR reads only the first 4 KiB): bounding both keeps
#: a damaged file from being read into memory.
MAX_ID_LENGTH: Final = 1 << 16
MAX_HEADER_SIZE: Final = 16 << 20

#: How a bundle part is stored: "binary", "text", "object", or "plain" (not a bundle at all).
if TYPE_CHECKING:
    Format = Literal["binary", "text", "object", "plain"]
else:
    Format = str


def check_file_type(file_type: str) -> None:
    """Raise Clang's message for an unknown ``-type``."""
    if file_type not in FILE_TYPES:
        raise OffloadError(f"'{file_type}': invalid file type specified")


def _fail(message: str, label: str | None, offset: int | None) -> BundleFormatError:
    return BundleFormatError(message, path=label, offset=offset)


# ============================================================================================
# Streaming I/O
# ============================================================================================
def copy_range(src_fd: int, src_offset: int, dst_fd: int, size: int) -> None:
    """Append ``size`` bytes of ``src_fd`` at ``src_offset`` to ``dst_fd`` (streamed, in the kernel when it
    can: :func:`~offload_builders.formats._io.copy_file_range_stream`).

    The sizes were checked against the input, so running short means the input is damaged (or shrank).
    """
    try:
        copy_file_range_stream(src_fd, dst_fd, src_offset, size)
    except ShortReadError as exc:
        raise BundleFormatError(f"input ended {exc.remaining} bytes before the expected end") from None


class _PlainSink:
    """Where an uncompressed bundle goes: the output descriptor itself."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, data: bytes) -> None:
        write_all(self.fd, data)

    def copy_from(self, fd: int, offset: int, size: int) -> None:
        copy_range(fd, offset, self.fd, size)

    def finish(self) -> None:
        return None


def _write_zeros(sink, count: int) -> None:
    block = bytes(min(count, CHUNK))
    while count > 0:
        sink.write(block[:count])
        count -= len(block)


class Outputs(_io.Outputs):
    """:class:`~offload_builders.formats._io.Outputs` (temporaries renamed into place together at the end,
    none left behind on error), failing with the bundler's own error type."""

    @staticmethod
    def error(path: str, exc: OSError) -> Exception:
        """An output that cannot be created or renamed into place is an :class:`OffloadError` line."""
        return OffloadError(f"'{path}': {exc.strerror}")


class InputFile(Record):
    """An opened input: a regular file, or anything else spooled into a temporary file first."""

    __slots__ = ("path", "fd", "size")
    path: str  # a name tools such as llvm-objcopy can open
    fd: int
    size: int

    def __init__(self, path: str, fd: int, size: int) -> None:
        self._init(path, fd, size)


def open_input(path: str | os.PathLike[str], stack: ExitStack) -> InputFile:
    """Open ``path`` (``-``: standard input) for as long as ``stack``; what is not a regular file is spooled."""
    name = os.fspath(path)
    try:
        if name == "-":
            source = sys.stdin.buffer
        else:
            fd = os.open(name, os.O_RDONLY)
            stack.callback(os.close, fd)
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode):
                return InputFile(name, fd, st.st_size)
            if stat.S_ISDIR(st.st_mode):
                raise OffloadError(f"'{name}': Is a directory")
            source = os.fdopen(os.dup(fd), "rb")
            stack.callback(source.close)
    except OSError as exc:
        raise OffloadError(f"'{name}': {exc.strerror}") from None
    import shutil
    import tempfile

    spool = stack.enter_context(tempfile.NamedTemporaryFile(prefix="offload-bundler-", suffix=".in"))
    shutil.copyfileobj(source, spool, CHUNK)
    spool.flush()
    return InputFile(spool.name, spool.fileno(), spool.tell())


# ============================================================================================
# Binary format
# ============================================================================================
class BundleEntry(Record):
    """One bundle entry: its ID as stored, and where its bytes are in the part that holds it.

    ``host_object``: an object bundle's host section (one zero byte): the host output is the object
    minus bundles.
    """

    __slots__ = ("id", "offset", "size", "host_object")
    id: str
    offset: int
    size: int
    host_object: bool

    def __init__(self, id: str, offset: int, size: int, host_object: bool = False) -> None:
        self._init(id, offset, size, host_object)


class BinaryBundle(Record):
    """A parsed binary bundle header.  Offsets are relative to the bundle's first byte.

    ``entries`` are in header order; ``end`` is the furthest byte used: header or entry data.
    """

    __slots__ = ("entries", "header_size", "end")
    entries: tuple[BundleEntry, ...]
    header_size: int
    end: int

    def __init__(self, entries: tuple[BundleEntry, ...], header_size: int, end: int) -> None:
        self._init(entries, header_size, end)

    @property
    def clang_order(self) -> list[BundleEntry]:
        """The order Clang visits entries in (``StringMap`` order), for ``--list`` and unbundling."""
        by_id = {entry.id: entry for entry in self.entries}
        return [by_id[key] for key in clang_stringmap_order(entry.id for entry in self.entries)]


def align_to(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


def binary_layout(ids: Sequence[str], sizes: Sequence[int], alignment: int = 1) -> tuple[bytes, list[int], int]:
    """The header bytes, entry offsets and total size Clang writes for these entries.

    Every entry, an empty host entry too, starts at the running offset aligned to ``alignment``;
    the file ends right after the last entry.
    """
    if alignment < 1:
        raise OffloadError(f"bundle alignment must be at least 1, not {alignment}")
    encoded = [i.encode() for i in ids]
    running = _COUNT.size + sum(_ENTRY.size + len(e) for e in encoded)
    header = bytearray(_COUNT.pack(MAGIC, len(ids)))
    offsets = []
    for raw, size in zip(encoded, sizes):
        running = align_to(running, alignment)
        offsets.append(running)
        header += _ENTRY.pack(running, size, len(raw)) + raw
        running += size
    return bytes(header), offsets, running


def _decode_id(raw: bytes, label: str | None, offset: int, what: str) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(f"{what}: the bundle entry ID is not valid UTF-8 ({exc.reason} at byte {exc.start})",
                    label, offset + exc.start) from None
    if not text:
        raise _fail(f"{what}: empty bundle entry ID", label, offset)
    bad = next((i for i, ch in enumerate(text) if ord(ch) < 0x20 or ord(ch) == 0x7F), None)
    if bad is not None:
        raise _fail(f"{what}: the bundle entry ID {text!r} contains a control character", label,
                    offset + len(text[:bad].encode()))
    return text


def parse_binary_bundle(region: FileRegion, *, label: str | None = None, base: int = 0) -> BinaryBundle:
    """Parse and check the binary bundle header at the start of ``region``.

    Everything is validated before use: the count against the space it needs (before anything is
    allocated), each record and ID against the end of the data, each entry's bytes against the end
    of the data and the end of the header, and IDs for UTF-8, uniqueness and overlap.  ``base`` is
    the region's offset in ``label``, for messages.
    """
    limit = region.size
    head = region.pread(_COUNT.size, 0)
    if len(head) < _COUNT.size:
        if head[:len(MAGIC)] != MAGIC:
            raise _fail("not a bundle (no __CLANG_OFFLOAD_BUNDLE__ magic)", label, base)
        raise _fail(f"truncated bundle header: {len(head)} bytes, the magic and entry count need "
                    f"{_COUNT.size}", label, base + len(head))
    magic, count = _COUNT.unpack(head)
    if magic != MAGIC:
        raise _fail("not a bundle (no __CLANG_OFFLOAD_BUNDLE__ magic)", label, base)
    room = (limit - _COUNT.size) // (_ENTRY.size + 1)
    if count > room:
        raise _fail(f"entry count {count} cannot fit: the {limit}-byte data has room for at most {room} "
                    f"entry records", label, base + len(MAGIC))
    if count > MAX_ENTRIES:
        raise _fail(f"entry count {count} exceeds this reader's limit of {MAX_ENTRIES}", label,
                    base + len(MAGIC))
    records: list[tuple[int, int, int, int, str]] = []  # record offset, offset, size, id offset, id
    cursor = _COUNT.size
    window = b""
    window_at = cursor
    for index in range(count):
        what = f"entry {index}"
        if cursor + _ENTRY.size > window_at + len(window):
            window = region.pread(max(CHUNK, _ENTRY.size), cursor)
            window_at = cursor
        if cursor + _ENTRY.size > window_at + len(window):
            raise _fail(f"{what}: the entry record runs past the end of the data ({limit} bytes); "
                        f"the bundle is truncated", label, base + cursor)
        offset, size, id_len = _ENTRY.unpack_from(window, cursor - window_at)
        id_at = cursor + _ENTRY.size
        if id_len > limit - id_at:
            raise _fail(f"{what}: ID length {id_len} runs past the end of the data ({limit} bytes)",
                        label, base + cursor + 16)
        if id_len > MAX_ID_LENGTH or id_at + id_len > MAX_HEADER_SIZE:
            raise _fail(f"{what}: ID length {id_len} makes the header larger than this reader accepts "
                        f"(IDs up to {MAX_ID_LENGTH} bytes, headers up to {MAX_HEADER_SIZE})", label,
                        base + cursor + 16)
        if id_at + id_len > window_at + len(window):
            window = region.pread(CHUNK, id_at)
            window_at = id_at
        raw = window[id_at - window_at:id_at - window_at + id_len]
        records.append((cursor, offset, size, id_at, _decode_id(raw, label, base + id_at, what)))
        cursor = id_at + id_len
    header_size = cursor
    entries: list[BundleEntry] = []
    seen: dict[str, int] = {}
    end = header_size
    for index, (record_at, offset, size, id_at, text) in enumerate(records):
        what = f"entry {index} ({text})"
        if text in seen:
            raise _fail(f"{what}: duplicate bundle entry ID (also entry {seen[text]}); Clang would keep "
                        f"only the last", label, base + id_at)
        seen[text] = index
        if offset < header_size:
            raise _fail(f"{what}: offset {offset} points into the {header_size}-byte header", label,
                        base + record_at)
        if size > limit - offset:
            raise _fail(f"{what}: data at offset {offset} with size {size} runs past the end of the data "
                        f"({limit} bytes)", label, base + record_at + 8)
        entries.append(BundleEntry(text, offset, size))
        end = max(end, offset + size)
    ordered = sorted((e for e in entries if e.size), key=lambda e: e.offset)
    for first, second in zip(ordered, ordered[1:]):
        if second.offset < first.offset + first.size:
            index = entries.index(second)
            raise _fail(f"entries '{first.id}' [{first.offset}, {first.offset + first.size}) and "
                        f"'{second.id}' [{second.offset}, {second.offset + second.size}) overlap", label,
                        base + records[index][0])
    return BinaryBundle(tuple(entries), header_size, end)


# ============================================================================================
# Text format
# ============================================================================================
def text_markers(comment: str) -> tuple[bytes, bytes]:
    """The byte strings that open and close an entry of a text bundle."""
    return (f"\n{comment} {MAGIC_STR}__START__ ".encode(), f"\n{comment} {MAGIC_STR}__END__ ".encode())


def _find(region: FileRegion, needle: bytes, start: int, end: int | None = None) -> int:
    """The offset of ``needle`` in ``region[start:end]`` or -1, read a chunk at a time."""
    end = region.size if end is None else end
    overlap = len(needle) - 1
    position = start
    while position < end:
        chunk = region.pread(min(CHUNK, end - position) + overlap, position)
        found = chunk.find(needle)
        if found >= 0 and position + found + len(needle) <= end:
            return position + found
        if position + len(chunk) >= end:
            return -1
        position += len(chunk) - overlap
    return -1


def parse_text_bundle(region: FileRegion, comment: str, *, label: str | None = None,
                      base: int = 0) -> list[BundleEntry]:
    """The entries of a text bundle, in file order (what Clang lists and unbundles in).

    Stricter than Clang: a START line without an end, a missing END marker, an END marker naming
    another ID, and repeated IDs are errors.
    """
    start_marker, end_marker = text_markers(comment)
    entries: list[BundleEntry] = []
    seen: set[str] = set()
    position = 0
    while (start := _find(region, start_marker, position)) >= 0:
        id_at = start + len(start_marker)
        newline = _find(region, b"\n", id_at, min(region.size, id_at + MAX_ID_LENGTH + 1))
        if newline < 0:
            raise _fail("bundle START line has no end of line (truncated, or an ID over "
                        f"{MAX_ID_LENGTH} bytes)", label, base + start + 1)
        text = _decode_id(region.pread(newline - id_at, id_at), label, base + id_at, "text bundle")
        if text in seen:
            raise _fail(f"duplicate bundle entry ID '{text}'", label, base + id_at)
        seen.add(text)
        content = newline + 1
        close = _find(region, end_marker, content)
        if close < 0:
            raise _fail(f"no END marker for bundle entry '{text}'", label, base + start + 1)
        end_id_at = close + len(end_marker)
        expected = text.encode()
        tail = region.pread(len(expected) + 1, end_id_at)
        if tail == expected + b"\n" or (tail == expected and end_id_at + len(tail) == region.size):
            position = end_id_at + len(tail)
        else:
            raise _fail(f"the END marker does not close bundle entry '{text}'", label, base + end_id_at)
        entries.append(BundleEntry(text, content, close - content))
    return entries


# ============================================================================================
# Object format (ELF)
# ============================================================================================
def parse_object_bundle(region: FileRegion, *, label: str | None = None, base: int = 0) -> list[BundleEntry]:
    """The ``__CLANG_OFFLOAD_BUNDLE__<id>`` sections of an ELF object, in section order."""
    from offload_builders.formats.elf import read_sections  # lazily: unbundling other types stays lean

    entries: list[BundleEntry] = []
    seen: set[str] = set()
    table = read_sections(region.pread, region.size, path=label, base=base, error=BundleFormatError)
    expected_entsize = 64 if table.elfclass == 64 else 40
    if table.sections and table.e_shentsize != expected_entsize:
        raise _fail(f"invalid e_shentsize {table.e_shentsize} (expected {expected_entsize})", label,
                    base + (58 if table.elfclass == 64 else 46))
    if len(table.sections) > MAX_ENTRIES * 4:
        raise _fail(f"{len(table.sections)} ELF sections is more than this reader accepts", label, base)
    for section in table.sections:
        if not section.raw_name.startswith(MAGIC):
            continue
        shdr_at = section.header_at
        text = _decode_id(section.raw_name[len(MAGIC):], label, base + shdr_at, f"section {section.index}")
        if text in seen:
            raise _fail(f"duplicate bundle section for '{text}'", label, base + shdr_at)
        seen.add(text)
        size, offset = section.file_size, section.sh_offset
        if size and (offset > region.size or size > region.size - offset):
            raise _fail(f"section '{MAGIC_STR}{text}' at offset {offset} with size {size} runs past "
                        f"the end of the file ({region.size} bytes)", label, base + shdr_at)
        host = size == 1 and region.pread(1, offset) == b"\0"
        entries.append(BundleEntry(text, offset, size, host_object=host))
    return entries


def strip_bundles(elf_path: str, out_fd: int, *, print_only: bool = False) -> None:
    """The host output of an object bundle: the object without its bundle sections (as Clang does).

    ``print_only`` (``-###``): print the llvm-objcopy command and write nothing, so the host output
    stays empty, as Clang 19 leaves it."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="offload-bundler-") as tmp:
        stripped = os.path.join(tmp, "host.o")
        if not run_objcopy(["--regex", f"--remove-section={MAGIC_STR}.*", "--", elf_path, stripped],
                            print_only=print_only):
            return
        with open(stripped, "rb") as src:
            copy_range(src.fileno(), 0, out_fd, os.fstat(src.fileno()).st_size)


# ============================================================================================
# Reading a whole input: compressed parts, concatenated bundles
# ============================================================================================
class BundlePart(Record):
    """One bundle of an input (a file may hold several back to back), with its entries in Clang's order.

    ``elf_path``: a path to the ELF object, for object parts.
    """

    __slots__ = ("region", "format", "entries", "label", "base", "elf_path")
    region: FileRegion
    format: Format
    entries: list[BundleEntry]
    label: str
    base: int
    elf_path: str | None

    def __init__(self, region: FileRegion, format: Format, entries: list[BundleEntry], label: str, base: int = 0,
                 elf_path: str | None = None) -> None:
        self._init(region, format, entries, label, base, elf_path)

    def region_of(self, entry: BundleEntry) -> tuple[int, int, int]:
        """``(fd, absolute offset, size)`` of an entry's bytes."""
        return self.region.fd, self.region.start + entry.offset, entry.size


class BundleInput:
    """Everything read from one input file (filled in while reading, hence not frozen).

    ``whole`` is what a host output gets when nothing matched: the (decompressed) input.
    """

    __slots__ = ("parts", "whole", "compression")

    def __init__(self, parts: list[BundlePart], whole: FileRegion,
                 compression: list[CompressionStats] | None = None) -> None:
        self.parts = parts
        self.whole = whole
        self.compression: list[CompressionStats] = [] if compression is None else compression

    def __repr__(self) -> str:
        return f"BundleInput(parts={self.parts!r}, whole={self.whole!r}, compression={self.compression!r})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return (self.parts, self.whole, self.compression) == (other.parts, other.whole, other.compression)

    __hash__ = None  # type: ignore[assignment]  # mutable, like a non-frozen dataclass

    @property
    def entries(self) -> Iterator[tuple[BundlePart, BundleEntry]]:
        for part in self.parts:
            for entry in part.entries:
                yield part, entry


def _skip_zeros(region: FileRegion, position: int) -> int:
    while position < region.size:
        chunk = region.pread(CHUNK, position)
        stripped = chunk.lstrip(b"\0")
        if stripped:
            return position + len(chunk) - len(stripped)
        position += len(chunk)
    return position


def read_bundle_input(path: str | os.PathLike[str], file_type: str, stack: ExitStack, *,
                      region: FileRegion | None = None, label: str | None = None, lazy: bool = False,
                      notify: Callable[[str], None] | None = None) -> BundleInput:
    """Open and parse ``path`` (or ``region`` of it) as ``-type=file_type`` would read it.

    Temporary files (decompressed data) live as long as ``stack``.  A compressed bundle is decompressed
    and checked whole before anything is parsed, unless ``lazy`` (for listing): then only as far as its
    parsing reads (a binary bundle's header is at the start), so the parts' regions must be read through
    their ``pread`` or ``ensure``-d before their descriptors are.  ``notify`` gets a line before a lazy read
    decompresses much (:data:`~offload_builders.formats.compressed.ANNOUNCE_BYTES`) in one go.
    """
    check_file_type(file_type)
    name = os.fspath(path)
    if region is None:
        opened = open_input(name, stack)
        region = FileRegion(opened.fd, 0, opened.size)
        name = opened.path if name == "-" else name
    label = label or name
    result = BundleInput([], region)
    elf_path = name if region.start == 0 else None
    _scan(region, label, 0, file_type, stack, result, elf_path=elf_path, nested=False, lazy=lazy, notify=notify)
    return result


def _scan(region: FileRegion, label: str, base: int, file_type: str, stack: ExitStack,
          result: BundleInput, *, elf_path: str | None, nested: bool, lazy: bool = False,
          notify: Callable[[str], None] | None = None) -> None:
    """Split ``region`` into bundle parts: compressed and binary bundles in sequence, or one text,
    object or plain part.

    Each bundle's extent comes from its own header (total size, or the furthest entry); only zero
    padding may separate it from the next, which must start with a bundle magic.
    """
    head = region.pread(len(MAGIC), 0)
    binary_ok = file_type not in TEXT_COMMENTS
    if not (is_compressed(head) or (binary_ok and head == MAGIC)):
        result.parts.append(_single_part(region, label, base, file_type, stack, elf_path))
        return
    position, components, decompressed = 0, 0, None
    while True:
        head = region.pread(len(MAGIC), position)
        sub = region.window(position)
        if is_compressed(head):
            if nested:
                raise _fail("a compressed bundle inside a compressed bundle", label, base + position)
            import tempfile

            spool = stack.enter_context(tempfile.TemporaryFile(prefix="offload-bundler-"))
            header, decompressed = open_decompressed(sub, spool.fileno(), path=label, base_offset=base + position,
                                                     notify=notify)
            if not lazy:
                decompressed.complete()
            result.compression.append(CompressionStats(header))
            _scan(decompressed, f"{label} (decompressed from the bundle at offset {base + position:#x})", 0,
                  file_type, stack, result, elf_path=None, nested=True, lazy=lazy, notify=notify)
            end = position + header.total_size
        elif head == MAGIC and binary_ok:
            bundle = parse_binary_bundle(sub, label=label, base=base + position)
            entries = [BundleEntry(e.id, position + e.offset, e.size) for e in bundle.clang_order]
            result.parts.append(BundlePart(region, "binary", entries, label, base))
            end = position + bundle.end
        else:
            raise _fail("unexpected data after a bundle: neither zero padding nor another bundle", label,
                        base + position)
        components += 1
        if end < region.size:  # what follows must be read (zero padding, or another bundle's magic)
            region.ensure(region.size, "see what follows the bundle in it")
        position = _skip_zeros(region, end)
        if position >= region.size:
            break
    if components == 1 and decompressed is not None and not nested:
        result.whole = decompressed


def _single_part(region: FileRegion, label: str, base: int, file_type: str, stack: ExitStack,
                 elf_path: str | None) -> BundlePart:
    comment = TEXT_COMMENTS.get(file_type)
    if comment is not None:
        region.ensure(region.size, "find the entries of a text bundle")
        return BundlePart(region, "text", parse_text_bundle(region, comment, label=label, base=base), label, base)
    head = region.pread(4, 0)
    if file_type in OBJECT_TYPES and head == ELF_MAGIC:
        entries = parse_object_bundle(region, label=label, base=base)
        if elf_path is None and any(e.host_object for e in entries):
            elf_path = spool_region(region, stack)
        return BundlePart(region, "object", entries, label, base, elf_path)
    if file_type in OBJECT_TYPES and head in (b"\xfe\xed\xfa\xce", b"\xfe\xed\xfa\xcf", b"\xce\xfa\xed\xfe",
                                              b"\xcf\xfa\xed\xfe", b"\0asm"):
        raise _fail("Mach-O and WebAssembly object bundles are not supported (only ELF)", label, base)
    return BundlePart(region, "plain", [], label, base)


def spool_region(region: FileRegion, stack: ExitStack) -> str:
    """A temporary file holding ``region`` (for llvm-objcopy, which reads a path), as long as ``stack``."""
    import tempfile

    spool = stack.enter_context(tempfile.NamedTemporaryFile(prefix="offload-bundler-", suffix=".o"))
    region.ensure(region.size, "copy the host object")
    copy_range(region.fd, region.start, spool.fileno(), region.size)
    spool.flush()
    return spool.name


# ============================================================================================
# Public operations
# ============================================================================================
class BundleResult(Record):
    """What :func:`bundle` wrote."""

    __slots__ = ("ids", "format", "compression")
    ids: tuple[str, ...]
    format: Format
    compression: CompressionStats | None

    def __init__(self, ids: tuple[str, ...], format: Format, compression: CompressionStats | None = None) -> None:
        self._init(ids, format, compression)


def bundle(inputs: Sequence[str | os.PathLike[str]], targets: Sequence[str], output: str | os.PathLike[str],
           *, file_type: str, bundle_align: int = 1, compression: CompressionOptions | None = None,
           llvm_version: int = 19, print_external_commands: bool = False) -> BundleResult:
    """Bundle ``inputs`` (one per target, in the same order) into ``output`` like clang-offload-bundler.

    ``targets`` are standardized and validated as Clang does (see
    :func:`~offload_builders.formats.bundle_id.validate_targets`).  ``compression`` wraps the bundle in
    a ``CCOB`` header (ignored for object bundles, as in Clang, whose llvm-objcopy step overwrites the
    compressed output).  ``print_external_commands`` is ``-###``: the llvm-objcopy command an object
    bundle needs is printed on standard error instead of run, and ``output`` is left as Clang 19 leaves
    it then (empty, or the compressed form of nothing with ``compression``).
    """
    check_file_type(file_type)
    if file_type == "a":
        raise OffloadError("Archive files are only supported for unbundling")
    if len(inputs) != len(targets):
        raise OffloadError("number of input files and targets should match in bundling mode")
    if bundle_align < 1:
        raise OffloadError(f"-bundle-align must be at least 1, not {bundle_align}")
    ids = validate_targets(targets, bundling=True, llvm_version=llvm_version)
    names = [str(entry) for entry in ids]
    host_index = next((i for i, entry in enumerate(ids) if entry.is_host), None)
    with ExitStack() as stack, Outputs() as outputs:
        files = [open_input(path, stack) for path in inputs]
        reference = files[host_index if host_index is not None else 0]
        head = os.pread(reference.fd, 4, 0)
        if file_type in OBJECT_TYPES and head == ELF_MAGIC:
            if host_index is None:
                raise OffloadError("an object bundle (ELF input with -type=o) needs a host target; "
                                   "clang-offload-bundler 19 crashes here. Bundle a host-... target with "
                                   "/dev/null as its input to get the binary format instead")
            if _bundle_object(files, names, host_index, output, outputs, print_only=print_external_commands):
                return BundleResult(tuple(names), "object")
            # -###: Clang 19 has opened the output and compressed its (empty) contents before the
            # llvm-objcopy step that would have overwritten them; that is what remains.
            fd = outputs.create(output)
            stats = CompressedWriter(fd, 0, compression).finish() if compression is not None else None
            return BundleResult(tuple(names), "object", stats)
        fd = outputs.create(output)
        comment = TEXT_COMMENTS.get(file_type)
        if comment is None:
            header, offsets, total = binary_layout(names, [f.size for f in files], bundle_align)
        else:
            start_marker, end_marker = text_markers(comment)
            total = sum(len(start_marker) + len(end_marker) + 2 * (len(n.encode()) + 1) + f.size
                        for n, f in zip(names, files))
        sink = _PlainSink(fd) if compression is None else CompressedWriter(fd, total, compression)
        if comment is None:
            sink.write(header)
            position = len(header)
            for offset, file in zip(offsets, files):
                _write_zeros(sink, offset - position)
                sink.copy_from(file.fd, 0, file.size)
                position = offset + file.size
        else:
            for name, file in zip(names, files):
                sink.write(start_marker + name.encode() + b"\n")
                sink.copy_from(file.fd, 0, file.size)
                sink.write(end_marker + name.encode() + b"\n")
        stats = sink.finish()
        return BundleResult(tuple(names), "binary" if comment is None else "text", stats)


def _bundle_object(files: list[InputFile], names: list[str], host_index: int,
                   output: str | os.PathLike[str], outputs: Outputs, *, print_only: bool = False) -> bool:
    """Add one section per entry to the host object with llvm-objcopy, exactly as Clang 19 does.

    With ``print_only`` (``-###``) the command is printed, not run, nothing is written and the result
    is False."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="offload-bundler-") as tmp:
        marker = os.path.join(tmp, "host-marker")
        with open(marker, "wb") as f:
            f.write(b"\0")
        args: list[str] = []
        for index, (name, file) in enumerate(zip(names, files)):
            source = marker if index == host_index else file.path
            args += [f"--add-section={MAGIC_STR}{name}={source}",
                     f"--set-section-flags={MAGIC_STR}{name}=readonly,exclude"]
        result_path = os.path.join(tmp, "fat.o")
        if not run_objcopy(args + ["--", files[host_index].path, result_path], print_only=print_only):
            return False
        fd = outputs.create(output)
        with open(result_path, "rb") as src:
            copy_range(src.fileno(), 0, fd, os.fstat(src.fileno()).st_size)
    return True


def list_bundle_ids(path: str | os.PathLike[str], *, file_type: str,
                    notify: Callable[[str], None] | None = None) -> list[str]:
    """The IDs ``clang-offload-bundler -list`` prints: hash order for binary bundles (as Clang),
    file order for text and object bundles, bundle after bundle for concatenated ones.

    A compressed bundle is decompressed only as far as its header (``clang-offload-bundler`` decompresses it
    all), so its entries' data are not checked unless they are that short; where everything must be read (a
    text bundle, or data after the bundle), ``notify`` hears how much first when it is much."""
    with ExitStack() as stack:
        data = read_bundle_input(path, file_type, stack, lazy=True, notify=notify)
        return [entry.id for _, entry in data.entries]


class UnbundleResult(Record):
    """Which entry went to which output (``None``: the output was created empty or as a copy)."""

    __slots__ = ("extracted", "compression")
    extracted: dict[str, str | None]
    compression: tuple[CompressionStats, ...]

    def __init__(self, extracted: dict[str, str | None], compression: tuple[CompressionStats, ...] = ()) -> None:
        self._init(extracted, compression)


def _write_entry(part: BundlePart, entry: BundleEntry, fd: int, *, print_only: bool = False) -> None:
    if entry.host_object:
        assert part.elf_path is not None
        strip_bundles(part.elf_path, fd, print_only=print_only)
    else:
        copy_range(*part.region_of(entry)[:2], fd, entry.size)


def _cant_find(names: Sequence[str]) -> str:
    """Clang's "Can't find bundles for A, B, and C" (sorted, with its comma rules)."""
    ordered = sorted(names)
    last = len(ordered) - 1
    message = "Can't find bundles for"
    for index, name in enumerate(ordered):
        if index and last > 1:
            message += ","
        message += " "
        if index == last and index:
            message += "and "
        message += name
    return message


def unbundle(input: str | os.PathLike[str], targets: Sequence[str], outputs: Sequence[str | os.PathLike[str]],
             *, file_type: str, allow_missing_bundles: bool = False, hip_openmp_compatible: bool = False,
             llvm_version: int = 19, print_external_commands: bool = False) -> UnbundleResult:
    """Extract one entry per target from ``input`` into the matching ``outputs``, as Clang 19 does.

    Entries are visited in Clang's order (hash order for binary bundles); each goes to the first
    still-unfilled target it is compatible with (in Clang's hash order of the targets), so with
    several compatible entries we pick the same one Clang does.  A target nothing matches is an
    error ("Can't find bundles for ...") unless ``allow_missing_bundles``, which creates it empty;
    if nothing matched at all, the host target gets a copy of the input (how plain host objects pass
    through an unbundling step).  ``print_external_commands`` is ``-###``: the llvm-objcopy command that
    strips an object bundle for its host output is printed on standard error instead of run, and that
    output is left empty, as Clang 19 does.  Archives (``-type=a``) are
    :func:`~offload_builders.formats.bundle_archive.unbundle_archive`'s.
    """
    check_file_type(file_type)
    if file_type == "a":  # the archive module reads its members with this one: it is not imported from here
        raise OffloadError("an archive (-type=a) is unbundled by "
                           "offload_builders.formats.bundle_archive.unbundle_archive")
    if len(outputs) != len(targets):
        raise OffloadError("number of output files and targets should match in unbundling mode")
    ids = validate_targets(targets, bundling=False, llvm_version=llvm_version)
    by_name = {str(entry): (entry, output) for entry, output in zip(ids, outputs)}
    worklist = clang_stringmap_order(by_name)
    extracted: dict[str, str | None] = {os.fspath(o): None for o in outputs}
    with ExitStack() as stack, Outputs() as out:
        data = read_bundle_input(input, file_type, stack)
        fds = {name: out.create(by_name[name][1]) for name in by_name}
        found_host = False
        for part, entry in data.entries:
            if not worklist:
                break
            code_object = parse_bundle_entry_id(entry.id, strict=False)
            target = next((name for name in worklist if is_code_object_compatible(
                code_object, by_name[name][0], hip_openmp_compatible=hip_openmp_compatible,
                llvm_version=llvm_version)), None)
            if target is None:
                continue
            _write_entry(part, entry, fds[target], print_only=print_external_commands)
            extracted[os.fspath(by_name[target][1])] = entry.id
            worklist.remove(target)
            found_host = found_host or code_object.is_host
        if worklist and not allow_missing_bundles:
            raise OffloadError(_cant_find(worklist))
        if len(worklist) == len(ids):
            for name in worklist:
                if by_name[name][0].is_host:
                    copy_range(data.whole.fd, data.whole.start, fds[name], data.whole.size)
        elif not (found_host or not any(e.is_host for e in ids) or allow_missing_bundles):
            raise OffloadError("Can't find bundle for the host target")
        return UnbundleResult(extracted, tuple(data.compression))
