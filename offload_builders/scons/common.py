"""The pieces of the ``offload`` SCons tool that every offload model shares.

Toolchain and target lookup (:func:`toolchain_for`, :func:`selected_targets`, :func:`target_flags`), the
renderer class of the ``$_OFFLOAD_*`` command variables (:class:`Renderer`), the phase actions
(:func:`phase_action`: sweep leftovers, ``$OFFLOAD_<PHASE>COM``, commit the ``.partial`` output),
the journal of unrecorded outputs, the leftover-cleaning emitters, program and device-library stamps,
and the link side both models use: the host link action, the extract and device-link builders, and the
device-link command. The models (:mod:`offload_builders.scons.openmp`, :mod:`offload_builders.scons.hip`)
build their emitters and renderers on these; :mod:`offload_builders.scons.tool` registers them.
"""
from __future__ import annotations

import atexit
import collections
import errno
import functools
import gc
import hashlib
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import SCons.Action
import SCons.Builder
import SCons.CacheDir
import SCons.Errors
import SCons.Node.FS
import SCons.Node.Python
import SCons.Platform.posix
import SCons.Script
import SCons.Subst
import SCons.Tool
import SCons.Util
import SCons.Warnings

from offload_builders import device_libraries, leftovers, linking, models, nvptx_tools
from offload_builders.content_records import ContentRecords
from offload_builders.driver import BoundCommand, memoized, portable_signature
from offload_builders.errors import OffloadError
from offload_builders.phase_table import LINK, OPENMP, Phase, node_name, row
from offload_builders.scons.remote import RemoteListAction, SideStep
from offload_builders.targets import TargetID, offload_arch_words, parse_offload_archs, parse_target_id
from offload_builders.toolchain import ProbeCache, Toolchain, find_toolchain, probe_cache

#: Driver flags that only change how the compiler runs, never what it produces: kept out of signatures.
_UNSIGNED_FLAG_PREFIXES = ("-v", "-fcolor-diagnostics", "-fno-color-diagnostics", "-fdiagnostics-color",
                           "--offload-jobs=", "-parallel-jobs=", "-ferror-limit=")


def user_error(error: Exception) -> SCons.Errors.UserError:
    return SCons.Errors.UserError(str(error))


def word_value(env, name: str) -> str:
    """``env.subst('$<name>')``, without SCons' substitution where the value is one plain word (no ``$``, no
    white space), which it would give back as it is: the tool reads a few such variables for every node."""
    value = env.get(name)
    if isinstance(value, str) and "$" not in value and not _WHITE_SPACE.search(value):
        return value
    return env.subst("$" + name)


_WHITE_SPACE = re.compile(r"\s")


def toolchain_for(env) -> Toolchain:
    """The toolchain for ``env``: ``$OFFLOAD_CLANG`` if set, else the process environment's search."""
    environ: Mapping[str, str] = os.environ
    if env.get("OFFLOAD_CLANG"):
        environ = collections.ChainMap({"OFFLOAD_CLANG": word_value(env, "OFFLOAD_CLANG")}, os.environ)
    try:
        return find_toolchain(environ)
    except OffloadError as error:
        raise user_error(error) from None


def top_directory(env) -> str:
    """The project's top directory (``#``), without ``env.Dir``'s substitution and lookup (per node, it adds up)."""
    return env.fs.Top.get_abspath()


def probe_cache_for(env) -> ProbeCache | None:
    """The project's probe cache (``$OFFLOAD_PROBE_CACHE`` under the top directory), or None where it is ''."""
    if not env.get("OFFLOAD_PROBE_CACHE"):
        return None
    return probe_cache(os.path.join(top_directory(env), word_value(env, "OFFLOAD_PROBE_CACHE")))


#: Per model class, toolchain, top directory and probe cache: the one phase model of a build (see :func:`phase_model`).
_PHASE_MODELS: dict[tuple, Any] = {}

_Model = TypeVar("_Model")


def phase_model(env, model_class: Callable[[Toolchain, str, ProbeCache | None], _Model]) -> _Model:
    """The phase model (OpenMP's, HIP's or CUDA's) of ``env``'s toolchain, project and probe cache, made once per
    process: it memoizes the command templates it derives from the driver's jobs, which every node renders."""
    cache = probe_cache_for(env)
    key = (model_class, toolchain_for(env), top_directory(env), cache)  # one cache object per file per process
    model = _PHASE_MODELS.get(key)
    if model is None:
        model = _PHASE_MODELS[key] = model_class(key[1], key[2], cache)
    return model


#: The host link's default command line (``$OFFLOAD_LINKCOM``): while it is this line, :class:`HostLinkAction`
#: runs the driver's own link job without starting the driver.
HOST_LINKCOM = row(Phase.LINK, OPENMP, LINK).default


def selected_targets(env) -> tuple[TargetID, ...]:
    """``$OFFLOAD_ARCHS`` parsed, canonicalized and checked, or one ``UserError`` naming the offenders."""
    value = env.get("OFFLOAD_ARCHS")
    if isinstance(value, str):
        value = env.subst(value)
    try:
        words = offload_arch_words(value)
    except OffloadError as error:
        raise user_error(error) from None
    return _parsed_archs(words)


@functools.lru_cache(maxsize=64)
def _parsed_archs(words: str | tuple[str, ...]) -> tuple[TargetID, ...]:
    """Parsed once per distinct value: every source's emitter asks (hundreds of times in a large project)."""
    try:
        return parse_offload_archs(words)
    except OffloadError as error:
        raise SCons.Errors.UserError(f"OFFLOAD_ARCHS: {error}") from None


def target_flags(env, target: TargetID, variable: str = "OFFLOAD_TARGET_FLAGS") -> list[str]:
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


def warn_unmatched_keys(env, variable: str, targets: Sequence[TargetID]) -> None:
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


def compile_flags(env, target, source, for_signature: bool, language: str) -> tuple[str, ...]:
    """The user's compile flags for a node, as the driver will see them."""
    text = "$OFFLOAD_FLAGS $CCFLAGS " + ("$CXXFLAGS" if language == "c++" else "$CFLAGS") + " $_CCCOMCOM"
    mode = SCons.Subst.SUBST_SIG if for_signature else SCons.Subst.SUBST_CMD
    flags = [str(flag) for flag in env.subst_list(text, mode, target=target, source=source)[0]]
    if for_signature:
        flags = [flag for flag in flags if not flag.startswith(_UNSIGNED_FLAG_PREFIXES)]
    return tuple(flags)


def partial_path(env, node) -> str:
    suffix = env.get("OFFLOAD_PARTIAL_SUFFIX")
    if not (isinstance(suffix, str) and "$" not in suffix):  # a plain string (the default) needs no subst
        suffix = env.subst("$OFFLOAD_PARTIAL_SUFFIX")
    return str(node) + suffix


_Value = TypeVar("_Value")


