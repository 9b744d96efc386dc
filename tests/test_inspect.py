"""``offload-inspect`` against the real tools: it must agree with each of them wherever they can read.

Inputs are built with clang 19 (OpenMP fat objects for x86_64, sm_80 and gfx90a:xnack+, an ``-flto`` host
object, an archive, a linked executable, HIP non-RDC objects with and without ``--offload-compress``,
shared objects linking two of them, a ``-fgpu-rdc`` object bundle), clang-offload-bundler 19 (binary,
compressed and text bundles, and concatenations of them), clang-offload-packager 19, and CUDA 13's
``ptxas``/``fatbinary`` for a ``.nv_fatbin`` section. The oracles:

* ``llvm-objdump --offloading`` (19): the offload binaries, as a multiset of (image kind, arch, triple,
  producer), on every ELF file and archive;
* ``clang-offload-bundler -list`` (19): the bundle entry IDs, as a set, on every bundle, object bundle and
  ``.hip_fatbin`` section it reads (for concatenations, on each bundle on its own: Clang 19 lists only the
  first of several uncompressed bundles and fails on compressed ones, both checked here);
* ``llvm-objdump --offloading`` (22), which reads ``.hip_fatbin`` bundles one after another: the IDs per
  bundle index, and the bytes for uncompressed bundles;
* ``--extract`` output byte for byte against ``clang-offload-packager <file> --image=`` (same file names)
  and ``clang-offload-bundler -unbundle``;
* ``fatbinary``'s own inputs for the NVIDIA fat binary and its cubin entry.

Failures must be one line on stderr naming the file and the byte offset, exit status 1, nothing on stdout,
no traceback, and no extracted file.
"""
from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from offload_builders.cli.inspect import main
from offload_builders.formats.inspect import safe_file_name, split_bundle_id, unique_names

OMP_SOURCE = """\
int main() {
  int x = 0;
#pragma omp target map(tofrom: x)
  x = 42;
  return x != 42;
}
"""

# No HIP/CUDA headers (-nogpuinc/-nocudainc): declare what a kernel definition needs.
HIP_SOURCE = """\
struct dim3 { unsigned x, y, z; };
extern "C" int hipLaunchKernel(const void *, dim3, dim3, void **, unsigned long, void *);
__attribute__((global)) void KERNEL(int *p) { p[0] = 1; }
"""

CUDA_SOURCE = """\
struct dim3 { unsigned x, y, z; };
typedef struct CUstream_st *cudaStream_t;
extern "C" int cudaLaunchKernel(const void *, dim3, dim3, void **, unsigned long, cudaStream_t);
__attribute__((global)) void k(int *p) { p[0] = 1; }
"""

HIP_ARCHS = "--offload-arch=gfx90a:xnack+,gfx942"
OURS = [sys.executable, "-m", "offload_builders.cli.inspect"]


def sh(*cmd: object, cwd: Path) -> None:
    result = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True)
    assert result.returncode == 0, (cmd, result.stderr)


