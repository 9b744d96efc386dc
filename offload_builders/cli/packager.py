"""``offload-packager``: a drop-in for ``clang-offload-packager`` (LLVM 19 behaviour, any enum version).

Bundle mode (``-o <file>``) writes one OffloadBinary per ``--image=file=...,triple=...[,key=value...]``
(several ``file=`` in one ``--image`` give one binary each), byte-identical to Clang's packager. Extract
mode (a positional input, no ``-o``) writes the images of the binaries matching each ``--image`` filter,
named ``<stem>-<triple>-<arch>.<index>.<ext>`` unless ``file=`` is given, or into an archive with
``--archive``. ``--llvm-version`` (default 19) selects the kind enum values (HIP is 3 before LLVM 21, 4
after).

Every failure is one line on stderr (``offload-packager: error: ...``, naming the file and, for malformed
input, the byte offset) and exit status 1; outputs appear atomically, so a failed run leaves none.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from offload_builders import __version__
from offload_builders.cli._common import UsageError as _Fail, answered_help_or_version, llvm_version_option, run_guarded
from offload_builders.cli.options import APPEND, FLAG, FLAG_ANY, LLVM_BOOL, LLVM_UNKNOWN, ONCE, Option, Parser
from offload_builders.formats._io import atomic_output, llvm_stem
from offload_builders.formats.offload_binary import (
    KindTable,
    OffloadBinary,
    OffloadingImage,
    kind_table,
    packager_arguments,
    packager_images,
    write_offload_binaries,
)
from offload_builders.targets import is_target_name

PROG = "offload-packager"
DEFAULT_LLVM_VERSION = 19

_HELP = f"""OVERVIEW: A utility for bundling several object files into a single binary.
The output binary can then be embedded into the host section table
to create a fatbinary containing offloading code.

USAGE: {PROG} [options] Extract from <file>.

OPTIONS:
  --archive                   - Write extracted files to a static archive
  --image=<<key>=<value>,...> - List of key and value arguments. Required keywords are 'file' and 'triple'.
  --llvm-version=<N>          - LLVM release whose enum values to use (default {DEFAULT_LLVM_VERSION})
  -o <file>                   - Write output to <file>.
  --help                      - Display available options
  --version                   - Display the version of this program
"""


@dataclass
class _Options:
    output: str | None = None
    input: str | None = None
    images: list[str] = field(default_factory=list)
    archive: bool = False
    llvm_version: int = DEFAULT_LLVM_VERSION
    help: bool = False
    version: bool = False


_PARSER = Parser(PROG, [
    Option("o", dest="output", action=ONCE),
    Option("image", dest="images", action=APPEND),
    Option("llvm-version", check=lambda value: llvm_version_option(value, option="for the --llvm-version option:")),
    Option("archive", action=FLAG),
    Option("help", "h", "help-list", "help-hidden", action=FLAG_ANY),
    Option("version", action=FLAG_ANY),
], missing="for the -{name} option: requires a value!", unknown=LLVM_UNKNOWN, bool_values=LLVM_BOOL)


def _parse(argv: Sequence[str]) -> _Options:
    """Parse like LLVM's ``cl::opt``: ``-x`` and ``--x`` alike, values as ``-o f``, ``-o=f`` or ``--image=...``."""
    opts = _Options()

    def positional(arg: str) -> None:
        if opts.input is not None:
            raise _Fail(f"Too many positional arguments specified! Can specify at most 1 positional argument: "
                        f"See: {PROG} --help")
        opts.input = arg

    _PARSER.parse(argv, opts, positional)
    return opts


def main(argv: Sequence[str] | None = None) -> int:
    """Run the packager; returns the exit status (0, or 1 after printing one error line)."""
    try:
        opts = _parse(sys.argv[1:] if argv is None else argv)
    except _Fail as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    return run_guarded(PROG, lambda: _main(opts))


def _main(opts: _Options) -> int:
    version_line = f"{PROG} (offload-builders {__version__}; clang-offload-packager compatible)"
    if answered_help_or_version(opts.help, opts.version, _HELP, version_line):
        return 0
    if opts.input and opts.output:
        raise _Fail("Packaging to an output file and extracting from an input file are mutually exclusive.")
    table = kind_table(opts.llvm_version)
    if opts.output:
        _bundle(opts, table)
    elif opts.input:
        _extract(opts, table)
    return 0


def _spool_stdin() -> str:
    """Copy standard input to a temporary file (removed by the caller) so it can be streamed and sized."""
    import shutil
    import tempfile

    fd, path = tempfile.mkstemp(prefix="offload-packager-stdin-")
    with os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(sys.stdin.buffer, out, 1 << 20)
    return path


def _bundle(opts: _Options, table: KindTable) -> None:
    temporaries: list[str] = []
    try:
        def resolve(name: str) -> str:
            if name != "-":
                return name
            temporaries.append(_spool_stdin())
            return temporaries[-1]

        images: list[OffloadingImage] = []
        for spec in opts.images:
            try:
                images.extend(packager_images(spec, table, resolve))
            except ValueError as error:
                raise _Fail(str(error)) from None
        write_offload_binaries(images, opts.output or "")
    finally:
        for path in temporaries:
            os.unlink(path)


def _matches(binary: OffloadBinary, key: str, value: str, table: KindTable) -> bool:
    """Clang's filter: ``file`` matches anything, ``kind`` compares the offload kind, other keys the strings
    (a missing key reads as "")."""
    if key == "file":
        return True
    if key == "kind":
        return binary.offload_kind == table.offload_value_for_name(value)
    return binary.string(key) == value


def _extract(opts: _Options, table: KindTable) -> None:
    from offload_builders.formats.containers import ArchiveMember, extract_offload_binaries, write_archive

    assert opts.input is not None
    spooled = None
    try:
        if opts.input == "-":
            spooled = _spool_stdin()
            found = extract_offload_binaries(spooled, display="<stdin>")
        else:
            found = extract_offload_binaries(opts.input)
        stem = llvm_stem(opts.input)
        for spec in opts.images:
            pairs = packager_arguments(spec)
            values = dict(pairs)
            chosen = [f for f in found if all(_matches(f.binary, k, v, table) for k, v in pairs)]
            if not chosen:
                continue
            if opts.archive:
                if "file" not in values:
                    raise _Fail("Image must have a 'file' argument.")
                write_archive([ArchiveMember.image_of(f) for f in chosen], values["file"])
            elif "file" in values:
                if len(chosen) > 1:
                    print(f"{PROG}: warning: Multiple inputs match to a single file, '{values['file']}'",
                          file=sys.stderr)
                with atomic_output(values["file"]) as fd:
                    chosen[-1].copy_image(fd)
            else:
                for index, item in enumerate(chosen):
                    binary = item.binary
                    for what, value in (("triple", binary.triple), ("arch", binary.arch)):
                        if value and not is_target_name(value):  # the name is made of them: never a path
                            shown = ascii(value[:64]) + (f" ({len(value)} characters)" if len(value) > 64 else "")
                            raise _Fail(f"{opts.input}: image {index}'s {what} {shown} cannot name a file (letters,"
                                             " digits and '_.+:-' only, at most 128); give --image=file=NAME")
                    name = (f"{stem}-{binary.triple}-{binary.arch}.{index}."
                            f"{table.image_kind_name(binary.image_kind)}")
                    with atomic_output(name) as fd:
                        item.copy_image(fd)
    finally:
        if spooled is not None:
            os.unlink(spooled)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
