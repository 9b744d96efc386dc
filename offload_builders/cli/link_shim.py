"""The directory a Clang driver is pointed at (``-B``) to run ``offload-link`` in ``clang-linker-wrapper``'s
place, and the link flags a build system that links with the driver (Meson's ``executable()``) needs.

The directory holds one script, ``clang-linker-wrapper``, that runs this Python's ``offload-link``: clang
runs it as this user, so the directory is private to the user (:mod:`offload_builders.private_dirs`), one
per interpreter, checked on every call, and the script is rewritten (atomically) whenever it is not this
user's own file with exactly the expected text. It lives in the per-user cache directory
(``$OFFLOAD_BUILDERS_CACHE_DIR``, else ``offload-builders`` in ``$XDG_CACHE_HOME`` or ``~/.cache``). Where the
caches are off (``OFFLOAD_BUILDERS_CACHE_DIR=``) the script still has to outlive this process (Meson asks for
the flags when it configures and links much later), so it goes to ``$XDG_RUNTIME_DIR/offload-builders``
(the per-user runtime directory the login session provides, ``0700``), else to the default cache directory
named above: never to a shared temporary directory, where another user could make the directory first.
"""
from __future__ import annotations

import hashlib
import os
import shlex
import sys
from pathlib import Path

from offload_builders.errors import ToolchainError
from offload_builders.private_dirs import private_directory, replace_private_file, trusted_file_text
from offload_builders.toolchain import configured_cache_dir, default_cache_dir, find_toolchain

WRAPPER_NAME = "clang-linker-wrapper"


def _shim_root() -> Path:
    """The private directory the shim directories go in (see the module's docstring)."""
    configured = configured_cache_dir()
    if configured:
        return private_directory(os.path.abspath(configured))
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime):  # the XDG spec: a relative value is to be ignored
        try:
            private_directory(runtime, create=False)  # the session's: never made here
        except ToolchainError as error:
            if os.path.lexists(runtime):
                raise ToolchainError(f"$XDG_RUNTIME_DIR: {error}; unset XDG_RUNTIME_DIR, or set"
                                     " OFFLOAD_BUILDERS_CACHE_DIR to a directory of this user's") from None
        else:
            return private_directory(os.path.join(runtime, "offload-builders"))
    return private_directory(os.path.abspath(default_cache_dir()))


def _wrapper_text() -> str:
    """The ``clang-linker-wrapper`` script: this Python's ``offload-link``, never code of the working directory."""
    return f"#!/bin/sh\nexec {shlex.quote(os.path.abspath(sys.executable))} -P -m offload_builders.cli.link \"$@\"\n"


def shim_name() -> str:
    """The shim directory's name: keyed by the script's text (this Python's path in it), so versions of the package
    that write other scripts never rewrite each other's."""
    return "link-shim-" + hashlib.sha256(_wrapper_text().encode()).hexdigest()[:12]


def shim_dir() -> str:
    """Make (if needed), check and return the directory whose ``clang-linker-wrapper`` runs ``offload-link``."""
    text = _wrapper_text()
    directory = private_directory(_shim_root() / shim_name())
    script = directory / WRAPPER_NAME
    if trusted_file_text(script) != text or not os.access(script, os.X_OK):
        replace_private_file(script, text, 0o700)
    return str(directory)


def link_args() -> list[str]:
    """What ``clang++`` needs to link OpenMP offload objects through ``offload-link``: the offload link
    (``--offload-link`` with our wrapper) and the host and device runtimes (see :func:`runtime_dir` for the
    run path: Meson wants it as ``build_rpath``, not as a flag)."""
    return ["-fopenmp", "--offload-link", f"-B{shim_dir()}", f"-L{runtime_dir()}", "-lomptarget",
            "-lomptarget.devicertl"]


def runtime_dir() -> str:
    """Where ``libomptarget.so`` is: the driver's own library directory."""
    return str(find_toolchain().lib_dir)
