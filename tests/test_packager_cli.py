"""``offload-packager`` as a drop-in for ``clang-offload-packager``: same bytes, same files, same errors.

Every differential case runs the real clang-offload-packager 19 (or llvm-offload-binary 22) on the same
arguments in a sibling directory and compares the directories byte for byte. Failures must be one line
on stderr naming the file (and the byte offset for malformed input), exit status 1, no traceback, and no
output file left behind. Memory: packaging and extracting a 256 MiB image stays flat.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from offload_builders.cli.packager import main
from offload_builders.formats.offload_binary import read_offload_binaries

SOURCE = """\
int main() {
  int x = 0;
#pragma omp target map(tofrom: x)
  x = 42;
  return x != 42;
}
"""

OURS = [sys.executable, "-m", "offload_builders.cli.packager"]


def run(cmd: list[object], cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, input=stdin, capture_output=True)


def tree(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory, llvm19) -> Path:
    """Device images, packages, fat objects and archives shared by the tests (read-only)."""
    d = tmp_path_factory.mktemp("inputs")
    (d / "a.cubin").write_bytes(b"hello")
    (d / "b.s").write_bytes(b"helloworld")
    (d / "k.bc").write_bytes(b"BC\xc0\xde" + bytes(range(60)))
    (d / "lto.o").write_bytes(b"BC\xc0\xde" + bytes(13))  # bitcode magic wins over the .o extension
    (d / "raw.bin").write_bytes(os.urandom(333))
    (d / "noext").write_bytes(b"x" * 9)
    (d / "x.cpp").write_text(SOURCE)
    cxx = llvm19("clang++")
    subprocess.run([str(cxx), "-fopenmp", "-fopenmp-targets=x86_64-unknown-linux-gnu", "-c", "x.cpp", "-o", "fat.o"],
                   cwd=d, check=True)
    subprocess.run([str(cxx), "-fopenmp", "--offload-arch=sm_80,gfx90a", "-nogpulib", "-c", "x.cpp", "-o", "gpu.o"],
                   cwd=d, check=True)
    subprocess.run([str(cxx), "-fopenmp", "-fopenmp-targets=x86_64-unknown-linux-gnu", "-flto", "-c", "x.cpp",
                    "-o", "fatlto.o"], cwd=d, check=True)
    subprocess.run([str(llvm19("llvm-ar")), "rcs", "libdev.a", "fat.o", "gpu.o"], cwd=d, check=True)
    subprocess.run([str(llvm19("clang-offload-packager")), "-o", "two.pkg",
                    "--image=file=a.cubin,triple=nvptx64-nvidia-cuda,arch=sm_80,kind=cuda",
                    "--image=file=b.s,triple=nvptx64-nvidia-cuda,arch=sm_70,kind=hip,feature=+ptx63,feature=+foo,mykey"],
                   cwd=d, check=True)
    return d


def differential(tool: Path, args: list[str], inputs: Path, tmp_path: Path, extra: list[str] = (),
                 stdin: bytes | None = None
                 ) -> tuple[subprocess.CompletedProcess[bytes], subprocess.CompletedProcess[bytes]]:
    """Run Clang's tool and ours with the same arguments in two empty directories; compare outputs."""
    results = []
    for name, cmd in (("clang", [tool]), ("ours", OURS + list(extra))):
        work = tmp_path / name
        work.mkdir()
        results.append(run(cmd + [a.replace("@", str(inputs) + "/") for a in args], work, stdin))
    clang, ours = results
    assert ours.returncode == clang.returncode, (ours.stderr, clang.stderr)
    assert tree(tmp_path / "ours") == tree(tmp_path / "clang"), args
    return clang, ours


