"""The HIP model of the SCons tool against the real Clang 19: the check is the bytes.

* ``.hip_fatbin`` (and in fact the whole object) of every object our nodes build for sample_project/hip
  is byte-identical to ``clang++ -x hip --offload-arch=... -cuid=... -c`` in one command, plain and
  compressed; ``-fgpu-rdc`` objects are identical to the new driver's.
* Incrementality is counted in commands (the sample's COMSTR labels): adding ``gfx90a:xnack-`` compiles
  and links one code object per source and nothing else device-side.
* Code objects carry the ELF flags of their target ID's features; a conflicting target list stops the
  build before anything compiles.
* An RDC program (``scons rdc=1 program=1``) links through our nodes, with no clang-linker-wrapper: its
  ``.hip_fatbin`` holds the entries and code objects (same symbols) that Clang's one-command link
  embeds, and against a stub HIP runtime it registers every kernel and variable once.
"""
from __future__ import annotations

import collections
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from offload_builders.formats.compressed import FileRegion, decompress_to, read_header
from offload_builders.models.hip import HOST_PROBE_TARGET, PROBE_CUID, HipPhaseModel, probe
from offload_builders.scons.hip import default_cuid
from offload_builders.targets import parse_offload_archs, parse_target_id
from offload_builders.toolchain import find_toolchain

pytestmark = pytest.mark.slow

SCONS = str(Path(sys.executable).with_name("scons"))
SOURCES = ("saxpy", "stencil")
BASE_ARCHS = "gfx90a:xnack+,gfx942"
#: What sample_project/hip/SConstruct passes to every compile (its OFFLOAD_FLAGS, CPPPATH and its
#: stub-runtime $OFFLOAD_HIP_FLAGS), for the one-command reference compiles.
SAMPLE_FLAGS = ("-O2", "-Iinclude", "-nogpulib", "-nogpuinc")
#: The sample's COMSTR labels -> phase.
LABELS = {"device compile": "DEVICE", "device link": "DEVICELINK", "fat binary": "BUNDLE",
          "offload binary": "PACKAGE", "host compile": "HOST", "archive": "AR", "device inputs": "EXTRACT",
          "wrapper": "WRAP", "link": "LINK"}

#: EF_AMDGPU_MACH_* values (llvm/include/llvm/BinaryFormat/ELF.h) and the v4 feature fields.
MACH = {"gfx906": 0x2F, "gfx908": 0x30, "gfx90a": 0x3F, "gfx942": 0x4C}
FEATURE_SETTING = {0x1: None, 0x2: False, 0x3: True}  # EF_AMDGPU_FEATURE_*_{ANY,OFF,ON}_V4, shifted down


@dataclass
class Build:
    returncode: int
    output: str

    @property
    def commands(self) -> list[tuple[str, str]]:
        found = []
        for line in self.output.splitlines():
            label, sep, target = line.partition(": ")
            phase = LABELS.get(label.split(" [")[0])
            if sep and phase:
                found.append((phase, target.strip()))
        return found

    @property
    def by_phase(self) -> collections.Counter:
        return collections.Counter(phase for phase, _ in self.commands)


class Sample:
    """A copy of sample_project/hip, built with scons as a user runs it."""

    def __init__(self, root: Path) -> None:
        shutil.copytree(REPO_ROOT / "sample_project" / "hip", root,
                        ignore=shutil.ignore_patterns("build", ".sconsign*"))
        self.root = root

    def scons(self, *args: str, check: bool = True) -> Build:
        done = subprocess.run([SCONS, "-Q", *args], cwd=self.root, capture_output=True, text=True)
        build = Build(done.returncode, done.stdout + done.stderr)
        if check:
            assert done.returncode == 0, build.output
        return build

    def obj(self, stem: str) -> Path:
        return self.root / "build" / f"{stem}.o"

    def reference(self, stem: str, archs: str, *flags: str) -> Path:
        """The object ``clang++`` builds in one command with the same sources, flags and -cuid."""
        out = self.root / f"{stem}.reference.o"
        cuid = default_cuid(f"src/{stem}.hip")
        argv = [str(find_toolchain().clangxx), "-x", "hip", *SAMPLE_FLAGS, *flags,
                *(f"--offload-arch={tid}" for tid in archs.split(",")), f"-cuid={cuid}",
                "-c", f"src/{stem}.hip", "-o", str(out)]
        subprocess.run(argv, cwd=self.root, check=True, capture_output=True)
        return out


