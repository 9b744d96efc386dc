"""What an ``offload-compile`` command was asked: its options, checked, and the source, targets and images they name.

Every subcommand reads its options through this module, so one spelling of each option and one line per mistake
(an option that does not apply, a missing one, a target ID that is not one) serve them all; ``native`` in a
target list is resolved here (:mod:`offload_builders.native_targets`).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from offload_builders.cli._common import UsageError
from offload_builders.cli.options import FLAG, Option, Parser
from offload_builders.driver import target_selection_flags
from offload_builders.errors import OffloadError
from offload_builders.models import TARGET_KINDS, source_model as model_of_source
from offload_builders.models.openmp import language_of
from offload_builders.native_targets import (
    NATIVE,
    described,
    expand_native,
    names_native,
    system_gpu_names,
    toolchain_arch_tools,
)
from offload_builders.phase_table import OPENMP
from offload_builders.targets import TargetID, parse_offload_archs, parse_target_id
from offload_builders.toolchain import find_toolchain

PROG = "offload-compile"

#: Dependency-file flags: this tool writes the depfile itself, one per node.
DEPENDENCY_FLAGS = ("-M", "-MD", "-MMD", "-MF", "-MT", "-MQ", "-MP", "-MG", "-MV", "-Wp,-M")
SUBCOMMANDS = ("host", "device", "package", "embed", "bundle", "arch-list-check", "check", "compdb-args", "compdb")


@dataclass
class PhaseOptions:
    """The command line of one ``offload-compile`` command: the subcommand, its operands, options and the compile
    flags after ``--``."""

    command: str = ""
    positional: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    output: str | None = None
    depfile: str | None = None
    target: str | None = None
    targets: str | None = None
    targets_file: str | None = None
    archlist_record: str | None = None
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


PARSER = Parser(PROG, [
    Option("-o", dest="output"),
    *(Option(name) for name in ("--depfile", "--target", "--targets", "--targets-file", "--archlist-record",
                                "--host-bc", "--package",
                                "--fatbin", "--cuid", "--source-root", "--model")),
    Option("--cmake-dir", action=FLAG),
    Option("--absolute-depfile", action=FLAG),
    Option("--groups", action=FLAG),
    Option("--help", "-help", "-h", action=FLAG),
    Option("--version", action=FLAG),
], dashes="exact", missing="missing value for {name}",
    unknown="unknown option '{arg}' (compile flags go after '--'; see --help)")


def parse(argv: Sequence[str]) -> PhaseOptions:
    opts = PhaseOptions()

    def positional(arg: str) -> None:
        if opts.command:
            opts.positional.append(arg)
        elif arg not in SUBCOMMANDS:
            raise UsageError(f"unknown subcommand '{arg}'; expected one of {', '.join(SUBCOMMANDS)}")
        else:
            opts.command = arg

    def compile_flags(rest: list[str]) -> None:
        opts.flags = rest

    PARSER.parse(argv, opts, positional, rest=compile_flags)
    return opts


def require(opts: PhaseOptions, *names: str) -> None:
    for name in names:
        if getattr(opts, name) is None:
            raise UsageError(f"{opts.command}: {PARSER.spelling(name)} is required")


def check_flags(flags: Sequence[str]) -> None:
    for flag in flags:
        if flag in DEPENDENCY_FLAGS or flag.startswith(("-MF", "-MT", "-MQ", "-Wp,-M")):
            raise UsageError(f"the compile flag '{flag}' writes a dependency file: {PROG} writes one per node,"
                             " use --depfile instead")
    if cuid := [flag for flag in flags if flag.startswith(("-cuid=", "-fuse-cuid="))]:
        raise UsageError(f"the compile flag '{cuid[0]}' sets the CUID: give it with --cuid (the same for every"
                         " phase of a source), or leave the default")
    if selected := target_selection_flags(flags):
        raise UsageError(f"the compile flag '{selected[0]}' selects offload targets: name them with --target/"
                         "--targets (one node per target)")


def source_file(opts: PhaseOptions, count: int = 1) -> str:
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


def refuse(opts: PhaseOptions, *names: str, why: str) -> None:
    """One line for an option that does not apply to this subcommand and source."""
    for name in names:
        if getattr(opts, name) is not None:
            raise UsageError(f"{opts.command}: {PARSER.spelling(name)} {why}")


def input_file(path: str, option: str) -> str:
    if not os.path.isfile(path):
        raise UsageError(f"{option}: '{path}' not found")
    return path


def target_id(text: str, option: str, model: str = OPENMP) -> TargetID:
    """``--target``: one ID; ``native``, the one GPU of this machine that ``model`` compiles for."""
    if names_native(text):
        names = native_names(text, option, model, f"{option} sm_90")
        if len(names) != 1:
            raise UsageError(f"{option}: '{NATIVE}' stands for {len(names)} targets here ({', '.join(names)}), and"
                             f" {option} takes one: name it, or give them all to a list ({PROG} check {NATIVE})")
        text = names[0]
    try:
        return parse_target_id(text)
    except OffloadError as error:  # one line naming the option
        raise UsageError(f"{option}: {error}") from None


def native_names(words: str | Sequence[str], option: str, model: str, example: str) -> tuple[str, ...]:
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


def with_native(words: str | Sequence[str], option: str, model: str, example: str
                ) -> tuple[Sequence[str], str, bool]:
    """``words`` with ``native`` replaced by what it stands for here (:func:`native_names`), the option to name in
    errors (with what ``native`` stood for), and whether ``native`` was there."""
    if not names_native(words):
        return words, option, False
    names = native_names(words, option, model, example)
    return expand_native(words, names), f"{option} ({described(names)})", True


def target_list(opts: PhaseOptions) -> list[TargetID]:
    """``--targets`` parsed, in the order given: each a valid ID, none twice, none conflicting; ``native``, this
    machine's GPUs that the source's model compiles for (each once)."""
    assert opts.targets is not None
    model = source_model(opts.positional[0]) if opts.positional else OPENMP
    items, option, native = with_native(opts.targets.split(","), "--targets", model, "--targets sm_90,gfx90a")
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


def paired_images(opts: PhaseOptions, what: str) -> list[tuple[TargetID, str]]:
    """``--targets`` and the images after the source, paired, in the driver's order (target IDs sorted),
    whatever order the build system lists them in."""
    paths = [input_file(path, what) for path in opts.positional[1:]]
    targets = target_list(opts)
    if len(targets) != len(paths):
        raise UsageError(f"--targets names {len(targets)} targets but {len(paths)} images are given;"
                         " give one image per target, in the same order")
    return sorted(zip(targets, paths), key=lambda pair: str(pair[0]))