def parallel(cwd: Path, commands: list[list[object]]) -> None:
    with ThreadPoolExecutor(8) as pool:
        for future in [pool.submit(sh, *cmd, cwd=cwd) for cmd in commands]:
            future.result()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory, llvm19, cuda) -> Path:
    """Every kind of input, built once for the module (read-only)."""
    d = tmp_path_factory.mktemp("inspect")
    cxx, bundler = llvm19("clang++"), llvm19("clang-offload-bundler")
    ptxas, fatbinary = cuda("ptxas"), cuda("fatbinary")
    (d / "x.cpp").write_text(OMP_SOURCE)
    (d / "plain.c").write_text("int f(int x) { return x + 1; }\n")
    (d / "k.cu").write_text(CUDA_SOURCE)
    for name in ("k", "k2", "k3"):
        (d / f"{name}.hip").write_text(HIP_SOURCE.replace("KERNEL", name))
    (d / "h.bin").write_bytes(b"HOSTDATA")
    (d / "d1.bin").write_bytes(b"DEV1")
    (d / "d2.bin").write_bytes(b"DEVICE_TWO!")
    (d / "d.ll").write_text("define void @d() { ret void }\n")
    (d / "h.ll").write_text("; host IR\n")
    (d / "img.cubin").write_bytes(b"hello")
    (d / "img.s").write_bytes(b"helloworld")
    omp = [cxx, "-fopenmp", "-fopenmp-targets=x86_64-unknown-linux-gnu"]
    hip = [cxx, "-x", "hip", HIP_ARCHS, "-nogpulib", "-nogpuinc", "-c"]
    b1 = ["-targets=host-x86_64-unknown-linux-gnu,hip-amdgcn-amd-amdhsa--gfx90a:xnack+,hip-amdgcn-amd-amdhsa--gfx908",
          "-input=h.bin", "-input=d1.bin", "-input=d2.bin"]
    b2 = ["-targets=host-x86_64-unknown-linux-gnu,openmp-amdgcn-amd-amdhsa--gfx942", "-input=h.bin", "-input=d2.bin"]
    parallel(d, [
        [*omp, "-c", "x.cpp", "-o", "fat.o"],
        [*omp, "-flto", "-c", "x.cpp", "-o", "fatlto.o"],
        [cxx, "-fopenmp", "--offload-arch=sm_80,gfx90a:xnack+", "-nogpulib", f"--cuda-path={ptxas.parent.parent}",
         "-c", "x.cpp", "-o", "gpu.o"],
        [*hip, "k.hip", "-o", "hip.o"],
        [*hip, "k2.hip", "-o", "hip2.o"],
        [*hip, "--offload-compress", "k.hip", "-o", "hipc.o"],
        [*hip, "--offload-compress", "k3.hip", "-o", "hip3c.o"],
        [*hip, "-fgpu-rdc", "k.hip", "-o", "rdc.o"],
        [cxx, "-x", "cuda", "--cuda-device-only", "--offload-arch=sm_80", "-nocudalib", "-nocudainc", "-S",
         "-Wno-unknown-cuda-version", "k.cu", "-o", "k.ptx"],
        [llvm19("clang"), "-c", "plain.c", "-o", "plain.o"],
        [bundler, "-type=bc", *b1, "-output=b1.bin"],
        [bundler, "-type=bc", *b2, "-bundle-align=16", "-output=b2.bin"],
        [bundler, "-type=bc", "-compress", *b1, "-output=b1c.bin"],
        [bundler, "-type=bc", "-compress", *b2, "-output=b2c.bin"],
        [bundler, "-type=ll", "-targets=hip-amdgcn-amd-amdhsa--gfx908,host-x86_64-pc-linux-gnu",
         "-input=d.ll", "-input=h.ll", "-output=text.ll"],
        [llvm19("clang-offload-packager"), "-o", "two.pkg",
         "--image=file=img.cubin,triple=nvptx64-nvidia-cuda,arch=sm_80,kind=cuda",
         "--image=file=img.s,triple=amdgcn-amd-amdhsa,arch=gfx90a:xnack+,kind=hip,feature=+xnack"],
    ])
    lld = ["-fuse-ld=lld", f"--ld-path={llvm19('ld.lld')}"]
    parallel(d, [
        [*omp, "fat.o", "-o", "a.out"],
        [llvm19("llvm-ar"), "rcs", "libdev.a", "fat.o", "gpu.o", "hip.o", "rdc.o"],
        [cxx, "-shared", *lld, "hip.o", "hip2.o", "-o", "libhip.so"],
        [cxx, "-shared", *lld, "hipc.o", "hip3c.o", "-o", "libhipc.so"],
        [ptxas, "-arch=sm_80", "k.ptx", "-o", "k.cubin"],
    ])
    sh(fatbinary, "--create=k.fatbin", "--image3=kind=elf,sm=80,file=k.cubin", "--image3=kind=ptx,sm=80,file=k.ptx",
       cwd=d)
    sh(cxx, "-x", "cuda", "--cuda-host-only", "--offload-arch=sm_80", "-nocudalib", "-nocudainc",
       "-Wno-unknown-cuda-version", "-Xclang", "-fcuda-include-gpubinary", "-Xclang", "k.fatbin", "-c", "k.cu",
       "-o", "cu.o", cwd=d)
    (d / "cat.bin").write_bytes((d / "b1.bin").read_bytes() + (d / "b2.bin").read_bytes())
    (d / "catc.bin").write_bytes((d / "b1c.bin").read_bytes() + (d / "b2c.bin").read_bytes())
    # Compressed, then zero padding (as the linker pads .hip_fatbin), then uncompressed.
    (d / "mixed.bin").write_bytes((d / "b1c.bin").read_bytes() + bytes(64) + (d / "b2.bin").read_bytes())
    objcopy = llvm19("llvm-objcopy")
    for name in ("hip.o", "hip2.o", "hipc.o", "hip3c.o", "libhip.so", "libhipc.so"):
        sh(objcopy, f"--dump-section=.hip_fatbin={name}.hip_fatbin", name, os.devnull, cwd=d)
    return d