def node_memo(target, key: tuple, make: Callable[[], _Value]) -> _Value:
    """``make()``, once per node (``target[0]``) and ``key`` once the SConscripts are read, when a node's
    environment and sources no longer change: the user's flags that every step of a node renders with (a
    device compile and its link, a fat binary's command for each of its targets). While they are read (an
    emitter's probe), ``make()`` each time: the environment may still change."""
    if not target or SCons.Script.sconscript_reading:
        return make()
    memo = getattr(target[0].attributes, "_offload_memo", None)
    if memo is None:
        memo = target[0].attributes._offload_memo = {}
    return memoized(memo, key, make)


def node_flags(target, source, for_signature: bool, substitute: Callable[[], tuple[str, ...]]) -> tuple[str, ...]:
    """A HIP or CUDA node's user flags, ``substitute()`` once per node, source and mode once the SConscripts are
    read (:func:`node_memo`): a fat binary's command asks for each of its targets' steps. Only renderers call
    it, never an emitter: a flag appended after the declaration must reach the command as it reaches the
    signature."""
    return node_memo(target, ("flags", str(source[0]), bool(for_signature)), substitute)


def _literal(argv: Sequence[str]) -> list[SCons.Subst.Literal]:
    """Rendered arguments, protected from further ``$`` expansion and word splitting."""
    return [SCons.Subst.Literal(arg) for arg in argv]


class Renderer:
    """A phase command in SCons' callable-variable convention (``$_OFFLOAD_<PHASE>_CC1`` and friends).

    Renders once per node and mode: SCons asks four or five times (signature, implicit dependencies,
    display, execution), and a node's environment and sources are fixed. The signature's words name the
    checkout only where the output can record it (:func:`~offload_builders.phases.portable_signature`),
    so another checkout shares this one's ``CacheDir`` entries. Our errors become
    ``UserError``. An object rather than a closure: to describe a node, SCons makes a function action
    of the variable's value and hashes its code, which for an object is this small ``__call__``.
    """

    def __init__(self, render: Callable[..., Sequence[Any] | BoundCommand]) -> None:
        self._render = render
        self.__name__ = render.__name__

    def words(self, target, source, env, for_signature) -> list[str]:
        """The rendered words (memoized per node and mode): what signatures and command scans read."""
        memo = getattr(target[0].attributes, "_offload_commands", None) if target else None
        key = (self.__name__, bool(for_signature))
        if memo is not None and key in memo:
            return memo[key]
        try:
            rendered = self._render(target, source, env, for_signature)
            # no checkout's location where the output cannot record it (see portable_signature)
            if isinstance(rendered, BoundCommand):  # a driver job: its fixed words made portable once per template
                argv = rendered.signature(top_directory(env)) if for_signature else rendered.words()
            else:
                argv = [str(arg) for arg in rendered]
                if for_signature:
                    argv = portable_signature(argv, top_directory(env))
        except OffloadError as error:
            raise user_error(error) from None
        if target:
            if memo is None:
                memo = target[0].attributes._offload_commands = {}
            memo[key] = argv
        return argv

    def __call__(self, target, source, env, for_signature) -> list[SCons.Subst.Literal]:
        return _literal(self.words(target, source, env, for_signature))


def mark_model(nodes, model: str) -> None:
    """Record on the nodes a model's emitter made which model made them (see :class:`ModelRenderer`)."""
    for node in nodes:
        node.attributes.offload_model = model


def node_model(target) -> str | None:
    """The model that made ``target[0]`` (:func:`mark_model`), None for a node no model's emitter made."""
    return getattr(target[0].attributes, "offload_model", None) if target else None


class ModelRenderer(Renderer):
    """One ``$_OFFLOAD_*`` command variable that every model shares (``$_OFFLOAD_HOST_CC1``: OpenMP's host
    front end, HIP's host compile): it renders with the renderer of the model that made the node, so the
    sources of one environment can be of different models. ``default`` renders nodes no model made (a
    program's device links); without one, such a node is an error."""

    def __init__(self, name: str, by_model: Mapping[str, Renderer], default: Renderer | None = None) -> None:
        self.by_model = dict(by_model)
        self.default = default
        self.__name__ = name

    def renderer(self, target) -> Renderer:
        model = node_model(target)
        renderer = self.by_model.get(model) if model is not None else self.default
        if renderer is None:
            made = f"made by the {model} model" if model is not None else "not made by OffloadObject"
            raise SCons.Errors.UserError(f"{target[0] if target else '?'}: {made}, which has no ${self.__name__}")
        return renderer

    def words(self, target, source, env, for_signature) -> list[str]:
        return self.renderer(target).words(target, source, env, for_signature)

    def __call__(self, target, source, env, for_signature) -> list[SCons.Subst.Literal]:
        return self.renderer(target)(target, source, env, for_signature)


def model_targets_for(env, source, model: str) -> tuple[TargetID, ...]:
    """The targets of ``$OFFLOAD_ARCHS`` (checked by :func:`selected_targets`) that ``model`` compiles
    ``source`` for; none is one ``UserError`` naming the source, its model and the list."""
    try:
        return models.source_targets(str(source), model, selected_targets(env))
    except OffloadError as error:
        raise user_error(error) from None


def rdc_selected(env) -> bool:
    """``$OFFLOAD_RDC`` or its alias ``$OFFLOAD_HIP_RDC`` (both set and disagreeing: a ``UserError``)."""
    try:
        return models.rdc_setting(env.get("OFFLOAD_RDC"), env.get("OFFLOAD_HIP_RDC"))
    except OffloadError as error:
        raise user_error(error) from None


def rpath_flags(target, source, env, for_signature):
    value = env.get("OFFLOAD_RPATH")
    if value is None:
        value = [str(toolchain_for(env).lib_dir)]
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


def unrecorded_outputs(env) -> leftovers.UnrecordedOutputs:
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


class JournalingCacheDir(SCons.CacheDir.CacheDir):
    """SCons' ``CacheDir``, whose retrievals are journaled as our commands' outputs are (:func:`_commit`).

    A retrieval writes an output that SCons records only when the build ends, as a command does: a build
    killed after retrieving the objects of one branch's sources leaves them newer than their record, and
    after a switch back to the recorded branch SCons takes them as up to date (and builds the rest on
    them). Journaled first, they are deleted when the next build starts, so they are retrieved or built
    again. The tool's default ``$CACHEDIR_CLASS``; a class of your own (``CacheDir(path, MyClass)``) is
    used as it is, unless it derives from this one."""

    @classmethod
    def copy_from_cache(cls, env, src, dst) -> str:
        unrecorded_outputs(env).add(os.path.abspath(dst))
        return super().copy_from_cache(env, src, dst)


def _commit(target, source, env) -> int:
    """Move each finished ``<target>.partial`` into place, so no half-written target ever exists; journal
    it first, so that a build killed before SCons records it cannot leave it looking up to date."""
    for node in target:
        partial = partial_path(env, node)
        if os.path.exists(partial):
            unrecorded_outputs(env).add(node.get_abspath())
            os.replace(partial, str(node))
        elif not os.path.exists(str(node)):
            raise SCons.Errors.BuildError(node=node, errstr=f"the command did not write {partial}")
    return 0


