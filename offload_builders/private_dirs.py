"""Directories the tool keeps things in that it later runs or trusts, and the files it writes there.

The link shim (a script clang runs as ``clang-linker-wrapper``), the NVPTX tool directory composed from the
CUDA 12 wheels and the per-user caches (whose driver jobs are run as they are) are only as safe as the
directories that hold them: a directory another local user may write, or may swap for one of theirs, lets
that user's code run as this one. So each such directory is made ``0700`` and, at every use, refused unless

* it is a directory owned by this user that no one else may write (mode without group or other write), and
* the way to it is safe: no directory on it may be written by anyone (world-writable) unless it has the
  sticky bit, as ``/tmp`` has, and in such a sticky directory each entry on the way (a directory or a
  symbolic link) must be this user's or root's: anyone could have made it there first.

Symbolic links on the way are followed (a home or cache directory linked to a scratch disk is common) and
their targets checked the same way. Directories on the way that belong to another user outside such a
sticky directory, or that their group may write, are trusted: the system, or the user's own choice of
``$OFFLOAD_BUILDERS_CACHE_DIR``, put them there.
"""
from __future__ import annotations

import os
import stat

from offload_builders.errors import ToolchainError

TYPE_CHECKING = False  # typing costs every command line's start-up: for type checkers only
if TYPE_CHECKING:
    from pathlib import Path
    from typing import BinaryIO

#: Symbolic links followed on the way to one directory at most (Linux's own limit).
_MAX_LINKS = 40


_NOT_PRIVATE = " is not a directory of this user's that only this user may write"


class UnsafeDirectoryError(ToolchainError):
    """A directory the tool would run or trust files from is not private to this user."""


def private_directory(path: str | os.PathLike[str], *, create: bool = True) -> Path:
    """Make ``path`` (mode 0700, missing parents too) unless ``create`` is false, check it as the module says,
    and return it. Raises :class:`UnsafeDirectoryError` where another user may write it or the way to it, and
    :class:`ToolchainError` where it does not exist (``create=False``) or cannot be made."""
    from pathlib import Path  # here: the compiler launcher checks its directory with private_path (start-up)

    return Path(private_path(path, create=create))


def private_path(path: str | os.PathLike[str], *, create: bool = True) -> str:
    """:func:`private_directory`, as a string (without importing :mod:`pathlib`), spelled as ``Path`` spells it."""
    path = _as_path_spells(os.fspath(path))
    for _ in range(64):  # each round makes one missing directory, then checks the whole way again
        missing = _missing_on_the_way(path)
        if missing is None:
            return path
        if not create:
            raise ToolchainError(f"{path} does not exist")
        try:
            os.mkdir(missing, 0o700)
        except FileExistsError:
            pass  # made meanwhile: checked as any other in the next round
        except OSError as error:
            raise ToolchainError(f"cannot make the private directory {path}: {error.strerror}") from None
    raise ToolchainError(f"cannot make the private directory {path}: too many components")


def _as_path_spells(path: str) -> str:
    """``path`` without empty and ``.`` components or a trailing slash, as :class:`pathlib.Path` spells it."""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    return ("/" if path.startswith("/") else "") + "/".join(parts) or "."


