"""``llvm_object_with_section``: a host object with its ``.llvm.offloading`` bytes replaced, against the object
Clang's back end writes with those bytes embedded (``-fembed-offload-object``), byte for byte.

The offload-cache launcher makes an added target's host object this way instead of running the back end again,
so every layout the writer produces must come out the same: sections after the replaced one realigned (a
``double`` table, debug sections, comdat groups, relocations, the symbol table, ``.llvm_addrsig``), for Clang 19
and 22, for package sizes that leave every remainder. Objects whose layout the rule does not explain exactly are
refused (None), never rewritten.
"""
from __future__ import annotations

import itertools
import subprocess
from pathlib import Path

import pytest

from conftest import LLVM19_BIN
from offload_builders.formats.elf import llvm_object_with_section, read_sections

SOURCE_C = """\
static const double table[4] = {1.5, 2.5, 3.5, 4.5};
int counter;
__attribute__((aligned(64))) char block[100] = {1};
double lookup(int i) { return table[i & 3] + counter + block[i & 63]; }
"""
SOURCE_CXX = """\
template <class T> struct Box { T value; T twice() const { return value * 2; } };
inline int shared_helper(int x) { static int calls; return x + ++calls; }
int use(int x) { Box<int> box{x}; return box.twice() + shared_helper(x); }
double use(double x) { Box<double> box{x}; return box.twice(); }
"""
FLAGS = {
    "O2": ["-O2"],
    "O0-g": ["-O0", "-g"],
    "sections": ["-O2", "-ffunction-sections", "-fdata-sections"],
    "pic-dwarf4": ["-O1", "-fPIC", "-g", "-gdwarf-4"],
    "addrsig-none": ["-O2", "-fno-addrsig"],
}
SIZES = [1, 3, 8, 13, 100, 4097]


def _section(data: bytes, name: str) -> bytes:
    table = read_sections(lambda length, at: data[at:at + length], len(data))
    found = table.named(name)
    assert found is not None
    return data[found.sh_offset:found.sh_offset + found.sh_size]


def _objects(clang: Path, tmp: Path, language: str, flags: list[str]) -> dict[int, bytes]:
    """The object of one source and flags for each embedded size (the bytes differ in every size)."""
    source = tmp / f"s.{language}"
    source.write_text(SOURCE_C if language == "c" else SOURCE_CXX)
    made = {}
    for size in SIZES:
        payload = tmp / f"payload{size}.bin"
        payload.write_bytes(bytes((index * 7 + size) % 251 for index in range(size)))
        out = tmp / f"s{size}.o"
        subprocess.run([str(clang), *flags, "-c", str(source), "-Xclang", f"-fembed-offload-object={payload}",
                        "-o", str(out)], check=True)
        made[size] = out.read_bytes()
    return made


def _check_every_pair(made: dict[int, bytes]) -> None:
    for old, new in itertools.permutations(SIZES, 2):
        content = _section(made[new], ".llvm.offloading")
        assert len(content) == new
        assert llvm_object_with_section(made[old], ".llvm.offloading", content) == made[new], (old, new)


@pytest.mark.parametrize("language", ["c", "cxx"])
@pytest.mark.parametrize("flags", FLAGS.values(), ids=FLAGS.keys())
def test_clang_19s_back_end_writes_what_the_rewrite_gives(tmp_path, language, flags):
    _check_every_pair(_objects(LLVM19_BIN / ("clang" if language == "c" else "clang++"), tmp_path, language, flags))


@pytest.mark.parametrize("flags", [FLAGS["O2"], FLAGS["sections"], FLAGS["pic-dwarf4"]], ids=["O2", "sections", "pic"])
def test_clang_22s_back_end_writes_what_the_rewrite_gives(tmp_path, llvm22, flags):
    _check_every_pair(_objects(llvm22("clang++"), tmp_path, "cxx", flags))


@pytest.mark.parametrize("triple", ["i686-unknown-linux-gnu", "powerpc-unknown-linux-gnu",
                                    "powerpc64-unknown-linux-gnu", "aarch64-unknown-linux-gnu"])
def test_other_classes_and_byte_orders_keep_their_layout(tmp_path, triple):
    """32-bit and big-endian objects: the rule lays each out as written (its own bytes give the same object) and a
    replaced section moves what follows, as for x86_64."""
    made = _objects(LLVM19_BIN / "clang", tmp_path, "c", [f"--target={triple}", "-O2", "-g"])
    _check_every_pair(made)


def test_what_the_rule_does_not_explain_is_refused(tmp_path):
    made = _objects(LLVM19_BIN / "clang", tmp_path, "c", ["-O2"])[13]
    assert llvm_object_with_section(made, ".llvm.offloading", b"x" * 13) is not None
    assert llvm_object_with_section(made, ".no.such.section", b"x") is None
    assert llvm_object_with_section(b"not an object", ".llvm.offloading", b"x") is None
    assert llvm_object_with_section(made, ".bss", b"x") is None  # no contents in the file to replace
    # Padding that is not zeros, or a header table not where the writer puts it: some other writer's file.
    table = read_sections(lambda length, at: made[at:at + length], len(made))
    data = table.named(".data")  # 64-aligned (``block``): the writer pads before it
    assert data is not None
    before = max(section.sh_offset + section.file_size for section in table.sections
                 if section.sh_offset + section.file_size <= data.sh_offset)
    assert before < data.sh_offset and not made[before:data.sh_offset].strip(b"\0")
    padded = bytearray(made)
    padded[data.sh_offset - 1] ^= 0x5A
    assert llvm_object_with_section(bytes(padded), ".llvm.offloading", b"x") is None
    moved = bytearray(made) + bytes(8)  # the section header table 8 bytes later: e_shoff at 40 in ELF64
    shoff = int.from_bytes(made[40:48], "little")
    moved[shoff + 8:] = made[shoff:]
    moved[shoff:shoff + 8] = bytes(8)
    moved[40:48] = (shoff + 8).to_bytes(8, "little")
    assert llvm_object_with_section(bytes(moved), ".llvm.offloading", b"x") is None
