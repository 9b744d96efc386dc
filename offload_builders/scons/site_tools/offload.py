"""SCons tool module ``offload`` (loaded through ``offload_builders.scons.toolpath()``)."""
from offload_builders.scons.tool import exists, generate

__all__ = ["exists", "generate"]
