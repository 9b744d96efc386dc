"""SCons tool ``offload``: Clang OpenMP and HIP offload compilation as one build node per phase and target.

Builders:

* ``OffloadObject``: source -> fat object, in the model of the source (:mod:`offload_builders.scons.objects`):
  ``.hip`` sources HIP, C and C++ sources ``$OFFLOAD_MODEL``'s (default OpenMP), read per source; each model
  takes the targets of ``$OFFLOAD_ARCHS`` it compiles for. For OpenMP, the emitter expands them into a host
  front-end node, one device-compile node per target ID (plus a ``ptxas`` node for NVPTX), a package node,
  and makes the object itself the embed step. SCons therefore schedules, caches and rebuilds every phase
  and target on its own.
* ``OffloadStaticLibrary``: fat objects (or sources) -> static library; ``ar`` and ``ranlib`` run in a
  scratch directory beside it (:class:`ArchiveInScratch`).
* ``OffloadProgram`` (:mod:`offload_builders.scons.program`, one for every model and any mix of OpenMP,
  HIP and host objects): fat objects, sources and libraries -> program, without ``clang-linker-wrapper``:
  per target ID an extract node (the device files the link needs, Clang 19's rules, see
  :mod:`offload_builders.linking`) and a device-link node; one wrap node (registration code made by
  :mod:`offload_builders.linking.registration`); the program itself is the host link. Adding a target links
  only that target's image again (plus wrap and host link).

Each phase has one ``$OFFLOAD_<PHASE>COM`` / ``$OFFLOAD_<PHASE>COMSTR`` pair. The compile phases'
``COM`` variables default to ``$_OFFLOAD_<PHASE>_CC1``, a callable that renders the installed driver's own
``-cc1`` job for that phase (see :mod:`offload_builders.models.openmp`); the user's ``$CCFLAGS``,
``$CXXFLAGS``/``$CFLAGS``, ``$_CCCOMCOM`` and ``$OFFLOAD_FLAGS`` go through the driver, and
``$OFFLOAD_TARGET_FLAGS[target]`` only into that target's device compile.

This module registers the variables (their phase commands from :mod:`offload_builders.phase_table`) and
the builders. What the models share is in modules named for it: :mod:`~offload_builders.scons.variables`,
:mod:`~offload_builders.scons.rendering`, :mod:`~offload_builders.scons.actions`,
:mod:`~offload_builders.scons.outputs`, :mod:`~offload_builders.scons.content_signatures`,
:mod:`~offload_builders.scons.scanning`, :mod:`~offload_builders.scons.tool_dependencies` and
:mod:`~offload_builders.scons.link_nodes`; the models' emitters and renderers are
:mod:`offload_builders.scons.openmp`'s, :mod:`offload_builders.scons.hip`'s and :mod:`offload_builders.scons.cuda`'s.
"""
from __future__ import annotations

import os
from typing import Any

import SCons.Action
import SCons.Builder
import SCons.Errors
import SCons.Scanner.Prog
import SCons.Subst
import SCons.Util

from offload_builders import leftovers
from offload_builders.scons import compilation_database, hip, objects, openmp, program
from offload_builders.scons.actions import HostLinkAction, PhaseCommandAction, in_process_action, node_action
from offload_builders.scons.construction_variables import SET_BY_TOOL, defaults_of
from offload_builders.scons.external import link_builder
from offload_builders.scons.link_nodes import (
    CHECK_DEPLOYABLE,
    CHECK_REGISTERED_ENTRIES,
    OffloadLinkWarning,
    device_link_level,
    target_link_flags,
)
from offload_builders.scons.openmp import PACKAGE_IN_PROCESS
from offload_builders.scons.outputs import (
    CLEAN_LEFTOVERS,
    COMMIT,
    REMOVE_STALE,
    JournalingCacheDir,  # noqa: F401 - $CACHEDIR_CLASS' default, which defaults_of finds in globals()
    clean_leftovers,
    partial_path,
    unrecorded_outputs,
)
from offload_builders.scons.program import EXTRACT_IN_PROCESS, WRAP_IN_PROCESS
from offload_builders.scons.rendering import rpath_flags
from offload_builders.scons.tool_dependencies import depend_on_device_libraries, program_stamp
from offload_builders.scons.variables import (
    OffloadTargetKeyWarning,
    selected_targets,
    set_default,
    toolchain_exists,
    toolchain_for,
)
from offload_builders.toolchain import Toolchain