def _section(llvm19, obj: Path, name: str) -> bytes:
    dumped = obj.with_name(obj.name + name + ".bin")
    subprocess.run([str(llvm19("llvm-objcopy")), f"--dump-section={name}={dumped}", str(obj), os.devnull],
                   check=True, capture_output=True)
    return dumped.read_bytes()


def _e_flags(code_object: Path) -> tuple[int, int, int]:
    """(e_flags, EI_OSABI, EI_ABIVERSION) of an ELF64 little-endian file."""
    data = code_object.read_bytes()[:64]
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1
    return struct.unpack_from("<I", data, 48)[0], data[7], data[8]


@pytest.fixture
def sample(tmp_path) -> Sample:
    return Sample(tmp_path / "hip")


# --------------------------------------------------------------------------------------------------
# Differential: our nodes' bytes against clang++ in one command
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("compress", [None, "--offload-compress", "--offload-compression-level=9"],
                         ids=["plain", "compressed", "compressed-level9"])
def test_hip_fatbin_is_identical_to_one_command_clang(sample, llvm19, compress):
    archs = "gfx90a:xnack+,gfx90a:xnack-,gfx942"
    flags = () if compress is None else ("--offload-compress",) if compress == "--offload-compress" \
        else ("--offload-compress", compress)
    sample.scons(f"offload_archs={archs}", f"flags={' '.join(flags)}")
    for stem in SOURCES:
        ours, reference = sample.obj(stem), sample.reference(stem, archs, *flags)
        fatbin = _section(llvm19, ours, ".hip_fatbin")
        assert fatbin == _section(llvm19, reference, ".hip_fatbin")
        # Clang 19 writes CCOB version 2, with or without a level (it has no way to ask for 3).
        assert fatbin[:6] == (b"__CLAN" if compress is None else b"CCOB\x02\x00")
        assert fatbin == (sample.root / "build" / f"{stem}.hipfb").read_bytes()
        # Stronger than asked, and true: the host compile is the driver's too, so the objects are equal.
        assert ours.read_bytes() == reference.read_bytes()
    listed = subprocess.run([str(llvm19("clang-offload-bundler")), "-list", "-type=o",
                             f"-input={sample.root / 'build' / 'saxpy.hipfb'}"],
                            check=True, capture_output=True, text=True).stdout.split()
    assert sorted(listed) == ["hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+", "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-",
                              "hipv4-amdgcn-amd-amdhsa--gfx942", "host-x86_64-unknown-linux--"]


