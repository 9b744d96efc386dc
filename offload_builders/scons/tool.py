"""SCons tool ``offload``: Clang OpenMP offload compilation as one build node per phase and target.

Builders:

* ``OffloadObject``: source -> fat object. Its emitter expands ``$OFFLOAD_ARCHS`` into a host front-end
  node, one device-compile node per target ID (plus a ``ptxas`` node for NVPTX), a package node, and
  makes the object itself the embed step. SCons therefore schedules, caches and rebuilds every phase
  and target on its own.
* ``OffloadStaticLibrary``: fat objects (or sources) -> static library.
* ``OffloadProgram``: fat objects, sources and libraries -> program, without ``clang-linker-wrapper``:
  per target ID an extract node (the device files the link needs, Clang 19's rules, see
  :mod:`offload_builders.linking`) and a device-link node; one wrap node (registration code made by
  :mod:`offload_builders.registration`); the program itself is the host link. Adding a target links
  only that target's image again (plus wrap and host link).

Each phase has one ``$OFFLOAD_<PHASE>COM`` / ``$OFFLOAD_<PHASE>COMSTR`` pair. The compile phases'
``COM`` variables default to ``$_OFFLOAD_<PHASE>_CC1``, a callable that renders the installed driver's own
``-cc1`` job for that phase (see :mod:`offload_builders.phases`); the user's ``$CCFLAGS``,
``$CXXFLAGS``/``$CFLAGS``, ``$_CCCOMCOM`` and ``$OFFLOAD_FLAGS`` go through the driver, and
``$OFFLOAD_TARGET_FLAGS[target]`` only into that target's device compile.
"""
from __future__ import annotations

import collections
import errno
import functools
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import SCons.Action
import SCons.Builder
import SCons.Errors
import SCons.Node.FS
import SCons.Platform.posix
import SCons.Scanner.Prog
import SCons.Script
import SCons.Subst
import SCons.Tool
import SCons.Util
import SCons.Warnings

from offload_builders import device_libraries, leftovers, linking
from offload_builders.errors import OffloadError
from offload_builders.phases import (
    LANGUAGE_BY_SUFFIX,
    DeviceSteps,
    HostSteps,
    PhaseModel,
    dependency_values,
    language_of,
    portable_signature,
    target_selection_flags,
)
from offload_builders.scons.external import link_builder
from offload_builders.source_identity import identity_signature
from offload_builders.targets import TargetID, parse_offload_archs, parse_target_id
from offload_builders.toolchain import Toolchain, find_toolchain, probe_cache

#: Construction variables this tool reads, with their defaults (set only where the user has not).
_DEFAULTS: dict[str, Any] = {
    "OFFLOAD_MODEL": "openmp",  # or "hip"; read when the tool is loaded
    "OFFLOAD_ARCHS": ["x86_64"],
    "OFFLOAD_FLAGS": [],
    "OFFLOAD_TARGET_FLAGS": {},
    "OFFLOAD_LINKFLAGS": [],
    "OFFLOAD_PARTIAL_SUFFIX": ".partial",
    "OFFLOAD_PROBE_CACHE": ".sconsign.offload-probes.json",  # relative to the top directory; '' disables
    "OFFLOAD_HOSTCOM": "$_OFFLOAD_HOST_CC1",
    "OFFLOAD_DEVICECOM": "$_OFFLOAD_DEVICE_CC1",
    "OFFLOAD_ASSEMBLECOM": "$_OFFLOAD_ASSEMBLE_CMD",
    "OFFLOAD_EMBEDCOM": "$_OFFLOAD_EMBED_CC1",
    "OFFLOAD_DEVICE_LINKFLAGS": ["$_OFFLOAD_DEVICE_LINK_LEVEL"],  # the -O of the link or compile flags, else -O2
    "OFFLOAD_TARGET_LINKFLAGS": {},
    "OFFLOAD_DEPLOY_DEVICES": [],  # e.g. ["gfx90a:sramecc+:xnack-", "sm_90"]: each must find an image
    "OFFLOAD_DEVICELINKCOM": "$_OFFLOAD_DEVICE_LINK_CMD",
    "OFFLOAD_LINKCOM": (
        "$OFFLOAD_CXX -o ${TARGET}$OFFLOAD_PARTIAL_SUFFIX $_OFFLOAD_WRAPPER_OBJECT $OFFLOAD_LINKFLAGS"
        " $LINKFLAGS $_OFFLOAD_RPATH $SOURCES $_LIBDIRFLAGS $_LIBFLAGS $_OFFLOAD_HOST_RUNTIME"
    ),
    "OFFLOAD_ARCOM": "$AR $ARFLAGS ${TARGET}$OFFLOAD_PARTIAL_SUFFIX $SOURCES",
}

#: Driver flags that only change how the compiler runs, never what it produces: kept out of signatures.
_UNSIGNED_FLAG_PREFIXES = ("-v", "-fcolor-diagnostics", "-fno-color-diagnostics", "-fdiagnostics-color",
                           "--offload-jobs=", "-parallel-jobs=", "-ferror-limit=")


def _user_error(error: Exception) -> SCons.Errors.UserError:
    return SCons.Errors.UserError(str(error))


def _toolchain(env) -> Toolchain:
    """The toolchain for ``env``: ``$OFFLOAD_CLANG`` if set, else the process environment's search."""
    environ: Mapping[str, str] = os.environ
    if env.get("OFFLOAD_CLANG"):
        environ = collections.ChainMap({"OFFLOAD_CLANG": env.subst("$OFFLOAD_CLANG")}, os.environ)
    try:
        return find_toolchain(environ)
    except OffloadError as error:
        raise _user_error(error) from None


#: One phase model per toolchain, top directory and probe cache file, so its templates are made once.
_MODELS: dict[tuple[Toolchain, str, str], PhaseModel] = {}


def _model(env) -> PhaseModel:
    top = env.Dir("#").abspath
    cache_path = os.path.join(top, env.subst("$OFFLOAD_PROBE_CACHE")) if env.get("OFFLOAD_PROBE_CACHE") else ""
    key = (_toolchain(env), top, cache_path)
    if key not in _MODELS:
        _MODELS[key] = PhaseModel(key[0], top, probe_cache(cache_path) if cache_path else None)
    return _MODELS[key]


def selected_targets(env) -> tuple[TargetID, ...]:
    """``$OFFLOAD_ARCHS`` parsed, canonicalized and checked, or one ``UserError`` naming the offenders."""
    value = env.get("OFFLOAD_ARCHS")
    if isinstance(value, str):
        value = env.subst(value)
    try:
        return parse_offload_archs(SCons.Util.flatten(value) if not isinstance(value, str) else value)
    except OffloadError as error:
        raise SCons.Errors.UserError(f"OFFLOAD_ARCHS: {error}") from None


