"""``offload-bundler`` as a drop-in for ``clang-offload-bundler`` 19: spellings, environment variables,
validation messages and the error contract (one line on stderr, exit 1, no traceback, no output).
"""
from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from offload_builders.cli.bundler import main
from offload_builders.formats import bundle as B
from offload_builders.formats.compressed import CompressionOptions, compress_bytes

HOST = "host-x86_64-unknown-linux-gnu"
GFX908 = "hip-amdgcn-amd-amdhsa--gfx908"
GFX90A = "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+"
TARGETS = f"{HOST},{GFX90A},{GFX908}"
CLEAN_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def ours(args: list, env: dict | None = None, stdin: bytes | None = None, cwd: Path | None = None):
    return subprocess.run([sys.executable, "-m", "offload_builders.cli.bundler", *map(str, args)],
                          capture_output=True, env={**CLEAN_ENV, **(env or {})}, input=stdin, cwd=cwd)


def clang(bundler: Path, args: list, env: dict | None = None, cwd: Path | None = None):
    return subprocess.run([str(bundler), *map(str, args)], capture_output=True, env={**CLEAN_ENV, **(env or {})},
                          cwd=cwd)


def message(result) -> str:
    """The text after ``error: `` of the one error line."""
    lines = result.stderr.decode().strip().splitlines()
    return lines[-1].split("error: ", 1)[1]


@pytest.fixture(scope="module")
def bundler(llvm19) -> Path:
    return llvm19("clang-offload-bundler")


@pytest.fixture()
def inputs(tmp_path) -> list[Path]:
    paths = []
    for index, data in enumerate([b"HOSTDATA", b"DEV1", b"DEVICE_TWO!"]):
        paths.append(tmp_path / f"in{index}")
        paths[-1].write_bytes(data)
    return paths


@pytest.mark.parametrize("spelling", ["single", "double", "separate", "inputs", "repeated-targets"])
def test_spellings_give_clangs_bytes(bundler, inputs, tmp_path, spelling):
    reference = tmp_path / "clang.bundle"
    assert clang(bundler, ["-type=bc", f"-targets={TARGETS}", *[f"-input={p}" for p in inputs],
                           f"-output={reference}", "-bundle-align=16"]).returncode == 0
    out = tmp_path / "ours.bundle"
    args = {
        "single": ["-type=bc", f"-targets={TARGETS}", *[f"-input={p}" for p in inputs], f"-output={out}",
                   "-bundle-align=16"],
        "double": ["--type=bc", f"--targets={TARGETS}", *[f"--input={p}" for p in inputs], f"--output={out}",
                   "--bundle-align=16"],
        "separate": ["--type", "bc", "--targets", TARGETS, *[a for p in inputs for a in ("-input", p)],
                     "-output", out, "-bundle-align", "16"],
        "inputs": ["-type=bc", f"-targets={TARGETS}", "-inputs=" + ",".join(map(str, inputs)), f"-outputs={out}",
                   "-bundle-align=16"],
        "repeated-targets": ["-type=bc", f"-targets={HOST}", f"-targets={GFX90A},{GFX908}",
                             *[f"-input={p}" for p in inputs], f"-output={out}", "-bundle-align=16"],
    }[spelling]
    made = ours(args)
    assert made.returncode == 0, made.stderr
    assert out.read_bytes() == reference.read_bytes()
    if spelling == "inputs":
        assert b"-inputs is deprecated, use -input instead" in made.stderr


def test_list_and_unbundle_output_match_clang(bundler, inputs, tmp_path):
    bundle_file = tmp_path / "b"
    assert ours(["-type=bc", f"-targets={TARGETS}", *[f"-input={p}" for p in inputs], f"-output={bundle_file}"]
                ).returncode == 0
    listed = ours(["-list", "-type=bc", f"-input={bundle_file}"])
    assert listed.stdout == clang(bundler, ["-list", "-type=bc", f"-input={bundle_file}"]).stdout
    from_stdin = ours(["-list", "-type=bc", "-input=-"], stdin=bundle_file.read_bytes())
    assert from_stdin.stdout == listed.stdout
    made = ours(["-unbundle", "-type=bc", f"-targets={GFX908},{HOST}", f"-input={bundle_file}", "-output=-",
                 f"-output={tmp_path / 'h'}"])
    assert made.returncode == 0 and made.stdout == b"DEVICE_TWO!"
    assert (tmp_path / "h").read_bytes() == b"HOSTDATA"


