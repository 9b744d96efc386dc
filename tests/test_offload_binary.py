"""OffloadBinary and container reading/writing, checked against the real LLVM 19 and 22 tools.

Differential: our bytes equal clang-offload-packager 19's (and llvm-offload-binary 22's) for the same
arguments, including Clang's hash-ordered string entries; Clang's tools read what we write; we read
what Clang writes, from packages, fat objects (CPU and GPU), archives, linked executables, shared
objects and -flto bitcode. Hardening: a fixed corpus of malformed binaries plus a hypothesis property,
where every malformed input ends in OffloadBinaryFormatError with a byte offset.
"""
from __future__ import annotations

import io
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from offload_builders.errors import OffloadBinaryFormatError, OffloadFormatError
from offload_builders.formats.containers import ContainerKind, extract_offload_binaries
from offload_builders.formats.offload_binary import (
    ENTRY,
    HEADER,
    MAX_NUM_STRINGS,
    ImageKind,
    OffloadingImage,
    OffloadKind,
    build_string_table,
    encode_offload_binary,
    kind_table,
    llvm_hash_value,
    packager_arguments,
    parse_offload_binary,
    read_offload_binaries,
    write_offload_binaries,
)

SOURCE = """\
#include <cstdio>
int dev_global = 7;
#pragma omp declare target(dev_global)
int main() {
  int x = 0;
#pragma omp target map(tofrom: x)
  x = 42 + dev_global;
  std::printf("%d\\n", x);
}
"""

# The 152-byte package of the reference (section 1.4), verified with clang-offload-packager 19.1.7.
REFERENCE_SMALL = bytes.fromhex(
    "10ff10ad01000000980000000000000020000000000000002800000000000000"
    "0000010000000000480000000000000002000000000000009000000000000000"
    "0300000000000000820000000000000068000000000000008700000000000000"
    "6900000000000000007838365f36342d756e6b6e6f776e2d6c696e75782d676e"
    "75006172636800747269706c650000004142430000000000"
)


def run(*cmd: object, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, check=True, capture_output=True, text=True)


def clang_image(args: list[tuple[str, str]], workdir: Path, name: str = "img.bin", payload: bytes = b"ABC") -> str:
    """An --image= value for the given pairs, with file= pointing at a fresh image file."""
    (workdir / name).write_bytes(payload)
    return ",".join([f"file={workdir / name}"] + [f"{k}={v}" if v is not None else k for k, v in args])


def ours_for(spec: str, llvm_version: int = 19) -> bytes:
    """What our library writes for one --image spec (the packager's logic, without the CLI)."""
    table = kind_table(llvm_version)
    pairs = packager_arguments(spec)
    values = dict(pairs)
    strings = tuple((k, v) for k, v in pairs if k not in ("file", "kind"))
    out = b""
    for f in values["file"].split(","):
        name = f.rsplit("/", 1)[-1]
        kind = table.image_value_for_extension(name.rsplit(".", 1)[-1] if "." in name else "")
        if Path(f).read_bytes()[:4] == b"BC\xc0\xde":
            kind = 2
        out += encode_offload_binary(OffloadingImage(f, kind, table.offload_value_for_name(values.get("kind", "")),
                                                     0, strings))
    return out


# --------------------------------------------------------------------------------------------------
# Writing: byte identity with Clang.


def test_reference_hexdump_and_clang19_agree(tmp_path: Path, llvm19) -> None:
    spec = clang_image([("triple", "x86_64-unknown-linux-gnu"), ("arch", ""), ("kind", "openmp")], tmp_path)
    run(llvm19("clang-offload-packager"), "-o", tmp_path / "c.pkg", f"--image={spec}")
    clang = (tmp_path / "c.pkg").read_bytes()
    assert clang == REFERENCE_SMALL
    assert ours_for(spec) == clang


def test_string_table_builder_tail_merges_in_llvm_order() -> None:
    table, offsets = build_string_table([b"arch", b"march", b"", b"triple", b"x86_64-unknown-linux-gnu", b"ple"])
    assert table == b"\0x86_64-unknown-linux-gnu\0march\0triple\0"
    assert offsets[b"arch"] == offsets[b"march"] + 1
    assert offsets[b"ple"] == offsets[b"triple"] + 3
    assert offsets[b""] == 0


