"""Differential tests of offload_builders.linking.registration against Clang's own wrapper code.

References come from the real tools, built fresh in a temporary directory:

* LLVM 19: ``clang-linker-wrapper --save-temps`` on objects compiled by clang 19 (OpenMP x86_64 and
  x86_64 + gfx90a, HIP gfx90a, CUDA sm_80 through a shim that gives clang 19 CUDA 13's fatbinary syntax);
* LLVM 22: ``llvm-offload-wrapper`` (the standalone wrap tool) and ``clang-linker-wrapper`` 22 for CUDA.

Modules are compared after both sides are parsed and printed by the same LLVM (llvmlite's), so the
comparison is instruction for instruction, modulo the image bytes (checked separately) and llvmlite's
names for unnamed values.  Objects are compared section by section, symbol by symbol and relocation by
relocation.  The end-to-end tests link programs against our wrapper object alone (no linker wrapper in
the link) and run them on libomptarget 19's x86_64 host-plugin device.
"""
from __future__ import annotations

import io
import os
import re
import shlex
import stat
import struct
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import llvmlite.binding as llvm
import pytest
from elftools.elf.elffile import ELFFile

from conftest import which_or_fail
from offload_builders.errors import (
    BundleFormatError,
    OffloadBinaryFormatError,
    OffloadError,
    OffloadFormatError,
    TargetIDError,
)
from offload_builders.formats import fatbinary
from offload_builders.formats.offload_binary import iter_offload_binaries, parse_offload_binary
from offload_builders.linking import registration as reg

Tool = Callable[[str], Path]
X86 = "x86_64-unknown-linux-gnu"
LLVM19_LIB = "/usr/lib/llvm-19/lib"
SHT_LLVM_OFFLOADING = 0x6FFF4C0B  # pyelftools does not name it

ZAXPY = r"""
#include <cstdio>
#include <omp.h>
#pragma omp declare target
int dev_global = 3;
#pragma omp end declare target
int main() {
  int y[4] = {1, 2, 3, 4};
  int on_host = -1, ndev = omp_get_num_devices();
  #pragma omp target map(tofrom: y, on_host)
  {
    on_host = omp_is_initial_device();
    for (int i = 0; i < 4; ++i) y[i] = y[i] * 2 + dev_global;
  }
  printf("on_host=%d num_devices=%d y=%d,%d,%d,%d\n", on_host, ndev, y[0], y[1], y[2], y[3]);
  return 0;
}
"""
RESULT = "y=5,7,9,11"

# A kernel and a device variable, without the CUDA/HIP headers (-nogpuinc): the host side only needs
# the launch function declared.
GPU_KERNEL = r"""
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
typedef struct { unsigned x, y, z; } dim3;
extern "C" int %(launch)s(const void*, dim3, dim3, void**, unsigned long, void*);
%(extra)s
__device__ int dev_var = 7;
__global__ void kern(int *p) { *p = dev_var; }
"""
CUDA_EXTRA = ('extern "C" int __cudaPushCallConfiguration(dim3, dim3, unsigned long, void*);\n'
              'extern "C" int __cudaPopCallConfiguration(dim3*, dim3*, unsigned long*, void*);')

# Clang 19 writes `fatbinary --image=profile=sm_80,file=...`, which CUDA 13 removed: translate it.
FATBINARY_SHIM = r'''#!%(python)s
import os, re, sys
args = []
for a in sys.argv[1:]:
    m = re.fullmatch(r"--image=profile=(sm|compute)_(\w+),file=(.*)", a)
    if m:
        a = "--image3=kind=%%s,sm=%%s,file=%%s" %% ("elf" if m.group(1) == "sm" else "ptx", m.group(2), m.group(3))
    args.append(a)
os.execv(%(fatbinary)r, ["fatbinary"] + args)
'''