#: What this module offered before the tool was split into shared, model and registration modules.
__all__ = [
    "CLEAN_LEFTOVERS", "EXTRACT_IN_PROCESS", "PACKAGE_IN_PROCESS", "WRAP_IN_PROCESS", "OffloadLinkWarning",
    "OffloadTargetKeyWarning", "clean_leftovers", "depend_on_device_libraries", "exists", "generate",
    "in_process_action", "program_stamp", "selected_targets",
]
#: The suffix of a static library's scratch directory, ``<target>.ar/``, where ``ar`` and ``ranlib`` write the
#: archive (see :class:`ArchiveInScratch`); the next run of the node empties it, ``scons -c`` removes it.
ARCHIVE_SCRATCH_SUFFIX = ".ar"

#: The archive's name inside the scratch directory: a fixed word, because it reaches the command through
#: ``$OFFLOAD_PARTIAL_SUFFIX``, which a shell reads unquoted.
_SCRATCH_ARCHIVE = "archive"

#: A thin archive's first bytes: it names its members by paths relative to its own directory.
_THIN_ARCHIVE_MAGIC = b"!<thin>\n"


class ArchiveInScratch(SCons.Action.ActionBase):
    """A static library's ``$OFFLOAD_ARCOM`` and ``$RANLIBCOM``, run on an archive inside ``<target>.ar/``, which
    then becomes the node's partial output.

    GNU ``ar`` and ``ranlib`` write the new archive to a temporary ``stXXXXXX`` in the directory of the archive
    they are given, then put it in place: killed on the way, they leave it, under a random name that no node can
    claim. Given an archive in the scratch directory, that is where it stays, until the next run of the node
    empties the directory (or ``scons -c`` removes it); the library's directory never holds it.
    ``${TARGET}$OFFLOAD_PARTIAL_SUFFIX`` names the archive there while the command runs (and is printed).

    Signed as the two commands with their usual paths, so that a library built before is up to date: an archive
    does not hold its own name, so its bytes are the same. A thin archive does hold paths relative to its
    directory: where ``ar`` wrote one, it is written again beside the target, as it was before."""

    targets = "$TARGETS"
    varlist = ()

    def __init__(self, archive: SCons.Action.ActionBase, ranlib: SCons.Action.ActionBase | None = None) -> None:
        self.archive = archive
        self.ranlib = ranlib

    def _commands(self) -> list[SCons.Action.ActionBase]:
        return [self.archive] if self.ranlib is None else [self.archive, self.ranlib]

    def __call__(self, target, source, env, exitstatfunc=SCons.Action._null, presub=SCons.Action._null,
                 show=SCons.Action._null, execute=SCons.Action._null, chdir=SCons.Action._null, executor=None):
        library = (executor.get_all_targets() if executor else target)[0]
        running = SCons.Action.execute_actions if execute is SCons.Action._null else execute
        scratch = str(library) + ARCHIVE_SCRATCH_SUFFIX
        in_scratch = os.path.join(scratch, _SCRATCH_ARCHIVE)
        partial = partial_path(env, library)
        options = (exitstatfunc, presub, show, execute, chdir)
        if running:
            leftovers.remove_leftovers([scratch])  # what a killed run left
            os.makedirs(scratch)
        try:
            scratch_env = env.Override({"OFFLOAD_PARTIAL_SUFFIX": f"{ARCHIVE_SCRATCH_SUFFIX}/{_SCRATCH_ARCHIVE}"})
            status = self.archive(target, source, scratch_env, *options, executor)
            archive = in_scratch if not running or os.path.exists(in_scratch) else partial
            if not status and running and _is_thin_archive(in_scratch):
                os.unlink(in_scratch)
                archive = partial
                status = self.archive(target, source, env, *options, executor)
            if not status and self.ranlib is not None:
                status = self.ranlib([SCons.Subst.Literal(archive)], source, env, *options)
            if not status and running and archive == in_scratch:
                os.replace(in_scratch, partial)
            return status
        finally:
            if running:
                leftovers.remove_leftovers([scratch])

    def __str__(self) -> str:
        return "\n".join(str(command) for command in self._commands())

    def genstring(self, target, source, env, executor=None) -> str:
        return "\n".join(command.genstring(target, source, env) for command in self._commands())

    def get_presig(self, target, source, env, executor=None) -> bytes:
        return b"".join(bytes(command.get_contents(target, source, env)) for command in self._commands())

    def get_implicit_deps(self, target, source, env, executor=None) -> list:
        return [dep for command in self._commands() for dep in command.get_implicit_deps(target, source, env)]

    def get_varlist(self, target, source, env, executor=None) -> tuple:
        return ()


