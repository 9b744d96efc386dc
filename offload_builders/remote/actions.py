"""One build node as a REAPI Action: the key under which its outputs are cached, and the input tree.

A node is described by a :class:`NodeJob`: its steps as the build system signs them, the files it reads under
the checkout (by path relative to the checkout and content), what else decides its outputs (the tools, files
outside the checkout, values) and its outputs (relative paths). The key must not depend on where the checkout
is, and two jobs with the same key must give the same bytes:

* The checkout's absolute path is replaced by ``$CHECKOUT`` in the steps, except in a step that makes debug
  information or coverage data (``-debug-info-kind=``, ``-fcoverage-mapping``, ``ptxas -g``/``-lineinfo``,
  ...), where it reaches the output (``DW_AT_comp_dir``): there the path stays, and such nodes share only with
  checkouts at the same path.
* Programs and files outside the checkout (the compiler, ``ptxas``, device libraries, headers found outside)
  are not uploaded: the salt names each by its path and content digest (:class:`ContentDigests`), so another
  compiler build, another device library or another header gives another key.
* The salt also holds :data:`KEY_VERSION`: in-process steps (bundle, package, wrap) are keyed by their declared
  name and version and the digest of the package's Python sources, and a change of this scheme changes every key.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO

from offload_builders.remote.digests import Digest, digest_of_bytes, digest_of_file

if TYPE_CHECKING:
    from offload_builders.remote.file_digests import FileMemo

#: Changes every key: bump it when what a key covers changes.
KEY_VERSION = "offload-builders remote key 1"

#: What stands for the checkout's absolute path in a key.
CHECKOUT_TOKEN = "$CHECKOUT"

#: Words after which a compile's output holds the compilation directory (debug information, coverage
#: mappings, PTX line information): the checkout's path then stays in the key.
_PATH_SENSITIVE = re.compile(
    r"^(?:-debug-info-kind=|-g$|-g[0-3]$|-ggdb|-gdwarf|-gline-tables-only|-fcoverage-mapping|--coverage|"
    r"-fprofile-instr-generate|-fprofile-instrument=|-ftest-coverage|-fprofile-arcs|-lineinfo|--generate-line-info|"
    r"--device-debug|-G$|-coverage-notes-file=|-coverage-data-file=|-record-command-line|-dwarf-debug-flags)")


@dataclass(frozen=True)
class NodeJob:
    """What decides a node's outputs, as the remote cache keys it."""

    #: The checkout's absolute path (the build's top directory); outputs and inputs are relative to it.
    root: str
    #: Each step's signature text (a command's words, an in-process step's code signature), as the build
    #: signs it, still with absolute paths: :func:`cache_key` replaces the root.
    steps: tuple[str, ...]
    #: Files read under the root: relative path -> content digest.
    inputs: Mapping[str, Digest]
    #: Everything else that decides the outputs, one line each (a tool's path and digest, a file outside the
    #: root with its digest, a value the build depends on).
    salt_lines: tuple[str, ...]
    #: The node's outputs, relative to the root, in the node's order.
    outputs: tuple[str, ...]
    #: Per output, whether it is executable (an action result records it).
    executable: frozenset[str] = field(default_factory=frozenset)


def relative_path(path: str, root: str) -> str | None:
    """``path`` relative to ``root``; None for a path outside it (REAPI paths never leave the input root)."""
    relative = os.path.relpath(os.path.abspath(path), root)
    if relative == "." or relative.startswith("..") or os.path.isabs(relative):
        return None
    return relative.replace(os.sep, "/")


def path_sensitive(steps: Iterable[str]) -> bool:
    """Whether a step writes the compilation directory into its output (see the module's docstring)."""
    return any(_PATH_SENSITIVE.match(word) for step in steps for word in step.split())


