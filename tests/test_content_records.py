"""The content records (offload_builders.content_records): a file's signature is reused only while the file is
the very one that was hashed, and only once it had settled before the run that hashed it."""
from __future__ import annotations

import os
import time
from pathlib import Path

from offload_builders.content_records import SETTLED_NS, ContentRecords

LATER = SETTLED_NS + 1_000_000_000  # a run that starts this long after the file was written


def _records(tmp_path: Path, started_ns: int, hash_format: str = "md5") -> ContentRecords:
    return ContentRecords(str(tmp_path / "records"), hash_format, started_ns)


def _recorded(tmp_path: Path) -> Path:
    """An output whose signature ``sig-1`` a run that started well after it was written recorded and saved."""
    output = tmp_path / "x.bc"
    output.write_bytes(b"device code")
    records = _records(tmp_path, time.time_ns() + LATER)
    records.note(str(output), output.stat(), output.stat(), "sig-1")
    records.save()
    return output


def test_a_settled_file_is_known_by_its_identity_in_the_next_run(tmp_path):
    output = _recorded(tmp_path)
    again = _records(tmp_path, time.time_ns() + LATER)
    assert again.known(str(output), output.stat()) == "sig-1"
    assert _records(tmp_path, time.time_ns(), hash_format="sha256").known(str(output), output.stat()) is None


def test_a_file_changed_shortly_before_the_run_is_not_recorded(tmp_path):
    """The racy case: a rewrite in the same clock tick as the hash would keep the recorded identity."""
    output = tmp_path / "x.bc"
    output.write_bytes(b"device code")
    records = _records(tmp_path, time.time_ns())
    records.note(str(output), output.stat(), output.stat(), "sig-1")
    records.save()
    assert _records(tmp_path, time.time_ns() + LATER).known(str(output), output.stat()) is None
    assert not (tmp_path / "records").exists()


def test_a_rewrite_with_the_same_size_and_modification_time_is_not_the_recorded_file(tmp_path):
    output = tmp_path / "x.bc"
    output.write_bytes(b"device code")
    records = _records(tmp_path, time.time_ns() + LATER)
    records.note(str(output), output.stat(), output.stat(), "sig-1")
    before = output.stat()
    time.sleep(0.02)  # past a clock tick, as any later edit is
    with output.open("r+b") as stream:
        stream.write(b"DEVICE")
    os.utime(output, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (output.stat().st_size, output.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert records.known(str(output), output.stat()) is None
    replaced = tmp_path / "y.bc"  # a new file moved over it (a checkout, a cache retrieval): a new inode
    replaced.write_bytes(b"device code")
    os.utime(replaced, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(replaced, output)
    assert records.known(str(output), output.stat()) is None


def test_a_file_changed_during_the_run_is_not_recorded_whatever_its_clock_says(tmp_path):
    """The signature may have been computed before the change: the identity before the run must be the one
    after it (a network file system's clock can put a change during the run seconds in the past)."""
    output = tmp_path / "x.bc"
    output.write_bytes(b"device code")
    before = output.stat()
    records = _records(tmp_path, time.time_ns() + LATER)
    time.sleep(0.02)
    output.write_bytes(b"other code!")
    records.note(str(output), before, output.stat(), "sig-of-device-code")
    assert records.known(str(output), output.stat()) is None
    records.note(str(output), output.stat(), output.stat(), "sig-of-other-code")
    assert records.known(str(output), output.stat()) == "sig-of-other-code"


def test_a_changed_or_missing_file_loses_its_record_and_a_broken_file_is_ignored(tmp_path):
    output = _recorded(tmp_path)
    assert _records(tmp_path, time.time_ns()).known(str(output), output.stat()) == "sig-1"
    records = _records(tmp_path, time.time_ns())  # this run rewrites the file: no record for it, nor the old one
    output.write_bytes(b"other code!")
    records.note(str(output), output.stat(), output.stat(), "sig-2")
    records.save()
    assert _records(tmp_path, time.time_ns() + LATER).known(str(output), output.stat()) is None
    records.note(str(output), None, None, None)
    (tmp_path / "records").write_bytes(b"\x00not marshal")
    assert _records(tmp_path, time.time_ns() + LATER).known(str(output), output.stat()) is None