def run(cmd: Sequence[str | os.PathLike[str]], cwd: Path | None = None, env: dict[str, str] | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([os.fspath(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)
    if check and proc.returncode != 0:
        pytest.fail(f"{shlex.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


# --------------------------------------------------------------------------------------------------
# Comparing modules and objects


def canonical_ir(text: str) -> str:
    """Parse and re-print ``text`` with llvmlite's LLVM: the same printer for Clang's IR and ours.

    llvmlite names unnamed values ``%".N"``; LLVM leaves them unnamed, so those names are cleared.  Image
    initializers become ``c"..."`` (their bytes are compared on their own) and the module header lines
    (ID, source file, triple, data layout) are dropped.
    """
    module = llvm.parse_assembly(text, context=llvm.create_context())
    module.verify()
    for fn in module.functions:
        for value in [*fn.arguments, *(i for b in fn.blocks for i in b.instructions)]:
            if re.fullmatch(r"\.\d+", value.name):
                value.name = ""
    out = re.sub(r'c"(?:[^"\\]|\\[0-9A-Fa-f]{2}|\\\\)*"', 'c"..."', str(module))
    return "\n".join(line for line in out.splitlines()
                     if not line.startswith(("; ModuleID", "source_filename", "target triple", "target datalayout"))
                     ).strip() + "\n"


def assert_same_ir(ours: str, theirs: str) -> None:
    a, b = canonical_ir(ours), canonical_ir(theirs)
    if a != b:
        import difflib

        diff = "\n".join(difflib.unified_diff(b.splitlines(), a.splitlines(), "clang", "ours", lineterm=""))
        pytest.fail(f"module differs from Clang's:\n{diff}")


@dataclass(frozen=True)
class GlobalInfo:
    linkage: str
    visibility: str
    unnamed_addr: bool
    constant: bool
    type: str
    section: str
    align: int | None


_GLOBAL = re.compile(r'^@(?P<name>"[^"]+"|[\w.$]+) = (?P<attrs>(?:(?:external|internal|private|appending|hidden|'
                     r'unnamed_addr) )*)(?P<kind>constant|global) (?P<rest>.*)$')


def globals_of(text: str) -> dict[str, GlobalInfo]:
    """The global variables of a canonical module, with the properties the runtime and linker care about."""
    table = {}
    for line in canonical_ir(text).splitlines():
        m = _GLOBAL.match(line)
        if not m:
            continue
        attrs = m["attrs"].split()
        rest = m["rest"]
        section = re.search(r', section "([^"]*)"', rest)
        align = re.search(r", align (\d+)$", rest)
        linkage = next((a for a in attrs if a in ("external", "internal", "private", "appending")), "")
        table[m["name"].strip('"')] = GlobalInfo(
            linkage=linkage, visibility="hidden" if "hidden" in attrs else "", unnamed_addr="unnamed_addr" in attrs,
            constant=m["kind"] == "constant", type=re.match(r"(\[[^\]]*\]|%[\w.]+|ptr|\{[^}]*\})", rest)[1],
            section=section[1] if section else "", align=int(align[1]) if align else None)
    return table


def elf_layout(data: bytes) -> dict[str, object]:
    """Sections (type, flags, alignment, size), symbols and relocations: what a linker sees in an object."""
    elf = ELFFile(io.BytesIO(data))
    sections = {s.name: (s["sh_type"], s["sh_flags"], s["sh_addralign"], s["sh_size"]) for s in elf.iter_sections()
                if s.name and s["sh_type"] not in ("SHT_STRTAB",)}
    symtab = elf.get_section_by_name(".symtab")

    def where(sym) -> str:
        index = sym["st_shndx"]
        return elf.get_section(index).name if isinstance(index, int) and index else str(index)

    def name(sym) -> str:  # a section symbol stands for its section
        return where(sym) if sym["st_info"]["type"] == "STT_SECTION" else sym.name

    symbols = sorted((name(s), s["st_info"]["type"], s["st_info"]["bind"], s["st_other"]["visibility"], where(s),
                      s["st_size"]) for s in symtab.iter_symbols())
    relocations = {}
    for s in elf.iter_sections():
        if s["sh_type"] == "SHT_RELA":
            relocations[s.name] = [(r["r_offset"], r["r_info_type"], name(symtab.get_symbol(r["r_info_sym"])),
                                    r["r_addend"]) for r in s.iter_relocations()]
    return {"machine": elf["e_machine"], "type": elf["e_type"], "sections": sections, "symbols": symbols,
            "relocations": relocations}


def section_data(data: bytes, name: str) -> bytes:
    section = ELFFile(io.BytesIO(data)).get_section_by_name(name)
    assert section is not None, f"no section {name}"
    return section.data()


def section_names(data: bytes) -> set[str]:
    return {s.name for s in ELFFile(io.BytesIO(data)).iter_sections()}


def dis(tool: Tool, bitcode: Path) -> str:
    return run([tool("llvm-dis"), bitcode, "-o", "-"]).stdout


# --------------------------------------------------------------------------------------------------
# Reference builds (module scope: each is built once for the whole file)


@dataclass(frozen=True)
class OmpBuild:
    dir: Path
    host_o: Path  # clang 19's fat object
    images: tuple[tuple[Path, str, str], ...]  # linked images as the linker wrapper made them: (path, triple, arch)
    wrapper_bc: Path  # clang-linker-wrapper 19's module and object
    wrapper_o: Path


def _omp_build(llvm19: Tool, root: Path, targets: list[str]) -> OmpBuild:
    root.mkdir()
    (root / "zaxpy.cpp").write_text(ZAXPY)
    flags = ["-fopenmp", f"-fopenmp-targets={','.join(targets)}"]
    if "amdgcn-amd-amdhsa" in targets:
        flags += ["-Xopenmp-target=amdgcn-amd-amdhsa", "-march=gfx90a"]
    run([llvm19("clang++"), *flags, "-O2", "-c", "zaxpy.cpp", "-o", "host.o"]
        + (["-nogpulib"] if len(targets) > 1 else []), cwd=root)
    # The driver's own link, for clang-linker-wrapper's wrapped module, object and linked images.
    run([llvm19("clang++"), *flags, "host.o", "-o", "a.out", "-save-temps", "-fuse-ld=lld", f"-L{LLVM19_LIB}"],
        cwd=root)
    images = [(root / "a.out.x86_64.native.img", X86, "")]
    if "amdgcn-amd-amdhsa" in targets:
        images.append((root / "a.out.amdgcn.gfx90a.img", "amdgcn-amd-amdhsa", "gfx90a"))
    return OmpBuild(root, root / "host.o", tuple(images), root / "a.out.openmp.image.wrapper.bc",
                    root / "a.out.openmp.image.wrapper.o")


@pytest.fixture(scope="module")
def omp_x86(llvm19: Tool, tmp_path_factory: pytest.TempPathFactory) -> OmpBuild:
    return _omp_build(llvm19, tmp_path_factory.mktemp("omp") / "x86", [X86])


@pytest.fixture(scope="module")
def omp_two(llvm19: Tool, tmp_path_factory: pytest.TempPathFactory) -> OmpBuild:
    return _omp_build(llvm19, tmp_path_factory.mktemp("omp") / "two", [X86, "amdgcn-amd-amdhsa"])


@dataclass(frozen=True)
class GpuBuild:
    dir: Path
    fatbin: Path  # the linker wrapper's fatbinary (.fatbin / .hipfb)
    image: Path  # the linked device image inside it
    wrapper_bc: Path
    wrapper_o: Path
    log: str  # --wrapper-verbose output: the commands the linker wrapper ran


def _gpu_build(tool: Tool, root: Path, lang: str, arch: str, extra: list[str]) -> GpuBuild:
    root.mkdir(exist_ok=True)
    source = root / f"k.{'cu' if lang == 'cuda' else 'hip'}"
    source.write_text(GPU_KERNEL % {"launch": "cudaLaunchKernel" if lang == "cuda" else "hipLaunchKernel",
                                    "extra": CUDA_EXTRA if lang == "cuda" else ""})
    run([tool("clang"), "-x", lang, "--offload-new-driver", "-fgpu-rdc", "-nogpulib", "-nogpuinc",
         f"--offload-arch={arch}", "-O2", "-c", source.name, "-o", "k.o", *extra], cwd=root)
    log = run([tool("clang-linker-wrapper"), "--host-triple=x86_64-pc-linux-gnu",
               f"--linker-path={which_or_fail('true')}", "--save-temps", "--wrapper-verbose", "-o", "a.out", "k.o",
               *extra], cwd=root)
    if lang == "cuda":
        fatbin, image = root / "a.out.fatbin", root / f"a.out.nvptx64.{arch}.img"
    else:
        fatbin, image = root / "a.out.hipfb", root / f"a.out.amdgcn.{arch}.img"
    return GpuBuild(root, fatbin, image, root / f"a.out.{lang}.image.wrapper.bc",
                    root / f"a.out.{lang}.image.wrapper.o", log.stdout + log.stderr)


@pytest.fixture(scope="module")
def hip19(llvm19: Tool, tmp_path_factory: pytest.TempPathFactory) -> GpuBuild:
    return _gpu_build(llvm19, tmp_path_factory.mktemp("hip19"), "hip", "gfx90a", [])


@pytest.fixture(scope="module")
def cuda19(llvm19: Tool, cuda: Tool, tmp_path_factory: pytest.TempPathFactory) -> GpuBuild:
    root = tmp_path_factory.mktemp("cuda19")
    shim = root / "cuda"
    (shim / "bin").mkdir(parents=True)
    for name in ("ptxas", "nvlink"):
        (shim / "bin" / name).symlink_to(cuda(name))
    cuda_root = cuda("ptxas").resolve().parent.parent
    for name in ("include", "nvvm"):
        if (cuda_root / name).exists():
            (shim / name).symlink_to(cuda_root / name)
    script = shim / "bin" / "fatbinary"
    script.write_text(FATBINARY_SHIM % {"python": sys.executable, "fatbinary": os.fspath(cuda("fatbinary"))})
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return _gpu_build(llvm19, root, "cuda", "sm_80", [f"--cuda-path={shim}"])


@pytest.fixture(scope="module")
def cuda22(llvm22: Tool, cuda: Tool, tmp_path_factory: pytest.TempPathFactory) -> GpuBuild:
    # LLVM 22 already writes CUDA 13's --image3 syntax: no shim.
    return _gpu_build(llvm22, tmp_path_factory.mktemp("cuda22"), "cuda", "sm_80",
                      [f"--cuda-path={cuda('ptxas').resolve().parent.parent}"])


def offload_wrapper22(llvm22: Tool, tmp: Path, kind: str, payloads: list[bytes]) -> str:
    """LLVM 22's standalone wrap tool on ``payloads`` (one file each): the module it writes, as text."""
    files = []
    for i, data in enumerate(payloads):
        files.append(tmp / f"{kind}.{i}.bin")
        files[-1].write_bytes(data)
    out = tmp / f"{kind}.wrapped.bc"
    run([llvm22("llvm-offload-wrapper"), f"--kind={kind}", f"--triple={X86}", "-o", out, *files])
    return dis(llvm22, out)


def image_binaries(build: OmpBuild) -> list[bytes]:
    return [reg.openmp_image_binary(path, triple=triple, arch=arch) for path, triple, arch in build.images]


# --------------------------------------------------------------------------------------------------
# Layouts and image binaries


def test_entry_layout_switches_at_llvm_21() -> None:
    assert [reg.entry_layout(v) for v in (19, 20, 21, 22, 23)] == [19, 19, 21, 21, 21]
    # The entry sizes the runtimes walk the tables with: 32 bytes (19/20), 56 bytes (21+), x86_64 data layout.
    llvm.initialize_all_targets()
    machine = llvm.Target.from_triple(X86).create_target_machine(reloc="pic", codemodel="default")
    for version, size in ((19, 32), (20, 32), (21, 56), (22, 56)):
        for module in (reg.openmp_module([], llvm_version=version), reg.cuda_module(reg.NV_FATBIN_MAGIC,
                                                                                  llvm_version=version)):
            parsed = llvm.parse_assembly(str(module), context=llvm.create_context())
            assert machine.target_data.get_abi_size(parsed.get_struct_type("struct.__tgt_offload_entry")) == size
    for bad in (18, 15, "19", True, None):
        with pytest.raises(OffloadError):
            reg.entry_layout(bad)  # type: ignore[arg-type]


def test_openmp_image_binaries_are_the_linker_wrappers(omp_two: OmpBuild) -> None:
    """bundleOpenMP's OffloadBinary per linked image: IMG_Object, openmp, triple then arch (also "")."""
    embedded = section_data(omp_two.wrapper_o.read_bytes(), ".llvm.offloading")
    ours = image_binaries(omp_two)
    assert b"".join(ours) == embedded
    for data, (path, triple, arch) in zip(ours, omp_two.images):
        binary = parse_offload_binary(data)
        assert (binary.image_kind, binary.offload_kind, binary.triple, binary.arch) == (1, 1, triple, arch)
        assert [key for key, _ in binary.strings] == ["triple", "arch"]
        assert data[binary.image_offset:binary.image_offset + binary.image_size] == path.read_bytes()
    # A path and the bytes give the same binary.
    path, triple, arch = omp_two.images[0]
    assert reg.openmp_image_binary(path.read_bytes(), triple=triple, arch=arch) == ours[0]


# --------------------------------------------------------------------------------------------------
# Modules against clang-linker-wrapper 19


def test_openmp_module_is_clang19s(llvm19: Tool, omp_x86: OmpBuild) -> None:
    clang = dis(llvm19, omp_x86.wrapper_bc)
    module = reg.openmp_module(image_binaries(omp_x86))
    assert_same_ir(str(module), clang)
    table = globals_of(str(module))
    assert table == globals_of(clang)
    entries = "[0 x %struct.__tgt_offload_entry]"
    assert table["__start_omp_offloading_entries"] == GlobalInfo("external", "hidden", False, True, entries, "", None)
    assert table["__stop_omp_offloading_entries"].visibility == "hidden"
    assert table["__dummy.omp_offloading_entries"] == GlobalInfo("internal", "", False, True, entries,
                                                                 "omp_offloading_entries", None)
    image = table[".omp_offloading.device_image"]
    assert (image.linkage, image.unnamed_addr, image.constant, image.section, image.align) == (
        "internal", True, True, ".llvm.offloading", 8)
    assert table[".omp_offloading.device_images"].type == "[1 x %__tgt_device_image]"
    assert table[".omp_offloading.descriptor"].type == "%__tgt_bin_desc"
    text = canonical_ir(str(module))
    assert "%struct.__tgt_offload_entry = type { ptr, ptr, i64, i32, i32 }" in text
    assert "{ i32 101, ptr @.omp_offloading.descriptor_reg, ptr null }" in text
    assert 'define internal void @.omp_offloading.descriptor_reg() section ".text.startup"' in text
    assert "call i32 @atexit(ptr @.omp_offloading.descriptor_unreg)" in text


def test_openmp_two_images_are_clang19s(llvm19: Tool, omp_two: OmpBuild) -> None:
    """x86_64 + gfx90a: one device image global per image (.N suffixes), in the order given."""
    module = str(reg.openmp_module(image_binaries(omp_two)))
    assert_same_ir(module, dis(llvm19, omp_two.wrapper_bc))
    names = set(globals_of(module))
    assert {".omp_offloading.device_image", ".omp_offloading.device_image.1"} <= names
    assert ".omp_offloading.device_image.2" not in names


@pytest.mark.parametrize("lang", ["cuda", "hip"])
def test_fatbin_modules_are_clang19s(request: pytest.FixtureRequest, llvm19: Tool, lang: str) -> None:
    build: GpuBuild = request.getfixturevalue(f"{lang}19")
    fatbin = build.fatbin.read_bytes()
    module = str((reg.cuda_module if lang == "cuda" else reg.hip_module)(fatbin))
    clang = dis(llvm19, build.wrapper_bc)
    assert_same_ir(module, clang)
    table = globals_of(module)
    hip = lang == "hip"
    assert table[".fatbin_image"].section == (".hip_fatbin" if hip else ".nv_fatbin")
    assert table[".fatbin_wrapper"] == GlobalInfo("internal", "", False, True, "%fatbin_wrapper",
                                                  ".hipFatBinSegment" if hip else ".nvFatBinSegment", 8)
    assert table[f"__dummy.{lang}_offloading_entries"].section == f"{lang}_offloading_entries"
    assert table[f".{lang}.binary_handle"] == GlobalInfo("internal", "", False, False, "ptr", "", None)
    text = canonical_ir(module)
    assert f"i32 {reg.HIP_FAT_MAGIC if hip else reg.CUDA_FAT_MAGIC}, i32 1, ptr @.fatbin_image, ptr null" in text
    assert ("call void @__cudaRegisterFatBinaryEnd" in text) is not hip
    # Surfaces and textures are registered for HIP only; managed variables not at all in 19.
    assert ("call void @__hipRegisterSurface" in text) is hip
    assert "RegisterManagedVar" not in text


@pytest.mark.parametrize("which", ["omp_x86", "omp_two", "cuda19", "hip19"])
def test_objects_are_clang19s(request: pytest.FixtureRequest, which: str) -> None:
    """Compiled by llvmlite, the object has Clang's sections, symbols and relocations -- in fact its bytes."""
    build = request.getfixturevalue(which)
    if which.startswith("omp"):
        ours = reg.wrap("openmp", image_binaries(build), host_triple="x86_64-pc-linux-gnu")
    else:
        ours = reg.wrap(which[:-2], build.fatbin.read_bytes(), host_triple="x86_64-pc-linux-gnu")
    theirs = build.wrapper_o.read_bytes()
    assert elf_layout(ours) == elf_layout(theirs)
    assert ours == theirs


# --------------------------------------------------------------------------------------------------
# Modules against LLVM 22 (the 21+ entry layout)


def test_openmp_module_is_llvm22s(llvm22: Tool, omp_two: OmpBuild, tmp_path: Path) -> None:
    binaries = image_binaries(omp_two)
    module = str(reg.openmp_module(binaries, llvm_version=22))
    assert_same_ir(module, offload_wrapper22(llvm22, tmp_path, "openmp", binaries))
    text = canonical_ir(module)
    assert "%struct.__tgt_offload_entry = type { i64, i16, i16, i32, ptr, ptr, i64, i64, ptr }" in text
    table = globals_of(module)
    assert table["__start_llvm_offload_entries"].visibility == "hidden"
    assert table["__dummy.llvm_offload_entries"] == GlobalInfo(
        "internal", "", False, True, "[0 x %struct.__tgt_offload_entry]", "llvm_offload_entries", 8)
    assert not any("omp_offloading_entries" in name for name in table)
    # 21 has the same layout; 22 also wraps raw images (ImageStart = the global itself).
    assert canonical_ir(str(reg.openmp_module(binaries, llvm_version=21))) == text
    raw = omp_two.images[0][0].read_bytes()
    assert_same_ir(str(reg.openmp_module([raw], llvm_version=22)),
                   offload_wrapper22(llvm22, tmp_path, "openmp", [raw]))


def test_openmp_object_matches_llc22(llvm22: Tool, omp_two: OmpBuild, tmp_path: Path) -> None:
    """Our 21+ object against LLVM 22's module compiled by llc 22 (PIC, the default init_array)."""
    binaries = image_binaries(omp_two)
    offload_wrapper22(llvm22, tmp_path, "openmp", binaries)
    run([llvm22("llc"), "-relocation-model=pic", "-filetype=obj", tmp_path / "openmp.wrapped.bc",
         "-o", tmp_path / "llc.o"])
    theirs = (tmp_path / "llc.o").read_bytes()
    ours = reg.wrap("openmp", binaries, llvm_version=22)
    layout, expected = elf_layout(ours), elf_layout(theirs)
    # llc names the file symbol after the bitcode file: everything else must agree.
    strip = lambda symbols: [s for s in symbols if s[1] != "STT_FILE"]  # noqa: E731
    assert strip(layout.pop("symbols")) == strip(expected.pop("symbols"))
    assert layout == expected
    assert {"llvm_offload_entries", ".llvm.offloading", ".init_array.101"} <= section_names(ours)


@pytest.mark.parametrize("lang", ["cuda", "hip"])
def test_fatbin_modules_are_llvm22s(llvm22: Tool, cuda22: GpuBuild, hip19: GpuBuild, tmp_path: Path,
                                    lang: str) -> None:
    fatbin = (cuda22 if lang == "cuda" else hip19).fatbin.read_bytes()
    module = str((reg.cuda_module if lang == "cuda" else reg.hip_module)(fatbin, llvm_version=22))
    assert_same_ir(module, offload_wrapper22(llvm22, tmp_path, lang, [fatbin]))
    text = canonical_ir(module)
    # The shared table is filtered by Kind (OFK_Cuda 2, OFK_HIP 4 from LLVM 21), and managed variables
    # are registered.
    assert f"icmp eq i16 %kind, {2 if lang == 'cuda' else 4}" in text
    assert f"call void @__{lang}RegisterManagedVar(ptr %0, ptr %aux_addr, ptr %addr, ptr %name" in text


def test_cuda_module_is_clang_linker_wrapper22s(llvm22: Tool, cuda22: GpuBuild) -> None:
    module = str(reg.cuda_module(cuda22.fatbin.read_bytes(), llvm_version=22, host_triple="x86_64-pc-linux-gnu"))
    assert_same_ir(module, dis(llvm22, cuda22.wrapper_bc))


# --------------------------------------------------------------------------------------------------
# Objects


@pytest.mark.parametrize("version", [19, 22])
def test_object_sections(omp_x86: OmpBuild, cuda22: GpuBuild, hip19: GpuBuild, version: int) -> None:
    entries = "llvm_offload_entries" if version >= 21 else None
    omp = reg.wrap("openmp", image_binaries(omp_x86), llvm_version=version)
    elf = ELFFile(io.BytesIO(omp))
    assert (elf["e_machine"], elf["e_type"]) == ("EM_X86_64", "ET_REL")
    init = elf.get_section_by_name(".init_array.101")
    assert (init["sh_type"], init["sh_size"]) == ("SHT_INIT_ARRAY", 8)
    assert ".ctors" not in " ".join(section_names(omp))
    assert elf.get_section_by_name(".llvm.offloading")["sh_type"] == SHT_LLVM_OFFLOADING
    assert elf.get_section_by_name(entries or "omp_offloading_entries")["sh_size"] == 0
    assert section_data(omp, ".llvm.offloading") == image_binaries(omp_x86)[0]

    for lang, build, magic, image_section, segment in (
            ("cuda", cuda22, reg.CUDA_FAT_MAGIC, ".nv_fatbin", ".nvFatBinSegment"),
            ("hip", hip19, reg.HIP_FAT_MAGIC, ".hip_fatbin", ".hipFatBinSegment")):
        fatbin = build.fatbin.read_bytes()
        obj = reg.wrap(lang, fatbin, llvm_version=version)
        assert section_data(obj, image_section) == fatbin
        head = section_data(obj, segment)
        assert len(head) == 24 and struct.unpack_from("<II", head) == (magic, 1) and head[8:] == bytes(16)
        layout = elf_layout(obj)
        assert layout["relocations"][f".rela{segment}"] == [(8, 1, image_section, 0)]  # R_X86_64_64 -> image
        assert layout["sections"][".init_array.101"][0] == "SHT_INIT_ARRAY"
        assert (entries or f"{lang}_offloading_entries") in layout["sections"]


def test_zero_images(omp_x86: OmpBuild, llvm19: Tool, tmp_path: Path) -> None:
    """No device images still registers a descriptor: a program built for offload then runs on the host.

    Without any registration, libomptarget 19 is never initialized and the same program segfaults in
    ``__tgt_target_kernel``.
    """
    for version in (19, 22):
        text = canonical_ir(str(reg.openmp_module([], llvm_version=version)))
        assert "@.omp_offloading.device_images = internal unnamed_addr constant [0 x %__tgt_device_image] " \
               "zeroinitializer" in text
        assert "%__tgt_bin_desc { i32 0, ptr @.omp_offloading.device_images" in text
        assert ".omp_offloading.device_image " not in text
    obj = reg.wrap("openmp", [])
    assert ".llvm.offloading" not in section_names(obj)
    assert {"omp_offloading_entries", ".init_array.101"} <= section_names(obj)
    (tmp_path / "wrapper.o").write_bytes(obj)
    program = link_program(llvm19, tmp_path, omp_x86.host_o)
    out = run_program(program, mandatory=False)
    assert "on_host=1" in out.stdout and RESULT in out.stdout


# --------------------------------------------------------------------------------------------------
# End to end: our wrapper object is the only registration code in the program


def link_program(llvm19: Tool, tmp: Path, host_o: Path) -> Path:
    """``clang++ -fopenmp wrapper.o host.o``: no -fopenmp-targets, so clang-linker-wrapper never runs."""
    out = tmp / "a.out"
    run([llvm19("clang++"), "-fopenmp", tmp / "wrapper.o", host_o, f"-L{LLVM19_LIB}", "-lomptarget",
         f"-Wl,-rpath,{LLVM19_LIB}", "-fuse-ld=lld", "-o", out])
    return out


def run_program(program: Path, *, mandatory: bool = True) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LD_LIBRARY_PATH=LLVM19_LIB, LIBOMPTARGET_INFO="1")
    if mandatory:
        env["OMP_TARGET_OFFLOAD"] = "MANDATORY"
    return run([program], env=env)


def test_end_to_end_by_hand_x86_offload(llvm19: Tool, tmp_path: Path) -> None:
    """The by-hand build of reference section 5.4, with our wrapper object in place of the linker wrapper."""
    (tmp_path / "zaxpy.cpp").write_text(ZAXPY)
    run([llvm19("clang++"), "-fopenmp", f"-fopenmp-targets={X86}", "-O2", "-c", "zaxpy.cpp", "-o", "host.o"],
        cwd=tmp_path)
    run([llvm19("clang-offload-packager"), "host.o", f"--image=triple={X86},file=dev.o"], cwd=tmp_path)
    run([llvm19("clang"), f"--target={X86}", "-O2", "-shared", "-Wl,-Bsymbolic", "-Wl,--no-undefined", "dev.o",
         "-o", "dev.img", f"-L{LLVM19_LIB}", "-lstdc++", "-lm", "-lomp", "-lomptarget"], cwd=tmp_path)
    binary = reg.openmp_image_binary(tmp_path / "dev.img", triple=X86, arch="")
    (tmp_path / "wrapper.o").write_bytes(reg.wrap("openmp", [binary]))
    program = link_program(llvm19, tmp_path, tmp_path / "host.o")

    out = run_program(program)
    # omp_is_initial_device() was 0 inside the region: it ran on a host-plugin device, not the host.
    assert re.search(r"on_host=0 num_devices=[1-9]\d* " + RESULT, out.stdout), out.stdout + out.stderr
    assert "omptarget device 0 info: Entering OpenMP kernel" in out.stderr
    # The image is in the program where offload tools look for it.
    listing = run([llvm19("llvm-objdump"), "--offloading", program]).stdout
    assert listing.count("OFFLOADING IMAGE") == 1 and X86 in listing


def test_end_to_end_two_images(llvm19: Tool, omp_two: OmpBuild, tmp_path: Path) -> None:
    """x86_64 and gfx90a images registered together: the x86_64 one runs (no GPU here), the other is skipped."""
    (tmp_path / "wrapper.o").write_bytes(reg.wrap("openmp", image_binaries(omp_two)))
    program = link_program(llvm19, tmp_path, omp_two.host_o)
    out = run_program(program)
    assert re.search(r"on_host=0 num_devices=[1-9]\d* " + RESULT, out.stdout), out.stdout + out.stderr
    found = [(b.triple, b.arch) for b in iter_offload_binaries(section_data(program.read_bytes(), ".llvm.offloading"))]
    assert found == [(X86, ""), ("amdgcn-amd-amdhsa", "gfx90a")]


# --------------------------------------------------------------------------------------------------
# Fatbinaries


def test_cuda_fatbinary_command_is_clang22s(cuda22: GpuBuild, cuda: Tool, tmp_path: Path) -> None:
    line = next(text for text in cuda22.log.splitlines() if "fatbinary" in text and "--create" in text)
    theirs = shlex.split(line)
    ours = fatbinary.cuda_fatbinary_command(theirs[0], [("sm_80", theirs[-1].rsplit("file=", 1)[1])], theirs[3])
    assert ours == theirs
    ours = fatbinary.cuda_fatbinary_command(os.fspath(cuda("fatbinary")), [("sm_80", os.fspath(cuda22.image))],
                                      os.fspath(tmp_path / "ours.fatbin"))
    run(ours)
    assert (tmp_path / "ours.fatbin").read_bytes() == cuda22.fatbin.read_bytes()


def test_cuda_fatbinary_command_spellings(cuda: Tool, cuda22: GpuBuild, tmp_path: Path) -> None:
    cmd = fatbinary.cuda_fatbinary_command("fatbinary",
                                           [("sm_80", "a.img"), ("sm_90a", "b.img"), ("compute_80", "c.s")],
                                           "out.fatbin")
    assert cmd == ["fatbinary", "-64", "--create", "out.fatbin", "--image3=kind=elf,sm=80,file=a.img",
                   "--image3=kind=elf,sm=90a,file=b.img", "--image3=kind=ptx,sm=80,file=c.s"]
    # Several cubins in one fatbinary, accepted by CUDA's fatbinary and wrapped as is.
    cmd = fatbinary.cuda_fatbinary_command(os.fspath(cuda("fatbinary")), [("sm_80", os.fspath(cuda22.image))] * 2,
                                     os.fspath(tmp_path / "two.fatbin"))
    run(cmd)
    fatbin = (tmp_path / "two.fatbin").read_bytes()
    assert fatbin.startswith(reg.NV_FATBIN_MAGIC)
    assert section_data(reg.wrap("cuda", fatbin), ".nv_fatbin") == fatbin
    for bad in ("gfx90a", "sm80", "sm_", "80"):
        with pytest.raises(TargetIDError):
            fatbinary.cuda_fatbinary_command("fatbinary", [(bad, "a.img")], "out")
    with pytest.raises(OffloadError):
        fatbinary.cuda_fatbinary_command("fatbinary", [], "out")


def bundler(tool: Tool, tmp: Path, targets: list[str], images: list[Path], *extra: str) -> bytes:
    out = tmp / "ref.hipfb"
    run([tool("clang-offload-bundler"), "-type=o", "-bundle-align=4096", f"-targets={','.join(targets)}",
         "-input=/dev/null", *[f"-input={i}" for i in images], f"-output={out}", *extra])
    return out.read_bytes()


def test_hip_fatbinary_is_clang_offload_bundlers(llvm19: Tool, llvm22: Tool, hip19: GpuBuild, tmp_path: Path) -> None:
    image = hip19.image
    host = "host-x86_64-unknown-linux"
    assert fatbinary.hip_fatbinary([("gfx90a", image.read_bytes())]) == bundler(
        llvm19, tmp_path, [host, "hipv4-amdgcn-amd-amdhsa--gfx90a"], [image])
    # Target IDs with features, several images, paths.
    second = hip19.dir / "k.o"
    assert fatbinary.hip_fatbinary([("gfx90a:xnack+", image), ("gfx942:sramecc-:xnack-", second)]) == bundler(
        llvm19, tmp_path, [host, "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+",
                           "hipv4-amdgcn-amd-amdhsa--gfx942:sramecc-:xnack-"], [image, second])
    # Compressed: CCOB v2 (19) at the default level and at a given one, v3 (22).
    assert fatbinary.hip_fatbinary([("gfx90a", image)], compress=True) == bundler(
        llvm19, tmp_path, [host, "hipv4-amdgcn-amd-amdhsa--gfx90a"], [image], "-compress")
    assert fatbinary.hip_fatbinary([("gfx90a", image)], compress=9) == bundler(
        llvm19, tmp_path, [host, "hipv4-amdgcn-amd-amdhsa--gfx90a"], [image], "-compress", "-compression-level=9")
    host22 = "host-x86_64-unknown-linux-gnu"
    assert fatbinary.hip_fatbinary([("gfx90a", image)], compress=True, llvm_version=22, host_target=host22) == bundler(
        llvm22, tmp_path, [host22, "hipv4-amdgcn-amd-amdhsa--gfx90a"], [image], "-compress")


def test_hip_fatbinary_is_the_linker_wrappers(hip19: GpuBuild) -> None:
    """clang-linker-wrapper 19's bundleHIP writes 'hip-' entries: the offload_kind option reproduces it."""
    assert fatbinary.hip_fatbinary([("gfx90a", hip19.image)], offload_kind="hip") == hip19.fatbin.read_bytes()


def test_hip_fatbinary_bad_input() -> None:
    with pytest.raises(OffloadError):
        fatbinary.hip_fatbinary([])
    with pytest.raises(TargetIDError):
        fatbinary.hip_fatbinary([("gfx90a", b"x")], offload_kind="openmp")
    with pytest.raises(TargetIDError):
        fatbinary.hip_fatbinary([("gfx90a", b"x"), ("gfx90a", b"y")])  # duplicate targets


# --------------------------------------------------------------------------------------------------
# Errors a caller can cause


def test_bad_openmp_images(omp_x86: OmpBuild) -> None:
    good = image_binaries(omp_x86)[0]
    raw = omp_x86.images[0][0].read_bytes()
    with pytest.raises(OffloadBinaryFormatError, match="not an offload binary"):
        reg.openmp_module([raw])  # LLVM 19 requires the OffloadBinary wrapping
    with pytest.raises(OffloadBinaryFormatError):
        reg.openmp_module([good[:100]])  # truncated
    with pytest.raises(OffloadBinaryFormatError, match="exactly one binary"):
        reg.openmp_module([good + good])
    with pytest.raises(OffloadBinaryFormatError):
        reg.openmp_module([good[:4] + b"\xff" * 60], llvm_version=22)  # the magic promises a binary
    with pytest.raises(OffloadError, match="sequence"):
        reg.openmp_module(good)  # type: ignore[arg-type]
    with pytest.raises(OffloadError):
        reg.openmp_module(["not bytes"])  # type: ignore[list-item]


def test_bad_wrap_arguments(omp_x86: OmpBuild, cuda22: GpuBuild) -> None:
    fatbin = cuda22.fatbin.read_bytes()
    with pytest.raises(OffloadError, match="unknown offload kind"):
        reg.wrap("sycl", [])
    with pytest.raises(OffloadError):
        reg.wrap("cuda", [fatbin])
    with pytest.raises(OffloadFormatError):
        reg.wrap("cuda", b"__CLANG_OFFLOAD_BUNDLE__")
    with pytest.raises(BundleFormatError):
        reg.wrap("hip", fatbin)
    for triple in ("x86_64-apple-darwin", "arm64-apple-macosx14", "x86_64-pc-windows-msvc", "x86_64-w64-mingw32"):
        with pytest.raises(OffloadError, match="ELF"):
            reg.wrap("openmp", image_binaries(omp_x86), host_triple=triple)
    with pytest.raises(OffloadError):
        reg.compile_module(reg.openmp_module([]), "nonsense-target-triple")
    with pytest.raises(OffloadError):
        reg.openmp_module([], llvm_version=18)
    with pytest.raises(TargetIDError):
        reg.openmp_image_binary(b"x", triple="", arch="")


def test_large_images_are_placed_byte_for_byte(tmp_path: Path) -> None:
    """Images reach the object without a trip through LLVM's text parser; the module is left unchanged."""
    image = os.urandom(8 << 20)
    binaries = [reg.openmp_image_binary(image, triple="amdgcn-amd-amdhsa", arch="gfx90a"),
                reg.openmp_image_binary(image[:1001], triple=X86, arch="")]
    module = reg.openmp_module(binaries)
    before = str(module)
    obj = reg.compile_module(module, X86)
    assert str(module) == before
    assert section_data(obj, ".llvm.offloading") == b"".join(binaries)
    fatbin = fatbinary.hip_fatbinary([("gfx90a", image)])
    assert section_data(reg.wrap("hip", fatbin), ".hip_fatbin") == fatbin


def test_modules_are_independent() -> None:
    """Each module has its own type context: building many in one process never clashes."""
    first = reg.openmp_module([])
    second = reg.openmp_module([], llvm_version=22)
    assert canonical_ir(str(first)) != canonical_ir(str(second))
    assert canonical_ir(str(reg.openmp_module([]))) == canonical_ir(str(first))


def test_cuda_and_hip_registrations_in_one_object_keep_their_fat_binaries() -> None:
    """wrap_kinds with CUDA and HIP: both modules have an internal ``.fatbin_image``; each kind's bytes land in
    its own section (the IR linker would rename one where the bytes could not be placed)."""
    cuda_fatbin = reg.NV_FATBIN_MAGIC + os.urandom(4093)
    hip_fatbin = fatbinary.hip_fatbinary([("gfx90a", os.urandom(3000))])
    obj = reg.wrap_kinds([("openmp", []), ("cuda", cuda_fatbin), ("hip", hip_fatbin)])
    assert section_data(obj, ".nv_fatbin") == cuda_fatbin
    assert section_data(obj, ".hip_fatbin") == hip_fatbin