_CALL_HASH = """
import ctypes, sys
fn = getattr(ctypes.CDLL(sys.argv[1]), "_ZN4llvm10hash_valueENS_9StringRefE")
fn.restype = ctypes.c_uint64
fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
for line in sys.stdin:
    data = bytes.fromhex(line.strip())
    print(fn(data, len(data)))
"""


@pytest.mark.parametrize("version", [19, 22])
def test_hash_matches_libllvm(version: int, llvm19, llvm22) -> None:
    """Our hash_value(StringRef) is LLVM's: call the function libLLVM exports (in a separate process, so
    that this one never holds two LLVMs)."""
    tool = (llvm19 if version == 19 else llvm22)("clang-offload-packager")
    libs = sorted((tool.parent.parent / "lib").glob(f"libLLVM.so.{version}*"))
    if not libs:
        pytest.fail(f"libLLVM.so.{version}* is missing next to {tool}: the LLVM {version} packages are required")
    lib = str(libs[0])
    rng = random.Random(7)
    samples = [bytes(rng.getrandbits(8) for _ in range(n)) for n in list(range(0, 200)) + [255, 256, 257, 1000, 4096]]
    result = subprocess.run([sys.executable, "-c", _CALL_HASH, lib], input="\n".join(s.hex() for s in samples) + "\n",
                            capture_output=True, text=True, check=True)
    assert [int(v) for v in result.stdout.split()] == [llvm_hash_value(s) for s in samples]