def _target_flags(env, target: TargetID, variable: str = "OFFLOAD_TARGET_FLAGS") -> list[str]:
    """``$OFFLOAD_TARGET_FLAGS`` (or another ``{target ID: flags}`` variable) entries for ``target``; keys
    may be spelled any valid way."""
    table = env.get(variable) or {}
    flags: list[str] = []
    for key, value in table.items():
        try:
            canonical = parse_target_id(str(key))
        except OffloadError as error:
            raise SCons.Errors.UserError(f"{variable} key {key!r}: {error}") from None
        if canonical == target:
            flags.extend(env.subst_list(value, SCons.Subst.SUBST_CMD)[0] if value else [])
    return [str(flag) for flag in flags]


class OffloadTargetKeyWarning(SCons.Warnings.WarningOnByDefault):
    """A ``{target ID: flags}`` key that names no target of this build: its flags are not used."""


#: (variable, key, targets) already warned about in this run.
_WARNED_KEYS: set[tuple[str, str, tuple[TargetID, ...]]] = set()


def _warn_unmatched_keys(env, variable: str, targets: Sequence[TargetID]) -> None:
    """Warn once per run about each key of ``$<variable>`` that matches none of ``targets``, naming the
    target it probably means (the same processor with other features): its flags would silently do
    nothing. A warning, not an error: a table that covers more targets than one build selects (with
    ``OFFLOAD_ARCHS`` from the command line) is normal."""
    for key in (env.get(variable) or {}):
        try:
            canonical = parse_target_id(str(key))
        except OffloadError as error:
            raise SCons.Errors.UserError(f"{variable} key {key!r}: {error}") from None
        memo = (variable, str(key), tuple(targets))
        if canonical in targets or memo in _WARNED_KEYS:
            continue
        _WARNED_KEYS.add(memo)
        near = [str(tid) for tid in targets if tid.processor == canonical.processor]
        hint = (f"; did you mean {' or '.join(repr(n) for n in near)}? A key names a target ID of OFFLOAD_ARCHS"
                " exactly, features included" if near else "")
        SCons.Warnings.warn(OffloadTargetKeyWarning,
                            f"{variable} key {key!r} matches no target of this build"
                            f" ({', '.join(str(tid) for tid in targets)}): its flags are not used{hint}")


def _compile_flags(env, target, source, for_signature: bool, language: str) -> tuple[str, ...]:
    """The user's compile flags for a node, as the driver will see them."""
    text = "$OFFLOAD_FLAGS $CCFLAGS " + ("$CXXFLAGS" if language == "c++" else "$CFLAGS") + " $_CCCOMCOM"
    mode = SCons.Subst.SUBST_SIG if for_signature else SCons.Subst.SUBST_CMD
    flags = [str(flag) for flag in env.subst_list(text, mode, target=target, source=source)[0]]
    if for_signature:
        flags = [flag for flag in flags if not flag.startswith(_UNSIGNED_FLAG_PREFIXES)]
    return tuple(flags)


def _partial(env, node) -> str:
    return str(node) + env.subst("$OFFLOAD_PARTIAL_SUFFIX")


def _literal(argv: Sequence[str]) -> list[SCons.Subst.Literal]:
    """Rendered arguments, protected from further ``$`` expansion and word splitting."""
    return [SCons.Subst.Literal(arg) for arg in argv]


def _object_of(target) -> list:
    """The fat object a compile node belongs to, as a target list: ``$TARGET`` in the user's compile flags
    means it in every phase (``-MF ${TARGET}.d`` names one dependency file, written by the host front end),
    and all phases of a source share one driver probe."""
    obj = getattr(target[0].attributes, "offload_object", None) if target else None
    return target if obj is None else [obj]


def _host_steps(env, target, source, for_signature: bool) -> HostSteps:
    language = language_of(str(source[0]))
    return _model(env).host_steps(language, _compile_flags(env, _object_of(target), source, for_signature, language))


def _device_steps(env, target, source, for_signature: bool) -> DeviceSteps:
    language = language_of(str(source[0]))
    tid = parse_target_id(env.subst("$OFFLOAD_TARGET"))
    flags = _compile_flags(env, _object_of(target), source, for_signature, language) + tuple(_target_flags(env, tid))
    return _model(env).device_steps(tid, language, flags)


class _Command:
    """A phase command in SCons' callable-variable convention (``$_OFFLOAD_<PHASE>_CC1`` and friends).

    Renders once per node and mode: SCons asks four or five times (signature, implicit dependencies,
    display, execution), and a node's environment and sources are fixed. The signature's words name the
    checkout only where the output can record it (:func:`~offload_builders.phases.portable_signature`),
    so another checkout shares this one's ``CacheDir`` entries. Our errors become
    ``UserError``. An object rather than a closure: to describe a node, SCons makes a function action
    of the variable's value and hashes its code, which for an object is this small ``__call__``.
    """

    def __init__(self, render: Callable[..., list[str]]) -> None:
        self._render = render
        self.__name__ = render.__name__

    def __call__(self, target, source, env, for_signature) -> list[SCons.Subst.Literal]:
        memo = getattr(target[0].attributes, "_offload_commands", None) if target else None
        key = (self.__name__, bool(for_signature))
        if memo is not None and key in memo:
            return memo[key]
        try:
            argv = self._render(target, source, env, for_signature)
            if for_signature:  # no checkout's location where the output cannot record it (see portable_signature)
                argv = portable_signature(argv, env.Dir("#").abspath)
            rendered = _literal(argv)
        except OffloadError as error:
            raise _user_error(error) from None
        if target:
            if memo is None:
                memo = target[0].attributes._offload_commands = {}
            memo[key] = rendered
        return rendered



@_Command
def _host_cc1(target, source, env, for_signature):
    steps = _host_steps(env, target, source, for_signature)
    return steps.frontend.render(source=str(source[0]), main_file_name=source[0].name,
                                 output=_partial(env, target[0]),
                                 **dependency_values(steps.frontend, str(_object_of(target)[0])))


@_Command
def _device_cc1(target, source, env, for_signature):
    steps = _device_steps(env, target, source, for_signature)
    return steps.compile.render(source=str(source[0]), main_file_name=source[0].name,
                                host_bc=str(source[1]), output=_partial(env, target[0]))


@_Command
def _assemble_cmd(target, source, env, for_signature):
    original = env["_OFFLOAD_ORIGINAL_SOURCE"]
    steps = _device_steps(env, target, [original], for_signature)
    assert steps.assemble is not None
    return steps.assemble.render(input=str(source[0]), output=_partial(env, target[0]))


@_Command
def _package_cmd(target, source, env, for_signature):
    original = env["_OFFLOAD_ORIGINAL_SOURCE"]
    images = []
    for node, tid_text in zip(source, env["_OFFLOAD_PACKAGE_TARGETS"]):
        steps = _device_steps(env.Override({"OFFLOAD_TARGET": tid_text}), target, [original], for_signature)
        images.append((steps, str(node)))
    return _model(env).package_command(images, _partial(env, target[0]))


