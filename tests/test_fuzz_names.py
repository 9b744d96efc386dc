"""Names inside offload binaries and bundles are data, never paths: a mutation fuzz of the command-line tools.

Triples, arches, other string-table values of offload binaries, bundle entry IDs (binary, compressed, text and
object bundles) and archive member names are drawn from ``/``, ``..``, NUL, newline, escape sequences, 4 KB
values, valid names with those spliced in, and arbitrary text; the files carrying them are then mutated byte by
byte. Every tool that lists or extracts per-entry files runs on them in a sandbox:

* ``offload-bundler -list`` and ``-unbundle`` (every ``-type`` the carrier can be read as, ``-type=a`` too);
* ``offload-packager FILE --image=...`` extracting under ``file=`` and into an archive (under its own derived
  names, ``<stem>-<triple>-<arch>.<n>.<ext>``, in fixed cases: ``test_packager_derived_names_stay_in_the_directory``;
  a triple or arch that is no target name is one error there);
* ``offload-inspect`` (text, ``--json``, ``--extract``) and ``offload-select`` (AMDGPU, NVPTX and host devices);
* ``offload-link --dry-run`` (with and without ``--save-temps``), in a process of its own.

Each run must leave everything outside its output directory as it was (the directory above the sandbox, its
temporary directory and a victim directory are listed before and after; the output directory holds decoys a raw
path join would go through: a directory and a symbolic link to the victim named ``<stem>-t`` and ``<stem>-lnk``),
and end with exit status 0, or 1 and exactly one ``<prog>: error:`` line (``offload-select``: or its report of a
device without an image), never a traceback or an internal error (``test_known_internal_errors``: an ELF file
whose section table lies at 2**63 was one). Names shown on stdout or stderr
never carry a control character: a crafted file cannot forge lines of a listing or drive the terminal.
"""
from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from offload_builders.cli import (
    bundler as bundler_cli,
    inspect as inspect_cli,
    packager as packager_cli,
    select as select_cli,
)
from offload_builders.formats import bundle as B
from offload_builders.formats.compressed import CompressionOptions, compress_bytes
from offload_builders.formats.offload_binary import OffloadingImage, encode_offload_binary

PY = sys.executable
SHT_PROGBITS, SHT_STRTAB, SHT_LLVM_OFFLOADING = 1, 3, 0x6FFF4C0B
SHF_EXCLUDE = 0x80000000
HOST_ID = "host-x86_64-unknown-linux-gnu-"
#: Stands for a NUL in an offload binary's string (which OffloadingImage refuses to write); same length.
NUL_MARK, NUL_BYTES = "\U0010fffd", b"\0/.\0"

# --------------------------------------------------------------------------------------------------
# Names

#: Whole names that would steer a raw path join, or break a line-oriented output.
NASTY = ["..", "../..", ".", "", "/", "/tmp/ESCAPE", "../../../../ESCAPE", "t/../../ESCAPE",
         "t/../../../ESCAPE", "lnk/ESCAPE", "t.d.inputs/../../../../ESCAPE", "x\0y", NUL_MARK + "../ESCAPE",
         "x\ny", "\n", "\r", "\x1b[2J\x1b]0;pwned\x07", "a" * 4096, "../" * 1200 + "ESCAPE", "-", "--o", ":",
         "\\..\\..\\ESCAPE", "a:b/c", "é/../ESCAPE", "%s%n", " "]
#: Pieces spliced into valid names.
PIECES = ["/", "..", "../", "/..", "\0", NUL_MARK, "\n", "\x1b", "\\", "a" * 4096, "../" * 8, ":", " ", "\x7f"]
TRIPLES = ["amdgcn-amd-amdhsa", "nvptx64-nvidia-cuda", "x86_64-unknown-linux-gnu", "t"]
ARCHS = ["gfx90a:xnack+", "gfx90a", "sm_80", "d", ""]
IDS = ["hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+", "hip-amdgcn-amd-amdhsa--gfx908", "openmp-nvptx64-nvidia-cuda--sm_80",
       "hipv4-amdgcn-amd-amdhsa--gfx1030"]


def name_like(valid: list[str]) -> st.SearchStrategy[str]:
    spliced = st.tuples(st.sampled_from(valid), st.sampled_from(PIECES), st.integers(0, 64)).map(
        lambda t: t[0][:t[2]] + t[1] + t[0][t[2]:])
    text = st.text(st.characters(codec="utf-8"), max_size=12)
    return st.one_of(st.sampled_from(NASTY), st.sampled_from(valid), spliced, text)


