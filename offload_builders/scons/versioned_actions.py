"""The tool's in-process actions, each signed by a name and a version it declares, never by its code.

SCons signs a Python function action by its bytecode, import names included: moving or renaming code rebuilt
every node the function runs in, while a change in what a called function does rebuilt nothing. An action
made here is signed by ``offload-builders action <name> v<version>`` (plus the variables of its ``varlist``, as
SCons adds them), so only a new version rebuilds its nodes. ``tests/test_action_versions.py`` keeps a record of
each declared action's code, and of the code it ``covers`` (what makes its output), and fails where that code
changed with neither a new version nor an entry saying the change does not change the output.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import SCons.Action


@dataclass(frozen=True)
class DeclaredAction:
    """One in-process action: what signs it (``name``, ``version``) and the code it stands for: the function it
    runs and what that function calls to make its output (``covers``: modules by dotted name, or a module's
    function or class as ``module:qualname``; names, so the tool imports none of them before a node runs)."""

    name: str
    version: int
    function: Callable
    covers: tuple[str, ...] = ()

    @property
    def signature(self) -> bytes:
        return f"offload-builders action {self.name} v{self.version}".encode()


#: Every declared action by name, in the order the tool's modules declare them.
DECLARED: dict[str, DeclaredAction] = {}


def declare(name: str, version: int, function: Callable, covers: Sequence[str] = ()) -> DeclaredAction:
    """Declare an action (once per name: two functions under one name would share their nodes' signatures)."""
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"action {name!r}: a version is a positive integer, not {version!r}")
    declared = DeclaredAction(name, version, function, tuple(covers))
    known = DECLARED.get(name)
    if known is not None and (known.function.__module__, known.function.__qualname__, known.version) != (
            function.__module__, function.__qualname__, version):  # the same one again: a reloaded module
        raise ValueError(f"action {name!r} is declared twice: {known.function.__qualname__} v{known.version} and "
                         f"{function.__qualname__} v{version}")
    DECLARED[name] = declared
    return declared


class VersionedFunctionAction(SCons.Action.FunctionAction):
    """A function action whose signature is its declaration's (see the module's docstring). ``kw`` as SCons'
    ``FunctionAction`` takes it (``cmdstr``, ``strfunction``, ``varlist``)."""

    def __init__(self, declared: DeclaredAction, kw: dict) -> None:
        super().__init__(declared.function, kw)
        self.declared = declared

    def get_presig(self, target, source, env, executor=None) -> bytes:
        return self.declared.signature


def versioned_action(function: Callable, name: str, version: int, cmdstr: str | None = None,
                     varlist: Sequence[str] = (), covers: Sequence[str] = ()) -> VersionedFunctionAction:
    """``SCons.Action.Action(function, cmdstr, varlist=varlist)``, signed by ``name`` and ``version``
    (``cmdstr`` None: the step prints nothing)."""
    return VersionedFunctionAction(declare(name, version, function, covers),
                                   {"cmdstr": cmdstr, "varlist": tuple(varlist)})


__all__ = ["DECLARED", "DeclaredAction", "VersionedFunctionAction", "declare", "versioned_action"]
