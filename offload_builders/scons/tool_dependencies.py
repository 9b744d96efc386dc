"""What a node depends on besides its sources and headers: the installed tools its targets need, checked at read
time (:func:`check_tools_for`), and the installed programs and device libraries its command runs or links, each
named by a stamp of its path, size and modification time (:func:`program_stamp`, :func:`depend_on_program`,
:func:`depend_on_device_libraries`), so that a toolchain upgrade rebuilds what it changes.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Sequence

import SCons.Node.Python

from offload_builders import device_libraries, nvptx_tools
from offload_builders.errors import OffloadError
from offload_builders.scons.variables import toolchain_for, user_error
from offload_builders.targets import TargetID
from offload_builders.toolchain import Toolchain


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