# --------------------------------------------------------------------------------------------------
# Carriers: the files the names travel in


def amdgpu_elf_head() -> bytes:
    """The 64-byte header of an AMDGPU HSA code object (code object v5), which offload-select reads."""
    ident = b"\x7fELF\x02\x01\x01" + bytes([64, 3]) + bytes(7)
    return ident + struct.pack("<HHIQQQIHHHHHH", 3, 224, 1, 0, 0, 0, 0x30, 64, 0, 0, 64, 0, 0)


def elf_object(sections: list[tuple[bytes, int, bytes]]) -> bytes:
    """An x86-64 ELF relocatable object with these ``(name, type, data)`` sections (and ``.shstrtab``)."""
    shstrtab = b"\0"
    name_at = []
    for name, _, _ in sections:
        name_at.append(len(shstrtab))
        shstrtab += name + b"\0"
    own_name = len(shstrtab)
    shstrtab += b".shstrtab\0"
    body = bytearray(64)
    data_at = []
    for _, _, data in sections:
        body += bytes(-len(body) % 8)
        data_at.append(len(body))
        body += data
    strtab_at = len(body)
    body += shstrtab + bytes(-(len(body) + len(shstrtab)) % 8)
    shoff = len(body)
    headers = bytes(64)
    for (_, kind, data), name, at in zip(sections, name_at, data_at):
        flags = SHF_EXCLUDE if kind == SHT_LLVM_OFFLOADING or name else 0
        headers += struct.pack("<IIQQQQIIQQ", name, kind, flags, 0, at, len(data), 0, 0, 8, 0)
    headers += struct.pack("<IIQQQQIIQQ", own_name, SHT_STRTAB, 0, 0, strtab_at, len(shstrtab), 0, 0, 1, 0)
    count = len(sections) + 2
    body[:64] = b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, shoff, 0, 64, 0, 0,
                                                                 64, count, count - 1)
    return bytes(body) + headers


def gnu_archive(members: list[tuple[bytes, bytes]]) -> bytes:
    """A GNU archive; every member named through the ``//`` table, so any byte string can be a name."""
    table = b"".join(name + b"/\n" for name, _ in members)
    out = b"!<arch>\n"

    def header(name: bytes, size: int) -> bytes:
        return name.ljust(16) + b"0".ljust(12) + b"0".ljust(6) * 2 + b"644".ljust(8) + str(size).encode().ljust(10) + \
            b"`\n"

    out += header(b"//", len(table)) + table + b"\n" * (len(table) & 1)
    at = 0
    for name, data in members:
        out += header(f"/{at}".encode(), len(data)) + data + b"\n" * (len(data) & 1)
        at += len(name) + 2
    return out


def offload_binary(triple: str, arch: str, extra: str, image: bytes) -> bytes:
    strings = [("triple", triple), ("arch", arch), ("note", extra)]
    encoded = encode_offload_binary(OffloadingImage(image, 1, 1, 0, tuple((k, v.replace("\0", NUL_MARK))
                                                                           for k, v in strings)))
    return encoded.replace(NUL_MARK.encode(), NUL_BYTES)


def text_bundle(ids: list[str], comment: str = ";") -> bytes:
    start, end = B.text_markers(comment)
    return b"".join(start + i.encode(errors="surrogateescape") + b"\n" + b"payload\n" + end + i.encode() + b"\n"
                    for i in ids)


#: What each carrier is, which bundler -type values read it, and the name the file gets.
CARRIERS = ["pkg", "fat.o", "bundle.bc", "bundle.ccob", "bundle.ll", "objbundle.o", "lib.a"]
BUNDLE_TYPES = {"bundle.bc": ["bc", "o"], "bundle.ccob": ["bc"], "bundle.ll": ["ll"], "objbundle.o": ["o"],
                "lib.a": ["a"], "fat.o": ["o"], "pkg": ["bc"]}


