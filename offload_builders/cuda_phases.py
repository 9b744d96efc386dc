"""Temporary alias (issue 31 move in progress): offload_builders.models.cuda."""
import sys

import offload_builders.models.cuda as _moved

sys.modules[__name__] = _moved
