"""Which file a compile read, as Clang's OpenMP target-region names see it.

Clang 19 names every OpenMP target region ``__omp_offloading_<st_dev>_<st_ino>_<function>_l<line>``: the
device and inode numbers of the file that holds it (the source, or a header). The host front end writes
those names into the host bitcode, and each device compile recomputes them from the file *it* reads and
keeps only the regions the host bitcode names. So a device compile of a file with another inode than the
host front end saw, however identical its bytes, emits no kernels and exits 0, and the program fails at
run time (``Failed to load kernel``). Clang 19 has no flag that names regions otherwise (newer LLVM falls
back to a hash of the file name only where no inode can be had), so the inode cannot be kept out.

The rule the build follows: **the identity of every file a host front end read is part of its signature.**
A file re-created with the same bytes (a branch switch, ``git stash pop``, rsync, an editor's safe-save)
runs the host front end again; its new bitcode names the new inode, so every device compile that reads it
runs again too. A host bitcode from a cache is reused only with the identity it was made with. The
link-time entry check (:func:`offload_builders.linking.missing_entries`) catches whatever slips past (a
file replaced while the build runs).

HIP is not affected: its kernel names come from ``-cuid``, not from the file.
"""
from __future__ import annotations

import os

TYPE_CHECKING = False  # the compiler launcher imports this module at every compile: for type checkers only
if TYPE_CHECKING:
    from collections.abc import Iterable


#: A file whose modification or change time is less than this before it is read is "racy": a write in the same tick
#: of the file system's clock may leave its stamp as it was (Linux updates file times from a clock that ticks every
#: few milliseconds; some file systems keep whole seconds, FAT two), so its stamp is not recorded.
RACY_SECONDS = 2.0


def stat_stamp(status: os.stat_result) -> str:
    """A file's identity as a stat gives it (device, inode, size, both times): equal only while nothing wrote it.
    The compiler launcher's file lists and the per-user digest memo keep what they read of a file under it."""
    return f"{status.st_dev} {status.st_ino} {status.st_size} {status.st_mtime_ns} {status.st_ctime_ns}"


def settled(status: os.stat_result, settled_before: int) -> bool:
    """Whether the file was last modified and changed before ``settled_before`` (ns, taken before the stat): no
    longer racy (:data:`RACY_SECONDS`), so its stamp may be recorded."""
    return status.st_mtime_ns < settled_before and status.st_ctime_ns < settled_before


def file_identity(path: str) -> str:
    """``path`` with the device and inode numbers Clang would put into target-region names
    (``missing`` for a file that does not exist: the compile will say so)."""
    try:
        status = os.stat(path)
    except OSError:
        return f"{path} missing"
    return f"{path} dev={status.st_dev:x} ino={status.st_ino:x}"


def identity_signature(paths: Iterable[str]) -> str:
    """One line per file, in the order given: what the host front end's build signature adds."""
    return "\n".join(file_identity(path) for path in paths)


__all__ = ["RACY_SECONDS", "file_identity", "identity_signature", "settled", "stat_stamp"]
