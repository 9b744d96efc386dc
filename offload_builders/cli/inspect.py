"""``offload-inspect FILE...``: list (and optionally extract) every offload payload in any file.

It reads objects, archives, executables, shared objects, ``-flto`` bitcode host objects, package files,
plain, text and compressed (``CCOB`` v1-v3) bundles and their concatenations, and the ``.hip_fatbin``,
``.nv_fatbin`` and ``__CLANG_OFFLOAD_BUNDLE__*`` sections of ELF files (see
:mod:`offload_builders.formats.inspect`). For each payload it prints where it is, its kind (offload kind
or bundle kind), triple, arch or target ID, image kind, size and offset; ``--json`` prints the same as
JSON. ``--extract DIR`` writes each payload's bytes to ``DIR``: offload binaries as
``clang-offload-packager <file> --image=`` names them (``<stem>-<triple>-<arch>.<index>.<ext>``), bundle
entries as ``<stem>-<bundle ID with ':' as '_'>`` (stem of the archive member or file), NVIDIA fat
binaries as ``<stem>-nv_fatbin.<n>.fatbin``; a name taken earlier in the run gets ``.1``, ``.2``...

Everything is read before anything is printed or written: a failure prints one line on stderr (naming
the file, and the byte offset for malformed data) and exits 1, with nothing on stdout and no extracted
file. A file without offload content is not an error: a note on stderr, exit 0.
"""
from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field

from offload_builders import __version__
from offload_builders.cli._common import (
    UsageError as _Fail,
    llvm_version_option,
    os_message as _os_message,
    run_tool,
)
from offload_builders.cli.options import FLAG, Option, Parser
from offload_builders.errors import OffloadError

# The format modules are imported where they are used, so that --help and usage errors stay quick.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO

    from offload_builders.formats.inspect import Inspection, Payload

PROG = "offload-inspect"
DEFAULT_LLVM_VERSION = 19
_NAME_MAX = 255

_HELP = f"""OVERVIEW: List the offload payloads (offload binaries, bundle entries, NVIDIA fat binaries) in files.

USAGE: {PROG} [options] <file>...   ('-' reads standard input)

OPTIONS:
  --json                 - Print machine-readable JSON
  --extract=<dir>        - Also write each payload's bytes into <dir> (created if missing)
  --llvm-version=<N>     - LLVM release whose OffloadBinary kind numbers to use (default {DEFAULT_LLVM_VERSION})
  --help                 - Display available options
  --version              - Display the version of this program
"""


@dataclass
class _Options:
    files: list[str] = field(default_factory=list)
    json: bool = False
    extract: str | None = None
    llvm_version: int = DEFAULT_LLVM_VERSION
    help: bool = False
    version: bool = False


def _directory(value: str) -> str:
    if not value:
        raise _Fail("option --extract requires a directory")
    return value


_PARSER = Parser(PROG, [
    Option("json", action=FLAG),
    Option("extract", check=_directory),
    Option("llvm-version", check=llvm_version_option),
    Option("help", "h", action=FLAG),
    Option("version", action=FLAG),
])


def _parse(argv: Sequence[str]) -> _Options:
    """``-x`` and ``--x`` alike; values as ``--extract DIR`` or ``--extract=DIR``; ``--`` ends options."""
    opts = _Options()
    _PARSER.parse(argv, opts, opts.files.append)
    return opts


def main(argv: Sequence[str] | None = None) -> int:
    """Run the tool; returns the exit status (0, or 1 after printing one error line)."""
    return run_tool(PROG, argv, _parse, _HELP, f"{PROG} (offload-builders {__version__})", _run)


def _named(display: str, message: str) -> str:
    """The message, led by the file's name unless it already names it."""
    return message if message.startswith(display) else f"{display}: {message}"


def _run(opts: _Options) -> int:
    if not opts.files:
        raise _Fail(f"no input files; try '{PROG} --help'")
    with ExitStack() as stack:
        inspections: list[Inspection] = []
        for name in opts.files:
            inspections.append(_inspect(name, opts.llvm_version, stack))
        extracted: dict[int, str] = {}
        if opts.extract is not None:
            extracted = _extract(inspections, opts.extract)
        output = _render_json(inspections, extracted) if opts.json else _render_text(inspections, extracted)
    sys.stdout.write(output)
    sys.stdout.flush()
    for inspection in inspections:
        if not inspection.payloads:
            from offload_builders.formats.inspect import printable

            print(f"{PROG}: {printable(inspection.file)}: no offload payloads", file=sys.stderr)
    return 0


def _inspect(name: str, llvm_version: int, stack: ExitStack) -> Inspection:
    """Inspect one input; standard input and other non-regular files are copied to a temporary file."""
    from offload_builders.formats.inspect import inspect_file

    display = "<stdin>" if name == "-" else name
    path = name
    if name == "-":
        path = _spool(sys.stdin.buffer, stack)
    else:
        st = os.stat(name)
        if stat.S_ISDIR(st.st_mode):
            raise _Fail(f"'{name}': Is a directory")
        if not stat.S_ISREG(st.st_mode):
            with open(name, "rb") as source:
                path = _spool(source, stack)
    from offload_builders.formats.inspect import printable

    try:
        inspection = inspect_file(path, llvm_version=llvm_version, display=display,
                                  stem="stdin" if name == "-" else None, notify=_note)
    except OffloadError as exc:
        raise _Fail(printable(_named(display, str(exc)))) from None
    except OSError as exc:
        if exc.filename is not None and os.fsdecode(exc.filename) == path:
            raise _Fail(printable(f"'{display}': {exc.strerror or exc}")) from None
        raise _Fail(printable(_named(display, _os_message(exc)))) from None
    except Exception as exc:  # a bug, or damage a reader does not report properly: still one line
        raise _Fail(printable(f"{display}: internal error: {type(exc).__name__}: {exc}")) from None
    stack.callback(inspection.close)
    return inspection