def test_offload_hip_compress_writes_version_2_like_clang_and_version_3_on_request(sample, llvm19, llvm22):
    """Clang 19 writes only CCOB v2 (it ignores COMPRESSED_BUNDLE_FORMAT_VERSION); v3 must hold the
    same zstd stream behind the wider header, and Clang 22's bundler must read it."""
    sample.scons(f"offload_archs={BASE_ARCHS}", "compress=2")
    v2 = {stem: _section(llvm19, sample.obj(stem), ".hip_fatbin") for stem in SOURCES}
    for stem in SOURCES:
        assert v2[stem] == _section(llvm19, sample.reference(stem, BASE_ARCHS, "--offload-compress"), ".hip_fatbin")
    third = sample.scons(f"offload_archs={BASE_ARCHS}", "compress=3")
    assert third.by_phase == {"BUNDLE": 2, "HOST": 2, "AR": 1}  # the format is in the bundle's signature
    plain = {stem: _section(llvm19, sample.reference(stem, BASE_ARCHS), ".hip_fatbin") for stem in SOURCES}
    for stem in SOURCES:
        path = sample.root / "build" / f"{stem}.hipfb"
        v3 = path.read_bytes()
        assert _section(llvm19, sample.obj(stem), ".hip_fatbin") == v3
        with open(path, "rb") as f:
            region = FileRegion(f.fileno(), 0, len(v3))
            header = read_header(region)
            assert (header.version, header.total_size, header.uncompressed_size) == (3, len(v3), len(plain[stem]))
            out = sample.root / f"{stem}.decompressed"
            with open(out, "wb") as sink:
                decompress_to(region, sink)
        assert out.read_bytes() == plain[stem]
        assert v3[32:] == v2[stem][24:]  # the same compressed stream as Clang 19's
        assert v3[24:32] == v2[stem][16:24]  # and the same MD5 prefix
        unbundled = sample.root / f"{stem}.gfx942.co"
        subprocess.run([str(llvm22("clang-offload-bundler")), "-unbundle", "-type=o", f"-input={path}",
                        "-targets=hipv4-amdgcn-amd-amdhsa--gfx942", f"-output={unbundled}"], check=True)
        assert unbundled.read_bytes() == (sample.root / "build" / f"{stem}.gfx942.hsaco").read_bytes()


def test_rdc_objects_are_identical_to_the_new_driver(sample, llvm19):
    sample.scons(f"offload_archs={BASE_ARCHS}", "rdc=1")
    for stem in SOURCES:
        ours = sample.obj(stem)
        reference = sample.reference(stem, BASE_ARCHS, "-fgpu-rdc", "--offload-new-driver")
        assert _section(llvm19, ours, ".llvm.offloading") == _section(llvm19, reference, ".llvm.offloading")
        assert ours.read_bytes() == reference.read_bytes()
        listing = subprocess.run([str(llvm19("llvm-objdump")), "--offloading", str(ours)],
                                 check=True, capture_output=True, text=True).stdout
        assert listing.count("producer        hip") == 2 and listing.count("kind            llvm ir") == 2
        assert "arch            gfx90a:xnack+" in listing and "arch            gfx942" in listing
    adding = sample.scons("offload_archs=gfx90a:xnack+,gfx90a:xnack-,gfx942", "rdc=1")
    assert adding.by_phase == {"DEVICE": 2, "PACKAGE": 2, "HOST": 2, "AR": 1}
    assert all("xnack-" in target for phase, target in adding.commands if phase == "DEVICE")


# --------------------------------------------------------------------------------------------------
# Incrementality, counted in commands
# --------------------------------------------------------------------------------------------------
def test_adding_a_target_id_compiles_one_code_object_per_source(sample):
    first = sample.scons(f"offload_archs={BASE_ARCHS}")
    assert first.by_phase == {"DEVICE": 4, "DEVICELINK": 4, "BUNDLE": 2, "HOST": 2, "AR": 1}
    assert sample.scons(f"offload_archs={BASE_ARCHS}").commands == []

    added = sample.scons("offload_archs=gfx90a:xnack+,gfx90a:xnack-,gfx942")
    assert added.by_phase == {"DEVICE": 2, "DEVICELINK": 2, "BUNDLE": 2, "HOST": 2, "AR": 1}
    device_side = [target for phase, target in added.commands if phase in ("DEVICE", "DEVICELINK")]
    # a device compile and its link are one node, the code object
    assert sorted(device_side) == ["build/saxpy.gfx90a_xnack-.hsaco"] * 2 + ["build/stencil.gfx90a_xnack-.hsaco"] * 2

    # The list's spelling and order do not matter; going back needs no device work at all.
    assert sample.scons("offload_archs=gfx942,gfx90a:xnack-,gfx90a:xnack+").commands == []
    removed = sample.scons(f"offload_archs={BASE_ARCHS}")
    assert removed.by_phase == {"BUNDLE": 2, "HOST": 2, "AR": 1}