# --------------------------------------------------------------------------------------------
# Validation messages: the same text as Clang's
# --------------------------------------------------------------------------------------------
VALIDATION = [
    ("no-output", ["-type=bc", f"-targets={HOST}", "-input=IN0"]),
    ("no-targets", ["-type=bc", "-input=IN0", "-output=OUT"]),
    ("unbundle-two-inputs", ["-unbundle", "-type=bc", f"-targets={HOST}", "-input=IN0", "-input=IN1", "-output=OUT"]),
    ("unbundle-count", ["-unbundle", "-type=bc", f"-targets={HOST},{GFX908}", "-input=IN0", "-output=OUT"]),
    ("bundle-two-outputs", ["-type=bc", f"-targets={HOST}", "-input=IN0", "-output=OUT", "-output=OUT2"]),
    ("bundle-count", ["-type=bc", f"-targets={HOST},{GFX908}", "-input=IN0", "-output=OUT"]),
    ("bundle-archive", ["-type=a", f"-targets={HOST}", "-input=IN0", "-output=OUT"]),
    ("list-unbundle", ["-list", "-unbundle", "-type=bc", "-input=IN0"]),
    ("list-two-inputs", ["-list", "-type=bc", "-input=IN0", "-input=IN1"]),
    ("list-output", ["-list", "-type=bc", "-input=IN0", "-output=OUT"]),
    ("list-targets", ["-list", "-type=bc", "-input=IN0", f"-targets={HOST}"]),
    ("check-archive-bundling", ["-check-input-archive", "-type=a", f"-targets={HOST}", "-input=IN0", "-output=OUT"]),
    ("check-archive-type", ["-check-input-archive", "-unbundle", "-type=bc", f"-targets={HOST}", "-input=IN0",
                            "-output=OUT"]),
    ("input-and-inputs", ["-type=bc", f"-targets={HOST}", "-input=IN0", "-inputs=IN1", "-output=OUT"]),
    ("bad-type", ["-type=xyz", f"-targets={HOST}", "-input=IN0", "-output=OUT"]),
    ("duplicate", ["-type=bc", f"-targets={HOST},{HOST}", "-input=IN0", "-input=IN1", "-output=OUT"]),
    ("two-hosts", ["-type=bc", f"-targets={HOST},host-x86_64-pc-linux-gnu", "-input=IN0", "-input=IN1",
                   "-output=OUT"]),
    ("no-host", ["-type=bc", "-targets=openmp-amdgcn-amd-amdhsa--gfx908", "-input=IN0", "-output=OUT"]),
    ("conflict", ["-type=bc", f"-targets={HOST},{GFX908},{GFX908}:xnack+", "-input=IN0", "-input=IN1", "-input=IN2",
                  "-output=OUT"]),
    ("cuda", ["-type=bc", f"-targets={HOST},cuda-nvptx64-nvidia-cuda--sm_70", "-input=IN0", "-input=IN1",
              "-output=OUT"]),
    ("bad-triple", ["-type=bc", f"-targets={HOST},hip-bogus-amd-amdhsa--gfx908", "-input=IN0", "-input=IN1",
                    "-output=OUT"]),
    ("missing-input", ["-type=bc", f"-targets={HOST}", "-input=MISSING", "-output=OUT"]),
    ("cant-find", ["-unbundle", "-type=bc", "-targets=hip-amdgcn-amd-amdhsa--gfx1030,hip-amdgcn-amd-amdhsa--gfx1031",
                   "-input=BUNDLE", "-output=OUT", "-output=OUT2"]),
]


@pytest.mark.parametrize("name, args", VALIDATION, ids=[v[0] for v in VALIDATION])
def test_validation_messages_match_clang(bundler, inputs, tmp_path, name, args):
    bundle_file = tmp_path / "bundle"
    bundle_file.write_bytes(B.binary_layout([HOST + "-"], [0])[0])
    names = {"IN0": inputs[0], "IN1": inputs[1], "IN2": inputs[2], "OUT": "out", "OUT2": "out2",
             "MISSING": "missing", "BUNDLE": bundle_file}

    def fill(arg: str) -> str:
        for key in sorted(names, key=len, reverse=True):
            arg = arg.replace(key, str(names[key]))
        return arg

    argv = [fill(a) for a in args]
    expected = clang(bundler, argv, cwd=tmp_path)
    got = ours(argv, cwd=tmp_path)
    assert expected.returncode == got.returncode == 1
    assert message(got) == message(expected)
    assert len(got.stderr.decode().strip().splitlines()) == 1
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()