def _note(message: str) -> None:
    """What the tool is about to decompress, when it is much (a compressed text bundle, an entry far in)."""
    from offload_builders.formats.inspect import printable

    print(f"{PROG}: note: {printable(message)}", file=sys.stderr, flush=True)


def _spool(source: BinaryIO, stack: ExitStack) -> str:
    import shutil
    import tempfile

    spool = stack.enter_context(tempfile.NamedTemporaryFile(prefix="offload-inspect-", suffix=".in"))
    shutil.copyfileobj(source, spool, 1 << 20)
    spool.flush()
    return spool.name


def _extract(inspections: Sequence[Inspection], directory: str) -> dict[int, str]:
    """Write every payload into ``directory``; all files appear together at the end, or none do.

    Returns ``id(payload) -> path``. Payloads are written to temporary files in ``directory`` and renamed
    into place only after all of them were written; on any failure the temporaries are removed (and the
    directory, if this run created it and it is empty).
    """
    import tempfile

    from offload_builders.formats.inspect import printable, safe_file_name, unique_names

    payloads = [p for inspection in inspections for p in inspection.payloads]
    taken: set[str] = set()
    names = unique_names((safe_file_name(p.default_name) for p in payloads), taken)
    for payload, name in zip(payloads, names):
        if len(os.fsencode(name)) > _NAME_MAX:
            raise _Fail(printable(f"{payload.origin}: the output name '{name[:60]}...' is longer than {_NAME_MAX} "
                                  "bytes"))
        if os.path.isdir(os.path.join(directory, name)):
            raise _Fail(f"'{os.path.join(directory, name)}': Is a directory")
    created = not os.path.isdir(directory)
    os.makedirs(directory, exist_ok=True)
    staged: list[tuple[str, str]] = []
    result: dict[int, str] = {}
    mask = os.umask(0)
    os.umask(mask)
    try:
        for payload, name in zip(payloads, names):
            final = os.path.join(directory, name)
            fd, temp = tempfile.mkstemp(prefix=".offload-inspect-", suffix=".tmp", dir=directory)
            staged.append((temp, final))
            try:
                try:
                    payload.copy_to(fd)
                except OffloadError as exc:
                    raise _Fail(printable(_named(payload.file, str(exc)))) from None
                os.fchmod(fd, 0o666 & ~mask)
            finally:
                os.close(fd)
            result[id(payload)] = final
        while staged:
            temp, final = staged[0]
            os.replace(temp, final)
            staged.pop(0)
    except BaseException:
        for temp, _ in staged:
            try:
                os.unlink(temp)
            except OSError:
                pass
        if created:
            try:
                os.rmdir(directory)
            except OSError:
                pass
        raise
    return result


def _describe(payload: Payload) -> str:
    """What the record holding the payload is: ``bundle 1 at 0x2000: <id>`` and the like."""
    if payload.format == "offload binary":
        return f"offload binary {payload.index} at {payload.header_offset:#x}"
    if payload.format == "nvidia fatbin":
        return f"nvidia fatbin {payload.index} at {payload.header_offset:#x}"
    if payload.compression is not None:
        c = payload.compression
        return (f"compressed bundle {payload.index} at {c.offset:#x} (CCOB v{c.version} {c.method}, "
                f"{c.total_size} -> {c.uncompressed_size} bytes): {payload.bundle_id}")
    if payload.format == "bundle":
        return f"bundle {payload.index} at {payload.header_offset:#x}: {payload.bundle_id}"
    return f"{payload.format}: {payload.bundle_id}"


def _render_text(inspections: Sequence[Inspection], extracted: dict[int, str]) -> str:
    """One line per payload (and per fat binary entry); names from the files shown with :func:`printable`."""
    from offload_builders.formats.inspect import printable

    lines = []
    for inspection in inspections:
        for p in inspection.payloads:
            line = (f"{p.origin}: {_describe(p)}: kind={p.kind} triple={p.triple} arch={p.arch} "
                    f"image={p.image_kind} size={p.size} offset={p.offset:#x}")
            if p.offset_in != "file":
                line += f" (in the {p.offset_in})" if p.offset_in == "decompressed bundle" else f" (in {p.offset_in})"
            if id(p) in extracted:
                line += f" -> {extracted[id(p)]}"
            lines.append(line)
            for e in p.entries:
                flag = f" compressed ({e.uncompressed_size} bytes uncompressed)" if e.compressed else ""
                lines.append(f"    entry: {e.kind} {e.arch or '?'} size={e.size} offset={e.offset:#x}{flag}")
    return "".join(printable(line) + "\n" for line in lines)


def _render_json(inspections: Sequence[Inspection], extracted: dict[int, str]) -> str:
    files = []
    for inspection in inspections:
        payloads = []
        for p in inspection.payloads:
            item = p.as_dict()
            item["extracted"] = extracted.get(id(p))
            payloads.append(item)
        files.append({"file": inspection.file, "payloads": payloads})
    return json.dumps({"files": files}, indent=2) + "\n"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
