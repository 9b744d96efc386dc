"""The modules' old names (before the package's layout of issue 31) as aliases of the modules themselves.

``from offload_builders import wrapping`` and ``import offload_builders.nvptx_runtime`` keep working for
SConstructs written against the old layout, and for the SCons tool's own in-process actions: SCons signs a
Python action with its bytecode, import statements included, so an action that imported a module by its old
name keeps doing so, and a tree built before the move stays up to date. The old name is the same module
object, not a copy: its state and its classes are the new module's.

Imported with the package by every command-line tool, so it loads nothing until an old name is imported.
"""
from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing costs every tool's start-up milliseconds: for type checkers only
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

#: Each moved module's old name (under ``offload_builders.``) and its module now.
MOVED_MODULES: dict[str, str] = {
    "phases": "offload_builders.models.openmp",
    "hip_phases": "offload_builders.models.hip",
    "cuda_phases": "offload_builders.models.cuda",
    "registration": "offload_builders.linking.registration",
    "wrapping": "offload_builders.linking.wrapping",
    "nvptx_runtime": "offload_builders.linking.nvptx_runtime",
    "image_groups": "offload_builders.linking.image_groups",
}

_PREFIX = "offload_builders."


class _AliasLoader:
    """Gives the import system the module an old name stands for, leaving the module's own spec as it was
    (a loader in the sense of :class:`importlib.abc.Loader`)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        import importlib

        module = importlib.import_module(self.target)
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.own_spec  # the import system gave it the old name's spec


class MovedModuleFinder:
    """Finds ``offload_builders.<old name>`` as the module it moved to (a :class:`importlib.abc.MetaPathFinder`)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if not fullname.startswith(_PREFIX) or fullname[len(_PREFIX):] not in MOVED_MODULES:
            return None
        from importlib.machinery import ModuleSpec

        # A loader by protocol: importlib.abc.Loader would load importlib.resources (and tempfile, zipfile).
        return ModuleSpec(fullname, _AliasLoader(MOVED_MODULES[fullname[len(_PREFIX):]]))  # type: ignore[arg-type]


def install() -> None:
    """Let the old dotted names import (once per process)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
