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
it, so host and cubins must agree), and there it is required; Clang 19 defines none and ignores it.

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
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from offload_builders import __version__
from offload_builders.cli._common import UsageError, run_tool
from offload_builders.cli.options import FLAG, Option, Parser
from offload_builders.driver import CommandTemplate, target_selection_flags
from offload_builders.errors import OffloadError
from offload_builders.models import TARGET_KINDS, source_model as model_of_source
from offload_builders.models.base import BasePhaseModel
from offload_builders.models.cuda import ARCH_LIST_SLOT, CudaPhaseModel
from offload_builders.models.gpu import GpuDeviceSteps, GpuPhaseModel, check_cuid, default_cuid, is_rdc
from offload_builders.models.hip import HipPhaseModel
from offload_builders.models.openmp import DeviceSteps, PhaseModel, language_of
from offload_builders.native_targets import (
    NATIVE,
    described,
    expand_native,
    names_native,
    system_gpu_names,
    toolchain_arch_tools,
)
from offload_builders.phase_table import CUDA, HIP, OPENMP
from offload_builders.source_identity import file_identity
from offload_builders.targets import MODEL_TARGET_KINDS, TargetID, model_targets, parse_offload_archs, parse_target_id
from offload_builders.toolchain import find_toolchain, user_cache

if TYPE_CHECKING:
    from offload_builders.remote.cli_jobs import CachedStep, RemoteSteps

PROG = "offload-compile"

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
  with -fgpu-rdc in the flags: device (bitcode or relocatable cubin), package (as above), host --package <pkg>

OPTIONS:
  -o <file>            - Output; written atomically, left untouched (mtime too) when its bytes are unchanged
  --depfile <file>     - Write a gcc-style depfile (output: source, headers, compiler binaries)
  --absolute-depfile   - Name the depfile's prerequisites by absolute path (CMake reads relative ones from its
                         binary directory, not the command's working directory)
  --target <ID>        - The target ID of a device compile (NVPTX: includes ptxas; the output is the cubin)
  --targets <ID,...>   - The target IDs of the package's or fat binary's images, in the images' order; CUDA
                         device and host: all the source's targets, whose __CUDA_ARCH_LIST__ Clang 20+ defines
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

#: Dependency-file flags: this tool writes the depfile itself, one per node.
_DEPENDENCY_FLAGS = ("-M", "-MD", "-MMD", "-MF", "-MT", "-MQ", "-MP", "-MG", "-MV", "-Wp,-M")
_SUBCOMMANDS = ("host", "device", "package", "embed", "bundle", "check", "compdb-args", "compdb")
#: Where ``compdb`` writes, in the Meson build directory, unless ``-o`` says otherwise.
MESON_DATABASE = os.path.join("offload-compdb", "compile_commands.json")
IDENTITY_SUFFIX = ".identity"


@dataclass
class _Options:
    command: str = ""
    positional: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    output: str | None = None
    depfile: str | None = None
    target: str | None = None
    targets: str | None = None
    host_bc: str | None = None
    package: str | None = None
    fatbin: str | None = None
    cuid: str | None = None
    source_root: str | None = None
    model: str | None = None
    cmake_dir: bool = False
    absolute_depfile: bool = False
    groups: bool = False
    help: bool = False
    version: bool = False


_PARSER = Parser(PROG, [
    Option("-o", dest="output"),
    *(Option(name) for name in ("--depfile", "--target", "--targets", "--host-bc", "--package", "--fatbin",
                                "--cuid", "--source-root", "--model")),
    Option("--cmake-dir", action=FLAG),
    Option("--absolute-depfile", action=FLAG),
    Option("--groups", action=FLAG),
    Option("--help", "-help", "-h", action=FLAG),
    Option("--version", action=FLAG),
], dashes="exact", missing="missing value for {name}",
    unknown="unknown option '{arg}' (compile flags go after '--'; see --help)")


def _parse(argv: Sequence[str]) -> _Options:
    opts = _Options()

    def positional(arg: str) -> None:
        if opts.command:
            opts.positional.append(arg)
        elif arg not in _SUBCOMMANDS:
            raise UsageError(f"unknown subcommand '{arg}'; expected one of {', '.join(_SUBCOMMANDS)}")
        else:
            opts.command = arg

    def compile_flags(rest: list[str]) -> None:
        opts.flags = rest

    _PARSER.parse(argv, opts, positional, rest=compile_flags)
    return opts


def _require(opts: _Options, *names: str) -> None:
    for name in names:
        if getattr(opts, name) is None:
            raise UsageError(f"{opts.command}: {_PARSER.spelling(name)} is required")


def _check_flags(flags: Sequence[str]) -> None:
    for flag in flags:
        if flag in _DEPENDENCY_FLAGS or flag.startswith(("-MF", "-MT", "-MQ", "-Wp,-M")):
            raise UsageError(f"the compile flag '{flag}' writes a dependency file: {PROG} writes one per node,"
                             " use --depfile instead")
    if cuid := [flag for flag in flags if flag.startswith(("-cuid=", "-fuse-cuid="))]:
        raise UsageError(f"the compile flag '{cuid[0]}' sets the CUID: give it with --cuid (the same for every"
                         " phase of a source), or leave the default")
    if selected := target_selection_flags(flags):
        raise UsageError(f"the compile flag '{selected[0]}' selects offload targets: name them with --target/"
                         "--targets (one node per target)")


def _source(opts: _Options, count: int = 1) -> str:
    if len(opts.positional) < count:
        raise UsageError(f"{opts.command}: no source file given")
    source = opts.positional[0]
    if not os.path.isfile(source):
        raise UsageError(f"source file '{source}' not found")
    if source_model(source) == OPENMP:
        language_of(source)
    return source