BUNDLES = [
    ["-o", "out.pkg", "--image=file=@a.cubin,triple=nvptx64-nvidia-cuda,arch=sm_80,kind=cuda"],
    ["-o", "out.pkg", "--image=file=@a.cubin,file=@b.s,triple=nvptx64-nvidia-cuda,arch=sm_70,kind=openmp",
     "--image=file=@k.bc,triple=amdgcn-amd-amdhsa,arch=gfx90a:xnack+,kind=hip,feature=+xnack,feature=+sramecc"],
    ["-o", "out.pkg", "--image=triple=x86_64-unknown-linux-gnu,file=@raw.bin,arch=,kind=openmp,bare,k=v=w"],
    ["-o", "out.pkg", "--image=file=@lto.o,triple=nvptx64-nvidia-cuda,kind=bogus",
     "--image=file=@noext,triple=t,kind=cuda,kind=cuda"],
    ["-o", "out.pkg", "--image=file=@b.s,triple=t," + ",".join(f"key{i}=value{i}" for i in range(70))],
    ["-o=out.pkg", "-image=file=@a.cubin,triple=t,,=empty-key"],
]


@pytest.mark.parametrize("args", BUNDLES, ids=range(len(BUNDLES)))
def test_bundle_is_byte_identical_to_clang19(args: list[str], inputs: Path, tmp_path: Path, llvm19) -> None:
    differential(llvm19("clang-offload-packager"), args, inputs, tmp_path)


def test_bundle_llvm22_enums(inputs: Path, tmp_path: Path, llvm22) -> None:
    args = ["-o", "out.pkg", "--image=file=@k.bc,triple=amdgcn-amd-amdhsa,arch=gfx90a,kind=hip",
            "--image=file=@raw.bin,triple=spirv64-intel,kind=sycl"]
    differential(llvm22("llvm-offload-binary"), args, inputs, tmp_path, extra=["--llvm-version=22"])
    first, second = read_offload_binaries(tmp_path / "ours" / "out.pkg")
    assert (first.offload_kind, second.offload_kind) == (4, 8)


def test_bundle_from_stdin(inputs: Path, tmp_path: Path, llvm19) -> None:
    differential(llvm19("clang-offload-packager"), ["-o", "out.pkg", "--image=file=-,triple=t,arch=a"], inputs,
                 tmp_path, stdin=b"from standard input")


EXTRACTS = [
    ["@two.pkg", "--image=kind=cuda", "--image=triple=nvptx64-nvidia-cuda"],
    ["@two.pkg", "--image=feature=+ptx63,feature=+foo"],
    ["@two.pkg", "--image=triple=nvptx64-nvidia-cuda,file=both.bin"],  # warning; the last match wins
    ["@two.pkg", "--archive", "--image=triple=nvptx64-nvidia-cuda,file=two.a"],
    ["@fat.o", "--image=kind=openmp"],
    ["@gpu.o", "--image=arch=sm_80", "--image=arch=gfx90a,file=gfx90a.bc"],
    ["@gpu.o", "--archive", "--image=kind=openmp,file=dev.a"],  # symbol table from ELF and bitcode members
    ["@libdev.a", "--image=kind=openmp"],
    ["@libdev.a", "--archive", "--image=triple=amdgcn-amd-amdhsa,file=amd.a"],
    ["@fatlto.o", "--image=triple=x86_64-unknown-linux-gnu"],
    ["@fat.o", "--image=kind=cuda"],  # no match: nothing, exit 0
    ["@x.cpp", "--image=kind=openmp"],  # not an offload container: nothing, exit 0
    ["@two.pkg"],  # no --image: nothing
]


@pytest.mark.parametrize("args", EXTRACTS, ids=range(len(EXTRACTS)))
def test_extract_matches_clang19(args: list[str], inputs: Path, tmp_path: Path, llvm19) -> None:
    clang, ours = differential(llvm19("clang-offload-packager"), args, inputs, tmp_path)
    if b"warning" in clang.stderr:
        assert ours.stderr == b"offload-packager: warning: Multiple inputs match to a single file, 'both.bin'\n"


