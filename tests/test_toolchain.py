"""Toolchain discovery against the installed Clang 19."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from offload_builders.errors import ToolchainError
from offload_builders.toolchain import CACHE_FORMAT, find_toolchain

LLVM = Path("/usr/lib/llvm-19")


def stored(key: str) -> str:
    """``key`` as a cache file holds it: with the entries' layout (:data:`CACHE_FORMAT`)."""
    return f"v{CACHE_FORMAT}:{key}"


def test_finds_clang_19_and_its_tools():
    toolchain = find_toolchain({"PATH": os.environ["PATH"]})
    assert toolchain.major == 19
    assert (toolchain.resource_dir / "include" / "omp.h").exists() or (toolchain.resource_dir / "include").is_dir()
    assert toolchain.tool("clang-offload-packager").name == "clang-offload-packager"
    assert toolchain.runtime_library("libomptarget.devicertl.a").is_file()
    assert toolchain.cuda_tool("ptxas").name == "ptxas"


def test_offload_clang_variable_wins():
    toolchain = find_toolchain({"OFFLOAD_CLANG": "/usr/lib/llvm-19/bin/clang", "PATH": ""})
    assert toolchain.clang == Path("/usr/lib/llvm-19/bin/clang")
    assert toolchain.clangxx.name == "clang++"


def test_missing_clang_names_what_and_the_packages():
    with pytest.raises(ToolchainError) as error:
        find_toolchain({"OFFLOAD_CLANG": "/nonexistent/clang", "PATH": ""})
    message = str(error.value)
    assert "/nonexistent/clang ($OFFLOAD_CLANG)" in message
    assert "apt-get install clang-19 clang-tools-19" in message


def _script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def _installed_copy(directory: Path) -> Path:
    """A copy of clang 19 in ``directory`` (132 kB: the code is in libclang-cpp), whose InstalledDir it is."""
    directory.mkdir(parents=True, exist_ok=True)
    copy = directory / "clang"
    shutil.copy2("/usr/lib/llvm-19/bin/clang", copy)
    return copy


def test_missing_sibling_tool_names_its_package(tmp_path):
    """The tools are looked up where the driver is installed (its InstalledDir), here a directory without them."""
    clang = _installed_copy(tmp_path / "llvm" / "bin")
    toolchain = find_toolchain({"OFFLOAD_CLANG": str(clang), "PATH": ""})
    assert toolchain.bin_dir == tmp_path / "llvm" / "bin"
    with pytest.raises(ToolchainError, match=r"clang-offload-packager not found in .*/llvm/bin \(the InstalledDir"
                                             r" of .*apt-get install clang-tools-19"):
        toolchain.tool("clang-offload-packager")
    with pytest.raises(ToolchainError, match=r"libomptarget.devicertl.a not found in .*/llvm/lib .*libomp-19-dev"):
        toolchain.runtime_library("libomptarget.devicertl.a")


def test_a_wrapper_elsewhere_finds_tools_and_runtime_where_the_driver_is(tmp_path):
    """Spack's, ccache's or a logging wrapper in another directory: the wrapper stays the compiler, the files
    come from the driver's InstalledDir (the issue: 'libomptarget.devicertl.a not found in /tmp/lib')."""
    wrap = tmp_path / "wrap" / "bin"
    clang = _script(wrap / "clang", '#!/bin/sh\nexec /usr/lib/llvm-19/bin/clang "$@"\n')
    toolchain = find_toolchain({"OFFLOAD_CLANG": str(clang), "PATH": ""})
    assert toolchain.clang == clang
    assert toolchain.bin_dir == LLVM / "bin"
    assert toolchain.lib_dir == LLVM / "lib"
    assert toolchain.resource_dir == LLVM / "lib" / "clang" / "19"
    assert toolchain.tool("clang-offload-packager") == LLVM / "bin" / "clang-offload-packager"
    assert toolchain.tool("ld.lld") == LLVM / "bin" / "ld.lld"
    assert toolchain.runtime_library("libomptarget.devicertl.a") == LLVM / "lib" / "libomptarget.devicertl.a"
    assert toolchain.clangxx == clang and toolchain.cxx_command == (str(clang), "--driver-mode=g++")

    twin = _script(wrap / "clang++", '#!/bin/sh\nexec /usr/lib/llvm-19/bin/clang++ "$@"\n')
    other = find_toolchain({"OFFLOAD_CLANG": str(clang), "PATH": "/nonexistent"})  # (not memoized)
    assert other.clangxx == twin and other.cxx_command == (str(twin),)


