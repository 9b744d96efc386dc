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
beyond :data:`MAX_SLOTS`, or beyond :data:`MAX_BYTES` of images in all, are removed.
``$OFFLOAD_KEPT_IMAGES_DIR`` names another directory of slots (the compiler launcher's cache, whose size limit
then counts them too); without it, ``OFFLOAD_BUILDERS_CACHE_DIR=`` (empty) turns this off with the other caches.

What is linked in from here is trusted as the link's own output, so the directories are checked as every directory
the tool trusts (:func:`~offload_builders.private_dirs.private_directory`: this user's, written by no one else, on a
safe way; made ``0700`` whatever the umask), and a key or image is read only where it is a regular file of this
user's of bounded size (:func:`~offload_builders.private_dirs.open_trusted_file`): another user's slot, a link to
``/dev/zero``, a FIFO or a directory swapped for a link are refused, and the link links as without them.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from typing import TYPE_CHECKING

from offload_builders.errors import ToolchainError
from offload_builders.private_dirs import open_trusted_file, private_directory, replace_private_file

if TYPE_CHECKING:
    from offload_builders.remote.actions import NodeJob

#: The per-user cache's directory of slots.
DIRECTORY = "kept-images"
#: A directory of slots to use instead (absolute): the compiler launcher, ``offload-cache``, puts the kept images of
#: the links it runs in its own cache, whose size limit then counts them.
DIRECTORY_VARIABLE = "OFFLOAD_KEPT_IMAGES_DIR"
#: Output paths whose images are kept (the most recently linked ones).
MAX_SLOTS = 32
#: Bytes of images kept in all slots together; also the largest image kept or read.
MAX_BYTES = 4 << 30
#: The largest key file read (a digest, a space, a digest).
_MAX_KEY_BYTES = 256


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
            slot = private_directory(self.slot, create=False)
            key_file = open_trusted_file(slot / (name + ".key"), _MAX_KEY_BYTES)
            if key_file is None:
                return False
            with key_file:
                kept_key, _, image_sha = key_file.read(_MAX_KEY_BYTES).decode("ascii").strip().partition(" ")
            if kept_key != key:
                return False
            image = open_trusted_file(slot / (name + ".img"), MAX_BYTES)
            if image is None:
                return False
            with image, open(destination, "wb") as out:
                shutil.copyfileobj(image, out)
            if _file_sha256(destination) == image_sha:
                os.utime(slot)  # recently used
                return True
        except (OSError, ValueError, ToolchainError):
            pass
        try:
            os.unlink(destination)
        except OSError:
            pass
        return False

    def keep(self, name: str, key: str, image: str) -> None:
        """Keep ``image`` as ``name`` with ``key``, replacing what was kept as ``name``; a failure keeps nothing
        and does not fail the link. The key goes first and comes back last, so no key names other bytes."""
        try:
            if os.path.getsize(image) > MAX_BYTES:
                return
            slot = private_directory(self.slot)
            key_path = slot / (name + ".key")
            try:
                os.unlink(key_path)
            except FileNotFoundError:
                pass
            partial = slot / f"{name}.img.{os.getpid()}.partial"
            try:
                fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
                with open(image, "rb") as source, os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(source, out)
                os.replace(partial, slot / (name + ".img"))
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(partial)
                raise
            replace_private_file(key_path, f"{key} {_file_sha256(image)}\n")
        except (OSError, ToolchainError):
            pass


def kept_images(output: str) -> KeptImages | None:
    """The kept images of ``output`` (by absolute path) in the per-user cache; None where the caches are off or
    the cache directory is not private to this user. Drops the least recently used slots beyond
    :data:`MAX_SLOTS` and :data:`MAX_BYTES`."""
    from offload_builders.toolchain import user_cache_dir

    chosen = os.environ.get(DIRECTORY_VARIABLE, "")
    cache = None if os.path.isabs(chosen) else user_cache_dir()
    if cache is None and not os.path.isabs(chosen):
        return None
    try:
        directory = private_directory(chosen if os.path.isabs(chosen) else os.path.join(str(cache), DIRECTORY))
    except ToolchainError:
        return None
    name = hashlib.sha256(os.path.abspath(output).encode("utf-8", "surrogateescape")).hexdigest()[:32]
    _prune(str(directory), keep=name)
    return KeptImages(os.path.join(directory, name))


def _slot_bytes(path: str) -> int:
    try:
        return sum(entry.stat(follow_symlinks=False).st_size for entry in os.scandir(path))
    except OSError:
        return 0


def _prune(directory: str, keep: str) -> None:
    """Remove the slots beyond :data:`MAX_SLOTS` or :data:`MAX_BYTES`, least recently used first (never
    ``keep``, which a link is about to fill)."""
    try:
        entries = [(entry.stat(follow_symlinks=False).st_mtime_ns, entry.path, entry.is_dir(follow_symlinks=False))
                   for entry in os.scandir(directory) if entry.name != keep]
    except OSError:
        return
    for _, path, is_slot in entries:
        if not is_slot:
            with contextlib.suppress(OSError):
                os.unlink(path)  # not a slot this module made
    slots = sorted(((mtime, path) for mtime, path, is_slot in entries if is_slot), reverse=True)
    total = _slot_bytes(os.path.join(directory, keep))
    for rank, (_, path) in enumerate(slots):
        total += _slot_bytes(path)
        if rank >= MAX_SLOTS - 1 or total > MAX_BYTES:
            shutil.rmtree(path, ignore_errors=True)


__all__ = ["DIRECTORY", "DIRECTORY_VARIABLE", "MAX_BYTES", "MAX_SLOTS", "KeptImages", "job_key", "kept_images"]