def test_extract_llvm22_names_hip(inputs: Path, tmp_path: Path, llvm22) -> None:
    work = tmp_path / "p"
    work.mkdir()
    subprocess.run([str(llvm22("llvm-offload-binary")), "-o", str(work / "h.pkg"),
                    f"--image=file={inputs}/k.bc,triple=amdgcn-amd-amdhsa,arch=gfx90a,kind=hip"], check=True)
    differential(llvm22("llvm-offload-binary"), [str(work / "h.pkg"), "--image=kind=hip"], inputs, tmp_path,
                 extra=["--llvm-version", "22"])
    assert list((tmp_path / "ours").iterdir())  # HIP=4 matched under LLVM 22's numbering


def test_in_process_main_and_console_script(inputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["-o", "x.pkg", f"--image=file={inputs}/b.s,triple=t"]) == 0
    assert read_offload_binaries(tmp_path / "x.pkg")[0].image_kind == 5
    assert main(["--help"]) == 0 and main(["--version"]) == 0
    assert main([]) == 0  # neither -o nor an input: nothing to do, as in Clang
    script = Path(sys.executable).with_name("offload-packager")
    assert script.exists(), "pyproject's console script is not installed: pip install -e ."
    assert run([script, "x.pkg", "--image=triple=t"], tmp_path).returncode == 0
    assert (tmp_path / "x-t-.0.s").read_bytes() == b"helloworld"


# --------------------------------------------------------------------------------------------------
# Errors: one line, exit 1, no traceback, nothing left behind.