def portable_steps(steps: Sequence[str], root: str) -> tuple[str, ...]:
    """The steps with the checkout's path replaced by :data:`CHECKOUT_TOKEN` where that is sound."""
    if not root or path_sensitive(steps):
        return tuple(steps)
    pattern = re.compile(re.escape(root.rstrip("/")) + r"(?=/|\s|$|[\"',;:=])")
    return tuple(pattern.sub(lambda _: CHECKOUT_TOKEN, step) for step in steps)


class ContentDigests:
    """Content digests of files outside the checkout (tools, device libraries, system headers), read once per
    process per file version: a file is hashed again when its size, modification time or inode change.
    ``persistent``: also remembered across processes, in the per-user memo of
    :mod:`offload_builders.remote.file_digests` (by each file's stat identity; also the run-path libraries and
    library identities of :func:`outside_file_line`), for short processes that key the same tools again and again
    (``offload-link``)."""

    def __init__(self, persistent: bool = False) -> None:
        self._known: dict[str, tuple[tuple[int, int, int], Digest]] = {}
        self.persistent = persistent

    def __call__(self, path: str) -> Digest | None:
        """The file's digest; None where it cannot be read (it then keys as missing)."""
        try:
            status = os.stat(path)
        except OSError:
            return None
        stamp = (status.st_size, status.st_mtime_ns, status.st_ino)
        known = self._known.get(path)
        if known is not None and known[0] == stamp:
            return known[1]
        try:
            if self.persistent:
                from offload_builders.remote.file_digests import content_digest

                digest = content_digest(path)
            else:
                digest = digest_of_file(path)
        except OSError:
            return None
        self._known[path] = (stamp, digest)
        return digest


#: The process's digests of files outside checkouts.
OUTSIDE_DIGESTS = ContentDigests()
#: The same, remembered across processes (:mod:`offload_builders.remote.file_digests`): ``offload-link``'s.
PERSISTENT_DIGESTS = ContentDigests(persistent=True)


def outside_file_line(path: str, digests: ContentDigests = OUTSIDE_DIGESTS) -> str:
    """A salt line for a file outside the checkout: its resolved path and content digest; for a program, also
    each library it loads from its own run path (:func:`runpath_libraries`) by build ID."""
    resolved = os.path.realpath(path)
    digest = digests(resolved)
    line = f"file {resolved} {digest if digest else 'missing'}"
    return "\n".join([line, *(f"  loads {library} {_library_identity(library, digests)}"
                                for library in runpath_libraries(resolved, persistent=digests.persistent))])


_ELF_MAGIC = b"\x7fELF"
_RUNPATH_LIBRARIES: dict[tuple[str, int, int], tuple[str, ...]] = {}


def runpath_libraries(path: str, *, persistent: bool = False) -> tuple[str, ...]:
    """The shared libraries an ELF program finds through its own ``RUNPATH``/``RPATH`` (``$ORIGIN/../lib``):
    where a launcher keeps its code. LLVM's ``clang`` is a small binary over ``libclang-cpp`` and ``libLLVM``,
    which a package update can change without changing it. Libraries from the system's directories (libc,
    libstdc++) are not listed. Read once per process per file version; ``persistent``: the program's dynamic
    entries (what is read of it) are remembered across processes (:mod:`offload_builders.remote.file_digests`), the
    libraries are looked for each time."""
    try:
        status = os.stat(path)
    except OSError:
        return ()
    key = (path, status.st_size, status.st_mtime_ns)
    if key not in _RUNPATH_LIBRARIES:
        _RUNPATH_LIBRARIES[key] = tuple(_read_runpath_libraries(path, persistent))
    return _RUNPATH_LIBRARIES[key]