def _random_spec(rng: random.Random) -> list[tuple[str, str | None]]:
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+.:é"
    count = rng.choice([0, 1, 2, 3, 5, 8, 20, 43, 44, 45, 46, 47, 60, 120])
    keys = [''.join(rng.choice(alphabet) for _ in range(rng.choice([1, 3, 7, 15, 16, 17, 33, 64, 65, 90])))
            for _ in range(count)]
    pairs: list[tuple[str, str | None]] = [("triple", "nvptx64-nvidia-cuda"), ("arch", rng.choice(["", "sm_80"])),
                                           ("kind", rng.choice(["openmp", "cuda", "hip", "sycl", "bogus"]))]
    for key in keys:
        roll = rng.random()
        value: str | None = None if roll < 0.1 else (
            "" if roll < 0.2 else "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))))
        pairs.append((key, value))
        if roll > 0.9:  # a repeated key: Clang joins the values with ','
            pairs.append((key, "again"))
    rng.shuffle(pairs)
    return pairs


@pytest.mark.parametrize("tool,version", [("clang-offload-packager", 19), ("llvm-offload-binary", 22)])
def test_random_keysets_byte_identical(tmp_path: Path, llvm19, llvm22, tool: str, version: int) -> None:
    """Clang's string-entry order is DenseMap hash order; we reproduce it exactly, growth included."""
    exe = llvm19(tool) if version == 19 else llvm22(tool)
    rng = random.Random(1000 + version)
    for case in range(25):
        ext = rng.choice(["o", "bc", "cubin", "fatbin", "s", "bin", "spv"])
        spec = clang_image(_random_spec(rng), tmp_path, f"img{case}.{ext}", payload=bytes(rng.randrange(50)))
        out = tmp_path / f"c{case}.pkg"
        run(exe, "-o", out, f"--image={spec}")
        assert ours_for(spec, version) == out.read_bytes(), spec


def test_multiple_files_and_images_concatenate(tmp_path: Path, llvm19) -> None:
    (tmp_path / "a.cubin").write_bytes(b"hello")
    (tmp_path / "b.s").write_bytes(b"helloworld")
    spec1 = f"file={tmp_path}/a.cubin,file={tmp_path}/b.s,triple=nvptx64-nvidia-cuda,arch=sm_80,kind=cuda"
    spec2 = f"file={tmp_path}/b.s,triple=nvptx64-nvidia-cuda,arch=sm_70,kind=hip,feature=+ptx63,feature=+foo,mykey"
    run(llvm19("clang-offload-packager"), "-o", tmp_path / "c.pkg", f"--image={spec1}", f"--image={spec2}")
    assert ours_for(spec1) + ours_for(spec2) == (tmp_path / "c.pkg").read_bytes()
    binaries = read_offload_binaries(tmp_path / "c.pkg")
    assert [b.image_size for b in binaries] == [5, 10, 10]
    assert binaries[2].string_map == {"feature": "+ptx63,+foo", "arch": "sm_70", "mykey": "",
                                      "triple": "nvptx64-nvidia-cuda"}
    assert [k for k, _ in binaries[2].strings] == ["feature", "arch", "mykey", "triple"]  # Clang's hash order


def test_streamed_writer_matches_in_memory_and_is_atomic(tmp_path: Path) -> None:
    img = tmp_path / "dev.o"
    img.write_bytes(os.urandom(100_003))
    image = OffloadingImage(img, 1, 1, 0, (("triple", "x86_64-unknown-linux-gnu"), ("arch", "")))
    out = tmp_path / "out.pkg"
    total = write_offload_binaries([image, OffloadingImage(b"xyz", 5, 2, 0, (("triple", "t"),))], out)
    data = out.read_bytes()
    assert total == len(data) and len(data) % 8 == 0
    assert data.startswith(encode_offload_binary(image))
    out.write_bytes(b"previous")
    with pytest.raises(FileNotFoundError):
        write_offload_binaries([image, OffloadingImage(tmp_path / "missing.o", 1, 1)], out)
    assert out.read_bytes() == b"previous"  # untouched, and no temporary left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dev.o", "out.pkg"]


# --------------------------------------------------------------------------------------------------
# Enumerations per LLVM version.


def test_kind_tables() -> None:
    t19, t21, t22 = kind_table(19), kind_table(21), kind_table(22)
    assert t19.offload_value(OffloadKind.HIP) == 3 and t21.offload_value(OffloadKind.HIP) == 4
    assert t22.offload_value(OffloadKind.SYCL) == 8
    with pytest.raises(ValueError):
        t19.offload_value(OffloadKind.SYCL)
    with pytest.raises(ValueError):
        t21.image_value(ImageKind.SPIRV)
    assert t22.image_value(ImageKind.SPIRV) == 6
    assert t19.offload_kind_name(3) == "hip" and t22.offload_kind_name(3) == "none"
    assert t19.offload_value_for_name("sycl") == 0 and t22.offload_value_for_name("sycl") == 8
    assert t22.image_kind_name(6) == "" and t19.image_kind_name(2) == "bc"
    for bad in (14, "19", None):
        with pytest.raises(ValueError):
            kind_table(bad)  # type: ignore[arg-type]


def test_llvm22_enums_against_llvm22_tools(tmp_path: Path, llvm22) -> None:
    """HIP=4 and SYCL=8 in 22: llvm-offload-binary writes them, objdump 22 names them, we agree."""
    for kind, value in (("hip", 4), ("sycl", 8), ("cuda", 2)):
        spec = clang_image([("triple", "amdgcn-amd-amdhsa"), ("arch", "gfx90a"), ("kind", kind)], tmp_path, "k.bc")
        run(llvm22("llvm-offload-binary"), "-o", tmp_path / f"{kind}.pkg", f"--image={spec}")
        data = (tmp_path / f"{kind}.pkg").read_bytes()
        assert ours_for(spec, 22) == data
        (binary,) = read_offload_binaries(data)
        assert binary.offload_kind == value and binary.offload_kind_name(22) == kind
    # A binary written by LLVM 19 for HIP (kind 3) means "none" to LLVM 22.
    hip19 = encode_offload_binary(OffloadingImage(b"x", 2, kind_table(19).offload_value(OffloadKind.HIP), 0,
                                                  (("triple", "amdgcn-amd-amdhsa"), ("arch", "gfx90a"))))
    (tmp_path / "hip19.pkg").write_bytes(hip19)
    listing = run(llvm22("llvm-objdump"), "--offloading", tmp_path / "hip19.pkg").stdout
    assert "producer        none" in listing
    assert read_offload_binaries(hip19)[0].offload_kind_name(22) == "none"
    # IMG_SPIRV (6) exists in 22 but its tools give it no name: extraction uses an empty extension.
    spirv = encode_offload_binary(OffloadingImage(b"spv", 6, 8, 0, (("triple", "spirv64-intel"), ("arch", "x"))))
    (tmp_path / "spv.pkg").write_bytes(spirv)
    run(llvm22("llvm-offload-binary"), tmp_path / "spv.pkg", "--image=kind=sycl", cwd=tmp_path)
    assert (tmp_path / "spv-spirv64-intel-x.0.").read_bytes() == b"spv"
    assert read_offload_binaries(spirv)[0].image_kind_name(22) == ""


# --------------------------------------------------------------------------------------------------
# Reading: what Clang writes, and Clang reading what we write.


def test_we_read_clang_output_from_a_file_without_loading_images(tmp_path: Path, llvm19) -> None:
    payload = os.urandom(4096)
    spec = clang_image([("triple", "amdgcn-amd-amdhsa"), ("arch", "gfx90a"), ("kind", "hip")], tmp_path, "k.o", payload)
    run(llvm19("clang-offload-packager"), "-o", tmp_path / "c.pkg", f"--image={spec}", f"--image={spec}")
    with open(tmp_path / "c.pkg", "rb") as f:
        binaries = read_offload_binaries(f)
    assert len(binaries) == 2 and binaries[1].offset == binaries[0].size
    second = binaries[1]
    assert second.image_kind == 1 and second.offload_kind == 3 and second.triple == "amdgcn-amd-amdhsa"
    assert second.entry.ImageOffset % 8 == 0 and second.header.EntrySize == ENTRY.size
    with open(tmp_path / "img.out", "wb") as sink:
        second.copy_image(sink)
    assert (tmp_path / "img.out").read_bytes() == payload
    assert second.read_image() == payload
    assert parse_offload_binary(tmp_path / "c.pkg", second.offset) == second


def test_clang_reads_what_we_write(tmp_path: Path, llvm19) -> None:
    (tmp_path / "dev.cubin").write_bytes(b"\x7fELF-pretend-cubin")
    (tmp_path / "dev.bc").write_bytes(b"BC\xc0\xde" + b"\0" * 12)
    images = [
        OffloadingImage(tmp_path / "dev.cubin", 3, 2, 0, (("triple", "nvptx64-nvidia-cuda"), ("arch", "sm_80"))),
        OffloadingImage(tmp_path / "dev.bc", 2, 1, 0, (("arch", "gfx90a"), ("triple", "amdgcn-amd-amdhsa"),
                                                      ("feature", "+xnack,+sramecc"))),
    ]
    write_offload_binaries(images, tmp_path / "ours.pkg")
    listing = run(llvm19("llvm-objdump"), "--offloading", tmp_path / "ours.pkg").stdout
    assert ("kind            cubin\narch            sm_80\ntriple          nvptx64-nvidia-cuda\n"
            "producer        cuda") in listing
    assert ("kind            llvm ir\narch            gfx90a\ntriple          amdgcn-amd-amdhsa\n"
            "producer        openmp") in listing
    run(llvm19("clang-offload-packager"), tmp_path / "ours.pkg", "--image=feature=+xnack,feature=+sramecc",
        cwd=tmp_path)
    assert (tmp_path / "ours-amdgcn-amd-amdhsa-gfx90a.0.bc").read_bytes() == (tmp_path / "dev.bc").read_bytes()


# --------------------------------------------------------------------------------------------------
# Containers: fat objects, archives, executables, shared objects, bitcode.


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, llvm19) -> dict[str, Path]:
    """Fat objects and programs built once with the real Clang 19."""
    d = tmp_path_factory.mktemp("built")
    (d / "x.cpp").write_text(SOURCE)
    cxx = llvm19("clang++")
    cpu = ["-fopenmp", "-fopenmp-targets=x86_64-unknown-linux-gnu"]
    run(cxx, *cpu, "-c", "x.cpp", "-o", "fat.o", cwd=d)
    run(cxx, "-fopenmp", "--offload-arch=sm_80,gfx90a", "-nogpulib", "-c", "x.cpp", "-o", "gpu.o", cwd=d)
    run(cxx, *cpu, "-flto", "-c", "x.cpp", "-o", "lto.o", cwd=d)
    run(cxx, *cpu, "x.cpp", "-o", "a.out", cwd=d)
    run(cxx, *cpu, "-shared", "-fPIC", "x.cpp", "-o", "libx.so", cwd=d)
    (d / "sub").mkdir()
    (d / "sub" / "a-very-long-member-name.o").write_bytes((d / "gpu.o").read_bytes())
    run(llvm19("llvm-ar"), "rcs", "libfat.a", "fat.o", "gpu.o", "sub/a-very-long-member-name.o", cwd=d)
    run(llvm19("llvm-ar"), "rcs", "--thin", "libthin.a", "fat.o", "gpu.o", cwd=d)
    # COFF has no section types: Clang finds ".llvm.offloading*" by name.
    (d / "k.cubin").write_bytes(b"cubin!")
    run(llvm19("clang-offload-packager"), "-o", "cuda.pkg",
        "--image=file=k.cubin,triple=nvptx64-nvidia-cuda,arch=sm_80,kind=openmp",
        "--image=file=k.cubin,triple=nvptx64-nvidia-cuda,arch=sm_90,kind=openmp", cwd=d)
    (d / "e.c").write_text("int f(void) { return 1; }\n")
    run(llvm19("clang"), "--target=x86_64-pc-windows-msvc", "-c", "e.c", "-o", "plain.obj", cwd=d)
    run(llvm19("llvm-objcopy"), "--add-section=.llvm.offloading=cuda.pkg", "plain.obj", "coff.obj", cwd=d)
    return {p.name: p for p in d.iterdir()}