def _is_thin_archive(path: str) -> bool:
    """Whether ``path`` is a thin archive, whose member paths hold only in the directory it was written in."""
    try:
        with open(path, "rb") as archive:
            return archive.read(len(_THIN_ARCHIVE_MAGIC)) == _THIN_ARCHIVE_MAGIC
    except FileNotFoundError:
        return False


class StepsSignedAs(SCons.Action.ListAction):
    """Steps that run in one order and are signed and described as ``signed_as`` (the node's signature, its
    implicit dependencies, the action SCons records), so that rearranging them rebuilds nothing."""

    def __init__(self, steps: list, signed_as: list) -> None:
        super().__init__(steps)
        self.signed_as = SCons.Action.ListAction(signed_as)

    def __str__(self) -> str:
        return str(self.signed_as)

    def genstring(self, target, source, env, executor=None) -> str:
        return self.signed_as.genstring(target, source, env, executor)

    def get_presig(self, target, source, env, executor=None) -> bytes:
        return self.signed_as.get_presig(target, source, env, executor)

    def get_implicit_deps(self, target, source, env, executor=None) -> list:
        return self.signed_as.get_implicit_deps(target, source, env, executor)

    def get_varlist(self, target, source, env, executor=None) -> list:
        return self.signed_as.get_varlist(target, source, env, executor)


def static_library_action(ranlib: bool) -> SCons.Action.ListAction:
    """``OffloadStaticLibrary``'s action: sweep, archive (and ``ranlib``) in the scratch directory, commit.

    Signed as the list it replaces (sweep, archive, commit, then ``ranlib`` on the library); as that list was, a
    library with ``ranlib`` is not asked of the remote cache."""
    archive = PhaseCommandAction("AR")
    if not ranlib:
        return node_action([REMOVE_STALE, ArchiveInScratch(archive), COMMIT])
    run_ranlib = SCons.Action.Action("$RANLIBCOM", "$RANLIBCOMSTR")
    return StepsSignedAs([REMOVE_STALE, ArchiveInScratch(archive, run_ranlib), COMMIT],
                         signed_as=[REMOVE_STALE, archive, COMMIT, run_ranlib])


def refuse_ninja_generator() -> None:
    """SCons' own Ninja generator (``--experimental=ninja``) turns our in-process phases into ``TEMPLATE``
    edges that a serial SCons daemon runs, and names no header for them: after a header change Ninja would
    run nothing. Silently stale is worse than no support, so the tool refuses to load there."""
    import SCons.Script

    if "ninja" in (SCons.Script.GetOption("experimental") or ()):
        raise SCons.Errors.UserError(
            "the offload tool does not support SCons' Ninja generator (--experimental=ninja): its phases would "
            "become Ninja edges that track no header, and builds would go stale; build with scons itself, or "
            "drive Ninja through Meson and offload-compile (README: Meson and Ninja)")