# --------------------------------------------------------------------------------------------------
# Helpers


def run_ours(*args: object) -> tuple[int, str, str]:
    """``offload-inspect`` in-process (the same ``main`` the console script runs)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def payloads(*args: object) -> list[dict]:
    rc, out, err = run_ours("--json", *args)
    assert rc == 0, err
    return [p for f in json.loads(out)["files"] for p in f["payloads"]]


def objdump_images(tool: Path, path: Path) -> collections.Counter:
    """(kind, arch, triple, producer) of every ``OFFLOADING IMAGE`` llvm-objdump prints."""
    result = subprocess.run([str(tool), "--offloading", str(path)], capture_output=True, text=True, check=True)
    images, current = [], None
    for line in result.stdout.splitlines():
        if line.startswith("OFFLOADING IMAGE"):
            current = {}
            images.append(current)
        elif current is not None and line.strip():
            key, _, value = line.partition(" ")
            current[key] = value.strip()
    return collections.Counter((i["kind"], i["arch"], i["triple"], i["producer"]) for i in images)


def bundler_list(tool: Path, path: Path, file_type: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tool), "-list", f"-type={file_type}", f"-input={path}"], capture_output=True, text=True)


def bundle_ids(items: list[dict], index: int | None = None) -> set[str]:
    return {p["bundle_id"] for p in items if p["bundle_id"] is not None and (index is None or p["index"] == index)}


def tree(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


# --------------------------------------------------------------------------------------------------
# Agreement with llvm-objdump --offloading (offload binaries)

OBJDUMP_FILES = ["fat.o", "gpu.o", "a.out", "libdev.a", "hip.o", "rdc.o", "cu.o", "plain.o", "libhip.so"]


@pytest.mark.parametrize("name", OBJDUMP_FILES)
def test_offload_binaries_agree_with_llvm_objdump(inputs: Path, llvm19, name: str) -> None:
    expected = objdump_images(llvm19("llvm-objdump"), inputs / name)
    ours = collections.Counter((p["image_kind"], p["arch"], p["triple"], p["kind"])
                               for p in payloads(inputs / name) if p["format"] == "offload binary")
    assert ours == expected
    if name in ("fat.o", "gpu.o", "a.out", "libdev.a"):
        assert expected, "the oracle saw nothing: the input is not what this test means to check"


def test_the_expected_offload_binaries(inputs: Path) -> None:
    """Beyond agreeing with llvm-objdump: the kinds and targets each compile asked for."""
    gpu = {(p["triple"], p["arch"], p["image_kind"], p["kind"]) for p in payloads(inputs / "gpu.o")}
    assert gpu == {("amdgcn-amd-amdhsa", "gfx90a:xnack+", "llvm ir", "openmp"),
                   ("nvptx64-nvidia-cuda", "sm_80", "elf", "openmp")}
    (lto,) = payloads(inputs / "fatlto.o")  # bitcode: llvm-objdump 19 cannot read it, the packager can
    assert (lto["container"], lto["triple"], lto["kind"], lto["offset_in"]) == (
        "LLVM bitcode", "x86_64-unknown-linux-gnu", "openmp", "global @llvm.embedded.object")
    (exe,) = payloads(inputs / "a.out")
    assert exe["container"] == "ELF executable" and exe["section"] == ".llvm.offloading"
    pkg = payloads(inputs / "two.pkg")
    assert [(p["kind"], p["arch"], p["image_kind"], p["strings"].get("feature")) for p in pkg] == [
        ("cuda", "sm_80", "cubin", None), ("hip", "gfx90a:xnack+", "ptx", "+xnack")]
    assert [p["kind"] for p in payloads("--llvm-version=21", inputs / "two.pkg")] == ["cuda", "none"]


# --------------------------------------------------------------------------------------------------
# Agreement with clang-offload-bundler -list (bundles)

BUNDLER_FILES = [
    ("b1.bin", "bc"), ("b2.bin", "bc"), ("b1c.bin", "bc"), ("b2c.bin", "bc"), ("text.ll", "ll"), ("rdc.o", "o"),
    ("hip.o.hip_fatbin", "o"), ("hip2.o.hip_fatbin", "o"), ("hipc.o.hip_fatbin", "o"), ("hip3c.o.hip_fatbin", "o"),
]


@pytest.mark.parametrize("name,file_type", BUNDLER_FILES)
def test_bundle_ids_agree_with_clang_offload_bundler(inputs: Path, llvm19, name: str, file_type: str) -> None:
    listed = bundler_list(llvm19("clang-offload-bundler"), inputs / name, file_type)
    assert listed.returncode == 0, listed.stderr
    expected = set(listed.stdout.split())
    assert expected
    assert bundle_ids(payloads(inputs / name)) == expected
    if name.endswith(".hip_fatbin"):  # the object holding the section says the same
        assert bundle_ids(payloads(inputs / name.removesuffix(".hip_fatbin"))) == expected


def test_hip_fatbin_sections(inputs: Path) -> None:
    (host, *devices) = payloads(inputs / "hip.o")
    assert (host["kind"], host["size"], host["section"]) == ("host", 0, ".hip_fatbin")
    assert {(p["kind"], p["triple"], p["arch"], p["image_kind"]) for p in devices} == {
        ("hipv4", "amdgcn-amd-amdhsa", "gfx90a:xnack+", "elf"), ("hipv4", "amdgcn-amd-amdhsa", "gfx942", "elf")}
    compressed = payloads(inputs / "hipc.o")
    assert {p["format"] for p in compressed} == {"compressed bundle"}
    assert {(p["compression"]["version"], p["compression"]["method"]) for p in compressed} == {(2, "zstd")}
    rdc = payloads(inputs / "rdc.o")
    assert {(p["format"], p["image_kind"]) for p in rdc} == {("object bundle", "llvm ir"),
                                                             ("object bundle", "host object")}


@pytest.mark.parametrize("name,pieces,compressed", [
    ("cat.bin", ["b1.bin", "b2.bin"], False),
    ("catc.bin", ["b1c.bin", "b2c.bin"], True),
    ("mixed.bin", ["b1c.bin", "b2.bin"], True),
    ("libhip.so.hip_fatbin", ["hip.o.hip_fatbin", "hip2.o.hip_fatbin"], False),
    ("libhipc.so.hip_fatbin", ["hipc.o.hip_fatbin", "hip3c.o.hip_fatbin"], True),
])
def test_concatenated_bundles(inputs: Path, llvm19, name: str, pieces: list[str], compressed: bool) -> None:
    """Each bundle of a concatenation, found from the previous one's header, matches Clang 19's list of that
    bundle on its own; Clang 19 itself lists only the first bundle, or fails when the first is compressed."""
    tool = llvm19("clang-offload-bundler")
    ours = payloads(inputs / name)
    assert {p["index"] for p in ours} == set(range(len(pieces)))
    for index, piece in enumerate(pieces):
        alone = bundler_list(tool, inputs / piece, "o")
        assert alone.returncode == 0, alone.stderr
        assert bundle_ids(ours, index) == set(alone.stdout.split())
    whole = bundler_list(tool, inputs / name, "o")
    if compressed:
        assert whole.returncode != 0 and "Src size is incorrect" in whole.stderr
    else:
        assert whole.returncode == 0 and set(whole.stdout.split()) == bundle_ids(ours, 0)


@pytest.mark.parametrize("name", ["hip.o", "hipc.o", "libhip.so", "libhipc.so", "libdev.a"])
def test_hip_fatbin_agrees_with_llvm_objdump_22(inputs: Path, tmp_path: Path, llvm22, name: str) -> None:
    """llvm-objdump 22 reads .hip_fatbin bundles (all of a concatenation) and writes each entry to
    ``<file>.<bundle index>.<id>``; the IDs per bundle must match ours, and for uncompressed bundles the
    bytes too. (For compressed bundles llvm-objdump 22.1 writes wrong bytes, so only the IDs count there.)"""
    shutil.copy(inputs / name, tmp_path / name)
    result = subprocess.run([str(llvm22("llvm-objdump")), "--offloading", name], cwd=tmp_path, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    prefix = "Extracting offload bundle: "
    theirs = {line[len(prefix):] for line in result.stdout.splitlines() if line.startswith(prefix)}
    ours = [p for p in payloads("--extract", tmp_path / "ours", tmp_path / name) if p["section"] == ".hip_fatbin"]
    # llvm-objdump names each entry after the object holding the section: the archive member, or the file.
    named = {f"{p['members'][-1] if p['members'] else name}.{p['index']}.{p['bundle_id']}": p for p in ours}
    assert theirs == set(named) and len(named) == len(ours)
    for written, p in named.items():
        if p["compression"] is None:
            assert Path(p["extracted"]).read_bytes() == (tmp_path / written).read_bytes()


# --------------------------------------------------------------------------------------------------
# --extract against clang-offload-packager and clang-offload-bundler -unbundle


@pytest.mark.parametrize("name", ["fat.o", "gpu.o", "a.out", "fatlto.o", "libdev.a", "two.pkg"])
def test_extract_matches_clang_offload_packager(inputs: Path, tmp_path: Path, llvm19, name: str) -> None:
    clang = tmp_path / "clang"
    clang.mkdir()
    sh(llvm19("clang-offload-packager"), inputs / name, "--image=", cwd=clang)
    ours = [p for p in payloads("--extract", tmp_path / "ours", inputs / name) if p["format"] == "offload binary"]
    written = {Path(p["extracted"]).name: Path(p["extracted"]).read_bytes() for p in ours}
    assert written == tree(clang) and written


def _unbundle(tool: Path, path: Path, file_type: str, ids: list[str], out: Path) -> dict[str, bytes]:
    """What Clang 19 unbundles for each stored ID. An ID ending in '-' is asked for without it: Clang 19
    standardizes the request back to the stored ID, while a trailing '-' in ``-targets`` hits its ""
    OffloadArch bug (the ID is doubled)."""
    outputs = [out / f"{i}.{n}" for i, n in enumerate(ids)]
    targets = ",".join(i.rstrip("-") for i in ids)
    sh(tool, "-unbundle", f"-type={file_type}", f"-input={path}", f"-targets={targets}",
       *[f"-output={o}" for o in outputs], cwd=out)
    return {i: o.read_bytes() for i, o in zip(ids, outputs)}


@pytest.mark.parametrize("name,file_type,pieces", [
    ("b1.bin", "bc", None), ("b1c.bin", "bc", None), ("text.ll", "ll", None), ("rdc.o", "o", None),
    ("hip.o", "o", ["hip.o.hip_fatbin"]), ("hipc.o", "o", ["hipc.o.hip_fatbin"]),
    ("cat.bin", "bc", ["b1.bin", "b2.bin"]), ("catc.bin", "bc", ["b1c.bin", "b2c.bin"]),
    ("libhipc.so", "o", ["hipc.o.hip_fatbin", "hip3c.o.hip_fatbin"]),
])
def test_extract_matches_clang_offload_bundler(inputs: Path, tmp_path: Path, llvm19, name: str, file_type: str,
                                               pieces: list[str] | None) -> None:
    """Every extracted entry (decompressed; the host entry of an object bundle as the object without its
    bundle sections) is byte-identical to what ``clang-offload-bundler -unbundle`` writes for its ID."""
    ours = payloads("--extract", tmp_path / "ours", inputs / name)
    assert ours
    tool = llvm19("clang-offload-bundler")
    for index, piece in enumerate(pieces or [name]):
        entries = [p for p in ours if p["index"] == index]
        work = tmp_path / f"clang{index}"
        work.mkdir()
        expected = _unbundle(tool, inputs / piece, file_type, [p["bundle_id"] for p in entries], work)
        assert {p["bundle_id"]: Path(p["extracted"]).read_bytes() for p in entries} == expected


def test_thin_and_nested_archives(inputs: Path, tmp_path: Path, llvm19) -> None:
    """A thin archive (members read from their own files) and an archive inside an archive list what the
    plain archive of the same objects lists."""
    members = ["fat.o", "gpu.o", "hip.o", "rdc.o"]
    sh(llvm19("llvm-ar"), "rcsT", tmp_path / "thin.a", *members, cwd=inputs)
    sh(llvm19("llvm-ar"), "rcs", tmp_path / "nested.a", "libdev.a", cwd=inputs)

    def summary(path: Path) -> collections.Counter:
        return collections.Counter((p["format"], p["kind"], p["triple"], p["arch"], p["bundle_id"], p["size"])
                                   for p in payloads(path))

    plain = summary(inputs / "libdev.a")
    assert summary(tmp_path / "thin.a") == plain and summary(tmp_path / "nested.a") == plain
    assert {tuple(p["members"]) for p in payloads(tmp_path / "nested.a")} == {("libdev.a", m) for m in members}


def test_extract_names_are_unique_and_deterministic(inputs: Path, tmp_path: Path) -> None:
    first = payloads("--extract", tmp_path / "a", inputs / "libhip.so", inputs / "hip.o", inputs / "libdev.a")
    second = payloads("--extract", tmp_path / "b", inputs / "libhip.so", inputs / "hip.o", inputs / "libdev.a")
    names = [Path(p["extracted"]).name for p in first]
    assert len(set(names)) == len(names) == len(list((tmp_path / "a").iterdir()))
    assert names == [Path(p["extracted"]).name for p in second]
    assert "libhip-hipv4-amdgcn-amd-amdhsa--gfx90a_xnack+" in names
    assert "libhip-hipv4-amdgcn-amd-amdhsa--gfx90a_xnack+.1" in names  # the second bundle of the section
    assert not [n for n in os.listdir(tmp_path / "a") if n.startswith(".")]  # no temporaries left


# --------------------------------------------------------------------------------------------------
# NVIDIA fat binaries


@pytest.mark.parametrize("name", ["cu.o", "k.fatbin"])
def test_nv_fatbin(inputs: Path, tmp_path: Path, name: str) -> None:
    (fatbin,) = payloads("--extract", tmp_path, inputs / name)
    source = (inputs / "k.fatbin").read_bytes()
    assert (fatbin["format"], fatbin["kind"], fatbin["size"]) == ("nvidia fatbin", "cuda", len(source))
    assert fatbin["section"] == (".nv_fatbin" if name == "cu.o" else None)
    assert Path(fatbin["extracted"]).read_bytes() == source
    elf, ptx = fatbin["entries"]
    assert (elf["kind"], elf["arch"], elf["compressed"]) == ("elf", "sm_80", False)
    cubin = (inputs / "k.cubin").read_bytes()
    data = (inputs / name).read_bytes()
    assert data[elf["offset"]:elf["offset"] + len(cubin)] == cubin and elf["size"] >= len(cubin)
    assert (ptx["kind"], ptx["arch"]) == ("ptx", "compute_80")


# --------------------------------------------------------------------------------------------------
# Output forms and the error contract


def test_text_output(inputs: Path) -> None:
    rc, out, err = run_ours(inputs / "gpu.o", inputs / "plain.o", inputs / "hipc.o")
    assert rc == 0
    lines = out.splitlines()
    assert len(lines) == 5 and all(str(inputs) in line for line in lines)
    assert any("kind=openmp triple=nvptx64-nvidia-cuda arch=sm_80 image=elf" in line for line in lines)
    assert any("compressed bundle 0 at 0x" in line and "(in the decompressed bundle)" in line for line in lines)
    assert err == f"offload-inspect: {inputs / 'plain.o'}: no offload payloads\n"


def test_no_offload_content_is_not_an_error(inputs: Path, tmp_path: Path) -> None:
    rc, out, err = run_ours("--json", "--extract", tmp_path / "x", inputs / "plain.o", inputs / "x.cpp")
    assert rc == 0 and json.loads(out) == {"files": [{"file": str(inputs / "plain.o"), "payloads": []},
                                                     {"file": str(inputs / "x.cpp"), "payloads": []}]}
    assert err.count("no offload payloads") == 2


def test_standard_input(inputs: Path, tmp_path: Path) -> None:
    result = subprocess.run(OURS + ["--json", "--extract", str(tmp_path), "-"], input=(inputs / "gpu.o").read_bytes(),
                            capture_output=True)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)["files"][0]
    assert found["file"] == "<stdin>" and len(found["payloads"]) == 2
    assert sorted(os.listdir(tmp_path)) == ["stdin-amdgcn-amd-amdhsa-gfx90a:xnack+.0.bc",
                                            "stdin-nvptx64-nvidia-cuda-sm_80.1.o"]


def test_console_script(inputs: Path) -> None:
    script = Path(sys.executable).parent / "offload-inspect"
    result = subprocess.run([str(script), str(inputs / "b1.bin")], capture_output=True, text=True)
    assert result.returncode == 0 and len(result.stdout.splitlines()) == 3, result.stderr


def _damage(inputs: Path, tmp_path: Path) -> dict[str, tuple[Path, int]]:
    """Damaged copies of real files, with the byte offset the error must name."""
    cases: dict[str, tuple[Path, int]] = {}

    def write(name: str, data: bytes, offset: int) -> None:
        (tmp_path / name).write_bytes(data)
        cases[name] = (tmp_path / name, offset)

    b1 = (inputs / "b1.bin").read_bytes()
    write("truncated.bin", b1[:100], 0x18)  # the entry count cannot fit in 100 bytes
    write("truncated-entry.bin", b1[:0xd0], 0x5e)  # entry 1 (record at 0x56): its 4 bytes at 0xcf run past the end
    b1c = (inputs / "b1c.bin").read_bytes()
    write("truncated-compressed.bin", b1c[:150], 0x8)  # the CCOB total size runs past the end
    (binary,) = payloads(inputs / "fat.o")
    fat = bytearray((inputs / "fat.o").read_bytes())
    fat[binary["header_offset"] + 4] = 7  # OffloadBinary version 7
    write("bad-version.o", bytes(fat), binary["header_offset"] + 4)
    pkg = bytearray((inputs / "two.pkg").read_bytes())
    pkg[0x10:0x18] = (1 << 40).to_bytes(8, "little")  # EntryOffset far past the binary
    write("bad-entry.pkg", bytes(pkg), 0x10)
    hip = payloads(inputs / "hip.o")
    obj = bytearray((inputs / "hip.o").read_bytes())
    at = hip[0]["header_offset"]
    obj[at + 24:at + 32] = (1 << 20).to_bytes(8, "little")  # entry count of the .hip_fatbin bundle
    write("bad-count.o", bytes(obj), at + 24)
    return cases


def test_damaged_inputs_fail_on_one_line(inputs: Path, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    for name, (path, offset) in _damage(inputs, tmp_path / "in").items():
        out = tmp_path / f"out-{name}"
        result = subprocess.run(OURS + ["--extract", str(out), str(inputs / "fat.o"), str(path)], capture_output=True,
                                text=True)
        assert result.returncode == 1, name
        assert result.stdout == "", name  # nothing for the good file either
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert lines[0].startswith(f"offload-inspect: error: {path}"), lines[0]
        assert f"offset {offset:#x}" in lines[0], (name, lines[0])
        assert not out.exists(), name  # no extracted file, not even the directory


def test_clang_19_on_a_truncated_bundle(inputs: Path, tmp_path: Path, llvm19) -> None:
    """Why the hardened reader matters: clang-offload-bundler 19 crashes on a bundle cut 2 bytes short (its
    header parser stops early and leaves an iterator uninitialized), where offload-inspect names the damage."""
    path = tmp_path / "truncated.bin"
    path.write_bytes((inputs / "b1.bin").read_bytes()[:220])
    listed = bundler_list(llvm19("clang-offload-bundler"), path, "bc")
    assert listed.returncode != 0 and not listed.stdout.strip()
    rc, out, err = run_ours(path)
    assert rc == 1 and out == "" and "offset 0x" in err


def test_usage_errors(tmp_path: Path) -> None:
    for args, message in [([], "no input files"), (["--bogus", "x"], "unknown option '--bogus'"),
                          (["--extract"], "requires a value"), ([str(tmp_path / "missing")], "No such file"),
                          ([str(tmp_path)], "Is a directory"), (["--llvm-version=9", "x"], "--llvm-version")]:
        rc, out, err = run_ours(*args)
        assert rc == 1 and out == "" and len(err.splitlines()) == 1 and message in err, (args, err)


# --------------------------------------------------------------------------------------------------
# Library helpers


@pytest.mark.parametrize("text,expected", [
    ("hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+", ("hipv4", "amdgcn-amd-amdhsa", "gfx90a:xnack+")),
    ("host-x86_64-unknown-linux--", ("host", "x86_64-unknown-linux", "")),
    ("host-x86_64-unknown-linux-gnu-", ("host", "x86_64-unknown-linux-gnu", "")),
    ("hipv4-amdgcn-amd-amdhsa--gfx10-3-generic", ("hipv4", "amdgcn-amd-amdhsa", "gfx10-3-generic")),
    ("hip-amdgcn-amd-amdhsa-unknown-gfx908", ("hip", "amdgcn-amd-amdhsa-unknown", "gfx908")),
    ("hip-amdgcn-amd-amdhsa-gfx908", ("hip", "amdgcn-amd-amdhsa", "gfx908")),
    ("openmp-nvptx64-nvidia-cuda--sm_80", ("openmp", "nvptx64-nvidia-cuda", "sm_80")),
    ("host-x86_64-pc-linux-gnu", ("host", "x86_64-pc-linux-gnu", "")),
])
def test_split_bundle_id(text: str, expected: tuple[str, str, str]) -> None:
    assert split_bundle_id(text) == expected


def test_names_are_safe_and_unique() -> None:
    assert safe_file_name("x-../../etc/passwd") == "x-.._.._etc_passwd"
    assert safe_file_name("..") == "_.."
    taken: set[str] = set()
    assert unique_names(["a-x.0.o", "a-x.0.o", "b", "b", "b"], taken) == ["a-x.0.o", "a-x.0.1.o", "b", "b.1", "b.2"]
