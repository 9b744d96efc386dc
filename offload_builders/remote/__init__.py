"""Remote caching and remote execution of offload nodes over the Remote Execution API v2 (REAPI).

:mod:`~offload_builders.remote.digests` names blobs, :mod:`~offload_builders.remote.client` talks to a server
(Bazel's, BuildGrid, Buildbarn, NativeLink, bazel-remote), :mod:`~offload_builders.remote.actions` turns one
build node into an Action whose key does not depend on the checkout's path, and
:mod:`~offload_builders.remote.cache` runs a node through the cache: a hit downloads checked outputs, a miss
runs locally and uploads. What a server sends is text from outside (:mod:`~offload_builders.remote.text`: made
safe to print, the URL redacted) and bounded (:mod:`~offload_builders.remote.client`); downloads go to temporary
files a later run sweeps (:mod:`~offload_builders.remote.downloads`).
"""
