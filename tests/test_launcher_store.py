"""offload-cache's on-disk cache (offload_builders.launcher.store): entries, eviction, statistics, trust."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time

import pytest

from offload_builders.launcher import keys, store as store_module
from offload_builders.launcher.store import CacheStore, parse_size
from offload_builders.source_identity import file_identity

KEY_A = "a1" + "0" * 30
KEY_B = "b2" + "1" * 30


@pytest.fixture(autouse=True)
def _cache_environment(monkeypatch):
    for name in ("OFFLOAD_CACHE_READONLY", "OFFLOAD_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def cache(tmp_path) -> CacheStore:
    opened = CacheStore.open(str(tmp_path / "cache"))
    assert opened is not None
    return opened


def _sources(directory, **contents: bytes) -> dict[str, str]:
    """Files to store: name -> path of a file holding ``contents[name]`` (names with '_' for '.')."""
    directory.mkdir(exist_ok=True)
    files = {}
    for name, data in contents.items():
        path = directory / name
        path.write_bytes(data)
        files[name.replace("_", ".")] = str(path)
    return files


def _entry_dir(cache: CacheStore, key: str) -> str:
    return os.path.join(cache.root, key[:2], key)


def _key(number: int) -> str:
    return f"{number:032x}"


def test_store_then_lookup_returns_bytes_and_meta(cache, tmp_path):
    meta = b"warning: diagnostics\n\x00\xffdepfile"
    assert cache.store(KEY_A, _sources(tmp_path / "src", out_o=b"object bytes", dep_d=b"a.o: a.c\n"), meta)
    entry = cache.lookup(KEY_A)
    assert entry is not None
    with entry:
        assert entry.key == KEY_A
        assert entry.meta == meta
        assert sorted(entry.names) == ["dep.d", "out.o"]
        assert entry.read("out.o") == b"object bytes"
        assert entry.read("dep.d") == b"a.o: a.c\n"
        assert entry.read("out.o") == b"object bytes"  # read again: reads by offset
        with pytest.raises(KeyError):
            entry.read("missing")
    assert cache.lookup(KEY_B) is None
    counts = cache.stats()
    assert counts["stores"] == 1 and counts["entries"] == 1
    on_disk = sum(os.path.getsize(os.path.join(_entry_dir(cache, KEY_A), name))
                  for name in os.listdir(_entry_dir(cache, KEY_A)))
    assert counts["size"] == on_disk
    assert os.listdir(os.path.join(cache.root, "tmp")) == []
    assert stat.S_IMODE(os.stat(_entry_dir(cache, KEY_A)).st_mode) == 0o700


def test_empty_entry_and_empty_meta(cache):
    assert cache.store(KEY_A, {})
    entry = cache.lookup(KEY_A)
    assert entry is not None and entry.names == () and entry.meta == b""
    entry.close()
    entry.close()


def test_second_store_keeps_the_first(cache, tmp_path):
    assert cache.store(KEY_A, _sources(tmp_path / "one", out_o=b"first"), b"1")
    assert cache.store(KEY_A, _sources(tmp_path / "two", out_o=b"second"), b"2")
    with cache.lookup(KEY_A) as entry:
        assert (entry.read("out.o"), entry.meta) == (b"first", b"1")
    assert cache.stats()["stores"] == 1
    assert os.listdir(os.path.join(cache.root, "tmp")) == []


def test_a_store_that_fails_writes_nothing(cache, tmp_path):
    assert not cache.store(KEY_A, {"out.o": str(tmp_path / "missing.o")})
    assert not os.path.exists(_entry_dir(cache, KEY_A))
    assert os.listdir(os.path.join(cache.root, "tmp")) == []
    assert cache.lookup(KEY_A) is None


def _truncate(path: str) -> None:
    with open(os.path.join(path, "out.o"), "r+b") as f:
        f.truncate(3)


def _unlink_manifest(path: str) -> None:
    os.unlink(os.path.join(path, "@manifest"))


def _garbage_manifest(path: str) -> None:
    with open(os.path.join(path, "@manifest"), "wb") as f:
        f.write(b"offload-cache-entry 1\n1\nnot-a-size out.o\n0\n")


def _extra_meta(path: str) -> None:
    with open(os.path.join(path, "@manifest"), "ab") as f:
        f.write(b"trailing")


def _unlink_file(path: str) -> None:
    os.unlink(os.path.join(path, "out.o"))


@pytest.mark.parametrize("damage", [_truncate, _unlink_manifest, _garbage_manifest, _extra_meta, _unlink_file])
def test_a_damaged_entry_is_a_miss_and_is_removed(cache, tmp_path, damage):
    assert cache.store(KEY_A, _sources(tmp_path / "src", out_o=b"object bytes"), b"meta")
    damage(_entry_dir(cache, KEY_A))
    assert cache.lookup(KEY_A) is None
    assert not os.path.exists(_entry_dir(cache, KEY_A))
    assert cache.stats()["entries"] == 0
    assert cache.store(KEY_A, _sources(tmp_path / "src", out_o=b"object bytes"), b"meta")
    with cache.lookup(KEY_A) as entry:
        assert entry.read("out.o") == b"object bytes"


def test_a_file_where_an_entry_should_be_is_a_miss(cache):
    os.mkdir(os.path.join(cache.root, KEY_A[:2]))
    with open(_entry_dir(cache, KEY_A), "wb") as f:
        f.write(b"junk")
    assert cache.lookup(KEY_A) is None
    assert not os.path.exists(_entry_dir(cache, KEY_A))


@pytest.mark.parametrize("key", ["", "abc", "A1" + "0" * 30, "g" * 32, "../" + "0" * 30, "0" * 129, "0" * 15])
def test_keys_that_are_not_lowercase_hex_are_refused(cache, tmp_path, key):
    with pytest.raises(ValueError, match="hexadecimal"):
        cache.lookup(key)
    with pytest.raises(ValueError, match="hexadecimal"):
        cache.store(key, {})


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "@manifest", "a b", "é"])
def test_file_names_outside_the_set_are_refused(cache, tmp_path, name):
    source = _sources(tmp_path / "src", out_o=b"x")["out.o"]
    with pytest.raises(ValueError, match="file name"):
        cache.store(KEY_A, {name: source})
    assert not os.path.exists(_entry_dir(cache, KEY_A))


def test_eviction_removes_least_recently_used_first_and_keeps_recent_ones(cache, tmp_path):
    sources = _sources(tmp_path / "src", out_o=b"x" * 1000)
    keys = [_key(number) for number in range(6)]
    for key in keys:
        assert cache.store(key, sources)
    now = time.time()
    # keys[0] is the oldest ... keys[4] the newest of the old; keys[5] was used 10 s ago: it must stay.
    for age, key in zip((5000, 4000, 3000, 2000, 1000, 10), keys):
        os.utime(_entry_dir(cache, key), (now - age, now - age))
    entry_size = cache.stats()["size"] // 6
    cache.set_max_size(4 * entry_size)  # 90%: 3.6 entries, so three go, the three least recently used
    freed = cache.evict()
    assert freed == 3 * entry_size
    assert [os.path.isdir(_entry_dir(cache, key)) for key in keys] == [False] * 3 + [True] * 3
    counts = cache.stats()
    assert counts["size"] == 3 * entry_size <= cache.max_size * 0.9
    assert counts["entries"] == 3 and counts["evictions"] == 3
    # Only recently used entries are left over the limit: none of them goes.
    for key in keys[3:]:
        os.utime(_entry_dir(cache, key))
    cache.set_max_size(1)
    assert cache.evict() == 0
    assert all(os.path.isdir(_entry_dir(cache, key)) for key in keys[3:])


def test_file_lists_count_in_the_size_and_the_least_recently_used_go_with_the_entries(cache, tmp_path):
    """The direct mode's file lists are within the size limit: an old key's lists are evicted as entries are (its
    next lookup is a miss), a recently used key's lists stay, and ``touch_file_lists`` is their LRU clock."""
    big = [(f"/src/header_{n}.h", "") for n in range(400)]  # a list of some kilobytes
    keys = [_key(number) for number in range(4)]
    for key in keys:
        cache.add_file_list(key, big)
    now = time.time()
    for age, key in zip((5000, 4000, 3000, 10), keys):
        path = os.path.join(cache.root, "lists", key[:2], key)
        os.utime(path, (now - age, now - age))
    cache.touch_file_lists(keys[0])  # used just now: it stays
    one = os.path.getsize(os.path.join(cache.root, "lists", keys[1][:2], keys[1]))
    cache.set_max_size(3 * one)  # 90%: 2.7 lists, so two go: keys[1] and keys[2], the least recently used
    assert cache.evict() == 2 * one
    assert [bool(cache.file_lists(key)) for key in keys] == [True, False, False, True]
    assert cache.stats()["size"] == 2 * one


