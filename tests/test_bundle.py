"""Binary, text and object bundles and archive unbundling, differential against clang-offload-bundler 19.

* Bundling: our output is byte-identical to Clang's over a corpus of every ``-type``, several
  alignments and host placements (first, last, none), object bundles with a real ELF host, and
  archives split by compatible target IDs.
* Reading: ``-list`` and ``-unbundle`` agree with Clang; concatenated bundles are found from each
  header's extent; damaged input of every kind ends in :class:`BundleFormatError` naming an offset
  (a hypothesis property suite plus a fixed corpus), where Clang 19 may crash.
* Streaming: peak memory does not grow with a 256 MiB image (measured in a subprocess).
"""
from __future__ import annotations

import os
import struct
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from itertools import product
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from offload_builders.errors import BundleFormatError, OffloadError, TargetIDError
from offload_builders.formats import bundle as B, bundle_archive as BA
from offload_builders.formats.compressed import CompressionOptions, FileRegion, Method

WORKERS = 4
HOST = "host-x86_64-unknown-linux-gnu"
GFX908 = "hip-amdgcn-amd-amdhsa--gfx908"
GFX90A = "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+"
GFX1030 = "hip-amdgcn-amd-amdhsa-gfx1030"
TYPES = ("i", "ii", "cui", "hipi", "d", "ll", "s", "bc", "o", "gch", "ast")
PY = sys.executable


def run(cmd, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)


@pytest.fixture(scope="module")
def bundler(llvm19) -> Path:
    return llvm19("clang-offload-bundler")


@pytest.fixture(scope="module")
def payloads(tmp_path_factory) -> dict[str, Path]:
    """Inputs with awkward content: empty, no trailing newline, markers of the other formats inside."""
    work = tmp_path_factory.mktemp("payloads")
    contents = {
        "host": b"int host_side(void);\n",
        "empty": b"",
        "nonl": b"no trailing newline",
        "tricky": b"__CLANG_OFFLOAD_BUNDLE__\x03\0\0\0CCOB\x02\0\x01\0// not a marker\n\n",
        "binary": bytes(range(256)) * 9 + b"\n# __CLANG_OFFLOAD_BUNDLE____END__ x",
    }
    paths = {}
    for name, data in contents.items():
        paths[name] = work / name
        paths[name].write_bytes(data)
    return paths


# --------------------------------------------------------------------------------------------
# Byte-identical bundling
# --------------------------------------------------------------------------------------------
PLACEMENTS = {
    "host-first": [(HOST, "host"), (GFX90A, "tricky"), (GFX908, "binary"), (GFX1030, "empty")],
    "host-last": [(GFX908, "nonl"), (GFX1030, "binary"), ("hip-amdgcn-amd-amdhsa--gfx90a:xnack-", "empty"),
                  (HOST, "host")],
    "no-host": [(GFX908, "binary"), (GFX90A, "nonl"), ("hipv4-amdgcn-amd-amdhsa--gfx1100", "tricky")],
    "openmp": [("openmp-nvptx64-nvidia-cuda--sm_80", "tricky"), ("host-x86_64-unknown-linux", "empty"),
               ("openmp-amdgcn-amd-amdhsa--gfx906:sramecc+:xnack-", "binary")],
}
CORPUS = list(product(TYPES, PLACEMENTS, (1, 8, 4096)))


@pytest.fixture(scope="module")
def clang_corpus(bundler, payloads, tmp_path_factory) -> dict[tuple, Path]:
    work = tmp_path_factory.mktemp("corpus")

    def one(case):
        file_type, placement, align = case
        out = work / f"{file_type}-{placement}-{align}"
        entries = PLACEMENTS[placement]
        made = run([bundler, f"-type={file_type}", "-targets=" + ",".join(t for t, _ in entries),
                    f"-bundle-align={align}", f"-output={out}", *[f"-input={payloads[p]}" for _, p in entries]])
        assert made.returncode == 0, made.stderr
        return case, out

    with ThreadPoolExecutor(WORKERS) as pool:
        return dict(pool.map(one, CORPUS))


@pytest.mark.parametrize("case", CORPUS, ids=["-".join(map(str, c)) for c in CORPUS])
def test_bundle_is_byte_identical_to_clang(case, clang_corpus, payloads, tmp_path):
    file_type, placement, align = case
    entries = PLACEMENTS[placement]
    ours = tmp_path / "ours"
    result = B.bundle([payloads[p] for _, p in entries], [t for t, _ in entries], ours, file_type=file_type,
                      bundle_align=align)
    assert ours.read_bytes() == clang_corpus[case].read_bytes()
    assert result.format == ("text" if file_type in B.TEXT_COMMENTS else "binary")


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("file_type", ["ll", "bc", "o"])
def test_list_and_unbundle_agree_with_clang(placement, file_type, clang_corpus, bundler, payloads, tmp_path):
    bundle_file = clang_corpus[(file_type, placement, 4096)]
    listed = run([bundler, "-list", f"-type={file_type}", f"-input={bundle_file}"])
    ours = B.list_bundle_ids(bundle_file, file_type=file_type)
    assert set(ours) == set(listed.stdout.split())
    assert ours == listed.stdout.split()  # the same order too: we emulate Clang's hash order
    targets = [t for t, _ in PLACEMENTS[placement]]
    clang_outs = [tmp_path / f"c{i}" for i in range(len(targets))]
    our_outs = [tmp_path / f"o{i}" for i in range(len(targets))]
    made = run([bundler, "-unbundle", f"-type={file_type}", "-targets=" + ",".join(targets),
                f"-input={bundle_file}", *[f"-output={o}" for o in clang_outs]])
    assert made.returncode == 0, made.stderr
    B.unbundle(bundle_file, targets, our_outs, file_type=file_type)
    for (_, payload), clang_out, our_out in zip(PLACEMENTS[placement], clang_outs, our_outs):
        assert our_out.read_bytes() == clang_out.read_bytes() == payloads[payload].read_bytes()


