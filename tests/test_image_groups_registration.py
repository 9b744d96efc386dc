"""OpenMP image groups: one program registering several descriptors, each with its own device image and its own
part of the host entry table (offload_builders.linking.registration.openmp_group_module).

The end-to-end tests compile two sources with clang 19, link each source's device code into its own x86_64 image
with the project's device link (the host-CPU target has no device runtime), wrap them as two groups, link the
host program with plain ``clang++ -fopenmp`` (no -fopenmp-targets: clang-linker-wrapper never runs) and run both
target regions on libomptarget 19's x86_64 device.  The recorder tests replace libomptarget's registration entry
points with a C file that prints what each ``__tgt_bin_desc`` holds, for what a run cannot show (``requires``
entries, entries of no group, the LLVM 22 entry layout).
"""
from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from offload_builders import linking
from offload_builders.errors import OffloadBinaryFormatError, OffloadError
from offload_builders.formats import fatbinary
from offload_builders.linking import registration as reg
from offload_builders.toolchain import find_toolchain
from test_registration import run

Tool = Callable[[str], Path]
X86 = "x86_64-unknown-linux-gnu"
KEY = (X86, "")
LLVM19_LIB = "/usr/lib/llvm-19/lib"

# Each source has its own target region and its own declare-target global, used in the region: a missing or
# misplaced entry makes the region fail to load or read a bad address.  Clang 22 has no omp.h here (the recorder
# tests do not need the device's answer to omp_is_initial_device, which the header makes Clang fold).
A_SRC = r"""%(requires)s
%(omp_h)s
#pragma omp declare target
int a_value = 7;
#pragma omp end declare target
int run_a(int x, int *on_host) {
  int r = 0, h = -1;
  #pragma omp target map(from: r, h)
  { r = a_value * x; h = omp_is_initial_device(); }
  *on_host = h;
  return r;
}
"""
B_SRC = r"""%(requires)s
#include <cstdio>
%(omp_h)s
#pragma omp declare target
int b_value = 5;
#pragma omp end declare target
int run_a(int x, int *on_host);
int main() {
  int ha = -1, hb = -1, rb = 0;
  int ra = run_a(3, &ha);
  #pragma omp target map(from: rb, hb)
  { rb = b_value + 100; hb = omp_is_initial_device(); }
  printf("a=%%d a_on_host=%%d b=%%d b_on_host=%%d\n", ra, ha, rb, hb);
  return 0;
}
"""
# A third object whose entries no group names: they go to group 0.
C_SRC = r"""%(requires)s
#pragma omp declare target
int c_value = 1;
#pragma omp end declare target
int run_c() { int r = 0;
  #pragma omp target map(from: r)
  r = c_value;
  return r; }
"""
OMP_H = """#if __has_include(<omp.h>)
#include <omp.h>
#else
extern "C" int omp_is_initial_device(void);
#endif"""
RESULT = "a=21 a_on_host=0 b=105 b_on_host=0"
USM = "#pragma omp requires unified_shared_memory"

# Stands in for libomptarget's registration entry points; kernels launched through __tgt_target_kernel fall
# back to the host (a non-zero return), so the program runs to the end.
RECORDER = r"""
#include <stdint.h>
#include <stdio.h>
#ifdef LAYOUT21
struct entry { uint64_t reserved; uint16_t version, kind; uint32_t flags; void *addr; const char *name;
               uint64_t size, data; void *aux; };
#else
struct entry { void *addr; const char *name; uint64_t size; int32_t flags, data; };
#endif
struct image { void *start, *end; struct entry *begin, *stop; };
struct desc { int32_t count; struct image *images; struct entry *begin, *stop; };
static struct desc *seen[64];
static int nseen;
void __tgt_register_lib(struct desc *d) {
  int k = nseen;
  seen[nseen++] = d;
  printf("register %d images=%d\n", k, d->count);
  for (int i = 0; i < d->count; ++i)
    printf("image %d %d same_range=%d\n", k, i, d->images[i].begin == d->begin && d->images[i].stop == d->stop);
  for (struct entry *e = d->begin; e != d->stop; ++e)
    printf("entry %d name=%s null_addr=%d flags=%d data=%d\n", k, e->name ? e->name : "(null)", e->addr == 0,
           (int)e->flags, (int)e->data);
}
void __tgt_unregister_lib(struct desc *d) {
  for (int k = 0; k < nseen; ++k)
    if (seen[k] == d) printf("unregister %d\n", k);
}
int __tgt_target_kernel(void *loc, int64_t device, int32_t teams, int32_t threads, void *id, void *args) {
  return 1;
}
"""


