"""``offload-select --device ID [--device-cap CAP]... [--cov LIST] [--json] FILE``: the image a runtime would load.

Prints the chosen image's entry ID (``hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+``) and exits 0. When a
device finds no image it prints, on stderr, one line saying so and then one line per image with the
requirement the device lacks, and exits 1. With several ``--device`` options (a deployment check) or a
file holding several modules (e.g. a program linking several HIP fat binaries), each printed ID is led by
the device and/or the module's location. ``--json`` prints everything as JSON on stdout (same exit status).
Bad options, device IDs and malformed files end in one ``offload-select: error:`` line and exit 1.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from offload_builders import __version__
from offload_builders.cli._common import UsageError as _Fail, llvm_version_option, run_tool
from offload_builders.cli.options import APPEND, EXTEND, FLAG, Option, Parser

PROG = "offload-select"
DEFAULT_LLVM_VERSION = 19

_HELP = f"""OVERVIEW: Print the device image a runtime would load from a fat object, fat binary or executable.

USAGE: {PROG} --device <target-id> [options] <file>

OPTIONS:
  --device=<id>          - The device, e.g. gfx90a:sramecc+:xnack-, sm_90, x86_64 (repeat for several)
  --device-cap=<caps>    - Capabilities: covN (loader takes code object vN), spirv, no-spirv, ptx-jit,
                           no-ptx-jit, hip, openmp, cuda, libomptarget=X.Y.Z (the OpenMP runtime's
                           LLVM version, whose cubin checks apply; default --llvm-version), NAME=VALUE
                           (comma-separated, repeatable)
  --cov=<list>           - Same as --device-cap=cov<N>,... (e.g. --cov=4,5)
  --json                 - Print machine-readable JSON
  --llvm-version=<N>     - LLVM release whose OffloadBinary kind numbers to use (default {DEFAULT_LLVM_VERSION})
  --help                 - Display available options
  --version              - Display the version of this program

Exit status: 0 when every device finds an image in every module of the file, 1 otherwise.
"""


@dataclass
class _Options:
    files: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    caps: list[str] = field(default_factory=list)
    json: bool = False
    llvm_version: int = DEFAULT_LLVM_VERSION
    help: bool = False
    version: bool = False


def _cov(value: str) -> list[str]:
    """``--cov=4,5``: the capabilities ``cov4``, ``cov5``."""
    versions = [v.strip() for v in value.split(",")]
    if not all(v.isdigit() for v in versions):
        raise _Fail(f"--cov: '{value}' is not a comma-separated list of code object versions")
    return [f"cov{v}" for v in versions]


_PARSER = Parser(PROG, [
    Option("device", dest="devices", action=APPEND),
    Option("device-cap", dest="caps", action=APPEND),
    Option("cov", dest="caps", action=EXTEND, check=_cov),
    Option("llvm-version", check=llvm_version_option),
    Option("json", action=FLAG),
    Option("help", "h", action=FLAG),
    Option("version", action=FLAG),
])


def _parse(argv: Sequence[str]) -> _Options:
    """``-x`` and ``--x`` alike; values as ``--device ID`` or ``--device=ID``; ``--`` ends options."""
    opts = _Options()
    _PARSER.parse(argv, opts, opts.files.append)
    return opts


def main(argv: Sequence[str] | None = None) -> int:
    """Run the tool; returns the exit status (0: every device finds an image; 1: not, or an error)."""
    return run_tool(PROG, argv, _parse, _HELP, f"{PROG} (offload-builders {__version__})", _main)


def _note(message: str) -> None:
    """What the tool is about to decompress to read an image's header, when it is much."""
    from offload_builders.formats.inspect import printable

    print(f"{PROG}: note: {printable(message)}", file=sys.stderr, flush=True)


def _main(opts: _Options) -> int:
    if not opts.devices:
        raise _Fail(f"no --device given; try '{PROG} --help'")
    if len(opts.files) != 1:
        raise _Fail(f"expected one input file, got {len(opts.files)}; try '{PROG} --help'")
    import os

    from offload_builders.selection import modules_in, parse_device, select_modules

    devices = [parse_device(d, opts.caps) for d in opts.devices]
    path = opts.files[0]
    if os.path.isdir(path):
        raise _Fail(f"'{path}': Is a directory")
    from offload_builders.errors import OffloadError
    from offload_builders.formats.inspect import printable  # names from the file: no control characters shown

    try:
        if path == "-":
            import shutil
            import tempfile

            with tempfile.NamedTemporaryFile(prefix="offload-select-", suffix=".in") as spool:
                shutil.copyfileobj(sys.stdin.buffer, spool, 1 << 20)
                spool.flush()
                modules = modules_in(spool.name, llvm_version=opts.llvm_version, display="<stdin>", notify=_note)
            path = "<stdin>"
        else:
            modules = modules_in(path, llvm_version=opts.llvm_version, notify=_note)
    except OffloadError as exc:
        raise _Fail(printable(str(exc))) from None
    results = [select_modules(modules, d, path) for d in devices]
    ok = all(r.ok for r in results)
    if opts.json:
        sys.stdout.write(json.dumps({"ok": ok, "results": [r.as_dict() for r in results]}, indent=2) + "\n")
        return 0 if ok else 1
    lines, errors = [], []
    for result in results:
        lead = f"{result.device}: " if len(results) > 1 else ""
        if not result.selections:
            errors.append(f"{PROG}: {lead}{path}: no device images")
        for s in result.selections:
            where = f"{s.module.origin}: " if len(result.selections) > 1 else ""
            if s.chosen is not None:
                lines.append(f"{lead}{where}{s.chosen.entry_id}")
            else:
                errors.append(f"{PROG}: {lead}{where or path + ': '}no image fits {result.device}")
                errors.extend(f"  {reason}" for reason in s.reasons())
    sys.stdout.write("".join(printable(line) + "\n" for line in lines))
    sys.stdout.flush()
    sys.stderr.write("".join(printable(line) + "\n" for line in errors))
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
