"""A Meson build directory's custom-target commands and its own compile database, as Meson's files describe them.

Meson's ``compile_commands.json`` lists only the sources Meson compiles itself, so a source compiled by
``custom_target`` commands (``offload-compile``'s phases) has no entry, and Meson compiles no ``.hip`` source and
``.cu`` ones only with ``nvcc``. What those commands are is in Meson's documented introspection,
``meson-info/intro-targets.json``, written at every set-up: each custom target's command as ``meson.build`` gave
it, Meson's placeholders unexpanded. This module reads both files; :mod:`offload_builders.compile_database` turns
the offload commands into entries. It runs no Meson: the files are read as they are.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from offload_builders.errors import MesonBuildDirectoryError

#: The introspection directory Meson writes in a build directory.
INFO_DIRECTORY = "meson-info"
#: The compile database Meson writes in a build directory.
OWN_DATABASE = "compile_commands.json"


@dataclass(frozen=True)
class CustomCommand:
    """One custom target's command: ``argv`` with Meson's directory placeholders replaced (the file ones, such as
    ``@INPUT@``, stay), run in the build directory."""

    target: str
    defined_in: str
    argv: tuple[str, ...]
    outputs: tuple[str, ...]


def _load(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8", "surrogateescape"))
    except FileNotFoundError:
        directory = os.path.dirname(os.path.dirname(path))
        raise MesonBuildDirectoryError(f"'{directory}' is not a Meson build directory (it has no"
                                       f" {os.path.relpath(path, directory)}): run meson setup first") from None
    except (OSError, ValueError) as error:
        raise MesonBuildDirectoryError(f"{path}: cannot read it ({error}): set the build directory up again"
                                       " (meson setup --reconfigure)") from None


def _info(build_dir: str, name: str) -> Any:
    return _load(os.path.join(build_dir, INFO_DIRECTORY, name))


def _replaced(word: str, placeholders: Mapping[str, str]) -> str:
    for name, value in placeholders.items():
        word = word.replace(name, value)
    return word


def custom_commands(build_dir: str) -> list[CustomCommand]:
    """Every custom target's command in ``build_dir``, in Meson's order. ``@SOURCE_ROOT@``, ``@BUILD_ROOT@``,
    ``@CURRENT_SOURCE_DIR@`` and ``@OUTDIR@`` become absolute directories."""
    info = _info(build_dir, "meson-info.json")
    targets = _info(build_dir, "intro-targets.json")
    where = os.path.join(build_dir, INFO_DIRECTORY)
    try:
        directories = info["directories"]
        source_root, build_root = str(directories["source"]), str(directories["build"])
        found = []
        for target in targets:
            if target.get("type") != "custom":
                continue
            outputs = tuple(str(name) for name in target.get("filename", ()))
            placeholders = {"@SOURCE_ROOT@": source_root, "@BUILD_ROOT@": build_root,
                            "@CURRENT_SOURCE_DIR@": os.path.dirname(str(target["defined_in"])),
                            "@OUTDIR@": os.path.dirname(outputs[0]) if outputs else build_root}
            for part in target.get("target_sources", ()):
                argv = [*part.get("compiler", ()), *part.get("parameters", ())]
                found.append(CustomCommand(str(target["name"]), str(target["defined_in"]),
                                           tuple(_replaced(str(word), placeholders) for word in argv), outputs))
    except (KeyError, TypeError, AttributeError) as error:
        raise MesonBuildDirectoryError(f"{where}: not the introspection Meson writes (missing {error}): set the"
                                       " build directory up again (meson setup --reconfigure)") from None
    return found


def own_entries(build_dir: str) -> list[dict[str, Any]]:
    """The entries of Meson's own ``compile_commands.json`` in ``build_dir`` (none if Meson wrote none)."""
    path = os.path.join(build_dir, OWN_DATABASE)
    if not os.path.exists(path):
        return []
    entries = _load(path)
    if not isinstance(entries, list) or not all(isinstance(entry, dict) and "file" in entry for entry in entries):
        raise MesonBuildDirectoryError(f"{path}: not a compile database (a list of entries with a 'file'): set the"
                                       " build directory up again (meson setup --reconfigure)")
    return entries


def entry_path(entry: Mapping[str, Any]) -> str:
    """The absolute, normalized path of the file an entry is for (``file`` is relative to ``directory``)."""
    return os.path.normpath(os.path.join(str(entry.get("directory", "")), str(entry["file"])))


def merged(own: Sequence[Mapping[str, Any]], added: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """``own`` then each of ``added`` for a file ``own`` does not list: the build's own entry is kept."""
    listed = {entry_path(entry) for entry in own}
    return [*own, *(entry for entry in added if entry_path(entry) not in listed)]


__all__ = ["INFO_DIRECTORY", "OWN_DATABASE", "CustomCommand", "custom_commands", "entry_path", "merged",
           "own_entries"]
