"""``offload-bundler``: a drop-in for ``clang-offload-bundler`` (LLVM 19) in pure Python.

Accepts Clang's options in their single- and double-dash spellings (``-type=o``, ``--type o``),
``-input`` repeated or ``-inputs`` as a comma list (likewise ``-output``/``-outputs``), and the
``OFFLOAD_BUNDLER_*`` environment variables, plus ``COMPRESSED_BUNDLE_FORMAT_VERSION`` (2 or 3) from
LLVM 20+, and ``-###`` (the llvm-objcopy commands of object bundles printed instead of run, see
``_run``).  Validation messages are Clang's.  Any error is one line on stderr (naming the file and
byte offset for a damaged input), exit status 1, no traceback and no partial output.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from offload_builders.cli._common import run_guarded
from offload_builders.cli.options import APPEND, FLAG, LLVM_BOOL, LLVM_UNKNOWN, Option, Parser
from offload_builders.errors import OffloadError
from offload_builders.formats import bundle as bundle_mod

# typing is imported for type checkers only: it costs the command line ~3 ms of start-up.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

    from offload_builders.formats.compressed import CompressionStats

PROG: Final = "offload-bundler"

HELP: Final = """\
OVERVIEW: A tool to bundle several input files of the specified type <type>
referring to the same source file but different targets into a single
one. The resulting file can also be unbundled into different files by
this tool if -unbundle is provided.

USAGE: offload-bundler [options]

OPTIONS:
  --###                   - Print any external commands that are to be executed instead of actually executing them - for testing purposes.
  --allow-missing-bundles - Create empty files if bundles are missing when unbundling.
  --bundle-align=<uint>   - Alignment of bundle for binary files
  --check-input-archive   - Check if input heterogeneous archive is valid in terms of TargetID rules.
  --compress              - Compress output file when bundling.
  --compression-level=<n> - Specify the compression level (integer)
  --hip-openmp-compatible - Treat hip and hipv4 offload kinds as compatible with openmp kind, and vice versa.
  --input=<string>        - Input file. Can be specified multiple times for multiple input files.
  --inputs=<string>       - [<input file>,...] (deprecated)
  --list                  - List bundle IDs in the bundled file.
  --output=<string>       - Output file. Can be specified multiple times for multiple output files.
  --outputs=<string>      - [<output file>,...] (deprecated)
  --targets=<string>      - [<offload kind>-<target triple>,...]
  --type=<string>         - Type of the files to be bundled/unbundled: i ii cui hipi d ll bc s o a gch ast
  --unbundle              - Unbundle bundled file into several output files.
  --verbose               - Print debug information.

ENVIRONMENT: OFFLOAD_BUNDLER_COMPRESS, OFFLOAD_BUNDLER_COMPRESSION_LEVEL, OFFLOAD_BUNDLER_VERBOSE,
  OFFLOAD_BUNDLER_IGNORE_ENV_VAR, COMPRESSED_BUNDLE_FORMAT_VERSION (2 or 3).