def test_layout_matches_the_reference_hexdump():
    header, offsets, total = B.binary_layout([HOST + "-", "hip-amdgcn-amd-amdhsa--gfx90a:xnack+", GFX908],
                                             [8, 4, 11])
    assert (len(header), offsets, total) == (0xC7, [0xC7, 0xCF, 0xD3], 0xDE)
    assert B.binary_layout(["a"], [0], 16)[1] == [64]


# --------------------------------------------------------------------------------------------
# Object bundles
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def objects(llvm19, tmp_path_factory) -> dict[str, Path]:
    """Real objects from Clang 19: x86-64 host objects, AMDGPU device objects and bitcode."""
    work = tmp_path_factory.mktemp("objects")
    (work / "host.c").write_text("int host_fn(int x) { return x * 2; }\nint host_var = 1;\n")
    (work / "dev.c").write_text("int devfn(int x){return x+1;}\nint gv = 3;\nstatic int sv=1;\n"
                                "int usesv(){return sv;}\nextern int ext(); int callext(){return ext();}\n")
    (work / "nosym.c").write_text("static int hidden(void) { return 1; }\n")
    clang = llvm19("clang")
    jobs = {
        "host.o": ["-c", work / "host.c"],
        "host2.o": ["-c", work / "nosym.c"],
        "dev.o": ["--target=amdgcn-amd-amdhsa", "-mcpu=gfx906", "-nogpulib", "-c", work / "dev.c"],
        "dev.bc": ["--target=amdgcn-amd-amdhsa", "-mcpu=gfx906", "-nogpulib", "-emit-llvm", "-c", work / "dev.c"],
        "dev908.bc": ["--target=amdgcn-amd-amdhsa", "-mcpu=gfx908", "-nogpulib", "-emit-llvm", "-c", work / "dev.c"],
    }

    def build(item):
        name, args = item
        made = run([clang, *args, "-o", work / name])
        assert made.returncode == 0, made.stderr
        return name, work / name

    with ThreadPoolExecutor(WORKERS) as pool:
        return dict(pool.map(build, jobs.items()))


@pytest.mark.parametrize("host_first", [True, False])
def test_object_bundle_matches_clang(bundler, objects, payloads, tmp_path, host_first):
    entries = [(HOST, objects["host.o"]), (GFX908, objects["dev.o"]), (GFX90A, payloads["tricky"])]
    if not host_first:
        entries = entries[1:] + entries[:1]
    targets = [t for t, _ in entries]
    clang_out, ours = tmp_path / "clang.o", tmp_path / "ours.o"
    made = run([bundler, "-type=o", "-targets=" + ",".join(targets), f"-output={clang_out}",
                *[f"-input={p}" for _, p in entries]])
    assert made.returncode == 0, made.stderr
    assert B.bundle([p for _, p in entries], targets, ours, file_type="o").format == "object"
    assert ours.read_bytes() == clang_out.read_bytes()

    from elftools.elf.elffile import ELFFile

    with open(ours, "rb") as f:
        sections = {s.name: s for s in ELFFile(f).iter_sections() if s.name.startswith(B.MAGIC_STR)}
        assert list(sections) == [B.MAGIC_STR + t + ("-" if t == HOST else "") for t in targets]
        for target, path in entries:
            section = sections[B.MAGIC_STR + B.parse_bundle_entry_id(target).__str__()]
            assert section["sh_flags"] & 0x80000000  # SHF_EXCLUDE
            assert section.data() == (b"\0" if target == HOST else path.read_bytes())
    assert B.list_bundle_ids(ours, file_type="o") == run(
        [bundler, "-list", "-type=o", f"-input={clang_out}"]).stdout.split()
    clang_outs = [tmp_path / f"c{i}" for i in range(3)]
    our_outs = [tmp_path / f"u{i}" for i in range(3)]
    assert run([bundler, "-unbundle", "-type=o", "-targets=" + ",".join(targets), f"-input={clang_out}",
                *[f"-output={o}" for o in clang_outs]]).returncode == 0
    B.unbundle(ours, targets, our_outs, file_type="o")
    for clang_part, our_part in zip(clang_outs, our_outs):
        assert our_part.read_bytes() == clang_part.read_bytes()


def test_rdc_flow_matches_clang(bundler, objects, tmp_path):
    """The driver's -fgpu-rdc steps: device bitcode bundled into the host object (host last, 3-field
    triples), then unbundled with -allow-missing-bundles, which also passes plain objects through."""
    targets = ["hip-amdgcn-amd-amdhsa-gfx908", "host-x86_64-pc-linux-gnu"]
    inputs = [objects["dev908.bc"], objects["host.o"]]
    made = run([bundler, "-type=o", "-targets=" + ",".join(targets), f"-output={tmp_path / 'clang.o'}",
                *[f"-input={p}" for p in inputs]])
    assert made.returncode == 0, made.stderr
    B.bundle(inputs, targets, tmp_path / "ours.o", file_type="o")
    assert (tmp_path / "ours.o").read_bytes() == (tmp_path / "clang.o").read_bytes()
    for source in (tmp_path / "clang.o", objects["host2.o"]):
        clang_outs, our_outs = [tmp_path / "c0", tmp_path / "c1"], [tmp_path / "o0", tmp_path / "o1"]
        assert run([bundler, "-unbundle", "-allow-missing-bundles", "-type=o", "-targets=" + ",".join(targets),
                    f"-input={source}", *[f"-output={o}" for o in clang_outs]]).returncode == 0
        B.unbundle(source, targets, our_outs, file_type="o", allow_missing_bundles=True)
        assert [o.read_bytes() for o in our_outs] == [c.read_bytes() for c in clang_outs]
    assert (tmp_path / "o1").read_bytes() == objects["host2.o"].read_bytes()  # passed through


