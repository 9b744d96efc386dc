"""Crafted and unusual link inputs (issue 28, defects 2 and 6).

* Defect 2: ``offload-link`` named its per-target files after the triple and arch inside the input's offload
  binary, so a crafted package (``triple=t, arch=d``, then ``triple=t.d.inputs/../../../escape/OUTSIDE``) wrote
  attacker bytes outside its temporary directory. Names from input data now pass a check first (one line, before
  anything is written) and unpacked device files are created without following symbolic links.
* Defect 6: a thin archive (``llvm-ar rcT``, what Meson makes of internal static libraries) holds only its
  members' names; its device code was never read, the link succeeded and the program failed at start ("Failed to
  load kernel"). Archives are now read as the host linker reads them, and the entry checks cover the archive
  members the host link takes, so a program never links without the device code its entries name.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from offload_builders import linking
from offload_builders.errors import OffloadFormatError
from offload_builders.formats.containers import archive_members, extract_offload_binaries
from offload_builders.formats.offload_binary import (
    ImageKind,
    OffloadingImage,
    OffloadKind,
    encode_offload_binary,
    kind_table,
)

LLVM = Path("/usr/lib/llvm-19/bin")
X86 = "x86_64-unknown-linux-gnu"
RUN_ENV = dict(os.environ, OMP_TARGET_OFFLOAD="MANDATORY", LD_LIBRARY_PATH="/usr/lib/llvm-19/lib")
LINK = [sys.executable, "-m", "offload_builders.cli.link"]


# --------------------------------------------------------------------------------------------------
# Defect 2: names inside offload binaries never become paths.


def _package(images: list[tuple[str, str]], nul: str | None = None) -> bytes:
    """Offload binaries (OpenMP, object images of junk bytes) with these (triple, arch) strings, back to back.
    ``nul``: a marker in a string that becomes a NUL byte (which the writer refuses to store)."""
    table = kind_table(19)
    data = b"".join(encode_offload_binary(OffloadingImage(
        f"image {index}".encode() * 8, table.image_value(ImageKind.OBJECT), table.offload_value(OffloadKind.OPENMP),
        strings=(("triple", triple), ("arch", arch)))) for index, (triple, arch) in enumerate(images))
    if nul is not None:
        marker = nul.encode()
        assert marker in data
        data = data.replace(marker, b"\0" + marker[1:])
    return data


def _fat_object(directory: Path, package: bytes, name: str = "crafted.o") -> Path:
    """A host object whose ``.llvm.offloading`` section holds ``package`` (the driver's own embedding)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "package.bin").write_bytes(package)
    (directory / "empty.c").write_text("int host_symbol = 1;\n")
    subprocess.run([str(LLVM / "clang"), "-c", "empty.c", "-Xclang", "-fembed-offload-object=package.bin",
                    "-o", name], cwd=directory, check=True)
    return directory / name


def _snapshot(root: Path, skip: Path | None = None) -> dict[str, tuple]:
    """Every entry under ``root`` (not following links; ``skip`` left out) with its type, size and mtime."""
    entries = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory) / name
            if skip is not None and (path == skip or skip in path.parents):
                continue
            status = path.lstat()
            entries[str(path.relative_to(root))] = (status.st_mode, status.st_size, status.st_mtime_ns)
    return entries


@pytest.fixture
def sandbox(tmp_path) -> Path:
    """``input/`` (the crafted object), ``tmp/`` ($TMPDIR), ``out/`` (the output's directory) and ``escape/``,
    where the issue's package wrote; a ``victim`` file beside them."""
    for name in ("input", "tmp", "out", "escape"):
        (tmp_path / name).mkdir()
    (tmp_path / "victim").write_text("do not touch\n")
    return tmp_path


def _offload_link(sandbox: Path, obj: Path, *extra: str) -> subprocess.CompletedProcess:
    argv = [*LINK, f"--host-triple={X86}", f"--linker-path={LLVM / 'ld.lld'}", *extra, "-o",
            str(sandbox / "out" / "prog"), str(obj)]
    return subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, TMPDIR=str(sandbox / "tmp")))


def _one_error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("offload-link: error: "), done.stderr
    return lines[0]


def _assert_nothing_written_outside(sandbox: Path, before: dict[str, tuple], save_temps: bool) -> None:
    """Outside ``out/`` nothing changed (``tmp/`` holds nothing new: the temporary directory is gone); in
    ``out/``, only files named after the output, directly in it."""
    assert _snapshot(sandbox, skip=sandbox / "out") == {k: v for k, v in before.items() if not k.startswith("out")}
    for name in _snapshot(sandbox / "out"):
        assert save_temps and name.split(os.sep)[0].startswith("prog."), name


