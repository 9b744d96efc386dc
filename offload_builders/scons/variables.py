"""Reading the ``offload`` tool's construction variables: the toolchain (``$OFFLOAD_CLANG``), the project's top
directory and probe cache, the phase model of a build (:func:`phase_model`), the targets (``$OFFLOAD_ARCHS``, its
``native`` asked of this machine's GPUs once per run, the ``{target ID: flags}`` tables and the warning about keys
that match no target), ``$OFFLOAD_RDC``, ``$OFFLOAD_DEPLOY_DEVICES``, defaults (:func:`set_default`), and our errors
as SCons' ``UserError``.

The bottom of :mod:`offload_builders.scons`: it imports no other module of ``offload_builders.scons`` (only core
modules), so each of them reads the variables through it.
"""
from __future__ import annotations

import collections
import functools
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import SCons.Errors
import SCons.Subst
import SCons.Util
import SCons.Warnings

from offload_builders import models
from offload_builders.errors import OffloadError
from offload_builders.native_targets import (
    ARCH_TOOLS,
    NATIVE,
    described,
    expand_native,
    names_native,
    system_gpu_names,
    toolchain_arch_tools,
)
from offload_builders.targets import TargetID, offload_arch_words, parse_offload_archs, parse_target_id
from offload_builders.toolchain import ProbeCache, Toolchain, find_toolchain, probe_cache


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


def node_target(env) -> TargetID:
    """The target of a per-target node (``$OFFLOAD_TARGET``): the emitters set it to the :class:`TargetID` itself
    (``str()`` is its canonical text, all that commands and signatures see); text, a user's override, is parsed."""
    value = env.get("OFFLOAD_TARGET")
    if isinstance(value, TargetID):
        return value
    return _parsed_target(word_value(env, "OFFLOAD_TARGET"), "OFFLOAD_TARGET")


def node_targets(env, variable: str) -> list[TargetID]:
    """The targets a node's images are for, in their order: ``$_OFFLOAD_BUNDLE_TARGETS`` (a fat binary's or
    package's) or ``$_OFFLOAD_WRAP_TARGETS`` (a program's wrapper and groups), which the emitters set to
    :class:`TargetID` objects."""
    return [value if isinstance(value, TargetID) else _parsed_target(str(value), variable) for value in env[variable]]


def _parsed_target(text: str, variable: str) -> TargetID:
    try:
        return parse_target_id(text)
    except OffloadError as error:
        raise SCons.Errors.UserError(f"{variable}: {error}") from None


def selected_targets(env) -> tuple[TargetID, ...]:
    """``$OFFLOAD_ARCHS`` parsed, canonicalized and checked (``native``: this machine's GPUs, see
    :func:`native_names`), or one ``UserError`` naming the offenders."""
    words = _arch_words(env)
    if names_native(words):
        try:
            expand_native(words, ())  # native with features: an error before any tool runs
        except OffloadError as error:
            raise SCons.Errors.UserError(f"OFFLOAD_ARCHS: {error}") from None
        names = native_names(env)
        return _parsed_archs(expand_native(words, names), f"OFFLOAD_ARCHS ({described(names)})")
    return _parsed_archs(words)


def _arch_words(env) -> str | tuple[str, ...]:
    value = env.get("OFFLOAD_ARCHS")
    if isinstance(value, str):
        value = env.subst(value)
    try:
        return offload_arch_words(value)
    except OffloadError as error:
        raise user_error(error) from None


@functools.lru_cache(maxsize=64)
def _parsed_archs(words: str | tuple[str, ...], variable: str = "OFFLOAD_ARCHS") -> tuple[TargetID, ...]:
    """Parsed once per distinct value: every source's emitter asks (hundreds of times in a large project)."""
    try:
        return parse_offload_archs(words)
    except OffloadError as error:
        raise SCons.Errors.UserError(f"{variable}: {error}") from None


#: Per pair of GPU-listing tools (their paths), the processors they printed: asked once per SCons run, since every
#: source's emitter reads ``$OFFLOAD_ARCHS``; kept in this process only (never on disk: the answer is the machine's).
_NATIVE_NAMES: dict[tuple, tuple[str, ...]] = {}