@dataclass(frozen=True)
class Source:
    obj: Path       # clang's fat host object
    image: bytes    # its device code linked alone, in an OffloadBinary
    image_path: Path  # the linked image (not written without link_images)
    entries: list[str]  # linking.registered_entries(obj)


def compile_sources(clang: Path, root: Path, sources: dict[str, str], requires: str = "",
                    link_images: bool = True) -> dict[str, Source]:
    """Compile each source for x86_64 offload and, with ``link_images``, link its device code into its own image
    with the project's device link (scan, select, unpack, device_link_command)."""
    root.mkdir(parents=True, exist_ok=True)
    toolchain = find_toolchain()
    out = {}
    for stem, text in sources.items():
        (root / f"{stem}.cpp").write_text(text % {"requires": requires, "omp_h": OMP_H})
        obj = root / f"{stem}.o"
        run([clang, "-fopenmp", f"-fopenmp-targets={X86}", "-O1", "-c", f"{stem}.cpp", "-o", obj], cwd=root)
        image = reg.openmp_image_binary(b"\x7fELF not loaded", triple=X86, arch="")
        if link_images:
            files = linking.select_device_files(linking.scan_link_inputs([os.fspath(obj)]), KEY)
            assert len(files) == 1, files
            linking.write_device_inputs(files, root / f"{stem}.devin")
            paths = linking.unpack_device_inputs(root / f"{stem}.devin", root / f"{stem}.inputs")
            run(linking.device_link_command(toolchain, KEY, paths, os.fspath(root / f"{stem}.img")))
            [image] = linking.openmp_image_binaries([(KEY, os.fspath(root / f"{stem}.img"))], toolchain.major)
        out[stem] = Source(obj, image, root / f"{stem}.img", linking.registered_entries(os.fspath(obj)))
    return out


@pytest.fixture(scope="module")
def two(llvm19: Tool, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Source]:
    return compile_sources(llvm19("clang++"), tmp_path_factory.mktemp("groups"), {"a": A_SRC, "b": B_SRC})


def link_program(llvm19: Tool, tmp: Path, objects: list[Path], wrapper: bytes, *,
                 runtime: Sequence[str | os.PathLike[str]]) -> Path:
    """``clang++ -fopenmp objects wrapper.o``: no -fopenmp-targets, so clang-linker-wrapper never runs and our
    object is the only registration in the program."""
    (tmp / "wrapper.o").write_bytes(wrapper)
    out = tmp / "a.out"
    run([llvm19("clang++"), "-fopenmp", *objects, tmp / "wrapper.o", *runtime, "-fuse-ld=lld", "-o", out])
    return out


OMPTARGET: list[str | os.PathLike[str]] = [f"-L{LLVM19_LIB}", "-lomptarget", f"-Wl,-rpath,{LLVM19_LIB}"]


def run_program(program: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LD_LIBRARY_PATH=LLVM19_LIB, LIBOMPTARGET_INFO="1", OMP_TARGET_OFFLOAD="MANDATORY")
    return run([program], env=env, check=False)


def groups_of(sources: dict[str, Source], *stems: str) -> list[reg.ImageGroup]:
    return [([sources[stem].image], sources[stem].entries) for stem in stems]


# --------------------------------------------------------------------------------------------------
# On libomptarget 19's x86_64 device


