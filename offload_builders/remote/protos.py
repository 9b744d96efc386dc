"""The generated REAPI v2, ByteStream and long-running-operation messages and stubs, from ``buildgrid-common``
(``pip install 'offload-builders[remote]'``). Imported only where a remote is configured, so a build without
one needs none of it; missing, it is one :class:`~offload_builders.errors.RemoteError` naming the extra."""
from __future__ import annotations

from offload_builders.errors import RemoteError

try:
    from buildgrid.common.protos.build.bazel.remote.execution.v2 import (
        remote_execution_pb2,
        remote_execution_pb2_grpc,
    )
    from buildgrid.common.protos.google.bytestream import bytestream_pb2, bytestream_pb2_grpc
    from buildgrid.common.protos.google.longrunning import operations_pb2
    from buildgrid.common.protos.google.rpc import code_pb2, status_pb2
except Exception as error:  # missing (ImportError), or a protobuf runtime the generated code does not fit
    raise RemoteError(f"$OFFLOAD_REMOTE is set, but the REAPI client cannot be imported ({error}): "
                      "pip install 'offload-builders[remote]'") from None

__all__ = ["bytestream_pb2", "bytestream_pb2_grpc", "code_pb2", "operations_pb2", "remote_execution_pb2",
           "remote_execution_pb2_grpc", "status_pb2"]
