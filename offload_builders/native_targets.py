"""``native`` in a target list: the GPUs of the machine the build is configured on, as the toolchain's
``amdgpu-arch`` and ``nvptx-arch`` name them.

Why the tool resolves it rather than Clang: every target is a build node of its own, so the list must be known
before anything compiles, and Clang 19 takes ``--offload-arch=native`` for HIP and CUDA only (OpenMP: "failed to
deduce triple"). The answer belongs to the machine, so it is asked at every read (each SCons run, each CMake
configure, each ``offload-compile`` command) and written to no cache another machine could read; the names it
gives then go through the target-ID checks of :mod:`offload_builders.targets` like any others.

The tools are found as Clang's driver finds them (``getSystemGPUArchs``: ``--amdgpu-arch-tool=``/``--nvptx-arch-
tool=``, else the driver's InstalledDir, else ``PATH``): ``$OFFLOAD_AMDGPU_ARCH_TOOL`` / ``$OFFLOAD_NVPTX_ARCH_TOOL``
where set (a path, or a name looked up on ``PATH``), else the toolchain's ``bin_dir``, else its ``search_path``.
Each prints one processor per GPU, one a line (duplicates for identical GPUs); as in Clang, a tool that exits
non-zero found nothing. One tool finding nothing is normal (a machine with GPUs of one vendor); both is
:class:`~offload_builders.errors.NativeTargetError`, which names the tools, what they said and what to do.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from offload_builders.errors import NativeTargetError

TYPE_CHECKING = False  # typing costs every command line milliseconds: for type checkers only
if TYPE_CHECKING:
    from offload_builders.toolchain import Toolchain

#: The word of a target list that stands for this machine's GPUs.
NATIVE = "native"

#: The tools asked, each with the environment variable that names another one (Clang's ``--<tool>-tool=``).
ARCH_TOOLS: tuple[tuple[str, str], ...] = (
    ("amdgpu-arch", "OFFLOAD_AMDGPU_ARCH_TOOL"),
    ("nvptx-arch", "OFFLOAD_NVPTX_ARCH_TOOL"),
)

#: How long a tool may take: newer Clang drivers' default (``executeToolChainProgram``; Clang 19 waits 10 s), since a
#: GPU runtime's first initialisation on a large node can be slow.
TOOL_TIMEOUT_S = 60

#: The example of named targets in the error, per place a list is given.
DEFAULT_EXAMPLE = "OFFLOAD_ARCHS=sm_90,gfx90a"


@dataclass(frozen=True)
class ArchTool:
    """One GPU-listing tool as found: ``path`` None where it was found nowhere (``looked`` says where)."""

    name: str
    path: str | None
    looked: str = ""


@dataclass(frozen=True)
class ToolAnswer:
    """What one tool said: the processor names it printed (exit status 0 only) or why it gave none."""

    tool: ArchTool
    names: tuple[str, ...]
    problem: str = ""  # empty when it printed names

    def describe(self) -> str:
        where = f"{self.tool.name} ({self.tool.path})" if self.tool.path else self.tool.name
        return f"{where} {self.problem}" if self.problem else f"{where} printed {', '.join(self.names)}"


def _items(words: str | Iterable[str]) -> list[str]:
    chunks = [words] if isinstance(words, str) else list(words)
    return [item for chunk in chunks for item in str(chunk).split(",")]


def names_native(words: str | Iterable[str]) -> bool:
    """Whether a target list (a comma-separated string or an iterable of such strings) holds ``native``."""
    return any(item.strip().split(":")[0] == NATIVE for item in _items(words))


def find_arch_tools(bin_dir: str | os.PathLike[str], search_path: str,
                    environ: Mapping[str, str] | None = None) -> tuple[ArchTool, ...]:
    """``amdgpu-arch`` and ``nvptx-arch``, found as Clang's driver finds them (see the module's docstring)."""
    environ = os.environ if environ is None else environ
    found = []
    for name, variable in ARCH_TOOLS:
        chosen = environ.get(variable, "")
        if chosen:
            path = chosen if os.sep in chosen else shutil.which(chosen, path=search_path or None)
            found.append(ArchTool(name, path, f"${variable}={chosen}"))
            continue
        candidate = os.path.join(os.fspath(bin_dir), name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            found.append(ArchTool(name, candidate))
            continue
        on_path = shutil.which(name, path=search_path) if search_path else None
        found.append(ArchTool(name, on_path, f"{os.fspath(bin_dir)} and PATH" if search_path else os.fspath(bin_dir)))
    return tuple(found)


def toolchain_arch_tools(toolchain: Toolchain, environ: Mapping[str, str] | None = None) -> tuple[ArchTool, ...]:
    """:func:`find_arch_tools` for a found toolchain: its InstalledDir, then the ``PATH`` it was found on."""
    return find_arch_tools(toolchain.bin_dir, toolchain.search_path, environ)


def _said(text: str) -> str:
    said = " / ".join(line.strip() for line in text.splitlines() if line.strip())
    return said if len(said) <= 200 else said[:197] + "..."


def ask_tool(tool: ArchTool, timeout: float = TOOL_TIMEOUT_S) -> ToolAnswer:
    """Run one tool: the names it printed, deduplicated in order, or why there are none."""
    if tool.path is None:
        return ToolAnswer(tool, (), f"was not found (looked at {tool.looked})")
    try:
        done = subprocess.run([tool.path], capture_output=True, text=True, errors="replace", timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return ToolAnswer(tool, (), f"did not answer within {timeout:g} s")
    except OSError as error:
        return ToolAnswer(tool, (), f"could not be run: {error.strerror or error}")
    said = _said(done.stderr) or _said(done.stdout)
    if done.returncode != 0:
        code = done.returncode
        status = f"exited with status {code}" if code > 0 else f"was killed by signal {-code}"
        return ToolAnswer(tool, (), f'{status} ("{said}")' if said else f"{status} and printed nothing")
    names = tuple(dict.fromkeys(line.strip() for line in done.stdout.splitlines() if line.strip()))
    if not names:
        return ToolAnswer(tool, (), f'printed no GPU ("{said}")' if said else "printed no GPU")
    return ToolAnswer(tool, names)


def system_gpu_names(tools: Iterable[ArchTool], *, example: str = DEFAULT_EXAMPLE,
                     timeout: float = TOOL_TIMEOUT_S) -> tuple[str, ...]:
    """The processors of this machine's GPUs, in the tools' order (AMD first), each once; none found is one
    :class:`NativeTargetError` naming every tool, what it said, and ``example`` (how to name targets instead)."""
    answers = [ask_tool(tool, timeout) for tool in tools]
    names = tuple(dict.fromkeys(name for answer in answers for name in answer.names))
    if not names:
        raise NativeTargetError(
            f"'{NATIVE}' found no GPU on this machine: {'; '.join(answer.describe() for answer in answers)}."
            f" Name the targets instead, e.g. {example}")
    return names


def expand_native(words: str | Iterable[str], names: Iterable[str]) -> tuple[str, ...]:
    """The items of a target list with ``native`` replaced by ``names`` (pure: no tool runs). Other items stay as
    they are, for the target-ID checks to judge; ``native`` with features is an error."""
    names = tuple(names)
    expanded: list[str] = []
    for item in _items(words):
        word = item.strip()
        if word.split(":")[0] != NATIVE:
            expanded.append(item)
        elif word != NATIVE:
            raise NativeTargetError(f"invalid target ID {word!r}: '{NATIVE}' takes no target-ID features (it stands"
                                    " for the processors of this machine's GPUs); name the target IDs instead")
        else:
            expanded.extend(names)
    return tuple(expanded)


def resolve_native(words: str | Iterable[str], toolchain: Toolchain, environ: Mapping[str, str] | None = None, *,
                   example: str = DEFAULT_EXAMPLE) -> tuple[str, ...] | None:
    """``words`` with ``native`` replaced by this machine's GPUs (the tools asked now, nothing kept), or None
    where ``words`` holds no ``native`` (no tool runs)."""
    if not names_native(words):
        return None
    expand_native(words, ())  # a malformed native item is an error before any tool runs
    return expand_native(words, system_gpu_names(toolchain_arch_tools(toolchain, environ), example=example))


def described(names: Iterable[str]) -> str:
    """``native`` and what it stood for, for the errors about a list it was part of."""
    return f"{NATIVE} = {','.join(names)}"


__all__ = [
    "ARCH_TOOLS",
    "NATIVE",
    "ArchTool",
    "ToolAnswer",
    "ask_tool",
    "described",
    "expand_native",
    "find_arch_tools",
    "names_native",
    "resolve_native",
    "system_gpu_names",
    "toolchain_arch_tools",
]