def _package_in_process(target, source, env) -> int:
    """The package step without a process: our OffloadBinary writer, byte-identical to the packager's
    output for the very ``--image=`` specs the driver would pass it (``$_OFFLOAD_PACKAGE_CMD`` runs the tool)."""
    from offload_builders.formats.offload_binary import kind_table, packager_images, write_offload_binaries

    command = _package_cmd(target, source, env, False)
    table = kind_table(_toolchain(env).major)
    images = []
    for arg in command:
        if str(arg).startswith("--image="):
            images.extend(packager_images(str(arg)[len("--image="):], table))
    write_offload_binaries(images, _partial(env, target[0]))
    return 0


@_Command
def _embed_cc1(target, source, env, for_signature):
    """The object's source is the original source; the emitter recorded its host bitcode and package."""
    inputs = getattr(target[0].attributes, "offload_inputs", None)
    if inputs is None:
        raise SCons.Errors.UserError(f"{target[0]} was not made by OffloadObject")
    host_bc, package = inputs
    steps = _host_steps(env, target, source, for_signature)
    return steps.embed.render(host_bc=str(host_bc), main_file_name=source[0].name, package=str(package),
                              output=_partial(env, target[0]))


def _rpath(target, source, env, for_signature):
    value = env.get("OFFLOAD_RPATH")
    if value is None:
        value = [str(_toolchain(env).lib_dir)]
    return [f"-Wl,-rpath,{path}" for path in SCons.Util.flatten(value) if path]


def _sweep_leftovers(target, source, env) -> int:
    """Before a node's command runs, remove what interrupted runs of it left: ``<target>.partial`` and the
    temporaries Clang, ld.lld and our writers name after it (see :mod:`offload_builders.leftovers`).
    Killed mid-command, they are never written again under the same (random) names and would pile up."""
    suffix = env.subst("$OFFLOAD_PARTIAL_SUFFIX")
    for node in target:
        _LEFTOVERS.sweep(str(node), suffix)
    return 0


#: This build's view of what interrupted builds left (see :class:`offload_builders.leftovers.Leftovers`).
_LEFTOVERS = leftovers.Leftovers()


#: Per project top directory: the outputs replaced in this build that SCons has not recorded yet.
_UNRECORDED: dict[str, leftovers.UnrecordedOutputs] = {}


def _unrecorded_outputs(env) -> leftovers.UnrecordedOutputs:
    """The journal of ``env``'s project; made once per process, when it deletes what a killed build left
    unrecorded (see :class:`offload_builders.leftovers.UnrecordedOutputs`)."""
    top = env.Dir("#").abspath
    journal = _UNRECORDED.get(top)
    if journal is None:
        journal = _UNRECORDED[top] = leftovers.UnrecordedOutputs(os.path.join(top, ".sconsign.offload-unrecorded"))
        if not SCons.Script.GetOption("no_exec"):
            journal.recover()
        _settle_journals_after_sconsign_write()
    return journal


def _settle_journals_after_sconsign_write() -> None:
    """Once SCons has written ``.sconsign`` (at the end of every build, interrupted by Ctrl-C or not), the
    journals are settled. SCons has no hook there, so its ``write`` is wrapped (once)."""
    import SCons.SConsign

    original = SCons.SConsign.write
    if getattr(original, "offload_settles_journals", False):
        return

    def write(*args, **kwargs):
        original(*args, **kwargs)
        for journal in _UNRECORDED.values():
            journal.settle()

    write.offload_settles_journals = True  # type: ignore[attr-defined]
    SCons.SConsign.write = write


def _commit(target, source, env) -> int:
    """Move each finished ``<target>.partial`` into place, so no half-written target ever exists; journal
    it first, so that a build killed before SCons records it cannot leave it looking up to date."""
    for node in target:
        partial = _partial(env, node)
        if os.path.exists(partial):
            _unrecorded_outputs(env).add(node.get_abspath())
            os.replace(partial, str(node))
        elif not os.path.exists(str(node)):
            raise SCons.Errors.BuildError(node=node, errstr=f"the command did not write {partial}")
    return 0


_REMOVE_STALE = SCons.Action.Action(_sweep_leftovers, None)
_COMMIT = SCons.Action.Action(_commit, None)


def clean_leftovers(scratch_suffixes: Sequence[str] = ()) -> Callable:
    """An emitter that, under ``scons -c``, has SCons remove the node's leftovers with the node.

    Their names are random, so they are found now, at read time (only when cleaning; one listing per
    directory), and handed to ``env.Clean``; ``scratch_suffixes`` name the node's scratch directories
    (``<target>.inputs`` of a device link), which SCons removes with their contents."""
    def emitter(target, source, env):
        if SCons.Script.GetOption("clean"):
            suffix = env.subst("$OFFLOAD_PARTIAL_SUFFIX")
            for node in target:
                found = _LEFTOVERS.find(node.get_abspath(), suffix, scratch_suffixes)
                if found:
                    env.Clean(node, found)
        return target, source
    return emitter


#: The emitter of every phase builder: see :func:`clean_leftovers`.
CLEAN_LEFTOVERS = clean_leftovers()


class _PhaseCommandAction(SCons.Action.LazyAction):
    """``$OFFLOAD_<PHASE>COM`` as SCons makes it (a lazy action), without ``Subst`` while the variable is
    just the name of one of our renderers.

    SCons substitutes a node's command three times (signature, message, run), and each time walks the
    ~80 words of a ``-cc1`` line through its expansion machinery, about 1 ms a node; a :class:`_Command`
    already holds the final words. Any other value (``ccache $_OFFLOAD_HOST_CC1``, a function, a
    ``$( $)`` section) takes SCons' own path, as do overrides passed to the action.
    """

    def __init__(self, phase: str, varlist: Sequence[str] = ()) -> None:
        super().__init__(f"OFFLOAD_{phase}COM", {"cmdstr": f"$OFFLOAD_{phase}COMSTR", "varlist": tuple(varlist)})

    def _renderer(self, env) -> _Command | None:
        value = env.get(self.var)
        if isinstance(value, str) and value[:1] == "$" and value[1:].isidentifier():
            renderer = env.get(value[1:])
            if isinstance(renderer, _Command):
                return renderer
        return None

    @staticmethod
    def _render(renderer: _Command, target, source, env, executor, for_signature: bool) -> list:
        """The renderer's words for the nodes SCons' substitution would give it (the executor's, sources
        through their repository copies)."""
        if executor:
            target, source = executor.get_all_targets(), executor.get_all_sources()
        return renderer(target, [SCons.Action.rfile(node) for node in source], env, for_signature)

    def process(self, target, source, env, executor=None, overrides=None):
        renderer = None if overrides else self._renderer(env)
        if renderer is None:
            return super().process(target, source, env, executor, overrides)
        return [list(self._render(renderer, target, source, env, executor, False))], False, False

    def get_targets(self, env, executor):
        # A lazy action would make an action of the renderer (and hash its code) to answer this.
        return self.targets if self._renderer(env) is not None else super().get_targets(env, executor)

    def batch_key(self, env, target, source):
        return None if self._renderer(env) is not None else super().batch_key(env, target, source)

    def genstring(self, target, source, env, executor=None):
        # What SCons records as the node's action (shown by --debug=explain), as a lazy action words it.
        renderer = self._renderer(env)
        if renderer is None:
            return super().genstring(target, source, env, executor)
        return f"{renderer.__name__}(target, source, env)"

    def execute(self, target, source, env, executor=None):
        """With SCons' own POSIX ``$SPAWN``, run the rendered argv without ``sh -c``: it is an argv list
        from the driver, never shell syntax, and the shell's start costs about 1 ms a node."""
        if env.get("SPAWN") is _SHELL_SPAWN and self._renderer(env) is not None:
            env = env.Override({"SPAWN": _spawn_argv, "ESCAPE": str})
        return super().execute(target, source, env, executor)

    def get_presig(self, target, source, env, executor=None):
        renderer = self._renderer(env)
        if renderer is None:
            return super().get_presig(target, source, env, executor)
        return " ".join(map(str, self._render(renderer, target, source, env, executor, True)))


