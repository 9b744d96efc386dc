"""Temporary alias (issue 31 move in progress): offload_builders.linking.wrapping."""
import sys

import offload_builders.linking.wrapping as _moved

sys.modules[__name__] = _moved
