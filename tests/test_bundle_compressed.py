"""Compressed bundles (CCOB v1, v2, v3; zlib and zstd) against clang-offload-bundler 19 and 22.

Each side must decompress and unbundle the other's output to identical bytes: Clang 19 reads v1 and
v2 (it misreads v3), Clang 22 reads all three and writes v3 by default.  Damaged headers and payloads
end in BundleFormatError with an offset, without allocating what a header claims.
"""
from __future__ import annotations

import hashlib
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from itertools import product
from pathlib import Path

import pytest

from offload_builders.errors import BundleFormatError
from offload_builders.formats import bundle as B
from offload_builders.formats.compressed import (
    LAYOUTS,
    CompressedWriter,
    CompressionOptions,
    FileRegion,
    Method,
    compress_bytes,
    decompress_bytes,
    read_header,
)

WORKERS = 4
HOST = "host-x86_64-unknown-linux-gnu"
TARGETS = [HOST, "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+", "hip-amdgcn-amd-amdhsa--gfx908"]
PY = sys.executable


def run(cmd, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)


@pytest.fixture(scope="module")
def tools(llvm19, llvm22) -> dict[int, Path]:
    return {19: llvm19("clang-offload-bundler"), 22: llvm22("clang-offload-bundler")}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[Path]:
    work = tmp_path_factory.mktemp("inputs")
    contents = [b"HOSTDATA", b"CCOB" * 1000 + bytes(range(256)) * 40, b"__CLANG_OFFLOAD_BUNDLE__" + b"x" * 5000]
    paths = []
    for index, data in enumerate(contents):
        paths.append(work / f"in{index}")
        paths[-1].write_bytes(data)
    return paths


def clang_unbundle(tool: Path, bundle_file: Path, work: Path, file_type: str = "bc") -> list[bytes] | str:
    outs = [work / f"clang{i}" for i in range(len(TARGETS))]
    made = run([tool, "-unbundle", f"-type={file_type}", "-targets=" + ",".join(TARGETS), f"-input={bundle_file}",
                *[f"-output={o}" for o in outs]])
    if made.returncode:
        return made.stderr.strip().split("error: ", 1)[-1]
    return [o.read_bytes() for o in outs]


OURS = list(product((1, 2, 3), Method, ("bc", "ll")))


@pytest.mark.parametrize("version, method, file_type", OURS, ids=[f"v{v}-{m.name}-{t}" for v, m, t in OURS])
def test_clang_reads_our_compressed_bundles(tools, inputs, tmp_path, version, method, file_type):
    ours = tmp_path / "ours.ccob"
    B.bundle(inputs, TARGETS, ours, file_type=file_type, compression=CompressionOptions(method, None, version))
    header = ours.read_bytes()[:LAYOUTS[version].size]
    assert header[:4] == b"CCOB" and struct.unpack_from("<HH", header, 4) == (version, int(method))
    expected = [p.read_bytes() for p in inputs]

    def unbundle_with(version: int) -> list[bytes] | str:
        work = tmp_path / str(version)
        work.mkdir()
        return clang_unbundle(tools[version], ours, work, file_type)

    with ThreadPoolExecutor(2) as pool:
        got = dict(zip((19, 22), pool.map(unbundle_with, (19, 22))))
    assert got[22] == expected
    if version == 3:  # Clang 19 reads any version >= 2 with the v2 layout
        assert isinstance(got[19], str) and "Could not decompress" in got[19]
    else:
        assert got[19] == expected


@pytest.mark.parametrize("case", ["19", "22", "22-v2", "19-text"])
def test_we_read_clangs_compressed_bundles(tools, inputs, tmp_path, case):
    tool = tools[int(case[:2])]
    env = {"COMPRESSED_BUNDLE_FORMAT_VERSION": "2"} if case.endswith("v2") else {}
    file_type = "ll" if case.endswith("text") else "bc"
    clang_out = tmp_path / "clang.ccob"
    made = run([tool, f"-type={file_type}", "-compress", "-targets=" + ",".join(TARGETS), f"-output={clang_out}",
                *[f"-input={p}" for p in inputs]], env={"PATH": "/usr/bin:/bin", **env})
    assert made.returncode == 0, made.stderr
    data = clang_out.read_bytes()
    assert struct.unpack_from("<HH", data, 4) == ((3 if case == "22" else 2), 1)
    assert B.list_bundle_ids(clang_out, file_type=file_type) == run(
        [tool, "-list", f"-type={file_type}", f"-input={clang_out}"]).stdout.split()
    outs = [tmp_path / f"o{i}" for i in range(len(TARGETS))]
    result = B.unbundle(clang_out, TARGETS, outs, file_type=file_type)
    assert [o.read_bytes() for o in outs] == [p.read_bytes() for p in inputs]
    assert len(result.compression) == 1 and result.compression[0].header.total_size == len(data)


