"""``OffloadObject`` for every offload model: the model chosen per source, when its node is declared.

The builder is a composite one, as SCons' own object builders are (``SCons/Tool/FortranCommon.py`` adds an
action and an emitter per suffix): ``.hip`` sources get the HIP model's action and emitter, ``.cu``
sources the CUDA model's, and each C and C++ suffix an action and emitter that
follow ``$OFFLOAD_MODEL`` (see :mod:`offload_builders.models`). The emitter reads it from the builder
call's environment, so it may be set after the tool loads or per call
(``env.OffloadObject('k.cpp', OFFLOAD_MODEL='hip')``), and records the model on every node it makes. The
command variables the models share (``$_OFFLOAD_HOST_CC1``, ...) are :class:`~offload_builders.scons.rendering.
ModelRenderer` objects that render each node with its own model's renderer.
"""
from __future__ import annotations

import SCons.Action
import SCons.Builder
import SCons.Errors
import SCons.Tool

from offload_builders import models
from offload_builders.errors import OffloadError
from offload_builders.phase_table import CUDA, HIP, OPENMP
from offload_builders.scons import cuda, hip, openmp
from offload_builders.scons.link_nodes import device_link_cmd
from offload_builders.scons.outputs import CLEAN_LEFTOVERS
from offload_builders.scons.rendering import ModelRenderer, node_model
from offload_builders.scons.scanning import SHARED_SOURCE_SCANNER
from offload_builders.scons.variables import user_error

#: Each built model's object emitter and the action of the object it makes.
_EMITTERS = {OPENMP: openmp.object_emitter, HIP: hip.object_emitter, CUDA: cuda.object_emitter}
_ACTIONS = {OPENMP: openmp.OBJECT_ACTION, HIP: hip.OBJECT_ACTION, CUDA: cuda.OBJECT_ACTION}
_RENDERERS = ((OPENMP, openmp.RENDERERS), (HIP, hip.RENDERERS), (CUDA, cuda.RENDERERS))


def _source_model(env, source) -> str:
    """The model of ``source[0]`` in ``env`` (:func:`offload_builders.models.source_model`)."""
    try:
        return models.source_model(str(source[0]), env.subst("$OFFLOAD_MODEL"))
    except OffloadError as error:
        raise user_error(error) from None


def _model_emitter(target, source, env):
    """The emitter of every offload suffix: the source's model's emitter, read from ``env`` now."""
    if not source:
        return target, source
    return _EMITTERS[_source_model(env, source)](target, source, env)


def _object_action(target, source, env, for_signature):
    """The object's action: its model's, as its emitter recorded it (``$OFFLOAD_MODEL`` for a node that
    has not been through the emitter)."""
    return _ACTIONS[node_model(target) or _source_model(env, source)]


#: The per-suffix action of C and C++ sources: the model's, chosen per node.
_CHOSEN_MODEL_ACTION = SCons.Action.CommandGeneratorAction(_object_action, {})

#: The emitter every suffix has: the model's, then the leftover cleaner.
_EMITTER = SCons.Builder.ListEmitter([_model_emitter, CLEAN_LEFTOVERS])


def object_builder():
    """``OffloadObject``: one builder for every model, its actions and emitters registered per suffix."""
    builder = SCons.Builder.Builder(action={}, emitter={}, suffix="$OBJSUFFIX",
                                    source_scanner=SHARED_SOURCE_SCANNER, single_source=True)
    for suffix, model in models.SUFFIX_MODELS.items():
        builder.add_action(suffix, _ACTIONS[model])
        builder.add_emitter(suffix, _EMITTER)
    for suffix in models.CHOSEN_MODEL_SUFFIXES:
        builder.add_action(suffix, _CHOSEN_MODEL_ACTION)
        builder.add_emitter(suffix, _EMITTER)
    return builder


def generate(env) -> None:
    """The object side of every model in ``env`` (called by the ``offload`` tool's generate): each model's
    variables, the shared command variables as :class:`ModelRenderer` objects, and ``OffloadObject``."""
    hip.generate_objects(env)
    cuda.generate_objects(env)
    for name in sorted({name for _, table in _RENDERERS for name in table}):
        by_model = {model: table[name] for model, table in _RENDERERS if name in table}
        # A program's device links are no model's object nodes: the shared device link renders them.
        default = device_link_cmd if name == "_OFFLOAD_DEVICE_LINK_CMD" else None
        env[name] = ModelRenderer(name, by_model, default)
    env["BUILDERS"]["OffloadObject"] = object_builder()


def check_model(env) -> None:
    """``$OFFLOAD_MODEL`` as the tool loads: a name it knows (it is read again for each source)."""
    try:
        models.check_chosen_model(env.subst("$OFFLOAD_MODEL"))
    except OffloadError as error:
        raise SCons.Errors.UserError(str(error)) from None


__all__ = ["check_model", "generate", "object_builder"]
