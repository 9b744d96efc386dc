"""The offload model of each source, the targets each model takes, and the relocatable-device-code switch.

One project mixes models: ``.hip`` sources are HIP, ``.cu`` sources CUDA, and C and C++
sources take the model the build chooses (``$OFFLOAD_MODEL``, default OpenMP). One target list
(``$OFFLOAD_ARCHS``) serves them all: each model compiles the targets it can (OpenMP every kind, HIP the
AMDGPU ones, CUDA the NVPTX ones), and a source whose model gets none is an error naming it.

Each model's phases are a module of this package over the driver layer (:mod:`offload_builders.driver`):
:mod:`~offload_builders.models.openmp`, :mod:`~offload_builders.models.hip` and
:mod:`~offload_builders.models.cuda`, as the SCons layer has ``scons/openmp.py``, ``hip.py`` and ``cuda.py``.
This package has no SCons imports.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from offload_builders.errors import OffloadError, ToolchainError
from offload_builders.models.openmp import LANGUAGE_BY_SUFFIX
from offload_builders.phase_table import CUDA, HIP, OPENMP
from offload_builders.targets import MODEL_TARGET_KINDS, TargetID, model_targets

#: Suffixes whose model the suffix decides, whatever ``$OFFLOAD_MODEL`` says.
SUFFIX_MODELS: Mapping[str, str] = {".hip": HIP, ".cu": CUDA}

#: The C and C++ suffixes: their model is ``$OFFLOAD_MODEL``'s.
CHOSEN_MODEL_SUFFIXES: tuple[str, ...] = tuple(LANGUAGE_BY_SUFFIX)

#: What ``$OFFLOAD_MODEL`` may name, and of those what builds today.
CHOOSABLE_MODELS: tuple[str, ...] = (OPENMP, HIP, CUDA)
BUILT_MODELS: tuple[str, ...] = (OPENMP, HIP, CUDA)

#: The target kinds (:attr:`TargetID.kind`) each model compiles for: the one rule, :data:`MODEL_TARGET_KINDS`.
TARGET_KINDS = MODEL_TARGET_KINDS

#: How a model's targets are described in an error.
_KIND_WORDS = {OPENMP: "any", HIP: "AMDGPU (e.g. gfx90a)", CUDA: "NVPTX (e.g. sm_90)"}


class ModelError(OffloadError, ValueError):
    """A source's model cannot build it: unknown or unsupported model, or no target for it."""


def check_chosen_model(chosen: str) -> str:
    """``$OFFLOAD_MODEL``'s value, checked."""
    if chosen not in CHOOSABLE_MODELS:
        raise ModelError(f"OFFLOAD_MODEL: unknown offload model {chosen!r}; use 'openmp', 'hip' or 'cuda'")
    return chosen


def source_model(source: str, chosen: str) -> str:
    """The model that compiles ``source``: its suffix's (``.hip``, ``.cu``), else ``chosen``
    (``$OFFLOAD_MODEL``)."""
    return SUFFIX_MODELS.get(os.path.splitext(source)[1]) or check_chosen_model(chosen)


def source_targets(source: str, model: str, targets: Iterable[TargetID]) -> tuple[TargetID, ...]:
    """:func:`model_targets` for one source; none is an error naming the source, its model and the list."""
    targets = tuple(targets)
    chosen = model_targets(model, targets)
    if not chosen:
        listed = ",".join(str(tid) for tid in targets) or "empty"
        raise ModelError(f"{source}: the {model} model compiles for {_KIND_WORDS[model]} targets, and OFFLOAD_ARCHS"
                         f" ({listed}) has none; add one to OFFLOAD_ARCHS")
    return chosen


def reject_reserved_flags(flags: Iterable[str], prefixes: tuple[str, ...], model: str, sources: str) -> None:
    """A HIP or CUDA compile's flags may not carry what the per-node split decides (``sources`` says where each
    comes from instead): one error naming every such flag."""
    bad = [flag for flag in flags if flag.startswith(prefixes)]
    if bad:
        raise ToolchainError(f"{model} compile flags must not contain {' '.join(bad)}: {sources}, and each phase is"
                             " its own build node")


def require_target_kind(targets: Iterable[TargetID], kind: str, model: str, processors: str) -> None:
    """A HIP or CUDA compile offloads to processors of one kind: one error naming the others."""
    others = [str(tid) for tid in targets if tid.kind != kind]
    if others:
        raise ToolchainError(f"{model} offload targets must be {processors}, not {', '.join(others)}")


def rdc_setting(rdc: object, hip_rdc: object) -> bool:
    """Relocatable device code from ``$OFFLOAD_RDC`` and its older HIP name ``$OFFLOAD_HIP_RDC``: None (or
    unset) says nothing, any other value is true or false; either one true selects RDC. Both set and
    disagreeing is an error, so no setting is silently ignored."""
    said = [bool(value) for value in (rdc, hip_rdc) if value is not None]
    if len(said) == 2 and said[0] != said[1]:
        raise ModelError(f"OFFLOAD_RDC={rdc!r} and OFFLOAD_HIP_RDC={hip_rdc!r} disagree; OFFLOAD_HIP_RDC is the old"
                         " name of OFFLOAD_RDC: set only OFFLOAD_RDC")
    return any(said)


__all__ = [
    "BUILT_MODELS", "CHOOSABLE_MODELS", "CHOSEN_MODEL_SUFFIXES", "CUDA", "SUFFIX_MODELS", "TARGET_KINDS",
    "ModelError", "check_chosen_model", "model_targets", "rdc_setting", "source_model", "source_targets",
]