_SHELL_SPAWN = SCons.Platform.posix.subprocess_spawn


class _DeviceLinkCommandAction(_PhaseCommandAction):
    """``$OFFLOAD_DEVICELINKCOM``: a device link that fails on a device-library symbol (``__ocml_sin_f64``,
    ``__nv_sinf``) ends with one line naming the library and what to install, rather than only the linker's
    "undefined symbol" (see :func:`offload_builders.device_libraries.missing_library_hint`). Its messages
    still reach the terminal as they come; they are kept to be read once it fails."""

    def execute(self, target, source, env, executor=None):
        if env.get("SPAWN") is not _SHELL_SPAWN or self._renderer(env) is None:
            return super().execute(target, source, env, executor)
        messages: list[str] = []
        env = env.Override({"SPAWN": functools.partial(_spawn_keeping_stderr, messages), "ESCAPE": str})
        status = super().execute(target, source, env, executor)
        if status and messages:
            hint = device_libraries.missing_library_hint("".join(messages), env.subst("$OFFLOAD_TARGET"))
            if hint is not None and isinstance(status, SCons.Errors.BuildError):
                status.errstr = hint  # SCons prints it in place of "Error 1"
            elif hint is not None:
                return SCons.Errors.BuildError(node=target[0] if target else None, errstr=hint, status=status,
                                               exitstatus=status)
        return status


#: What a POSIX shell acts on in a word as SCons passes it (bare, or in "..." when it holds a space).
_SHELL_ACTIVE = re.compile(r"""[\\"'$`*?\[~#;&|<>()\n]""")


def _spawn_keeping_stderr(messages: list[str], shell: str, escape, command: str, args: list[str],
                          environ: dict[str, str]) -> int:
    """Like :func:`_spawn_argv`, with the command's standard error passed on and appended to ``messages``."""
    argv = list(args)
    if any(_SHELL_ACTIVE.search(arg) for arg in args):
        argv = [shell, "-c", " ".join(SCons.Subst.quote_spaces(arg) for arg in args)]
    try:
        done = subprocess.run(argv, env=environ, stderr=subprocess.PIPE, close_fds=True, check=False)
    except OSError as error:
        print(f"{args[0]}: {error.strerror}", file=sys.stderr)
        return 127 if error.errno == errno.ENOENT else 126
    text = done.stderr.decode(errors="replace")
    if text:
        sys.stderr.write(text)
        sys.stderr.flush()
    messages.append(text)
    return done.returncode


def _spawn_argv(shell: str, escape, command: str, args: list[str], environ: dict[str, str]) -> int:
    """``$SPAWN`` for argv that needs no shell; the exit status ``sh`` would give for a missing program.

    Words that the shell would change still go through it, as SCons would pass them: users write flags
    for the shell (``CPPDEFINES=[("V", '\\\\"1.0\\\\"')]`` relies on it to drop the backslashes)."""
    if any(_SHELL_ACTIVE.search(arg) for arg in args):
        return _SHELL_SPAWN(shell, escape, command, [SCons.Subst.quote_spaces(arg) for arg in args], environ)
    try:
        return SCons.Platform.posix.exec_subprocess(list(args), environ)
    except OSError as error:
        print(f"{args[0]}: {error.strerror}", file=sys.stderr)
        return 127 if error.errno == errno.ENOENT else 126


class _HostLinkAction(SCons.Action.LazyAction):
    """``$OFFLOAD_LINKCOM`` as SCons makes it. While it is our default line and SCons' POSIX ``$SPAWN``
    runs it, the spawn runs the one job the driver would run for that line (its ``ld.lld``), known from
    a probe kept in the project's probe cache, instead of starting the driver: about 20 ms a link.
    Signature and message stay the driver line's, so nothing relinks for this and the printed command
    still does what it says."""

    def __init__(self) -> None:
        super().__init__("OFFLOAD_LINKCOM", {"cmdstr": "$OFFLOAD_LINKCOMSTR"})

    def execute(self, target, source, env, executor=None):
        if (env.get("SPAWN") is _SHELL_SPAWN and env.get(self.var) == _DEFAULTS["OFFLOAD_LINKCOM"]
                and (cache := _model(env).cache) is not None):
            if executor:
                target, source = executor.get_all_targets(), executor.get_all_sources()
            lines = self.process(target, [SCons.Action.rfile(node) for node in source], env, executor)[0]
            if len(lines) == 1 and not any(_for_the_shell(word) for word in lines[0]):
                env = env.Override({"SPAWN": functools.partial(_spawn_link_job, cache), "ESCAPE": str})
        return super().execute(target, source, env, executor)


def _for_the_shell(word) -> bool:
    """A word SCons would hand the shell to read (file names are literal: SCons quotes them, meaning them
    as they are)."""
    literal = getattr(word, "is_literal", lambda: False)()
    return not literal and (_SHELL_ACTIVE.search(str(word)) is not None or " " in str(word) or "\t" in str(word))


def _spawn_link_job(cache, shell: str, escape, command: str, args: list[str], environ: dict[str, str]) -> int:
    """``$SPAWN`` for the host link (words as they are, none for the shell): the driver's own job."""
    try:
        job = linking.host_link_job(args, os.getcwd(), environ, cache)
    except OffloadError:
        job = None  # the driver does not start: running it says so
    return _spawn_argv(shell, escape, command, list(job or args), environ)


def _phase_action(phase: str) -> SCons.Action.ListAction:
    return SCons.Action.ListAction([_REMOVE_STALE, _PhaseCommandAction(phase), _COMMIT])


class _SourceIdentityAction(SCons.Action.ActionBase):
    """Puts the identity (device, inode) of the source and of every header it includes into the host front
    end's build signature; runs nothing. OpenMP target regions are named after it, so a file re-created with
    the same bytes must run the host front end, and through its new bitcode every device compile, again
    (see :mod:`offload_builders.source_identity`). SCons computes the signature once the source and its
    headers are built and scanned, just before it decides whether the node runs."""

    def __call__(self, target, source, env, *args, **kwargs) -> int:
        return 0

    def __str__(self) -> str:
        return "source identity"

    def get_presig(self, target, source, env, executor=None) -> bytes:
        if executor:
            target, source = executor.get_all_targets(), executor.get_all_sources()
        paths = [str(SCons.Action.rfile(node)) for node in source]
        for node in target[0].implicit or ():
            if isinstance(node, SCons.Node.FS.File):
                paths.append(str(SCons.Action.rfile(node)))
        return identity_signature(paths).encode()

    def get_implicit_deps(self, target, source, env, executor=None) -> list:
        return []

    def get_varlist(self, target, source, env, executor=None) -> tuple:
        return ()


