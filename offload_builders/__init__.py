"""offload-builders: Clang's GPU offload compilation as ordinary build-graph nodes."""
from __future__ import annotations

__version__ = "0.1.0"
