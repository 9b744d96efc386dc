"""Where a node's outputs are written and how they are committed: the ``.partial`` name its command writes
(:func:`partial_path`) and the files its steps pass along (:func:`side_path`), the sweep of what interrupted runs
left (:data:`REMOVE_STALE`, a node's first step), the commit that moves finished outputs into place (:data:`COMMIT`,
its last), the journal of outputs SCons has not recorded yet (:func:`unrecorded_outputs`, also for ``CacheDir``
retrievals: :class:`JournalingCacheDir`), and what the tool does for every node it makes (:func:`own_outputs`:
leftovers removed under ``scons -c``, content signatures reused otherwise; :data:`CLEAN_LEFTOVERS`).

Together because the sweep, the commit and the journal share this process's view of leftovers and journals. Low
in the package (it imports no action or model), so :mod:`offload_builders.scons.remote` commits what it downloads
under the same names.
"""
from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable, Sequence

import SCons.CacheDir
import SCons.Errors
import SCons.Script

from offload_builders import leftovers
from offload_builders.errors import OffloadError
from offload_builders.scons.content_signatures import reuse_content_signatures
from offload_builders.scons.variables import user_error, word_value
from offload_builders.scons.versioned_actions import versioned_action


def partial_path(env, node) -> str:
    suffix = env.get("OFFLOAD_PARTIAL_SUFFIX")
    if not (isinstance(suffix, str) and "$" not in suffix):  # a plain string (the default) needs no subst
        suffix = env.subst("$OFFLOAD_PARTIAL_SUFFIX")
    return str(node) + suffix


def side_path(env, node, suffix: str) -> str:
    """Where a step of ``node``'s action writes a file that only the next step reads (NVPTX's PTX, HIP's device
    object, OpenMP's package): a name made from the node's partial output, which the next run of the node
    sweeps if a build is killed in between (:func:`offload_builders.leftovers.leftover_pattern`)."""
    return partial_path(env, node) + suffix


def _sweep_leftovers(target, source, env) -> int:
    """Before a node's command runs, remove what interrupted runs of it left: ``<target>.partial`` and the
    temporaries Clang, ld.lld and our writers name after it (see :mod:`offload_builders.leftovers`).
    Killed mid-command, they are never written again under the same (random) names and would pile up."""
    suffix = env.subst("$OFFLOAD_PARTIAL_SUFFIX")
    for node in target:
        _LEFTOVERS.sweep(str(node), suffix)
    return 0


#: This build's view of what interrupted builds left (see :class:`offload_builders.leftovers.Leftovers`).
_LEFTOVERS = leftovers.Leftovers()


REMOVE_STALE = versioned_action(_sweep_leftovers, "sweep leftovers", 1)


#: Per project top directory: the outputs replaced in this build that SCons has not recorded yet.
_UNRECORDED: dict[str, leftovers.UnrecordedOutputs] = {}


def unrecorded_outputs(env) -> leftovers.UnrecordedOutputs:
    """The journal of ``env``'s project; made once per process, when it deletes what a killed build left
    unrecorded (see :class:`offload_builders.leftovers.UnrecordedOutputs`)."""
    top = env.Dir("#").abspath
    journal = _UNRECORDED.get(top)
    if journal is None:
        journal = _UNRECORDED[top] = leftovers.UnrecordedOutputs(os.path.join(top, ".sconsign.offload-unrecorded"))
        if not SCons.Script.GetOption("no_exec"):
            journal.recover()
        _settle_journals_after_sconsign_write()
    return journal


def _settle_journals_after_sconsign_write() -> None:
    """Once SCons has written ``.sconsign`` (at the end of every build, interrupted by Ctrl-C or not), the
    journals are settled. SCons has no hook there, so its ``write`` is wrapped (once)."""
    import SCons.SConsign

    original = SCons.SConsign.write
    if getattr(original, "offload_settles_journals", False):
        return

    def write(*args, **kwargs):
        original(*args, **kwargs)
        for journal in _UNRECORDED.values():
            journal.settle()

    write.offload_settles_journals = True  # type: ignore[attr-defined]
    SCons.SConsign.write = write


