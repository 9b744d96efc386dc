"""The directory a Clang driver is pointed at (``-B``) to run ``offload-link`` in ``clang-linker-wrapper``'s
place, and the link flags a build system that links with the driver (Meson's ``executable()``) needs.

The directory holds one script, ``clang-linker-wrapper``, that runs this Python's ``offload-link``. It lives
under the per-user cache directory (``$OFFLOAD_BUILDERS_CACHE_DIR``, else ``~/.cache/offload-builders``;
the system's temporary directory where caches are off), one per interpreter, and is rewritten only when
its text would change, atomically.
"""
from __future__ import annotations

import hashlib
import os
import shlex
import sys
import tempfile

from offload_builders.toolchain import find_toolchain

WRAPPER_NAME = "clang-linker-wrapper"


def _cache_root() -> str:
    directory = os.environ.get("OFFLOAD_BUILDERS_CACHE_DIR")
    if directory is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        directory = os.path.join(base, "offload-builders")
    return directory or os.path.join(tempfile.gettempdir(), f"offload-builders-{os.getuid()}")


def shim_dir() -> str:
    """Make (if needed) and return the directory whose ``clang-linker-wrapper`` runs ``offload-link``."""
    python = os.path.abspath(sys.executable)
    directory = os.path.join(_cache_root(), "link-shim-" + hashlib.sha256(python.encode()).hexdigest()[:12])
    script = os.path.join(directory, WRAPPER_NAME)
    text = f"#!/bin/sh\nexec {shlex.quote(python)} -m offload_builders.cli.link \"$@\"\n"
    try:
        with open(script) as f:
            if f.read() == text:
                return directory
    except OSError:
        pass
    os.makedirs(directory, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=f".{WRAPPER_NAME}.", dir=directory)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(partial, 0o755)
    os.replace(partial, script)
    return directory


def link_args() -> list[str]:
    """What ``clang++`` needs to link OpenMP offload objects through ``offload-link``: the offload link
    (``--offload-link`` with our wrapper) and the host and device runtimes (see :func:`runtime_dir` for the
    run path: Meson wants it as ``build_rpath``, not as a flag)."""
    return ["-fopenmp", "--offload-link", f"-B{shim_dir()}", f"-L{runtime_dir()}", "-lomptarget",
            "-lomptarget.devicertl"]


def runtime_dir() -> str:
    """Where ``libomptarget.so`` is: the driver's own library directory."""
    return str(find_toolchain().lib_dir)