def test_the_cuid_is_pinned_per_source_and_can_be_set(sample, tmp_path):
    """The default CUID depends on the source path only; $OFFLOAD_HIP_CUID replaces it everywhere."""
    sample.scons(f"offload_archs={BASE_ARCHS}")
    symbols = subprocess.run([str(find_toolchain().bin_dir / "llvm-nm"), str(sample.obj("saxpy"))],
                             check=True, capture_output=True, text=True).stdout
    cuid_symbols = [line.split()[-1] for line in symbols.splitlines() if "__hip_cuid_" in line]
    assert len(cuid_symbols) == 1
    assert default_cuid("src/saxpy.hip") != default_cuid("src/stencil.hip")
    assert default_cuid("src/saxpy.hip") == default_cuid(os.path.join("src", "saxpy.hip"))

    sconstruct = sample.root / "SConstruct"
    sconstruct.write_text(sconstruct.read_text().replace(
        'OFFLOAD_MODEL="hip",',
        'OFFLOAD_MODEL="hip", OFFLOAD_HIP_CUID=ARGUMENTS.get("cuid", "$_OFFLOAD_HIP_DEFAULT_CUID"),'))
    assert sample.scons(f"offload_archs={BASE_ARCHS}").commands == []  # spelling the default changes nothing
    fixed = sample.scons(f"offload_archs={BASE_ARCHS}", "cuid=${SOURCE.filebase}_v1")
    assert fixed.by_phase == {"DEVICE": 4, "DEVICELINK": 4, "BUNDLE": 2, "HOST": 2, "AR": 1}
    reference = sample.root / "fixed.o"
    subprocess.run([str(find_toolchain().clangxx), "-x", "hip", *SAMPLE_FLAGS, "--offload-arch=gfx90a:xnack+",
                    "--offload-arch=gfx942", "-cuid=saxpy_v1", "-c", "src/saxpy.hip", "-o", str(reference)],
                   cwd=sample.root, check=True)
    assert sample.obj("saxpy").read_bytes() == reference.read_bytes()

    bad = sample.scons(f"offload_archs={BASE_ARCHS}", "cuid=a b", check=False)
    assert bad.returncode != 0 and "is not a CUID" in bad.output and bad.commands == []


# --------------------------------------------------------------------------------------------------
# Target-ID features end to end
# --------------------------------------------------------------------------------------------------
def test_code_objects_carry_the_target_id_features_in_their_elf_flags(sample, llvm19):
    archs = "gfx90a:xnack+,gfx90a:xnack-,gfx942,gfx908:sramecc+,gfx908:sramecc-,gfx906:sramecc-:xnack+"
    sample.scons(f"offload_archs={archs}", "build/saxpy.o")
    for tid in parse_offload_archs(archs):
        e_flags, osabi, abiversion = _e_flags(sample.root / "build" / f"saxpy.{tid.file_token}.hsaco")
        assert (osabi, abiversion) == (64, 3)  # ELFOSABI_AMDGPU_HSA, code object v5 (Clang 19's default)
        assert e_flags & 0xFF == MACH[tid.processor], tid
        assert FEATURE_SETTING[(e_flags >> 8) & 0x3] is tid.feature("xnack"), (tid, hex(e_flags))
        assert FEATURE_SETTING[(e_flags >> 10) & 0x3] is tid.feature("sramecc"), (tid, hex(e_flags))
    # Spot values from the reference (gfx90a:xnack+ is 0x73F) and the bundle's entry IDs.
    assert _e_flags(sample.root / "build" / "saxpy.gfx90a_xnack+.hsaco")[0] == 0x73F
    listed = subprocess.run([str(llvm19("clang-offload-bundler")), "-list", "-type=o",
                             f"-input={sample.root / 'build' / 'saxpy.hipfb'}"],
                            check=True, capture_output=True, text=True).stdout.split()
    assert "hipv4-amdgcn-amd-amdhsa--gfx906:sramecc-:xnack+" in listed
    assert "hipv4-amdgcn-amd-amdhsa--gfx908:sramecc-" in listed