_HOST_BUILDER = SCons.Builder.Builder(action=SCons.Action.ListAction([_SourceIdentityAction(),
                                                                     *_phase_action("HOST").list]),
                                      source_scanner=SCons.Tool.SourceFileScanner, single_source=True,
                                      emitter=CLEAN_LEFTOVERS)
_DEVICE_BUILDER = SCons.Builder.Builder(action=_phase_action("DEVICE"), source_scanner=SCons.Tool.SourceFileScanner,
                                        emitter=CLEAN_LEFTOVERS)
_ASSEMBLE_BUILDER = SCons.Builder.Builder(action=_phase_action("ASSEMBLE"), single_source=True, emitter=CLEAN_LEFTOVERS)
_PACKAGE_BUILDER = SCons.Builder.Builder(action=SCons.Action.ListAction([
    _REMOVE_STALE,
    SCons.Action.Action("$OFFLOAD_PACKAGECOM", "$OFFLOAD_PACKAGECOMSTR", varlist=["_OFFLOAD_PACKAGE_TARGETS"]),
    _COMMIT,
]), emitter=CLEAN_LEFTOVERS)


def _check_tools_for(env, targets: Sequence[TargetID]) -> None:
    """Fail at read time, before any compile, when a target needs a tool that is not installed."""
    toolchain = _toolchain(env)
    try:
        toolchain.tool("clang-offload-packager")
        if any(tid.kind == "nvptx" for tid in targets):
            toolchain.cuda_tool("ptxas")
    except OffloadError as error:
        raise _user_error(error) from None


def _object_emitter(target, source, env):
    """Expand one fat object into host front end, per-target device nodes, package and embed."""
    if len(source) != 1:
        raise SCons.Errors.UserError(f"OffloadObject builds one object per source, got {len(source)} sources"
                                     f" for {target[0]}")
    obj, src = target[0], source[0]
    targets = selected_targets(env)
    _check_tools_for(env, targets)
    stem = os.path.splitext(obj.name)[0]
    directory = obj.dir
    try:
        language = language_of(str(src))
        # Probe now, at read time, so a configuration the driver rejects stops the build before any compile.
        flags = _compile_flags(env, [obj], [src], False, language)
        _warn_unmatched_keys(env, "OFFLOAD_TARGET_FLAGS", targets)
        per_target = {tid: tuple(_target_flags(env, tid)) for tid in targets}
        _check_no_target_selection(flags, "$OFFLOAD_FLAGS, $CCFLAGS, $CXXFLAGS/$CFLAGS or $CPPFLAGS", targets)
        for tid, extra in per_target.items():
            _check_no_target_selection(extra, f"$OFFLOAD_TARGET_FLAGS[{str(tid)!r}]", targets)
        model = _model(env)
        host = model.host_steps(language, flags)
        plans = {tid: model.device_steps(tid, language, flags + extra) for tid, extra in per_target.items()}
    except OffloadError as error:
        raise SCons.Errors.UserError(f"{src}: {error}") from None

    overrides = _command_dependency_overrides(env)
    host_bc = _HOST_BUILDER(env, [directory.File(f"{stem}.host.bc")], [src], **overrides)
    _depend_on_program(env, host_bc, overrides, host.frontend)
    images, compiled = [], []
    for tid, steps in plans.items():
        device = _DEVICE_BUILDER(env, [directory.File(f"{stem}.{tid.file_token}.dev{steps.compile_suffix}")],
                                 [src] + host_bc, OFFLOAD_TARGET=str(tid), **overrides)
        _depend_on_program(env, device, overrides, steps.compile)
        depend_on_device_libraries(env, device, steps.compile)
        compiled.extend(device)
        if steps.assemble is not None:
            device = _ASSEMBLE_BUILDER(env, [directory.File(f"{stem}.{tid.file_token}.dev.cubin{steps.image_suffix}")],
                                       device, OFFLOAD_TARGET=str(tid), _OFFLOAD_ORIGINAL_SOURCE=src, **overrides)
            _depend_on_program(env, device, overrides, steps.assemble)
            compiled.extend(device)
        images.extend(device)
    package = _PACKAGE_BUILDER(env, [directory.File(f"{stem}.offload.pkg")], images,
                               _OFFLOAD_PACKAGE_TARGETS=tuple(str(tid) for tid in plans),
                               _OFFLOAD_ORIGINAL_SOURCE=src)
    for node in [*host_bc, *package, *compiled]:
        node.attributes.offload_object = obj
    obj.attributes.offload_inputs = (host_bc[0], package[0])
    env.Depends(obj, host_bc + package)
    _depend_on_program(env, [obj], overrides, host.embed)  # SCons' scan also finds clang, by contents
    return target, source


def _check_no_target_selection(flags: Sequence[str], where: str, targets: Sequence[TargetID]) -> None:
    """One clear error for a flag that chooses offload targets itself (``--offload-arch=``): the tool makes
    one node per target of ``$OFFLOAD_ARCHS``, and the driver would add that flag's targets to each."""
    chosen = target_selection_flags(flags)
    if chosen:
        raise SCons.Errors.UserError(
            f"{chosen[0]} in {where}: the offload targets belong in $OFFLOAD_ARCHS (now "
            f"{','.join(str(tid) for tid in targets)}), e.g. OFFLOAD_ARCHS=['x86_64', 'sm_90']; remove the flag")


def _command_dependency_overrides(env) -> dict:
    """Overrides for the compile nodes: no implicit command dependency scan (unless the user configured it).

    SCons finds a command's program by rendering the whole command once more and searching ``$PATH`` for
    its first word, for every node, and then hashes the program's contents (37 MiB for CUDA 13's
    ``ptxas``) on every run, no-op builds included. Our phase commands start with the absolute path of
    the probed program, so :func:`_depend_on_program` names it through a stamp instead.
    """
    return {} if "IMPLICIT_COMMAND_DEPENDENCIES" in env else {"IMPLICIT_COMMAND_DEPENDENCIES": 0}


def program_stamp(program: str) -> str:
    """What identifies an installed program (or device library) for rebuilds: its resolved path, size and
    modification time (a package update changes them; the toolchain cache keys on the same)."""
    resolved = os.path.realpath(program)
    try:
        status = os.stat(resolved)
    except OSError:
        return f"{resolved} (missing)"
    return f"{resolved} size={status.st_size} mtime_ns={status.st_mtime_ns}"


