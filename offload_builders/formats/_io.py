"""Output and copy primitives shared by the packager and the bundler.

Kept to the standard library modules the bundler loads anyway (its start-up is benchmarked against
``cat``): ``tempfile`` and ``typing`` are deliberately not imported.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys

TYPE_CHECKING = False  # typing costs ~3 ms of start-up; annotations are strings anyway
if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import TracebackType
    from typing import Self

#: Bytes per step wherever data is copied or scanned through user space.
CHUNK = 1 << 20

# Errors after which the in-kernel copy is abandoned for the next way (file systems and file types that
# do not support it, seccomp filters, FUSE): copy_file_range, then sendfile, then pread/write.
_FALLBACK_ERRNOS = frozenset({errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP,
                              errno.EBADF, errno.ESPIPE, errno.EPERM, errno.ETXTBSY, errno.EIO})


def write_all(fd: int, data: bytes | memoryview) -> None:
    """``os.write`` until everything is written (it may write less than asked, e.g. to a pipe)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class ShortReadError(OSError):
    """The source ended before the promised byte count: it shrank while being copied."""

    def __init__(self, remaining: int) -> None:
        super().__init__(errno.EIO, f"input ended {remaining} bytes early (did it shrink while being copied?)")
        self.remaining = remaining


def copy_file_range_stream(src_fd: int, dst_fd: int, offset: int, count: int) -> None:
    """Copy ``count`` bytes at ``offset`` of ``src_fd`` to the current position of ``dst_fd``.

    In the kernel (``copy_file_range``, which may share extents, then ``sendfile``) when the OS allows,
    else ``CHUNK``-sized ``pread``/``write``, so memory use never depends on ``count``. Raises
    :class:`ShortReadError` if the source holds fewer bytes than promised.
    """
    position = offset
    remaining = count
    kernel = [name for name in ("copy_file_range", "sendfile") if hasattr(os, name)]
    while remaining > 0:
        step = min(remaining, 1 << 30)
        if kernel:
            try:
                if kernel[0] == "copy_file_range":
                    copied = os.copy_file_range(src_fd, dst_fd, step, position)
                else:
                    copied = os.sendfile(dst_fd, src_fd, position, step)
            except OSError as exc:
                if exc.errno not in _FALLBACK_ERRNOS:
                    raise
                kernel.pop(0)
                continue
        else:
            chunk = os.pread(src_fd, min(step, CHUNK), position)
            write_all(dst_fd, chunk)
            copied = len(chunk)
        if copied == 0:
            raise ShortReadError(remaining)
        position += copied
        remaining -= copied


class Outputs:
    """Output files written as temporaries next to their targets and renamed into place together.

    :meth:`create` gives a descriptor per output; leaving the block without an error renames every
    temporary over its target (mode 0666 minus the umask, like LLVM's ``FileOutputBuffer``), and any
    error removes them all, so a failed run leaves neither a partial nor a clobbered output. ``-``
    means standard output, and an existing non-regular file (``/dev/null``, a FIFO) is written in place.
    Temporary names come from the pid and a counter, which spares importing ``tempfile``.
    """

    _counter = 0

    def __init__(self) -> None:
        self._pending: list[tuple[str, str]] = []
        self._direct: list[int] = []

    @staticmethod
    def error(path: str, exc: OSError) -> Exception:
        """What to raise when ``path`` cannot be created or put in place; subclasses pick their own type.

        The default is an ``OSError`` that names the output, never the temporary file."""
        return OSError(exc.errno, exc.strerror, path)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        pending, self._pending = self._pending, []
        direct, self._direct = self._direct, []
        try:
            for fd in direct:
                if fd > 2:
                    os.close(fd)
            while exc_type is None and pending:
                temp, final = pending[0]
                try:
                    os.replace(temp, final)
                except OSError as error:
                    raise self.error(final, error) from None
                pending.pop(0)
        finally:
            for temp, _ in pending:
                with contextlib.suppress(OSError):
                    os.unlink(temp)

    def create(self, path: str | os.PathLike[str]) -> int:
        """A descriptor to write the output ``path`` through (closed when the block ends)."""
        path = os.fspath(path)
        if path == "-":
            sys.stdout.flush()
            self._direct.append(1)
            return 1
        try:
            special = not stat.S_ISREG(os.stat(path).st_mode)
        except FileNotFoundError:
            special = False
        except OSError as exc:
            raise self.error(path, exc) from None
        if special:
            fd = os.open(path, os.O_WRONLY)
            self._direct.append(fd)
            return fd
        directory = os.path.dirname(os.path.abspath(path))
        while True:
            Outputs._counter += 1
            temp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{Outputs._counter}.tmp")
            try:
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                break
            except FileExistsError:
                continue
            except OSError as exc:
                raise self.error(path, exc) from None
        self._pending.append((temp, path))
        self._direct.append(fd)
        mask = os.umask(0)
        os.umask(mask)
        os.fchmod(fd, 0o666 & ~mask)
        return fd


@contextlib.contextmanager
def atomic_output(output: str | os.PathLike[str]) -> Iterator[int]:
    """One :class:`Outputs` output: a descriptor whose contents replace ``output`` only if the block succeeds."""
    with Outputs() as outputs:
        yield outputs.create(output)


def llvm_stem(path: str) -> str:
    """``sys::path::stem(path)``: the file name without its last extension (``.x`` has stem ``""``).

    Clang's tools name extracted files after it, so ours must compute it the same way.
    """
    name = path.rsplit("/", 1)[-1] or "."
    if name in (".", ".."):
        return name
    dot = name.rfind(".")
    return name if dot < 0 else name[:dot]