@pytest.mark.parametrize("archs, message", [
    ("gfx90a,gfx90a:xnack+", "conflicting offload target IDs 'gfx90a' and 'gfx90a:xnack+'"),
    # Clang 19 accepts this pair (its check is asymmetric); the documented rule rejects it.
    ("gfx908:sramecc+:xnack+,gfx908:xnack+", "conflicting offload target IDs"),
    ("gfx90a:xnack", "has no '+' or '-' sign"),
    ("gfx1030:xnack+", "does not support target-ID feature 'xnack'"),
    # One target list for every model: HIP takes its AMDGPU targets (tests/test_models.py), here there are none.
    ("x86_64,sm_90", "saxpy.hip: the hip model compiles for AMDGPU (e.g. gfx90a) targets, and OFFLOAD_ARCHS"
                     " (sm_90,x86_64) has none"),
])
def test_bad_target_lists_stop_the_build_before_any_compile(sample, archs, message):
    build = sample.scons(f"offload_archs={archs}", check=False)
    assert build.returncode != 0
    assert message in build.output
    assert build.commands == []
    assert not (sample.root / "build").exists() or not any((sample.root / "build").iterdir())


def test_a_non_rdc_program_links_and_registers_its_fat_binaries(sample):
    """OffloadProgram links the fat objects as plain host objects; a stub runtime shows what they register."""
    build = sample.scons(f"offload_archs={BASE_ARCHS}", "program=1")
    assert build.by_phase["HOST"] == 2 and build.by_phase["LINK"] == 1
    assert "EXTRACT" not in build.by_phase and "WRAP" not in build.by_phase
    run = subprocess.run([str(sample.root / "build" / "prog")], capture_output=True, text=True, check=True)
    lines = run.stdout.splitlines()
    assert lines.count("fatbin magic=48495046 version=1 __CLANG_OFFLOAD_BUNDLE__ entries=3") == 2
    assert sorted(line for line in lines if line.startswith(("kernel", "variable"))) == [
        "kernel _Z5saxpyifPKfPf", "kernel _Z7stenciliPKfPf", "variable blocks_done", "variable coefficients"]
    assert lines[-2:] == ["launch grid=4 block=256", "launch grid=8 block=128"]


# --------------------------------------------------------------------------------------------------
# The link side of RDC mode: clang-linker-wrapper's steps as our nodes
# --------------------------------------------------------------------------------------------------
RDC_SOURCES = ("saxpy", "stencil", "scale", "rescale")


def _bundle_entries(data: bytes) -> list[tuple[str, bytes]]:
    """(ID, code object) of each entry of an uncompressed offload bundle, in file order."""
    assert data[:24] == b"__CLANG_OFFLOAD_BUNDLE__"
    (count,), pos, entries = struct.unpack_from("<Q", data, 24), 32, []
    for _ in range(count):
        offset, size, length = struct.unpack_from("<QQQ", data, pos)
        entries.append((data[pos + 24:pos + 24 + length].decode(), data[offset:offset + size]))
        pos += 24 + length
    return entries


def _defined_symbols(llvm19, code_object: bytes, scratch: Path) -> set[tuple[str, str, int]]:
    """(name, nm type, size) of every defined symbol but the linker's own _DYNAMIC."""
    scratch.write_bytes(code_object)
    listing = subprocess.run([str(llvm19("llvm-nm")), "--defined-only", "-S", str(scratch)],
                             check=True, capture_output=True, text=True).stdout
    symbols = set()
    for line in listing.splitlines():
        _address, size, kind, name = line.split()
        if name != "_DYNAMIC":
            symbols.add((name, kind, int(size, 16)))
    return symbols


