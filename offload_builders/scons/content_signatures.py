"""Content signatures reused across runs: :func:`reuse_content_signatures` gives a node the signature an earlier
run recorded for the very same file (by inode, size, modification and change time), so SCons does not hash it
again, and the signatures this run computed are recorded at exit (:mod:`offload_builders.content_records` keeps
them).

A module of its own because it owns process state, the records per project and their ``atexit`` writer;
:func:`offload_builders.scons.outputs.own_outputs` hands it every node the tool makes.
"""
from __future__ import annotations

import atexit
import os
import time
from typing import Any

import SCons.Script
import SCons.Util

from offload_builders.content_records import ContentRecords

#: Per project top directory: its content records, and the nodes whose signatures go into them at exit with
#: their files' stat when the SConscripts were read (before SCons hashed anything).
_CONTENT_RECORDS: dict[str, tuple[ContentRecords, list[tuple[Any, os.stat_result | None]]]] = {}


#: The name of the content records' file in the project's top directory.
CONTENT_RECORDS_FILE = ".sconsign.offload-contents"


def reuse_content_signatures(env, nodes) -> None:
    """Give each node whose file is the very file (by inode, size, modification and change time) whose
    content signature an earlier run recorded that signature, so SCons does not hash it again; at exit,
    record the signatures this run computed (see :mod:`offload_builders.content_records`: SCons hashes every
    output younger than ``--max-drift`` on every run, our intermediates included, a no-op too).

    A negative ``--max-drift`` asks SCons to hash every file on every run: then nothing is reused or
    recorded."""
    if _trusts_no_signature():
        return
    top = env.Dir("#").abspath
    entry = _CONTENT_RECORDS.get(top)
    if entry is None:
        if not _CONTENT_RECORDS:
            atexit.register(_record_content_signatures)
        records = ContentRecords(os.path.join(top, CONTENT_RECORDS_FILE), _build_hash_format(), time.time_ns())
        entry = _CONTENT_RECORDS[top] = (records, [])
    records, watched = entry
    for node in nodes:
        stat = node.stat()
        if stat is not None:
            signature = records.known(node.get_abspath(), stat)
            if signature is not None:
                node.get_ninfo().csig = signature
        watched.append((node, stat))


def _trusts_no_signature() -> bool:
    """``--max-drift`` (or a ``SetOption`` of it) below zero. Outside the ``scons`` command (the tool used
    from a Python program) SCons' options read as None."""
    drift = SCons.Script.GetOption("max_drift")
    return isinstance(drift, int) and drift < 0


def _build_hash_format() -> str:
    """The hash format this build's signatures will have. SCons applies ``--hash-format`` (and a ``SetOption``
    of it) only once the SConscripts are read, so while they are, the hash function in use is the default
    one; the option, as set so far, is what counts."""
    chosen = SCons.Script.GetOption("hash_format")
    return chosen.lower() if chosen else SCons.Util.get_current_hash_algorithm_used()


def _record_content_signatures() -> None:
    """At exit: each watched node's content signature, if SCons computed one, for its file if the file is the
    one it was when the SConscripts were read. Nothing is recorded if the signatures are not of the format the
    records were read for, or if ``--max-drift`` ended below zero (a ``SetOption`` of either after the tool's
    first node; this run has used the records read for the options as they were then: in the worst case,
    signatures of the other format, which match no record of this one, so their consumers rerun)."""
    if SCons.Script.GetOption("no_exec") or SCons.Script.GetOption("clean") or _trusts_no_signature():
        return
    for records, watched in _CONTENT_RECORDS.values():
        if records.hash_format != SCons.Util.get_current_hash_algorithm_used():
            continue
        for node, before in watched:
            path = node.get_abspath()
            try:
                after = os.stat(path) if node.rfile() is node else None
            except OSError:
                after = None
            records.note(path, before, after, getattr(getattr(node, "ninfo", None), "csig", None))
        records.save()