@pytest.mark.parametrize(("name", "twin"), [("clang-19", "clang++-19"),
                                            ("x86_64-linux-gnu-clang", "x86_64-linux-gnu-clang++"), ("mycc", None)])
def test_the_cxx_driver_of_a_wrapper(tmp_path, name, twin):
    """clang++ beside the wrapper, named as ccache's and Spack's directories pair them; else the same wrapper
    in g++ mode, which links libstdc++."""
    clang = _script(tmp_path / name, '#!/bin/sh\nexec /usr/lib/llvm-19/bin/clang "$@"\n')
    if twin:
        _script(tmp_path / twin, '#!/bin/sh\nexec /usr/lib/llvm-19/bin/clang++ "$@"\n')
    toolchain = find_toolchain({"OFFLOAD_CLANG": str(clang), "PATH": ""})
    command = toolchain.cxx_command
    assert command == ((str(tmp_path / twin),) if twin else (str(clang), "--driver-mode=g++"))
    (tmp_path / "main.o").touch()
    done = subprocess.run([*command, "-###", "main.o"], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert '"-lstdc++"' in done.stderr


def test_missing_ptxas_is_explained(tmp_path):
    toolchain = find_toolchain({"OFFLOAD_CLANG": "/usr/lib/llvm-19/bin/clang", "CUDA_PATH": str(tmp_path), "PATH": ""})
    with pytest.raises(ToolchainError, match=r"ptxas is needed for NVPTX targets.*CUDA toolkit"):
        toolchain.cuda_tool("ptxas")


def _probe_in_child(env: dict[str, str], clang: Path) -> str:
    code = ("from offload_builders.toolchain import find_toolchain; "
            f"t = find_toolchain({{'OFFLOAD_CLANG': {str(clang)!r}, 'PATH': ''}}); print(t.version, t.bin_dir)")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return done.stdout


PROBE = ["-###", "-c", "-x", "c", "/dev/null"]


def test_version_probe_is_kept_across_processes_until_the_binary_changes(tmp_path):
    """Each SCons run and each offload-link would otherwise start a clang process to learn the version."""
    log = tmp_path / "calls"
    clang = _script(tmp_path / "bin" / "clang",
                    f'#!/bin/sh\necho "$@" >> {log}\nexec /usr/lib/llvm-19/bin/clang "$@"\n')
    env = dict(os.environ, OFFLOAD_BUILDERS_CACHE_DIR=str(tmp_path / "cache"))
    found = _probe_in_child(env, clang)
    assert found.startswith("(19, ") and found.endswith(") /usr/lib/llvm-19/bin\n"), found
    assert log.read_text().split() == PROBE  # one process: version, InstalledDir and resource directory
    assert (tmp_path / "cache" / "toolchains.json").is_file()
    _probe_in_child(env, clang)
    assert log.read_text().split() == PROBE  # answered from the cache
    clang.write_text(clang.read_text() + "# upgraded\n")  # a new binary: new size and mtime
    _probe_in_child(env, clang)
    assert log.read_text().split() == PROBE * 2
    _probe_in_child(dict(env, PATH=env["PATH"] + ":/nonexistent"), clang)  # a wrapper may choose by $PATH
    assert log.read_text().split() == PROBE * 3
    _probe_in_child(dict(env, OFFLOAD_BUILDERS_CACHE_DIR=""), clang)  # the cache turned off
    assert log.read_text().split() == PROBE * 4


def test_the_compiler_behind_an_unchanged_wrapper_is_probed_again_when_it_changes(tmp_path):
    """The wrapper script stays the same while the compiler it runs is upgraded: its InstalledDir is stamped."""
    log = tmp_path / "calls"
    installed = _installed_copy(tmp_path / "llvm" / "bin")
    clang = _script(tmp_path / "wrap" / "clang", f'#!/bin/sh\necho "$@" >> {log}\nexec {installed} "$@"\n')
    env = dict(os.environ, OFFLOAD_BUILDERS_CACHE_DIR=str(tmp_path / "cache"))
    assert _probe_in_child(env, clang).endswith(f") {installed.parent}\n")
    _probe_in_child(env, clang)
    assert log.read_text().split() == PROBE
    status = installed.stat()
    os.utime(installed, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000_000))  # reinstalled
    _probe_in_child(env, clang)
    assert log.read_text().split() == PROBE * 2