def test_an_rdc_program_links_through_our_nodes_and_registers_each_kernel_once(sample, llvm19):
    build = sample.scons(f"offload_archs={BASE_ARCHS}", "rdc=1", "program=1", "linkflags=-v")
    assert build.by_phase == {"DEVICE": 8, "PACKAGE": 4, "HOST": 4, "AR": 1, "EXTRACT": 2, "DEVICELINK": 2,
                              "WRAP": 1, "LINK": 1}
    assert sorted(target for phase, target in build.commands if phase == "DEVICELINK") == [
        "build/prog.gfx90a_xnack+.hsaco", "build/prog.gfx942.hsaco"]
    # The host link is the driver's plain link (its -v output): the wrapper object in, no linker wrapper.
    assert "clang-linker-wrapper" not in build.output and "clang-offload-bundler" not in build.output
    host_links = [line for line in build.output.splitlines()
                  if line.split()[:1] and os.path.basename(line.split()[0].strip('"')) in ("ld", "ld.lld")]
    assert len(host_links) == 1 and "-o build/prog.partial build/" not in host_links[0], build.output
    assert " build/prog.offload.wrapper.o " in host_links[0] and " build/saxpy.o " in host_links[0]

    program = sample.root / "build" / "prog"
    segment = _section(llvm19, program, ".hipFatBinSegment")
    assert struct.unpack_from("<II", segment) == (0x48495046, 1)
    lines = subprocess.run([str(program)], capture_output=True, text=True, check=True).stdout.splitlines()
    # One fat binary for the whole program (the objects register nothing themselves), each entry once.
    assert [line for line in lines if line.startswith("fatbin")] == [
        "fatbin magic=48495046 version=1 __CLANG_OFFLOAD_BUNDLE__ entries=3"]
    assert sorted(line for line in lines if line.startswith(("kernel", "variable", "surface", "texture"))) == [
        "kernel _Z5saxpyifPKfPf", "kernel _Z7rescaleiPf", "kernel _Z7stenciliPKfPf", "variable blocks_done",
        "variable coefficients", "variable scale_factor"]
    assert lines[-3:] == ["launch grid=4 block=256", "launch grid=8 block=128", "launch grid=16 block=64"]


def test_the_rdc_program_embeds_what_clangs_one_command_link_embeds(sample, llvm19):
    """Entries (IDs, in order) and code objects against ``clang++ -fgpu-rdc --offload-new-driver`` linking
    the same objects. The code objects have the same symbols, kinds and sizes, and the same instructions,
    but are not byte-identical: the wrapper runs LTO in-process and links the result with ld.lld, we let
    ld.lld run the LTO (``-flto``), and lld's LTO always emits a section per function (lld/ELF/LTO.cpp), so
    the kernels sit 0x400 bytes further into ``.text`` and addresses and pc-relative offsets differ."""
    sample.scons(f"offload_archs={BASE_ARCHS}", "rdc=1", "program=1")
    build = sample.root / "build"
    reference = sample.root / "reference"
    subprocess.run([str(llvm19("clang++")), "-fgpu-rdc", "--offload-new-driver",
                    *(f"--offload-arch={tid}" for tid in BASE_ARCHS.split(",")),
                    *(str(build / f"{stem}.o") for stem in (*RDC_SOURCES, "main", "stub_runtime")),
                    "-o", str(reference)], check=True, capture_output=True)
    ours = _bundle_entries(_section(llvm19, build / "prog", ".hip_fatbin"))
    theirs = _bundle_entries(_section(llvm19, reference, ".hip_fatbin"))
    ids = ["host-x86_64-unknown-linux--", "hip-amdgcn-amd-amdhsa--gfx942", "hip-amdgcn-amd-amdhsa--gfx90a:xnack+"]
    assert [entry for entry, _ in ours] == [entry for entry, _ in theirs] == ids
    for (entry, code_object), (_, clangs) in zip(ours[1:], theirs[1:]):
        tid = parse_target_id(entry.rpartition("--")[2])
        assert code_object == (build / f"prog.{tid.file_token}.hsaco").read_bytes()
        assert code_object[48:52] == clangs[48:52]  # e_flags: processor and features
        symbols = _defined_symbols(llvm19, code_object, sample.root / "ours.co")
        assert symbols == _defined_symbols(llvm19, clangs, sample.root / "clangs.co")
        assert {name for name, kind, _ in symbols if kind == "T"} == {
            "_Z5saxpyifPKfPf", "_Z7stenciliPKfPf", "_Z7rescaleiPf"}