def assert_one_line_error(result: subprocess.CompletedProcess[bytes], *needles: str) -> str:
    err = result.stderr.decode()
    assert result.returncode == 1, err
    assert err.count("\n") == 1 and err.startswith("offload-packager: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


@pytest.mark.parametrize("args,message", [
    (["-o", "o.pkg", "--image=file=@a.cubin"], "error: 'file' and 'triple' are required image arguments"),
    (["-o", "o.pkg", "@two.pkg"],
     "error: Packaging to an output file and extracting from an input file are mutually exclusive."),
    (["-o", "o.pkg", "--image=file=nope.o,triple=t"], "error: 'nope.o': No such file or directory"),
    (["@two.pkg", "--archive", "--image=kind=cuda"], "error: Image must have a 'file' argument."),
    (["missing.pkg", "--image=kind=cuda"], "error: 'missing.pkg': No such file or directory"),
    (["--bogus"], "Unknown command line argument '--bogus'"),
    (["-o"], "for the -o option: requires a value!"),
    (["a", "b"], "Too many positional arguments"),
    (["--llvm-version=12"], "--llvm-version"),
])
def test_cli_errors(args: list[str], message: str, inputs: Path, tmp_path: Path) -> None:
    result = run(OURS + [a.replace("@", str(inputs) + "/") for a in args], tmp_path)
    assert_one_line_error(result, message)
    assert list(tmp_path.iterdir()) == []


def test_failed_bundle_leaves_no_output(inputs: Path, tmp_path: Path) -> None:
    (tmp_path / "out.pkg").write_bytes(b"old contents")
    result = run(OURS + ["-o", "out.pkg", f"--image=file={inputs}/a.cubin,triple=t",
                         "--image=file=gone.cubin,triple=t"], tmp_path)
    assert_one_line_error(result, "'gone.cubin': No such file or directory")
    assert tree(tmp_path) == {"out.pkg": b"old contents"}  # untouched, no temporary files
    run(OURS + ["-o", "new.pkg", f"--image=file={inputs}/a.cubin,triple=t", "--image=file=gone.cubin,triple=t"],
        tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.pkg"]


def _corrupted(inputs: Path) -> dict[str, tuple[bytes, int]]:
    """Malformed inputs and the byte offset the error must name."""
    pkg = (inputs / "two.pkg").read_bytes()
    fat = (inputs / "fat.o").read_bytes()
    at = fat.index(b"\x10\xff\x10\xad")
    bad_fat = bytearray(fat)
    bad_fat[at + 0x30:at + 0x38] = (1 << 62).to_bytes(8, "little")  # absurd NumStrings
    bad_pkg = bytearray(pkg)
    bad_pkg[0x98 + 8:0x98 + 16] = (1 << 40).to_bytes(8, "little")  # second binary's Size past the end
    bad_utf8 = bytearray(pkg)
    bad_utf8[0x6a] = 0xFF  # inside the key "arch" of the first binary
    archive = (inputs / "libdev.a").read_bytes()
    return {
        "trunc.pkg": (pkg[:100], 8),
        "version.pkg": (pkg[:4] + b"\x02" + pkg[5:], 4),
        "size.pkg": (bytes(bad_pkg), 0x98 + 8),
        "utf8.pkg": (bytes(bad_utf8), 0x6a),
        "numstrings.o": (bytes(bad_fat), at + 0x30),
        "trunc.a": (archive[:len(archive) - 100], None),
    }


@pytest.mark.parametrize("name", ["trunc.pkg", "version.pkg", "size.pkg", "utf8.pkg", "numstrings.o", "trunc.a"])
def test_malformed_input_is_one_line_with_file_and_offset(name: str, inputs: Path, tmp_path: Path, llvm19) -> None:
    data, offset = _corrupted(inputs)[name]
    src = tmp_path / "src"
    src.mkdir()
    (src / name).write_bytes(data)
    work = tmp_path / "work"
    work.mkdir()
    result = run(OURS + [src / name, "--image=kind=openmp", "--image=kind=cuda", "--image=kind=hip"], work)
    err = assert_one_line_error(result, str(src / name), "offset 0x")
    if offset is not None:
        assert f"offset {offset:#x}:" in err
    assert list(work.iterdir()) == []
    if name not in ("utf8.pkg", "numstrings.o"):  # LLVM 19 does not check these (it would read out of bounds)
        clang = run([llvm19("clang-offload-packager"), src / name, "--image=kind=openmp"], work)
        assert clang.returncode == 1 and b"error:" in clang.stderr


# --------------------------------------------------------------------------------------------------
# Memory: streaming keeps the peak RSS flat.

_RUN = """
import sys
from offload_builders.cli.packager import main
mode, image, out = sys.argv[1:4]
if mode == "bundle":
    sys.exit(main(["-o", out, f"--image=file={image},triple=x86_64-unknown-linux-gnu,arch=,kind=openmp"]))
sys.exit(main([image, f"--image=kind=openmp,file={out}"]))
"""

# Linux keeps a process's RSS high-water mark across fork+exec, so a child forked straight from this
# (large) pytest process would report pytest's own peak. A small launcher forks the packager instead
# and reports getrusage(RUSAGE_CHILDREN): the packager's own peak.
_LAUNCH = """
import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def _peak_kib(mode: str, image: Path, out: Path) -> int:
    result = subprocess.run([sys.executable, "-c", _LAUNCH, sys.executable, "-c", _RUN, mode, str(image), str(out)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


def test_memory_stays_flat_for_a_256_mib_image(tmp_path: Path) -> None:
    small, big = tmp_path / "small.o", tmp_path / "big.o"
    small.write_bytes(b"\x7fELF" + bytes(60))
    with open(big, "wb") as f:  # sparse: costs no disk until copied
        f.write(b"\x7fELF")
        f.truncate(256 << 20)
    baseline = _peak_kib("bundle", small, tmp_path / "small.pkg")
    bundled = _peak_kib("bundle", big, tmp_path / "big.pkg")
    (binary,) = read_offload_binaries(tmp_path / "big.pkg")
    assert binary.image_size == 256 << 20
    (tmp_path / "small.pkg").unlink()
    big.unlink()
    extracted = _peak_kib("extract", tmp_path / "big.pkg", tmp_path / "again.o")
    assert (tmp_path / "again.o").stat().st_size == 256 << 20
    assert bundled - baseline < 16 << 10, (baseline, bundled)  # KiB: far below the 256 MiB image
    assert extracted - baseline < 16 << 10, (baseline, extracted)
    assert max(bundled, extracted) < 64 << 10, (bundled, extracted)