REMOVE_STALE = SCons.Action.Action(_sweep_leftovers, None)


def side_path(env, node, suffix: str) -> str:
    """Where a step of ``node``'s action writes a file that only the next step reads (NVPTX's PTX, HIP's device
    object, OpenMP's package): a name made from the node's partial output, which the next run of the node
    sweeps if a build is killed in between (:func:`offload_builders.leftovers.leftover_pattern`)."""
    return partial_path(env, node) + suffix


class RemoveSideFile(SideStep, SCons.Action.ActionBase):
    """The last step of a node whose steps pass a file along (:func:`side_path`): the file is in the target
    now. Its signature is its description (a function action's would be its code's bytes, so editing the
    function would rebuild every such node)."""

    def __init__(self, suffix: str, what: str) -> None:
        self.suffix = suffix
        self.description = f"remove {what}"

    def __call__(self, target, source, env, *args, **kwargs) -> int:
        try:
            os.unlink(side_path(env, target[0], self.suffix))
        except FileNotFoundError:
            pass
        return 0

    def __str__(self) -> str:
        return self.description

    def get_presig(self, target, source, env, executor=None) -> bytes:
        return self.description.encode()

    def get_implicit_deps(self, target, source, env, executor=None) -> list:
        return []

    def get_varlist(self, target, source, env, executor=None) -> tuple:
        return ()


COMMIT = SCons.Action.Action(_commit, None)


def clean_leftovers(scratch_suffixes: Sequence[str] = ()) -> Callable:
    """An emitter that does for the node what :func:`own_outputs` does (the name is from when that was
    removing the node's leftovers under ``scons -c`` alone)."""
    def emitter(target, source, env):
        own_outputs(env, target, scratch_suffixes)
        return target, source
    return emitter


def own_outputs(env, nodes, scratch_suffixes: Sequence[str] = ()) -> None:
    """What the tool does for every node it makes: under ``scons -c`` it has SCons remove the nodes'
    leftovers with them, and otherwise it reuses their recorded content signatures
    (:func:`reuse_content_signatures`).

    Leftovers have random names, so they are found now, at read time (only when cleaning; one listing per
    directory), and handed to ``env.Clean``; ``scratch_suffixes`` name the node's scratch directories
    (``<target>.inputs`` of a device link), which SCons removes with their contents. An emitter that makes
    nodes calls this for them (rather than giving their builders an emitter: SCons makes each builder
    call with an emitter look its nodes up twice)."""
    freeze_declared_graph()
    try:
        leftovers.check_partial_suffix(word_value(env, "OFFLOAD_PARTIAL_SUFFIX"))
    except OffloadError as error:
        raise user_error(error) from None
    if SCons.Script.GetOption("clean"):
        suffix = env.subst("$OFFLOAD_PARTIAL_SUFFIX")
        for node in nodes:
            found = _LEFTOVERS.find(node.get_abspath(), suffix, scratch_suffixes)
            if found:
                env.Clean(node, found)
    else:
        reuse_content_signatures(env, nodes)


def freeze_declared_graph() -> None:
    """While SCons reads the SConscripts, take everything made so far out of the cyclic garbage collector's
    reach (``gc.freeze()``, constant time).

    The nodes, executors and environments a build declares live until the process exits, yet CPython's
    collector walks them all again in each full collection, and once more at exit: for 256 sources x 8
    targets (2600 nodes) 0.1-0.25 s of a 1.2-1.5 s no-op. Frozen, they are skipped; what the build phase
    makes is collected as before. The cost: cyclic garbage made while reading, before the last freeze, is
    never collected (its memory goes back with the process's; its finalizers do not run). Outside the
    reading of SConscripts (the tool used from a Python program or a test) nothing is frozen, nor in a
    free-threaded CPython, whose ``gc.freeze()`` visits every object."""
    if SCons.Script.sconscript_reading and getattr(sys, "_is_gil_enabled", lambda: True)():
        gc.freeze()


#: Per project top directory: its content records, and the nodes whose signatures go into them at exit with
#: their files' stat when the SConscripts were read (before SCons hashed anything).
_CONTENT_RECORDS: dict[str, tuple[ContentRecords, list[tuple[Any, os.stat_result | None]]]] = {}

#: The name of the content records' file in the project's top directory.
CONTENT_RECORDS_FILE = ".sconsign.offload-contents"


def reuse_content_signatures(env, nodes) -> None:
    """Give each node whose file is the very file (by inode, size, modification and change time) whose
    content signature an earlier run recorded that signature, so SCons does not hash it again; at exit,
    record the signatures this run computed (see :mod:`offload_builders.content_records`: SCons hashes every
    output younger than ``--max-drift`` on every run, our intermediates included, a no-op too).

    A negative ``--max-drift`` asks SCons to hash every file on every run: then nothing is reused or
    recorded."""
    if _trusts_no_signature():
        return
    top = env.Dir("#").abspath
    entry = _CONTENT_RECORDS.get(top)
    if entry is None:
        if not _CONTENT_RECORDS:
            atexit.register(_record_content_signatures)
        records = ContentRecords(os.path.join(top, CONTENT_RECORDS_FILE), _build_hash_format(), time.time_ns())
        entry = _CONTENT_RECORDS[top] = (records, [])
    records, watched = entry
    for node in nodes:
        stat = node.stat()
        if stat is not None:
            signature = records.known(node.get_abspath(), stat)
            if signature is not None:
                node.get_ninfo().csig = signature
        watched.append((node, stat))


def _trusts_no_signature() -> bool:
    """``--max-drift`` (or a ``SetOption`` of it) below zero. Outside the ``scons`` command (the tool used
    from a Python program) SCons' options read as None."""
    drift = SCons.Script.GetOption("max_drift")
    return isinstance(drift, int) and drift < 0


def _build_hash_format() -> str:
    """The hash format this build's signatures will have. SCons applies ``--hash-format`` (and a ``SetOption``
    of it) only once the SConscripts are read, so while they are, the hash function in use is the default
    one; the option, as set so far, is what counts."""
    chosen = SCons.Script.GetOption("hash_format")
    return chosen.lower() if chosen else SCons.Util.get_current_hash_algorithm_used()


def _record_content_signatures() -> None:
    """At exit: each watched node's content signature, if SCons computed one, for its file if the file is the
    one it was when the SConscripts were read. Nothing is recorded if the signatures are not of the format the
    records were read for, or if ``--max-drift`` ended below zero (a ``SetOption`` of either after the tool's
    first node; this run has used the records read for the options as they were then: in the worst case,
    signatures of the other format, which match no record of this one, so their consumers rerun)."""
    if SCons.Script.GetOption("no_exec") or SCons.Script.GetOption("clean") or _trusts_no_signature():
        return
    for records, watched in _CONTENT_RECORDS.values():
        if records.hash_format != SCons.Util.get_current_hash_algorithm_used():
            continue
        for node, before in watched:
            path = node.get_abspath()
            try:
                after = os.stat(path) if node.rfile() is node else None
            except OSError:
                after = None
            records.note(path, before, after, getattr(getattr(node, "ninfo", None), "csig", None))
        records.save()


