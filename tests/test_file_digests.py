"""The per-user memo of outside files' digests (offload_builders.remote.file_digests), on real files: a later process
reads a file's digest from it only while the file's stat identity is the one recorded."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from offload_builders.remote import actions, file_digests
from offload_builders.remote.digests import digest_of_file


@pytest.fixture(scope="module")
def settled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Files written more than the racy margin ago (so recorded), made once for the module."""
    directory = tmp_path_factory.mktemp("settled")
    (directory / "big.bin").write_bytes(os.urandom(3 << 20))
    for index in range(6):
        (directory / f"small{index}.txt").write_text(f"file {index}\n")
    time.sleep(file_digests.RACY_SECONDS + 0.2)
    return directory


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh per-user cache for this process and its children; the process's memos forgotten."""
    directory = tmp_path / "cache"
    monkeypatch.setenv("OFFLOAD_BUILDERS_CACHE_DIR", str(directory))
    monkeypatch.setattr(file_digests, "_MEMO", [])
    monkeypatch.setattr(actions, "_RUNPATH_LIBRARIES", {})
    return directory


def _entries(cache: Path) -> list[Path]:
    memo = cache / file_digests.DIRECTORY
    return sorted(path for path in memo.iterdir() if not path.name.startswith(".")) if memo.is_dir() else []


def _line_in_new_process(path: str) -> str:
    code = ("import sys; from offload_builders.remote.actions import PERSISTENT_DIGESTS, outside_file_line;"
            "print(outside_file_line(sys.argv[1], PERSISTENT_DIGESTS))")
    return subprocess.run([sys.executable, "-c", code, path], check=True, capture_output=True, text=True).stdout[:-1]


def _no_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(stream: object) -> None:
        raise AssertionError("hashed, not taken from the memo")

    monkeypatch.setattr(file_digests, "digest_of_stream", refuse)


def test_a_later_process_takes_the_recorded_digest(settled: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    big = str(settled / "big.bin")
    line = _line_in_new_process(big)
    assert line == actions.outside_file_line(big, actions.ContentDigests())  # the same line as without the memo
    assert len(_entries(cache)) == 1
    _no_hashing(monkeypatch)
    assert actions.outside_file_line(big, actions.ContentDigests(persistent=True)) == line


def test_same_size_and_mtime_but_new_content_is_hashed_again(tmp_path: Path, settled: Path, cache: Path) -> None:
    path = tmp_path / "big.bin"
    shutil.copy2(settled / "big.bin", path)
    old = os.stat(path)
    os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns - 10**10))
    time.sleep(file_digests.RACY_SECONDS + 0.2)
    before = os.stat(path)
    first = actions.ContentDigests(persistent=True)(str(path))
    assert first == digest_of_file(path) and len(_entries(cache)) == 1
    data = bytearray(path.read_bytes())
    data[:16] = bytes(byte ^ 0xFF for byte in data[:16])
    path.write_bytes(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    second = actions.ContentDigests(persistent=True)(str(path))
    assert second == digest_of_file(path) != first


def test_a_damaged_entry_is_a_miss_and_is_rewritten(settled: Path, cache: Path) -> None:
    small = str(settled / "small0.txt")
    assert file_digests.content_digest(small) == digest_of_file(small)
    (entry,) = _entries(cache)
    entry.write_text('{"version": 1, "path": ')
    assert file_digests.content_digest(small) == digest_of_file(small)
    assert json.loads(entry.read_text())["path"] == small
    entry.write_text(json.dumps({"version": 1, "path": small, "stamp": "x", "values": {"digest": ["00", 1]}}))
    assert file_digests.content_digest(small) == digest_of_file(small)


def test_a_file_written_just_now_is_not_recorded(tmp_path: Path, cache: Path) -> None:
    fresh = tmp_path / "fresh.txt"
    fresh.write_text("still being written\n")
    assert file_digests.content_digest(str(fresh)) == digest_of_file(fresh)
    assert _entries(cache) == []


def test_the_cap_drops_the_oldest_entries(settled: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_digests, "MAX_ENTRIES", 4)
    file_digests.content_digest(str(settled / "small0.txt"))  # makes the directory
    memo = cache / file_digests.DIRECTORY
    now = time.time_ns()
    for index in range(8):
        old = memo / f"{index:032x}"
        old.write_text("{}")
        os.utime(old, ns=(now - (100 - index) * 10**9, now - (100 - index) * 10**9))
    monkeypatch.setattr(file_digests, "_MEMO", [])  # a new process: prunes once
    file_digests.content_digest(str(settled / "small1.txt"))
    kept = {path.name for path in _entries(cache)}
    assert len(kept) == 4
    assert {f"{index:032x}" for index in (6, 7)} <= kept  # the newest of the old ones, and the two recorded now


def test_a_directory_others_may_write_turns_the_memo_off(settled: Path, cache: Path) -> None:
    memo = cache / file_digests.DIRECTORY
    memo.mkdir(parents=True, mode=0o700)
    memo.chmod(0o777)
    small = str(settled / "small2.txt")
    assert file_digests.memo() is None
    assert file_digests.content_digest(small) == digest_of_file(small)
    assert list(memo.iterdir()) == []


def test_a_program_with_a_run_path_keys_as_without_the_memo(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    program = next((path for path in ("/usr/lib/llvm-19/bin/ld.lld", "/usr/lib/llvm-19/bin/llvm-nm")
                    if os.path.isfile(path)), os.path.realpath(sys.executable))
    if time.time() - max(os.stat(program).st_mtime, os.stat(program).st_ctime) < file_digests.RACY_SECONDS + 1:
        pytest.skip("the program was just installed")
    plain = actions.outside_file_line(program, actions.ContentDigests())
    line = _line_in_new_process(program)
    assert line == plain
    _no_hashing(monkeypatch)

    def refuse(stream: object) -> None:
        raise AssertionError("parsed, not taken from the memo")

    monkeypatch.setattr(actions, "_dynamic_entries", refuse)
    if "  loads " in plain:
        monkeypatch.setattr(actions, "_build_id", refuse)
    assert actions.outside_file_line(program, actions.ContentDigests(persistent=True)) == plain