def test_file_lists_stay_readable_however_many_files_a_compile_reads(cache):
    """Lists are kept under the size :meth:`file_lists` reads back: the oldest go first, so a key whose compiles
    read thousands of headers keeps its newest lists rather than losing all of them."""
    from offload_builders.launcher import store as store_module

    for number in range(8):  # about 1.3 MB each: more than the 4 MiB read limit together
        cache.add_file_list(KEY_A, [(f"/usr/include/set{number}/header_{n:05}.h", "1 2 3 4 5 " + "0" * 40)
                                    for n in range(20000)])
    lists = cache.file_lists(KEY_A)
    assert 1 <= len(lists) < 8 and lists[0][0][0].startswith("/usr/include/set7/")
    assert os.path.getsize(os.path.join(cache.root, "lists", KEY_A[:2], KEY_A)) <= store_module._MAX_FILE_LISTS_BYTES


def test_a_hit_is_the_lru_clock(cache, tmp_path):
    sources = _sources(tmp_path / "src", out_o=b"x" * 1000)
    assert cache.store(KEY_A, sources) and cache.store(KEY_B, sources)
    old = time.time() - 5000
    for key in (KEY_A, KEY_B):
        os.utime(_entry_dir(cache, key), (old, old))
    cache.lookup(KEY_A).close()  # used now: it stays, KEY_B goes
    cache.set_max_size(cache.stats()["size"] - 1)
    assert cache.evict() > 0
    assert os.path.isdir(_entry_dir(cache, KEY_A)) and not os.path.exists(_entry_dir(cache, KEY_B))