#: The emitter of every phase builder: see :func:`own_outputs`.
CLEAN_LEFTOVERS = clean_leftovers()


class CachingLazyAction(SCons.Action.LazyAction):
    """``$VAR`` as SCons makes it (a lazy action), keeping the action it makes of a function: SCons makes a new
    one each time it asks the node anything (its description, signature, scans: five times a node in a
    no-op), and hashes the function's code each time; the same function gives the same action. Other values
    (a command line, a list) take SCons' own path."""

    def __init__(self, var, kw) -> None:
        super().__init__(var, kw)
        self._made: dict[Any, SCons.Action.ActionBase] = {}  # per function value, the action made of it

    def _generate_cache(self, env):
        value = env.get(self.var) if env else None
        if not callable(value) or isinstance(value, SCons.Action.ActionBase):
            return super()._generate_cache(env)
        try:
            return memoized(self._made, value, lambda: super(CachingLazyAction, self)._generate_cache(env))
        except TypeError:  # an unhashable callable object
            return super()._generate_cache(env)


class PhaseCommandAction(CachingLazyAction):
    """``$OFFLOAD_<PHASE>COM`` as SCons makes it (a lazy action), without ``Subst`` while the variable is
    just the name of one of our renderers.

    SCons substitutes a node's command three times (signature, message, run), and each time walks the
    ~80 words of a ``-cc1`` line through its expansion machinery, about 1 ms a node; a :class:`Renderer`
    already holds the final words. Any other value (``ccache $_OFFLOAD_HOST_CC1``, a function, a
    ``$( $)`` section) takes SCons' own path, as do overrides passed to the action.
    """

    def __init__(self, phase: str, varlist: Sequence[str] = ()) -> None:
        super().__init__(f"OFFLOAD_{phase}COM", {"cmdstr": f"$OFFLOAD_{phase}COMSTR", "varlist": tuple(varlist)})

    def renderer(self, env) -> Renderer | None:
        value = env.get(self.var)
        if isinstance(value, str) and value[:1] == "$" and value[1:].isidentifier():
            renderer = env.get(value[1:])
            if isinstance(renderer, Renderer):
                return renderer
        return None

    def _node_renderer(self, target, env) -> Renderer | None:
        """:meth:`renderer`, once per node, for what SCons asks of every node in every build (its signature,
        its command scan, its action's description): after the SConscripts are read, a node's build
        environment no longer changes."""
        memo = getattr(target[0].attributes, "_offload_renderers", None) if target else None
        if memo is None:
            if not target:
                return self.renderer(env)
            memo = target[0].attributes._offload_renderers = {}
        if self.var not in memo:
            memo[self.var] = self.renderer(env)
        return memo[self.var]

    @staticmethod
    def _render(renderer: Renderer, target, source, env, executor, for_signature: bool) -> list[str]:
        """The renderer's words for the nodes SCons' substitution would give it (the executor's, sources
        through their repository copies)."""
        if executor:
            target, source = executor.get_all_targets(), executor.get_all_sources()
        return renderer.words(target, [SCons.Action.rfile(node) for node in source], env, for_signature)

    def process(self, target, source, env, executor=None, overrides=None):
        renderer = None if overrides else self.renderer(env)
        if renderer is None:
            return super().process(target, source, env, executor, overrides)
        return [_literal(self._render(renderer, target, source, env, executor, False))], False, False

    def argv(self, target, source, env, executor=None) -> list[str] | None:
        """The words the node runs, where the variable is just one of our renderers (None otherwise: a
        command of the user's, a function): what remote execution sends."""
        renderer = self._node_renderer(executor.get_all_targets() if executor else target, env)
        return None if renderer is None else self._render(renderer, target, source, env, executor, False)

    def get_targets(self, env, executor):
        # A lazy action would make an action of the renderer (and hash its code) to answer this.
        return self.targets if self.renderer(env) is not None else super().get_targets(env, executor)

    def batch_key(self, env, target, source):
        return None if self.renderer(env) is not None else super().batch_key(env, target, source)

    def genstring(self, target, source, env, executor=None):
        # What SCons records as the node's action (shown by --debug=explain), as a lazy action words it.
        renderer = self._node_renderer(executor.get_all_targets() if executor else target, env)
        if renderer is None:
            return super().genstring(target, source, env, executor)
        return f"{renderer.__name__}(target, source, env)"

    def execute(self, target, source, env, executor=None):
        """With SCons' own POSIX ``$SPAWN``, run the rendered argv without ``sh -c``: it is an argv list
        from the driver, never shell syntax, and the shell's start costs about 1 ms a node. Only words of the
        user's own flags written for the shell (:func:`_user_shell_words`) ever reach one; any other value of
        the variable takes SCons' path, its words quoted by :class:`_Escape` (SCons' own leaves backticks active)."""
        renderer = self.renderer(env)
        if renderer is not None and env.get("SPAWN") is _SHELL_SPAWN:
            words = self._shell_words(renderer, target, source, env, executor)
            env = env.Override({"SPAWN": functools.partial(_spawn_argv, shell_words=words), "ESCAPE": str})
        elif env.get("ESCAPE") is _SHELL_ESCAPE:
            env = env.Override({"ESCAPE": _Escape(env, executor.get_all_targets() if executor else target, source)})
        return super().execute(target, source, env, executor)

    def _shell_words(self, renderer: Renderer, target, source, env, executor) -> frozenset[str]:
        """:func:`_user_shell_words` for a node whose rendered words hold something a shell acts on, else none
        (the usual case: the user's flags are not read at all)."""
        words = self._render(renderer, target, source, env, executor, False)
        if not any(_SHELL_ACTIVE.search(word) for word in words):
            return frozenset()
        return _user_shell_words(env, executor.get_all_targets() if executor else target, source)

    def get_presig(self, target, source, env, executor=None):
        renderer = self._node_renderer(executor.get_all_targets() if executor else target, env)
        if renderer is None:
            return super().get_presig(target, source, env, executor)
        return " ".join(self._render(renderer, target, source, env, executor, True))

    def get_implicit_deps(self, target, source, env, executor=None):
        """SCons' default command scan (``$IMPLICIT_COMMAND_DEPENDENCIES`` unset or true: the program, the first
        word found on ``$ENV['PATH']``) read from the rendered words, which SCons would substitute once more
        (about 1 ms a node); any other setting takes SCons' own path."""
        if env.get("IMPLICIT_COMMAND_DEPENDENCIES", True) not in (True, 1):  # our compile nodes: 0
            return super().get_implicit_deps(target, source, env, executor)
        renderer = self._node_renderer(executor.get_all_targets() if executor else target, env)
        if renderer is None:
            return super().get_implicit_deps(target, source, env, executor)
        words = self._render(renderer, target, source, env, executor, True)
        program = env.WhereIs(words[0]) if words else None
        return [env.fs.File(program)] if program else []


