"""Temporary alias (issue 31 move in progress): offload_builders.linking.image_groups."""
import sys

import offload_builders.linking.image_groups as _moved

sys.modules[__name__] = _moved