def test_header_fields_match_clang_19(tools, inputs, tmp_path):
    """Our default is Clang 19's: v2, zstd, the same sizes and truncated MD5."""
    clang_out, ours = tmp_path / "clang.ccob", tmp_path / "ours.ccob"
    made = run([tools[19], "-type=bc", "-compress", "-targets=" + ",".join(TARGETS), f"-output={clang_out}",
                *[f"-input={p}" for p in inputs]])
    assert made.returncode == 0
    B.bundle(inputs, TARGETS, ours, file_type="bc", compression=CompressionOptions())
    fields = []
    for path in (clang_out, ours):
        with open(path, "rb") as f:
            header = read_header(FileRegion(f.fileno(), 0, path.stat().st_size))
        fields.append((header.version, header.method, header.uncompressed_size, header.hash))
    assert fields[0] == fields[1]
    uncompressed = tmp_path / "plain"
    B.bundle(inputs, TARGETS, uncompressed, file_type="bc")
    assert fields[1][3] == hashlib.md5(uncompressed.read_bytes()).digest()[:8]
    assert decompress_bytes(clang_out.read_bytes()) == uncompressed.read_bytes()


def test_sizes_that_do_not_fit_the_version_are_refused(tmp_path):
    """LLVM 19 silently truncated sizes of 4 GiB and more to 32 bits; we refuse before writing."""
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate((4 << 30) + 1)  # sparse
    out = tmp_path / "out.ccob"
    for version in (1, 2):
        with pytest.raises(BundleFormatError, match=f"exceeds the compressed bundle format version {version} limit"):
            B.bundle([big, big], [HOST, "hip-amdgcn-amd-amdhsa--gfx908"], out, file_type="bc",
                     compression=CompressionOptions(version=version))
        assert not out.exists()
    with open(tmp_path / "v3", "wb") as f:  # v3 takes the size (nothing is compressed here)
        CompressedWriter(f.fileno(), (4 << 30) + 1, CompressionOptions(version=3))


# --------------------------------------------------------------------------------------------
# Concatenated compressed bundles
# --------------------------------------------------------------------------------------------
def test_concatenated_compressed_bundles_are_split_by_total_size(tools, inputs, tmp_path):
    """The zstd data of the first bundle contains "CCOB" (its input is mostly that string, stored
    raw), so only the header's total size can find the second bundle; Clang 19 fails outright."""
    parts = []
    for index, (version, method) in enumerate([(2, Method.ZSTD), (3, Method.ZLIB), (2, Method.ZLIB)]):
        path = tmp_path / f"part{index}"
        targets = [HOST, f"hip-amdgcn-amd-amdhsa--gfx{1030 + index}"]
        B.bundle([inputs[0], inputs[1]], targets, path, file_type="bc",
                 compression=CompressionOptions(method, None, version))
        parts.append(path.read_bytes())
    assert b"CCOB" in parts[0][24:]
    plain = tmp_path / "plain"
    B.bundle([inputs[0], inputs[2]], [HOST, "hip-amdgcn-amd-amdhsa--gfx1100"], plain, file_type="bc")
    combined = tmp_path / "combined"
    blob = bytearray()
    for part in (parts[0], parts[1], plain.read_bytes(), parts[2]):
        blob += part + bytes(-len(part) % 4096)
    combined.write_bytes(bytes(blob))
    ids = B.list_bundle_ids(combined, file_type="bc")
    assert sorted(set(ids)) == sorted({HOST + "-", "hip-amdgcn-amd-amdhsa--gfx1030", "hip-amdgcn-amd-amdhsa--gfx1031",
                                       "hip-amdgcn-amd-amdhsa--gfx1100", "hip-amdgcn-amd-amdhsa--gfx1032"})
    assert len(ids) == 8
    B.unbundle(combined, ["hip-amdgcn-amd-amdhsa--gfx1031", "hip-amdgcn-amd-amdhsa--gfx1100"],
               [tmp_path / "a", tmp_path / "b"], file_type="bc")
    assert (tmp_path / "a").read_bytes() == inputs[1].read_bytes()
    assert (tmp_path / "b").read_bytes() == inputs[2].read_bytes()
    clang = run([tools[19], "-list", "-type=bc", f"-input={combined}"])
    assert clang.returncode == 1 and "Src size is incorrect" in clang.stderr