@pytest.mark.parametrize("save_temps", [False, True], ids=["temporary-directory", "save-temps"])
def test_the_issues_package_writes_nothing_outside_and_fails_in_one_line(sandbox, save_temps):
    """The issue's repro: the first image makes ``<stem>.t.d.inputs/``, through which the second image's triple
    led to ``escape/`` (three levels up from the temporary directory, two from the output's)."""
    up = "../" * (2 if save_temps else 3)
    obj = _fat_object(sandbox / "input", _package([("t", "d"), (f"t.d.inputs/{up}escape/OUTSIDE", "x")]))
    before = _snapshot(sandbox)
    done = _offload_link(sandbox, obj, *(["--save-temps"] if save_temps else []))
    line = _one_error_line(done)
    assert "is not a target name" in line and "crafted.o" in line
    assert not list((sandbox / "escape").iterdir())
    _assert_nothing_written_outside(sandbox, before, save_temps)


_BAD_NAMES = {
    "slash": "a/b",
    "dot-dot": "..",
    "traversal": "../../escape/OUTSIDE",
    "nul": "t/@NUL@x",  # read up to the NUL: "t/"
    "nul-dot-dot": "..@NUL@/x",  # read up to the NUL: ".."
    "newline": "x86_64\n../../escape/OUTSIDE",
    "4KB": "A" * 4096,
    "4KB-traversal": "../" * 1366,
}


@pytest.mark.parametrize("field", ["triple", "arch"])
@pytest.mark.parametrize("name", list(_BAD_NAMES))
def test_names_with_slashes_dots_nul_or_4kb_are_refused_before_anything_is_written(sandbox, field, name):
    value = _BAD_NAMES[name]
    image = (value, "d") if field == "triple" else (X86, value)
    obj = _fat_object(sandbox / "input", _package([image], nul="@NUL" if "@NUL@" in value else None))
    before = _snapshot(sandbox)
    line = _one_error_line(_offload_link(sandbox, obj, "--save-temps"))
    assert f"the device image's {field} " in line and "is not a target name" in line
    assert len(line) < 600  # a 4 KB name is cut short in the message
    _assert_nothing_written_outside(sandbox, before, save_temps=True)
    assert not list((sandbox / "out").iterdir())


def test_targets_whose_names_would_collide_get_files_of_their_own(sandbox):
    """``t`` + ``d.x`` and ``t.d`` + ``x`` are both target names and both give ``prog.t.d.x``: each target keeps
    its own device input file (``--dry-run`` prints the commands and runs none)."""
    obj = _fat_object(sandbox / "input", _package([("t", "d.x"), ("t.d", "x")]))
    done = _offload_link(sandbox, obj, "--save-temps", "--dry-run")
    assert done.returncode == 0, done.stderr
    out = sandbox / "out"
    first, second = (linking.read_device_inputs(out / name) for name in ("prog.t.d.x.devin", "prog.t.d.x.1.devin"))
    assert [(b.triple, b.arch) for b in first + second] == [("t", "d.x"), ("t.d", "x")]
    assert (out / "prog.t.d.x.inputs" / "000.o").read_bytes() != (out / "prog.t.d.x.1.inputs" / "000.o").read_bytes()


def test_unpacked_device_files_replace_symbolic_links_rather_than_follow_them(sandbox):
    obj = _fat_object(sandbox / "input", _package([(X86, "")]))
    scanned = linking.scan_link_inputs([str(obj)])
    device_inputs = sandbox / "out" / "prog.devin"
    linking.write_device_inputs(linking.select_device_files(scanned, (X86, "")), device_inputs)
    directory = sandbox / "out" / "prog.inputs"
    directory.mkdir()
    (directory / "000.o").symlink_to(sandbox / "victim")
    assert linking.unpack_device_inputs(device_inputs, directory) == [str(directory / "000.o")]
    assert (sandbox / "victim").read_text() == "do not touch\n"
    assert not (directory / "000.o").is_symlink() and (directory / "000.o").read_bytes().startswith(b"image 0")
    # A directory that is a symbolic link is not written through either.
    elsewhere = sandbox / "out" / "elsewhere.inputs"
    elsewhere.symlink_to(sandbox / "escape", target_is_directory=True)
    with pytest.raises(OSError):
        linking.unpack_device_inputs(device_inputs, elsewhere)
    assert not list((sandbox / "escape").iterdir())


# --------------------------------------------------------------------------------------------------
# Defect 6: thin archives, and the entry checks over archive members.