def test_a_store_over_the_limit_evicts(cache, tmp_path):
    sources = _sources(tmp_path / "src", out_o=b"x" * 1000)
    assert cache.store(KEY_A, sources)
    old = time.time() - 5000
    os.utime(_entry_dir(cache, KEY_A), (old, old))
    cache.set_max_size(cache.stats()["size"] + 100)
    assert cache.store(KEY_B, sources)
    assert not os.path.exists(_entry_dir(cache, KEY_A)) and os.path.isdir(_entry_dir(cache, KEY_B))
    assert cache.stats()["entries"] == 1


def test_eviction_removes_stale_temporary_directories(cache):
    temp = os.path.join(cache.root, "tmp")
    os.makedirs(os.path.join(temp, "store.1.stale"))
    os.makedirs(os.path.join(temp, "store.2.fresh"))
    old = time.time() - 7200
    os.utime(os.path.join(temp, "store.1.stale"), (old, old))
    cache.evict()
    assert os.listdir(temp) == ["store.2.fresh"]


def test_an_entry_evicted_while_open_can_still_be_copied_out(cache, tmp_path):
    assert cache.store(KEY_A, _sources(tmp_path / "src", out_o=b"object bytes" * 1000), b"meta")
    entry = cache.lookup(KEY_A)
    assert entry is not None
    old = time.time() - 5000
    os.utime(_entry_dir(cache, KEY_A), (old, old))
    cache.set_max_size(1)
    assert cache.evict() > 0
    assert not os.path.exists(_entry_dir(cache, KEY_A))
    destination = str(tmp_path / "out.o")
    entry.copy_to("out.o", destination)
    assert open(destination, "rb").read() == b"object bytes" * 1000
    assert entry.read("out.o") == b"object bytes" * 1000
    entry.close()
    cache.clear()  # and clearing likewise
    assert cache.store(KEY_B, _sources(tmp_path / "src", out_o=b"second"))
    with cache.lookup(KEY_B) as entry:
        cache.clear()
        assert entry.read("out.o") == b"second"


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_copy_to_is_atomic_and_takes_the_umask(cache, tmp_path, umask):
    assert cache.store(KEY_A, _sources(tmp_path / "src", out_o=b"object bytes"))
    destination = tmp_path / "build" / "out.o"
    destination.parent.mkdir()
    destination.write_bytes(b"an old object that is longer")
    (tmp_path / "build" / "out.o.partial").write_bytes(b"left by a killed launcher")
    os.chmod(tmp_path / "build" / "out.o.partial", 0o600)
    previous = os.umask(umask)
    try:
        with cache.lookup(KEY_A) as entry:
            entry.copy_to("out.o", str(destination))
    finally:
        os.umask(previous)
    assert destination.read_bytes() == b"object bytes"
    assert stat.S_IMODE(destination.stat().st_mode) == 0o644 & ~umask
    assert os.listdir(destination.parent) == ["out.o"]


