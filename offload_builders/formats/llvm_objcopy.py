"""Where ``llvm-objcopy`` is and how it runs: the one program the bundler runs (for object bundles), and the
one ``offload-inspect`` runs to strip a host object.

A module of its own so that the format modules keep to bytes, and both tools find the same program.
"""
from __future__ import annotations

import os
import sys

from offload_builders.errors import OffloadError, ToolchainError

_objcopy_path: str | None = None


def find_llvm_objcopy() -> str:
    """``llvm-objcopy``: ``$OFFLOAD_BUNDLER_LLVM_OBJCOPY``, else LLVM 19's (as Clang 19 uses the one
    next to itself, and ``/usr/bin/llvm-objcopy`` may be an older release), else ``PATH``'s."""
    global _objcopy_path
    import shutil

    if _objcopy_path is None:
        candidates = [os.environ.get("OFFLOAD_BUNDLER_LLVM_OBJCOPY"), "/usr/lib/llvm-19/bin/llvm-objcopy",
                      shutil.which("llvm-objcopy-19"), shutil.which("llvm-objcopy")]
        for candidate in candidates:
            if candidate and os.access(candidate, os.X_OK):
                _objcopy_path = candidate
                break
        else:
            raise ToolchainError("unable to find 'llvm-objcopy' in path (object bundles need it); "
                                 "install it with: apt-get install llvm-19")
    return _objcopy_path


def run_objcopy(args: list[str], *, print_only: bool = False) -> bool:
    """Run ``llvm-objcopy args``; with ``print_only`` (``-###``) print the command instead, on standard
    error and quoted as Clang's ``executeObjcopy`` prints it, and return False (nothing was run)."""
    if print_only:
        sys.stderr.write(f'"{find_llvm_objcopy()}"' + "".join(f' "{arg}"' for arg in args) + "\n")
        return False
    import subprocess

    result = subprocess.run([find_llvm_objcopy(), *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, errors="surrogateescape")
    if result.returncode != 0:
        detail = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise OffloadError(f"'llvm-objcopy' tool failed: {detail}")
    return True