def test_two_groups_run_on_the_device(llvm19: Tool, two: dict[str, Source], tmp_path: Path) -> None:
    """Each source's image is registered with its own entries: both regions run on the device, each reading its
    own declare-target global, and libomptarget reports no entry it could not load."""
    assert all(len(source.entries) == 2 for source in two.values())  # the region and the global
    wrapper = reg.wrap_openmp_groups(groups_of(two, "a", "b"))
    program = link_program(llvm19, tmp_path, [two["a"].obj, two["b"].obj], wrapper, runtime=OMPTARGET)
    out = run_program(program)
    assert out.returncode == 0 and RESULT in out.stdout, out.stdout + out.stderr
    assert out.stderr.count("Entering OpenMP kernel") == 2, out.stderr
    assert "Failed to load" not in out.stderr and "mismatch" not in out.stderr, out.stderr
    # Our registration only: one constructor, our descriptor array and no clang-linker-wrapper descriptor, the
    # two images in the offloading section.
    symbols = run([llvm19("llvm-nm"), program]).stdout.split()
    assert symbols.count(".omp_offloading.descriptor_reg") == 1
    assert ".omp_offloading.descriptors" in symbols and ".omp_offloading.descriptor" not in symbols
    listing = run([llvm19("llvm-objdump"), "--offloading", program]).stdout
    assert listing.count("OFFLOADING IMAGE") == 2


@pytest.mark.parametrize("wrong", ["one descriptor", "swapped entries", "all to group 0"])
def test_the_partition_matters(llvm19: Tool, two: dict[str, Source], tmp_path: Path, wrong: str) -> None:
    """The negative controls: the same images registered with the whole entry table in one descriptor (what the
    driver would do with two images of one target), with each group given the other's entry names, or with no
    names (every entry to group 0) fail to load entries and crash."""
    a, b = two["a"], two["b"]
    if wrong == "one descriptor":
        wrapper = reg.wrap("openmp", [a.image, b.image])
    elif wrong == "swapped entries":
        wrapper = reg.wrap_openmp_groups([([a.image], b.entries), ([b.image], a.entries)])
    else:
        wrapper = reg.wrap_openmp_groups([([a.image], []), ([b.image], [])])
    out = run_program(link_program(llvm19, tmp_path, [a.obj, b.obj], wrapper, runtime=OMPTARGET))
    assert out.returncode != 0 and RESULT not in out.stdout, out.stdout + out.stderr
    assert "Failed to load" in out.stderr, out.stderr


def test_one_group_runs_as_openmp_module_does(llvm19: Tool, two: dict[str, Source], tmp_path: Path) -> None:
    """A single group (the whole program's device code in one image) gets every entry, named or not."""
    root = tmp_path / "one"
    root.mkdir()
    toolchain = find_toolchain()
    scanned = linking.scan_link_inputs([os.fspath(two["a"].obj), os.fspath(two["b"].obj)])
    linking.write_device_inputs(linking.select_device_files(scanned, KEY), root / "devin")
    paths = linking.unpack_device_inputs(root / "devin", root / "inputs")
    run(linking.device_link_command(toolchain, KEY, paths, os.fspath(root / "all.img")))
    [image] = linking.openmp_image_binaries([(KEY, os.fspath(root / "all.img"))], toolchain.major)
    for names in (two["a"].entries + two["b"].entries, []):
        for wrapper in (reg.wrap_openmp_groups([([image], names)]), reg.wrap("openmp", [image])):
            out = run_program(link_program(llvm19, root, [two["a"].obj, two["b"].obj], wrapper, runtime=OMPTARGET))
            assert out.returncode == 0 and RESULT in out.stdout, out.stdout + out.stderr
            assert "Failed to load" not in out.stderr and "mismatch" not in out.stderr, out.stderr