def test_copy_to_a_missing_directory_fails_and_leaves_nothing(cache, tmp_path):
    assert cache.store(KEY_A, _sources(tmp_path / "src", out_o=b"object bytes"))
    with cache.lookup(KEY_A) as entry, pytest.raises(FileNotFoundError):
        entry.copy_to("out.o", str(tmp_path / "missing" / "out.o"))


def _count_in_children(root: str, processes: int, times: int, shards: int | None = None) -> None:
    children = []
    for _ in range(processes):
        pid = os.fork()
        if pid == 0:  # the child: counts, then leaves without running pytest's exit handlers
            status = 1
            try:
                if shards is not None:
                    store_module._STAT_SHARDS = shards  # all in one shard: they wait for its lock
                child_cache = CacheStore.open(root)
                assert child_cache is not None
                for _ in range(times):
                    child_cache.count("hits")
                status = 0
            finally:
                os._exit(status)
        children.append(pid)
    for pid in children:
        assert os.waitpid(pid, 0)[1] == 0


@pytest.mark.parametrize("shards", [None, 1])
def test_concurrent_counts_are_all_kept(cache, shards):
    _count_in_children(cache.root, 8, 200, shards)
    assert cache.stats()["hits"] == 1600


def test_zero_stats_keeps_the_size_and_clear_keeps_the_counts(cache, tmp_path):
    assert cache.store(KEY_A, _sources(tmp_path / "src", out_o=b"object bytes"))
    cache.count("hits", 3)
    cache.count("misses")
    size = cache.stats()["size"]
    cache.zero_stats()
    counts = cache.stats()
    assert counts.get("hits", 0) == counts.get("misses", 0) == counts.get("stores", 0) == 0
    assert (counts["size"], counts["entries"]) == (size, 1)
    cache.count("hits", 2)
    cache.clear()
    assert cache.lookup(KEY_A) is None
    assert [name for name in os.listdir(cache.root) if len(name) == 2] == []
    counts = cache.stats()
    assert (counts["hits"], counts["size"], counts["entries"]) == (2, 0, 0)


def test_count_refuses_a_name_with_white_space(cache):
    with pytest.raises(ValueError):
        cache.count("two words")


def test_show_stats(cache, tmp_path):
    assert cache.store(KEY_A, _sources(tmp_path / "src", out_o=b"x" * 2048))
    cache.count("hits", 3)
    cache.count("misses")
    cache.count("pass-through", 2)
    shown = cache.show_stats()
    lines = dict(line.split(None, 1) if not line.startswith(("cache ", "hit rate")) else
                 (line[:20].strip(), line[20:]) for line in shown.splitlines())
    assert lines["cache directory"] == cache.root
    assert (lines["hits"], lines["misses"], lines["stores"], lines["pass-through"]) == ("3", "1", "1", "2")
    assert lines["hit rate"] == "75.0 %"
    assert lines["entries"] == "1"
    assert lines["cache size"].startswith("2.") and lines["cache size"].endswith("KiB / 5.0 GiB (0 %)")