# --------------------------------------------------------------------------------------------
# Environment variables
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env, flags, compressed", [
    ({"OFFLOAD_BUNDLER_COMPRESS": "1"}, [], 2),
    ({"OFFLOAD_BUNDLER_COMPRESS": "yes"}, [], 0),
    ({"OFFLOAD_BUNDLER_COMPRESS": "1", "OFFLOAD_BUNDLER_IGNORE_ENV_VAR": "1"}, [], 0),
    ({"OFFLOAD_BUNDLER_COMPRESS": "0"}, ["-compress"], 2),
    ({"OFFLOAD_BUNDLER_COMPRESS": "1"}, ["-compress=false"], 0),
    ({"COMPRESSED_BUNDLE_FORMAT_VERSION": "3"}, ["-compress"], 3),
    ({"COMPRESSED_BUNDLE_FORMAT_VERSION": "3", "OFFLOAD_BUNDLER_IGNORE_ENV_VAR": "1"}, ["-compress"], 2),
])
def test_compression_switches(bundler, inputs, tmp_path, env, flags, compressed):
    out = tmp_path / "ours"
    made = ours(["-type=bc", f"-targets={TARGETS}", *[f"-input={p}" for p in inputs], f"-output={out}", *flags], env)
    assert made.returncode == 0, made.stderr
    data = out.read_bytes()
    if not compressed:
        reference = tmp_path / "clang"
        assert clang(bundler, ["-type=bc", f"-targets={TARGETS}", *[f"-input={p}" for p in inputs],
                               f"-output={reference}", *flags], env).returncode == 0
        assert data == reference.read_bytes()
    else:
        assert data[:4] == b"CCOB" and struct.unpack_from("<H", data, 4)[0] == compressed
        assert B.list_bundle_ids(out, file_type="bc") == [GFX90A, GFX908, HOST + "-"]


def test_compression_level_and_verbose_match_clang(bundler, inputs, tmp_path):
    env = {"OFFLOAD_BUNDLER_COMPRESSION_LEVEL": "19", "OFFLOAD_BUNDLER_VERBOSE": "1"}
    args = ["-type=bc", "-compress", f"-targets={TARGETS}", *[f"-input={p}" for p in inputs]]
    theirs = clang(bundler, [*args, f"-output={tmp_path / 'clang'}"], env).stderr.decode().splitlines()
    mine = ours([*args, f"-output={tmp_path / 'ours'}"], env).stderr.decode().splitlines()
    keys = ("Compressed bundle format version", "Compression method used", "Compression level",
            "Binary size before compression", "Truncated MD5 hash", "Total file size")
    shared = [line for line in mine if line.startswith(keys)]
    assert len(shared) == len(keys) and all(line in theirs for line in shared)
    assert "Compression level: 19" in mine
    level = ours([*args, "-compression-level=7", "-verbose", f"-output={tmp_path / 'ours'}"]).stderr.decode()
    assert "Compression level: 7" in level
    bad = {"OFFLOAD_BUNDLER_COMPRESSION_LEVEL": "abc"}
    warning = "Warning: Invalid value for OFFLOAD_BUNDLER_COMPRESSION_LEVEL: abc. Ignoring it."
    assert warning in clang(bundler, [*args, f"-output={tmp_path / 'clang'}"], bad).stderr.decode()
    assert warning in ours([*args, f"-output={tmp_path / 'ours'}"], bad).stderr.decode()


def test_unbundle_verbose_reports_decompression(inputs, tmp_path):
    bundle_file = tmp_path / "b"
    assert ours(["-type=bc", "-compress", f"-targets={TARGETS}", *[f"-input={p}" for p in inputs],
                 f"-output={bundle_file}"]).returncode == 0
    made = ours(["-unbundle", "-verbose", "-type=bc", f"-targets={GFX908}", f"-input={bundle_file}",
                 f"-output={tmp_path / 'o'}"])
    assert made.returncode == 0
    assert b"Decompression method: zstd" in made.stderr and b"Hashes match: Yes" in made.stderr


# --------------------------------------------------------------------------------------------
# The error contract
# --------------------------------------------------------------------------------------------
def _bundle(count: int, *records: tuple[int, int, bytes, int | None], tail: bytes = b"z") -> bytes:
    body = b"".join(struct.pack("<QQQ", o, s, len(i) if n is None else n) + i for o, s, i, n in records)
    return B.MAGIC + struct.pack("<Q", count) + body + tail


