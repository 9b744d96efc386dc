"""Compile-database entries for offload sources: per source, the one driver command its build nodes stand for.

Language servers and other Clang tools (clangd, clang-tidy) read ``compile_commands.json`` and parse each
source with the command listed for it. The build tools here split a source into phase commands (a host
front end, a device compile per target, a package, an embed...), none of which such a tool can use, so a
build lists no entry for it. An entry here is instead the driver command that compiles what those nodes
compile: the model's mode (``-fopenmp``, ``-x hip``, ``-x cuda``), the user's flags, the target list, the
device-library and header flags the tool adds (:mod:`offload_builders.device_libraries`,
:func:`offload_builders.models.hip.default_flags`, :func:`offload_builders.models.cuda.default_flags`), and
``--offload-host-only``: a language server parses one job of a command, and the host job is the one that
every source has and that sees the whole file (``docs/editors.md`` says why this view).

The SCons tool (:mod:`offload_builders.scons.compilation_database`) and ``offload-compile compdb-args``
(CMake, Meson) take their entries from here. This module has no SCons imports.
"""
from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence

from offload_builders import device_libraries
from offload_builders.models import source_targets
from offload_builders.models.cuda import default_flags as cuda_default_flags
from offload_builders.models.gpu import RDC_FLAGS, is_rdc
from offload_builders.models.hip import default_flags as hip_default_flags
from offload_builders.models.openmp import language_of
from offload_builders.phase_table import CUDA, HIP, OPENMP
from offload_builders.targets import TargetID
from offload_builders.toolchain import Toolchain

#: The flag that makes an entry the host job's view of the source.
HOST_VIEW = "--offload-host-only"

#: Each model's driver mode: what makes the driver compile a source in that model.
MODE_FLAGS: Mapping[str, tuple[str, ...]] = {OPENMP: ("-fopenmp",), HIP: ("-x", "hip"), CUDA: ("-x", "cuda")}

#: Options whose value is the next word: an option and its value form one group (CMake's COMPILE_OPTIONS
#: de-duplicates words, so ``-Xarch_gfx942 -nogpulib -Xarch_gfx90a -nogpulib`` must travel as two groups).
_SEPARATE_VALUE = ("-x", "-isystem", "-include", "-Xclang", "-mllvm", "-Xopenmp-target")


def target_selection(toolchain: Toolchain, model: str, targets: Sequence[TargetID]) -> list[str]:
    """The driver flags that select ``targets`` (the model's own) in one command. An OpenMP list with the host
    CPU names triples (``-fopenmp-targets=``: the driver cannot combine it with ``--offload-arch``), which the
    host view needs no more of; CUDA also names the installation the CUDA model compiles with."""
    if model == OPENMP and any(target.kind == "host-cpu" for target in targets):
        return ["-fopenmp-targets=" + ",".join(dict.fromkeys(target.triple for target in targets))]
    chosen = ["--offload-arch=" + ",".join(str(target) for target in targets)]
    if model == CUDA and toolchain.cuda_path is not None:
        chosen.insert(0, f"--cuda-path={toolchain.cuda_path}")
    return chosen


def _one_command(targets: Sequence[TargetID], per_target: Callable[[TargetID], Sequence[str]]) -> list[str]:
    """Per-target flags as one command takes them: each flag once, ``-nogpulib`` only for the targets that
    get it (``-Xarch_<processor>``), or plainly where every GPU target gets it."""
    chosen = {target: tuple(per_target(target)) for target in targets if target.kind in ("amdgpu", "nvptx")}
    if chosen and all("-nogpulib" in flags for flags in chosen.values()):
        return list(dict.fromkeys(flag for flags in chosen.values() for flag in flags))
    return device_libraries.merged_target_flags(chosen, chosen.__getitem__)


def tool_flags(toolchain: Toolchain, model: str, targets: Sequence[TargetID], flags: Sequence[str],
               environ: Mapping[str, str] | None = None) -> list[str]:
    """What the tool adds to ``flags`` for a source of ``model`` compiled for ``targets``, as one command takes
    it: the device libraries (or ``-nogpulib`` where they are missing) and the headers (HIP's ``-nogpuinc``
    without a HIP installation, CUDA's with Clang 19), and relocatable device code's new offload driver."""
    flags = tuple(flags)
    if model == OPENMP:
        return _one_command(targets, lambda target: device_libraries.device_library_flags(toolchain, target, flags,
                                                                                           environ))
    if model == HIP:
        added = _one_command(targets, lambda target: hip_default_flags(toolchain, target, flags, environ))
    else:
        added = list(cuda_default_flags(toolchain, flags))
    if is_rdc(flags):
        added += [flag for flag in RDC_FLAGS if flag not in flags and flag not in added]
    return added


def entry_arguments(toolchain: Toolchain, source: str, model: str, targets: Iterable[TargetID],
                    flags: Sequence[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """The arguments of ``source``'s entry between the driver and the source: the model's mode, ``flags``
    (the user's, as every phase gets them), the model's targets of ``targets``, :func:`tool_flags` and
    :data:`HOST_VIEW`. A model with no target among ``targets`` is a :class:`~offload_builders.models.ModelError`."""
    chosen = source_targets(source, model, targets)
    if model == OPENMP:
        language_of(source)  # a suffix the OpenMP model compiles, or one error naming it
    return [*MODE_FLAGS[model], *flags, *target_selection(toolchain, model, chosen),
            *tool_flags(toolchain, model, chosen, flags, environ), HOST_VIEW]


def added_arguments(toolchain: Toolchain, source: str, model: str, targets: Iterable[TargetID],
                    flags: Sequence[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """:func:`entry_arguments` without ``flags``: what a build system that passes the user's flags itself adds."""
    arguments = entry_arguments(toolchain, source, model, targets, flags, environ)
    mode = len(MODE_FLAGS[model])
    return arguments[:mode] + arguments[mode + len(flags):]


def driver(toolchain: Toolchain, source: str, model: str) -> str:
    """The driver an entry names: ``clang`` for an OpenMP C source, else ``clang++`` (the models' choice)."""
    if model == OPENMP and os.path.splitext(source)[1] == ".c":
        return str(toolchain.clang)
    return str(toolchain.clangxx)


def entry_command(toolchain: Toolchain, source: str, model: str, targets: Iterable[TargetID], flags: Sequence[str],
                  output: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """``source``'s entry as one argv: the driver, :func:`entry_arguments`, ``-c source -o output``."""
    return [driver(toolchain, source, model), *entry_arguments(toolchain, source, model, targets, flags, environ),
            "-c", source, "-o", output]


def option_groups(arguments: Sequence[str]) -> list[list[str]]:
    """``arguments`` as options, each with its separate value (``-x hip``, ``-Xarch_gfx942 -nogpulib``)."""
    groups: list[list[str]] = []
    pending = False
    for argument in arguments:
        if pending:
            groups[-1].append(argument)
            pending = False
            continue
        groups.append([argument])
        pending = argument in _SEPARATE_VALUE or argument.startswith("-Xarch_")
    return groups


def shell_groups(arguments: Sequence[str]) -> list[str]:
    """:func:`option_groups`, each as one shell-quoted line (CMake's ``SHELL:`` options take them)."""
    return [shlex.join(group) for group in option_groups(arguments)]


__all__ = [
    "HOST_VIEW", "MODE_FLAGS", "added_arguments", "driver", "entry_arguments", "entry_command", "option_groups",
    "shell_groups", "target_selection", "tool_flags",
]