def test_unified_shared_memory_groups_run(llvm19: Tool, tmp_path: Path) -> None:
    """With ``#pragma omp requires unified_shared_memory`` in both sources, each object has a requires entry
    (null address, flags 0x10) and its global becomes ``<name>_decl_tgt_ref_ptr``; every group gets both requires
    entries, so every descriptor carries the same flags."""
    sources = compile_sources(llvm19("clang++"), tmp_path, {"a": A_SRC, "b": B_SRC}, requires=USM)
    assert all("" in source.entries for source in sources.values())  # Clang 19 names the requires entry ""
    program = link_program(llvm19, tmp_path, [sources["a"].obj, sources["b"].obj],
                           reg.wrap_openmp_groups(groups_of(sources, "a", "b")), runtime=OMPTARGET)
    out = run_program(program)
    assert out.returncode == 0 and RESULT in out.stdout, out.stdout + out.stderr
    assert "Failed to load" not in out.stderr and "mismatch" not in out.stderr, out.stderr


# --------------------------------------------------------------------------------------------------
# What each descriptor holds (a recorder in place of libomptarget)


def recorded(clang: Path, llvm19: Tool, tmp: Path, version: int) -> tuple[dict[str, Source], list[str]]:
    """Three objects (each with a requires entry) where the groups name only a's and b's entries; the lines the
    recorder prints for the two descriptors."""
    sources = compile_sources(clang, tmp, {"a": A_SRC, "b": B_SRC, "c": C_SRC}, requires=USM, link_images=False)
    (tmp / "recorder.c").write_text(RECORDER)
    layout = ["-DLAYOUT21"] if reg.entry_layout(version) >= 21 else []
    run([llvm19("clang"), "-O1", "-c", tmp / "recorder.c", "-o", tmp / "recorder.o", *layout])
    wrapper = reg.wrap_openmp_groups(groups_of(sources, "a", "b"), llvm_version=version)
    program = link_program(llvm19, tmp, [sources[s].obj for s in "abc"], wrapper, runtime=[tmp / "recorder.o"])
    return sources, run([program]).stdout.splitlines()


@pytest.mark.parametrize("version", [19, 22])
def test_descriptors_hold_their_groups_entries(llvm19: Tool, llvm22: Tool, tmp_path: Path, version: int) -> None:
    """Group g's descriptor and each of its images hold g's named entries, every requires entry, and (group 0)
    the entries no group names; registered in group order, unregistered in reverse.  LLVM 22's objects use the
    56-byte entries of ``llvm_offload_entries`` (and name the requires entry ".requires")."""
    clang = (llvm19 if version == 19 else llvm22)("clang++")
    sources, lines = recorded(clang, llvm19, tmp_path, version)
    assert [line for line in lines if line.startswith(("register", "unregister"))] == [
        "register 0 images=1", "register 1 images=1", "unregister 1", "unregister 0"], lines
    assert "image 0 0 same_range=1" in lines and "image 1 0 same_range=1" in lines, lines
    entries: dict[int, list[tuple[str, str]]] = {0: [], 1: []}
    for line in lines:
        if match := re.fullmatch(r"entry (\d) name=(\S*) null_addr=(\d) flags=(\d+) data=(\d+)", line):
            group, name, null_addr, flags, data = match.groups()
            # A requires entry: null address, flags OMP_REGISTER_REQUIRES, data the clauses (unified_shared_memory
            # is 8); named entries: a non-null address.
            entries[int(group)].append((name, f"{flags}/{data}" if null_addr == "1" else "addr"))
    requires_name = "" if version == 19 else ".requires"
    requires = [(requires_name, "16/8")] * 3  # one per object
    named = {stem: [n for n in sources[stem].entries if n != requires_name] for stem in "abc"}
    assert all(len(names) == 2 and len(sources[stem].entries) == 3 for stem, names in named.items()), sources
    assert sorted(entries[0]) == sorted(requires + [(n, "addr") for n in named["a"] + named["c"]]), entries[0]
    assert sorted(entries[1]) == sorted(requires + [(n, "addr") for n in named["b"]]), entries[1]


# --------------------------------------------------------------------------------------------------
# The module and its inputs


