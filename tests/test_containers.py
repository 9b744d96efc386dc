"""Damaged ``-flto`` bitcode must never take our process down.

llvmlite's LLVM is built with assertions, and some damaged bitcode (a flipped byte in a type or value
table) fails one: ``abort()`` kills the whole Python process (exit status 134), which no ``except`` can
catch.  :mod:`offload_builders.formats.containers` therefore parses bitcode in a child process.  These
tests build a real fat ``-flto`` object with Clang 19, damage it (truncations, and byte flips that are
shown to abort a bare in-process llvmlite parse), and require for each variant:

* the library (``extract_offload_binaries``, ``archive_symbols``) raises ``OffloadFormatError`` naming
  the file and offset, and this very test process survives to check the next one;
* ``offload-inspect`` and ``offload-packager`` print one ``error:`` line (no traceback), exit 1, and write
  no output file, where ``clang-offload-packager`` 19 fails too;
* the intact object still gives the binary ``clang-offload-packager`` 19 extracts, byte for byte.
"""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from offload_builders.errors import OffloadFormatError
from offload_builders.formats import containers
from offload_builders.formats.containers import ArchiveMember, ContainerKind, archive_symbols, extract_offload_binaries

SOURCE = """\
#include <cstdio>
int shared_value = 3;
int main() {
  int x = 0;
#pragma omp target map(tofrom: x)
  x = 42;
  std::printf("%d %d\\n", x, shared_value);
}
"""
IMAGE = "file={},triple=x86_64-unknown-linux-gnu,kind=openmp"
# A bare in-process parse, as the library did before: what the flipped variants are checked against.
BARE_PARSE = ("import sys, llvmlite.binding as llvm\n"
              "llvm.parse_bitcode(sys.stdin.buffer.read(), context=llvm.create_context())")


@pytest.fixture(scope="module")
def lto(tmp_path_factory: pytest.TempPathFactory, llvm19) -> Path:
    d = tmp_path_factory.mktemp("lto")
    (d / "x.cpp").write_text(SOURCE)
    subprocess.run([str(llvm19("clang++")), "-fopenmp", "-fopenmp-targets=x86_64-unknown-linux-gnu", "-flto",
                    "-c", "x.cpp", "-o", "x.o"], cwd=d, check=True)
    return d / "x.o"


def _aborts_llvmlite(data: bytes) -> bool:
    result = subprocess.run([sys.executable, "-c", BARE_PARSE], input=data, capture_output=True)
    return result.returncode == -signal.SIGABRT


