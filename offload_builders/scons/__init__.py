"""The SCons integration: ``toolpath()`` lets an installed package provide the ``offload`` tool.

    import offload_builders.scons
    env = Environment(tools=['default', 'offload'], toolpath=[offload_builders.scons.toolpath()])
"""
from __future__ import annotations

from pathlib import Path


def toolpath() -> str:
    """The directory holding the ``offload`` SCons tool module, for ``Environment(toolpath=[...])``."""
    return str(Path(__file__).resolve().parent / "site_tools")
