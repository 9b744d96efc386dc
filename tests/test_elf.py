"""The struct-based ELF section-table reader, diffed against pyelftools on files the real toolchain writes.

Every ELF class and byte order (objects Clang 19 compiles for i686, x86_64, powerpc and powerpc64),
shared objects, PIE and non-PIE executables, an object with more than 0xff00 sections (extended
numbering), and GPU device objects; damaged copies give an ``OffloadFormatError`` with an offset,
never another exception.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from hypothesis import HealthCheck, given, settings, strategies as st

from offload_builders.errors import BundleFormatError, OffloadFormatError
from offload_builders.formats.elf import file_reader, read_sections

SOURCE = ("int counter = 3;\nstatic int hidden[4];\nextern int outside(int);\n"
          "int bump(int x) { return counter += x + hidden[x & 3] + outside(x); }\n")
TRIPLES = ["x86_64-unknown-linux-gnu", "i686-unknown-linux-gnu", "powerpc-unknown-linux-gnu",
           "powerpc64-unknown-linux-gnu", "amdgcn-amd-amdhsa"]


def _compile(llvm19, tmp: Path, triple: str, *extra: str) -> Path:
    source = tmp / "s.c"
    source.write_text(SOURCE)
    out = tmp / f"{triple}{''.join(extra).replace('-', '_')}.o"
    flags = ["-nogpulib", "-mcpu=gfx90a"] if triple.startswith("amdgcn") else []
    subprocess.run([str(llvm19("clang")), f"--target={triple}", *flags, "-O1", *extra, "-c", str(source),
                    "-o", str(out)], check=True)
    return out


def _ours(path: Path):
    with open(path, "rb") as f:
        return read_sections(file_reader(f.fileno()), os.fstat(f.fileno()).st_size, path=str(path))


def _theirs(path: Path) -> tuple[list[tuple[str, int, int]], bool]:
    with open(path, "rb") as f:
        elf = ELFFile(f)
        sections = [(s.name, s["sh_offset"], s["sh_size"]) for s in elf.iter_sections()]
        interp = elf["e_type"] == "ET_DYN" and any(p["p_type"] == "PT_INTERP" for p in elf.iter_segments())
    return sections, interp


def _agree(path: Path) -> None:
    ours = _ours(path)
    theirs, interp = _theirs(path)
    assert [(s.name, s.sh_offset, s.sh_size) for s in ours.sections] == theirs, path
    assert ours.has_interpreter == interp, path
    assert [s.index for s in ours.sections] == list(range(len(theirs)))


@pytest.mark.parametrize("triple", TRIPLES)
def test_objects_of_every_class_and_byte_order_agree_with_pyelftools(llvm19, tmp_path, triple):
    path = _compile(llvm19, tmp_path, triple)
    _agree(path)
    table = _ours(path)
    assert table.elfclass == (32 if triple.startswith(("i686", "powerpc-")) else 64)
    assert table.named(".text") is not None or table.named(".text.bump") is not None


def test_shared_objects_and_executables(llvm19, tmp_path):
    source = tmp_path / "main.c"
    source.write_text("int main(void) { return 0; }\n")
    built = {}
    variants = {"pie": ["-fPIE", "-pie"], "nopie": ["-fno-PIE", "-no-pie"], "lib.so": ["-shared", "-fPIC"]}
    for name, flags in variants.items():
        built[name] = tmp_path / name
        subprocess.run([str(llvm19("clang")), *flags, str(source), "-o", str(built[name])], check=True)
        _agree(built[name])
    assert _ours(built["pie"]).has_interpreter and _ours(built["pie"]).e_type == 3  # ET_DYN with PT_INTERP
    assert not _ours(built["lib.so"]).has_interpreter
    assert not _ours(built["nopie"]).has_interpreter  # ET_EXEC: the flag is only about ET_DYN files


def test_more_than_0xff00_sections_use_extended_numbering(llvm19, tmp_path):
    source = tmp_path / "many.s"
    source.write_text("".join(f'.section .s{i},"a"\n.byte {i & 0xff}\n' for i in range(0xff10)))
    path = tmp_path / "many.o"
    subprocess.run([str(llvm19("clang")), "-c", str(source), "-o", str(path)], check=True)
    raw = path.read_bytes()
    assert int.from_bytes(raw[60:62], "little") == 0  # e_shnum 0: the count is in section 0's sh_size
    _agree(path)
    assert _ours(path).sections[-1].index > 0xff00
    # The name table's index in section 0's sh_link (e_shstrndx = SHN_XINDEX), as for > 0xff00 sections.
    strndx = int.from_bytes(raw[62:64], "little")
    shoff = int.from_bytes(raw[40:48], "little")
    patched = bytearray(raw)
    patched[62:64] = (0xFFFF).to_bytes(2, "little")
    patched[shoff + 40:shoff + 44] = strndx.to_bytes(4, "little")
    xindex = tmp_path / "xindex.o"
    xindex.write_bytes(patched)
    _agree(xindex)
    assert _ours(xindex).named(".s65295") is not None


@pytest.fixture(scope="module")
def sample_object(tmp_path_factory, llvm19) -> bytes:
    return _compile(llvm19, tmp_path_factory.mktemp("elf"), "x86_64-unknown-linux-gnu").read_bytes()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_objects_raise_offload_format_errors(sample_object, data):
    raw = bytearray(sample_object)
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    length = data.draw(st.integers(16, len(raw)))
    blob = bytes(raw[:length])
    try:
        table = read_sections(lambda n, at: blob[at:at + max(0, n)], len(blob), path="x.o", base=0x100,
                              error=BundleFormatError)
    except BundleFormatError as exc:
        assert exc.path == "x.o" and exc.offset is not None and exc.offset >= 0x100
        assert str(exc).startswith("x.o: offset 0x")
    else:
        for section in table.sections:
            assert section.header_at + 40 <= len(blob)


def test_errors_name_the_field(tmp_path, sample_object):
    truncated = tmp_path / "t.o"
    truncated.write_bytes(sample_object[:40])
    with pytest.raises(OffloadFormatError, match="ends inside the ELF header"):
        _ours(truncated)
    table_cut = tmp_path / "cut.o"
    shoff = int.from_bytes(sample_object[40:48], "little")
    table_cut.write_bytes(sample_object[:shoff + 70])
    with pytest.raises(OffloadFormatError, match=r"section header table \(\d+ entries\) runs past the end") as info:
        _ours(table_cut)
    assert info.value.offset == shoff
    bad_strndx = bytearray(sample_object)
    bad_strndx[62:64] = (500).to_bytes(2, "little")
    (tmp_path / "strndx.o").write_bytes(bad_strndx)
    with pytest.raises(OffloadFormatError, match="e_shstrndx 500 names no section") as info:
        _ours(tmp_path / "strndx.o")
    assert info.value.offset == 62


@pytest.mark.parametrize("triple", TRIPLES)
def test_symbols_agree_with_pyelftools(llvm19, tmp_path, triple):
    from offload_builders.formats.elf import read_symbols

    path = _compile(llvm19, tmp_path, triple, "-fvisibility=hidden") if triple.startswith("amdgcn") else \
        _compile(llvm19, tmp_path, triple)
    with open(path, "rb") as f:
        reader = file_reader(f.fileno())
        size = os.fstat(f.fileno()).st_size
        ours = read_symbols(reader, size, read_sections(reader, size))
        elf = ELFFile(f)
        symtab = elf.get_section_by_name(".symtab")
        theirs = [(s.name.encode(), s["st_info"]["bind"], s["st_info"]["type"], s["st_other"]["visibility"],
                   s["st_shndx"], s["st_value"], s["st_size"]) for s in symtab.iter_symbols()][1:]
    bindings = {0: "STB_LOCAL", 1: "STB_GLOBAL", 2: "STB_WEAK"}
    visibility = {0: "STV_DEFAULT", 1: "STV_INTERNAL", 2: "STV_HIDDEN", 3: "STV_PROTECTED"}
    assert [(s.name, bindings[s.binding], visibility[s.visibility], s.undefined, s.st_value, s.st_size)
            for s in ours] == [(name, bind, vis, shndx == "SHN_UNDEF", value, size)
                               for name, bind, _type, vis, shndx, value, size in theirs]
    names = {s.name for s in ours}
    assert {b"counter", b"bump"} <= names
    assert b"outside" in [s.name for s in ours if s.undefined]
    assert b"counter" not in [s.name for s in ours if s.undefined]