def test_object_bundle_without_host_is_an_error_where_clang_crashes(bundler, objects, tmp_path):
    crashed = run([bundler, "-type=o", f"-targets={GFX908},{GFX90A}", f"-input={objects['dev.o']}",
                   f"-input={objects['dev.o']}", f"-output={tmp_path / 'clang.o'}"])
    assert crashed.returncode in (-11, 139)
    with pytest.raises(OffloadError, match="needs a host target"):
        B.bundle([objects["dev.o"]] * 2, [GFX908, GFX90A], tmp_path / "ours.o", file_type="o")
    assert not (tmp_path / "ours.o").exists()


def test_compression_is_ignored_for_object_bundles_as_in_clang(bundler, objects, tmp_path):
    targets = [HOST, GFX908]
    made = run([bundler, "-type=o", "-compress", "-targets=" + ",".join(targets), f"-input={objects['host.o']}",
                f"-input={objects['dev.o']}", f"-output={tmp_path / 'clang.o'}"])
    assert made.returncode == 0
    B.bundle([objects["host.o"], objects["dev.o"]], targets, tmp_path / "ours.o", file_type="o",
             compression=CompressionOptions())
    assert (tmp_path / "ours.o").read_bytes() == (tmp_path / "clang.o").read_bytes()


# --------------------------------------------------------------------------------------------
# Archives
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def library(bundler, llvm19, objects, payloads, tmp_path_factory) -> Path:
    """A static library of bundles: binary bundles of bitcode, an object bundle, a compressed bundle,
    a plain object, a member name used twice and names short enough to sit in the member header."""
    work = tmp_path_factory.mktemp("library")
    members = work / "members"
    members.mkdir()

    def make(name: str, file_type: str, entries: list[tuple[str, Path]], *extra: str) -> Path:
        out = members / name
        made = run([bundler, f"-type={file_type}", "-targets=" + ",".join(t for t, _ in entries),
                    f"-output={out}", *[f"-input={p}" for _, p in entries], *extra])
        assert made.returncode == 0, made.stderr
        return out

    first = make("first.bc", "bc", [(HOST, objects["host.o"]), ("openmp-amdgcn-amd-amdhsa--gfx906", objects["dev.bc"]),
                                    ("openmp-amdgcn-amd-amdhsa--gfx908", objects["dev908.bc"])])
    fat = make("fat.o", "o", [(HOST, objects["host.o"]), ("openmp-amdgcn-amd-amdhsa--gfx906:xnack+", objects["dev.o"]),
                              ("openmp-nvptx64-nvidia-cuda--sm_80", payloads["binary"])])
    packed = make("packed.bc", "bc", [(HOST, objects["host2.o"]),
                                      ("openmp-amdgcn-amd-amdhsa--gfx906:xnack-", objects["dev.bc"])], "-compress")
    short = make("s.bc", "bc", [(HOST, payloads["nonl"]), ("openmp-amdgcn-amd-amdhsa--gfx906", payloads["empty"])])
    archive = work / "libdev.a"
    made = run([llvm19("llvm-ar"), "qc", archive, first, fat, objects["host2.o"], packed, short, first])
    assert made.returncode == 0, made.stderr
    return archive


ARCHIVE_TARGETS = ["openmp-amdgcn-amd-amdhsa--gfx906:xnack+", "openmp-amdgcn-amd-amdhsa--gfx908", HOST,
                   "openmp-nvptx64-nvidia-cuda--sm_80", "openmp-amdgcn-amd-amdhsa--gfx906:xnack-"]


def test_archive_unbundling_is_byte_identical_to_clang(bundler, library, tmp_path):
    clang_outs = [tmp_path / f"clang{i}.a" for i in range(len(ARCHIVE_TARGETS))]
    our_outs = [tmp_path / f"ours{i}.a" for i in range(len(ARCHIVE_TARGETS))]
    made = run([bundler, "-unbundle", "-type=a", "-targets=" + ",".join(ARCHIVE_TARGETS), f"-input={library}",
                *[f"-output={o}" for o in clang_outs]])
    assert made.returncode == 0, made.stderr
    BA.unbundle_archive(library, ARCHIVE_TARGETS, our_outs)
    for clang_out, our_out in zip(clang_outs, our_outs):
        assert our_out.read_bytes() == clang_out.read_bytes(), our_out.name
    # gfx906:xnack+ collects the Any and the xnack+ entries of every member, with Clang's names
    names = _member_names(our_outs[0])
    assert "first-openmp-amdgcn-amd-amdhsa--gfx906first.bc" in names
    assert "fat-openmp-amdgcn-amd-amdhsa--gfx906_xnack+fat.bc" in names
    assert "s-openmp-amdgcn-amd-amdhsa--gfx906s.bc" in names
    assert "fat-openmp-nvptx64-nvidia-cuda--sm_80fat.cubin" in _member_names(our_outs[3])
    assert "fat-host-x86_64-unknown-linux-gnu-fat.o" in _member_names(our_outs[2])


def _member_names(archive: Path) -> list[str]:
    with open(archive, "rb") as f:
        region = FileRegion(f.fileno(), 0, os.fstat(f.fileno()).st_size)
        return [m.name for m in BA.read_archive(region, label=str(archive))]


def test_archive_missing_target(bundler, library, tmp_path):
    targets = [HOST, "openmp-amdgcn-amd-amdhsa--gfx1030"]
    made = run([bundler, "-unbundle", "-type=a", "-targets=" + ",".join(targets), f"-input={library}",
                f"-output={tmp_path / 'c0'}", f"-output={tmp_path / 'c1'}"])
    with pytest.raises(OffloadError) as info:
        BA.unbundle_archive(library, targets, [tmp_path / "o0", tmp_path / "o1"])
    assert made.returncode == 1
    assert made.stderr.strip() == f"{bundler}: error: {info.value}"  # Clang's message, word for word
    assert not (tmp_path / "o0").exists() and not (tmp_path / "o1").exists()
    made = run([bundler, "-unbundle", "-type=a", "-allow-missing-bundles", "-targets=" + ",".join(targets),
                f"-input={library}", f"-output={tmp_path / 'c0'}", f"-output={tmp_path / 'c1'}"])
    assert made.returncode == 0
    BA.unbundle_archive(library, targets, [tmp_path / "o0", tmp_path / "o1"], allow_missing_bundles=True)
    assert (tmp_path / "o1").read_bytes() == (tmp_path / "c1").read_bytes() == b"!<arch>\n"
    assert (tmp_path / "o0").read_bytes() == (tmp_path / "c0").read_bytes()