def _read_runpath_libraries(path: str, persistent: bool = False) -> list[str]:
    memo_, before = _memo(persistent)
    try:
        with open(path, "rb") as stream:
            status = os.fstat(stream.fileno())
            recorded = memo_.lookup(path, status, "dynamic") if memo_ is not None else None
            if (isinstance(recorded, list) and len(recorded) == 2
                    and all(isinstance(part, list) and all(isinstance(word, str) for word in part)
                            for part in recorded)):
                needed, search = recorded
            else:
                needed, search = _dynamic_entries(stream)
                if memo_ is not None:
                    memo_.record(path, status, before, "dynamic", [needed, search])
    except OSError:
        return []
    origin = os.path.dirname(path)
    directories = [entry.replace("${ORIGIN}", origin).replace("$ORIGIN", origin) for entry in search if entry]
    found = []
    for name in needed:
        for directory in directories:
            candidate = os.path.join(directory, name)
            if os.path.isfile(candidate):
                found.append(os.path.realpath(candidate))
                break
    return found


def _memo(persistent: bool) -> tuple[FileMemo | None, int]:
    """The per-user memo where ``persistent`` (and it is usable), and the time before which a file read now must
    have settled to be recorded there."""
    if not persistent:
        return None, 0
    from offload_builders.remote.file_digests import memo, settled_before

    return memo(), settled_before()


def _dynamic_entries(stream: BinaryIO) -> tuple[list[str], list[str]]:
    """An ELF file's ``DT_NEEDED`` names and its run-path entries, as written; none for another file. Raises
    :class:`OSError` where it cannot be read."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    needed: list[str] = []
    search: list[str] = []
    if stream.read(4) != _ELF_MAGIC:
        return [], []
    stream.seek(0)
    try:
        dynamic = ELFFile(stream).get_section_by_name(".dynamic")
        if not isinstance(dynamic, DynamicSection):
            return [], []
        for tag in dynamic.iter_tags():
            if tag.entry.d_tag == "DT_NEEDED":
                needed.append(tag.needed)  # type: ignore[attr-defined]  # set per tag kind
            elif tag.entry.d_tag == "DT_RUNPATH":
                search += tag.runpath.split(":")  # type: ignore[attr-defined]
            elif tag.entry.d_tag == "DT_RPATH":
                search += tag.rpath.split(":")  # type: ignore[attr-defined]
    except (ELFError, ValueError):
        return [], []
    return needed, search


def _library_identity(path: str, digests: ContentDigests) -> str:
    """A library's GNU build ID (a note the linker writes: cheap to read, unlike hashing 130 MB of libLLVM),
    else its content digest."""
    memo_, before = _memo(digests.persistent)
    try:
        with open(path, "rb") as stream:
            status = os.fstat(stream.fileno())
            recorded = memo_.lookup(path, status, "build-id") if memo_ is not None else None
            if isinstance(recorded, str):
                return recorded
            build_id = _build_id(stream)
            if build_id is not None:
                if memo_ is not None:
                    memo_.record(path, status, before, "build-id", build_id)
                return build_id
    except OSError:
        pass
    digest = digests(path)
    return str(digest) if digest else "missing"


def _build_id(stream: BinaryIO) -> str | None:
    """``build-id <hex>`` of an ELF file's GNU build ID note; None where it has none or is no ELF file."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import NoteSection

    try:
        for section in ELFFile(stream).iter_sections():
            if isinstance(section, NoteSection):
                for note in section.iter_notes():
                    if note["n_type"] == "NT_GNU_BUILD_ID":
                        return f"build-id {note['n_desc']}"
    except (ELFError, ValueError):
        pass
    return None


@dataclass(frozen=True)
class ActionMessages:
    """The serialized Action, Command and input tree of a job: what the key is the digest of."""

    action_digest: Digest
    command_digest: Digest
    input_root_digest: Digest
    #: Every message by digest (Action, Command, each Directory), to upload with the result.
    blobs: Mapping[Digest, bytes]
    #: The command's argv (:func:`cache_key`: a description of the steps; runnable only for one-command
    #: nodes built by :func:`command_action`).
    arguments: tuple[str, ...]
    outputs: tuple[str, ...]


def _re():  # noqa: ANN202 - the generated module
    from offload_builders.remote.protos import remote_execution_pb2

    return remote_execution_pb2


