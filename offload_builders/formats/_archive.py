"""``ar`` archives for the packager and the bundler: one member walk, one writer.

The walk reads GNU and BSD archives (and GNU thin ones), checking every header and size against the
archive; the writer produces what LLVM's ``writeArchive`` writes for ``K_GNU`` with ``Deterministic``
on. Standard library only, and imported by the bundler only for ``-type=a``, so its start-up does not grow.
"""
from __future__ import annotations

import struct

from offload_builders.formats._io import write_all

TYPE_CHECKING = False  # typing costs ~3 ms of start-up; annotations are strings anyway
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from typing import Protocol

    class Member(Protocol):
        """What the writer needs of a member: its name, its size, and a way to stream its bytes."""

        @property
        def name(self) -> str: ...

        @property
        def size(self) -> int: ...

        def copy_to(self, fd: int) -> None: ...

AR_MAGIC = b"!<arch>\n"
THIN_MAGIC = b"!<thin>\n"
HEADER = struct.Struct("16s12s6s6s8s10s2s")  # name, date, uid, gid, mode, size, "`\n"
#: The ``//`` long-name table is read into memory; a larger one is damage, not an archive.
MAX_NAME_TABLE = 64 << 20


# --------------------------------------------------------------------------------------------------
# Reading.


def iter_members(pread: Callable[[int, int], bytes], start: int, end: int, fail: Callable[[str, int], Exception],
                 *, thin: bool = False) -> Iterator[tuple[bytes, int, int, int]]:
    """The regular members of the archive in ``[start, end)``: ``(name, header offset, data offset, size)``.

    ``pread(size, offset)`` reads the archive's file; ``fail(message, offset)`` builds the error raised
    for a damaged archive (offsets are those ``pread`` takes). Symbol tables (``/``, ``/SYM64/``,
    ``__.SYMDEF*``) and the ``//`` name table are skipped, GNU long names and BSD ``#1/N`` names
    resolved, and every size is checked against ``end`` before anything is read. In a thin archive the
    regular members' data lies in the files they name, so only their headers are here.
    """
    pos = start + len(AR_MAGIC)
    long_names: bytes | None = None
    while pos < end:
        if end - pos < HEADER.size:
            raise fail(f"truncated archive member header ({end - pos} bytes left, {HEADER.size} needed)", pos)
        raw_name, _date, _uid, _gid, _mode, raw_size, terminator = HEADER.unpack(pread(HEADER.size, pos))
        if terminator != b"`\n":
            raise fail("archive member header does not end in '`\\n'", pos + 58)
        digits = raw_size.rstrip(b" ")
        if not digits.isdigit():
            raise fail(f"archive member size {raw_size!r} is not a decimal number", pos + 48)
        size = int(digits)
        data = pos + HEADER.size
        name = raw_name.rstrip(b" ")
        stored = 0 if thin and name not in (b"/", b"/SYM64/", b"//") else size
        if stored > end - data:
            raise fail(f"archive member of {size} bytes runs past the end of the archive", pos + 48)
        if name == b"//":
            if size > MAX_NAME_TABLE:
                raise fail(f"archive name table of {size} bytes is larger than the {MAX_NAME_TABLE} this "
                           f"reader accepts", pos)
            long_names = pread(size, data)
        elif name not in (b"/", b"/SYM64/"):
            data_offset, data_size = data, size
            if name.startswith(b"#1/"):
                length = name[3:]
                if not length.isdigit() or int(length) > size:
                    raise fail(f"bad BSD archive member name length {length!r}", pos)
                name = pread(int(length), data).rstrip(b"\0")
                data_offset, data_size = data + int(length), size - int(length)
            else:
                if name.startswith(b"/") and name[1:].isdigit():
                    index = int(name[1:])
                    if long_names is None or index >= len(long_names):
                        raise fail(f"long member name /{index} has no entry in the name table", pos)
                    stop = long_names.find(b"\n", index)
                    name = long_names[index:len(long_names) if stop < 0 else stop]
                if name.endswith(b"/"):  # GNU names end in '/'
                    name = name[:-1]
            if not name.startswith(b"__.SYMDEF"):
                yield name, pos, data_offset, data_size
        pos = data + stored + ((data + stored - start) & 1)


# --------------------------------------------------------------------------------------------------
# Writing.


def _field(value: bytes | int | str, width: int) -> bytes:
    """A space-padded header field (never truncated, as LLVM's ``printWithSpacePadding``)."""
    raw = value if isinstance(value, bytes) else str(value).encode()
    return raw.ljust(width)


def _member_header(name: bytes, size: int, mode: str = "644") -> bytes:
    """A deterministic member header: date, owner and group 0."""
    return (_field(name, 16) + _field(0, 12) + _field(0, 6) + _field(0, 6) + _field(mode, 8) + _field(size, 10)
            + b"`\n")


def write_archive(fd: int, members: Sequence[Member], symbols: Sequence[list[bytes] | None]) -> None:
    """Write a GNU archive byte-identical to ``writeArchive(..., NormalSymtab, K_GNU, Deterministic)``.

    ``symbols[i]`` are the symbol-table names of ``members[i]``, None when it is not a symbolic file
    (an object or bitcode). As in LLVM 19, a symbolic member without symbols still gets an (empty)
    ``/`` table; 64-bit offsets (``/SYM64/``) once a member header lies beyond 4 GiB. Names of 16 bytes
    or more, or holding ``/``, go to the ``//`` table, each once. Member data is streamed, not loaded.
    """
    if not members:
        write_all(fd, AR_MAGIC)
        return
    strtab = bytearray()
    name_at: dict[str, int] = {}
    headers: list[bytes] = []
    for member in members:
        raw = member.name.encode("utf-8", "surrogateescape")
        if len(raw) < 16 and b"/" not in raw:
            headers.append(_member_header(raw + b"/", member.size))
            continue
        if member.name not in name_at:
            name_at[member.name] = len(strtab)
            strtab += raw + b"/\n"
        headers.append(_member_header(b"/" + str(name_at[member.name]).encode(), member.size))
    if len(strtab) % 2:
        strtab += b"\n"
    per_member = [syms or [] for syms in symbols]
    names = b"".join(s + b"\0" for syms in per_member for s in syms)
    count = sum(len(syms) for syms in per_member)
    if not names and any(syms is not None for syms in symbols):
        names = b"\0\0\0"
    strtab_member = (b"//" + b" " * 46 + _field(len(strtab), 10) + b"`\n" + bytes(strtab)) if strtab else b""
    sizes = [len(h) + m.size + (m.size % 2) for h, m in zip(headers, members)]

    def symtab(offset_size: int) -> bytes:
        if not names:
            return b""
        body_size = offset_size * (1 + count) + len(names)
        pad = body_size % 2
        fmt = ">I" if offset_size == 4 else ">Q"
        body = bytearray(struct.pack(fmt, count))
        position = len(AR_MAGIC) + HEADER.size + body_size + pad + len(strtab_member)
        for syms, size in zip(per_member, sizes):
            body += struct.pack(fmt, position) * len(syms)
            position += size
        body += names + b"\0" * pad
        return _member_header(b"/" if offset_size == 4 else b"/SYM64/", len(body), "0") + bytes(body)

    table = symtab(4)
    last_header = len(AR_MAGIC) + len(table) + len(strtab_member) + sum(sizes[:-1])
    if names and last_header >= 1 << 32:
        table = symtab(8)
    write_all(fd, AR_MAGIC + table + strtab_member)
    for header, member in zip(headers, members):
        write_all(fd, header)
        member.copy_to(fd)
        if member.size % 2:
            write_all(fd, b"\n")