def test_check_input_archive_reports_clangs_conflict(bundler, llvm19, payloads, tmp_path):
    bad = tmp_path / "bad.bc"
    pair = [HOST, "openmp-amdgcn-amd-amdhsa--gfx906", "openmp-amdgcn-amd-amdhsa--gfx906:xnack+"]
    # Clang refuses to bundle this pair; write the bundle ourselves, bypassing the check
    header, offsets, total = B.binary_layout([B.parse_bundle_entry_id(t).__str__() for t in pair], [1, 1, 1])
    bad.write_bytes(header + b"abc")
    archive = tmp_path / "lib3.a"
    assert run([llvm19("llvm-ar"), "qc", archive, bad]).returncode == 0
    made = run([bundler, "-unbundle", "-type=a", "-check-input-archive", "-targets=" + HOST, f"-input={archive}",
                f"-output={tmp_path / 'c'}"], cwd=tmp_path)
    assert made.returncode == 1
    with pytest.raises(OffloadError) as info:
        BA.unbundle_archive(archive, [HOST], [tmp_path / "o"], check_input_archive=True)
    assert made.stderr.strip().split("error: ", 1)[1] == str(info.value)
    BA.unbundle_archive(archive, [HOST], [tmp_path / "o"])  # without the check it unbundles


# --------------------------------------------------------------------------------------------
# Concatenated bundles: found from each header's extent, never by searching for a magic
# --------------------------------------------------------------------------------------------
def _bundle_bytes(pairs: list[tuple[str, bytes]], align: int = 1) -> bytes:
    ids = [B.parse_bundle_entry_id(t).__str__() for t, _ in pairs]
    header, offsets, total = B.binary_layout(ids, [len(d) for _, d in pairs], align)
    out = bytearray(header)
    for offset, (_, data) in zip(offsets, pairs):
        out += bytes(offset - len(out)) + data
    return bytes(out)


def test_concatenated_bundles(bundler, tmp_path):
    tricky = b"xx__CLANG_OFFLOAD_BUNDLE__\xff\xff\xff\xff\xff\xff\xff\xffCCOB\x09\0\x07\0yy"
    first = _bundle_bytes([(HOST, b""), (GFX908, tricky)], align=4096)
    second = _bundle_bytes([(HOST, b""), (GFX90A, b"second image")], align=4096)
    padded = first + bytes(-len(first) % 4096) + second
    path = tmp_path / "fatbin"
    path.write_bytes(padded)
    ours = B.list_bundle_ids(path, file_type="bc")
    assert sorted(ours) == sorted([HOST + "-", GFX908, HOST + "-", GFX90A])
    clang = run([bundler, "-list", "-type=bc", f"-input={path}"])
    assert sorted(clang.stdout.split()) == sorted([HOST + "-", GFX908])  # Clang 19 sees only the first
    B.unbundle(path, [GFX908, GFX90A], [tmp_path / "a", tmp_path / "b"], file_type="bc")
    assert (tmp_path / "a").read_bytes() == tricky
    assert (tmp_path / "b").read_bytes() == b"second image"
    path.write_bytes(first + b"\0\0junk")
    with pytest.raises(BundleFormatError) as info:
        B.list_bundle_ids(path, file_type="bc")
    assert info.value.offset == len(first) + 2


def test_plain_input_passes_through_to_the_host_as_in_clang(bundler, payloads, tmp_path):
    """Nothing matched: with -allow-missing-bundles the host output is a copy of the input."""
    targets = [GFX908, HOST]
    made = run([bundler, "-unbundle", "-type=bc", "-allow-missing-bundles", "-targets=" + ",".join(targets),
                f"-input={payloads['binary']}", f"-output={tmp_path / 'c0'}", f"-output={tmp_path / 'c1'}"])
    assert made.returncode == 0
    B.unbundle(payloads["binary"], targets, [tmp_path / "o0", tmp_path / "o1"], file_type="bc",
               allow_missing_bundles=True)
    assert (tmp_path / "o1").read_bytes() == (tmp_path / "c1").read_bytes() == payloads["binary"].read_bytes()
    assert (tmp_path / "o0").read_bytes() == (tmp_path / "c0").read_bytes() == b""


# --------------------------------------------------------------------------------------------
# No partial output
# --------------------------------------------------------------------------------------------
def test_failed_unbundle_leaves_nothing_behind(tmp_path, payloads):
    bundle_file = tmp_path / "b"
    B.bundle([payloads["host"], payloads["binary"]], [HOST, GFX908], bundle_file, file_type="bc")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "keep").write_bytes(b"previous")
    with pytest.raises(OffloadError, match="Can't find bundles for hip-amdgcn-amd-amdhsa--gfx90a"):
        B.unbundle(bundle_file, [GFX908, "hip-amdgcn-amd-amdhsa--gfx90a", HOST],
                   [out_dir / "dev", out_dir / "x", out_dir / "keep"], file_type="bc")
    assert sorted(p.name for p in out_dir.iterdir()) == ["keep"]
    assert (out_dir / "keep").read_bytes() == b"previous"
    with pytest.raises(OffloadError):
        B.bundle([payloads["host"], tmp_path / "missing"], [HOST, GFX908], out_dir / "new", file_type="bc")
    assert sorted(p.name for p in out_dir.iterdir()) == ["keep"]


def test_special_outputs_are_written_in_place(tmp_path, payloads):
    bundle_file = tmp_path / "b"
    B.bundle([payloads["host"], payloads["binary"]], [HOST, GFX908], bundle_file, file_type="bc")
    B.unbundle(bundle_file, [GFX908, HOST], ["/dev/null", tmp_path / "h"], file_type="bc")
    assert (tmp_path / "h").read_bytes() == payloads["host"].read_bytes()
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")