#: The reference's example bundle (b1.bin); its first 220 bytes crash Clang 19.
GOOD = (B.binary_layout([HOST + "-", "hip-amdgcn-amd-amdhsa--gfx90a:xnack+", GFX908], [8, 4, 11])[0]
        + b"HOSTDATADEV1DEVICE_TWO!")
CCOB = compress_bytes(GOOD, CompressionOptions())
CORPUS = [
    ("truncated", "bc", GOOD[:220]),
    ("absurd-count", "bc", _bundle(2**64 - 1, (64, 1, b"x", None))),
    ("offset-past-end", "bc", _bundle(1, (1000, 1, b"host-x", None))),
    ("overflowing-length", "bc", _bundle(1, (46, 1, b"host-x", 2**64 - 1))),
    ("overlap", "bc", _bundle(2, (78, 4, b"host-x", None), (80, 4, b"hip-y", None), tail=b"abcdef")),
    ("duplicate-ids", "bc", _bundle(2, (78, 1, b"host-x", None), (79, 1, b"host-x", None), tail=b"ab")),
    ("bad-utf8", "bc", _bundle(1, (47, 1, b"host-\xff\xfe", None))),
    ("ccob-version-9", "bc", CCOB[:4] + struct.pack("<H", 9) + CCOB[6:]),
    ("ccob-method-7", "bc", CCOB[:6] + struct.pack("<H", 7) + CCOB[8:]),
    ("ccob-claims-4-gib", "bc", CCOB[:12] + struct.pack("<I", 0xFFFFFFFF) + CCOB[16:]),
    ("text-without-end", "ll", b"\n; __CLANG_OFFLOAD_BUNDLE____START__ host-x\ncontent\n"),
    ("archive-size-past-end", "a", b"!<arch>\n" + b"m.o/".ljust(16) + b"0".ljust(12) + b"0".ljust(12)
     + b"644".ljust(8) + b"999".ljust(10) + b"`\nabc"),
]


# -list reads archives as plain files, as Clang does, so damaged archives are checked by unbundling only.
DAMAGED_CASES = [pytest.param(mode, name, file_type, data, id=f"{mode}-{name}")
                 for mode in ("list", "unbundle") for name, file_type, data in CORPUS
                 if not (mode == "list" and file_type == "a")]


@pytest.mark.parametrize("mode, name, file_type, data", DAMAGED_CASES)
def test_damaged_input_is_one_line_exit_1_no_output(tmp_path, name, file_type, data, mode):
    path = tmp_path / name
    path.write_bytes(data)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    if mode == "list":
        args = ["-list", f"-type={file_type}", f"-input={path}"]
    else:
        args = ["-unbundle", "-allow-missing-bundles", f"-type={file_type}", f"-targets={HOST},{GFX908}",
                f"-input={path}", f"-output={out_dir / 'host'}", f"-output={out_dir / 'dev'}"]
    made = ours(args)
    err = made.stderr.decode()
    assert made.returncode == 1
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("offload-bundler: error: ") and f"{path}: offset 0x" in err
    assert list(out_dir.iterdir()) == []
    assert made.stdout == b""


def test_the_bundle_that_crashes_clang_19(bundler, tmp_path):
    path = tmp_path / "truncated.bin"
    path.write_bytes(GOOD[:220])
    crashed = clang(bundler, ["-unbundle", "-type=bc", f"-targets={GFX908}", f"-input={path}",
                              f"-output={tmp_path / 'clang'}"])
    assert crashed.returncode in (-11, 139)
    made = ours(["-unbundle", "-type=bc", f"-targets={GFX908}", f"-input={path}", f"-output={tmp_path / 'ours'}"])
    assert made.returncode == 1
    assert message(made) == (f"{path}: offset 0x9a: entry 2 (hip-amdgcn-amd-amdhsa--gfx908): data at offset 211 "
                             "with size 11 runs past the end of the data (220 bytes)")
    assert not (tmp_path / "ours").exists()


def test_zero_bundle_alignment_is_an_error_where_clang_crashes(bundler, inputs, tmp_path):
    crashed = clang(bundler, ["-type=bc", f"-targets={HOST}", f"-input={inputs[0]}", f"-output={tmp_path / 'c'}",
                              "-bundle-align=0"])
    assert crashed.returncode in (-8, 136)  # SIGFPE
    made = ours(["-type=bc", f"-targets={HOST}", f"-input={inputs[0]}", f"-output={tmp_path / 'o'}",
                 "-bundle-align=0"])
    assert made.returncode == 1 and "at least 1" in message(made)
    assert not (tmp_path / "o").exists()