def _depend_on_program(env, nodes, overrides: dict, template) -> None:
    program = str(template.argv[0]) if template is not None and template.argv else ""
    if overrides and os.path.isabs(program):
        env.Depends(nodes, env.Value(program_stamp(program)))


def depend_on_device_libraries(env, nodes, template) -> None:
    """Make compile nodes depend on the device libraries their command links (``-mlink-builtin-bitcode``:
    ROCm's ocml/oclc, libdevice, the NVPTX OpenMP runtime), each by its stamp, so an upgraded library
    package rebuilds them. SCons would not see them otherwise: they are arguments, not sources."""
    for path in device_libraries.linked_libraries(template.argv if template is not None else ()):
        env.Depends(nodes, env.Value(program_stamp(path)))


class OffloadLinkWarning(SCons.Warnings.WarningOnByDefault):
    """A link-time offload problem that does not stop the build (a target with no device code)."""


def _device_runtime(env):
    try:
        return env.File(str(linking.device_runtime(_toolchain(env))))
    except OffloadError as error:
        raise _user_error(error) from None


def _static_libraries(env) -> list:
    """The static libraries ``$LIBS`` names, found in ``$LIBPATH`` as the linker would (shared ones have no
    device code to extract)."""
    dirs = tuple(env.Dir(d) for d in SCons.Util.flatten(env.subst_list("$LIBPATH")[0] if env.get("LIBPATH") else []))
    prefix, suffix = env.subst("$LIBPREFIX"), env.subst("$LIBSUFFIX")
    found = []
    for lib in SCons.Util.flatten(env.get("LIBS", [])):
        if not isinstance(lib, str):
            if str(lib).endswith(suffix):
                found.append(lib)
            continue
        name = env.subst(lib)
        if os.sep in name or name.endswith(suffix):
            found.append(env.File(name))
            continue
        node = SCons.Node.FS.find_file(f"{prefix}{name}{suffix}", dirs)
        if node is not None:
            found.append(node)
    return found


_SCANS: dict[tuple, linking.ScannedInputs] = {}


def _scan(paths: Sequence[str]) -> linking.ScannedInputs:
    """Scan the link inputs once per build for all targets (keyed on the files' identity)."""
    key = tuple((p, st.st_mtime_ns, st.st_size) for p in paths for st in [os.stat(p)] if os.path.exists(p))
    if key not in _SCANS:
        _SCANS.clear()
        _SCANS[key] = linking.scan_link_inputs(paths)
    return _SCANS[key]


def _extract_device_inputs(target, source, env) -> int:
    """Write the target's device files (Clang 19's selection from all link inputs) to its device input file."""
    tid = parse_target_id(env.subst("$OFFLOAD_TARGET"))
    key = linking.group_key(tid)
    try:
        scanned = _scan([str(node) for node in source])
        problems = linking.check_entries(scanned, key, str(tid))
        if problems:
            raise SCons.Errors.BuildError(node=target[0], errstr="\n".join(problems))
        files = linking.select_device_files(scanned, key)
        if not files:
            SCons.Warnings.warn(OffloadLinkWarning, f"{target[0]}: no device code for {tid} in any input: the "
                                                     f"program has no {tid} image")
        linking.write_device_inputs(files, _partial(env, target[0]))
    except OffloadError as error:
        raise SCons.Errors.BuildError(node=target[0], errstr=str(error)) from None
    return 0


def _inputs_dir(env, node) -> str:
    return str(node) + ".inputs"


def _unpack_device_inputs(target, source, env) -> int:
    """Unpack the device input file next to the image; with no device code the image is an empty file."""
    linking.load_wrapper_compiler()  # the wrap node follows: LLVM loads while the device link's process runs
    directory = _inputs_dir(env, target[0])
    _empty_directory(directory)
    try:
        paths = linking.unpack_device_inputs(str(source[0]), directory)
    except OffloadError as error:
        raise SCons.Errors.BuildError(node=target[0], errstr=str(error)) from None
    if not paths:
        open(_partial(env, target[0]), "wb").close()
    return 0


def _remove_inputs_dir(target, source, env) -> int:
    directory = _inputs_dir(env, target[0])
    if _empty_directory(directory):
        os.rmdir(directory)
    return 0


def _empty_directory(directory: str) -> bool:
    """Delete the files of an unpacked-inputs directory; whether it exists."""
    if not os.path.isdir(directory):
        return False
    for name in os.listdir(directory):
        os.unlink(os.path.join(directory, name))
    return True


@_Command
def _device_link_cmd(target, source, env, for_signature):
    """The device link of one target; nothing to run when no input has device code for it."""
    tid = parse_target_id(env.subst("$OFFLOAD_TARGET"))
    if for_signature:
        inputs = [str(source[0])]
    elif not os.path.exists(str(source[0])):
        # Not extracted yet (scons -n on a clean tree): the command as it will run, its inputs as a pattern.
        inputs = [os.path.join(_inputs_dir(env, target[0]), "*.o")]
    else:
        count = len(linking.read_device_inputs(str(source[0])))
        if count == 0:
            return []
        inputs = [os.path.join(_inputs_dir(env, target[0]), f"{index:03d}.o") for index in range(count)]
    flags, host_libraries = _device_link_arguments(env, tid, target, source, for_signature)
    toolchain, key = _toolchain(env), linking.group_key(tid)
    # The driver's own job, probed when the program was declared; the driver command if the flags differ now.
    job = linking.known_device_link(toolchain, key, flags=flags, host_libraries=host_libraries)
    if job is not None:
        return linking.render_device_link(job, inputs, _partial(env, target[0]), host_libraries)
    return linking.device_link_command(toolchain, key, inputs, _partial(env, target[0]),
                                       flags=flags, host_libraries=host_libraries)


def _device_link_arguments(env, tid: TargetID, target, source, for_signature: bool) -> tuple[list[str], list[str]]:
    """The device-link flags and (for the host-CPU image, a shared object linked against the host's
    libraries) the library flags of one device-link node."""
    flags = [str(f) for f in env.subst_list("$OFFLOAD_DEVICE_LINKFLAGS $_OFFLOAD_TARGET_LINKFLAGS",
                                            SCons.Subst.SUBST_SIG if for_signature else SCons.Subst.SUBST_CMD,
                                            target=target, source=source)[0]]
    host_libraries = []
    if tid.kind == "host-cpu":
        host_libraries = [str(f) for f in env.subst_list("$_LIBDIRFLAGS $_LIBFLAGS", target=target, source=source)[0]]
    return flags, host_libraries


def _probe_device_link(node, tid: TargetID) -> None:
    """Ask the driver, at read time, for the job of this device-link node (see :func:`_device_link_cmd`)."""
    executor = node.get_executor()
    env = executor.get_build_env()
    targets, sources = executor.get_all_targets(), executor.get_all_sources()
    try:
        for for_signature in (False, True):
            flags, host_libraries = _device_link_arguments(env, tid, targets, sources, for_signature)
            linking.probe_device_link(_toolchain(env), linking.group_key(tid), flags=flags,
                                      host_libraries=host_libraries, cache=_model(env).cache,
                                      warn=functools.partial(SCons.Warnings.warn, OffloadLinkWarning))
    except OffloadError as error:
        raise _user_error(error) from None


