"""Kept images are linked into programs, so their directories and files are checked as every per-user directory the
tool trusts: slots are made 0700 whatever the umask; another user's slot, a ``kept-images`` that is a link to
another user's world-writable directory, a key or image that is a FIFO or a link to ``/dev/zero`` are refused (the
link links as without them, promptly); kept images have a byte limit as well as a slot limit.

The ownership tests give files to another user with ``chown`` (root only; CI and these machines run as root): the
check compares owners, which root's own permissions do not bypass."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from offload_builders.linking import kept_images as kept_images_module
from offload_builders.linking.kept_images import DIRECTORY, kept_images

#: The uid of the other user the ownership tests give files to (Debian's ``nobody``).
OTHER_UID = 65534
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("OFFLOAD_BUILDERS_CACHE_DIR", str(root))
    return root


def keep_one(tmp_path: Path, output: str = "prog", data: bytes = b"image bytes") -> kept_images_module.KeptImages:
    image = tmp_path / f"{output}.image"
    image.write_bytes(data)
    kept = kept_images(str(tmp_path / output))
    assert kept is not None
    kept.keep("prog.t", "key", str(image))
    return kept


def test_slots_are_private_whatever_the_umask(cache, tmp_path):
    old = os.umask(0o002)
    try:
        kept = keep_one(tmp_path)
    finally:
        os.umask(old)
    for directory in (cache / DIRECTORY, Path(kept.slot)):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    out = tmp_path / "out"
    assert kept.fetch("prog.t", "key", str(out)) and out.read_bytes() == b"image bytes"


@needs_root
def test_another_users_slot_is_not_linked_in(cache, tmp_path):
    kept = keep_one(tmp_path)
    for path in (Path(kept.slot), *Path(kept.slot).iterdir()):
        os.chown(path, OTHER_UID, OTHER_UID)
    out = tmp_path / "out"
    assert not kept.fetch("prog.t", "key", str(out)) and not out.exists()


@needs_root
def test_another_users_key_and_image_in_ones_own_slot_are_not_linked_in(cache, tmp_path):
    kept = keep_one(tmp_path)
    for name in ("prog.t.key", "prog.t.img"):
        os.chown(Path(kept.slot) / name, OTHER_UID, OTHER_UID)
        out = tmp_path / "out"
        assert not kept.fetch("prog.t", "key", str(out)) and not out.exists()
        os.chown(Path(kept.slot) / name, 0, 0)


@needs_root
def test_kept_images_linked_to_another_users_world_writable_directory_is_not_used(cache, tmp_path):
    keep_one(tmp_path)  # makes the cache
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o777)
    theirs.chmod(0o777)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    (cache / DIRECTORY).rename(tmp_path / "old-kept-images")
    (cache / DIRECTORY).symlink_to(theirs)
    assert kept_images(str(tmp_path / "prog")) is None
    assert list(theirs.iterdir()) == []


@pytest.mark.parametrize("swap", ["key is a FIFO", "key links to /dev/zero", "image links to /dev/zero",
                                  "image is a FIFO"])
def test_a_swapped_key_or_image_is_refused_promptly(cache, tmp_path, swap):
    """In a subprocess with a timeout: the old code hung on a FIFO and read /dev/zero until memory ran out."""
    kept = keep_one(tmp_path)
    slot = Path(kept.slot)
    what, _, how = swap.partition(" ")
    path = slot / ("prog.t.key" if what == "key" else "prog.t.img")
    path.unlink()
    if "FIFO" in how:
        os.mkfifo(path, 0o600)
    else:
        path.symlink_to("/dev/zero")
    out = tmp_path / "out"
    script = textwrap.dedent(f"""
        from offload_builders.linking.kept_images import kept_images
        kept = kept_images({str(tmp_path / "prog")!r})
        print(kept is not None and kept.fetch("prog.t", "key", {str(out)!r}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, OFFLOAD_BUILDERS_CACHE_DIR=str(cache)))
    assert (done.returncode, done.stdout.strip()) == (0, "False"), done.stderr
    assert not out.exists()


def test_kept_images_have_a_byte_limit(cache, tmp_path, monkeypatch):
    """An image over MAX_BYTES is not kept; slots beyond MAX_BYTES in all go, least recently used first."""
    monkeypatch.setattr(kept_images_module, "MAX_BYTES", 1000)
    big = keep_one(tmp_path, "big", b"x" * 1001)
    assert not (Path(big.slot) / "prog.t.img").exists()
    slots = []
    for number in range(4):
        kept = keep_one(tmp_path, f"prog{number}", b"y" * 300)
        os.utime(kept.slot, ns=(number * 10**9, number * 10**9))
        slots.append(Path(kept.slot))
    # Each slot holds 300 bytes of image and a 130-byte key: taking a new slot keeps the most recently used that
    # fit in 1000 bytes, prog3's and prog2's.
    assert kept_images(str(tmp_path / "new")) is not None
    assert set((cache / DIRECTORY).iterdir()) == {slots[2], slots[3]}


def test_a_stray_file_in_kept_images_is_removed_and_costs_no_slot(cache, tmp_path, monkeypatch):
    """Only slots count against MAX_SLOTS: a file that is no slot (a link, a leftover) goes, and takes no slot's
    place."""
    monkeypatch.setattr(kept_images_module, "MAX_SLOTS", 3)
    slots = []
    for number in range(2):
        kept = keep_one(tmp_path, f"prog{number}")
        os.utime(kept.slot, ns=(number * 10**9, number * 10**9))
        slots.append(Path(kept.slot))
    stray = cache / DIRECTORY / "stray"
    stray.write_bytes(b"not a slot")
    os.utime(stray, ns=(10 * 10**9, 10 * 10**9))  # more recent than both slots
    # A third slot is taken: with the two before it, MAX_SLOTS in all; the stray file goes.
    assert kept_images(str(tmp_path / "new")) is not None
    assert set((cache / DIRECTORY).iterdir()) == set(slots)
