"""``offload-compile``: one offload compile phase per command (OpenMP, HIP, CUDA), for Meson/Ninja and other pipelines.

Each subcommand runs the installed driver's own job for one phase, rendered through the same phase models
as the SCons tool (:class:`~offload_builders.models.openmp.PhaseModel`, :class:`~offload_builders.models.hip.
HipPhaseModel`, :class:`~offload_builders.models.cuda.CudaPhaseModel`; probes kept in the same per-user
cache)::

    offload-compile host    SRC -o X.host.bc [--depfile D] [-- FLAGS]
    offload-compile device  SRC --host-bc X.host.bc --target T -o X.T.dev.o [--depfile D] [-- FLAGS]
    offload-compile package SRC --targets T1,T2 -o X.pkg IMAGE1 IMAGE2 [--depfile D] [-- FLAGS]
    offload-compile embed   SRC --host-bc X.host.bc --package X.pkg -o X.o [--depfile D] [-- FLAGS]
    offload-compile check   T1,T2 ...        (prints the canonical target-ID list, or fails)
    offload-compile compdb-args SRC --targets T1,T2 [--groups] [-- FLAGS]   (a compile-database entry's arguments)
    offload-compile compdb  BUILDDIR [-o FILE]   (a Meson build's database with an entry per offload source)

A ``.hip`` source is HIP and a ``.cu`` source CUDA, as in the SCons tool, each with three phases::

    offload-compile device  SRC.hip --target T -o X.T.hsaco        (device compile + lld link)
    offload-compile device  SRC.cu  --target T -o X.T.cubin        (device compile + ptxas; PTX in X.T.cubin.ptx)
    offload-compile bundle  SRC --targets T1,T2 -o X.fatbin IMAGE1 IMAGE2   (HIP: in-process; CUDA: fatbinary)
    offload-compile host    SRC --fatbin X.fatbin -o X.o           (-fcuda-include-gpubinary)

and with ``-fgpu-rdc`` in the flags (relocatable device code, as ``$OFFLOAD_RDC``): ``device`` writes the
device bitcode (HIP) or relocatable cubin (CUDA), ``package`` the offload package (``clang-offload-packager``,
kind ``hip`` or ``cuda``) and ``host --package X.pkg`` the object embedding it, for ``offload-link`` or the
SCons tool's link. ``--offload-compress`` in the flags compresses a HIP fat binary as the SCons tool does.

A CUDA ``device`` or ``host`` compile also takes ``--targets T1,T2``, all the source's targets: from Clang 20
the driver defines ``__CUDA_ARCH_LIST__`` from them in every job (CUB and Thrust name their namespace after
it, so host and cubins must agree), and there it is required; Clang 19 defines none and ignores it. Ninja
reruns a command whose line changes, so a ``device`` with ``--targets`` reruns whenever the list does; the list
check avoids that where the list cannot change the device compile's output (as the SCons tool's)::

    offload-compile arch-list-check SRC.cu --target T --targets T1,T2 -o X.T.archlist [--depfile D] [-- FLAGS]
    offload-compile device SRC.cu --target T --targets-file LIST -o X.T.cubin [--depfile D] [-- FLAGS]

``arch-list-check`` runs T's device ``-cc1`` (as ``device`` renders it, with the list) with ``-E -dD`` and
writes the digest of that text without the list's own ``#define`` (or the list itself where the text cannot
tell: a ``#pragma`` the list can reach, flags recording macros or the command line, a failed preprocessing),
left untouched when unchanged; ``device`` reads the list from ``LIST`` (a file the build system writes when it
is set up, not named in its depfile) and the build makes it depend on the record: with ``restat`` it reruns
where the record changed.

Host and device compiles of a non-RDC source share one CUID: ``--cuid C``, else 16 hex digits of the MD5
of the source's path relative to ``--source-root DIR`` (the SCons tool's rule when DIR is its top
directory: the same objects byte for byte), else of its absolute path. Either way the default does not
depend on the directory the commands run in, so two build directories of one tree give the same objects.

Why a command per phase: a build system that runs commands (Ninja) then schedules, skips and rebuilds each
phase and target on its own. Three things make that correct and incremental:

* It owns the dependency files: ``-MD``/``-MF`` in FLAGS are refused (the driver would give every phase of a
  source one file), and ``--depfile`` writes one gcc-style file per node naming its output, the source, the
  headers it read and the compiler binaries (a compiler update rebuilds; Ninja's command hash never sees
  the ``-cc1`` line).
* Outputs are written atomically (``<output>.partial``, renamed), and an output whose bytes did not change
  is left untouched, mtime included, so Ninja's ``restat`` stops the work downstream.
* Source identity: OpenMP target regions are named after the source's (and headers') device and inode
  numbers (:mod:`offload_builders.source_identity`). ``host`` also writes ``<output>.identity`` with the
  identity of every file it read; ``device`` compares it with the files it reads, and where one was
  re-created (same bytes, new inode: a branch switch, an editor's safe-save, rsync) it removes that file
  and fails with one line. Declared as a second output of the host node, its removal makes the next build
  run the host front end again, then every device compile of that source.

Remote cache: with ``$OFFLOAD_REMOTE`` (``grpc://HOST:PORT/INSTANCE``, the SCons tool's variable; the other
``OFFLOAD_REMOTE_*`` settings too) each phase is looked up in that REAPI cache before it runs: a hit is
downloaded into the ``.partial`` names and committed as above, its depfile written as a local run writes it; a
miss runs here and is uploaded. The key does not depend on where the checkout is: its paths are relative to
``--source-root`` (any phase), else the working directory, and a phase reading or writing a file named by a
relative path outside that root runs as without a remote. A compile's headers are found before it runs by a
dependency scan (the same ``-cc1`` job, preprocessing only). OpenMP's host front end and device compiles are
keyed with the identity of the files they read, so they share only with builds of the same files on the same
machine; every other phase shares across checkouts. The remote never fails a phase: a server that cannot be
used is one ``offload-compile: warning:`` line and a local build.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from offload_builders import __version__
from offload_builders.cli._common import UsageError, run_tool
from offload_builders.cli.phase_options import (
    PROG,
    SUBCOMMANDS,
    PhaseOptions,
    check_flags,
    parse,
    refuse,
    require,
    source_model,
    target_list,
    with_native,
)
from offload_builders.cli.phase_runs import commit_text
from offload_builders.errors import OffloadError
from offload_builders.phase_table import OPENMP
from offload_builders.targets import MODEL_TARGET_KINDS, model_targets, parse_offload_archs
from offload_builders.toolchain import find_toolchain

_HELP = f"""OVERVIEW: Run one phase of a Clang OpenMP, HIP or CUDA offload compile (the installed driver's own job).

USAGE: {PROG} host    SRC -o <host.bc> [--depfile <file>] [-- <compile flags>]
       {PROG} device  SRC --host-bc <host.bc> --target <ID> -o <out> [--depfile <file>] [-- <compile flags>]
       {PROG} package SRC --targets <ID,...> -o <pkg> <image per target...> [--depfile <file>] [-- <flags>]
       {PROG} embed   SRC --host-bc <host.bc> --package <pkg> -o <obj> [--depfile <file>] [-- <compile flags>]
       {PROG} check   [--model openmp|hip|cuda] <ID,...>...   print the canonical target-ID list (comma-separated;
                      --model: the targets that model compiles for, possibly none), or fail
       {PROG} compdb-args SRC --targets <ID,...> [--groups] [-- <flags>]   print what the compile-database
                      entry of a source named SRC (its suffix) adds to the flags (one per line; --groups: each
                      option with its value, shell-quoted)
       {PROG} compdb  <Meson build directory> [-o <file>]   write Meson's compile_commands.json with an entry
                      for each source its {PROG} package and bundle commands name (default file:
                      <build directory>/offload-compdb/compile_commands.json)
HIP (.hip) and CUDA (.cu) sources:
       {PROG} device  SRC --target <ID> -o <code object|cubin> [--cuid <C>] [--source-root <dir>] [--depfile <file>]
                      [-- <flags>]          (CUDA: the PTX is written beside the cubin, <cubin>.ptx)
       {PROG} bundle  SRC --targets <ID,...> -o <fatbin> <code object|cubin per target...> [--depfile <file>]
                      [-- <flags>]
       {PROG} host    SRC --fatbin <fatbin> -o <obj> [--cuid <C>] [--source-root <dir>] [--depfile <file>] [-- <flags>]
  CUDA device and host also take --targets <ID,...>, all the source's targets (required from Clang 20)
       {PROG} arch-list-check SRC.cu --target <ID> --targets <ID,...> -o <record> [--depfile <file>] [-- <flags>]
                      CUDA: record what the list changes of that device compile (its -E -dD text's digest
                      without the list's #define, else the list); a device taking the list by --targets-file and
                      depending on the record reruns only where the list changes its output
  with -fgpu-rdc in the flags: device (bitcode or relocatable cubin), package (as above), host --package <pkg>

OPTIONS:
  -o <file>            - Output; written atomically, left untouched (mtime too) when its bytes are unchanged
  --depfile <file>     - Write a gcc-style depfile (output: source, headers, compiler binaries)
  --absolute-depfile   - Name the depfile's prerequisites by absolute path (CMake reads relative ones from its
                         binary directory, not the command's working directory)
  --target <ID>        - The target ID of a device compile (NVPTX: includes ptxas; the output is the cubin)
  --targets <ID,...>   - The target IDs of the package's or fat binary's images, in the images' order; CUDA
                         device and host: all the source's targets, whose __CUDA_ARCH_LIST__ Clang 20+ defines
  --targets-file <file> - CUDA device: --targets read from <file> (one line), so the list is not on the command
                         line (the device depends on its arch-list-check record instead)
  --archlist-record <file> - CUDA device with --targets-file, for build tools that compare times only (make):
                         the source and target's arch-list-check record; where it and the device's own command
                         (the list left out) are what they were at its last compile (<output>.archlist-seen), the
                         outputs are kept and nothing runs
  --host-bc <file>     - The host bitcode (made by `{PROG} host`, with its .identity file)
  --package <file>     - The offload package to embed (OpenMP; HIP and CUDA with -fgpu-rdc)
  --fatbin <file>      - HIP, CUDA: the fat binary (made by `{PROG} bundle`) the host compile includes
  --cuid <C>           - HIP, CUDA: the CUID host and device compiles share (default: 16 hex digits of the MD5
                         of the source's path relative to --source-root, else of its absolute path)
  --source-root <dir>  - What the remote cache's paths are relative to (default: the working directory); HIP,
                         CUDA: also where the default CUID's path starts (the SCons tool's top directory gives
                         the SCons tool's CUID)
  --cmake-dir          - Print the directory of the CMake package config (find_package(OffloadBuilders))
  --help, --version
The compile flags after `--` are the same for every phase of a source (device: plus that target's own).
The compiler is $OFFLOAD_CLANG, else clang-19, /usr/lib/llvm-19/bin/clang, clang.
A target list (check, --targets, --target) may hold `native`: this machine's GPUs, asked at every command of the
compiler's amdgpu-arch and nvptx-arch (its own, else on PATH; $OFFLOAD_AMDGPU_ARCH_TOOL/$OFFLOAD_NVPTX_ARCH_TOOL).
With $OFFLOAD_REMOTE=grpc://HOST:PORT/INSTANCE each phase is looked up in that remote cache (REAPI) first.
"""

#: Where ``compdb`` writes, in the Meson build directory, unless ``-o`` says otherwise.
MESON_DATABASE = os.path.join("offload-compdb", "compile_commands.json")
#: This module, as ``python -m`` names it in a custom command.
_MODULE = "offload_builders.cli.compile"


def _check(opts: PhaseOptions) -> int:
    if not opts.positional:
        raise UsageError("check: no target IDs given (e.g. x86_64,gfx90a)")
    model = (opts.model or OPENMP).lower()
    if model not in MODEL_TARGET_KINDS:
        raise UsageError(f"--model: unknown offload model '{opts.model}'; use openmp, hip or cuda")
    # native: this machine's GPUs (all of them: --model picks its own below), asked now (CMake's configure runs this)
    words, where, _ = with_native(opts.positional, "check", OPENMP, "OFFLOAD_ARCHS=sm_90,gfx90a")
    try:
        targets = parse_offload_archs(words)
    except OffloadError as error:
        raise UsageError(f"{where}: {error}") from None
    print(",".join(str(target) for target in model_targets(model, targets)))
    return 0


def _database_model(source: str, flags: Sequence[str]) -> str:
    """The model of a compile-database entry's ``source``, whose ``flags`` it accepts, else one line."""
    model = source_model(source)
    try:
        if model != OPENMP:
            from offload_builders.cli.gpu_phases import GPU_MODELS

            GPU_MODELS[model].check_flags(flags)
    except OffloadError as error:
        raise UsageError(str(error)) from None
    return model


def _compdb_args(opts: PhaseOptions) -> int:
    """What SRC's compile-database entry adds to the flags (:func:`offload_builders.compile_database.added_arguments`:
    the model's mode, the targets, the tool's device-library and header flags, the host view), one argument per line
    or, with ``--groups``, one option and its value per line, shell-quoted (CMake's ``SHELL:`` options). Only SRC's
    suffix is read: it need not exist (Meson makes a file named in ``run_command`` a dependency of its set-up)."""
    from offload_builders.compile_database import added_arguments, shell_groups

    require(opts, "targets")
    refuse(opts, "output", "depfile", "target", "host_bc", "package", "fatbin", "cuid",
           why="is for the compile phases; compdb-args prints arguments")
    if not opts.positional:
        raise UsageError("compdb-args: no source file given")
    source = opts.positional[0]
    targets = target_list(opts)
    try:
        model = _database_model(source, opts.flags)
        added = added_arguments(find_toolchain(), source, model, targets, opts.flags)
    except (UsageError, OffloadError) as error:
        raise UsageError(f"compdb-args: {error}") from None
    print("\n".join(shell_groups(added) if opts.groups else added))
    return 0


def _offload_call(argv: Sequence[str]) -> list[str] | None:
    """The arguments of this tool's ``package`` or ``bundle`` in a custom command (run as ``offload-compile`` or
    ``python -m offload_builders.cli.compile``), else None: each offload source has one, naming the source, all
    its targets and its flags."""
    for index, word in enumerate(argv):
        if os.path.basename(word) == PROG or (word == _MODULE and index and argv[index - 1] == "-m"):
            rest = list(argv[index + 1:])
            return rest if rest and rest[0] in ("package", "bundle") else None
    return None


def _compdb(opts: PhaseOptions) -> int:
    """Write a Meson build directory's compile database with an entry per offload source: Meson's own entries
    (:mod:`offload_builders.meson_introspection`), then, for each source that a custom target's ``package`` or
    ``bundle`` command of this tool names and Meson does not list, the driver command of its nodes (the host view,
    :mod:`offload_builders.compile_database`). Its own file, which Meson's set-up never rewrites: a language
    server reads it with ``--compile-commands-dir``."""
    import json

    from offload_builders.compile_database import entry_command
    from offload_builders.meson_introspection import custom_commands, merged, own_entries

    refuse(opts, "depfile", "target", "targets", "host_bc", "package", "fatbin", "cuid", "source_root",
           why="is for the compile phases; compdb reads a Meson build directory")
    if len(opts.positional) != 1 or opts.flags:
        raise UsageError("compdb: give one Meson build directory and nothing after it (e.g. compdb build)")
    build_dir = os.path.abspath(opts.positional[0])
    output = os.path.abspath(opts.output or os.path.join(build_dir, MESON_DATABASE))
    try:
        commands, own = custom_commands(build_dir), own_entries(build_dir)
    except OffloadError as error:
        raise UsageError(f"compdb: {error}") from None
    added: list[dict[str, object]] = []
    for command in commands:
        call = _offload_call(command.argv)
        if call is None:
            continue
        where = f"compdb: custom target '{command.target}' ({command.defined_in})"
        try:
            phase = parse(call)
            if not phase.positional or phase.targets is None:
                raise UsageError(f"{phase.command} names no source or no --targets")
            source = os.path.normpath(os.path.join(build_dir, phase.positional[0]))
            phase.positional[0] = source
            model = _database_model(source, phase.flags)
            # -o in the database's own directory, named after the (unique) target: nothing a build reads
            object_name = os.path.join(os.path.dirname(output), command.target + ".o")
            argv = entry_command(find_toolchain(), source, model, target_list(phase), phase.flags, object_name)
        except (UsageError, OffloadError) as error:
            raise UsageError(f"{where}: {error}") from None
        added.append({"directory": build_dir, "file": source, "arguments": argv, "output": object_name})
    entries = merged(own, added)
    os.makedirs(os.path.dirname(output), exist_ok=True)
    commit_text(output, json.dumps(entries, indent=2, ensure_ascii=False) + "\n")
    return 0


def _compile_phase(opts: PhaseOptions) -> int:
    """``host``, ``device``, ``package``: the phase of the source's model (its suffix), whose module is imported
    only now, so that a command imports one model's code (the start-up of every phase command)."""
    if opts.positional and source_model(opts.positional[0]) != OPENMP:
        from offload_builders.cli import gpu_phases as phases
    else:
        from offload_builders.cli import openmp_phases as phases  # type: ignore[no-redef]
    return {"host": phases.host, "device": phases.device, "package": phases.package}[opts.command](opts)


def _embed(opts: PhaseOptions) -> int:
    from offload_builders.cli.openmp_phases import embed

    return embed(opts)


def _bundle(opts: PhaseOptions) -> int:
    from offload_builders.cli.gpu_phases import bundle

    return bundle(opts)


def _arch_list_check(opts: PhaseOptions) -> int:
    if not opts.positional:
        raise UsageError("arch-list-check: no source file given")
    from offload_builders.cli.gpu_phases import arch_list_check

    return arch_list_check(opts)


_PHASES = {"host": _compile_phase, "device": _compile_phase, "package": _compile_phase, "embed": _embed,
           "bundle": _bundle, "arch-list-check": _arch_list_check, "check": _check, "compdb-args": _compdb_args,
           "compdb": _compdb}


def _main(opts: PhaseOptions) -> int:
    if opts.cmake_dir:  # OffloadBuildersConfig.cmake: cmake -DOffloadBuilders_DIR=$(offload-compile --cmake-dir)
        print(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "cmake"))
        return 0
    if not opts.command:
        raise UsageError(f"no subcommand given; expected one of {', '.join(SUBCOMMANDS)} (see --help)")
    check_flags(opts.flags)
    if opts.model is not None and opts.command != "check":
        raise UsageError(f"{opts.command}: --model is for check (a source's model is its suffix's)")
    if opts.targets_file is not None and opts.command != "device":
        raise UsageError(f"{opts.command}: --targets-file is for `device` of CUDA (.cu) sources")
    if opts.archlist_record is not None and opts.targets_file is None:
        raise UsageError(f"{opts.command}: --archlist-record is for `device` of CUDA (.cu) sources with"
                         " --targets-file")
    if opts.source_root is not None and not os.path.isdir(opts.source_root):
        raise UsageError(f"--source-root: '{opts.source_root}' is not a directory")
    return _PHASES[opts.command](opts)


def main(argv: Sequence[str] | None = None) -> int:
    return run_tool(PROG, argv, parse, _HELP, f"{PROG} (offload-builders) {__version__}", _main)


if __name__ == "__main__":
    sys.exit(main())