def _missing_on_the_way(path: str) -> str | None:
    """Check the way to ``path`` and ``path`` itself; return the first directory that does not exist yet
    (resolved: where to make it), or None where ``path`` exists and is private."""
    uid = os.getuid()
    absolute = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    parts = [part for part in absolute.split("/") if part not in ("", ".")]
    current, links = "/", 0
    current_info = _lstat("/", path)
    if current_info.st_mode & stat.S_IWOTH and not current_info.st_mode & stat.S_ISVTX:
        raise UnsafeDirectoryError(f"{path}{_NOT_PRIVATE}: anyone may write /")
    while parts:
        name = parts.pop(0)
        if name == "..":
            current = os.path.dirname(current)  # ``current`` is resolved: its parent is the kernel's ".."
            current_info = _lstat(current, path)
            continue
        candidate = os.path.join(current, name)
        try:
            info = os.lstat(candidate)
        except FileNotFoundError:
            if ".." in parts:
                raise ToolchainError(f"cannot make the private directory {path}: {candidate} does not exist"
                                     " and a '..' follows it") from None
            return candidate
        except OSError as error:
            raise ToolchainError(f"cannot use {path}: {candidate}: {error.strerror}") from None
        if _anyone_may_add_to(current_info) and info.st_uid not in (0, uid):
            raise UnsafeDirectoryError(
                f"{path}{_NOT_PRIVATE}: {candidate} belongs to another user (uid {info.st_uid}) in {current},"
                " where anyone may make entries; use another directory")
        if stat.S_ISLNK(info.st_mode):
            links += 1
            if links > _MAX_LINKS:
                raise ToolchainError(f"cannot use {path}: too many symbolic links on the way")
            target = os.readlink(candidate)
            if target.startswith("/"):
                current, current_info = "/", _lstat("/", path)
            parts = [part for part in target.split("/") if part not in ("", ".")] + parts
            continue
        if not stat.S_ISDIR(info.st_mode):
            raise ToolchainError(f"cannot use {path}: {candidate} is not a directory")
        if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
            raise UnsafeDirectoryError(
                f"{path}{_NOT_PRIVATE}: anyone may write {candidate} (mode {stat.S_IMODE(info.st_mode):04o},"
                " no sticky bit), so anyone could replace what is in it")
        current, current_info = candidate, info
    if current_info.st_uid != uid or current_info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        owner = "this user" if current_info.st_uid == uid else f"uid {current_info.st_uid}"
        raise UnsafeDirectoryError(
            f"{path}{_NOT_PRIVATE} (it is owned by {owner}, mode {stat.S_IMODE(current_info.st_mode):04o}):"
            " offload-builders runs or trusts what it keeps there; remove it, or use another directory")
    return None


def _anyone_may_add_to(info: os.stat_result) -> bool:
    return bool(info.st_mode & stat.S_IWOTH)


def _lstat(directory: str, path: str) -> os.stat_result:
    try:
        return os.lstat(directory)
    except OSError as error:
        raise ToolchainError(f"cannot use {path}: {directory}: {error.strerror}") from None


def open_trusted_file(path: str | os.PathLike[str], max_bytes: int) -> BinaryIO | None:
    """``path`` open for reading where it is a regular file (not a link) of this user's that no one else may
    write, of at most ``max_bytes``; else None (missing, a link, a FIFO or device, another's, writable by others,
    too large, unreadable). Opened without following a link and without blocking, then checked on the open file,
    so a FIFO, ``/dev/zero`` or a link swapped in meanwhile is refused, never read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    f = os.fdopen(fd, "rb")
    try:
        info = os.fstat(f.fileno())
    except OSError:
        f.close()
        return None
    if (not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid()
            or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or info.st_size > max_bytes):
        f.close()
        return None
    return f


#: The largest text file :func:`trusted_file_text` reads (keys, scripts, caches' JSON).
MAX_TEXT_BYTES = 16 << 20


def trusted_file_text(path: str | os.PathLike[str], max_bytes: int = MAX_TEXT_BYTES) -> str | None:
    """The text of ``path`` where :func:`open_trusted_file` takes it, else None (also where it is not UTF-8 or
    grew past ``max_bytes`` while read): a caller treats None as "not there" and writes its own
    (:func:`replace_private_file`)."""
    f = open_trusted_file(path, max_bytes)
    if f is None:
        return None
    with f:
        try:
            data = f.read(max_bytes + 1)
            return data.decode() if len(data) <= max_bytes else None
        except (OSError, UnicodeDecodeError):
            return None


def replace_private_file(path: str | os.PathLike[str], text: str, mode: int = 0o600) -> None:
    """Write ``text`` to ``path`` (in a private directory) with ``mode``, atomically: a new file renamed over
    whatever was there (a link there is replaced, never followed). The temporary file goes on any failure."""
    path = os.fspath(path)
    fd, partial = _new_partial_file(path)
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), mode)
            f.write(text)
        os.replace(partial, path)
    except BaseException:
        try:
            os.unlink(partial)
        except OSError:
            pass
        raise


def _new_partial_file(path: str) -> tuple[int, str]:
    """A new file (``O_EXCL``, ``0600``, a random name) beside ``path``, as ``tempfile.mkstemp`` makes one, without
    importing ``tempfile`` (with ``random`` and ``shutil``) into every compile that stores something."""
    directory, name = os.path.split(path)
    for _ in range(100):
        partial = os.path.join(directory or ".", f".{name}.{os.urandom(6).hex()}.partial")
        try:
            return os.open(partial, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), partial
        except FileExistsError:
            continue
    raise FileExistsError(f"no new file could be made beside {path}")


__all__ = ["MAX_TEXT_BYTES", "UnsafeDirectoryError", "open_trusted_file", "private_directory", "private_path",
           "replace_private_file", "trusted_file_text"]