OFFLOAD_LINK = str(Path(sys.executable).with_name("offload-link"))


def test_offload_link_registers_the_rdc_program_as_the_scons_link_does(sample, llvm19):
    """The same objects linked by the driver with ``offload-link`` in clang-linker-wrapper's place
    (``-B<shim dir> --offload-link``): the code objects go in the HIP fat binary, registered by
    ``__hipRegisterFatBinary`` (not as OpenMP images: no ``__tgt_register_lib``), its ``.hip_fatbin`` the SCons
    program's byte for byte, and the stub runtime sees the same registrations and launches. With
    ``--offload-compress`` (which Clang 19's own wrapper cannot link) the compressed bytes are the SCons link's
    with ``compress=2``. Without a HIP runtime the link fails with one line saying what to add."""
    shim = subprocess.run([OFFLOAD_LINK, "--print-shim-dir"], capture_output=True, text=True,
                          check=True).stdout.strip()
    objects = [f"build/{stem}.o" for stem in (*RDC_SOURCES, "main", "stub_runtime")]
    for scons_args, flags in (((), ()), (("compress=2",), ("--offload-compress",))):
        sample.scons(f"offload_archs={BASE_ARCHS}", "rdc=1", "program=1", *scons_args)
        linked = subprocess.run([str(llvm19("clang++")), f"-B{shim}", "--offload-link", *flags, "-fuse-ld=lld",
                                 *objects, "-o", "ours"], cwd=sample.root, capture_output=True, text=True)
        assert linked.returncode == 0, linked.stderr
        ours, theirs = sample.root / "ours", sample.root / "build" / "prog"
        assert _section(llvm19, ours, ".hip_fatbin") == _section(llvm19, theirs, ".hip_fatbin")
        assert _section(llvm19, ours, ".hip_fatbin")[:4] == (b"CCOB" if flags else b"__CL")
        symbols = subprocess.run([str(llvm19("llvm-nm")), str(ours)], capture_output=True, text=True,
                                 check=True).stdout
        assert "__hipRegisterFatBinary" in symbols and "__tgt_register_lib" not in symbols
        runs = [subprocess.run([str(program)], capture_output=True, text=True, check=True).stdout
                for program in (ours, theirs)]
        assert runs[0] == runs[1] and "kernel _Z7rescaleiPf" in runs[0] and "launch grid=16 block=64" in runs[0]
    # Without a HIP runtime (the stub here; --hip-link gives libamdhip64) the link says what to add, in one line.
    linked = subprocess.run([str(llvm19("clang++")), f"-B{shim}", "--offload-link", "-fuse-ld=lld", *objects[:-1],
                             "-o", "ours"], cwd=sample.root, capture_output=True, text=True)
    assert linked.returncode != 0 and "Traceback" not in linked.stderr
    assert ("offload-link: error: 'ld.lld' failed with exit code 1: the HIP fat binary's registration needs the HIP"
            " runtime: link with --hip-link (or -lamdhip64, or your own runtime's library)") in linked.stderr


