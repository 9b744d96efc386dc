"""``offload-cache``'s second level: the REAPI cache of ``$OFFLOAD_REMOTE`` (offload_builders.launcher.remote_level),
against a real BuildGrid on loopback and the real Clang 19 driver.

Two caches stand for two machines sharing one server (the same checkout, two build trees, as CMake builds it:
sources by absolute path, objects relatively). Processes are counted from an exec trace (``strace -ff``), as in
``test_offload_cache.py``; every object and dependency file is compared with the driver's own.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import LLVM19_BIN, which_or_fail
from test_process_counts import Process, read_trace

CLANGXX = str(LLVM19_BIN / "clang++")
LAUNCHER = [sys.executable, "-m", "offload_builders.cli.cache"]

KERNEL = """\
#include "kernel.h"
int kernel(int n) {
  int sum = 0;
#pragma omp target map(tofrom: sum)
  for (int i = 0; i < n; ++i) sum += i * SCALE;
  return sum;
}
"""


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A source with a target region and a header, and two build trees of it."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "kernel.cpp").write_text(KERNEL)
    (src / "kernel.h").write_text("#define SCALE 2\n")
    for build in ("build1", "build2", "build3"):
        (tmp_path / build / "obj").mkdir(parents=True)
    return tmp_path


def flags(checkout: Path, archs: str = "gfx90a") -> list[str]:
    return ["-fopenmp", f"--offload-arch={archs}", "-nogpulib", "-O2", "-MD", "-MT", "obj/kernel.o", "-MF",
            "obj/kernel.d", "-c", str(checkout / "src" / "kernel.cpp"), "-o", "obj/kernel.o"]


def machine(checkout: Path, name: str, remote: str | None, **settings: str) -> dict[str, str]:
    """The environment of one "machine": its own cache, the server (None: no $OFFLOAD_REMOTE)."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("OFFLOAD_CACHE_", "OFFLOAD_REMOTE"))}
    env.update(OFFLOAD_CACHE_DIR=str(checkout / f"cache-{name}"), **settings)
    if remote is not None:
        env["OFFLOAD_REMOTE"] = remote
    return env


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)


def launch(checkout: Path, build: str, env: dict[str, str], archs: str = "gfx90a") -> str:
    """Compile through the launcher in ``build``; its stderr."""
    done = run([*LAUNCHER, CLANGXX, *flags(checkout, archs)], checkout / build, env)
    assert done.returncode == 0, done.stderr
    return done.stderr


def traced(checkout: Path, build: str, env: dict[str, str], name: str, archs: str = "gfx90a"
           ) -> tuple[list[Process], str]:
    """:func:`launch` under ``strace -ff``: every process started, and the launcher's stderr."""
    prefix = checkout / "traces" / name / "t"
    prefix.parent.mkdir(parents=True)
    done = run([which_or_fail("strace"), "-ff", "-qq", "-v", "-s", "65536", "-e", "trace=execve", "-e",
                "status=successful", "-e", "signal=none", "-o", str(prefix), *LAUNCHER, CLANGXX,
                *flags(checkout, archs)], checkout / build, env)
    assert done.returncode == 0, done.stderr
    return read_trace(prefix), done.stderr


def assert_drivers(checkout: Path, build: str, archs: str = "gfx90a") -> None:
    """The object and dependency file in ``build`` are the driver's for the same command, byte for byte."""
    obj, deps = checkout / build / "obj" / "kernel.o", checkout / build / "obj" / "kernel.d"
    ours = (obj.read_bytes(), deps.read_bytes())
    assert not list((checkout / build / "obj").glob("*.partial"))
    driver = subprocess.run([CLANGXX, *flags(checkout, archs)], cwd=checkout / build, capture_output=True, text=True)
    assert driver.returncode == 0, driver.stderr
    assert (obj.read_bytes(), deps.read_bytes()) == ours, "the launcher's object or depfile is not the driver's"


def stats(env: dict[str, str]) -> dict[str, str]:
    shown = run([*LAUNCHER, "--show-stats"], Path.cwd(), env).stdout
    return {line[:20].strip(): line[20:].strip() for line in shown.splitlines()}


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("offload-cache: warning:")]


def compiles(processes: list[Process]) -> list[Process]:
    return [p for p in processes if "-cc1" in p.argv]


def device_targets(processes: list[Process]) -> list[str | None]:
    return [p.option("-target-cpu") for p in compiles(processes) if "-fopenmp-is-target-device" in p.argv]


def remote_action(checkout: Path, build: str, env: dict[str, str], what: str, archs: str = "gfx90a"):
    """The REAPI action under which the second level keeps the command's file lists (``what``: "file-lists") or
    its ``-###`` record ("-###"), named as offload_builders.launcher.remote_level names them."""
    from offload_builders.launcher.keys import command_key
    from offload_builders.launcher.remote_level import OUTPUT, REMOTE_SCHEME
    from offload_builders.remote.actions import NodeJob, cache_key

    base = command_key(CLANGXX, flags(checkout, archs), str(checkout / build), env)
    step = f"offload-cache file-lists {base.hex()}" if what == "file-lists" else \
        f"offload-cache entry {base.copy().add('-###').hex()}"
    return cache_key(NodeJob(root="", steps=(step,), inputs={}, salt_lines=(REMOTE_SCHEME,), outputs=(OUTPUT,)))


