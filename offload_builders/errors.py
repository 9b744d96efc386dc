"""The package's exception tree.

Every error a user can cause derives from :class:`OffloadError`, so the command-line tools can
turn any of them into one line on stderr and the SCons tool into one ``UserError``.
"""
from __future__ import annotations


class OffloadError(Exception):
    """Base of every error offload-builders raises on purpose."""


class TargetIDError(OffloadError, ValueError):
    """An offload target ID or bundle entry ID is malformed, unknown, or conflicts with another."""


class NativeTargetError(TargetIDError):
    """``native`` in a target list could not stand for this machine's GPUs: ``amdgpu-arch`` and ``nvptx-arch``
    found none (the message names them and what they said), or ``native`` was given features."""


class ToolchainError(OffloadError):
    """A required tool (Clang, a sibling LLVM tool, ptxas, ...) is missing or unusable."""


class MesonBuildDirectoryError(OffloadError):
    """A Meson build directory's introspection files (``meson-info/``) are missing or not what Meson writes."""


class OffloadFormatError(OffloadError):
    """A bundle, offload binary or object file is malformed.

    ``path`` and ``offset`` locate the problem when they are known; ``str()`` includes them so that
    a CLI can print the exception as it is.
    """

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None) -> None:
        self.message = message
        self.path = path
        self.offset = offset
        super().__init__(self._render())

    def _render(self) -> str:
        where = self.path or ""
        if self.offset is not None:
            where = f"{where}: offset {self.offset:#x}" if where else f"offset {self.offset:#x}"
        return f"{where}: {self.message}" if where else self.message

    def located(self, path: str) -> OffloadFormatError:
        """Return a copy of this error that names ``path`` (used when a reader learns the file name late)."""
        clone = type(self)(self.message, path=path, offset=self.offset)
        return clone


class BundleFormatError(OffloadFormatError):
    """A clang-offload-bundler bundle (plain, text, object or compressed) is malformed."""


class OffloadBinaryFormatError(OffloadFormatError):
    """A clang-offload-packager offload binary (magic 0x10FF10AD) is malformed."""


class RemoteError(OffloadError):
    """A Remote Execution API server could not be used: unreachable, too slow, refused the request, or
    answered something the protocol does not allow. Builds treat it as a miss, warn once and go on locally."""


class RemoteIntegrityError(RemoteError):
    """A blob the server sent does not match the digest it was asked for (or an action result names outputs
    the action did not declare): the blob is discarded and the node built locally."""
