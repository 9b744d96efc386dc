"""Make-style dependency files as Clang writes them (``DependencyFile.cpp``), read and written back byte for byte.

Both the phase commands (:mod:`offload_builders.cli.phase_runs`, one depfile per node) and the compiler launcher
(:mod:`offload_builders.launcher.jobs`, the files a compile read) read what Clang wrote; the phase commands write
their own in Clang's spelling, so Ninja reads the same names from either.
"""
from __future__ import annotations

import os


def read_make_dependencies(path: str) -> list[str]:
    """The prerequisites of a Clang-written dependency file (one rule): the paths :func:`escape` writes back
    as Clang wrote them.

    The inverse of Clang's writer (``PrintFilename`` in ``DependencyFile.cpp``): ``$$`` is ``$``, ``\\#`` is
    ``#``, ``2N+1`` backslashes before a space are ``N`` and a space of the name, other backslashes are
    themselves; words are separated by spaces and ``\\``-newlines only (Clang writes a tab as it is). Reading
    ``$$`` as two dollars wrote ``$$$$`` back, a file that does not exist: Ninja reran the node on every build."""
    with open(path, "rb") as f:
        rest = _after_target(os.fsdecode(f.read()))
    words: list[str] = []
    current: list[str] = []
    index = 0
    while index < len(rest):
        char = rest[index]
        if char == "\\":
            run = len(rest[index:]) - len(rest[index:].lstrip("\\"))
            after = rest[index + run:index + run + 1]
            index += run
            if after == " " and run % 2:
                current.append("\\" * (run // 2) + " ")
                index += 1
                continue
            if after == "#":
                current.append("\\" * (run - 1) + "#")
                index += 1
                continue
            if after != "\n" or run != 1:
                current.append("\\" * run)
                continue
            index += 1  # a line continuation: it separates words
            char = " "
        elif char == "$" and rest[index + 1:index + 2] == "$":
            current.append("$")
            index += 2
            continue
        else:
            index += 1
        if char in " \n":
            if current:
                words.append("".join(current))
            current = []
        else:
            current.append(char)
    if current:
        words.append("".join(current))
    return words


def _after_target(text: str) -> str:
    """The prerequisites of the rule: what follows the first ``:`` that ends the target (Clang writes the
    ``-MT`` target as it is, so a ``:`` inside a path is followed by something other than a blank)."""
    index = 0
    while (index := text.find(":", index)) >= 0:
        if text[index + 1:index + 2] in ("", " ", "\n", "\t") or text[index + 1:index + 3] == "\\\n":
            return text[index + 1:]
        index += 1
    return ""


def escape(path: str) -> str:
    """``path`` as Clang writes it in a dependency file (``PrintFilename``), byte for byte the same for the
    names Clang lists: ``#`` as ``\\#``, ``$`` as ``$$``, a space as ``\\ `` after doubling the backslashes
    before it; anything else as it is. So Ninja reads from our file what it reads from Clang's for the same
    name (it cannot tell a tab or a trailing backslash, in Clang's file either)."""
    out: list[str] = []
    for index, char in enumerate(path):
        if char == "#":
            out.append("\\")
        elif char == " ":
            out.append("\\" * (1 + len(path[:index]) - len(path[:index].rstrip("\\"))))
        elif char == "$":
            out.append("$")
        out.append(char)
    return "".join(out)


__all__ = ["escape", "read_make_dependencies"]