_SHELL_SPAWN = SCons.Platform.posix.subprocess_spawn


class _DeviceLinkCommandAction(PhaseCommandAction):
    """``$OFFLOAD_DEVICELINKCOM``: a device link that fails on a device-library symbol (``__ocml_sin_f64``,
    ``__nv_sinf``) ends with one line naming the library and what to install, rather than only the linker's
    "undefined symbol" (see :func:`offload_builders.device_libraries.missing_library_hint`). Its messages
    still reach the terminal as they come; they are kept to be read once it fails."""

    def execute(self, target, source, env, executor=None):
        renderer = self.renderer(env)
        if env.get("SPAWN") is not _SHELL_SPAWN or renderer is None:
            return super().execute(target, source, env, executor)
        messages: list[str] = []
        spawn = functools.partial(_spawn_keeping_stderr, messages, _inputs_dir(env, target[0]) if target else None,
                                  shell_words=self._shell_words(renderer, target, source, env, executor))
        env = env.Override({"SPAWN": spawn, "ESCAPE": str})
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

#: SCons' own ``$ESCAPE`` on POSIX. It puts a literal word in double quotes with only ``\``, ``"`` and ``$``
#: escaped, where a backtick still runs a command: our actions replace it (:func:`_quote_word`).
_SHELL_ESCAPE = SCons.Platform.posix.escape


def _user_shell_words(env, target, source) -> frozenset[str]:
    """The words of the user's own flags that SCons' ``$CCCOM`` would hand a shell to read, and the values a
    driver job repeats them as (``-DV=\\"1\\"`` becomes ``-D`` ``V=\\"1\\"`` in a ``-cc1`` line).

    The user's flags are every ``*FLAGS`` variable of theirs (``{target: flags}`` tables included) and the
    defines; a word counts where SCons would not quote it (it is not literal) and a shell would change it.
    Words that the tool or the driver made (paths, the top directory in ``-fdebug-compilation-dir=``) are not
    among them: they must reach the program as they are, whatever the project's path holds."""
    names = ["_CPPDEFFLAGS"]
    tables: list[Any] = []
    for name, value in env.Dictionary().items():
        if not name.endswith("FLAGS") or name.startswith("_"):
            continue
        if isinstance(value, dict):
            tables.extend(flags for flags in value.values() if flags)
        else:
            names.append(name)
    lines = env.subst_list(" ".join(f"${name}" for name in names), SCons.Subst.SUBST_CMD, target=target,
                           source=source)
    for flags in tables:
        lines += env.subst_list(flags, SCons.Subst.SUBST_CMD, target=target, source=source)
    words: set[str] = set()
    for line in lines:
        for word in line:
            text = str(word)
            if _SHELL_ACTIVE.search(text) and not getattr(word, "is_literal", lambda: False)():
                words.update((text, *_option_values(text)))
    return frozenset(words)


def _option_values(word: str) -> list[str]:
    """What a driver job may repeat of a flag: the value of a one-letter option (``V=1`` of ``-DV=1``, as
    ``-D V=1`` in a ``-cc1`` line), and that of an ``-f...=`` option (``-ffile-prefix-map=V`` becomes
    ``-fdebug-prefix-map=V``)."""
    values = []
    if len(word) > 2 and word[0] == "-" and word[1].isalpha():
        values.append(word[2:])
    if word.startswith("-f") and "=" in word:
        values.append(word.split("=", 1)[1])
    return values


def _from_user(word: str, shell_words: frozenset[str]) -> bool:
    """Whether ``word`` of a command is one of the user's words for the shell, or one's value under the same
    or another option."""
    return word in shell_words or any(value in shell_words for value in _option_values(word))


def _quote_word(word: str, shell_words: frozenset[str] = frozenset()) -> str:
    """``word`` for a shell command line: the user's own words for the shell as SCons passes them (in double
    quotes where they hold a space, so the shell reads the rest), any other word quoted so that the shell
    passes it unchanged."""
    word = str(word)
    if _from_user(word, shell_words):
        return SCons.Subst.quote_spaces(word)
    return shlex.quote(word)


class _Escape:
    """``$ESCAPE`` for one command that SCons' own path runs (a wrapped phase command): :func:`_quote_word`,
    the user's words read only once a word holds something a shell acts on."""

    def __init__(self, env, target, source) -> None:
        self._env, self._target, self._source = env, target, source
        self._shell_words: frozenset[str] | None = None

    def __call__(self, word) -> str:
        text = str(word)
        if _SHELL_ACTIVE.search(text) is None:
            return shlex.quote(text)
        if self._shell_words is None:
            self._shell_words = _user_shell_words(self._env, self._target, self._source)
        return _quote_word(text, self._shell_words)


def _command(shell: str, args: Sequence[str], shell_words: frozenset[str]) -> list[str]:
    """The argv that runs ``args``: themselves, or ``sh -c`` where one of the user's words needs the shell."""
    if not any(_SHELL_ACTIVE.search(arg) and _from_user(arg, shell_words) for arg in args):
        return list(args)
    return [shell, "-c", " ".join(_quote_word(arg, shell_words) for arg in args)]


def _spawn_keeping_stderr(messages: list[str], scratch: str | None, shell: str, escape, command: str, args: list[str],
                          environ: dict[str, str], shell_words: frozenset[str] = frozenset()) -> int:
    """Like :func:`_spawn_argv`, with the command's standard error passed on and appended to ``messages``, and
    its ``$TMPDIR`` a directory of its own inside ``scratch`` (the device link's unpacked inputs)."""
    try:
        with leftovers.private_tmpdir(environ, scratch) as private:
            done = subprocess.run(_command(shell, args, shell_words), env=private, stderr=subprocess.PIPE,
                                  close_fds=True, check=False)
    except OSError as error:
        print(f"{args[0]}: {error.strerror}", file=sys.stderr)
        return 127 if error.errno == errno.ENOENT else 126
    text = done.stderr.decode(errors="replace")
    if text:
        sys.stderr.write(text)
        sys.stderr.flush()
    messages.append(text)
    return done.returncode


def _spawn_argv(shell: str, escape, command: str, args: list[str], environ: dict[str, str],
                shell_words: frozenset[str] = frozenset()) -> int:
    """``$SPAWN`` for argv that needs no shell; the exit status ``sh`` would give for a missing program.

    Only the user's own words for the shell (``shell_words``, see :func:`_user_shell_words`) send it through
    one, every other word quoted for it: users write flags for the shell (``CPPDEFINES=[("V",
    '\\\\"1.0\\\\"')]`` relies on it to drop the backslashes), while a word the tool or the driver made
    (``-fdebug-compilation-dir=`` with a project path holding a backtick or a ``"``) is never shell syntax."""
    try:
        return SCons.Platform.posix.exec_subprocess(_command(shell, args, shell_words), environ)
    except OSError as error:
        print(f"{args[0]}: {error.strerror}", file=sys.stderr)
        return 127 if error.errno == errno.ENOENT else 126