def server_holds_lists(server, checkout: Path, build: str, env: dict[str, str]) -> bool:
    """Whether the server holds file lists for the command's key: asked directly."""
    from offload_builders.remote.client import RemoteClient, RemoteSettings

    with RemoteClient(RemoteSettings.from_url(server.remote, {})) as client:
        return client.get_action_result(remote_action(checkout, build, env, "file-lists").action_digest) is not None


def entries(env: dict[str, str]) -> list[str]:
    """The entries of a machine's cache directory."""
    root = Path(env["OFFLOAD_CACHE_DIR"])
    return [entry.name for shard in root.iterdir() if len(shard.name) == 2 for entry in shard.iterdir()]


def test_a_second_cache_gets_the_whole_command_from_the_server(checkout, buildgrid):
    a = machine(checkout, "a", buildgrid.remote)
    b = machine(checkout, "b", buildgrid.remote)
    assert not warnings(launch(checkout, "build1", a))
    processes, stderr = traced(checkout, "build2", b, "b")
    assert not warnings(stderr), stderr
    assert compiles(processes) == [] and not [p for p in processes if p.program == "clang-offload-packager"]
    assert (checkout / "build2/obj/kernel.o").read_bytes() == (checkout / "build1/obj/kernel.o").read_bytes()
    assert_drivers(checkout, "build2")
    counts = stats(b)
    assert (counts["hits"], counts["remote hits"], counts["misses"]) == ("1", "1", "0")
    assert stats(a)["remote hits"] == "0"
    # downloaded into B's store: the next compile there is a local hit, though the server is gone
    buildgrid.stop()
    processes, stderr = traced(checkout, "build2", b, "b-again")
    assert compiles(processes) == [] and not warnings(stderr), stderr
    assert (stats(b)["hits"], stats(b)["remote hits"]) == ("2", "1")
    assert_drivers(checkout, "build2")


def test_a_target_added_on_a_second_cache_takes_the_old_targets_jobs_from_the_server(checkout, buildgrid):
    a = machine(checkout, "a", buildgrid.remote)
    b = machine(checkout, "b", buildgrid.remote)
    launch(checkout, "build1", a, "gfx90a")
    processes, stderr = traced(checkout, "build2", b, "b", "gfx90a,gfx1030")
    assert not warnings(stderr), stderr
    host_front_end = [p for p in compiles(processes) if "-emit-llvm-bc" in p.argv
                      and "-fopenmp-is-target-device" not in p.argv]
    assert device_targets(processes) == ["gfx1030"] and host_front_end == []
    assert_drivers(checkout, "build2", "gfx90a,gfx1030")
    counts = stats(b)
    assert (counts["misses"], counts["remote hits"]) == ("1", "2")  # the host front end, gfx90a's device compile


def test_a_server_that_is_down_is_one_warning_and_a_local_compile(checkout):
    from remote_servers import free_port

    down = machine(checkout, "a", f"grpc://127.0.0.1:{free_port()}/main")
    stderr = launch(checkout, "build1", down, "gfx90a,gfx1030")
    (warning,) = warnings(stderr)
    assert "remote" in warning and "127.0.0.1" in warning, stderr
    assert_drivers(checkout, "build1", "gfx90a,gfx1030")
    counts = stats(down)
    assert (counts["misses"], counts["stores"], counts["remote hits"]) == ("1", "7", "0")
    # the local cache works as without a server: a hit asks nothing
    processes, stderr = traced(checkout, "build1", down, "hit", "gfx90a,gfx1030")
    assert compiles(processes) == [] and not warnings(stderr), stderr
    assert stats(down)["hits"] == "1"


def test_a_read_only_cache_fetches_but_uploads_nothing(checkout, buildgrid):
    shared = machine(checkout, "shared", buildgrid.remote, OFFLOAD_CACHE_READONLY="1")
    reader = machine(checkout, "reader", buildgrid.remote, OFFLOAD_CACHE_READONLY="1")
    for env in (shared, reader):  # a read-only cache is one that exists: made (empty) first
        assert run([*LAUNCHER, "--zero-stats"], checkout, {**env, "OFFLOAD_CACHE_READONLY": "0"}).returncode == 0
    assert not warnings(launch(checkout, "build1", shared))
    assert_drivers(checkout, "build1")
    assert stats(shared)["stores"] == "0" and entries(shared) == []
    assert not server_holds_lists(buildgrid, checkout, "build1", shared)
    # nothing reached the server: a second, empty cache compiles every job
    writer = machine(checkout, "writer", buildgrid.remote)
    processes, stderr = traced(checkout, "build2", writer, "writer")
    assert len(compiles(processes)) == 3 and not warnings(stderr), stderr  # host, gfx90a, the embedding back end
    assert stats(writer)["remote hits"] == "0"
    assert server_holds_lists(buildgrid, checkout, "build2", writer)
    # what that one uploaded, a read-only cache gets, holding it in no file of its own
    processes, stderr = traced(checkout, "build3", reader, "reader")
    assert compiles(processes) == [] and not warnings(stderr), stderr
    assert_drivers(checkout, "build3")
    assert (stats(reader)["hits"], stats(reader)["remote hits"]) == ("1", "1") and entries(reader) == []


