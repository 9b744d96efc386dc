"""Each GPU target's device image from a program's last ``offload-link``, kept and reused while its key holds.

The SCons tool links each target's device image in a node of its own, so adding a target links that target's
image alone. ``offload-link`` is one command of a CMake, Meson or Ninja build (as ``clang-linker-wrapper`` is of the
driver's link), which would link every target's image again. So it keeps each GPU target's image, with the key of
the device link that made it, in a slot of the per-user cache (:func:`~offload_builders.toolchain.user_cache_dir`)
for that output path, and the next link of the same output takes it instead of linking where the key is the
same.

The key is what the remote cache keys the device link by (:func:`offload_builders.remote.cli_jobs.step_job`): its
command with the scratch directory left out, the content of every device file it reads, and the programs it runs
by path and content (NVPTX: also clang-nvlink-wrapper, ptxas, nvlink and the CUDA 12 wheels' libnvJitLink). A kept
image is used only if its key is the new link's and its bytes are the ones recorded beside the key, checked after
the copy; anything else (no slot, another key, a missing or damaged file, a cache that cannot be written) links as
without it. The host CPU's device link is not kept, as it is not cached remotely: it links host libraries found by
the linker's own search.

Slots are per output path (a program's images replace that program's earlier ones); the least recently used
beyond :data:`MAX_SLOTS` are removed. ``OFFLOAD_BUILDERS_CACHE_DIR=`` (empty) turns this off with the other caches.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from typing import TYPE_CHECKING

from offload_builders.private_dirs import replace_private_file

if TYPE_CHECKING:
    from offload_builders.remote.actions import NodeJob

#: The per-user cache's directory of slots.
DIRECTORY = "kept-images"
#: Output paths whose images are kept (the most recently linked ones).
MAX_SLOTS = 32


def job_key(job: NodeJob) -> str:
    """The device link's key: a digest of everything :class:`~offload_builders.remote.actions.NodeJob` holds."""
    sha = hashlib.sha256()
    for part in (*job.steps, "", *(f"{path} {digest}" for path, digest in sorted(job.inputs.items())), "",
                 *job.salt_lines, "", *job.outputs):
        sha.update(part.encode("utf-8", "surrogateescape") + b"\0")
    return sha.hexdigest()


def _file_sha256(path: str) -> str:
    from offload_builders.remote.digests import digest_of_file

    return digest_of_file(path).hash


class KeptImages:
    """The kept images of one output (``slot``: its directory, made on the first :meth:`keep`)."""

    def __init__(self, slot: str) -> None:
        self.slot = slot

    def fetch(self, name: str, key: str, destination: str) -> bool:
        """Copy the image kept as ``name`` to ``destination`` if it was linked with ``key`` and its bytes are the
        recorded ones; True then. Otherwise False, and nothing written at ``destination`` (a copy whose bytes are
        not the recorded ones is removed)."""
        try:
            with open(os.path.join(self.slot, name + ".key"), encoding="ascii") as stream:
                kept_key, _, image_sha = stream.read().strip().partition(" ")
            if kept_key != key:
                return False
            shutil.copyfile(os.path.join(self.slot, name + ".img"), destination)
            if _file_sha256(destination) == image_sha:
                os.utime(self.slot)  # recently used
                return True
        except (OSError, ValueError):
            pass
        try:
            os.unlink(destination)
        except OSError:
            pass
        return False

    def keep(self, name: str, key: str, image: str) -> None:
        """Keep ``image`` as ``name`` with ``key``, replacing what was kept as ``name``; a failure keeps nothing
        and does not fail the link. The key goes first and comes back last, so no key names other bytes."""
        key_path = os.path.join(self.slot, name + ".key")
        try:
            os.makedirs(self.slot, mode=0o700, exist_ok=True)
            try:
                os.unlink(key_path)
            except FileNotFoundError:
                pass
            partial = os.path.join(self.slot, f"{name}.img.{os.getpid()}.partial")
            try:
                shutil.copyfile(image, partial)
                os.replace(partial, os.path.join(self.slot, name + ".img"))
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(partial)
                raise
            replace_private_file(key_path, f"{key} {_file_sha256(image)}\n")
        except OSError:
            pass


def kept_images(output: str) -> KeptImages | None:
    """The kept images of ``output`` (by absolute path) in the per-user cache; None where the caches are off.
    Drops the least recently used slots beyond :data:`MAX_SLOTS`."""
    from offload_builders.toolchain import user_cache_dir

    cache = user_cache_dir()
    if cache is None:
        return None
    directory = os.path.join(cache, DIRECTORY)
    name = hashlib.sha256(os.path.abspath(output).encode("utf-8", "surrogateescape")).hexdigest()[:32]
    _prune(directory, keep=name)
    return KeptImages(os.path.join(directory, name))


def _prune(directory: str, keep: str) -> None:
    """Remove the slots beyond :data:`MAX_SLOTS`, least recently used first (never ``keep``)."""
    try:
        entries = [(entry.stat().st_mtime_ns, entry.path) for entry in os.scandir(directory)
                   if entry.name != keep and entry.is_dir(follow_symlinks=False)]
    except OSError:
        return
    entries.sort(reverse=True)
    for _, path in entries[MAX_SLOTS - 1:]:
        shutil.rmtree(path, ignore_errors=True)


__all__ = ["DIRECTORY", "MAX_SLOTS", "KeptImages", "job_key", "kept_images"]