"""  # noqa: E501 (the option lines are clang-offload-bundler's, word for word)


class UsageError(OffloadError):
    """A command-line mistake (Clang's wording where it has one)."""


class Options:
    """The parsed command line: list options keep every occurrence, a flag not given is None (the
    environment decides ``-compress`` and ``-verbose`` then).

    (Plain classes here and below: importing ``dataclasses`` costs the command line ~8 ms.)
    """

    def __init__(self) -> None:
        self.type: str | None = None
        self.targets: list[str] = []
        self.input: list[str] = []
        self.inputs: list[str] = []
        self.output: list[str] = []
        self.outputs: list[str] = []
        self.bundle_align: str | None = None
        self.compression_level: str | None = None
        self.unbundle: bool | None = None
        self.list: bool | None = None
        self.allow_missing_bundles: bool | None = None
        self.compress: bool | None = None
        self.verbose: bool | None = None
        self.hip_openmp_compatible: bool | None = None
        self.check_input_archive: bool | None = None
        self.help: bool | None = None
        self.h: bool | None = None
        self.version: bool | None = None
        self.dry_run: bool | None = None  # -###


_PARSER: Final = Parser(PROG, [
    *(Option(name) for name in ("type", "bundle-align", "compression-level")),
    *(Option(name, action=APPEND) for name in ("targets", "input", "inputs", "output", "outputs")),
    *(Option(name, action=FLAG) for name in ("unbundle", "list", "allow-missing-bundles", "compress", "verbose",
                                             "hip-openmp-compatible", "check-input-archive", "help", "version")),
    Option("h", action=FLAG),
    Option("###", dest="dry_run", action=FLAG),
], missing="for the --{name} option: requires a value!", unknown=LLVM_UNKNOWN, bool_values={**LLVM_BOOL, "": True},
    dash_dash=False)


def _no_positional(arg: str) -> None:
    raise UsageError(f"Too many positional arguments specified! Can specify at most 0 positional "
                     f"arguments: See: {PROG} --help")


def parse_args(argv: Sequence[str]) -> Options:
    """Parse LLVM ``cl`` style options: ``-name=value``, ``--name=value``, ``-name value``, flags."""
    options = Options()
    _PARSER.parse(argv, options, _no_positional)
    return options


def _comma(values: list[str]) -> list[str]:
    """The items of comma-separated lists (``-inputs=a,b``), empty ones dropped."""
    return [item for value in values for item in value.split(",") if item != ""]


class Environment:
    """The ``OFFLOAD_BUNDLER_*`` settings, as ``OffloadBundlerConfig``'s constructor reads them."""

    def __init__(self, verbose: bool | None = None, compress: bool | None = None, level: int | None = None,
                 version: int | None = None, warnings: tuple[str, ...] = ()) -> None:
        self.verbose = verbose
        self.compress = compress
        self.level = level
        self.version = version
        self.warnings = warnings

    @classmethod
    def read(cls, env: dict[str, str] | os._Environ[str]) -> Environment:
        if env.get("OFFLOAD_BUNDLER_IGNORE_ENV_VAR") == "1":
            return cls()
        warnings = []
        verbose = env["OFFLOAD_BUNDLER_VERBOSE"] == "1" if "OFFLOAD_BUNDLER_VERBOSE" in env else None
        compress = env["OFFLOAD_BUNDLER_COMPRESS"] == "1" if "OFFLOAD_BUNDLER_COMPRESS" in env else None
        level = None
        if "OFFLOAD_BUNDLER_COMPRESSION_LEVEL" in env:
            text = env["OFFLOAD_BUNDLER_COMPRESSION_LEVEL"]
            try:
                level = int(text, 10)
            except ValueError:
                warnings.append(f"Warning: Invalid value for OFFLOAD_BUNDLER_COMPRESSION_LEVEL: {text}. "
                                f"Ignoring it.")
        version = None
        if "COMPRESSED_BUNDLE_FORMAT_VERSION" in env:
            text = env["COMPRESSED_BUNDLE_FORMAT_VERSION"]
            if text in ("2", "3"):
                version = int(text)
            else:
                warnings.append(f"Warning: Invalid value for COMPRESSED_BUNDLE_FORMAT_VERSION: {text}. "
                                f"Valid values are 2 or 3. Using default version 2.")
        return cls(verbose, compress, level, version, tuple(warnings))


def _warn(message: str) -> None:
    print(f"{PROG}: warning: {message}", file=sys.stderr)


def _note(message: str) -> None:
    """What a listing is about to decompress, when it is much (a compressed text bundle)."""
    print(f"{PROG}: note: {message}", file=sys.stderr, flush=True)


def _report_stats(stats: Sequence[CompressionStats], *, compressing: bool, level: int | None = None) -> None:
    for item in stats:
        for line in item.describe(compressing=compressing, level=level):
            print(line, file=sys.stderr)


def _run(options: Options, env: Environment) -> int:
    for warning in env.warnings:
        print(warning, file=sys.stderr)
    if options.help or options.h:
        sys.stdout.write(HELP)
        return 0
    if options.version:
        from offload_builders import __version__

        print(f"{PROG} (offload_builders {__version__}), compatible with clang-offload-bundler 19")
        return 0
    file_type = options.type
    if file_type is None:
        raise UsageError("for the --type option: must be specified at least once!")
    if options.input and options.inputs:
        raise UsageError("-inputs and -input cannot be used together, use only -input instead")
    if options.inputs:
        _warn("-inputs is deprecated, use -input instead")
    inputs = options.input + _comma(options.inputs)
    if options.output and options.outputs:
        raise UsageError("-outputs and -output cannot be used together, use only -output instead")
    if options.outputs:
        _warn("-outputs is deprecated, use -output instead")
    outputs = options.output + _comma(options.outputs)
    targets = _comma(options.targets)
    verbose = options.verbose if options.verbose is not None else bool(env.verbose)
    compress = options.compress if options.compress is not None else bool(env.compress)
    unbundling = bool(options.unbundle)
    # -###, as in clang-offload-bundler 19: the only external program either tool runs is llvm-objcopy,
    # for object bundles (-type=o/a with an ELF host: adding the bundle sections when bundling, removing
    # them for the host output when unbundling).  Those commands are printed on stderr, quoted as Clang
    # prints them, instead of being run, and everything else is done as usual, so the outputs are what
    # Clang leaves: device outputs written, the output objcopy would have made empty (or, bundling with
    # -compress, the compressed form of nothing).  Other types run no command and print nothing.  What
    # we print is the command *we* would run: the same program (LLVM 19's llvm-objcopy), arguments and
    # inputs; only temporary files differ: Clang's /tmp/clang-offload-bundler-*.tmp against ours
    # (<tmp>/offload-bundler-*/host-marker, and fat.o or host.o), and when bundling, objcopy writes our
    # temporary rather than the output, which we then put in place atomically.
    dry_run = bool(options.dry_run)
    bundle_mod.check_file_type(file_type)

    if options.list:
        if unbundling:
            raise UsageError("-unbundle and -list cannot be used together")
        if len(inputs) != 1:
            raise UsageError("only one input file supported for -list")
        if outputs:
            raise UsageError("-outputs option is invalid for -list")
        if targets:
            raise UsageError("-targets option is invalid for -list")
        ids = bundle_mod.list_bundle_ids(inputs[0], file_type=file_type, notify=_note)
        sys.stdout.write("".join(f"{i}\n" for i in ids))
        return 0
    if options.check_input_archive:
        if not unbundling:
            raise UsageError("-check-input-archive cannot be used while bundling")
        if file_type != "a":
            raise UsageError("-check-input-archive can only be used for unbundling archives (-type=a)")
    if not outputs:
        raise UsageError("no output file specified!")
    if not options.targets:
        raise UsageError("for the --targets option: must be specified at least once!")
    if unbundling:
        if len(inputs) != 1:
            raise UsageError("only one input file supported in unbundling mode")
        if len(outputs) != len(targets):
            raise UsageError("number of output files and targets should match in unbundling mode")
        common = dict(allow_missing_bundles=bool(options.allow_missing_bundles),
                      hip_openmp_compatible=bool(options.hip_openmp_compatible))
        if file_type == "a":
            from offload_builders.formats.bundle_archive import unbundle_archive  # only -type=a needs it

            unbundle_archive(inputs[0], targets, outputs, **common,
                             check_input_archive=bool(options.check_input_archive),
                             print_external_commands=dry_run)
        else:
            result = bundle_mod.unbundle(inputs[0], targets, outputs, file_type=file_type, **common,
                                         print_external_commands=dry_run)
            if verbose:
                _report_stats(result.compression, compressing=False)
        return 0
    if file_type == "a":
        raise UsageError("Archive files are only supported for unbundling")
    if len(outputs) != 1:
        raise UsageError("only one output file supported in bundling mode")
    if len(inputs) != len(targets):
        raise UsageError("number of input files and targets should match in bundling mode")
    align_text = options.bundle_align or "1"
    try:
        alignment = int(align_text, 0)
    except ValueError:
        raise UsageError(f"for the --bundle-align option: '{align_text}' value invalid for uint argument!") from None
    compression = None
    if compress:
        level_text = options.compression_level
        try:
            level = int(level_text, 10) if level_text is not None else env.level
        except ValueError:
            raise UsageError(f"for the --compression-level option: '{level_text}' value invalid for integer "
                             f"argument!") from None
        from offload_builders.formats.compressed import CompressionOptions, Method

        compression = CompressionOptions(Method.ZSTD, level, env.version or 2)
    bundled = bundle_mod.bundle(inputs, targets, outputs[0], file_type=file_type, bundle_align=alignment,
                                compression=compression, print_external_commands=dry_run)
    if verbose and bundled.compression is not None and compression is not None:
        _report_stats([bundled.compression], compressing=True, level=compression.effective_level)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bundler; return the exit status (0, or 1 after one error line on stderr)."""
    args = sys.argv[1:] if argv is None else list(argv)

    def body() -> int:
        try:
            return _run(parse_args(args), Environment.read(os.environ))
        except OffloadError as exc:
            # Archive member names (and other text from the input) reach messages: no control characters.
            from offload_builders.formats.inspect import printable  # only on this path: start-up stays lean

            message = str(exc)
            shown = " ".join(printable(line) for line in message.splitlines())
            if shown == message:
                raise
            raise OffloadError(shown) from None

    # ValueError: option values the library refuses (a compression level out of range).
    return run_guarded(PROG, body, user_errors=(ValueError,))


if __name__ == "__main__":
    sys.exit(main())