def test_driver_probe_keys_of_a_wrapper_name_the_compiler_behind_it(tmp_path):
    """Phase and link probes of a wrapper are keyed by the compiler it runs, not only by the script."""
    from offload_builders import toolchain as module

    installed = _installed_copy(tmp_path / "llvm" / "bin")
    clang = _script(tmp_path / "wrap" / "clang", f'#!/bin/sh\nexec {installed} "$@"\n')

    def key() -> str:
        module._find_toolchain.cache_clear()
        module._probe_toolchain.cache_clear()
        find_toolchain({"OFFLOAD_CLANG": str(clang), "PATH": ""})
        return module.ProbeCache.key(str(clang), "c", ("-O2",), "/")

    before = key()
    assert os.path.realpath(installed) in json.loads(before.partition(":")[2])[-4:]
    status = installed.stat()
    os.utime(installed, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000_000))
    assert key() != before


def test_probe_cache_keeps_the_newest_entries(tmp_path, monkeypatch):
    from offload_builders.toolchain import ProbeCache

    monkeypatch.setattr(ProbeCache, "MAX_ENTRIES", 3)
    cache = ProbeCache(tmp_path / "c.json")
    for index in range(5):
        cache.put(f"k{index}", ((str(index),),))
    cache.put("k2", (("again",),))  # a refreshed entry counts as new
    cache.save()
    reloaded = ProbeCache(tmp_path / "c.json")
    assert [key for key in ("k0", "k1", "k2", "k3", "k4") if reloaded.get(key) is not None] == ["k2", "k3", "k4"]
    assert reloaded.get("k2") == (("again",),)


def test_a_damaged_cache_file_is_a_miss(tmp_path):
    from offload_builders.toolchain import ProbeCache

    entries = {"number": 5, "text": "abc", "nested": [[1, 2]], "good": [["a", "b"]], "nul": [["a\0"]]}
    (tmp_path / "c.json").write_text(json.dumps({stored(key): value for key, value in entries.items()}))
    cache = ProbeCache(tmp_path / "c.json")
    assert cache.get("nul") is None
    assert [cache.get(k) for k in ("number", "text", "nested", "missing")] == [None] * 4
    assert cache.get("good") == (("a", "b"),)
    (tmp_path / "d.json").write_text("{not json")
    assert ProbeCache(tmp_path / "d.json").get("good") is None
    (tmp_path / "e.json").write_text(json.dumps({"good": [["a", "b"]], "v1:good": [["a", "b"]]}))
    assert ProbeCache(tmp_path / "e.json").get("good") is None  # written in another layout


def test_probe_keys_change_when_a_gcc_version_is_installed(tmp_path, monkeypatch):
    """Cached driver jobs name GCC's crt files and headers: a GCC installed or removed is probed again."""
    from offload_builders import toolchain

    gcc = tmp_path / "gcc"
    (gcc / "x86_64-linux-gnu" / "12").mkdir(parents=True)
    monkeypatch.setattr(toolchain, "_DRIVER_SEARCHED", (str(gcc),))
    toolchain._driver_search_stamp.cache_clear()
    before = toolchain.ProbeCache.key("/usr/lib/llvm-19/bin/clang++", "host-link", ("a.o",), "/")
    assert toolchain.ProbeCache.key("/usr/lib/llvm-19/bin/clang++", "host-link", ("a.o",), "/") == before
    (gcc / "x86_64-linux-gnu" / "13").mkdir()
    toolchain._driver_search_stamp.cache_clear()
    after = toolchain.ProbeCache.key("/usr/lib/llvm-19/bin/clang++", "host-link", ("a.o",), "/")
    toolchain._driver_search_stamp.cache_clear()
    assert after != before


_SAVER = """
import sys
from offload_builders.toolchain import ProbeCache
path, prefix, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
cache = ProbeCache(path)
for index in range(count):
    cache.put(f"{prefix}{index}", ((prefix, str(index)),))
    cache.save()
"""