# --------------------------------------------------------------------------------------------
# Damaged input: a fixed corpus and properties
# --------------------------------------------------------------------------------------------
def _record(offset: int, size: int, id_text: bytes, id_len: int | None = None) -> bytes:
    return struct.pack("<QQQ", offset, size, len(id_text) if id_len is None else id_len) + id_text


def _header(count: int, *records: bytes) -> bytes:
    return B.MAGIC + struct.pack("<Q", count) + b"".join(records)


GOOD = _bundle_bytes([(HOST, b"HOSTDATA"), ("hip-amdgcn-amd-amdhsa--gfx90a:xnack+", b"DEV1"),
                      (GFX908, b"DEVICE_TWO!")])
ENTRY_AT = 32
#: (name, file type, data): each must be a BundleFormatError with an offset, in the library and CLI.
BAD_INPUTS = [
    ("truncated-clang-19-segfaults", "bc", GOOD[:220]),
    ("truncated-in-record", "bc", GOOD[:40]),
    ("truncated-in-id", "bc", GOOD[:60]),
    ("truncated-count", "bc", GOOD[:28]),
    ("absurd-count", "bc", _header(2**64 - 1, _record(64, 1, b"x"))),
    ("count-over-limit", "bc", _header(70000) + bytes(70000 * 25)),
    ("offset-past-end", "bc", _header(1, _record(1000, 1, b"host-x")) + b"z"),
    ("size-past-end", "bc", _header(1, _record(46, 2**63, b"host-x")) + b"z"),
    ("offset-plus-size-overflows", "bc", _header(1, _record(2**64 - 1, 2, b"host-x")) + b"z"),
    ("id-length-overflows", "bc", _header(1, _record(46, 1, b"host-x", 2**64 - 1)) + b"z"),
    ("zero-offset", "bc", _header(1, _record(0, 1, b"host-x")) + b"z"),
    ("offset-into-header", "bc", _header(1, _record(10, 1, b"host-x")) + b"z"),
    ("overlap", "bc", _header(2, _record(78, 4, b"host-x"), _record(80, 4, b"hip-y")) + b"abcdef"),
    ("duplicate-ids", "bc", _header(2, _record(78, 1, b"host-x"), _record(79, 1, b"host-x")) + b"ab"),
    ("bad-utf8", "bc", _header(1, _record(47, 1, b"host-\xff\xfe")) + b"z"),
    ("empty-id", "bc", _header(1, _record(32 + 24, 1, b"")) + b"z"),
    ("control-char-id", "bc", _header(1, _record(47, 1, b"host\nxx")) + b"z"),
    ("trailing-junk", "bc", GOOD + b"\0\0junk"),
    ("text-no-end", "ll", b"\n; __CLANG_OFFLOAD_BUNDLE____START__ host-x\ncontent\n"),
    ("text-end-mismatch", "ll", b"\n; __CLANG_OFFLOAD_BUNDLE____START__ host-x\nc\n; "
                                b"__CLANG_OFFLOAD_BUNDLE____END__ host-y\n"),
    ("text-start-no-newline", "s", b"\n# __CLANG_OFFLOAD_BUNDLE____START__ host-x"),
    ("text-duplicate", "i", (b"\n// __CLANG_OFFLOAD_BUNDLE____START__ a\n1\n// __CLANG_OFFLOAD_BUNDLE____END__ a\n")
     * 2),
    ("text-bad-utf8", "ll", b"\n; __CLANG_OFFLOAD_BUNDLE____START__ \xff\nc\n; __CLANG_OFFLOAD_BUNDLE____END__ \xff\n"),
]


@pytest.mark.parametrize("name, file_type, data", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_damaged_input_is_a_bundle_format_error_with_offset(name, file_type, data, tmp_path):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(BundleFormatError) as info:
        B.list_bundle_ids(path, file_type=file_type)
    assert info.value.offset is not None and info.value.path == str(path)
    assert f"offset {info.value.offset:#x}" in str(info.value)
    with pytest.raises(BundleFormatError):
        B.unbundle(path, [HOST], [tmp_path / "out"], file_type=file_type, allow_missing_bundles=True)
    assert not (tmp_path / "out").exists()


def test_truncated_bundle_crashes_clang_19_and_is_explained_here(bundler, tmp_path):
    path = tmp_path / "truncated.bin"
    path.write_bytes(GOOD[:220])
    crashed = run([bundler, "-list", "-type=bc", f"-input={path}"])
    assert crashed.returncode in (-11, 139)
    with pytest.raises(BundleFormatError, match="runs past the end of the data") as info:
        B.list_bundle_ids(path, file_type="bc")
    assert info.value.offset == 0x9A  # the size field of entry 2


def _elf_with_section(name: bytes, contents: bytes, *, section_offset: int | None = None,
                      shentsize: int = 64, shnum: int | None = None) -> bytes:
    """A minimal ELF64 relocatable object: null section, one PROGBITS section, .shstrtab."""
    shstrtab = b"\0" + name + b"\0.shstrtab\0"
    data_at = 64
    strtab_at = data_at + len(contents)
    shoff = strtab_at + len(shstrtab)
    shoff += -shoff % 8
    ident = b"\x7fELF\x02\x01\x01" + bytes(9)
    header = ident + struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, shoff, 0, 64, 0, 0, shentsize,
                                 3 if shnum is None else shnum, 2)
    sections = bytes(64)
    sections += struct.pack("<IIQQQQIIQQ", 1, 1, 0x80000000, 0,
                            data_at if section_offset is None else section_offset, len(contents), 0, 0, 1, 0)
    sections += struct.pack("<IIQQQQIIQQ", 1 + len(name) + 1, 3, 0, 0, strtab_at, len(shstrtab), 0, 0, 1, 0)
    body = header + contents + shstrtab
    return body + bytes(shoff - len(body)) + sections