def test_read_only_mode_stores_nothing(cache, tmp_path, monkeypatch):
    assert cache.store(KEY_A, _sources(tmp_path / "src", out_o=b"object bytes"))
    monkeypatch.setenv("OFFLOAD_CACHE_READONLY", "1")
    shared = CacheStore.open(cache.root)
    assert shared is not None and shared.read_only
    before = os.stat(_entry_dir(cache, KEY_A)).st_mtime_ns
    with shared.lookup(KEY_A) as entry:
        assert entry.read("out.o") == b"object bytes"
    assert os.stat(_entry_dir(cache, KEY_A)).st_mtime_ns == before  # not even the LRU clock
    assert not shared.store(KEY_B, _sources(tmp_path / "src", out_o=b"other"))
    assert not os.path.exists(_entry_dir(cache, KEY_B))
    shared.set_max_size(1)
    assert shared.evict() == 0 and os.path.isdir(_entry_dir(cache, KEY_A))
    os.unlink(os.path.join(_entry_dir(cache, KEY_A), "@manifest"))
    assert shared.lookup(KEY_A) is None and os.path.isdir(_entry_dir(cache, KEY_A))  # a miss, left as it is
    assert CacheStore.open(str(tmp_path / "never-made")) is None  # read-only: nothing to read, nothing made
    assert not os.path.exists(tmp_path / "never-made")


def test_max_size_is_kept_in_config(cache):
    assert cache.max_size == store_module.DEFAULT_MAX_SIZE
    cache.set_max_size(123456)
    assert CacheStore.open(cache.root).max_size == 123456
    with open(os.path.join(cache.root, "config"), "w") as f:
        f.write("# written by hand\nmax_size = 10G\n")
    assert CacheStore.open(cache.root).max_size == 10 << 30
    with pytest.raises(ValueError):
        cache.set_max_size(-1)


def test_open_refuses_a_directory_others_may_write(tmp_path, capsys):
    root = tmp_path / "cache"
    root.mkdir()
    os.chmod(root, 0o777)
    assert CacheStore.open(str(root)) is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("offload-cache: warning: cache off: ")
    assert str(root) in err


def test_open_where_a_file_is_in_the_way_is_off_silently(tmp_path, capsys):
    (tmp_path / "file").write_bytes(b"")
    assert CacheStore.open(str(tmp_path / "file" / "cache")) is None
    assert capsys.readouterr().err == ""


def test_open_where_the_parent_is_not_writable_is_off(tmp_path, capsys):
    parent = tmp_path / "read-only"
    parent.mkdir()
    os.chmod(parent, 0o500)
    try:
        os.mkdir(parent / "probe")
    except PermissionError:
        pass
    else:  # root writes anyway: a read-only bind mount in a mount namespace of its own says the same
        os.rmdir(parent / "probe")
        os.chmod(parent, 0o700)
        _open_under_a_read_only_mount(parent)
        return
    try:
        assert CacheStore.open(str(parent / "home" / "cache")) is None
        assert capsys.readouterr().err == ""
    finally:
        os.chmod(parent, 0o700)