def test_adding_a_target_id_links_one_more_code_object(sample):
    sample.scons(f"offload_archs={BASE_ARCHS}", "rdc=1", "program=1")
    assert sample.scons(f"offload_archs={BASE_ARCHS}", "rdc=1", "program=1").commands == []
    added = sample.scons("offload_archs=gfx90a:xnack+,gfx90a:xnack-,gfx942", "rdc=1", "program=1")
    # The objects gain a device compile each; every target's device files are selected again (the
    # objects changed), but only the new target's are new, so only its code object is linked.
    assert added.by_phase == {"DEVICE": 4, "PACKAGE": 4, "HOST": 4, "AR": 1, "EXTRACT": 3, "DEVICELINK": 1,
                              "WRAP": 1, "LINK": 1}
    assert [target for phase, target in added.commands if phase == "DEVICELINK"] == ["build/prog.gfx90a_xnack-.hsaco"]
    assert sample.scons("offload_archs=gfx942,gfx90a:xnack-,gfx90a:xnack+", "rdc=1", "program=1").commands == []
    lines = subprocess.run([str(sample.root / "build" / "prog")], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    assert "fatbin magic=48495046 version=1 __CLANG_OFFLOAD_BUNDLE__ entries=4" in lines


def test_a_compressed_rdc_fat_binary_only_wraps_and_links_again(sample, llvm19):
    """Clang 19 cannot do this one itself: its driver hands the wrapper ``-compress``, which the wrapper does
    not know and passes on to the host linker (``ld: unrecognized option '-compress'``)."""
    sample.scons(f"offload_archs={BASE_ARCHS}", "rdc=1", "program=1")
    compressed = sample.scons(f"offload_archs={BASE_ARCHS}", "rdc=1", "program=1", "compress=2")
    assert compressed.by_phase == {"WRAP": 1, "LINK": 1}
    fatbin = sample.root / "prog.hipfb"
    fatbin.write_bytes(_section(llvm19, sample.root / "build" / "prog", ".hip_fatbin"))
    assert fatbin.read_bytes()[:6] == b"CCOB\x02\x00"
    unbundled = sample.root / "gfx942.co"
    subprocess.run([str(llvm19("clang-offload-bundler")), "-unbundle", "-type=o", f"-input={fatbin}",
                    "-targets=hip-amdgcn-amd-amdhsa--gfx942", f"-output={unbundled}"], check=True)
    assert unbundled.read_bytes() == (sample.root / "build" / "prog.gfx942.hsaco").read_bytes()


def test_an_object_without_code_for_a_linked_target_stops_the_link(sample):
    (sample.root / "src" / "SConscript").write_text(textwrap.dedent("""
        Import("env")
        narrow = env.Clone(OFFLOAD_ARCHS="gfx942")
        Default(env.OffloadProgram("prog", [env.OffloadObject("saxpy.hip"), narrow.OffloadObject("stencil.hip")]))
    """))
    build = sample.scons(f"offload_archs={BASE_ARCHS}", "rdc=1", check=False)
    assert build.returncode != 0
    errors = [line for line in build.output.splitlines() if "no device code for" in line]
    assert errors == ["scons: *** [build/prog.gfx90a_xnack+.devin] build/stencil.o: HIP kernels or device"
                      " variables but no device code for gfx90a:xnack+; compile with that target in"
                      " OFFLOAD_ARCHS or drop gfx90a:xnack+ from the link"], build.output
    assert "Traceback" not in build.output and "LINK" not in build.by_phase


# --------------------------------------------------------------------------------------------------
# The phase model's two assumptions, against the driver
# --------------------------------------------------------------------------------------------------
def _without_temporaries(job) -> list[str]:
    scratch = tempfile.gettempdir() + os.sep
    return [arg for arg in job if not arg.startswith(scratch) and "offload-hip-probe-" not in arg]


def test_one_targets_jobs_do_not_depend_on_the_other_targets(tmp_path):
    model = HipPhaseModel(find_toolchain(), tmp_path)
    flags = ("-O2", "-nogpulib", "-nogpuinc")
    targets = parse_offload_archs("gfx90a:xnack+,gfx90a:xnack-,gfx942")
    together = probe(model.driver, (*flags, *(f"--offload-arch={t}" for t in targets), f"-cuid={PROBE_CUID}"),
                      model.cwd)
    device_jobs = [list(job) for job in together if "-fcuda-is-device" in job]
    assert len(device_jobs) == len(targets)
    for tid in targets:
        alone = model.device_steps(tid, flags)
        matching = [job for job in device_jobs
                    if alone.compile.render(source=job[-1], main_file_name=os.path.basename(job[-1]), cuid=PROBE_CUID,
                                            output=job[job.index("-o") + 1]) == job]
        assert len(matching) == 1, tid
    # The host job is the same whichever target was probed.
    probed = ("gfx908", "gfx1030", str(HOST_PROBE_TARGET))
    hosts = {tuple(_without_temporaries(model._jobs(parse_target_id(t), flags)[-1])) for t in probed}
    assert len(hosts) == 1
