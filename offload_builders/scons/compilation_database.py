"""Offload objects in SCons' own compilation database (``env.Tool('compilation_db')``, ``env.CompilationDatabase()``).

SCons' ``compilation_db`` tool collects its entries through an emitter it adds to the C and C++ object builders;
``OffloadObject`` is none of them, so the database listed no offload source. :func:`generate` adds an emitter to
``OffloadObject`` that hands each object and its source to that tool's own entry emitter, in an environment whose
``$CXXCOM`` and ``$CCCOM`` render the source's entry (:mod:`offload_builders.compile_database`: one driver command
per source, the host view). The tool then writes offload entries with the build's own, as it writes those:
``$COMPILATIONDB_USE_ABSPATH``, ``$COMPILATIONDB_PATH_FILTER``, the top directory as ``directory``. Where the
tool is not loaded nothing happens; it may be loaded before or after ``offload`` (its emitter is looked up for
each object), and it lists the objects declared after it is loaded, as for its own entries.
"""
from __future__ import annotations

import collections
import collections.abc

import SCons.Builder
import SCons.Errors
import SCons.Subst

from offload_builders import compile_database, models
from offload_builders.errors import OffloadError
from offload_builders.models.gpu import is_rdc
from offload_builders.models.openmp import language_of
from offload_builders.phase_table import CUDA, HIP, OPENMP
from offload_builders.scons.rendering import compile_flags, literal_words, node_model
from offload_builders.scons.variables import model_targets_for, rdc_selected, toolchain_for, user_error

#: The module SCons imports its ``compilation_db`` tool as.
_COMPILATION_DB_MODULE = "SCons.Tool.compilation_db"
#: The object builder's suffixes whose emitters that tool extends, the C++ ones first (their entries render $CXXCOM).
_SUFFIXES = (".cpp", ".cc", ".cxx", ".c")
#: The command variables the tool's entry renders (static and shared objects, C++ and C).
_COMMAND_VARIABLES = ("CXXCOM", "CCCOM", "SHCXXCOM", "SHCCCOM")


def compilation_db_emitter(env):
    """The entry emitter SCons' ``compilation_db`` tool added to ``env``'s C++ (else C) object builder, or None
    where the tool is not loaded.

    The one place that depends on how that tool works inside. Its entries live in a private module-level list
    (of nodes in SCons 4.5, of tuples from 4.6 on) that only its emitter fills, so the emitter is what we use:
    in every version since 4.0 a function of that module, one of the static object builder's emitters for each
    C and C++ suffix, that records ``(target[0], source[0], env)`` and renders ``$CXXCOM`` (or ``$CCCOM``) in that
    environment when the database is written. It is found by its module among the builder's emitters (the
    first, should the tool have been loaded twice: one entry per source)."""
    builder = env["BUILDERS"].get("StaticObject")
    emitters = getattr(builder, "emitter", None)
    if not isinstance(emitters, collections.abc.Mapping):
        return None
    for suffix in _SUFFIXES:
        found = _from_module(emitters.get(suffix))
        if found is not None:
            return found
    return None


def _from_module(emitter):
    if isinstance(emitter, (list, collections.UserList)):
        for each in emitter:
            found = _from_module(each)
            if found is not None:
                return found
        return None
    if callable(emitter) and getattr(emitter, "__module__", None) == _COMPILATION_DB_MODULE:
        return emitter
    return None


#: The model's own flags variable of HIP and CUDA compiles (as ``scons/hip.py`` and ``scons/cuda.py`` read them).
_MODEL_FLAGS = {HIP: "$OFFLOAD_HIP_FLAGS", CUDA: "$OFFLOAD_CUDA_FLAGS"}


def _user_flags(env, obj, src, model: str) -> tuple[str, ...]:
    """The flags every phase of ``src`` gets, as its model's renderers compute them: the C or C++ ones, and for
    HIP and CUDA the model's own variable and ``-fgpu-rdc`` where ``$OFFLOAD_RDC`` selects it (the tool's
    defaults come from :mod:`offload_builders.compile_database`)."""
    if model == OPENMP:
        return compile_flags(env, [obj], [src], False, language_of(str(src)))
    flags = compile_flags(env, [obj], [src], False, "c++")
    flags += tuple(str(flag) for flag in env.subst_list(_MODEL_FLAGS[model], SCons.Subst.SUBST_CMD, target=[obj],
                                                         source=[src])[0])
    if rdc_selected(env) and not is_rdc(flags):
        flags += ("-fgpu-rdc",)
    return flags


def entry_words(env, obj, src) -> list[str]:
    """The entry of the offload object ``obj`` (made by ``OffloadObject`` from ``src``): the driver command of
    :func:`offload_builders.compile_database.entry_command`, in the object's own environment."""
    build_env = obj.get_build_env() if obj.has_builder() else env
    try:
        model = node_model([obj]) or models.source_model(str(src), build_env.subst("$OFFLOAD_MODEL"))
        targets = model_targets_for(build_env, src, model)
        flags = _user_flags(build_env, obj, src, model)
        return compile_database.entry_command(toolchain_for(build_env), str(src), model, targets, flags, str(obj))
    except OffloadError as error:
        raise user_error(error) from None


def _entry_command(target, source, env, for_signature):
    """``$CXXCOM`` (and ``$CCCOM``) of an offload object's entry: what the tool's entry prints."""
    if not target or not source:
        raise SCons.Errors.UserError("an offload compilation-database entry names no object or source")
    return literal_words(entry_words(env, target[0], source[0]))


_ENTRY_OVERRIDES = dict.fromkeys(_COMMAND_VARIABLES, _entry_command)


def entry_emitter(target, source, env):
    """``OffloadObject``'s last emitter: the object's entry in the ``compilation_db`` tool's database, where the
    tool is loaded (see :func:`compilation_db_emitter`)."""
    emitter = compilation_db_emitter(env)
    if emitter is not None and target and source:
        emitter(target=[target[0]], source=[source[0]], env=env.Override(_ENTRY_OVERRIDES))
    return target, source


def generate(env) -> None:
    """Add :func:`entry_emitter` to every suffix's emitter of ``env``'s ``OffloadObject``."""
    builder = env["BUILDERS"]["OffloadObject"]
    for suffix, emitter in list(builder.emitter.items()):
        builder.emitter[suffix] = SCons.Builder.ListEmitter([emitter, entry_emitter])


__all__ = ["compilation_db_emitter", "entry_emitter", "entry_words", "generate"]