BAD_OBJECTS = [
    ("section-past-end", _elf_with_section(B.MAGIC + b"hip-x", b"abc", section_offset=10**6)),
    ("section-table-past-end", _elf_with_section(B.MAGIC + b"hip-x", b"abc", shnum=4000)),
    ("bad-shentsize", _elf_with_section(B.MAGIC + b"hip-x", b"abc", shentsize=0)),
    ("section-name-bad-utf8", _elf_with_section(B.MAGIC + b"hip-\xff", b"abc")),
    ("truncated-elf", _elf_with_section(B.MAGIC + b"hip-x", b"abc")[:70]),
]


@pytest.mark.parametrize("name, data", BAD_OBJECTS, ids=[b[0] for b in BAD_OBJECTS])
def test_damaged_objects_are_bundle_format_errors(name, data, tmp_path):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(BundleFormatError) as info:
        B.list_bundle_ids(path, file_type="o")
    assert info.value.offset is not None


def test_minimal_elf_fixture_is_read_correctly(tmp_path):
    path = tmp_path / "ok.o"
    path.write_bytes(_elf_with_section(B.MAGIC + b"hip-amdgcn-amd-amdhsa--gfx908", b"abc"))
    assert B.list_bundle_ids(path, file_type="o") == [GFX908]
    B.unbundle(path, [GFX908], [tmp_path / "dev"], file_type="o")
    assert (tmp_path / "dev").read_bytes() == b"abc"


BAD_ARCHIVES = [
    ("not-an-archive", b"!<arc>\nxxxxx"),
    ("thin", b"!<thin>\n"),
    ("truncated-header", b"!<arch>\nfoo.o/   "),
    ("size-past-end", b"!<arch>\n" + b"foo.o/".ljust(16) + b"0".ljust(12) + b"0".ljust(6) * 2 + b"644".ljust(8)
     + b"999".ljust(10) + b"`\nabc"),
    ("bad-size", b"!<arch>\n" + b"foo.o/".ljust(16) + b"0".ljust(12) + b"0".ljust(6) * 2 + b"644".ljust(8)
     + b"-1x".ljust(10) + b"`\nabc"),
    ("long-name-out-of-table", b"!<arch>\n" + b"/99".ljust(16) + b"0".ljust(12) + b"0".ljust(6) * 2
     + b"644".ljust(8) + b"3".ljust(10) + b"`\nabc"),
]


@pytest.mark.parametrize("name, data", BAD_ARCHIVES, ids=[b[0] for b in BAD_ARCHIVES])
def test_damaged_archives_are_bundle_format_errors(name, data, tmp_path):
    path = tmp_path / f"{name}.a"
    path.write_bytes(data)
    with pytest.raises(BundleFormatError) as info:
        BA.unbundle_archive(path, [HOST], [tmp_path / "o.a"], allow_missing_bundles=True)
    assert info.value.offset is not None
    assert not (tmp_path / "o.a").exists()


