"""``offload-cache``: a compiler launcher that caches each job of a Clang offload compile on its own.

Used as ccache and sccache are (``CMAKE_<LANG>_COMPILER_LAUNCHER``, ``CXX="offload-cache clang++-19"``), it runs the
driver's own jobs (from ``-###``) one by one, each output kept under a key of what that job reads, so adding an
offload target runs that target's device jobs and the embed step only. This package imports nothing heavy at
start-up: the launcher runs for every compile.
"""

#: Marks a program in a file list (the direct mode's lists, :mod:`offload_builders.launcher.store`): it is checked
#: by its identity (size, mtime: ``keys.program_identity``), not hashed whole (a linker is tens of megabytes). No
#: path holds a NUL, so no file name can look like it. Here, below the store, the keys and the second level, which
#: all read it.
PROGRAM = "\0program "
