"""Sharing the work SCons does per node among a source's phase nodes: the override environments of the models'
emitters, one per environment and overrides (:func:`override_environment`), the source scanner that walks a
source's includes once for all its phase nodes (:data:`SHARED_SOURCE_SCANNER`), and the compile nodes' overrides
that skip SCons' command scan (:func:`command_dependency_overrides`).

Together because the scanner looks up the environment an override environment was made from, which only
:func:`override_environment` records.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import SCons.Tool

#: Per environment (by identity; the environment is kept, so its id is not reused): its override
#: environments by their overrides, see :func:`override_environment`.
_OVERRIDE_ENVIRONMENTS: dict[int, tuple[Any, dict[tuple, Any]]] = {}


def override_environment(env, overrides: Mapping[str, Any]):
    """``env.Override(overrides)``, made once per environment and overrides (their values hashable): what a
    builder call with those keyword arguments makes for each node. An emitter that makes the same kind of
    node for every source (a target's device compile) passes it to the builder instead of the keywords,
    so its nodes share one environment, as nodes made without overrides share the caller's."""
    entry = _OVERRIDE_ENVIRONMENTS.get(id(env))
    if entry is None or entry[0] is not env:
        entry = _OVERRIDE_ENVIRONMENTS[id(env)] = (env, {})
    key = tuple(sorted(overrides.items()))
    made = entry[1].get(key)
    if made is None:
        made = entry[1][key] = env.Override(dict(overrides))
        _SCAN_SUBJECTS[id(made)] = env
    return made


#: Each environment :func:`override_environment` made, by identity, to the environment it was made from.
_SCAN_SUBJECTS: dict[int, Any] = {}


class _ScanPath(tuple):
    """A scanner's search path (a tuple, as SCons computes it per node), with what it was computed from."""

    context: tuple


class _WholeScan:
    """One scanner SCons' ``SourceFileScanner`` selects for a source, answering for the source with every
    file it includes, directly or through files no node builds (see :class:`SharedSourceScanner`)."""

    def __init__(self, scanner) -> None:
        self.scanner = scanner
        self.name = getattr(scanner, "name", "scanner")

    def path(self, env, dir=None, target=None, source=None):
        path = _ScanPath(self.scanner.path(env, dir, target, source))
        path.context = (dir, target, source)
        return path

    def __call__(self, node, env, path=()):
        subject = _SCAN_SUBJECTS.get(id(env), env)
        key = (id(self.scanner), id(subject), tuple(path))
        # Kept where SCons keeps a file's includes (the node's memo, which SCons empties whenever the file
        # may have changed: once it is built, and in --interactive before every build).
        memo = node._memo.setdefault("offload_whole_scan", {})
        found = memo.get(key)
        if found is None:
            dir, target, source = getattr(path, "context", (None, None, None))
            found = memo[key] = _walk_includes(node, subject, self.scanner,
                                               lambda scanner: scanner.path(subject, dir, target, source))
        return found

    def recurse_nodes(self, nodes) -> list:
        """Only the built files among them: what they include is known once they are built, and SCons walks
        them again then; the rest of the walk is in the answer."""
        return [node for node in nodes if node.has_builder()]

    def select(self, node):
        return SHARED_SOURCE_SCANNER.select(node)

    def __str__(self) -> str:
        return str(self.scanner)


def _walk_includes(node, env, root_scanner, path_of: Callable[[Any], Any]) -> list:
    """SCons' breadth-first walk of a phase node's source (``Node.get_implicit_deps`` with the builder's
    ``SourceFileScanner``: each file's scanner by its suffix, else the source's), except that a file some
    node builds is listed but not walked into."""
    found: list = []
    seen, queue, paths = {node}, [node], {}
    while queue:
        current = queue.pop(0)
        scanner = SCons.Tool.SourceFileScanner.select(current) or root_scanner
        if scanner is None:
            continue
        if scanner not in paths:
            paths[scanner] = path_of(scanner)
        included = [each for each in current.get_found_includes(env, scanner, paths[scanner]) if each not in seen]
        found.extend(included)
        seen.update(included)
        queue.extend(each for each in scanner.recurse_nodes(included) if not each.has_builder())
    return found


class SharedSourceScanner:
    """The phase nodes' source scanner: SCons' own walk through a source's includes (``SourceFileScanner``,
    with whatever the user added to it), made once per source and environment, not once per phase node.

    SCons walks a source's includes for every node that has it as a source, and keeps each file's includes
    per environment object: a source compiled for four targets was walked five times (host front end, four
    device compiles; the object a sixth), each walk as many steps as the source includes files. Our phase
    nodes differ from their object's environment only by our own variables (``$OFFLOAD_TARGET``, never
    ``$CPPPATH``, ``$CPPDEFINES`` or the scanners), so they find the same files: the first one walks with
    the object's environment, the others take its list. A generated header is walked by SCons itself,
    after it is built, as before."""

    def __init__(self) -> None:
        self._by_scanner: dict[int, _WholeScan] = {}

    def select(self, node):
        scanner = SCons.Tool.SourceFileScanner.select(node)
        if scanner is None:
            return None
        whole = self._by_scanner.get(id(scanner))
        if whole is None or whole.scanner is not scanner:
            whole = self._by_scanner[id(scanner)] = _WholeScan(scanner)
        return whole

    def __call__(self, node, env, path=()):
        selected = self.select(node)
        return selected(node, env, path) if selected is not None else []

    def path(self, env, dir=None, target=None, source=None):
        return ()

    def recurse_nodes(self, nodes):
        return nodes


SHARED_SOURCE_SCANNER = SharedSourceScanner()


def command_dependency_overrides(env) -> dict:
    """Overrides for the compile nodes: no implicit command dependency scan (unless the user configured it).

    SCons finds a command's program by rendering the whole command once more and searching ``$PATH`` for
    its first word, for every node, and then hashes the program's contents (37 MiB for CUDA 13's
    ``ptxas``) on every run, no-op builds included. Our phase commands start with the absolute path of
    the probed program, so :func:`~offload_builders.scons.tool_dependencies.depend_on_program` names it through
    a stamp instead.
    """
    return {} if "IMPLICIT_COMMAND_DEPENDENCIES" in env else {"IMPLICIT_COMMAND_DEPENDENCIES": 0}
