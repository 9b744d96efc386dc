"""Content digests as REAPI names blobs: SHA-256 of the bytes, in lower-case hex, and the size."""
from __future__ import annotations

import hashlib
import os
from typing import BinaryIO, NamedTuple

#: Read files in pieces of this size when hashing (large images, toolchain binaries).
CHUNK_SIZE = 1 << 20


class Digest(NamedTuple):
    """A blob's name on the server (``build.bazel.remote.execution.v2.Digest``)."""

    hash: str
    size: int

    def __str__(self) -> str:
        return f"{self.hash}/{self.size}"


def digest_of_bytes(data: bytes) -> Digest:
    return Digest(hashlib.sha256(data).hexdigest(), len(data))


def digest_of_file(path: str | os.PathLike[str]) -> Digest:
    """The file's digest, read in pieces (images and archives can be large)."""
    with open(path, "rb") as stream:
        return digest_of_stream(stream)


def digest_of_stream(stream: BinaryIO) -> Digest:
    """The digest of what is left to read of a file already open (one whose stat was taken through it)."""
    sha = hashlib.sha256()
    size = 0
    while piece := stream.read(CHUNK_SIZE):
        sha.update(piece)
        size += len(piece)
    return Digest(sha.hexdigest(), size)


#: The digest of no bytes (REAPI: servers need not store it; clients never upload it).
EMPTY_DIGEST = digest_of_bytes(b"")

__all__ = ["CHUNK_SIZE", "Digest", "EMPTY_DIGEST", "digest_of_bytes", "digest_of_file", "digest_of_stream"]