HEAT = textwrap.dedent("""
    #include <cstddef>
    void heat_step(double *a, std::size_t n) {
    #pragma omp target teams distribute parallel for map(tofrom : a[0 : n])
      for (std::size_t i = 0; i < n; ++i) a[i] += 1.0;
    }
""")
TOTAL = textwrap.dedent("""
    #include <cstddef>
    double total(const double *a, std::size_t n) {
      double s = 0;
    #pragma omp target teams distribute parallel for reduction(+ : s) map(to : a[0 : n])
      for (std::size_t i = 0; i < n; ++i) s += a[i];
      return s;
    }
""")
MAIN = textwrap.dedent("""
    #include <cstddef>
    #include <cstdio>
    #include <omp.h>
    void heat_step(double *a, std::size_t n);
    double total(const double *a, std::size_t n);
    int main() {
      static double a[1000];
      for (int step = 0; step < 3; ++step) heat_step(a, 1000);
      const double t = total(a, 1000);
      int on_device = 0;
    #pragma omp target map(from : on_device)
      on_device = !omp_is_initial_device();
      std::printf("on_device=%d total=%g\\n", on_device, t);
      return on_device && t == 3000.0 ? 0 : 1;
    }
""")


@pytest.fixture(scope="module")
def objects(tmp_path_factory) -> Path:
    """heat.o and total.o (OpenMP target regions, x86_64 host device), main.o (calling them, and a region of its
    own) and plain.o (main.cpp without OpenMP), each compiled once by the Clang 19 driver."""
    work = tmp_path_factory.mktemp("thin")
    for name, text in (("heat", HEAT), ("total", TOTAL), ("main", MAIN)):
        (work / f"{name}.cpp").write_text(text)
        subprocess.run([str(LLVM / "clang++"), "-fopenmp", f"-fopenmp-targets={X86}", "-O1", "-c", f"{name}.cpp",
                        "-o", f"{name}.o"], cwd=work, check=True)
    subprocess.run([str(LLVM / "clang++"), "-O1", "-c", "main.cpp", "-o", "plain.o"], cwd=work, check=True)
    return work


def _archive(work: Path, name: str, members: list[str], thin: bool = True) -> Path:
    (work / name).unlink(missing_ok=True)
    subprocess.run([str(LLVM / "llvm-ar"), "rcT" if thin else "rc", name, *members], cwd=work, check=True)
    return work / name


def _link_args() -> list[str]:
    done = subprocess.run([*LINK, "--print-link-args"], capture_output=True, text=True, check=True)
    return done.stdout.split()


def _driver_link(work: Path, inputs: list[str], output: str) -> subprocess.CompletedProcess:
    """``clang++`` linking through ``offload-link`` (the flags ``--print-link-args`` gives, as Meson links)."""
    return subprocess.run([str(LLVM / "clang++"), *_link_args(), f"-Wl,-rpath,{LLVM.parent / 'lib'}", *inputs,
                           "-o", output], cwd=work, capture_output=True, text=True)


def _offload_link_error(done: subprocess.CompletedProcess) -> str:
    """The one ``offload-link`` line of a failed driver link (the driver adds its own)."""
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if "offload-link" in line]
    assert len(lines) == 1 and lines[0].startswith("offload-link: error: "), done.stderr
    return lines[0]


def test_a_thin_archives_device_code_is_read_from_its_members_files(objects):
    thin = _archive(objects, "libthin.a", ["heat.o", "total.o"])
    assert thin.read_bytes().startswith(b"!<thin>\n")
    found = extract_offload_binaries(thin)
    assert [(f.origin.file, f.binary.triple) for f in found] == [(str(objects / "heat.o"), X86),
                                                                 (str(objects / "total.o"), X86)]
    assert [(m.label, m.file, m.thin) for m in archive_members(thin)] == [
        (f"{thin}(heat.o)", str(objects / "heat.o"), True), (f"{thin}(total.o)", str(objects / "total.o"), True)]
    scanned = linking.scan_link_inputs([str(objects / "main.o"), str(thin)])
    assert len(scanned.archive_members) == 2
    chosen = linking.select_device_files(scanned, (X86, ""))
    assert {f.origin.file for f in chosen} == {str(objects / name) for name in ("main.o", "heat.o", "total.o")}
    assert [obj.path for obj in scanned.linked_members()] == [f"{thin}(heat.o)", f"{thin}(total.o)"]
    assert linking.offload_kinds([str(thin)], 19) == {"openmp"}