def _open_under_a_read_only_mount(parent) -> None:
    (parent / "exists").mkdir(mode=0o700)
    probe = ("from offload_builders.launcher.store import CacheStore; import sys;"
             "print(CacheStore.open(sys.argv[1]), CacheStore.open(sys.argv[2]))")
    script = ('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && '
              'exec "$2" -c "$3" "$1/home/cache" "$1/exists"')
    if shutil.which("unshare") is None:
        pytest.skip("running as root and no unshare(1) to make a read-only mount")
    result = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", str(parent), sys.executable, probe],
                            capture_output=True, text=True)
    if result.returncode and "mount" in result.stderr and "Traceback" not in result.stderr:
        pytest.skip(f"running as root and cannot make a read-only mount: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "None None\n" and result.stderr == ""


def test_an_existing_directory_this_user_cannot_write_is_off(tmp_path):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    os.chmod(root, 0o500)
    try:
        if os.access(root, os.W_OK):  # root writes anyway: a read-only mount is what it cannot write
            parent = tmp_path / "mounted"
            parent.mkdir(mode=0o700)
            _open_under_a_read_only_mount(parent)
            return
        assert CacheStore.open(str(root)) is None
    finally:
        os.chmod(root, 0o700)


def test_where_the_cache_is_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("OFFLOAD_BUILDERS_CACHE_DIR", str(tmp_path / "builders"))
    assert CacheStore.open().root == str(tmp_path / "builders" / "offload-cache")
    monkeypatch.setenv("OFFLOAD_CACHE_DIR", str(tmp_path / "own"))
    assert CacheStore.open().root == str(tmp_path / "own")
    monkeypatch.setenv("OFFLOAD_CACHE_DIR", "")
    assert CacheStore.open() is None
    monkeypatch.delenv("OFFLOAD_CACHE_DIR")
    monkeypatch.setenv("OFFLOAD_BUILDERS_CACHE_DIR", "")
    assert CacheStore.open() is None
    monkeypatch.delenv("OFFLOAD_BUILDERS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert CacheStore.open().root == str(tmp_path / "xdg" / "offload-builders" / "offload-cache")


@pytest.mark.parametrize(("text", "size"), [
    ("5G", 5 << 30), ("500M", 500 << 20), ("100k", 100 << 10), ("100K", 100 << 10), ("1073741824", 1 << 30),
    ("2T", 2 << 40), ("1.5G", 3 << 29), (" 5 GiB ", 5 << 30), ("5GB", 5 << 30), ("0", 0), ("7B", 7),
])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "G", "5X", "-5G", "1.2.3G", "1e9", "5 G G", "five", "1.G", ".5G", "5Gi2",
                                  "²"])
def test_parse_size_refuses_junk(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_importing_the_store_is_cheap():
    code = "import offload_builders.launcher.store, sys; print(' '.join(sorted(sys.modules)))"
    modules = set(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                 text=True).stdout.split())
    assert "offload_builders.launcher.store" in modules
    assert not modules & {"dataclasses", "subprocess", "typing", "inspect", "json"}


# The direct mode's file lists: each file's stamp and digest, so that a hit reads no file that did not change.

SETTLE = 0.3  # RACY_SECONDS in these tests (the real margin is seconds): a file this old is settled


@pytest.fixture
def fresh_keys(monkeypatch):
    """offload_builders.launcher.keys with a short racy margin and an empty per-process memory (call ``forget``
    to start over, as the next launcher process would)."""
    monkeypatch.setattr(keys, "RACY_SECONDS", SETTLE)
    monkeypatch.setattr(keys, "_FILES", {})
    return keys


def _forget() -> None:
    keys._FILES.clear()  # what the next compile's process starts with


def _settled(*paths) -> None:
    """Wait until the files' last change is older than the racy margin."""
    newest = max(os.stat(path).st_ctime for path in paths)
    time.sleep(max(0.0, newest + SETTLE + 0.05 - time.time()))


def _object(tmp_path, data: bytes) -> dict[str, str]:
    path = tmp_path / f"out-{data.hex()}.o"
    path.write_bytes(data)
    return {"out": str(path)}


def _hit(cache: CacheStore, base: str) -> bytes | None:
    entry = keys.lookup_by_files(cache, base)
    if entry is None:
        return None
    with entry:
        return entry.read("out")


def _recorded(cache: CacheStore, base: str, path: str) -> str:
    return dict(cache.file_lists(base)[0])[path]


def _result_key(base: str, path: str, digest: str) -> str:
    return keys.Key("result", base, f"{path} {digest}", file_identity(path)).hex()


