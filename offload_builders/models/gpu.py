"""What the HIP and CUDA phase models share: :class:`GpuPhaseModel`, the interface both implement (and the CLI's
phases call), the relocatable-device-code switch (:data:`RDC_FLAGS`, :func:`is_rdc`), the CUID their host and
device compiles share (:func:`default_cuid`, :func:`check_cuid`) and the one their probes pin
(:data:`PROBE_CUID`, :func:`mode_flags`).

A HIP or CUDA compile of one source is, per target, a device compile and a second job on its output (HIP's
link to a code object, CUDA's ``ptxas``); then the source's fat binary of every target's image, or with
relocatable device code its offload package; then the host compile, which is the object and embeds one of them.
:mod:`offload_builders.models.hip` and :mod:`offload_builders.models.cuda` derive each of those jobs from the
driver's own. This module has no SCons imports.
"""
from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from offload_builders.driver import CommandTemplate
from offload_builders.errors import ToolchainError
from offload_builders.models.base import BasePhaseModel
from offload_builders.targets import TargetID

#: The driver flags of relocatable-device-code mode: device code stays bitcode (HIP) or relocatable cubins (CUDA)
#: in an offload binary (``.llvm.offloading``), linked and registered at link time instead of a fat binary per
#: object.
RDC_FLAGS: tuple[str, ...] = ("-fgpu-rdc", "--offload-new-driver")

#: What a probe passes as ``-cuid``; its jobs carry it back, and it becomes the ``cuid`` slot.
PROBE_CUID = "offloadprobecuid"

#: A CUID becomes part of symbol names (``__hip_cuid_*``, RDC stubs): identifier characters only.
CUID_PATTERN = re.compile(r"[A-Za-z0-9_]+")


def _last_switch(flags: Iterable[str], on: str, off: str) -> bool:
    """Whether the last of ``on`` and ``off`` among ``flags`` is ``on`` (as Clang reads a flag and its negation)."""
    chosen = False
    for flag in flags:
        if flag in (on, off):
            chosen = flag == on
    return chosen


def is_rdc(flags: Iterable[str]) -> bool:
    """Whether ``flags`` select relocatable device code (the last ``-f[no-]gpu-rdc`` wins, as in Clang)."""
    return _last_switch(flags, "-fgpu-rdc", "-fno-gpu-rdc")


def uses_new_driver(flags: Iterable[str]) -> bool:
    """Whether ``flags`` ask for the new offload driver (the last ``--[no-]offload-new-driver`` wins)."""
    return _last_switch(flags, "--offload-new-driver", "--no-offload-new-driver")


def mode_flags(flags: Sequence[str], selection: Sequence[str]) -> tuple[str, ...]:
    """What a probe passes after the user's ``flags`` for the targets' ``selection`` (``--offload-arch=``,
    ``--cuda-gpu-arch=``): with relocatable device code the new driver's flags the user's lack, then the
    selection; otherwise the selection, then the pinned :data:`PROBE_CUID`. The new driver does not forward
    ``-cuid`` (it warns it unused), so none is pinned there."""
    if is_rdc(flags):
        return (*(flag for flag in RDC_FLAGS if flag not in flags), *selection)
    return (*selection, f"-cuid={PROBE_CUID}")


def pins_cuid(job: Sequence[str]) -> bool:
    """Whether a probe's job carries the pinned ``-cuid``, which its template turns into the ``cuid`` slot."""
    return f"-cuid={PROBE_CUID}" in job


def default_cuid(path: str) -> str:
    """The default CUID of a source: the first 16 hex digits of the MD5 of its path (``/`` separators).

    The SCons tool passes the path relative to the top directory, ``offload-compile`` the path relative to
    its ``--source-root`` (else the absolute path); either way the value is deterministic, unlike the
    driver's default, which hashes the whole command line (``-o`` included) and so would tie each target's
    device compile to all the others.
    """
    return hashlib.md5(path.replace(os.sep, "/").encode()).hexdigest()[:16]


def check_cuid(value: str) -> str:
    """``value`` if it is a usable CUID (letters, digits, ``_``), else a :class:`ToolchainError`."""
    if not CUID_PATTERN.fullmatch(value):
        raise ToolchainError(f"{value!r} is not a CUID; use letters, digits and '_' only")
    return value