def _clang_extract(llvm19, path: Path, workdir: Path) -> dict[str, bytes]:
    workdir.mkdir()
    run(llvm19("clang-offload-packager"), path, "--image=kind=openmp", cwd=workdir)
    return {p.name: p.read_bytes() for p in workdir.iterdir()}


@pytest.mark.parametrize("name,kinds", [
    ("fat.o", [ContainerKind.ELF_RELOCATABLE]),
    ("gpu.o", [ContainerKind.ELF_RELOCATABLE] * 2),
    ("libfat.a", [ContainerKind.ELF_RELOCATABLE] * 5),
    ("libthin.a", [ContainerKind.ELF_RELOCATABLE] * 3),
    ("a.out", [ContainerKind.ELF_EXECUTABLE]),
    ("libx.so", [ContainerKind.ELF_SHARED_OBJECT]),
    ("lto.o", [ContainerKind.BITCODE]),
    ("coff.obj", [ContainerKind.COFF_OBJECT] * 2),
])
def test_extraction_matches_clang(built: dict[str, Path], tmp_path: Path, llvm19, name: str,
                                  kinds: list[ContainerKind]) -> None:
    found = extract_offload_binaries(built[name])
    assert [f.origin.container for f in found] == kinds
    expected = _clang_extract(llvm19, built[name], tmp_path / "clang")
    stem = name.split(".")[0]
    ours = {f"{stem}-{f.binary.triple}-{f.binary.arch}.{i}.{f.binary.image_kind_name(19)}": f.read_image()
            for i, f in enumerate(found)}
    assert ours == expected
    for f in found:
        sink = tmp_path / "copy.bin"
        with open(sink, "wb") as out:
            f.copy_image(out)
        assert sink.read_bytes() == f.read_image()
        assert f.binary.size % 8 == 0 and f.describe()