def test_file_lists_keep_what_is_recorded_with_each_name(cache):
    program = keys.program_entry("/usr/bin/ld.lld")
    cache.add_file_list(KEY_A, [("a.c", "1 2 3 4 5 " + "0" * 40), ("/usr/include/stdio.h", ""), (program, "")])
    assert cache.file_lists(KEY_A) == [[("a.c", "1 2 3 4 5 " + "0" * 40), ("/usr/include/stdio.h", ""),
                                        (program, "")]]
    cache.add_file_list(KEY_A, [("b.c", "")])
    cache.add_file_list(KEY_A, [("a.c", "9 9 9 9 9 " + "1" * 40), ("/usr/include/stdio.h", ""), (program, "")])
    # the same names recorded anew replace their earlier list, which no longer holds what the files are
    assert cache.file_lists(KEY_A) == [[("a.c", "9 9 9 9 9 " + "1" * 40), ("/usr/include/stdio.h", ""),
                                        (program, "")], [("b.c", "")]]
    with open(os.path.join(cache.root, "lists", KEY_A[:2], KEY_A)) as f:
        assert f.read().split("\n\n")[1] == "b.c"  # a name alone: as lists were written before stamps
    for unlistable in ([("a\nb", "")], [("a", "x\ny")], [("a", "x\0y")], [(program, "1")], [("", "")]):
        cache.add_file_list(KEY_B, unlistable)
        assert cache.file_lists(KEY_B) == []


def test_a_settled_file_is_taken_by_its_stamp_and_not_read(cache, tmp_path, fresh_keys):
    header = tmp_path / "h.h"
    header.write_bytes(b"int a;\n")
    _settled(header)
    base = _key(1)
    keys.store_by_files(cache, base, [str(header)], _object(tmp_path, b"v1"), b"")
    recorded = _recorded(cache, base, str(header))
    status = os.stat(header)
    assert recorded.startswith(f"{status.st_dev} {status.st_ino} {status.st_size} {status.st_mtime_ns} "
                               f"{status.st_ctime_ns} ")
    # A list whose recorded digest is not the file's: only a lookup that trusts the stamp, and does not read the
    # file, finds the entry stored under that digest.
    forged = "f" * 40
    cache.add_file_list(base, [(str(header), recorded.rsplit(" ", 1)[0] + " " + forged)])
    cache.store(_result_key(base, str(header), forged), _object(tmp_path, b"trusted"))
    _forget()
    assert _hit(cache, base) == b"trusted"