class HostLinkAction(SCons.Action.LazyAction):
    """``$OFFLOAD_LINKCOM`` as SCons makes it. While it is our default line and SCons' POSIX ``$SPAWN``
    runs it, the spawn runs the one job the driver would run for that line (its ``ld.lld``), known from
    a probe kept in the project's probe cache, instead of starting the driver: about 20 ms a link.
    Signature and message stay the driver line's, so nothing relinks for this and the printed command
    still does what it says."""

    def __init__(self) -> None:
        super().__init__("OFFLOAD_LINKCOM", {"cmdstr": "$OFFLOAD_LINKCOMSTR"})

    def execute(self, target, source, env, executor=None):
        if (env.get("SPAWN") is _SHELL_SPAWN and env.get(self.var) == HOST_LINKCOM
                and (cache := probe_cache_for(env)) is not None):
            if executor:
                target, source = executor.get_all_targets(), executor.get_all_sources()
            lines = self.process(target, [SCons.Action.rfile(node) for node in source], env, executor)[0]
            if len(lines) == 1 and not any(_for_the_shell(word) for word in lines[0]):
                return super().execute(target, source, env.Override(
                    {"SPAWN": functools.partial(_spawn_link_job, cache), "ESCAPE": str}), executor)
        if env.get("ESCAPE") is _SHELL_ESCAPE:  # its literal words (file names) as they are, backticks too
            env = env.Override({"ESCAPE": _quote_word})
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


def node_action(actions: Sequence) -> RemoteListAction:
    """The action list of an offload node: its steps, which start by sweeping leftovers (:data:`REMOVE_STALE`)
    and commit with :data:`COMMIT`, asking the remote cache first where ``$OFFLOAD_REMOTE`` names one
    (:class:`offload_builders.scons.remote.RemoteListAction`; its signature is the list's own)."""
    return RemoteListAction(list(actions), sweep=REMOVE_STALE, commit=COMMIT)


def phase_action(phase: str) -> SCons.Action.ListAction:
    return node_action([REMOVE_STALE, PhaseCommandAction(phase), COMMIT])


def check_tools_for(env, targets: Sequence[TargetID]) -> None:
    """Fail at read time, before any compile, when a target needs a tool that is not installed."""
    _check_tools(toolchain_for(env), any(tid.kind == "nvptx" for tid in targets))


@functools.lru_cache(maxsize=32)
def _check_tools(toolchain: Toolchain, nvptx: bool) -> None:
    """Once per toolchain and need, not per source (an error is not cached: it stops the build)."""
    try:
        toolchain.tool("clang-offload-packager")
        if nvptx:  # the tools of OpenMP images: one the runtime loads, or one line saying why there is none
            nvptx_tools.openmp_tool(toolchain, "ptxas")
    except OffloadError as error:
        raise user_error(error) from None


#: Per environment (by identity; the environment is kept, so its id is not reused): its override
#: environments by their overrides, see :func:`override_environment`.
_OVERRIDE_ENVIRONMENTS: dict[int, tuple[Any, dict[tuple, Any]]] = {}


def override_environment(env, overrides: Mapping[str, Any]):
    """``env.Override(overrides)``, made once per environment and overrides (their values hashable): what a
    builder call with those keyword arguments makes for each node. An emitter that makes the same kind of
    node for every source (a target's device compile) passes it to the builder instead of the keywords,
    so its nodes share one environment, as nodes made without overrides share the caller's."""
    entry = _OVERRIDE_ENVIRONMENTS.get(id(env))
    if entry is None or entry[0] is not env:
        entry = _OVERRIDE_ENVIRONMENTS[id(env)] = (env, {})
    key = tuple(sorted(overrides.items()))
    made = entry[1].get(key)
    if made is None:
        made = entry[1][key] = env.Override(dict(overrides))
        _SCAN_SUBJECTS[id(made)] = env
    return made


#: Each environment :func:`override_environment` made, by identity, to the environment it was made from.
_SCAN_SUBJECTS: dict[int, Any] = {}


class _ScanPath(tuple):
    """A scanner's search path (a tuple, as SCons computes it per node), with what it was computed from."""

    context: tuple


class _WholeScan:
    """One scanner SCons' ``SourceFileScanner`` selects for a source, answering for the source with every
    file it includes, directly or through files no node builds (see :class:`SharedSourceScanner`)."""

    def __init__(self, scanner) -> None:
        self.scanner = scanner
        self.name = getattr(scanner, "name", "scanner")

    def path(self, env, dir=None, target=None, source=None):
        path = _ScanPath(self.scanner.path(env, dir, target, source))
        path.context = (dir, target, source)
        return path

    def __call__(self, node, env, path=()):
        subject = _SCAN_SUBJECTS.get(id(env), env)
        key = (id(self.scanner), id(subject), tuple(path))
        # Kept where SCons keeps a file's includes (the node's memo, which SCons empties whenever the file
        # may have changed: once it is built, and in --interactive before every build).
        memo = node._memo.setdefault("offload_whole_scan", {})
        found = memo.get(key)
        if found is None:
            dir, target, source = getattr(path, "context", (None, None, None))
            found = memo[key] = _walk_includes(node, subject, self.scanner,
                                               lambda scanner: scanner.path(subject, dir, target, source))
        return found

    def recurse_nodes(self, nodes) -> list:
        """Only the built files among them: what they include is known once they are built, and SCons walks
        them again then; the rest of the walk is in the answer."""
        return [node for node in nodes if node.has_builder()]

    def select(self, node):
        return SHARED_SOURCE_SCANNER.select(node)

    def __str__(self) -> str:
        return str(self.scanner)


def _walk_includes(node, env, root_scanner, path_of: Callable[[Any], Any]) -> list:
    """SCons' breadth-first walk of a phase node's source (``Node.get_implicit_deps`` with the builder's
    ``SourceFileScanner``: each file's scanner by its suffix, else the source's), except that a file some
    node builds is listed but not walked into."""
    found: list = []
    seen, queue, paths = {node}, [node], {}
    while queue:
        current = queue.pop(0)
        scanner = SCons.Tool.SourceFileScanner.select(current) or root_scanner
        if scanner is None:
            continue
        if scanner not in paths:
            paths[scanner] = path_of(scanner)
        included = [each for each in current.get_found_includes(env, scanner, paths[scanner]) if each not in seen]
        found.extend(included)
        seen.update(included)
        queue.extend(each for each in scanner.recurse_nodes(included) if not each.has_builder())
    return found


