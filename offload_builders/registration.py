"""Temporary alias (issue 31 move in progress): offload_builders.linking.registration."""
import sys

import offload_builders.linking.registration as _moved

sys.modules[__name__] = _moved