class GpuDeviceSteps(Protocol):
    """What one target contributes to one source's object, as every GPU model's device steps give it."""

    @property
    def target(self) -> TargetID: ...

    @property
    def compile(self) -> CommandTemplate: ...

    @property
    def compile_suffix(self) -> str: ...

    @property
    def image_spec(self) -> tuple[str, ...] | None: ...

    @property
    def second_step(self) -> CommandTemplate | None: ...


class GpuHostSteps(Protocol):
    """The host compile of a source, as every GPU model's host steps give it."""

    @property
    def compile(self) -> CommandTemplate: ...


@dataclass(frozen=True)
class FatbinJob:
    """How one source's fat binary is made from its targets' images (without relocatable device code): by
    running ``command`` (CUDA: the toolkit's ``fatbinary``) or, where that is None, in this process by ``write``
    (HIP: our bundle writer), for which ``described`` stands in a cache key. ``reads``: the files it reads, the
    images first, then ``kept``: those a device phase keeps beside its image for it (CUDA: the PTX)."""

    reads: tuple[str, ...]
    kept: tuple[str, ...] = ()
    command: tuple[str, ...] | None = None
    write: Callable[[], None] | None = None
    described: tuple[str, ...] = ()


class GpuPhaseModel(BasePhaseModel):
    """The interface of the HIP and CUDA phase models (:class:`~offload_builders.models.hip.HipPhaseModel`,
    :class:`~offload_builders.models.cuda.CudaPhaseModel`): per-phase command templates of ``clang++`` for one
    toolchain. ``flags`` are the user's driver flags; :meth:`flags_for` adds what the tool adds."""

    #: The target a host compile and the fat binary's parameters are probed with (neither depends on it).
    host_probe_target: ClassVar[TargetID]
    #: Whether a device or host compile depends on all of a source's targets (CUDA: ``__CUDA_ARCH_LIST__``, from
    #: Clang 20), not only on its own (:meth:`arch_list_values`).
    takes_target_list: ClassVar[bool] = False

    @property
    def driver(self) -> str:
        return str(self.toolchain.clangxx)

    @staticmethod
    def check_flags(flags: Iterable[str]) -> None:
        """Reject flags that would fight the per-node split (target selection, CUID, host/device-only)."""
        raise NotImplementedError

    @staticmethod
    def check_targets(targets: Iterable[TargetID]) -> None:
        """Reject targets of another kind than the model offloads to."""
        raise NotImplementedError

    def default_flags(self, target: TargetID, flags: Sequence[str]) -> tuple[str, ...]:
        """What the tool adds to the user's ``flags`` for a compile probed with ``target``."""
        raise NotImplementedError

    def flags_for(self, target: TargetID, flags: Sequence[str]) -> tuple[str, ...]:
        """The user's ``flags``, checked (:meth:`check_flags`), and what the tool adds for ``target``."""
        self.check_flags(flags)
        return (*flags, *self.default_flags(target, flags))

    def device_steps(self, target: TargetID, flags: Sequence[str] = ()) -> GpuDeviceSteps:
        """Templates for one target's device compile and the job on its output."""
        raise NotImplementedError

    def host_steps(self, flags: Sequence[str] = ()) -> GpuHostSteps:
        """The host compile's template (independent of the targets but for :meth:`arch_list_values`)."""
        raise NotImplementedError

    def arch_list_values(self, template: CommandTemplate, targets: Iterable[TargetID],
                         flags: Sequence[str] = ()) -> dict[str, str]:
        """The slots of ``template`` that hold all of a source's ``targets``; ``{}`` where a compile depends on
        its own target alone (:attr:`takes_target_list` false)."""
        return {}

    def kept_compile_output(self, image: str, rdc: bool) -> str | None:
        """Where ``offload-compile device`` keeps its compile's output beside the image ``image`` for the fat
        binary; None where the fat binary does not read it."""
        return None

    def fatbin_job(self, flags: Sequence[str], images: Sequence[tuple[TargetID, str]], output: str, *,
                   environ: Mapping[str, str]) -> FatbinJob:
        """How the fat binary ``output`` of a source compiled with the user's ``flags`` is made from its
        ``images`` (target, image path), in the driver's order, run in ``environ``."""
        raise NotImplementedError


__all__ = [
    "CUID_PATTERN", "PROBE_CUID", "RDC_FLAGS", "FatbinJob", "GpuDeviceSteps", "GpuHostSteps", "GpuPhaseModel",
    "check_cuid", "default_cuid", "is_rdc", "mode_flags", "pins_cuid",
]