class SharedSourceScanner:
    """The phase nodes' source scanner: SCons' own walk through a source's includes (``SourceFileScanner``,
    with whatever the user added to it), made once per source and environment, not once per phase node.

    SCons walks a source's includes for every node that has it as a source, and keeps each file's includes
    per environment object: a source compiled for four targets was walked five times (host front end, four
    device compiles; the object a sixth), each walk as many steps as the source includes files. Our phase
    nodes differ from their object's environment only by our own variables (``$OFFLOAD_TARGET``, never
    ``$CPPPATH``, ``$CPPDEFINES`` or the scanners), so they find the same files: the first one walks with
    the object's environment, the others take its list. A generated header is walked by SCons itself,
    after it is built, as before."""

    def __init__(self) -> None:
        self._by_scanner: dict[int, _WholeScan] = {}

    def select(self, node):
        scanner = SCons.Tool.SourceFileScanner.select(node)
        if scanner is None:
            return None
        whole = self._by_scanner.get(id(scanner))
        if whole is None or whole.scanner is not scanner:
            whole = self._by_scanner[id(scanner)] = _WholeScan(scanner)
        return whole

    def __call__(self, node, env, path=()):
        selected = self.select(node)
        return selected(node, env, path) if selected is not None else []

    def path(self, env, dir=None, target=None, source=None):
        return ()

    def recurse_nodes(self, nodes):
        return nodes


SHARED_SOURCE_SCANNER = SharedSourceScanner()


def command_dependency_overrides(env) -> dict:
    """Overrides for the compile nodes: no implicit command dependency scan (unless the user configured it).

    SCons finds a command's program by rendering the whole command once more and searching ``$PATH`` for
    its first word, for every node, and then hashes the program's contents (37 MiB for CUDA 13's
    ``ptxas``) on every run, no-op builds included. Our phase commands start with the absolute path of
    the probed program, so :func:`depend_on_program` names it through a stamp instead.
    """
    return {} if "IMPLICIT_COMMAND_DEPENDENCIES" in env else {"IMPLICIT_COMMAND_DEPENDENCIES": 0}


@functools.lru_cache(maxsize=256)
def program_stamp(program: str) -> str:
    """What identifies an installed program (or device library) for rebuilds: its resolved path, size and
    modification time (a package update changes them; the toolchain cache keys on the same). Read once per
    build (every compile node names the same few programs and libraries; none changes during a build)."""
    resolved = os.path.realpath(program)
    try:
        status = os.stat(resolved)
    except OSError:
        return f"{resolved} (missing)"
    return f"{resolved} size={status.st_size} mtime_ns={status.st_mtime_ns}"


def depend_on_stamps(nodes, paths: Sequence[str]) -> None:
    """``env.Depends(nodes, env.Value(program_stamp(path)))`` for each path, without ``Depends``' node lookups:
    ``nodes`` are nodes already (a builder's), and the stamps' value nodes are made once per build."""
    values = [_stamp_value(path) for path in paths]
    if values:
        for node in nodes:
            node.add_dependency(values)


@functools.lru_cache(maxsize=256)
def _stamp_value(path: str) -> SCons.Node.Python.Value:
    return SCons.Node.Python.ValueWithMemo(program_stamp(path))


def depend_on_program(env, nodes, overrides: dict, template) -> None:
    program = str(template.argv[0]) if template is not None and template.argv else ""
    if overrides and os.path.isabs(program):
        depend_on_stamps(nodes, [program])


def depend_on_device_libraries(env, nodes, template) -> None:
    """Make compile nodes depend on the device libraries their command links (``-mlink-builtin-bitcode``:
    ROCm's ocml/oclc, libdevice, the NVPTX OpenMP runtime), each by its stamp, so an upgraded library
    package rebuilds them. SCons would not see them otherwise: they are arguments, not sources."""
    depend_on_stamps(nodes, _linked_libraries(tuple(template.argv) if template is not None else ()))


@functools.lru_cache(maxsize=256)
def _linked_libraries(argv: tuple) -> tuple[str, ...]:
    """:func:`offload_builders.device_libraries.linked_libraries` once per job template (one per target and
    flags, shared by every source)."""
    return tuple(device_libraries.linked_libraries(argv))


class OffloadLinkWarning(SCons.Warnings.WarningOnByDefault):
    """A link-time offload problem that does not stop the build (a target with no device code)."""


def static_libraries(env) -> list:
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


def scanned_inputs(paths: Sequence[str]) -> linking.ScannedInputs:
    """Scan the link inputs once per build for all targets (keyed on the files' identity)."""
    key = _identity_key(paths)
    if key not in _SCANS:
        _SCANS.clear()
        _SCANS[key] = linking.scan_link_inputs(paths)
    return _SCANS[key]


def _identity_key(paths: Sequence[str]) -> tuple:
    """The files as they are now (path, modification time, size; a missing one by its path alone)."""
    key: list[tuple] = []
    for path in paths:
        try:
            status = os.stat(path)
        except OSError:
            key.append((path,))
        else:
            key.append((path, status.st_mtime_ns, status.st_size))
    return tuple(key)


_KINDS: dict[tuple, frozenset[str]] = {}


def input_offload_kinds(paths: Sequence[str], llvm_version: int) -> frozenset[str]:
    """:func:`offload_builders.linking.offload_kinds` of the link inputs, read once per build: SCons renders
    the host link's runtime (which depends on them) for its signature, its command scan and its run. The
    answer is also remembered per user by the inputs' absolute paths, sizes and modification times, so a
    no-op build reads no object (reading every object cost a no-op of 64 sources about 5%)."""
    key = (llvm_version, _identity_key(paths))
    if key not in _KINDS:
        from offload_builders.toolchain import user_cache

        cache = user_cache("link-input-kinds.json", max_entries=256)
        remembered = "link-input-kinds-v1:" + hashlib.blake2b(
            repr((llvm_version, [(os.path.abspath(entry[0]), *entry[1:]) for entry in key[1]])).encode(),
            digest_size=20).hexdigest()
        known = cache.get(remembered) if cache is not None else None
        if known is not None and len(known) == 1:
            _KINDS[key] = frozenset(known[0])
        else:
            _KINDS[key] = linking.offload_kinds(paths, llvm_version)
            if cache is not None:
                cache.put(remembered, (tuple(sorted(_KINDS[key])),))
    return _KINDS[key]


def extract_device_inputs(target, source, env, choose: Callable[..., list[linking.FoundBinary]]) -> int:
    """An extract node's action: scan the link inputs (once per build for all targets), let the model's
    ``choose(target, env, scanned, tid, key)`` pick one target's device files (it raises ``BuildError``
    for what stops the link), and write them to the node's device input file."""
    tid = parse_target_id(env.subst("$OFFLOAD_TARGET"))
    try:
        files = choose(target, env, scanned_inputs([str(node) for node in source]), tid, linking.group_key(tid))
        linking.write_device_inputs(files, partial_path(env, target[0]))
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
        open(partial_path(env, target[0]), "wb").close()
    return 0


def _remove_inputs_dir(target, source, env) -> int:
    directory = _inputs_dir(env, target[0])
    if _empty_directory(directory):
        os.rmdir(directory)
    return 0


def _empty_directory(directory: str) -> bool:
    """Delete what an unpacked-inputs directory holds (a killed link's ``$TMPDIR`` too); whether it exists."""
    if not os.path.isdir(directory):
        return False
    leftovers.remove_leftovers(os.path.join(directory, name) for name in os.listdir(directory))
    return True


