"""offload-builders: Clang's GPU offload compilation as ordinary build-graph nodes."""
from __future__ import annotations

from offload_builders import moved_modules

__version__ = "0.1.0"

moved_modules.install()  # the modules' names before issue 31's layout still import

TYPE_CHECKING = False  # typing costs every tool's start-up milliseconds: for type checkers only
if TYPE_CHECKING:  # what moved_modules gives the old names, for the type checker
    from offload_builders.linking import image_groups, nvptx_runtime, registration, wrapping
    from offload_builders.models import cuda as cuda_phases, hip as hip_phases, openmp as phases

    __all__ = ["cuda_phases", "hip_phases", "image_groups", "nvptx_runtime", "phases", "registration", "wrapping"]