def build(carrier: str, names: dict[str, str]) -> tuple[str, bytes]:
    """``(file name, bytes)`` of the carrier with the drawn names in it."""
    head = amdgpu_elf_head()
    pkg = (offload_binary(names["triple1"], names["arch1"], names["extra"], head + b"one")
           + offload_binary(names["triple2"], names["arch2"], "v", head + b"two"))
    ids = [HOST_ID, names["id1"], names["id2"]]
    if carrier == "pkg":
        return "pkg.pkg", pkg
    if carrier == "fat.o":
        return "fat.o", elf_object([(b".text", SHT_PROGBITS, b"\xc3"), (b".llvm.offloading", SHT_LLVM_OFFLOADING, pkg)])
    contents = [b"host", head + b"dev1", head + b"dev2"]
    if carrier in ("bundle.bc", "bundle.ccob"):
        header, offsets, _ = B.binary_layout(ids, [len(c) for c in contents], 8)
        data = bytearray(header)
        for offset, content in zip(offsets, contents):
            data += bytes(offset - len(data)) + content
        if carrier == "bundle.bc":
            return "bundle.bc", bytes(data)
        return "bundle.ccob", compress_bytes(bytes(data), CompressionOptions(version=2))
    if carrier == "bundle.ll":
        return "bundle.ll", text_bundle(ids)
    if carrier == "objbundle.o":
        sections = [(b".text", SHT_PROGBITS, b"\xc3")]
        sections += [(B.MAGIC + i.encode(), SHT_PROGBITS, c if n else b"\0")
                     for n, (i, c) in enumerate(zip(ids, contents))]
        return "objbundle.o", elf_object(sections)
    assert carrier == "lib.a"
    fat = elf_object([(b".llvm.offloading", SHT_LLVM_OFFLOADING, pkg)])
    header, offsets, _ = B.binary_layout(ids, [len(c) for c in contents], 1)
    bundle = header + b"".join(contents)
    member = names["member"].encode(errors="surrogateescape").replace(b"\n", b"_") or b"m"
    return "lib.a", gnu_archive([(member + b".o", fat), (member + b".bc", bundle)])


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(draw(st.integers(0, 3))):
        if not buf:
            break
        op = draw(st.sampled_from(["set", "truncate", "insert", "delete"]))
        at = draw(st.integers(0, len(buf) - 1))
        if op == "set":
            buf[at] = draw(st.integers(0, 255))
        elif op == "truncate":
            del buf[at:]
        elif op == "insert":
            buf[at:at] = draw(st.binary(min_size=1, max_size=9))
        else:
            del buf[at:at + draw(st.integers(1, 9))]
    return bytes(buf)


NAMES = st.fixed_dictionaries({"triple1": name_like(TRIPLES), "arch1": name_like(ARCHS),
                               "triple2": name_like(TRIPLES), "arch2": name_like(ARCHS), "extra": name_like(["v"]),
                               "id1": name_like(IDS), "id2": name_like(IDS), "member": name_like(["m", "dir/m"])})


# --------------------------------------------------------------------------------------------------
# The sandbox


