"""Offload sources outside the project: their objects and intermediate files go beside the target.

SCons names an object after its source, in the source's directory: ``env.Program('build/app',
['/abs/src/x.cpp'])`` writes ``/abs/src/x.o``. For an offload source that is a dozen files per source (host
bitcode, one device file per target, package, object) written into a third-party or read-only tree. The
link builders here compile such sources (absolute paths, or ``../`` paths that leave the top directory)
into the directory of the target that links them, as ``<target dir>/<stem>$OBJSUFFIX``; sources inside the
project keep SCons' usual placement (and ``VariantDir``).
"""
from __future__ import annotations

import os
from typing import Any

import SCons.Action
import SCons.Builder
import SCons.Node
import SCons.Node.FS
import SCons.Util


def _outside(path: str, top: str) -> bool:
    return os.path.commonpath([path, top]) != top


def sources_beside(env, target: list, source: list) -> list:
    """``source`` with each offload source outside the top directory replaced by its object, built by
    ``env.OffloadObject`` in the directory of ``target[0]``."""
    top = env.Dir("#").get_abspath()
    first = target[0]
    directory = (first if isinstance(first, SCons.Node.FS.Base) else env.File(env.subst(str(first)))).dir
    suffixes = set(env["BUILDERS"]["OffloadObject"].src_suffixes(env))
    object_suffix = env.subst("$OBJSUFFIX")
    result: list = []
    for item in SCons.Util.flatten(source):
        if isinstance(item, SCons.Node.Node) and not isinstance(item, SCons.Node.FS.Base):
            result.append(item)  # an Alias or a Value: no file to compile
            continue
        node = item if isinstance(item, SCons.Node.FS.Base) else env.File(env.subst(str(item)))
        stem, suffix = os.path.splitext(node.name)
        if suffix in suffixes and not node.has_builder() and _outside(node.srcnode().get_abspath(), top):
            result.extend(env.OffloadObject(directory.File(stem + object_suffix), node))
        else:
            result.append(item)
    return result


class LinkBuilder(SCons.Builder.BuilderBase):
    """A program or library builder whose offload sources outside the project compile beside its target."""

    def _execute(self, env, target, source, overwarn={}, executor_kw={}):  # noqa: B006 (SCons' signature)
        if target and source:
            source = sources_beside(env, list(target), list(source))
        return super()._execute(env, target, source, overwarn, executor_kw)


def link_builder(*, action: Any, emitter: Any = None, **kw: Any) -> LinkBuilder:
    """:class:`LinkBuilder` made as ``SCons.Builder.Builder`` makes a builder (an action, a list of emitters)."""
    if SCons.Util.is_List(emitter):
        emitter = SCons.Builder.ListEmitter(emitter)
    return LinkBuilder(action=SCons.Action.Action(action), emitter=emitter, **kw)


__all__ = ["LinkBuilder", "link_builder", "sources_beside"]