def _lld_link_flags(env, toolchain: Toolchain) -> list[str]:
    """``$OFFLOAD_LINKFLAGS``' default: ``-fuse-ld=lld`` where the toolchain has ``ld.lld`` and ``$LINKFLAGS``
    chooses no linker, else none."""
    if not toolchain.optional_tool("ld.lld"):
        return []
    linker_chosen = any(str(flag).startswith("-fuse-ld") for flag in SCons.Util.flatten(env.get("LINKFLAGS", [])))
    return [] if linker_chosen else ["-fuse-ld=lld"]


def generate(env, **kwargs: Any) -> None:
    """Add the offload builders and variables to ``env`` without overwriting anything the user set."""
    refuse_ninja_generator()
    for key, value in kwargs.items():  # env.Tool('offload', archs=[...]) sets $OFFLOAD_ARCHS
        name = key.upper()
        env[name if name.startswith("OFFLOAD_") else f"OFFLOAD_{name}"] = value
    toolchain = toolchain_for(env)
    unrecorded_outputs(env)  # before anything is built: outputs a killed build left unrecorded go
    cxx = toolchain.cxx_command  # a wrapper with no C++ twin: itself with --driver-mode=g++
    computed = {"OFFLOAD_CC": str(toolchain.clang), "OFFLOAD_CXX": cxx[0] if len(cxx) == 1 else list(cxx),
                "OFFLOAD_LINKFLAGS": _lld_link_flags(env, toolchain)}
    for key, value in defaults_of(SET_BY_TOOL, globals(), computed).items():  # $CACHEDIR_CLASS: ours journals
        set_default(env, key, value)
    env["_OFFLOAD_TARGET_LINKFLAGS"] = target_link_flags
    env["_OFFLOAD_DEVICE_LINK_LEVEL"] = device_link_level
    openmp.generate(env)
    program.generate(env)
    objects.generate(env)  # OffloadObject, per suffix: .hip is HIP, .cu CUDA, C and C++ take $OFFLOAD_MODEL
    compilation_database.generate(env)  # its objects in SCons' compilation_db tool's database, where it is loaded
    env["_OFFLOAD_RPATH"] = rpath_flags

    env.AddMethod(selected_targets, "OffloadSelectedTargets")
    env["BUILDERS"]["OffloadStaticLibrary"] = link_builder(
        action=static_library_action(ranlib=bool(env.get("RANLIB"))),
        prefix="$LIBPREFIX",
        suffix="$LIBSUFFIX",
        src_suffix="$OBJSUFFIX",
        src_builder="OffloadObject",
        emitter=[program.library_emitter, clean_leftovers([ARCHIVE_SCRATCH_SUFFIX])],
    )
    env["BUILDERS"]["OffloadProgram"] = link_builder(
        action=SCons.Action.ListAction([
            CHECK_REGISTERED_ENTRIES,
            REMOVE_STALE,
            HostLinkAction(),
            CHECK_DEPLOYABLE,
            COMMIT,
        ]),
        emitter=[program.program_emitter, CLEAN_LEFTOVERS],
        prefix="$PROGPREFIX",
        suffix="$PROGSUFFIX",
        src_suffix="$OBJSUFFIX",
        src_builder="OffloadObject",
        target_scanner=SCons.Scanner.Prog.ProgramScanner(),
    )
    objects.check_model(env)
    if env.subst("$OFFLOAD_MODEL") == "hip":
        hip.generate(env)  # what a HIP-model program's link needs; OffloadProgram serves every model


def exists(env) -> bool:
    """True when a usable Clang is found (SCons does not call this for user tools; generate checks too)."""
    return toolchain_exists(env)