def source_model(source: str) -> str:
    """The model of ``source`` from its suffix, as in the SCons tool: ``.hip`` HIP, ``.cu`` CUDA, else OpenMP."""
    return model_of_source(source, OPENMP)


def _refuse(opts: _Options, *names: str, why: str) -> None:
    """One line for an option that does not apply to this subcommand and source."""
    for name in names:
        if getattr(opts, name) is not None:
            raise UsageError(f"{opts.command}: {_PARSER.spelling(name)} {why}")


def _input(path: str, option: str) -> str:
    if not os.path.isfile(path):
        raise UsageError(f"{option}: '{path}' not found")
    return path


def _target(text: str, option: str, model: str = OPENMP) -> TargetID:
    """``--target``: one ID; ``native``, the one GPU of this machine that ``model`` compiles for."""
    if names_native(text):
        names = _native_names(text, option, model, f"{option} sm_90")
        if len(names) != 1:
            raise UsageError(f"{option}: '{NATIVE}' stands for {len(names)} targets here ({', '.join(names)}), and"
                             f" {option} takes one: name it, or give them all to a list ({PROG} check {NATIVE})")
        text = names[0]
    try:
        return parse_target_id(text)
    except OffloadError as error:  # one line naming the option
        raise UsageError(f"{option}: {error}") from None


def _native_names(words: str | Sequence[str], option: str, model: str, example: str) -> tuple[str, ...]:
    """What ``native`` in ``words`` stands for (:mod:`offload_builders.native_targets`: this machine's GPUs, asked
    now), those ``model`` compiles for (HIP the AMDGPU ones, CUDA the NVPTX ones, OpenMP all); none, one line."""
    try:
        expand_native(words, ())  # native with features
        names = system_gpu_names(toolchain_arch_tools(find_toolchain()), example=example)
    except OffloadError as error:
        raise UsageError(f"{option}: {error}") from None
    try:
        kept = tuple(name for name in names if parse_target_id(name).kind in TARGET_KINDS[model])
    except OffloadError as error:  # a processor the tools know and this package does not
        raise UsageError(f"{option} ({described(names)}): {error}") from None
    if not kept:
        raise UsageError(f"{option}: '{NATIVE}' found {', '.join(names)} on this machine, and the {model} model"
                         f" compiles for none of them; name the targets instead, e.g. {example}")
    return kept


def _with_native(words: str | Sequence[str], option: str, model: str, example: str
                 ) -> tuple[Sequence[str], str, bool]:
    """``words`` with ``native`` replaced by what it stands for here (:func:`_native_names`), the option to name in
    errors (with what ``native`` stood for), and whether ``native`` was there."""
    if not names_native(words):
        return words, option, False
    names = _native_names(words, option, model, example)
    return expand_native(words, names), f"{option} ({described(names)})", True


def _model() -> PhaseModel:
    return PhaseModel(find_toolchain(), os.getcwd(), user_cache("driver-probes.json", max_entries=256))


# --- running jobs, outputs and depfiles ------------------------------------------------------------------

def _run(argv: Sequence[str]) -> None:
    """Run one job; its own diagnostics go to stderr as they are, a failure is one line naming the tool."""
    try:
        done = subprocess.run(list(argv), check=False)
    except OSError as error:
        raise UsageError(f"cannot run {argv[0]}: {error.strerror}") from None
    if done.returncode != 0:
        raise UsageError(f"{os.path.basename(argv[0])} failed (exit status {done.returncode})")


def _with_dependency_file(argv: Sequence[str], depfile: str, output: str) -> list[str]:
    """A ``-cc1`` job that also writes the headers it reads to ``depfile`` (``-MMD`` semantics)."""
    return [*argv[:2], "-dependency-file", depfile, "-MT", output, *argv[2:]]


