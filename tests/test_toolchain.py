"""Toolchain discovery against the installed Clang 19."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from offload_builders.errors import ToolchainError
from offload_builders.toolchain import find_toolchain


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


def test_missing_sibling_tool_names_its_package(tmp_path):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    fake_clang = fake_bin / "clang"
    fake_clang.write_text('#!/bin/sh\nexec /usr/lib/llvm-19/bin/clang "$@"\n')
    fake_clang.chmod(fake_clang.stat().st_mode | stat.S_IEXEC)
    toolchain = find_toolchain({"OFFLOAD_CLANG": str(fake_clang), "PATH": ""})
    with pytest.raises(ToolchainError, match=r"clang-offload-packager not found .*apt-get install clang-tools-19"):
        toolchain.tool("clang-offload-packager")


def test_missing_ptxas_is_explained(tmp_path):
    toolchain = find_toolchain({"OFFLOAD_CLANG": "/usr/lib/llvm-19/bin/clang", "CUDA_PATH": str(tmp_path), "PATH": ""})
    with pytest.raises(ToolchainError, match=r"ptxas is needed for NVPTX targets.*CUDA toolkit"):
        toolchain.cuda_tool("ptxas")


def _probe_in_child(env: dict[str, str], clang: Path) -> None:
    import subprocess
    import sys

    code = ("from offload_builders.toolchain import find_toolchain; "
            f"t = find_toolchain({{'OFFLOAD_CLANG': {str(clang)!r}, 'PATH': ''}}); print(t.version, t.resource_dir)")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.startswith("(19, "), done.stdout


def test_version_probe_is_kept_across_processes_until_the_binary_changes(tmp_path):
    """Each SCons run and each offload-link would otherwise start two clang processes to learn the version."""
    log = tmp_path / "calls"
    clang = tmp_path / "bin" / "clang"
    clang.parent.mkdir()
    clang.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec /usr/lib/llvm-19/bin/clang "$@"\n')
    clang.chmod(0o755)
    env = dict(os.environ, OFFLOAD_BUILDERS_CACHE_DIR=str(tmp_path / "cache"))
    _probe_in_child(env, clang)
    assert log.read_text().split() == ["--version", "-print-resource-dir"]
    assert (tmp_path / "cache" / "toolchains.json").is_file()
    _probe_in_child(env, clang)
    assert log.read_text().split() == ["--version", "-print-resource-dir"]  # answered from the cache
    clang.write_text(clang.read_text() + "# upgraded\n")  # a new binary: new size and mtime
    _probe_in_child(env, clang)
    assert log.read_text().split() == ["--version", "-print-resource-dir"] * 2
    _probe_in_child(dict(env, OFFLOAD_BUILDERS_CACHE_DIR=""), clang)  # the cache turned off
    assert log.read_text().split() == ["--version", "-print-resource-dir"] * 3


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

    (tmp_path / "c.json").write_text('{"number": 5, "text": "abc", "nested": [[1, 2]], "good": [["a", "b"]]}')
    cache = ProbeCache(tmp_path / "c.json")
    assert [cache.get(k) for k in ("number", "text", "nested", "missing")] == [None] * 4
    assert cache.get("good") == (("a", "b"),)
    (tmp_path / "d.json").write_text("{not json")
    assert ProbeCache(tmp_path / "d.json").get("good") is None


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
