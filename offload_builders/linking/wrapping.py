"""The wrap step of a link: which offload kinds register each linked device image, and the one object that
registers them. One code path for ``OffloadProgram``'s wrap node and ``offload-link``.

``clang-linker-wrapper`` 19 groups device files by (triple, arch) across offload kinds, links one image per
group and registers that image once per offload kind among the group's files (``ActiveOffloadKinds``):
OpenMP's images each in an offload binary behind ``__tgt_register_lib``, CUDA's linked cubins in one fat
binary behind ``__cudaRegisterFatBinary`` (CUDA 13's ``fatbinary``), HIP's code objects in one fat binary
behind ``__hipRegisterFatBinary``, each in its own object, whose priority-101 constructors run in that
order. Here they are modules of one object (:func:`offload_builders.linking.registration.wrap_kinds`). With no
image of any kind the wrapper writes nothing; a caller may ask for a kind's empty registration instead.

The runtime libraries those registrations call are the host link's business, as with the wrapper: the
driver's (``-fopenmp`` gives ``-lomptarget``, ``--hip-link`` ``-lamdhip64``) or the user's (``-lcudart``).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from offload_builders import linking
from offload_builders.errors import OffloadError
from offload_builders.formats.compressed import CompressionOptions
from offload_builders.phase_table import CUDA, HIP, OPENMP
from offload_builders.targets import NVPTX_TRIPLE
from offload_builders.toolchain import Toolchain


@dataclass(frozen=True)
class LinkedImage:
    """One group's linked device image and the offload kinds of the device files it was linked from."""

    key: linking.GroupKey      # (triple, arch): the arch is the target ID (empty for the host CPU)
    path: str                  # an empty file: the group had no device code, and nothing registers it
    kinds: frozenset[str]      # what linking.device_input_kinds reads from the group's device input file


def check_openmp_image(image: LinkedImage, toolchain: Toolchain) -> None:
    """Refuse to register an NVPTX image the program's OpenMP runtime would not load (its ELF checks, in the
    layout that runtime reads: :mod:`offload_builders.formats.cubin`), rather than link a program that stops
    with "No images found compatible with the installed hardware"."""
    if image.key[0] != NVPTX_TRIPLE:
        return
    from offload_builders.formats import cubin

    refusal = cubin.runtime_refusal(cubin.read_file_header(image.path), toolchain.version)
    if refusal is not None:
        raise OffloadError(f"{image.path}: the OpenMP runtime would not load this {image.key[1]} image: {refusal}")


def registration_object(images: Sequence[LinkedImage], toolchain: Toolchain, scratch: str, *,
                        hip_compression: CompressionOptions | None = None,
                        empty_kind: str | None = None) -> bytes | None:
    """The host object registering ``images`` per offload kind present (OpenMP, then CUDA, then HIP), or,
    with none to register, ``empty_kind``'s empty registration (OpenMP: an empty descriptor; HIP or CUDA: an
    object with no code), or None (no object: what ``clang-linker-wrapper`` does).

    ``scratch`` is a path prefix for the fat binaries' files (``fatbinary`` writes one; removed again);
    ``hip_compression`` compresses the HIP fat binary (:func:`offload_builders.models.hip.program_fatbinary`).
    Raises :class:`~offload_builders.errors.OffloadError` (a failed ``fatbinary``, a bad image).
    """
    from offload_builders.linking import registration
    from offload_builders.models import cuda, hip

    major = toolchain.major
    openmp_images: list[tuple[linking.GroupKey, str]] = []
    cuda_images: list[tuple[str, str]] = []
    hip_images: list[tuple[str, str]] = []
    for image in images:
        if os.path.getsize(image.path) == 0:
            continue
        if OPENMP in image.kinds:
            check_openmp_image(image, toolchain)
            openmp_images.append((image.key, image.path))
        if CUDA in image.kinds:
            cuda_images.append((image.key[1], image.path))
        if HIP in image.kinds:
            hip_images.append((image.key[1], image.path))
    payloads: list[tuple[str, Sequence[bytes] | bytes]] = []
    if openmp_images or (empty_kind == OPENMP and not cuda_images and not hip_images):
        payloads.append((registration.OPENMP, linking.openmp_image_binaries(openmp_images, major)))
    if cuda_images:
        payloads.append((registration.CUDA, cuda.program_fatbinary(toolchain, cuda_images, scratch)))
    if hip_images:
        payloads.append((registration.HIP, hip.program_fatbinary(hip_images, hip_compression, scratch,
                                                                        llvm_version=major)))
    if payloads:
        return registration.wrap_kinds(payloads, llvm_version=major)
    if empty_kind is None:
        return None
    triple = registration.DEFAULT_HOST_TRIPLE
    return registration.compile_module(registration.new_module(triple), triple)


__all__ = ["LinkedImage", "check_openmp_image", "registration_object"]
