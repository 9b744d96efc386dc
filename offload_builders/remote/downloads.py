"""The temporary files of downloads, and the sweep of those a killed process left.

A download goes to ``.<name>.<pid>.<n>.tmp`` beside its destination ``<name>`` and is renamed into place once
complete and checked (:meth:`~offload_builders.remote.client.RemoteClient.download_to`). A process killed
mid-download (``SIGTERM``, ``SIGKILL``) cannot remove its temporary file, so the next run of the step removes those
of processes that no longer run: each ``offload-compile``/``offload-link`` step before it asks the cache
(:func:`sweep_downloads`), each SCons node with its other leftovers
(:func:`offload_builders.leftovers.leftover_pattern`: once per directory and build, where a sweep per download
would list a large directory once per output). Needs no grpcio.
"""
from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

#: Numbers the downloads' temporary files within the process.
_DOWNLOADS = itertools.count()
#: The most characters of the destination's name in a temporary file's name (file names have 255 bytes).
NAME_KEPT = 200


def download_temporary(path: Path) -> Path:
    """A new temporary file name for a download to ``path``, beside it."""
    return path.parent / f".{path.name[:NAME_KEPT]}.{os.getpid()}.{next(_DOWNLOADS)}.tmp"


def _running(pid: int) -> bool:
    if pid <= 0:
        return True  # not a process's: never swept
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (EPERM): it runs
        return True
    return True


def sweep_downloads(path: str | os.PathLike[str]) -> None:
    """Remove the temporary files of downloads to ``path`` that a process no longer running left (a live
    process's, this one's included, stay). Errors are ignored: it only tidies up."""
    path = Path(path)
    pattern = re.compile(re.escape(f".{path.name[:NAME_KEPT]}.") + r"([0-9]+)\.[0-9]+\.tmp")
    try:
        with os.scandir(path.parent) as entries:
            found = [(entry.name, int(match[1])) for entry in entries
                     if (match := pattern.fullmatch(entry.name)) is not None]
    except OSError:
        return
    for name, pid in found:
        if pid != os.getpid() and not _running(pid):
            try:
                os.unlink(path.parent / name)
            except OSError:
                pass


__all__ = ["NAME_KEPT", "download_temporary", "sweep_downloads"]