def test_extraction_reports_locations(built: dict[str, Path]) -> None:
    found = extract_offload_binaries(built["libfat.a"])
    assert [f.origin.members for f in found] == [("fat.o",), ("gpu.o",), ("gpu.o",),
                                                  ("a-very-long-member-name.o",), ("a-very-long-member-name.o",)]
    assert {f.origin.section for f in found} == {".llvm.offloading"}
    raw = built["libfat.a"].read_bytes()
    for f in found:  # offsets are absolute in the archive file
        assert raw[f.offset:f.offset + 4] == b"\x10\xff\x10\xad"
    assert str(found[0].origin).endswith("libfat.a(fat.o): section .llvm.offloading")
    (lto,) = extract_offload_binaries(built["lto.o"])
    assert lto.origin.symbol == "llvm.embedded.object" and lto.binary.data is not None
    assert "initializer offset 0x0" in lto.describe()
    assert extract_offload_binaries(built["libx.so"], include_shared_objects=False) == []
    assert len(extract_offload_binaries(built["a.out"], include_shared_objects=False)) == 1  # a PIE, not a .so
    assert extract_offload_binaries(built["x.cpp"]) == []


def test_objdump_and_clang_agree_on_executable(built: dict[str, Path], llvm19) -> None:
    listing = run(llvm19("llvm-objdump"), "--offloading", built["a.out"]).stdout
    (f,) = extract_offload_binaries(built["a.out"])
    assert f"kind            elf\narch            {f.binary.arch}\ntriple          {f.binary.triple}" in listing