def _read_all(data: bytes, file_type: str) -> None:
    """List and unbundle ``data``: success or BundleFormatError (or a missing-bundle error), nothing else."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "input"
        path.write_bytes(data)
        try:
            ids = B.list_bundle_ids(path, file_type=file_type)
        except BundleFormatError as exc:
            assert exc.offset is not None
            return
        targets = [i for i in dict.fromkeys(ids) if _valid_request(i)][:3] or [HOST]
        outputs = [Path(tmp) / f"o{i}" for i in range(len(targets))]
        try:
            B.unbundle(path, targets, outputs, file_type=file_type, allow_missing_bundles=True)
        except BundleFormatError as exc:
            assert exc.offset is not None and exc.path == str(path), exc  # located, like a listing's error
        except TargetIDError as exc:
            # listed IDs that cannot be requested together: Clang's own validation messages
            assert str(exc).startswith(("Cannot bundle inputs with conflicting targets",
                                        "expecting exactly one host target")), exc
        except OffloadError as exc:  # the host object of a damaged ELF bundle that llvm-objcopy refuses
            assert file_type == "o" and str(exc).startswith("'llvm-objcopy' tool failed: "), exc
        else:
            return
        assert not any(out.exists() for out in outputs)  # an error leaves no output


def _valid_request(text: str) -> bool:
    try:
        B.validate_targets([text], bundling=False)
        return True
    except OffloadError:
        return False


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_bundles_never_raise_anything_else(data):
    kind = data.draw(st.sampled_from(["binary", "text", "compressed", "object"]))
    if kind == "binary":
        base, file_type = GOOD, "bc"
    elif kind == "text":
        base = (b"\n; __CLANG_OFFLOAD_BUNDLE____START__ host-x86_64-unknown-linux-gnu-\nhost\n"
                b"; __CLANG_OFFLOAD_BUNDLE____END__ host-x86_64-unknown-linux-gnu-\n"
                b"\n; __CLANG_OFFLOAD_BUNDLE____START__ hip-amdgcn-amd-amdhsa--gfx908\ndev\n"
                b"; __CLANG_OFFLOAD_BUNDLE____END__ hip-amdgcn-amd-amdhsa--gfx908\n")
        file_type = "ll"
    elif kind == "compressed":
        from offload_builders.formats.compressed import compress_bytes

        version = data.draw(st.sampled_from([1, 2, 3]))
        base, file_type = compress_bytes(GOOD, CompressionOptions(version=version)), "bc"
    else:
        base, file_type = _elf_with_section(B.MAGIC + b"hip-amdgcn-amd-amdhsa--gfx908", b"abc"), "o"
    buf = bytearray(base)
    for _ in range(data.draw(st.integers(0, 4))):
        if not buf:
            break
        op = data.draw(st.sampled_from(["set", "truncate", "insert", "delete"]))
        at = data.draw(st.integers(0, len(buf) - 1))
        if op == "set":
            buf[at] = data.draw(st.integers(0, 255))
        elif op == "truncate":
            del buf[at:]
        elif op == "insert":
            buf[at:at] = data.draw(st.binary(min_size=1, max_size=9))
        else:
            del buf[at:at + data.draw(st.integers(1, 9))]
    _read_all(bytes(buf), file_type)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300), st.sampled_from(["bc", "ll", "o", "a"]))
def test_arbitrary_bytes_never_raise_anything_else(raw, file_type):
    prefix = {"bc": B.MAGIC, "ll": b"", "o": b"\x7fELF\x02\x01\x01", "a": b"!<arch>\n"}[file_type]
    data = prefix + raw
    if file_type == "a":
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "x.a").write_bytes(data)
            try:
                BA.unbundle_archive(Path(tmp) / "x.a", [HOST], [Path(tmp) / "o.a"], allow_missing_bundles=True)
            except BundleFormatError as exc:
                assert exc.offset is not None and exc.path and str(exc).startswith(exc.path), exc
                assert not (Path(tmp) / "o.a").exists()
        return
    _read_all(data, file_type)


# --------------------------------------------------------------------------------------------
# Streaming: memory does not grow with the image size
# --------------------------------------------------------------------------------------------
#: Runs the CLI and records its own peak RSS (VmHWM, kB).  A parent's ru_maxrss would also count the
#: pages of the forked test process before exec, so the child reports its high-water mark itself.
PEAK_RSS_RUNNER = """
import sys
from offload_builders.cli.bundler import main
status = main(sys.argv[2:])
peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))
open(sys.argv[1], "w").write(peak.split()[1])
sys.exit(status)
"""


def peak_rss_mib(args: list[str]) -> float:
    """Run the CLI in a fresh interpreter and return its peak resident set size in MiB."""
    with tempfile.NamedTemporaryFile("r") as report:
        made = subprocess.run([PY, "-c", PEAK_RSS_RUNNER, report.name, *args], capture_output=True, text=True)
        assert made.returncode == 0, made.stderr
        return int(report.read()) / 1024


@pytest.mark.parametrize("file_type", ["bc", "ll"])
def test_memory_stays_flat_with_a_256_mib_image(tmp_path, file_type):
    peaks = {}
    for size_mib in (1, 256):
        image = tmp_path / f"image{size_mib}"
        with open(image, "wb") as f:
            f.truncate(size_mib << 20)  # sparse: no disk needed
        (tmp_path / "host").write_bytes(b"host")
        bundled = tmp_path / f"bundle{size_mib}"
        targets = f"-targets={HOST},{GFX908}"
        bundle_peak = peak_rss_mib([f"-type={file_type}", targets, f"-input={tmp_path / 'host'}", f"-input={image}",
                                     f"-output={bundled}", "-bundle-align=4096"])
        out = tmp_path / f"out{size_mib}"
        unbundle_peak = peak_rss_mib(["-unbundle", f"-type={file_type}", f"-targets={GFX908}", f"-input={bundled}",
                                       f"-output={out}"])
        assert out.stat().st_size == size_mib << 20
        peaks[size_mib] = (bundle_peak, unbundle_peak)
    for small, large in zip(peaks[1], peaks[256]):
        assert large < 100
        assert large - small < 16, peaks


# --------------------------------------------------------------------------------------------
# Bounded decompression: listing and selection read what they need, or say how much first
# --------------------------------------------------------------------------------------------
BOMB_DEVICE = "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+"
BOMB_IMAGE = 1 << 30
#: The first 8 bytes of the MD5 of the bomb's 1 GiB bundle (computing it takes seconds; a reader that reaches
#: the end of the stream checks it, so the bomb is a valid compressed bundle, not a damaged one).
BOMB_MD5 = bytes.fromhex("d8c684d5e8dca40c")


def _amdgpu_elf_head() -> bytes:
    """The 64-byte header of an AMDGPU HSA code object v5 (what offload-select reads of an image)."""
    ident = b"\x7fELF\x02\x01\x01" + bytes([64, 3]) + bytes(7)
    return ident + struct.pack("<HHIQQQIHHHHHH", 3, 224, 1, 0, 0, 0, 0x30, 64, 0, 0, 64, 0, 0)


def _ccob(pieces, total: int, digest: bytes) -> bytes:
    """A CCOB v2 zstd bundle of the uncompressed bundle ``pieces`` (an iterable of bytes, ``total`` in all)."""
    import zstandard

    stream = zstandard.ZstdCompressor(level=1).compressobj(size=total)
    payload = b"".join(stream.compress(piece) for piece in pieces) + stream.flush()
    return struct.pack("<4sHHIIQ", b"CCOB", 2, 1, 24 + len(payload), total, struct.unpack("<Q", digest)[0]) + payload


@pytest.fixture(scope="module")
def zstd_bomb(tmp_path_factory) -> Path:
    """A real bundle header (a host entry and a gfx90a code object) whose code object is 1 GiB: its ELF header
    and then zeros; compressed, 33 KB."""
    header, offsets, total = B.binary_layout([HOST + "-", BOMB_DEVICE], [4, BOMB_IMAGE], 4096)
    prefix = (header + bytes(offsets[0] - len(header)) + b"host" + bytes(offsets[1] - offsets[0] - 4)
              + _amdgpu_elf_head())
    zeros = bytes(1 << 20)

    def pieces():
        yield prefix
        left = total - len(prefix)
        while left:
            yield zeros[:min(left, len(zeros))]
            left -= min(left, len(zeros))

    path = tmp_path_factory.mktemp("bomb") / "bomb.ccob"
    path.write_bytes(_ccob(pieces(), total, BOMB_MD5))
    return path


@pytest.fixture
def decompressed(monkeypatch) -> list[int]:
    """Counts every byte any decompressor of :mod:`~offload_builders.formats.compressed` puts out."""
    from offload_builders.formats import compressed

    count = [0]
    real = compressed._decompressed_pieces

    def counting(method, payload):
        for piece in real(method, payload):
            count[0] += len(piece)
            yield piece

    monkeypatch.setattr(compressed, "_decompressed_pieces", counting)
    return count


def _run_cli(main, args, capsys) -> tuple[int, str, str]:
    status = main([str(a) for a in args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_a_zstd_bomb_is_listed_and_selected_from_its_header(zstd_bomb, decompressed, capsys):
    """-list, offload-inspect and offload-select read the bundle header and the code object's ELF header: a few
    MiB decompressed (whole CHUNKs) of the 1 GiB the 33 KB file declares, and no note (nothing large to say)."""
    from offload_builders.cli import bundler, inspect as inspect_cli, select as select_cli

    assert zstd_bomb.stat().st_size < 64 << 10
    for main, args, expected in [
        (bundler.main, ["-list", "-type=bc", f"-input={zstd_bomb}"], f"{BOMB_DEVICE}\n{HOST}-\n"),
        (inspect_cli.main, [zstd_bomb], f"arch=gfx90a:xnack+ image=elf size={BOMB_IMAGE} "),
        (inspect_cli.main, ["--json", zstd_bomb], '"uncompressed_size": 1073750016'),
        (select_cli.main, ["--device=gfx90a:xnack+", zstd_bomb], f"{BOMB_DEVICE}\n"),
        (select_cli.main, ["--device=gfx90a:xnack+", "--cov=4", zstd_bomb], ""),  # the ELF header says cov5
    ]:
        decompressed[0] = 0
        status, out, err = _run_cli(main, args, capsys)
        assert expected in out and err.count("note:") == 0, (args, out, err)
        assert status == (1 if "--cov=4" in args else 0), (args, err)
        assert decompressed[0] <= 4 << 20, (args, decompressed[0])
    assert "needs cov4" in err or "cov5" in err, err


def test_reading_everything_is_announced_first(tmp_path, decompressed, capsys, monkeypatch):
    """Where the whole payload must be read (a compressed text bundle's entries are found by scanning it; an
    image header far into the data), the tools say how much they are about to decompress, then do."""
    from offload_builders.cli import bundler, inspect as inspect_cli, select as select_cli
    from offload_builders.formats import compressed

    monkeypatch.setattr(compressed, "ANNOUNCE_BYTES", 1 << 20)
    start, end = B.text_markers(";")
    text = b"".join(start + i.encode() + b"\n" + body + end + i.encode() + b"\n"
                    for i, body in [(HOST + "-", b"host\n"), (BOMB_DEVICE, b"; device\n" * (300 << 10))])
    text_path = tmp_path / "text.ccob"
    text_path.write_bytes(_ccob([text], len(text), hashlib_md5(text)))
    header, offsets, total = B.binary_layout([HOST + "-", BOMB_DEVICE], [0, 64], 4 << 20)  # both at 4 MiB
    far = header + bytes(offsets[1] - len(header)) + _amdgpu_elf_head()
    far_path = tmp_path / "far.ccob"
    far_path.write_bytes(_ccob([far], len(far), hashlib_md5(far)))
    for main, args, expected, size in [
        (bundler.main, ["-list", "-type=ll", f"-input={text_path}"], f"{HOST}-\n{BOMB_DEVICE}\n", len(text)),
        (inspect_cli.main, [text_path], "image=text", len(text)),
        (select_cli.main, ["--device=gfx90a:xnack+", far_path], f"{BOMB_DEVICE}\n", len(far)),
    ]:
        decompressed[0] = 0
        status, out, err = _run_cli(main, args, capsys)
        assert status == 0 and expected in out, (args, out, err)
        notes = [line for line in err.splitlines() if "note: " in line]
        assert len(notes) == 1 and "decompressing " in notes[0] and f"(declared uncompressed size {size:,})" in notes[0]
        announced = int(notes[0].split("decompressing ", 1)[1].split(" ", 1)[0].replace(",", ""))
        # said before the read (when at most the header's two CHUNKs were in), of the bytes up to what it needs
        # (all of the text; the image's first 20 bytes); afterwards all of it was decompressed
        assert decompressed[0] == size and size - (2 << 20) - 64 <= announced <= size, (notes, decompressed[0])


def hashlib_md5(data: bytes) -> bytes:
    import hashlib

    return hashlib.md5(data).digest()[:8]


def _ids(path: Path, *, lazy: bool) -> list[str] | str:
    from contextlib import ExitStack

    try:
        with ExitStack() as stack:
            return [entry.id for _, entry in B.read_bundle_input(path, "bc", stack, lazy=lazy).entries]
    except BundleFormatError as exc:
        return f"error at {exc.offset}"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_lazy_listing_agrees_with_full_decompression(data):
    """Damaged small compressed bundles (smaller than what the header parse reads, so the lazy reader reaches the
    end of the stream and runs every check): listing lazily gives exactly what full decompression gives, the
    same IDs or an error."""
    from offload_builders.formats.compressed import compress_bytes

    version = data.draw(st.sampled_from([1, 2, 3]))
    method = data.draw(st.sampled_from(list(Method)))
    base = compress_bytes(GOOD, CompressionOptions(method, None, version))
    buf = bytearray(base)
    for _ in range(data.draw(st.integers(0, 3))):
        at = data.draw(st.integers(0, len(buf) - 1))
        buf[at] = data.draw(st.integers(0, 255))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "in.ccob"
        path.write_bytes(bytes(buf))
        full, lazy = _ids(path, lazy=False), _ids(path, lazy=True)
    assert lazy == full


def test_a_lazy_listing_does_not_check_what_it_does_not_read(tmp_path):
    """The one difference: damage past what the listing reads (here the MD5 of a bundle with a 3 MiB entry) is
    found by unbundling, which decompresses everything, not by -list."""
    from offload_builders.formats.compressed import compress_bytes

    image = bytes(range(256)) * (3 << 12)
    data = bytearray(compress_bytes(_bundle_bytes([(HOST, b"HOSTDATA"), (GFX908, image)])))
    data[16] ^= 1  # the stored MD5
    path = tmp_path / "bad-hash.ccob"
    path.write_bytes(bytes(data))
    assert sorted(B.list_bundle_ids(path, file_type="bc")) == [GFX908, HOST + "-"]
    with pytest.raises(BundleFormatError, match="does not match the stored hash"):
        B.unbundle(path, [GFX908], [tmp_path / "out"], file_type="bc")
    assert not (tmp_path / "out").exists()