def test_a_file_changed_with_its_size_and_mtime_kept_is_hashed_again(cache, tmp_path, fresh_keys):
    header = tmp_path / "h.h"
    header.write_bytes(b"int a;\n")
    _settled(header)
    base = _key(2)
    keys.store_by_files(cache, base, [str(header)], _object(tmp_path, b"v1"), b"")
    before = os.stat(header)
    _settled(header)  # a change well after the record: its stamp differs by the change time alone
    header.write_bytes(b"int b;\n")
    os.utime(header, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(header)
    assert (after.st_dev, after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_dev, before.st_ino, before.st_size, before.st_mtime_ns)
    assert after.st_ctime_ns != before.st_ctime_ns
    _forget()
    assert _hit(cache, base) is None
    keys.store_by_files(cache, base, [str(header)], _object(tmp_path, b"v2"), b"")
    _forget()
    assert _hit(cache, base) == b"v2"
    header.write_bytes(b"int a;\n")  # back as it was (mtime too): the first list's entry again
    os.utime(header, ns=(before.st_atime_ns, before.st_mtime_ns))
    _forget()
    assert _hit(cache, base) == b"v1"


def test_a_touched_file_is_hashed_again_and_its_list_recorded_anew(cache, tmp_path, fresh_keys):
    header = tmp_path / "h.h"
    header.write_bytes(b"int a;\n")
    _settled(header)
    base = _key(3)
    keys.store_by_files(cache, base, [str(header)], _object(tmp_path, b"v1"), b"")
    old = _recorded(cache, base, str(header))
    os.utime(header, ns=(0, 1_000_000_000))  # touch -d: an mtime of the past; the change time is now
    _settled(header)
    _forget()
    assert _hit(cache, base) == b"v1"  # the same bytes
    new = _recorded(cache, base, str(header))
    assert new != old and new.split()[3] == "1000000000" and new.split()[-1] == old.split()[-1]
    # recorded anew: the next hit takes the file by its new stamp (a forged digest shows it is not read)
    forged = "e" * 40
    cache.add_file_list(base, [(str(header), new.rsplit(" ", 1)[0] + " " + forged)])
    cache.store(_result_key(base, str(header), forged), _object(tmp_path, b"trusted"))
    _forget()
    assert _hit(cache, base) == b"trusted"


def test_a_file_replaced_by_a_copy_is_hashed_again(cache, tmp_path, fresh_keys):
    header = tmp_path / "h.h"
    header.write_bytes(b"int a;\n")
    _settled(header)
    base = _key(4)
    keys.store_by_files(cache, base, [str(header)], _object(tmp_path, b"v1"), b"")
    recorded = _recorded(cache, base, str(header))
    by_content = keys.files_part([str(header)], identity=False)
    cache.add_file_list(base, [(str(header), recorded.rsplit(" ", 1)[0] + " " + "f" * 40)])
    old_inode = os.stat(header).st_ino
    shutil.copy2(header, tmp_path / "copy.h")  # the same bytes and mtime, another inode, as a safe-save leaves
    os.replace(tmp_path / "copy.h", header)
    assert os.stat(header).st_ino != old_inode
    _forget()
    assert keys.files_part([str(header)], identity=False) == by_content  # the same content is the same digest
    # the forged digest recorded with the old stamp is not taken; the identity (an OpenMP target region's name
    # holds the inode) is the new file's, so the entry of the old one does not hit
    assert _hit(cache, base) is None
    cache.store(_result_key(base, str(header), by_content[0].rsplit(" ", 1)[1]), _object(tmp_path, b"copy"))
    _forget()
    assert _hit(cache, base) == b"copy"


def test_a_racy_file_is_recorded_without_a_stamp_and_hashed(cache, tmp_path, fresh_keys, monkeypatch):
    monkeypatch.setattr(keys, "RACY_SECONDS", 2.0)  # the real margin
    header = tmp_path / "h.h"
    settled = tmp_path / "settled.h"
    settled.write_bytes(b"int s;\n")
    os.utime(settled, ns=(0, 0))
    header.write_bytes(b"int a;\n")  # changed just now: a change in the same clock tick would keep its stamp
    base = _key(5)
    keys.store_by_files(cache, base, [str(header)], _object(tmp_path, b"v1"), b"")
    assert _recorded(cache, base, str(header)) == ""
    before = os.stat(header)
    header.write_bytes(b"int b;\n")
    os.utime(header, ns=(before.st_atime_ns, before.st_mtime_ns))
    _forget()
    assert _hit(cache, base) is None
    keys.store_by_files(cache, base, [str(header)], _object(tmp_path, b"v2"), b"")
    _forget()
    assert _hit(cache, base) == b"v2"
    assert _recorded(cache, base, str(header)) == ""  # still racy: the hit recorded nothing new
    # once settled, a hit records its stamp, and the next hit does not read it
    monkeypatch.setattr(keys, "RACY_SECONDS", SETTLE)
    _settled(header)
    _forget()
    assert _hit(cache, base) == b"v2"
    recorded = _recorded(cache, base, str(header))
    assert recorded.endswith(" " + keys.file_digest(str(header)))


def test_hashing_reads_the_whole_file(tmp_path, fresh_keys):
    import hashlib

    for size in (0, 1, 4095, 4096, 4097, (1 << 20) + 3, (3 << 20) + 5):
        path = tmp_path / f"f{size}"
        data = os.urandom(size)
        path.write_bytes(data)
        assert keys.file_digest(str(path)) == hashlib.blake2b(data, digest_size=20).hexdigest()
    assert keys.file_digest(str(tmp_path)) is None  # a directory
    assert keys.file_digest(str(tmp_path / "missing")) is None