def _device_link_level(target, source, env, for_signature):
    """The default of ``$OFFLOAD_DEVICE_LINKFLAGS``: the device link's ``-O``, as the driver maps the link line's
    ``-O`` to ``clang-linker-wrapper --opt-level`` (``$OFFLOAD_LINKFLAGS $LINKFLAGS``), else the compile's
    (``$OFFLOAD_FLAGS $CCFLAGS $CXXFLAGS``, and ``$OFFLOAD_HIP_FLAGS`` for HIP: a one-command build has it on
    its link line), else ``-O2``."""
    def words(text: str) -> list[str]:
        mode = SCons.Subst.SUBST_SIG if for_signature else SCons.Subst.SUBST_CMD
        return [str(word) for word in env.subst_list(text, mode, target=target, source=source)[0]]

    hip = " $OFFLOAD_HIP_FLAGS" if env.get("OFFLOAD_MODEL") == "hip" else ""
    return [linking.device_link_opt_flag(words("$OFFLOAD_LINKFLAGS $LINKFLAGS"),
                                         words("$OFFLOAD_FLAGS $CCFLAGS $CXXFLAGS" + hip))]


def _target_link_flags(target, source, env, for_signature):
    """``$OFFLOAD_TARGET_LINKFLAGS[target]``: device-link flags for one target ID."""
    return _target_flags(env, parse_target_id(env.subst("$OFFLOAD_TARGET")), "OFFLOAD_TARGET_LINKFLAGS")


def _wrap_images(target, source, env) -> int:
    """Generate the registration object for the linked images (no Clang process: llvmlite does it).
    An empty image file means the target has no device code: it is not registered."""
    images = [(linking.group_key(parse_target_id(tid_text)), str(node))
              for node, tid_text in zip(source, env["_OFFLOAD_WRAP_TARGETS"]) if os.path.getsize(str(node)) > 0]
    try:
        data = linking.wrap_openmp_images(images, _toolchain(env).major)
    except OffloadError as error:
        raise SCons.Errors.BuildError(node=target[0], errstr=str(error)) from None
    with open(_partial(env, target[0]), "wb") as f:
        f.write(data)
    return 0


def _wrapper_object(target, source, env, for_signature):
    wrapper = getattr(target[0].attributes, "offload_wrapper", None)
    if wrapper is None:
        raise SCons.Errors.UserError(f"{target[0]} was not made by OffloadProgram")
    return [str(wrapper)]


def _host_runtime(target, source, env, for_signature):
    return linking.host_runtime_arguments(_toolchain(env))


def _function_phase(phase: str, before=(), after=(), varlist: Sequence[str] | None = None,
                    command: type[_PhaseCommandAction] = _PhaseCommandAction) -> SCons.Action.ListAction:
    """Like :func:`_phase_action` for phases whose ``$OFFLOAD_<PHASE>COM`` may be a Python function
    (``varlist``: what its signature reads, default :data:`_FUNCTION_PHASE_VARLIST`)."""
    return SCons.Action.ListAction([
        _REMOVE_STALE, *before,
        command(phase, _FUNCTION_PHASE_VARLIST if varlist is None else varlist),
        _COMMIT, *after,
    ])


def in_process_action(function, phase: str, varlist: Sequence[str]) -> SCons.Action.FunctionAction:
    """A default ``$OFFLOAD_<PHASE>COM`` that runs ``function`` in the SCons process, as one action object.

    Given a bare function, SCons makes a new action from it each time it resolves the variable (for
    the signature, the dependencies, the message and the run: five times a node) and hashes the
    function's bytecode each time. An action object is used as it is; it carries the message and
    ``varlist`` the builder's ``$VAR`` action would have passed.
    """
    return SCons.Action.Action(function, f"$OFFLOAD_{phase}COMSTR", varlist=list(varlist))


_FUNCTION_PHASE_VARLIST = ("OFFLOAD_TARGET", "OFFLOAD_CLANG", "_OFFLOAD_WRAP_TARGETS")
EXTRACT_IN_PROCESS = in_process_action(_extract_device_inputs, "EXTRACT", _FUNCTION_PHASE_VARLIST)
WRAP_IN_PROCESS = in_process_action(_wrap_images, "WRAP", _FUNCTION_PHASE_VARLIST)
PACKAGE_IN_PROCESS = in_process_action(_package_in_process, "PACKAGE", ["_OFFLOAD_PACKAGE_TARGETS"])
_EXTRACT_BUILDER = SCons.Builder.Builder(action=_function_phase("EXTRACT"), emitter=CLEAN_LEFTOVERS)
_DEVICE_LINK_BUILDER = SCons.Builder.Builder(action=_function_phase(
    "DEVICELINK", before=[SCons.Action.Action(_unpack_device_inputs, None)],
    after=[SCons.Action.Action(_remove_inputs_dir, None)], command=_DeviceLinkCommandAction),
    emitter=clean_leftovers([".inputs"]))  # _inputs_dir: the unpacked inputs, a scratch directory
_WRAP_BUILDER = SCons.Builder.Builder(action=_function_phase("WRAP"), emitter=CLEAN_LEFTOVERS)


def _deploy_devices(env) -> list[str]:
    value = env.get("OFFLOAD_DEPLOY_DEVICES") or []
    return [env.subst(d) for d in ([value] if isinstance(value, str) else SCons.Util.flatten(value)) if d]


def _check_deployment(target, source, env) -> int:
    """Fail the link when a deployment device would find no image it can load (see ``offload-select``)."""
    devices = _deploy_devices(env)
    if not devices:
        return 0
    from offload_builders.selection import check_deployment

    partial = _partial(env, target[0])
    try:
        problems = check_deployment(partial, devices, llvm_version=_toolchain(env).major)
        message = f"{target[0]}: not deployable: " + "; ".join(problems) if problems else ""
    except OffloadError as error:
        message = str(error)
    if message:
        if os.path.lexists(partial):
            os.unlink(partial)  # a program that is not deployable is not kept, not even as a leftover
        raise SCons.Errors.BuildError(node=target[0], errstr=message)
    return 0


def _check_registered_entries(target, source, env) -> int:
    """Before the host link: every offload entry the program's objects register must be defined by every
    target's linked image (Clang links a program that fails at run time otherwise)."""
    images = getattr(target[0].attributes, "offload_images", ())
    objects = [str(SCons.Action.rfile(node)) for node in source]
    try:
        problems = linking.missing_entries(objects, [(label, str(node)) for label, node in images])
    except OffloadError as error:
        raise SCons.Errors.BuildError(node=target[0], errstr=str(error)) from None
    if problems:
        raise SCons.Errors.BuildError(node=target[0], errstr="\n".join(problems))
    return 0