def input_tree(files: Mapping[str, Digest], executable: frozenset[str] = frozenset()
               ) -> tuple[Digest, dict[Digest, bytes]]:
    """The Merkle tree of ``files`` (relative paths): the root Directory's digest and every Directory by
    digest. Entries are sorted by name, as REAPI requires for a canonical digest."""
    re_pb2 = _re()
    tree: dict = {}
    for path, digest in files.items():
        *parents, name = path.split("/")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"{path}: a parent directory is also a file")
        node[name] = (digest, path in executable)
    blobs: dict[Digest, bytes] = {}

    def directory(node: dict) -> Digest:
        message = re_pb2.Directory()
        for name in sorted(node):
            entry = node[name]
            if isinstance(entry, dict):
                child = directory(entry)
                message.directories.add(name=name, digest=re_pb2.Digest(hash=child.hash, size_bytes=child.size))
            else:
                digest, is_executable = entry
                message.files.add(name=name, digest=re_pb2.Digest(hash=digest.hash, size_bytes=digest.size),
                                  is_executable=is_executable)
        data = message.SerializeToString(deterministic=True)
        digest = digest_of_bytes(data)
        blobs[digest] = data
        return digest

    return directory(tree), blobs


def _action_messages(arguments: Sequence[str], job: NodeJob, salt_lines: Sequence[str],
                     environment: Mapping[str, str] = {}, platform: Mapping[str, str] = {}) -> ActionMessages:
    re_pb2 = _re()
    command = re_pb2.Command(arguments=list(arguments), output_paths=sorted(job.outputs))
    for name in sorted(environment):
        command.environment_variables.add(name=name, value=environment[name])
    if platform:
        command.platform.CopyFrom(re_pb2.Platform(properties=[
            re_pb2.Platform.Property(name=name, value=platform[name]) for name in sorted(platform)]))
    command_data = command.SerializeToString(deterministic=True)
    command_digest = digest_of_bytes(command_data)
    root_digest, blobs = input_tree(job.inputs)
    salt = "\n".join([KEY_VERSION, *salt_lines]).encode()
    action = re_pb2.Action(command_digest=re_pb2.Digest(hash=command_digest.hash, size_bytes=command_digest.size),
                           input_root_digest=re_pb2.Digest(hash=root_digest.hash, size_bytes=root_digest.size),
                           salt=salt)
    if platform:
        action.platform.CopyFrom(command.platform)
    action_data = action.SerializeToString(deterministic=True)
    action_digest = digest_of_bytes(action_data)
    blobs[command_digest] = command_data
    blobs[action_digest] = action_data
    return ActionMessages(action_digest, command_digest, root_digest, blobs, tuple(arguments), job.outputs)


#: The first word of a cache key's argv: the steps are descriptions, run by the build, not by a worker.
NODE_PROGRAM = "offload-builders-node"


def cache_key(job: NodeJob) -> ActionMessages:
    """The Action under which the node's outputs are cached: its argv holds the steps (checkout path
    replaced where sound), its input root the files read under the checkout, its salt the rest."""
    return _action_messages([NODE_PROGRAM, *portable_steps(job.steps, job.root)], job, job.salt_lines)


def command_action(argv: Sequence[str], job: NodeJob, environment: Mapping[str, str] = {},
                   platform: Mapping[str, str] = {}) -> ActionMessages:
    """An Action a worker can run (remote execution): ``argv`` as it runs here, from the input root as the
    working directory, so relative paths resolve there; the salt keeps its result apart from other
    toolchains'."""
    return _action_messages(argv, job, job.salt_lines, environment, platform)


__all__ = ["ActionMessages", "CHECKOUT_TOKEN", "ContentDigests", "KEY_VERSION", "NODE_PROGRAM", "NodeJob",
           "OUTSIDE_DIGESTS", "PERSISTENT_DIGESTS", "cache_key", "command_action", "input_tree", "outside_file_line",
           "path_sensitive", "portable_steps", "relative_path"]
