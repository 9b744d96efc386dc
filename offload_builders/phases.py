"""Temporary alias (issue 31 move in progress): offload_builders.models.openmp."""
import sys

import offload_builders.models.openmp as _moved

sys.modules[__name__] = _moved
