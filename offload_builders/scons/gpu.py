"""What the HIP and CUDA models of the ``offload`` SCons tool share (:mod:`offload_builders.scons.hip`,
:mod:`offload_builders.scons.cuda`): a source's user flags and CUID, the renderers' look-ups of the source a node
derives from and of the object's device side, the packager's command, and the object emitter's frame (one source
per object; the node that gathers the per-target images, a fat binary or, with relocatable device code, an offload
package; what the object records). The models' own phases, nodes and variables stay in their modules.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import SCons.Builder
import SCons.Errors
import SCons.Subst
import SCons.Tool

from offload_builders.driver import CommandTemplate
from offload_builders.errors import OffloadError
from offload_builders.models.base import PackagedSteps, package_command
from offload_builders.models.gpu import RDC_FLAGS, check_cuid, default_cuid, is_rdc
from offload_builders.phase_table import Phase, node_name
from offload_builders.scons import openmp
from offload_builders.scons.actions import phase_action
from offload_builders.scons.outputs import own_outputs, partial_path
from offload_builders.scons.rendering import compile_flags, mark_model, node_memo
from offload_builders.scons.variables import node_targets, rdc_selected, set_default, toolchain_for
from offload_builders.targets import TargetID

#: The offload package of a source's relocatable device code (``$OFFLOAD_PACKAGECOM``).
PACKAGE_BUILDER = SCons.Builder.Builder(action=phase_action("PACKAGE"))


def default_cuid_var(target, source, env, for_signature) -> str:
    """``$_OFFLOAD_HIP_DEFAULT_CUID`` and ``$_OFFLOAD_CUDA_DEFAULT_CUID``: :func:`default_cuid` of the (original)
    source's path relative to the top directory."""
    return default_cuid(source[0].srcnode().get_path(env.Dir("#")))


def source_cuid(env, source, variable: str) -> str:
    """The CUID for ``source``: ``$<variable>`` (``OFFLOAD_HIP_CUID``, ``OFFLOAD_CUDA_CUID``) substituted with that
    source, checked (:func:`offload_builders.models.gpu.check_cuid`)."""
    try:
        return check_cuid(env.subst(f"${variable}", source=source))
    except OffloadError as error:
        raise SCons.Errors.UserError(f"{variable} for {source[0]}: {error}") from None


def cuid_value(template: CommandTemplate, env, target, source, variable: str) -> dict[str, str]:
    """The ``cuid`` slot's value of a node's compile (:func:`source_cuid`, once per node); ``{}`` where the
    template has none (relocatable device code)."""
    if "cuid" not in template.slots:
        return {}
    return {"cuid": node_memo(target, ("cuid", str(source[0])), lambda: source_cuid(env, source, variable))}


def user_flags(env, target, source, for_signature: bool, variable: str) -> tuple[str, ...]:
    """The user's flags for a compile of ``source``: the C++ ones, ``$<variable>`` (``OFFLOAD_HIP_FLAGS``,
    ``OFFLOAD_CUDA_FLAGS``) and ``-fgpu-rdc`` where ``$OFFLOAD_RDC`` selects relocatable device code."""
    flags = compile_flags(env, target, source, for_signature, "c++")
    mode = SCons.Subst.SUBST_SIG if for_signature else SCons.Subst.SUBST_CMD
    flags += tuple(str(flag) for flag in env.subst_list(f"${variable}", mode, target=target, source=source)[0])
    if rdc_selected(env) and not is_rdc(flags):
        flags += RDC_FLAGS[:1]
    return flags


def original_source(env, source) -> list:
    """The source a node derives from (fat binaries and packages record it at read time)."""
    original = env.get("_OFFLOAD_ORIGINAL_SOURCE")
    return [original] if original is not None else [source[0]]


def object_device_side(target) -> tuple:
    """What the emitter recorded for an object's host compile: its fat binary or package."""
    device_side = getattr(target[0].attributes, "offload_inputs", None)
    if device_side is None:
        raise SCons.Errors.UserError(f"{target[0]} was not made by OffloadObject")
    return device_side


def package_argv(env, target, source, for_signature: bool,
                 device_steps: Callable[[Any, Any, Any, bool, TargetID], PackagedSteps]) -> list[str]:
    """The packager's command of a package node, whose sources are each target's device output in target order;
    ``device_steps(env, target, original source, for_signature, target ID)`` gives each one's steps."""
    original = original_source(env, source)
    images = [(device_steps(env, target, original, for_signature, tid), str(node))
              for node, tid in zip(source, node_targets(env, "_OFFLOAD_BUNDLE_TARGETS"))]
    return package_command(toolchain_for(env), images, partial_path(env, target[0]))


def one_source(target, source) -> tuple[Any, Any]:
    """The object and the source of an ``OffloadObject`` call: one source per object."""
    if len(source) != 1:
        raise SCons.Errors.UserError(f"OffloadObject builds one object per source, got {len(source)} sources"
                                     f" for {target[0]}")
    return target[0], source[0]


def device_side_node(env, model: str, obj, src, images, order: tuple[TargetID, ...], *, rdc: bool,
                     bundle_builder, bundle_overrides: Mapping[str, Any] | None = None) -> list:
    """The node that gathers the per-target ``images`` of ``src`` (for the targets ``order``) for its object
    ``obj``: with relocatable device code the offload package (``$OFFLOAD_PACKAGECOM``; the packager where that
    is OpenMP's in-process writer, which reads OpenMP's variables), else the fat binary of ``bundle_builder``
    with ``bundle_overrides``."""
    if rdc:
        phase, builder = Phase.PACKAGE, PACKAGE_BUILDER
        overrides = ({"OFFLOAD_PACKAGECOM": "$_OFFLOAD_PACKAGE_CMD"}
                     if env.get("OFFLOAD_PACKAGECOM") is openmp.PACKAGE_IN_PROCESS else {})
    else:
        phase, builder, overrides = Phase.BUNDLE, bundle_builder, dict(bundle_overrides or {})
    stem = os.path.splitext(obj.name)[0]
    return builder(env, [obj.dir.File(node_name(phase, model, stem=stem))], images,
                   _OFFLOAD_BUNDLE_TARGETS=order, _OFFLOAD_ORIGINAL_SOURCE=src, **overrides)


def record_object(env, model: str, obj, made: list, device_side: list) -> None:
    """What an object's emitter records once its nodes are made: the tool owns them, ``model`` made them, and
    the host compile reads the device side."""
    own_outputs(env, [*made, *device_side])
    mark_model([obj, *made, *device_side], model)
    obj.attributes.offload_inputs = (device_side[0],)
    env.Depends(obj, device_side)


def generate_sources(env, defaults: Mapping[str, Any], suffixes: Iterable[str]) -> None:
    """A model's variables, set only where the user has not, and the C++ header scanner for its sources."""
    for key, value in defaults.items():
        set_default(env, key, value)
    for suffix in suffixes:
        SCons.Tool.SourceFileScanner.add_scanner(suffix, SCons.Tool.CScanner)


__all__ = ["PACKAGE_BUILDER", "cuid_value", "default_cuid_var", "device_side_node", "generate_sources",
           "object_device_side", "one_source", "original_source", "package_argv", "record_object", "source_cuid",
           "user_flags"]
