"""SCons tool ``offload``: a thin shim over the installed ``offload_builders`` package.

Copy this directory into a project's ``site_scons/site_tools/`` and ``env.Tool('offload')`` (or
``tools=['default', 'offload']``) loads the tool of the ``offload_builders`` package installed in the Python that
runs SCons (``pip install offload-builders`` in the virtualenv whose ``scons`` builds the project). The shim holds
no code of its own, so it never goes stale against the package. Inside an offload-builders checkout it also finds
the checkout's package; anywhere else, a Python without the package is one error saying what to install.
"""
import os
import sys

try:
    import offload_builders  # noqa: F401
except ImportError:
    _checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    if not os.path.isfile(os.path.join(_checkout, "offload_builders", "__init__.py")):
        import SCons.Errors

        raise SCons.Errors.UserError(
            f"the offload tool ({os.path.dirname(os.path.abspath(__file__))}) needs the offload-builders package "
            f"in the Python that runs SCons ({sys.executable}): install it there with "
            f"'{sys.executable} -m pip install offload-builders' (from a checkout or a wheel; add [nvptx] for "
            "NVIDIA targets), or run the scons of the virtualenv that has it") from None
    sys.path.insert(0, _checkout)

from offload_builders.scons.tool import exists, generate  # noqa: E402

__all__ = ["exists", "generate"]
