"""``nvlink`` for CUDA 12 tools directories: the command line ``clang-nvlink-wrapper`` gives ``nvlink``, linked
in process by ``libnvJitLink.so.12`` (:mod:`offload_builders.nvjitlink`), which keeps the cubin ELF ABI 7 that
libomptarget 19 loads. :mod:`offload_builders.nvptx_tools` installs it as ``bin/nvlink`` of the directory
it composes from the CUDA 12 wheels; ``$OFFLOAD_NVJITLINK`` names the library.

    nvlink -o OUT -arch sm_90 [-g] [-v] [-O<n>] [-L DIR]... INPUT.cubin...

Library searches (``-l``) are not supported: ``clang-nvlink-wrapper`` resolves archives itself and hands
nvlink files. Every other option is one clear error.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from offload_builders import __version__
from offload_builders.cli._common import UsageError, run_tool
from offload_builders.cli.options import APPEND, FLAG, Option, Parser

PROG = "nvlink"
LIBRARY_VARIABLE = "OFFLOAD_NVJITLINK"

_HELP = f"""OVERVIEW: nvlink's device link of relocatable cubins, run by libnvJitLink.so.12 (offload-builders)
USAGE: {PROG} -o <output> -arch <sm_NN> [options] <input.cubin>...
OPTIONS:
  -o <file>        - The linked cubin
  -arch <sm_NN>    - The target (also --arch, -arch=)
  -g               - Keep debug information
  -v               - Print what is linked
  -O<n>            - Optimization level given to nvJitLink
  -L <dir>         - Accepted and ignored (no library searches)
  ${LIBRARY_VARIABLE} names libnvJitLink.so.12.
"""


@dataclass
class _Options:
    inputs: list[str] = field(default_factory=list)
    output: str | None = None
    arch: str | None = None
    debug: bool = False
    verbose: bool = False
    level: str | None = None
    library_dirs: list[str] = field(default_factory=list)
    libraries: list[str] = field(default_factory=list)
    help: bool = False
    version: bool = False


_PARSER = Parser(PROG, [
    Option("o", dest="output"),
    Option("arch"),
    Option("g", dest="debug", action=FLAG),
    Option("v", dest="verbose", action=FLAG),
    Option("L", dest="library_dirs", action=APPEND),
    Option("l", dest="libraries", action=APPEND),
    Option("help", "h", action=FLAG),
    Option("version", action=FLAG),
])


def _parse(argv: Sequence[str]) -> _Options:
    opts = _Options()
    rest = []
    for arg in argv:
        if len(arg) == 3 and arg.startswith("-O") and arg[2].isdigit():
            opts.level = arg
        else:
            rest.append(arg)
    _PARSER.parse(rest, opts, opts.inputs.append)
    return opts


def _main(opts: _Options) -> int:
    from offload_builders import nvjitlink
    from offload_builders.formats.cubin import EM_CUDA

    if opts.libraries:
        raise UsageError(f"-l{opts.libraries[0]}: library searches are not supported; give the files")
    if not opts.output or not opts.arch:
        raise UsageError("-o and -arch are required")
    if not opts.inputs:
        raise UsageError("no input files")
    library = os.environ.get(LIBRARY_VARIABLE)
    if not library:
        raise UsageError(f"${LIBRARY_VARIABLE} does not name libnvJitLink.so.12 (this nvlink belongs to a tools"
                         " directory composed by offload-builders)")
    inputs = []
    for path in opts.inputs:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as error:
            raise UsageError(f"{path}: {error.strerror}") from None
        cubin = data[:4] == b"\x7fELF" and len(data) > 20 and int.from_bytes(data[18:20], "little") == EM_CUDA
        inputs.append((path, data, nvjitlink.INPUT_CUBIN if cubin else nvjitlink.INPUT_ANY))
    options = [*(["-g"] if opts.debug else []), *([opts.level] if opts.level else [])]
    if opts.verbose:
        sys.stderr.write(f"{PROG}: nvJitLink ({library}) -arch={opts.arch} {' '.join(options)}"
                         f" {' '.join(opts.inputs)} -> {opts.output}\n")
    image = nvjitlink.link(library, opts.arch, inputs, options)
    partial = opts.output + ".partial"
    with open(partial, "wb") as f:
        f.write(image)
    os.replace(partial, opts.output)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_tool(PROG, argv, _parse, _HELP, f"{PROG} (offload-builders {__version__}, nvJitLink)", _main)


if __name__ == "__main__":
    sys.exit(main())