@pytest.fixture(scope="module")
def damaged(lto: Path) -> dict[str, bytes]:
    """Truncations at several offsets, and byte flips (xor 0xff) that abort a bare llvmlite parse."""
    data = lto.read_bytes()
    assert data.startswith(b"BC\xc0\xde")
    variants = {f"truncated-at-{n}": data[:n] for n in (4, 8, 20, 100, len(data) // 2, len(data) - 4, len(data) - 1)}
    flips = 0
    for offset in range(300, min(len(data), 1900), 40):  # the module's type and value tables
        flipped = bytearray(data)
        flipped[offset] ^= 0xFF
        if _aborts_llvmlite(bytes(flipped)):
            variants[f"flipped-at-{offset}"] = bytes(flipped)
            flips += 1
        if flips == 4:
            break
    assert flips == 4, "expected byte flips that make llvmlite abort the process (the hazard under test)"
    return variants


def test_intact_object_still_matches_clang(lto: Path, tmp_path: Path, llvm19) -> None:
    (found,) = extract_offload_binaries(lto)
    assert found.origin.container is ContainerKind.BITCODE
    assert found.origin.symbol == "llvm.embedded.object"
    subprocess.run([str(llvm19("clang-offload-packager")), str(lto), "--image=" + IMAGE.format(tmp_path / "clang.o")],
                   check=True)
    ours = subprocess.run([sys.executable, "-m", "offload_builders.cli.packager", str(lto),
                           "--image=" + IMAGE.format(tmp_path / "ours.o")], capture_output=True, text=True)
    assert ours.returncode == 0, ours.stderr
    assert (tmp_path / "ours.o").read_bytes() == (tmp_path / "clang.o").read_bytes() == found.read_image()
    # the archive symbol table of the bitcode: its defined globals (what llvm-ar 19 writes)
    member = ArchiveMember("x.o", str(lto), 0, lto.stat().st_size)
    assert set(archive_symbols(member)) >= {b"main", b"shared_value"}


def test_library_raises_and_survives(lto: Path, damaged: dict[str, bytes], tmp_path: Path) -> None:
    for name, data in damaged.items():
        path = tmp_path / f"{name}.o"
        path.write_bytes(data)
        with pytest.raises(OffloadFormatError) as info:
            extract_offload_binaries(path)
        assert info.value.path == str(path) and info.value.offset is not None, name
        assert "malformed LLVM bitcode" in info.value.message, (name, info.value.message)
        if name.startswith("flipped"):
            assert "LLVM crashed (SIGABRT)" in info.value.message, (name, info.value.message)
        with pytest.raises(OffloadFormatError, match="malformed LLVM bitcode"):
            archive_symbols(ArchiveMember(path.name, data, 0, len(data)))
    # the child that parses bitcode is restarted after a crash: an intact read still works
    assert len(extract_offload_binaries(lto)) == 1


def test_damaged_member_of_an_archive(lto: Path, damaged: dict[str, bytes], tmp_path: Path, llvm19) -> None:
    """The error names the archive and member; the intact member before it was read first."""
    name = next(n for n in damaged if n.startswith("flipped"))
    (tmp_path / "bad.o").write_bytes(damaged[name])
    (tmp_path / "good.o").write_bytes(lto.read_bytes())
    subprocess.run([str(llvm19("llvm-ar")), "rcS", "lib.a", "good.o", "bad.o"], cwd=tmp_path, check=True)
    with pytest.raises(OffloadFormatError) as info:
        extract_offload_binaries(tmp_path / "lib.a")
    assert info.value.path == f"{tmp_path / 'lib.a'}(bad.o)"
    assert "LLVM crashed (SIGABRT)" in info.value.message
    assert len(extract_offload_binaries(tmp_path / "good.o")) == 1


def _check_cli_failure(result: subprocess.CompletedProcess[str], prog: str, path: Path) -> None:
    assert result.returncode == 1, (path, result.returncode, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{prog}: error: {path}: offset 0x"), lines[0]
    assert "malformed LLVM bitcode" in lines[0] and "Traceback" not in result.stderr


def test_cli_one_line_error_for_each_damaged_variant(damaged: dict[str, bytes], tmp_path: Path, llvm19) -> None:
    for name, data in damaged.items():
        path = tmp_path / f"{name}.o"
        path.write_bytes(data)
        out = tmp_path / f"{name}.image"
        packager = subprocess.run([sys.executable, "-m", "offload_builders.cli.packager", str(path),
                                   "--image=" + IMAGE.format(out)], capture_output=True, text=True)
        _check_cli_failure(packager, "offload-packager", path)
        assert not out.exists()
        inspect = subprocess.run([sys.executable, "-m", "offload_builders.cli.inspect", str(path)],
                                 capture_output=True, text=True)
        _check_cli_failure(inspect, "offload-inspect", path)
        # clang-offload-packager 19 (built without assertions) refuses each of them too
        clang = subprocess.run([str(llvm19("clang-offload-packager")), str(path),
                                "--image=" + IMAGE.format(tmp_path / "clang.image")], capture_output=True, text=True)
        assert (clang.returncode, clang.stderr.split(": error: ")[-1].strip()) == (1, "Failed to create module"), name


def test_bitcode_wrapper_header(lto: Path, tmp_path: Path) -> None:
    """A wrapped module (0x0B17C0DE header) is read; a wrapper pointing past the end is refused up front."""
    data = lto.read_bytes()
    header = b"\xde\xc0\x17\x0b" + (0).to_bytes(4, "little") + (20).to_bytes(4, "little")
    wrapped = tmp_path / "wrapped.o"
    wrapped.write_bytes(header + len(data).to_bytes(4, "little") + bytes(4) + data)
    (found,) = extract_offload_binaries(wrapped)
    assert found.read_image() == extract_offload_binaries(lto)[0].read_image()
    bad = tmp_path / "bad-wrapper.o"
    bad.write_bytes(header + (len(data) + 4).to_bytes(4, "little") + bytes(4) + data)
    with pytest.raises(OffloadFormatError, match=r"offset 0x8: malformed LLVM bitcode: the wrapper header puts"):
        extract_offload_binaries(bad)


def test_child_starts_once_per_process(lto: Path) -> None:
    """Every bitcode read after the first reuses the child (what keeps archives of -flto objects fast)."""
    extract_offload_binaries(lto)
    child = containers._BitcodeChild._current
    assert child is not None
    for _ in range(3):
        extract_offload_binaries(lto)
    assert containers._BitcodeChild._current is child and child.process.poll() is None


def test_link_time_symbol_reading_survives_bitcode_that_aborts_llvm(lto: Path, damaged: dict[str, bytes],
                                                                    monkeypatch) -> None:
    """The device-code selection reads a bitcode file's own symbol table, as clang-linker-wrapper does, so
    damage inside the module does not reach it (the link reports it); bitcode without a table is read in
    the child, where a damaged archive member would otherwise abort the SCons process (or offload-link)
    with LLVM's assertion instead of an error."""
    from offload_builders.formats import irsymtab
    from offload_builders.linking import device_symbols

    symbols = {s.name: s for s in device_symbols(lto.read_bytes(), "lto.o")}
    assert not symbols["main"].undefined and not symbols["shared_value"].undefined
    assert any(s.undefined for s in symbols.values())  # what main calls from elsewhere
    name = next(n for n in damaged if n.startswith("flipped"))
    assert device_symbols(damaged[name], "lib.a(bad.o)") == list(symbols.values())  # the table is intact
    monkeypatch.setattr(irsymtab, "read_symbols", lambda data, label="": None)  # as for a file without one
    assert {s.name: s for s in device_symbols(lto.read_bytes(), "lto.o")} == symbols  # LLVM reads the same
    with pytest.raises(OffloadFormatError, match=r"LLVM crashed \(SIGABRT\)") as info:
        device_symbols(damaged[name], "lib.a(bad.o)")
    assert info.value.path == "lib.a(bad.o)"
    assert device_symbols(lto.read_bytes(), "lto.o")  # a new child serves the next request
