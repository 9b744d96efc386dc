"""Temporary alias (issue 31 move in progress): offload_builders.linking.nvptx_runtime."""
import sys

import offload_builders.linking.nvptx_runtime as _moved

sys.modules[__name__] = _moved