def test_corrupt_containers_raise_format_errors(built: dict[str, Path], tmp_path: Path) -> None:
    fat = built["fat.o"].read_bytes()
    cases = {
        "truncated.o": fat[:300],
        "shoff.o": fat[:0x28] + struct.pack("<Q", 1 << 40) + fat[0x30:],
        "shnum.o": fat[:0x3C] + struct.pack("<H", 0xFFF0) + fat[0x3E:],
        "ar-trunc.a": built["libfat.a"].read_bytes()[:100],
        "ar-size.a": b"!<arch>\nfat.o/          0           0     0     644     99999999  `\n" + fat,
        "ar-name.a": b"!<arch>\n/77             0           0     0     644     4         `\nabcd",
        "bc.o": b"BC\xc0\xde" + b"\x35\x14\x00\x00" * 20,
    }
    # A fat object whose .llvm.offloading section holds a corrupted binary.
    sec = fat.index(b"\x10\xff\x10\xad")
    cases["badbin.o"] = fat[:sec + 4] + b"\x09" + fat[sec + 5:]
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(OffloadFormatError) as info:
            extract_offload_binaries(tmp_path / name)
        assert info.value.path and name in info.value.path and info.value.offset is not None, name
    with pytest.raises(OffloadBinaryFormatError) as info:
        extract_offload_binaries(tmp_path / "badbin.o")
    assert info.value.offset == sec + 4


# --------------------------------------------------------------------------------------------------
# Hardening: a fixed corpus and a property.


def _sample() -> bytes:
    return encode_offload_binary(OffloadingImage(b"IMAGEDATA" * 3, 1, 1, 0,
                                                 (("triple", "x86_64-unknown-linux-gnu"), ("arch", "gfx90a"))))