def _read_make_dependencies(path: str) -> list[str]:
    """The prerequisites of a Clang-written dependency file (one rule): the paths :func:`_escape` writes back
    as Clang wrote them.

    The inverse of Clang's writer (``PrintFilename`` in ``DependencyFile.cpp``): ``$$`` is ``$``, ``\\#`` is
    ``#``, ``2N+1`` backslashes before a space are ``N`` and a space of the name, other backslashes are
    themselves; words are separated by spaces and ``\\``-newlines only (Clang writes a tab as it is). Reading
    ``$$`` as two dollars wrote ``$$$$`` back, a file that does not exist: Ninja reran the node on every build."""
    with open(path, "rb") as f:
        rest = _after_target(os.fsdecode(f.read()))
    words: list[str] = []
    current: list[str] = []
    index = 0
    while index < len(rest):
        char = rest[index]
        if char == "\\":
            run = len(rest[index:]) - len(rest[index:].lstrip("\\"))
            after = rest[index + run:index + run + 1]
            index += run
            if after == " " and run % 2:
                current.append("\\" * (run // 2) + " ")
                index += 1
                continue
            if after == "#":
                current.append("\\" * (run - 1) + "#")
                index += 1
                continue
            if after != "\n" or run != 1:
                current.append("\\" * run)
                continue
            index += 1  # a line continuation: it separates words
            char = " "
        elif char == "$" and rest[index + 1:index + 2] == "$":
            current.append("$")
            index += 2
            continue
        else:
            index += 1
        if char in " \n":
            if current:
                words.append("".join(current))
            current = []
        else:
            current.append(char)
    if current:
        words.append("".join(current))
    return words


def _after_target(text: str) -> str:
    """The prerequisites of the rule: what follows the first ``:`` that ends the target (Clang writes the
    ``-MT`` target as it is, so a ``:`` inside a path is followed by something other than a blank)."""
    index = 0
    while (index := text.find(":", index)) >= 0:
        if text[index + 1:index + 2] in ("", " ", "\n", "\t") or text[index + 1:index + 3] == "\\\n":
            return text[index + 1:]
        index += 1
    return ""


def _escape(path: str) -> str:
    """``path`` as Clang writes it in a dependency file (``PrintFilename``), byte for byte the same for the
    names Clang lists: ``#`` as ``\\#``, ``$`` as ``$$``, a space as ``\\ `` after doubling the backslashes
    before it; anything else as it is. So Ninja reads from our file what it reads from Clang's for the same
    name (it cannot tell a tab or a trailing backslash, in Clang's file either)."""
    out: list[str] = []
    for index, char in enumerate(path):
        if char == "#":
            out.append("\\")
        elif char == " ":
            out.append("\\" * (1 + len(path[:index]) - len(path[:index].rstrip("\\"))))
        elif char == "$":
            out.append("$")
        out.append(char)
    return "".join(out)


def _write_depfile(opts: _Options, prerequisites: Sequence[str]) -> None:
    """One rule, the output and each prerequisite escaped as Clang escapes them (:func:`_escape`); with
    ``--absolute-depfile`` each prerequisite named relatively (as the compile named it, from the working
    directory) made absolute: CMake reads relative depfile paths from its binary directory, not from the
    command's ``WORKING_DIRECTORY``."""
    depfile, output = opts.depfile, opts.output
    if depfile is None or output is None:
        return
    if opts.absolute_depfile:
        prerequisites = [os.path.abspath(path) for path in prerequisites]
    unique = list(dict.fromkeys(prerequisites))
    text = f"{_escape(output)}:" + "".join(f" \\\n  {_escape(path)}" for path in unique) + "\n"
    partial = _partial(depfile)
    with open(partial, "wb") as f:  # the names' bytes as the file system has them, whatever the locale
        f.write(os.fsencode(text))
    _commit(partial, depfile)


def _binaries(argv: Sequence[str]) -> list[str]:
    """The program a job runs (the real file behind it) and the bitcode libraries it links."""
    files = [os.path.realpath(argv[0])]
    files += [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "-mlink-builtin-bitcode"]
    return files


def _compiler_files(model: BasePhaseModel) -> list[str]:
    """The drivers asked for the jobs: a wrapper (ccache's, Spack's) and what it runs."""
    toolchain = model.toolchain
    return list(dict.fromkeys([str(toolchain.clang), os.path.realpath(toolchain.clang),
                               str(toolchain.clangxx), os.path.realpath(toolchain.clangxx)]))


def _partial(output: str) -> str:
    return output + ".partial"


def _commit(partial: str, output: str) -> None:
    """Rename ``partial`` over ``output``, unless ``output`` already has these bytes: then it stays untouched
    (its mtime too), so Ninja's ``restat`` skips what depends on it."""
    if _same_bytes(partial, output):
        os.unlink(partial)
    else:
        os.replace(partial, output)


def _commit_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through its partial name, names in it as the file system has their bytes."""
    partial = _partial(path)
    with open(partial, "wb") as f:
        f.write(os.fsencode(text))
    _commit(partial, path)


def _same_bytes(a: str, b: str) -> bool:
    try:
        if os.path.getsize(a) != os.path.getsize(b):
            return False
        with open(a, "rb") as fa, open(b, "rb") as fb:
            while True:
                block = fa.read(1 << 20)
                if block != fb.read(1 << 20):
                    return False
                if not block:
                    return True
    except OSError:
        return False


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# --- the remote cache ($OFFLOAD_REMOTE) -------------------------------------------------------------------
#
# Every phase runs through :func:`_produce`: with $OFFLOAD_REMOTE set, the step is keyed first
# (:mod:`offload_builders.remote.cli_jobs`: its jobs' argv, the files it reads under the root, the programs and
# outside files by content), a hit is downloaded into the outputs' ``.partial`` names and committed as a local
# run's outputs are (unchanged bytes keep the old file, for ``restat``), and the depfile (and the OpenMP host's
# ``.identity``) is written as a local run writes it; a miss runs here, then uploads. A compile's headers are
# known before it runs from a dependency scan (:func:`_scan`). The root of the key's paths is ``--source-root``,
# else the working directory.
#
# OpenMP's host front end and device compiles are keyed with the identity (device, inode) of every file they
# read (:func:`~offload_builders.source_identity.file_identity`): their target-region names hold it, so such an
# output is right only for those very files. They share with a build of the same files on the same machine (a
# cleaned or re-created build directory, a CI workspace that keeps its checkout), never with another checkout,
# which is sound, as the SCons tool keys them. The phases that only read what these wrote (OpenMP's package and
# embed) and every HIP and CUDA phase are keyed by content and share across checkouts.

#: A ``-cc1`` job's action flags: a dependency scan replaces the one a job has by ``-Eonly``.
_CC1_ACTIONS = frozenset({"-emit-obj", "-emit-llvm-bc", "-emit-llvm", "-S", "-emit-llvm-only", "-emit-codegen-only"})


def _remote_steps() -> RemoteSteps | None:
    """The remote cache where ``$OFFLOAD_REMOTE`` names one."""
    from offload_builders.remote.cli_jobs import remote_steps

    return remote_steps(PROG)


def _root(opts: _Options) -> str:
    """What the remote cache's paths are relative to: ``--source-root``, else the working directory."""
    return os.path.abspath(opts.source_root) if opts.source_root is not None else os.getcwd()


def _scan(argv: Sequence[str], scratch: str) -> list[str] | None:
    """The files a ``-cc1`` job will read (the source, then the headers: what its ``-dependency-file`` lists, so
    not the system headers, which the toolchain in the key stands for), from the same job preprocessing only
    (``-Eonly``, no ``-o``), before it runs; None where that cannot be had (its diagnostics are for the real
    compile to print)."""
    actions = [index for index, word in enumerate(argv) if word in _CC1_ACTIONS]
    outputs = [index for index, word in enumerate(argv[:-1]) if word == "-o"]
    if list(argv[1:2]) != ["-cc1"] or len(actions) != 1 or len(outputs) != 1:
        return None
    scan = list(argv)
    scan[actions[0]] = "-Eonly"
    del scan[outputs[0]:outputs[0] + 2]
    depfile = os.path.join(scratch, "scan.d")
    try:
        done = subprocess.run(_with_dependency_file(scan, depfile, "scan"), stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        return _read_make_dependencies(depfile) if done.returncode == 0 else None
    except OSError:
        return None


@dataclass
class _Lookup:
    """A step keyed in the remote cache, and the files a dependency scan found it reads (None: no scan)."""

    step: CachedStep
    scanned: list[str] | None


def _lookup(opts: _Options, jobs: Sequence[Sequence[str]], outputs: Sequence[str], *, tools: Sequence[str],
            scan: Sequence[str] | None = None, scratch: str | None = None, inputs: Sequence[str] = (),
            identity: bool = False, in_process: bool = False) -> _Lookup | None:
    """The step of ``jobs`` (run here as they are) writing ``outputs``, keyed, where ``$OFFLOAD_REMOTE`` is set:
    it reads ``inputs`` and, for the ``-cc1`` job ``scan``, what a dependency scan of it lists (each file's
    identity keyed too with ``identity``); it runs the jobs' programs (``in_process``: ``jobs`` describe what
    our code does here) and depends on ``tools``. None: not cached (no remote, a failed scan, a file outside
    the root)."""
    remote = _remote_steps()
    if remote is None:
        return None
    scanned = None
    if scan is not None:
        assert scratch is not None
        scanned = _scan(scan, scratch)
        if scanned is None:
            return None
    read = scanned or []
    root = _root(opts)
    values = [file_identity(path) for path in read] if identity else []
    if scan is not None and _file_names_hold_root(read, root, scan):
        values.append(f"checkout {root}")
    step = remote.step(root, jobs, inputs=[*read, *inputs], outputs=outputs, scratch=scratch,
                       tools=[*(path for argv in jobs if not in_process for path in _binaries(argv)), *tools],
                       values=values, in_process=in_process)
    return _Lookup(step, scanned) if step is not None else None


def _file_names_hold_root(read: Sequence[str], root: str, argv: Sequence[str]) -> bool:
    """Whether ``__FILE__`` (an ``assert``'s message) in the files a compile reads would spell the checkout's
    path: one is named by an absolute path under ``root`` (a CMake build names sources so) that no
    ``-fmacro-prefix-map`` (``-ffile-prefix-map``) rewrites. Its output then holds that path, so its key does
    too: it shares only with checkouts at the same place."""
    from offload_builders.remote.actions import relative_path

    maps = [word.split("=", 1)[1].partition("=")[0] for word in argv if word.startswith("-fmacro-prefix-map=")]
    return any(os.path.isabs(path) and relative_path(path, root) is not None
               and not any(old and path.startswith(old) for old in maps) for path in read)


def _produce(outputs: Sequence[str], produce: Callable[[], list[str]], lookup: _Lookup | None) -> list[str]:
    """Write every output's ``.partial`` file, by ``produce`` (which returns the files the step read) or from the
    remote cache, then commit them all in order (no partial file left on failure). Returns the files read: from
    ``produce``, or on a hit from the dependency scan. A step run here is stored, unless it read other files
    than its scan found (the key would not cover them)."""
    if lookup is not None and lookup.step.fetch(_partial):
        for output in outputs:
            _commit(_partial(output), output)
        return list(lookup.scanned or [])
    try:
        read = produce()
    except BaseException:
        for output in outputs:
            _remove(_partial(output))
        raise
    for output in outputs:
        _commit(_partial(output), output)
    if lookup is not None:
        if lookup.scanned is None or set(read) == set(lookup.scanned):
            lookup.step.store()
        else:
            lookup.step.remote.warn(f"remote cache: not storing {', '.join(outputs)}: the compile read other files"
                                    " than its dependency scan listed")
    return read


# --- the phases --------------------------------------------------------------------------------------------

def _run_to(opts: _Options, argv: Sequence[str], output: str, *, inputs: Sequence[str], tools: Sequence[str]
            ) -> None:
    """Run one job writing ``output``'s partial file (it reads ``inputs``), then commit it; through the remote
    cache where one is set."""
    def produce() -> list[str]:
        _run(argv)
        return list(inputs)

    _produce([output], produce, _lookup(opts, [argv], [output], inputs=inputs, tools=tools))


def _compile_one_job(opts: _Options, argv: Sequence[str], output: str, *, tools: Sequence[str],
                     inputs: Sequence[str] = (), identity: bool = False) -> list[str]:
    """Run a one-job compile writing ``output``'s partial file with its own dependency file, then commit it (no
    partial file left on failure), through the remote cache where one is set; returns the files the compile
    read (the source, then its headers)."""
    with tempfile.TemporaryDirectory(prefix="offload-compile-") as scratch:
        return _compile_jobs(opts, [argv], [output], scratch, tools=tools, inputs=inputs, identity=identity)


def _compile_jobs(opts: _Options, jobs: Sequence[Sequence[str]], outputs: Sequence[str], scratch: str, *,
                  tools: Sequence[str], inputs: Sequence[str] = (), identity: bool = False) -> list[str]:
    """Run a compile (``jobs[0]``, with its own dependency file) and the jobs after it (its assemble or link),
    which write ``outputs``' partial files, then commit them, through the remote cache where one is set; returns
    the files the compile read (the source, then its headers). Intermediate files live in ``scratch``."""
    headers_file = os.path.join(scratch, "deps.d")

    def produce() -> list[str]:
        _run(_with_dependency_file(jobs[0], headers_file, outputs[-1]))
        for job in jobs[1:]:
            _run(job)
        return _read_make_dependencies(headers_file)

    lookup = _lookup(opts, jobs, outputs, tools=tools, scan=jobs[0], scratch=scratch, inputs=inputs,
                     identity=identity)
    return _produce(outputs, produce, lookup)


def _gpu_source_model(opts: _Options) -> str:
    return source_model(opts.positional[0]) if opts.positional else OPENMP


def _host(opts: _Options) -> int:
    if (gpu := _gpu_source_model(opts)) != OPENMP:
        return _gpu_host(opts, gpu)
    _refuse(opts, "fatbin", "cuid", why="is for HIP (.hip) and CUDA (.cu) sources")
    _require(opts, "output")
    assert opts.output is not None
    source = _source(opts)
    model = _model()
    steps = model.host_steps(language_of(source), opts.flags)
    argv = steps.frontend.render(source=source, main_file_name=os.path.basename(source), output=_partial(opts.output))
    read = _compile_one_job(opts, argv, opts.output, tools=_compiler_files(model), identity=True)
    # Every file whose inode names target regions in this bitcode (the source first, then its headers).
    _commit_text(opts.output + IDENTITY_SUFFIX, "".join(file_identity(path) + "\n" for path in read))
    _write_depfile(opts, [*read, *_binaries(argv), *_compiler_files(model)])
    return 0


def _check_identity(host_bc: str) -> None:
    """Fail, naming the file, where a file the host front end read is now another file (another inode)."""
    record = host_bc + IDENTITY_SUFFIX
    try:
        with open(record, "rb") as f:
            lines = [line for line in os.fsdecode(f.read()).split("\n") if line.strip()]
    except OSError:
        raise UsageError(f"'{record}' not found: make '{host_bc}' with `{PROG} host` (it writes this file"
                         " beside it) and declare both as outputs of the host step") from None
    for line in lines:
        path = line.rsplit(" dev=", 1)[0].removesuffix(" missing")
        if file_identity(path) != line:
            _remove(record)
            raise UsageError(f"'{path}' is not the file '{host_bc}' was made from (re-created: another inode),"
                             f" so this compile would emit no kernels; removed '{record}' so that the host step"
                             " runs again: run the build again")


def _device_steps(model: PhaseModel, source: str, target: TargetID, flags: Sequence[str]) -> DeviceSteps:
    return model.device_steps(target, language_of(source), flags)


def _device(opts: _Options) -> int:
    if (gpu := _gpu_source_model(opts)) != OPENMP:
        return _gpu_device(opts, gpu)
    _refuse(opts, "cuid", why="is for HIP (.hip) and CUDA (.cu) sources")
    _require(opts, "output", "target", "host_bc")
    assert opts.output is not None and opts.target is not None and opts.host_bc is not None
    source = _source(opts)
    host_bc = _input(opts.host_bc, "--host-bc")
    target = _target(opts.target, "--target")
    _check_identity(host_bc)
    model = _model()
    steps = _device_steps(model, source, target, opts.flags)
    partial = _partial(opts.output)
    with tempfile.TemporaryDirectory(prefix="offload-compile-") as scratch:
        compiled = os.path.join(scratch, "device" + steps.compile_suffix) if steps.assemble else partial
        argv = steps.compile.render(source=source, main_file_name=os.path.basename(source), host_bc=host_bc,
                                    output=compiled)
        ran = [argv] if steps.assemble is None else [argv, steps.assemble.render(input=compiled, output=partial)]
        read = _compile_jobs(opts, ran, [opts.output], scratch, tools=_compiler_files(model), inputs=[host_bc],
                             identity=True)
    binaries = [path for job in ran for path in _binaries(job)]
    _write_depfile(opts, [*read, host_bc, *binaries, *_compiler_files(model)])
    return 0


def _package(opts: _Options) -> int:
    from offload_builders.formats.offload_binary import kind_table, packager_images, write_offload_binaries

    _require(opts, "output", "targets")
    assert opts.output is not None
    source = _source(opts)
    if (gpu := source_model(source)) != OPENMP:
        return _gpu_package(opts, source, gpu)
    pairs = _images(opts, "package image")
    model = _model()
    # Each image is named with its phase's suffix, as the SCons tool names it: the packager takes the image
    # kind from it (an object from ".o"), so the build system may name its files as it likes.
    named: dict[str, str] = {}
    steps = []
    for index, (target, path) in enumerate(pairs):
        target_steps = _device_steps(model, source, target, opts.flags)
        named[f"image{index}{target_steps.image_suffix}"] = path
        steps.append((target_steps, f"image{index}{target_steps.image_suffix}"))
    partial = _partial(opts.output)
    command = model.package_command(steps, partial)

    def produce() -> list[str]:
        table = kind_table(model.toolchain.major)
        binaries = [image for arg in command if arg.startswith("--image=")
                    for image in packager_images(arg[len("--image="):], table, named.__getitem__)]
        write_offload_binaries(binaries, partial)
        return list(named.values())

    # Written here as the packager would write it: keyed by what it is given and by our code.
    described = ["offload-builders-package", *command[1:], *(f"{name}={path}" for name, path in named.items())]
    _produce([opts.output], produce, _lookup(opts, [described], [opts.output], inputs=list(named.values()),
                                             tools=_compiler_files(model), in_process=True))
    _write_depfile(opts, [*(path for _, path in pairs), *_compiler_files(model)])
    return 0


def _target_list(opts: _Options) -> list[TargetID]:
    """``--targets`` parsed, in the order given: each a valid ID, none twice, none conflicting; ``native``, this
    machine's GPUs that the source's model compiles for (each once)."""
    assert opts.targets is not None
    model = source_model(opts.positional[0]) if opts.positional else OPENMP
    items, option, native = _with_native(opts.targets.split(","), "--targets", model, "--targets sm_90,gfx90a")
    try:
        targets = [parse_target_id(text.strip()) for text in items]
        parse_offload_archs(items)  # conflicting IDs
    except OffloadError as error:
        raise UsageError(f"{option}: {error}") from None
    if native:  # what native stands for may repeat a target named beside it
        targets = list(dict.fromkeys(targets))
    if len(set(targets)) != len(targets):
        raise UsageError(f"--targets: a target ID appears twice in '{opts.targets}'")
    return targets


def _images(opts: _Options, what: str) -> list[tuple[TargetID, str]]:
    """``--targets`` and the images after the source, paired, in the driver's order (target IDs sorted),
    whatever order the build system lists them in."""
    images = [_input(path, what) for path in opts.positional[1:]]
    targets = _target_list(opts)
    if len(targets) != len(images):
        raise UsageError(f"--targets names {len(targets)} targets but {len(images)} images are given;"
                         " give one image per target, in the same order")
    return sorted(zip(targets, images), key=lambda pair: str(pair[0]))


def _embed(opts: _Options) -> int:
    _require(opts, "output", "host_bc", "package")
    assert opts.output is not None and opts.host_bc is not None and opts.package is not None
    source = _source(opts)
    if source_model(source) != OPENMP:
        raise UsageError(f"embed: '{source}' is {source_model(source).upper()}: `{PROG} host` makes its object"
                         " (with --fatbin, or --package with -fgpu-rdc)")
    host_bc = _input(opts.host_bc, "--host-bc")
    package = _input(opts.package, "--package")
    model = _model()
    steps = model.host_steps(language_of(source), opts.flags)
    argv = steps.embed.render(host_bc=host_bc, main_file_name=os.path.basename(source), package=package,
                              output=_partial(opts.output))
    _run_to(opts, argv, opts.output, inputs=[host_bc, package], tools=_compiler_files(model))
    _write_depfile(opts, [host_bc, package, *_binaries(argv), *_compiler_files(model)])
    return 0


# --- HIP and CUDA: device compile (+ link or ptxas), fat binary or package, host compile -------------------

#: The phase model of each GPU model's sources.
_GPU_MODELS: dict[str, type[GpuPhaseModel]] = {HIP: HipPhaseModel, CUDA: CudaPhaseModel}


def _gpu_model(model: str) -> GpuPhaseModel:
    return _GPU_MODELS[model](find_toolchain(), os.getcwd(), user_cache("driver-probes.json", max_entries=256))


def _host_flags(phases: GpuPhaseModel, flags: Sequence[str]) -> tuple[str, ...]:
    """The user's flags plus what the SCons tool adds (:meth:`~offload_builders.models.gpu.GpuPhaseModel.flags_for`)
    for a host compile or a fat binary's parameters, probed with the model's fixed target (neither depends on it)."""
    return phases.flags_for(phases.host_probe_target, flags)


def _check_gpu_targets(phases: GpuPhaseModel, targets: Sequence[TargetID], option: str) -> None:
    """Each of ``targets`` a processor the model offloads to, else one line naming ``option``."""
    for target in targets:
        try:
            phases.check_targets([target])
        except OffloadError as error:
            raise UsageError(f"{option}: {error}") from None


def _gpu_target(phases: GpuPhaseModel, model: str, text: str, option: str) -> TargetID:
    target = _target(text, option, model)
    _check_gpu_targets(phases, [target], option)
    return target


def _device_steps_of(phases: GpuPhaseModel, target: TargetID, flags: Sequence[str]) -> GpuDeviceSteps:
    return phases.device_steps(target, phases.flags_for(target, flags))


def _cuid(opts: _Options, source: str, rdc: bool) -> dict[str, str]:
    """The ``cuid`` slot's value: ``--cuid``, else :func:`~offload_builders.models.gpu.default_cuid` of the
    source's path relative to ``--source-root`` (the SCons tool's rule when that is its top directory), else
    of its absolute path; never the path as given, so every build directory gives the same objects. RDC
    compiles pin none (the new driver does not forward ``-cuid``)."""
    if rdc:
        _refuse(opts, "cuid", why="is for compiles without -fgpu-rdc (relocatable device code has no CUID)")
        return {}
    if opts.cuid is not None:
        try:
            return {"cuid": check_cuid(opts.cuid)}
        except OffloadError as error:
            raise UsageError(f"--cuid: {error}") from None
    path = os.path.abspath(source)
    if opts.source_root is not None:
        path = os.path.relpath(path, os.path.abspath(opts.source_root))
        if path == os.pardir or path.startswith(os.pardir + os.sep):
            raise UsageError(f"--source-root: '{source}' is not inside '{opts.source_root}'")
    return {"cuid": default_cuid(path)}


def _arch_list(opts: _Options, phases: GpuPhaseModel, template: CommandTemplate, flags: Sequence[str],
               target: TargetID | None = None) -> dict[str, str]:
    """CUDA: the arch-list slot's value for ``--targets`` (all the source's targets, ``target`` among them), the
    driver's ``__CUDA_ARCH_LIST__`` for one command compiling them all (Clang 20+); ``{}`` where ``template``
    has no such slot (Clang 19: ``--targets`` is checked and has no effect). HIP compiles take no list."""
    if not phases.takes_target_list:
        _refuse(opts, "targets", why=f"is for `{opts.command}` of CUDA (.cu) sources (a HIP {opts.command}"
                " compile does not depend on the other targets)")
        return {}
    if opts.targets is None:
        if ARCH_LIST_SLOT in template.slots:
            raise UsageError(f"{opts.command}: --targets is required with Clang {phases.toolchain.major}: its CUDA"
                             " compiles define __CUDA_ARCH_LIST__ from all the source's targets; give them all, as"
                             " to `bundle` (e.g. --targets sm_80,sm_90)")
        return {}
    targets = _target_list(opts)
    _check_gpu_targets(phases, targets, "--targets")
    if target is not None and target not in targets:
        raise UsageError(f"{opts.command}: --targets '{opts.targets}' does not name --target {target}: give all"
                         " the source's targets")
    return phases.arch_list_values(template, targets, flags)


def _gpu_device(opts: _Options, model: str) -> int:
    """HIP: the device compile and (without -fgpu-rdc) its lld link to the code object; CUDA: the device
    compile to PTX and ptxas to the cubin, the PTX kept as ``<output>.ptx`` for the fat binary."""
    _refuse(opts, "host_bc", why="is for OpenMP sources (a HIP or CUDA device compile reads only the source)")
    _require(opts, "output", "target")
    assert opts.output is not None and opts.target is not None
    source = _source(opts)
    phases = _gpu_model(model)
    target = _gpu_target(phases, model, opts.target, "--target")
    flags = phases.flags_for(target, opts.flags)
    rdc = is_rdc(flags)
    cuid = _cuid(opts, source, rdc)
    steps = phases.device_steps(target, flags)
    arch_list = _arch_list(opts, phases, steps.compile, flags, target)
    second = steps.second_step
    ptx = phases.kept_compile_output(opts.output, rdc)
    partial = _partial(opts.output)
    with tempfile.TemporaryDirectory(prefix="offload-compile-") as scratch:
        if second is None:
            compiled = partial                      # HIP with -fgpu-rdc: the device bitcode is the output
        elif ptx is not None:
            compiled = _partial(ptx)                # CUDA: the PTX is kept for the fat binary
        else:
            compiled = os.path.join(scratch, "device" + steps.compile_suffix)
        ran = [steps.compile.render(source=source, main_file_name=os.path.basename(source), output=compiled,
                                    **cuid, **arch_list)]
        if second is not None:
            ran.append(second.render(input=compiled, output=partial))
        outputs = [opts.output] if ptx is None else [ptx, opts.output]
        read = _compile_jobs(opts, ran, outputs, scratch, tools=_compiler_files(phases))
    binaries = [path for job in ran for path in _binaries(job)]
    _write_depfile(opts, [*read, *binaries, *_compiler_files(phases)])
    return 0


def _bundle(opts: _Options) -> int:
    """The fat binary of a source compiled without -fgpu-rdc, as its model makes it
    (:meth:`~offload_builders.models.gpu.GpuPhaseModel.fatbin_job`): HIP's written in-process (compressed as the
    flags say), CUDA's by the toolkit's ``fatbinary`` (each cubin, and the PTX beside it where the driver puts PTX
    in)."""
    _require(opts, "output", "targets")
    assert opts.output is not None
    source = _source(opts)
    model = source_model(source)
    if model == OPENMP:
        raise UsageError(f"bundle: '{source}' is neither HIP (.hip) nor CUDA (.cu): its offload package is made by"
                         f" `{PROG} package`")
    pairs = _images(opts, "code object" if model == HIP else "cubin")
    phases = _gpu_model(model)
    _check_gpu_targets(phases, [target for target, _ in pairs], "--targets")
    if is_rdc(_host_flags(phases, opts.flags)):
        raise UsageError(f"bundle: with -fgpu-rdc the device code goes into an offload package: use `{PROG} package`")
    partial = _partial(opts.output)
    job = phases.fatbin_job(opts.flags, pairs, partial, environ=os.environ)
    for path in job.kept:
        _input(path, "the device compile's output (kept beside its image by `device`)")
    if job.command is None:
        write = job.write
        assert write is not None

        def produce() -> list[str]:
            write()
            return list(job.reads)

        # Written here: keyed by what the writer is given and by our code.
        lookup = _lookup(opts, [list(job.described)], [opts.output], inputs=job.reads, tools=_compiler_files(phases),
                         in_process=True)
        _produce([opts.output], produce, lookup)
        binaries: list[str] = []
    else:
        _run_to(opts, job.command, opts.output, inputs=job.reads, tools=_compiler_files(phases))
        binaries = _binaries(job.command)
    _write_depfile(opts, [*job.reads, *binaries, *_compiler_files(phases)])
    return 0


def _gpu_package(opts: _Options, source: str, model: str) -> int:
    """-fgpu-rdc: the offload package of a source's per-target device code (HIP bitcode, CUDA relocatable
    cubins), by ``clang-offload-packager`` as the SCons tool runs it."""
    assert opts.output is not None
    pairs = _images(opts, "device image")
    phases = _gpu_model(model)
    _check_gpu_targets(phases, [target for target, _ in pairs], "--targets")
    if not is_rdc(_host_flags(phases, opts.flags)):
        raise UsageError(f"package: '{source}' is {model.upper()} without -fgpu-rdc: its fat binary is made by"
                         f" `{PROG} bundle` (add -fgpu-rdc to every phase's flags for relocatable device code)")
    images = [(_device_steps_of(phases, target, opts.flags), path) for target, path in pairs]
    partial = _partial(opts.output)
    argv = phases.package_command(images, partial)
    _run_to(opts, argv, opts.output, inputs=[path for _, path in pairs], tools=_compiler_files(phases))
    _write_depfile(opts, [*(path for _, path in pairs), *_binaries(argv), *_compiler_files(phases)])
    return 0


def _gpu_host(opts: _Options, model: str) -> int:
    """The host compile, which is the object: with the fat binary (``--fatbin``, and the CUID its device
    code was compiled with) or, with -fgpu-rdc, the offload package (``--package``)."""
    _refuse(opts, "host_bc", why="is for OpenMP sources (a HIP or CUDA host compile reads the source)")
    _require(opts, "output")
    assert opts.output is not None
    source = _source(opts)
    phases = _gpu_model(model)
    flags = _host_flags(phases, opts.flags)
    rdc = is_rdc(flags)
    if rdc:
        _refuse(opts, "fatbin", why="is for compiles without -fgpu-rdc; with it the host compile takes --package")
        _require(opts, "package")
        assert opts.package is not None
        device_side = {"package": _input(opts.package, "--package")}
    else:
        _refuse(opts, "package", why="is for -fgpu-rdc compiles; without it the host compile takes --fatbin")
        _require(opts, "fatbin")
        assert opts.fatbin is not None
        device_side = {"fatbin": _input(opts.fatbin, "--fatbin")}
    cuid = _cuid(opts, source, rdc)
    steps = phases.host_steps(flags)
    arch_list = _arch_list(opts, phases, steps.compile, flags)
    argv = steps.compile.render(source=source, main_file_name=os.path.basename(source), output=_partial(opts.output),
                                **device_side, **cuid, **arch_list)
    read = _compile_one_job(opts, argv, opts.output, tools=_compiler_files(phases), inputs=list(device_side.values()))
    _write_depfile(opts, [*read, *device_side.values(), *_binaries(argv), *_compiler_files(phases)])
    return 0


def _check(opts: _Options) -> int:
    if not opts.positional:
        raise UsageError("check: no target IDs given (e.g. x86_64,gfx90a)")
    model = (opts.model or OPENMP).lower()
    if model not in MODEL_TARGET_KINDS:
        raise UsageError(f"--model: unknown offload model '{opts.model}'; use openmp, hip or cuda")
    # native: this machine's GPUs (all of them: --model picks its own below), asked now (CMake's configure runs this)
    words, where, _ = _with_native(opts.positional, "check", OPENMP, "OFFLOAD_ARCHS=sm_90,gfx90a")
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
            _GPU_MODELS[model].check_flags(flags)
    except OffloadError as error:
        raise UsageError(str(error)) from None
    return model


def _compdb_args(opts: _Options) -> int:
    """What SRC's compile-database entry adds to the flags (:func:`offload_builders.compile_database.added_arguments`:
    the model's mode, the targets, the tool's device-library and header flags, the host view), one argument per line
    or, with ``--groups``, one option and its value per line, shell-quoted (CMake's ``SHELL:`` options). Only SRC's
    suffix is read: it need not exist (Meson makes a file named in ``run_command`` a dependency of its set-up)."""
    from offload_builders.compile_database import added_arguments, shell_groups

    _require(opts, "targets")
    _refuse(opts, "output", "depfile", "target", "host_bc", "package", "fatbin", "cuid",
            why="is for the compile phases; compdb-args prints arguments")
    if not opts.positional:
        raise UsageError("compdb-args: no source file given")
    source = opts.positional[0]
    targets = _target_list(opts)
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
        if os.path.basename(word) == PROG or (word == __name__ and index and argv[index - 1] == "-m"):
            rest = list(argv[index + 1:])
            return rest if rest and rest[0] in ("package", "bundle") else None
    return None


def _compdb(opts: _Options) -> int:
    """Write a Meson build directory's compile database with an entry per offload source: Meson's own entries
    (:mod:`offload_builders.meson_introspection`), then, for each source that a custom target's ``package`` or
    ``bundle`` command of this tool names and Meson does not list, the driver command of its nodes (the host view,
    :mod:`offload_builders.compile_database`). Its own file, which Meson's set-up never rewrites: a language
    server reads it with ``--compile-commands-dir``."""
    import json

    from offload_builders.compile_database import entry_command
    from offload_builders.meson_introspection import custom_commands, merged, own_entries

    _refuse(opts, "depfile", "target", "targets", "host_bc", "package", "fatbin", "cuid", "source_root",
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
            phase = _parse(call)
            if not phase.positional or phase.targets is None:
                raise UsageError(f"{phase.command} names no source or no --targets")
            source = os.path.normpath(os.path.join(build_dir, phase.positional[0]))
            phase.positional[0] = source
            model = _database_model(source, phase.flags)
            # -o in the database's own directory, named after the (unique) target: nothing a build reads
            object_name = os.path.join(os.path.dirname(output), command.target + ".o")
            argv = entry_command(find_toolchain(), source, model, _target_list(phase), phase.flags, object_name)
        except (UsageError, OffloadError) as error:
            raise UsageError(f"{where}: {error}") from None
        added.append({"directory": build_dir, "file": source, "arguments": argv, "output": object_name})
    entries = merged(own, added)
    os.makedirs(os.path.dirname(output), exist_ok=True)
    _commit_text(output, json.dumps(entries, indent=2, ensure_ascii=False) + "\n")
    return 0


_PHASES = {"host": _host, "device": _device, "package": _package, "embed": _embed, "bundle": _bundle,
           "check": _check, "compdb-args": _compdb_args, "compdb": _compdb}


def _main(opts: _Options) -> int:
    if opts.cmake_dir:  # OffloadBuildersConfig.cmake: cmake -DOffloadBuilders_DIR=$(offload-compile --cmake-dir)
        print(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "cmake"))
        return 0
    if not opts.command:
        raise UsageError(f"no subcommand given; expected one of {', '.join(_SUBCOMMANDS)} (see --help)")
    _check_flags(opts.flags)
    if opts.model is not None and opts.command != "check":
        raise UsageError(f"{opts.command}: --model is for check (a source's model is its suffix's)")
    if opts.source_root is not None and not os.path.isdir(opts.source_root):
        raise UsageError(f"--source-root: '{opts.source_root}' is not a directory")
    return _PHASES[opts.command](opts)


def main(argv: Sequence[str] | None = None) -> int:
    return run_tool(PROG, argv, _parse, _HELP, f"{PROG} (offload-builders) {__version__}", _main)


if __name__ == "__main__":
    sys.exit(main())