def test_recache_fetches_nothing(checkout, buildgrid):
    a = machine(checkout, "a", buildgrid.remote)
    launch(checkout, "build1", a)
    b = machine(checkout, "b", buildgrid.remote, OFFLOAD_CACHE_RECACHE="1")
    processes, stderr = traced(checkout, "build2", b, "b")
    assert len(compiles(processes)) == 3 and not warnings(stderr), stderr
    assert_drivers(checkout, "build2")
    assert stats(b)["remote hits"] == "0"


def test_an_entry_the_server_holds_damaged_is_a_warning_and_a_miss(checkout, buildgrid):
    from offload_builders.remote.cache import RemoteCache

    a = machine(checkout, "a", buildgrid.remote)
    garbage = checkout / "garbage"
    garbage.write_bytes(b"offload-cache-pack 1\n99\nnot a manifest")
    said: list[str] = []
    server = RemoteCache(buildgrid.remote, {}, said.append)
    server.store(remote_action(checkout, "build1", a, "-###"), {"entry": str(garbage)})
    assert server.counts["stored"] == 1, said
    stderr = launch(checkout, "build1", a)
    (warning,) = warnings(stderr)
    assert "not a packed cache entry" in warning, stderr
    assert_drivers(checkout, "build1")
    # the store that followed replaced it
    from offload_builders.remote.client import RemoteClient, RemoteSettings, from_proto
    from offload_builders.remote.digests import digest_of_file

    with RemoteClient(RemoteSettings.from_url(buildgrid.remote, {})) as client:
        result = client.get_action_result(remote_action(checkout, "build1", a, "-###").action_digest)
    assert result is not None and [entry.path for entry in result.output_files] == ["entry"]
    assert from_proto(result.output_files[0].digest) != digest_of_file(str(garbage))


def _imported(stderr: str) -> set[str]:
    """The modules ``python -X importtime`` says it imported."""
    return {line.split("|")[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")} - {
        "imported package"}


def test_a_local_hit_asks_no_server_and_imports_nothing_more(checkout, buildgrid):
    a = machine(checkout, "a", buildgrid.remote)
    launch(checkout, "build1", a)
    buildgrid.stop()  # a hit that asked it would warn
    argv = [sys.executable, "-X", "importtime", *LAUNCHER[1:], CLANGXX, *flags(checkout)]
    with_remote = run(argv, checkout / "build1", a)
    assert with_remote.returncode == 0 and not warnings(with_remote.stderr), with_remote.stderr
    without = run(argv, checkout / "build1", machine(checkout, "a", None))
    assert without.returncode == 0 and not warnings(without.stderr), without.stderr
    assert stats(a)["hits"] == "2"
    imported = _imported(with_remote.stderr)
    assert imported == _imported(without.stderr)
    assert "offload_builders.launcher.store" in imported
    assert not {name for name in imported if name.startswith(("offload_builders.remote", "grpc", "google"))
                or name == "offload_builders.launcher.remote_level"}
    assert_drivers(checkout, "build1")


def test_a_packed_entry_unpacks_whole_or_not_at_all(tmp_path):
    from offload_builders.launcher import store as store_module

    (tmp_path / "out").write_bytes(b"object" * 1000)
    (tmp_path / "stderr").write_bytes(b"warning\n")
    pack = tmp_path / "pack"
    store_module._pack({"out": str(tmp_path / "out"), "stderr": str(tmp_path / "stderr")}, b"meta", str(pack))
    (tmp_path / "whole").mkdir()
    written = store_module._unpack(str(pack), str(tmp_path / "whole"))
    assert written == sum(path.stat().st_size for path in (tmp_path / "whole").iterdir())
    assert sorted(path.name for path in (tmp_path / "whole").iterdir()) == ["@manifest", "out", "stderr"]
    entry, _, found = store_module._open_entry(str(tmp_path / "whole"), "k" * 16, mark_used=False)
    assert found == "entry" and entry is not None
    with entry:
        assert (entry.read("out"), entry.read("stderr"), entry.meta) == (b"object" * 1000, b"warning\n", b"meta")
    data = pack.read_bytes()
    bad_name = data.replace(b" stderr\n", b" std/rr\n", 1)
    for damaged in (data[:-1], data + b"x", bad_name, b"offload-cache-pack 1\n" + data[21:].replace(b"\n", b"x", 1),
                    b"something else"):
        pack.write_bytes(damaged)
        target = tmp_path / f"damaged{len(list(tmp_path.iterdir()))}"
        target.mkdir()
        with pytest.raises(ValueError):
            store_module._unpack(str(pack), str(target))
