"""Temporary alias (issue 31 move in progress): offload_builders.models.hip."""
import sys

import offload_builders.models.hip as _moved

sys.modules[__name__] = _moved