def _put(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    raw = bytearray(data)
    struct.pack_into("<" + fmt, raw, offset, value)
    return bytes(raw)


H = HEADER.offsets
E = {k: v + HEADER.size for k, v in ENTRY.offsets.items()}
U64 = (1 << 64) - 1


def _corpus() -> dict[str, bytes]:
    good = _sample()
    size = len(good)
    image_at = struct.unpack_from("<Q", good, E["ImageOffset"])[0]
    strings_at = 72
    key0 = struct.unpack_from("<Q", good, strings_at)[0]
    c = {
        "empty-ish": good[:4],
        "short": good[:71],
        "truncated": good[:size - 8],
        "bad-magic": b"\x10\xff\x10\xae" + good[4:],
        "version-0": _put(good, H["Version"], "I", 0),
        "version-2": _put(good, H["Version"], "I", 2),
        "size-0": _put(good, H["Size"], "Q", 0),
        "size-71": _put(good, H["Size"], "Q", 71),
        "size-past-end": _put(good, H["Size"], "Q", size + 8),
        "size-u64max": _put(good, H["Size"], "Q", U64),
        "entry-offset-0": _put(good, H["EntryOffset"], "Q", 0),
        "entry-overlaps-header": _put(good, H["EntryOffset"], "Q", 16),
        "entry-offset-past-end": _put(good, H["EntryOffset"], "Q", size),
        "entry-offset-u64max": _put(good, H["EntryOffset"], "Q", U64),
        "entry-size-0": _put(good, H["EntrySize"], "Q", 0),
        "entry-size-u64max": _put(good, H["EntrySize"], "Q", U64),
        "string-offset-past-end": _put(good, E["StringOffset"], "Q", size + 16),
        "string-offset-u64max": _put(good, E["StringOffset"], "Q", U64 - 15),
        "strings-overlap-header": _put(good, E["StringOffset"], "Q", 0),
        "strings-overlap-entry": _put(good, E["StringOffset"], "Q", 0x30),
        "num-strings-u64max": _put(good, E["NumStrings"], "Q", U64),
        "num-strings-2^32": _put(good, E["NumStrings"], "Q", 1 << 32),
        "num-strings-past-end": _put(good, E["NumStrings"], "Q", (size - 72) // 16 + 1),
        "image-offset-past-end": _put(good, E["ImageOffset"], "Q", size + 8),
        "image-size-past-end": _put(good, E["ImageSize"], "Q", size),
        "image-wraps-u64": _put(_put(good, E["ImageOffset"], "Q", U64 - 7), E["ImageSize"], "Q", 16),
        "image-size-wraps-u64": _put(good, E["ImageSize"], "Q", U64 - image_at + 9),
        "image-overlaps-strings": _put(good, E["ImageOffset"], "Q", 72),
        "image-overlaps-header": _put(good, E["ImageOffset"], "Q", 0),
        "key-past-end": _put(good, strings_at, "Q", size + 100),
        "key-u64max": _put(good, strings_at, "Q", U64),
        "key-in-header": _put(good, strings_at, "Q", 8),
        "key-in-image": _put(good, strings_at, "Q", image_at + 1),
        "value-in-string-entries": _put(good, strings_at + 8, "Q", strings_at + 4),
        "key-unterminated": good[:image_at - 8] + b"\xff" * 8 + good[image_at:],
        "bad-utf8-key": good[:key0] + b"\xc3\x28" + good[key0 + 2:],
        "bad-utf8-value": bytes(b if i < 0x58 or good[i] != ord("g") else 0xFF for i, b in enumerate(good)),
        "garbage-after": good + b"\0" * 8,
        "short-second": good + good[:40],
        "second-bad-version": good + _put(good, H["Version"], "I", 7),
    }
    # NumStrings above the limit in a binary large enough to hold them.
    count = MAX_NUM_STRINGS + 1
    big = bytearray(72 + count * 16 + 8)
    big[:72] = HEADER.pack(Magic=b"\x10\xff\x10\xad", Version=1, Size=len(big), EntryOffset=32, EntrySize=40) + \
        ENTRY.pack(TheImageKind=0, TheOffloadKind=0, Flags=0, StringOffset=72, NumStrings=count, ImageOffset=0,
                   ImageSize=0)
    c["num-strings-over-limit"] = bytes(big)
    # Many entries pointing at one huge unterminated string.
    n = 4000
    blob = bytearray(72 + n * 16 + (1 << 16))
    blob[:72] = HEADER.pack(Magic=b"\x10\xff\x10\xad", Version=1, Size=len(blob), EntryOffset=32, EntrySize=40) + \
        ENTRY.pack(TheImageKind=0, TheOffloadKind=0, Flags=0, StringOffset=72, NumStrings=n, ImageOffset=0, ImageSize=0)
    for i in range(n):
        struct.pack_into("<QQ", blob, 72 + 16 * i, 72 + n * 16 + i, 72 + n * 16 + i + 1)
    blob[72 + n * 16:] = b"a" * ((1 << 16) - 1) + b"\0"  # terminated, but 4000 overlapping 64 KiB strings
    c["unterminated-shared-string"] = bytes(blob)
    return c


@pytest.mark.parametrize("case", sorted(_corpus()))
def test_corpus_case_is_a_format_error(case: str, tmp_path: Path) -> None:
    data = _corpus()[case]
    with pytest.raises(OffloadBinaryFormatError) as from_bytes:
        read_offload_binaries(data)
    path = tmp_path / f"{case}.bin"
    path.write_bytes(data)
    with pytest.raises(OffloadBinaryFormatError) as from_file:
        read_offload_binaries(path)
    assert from_bytes.value.offset is not None and 0 <= from_bytes.value.offset <= len(data)
    assert from_file.value.offset == from_bytes.value.offset
    assert from_file.value.message == from_bytes.value.message
    assert str(path) in str(from_file.value) and f"offset {from_file.value.offset:#x}" in str(from_file.value)


def test_clang_rejects_what_we_reject_where_it_checks(tmp_path: Path, llvm19) -> None:
    """The checks LLVM 19 itself makes (magic, version, sizes) fail in Clang's packager too."""
    corpus = _corpus()
    for case in ("version-0", "version-2", "size-past-end", "short", "entry-offset-past-end"):
        (tmp_path / f"{case}.pkg").write_bytes(corpus[case])
        result = subprocess.run([str(llvm19("clang-offload-packager")), str(tmp_path / f"{case}.pkg"),
                                 "--image=kind=openmp"], cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode == 1 and "error:" in result.stderr, case


_INTERESTING = st.sampled_from([0, 1, 7, 8, 16, 31, 32, 40, 71, 72, 0x47, 0x48, 0x7F, 0x80, 0x90, 0xFF, 0x100,
                                1 << 31, (1 << 32) - 1, 1 << 32, 1 << 63, U64 - 8, U64 - 1, U64])
_FIELDS = [(H["Version"], "I"), (H["Size"], "Q"), (H["EntryOffset"], "Q"), (H["EntrySize"], "Q"),
           (E["TheImageKind"], "H"), (E["TheOffloadKind"], "H"), (E["Flags"], "I"), (E["StringOffset"], "Q"),
           (E["NumStrings"], "Q"), (E["ImageOffset"], "Q"), (E["ImageSize"], "Q"),
           (72, "Q"), (80, "Q"), (88, "Q"), (96, "Q")]


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    sample = _sample()
    data = bytearray(sample * draw(st.integers(1, 2)))
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["field", "byte", "truncate", "extend"]))
        if action == "field":
            offset, fmt = draw(st.sampled_from(_FIELDS))
            base = draw(st.sampled_from([0, len(sample)]))
            width = struct.calcsize(fmt)
            value = draw(st.one_of(_INTERESTING, st.integers(0, (1 << (8 * width)) - 1))) % (1 << (8 * width))
            if base + offset + width <= len(data):
                struct.pack_into("<" + fmt, data, base + offset, value)
        elif action == "byte" and data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        elif action == "truncate":
            del data[draw(st.integers(0, len(data))):]
        else:
            data += draw(st.binary(max_size=64))
    return bytes(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_property_any_mutation_parses_or_raises_format_error(data: bytes) -> None:
    try:
        binaries = read_offload_binaries(data)
    except OffloadBinaryFormatError as exc:
        assert exc.offset is not None and 0 <= exc.offset <= len(data)
        with pytest.raises(OffloadBinaryFormatError) as again:  # the file path gives the same verdict
            read_offload_binaries(io.BytesIO(data))
        assert again.value.offset == exc.offset
        return
    for b in binaries:  # whatever parses is internally consistent
        assert b.end <= len(data) and b.image_offset + b.image_size <= b.end
        assert len(b.read_image()) == b.image_size
        assert len(b.strings) == b.entry.NumStrings


@settings(max_examples=150, deadline=None)
@given(st.binary(min_size=0, max_size=300))
def test_property_random_bytes_after_magic(tail: bytes) -> None:
    data = b"\x10\xff\x10\xad\x01\x00\x00\x00" + tail
    try:
        read_offload_binaries(data)
    except OffloadBinaryFormatError as exc:
        assert exc.offset is not None


_KEY = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0,="), min_size=1, max_size=40)
_VALUE = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0,"), max_size=40)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pairs=st.dictionaries(_KEY, _VALUE, max_size=12), payload=st.binary(max_size=40),
       image_kind=st.integers(0, 0xFFFF), offload_kind=st.integers(0, 0xFFFF), flags=st.integers(0, U64 >> 32))
def test_property_round_trip_and_clang_reads_it(pairs: dict[str, str], payload: bytes, image_kind: int,
                                                offload_kind: int, flags: int, tmp_path: Path, llvm19) -> None:
    assume(all(k not in ("file", "kind") for k in pairs))
    strings = tuple(packager_arguments(",".join(f"{k}={v}" for k, v in pairs.items()))) if pairs else ()
    image = OffloadingImage(payload, image_kind, offload_kind, flags, strings)
    data = encode_offload_binary(image)
    (b,) = read_offload_binaries(data)
    assert (b.image_kind, b.offload_kind, b.flags, b.strings, b.read_image()) == \
        (image_kind, offload_kind, flags, strings, payload)
    out = tmp_path / "p.pkg"
    out.write_bytes(data)
    listing = run(llvm19("llvm-objdump"), "--offloading", out).stdout
    assert f"arch            {pairs.get('arch', '')}\n" in listing


@pytest.fixture(scope="module")
def container_samples(built: dict[str, Path]) -> dict[str, bytes]:
    return {name: built[name].read_bytes() for name in ("fat.o", "libfat.a", "coff.obj", "a.out")}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_property_mutated_containers_parse_or_raise_format_error(data: st.DataObject,
                                                                 container_samples: dict[str, bytes],
                                                                 tmp_path: Path) -> None:
    """Flipped bytes, overwritten words and truncation of real ELF/COFF/ar files: results or an
    OffloadFormatError that names the file -- never another exception (pyelftools' included)."""
    name = data.draw(st.sampled_from(sorted(container_samples)))
    raw = bytearray(container_samples[name])
    for _ in range(data.draw(st.integers(1, 6))):
        where = data.draw(st.integers(0, len(raw) - 8))
        if data.draw(st.booleans()):
            raw[where] = data.draw(st.integers(0, 255))
        else:
            raw[where:where + 8] = data.draw(_INTERESTING).to_bytes(8, "little")
    if data.draw(st.booleans()):
        del raw[data.draw(st.integers(1, len(raw))):]
    path = tmp_path / name
    path.write_bytes(bytes(raw))
    try:
        found = extract_offload_binaries(path)
    except OffloadFormatError as exc:
        assert exc.path is not None and name in exc.path
        return
    for f in found:
        assert len(f.read_image()) == f.binary.image_size