# --------------------------------------------------------------------------------------------
# Damaged compressed bundles
# --------------------------------------------------------------------------------------------
PLAIN = B.binary_layout([HOST + "-"], [4])[0] + b"host"
V2 = compress_bytes(PLAIN, CompressionOptions(version=2))
V1_ZLIB = compress_bytes(PLAIN, CompressionOptions(Method.ZLIB, None, 1))
V3 = compress_bytes(PLAIN, CompressionOptions(version=3))


def _patch(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


BAD = [
    ("version-0", _patch(V2, 4, "<H", 0)),
    ("version-4", _patch(V2, 4, "<H", 4)),
    ("version-ffff", _patch(V2, 4, "<H", 0xFFFF)),
    ("method-2", _patch(V2, 6, "<H", 2)),
    ("truncated-header", V2[:22]),
    ("truncated-v3-header", V3[:30]),
    ("magic-only", b"CCOB"),
    ("total-size-below-header", _patch(V2, 8, "<I", 10)),
    ("total-size-past-end", _patch(V2, 8, "<I", len(V2) + 1)),
    ("v3-total-size-huge", _patch(V3, 8, "<Q", 2**63)),
    ("claimed-size-far-above", _patch(V2, 12, "<I", 0xFFFFFFFF)),
    ("v3-claimed-size-2-62", _patch(V3, 16, "<Q", 2**62)),
    ("claimed-size-below", _patch(V2, 12, "<I", 3)),
    ("v1-claimed-size-above", _patch(V1_ZLIB, 8, "<I", 1 << 31)),
    ("hash-mismatch", _patch(V2, 16, "<Q", 12345)),
    ("payload-garbage", V2[:24] + b"\x28\xb5\x2f\xfd" + b"\xff" * 40),
    ("payload-truncated", _patch(V2[:-5], 8, "<I", len(V2) - 5)),
    ("v1-trailing-garbage", V1_ZLIB + b"garbage"),
    ("v1-zlib-truncated", V1_ZLIB[:-3]),
    ("nested", compress_bytes(V2, CompressionOptions())),
    ("decompresses-to-bad-bundle", compress_bytes(PLAIN[:-10], CompressionOptions())),
]


@pytest.mark.parametrize("name, data", BAD, ids=[b[0] for b in BAD])
def test_damaged_compressed_bundles_are_errors_with_offsets(name, data, tmp_path):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(BundleFormatError) as info:
        B.list_bundle_ids(path, file_type="bc")
    assert info.value.offset is not None and str(path) in str(info.value)
    with pytest.raises(BundleFormatError):
        B.unbundle(path, [HOST], [tmp_path / "o"], file_type="bc", allow_missing_bundles=True)
    assert not (tmp_path / "o").exists()


def test_clang_19_ignores_the_hash(tools, tmp_path):
    """Clang never checks the MD5 (only -verbose prints "Hashes match: No"); we report a mismatch."""
    path = tmp_path / "bad-hash"
    path.write_bytes(_patch(V2, 16, "<Q", 12345))
    assert run([tools[19], "-list", "-type=bc", f"-input={path}"]).stdout.split() == [HOST + "-"]
    with pytest.raises(BundleFormatError, match="does not match the stored hash"):
        B.list_bundle_ids(path, file_type="bc")


MEMORY_RUNNER = """
import sys
from offload_builders.errors import BundleFormatError
from offload_builders.formats.bundle import list_bundle_ids
try:
    list_bundle_ids(sys.argv[1], file_type="bc")
    outcome = "ok"
except BundleFormatError as exc:
    outcome = "BundleFormatError: " + str(exc)
peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(int(peak.split()[1]) // 1024, outcome)
"""


@pytest.mark.parametrize("case", ["claims-2-62", "bomb"])
def test_claimed_sizes_are_never_allocated(tmp_path, case):
    """A v3 header claiming 2**62 bytes, and a small claim whose data inflates to 256 MiB of zeros,
    both fail with bounded memory."""
    path = tmp_path / case
    if case == "claims-2-62":
        path.write_bytes(_patch(V3, 16, "<Q", 2**62))
    else:
        zeros = tmp_path / "zeros"
        with open(zeros, "wb") as f:
            f.truncate(256 << 20)
        B.bundle([zeros], ["hip-amdgcn-amd-amdhsa--gfx908"], path, file_type="bc", compression=CompressionOptions())
        path.write_bytes(_patch(path.read_bytes(), 12, "<I", 1 << 20))
    made = run([PY, "-c", MEMORY_RUNNER, path])
    peak_mib, outcome = made.stdout.split(" ", 1)
    assert outcome.startswith("BundleFormatError"), made.stdout + made.stderr
    assert int(peak_mib) < 100