def test_processes_saving_one_cache_file_at_once_keep_each_others_entries(tmp_path):
    """Two projects building at once write the same per-user file: each save merges what is on disk."""
    path = tmp_path / "cache" / "shared.json"
    savers = [subprocess.Popen([sys.executable, "-c", _SAVER, str(path), prefix, "150"]) for prefix in ("a", "b")]
    assert [saver.wait() for saver in savers] == [0, 0]
    saved = json.loads(path.read_text())
    assert sorted(saved) == sorted(stored(f"{prefix}{index}") for prefix in "ab" for index in range(150))
    assert saved[stored("b7")] == [["b", "7"]]
    assert os.listdir(path.parent) == ["shared.json"]  # no temporary file left


def test_threads_saving_one_cache_file_at_once(tmp_path):
    """Two caches of one file in one process (each its own object), saved from threads."""
    import threading

    from offload_builders.toolchain import ProbeCache

    caches = [ProbeCache(tmp_path / "shared.json") for _ in range(2)]

    def fill(cache: ProbeCache, prefix: str) -> None:
        for index in range(100):
            cache.put(f"{prefix}{index}", ((prefix,),))
            cache.save()

    threads = [threading.Thread(target=fill, args=(cache, prefix)) for cache, prefix in zip(caches, "ab")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(json.loads((tmp_path / "shared.json").read_text())) == 200
    assert os.listdir(tmp_path) == ["shared.json"]


def test_a_truncated_cache_file_is_a_miss_and_is_replaced(tmp_path):
    """A file cut short (a full disk, a crash of an older version) is no error: a miss, then rewritten whole."""
    from offload_builders.toolchain import ProbeCache

    path = tmp_path / "c.json"
    first = ProbeCache(path)
    first.put("old", (("x",),))
    first.save()
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    cache = ProbeCache(path)
    assert cache.get("old") is None
    cache.put("new", (("y",),))
    path.write_text("{truncated again")  # damaged on disk between our load and our save
    cache.save()
    assert json.loads(path.read_text()) == {stored("new"): [["y"]]}


def test_a_save_that_fails_leaves_no_temporary_file(tmp_path):
    from offload_builders.toolchain import ProbeCache

    (tmp_path / "c.json").mkdir()  # the rename over it fails
    cache = ProbeCache(tmp_path / "c.json")
    cache.put("k", (("v",),))
    cache.save()  # the build goes on without the cache
    assert os.listdir(tmp_path) == ["c.json"] and os.listdir(tmp_path / "c.json") == []


_SCONSTRUCT = """
import offload_builders.scons
env = Environment(tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()], OFFLOAD_ARCHS="x86_64")
env.OffloadProgram("prog", ["main.c"])
"""

_MAIN_C = """
#include <stdio.h>
#include <omp.h>
int main(void) {
  int on_device = 0;
  #pragma omp target map(from : on_device)
  on_device = !omp_is_initial_device();
  printf("on_device=%d\\n", on_device);
  return !on_device;
}
"""


@pytest.mark.slow
def test_two_builds_at_once_share_the_per_user_caches(tmp_path):
    """Two projects building at the same time with one $OFFLOAD_BUILDERS_CACHE_DIR: both build, the files
    stay valid JSON holding both projects' driver probes, and no temporary file is left behind."""
    cache = tmp_path / "cache"
    env = dict(os.environ, OFFLOAD_BUILDERS_CACHE_DIR=str(cache))
    projects = [tmp_path / name for name in ("one", "two")]
    for index, project in enumerate(projects):
        project.mkdir()
        (project / "SConstruct").write_text(_SCONSTRUCT)
        (project / "main.c").write_text(_MAIN_C.replace("on_device=", f"project{index} on_device="))
    scons = str(Path(sys.executable).with_name("scons"))
    builds = [subprocess.Popen([scons, "-Q"], cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True) for project in projects]
    outputs = [build.communicate()[0] for build in builds]
    assert [build.returncode for build in builds] == [0, 0], outputs
    for index, project in enumerate(projects):
        run = subprocess.run([str(project / "prog")], capture_output=True, text=True, check=False,
                             env=dict(os.environ, OMP_TARGET_OFFLOAD="MANDATORY"))
        assert (run.returncode, run.stdout) == (0, f"project{index} on_device=1\n"), run.stderr
    names = sorted(os.listdir(cache))
    assert names and all(name.endswith(".json") and not name.startswith(".") for name in names), names
    contents = {name: json.loads((cache / name).read_text()) for name in names}
    assert {"toolchains.json", "driver-probes.json"} <= set(contents)
    probes = contents["driver-probes.json"]
    assert all(any(str(project) in key for key in probes) for project in projects), list(probes)
