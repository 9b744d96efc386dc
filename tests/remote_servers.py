# mypy: disable-error-code="import-untyped"
"""REAPI servers for the remote caching and execution tests, started on loopback as child processes.

- :func:`start_buildgrid`: BuildGrid 0.4.4 (``bgd`` from ``.venv-buildgrid``) serving CAS, ByteStream, ActionCache
  and Capabilities from memory (an LRU store): a remote cache, no Execution service.
- :func:`start_buildbox_casd`: ``buildbox-casd`` (from ``.buildbox``) with its local Execution service: CAS,
  ByteStream, ActionCache, Capabilities, Execution and Operations. Actions run under ``buildbox-run`` (bubblewrap)
  in a sandbox whose root is the action's input root, with the host's ``/usr`` (and ``/bin``, ``/lib``,
  ``/lib64``) bound read-only into it, so that host tools such as ``/usr/lib/llvm-19/bin/clang`` run by absolute
  path; nothing else of the host (``/work``, ``/home``, ``/etc``...) is visible.

``./scripts/bootstrap`` installs both. A missing server is an error (:class:`ServerToolMissing`), never a skip.
A server can be stopped and started again on the same port (the fault tests stop one mid-build); its log (all
runs, appended) is in its directory and is quoted when it does not come up.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Self

import grpc
from buildgrid.common.protos.build.bazel.remote.execution.v2 import remote_execution_pb2, remote_execution_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_INSTANCE = "main"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0

# The host directories bound read-only into buildbox-run's sandbox (those that exist; a symbolic link such as
# Debian's /bin -> usr/bin is bound from its target, which bubblewrap needs).
SANDBOX_HOST_PATHS = ("/usr", "/bin", "/lib", "/lib64")


class ServerToolMissing(RuntimeError):
    """A server program the tests need is not installed."""


def _executable(path: Path, what: str) -> Path:
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ServerToolMissing(f"{what} {path} is missing: run ./scripts/bootstrap, which installs it")
    return path


def bgd_path() -> Path:
    """BuildGrid's ``bgd``: ``$OFFLOAD_TEST_BGD``, else ``.venv-buildgrid/bin/bgd``."""
    override = os.environ.get("OFFLOAD_TEST_BGD")
    path = Path(override) if override else REPO_ROOT / ".venv-buildgrid" / "bin" / "bgd"
    return _executable(path, "BuildGrid's bgd")


def buildbox_dir() -> Path:
    """The directory with ``buildbox-casd`` and ``buildbox-run``: ``$OFFLOAD_TEST_BUILDBOX_DIR``, else ``.buildbox``."""
    override = os.environ.get("OFFLOAD_TEST_BUILDBOX_DIR")
    return Path(override) if override else REPO_ROOT / ".buildbox"


def casd_path() -> Path:
    return _executable(buildbox_dir() / "buildbox-casd", "buildbox-casd")


def buildbox_run_path() -> Path:
    return _executable(buildbox_dir() / "buildbox-run", "buildbox-run (the bubblewrap runner)")


