"""``formats.irsymtab``: the symbol table of a bitcode file, checked against LLVM's own reading of it.

``llvm-lto2 dump-symtab`` prints what ``lto::InputFile`` reads from a bitcode file's symbol table: the
symbols that are global and not format-specific (the ones ``clang-linker-wrapper`` looks at), each with
its visibility and flags. Our reader must list the same symbols with the same flags, in the same order,
for every member of the OpenMP device runtime archive (AMDGPU and NVPTX) and for bitcode Clang 19 and
Clang 22 compile (device, host, a C++ alias, a weak and a TLS symbol); and turn damage into one
``OffloadFormatError`` naming the file.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import LLVM19_BIN
from offload_builders.errors import OffloadFormatError
from offload_builders.formats.irsymtab import IRSymbol, SymbolFlag, Visibility, read_symbols
from offload_builders.linking import scan_link_inputs

RUNTIME = Path("/usr/lib/llvm-19/lib/libomptarget.devicertl.a")
LLVM22_BIN = Path("/usr/lib/llvm-22/bin")

SOURCE = """\
__attribute__((weak)) int weak_value = 1;
thread_local int tls_value = 2;
static int hidden_helper(int x) { return x + 1; }
extern "C" int used_elsewhere(int);
__attribute__((visibility("hidden"))) int hidden_value = 3;
inline int inline_function(int x) { return x * 2; }
extern "C" int aliased(int x) { return hidden_helper(x) + inline_function(x) + used_elsewhere(x); }
#if !defined(__AMDGCN__) && !defined(__NVPTX__)  // host only: the device compile emits no aliased()
extern "C" int alias_of(int) __attribute__((alias("aliased")));
#endif
double sine(double x) { return __builtin_sin(x); }
#pragma omp declare target
double device_weight = 0.5;
double scaled(double x) { return x * device_weight; }
#pragma omp end declare target
double run(double *x, int n) {
  double sum = 0;
#pragma omp target teams distribute parallel for reduction(+ : sum) map(to : x[0 : n])
  for (int i = 0; i < n; ++i) sum += scaled(x[i]);
  return sum;
}
"""


def _compile(tmp_path: Path, bin_dir: Path, flags: list[str]) -> Path:
    """SOURCE compiled to bitcode at -O1 with ``flags``."""
    (tmp_path / "x.cpp").write_text(SOURCE)
    out = tmp_path / "x.bc"
    subprocess.run([str(bin_dir / "clang++"), "-O1", "-c", "-emit-llvm", *flags, "x.cpp", "-o", str(out)],
                   cwd=tmp_path, check=True, capture_output=True)
    return out


def _dump_symtab(path: Path, bin_dir: Path) -> list[str]:
    """``llvm-lto2 dump-symtab``'s symbol lines: visibility, then U C W I O T X (or -), a space, the name."""
    text = subprocess.run([str(bin_dir / "llvm-lto2"), "dump-symtab", str(path)], capture_output=True, text=True,
                          check=True).stdout
    return [line for line in text.splitlines() if len(line) > 9 and line[0] in "DHP" and line[8] == " "]


def _as_dumped(symbols: list[IRSymbol]) -> list[str]:
    def flag(letter: str, bit: SymbolFlag, symbol: IRSymbol) -> str:
        return letter if symbol.has(bit) else "-"

    letters = (("U", SymbolFlag.UNDEFINED), ("C", SymbolFlag.COMMON), ("W", SymbolFlag.WEAK),
               ("I", SymbolFlag.INDIRECT), ("O", SymbolFlag.MAY_OMIT), ("T", SymbolFlag.TLS),
               ("X", SymbolFlag.EXECUTABLE))
    return ["DHP"[symbol.visibility] + "".join(flag(letter, bit, symbol) for letter, bit in letters) + " " + symbol.name
            for symbol in symbols if symbol.has(SymbolFlag.GLOBAL) and not symbol.has(SymbolFlag.FORMAT_SPECIFIC)]


def test_every_device_runtime_member_reads_as_llvm_reads_it(tmp_path):
    members = scan_link_inputs([str(RUNTIME)]).archive_members
    assert len(members) > 20 and {m.binary.triple for m in members} == {"amdgcn-amd-amdhsa", "nvptx64-nvidia-cuda"}
    for index, member in enumerate(members):
        path = tmp_path / f"member{index}.bc"
        path.write_bytes(member.read_image())
        ours = read_symbols(path.read_bytes(), str(path))
        assert ours is not None, member.describe()
        dumped = _dump_symtab(path, LLVM19_BIN)
        assert dumped and _as_dumped(ours) == dumped, member.describe()