class JournalingCacheDir(SCons.CacheDir.CacheDir):
    """SCons' ``CacheDir``, whose retrievals are journaled as our commands' outputs are (:func:`_commit`).

    A retrieval writes an output that SCons records only when the build ends, as a command does: a build
    killed after retrieving the objects of one branch's sources leaves them newer than their record, and
    after a switch back to the recorded branch SCons takes them as up to date (and builds the rest on
    them). Journaled first, they are deleted when the next build starts, so they are retrieved or built
    again. The tool's default ``$CACHEDIR_CLASS``; a class of your own (``CacheDir(path, MyClass)``) is
    used as it is, unless it derives from this one."""

    @classmethod
    def copy_from_cache(cls, env, src, dst) -> str:
        unrecorded_outputs(env).add(os.path.abspath(dst))
        return super().copy_from_cache(env, src, dst)


def _commit(target, source, env) -> int:
    """Move each finished ``<target>.partial`` into place, so no half-written target ever exists; journal
    it first, so that a build killed before SCons records it cannot leave it looking up to date."""
    for node in target:
        partial = partial_path(env, node)
        if os.path.exists(partial):
            unrecorded_outputs(env).add(node.get_abspath())
            os.replace(partial, str(node))
        elif not os.path.exists(str(node)):
            raise SCons.Errors.BuildError(node=node, errstr=f"the command did not write {partial}")
    return 0


COMMIT = versioned_action(_commit, "commit", 1)


def clean_leftovers(scratch_suffixes: Sequence[str] = ()) -> Callable:
    """An emitter that does for the node what :func:`own_outputs` does (the name is from when that was
    removing the node's leftovers under ``scons -c`` alone)."""
    def emitter(target, source, env):
        own_outputs(env, target, scratch_suffixes)
        return target, source
    return emitter


def own_outputs(env, nodes, scratch_suffixes: Sequence[str] = ()) -> None:
    """What the tool does for every node it makes: under ``scons -c`` it has SCons remove the nodes'
    leftovers with them, and otherwise it reuses their recorded content signatures
    (:func:`~offload_builders.scons.content_signatures.reuse_content_signatures`).

    Leftovers have random names, so they are found now, at read time (only when cleaning; one listing per
    directory), and handed to ``env.Clean``; ``scratch_suffixes`` name the node's scratch directories
    (``<target>.inputs`` of a device link), which SCons removes with their contents. An emitter that makes
    nodes calls this for them (rather than giving their builders an emitter: SCons makes each builder
    call with an emitter look its nodes up twice)."""
    freeze_declared_graph()
    try:
        leftovers.check_partial_suffix(word_value(env, "OFFLOAD_PARTIAL_SUFFIX"))
    except OffloadError as error:
        raise user_error(error) from None
    if SCons.Script.GetOption("clean"):
        suffix = env.subst("$OFFLOAD_PARTIAL_SUFFIX")
        for node in nodes:
            found = _LEFTOVERS.find(node.get_abspath(), suffix, scratch_suffixes)
            if found:
                env.Clean(node, found)
    else:
        reuse_content_signatures(env, nodes)


def freeze_declared_graph() -> None:
    """While SCons reads the SConscripts, take everything made so far out of the cyclic garbage collector's
    reach (``gc.freeze()``, constant time).

    The nodes, executors and environments a build declares live until the process exits, yet CPython's
    collector walks them all again in each full collection, and once more at exit: for 256 sources x 8
    targets (2600 nodes) 0.1-0.25 s of a 1.2-1.5 s no-op. Frozen, they are skipped; what the build phase
    makes is collected as before. The cost: cyclic garbage made while reading, before the last freeze, is
    never collected (its memory goes back with the process's; its finalizers do not run). Outside the
    reading of SConscripts (the tool used from a Python program or a test) nothing is frozen, nor in a
    free-threaded CPython, whose ``gc.freeze()`` visits every object."""
    if SCons.Script.sconscript_reading and getattr(sys, "_is_gil_enabled", lambda: True)():
        gc.freeze()


#: The emitter of every phase builder: see :func:`own_outputs`.
CLEAN_LEFTOVERS = clean_leftovers()