def native_names(env) -> tuple[str, ...]:
    """What ``native`` stands for in ``env``: the processors ``amdgpu-arch`` and ``nvptx-arch`` print (the
    toolchain's own, or ``$OFFLOAD_AMDGPU_ARCH_TOOL``/``$OFFLOAD_NVPTX_ARCH_TOOL``, construction or environment
    variables), or one ``UserError`` where they find no GPU."""
    chosen = {variable: word_value(env, variable) for _, variable in ARCH_TOOLS if env.get(variable)}
    tools = toolchain_arch_tools(toolchain_for(env), collections.ChainMap(chosen, os.environ))
    names = _NATIVE_NAMES.get(tools)
    if names is None:
        try:
            names = _NATIVE_NAMES[tools] = system_gpu_names(tools)
        except OffloadError as error:
            raise SCons.Errors.UserError(f"OFFLOAD_ARCHS: {error}") from None
    return names


def _key_targets(env, variable: str, key: object) -> tuple[TargetID, ...]:
    """The targets a ``{target ID: flags}`` key names: one, or for ``native`` those ``native`` in ``$OFFLOAD_ARCHS``
    stands for (none where the list does not name it: no tool runs for a table alone)."""
    try:
        if str(key).strip() != NATIVE:
            return (parse_target_id(str(key)),)
        if not names_native(_arch_words(env)):
            return ()
        return tuple(parse_target_id(name) for name in native_names(env))
    except OffloadError as error:
        raise SCons.Errors.UserError(f"{variable} key {key!r}: {error}") from None


def target_flags(env, target: TargetID, variable: str = "OFFLOAD_TARGET_FLAGS") -> list[str]:
    """``$OFFLOAD_TARGET_FLAGS`` (or another ``{target ID: flags}`` variable) entries for ``target``; keys
    may be spelled any valid way, and ``native`` names what it stands for in ``$OFFLOAD_ARCHS``."""
    table = env.get(variable) or {}
    flags: list[str] = []
    for key, value in table.items():
        if target in _key_targets(env, variable, key):
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
        named = _key_targets(env, variable, key)
        memo = (variable, str(key), tuple(targets))
        if any(tid in targets for tid in named) or memo in _WARNED_KEYS:
            continue
        _WARNED_KEYS.add(memo)
        near = [str(tid) for tid in targets if any(tid.processor == each.processor for each in named)]
        hint = (f"; did you mean {' or '.join(repr(n) for n in near)}? A key names a target ID of OFFLOAD_ARCHS"
                " exactly, features included" if near else "")
        if not named:  # a native key where OFFLOAD_ARCHS names no native
            hint = f"; a '{NATIVE}' key stands for what '{NATIVE}' in OFFLOAD_ARCHS stands for, and it names none"
        SCons.Warnings.warn(OffloadTargetKeyWarning,
                            f"{variable} key {key!r} matches no target of this build"
                            f" ({', '.join(str(tid) for tid in targets)}): its flags are not used{hint}")


def model_targets_for(env, source, model: str) -> tuple[TargetID, ...]:
    """The targets of ``$OFFLOAD_ARCHS`` (checked by :func:`selected_targets`) that ``model`` compiles
    ``source`` for; none is one ``UserError`` naming the source, its model and the list."""
    try:
        return models.source_targets(str(source), model, selected_targets(env))
    except OffloadError as error:
        if names_native(_arch_words(env)):  # the list named no such target: say what native found
            raise SCons.Errors.UserError(f"{error} ('{NATIVE}' stands for {','.join(native_names(env))} on this"
                                         " machine)") from None
        raise user_error(error) from None


def rdc_selected(env) -> bool:
    """``$OFFLOAD_RDC`` or its alias ``$OFFLOAD_HIP_RDC`` (both set and disagreeing: a ``UserError``)."""
    try:
        return models.rdc_setting(env.get("OFFLOAD_RDC"), env.get("OFFLOAD_HIP_RDC"))
    except OffloadError as error:
        raise user_error(error) from None


def deploy_devices(env) -> list[str]:
    value = env.get("OFFLOAD_DEPLOY_DEVICES") or []
    return [env.subst(d) for d in ([value] if isinstance(value, str) else SCons.Util.flatten(value)) if d]


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