def test_many_names_are_found(llvm19: Tool, tmp_path: Path) -> None:
    """The binary search over the sorted name table: with hundreds of decoy names around the real ones (bytes
    above 0x7f included, which strcmp orders as unsigned), each entry still reaches its group."""
    sources = compile_sources(llvm19("clang++"), tmp_path, {"a": A_SRC, "b": B_SRC, "c": C_SRC}, link_images=False)
    (tmp_path / "recorder.c").write_text(RECORDER)
    run([llvm19("clang"), "-O1", "-c", tmp_path / "recorder.c", "-o", tmp_path / "recorder.o"])
    decoys = [f"{prefix}{i:04d}" for i in range(300) for prefix in ("a_value", "b_val", "\u00e9", "__omp_offloading_")]
    groups = [([sources["a"].image], decoys[0::3] + sources["a"].entries),
              ([sources["b"].image], decoys[1::3] + sources["c"].entries),
              ([sources["c"].image], decoys[2::3] + sources["b"].entries)]
    program = link_program(llvm19, tmp_path, [sources[s].obj for s in "abc"], reg.wrap_openmp_groups(groups),
                           runtime=[tmp_path / "recorder.o"])
    lines = run([program]).stdout.splitlines()
    found: dict[int, list[str]] = {}
    for line in lines:
        if match := re.fullmatch(r"entry (\d) name=(\S*) .*", line):
            found.setdefault(int(match.group(1)), []).append(match.group(2))
    assert {k: sorted(v) for k, v in found.items()} == {
        0: sorted(sources["a"].entries), 1: sorted(sources["c"].entries), 2: sorted(sources["b"].entries)}, lines


def test_group_module_in_wrap_kinds() -> None:
    """``openmp-groups`` is a kind of :func:`wrap` and :func:`wrap_kinds`, next to HIP's registration; the images
    land in the offloading section in group order."""
    images = [reg.openmp_image_binary(bytes([i]) * (100 + i), triple=X86, arch="") for i in range(3)]
    groups: list[reg.ImageGroup] = [([images[0]], ["k0"]), ([images[1]], ["k1", "g1"]), ([images[2]], [])]
    hip = fatbinary.hip_fatbinary([("gfx90a", os.urandom(300))])
    for obj in (reg.wrap("openmp-groups", groups), reg.wrap_kinds([("openmp-groups", groups), ("hip", hip)]),
                reg.wrap_openmp_groups(groups, llvm_version=22)):
        assert b"".join(images) in obj
    text = str(reg.openmp_group_module(groups))
    assert text.count("__tgt_register_lib") == 2 and "[3 x %\"__tgt_bin_desc\"]" in text  # a declaration and a call


def test_bad_groups() -> None:
    image = reg.openmp_image_binary(b"\x7fELF", triple=X86, arch="")
    gpu = reg.openmp_image_binary(b"\x7fELF", triple="amdgcn-amd-amdhsa", arch="gfx90a")
    with pytest.raises(OffloadError, match="at least one image group"):
        reg.openmp_group_module([])
    with pytest.raises(OffloadError, match="group 1 has no device image"):
        reg.openmp_group_module([([image], ["a"]), ([], ["b"])])
    with pytest.raises(OffloadError, match="'k' is in image groups 0 and 2"):
        reg.openmp_group_module([([image], ["k"]), ([image], ["j"]), ([image], ["x", "k"])])
    with pytest.raises(OffloadError, match="different targets"):
        reg.openmp_group_module([([image, gpu], ["a"]), ([image], ["b"])])
    with pytest.raises(OffloadError, match="NUL"):
        reg.openmp_group_module([([image], ["a\0b"])])
    with pytest.raises(OffloadError, match="sequence of strings"):
        reg.openmp_group_module([([image], "kernel")])
    with pytest.raises(OffloadError, match="pair"):
        reg.openmp_group_module([[image]])  # type: ignore[list-item]
    with pytest.raises(OffloadError, match="sequence"):
        reg.openmp_group_module(image)  # type: ignore[arg-type]
    with pytest.raises(OffloadBinaryFormatError, match="not an offload binary"):
        reg.openmp_group_module([([b"\x7fELF raw"], [])])
    # The requires entry's names (LLVM 19: "", LLVM 22: ".requires") may be in every group.
    reg.openmp_group_module([([image], ["", ".requires", "a"]), ([image], ["", ".requires", "b"])])
