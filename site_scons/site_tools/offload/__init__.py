"""SCons tool ``offload``: a thin shim over the installed ``offload_builders`` package.

Copy this directory into a project's ``site_scons/site_tools/`` (or point ``toolpath`` here) and
``env.Tool('offload')`` works. When the package is not installed in the Python that runs SCons, the
checkout this shim lives in is put on ``sys.path``.
"""
import os
import sys

try:
    import offload_builders  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from offload_builders.scons.tool import exists, generate  # noqa: E402

__all__ = ["exists", "generate"]
