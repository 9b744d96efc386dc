"""The phases of an offload build, declared once.

Each row names a phase (:class:`Phase`, passed explicitly wherever a phase is meant), the offload models
that run it, the name of the node it makes, whether it runs per source, per target or per program, its
``$OFFLOAD_<PHASE>COM`` / ``COMSTR`` pair and its default command. The SCons tool takes its variable
defaults and its node names from here, and the tests check the README's phase tables against it.

This module has no SCons imports.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


class Phase(enum.Enum):
    """A step of the build, named as in ``$OFFLOAD_<PHASE>COM``."""

    HOST = "HOST"              # OpenMP: host front end to bitcode; HIP: the host compile, the object itself
    DEVICE = "DEVICE"          # device compile, one per target ID
    ASSEMBLE = "ASSEMBLE"      # NVPTX only: ptxas (OpenMP: the second step of the device compile's node)
    DEVICELINK = "DEVICELINK"  # device link (a HIP object's code object, or a program's per-target image)
    BUNDLE = "BUNDLE"          # HIP: the fat binary of a source's code objects
    PACKAGE = "PACKAGE"        # offload binary of a source's device images (OpenMP, HIP RDC)
    EMBED = "EMBED"            # OpenMP: host back end embedding the package, the object itself
    AR = "AR"                  # static library
    RUNTIMESYMS = "RUNTIMESYMS"  # NVPTX, OpenMP: what the cubins take from the device runtime, and its bitcode
    RUNTIMELINK = "RUNTIMELINK"  # NVPTX, OpenMP: the device runtime's LTO and ptxas, for that interface alone
    EXTRACT = "EXTRACT"        # the device files one target's link needs
    GROUPS = "GROUPS"          # OpenMP image groups: which link inputs each group's image holds
    GROUPLINK = "GROUPLINK"    # OpenMP image groups: one target's image of every group
    WRAP = "WRAP"              # registration code for the linked images
    LINK = "LINK"              # host link, the program itself


class Scope(enum.Enum):
    """How often a phase runs."""

    SOURCE = "per source"
    TARGET = "per target"      # per source and target ID, or per program and target ID (``side``)
    PROGRAM = "per program"    # per program or library


class Default(enum.Enum):
    """What the default of ``$OFFLOAD_<PHASE>COM`` is."""

    COMMAND = "command"        # a command line or ``$_OFFLOAD_*`` renderer: the variable's default as written
    ACTION = "action"          # an in-process Python action of the model's module, by name


OPENMP = "openmp"
HIP = "hip"
CUDA = "cuda"
MODELS: tuple[str, ...] = (OPENMP, HIP)

#: The host link's default command line.
LINK_COMMAND = ("$OFFLOAD_CXX -o ${TARGET}$OFFLOAD_PARTIAL_SUFFIX $_OFFLOAD_WRAPPER_OBJECT $OFFLOAD_LINKFLAGS"
                " $LINKFLAGS $_OFFLOAD_RPATH $SOURCES $_LIBDIRFLAGS $_LIBFLAGS $_OFFLOAD_HOST_RUNTIME")


@dataclass(frozen=True)
class PhaseRow:
    """One phase as one model runs it."""

    phase: Phase
    models: tuple[str, ...]
    title: str                 # the README's name of the phase
    node: str                  # node name: {stem} of the object, {program}, {target} (file token), {suffix}, {obj}
    scope: Scope
    side: str                  # "compile" (OffloadObject) or "link" (OffloadProgram, OffloadStaticLibrary)
    default_kind: Default
    default: str               # the command, or the action's name in the model's SCons module (link side:
    #                            offload_builders.scons.program, which serves every model)
    message: str = ""          # the default of ``$OFFLOAD_<PHASE>COMSTR`` ("": unset, SCons prints the command)

    @property
    def com(self) -> str:
        return f"OFFLOAD_{self.phase.value}COM"

    @property
    def comstr(self) -> str:
        return f"OFFLOAD_{self.phase.value}COMSTR"


COMPILE, LINK = "compile", "link"
_C, _L = COMPILE, LINK
_CMD, _ACT = Default.COMMAND, Default.ACTION

#: Every phase of every model, in the order a build runs them.
PHASES: tuple[PhaseRow, ...] = (
    # OpenMP, per source: host front end, device compile (and ptxas), package, embed.
    PhaseRow(Phase.HOST, (OPENMP,), "host front end", "{stem}.host.bc", Scope.SOURCE, _C, _CMD, "$_OFFLOAD_HOST_CC1"),
    PhaseRow(Phase.DEVICE, (OPENMP,), "device compile", "{stem}.{target}.dev{suffix}", Scope.TARGET, _C, _CMD,
             "$_OFFLOAD_DEVICE_CC1"),
    # The PTX is ptxas' input alone: an NVPTX device compile's node writes it, assembles it and removes it.
    PhaseRow(Phase.ASSEMBLE, (OPENMP,), "assemble", "{stem}.{target}.dev.cubin{suffix}", Scope.TARGET, _C, _CMD,
             "$_OFFLOAD_ASSEMBLE_CMD"),
    # The package is the embed's input alone: the object's node writes it, embeds it and removes it.
    PhaseRow(Phase.PACKAGE, (OPENMP,), "package", "{stem}{obj}", Scope.SOURCE, _C, _ACT, "PACKAGE_IN_PROCESS"),
    PhaseRow(Phase.EMBED, (OPENMP,), "embed", "{stem}{obj}", Scope.SOURCE, _C, _CMD, "$_OFFLOAD_EMBED_CC1"),
    # HIP, per source: device compile, device link to a code object (or RDC: package), fat binary, host compile.
    PhaseRow(Phase.DEVICE, (HIP,), "device compile", "{stem}.{target}.dev{suffix}", Scope.TARGET, _C, _CMD,
             "$_OFFLOAD_DEVICE_CC1"),
    # Not RDC, the device object is the link's input alone: the code object's node compiles, links and removes it.
    PhaseRow(Phase.DEVICELINK, (HIP,), "device link", "{stem}.{target}.hsaco", Scope.TARGET, _C, _CMD,
             "$_OFFLOAD_DEVICE_LINK_CMD"),
    PhaseRow(Phase.BUNDLE, (HIP,), "fat binary", "{stem}.hipfb", Scope.SOURCE, _C, _ACT, "BUNDLE_IN_PROCESS"),
    PhaseRow(Phase.PACKAGE, (HIP,), "package", "{stem}.offload.pkg", Scope.SOURCE, _C, _CMD, "$_OFFLOAD_PACKAGE_CMD"),
    PhaseRow(Phase.HOST, (HIP,), "host compile", "{stem}{obj}", Scope.SOURCE, _C, _CMD, "$_OFFLOAD_HOST_CC1"),
    # CUDA, per source: device compile (PTX) and ptxas (cubin), one node per target whose targets are the cubin and
    # the PTX (the fat binary holds both); the toolkit's fatbinary (or RDC: package), host compile.
    PhaseRow(Phase.DEVICE, (CUDA,), "device compile", "{stem}.{target}.dev{suffix}", Scope.TARGET, _C, _CMD,
             "$_OFFLOAD_DEVICE_CC1"),
    PhaseRow(Phase.ASSEMBLE, (CUDA,), "assemble", "{stem}.{target}.cubin", Scope.TARGET, _C, _CMD,
             "$_OFFLOAD_ASSEMBLE_CMD"),
    PhaseRow(Phase.BUNDLE, (CUDA,), "fat binary", "{stem}.fatbin", Scope.SOURCE, _C, _CMD, "$_OFFLOAD_FATBINARY_CMD"),
    PhaseRow(Phase.PACKAGE, (CUDA,), "package", "{stem}.offload.pkg", Scope.SOURCE, _C, _CMD, "$_OFFLOAD_PACKAGE_CMD"),
    PhaseRow(Phase.HOST, (CUDA,), "host compile", "{stem}{obj}", Scope.SOURCE, _C, _CMD, "$_OFFLOAD_HOST_CC1"),
    # Both models, the static library. Its command (and ranlib) runs on an archive in <target>.ar/, which
    # ${TARGET}$OFFLOAD_PARTIAL_SUFFIX names while it runs, where GNU ar's temporary stays if it is killed.
    PhaseRow(Phase.AR, MODELS, "archive", "{program}", Scope.PROGRAM, _L, _CMD,
             "$AR $ARFLAGS ${TARGET}$OFFLOAD_PARTIAL_SUFFIX $SOURCES"),
    # The program: per target ID extract and device link (with $OFFLOAD_IMAGE_GROUPS: the plan, then per target
    # every group's link), one wrap, the host link; for an OpenMP NVPTX target
    # first the device runtime's interface (a second output: the runtime's selected bitcode) and its link.
    # These two are the tool's own nodes, which a project's phase labels may not know: unlabelled, SCons would
    # print their in-process functions' repr, so they have a message (the sample projects' label style).
    PhaseRow(Phase.RUNTIMESYMS, (OPENMP,), "device runtime interface", "{program}.{target}.devicertl.syms",
             Scope.TARGET, _L, _ACT, "RUNTIMESYMS_IN_PROCESS", "device runtime interface [$OFFLOAD_TARGET]: $TARGET"),
    PhaseRow(Phase.RUNTIMELINK, (OPENMP,), "device runtime link", "{program}.{target}.devicertl.pkg", Scope.TARGET,
             _L, _ACT, "RUNTIMELINK_IN_PROCESS", "device runtime link [$OFFLOAD_TARGET]: $TARGET"),
    PhaseRow(Phase.EXTRACT, MODELS, "extract", "{program}.{target}.devin", Scope.TARGET, _L, _ACT,
             "EXTRACT_IN_PROCESS"),
    PhaseRow(Phase.GROUPS, (OPENMP,), "image groups", "{program}.offload.groups", Scope.PROGRAM, _L, _ACT,
             "GROUPS_IN_PROCESS"),
    PhaseRow(Phase.GROUPLINK, (OPENMP,), "group device links", "{program}.{target}.groups", Scope.TARGET, _L, _ACT,
             "GROUPLINK_IN_PROCESS"),
    PhaseRow(Phase.DEVICELINK, (OPENMP,), "device link", "{program}.{target}.img", Scope.TARGET, _L, _CMD,
             "$_OFFLOAD_DEVICE_LINK_CMD"),
    PhaseRow(Phase.DEVICELINK, (HIP,), "device link", "{program}.{target}.hsaco", Scope.TARGET, _L, _CMD,
             "$_OFFLOAD_DEVICE_LINK_CMD"),
    PhaseRow(Phase.WRAP, MODELS, "wrap", "{program}.offload.wrapper{obj}", Scope.PROGRAM, _L, _ACT,
             "WRAP_IN_PROCESS"),
    PhaseRow(Phase.LINK, MODELS, "host link", "{program}", Scope.PROGRAM, _L, _CMD, LINK_COMMAND),
)


def row(phase: Phase, model: str, side: str = _C) -> PhaseRow:
    """The row of ``phase`` as ``model`` runs it on ``side`` (``compile`` or ``link``); a missing one is a
    programming error."""
    for candidate in PHASES:
        if candidate.phase is phase and model in candidate.models and candidate.side == side:
            return candidate
    raise KeyError(f"no {side} phase {phase.value} in the {model} model")


def node_name(phase: Phase, model: str, side: str = _C, **values: str) -> str:
    """The name of the node ``phase`` makes (``stem``, ``program``, ``target``, ``suffix``, ``obj`` as its
    pattern needs them)."""
    return row(phase, model, side).node.format(**values)


def message_defaults(model: str) -> dict[str, str]:
    """``$OFFLOAD_<PHASE>COMSTR`` defaults of ``model``'s phases that have one (most have none: SCons then prints
    the command, which is what a user who has not labelled the phases asked for)."""
    return {spec.comstr: spec.message for spec in PHASES if model in spec.models and spec.message}


def command_defaults(model: str) -> dict[str, str]:
    """``$OFFLOAD_<PHASE>COM`` defaults that are commands (the actions are the model module's), for ``model``;
    where a phase runs on both sides with one variable, the compile side's."""
    defaults: dict[str, str] = {}
    for spec in PHASES:
        if model in spec.models and spec.default_kind is Default.COMMAND:
            defaults.setdefault(spec.com, spec.default)
    return defaults
