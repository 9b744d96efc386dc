"""What every phase model shares: :class:`BasePhaseModel`, one toolchain's per-phase command templates derived
from its driver and memoized, and the packager command of a source's offload binary.

The OpenMP model (:class:`~offload_builders.models.openmp.PhaseModel`) derives from it directly, the HIP and CUDA
models through :class:`~offload_builders.models.gpu.GpuPhaseModel`, the part they share. Each model asks the
driver through :mod:`offload_builders.driver`; this module has no SCons imports.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol, TypeVar

from offload_builders.driver import memoized
from offload_builders.targets import TargetID
from offload_builders.toolchain import ProbeCache, Toolchain

_Made = TypeVar("_Made")


class PackagedSteps(Protocol):
    """A target's device steps as the packager reads them: the target and its image's ``key=value`` pairs
    (None: the steps make no packaged image, as a HIP or CUDA compile without relocatable device code)."""

    @property
    def target(self) -> TargetID: ...

    @property
    def image_spec(self) -> tuple[str, ...] | None: ...


def package_command(toolchain: Toolchain, images: Sequence[tuple[PackagedSteps, str]], output: str) -> list[str]:
    """The ``clang-offload-packager`` call for one source: one ``--image`` per ``(steps, path)``, in the order
    given (OpenMP's device outputs, HIP's RDC bitcode, CUDA's relocatable cubins)."""
    argv = [str(toolchain.tool("clang-offload-packager")), "-o", output]
    for steps, path in images:
        if steps.image_spec is None:
            raise ValueError(f"{steps.target}: not an RDC device step")
        argv.append("--image=" + ",".join((f"file={path}", *steps.image_spec)))
    return argv


class BasePhaseModel:
    """Per-phase command templates for one toolchain, derived from its driver and memoized.

    ``cwd`` is the directory the commands will run in (the driver records it in debug info); ``cache``, when
    given, keeps probe results across processes.
    """

    def __init__(self, toolchain: Toolchain, cwd: str | os.PathLike[str], cache: ProbeCache | None = None) -> None:
        self.toolchain = toolchain
        self.cwd = str(cwd)
        self.cache = cache
        self._steps: dict[tuple, Any] = {}

    def memo(self, key: Hashable, make: Callable[[], _Made]) -> _Made:
        """``make()`` once per ``key`` for this model: the templates derived from one probe's jobs."""
        return memoized(self._steps, key, make)

    def package_command(self, images: Sequence[tuple[PackagedSteps, str]], output: str) -> list[str]:
        """The packager call for one source (:func:`package_command`), one ``--image`` per target in the order
        given."""
        return package_command(self.toolchain, images, output)


__all__ = ["BasePhaseModel", "PackagedSteps", "package_command"]