def bwrap_path() -> Path:
    found = shutil.which("bwrap")
    if not found:
        raise ServerToolMissing("bubblewrap (bwrap) is not on PATH: run ./scripts/bootstrap, which installs it")
    return Path(found)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def port_is_free(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:``port`` (as servers do, past connections in TIME_WAIT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class _Server:
    """A REAPI server child process on ``127.0.0.1:port``; subclasses say how to run it."""

    name = "server"

    def __init__(self, directory: Path, instance: str = DEFAULT_INSTANCE, port: int | None = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.instance = instance
        self.port = port if port is not None else free_port()
        self.log_path = self.directory / f"{self.name}.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        """The gRPC target (``127.0.0.1:PORT``), what ``grpc.insecure_channel`` takes."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"grpc://{self.target}"

    @property
    def remote(self) -> str:
        """``grpc://127.0.0.1:PORT/INSTANCE``: the URL with the instance name, the form ``$OFFLOAD_REMOTE`` takes."""
        return f"{self.url}/{self.instance}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int:
        """The running server's process id (a test may kill it as a crash would)."""
        assert self._process is not None, f"{self} is not running"
        return self._process.pid

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start the server and wait until it answers GetCapabilities for its instance."""
        if self.running:
            return
        # Else another server's answer would pass for this one's (a gRPC server of ours would fail to bind, but
        # SO_REUSEPORT, gRPC's default, lets two share a port).
        if not port_is_free(self.port):
            raise RuntimeError(f"cannot start {self.name} on {self.url}: something else listens on port {self.port}")
        command = self.command()
        with self.log_path.open("ab") as log:
            log.write(f"\n=== {time.strftime('%H:%M:%S')} starting: {' '.join(command)}\n".encode())
            log.flush()
            self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             cwd=self.directory, env=self.environment(), start_new_session=True)
        try:
            self._wait_until_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_until_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last_error = "no answer yet"
        # gRPC waits 1 s (and more) before it reconnects after a refused connection: poll faster than that.
        options = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.min_reconnect_backoff_ms", 50),
                   ("grpc.max_reconnect_backoff_ms", 200)]
        with grpc.insecure_channel(self.target, options=options) as channel:
            stub = remote_execution_pb2_grpc.CapabilitiesStub(channel)
            while True:
                assert self._process is not None
                code = self._process.poll()
                if code is not None:
                    raise RuntimeError(f"{self.name} exited with status {code} before answering on {self.url}; "
                                       f"its log ({self.log_path}):\n{self.log()[-6000:]}")
                try:
                    stub.GetCapabilities(remote_execution_pb2.GetCapabilitiesRequest(instance_name=self.instance),
                                         timeout=2.0)
                    return
                except grpc.RpcError as error:
                    last_error = f"{error.code()}: {error.details()}"
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} did not answer GetCapabilities on {self.url} (instance "
                                       f"{self.instance!r}) within {timeout:.0f} s (last: {last_error}); its log "
                                       f"({self.log_path}):\n{self.log()[-6000:]}")
                time.sleep(0.1)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL); :meth:`start` runs it again on the same port."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def kill(self) -> None:
        """Stop the server at once (SIGKILL): a crash, not a shutdown."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url}, instance={self.instance!r})"


BUILDGRID_CONFIG = """\
# BuildGrid {version} test server: CAS, ByteStream and ActionCache over one store (in-memory LRU, or on disk);
# the Capabilities service comes with them. Loopback only; by default no TLS and no authorization.
server:
  - !channel
    address: "127.0.0.1:{port}"
{channel}

{authorization}

# gRPC's default SO_REUSEPORT would let a second server share the port silently.
grpc-server-options:
  grpc.so_reuseport: 0

storages:
{storage}

caches:
  - !lru-action-cache &action-cache
    storage: *cas-storage
    max-cached-refs: 100000
    allow-updates: true
    cache-failed-actions: true

instances:
  - name: "{instance}"
    services:
      - !cas
        storage: *cas-storage
      - !bytestream
        storage: *cas-storage
      - !action-cache
        cache: *action-cache

thread-pool-size: 16
"""


#: The channel and authorization sections of a plain test server.
INSECURE_CHANNEL = "    insecure-mode: true"
NO_AUTHORIZATION = "authorization:\n  method: none"


def buildgrid_config(port: int, instance: str = DEFAULT_INSTANCE, storage: str = "", channel: str = INSECURE_CHANNEL,
                     authorization: str = NO_AUTHORIZATION) -> str:
    """BuildGrid's configuration (:data:`BUILDGRID_CONFIG`); ``channel`` and ``authorization`` as YAML lines (TLS
    files, JWT settings), ``storage`` a storage entry (default: in-memory LRU of 1 GiB)."""
    return BUILDGRID_CONFIG.format(version="0.4.4", port=port, instance=instance, channel=channel,
                                   authorization=authorization,
                                   storage=storage or "  - !lru-storage &cas-storage\n    size: 1024M")


class BuildGridServer(_Server):
    """BuildGrid with an in-memory CAS and ActionCache; a restart starts it empty."""

    name = "buildgrid"

    def __init__(self, directory: Path, instance: str = DEFAULT_INSTANCE, port: int | None = None,
                 cas_size: str = "1024M", disk: bool = False) -> None:
        super().__init__(directory, instance, port)
        self.cas_size = cas_size
        #: CAS blobs as files under ``cas_path`` (``!disk-storage``, which serves what it reads unchecked, as a
        #: disk that rots would): the corrupted-blob tests damage one.
        self.disk = disk
        self.cas_path = self.directory / "cas"
        self.config_path = self.directory / "buildgrid.yml"

    def blob_path(self, digest_hash: str) -> Path:
        """Where ``!disk-storage`` keeps the blob of this SHA-256."""
        return self.cas_path / "cas" / "objects" / digest_hash[:2] / digest_hash[2:]

    def command(self) -> list[str]:
        self.config_path.write_text(buildgrid_config(self.port, self.instance, self._storage()))
        return [str(bgd_path()), "server", "start", str(self.config_path)]

    def _storage(self) -> str:
        if self.disk:
            return f"  - !disk-storage &cas-storage\n    path: {self.cas_path}"
        return f"  - !lru-storage &cas-storage\n    size: {self.cas_size}"


class ExecutionServer(_Server):
    """buildbox-casd with a local Execution service (buildbox-run, bubblewrap). Its CAS and ActionCache are on
    disk (``cache/``) and survive a restart."""

    name = "buildbox-casd"

    def __init__(self, directory: Path, instance: str = DEFAULT_INSTANCE, port: int | None = None,
                 jobs: int = 2, host_paths: tuple[str, ...] = SANDBOX_HOST_PATHS) -> None:
        super().__init__(directory, instance, port)
        self.jobs = jobs
        self.host_paths = host_paths
        self.cache_dir = self.directory / "cache"

    def command(self) -> list[str]:
        bwrap_path()
        command = [str(casd_path()), f"--bind={self.target}", f"--local-server-instance={self.instance}",
                   f"--buildbox-run={buildbox_run_path()}", f"--jobs={self.jobs}", "--log-level=info",
                   # The runner talks to this casd only: no retries (by default 4, backing off from 1 s), which on
                   # a stop mid-action would hold casd's shutdown ~9 s while the runner tries to upload the
                   # killed command's stdout.
                   "--runner-arg=--retry-limit=0"]
        for path in self.host_paths:
            if os.path.exists(path):
                command.append(f"--runner-arg=--ro-bind-mount={os.path.realpath(path)}:{path}")
        return [*command, str(self.cache_dir)]

    def environment(self) -> dict[str, str]:
        # casd looks for buildbox-fuse on PATH (to stage inputs with FUSE); an unreadable PATH entry such as
        # another user's home is a fatal error for it, and a FUSE stager found elsewhere is not one we chose.
        return {**os.environ, "PATH": f"{buildbox_dir()}:/usr/local/bin:/usr/bin:/bin"}


def start_buildgrid(directory: Path, instance: str = DEFAULT_INSTANCE, disk: bool = False) -> BuildGridServer:
    """A started BuildGrid server (CAS, ByteStream, ActionCache) logging into ``directory``."""
    server = BuildGridServer(directory, instance, disk=disk)
    server.start()
    return server


def start_buildbox_casd(directory: Path, instance: str = DEFAULT_INSTANCE) -> ExecutionServer:
    """A started buildbox-casd with local execution, its cache and log in ``directory``."""
    server = ExecutionServer(directory, instance)
    server.start()
    return server