class Sandbox:
    """``root/`` (listed) holding ``in/`` (inputs), ``out/`` (the output directory and working directory, with
    decoys), ``tmp/`` (TMPDIR: must be empty after every run) and ``victim/`` (where the decoy link points)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.inputs, self.out, self.tmp, self.victim = (root / "sandbox" / "in", root / "sandbox" / "out",
                                                        root / "sandbox" / "tmp", root / "victim")
        for path in (self.inputs, self.tmp, self.victim):
            path.mkdir(parents=True, exist_ok=True)
        (self.victim / "keep").write_text("victim\n")
        self.reset()

    def reset(self) -> None:
        """An empty output directory with the decoys, nothing in the inputs and the temporary directory."""
        for path in (self.out, self.inputs):
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir()
        for entry in os.listdir(self.tmp):
            shutil.rmtree(self.tmp / entry, ignore_errors=True)
        for stem in ("pkg", "fat", "bundle", "objbundle", "lib", "a.out"):
            (self.out / f"{stem}-t").mkdir()
            (self.out / f"{stem}-lnk").symlink_to(self.victim)
        (self.out / "t.d.inputs").mkdir()

    def snapshot(self) -> dict[str, tuple[object, ...]]:
        """Everything under the root but the output directory: type, size, mode, mtime, link target."""
        seen: dict[str, tuple[object, ...]] = {}
        for top, dirs, files in os.walk(self.root, followlinks=False):
            if Path(top) == self.out:
                dirs[:] = []
                continue
            for name in dirs + files:
                path = os.path.join(top, name)
                if Path(path) == self.out:
                    continue
                info = os.lstat(path)
                if Path(path) == self.tmp:  # temporary files come and go (run_tool checks it is left empty)
                    seen["sandbox/tmp"] = (stat.S_IFMT(info.st_mode), info.st_mode)
                    continue
                target = os.readlink(path) if stat.S_ISLNK(info.st_mode) else None
                seen[os.path.relpath(path, self.root)] = (stat.S_IFMT(info.st_mode), info.st_size, info.st_mode,
                                                          info.st_mtime_ns, target)
        return seen


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Sandbox:
    return Sandbox(tmp_path_factory.mktemp("fuzz-names"))


_CONTROL = {chr(c) for c in range(32) if chr(c) not in "\n\t"} | {"\x7f"}


def check_outcome(prog: str, argv: list[str], rc: int, out: str, err: str) -> None:
    where = f"{prog} {' '.join(map(ascii, argv))}"
    assert rc in (0, 1), (where, rc, err)
    assert "Traceback" not in err, (where, err)
    assert "internal error" not in err, (where, err)
    lines = err.splitlines()
    errors = [line for line in lines if line.startswith(f"{prog}: error:")]
    if rc == 1:
        if prog == "offload-select" and not errors:  # its report of a device without an image (in JSON, none)
            assert lines or "--json" in argv, (where, err)
            assert all(line.startswith((f"{prog}: ", "  ")) for line in lines), (where, err)
        else:
            assert len(errors) == 1, (where, err)
            assert len(lines) == 1 or prog == "offload-link", (where, err)  # the link may print commands first
    else:
        assert not errors, (where, err)
    bad = sorted({ch for ch in out + err if ch in _CONTROL})
    assert not bad, (where, "control characters in the output", bad, out[-500:], err[-500:])


@contextlib.contextmanager
def _in_process(cwd: Path, tmp: Path):
    """The working directory, TMPDIR and the standard streams of a tool run in this process."""
    old_cwd, old_tempdir = os.getcwd(), tempfile.tempdir
    stdout = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="surrogateescape")
    stderr = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="surrogateescape")
    os.chdir(cwd)
    tempfile.tempdir = str(tmp)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            yield stdout, stderr
    finally:
        os.chdir(old_cwd)
        tempfile.tempdir = old_tempdir


def run_tool(sandbox: Sandbox, prog: str, main: Callable[[list[str]], int], argv: list[str]) -> tuple[int, str]:
    """Run a tool in this process in the sandbox; check the outcome and that nothing outside ``out/`` changed."""
    rc, out, _ = run_tool_capture(sandbox, prog, main, argv)
    return rc, out


def run_tool_capture(sandbox: Sandbox, prog: str, main: Callable[[list[str]], int],
                     argv: list[str]) -> tuple[int, str, str]:
    """:func:`run_tool`, returning stderr too."""
    before = sandbox.snapshot()
    with _in_process(sandbox.out, sandbox.tmp) as (stdout, stderr):
        rc = main(argv)
    stdout.flush()
    stderr.flush()
    out = stdout.buffer.getvalue().decode("utf-8", "replace")  # type: ignore[attr-defined]
    err = stderr.buffer.getvalue().decode("utf-8", "replace")  # type: ignore[attr-defined]
    after = sandbox.snapshot()
    assert after == before, (prog, argv, "changed outside the output directory",
                             sorted(set(after.items()) ^ set(before.items())))
    assert not os.listdir(sandbox.tmp), (prog, argv, "left temporary files", os.listdir(sandbox.tmp))
    check_outcome(prog, argv, rc, out, err)
    return rc, out, err


def exercise(sandbox: Sandbox, file_name: str, data: bytes) -> None:
    """Every listing and extraction of the file ``data`` named ``file_name`` in the sandbox, each checked."""
    carrier = {"pkg.pkg": "pkg"}.get(file_name, file_name)
    source = sandbox.inputs / file_name
    source.write_bytes(data)
    src = str(source)
    for file_type in BUNDLE_TYPES[carrier]:
        rc, listed = run_tool(sandbox, "offload-bundler", bundler_cli.main, ["-list", f"-type={file_type}",
                                                                             f"-input={src}"])
        ids = [HOST_ID, *[i for i in dict.fromkeys(listed.splitlines()) if i != HOST_ID][:2]]
        suffix = ".a" if file_type == "a" else ""
        run_tool(sandbox, "offload-bundler", bundler_cli.main,
                 ["-unbundle", f"-type={file_type}", f"-input={src}", "-targets=" + ",".join(ids),
                  *[f"-output={sandbox.out / f'unbundled{n}{suffix}'}" for n in range(len(ids))],
                  "-allow-missing-bundles"])
    if carrier in ("pkg", "fat.o", "lib.a"):
        # Extraction under the packager's own names (<stem>-<triple>-<arch>...) is left out: it joins them raw
        # (see test_packager_derived_names_stay_in_the_directory).
        run_tool(sandbox, "offload-packager", packager_cli.main, [src, "--image=file=chosen.img,kind=openmp"])
        run_tool(sandbox, "offload-packager", packager_cli.main, [src, "--image=file=images.a,kind=openmp",
                                                                  "--archive"])
    run_tool(sandbox, "offload-inspect", inspect_cli.main, [src])
    run_tool(sandbox, "offload-inspect", inspect_cli.main, ["--json", src])
    run_tool(sandbox, "offload-inspect", inspect_cli.main, [f"--extract={sandbox.out / 'extracted'}", src])
    for device in ("gfx90a:xnack+", "sm_80", "x86_64"):
        run_tool(sandbox, "offload-select", select_cli.main, [f"--device={device}", src])
    run_tool(sandbox, "offload-select", select_cli.main, ["--device=gfx90a:xnack+", "--json", src])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(carrier=st.sampled_from(CARRIERS), names=NAMES, data=st.data())
def test_names_never_steer_where_the_tools_write(sandbox: Sandbox, carrier: str, names: dict[str, str],
                                                 data: st.DataObject) -> None:
    sandbox.reset()
    file_name, raw = build(carrier, names)
    if data.draw(st.booleans(), label="mutate"):
        raw = data.draw(mutated(raw), label="mutated")
    exercise(sandbox, file_name, raw)


# --------------------------------------------------------------------------------------------------
# Fixed cases: the names of the issue, and the tools as processes


BASE_NAMES = {"triple1": "amdgcn-amd-amdhsa", "arch1": "gfx90a:xnack+", "triple2": "nvptx64-nvidia-cuda",
              "arch2": "sm_80", "extra": "v", "id1": IDS[0], "id2": IDS[2], "member": "m"}
FIXED = {
    "slashes": {"triple1": "t/../../ESCAPE", "arch1": "lnk/ESCAPE", "triple2": "/tmp/ESCAPE", "arch2": "../..",
                "id1": "hipv4-amdgcn-amd-amdhsa--gfx90a/../../ESCAPE", "id2": "../../../../ESCAPE",
                "member": "../../ESCAPE"},
    "control": {"triple1": "amdgcn-amd-amdhsa\n", "arch1": "gfx90a\x1b[2J", "triple2": "x\0y", "arch2": "\r",
                "id1": "hipv4-amdgcn-amd-amdhsa--gfx90a\n", "id2": "a\0b", "member": "x\ny", "extra": "\x07"},
    "long": {"triple1": "a" * 4096, "arch1": "b" * 4096, "id1": "hipv4-amdgcn-amd-amdhsa--" + "c" * 4096,
             "member": "m" * 4096, "extra": "../" * 1400},
}


@pytest.mark.parametrize("carrier", CARRIERS)
@pytest.mark.parametrize("case", sorted(FIXED))
def test_fixed_names_in_every_carrier(sandbox: Sandbox, carrier: str, case: str) -> None:
    sandbox.reset()
    file_name, raw = build(carrier, {**BASE_NAMES, **FIXED[case]})
    exercise(sandbox, file_name, raw)


#: The packager names what it extracts ``<stem>-<triple>-<arch>.<index>.<ext>`` (as clang-offload-packager does)
#: from the binary's strings, joined raw; ``atomic_output`` then makes its temporary file next to the *lexically*
#: normalized path (``os.path.abspath``), so even a name whose directories do not exist puts a file outside first.
PACKAGER_ESCAPES = {
    "through-a-directory": {"triple1": "t/../../ESCAPE"},  # out/pkg-t exists: the image lands in the sandbox
    "through-a-link": {"triple1": "lnk/ESCAPE"},  # out/pkg-lnk -> victim/: the image lands in the victim
    "temporary-outside": {"triple1": "nonexistent/../../ESCAPE"},  # fails, after a temporary file above out/
}


@pytest.mark.parametrize("case", sorted(PACKAGER_ESCAPES))
def test_packager_derived_names_stay_in_the_directory(sandbox: Sandbox, case: str) -> None:
    sandbox.reset()
    file_name, raw = build("pkg", {**BASE_NAMES, **PACKAGER_ESCAPES[case]})
    source = sandbox.inputs / file_name
    source.write_bytes(raw)
    run_tool(sandbox, "offload-packager", packager_cli.main, [str(source), "--image=kind=openmp"])


def _huge_section_table_offset() -> bytes:
    """An ELF object whose e_shoff is 2**63 and e_shnum 0 (so the count is read from section 0 first)."""
    raw = bytearray(elf_object([(b".text", SHT_PROGBITS, b"\xc3")]))
    struct.pack_into("<Q", raw, 40, 1 << 63)
    struct.pack_into("<H", raw, 60, 0)
    return bytes(raw)


@pytest.mark.parametrize("prog", ["offload-inspect", "offload-select", "offload-packager"])
def test_known_internal_errors(sandbox: Sandbox, prog: str) -> None:
    sandbox.reset()
    source = sandbox.inputs / "shoff.o"
    source.write_bytes(_huge_section_table_offset())
    main, args = {"offload-inspect": (inspect_cli.main, []), "offload-select": (select_cli.main, ["--device=gfx90a"]),
                  "offload-packager": (packager_cli.main, ["--image=file=x,kind=openmp"])}[prog]
    _, _, err = run_tool_capture(sandbox, prog, main, [*args, str(source)])
    assert err.startswith(f"{prog}: error: ") and "internal error" not in err, err


# --------------------------------------------------------------------------------------------------
# offload-link (a process per run: it runs the driver's probes and prints its commands)

SCRIPTS = Path(sys.executable).parent


def run_process(sandbox: Sandbox, prog: str, argv: list[str]) -> tuple[int, str]:
    """Run the console script ``prog`` in ``out/`` with TMPDIR in the sandbox; check as :func:`run_tool` does."""
    before = sandbox.snapshot()
    env = {**os.environ, "TMPDIR": str(sandbox.tmp)}
    done = subprocess.run([str(SCRIPTS / prog), *argv], cwd=sandbox.out, env=env, capture_output=True)
    out, err = done.stdout.decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace")
    after = sandbox.snapshot()
    assert after == before, (prog, argv, "changed outside the output directory",
                             sorted(set(after.items()) ^ set(before.items())))
    assert not os.listdir(sandbox.tmp), (prog, argv, "left temporary files", os.listdir(sandbox.tmp))
    check_outcome(prog, argv, done.returncode, out, err)
    return done.returncode, out


def exercise_link(sandbox: Sandbox, file_name: str, data: bytes) -> None:
    source = sandbox.inputs / file_name
    source.write_bytes(data)
    for extra in ([], ["--save-temps"]):
        run_process(sandbox, "offload-link", ["--linker-path=/bin/true", "--dry-run", *extra, "--",
                                              "-o", str(sandbox.out / "a.out"), str(source)])


LINK_CASES = {
    # The package: the first image makes <out>.t.d.inputs/, the second's triple climbs out through it.
    "issue-28": {"triple1": "t", "arch1": "d", "triple2": "t.d.inputs/../../../../ESCAPE", "arch2": "x"},
    "through-a-link": {"triple1": "t", "arch1": "d", "triple2": "lnk/ESCAPE"},
    "valid": {},
}


@pytest.mark.parametrize("carrier", ["fat.o", "lib.a"])
@pytest.mark.parametrize("case", sorted(LINK_CASES))
def test_link_names_stay_in_the_output_directory(sandbox: Sandbox, carrier: str, case: str) -> None:
    sandbox.reset()
    (sandbox.out / "a.out.t.d.inputs").mkdir(exist_ok=True)
    (sandbox.out / "a.out.lnk").symlink_to(sandbox.victim)
    file_name, raw = build(carrier, {**BASE_NAMES, **LINK_CASES[case]})
    exercise_link(sandbox, file_name, raw)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(carrier=st.sampled_from(["fat.o", "lib.a"]), names=NAMES, data=st.data())
def test_link_fuzzed_names_stay_in_the_output_directory(sandbox: Sandbox, carrier: str, names: dict[str, str],
                                                        data: st.DataObject) -> None:
    sandbox.reset()
    (sandbox.out / "a.out.t.d.inputs").mkdir(exist_ok=True)
    file_name, raw = build(carrier, names)
    if data.draw(st.booleans(), label="mutate"):
        raw = data.draw(mutated(raw), label="mutated")
    exercise_link(sandbox, file_name, raw)
