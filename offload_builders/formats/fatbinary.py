"""Fat binaries: the containers a HIP or CUDA program registers with its runtime, one image per target.

Below both the models (which build them for a compile's or a program's images) and linking (whose registration
code embeds them), so neither reaches up into the other: HIP's is an offload bundle written here, byte for byte
``clang-offload-bundler``'s; CUDA's is made by CUDA's own ``fatbinary``, whose command is written here.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Union

from offload_builders.errors import OffloadError, TargetIDError

PathArg = Union[str, "os.PathLike[str]"]

__all__ = ["cuda_fatbinary_command", "hip_fatbinary"]


def cuda_fatbinary_command(fatbinary: str, images: Sequence[tuple[str, str]], output: str) -> list[str]:
    """The ``fatbinary`` command that combines linked cubins (``(arch, path)``) into one fatbinary.

    CUDA 13 removed ``--image=profile=...``; this is the ``--image3=kind=elf,sm=<N>,file=<path>``
    spelling (accepted since CUDA 12), the one clang-linker-wrapper 22 writes.  ``compute_<N>`` entries
    are PTX (``kind=ptx``).
    """
    if isinstance(images, (str, bytes)) or not images:
        raise OffloadError("a CUDA fatbinary needs at least one (arch, image path) pair")
    command = [os.fspath(fatbinary), "-64", "--create", os.fspath(output)]
    for arch, path in images:
        if not isinstance(arch, str):
            raise TargetIDError(f"CUDA architecture must be a string, not {type(arch).__name__}")
        prefix, _, number = arch.partition("_")
        if prefix not in ("sm", "compute") or not number[:1].isdigit() or not number.isalnum():
            raise TargetIDError(f"invalid CUDA architecture {arch!r}: expected sm_<N> or compute_<N>")
        path = os.fspath(path)
        if "," in path:
            raise OffloadError(f"fatbinary cannot take a file name with a comma: {path!r}")
        command.append(f"--image3=kind={'elf' if prefix == 'sm' else 'ptx'},sm={number},file={path}")
    return command


def hip_fatbinary(images: Sequence[tuple[str, bytes | PathArg]], *, compress: int | bool | None = None,
                  offload_kind: str = "hipv4", host_target: str = "host-x86_64-unknown-linux",
                  llvm_version: int = 19) -> bytes:
    """A HIP fatbinary: the offload bundle the HIP runtime unpacks, ``(target ID, code object)`` per image.

    Exactly what ``clang-offload-bundler -type=o -bundle-align=4096 -targets=<host_target>,<offload_kind>-
    amdgcn-amd-amdhsa--<target ID>... -input=/dev/null -input=<image>... -output=<file>`` writes: an empty
    host entry first, then the code objects at 4096-byte boundaries.  ``compress`` wraps it in a ``CCOB``
    header (zstd, format 2 for LLVM < 22 and 3 from 22): ``True`` at the default level, an int at that level.

    clang-linker-wrapper's own bundle (``bundleHIP``) uses ``offload_kind="hip"``; LLVM 22 writes the host
    as ``host-x86_64-unknown-linux-gnu``.
    """
    from offload_builders.formats.bundle import binary_layout
    from offload_builders.formats.bundle_id import validate_targets
    from offload_builders.formats.compressed import CompressionOptions, Method, compress_bytes

    if not isinstance(llvm_version, int) or isinstance(llvm_version, bool) or llvm_version < 19:
        raise OffloadError(f"unsupported LLVM version {llvm_version!r}: HIP fat binaries are written as LLVM 19 "
                           "and later write them")
    if isinstance(images, (str, bytes)) or not images:
        raise OffloadError("a HIP fatbinary needs at least one (target ID, code object) pair")
    if offload_kind not in ("hip", "hipv4"):
        raise TargetIDError(f"HIP bundle entries are 'hip' or 'hipv4', not {offload_kind!r}")
    targets = [host_target]
    blobs = [b""]
    for target_id, image in images:
        if not isinstance(target_id, str) or not target_id:
            raise TargetIDError(f"invalid AMDGPU target ID {target_id!r}")
        targets.append(f"{offload_kind}-amdgcn-amd-amdhsa--{target_id}")
        if isinstance(image, (bytes, bytearray, memoryview)):
            blobs.append(bytes(image))
        else:
            with open(image, "rb") as f:
                blobs.append(f.read())
    ids = [str(entry) for entry in validate_targets(targets, bundling=True, llvm_version=llvm_version)]
    header, offsets, total = binary_layout(ids, [len(b) for b in blobs], 4096)
    out = bytearray(total)
    out[:len(header)] = header
    for offset, blob in zip(offsets, blobs):
        out[offset:offset + len(blob)] = blob
    if compress is None or compress is False:
        return bytes(out)
    level = None if compress is True else int(compress)
    try:
        options = CompressionOptions(Method.ZSTD, level, 3 if llvm_version >= 22 else 2)
    except ValueError as exc:
        raise OffloadError(str(exc)) from None
    return compress_bytes(bytes(out), options)
