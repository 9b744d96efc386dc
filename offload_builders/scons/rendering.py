"""Rendering phase commands: :class:`Renderer`, a ``$_OFFLOAD_*`` command variable that renders once per node and
mode (its signature's words made portable), :class:`ModelRenderer`, a variable the models share that renders each
node with the renderer of the model that made it (:func:`mark_model`), the per-node memos of the user's flags
(:func:`node_memo`, :func:`node_flags`, :func:`compile_flags`), and ``$_OFFLOAD_RPATH`` (:func:`rpath_flags`).

The models' renderers are built on these; :mod:`offload_builders.scons.actions` runs what they render.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import SCons.Errors
import SCons.Script
import SCons.Subst
import SCons.Util

from offload_builders.driver import BoundCommand, memoized, portable_signature
from offload_builders.errors import OffloadError
from offload_builders.scons.variables import toolchain_for, top_directory, user_error

#: Driver flags that only change how the compiler runs, never what it produces: kept out of signatures.
_UNSIGNED_FLAG_PREFIXES = ("-v", "-fcolor-diagnostics", "-fno-color-diagnostics", "-fdiagnostics-color",
                           "--offload-jobs=", "-parallel-jobs=", "-ferror-limit=")


def compile_flags(env, target, source, for_signature: bool, language: str) -> tuple[str, ...]:
    """The user's compile flags for a node, as the driver will see them."""
    text = "$OFFLOAD_FLAGS $CCFLAGS " + ("$CXXFLAGS" if language == "c++" else "$CFLAGS") + " $_CCCOMCOM"
    mode = SCons.Subst.SUBST_SIG if for_signature else SCons.Subst.SUBST_CMD
    flags = [str(flag) for flag in env.subst_list(text, mode, target=target, source=source)[0]]
    if for_signature:
        flags = [flag for flag in flags if not flag.startswith(_UNSIGNED_FLAG_PREFIXES)]
    return tuple(flags)


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


def literal_words(argv: Sequence[str]) -> list[SCons.Subst.Literal]:
    """Rendered arguments, protected from further ``$`` expansion and word splitting."""
    return [SCons.Subst.Literal(arg) for arg in argv]


class Renderer:
    """A phase command in SCons' callable-variable convention (``$_OFFLOAD_<PHASE>_CC1`` and friends).

    Renders once per node and mode: SCons asks four or five times (signature, implicit dependencies,
    display, execution), and a node's environment and sources are fixed. The signature's words name the
    checkout only where the output can record it (:func:`~offload_builders.driver.portable_signature`),
    so another checkout shares this one's ``CacheDir`` entries. Our errors become
    ``UserError``. An object rather than a closure: to describe a node, SCons makes a function action
    of the variable's value and hashes its code (its cost), which for an object is this small ``__call__``.
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
        return literal_words(self.words(target, source, env, for_signature))


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


def rpath_flags(target, source, env, for_signature):
    value = env.get("OFFLOAD_RPATH")
    if value is None:
        value = [str(toolchain_for(env).lib_dir)]
    return [f"-Wl,-rpath,{path}" for path in SCons.Util.flatten(value) if path]