def test_a_thin_member_in_a_subdirectory_is_found_relative_to_the_archive(objects, tmp_path, monkeypatch):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "heat.o").write_bytes((objects / "heat.o").read_bytes())
    thin = _archive(tmp_path / "lib", "libheat.a", ["heat.o"])
    monkeypatch.chdir(objects)  # not where the member is
    assert [f.origin.file for f in extract_offload_binaries(thin)] == [str(tmp_path / "lib" / "heat.o")]


def test_a_program_from_a_thin_archive_links_and_runs(objects):
    _archive(objects, "libthin.a", ["heat.o", "total.o"])
    done = _driver_link(objects, ["main.o", "libthin.a"], "from_thin")
    assert done.returncode == 0, done.stderr
    run = subprocess.run([str(objects / "from_thin")], capture_output=True, text=True, env=RUN_ENV)
    assert (run.returncode, run.stdout) == (0, "on_device=1 total=3000\n"), run.stderr


def test_a_missing_thin_member_is_one_error_naming_the_archive_and_the_member(objects, tmp_path):
    (tmp_path / "gone.o").write_bytes((objects / "heat.o").read_bytes())
    thin = _archive(tmp_path, "libgone.a", ["gone.o"])
    (tmp_path / "gone.o").unlink()
    with pytest.raises(OffloadFormatError, match=r"libgone\.a: offset 0x[0-9a-f]+: thin archive member 'gone\.o' "
                                                 r"is missing"):
        linking.scan_link_inputs([str(objects / "main.o"), str(thin)])
    line = _offload_link_error(_driver_link(objects, ["main.o", str(thin)], "from_gone"))
    assert "libgone.a" in line and "'gone.o' is missing" in line


def test_a_thin_member_that_is_a_fifo_is_refused_without_blocking(objects, tmp_path):
    os.mkfifo(tmp_path / "pipe.o")
    thin = tmp_path / "libpipe.a"
    # llvm-ar will not archive a FIFO: the archive is the one of a regular file whose place the FIFO took.
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "pipe.o").write_bytes((objects / "heat.o").read_bytes())
    _archive(tmp_path / "real", "libpipe.a", ["pipe.o"])
    thin.write_bytes((tmp_path / "real" / "libpipe.a").read_bytes())
    with pytest.raises(OffloadFormatError, match="thin archive member 'pipe.o' cannot be read .*not a regular file"):
        extract_offload_binaries(thin)


def test_a_member_with_entries_but_no_device_code_stops_the_link_in_one_line(objects):
    """heat.o without its ``.llvm.offloading`` section, in a thin archive the program takes it from: Clang links
    it, and the program fails at start."""
    subprocess.run([str(LLVM / "llvm-objcopy"), "--remove-section", ".llvm.offloading", "heat.o", "heat_host.o"],
                   cwd=objects, check=True)
    _archive(objects, "libstripped.a", ["heat_host.o", "total.o"])
    line = _offload_link_error(_driver_link(objects, ["main.o", "libstripped.a"], "from_stripped"))
    assert f"libstripped.a(heat_host.o): has offload entries but no device code for {X86}" in line
    assert not (objects / "from_stripped").exists()
    # A member the program does not take is not the link's business.
    done = _driver_link(objects, ["main.o", "heat.o", "total.o", "libstripped.a"], "not_taken")
    assert done.returncode == 0, done.stderr


def test_a_member_whose_device_code_lacks_its_entries_stops_the_link_in_one_line(objects):
    """heat.o carrying total.o's device code, in a regular archive: the image lacks heat_step's kernel."""
    subprocess.run([str(LLVM / "llvm-objcopy"), "--dump-section", ".llvm.offloading=total.pkg", "total.o"],
                   cwd=objects, check=True)
    subprocess.run([str(LLVM / "llvm-objcopy"), "--update-section", ".llvm.offloading=total.pkg", "heat.o",
                    "heat_other.o"], cwd=objects, check=True)
    _archive(objects, "libother.a", ["heat_other.o", "total.o"], thin=False)
    line = _offload_link_error(_driver_link(objects, ["main.o", "libother.a"], "from_other"))
    assert "libother.a(heat_other.o): registers the offload entry __omp_offloading_" in line
    assert "heat_step" in line and not (objects / "from_other").exists()


def test_library_entries_in_a_program_without_device_code_stop_the_link_in_one_line(objects):
    """main.cpp compiled without offload flags: Clang 19 takes no device code from the library (only targets a
    regular input has), so the program would have no image for the library's regions."""
    _archive(objects, "libthin.a", ["heat.o", "total.o"])
    line = _offload_link_error(_driver_link(objects, ["plain.o", "libthin.a"], "from_plain"))
    assert "libthin.a(heat.o), " in line and "no object of the link has device code" in line