@pytest.mark.parametrize("bin_dir", [LLVM19_BIN, LLVM22_BIN], ids=["clang19", "clang22"])
@pytest.mark.parametrize("flags", [["-fopenmp", "--offload-arch=gfx90a", "--offload-device-only", "-nogpulib"],
                                   ["-fopenmp", "--offload-arch=sm_80", "--offload-device-only", "-nogpulib"],
                                   ["-fPIC"]], ids=["amdgpu", "nvptx", "host"])
def test_compiled_bitcode_reads_as_llvm_reads_it(tmp_path, bin_dir, flags):
    out = _compile(tmp_path, bin_dir, flags)
    ours = read_symbols(out.read_bytes(), str(out))
    assert ours is not None
    dumped = _dump_symtab(out, bin_dir)
    assert _as_dumped(ours) == dumped
    if flags == ["-fPIC"]:  # the source's kinds of symbol are all there
        by_name = {symbol.name: symbol for symbol in ours}
        assert by_name["weak_value"].has(SymbolFlag.WEAK)
        assert by_name["alias_of"].has(SymbolFlag.INDIRECT)
        assert by_name["used_elsewhere"].has(SymbolFlag.UNDEFINED)
        assert by_name["hidden_value"].visibility is Visibility.HIDDEN
        assert any(symbol.has(SymbolFlag.TLS) for symbol in ours)


def test_bitcode_in_a_wrapper_header_reads_as_without(tmp_path):
    """The 20-byte wrapper header (0x0B17C0DE) some tools put in front of the bitcode."""
    data = _compile(tmp_path, LLVM19_BIN, ["-fPIC"]).read_bytes()
    wrapped = (0x0B17C0DE).to_bytes(4, "little") + (0).to_bytes(4, "little") + (20).to_bytes(4, "little") + \
        len(data).to_bytes(4, "little") + (7).to_bytes(4, "little") + data
    assert read_symbols(wrapped) == read_symbols(data) and read_symbols(data)


def test_damage_is_one_error_naming_the_file(tmp_path):
    data = _compile(tmp_path, LLVM19_BIN, ["-fPIC"]).read_bytes()
    with pytest.raises(OffloadFormatError, match="not LLVM bitcode") as caught:
        read_symbols(b"\x7fELF" + data[4:], "damaged.bc")
    assert "damaged.bc" in str(caught.value)
    for cut in (len(data) - 3, len(data) - 40, len(data) // 2):  # a block or blob that runs past the end
        with pytest.raises(OffloadFormatError) as caught:
            read_symbols(data[:cut], "cut.bc")
        assert "cut.bc" in str(caught.value)


def test_bitcode_without_a_symbol_table_gives_none():
    """The bitcode magic and nothing else: no table, which LLVM would build from the module."""
    assert read_symbols(b"BC\xc0\xde") is None


_RUNTIME_MEMBER: list[bytes] = []


def _runtime_member() -> bytes:
    """One real bitcode file (the first device runtime member), read once for the property test."""
    if not _RUNTIME_MEMBER:
        _RUNTIME_MEMBER.append(scan_link_inputs([str(RUNTIME)]).archive_members[0].read_image())
    return _RUNTIME_MEMBER[0]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_damaged_bitcode_gives_symbols_none_or_one_error(data):
    """Any byte changed or any length cut off: a list, None, or an OffloadFormatError naming the file,
    never another exception. The changes hit the table's blocks (the last 64 KB) more often than the module."""
    good = _runtime_member()
    damaged = bytearray(good)
    for _ in range(data.draw(st.integers(1, 4))):
        tail = data.draw(st.booleans())
        at = data.draw(st.integers(max(0, len(good) - 64_000) if tail else 0, len(good) - 1))
        damaged[at] = data.draw(st.integers(0, 255))
    cut = len(good) if data.draw(st.booleans()) else data.draw(st.integers(0, len(good)))
    try:
        result = read_symbols(bytes(damaged[:cut]), "damaged.bc")
    except OffloadFormatError as error:
        assert "damaged.bc" in str(error)
    else:
        assert result is None or all(isinstance(symbol, IRSymbol) for symbol in result)