def _check_link_tools_for(env, targets: Sequence[TargetID]) -> None:
    toolchain = _toolchain(env)
    try:
        linking.device_runtime(toolchain)
        if any(tid.kind == "amdgpu" for tid in targets):
            toolchain.tool("ld.lld")
        if any(tid.kind == "nvptx" for tid in targets):
            toolchain.tool("clang-nvlink-wrapper")
            toolchain.cuda_tool("nvlink")
    except OffloadError as error:
        raise _user_error(error) from None


def _program_emitter(target, source, env):
    """Expand the link into per-target extract and device-link nodes, one wrap node and the host link."""
    targets = selected_targets(env)
    _check_tools_for(env, targets)
    _check_link_tools_for(env, targets)
    _warn_unmatched_keys(env, "OFFLOAD_TARGET_LINKFLAGS", targets)
    devices = _deploy_devices(env)
    if devices:
        from offload_builders.selection import parse_device

        try:
            for device in devices:
                name, *capabilities = device.replace(";", " ").split()
                parse_device(name, capabilities)
        except OffloadError as error:
            raise SCons.Errors.UserError(f"OFFLOAD_DEPLOY_DEVICES: {error}") from None
    program = target[0]
    stem, directory = program.name, program.dir
    inputs = list(source) + _static_libraries(env) + [_device_runtime(env)]
    images = []
    for tid in targets:
        device_inputs = _EXTRACT_BUILDER(env, [directory.File(f"{stem}.{tid.file_token}.devin")], inputs,
                                         OFFLOAD_TARGET=str(tid))
        image = _DEVICE_LINK_BUILDER(env, [directory.File(f"{stem}.{tid.file_token}.img")], device_inputs,
                                     OFFLOAD_TARGET=str(tid))
        _probe_device_link(image[0], tid)
        images.extend(image)
    program.attributes.offload_images = [(str(tid), image) for tid, image in zip(targets, images)]
    wrapper = _WRAP_BUILDER(env, [directory.File(f"{stem}.offload.wrapper{env.subst('$OBJSUFFIX')}")], images,
                            _OFFLOAD_WRAP_TARGETS=tuple(str(tid) for tid in targets))
    program.attributes.offload_wrapper = wrapper[0]
    env.Depends(program, wrapper)
    return target, source


def _set_default(env, key: str, value: Any) -> None:
    if key not in env:
        env[key] = SCons.Util.CLVar(value) if isinstance(value, list) else value


def generate(env, **kwargs: Any) -> None:
    """Add the offload builders and variables to ``env`` without overwriting anything the user set."""
    for key, value in kwargs.items():  # env.Tool('offload', archs=[...]) sets $OFFLOAD_ARCHS
        name = key.upper()
        env[name if name.startswith("OFFLOAD_") else f"OFFLOAD_{name}"] = value
    toolchain = _toolchain(env)
    _unrecorded_outputs(env)  # before anything is built: outputs a killed build left unrecorded go
    _set_default(env, "OFFLOAD_CC", str(toolchain.clang))
    cxx = toolchain.cxx_command  # a wrapper with no C++ twin: itself with --driver-mode=g++
    _set_default(env, "OFFLOAD_CXX", cxx[0] if len(cxx) == 1 else list(cxx))
    for key, value in _DEFAULTS.items():
        _set_default(env, key, value)
    if "OFFLOAD_LINKFLAGS" in env and not env["OFFLOAD_LINKFLAGS"] and toolchain.optional_tool("ld.lld"):
        linker_chosen = any(str(flag).startswith("-fuse-ld") for flag in SCons.Util.flatten(env.get("LINKFLAGS", [])))
        if not linker_chosen:
            env["OFFLOAD_LINKFLAGS"] = SCons.Util.CLVar(["-fuse-ld=lld"])
    env["_OFFLOAD_HOST_CC1"] = _host_cc1
    env["_OFFLOAD_DEVICE_CC1"] = _device_cc1
    env["_OFFLOAD_ASSEMBLE_CMD"] = _assemble_cmd
    env["_OFFLOAD_PACKAGE_CMD"] = _package_cmd
    env["_OFFLOAD_EMBED_CC1"] = _embed_cc1
    env["_OFFLOAD_DEVICE_LINK_CMD"] = _device_link_cmd
    env["_OFFLOAD_TARGET_LINKFLAGS"] = _target_link_flags
    env["_OFFLOAD_DEVICE_LINK_LEVEL"] = _device_link_level
    env["_OFFLOAD_WRAPPER_OBJECT"] = _wrapper_object
    env["_OFFLOAD_HOST_RUNTIME"] = _host_runtime
    _set_default(env, "OFFLOAD_PACKAGECOM", PACKAGE_IN_PROCESS)  # '$_OFFLOAD_PACKAGE_CMD' runs the packager
    _set_default(env, "OFFLOAD_EXTRACTCOM", EXTRACT_IN_PROCESS)
    _set_default(env, "OFFLOAD_WRAPCOM", WRAP_IN_PROCESS)
    env["_OFFLOAD_RPATH"] = _rpath

    env.AddMethod(selected_targets, "OffloadSelectedTargets")
    env["BUILDERS"]["OffloadObject"] = SCons.Builder.Builder(
        action=_phase_action("EMBED"),
        emitter=[_object_emitter, CLEAN_LEFTOVERS],
        suffix="$OBJSUFFIX",
        src_suffix=list(LANGUAGE_BY_SUFFIX),
        single_source=True,
    )
    env["BUILDERS"]["OffloadStaticLibrary"] = link_builder(
        action=_phase_action("AR") + SCons.Action.Action("$RANLIBCOM", "$RANLIBCOMSTR") if env.get("RANLIB")
        else _phase_action("AR"),
        prefix="$LIBPREFIX",
        suffix="$LIBSUFFIX",
        src_suffix="$OBJSUFFIX",
        src_builder="OffloadObject",
        emitter=CLEAN_LEFTOVERS,
    )
    env["BUILDERS"]["OffloadProgram"] = link_builder(
        action=SCons.Action.ListAction([
            SCons.Action.Action(_check_registered_entries, None),
            _REMOVE_STALE,
            _HostLinkAction(),
            SCons.Action.Action(_check_deployment, None, varlist=["OFFLOAD_DEPLOY_DEVICES"]),
            _COMMIT,
        ]),
        emitter=[_program_emitter, CLEAN_LEFTOVERS],
        prefix="$PROGPREFIX",
        suffix="$PROGSUFFIX",
        src_suffix="$OBJSUFFIX",
        src_builder="OffloadObject",
        target_scanner=SCons.Scanner.Prog.ProgramScanner(),
    )
    model = env.subst("$OFFLOAD_MODEL")
    if model == "hip":
        from offload_builders.scons import hip  # the HIP model replaces the object and program builders

        hip.generate(env)
    elif model != "openmp":
        raise SCons.Errors.UserError(f"OFFLOAD_MODEL: unknown offload model {model!r}; use 'openmp' or 'hip'")


def exists(env) -> bool:
    """True when a usable Clang is found (SCons does not call this for user tools; generate checks too)."""
    try:
        _toolchain(env)
    except SCons.Errors.UserError:
        return False
    return True