def test_usage_errors_and_help(capsys):
    assert main(["--help"]) == 0
    assert "USAGE: offload-bundler" in capsys.readouterr().out
    assert main(["-type=bc", "-frobnicate"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Unknown command line argument '-frobnicate'" in err
    assert main(["-type=bc", "-compress=maybe", f"-targets={HOST}", "-input=x", "-output=y"]) == 1
    assert "invalid value for boolean argument" in capsys.readouterr().err
    assert main(["stray"]) == 1
    assert "positional" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# -###: the llvm-objcopy commands, printed instead of run
# --------------------------------------------------------------------------------------------
@pytest.fixture()
def object_inputs(llvm19, tmp_path) -> Path:
    """A host object and a device image in ``tmp_path``, a private TMPDIR, and Clang's object bundle."""
    (tmp_path / "h.c").write_text("int host_function(void) { return 1; }\n")
    subprocess.run([str(llvm19("clang")), "-c", "h.c", "-o", "h.o"], cwd=tmp_path, check=True)
    (tmp_path / "d.bin").write_bytes(b"DEVICE")
    (tmp_path / "tmp").mkdir()
    made = clang(llvm19("clang-offload-bundler"), ["-type=o", f"-targets={HOST},{GFX908}", "-input=h.o", "-input=d.bin",
                                                   "-output=fat.o"], cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    subprocess.run([str(llvm19("llvm-ar")), "rc", "lib.a", "fat.o"], cwd=tmp_path, check=True)
    return tmp_path


def _dry_run(tool, args: list, d: Path, tag: str) -> tuple[str, dict[str, bytes]]:
    """Run in ``d`` with TMPDIR=d/tmp; outputs are named ``<tag>.<name>``. Returns stderr with temporary
    paths replaced by ``<temp>`` (Clang's and ours are named differently), and the outputs' bytes."""
    args = [a.replace("@", f"{tag}.") for a in args]
    made = tool(args, env={"TMPDIR": str(d / "tmp")}, cwd=d)
    assert made.returncode == 0, made.stderr
    text = re.sub(re.escape(str(d / "tmp")) + r'/[^"]*', "<temp>", made.stderr.decode())
    outputs = {p.name.split(".", 1)[1]: p.read_bytes() for p in d.glob(f"{tag}.*")}
    return text, outputs


DRY_RUNS = {
    "bundle object": ["-type=o", f"-targets={HOST},{GFX908}", "-input=h.o", "-input=d.bin", "-output=@fat.o"],
    "bundle object, compressed": ["-type=o", "-compress", "-verbose", f"-targets={HOST},{GFX908}", "-input=h.o",
                                  "-input=d.bin", "-output=@fat.o"],
    "unbundle object": ["-unbundle", "-type=o", f"-targets={HOST},{GFX908}", "-input=fat.o", "-output=@host.o",
                        "-output=@dev.bin"],
    "unbundle object, device only": ["-unbundle", "-type=o", f"-targets={GFX908}", "-input=fat.o",
                                     "-output=@dev.bin"],
    "unbundle archive": ["-unbundle", "-type=a", f"-targets={HOST},{GFX908}", "-input=lib.a", "-output=@host.a",
                         "-output=@dev.a"],
    "unbundle plain object": ["-unbundle", "-type=o", "-allow-missing-bundles", f"-targets={HOST},{GFX908}",
                              "-input=h.o", "-output=@host.o", "-output=@dev.bin"],
    "bundle binary (non-ELF host)": ["-type=o", f"-targets={HOST},{GFX908}", "-input=/dev/null", "-input=d.bin",
                                     "-output=@fat.o"],
    "bundle bc": ["-type=bc", f"-targets={HOST},{GFX908}", "-input=h.o", "-input=d.bin", "-output=@fat.bc"],
    "list": ["-list", "-type=o", "-input=fat.o"],
}


@pytest.mark.parametrize("case", DRY_RUNS)
def test_print_external_commands_matches_clang(bundler, object_inputs, case):
    """Clang 19's -### prints the llvm-objcopy command of an object bundle (bundling, or stripping the host
    output) instead of running it, leaves that output empty and does everything else as usual: our
    commands must be the same up to temporary file names, our outputs identical."""
    d, args = object_inputs, ["-###", *DRY_RUNS[case]]
    theirs, their_outputs = _dry_run(lambda a, **kw: clang(bundler, a, **kw), args, d, "clang")
    mine, my_outputs = _dry_run(ours, args, d, "ours")
    assert my_outputs == their_outputs
    # Clang's -verbose adds the compression speed and a timer report: not reproduced (timings)
    theirs = "".join(line for line in theirs.splitlines(keepends=True)
                     if line.startswith(('"', "Compressed", "Total", "Compression ", "Binary", "Truncated"))
                     and not line.startswith("Compression speed"))
    commands = [line for line in mine.splitlines() if line.startswith('"')]
    if case.startswith("bundle object"):
        # objcopy writes our temporary, which we put in place atomically; Clang has it write the output
        assert theirs.count('"clang.fat.o"\n') == 1 and commands[0].endswith('"<temp>"')
        theirs = theirs.replace('"clang.fat.o"\n', '"<temp>"\n')
    if "compressed" in case:
        # Clang prints the compression report of its empty output before the command, we after it
        theirs = "".join(sorted(theirs.splitlines(keepends=True), key=lambda line: not line.startswith('"')))
    assert mine == theirs
    runs_objcopy = case in ("bundle object", "bundle object, compressed", "unbundle object", "unbundle archive")
    assert len(commands) == runs_objcopy
    if runs_objcopy:
        assert commands[0].startswith('"/usr/lib/llvm-19/bin/llvm-objcopy" ')
    # what objcopy would have written is left empty (compressed: the CCOB form of nothing)
    emptied = {"bundle object": "fat.o", "unbundle object": "host.o"}.get(case)
    if emptied is not None:
        assert my_outputs[emptied] == b""
    if case == "bundle object, compressed":
        assert my_outputs["fat.o"][:4] == b"CCOB" and len(my_outputs["fat.o"]) == 33
    without = ours(args[1:], cwd=d)
    assert without.returncode == 0 and b'"/usr/lib/llvm-19/bin/llvm-objcopy"' not in without.stderr


def test_print_external_commands_spellings(object_inputs):
    d = object_inputs
    for flag in ("-###", "--###", "-###=1", "--###=true"):
        made = ours([flag, *DRY_RUNS["bundle object"]], cwd=d)
        assert made.returncode == 0 and made.stderr.startswith(b'"') and (d / "@fat.o").read_bytes() == b""
    made = ours(["-###=0", *DRY_RUNS["bundle object"]], cwd=d)
    assert made.returncode == 0 and made.stderr == b"" and (d / "@fat.o").read_bytes()[:4] == b"\x7fELF"


LEAN_CHECK = """
import sys
from offload_builders.cli.bundler import main
status = main(sys.argv[1:])
heavy = ("dataclasses", "inspect", "typing", "tempfile", "subprocess", "offload_builders.targets", "elftools",
         "zstandard", "llvmlite", "hashlib", "zlib")
print(status, *sorted(name for name in heavy if name in sys.modules))
"""


def test_unbundling_loads_only_what_it_needs(inputs, tmp_path):
    """Start-up is most of what offload-bundler costs against cat (bench/bench_bundler.py): unbundling an
    uncompressed bundle, host and device targets, must not load what only other paths need."""
    fat = tmp_path / "fat.bin"
    assert ours(["-type=o", f"-targets={TARGETS}", *[f"-input={p}" for p in inputs], f"-output={fat}"]).returncode == 0
    args = ["-unbundle", "-type=o", f"-targets={HOST},{GFX908}", f"-input={fat}", f"-output={tmp_path / 'h'}",
            f"-output={tmp_path / 'd'}"]
    made = subprocess.run([sys.executable, "-c", LEAN_CHECK, *args], capture_output=True, text=True, env=CLEAN_ENV)
    assert made.stdout.split() == ["0"], made.stdout + made.stderr
    assert (tmp_path / "d").read_bytes() == inputs[2].read_bytes()


# --------------------------------------------------------------------------------------------
# Every option the library implements, through the command line
# --------------------------------------------------------------------------------------------
OPENMP908 = "openmp-amdgcn-amd-amdhsa--gfx908"
#: (case, base arguments, the option's arguments, the option's environment, the reference bundler): run with
#: and without the option, both tools must give the same result, and the option must change it. Names in
#: capitals are files of the ``option_files`` fixture; ``OUT``/``OUT2`` are the outputs compared.
OPTION_CASES = [
    ("hip-openmp-compatible", ["-unbundle", "-type=bc", f"-targets={HOST},{OPENMP908}", "-input=HIPBUNDLE",
                               "-output=OUT", "-output=OUT2"], ["-hip-openmp-compatible"], {}, 19),
    ("hip-openmp-compatible, archive", ["-unbundle", "-type=a", f"-targets={OPENMP908}", "-input=HIPLIB",
                                        "-output=OUT", "-allow-missing-bundles"], ["-hip-openmp-compatible"], {}, 19),
    ("allow-missing-bundles", ["-unbundle", "-type=bc", f"-targets={HOST},hip-amdgcn-amd-amdhsa--gfx1030",
                               "-input=HIPBUNDLE", "-output=OUT", "-output=OUT2"], ["-allow-missing-bundles"], {}, 19),
    ("allow-missing-bundles, archive", ["-unbundle", "-type=a", "-targets=hip-amdgcn-amd-amdhsa--gfx1030",
                                        "-input=HIPLIB", "-output=OUT"], ["-allow-missing-bundles"], {}, 19),
    ("check-input-archive", ["-unbundle", "-type=a", f"-targets={HOST}", "-input=CONFLICTLIB", "-output=OUT"],
     ["-check-input-archive"], {}, 19),
    ("bundle-align", ["-type=bc", f"-targets={HOST},{GFX908}", "-input=IN0", "-input=BIG", "-output=OUT"],
     ["-bundle-align=4096"], {}, 19),
    ("compress", ["-type=bc", f"-targets={HOST},{GFX908}", "-input=IN0", "-input=BIG", "-output=OUT"],
     ["-compress"], {}, 19),
    ("compression-level", ["-type=bc", "-compress", f"-targets={HOST},{GFX908}", "-input=IN0", "-input=BIG",
                           "-output=OUT"], ["-compression-level=12"], {}, 19),
    ("verbose", ["-type=bc", "-compress", f"-targets={HOST},{GFX908}", "-input=IN0", "-input=BIG", "-output=OUT"],
     ["-verbose"], {}, 19),
    ("list", ["-type=bc", "-input=HIPBUNDLE"], ["-list"], {}, 19),
    ("unbundle", ["-type=bc", f"-targets={GFX908}", "-input=HIPBUNDLE", "-output=OUT"], ["-unbundle"], {}, 19),
    ("OFFLOAD_BUNDLER_COMPRESS", ["-type=bc", f"-targets={HOST},{GFX908}", "-input=IN0", "-input=BIG",
                                  "-output=OUT"], [], {"OFFLOAD_BUNDLER_COMPRESS": "1"}, 19),
    ("OFFLOAD_BUNDLER_COMPRESSION_LEVEL", ["-type=bc", "-compress", f"-targets={HOST},{GFX908}", "-input=IN0",
                                           "-input=BIG", "-output=OUT"], [],
     {"OFFLOAD_BUNDLER_COMPRESSION_LEVEL": "12"}, 19),
    ("OFFLOAD_BUNDLER_VERBOSE", ["-type=bc", "-compress", f"-targets={HOST},{GFX908}", "-input=IN0", "-input=BIG",
                                 "-output=OUT"], [], {"OFFLOAD_BUNDLER_VERBOSE": "1"}, 19),
    ("OFFLOAD_BUNDLER_IGNORE_ENV_VAR", ["-type=bc", f"-targets={HOST},{GFX908}", "-input=IN0", "-input=BIG",
                                        "-output=OUT"], [], {"OFFLOAD_BUNDLER_IGNORE_ENV_VAR": "1"}, 19),
    # LLVM 20+ reads it (Clang 19 does not): compared with LLVM 22, whose own default is not ours
    ("COMPRESSED_BUNDLE_FORMAT_VERSION", ["-type=bc", "-compress", f"-targets={HOST},{GFX908}", "-input=IN0",
                                          "-input=BIG", "-output=OUT"], [],
     {"COMPRESSED_BUNDLE_FORMAT_VERSION": "3"}, 22),
]
#: The environment of every run of a case (the option's environment is added on top).
OPTION_BASE_ENV = {"OFFLOAD_BUNDLER_IGNORE_ENV_VAR": {"OFFLOAD_BUNDLER_COMPRESS": "1"},
                   "COMPRESSED_BUNDLE_FORMAT_VERSION": {"COMPRESSED_BUNDLE_FORMAT_VERSION": "2"}}
#: -verbose lines both tools print (Clang adds timings).
VERBOSE_KEYS = ("Compressed bundle format version", "Compression method used", "Compression level",
                "Binary size before compression", "Truncated MD5 hash", "Total file size")


@pytest.fixture(scope="module")
def option_files(llvm19, tmp_path_factory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("options")
    bundler = llvm19("clang-offload-bundler")
    files = {"IN0": work / "in0", "DEV": work / "dev", "BIG": work / "big"}
    files["IN0"].write_bytes(b"HOSTDATA")
    files["DEV"].write_bytes(b"DEVICE")
    words = [bytes(f"w{i * 7919 % 997}", "ascii") for i in range(400)]
    files["BIG"].write_bytes(b" ".join(words[i * i % 397] for i in range(40000)))  # compressible, level-sensitive
    files["HIPBUNDLE"] = work / "hip.bundle"
    made = clang(bundler, ["-type=bc", f"-targets={HOST},{GFX908}", f"-input={files['IN0']}",
                           f"-input={files['DEV']}", f"-output={files['HIPBUNDLE']}"])
    assert made.returncode == 0, made.stderr
    hip_object = work / "hip.o"
    assert clang(bundler, ["-type=bc", f"-targets={HOST},{GFX908}", f"-input={files['IN0']}",
                           f"-input={files['DEV']}", f"-output={hip_object}"]).returncode == 0
    files["HIPLIB"] = work / "libhip.a"
    subprocess.run([str(llvm19("llvm-ar")), "rc", str(files["HIPLIB"]), str(hip_object)], check=True)
    # Clang refuses to bundle a conflicting pair: written by our layout code, bypassing the check
    pair = [HOST + "-", "openmp-amdgcn-amd-amdhsa--gfx906", "openmp-amdgcn-amd-amdhsa--gfx906:xnack+"]
    conflict = work / "conflict.bc"
    conflict.write_bytes(B.binary_layout(pair, [1, 1, 1])[0] + b"abc")
    files["CONFLICTLIB"] = work / "libconflict.a"
    subprocess.run([str(llvm19("llvm-ar")), "rc", str(files["CONFLICTLIB"]), str(conflict)], check=True)
    return files


def _outcome(tool, args: list[str], env: dict[str, str], files: dict[str, Path], out_dir: Path) -> tuple:
    """(exit status, error message, stdout, the -verbose lines both print, each output's bytes). A failed run's
    outputs are left out: Clang leaves what it wrote before the error, we write nothing (checked here)."""
    out_dir.mkdir()
    names = {**{k: str(v) for k, v in files.items()}, "OUT": str(out_dir / "out"), "OUT2": str(out_dir / "out2")}
    argv = [re.sub(r"\b(OUT2|OUT|[A-Z][A-Z0-9]+)\b", lambda m: names.get(m.group(1), m.group(1)), a)
            if "=" in a and not a.startswith("-targets") else a for a in args]
    made = tool(argv, env=env)
    stderr = made.stderr.decode()
    error = stderr.strip().splitlines()[-1].split("error: ", 1)[1] if made.returncode else None
    verbose = sorted(line for line in stderr.splitlines() if line.startswith(VERBOSE_KEYS))
    outputs = {p.name: p.read_bytes() for p in sorted(out_dir.iterdir())}
    if made.returncode and tool is ours:
        assert outputs == {}
    return made.returncode, error, made.stdout, verbose, outputs if not made.returncode else None


@pytest.mark.parametrize("case, args, option, option_env, llvm", OPTION_CASES, ids=[c[0] for c in OPTION_CASES])
def test_every_option_reaches_the_library_as_clangs_does(llvm19, llvm22, option_files, tmp_path, case, args,
                                                         option, option_env, llvm):
    """Each option changes what Clang's bundler does in this case, and changes ours the same way: an
    option the command line parses but does not pass on (or passes wrongly) fails here."""
    reference = (llvm19 if llvm == 19 else llvm22)("clang-offload-bundler")
    base_env = OPTION_BASE_ENV.get(case, {})
    results = {}
    for name, tool in (("clang", lambda a, env: clang(reference, a, env)), ("ours", ours)):
        for label, extra, env in (("without", [], base_env), ("with", option, {**base_env, **option_env})):
            results[name, label] = _outcome(tool, [*args, *extra], env, option_files, tmp_path / f"{name}-{label}")
    assert results["ours", "without"] == results["clang", "without"]
    assert results["ours", "with"] == results["clang", "with"]
    assert results["clang", "with"] != results["clang", "without"]  # the case really exercises the option


# Clang 19's zstd output (LLVM 19 links the system libzstd 1.5.4) and ours (python-zstandard) are the same
# bytes up to level 15 on the option cases' 196 KB input, which is why they use level 12.
