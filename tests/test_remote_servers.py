# mypy: disable-error-code="import-untyped"
"""The REAPI servers the remote tests start (tests/remote_servers.py) answer as those tests expect."""
from __future__ import annotations

import hashlib

import grpc
import pytest
from buildgrid.common.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as re_pb2,
    remote_execution_pb2_grpc as re_grpc,
)

from remote_servers import BuildGridServer, ExecutionServer


def _digest(data: bytes) -> re_pb2.Digest:
    return re_pb2.Digest(hash=hashlib.sha256(data).hexdigest(), size_bytes=len(data))


def _capabilities(server: BuildGridServer | ExecutionServer) -> re_pb2.ServerCapabilities:
    with grpc.insecure_channel(server.target) as channel:
        return re_grpc.CapabilitiesStub(channel).GetCapabilities(
            re_pb2.GetCapabilitiesRequest(instance_name=server.instance), timeout=10)


def test_buildgrid_serves_a_cache_and_restarts_on_its_port(buildgrid: BuildGridServer) -> None:
    capabilities = _capabilities(buildgrid)
    assert re_pb2.DigestFunction.SHA256 in capabilities.cache_capabilities.digest_function
    assert capabilities.cache_capabilities.action_cache_update_capabilities.update_enabled
    assert not capabilities.execution_capabilities.exec_enabled
    assert buildgrid.url == f"grpc://127.0.0.1:{buildgrid.port}"

    url = buildgrid.url
    buildgrid.stop()
    with pytest.raises(grpc.RpcError) as refused:
        _capabilities(buildgrid)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    buildgrid.start()
    assert buildgrid.url == url
    assert _capabilities(buildgrid).cache_capabilities.digest_function


def test_casd_executes_an_action_with_host_tools(casd_execution: ExecutionServer, llvm19) -> None:
    clang = str(llvm19("clang"))
    assert _capabilities(casd_execution).execution_capabilities.exec_enabled

    source = b"int answer(void) { return 42; }\n"
    src = re_pb2.Directory(files=[re_pb2.FileNode(name="a.c", digest=_digest(source))]).SerializeToString()
    root = re_pb2.Directory(directories=[re_pb2.DirectoryNode(name="src", digest=_digest(src))]).SerializeToString()
    # The sandbox's root is the input root: host tools by absolute path (/usr is bound in), inputs relative.
    command = re_pb2.Command(
        arguments=["/bin/sh", "-c", f'echo hi > out.txt && "{clang}" -c a.c -o obj/a.o'],
        working_directory="src", output_paths=["out.txt", "obj/a.o"], output_files=["out.txt", "obj/a.o"],
        environment_variables=[re_pb2.Command.EnvironmentVariable(name="PATH", value="/usr/bin:/bin")],
    ).SerializeToString()
    action = re_pb2.Action(command_digest=_digest(command), input_root_digest=_digest(root)).SerializeToString()

    with grpc.insecure_channel(casd_execution.target) as channel:
        cas = re_grpc.ContentAddressableStorageStub(channel)
        uploaded = cas.BatchUpdateBlobs(re_pb2.BatchUpdateBlobsRequest(
            instance_name=casd_execution.instance,
            requests=[re_pb2.BatchUpdateBlobsRequest.Request(digest=_digest(blob), data=blob)
                      for blob in (source, src, root, command, action)]), timeout=10)
        assert [response.status.code for response in uploaded.responses] == [0] * 5

        def execute() -> re_pb2.ExecuteResponse:
            operations = list(re_grpc.ExecutionStub(channel).Execute(re_pb2.ExecuteRequest(
                instance_name=casd_execution.instance, action_digest=_digest(action)), timeout=60))
            assert operations[-1].done and operations[-1].name.startswith(f"{casd_execution.instance}#")
            response = re_pb2.ExecuteResponse()
            assert operations[-1].response.Unpack(response)
            return response

        response = execute()
        result = response.result
        stderr = cas.BatchReadBlobs(re_pb2.BatchReadBlobsRequest(
            instance_name=casd_execution.instance, digests=[result.stderr_digest]), timeout=10).responses[0].data
        assert response.status.code == 0 and result.exit_code == 0, stderr
        outputs = {file.path: file.digest for file in result.output_files}
        assert sorted(outputs) == ["obj/a.o", "out.txt"]
        read = cas.BatchReadBlobs(re_pb2.BatchReadBlobsRequest(
            instance_name=casd_execution.instance, digests=list(outputs.values())), timeout=10)
        contents = {blob.digest.hash: blob.data for blob in read.responses}
        assert contents[outputs["out.txt"].hash] == b"hi\n"
        assert contents[outputs["obj/a.o"].hash].startswith(b"\x7fELF")

        # A second Execute of the same action is answered from casd's action cache.
        again = execute()
        assert again.cached_result and again.result.output_files == result.output_files