@Renderer
def device_link_cmd(target, source, env, for_signature):
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
    return device_link_argv(env, tid, target, source, inputs, partial_path(env, target[0]), for_signature)


def device_link_argv(env, tid: TargetID, target, source, inputs: Sequence[str], output: str,
                     for_signature: bool = False) -> list[str]:
    """One device link of ``inputs`` to ``output`` with the flags of the node ``target``: the driver's own
    job, probed when the program was declared; the driver command if the flags differ now."""
    flags, host_libraries = _device_link_arguments(env, tid, target, source, for_signature)
    toolchain, key = toolchain_for(env), linking.group_key(tid)
    job = linking.known_device_link(toolchain, key, flags=flags, host_libraries=host_libraries)
    if job is not None:
        return linking.render_device_link(job, inputs, output, host_libraries)
    return linking.device_link_command(toolchain, key, inputs, output, flags=flags, host_libraries=host_libraries)


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


def probe_device_link(node, tid: TargetID) -> str | None:
    """Ask the driver, at read time, for the job of this device-link node (see :func:`device_link_cmd`);
    the program that job runs (None where the link runs the driver)."""
    executor = node.get_executor()
    env = executor.get_build_env()
    targets, sources = executor.get_all_targets(), executor.get_all_sources()
    program = None
    try:
        for for_signature in (True, False):
            flags, host_libraries = _device_link_arguments(env, tid, targets, sources, for_signature)
            job = linking.probe_device_link(toolchain_for(env), linking.group_key(tid), flags=flags,
                                            host_libraries=host_libraries, cache=probe_cache_for(env),
                                            warn=functools.partial(SCons.Warnings.warn, OffloadLinkWarning))
            program = str(job.argv[0]) if job is not None else None
    except OffloadError as error:
        raise user_error(error) from None
    return program


def device_link_level(target, source, env, for_signature):
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


def target_link_flags(target, source, env, for_signature):
    """``$OFFLOAD_TARGET_LINKFLAGS[target]``: device-link flags for one target ID."""
    return target_flags(env, parse_target_id(env.subst("$OFFLOAD_TARGET")), "OFFLOAD_TARGET_LINKFLAGS")


def function_phase(phase: str, before=(), after=(), varlist: Sequence[str] | None = None,
                    command: type[PhaseCommandAction] = PhaseCommandAction) -> SCons.Action.ListAction:
    """Like :func:`phase_action` for phases whose ``$OFFLOAD_<PHASE>COM`` may be a Python function
    (``varlist``: what its signature reads, default :data:`FUNCTION_PHASE_VARLIST`)."""
    return node_action([
        REMOVE_STALE, *before,
        command(phase, FUNCTION_PHASE_VARLIST if varlist is None else varlist),
        COMMIT, *after,
    ])


def in_process_action(function, phase: str, varlist: Sequence[str]) -> SCons.Action.FunctionAction:
    """A default ``$OFFLOAD_<PHASE>COM`` that runs ``function`` in the SCons process, as one action object.

    Given a bare function, SCons makes a new action from it each time it resolves the variable (for
    the signature, the dependencies, the message and the run: five times a node) and hashes the
    function's bytecode each time. An action object is used as it is; it carries the message and
    ``varlist`` the builder's ``$VAR`` action would have passed.
    """
    return SCons.Action.Action(function, f"$OFFLOAD_{phase}COMSTR", varlist=list(varlist))


FUNCTION_PHASE_VARLIST = ("OFFLOAD_TARGET", "OFFLOAD_CLANG", "_OFFLOAD_WRAP_TARGETS")


EXTRACT_BUILDER = SCons.Builder.Builder(action=function_phase("EXTRACT"), emitter=CLEAN_LEFTOVERS)


DEVICE_LINK_BUILDER = SCons.Builder.Builder(action=function_phase(
    "DEVICELINK", before=[SCons.Action.Action(_unpack_device_inputs, None)],
    after=[SCons.Action.Action(_remove_inputs_dir, None)], command=_DeviceLinkCommandAction),
    emitter=clean_leftovers([".inputs"]))  # _inputs_dir: the unpacked inputs, a scratch directory


def deploy_devices(env) -> list[str]:
    value = env.get("OFFLOAD_DEPLOY_DEVICES") or []
    return [env.subst(d) for d in ([value] if isinstance(value, str) else SCons.Util.flatten(value)) if d]


def check_deployable(target, source, env) -> int:
    """Fail the link when a deployment device would find no image it can load (see ``offload-select``)."""
    devices = deploy_devices(env)
    if not devices:
        return 0
    from offload_builders.selection import check_deployment

    partial = partial_path(env, target[0])
    try:
        problems = check_deployment(partial, devices, llvm_version=toolchain_for(env).major)
        message = f"{target[0]}: not deployable: " + "; ".join(problems) if problems else ""
    except OffloadError as error:
        message = str(error)
    if message:
        if os.path.lexists(partial):
            os.unlink(partial)  # a program that is not deployable is not kept, not even as a leftover
        raise SCons.Errors.BuildError(node=target[0], errstr=message)
    return 0


def check_registered_entries(target, source, env) -> int:
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


def set_default(env, key: str, value: Any) -> None:
    if key not in env:
        env[key] = SCons.Util.CLVar(value) if isinstance(value, list) else value


def toolchain_exists(env) -> bool:
    """True when a usable Clang is found for ``env`` (the tools' ``exists``)."""
    try:
        toolchain_for(env)
    except SCons.Errors.UserError:
        return False
    return True


def program_link_nodes(env, program, inputs, targets: Sequence[TargetID], model: str, wrap_builder, *,
                       probe: bool = False, **link_overrides: Any) -> list:
    """The link side of ``program`` both models share: per target ID, in the order given, an extract node
    over ``inputs`` and a device-link node (``link_overrides`` on it; ``probe``: ask the driver for its job
    now, see :func:`probe_device_link`), then one ``wrap_builder`` node over the images, which the program
    depends on and records (``offload_wrapper``). Node names are the phase table's for ``model``. Returns
    the images, in the order of ``targets``."""
    stem, directory = program.name, program.dir
    images = []
    for tid in targets:
        names = {"program": stem, "target": tid.file_token}
        device_inputs = EXTRACT_BUILDER(env, [directory.File(node_name(Phase.EXTRACT, model, LINK, **names))], inputs,
                                        OFFLOAD_TARGET=str(tid))
        image = DEVICE_LINK_BUILDER(env, [directory.File(node_name(Phase.DEVICELINK, model, LINK, **names))],
                                    device_inputs, OFFLOAD_TARGET=str(tid), **link_overrides)
        if probe:
            probe_device_link(image[0], tid)
        images.extend(image)
    wrapper_name = node_name(Phase.WRAP, model, LINK, program=stem, obj=env.subst("$OBJSUFFIX"))
    wrapper = wrap_builder(env, [directory.File(wrapper_name)], images,
                           _OFFLOAD_WRAP_TARGETS=tuple(str(tid) for tid in targets))
    program.attributes.offload_wrapper = wrapper[0]
    env.Depends(program, wrapper)
    return images
