"""What an interrupted command can leave next to its output, found by name.

Every phase command writes ``<target><suffix>`` (``$OFFLOAD_PARTIAL_SUFFIX``, default ``.partial``), and
only a finished one is renamed over the target. A command killed on the way (SIGKILL, an out-of-memory
kill, a lost machine; Ctrl-C between a command's end and the rename) leaves files that no later build
writes again, because their names are random:

* the partial output, ``<target>.partial``;
* Clang's ``-cc1`` temporary: the partial name with ``-XXXXXXXX`` (8 hex digits) before its last
  extension and ``.tmp`` after it (``main.o-3ec90e20.partial.tmp``), renamed to the partial name when
  the compile ends (Clang's ``CompilerInstance::createOutputFile``);
* LLVM's ``FileOutputBuffer`` temporary, ``<partial>.tmpXXXXXXX`` (7 hex digits): ``ld.lld`` (device
  links, the host link) and ``clang-offload-packager`` write through it;
* our own writers' temporaries (:mod:`offload_builders.formats`), ``.<partial>.<pid>.<n>.tmp``, the
  HIP fat binary's uncompressed bundle, ``<partial>.uncompressed``, an OpenMP object's package,
  ``<partial>.package``, which its embed step reads (and their ``.<...>.<pid>.<n>.tmp``), an OpenMP
  NVPTX device node's PTX, ``<partial>.ptx``, which its ``ptxas`` step reads, and a HIP device node's
  device object, ``<partial>.device.o``, which its device link reads (and Clang's temporaries of them);
* a scratch directory that a node declares, such as the device link's ``<target>.inputs/`` or a static
  library's ``<target>.ar/``.

Only names made from the node's own target match, so sweeping one node never touches another node's
files or anything else in the directory. (``ptxas``, ``nvlink`` and ``clang-nvlink-wrapper`` write the
partial output itself; their other temporaries go to ``$TMPDIR``, which is not the build's to sweep:
:func:`private_tmpdir` gives each command a ``$TMPDIR`` of its own, removed when it ends, because
``clang-nvlink-wrapper`` leaves its ``.s`` and ``.cubin`` temporaries there when a link fails. GNU ``ar``
and ``ranlib`` write ``stXXXXXX`` in the archive's directory, a name no node can claim, so a static library's
run on an archive inside its scratch directory, ``<target>.ar/``.)
"""
from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TextIO

from offload_builders.errors import OffloadError

#: ``$OFFLOAD_PARTIAL_SUFFIX``'s default: what every phase command writes, renamed over the target once it ends.
DEFAULT_PARTIAL_SUFFIX = ".partial"

#: The suffix (after the partial output's name) of the package an OpenMP object's action writes and embeds.
PACKAGE_SUFFIX = ".package"

#: The suffix (after the partial output's name) of the PTX an OpenMP NVPTX device node compiles and ``ptxas``
#: assembles into the node's cubin.
PTX_SUFFIX = ".ptx"

#: The suffix (after the partial output's name) of the device object a HIP device node compiles and links
#: into the node's code object.
DEVICE_OBJECT_SUFFIX = ".device.o"

#: The suffixes of the side files a Clang ``-cc1`` step writes (through a temporary of its own).
_COMPILED_SIDE_SUFFIXES = (PTX_SUFFIX, DEVICE_OBJECT_SUFFIX)

#: The suffixes of the files a node's own steps write beside its partial output.
_SIDE_SUFFIXES = (".uncompressed", PACKAGE_SUFFIX, *_COMPILED_SIDE_SUFFIXES)
_SIDE_FILE = "(?:" + "|".join(re.escape(suffix) for suffix in _SIDE_SUFFIXES) + ")"


#: The characters a partial-output suffix may hold: it is appended to file names in commands that a shell
#: may read (``${TARGET}$OFFLOAD_PARTIAL_SUFFIX`` in the link and archive lines), where the target is quoted
#: and the suffix is not.
_SUFFIX_CHARACTERS = re.compile(r"[\w.,+~@%=-]+")


@functools.lru_cache(maxsize=64)
def check_partial_suffix(suffix: str, variable: str = "OFFLOAD_PARTIAL_SUFFIX") -> str:
    """``suffix`` (``$OFFLOAD_PARTIAL_SUFFIX`` as substituted), or one :class:`OffloadError` naming ``variable``
    where it cannot name the partial output beside its target: empty (the command would write the target
    itself, so a killed one leaves it half written), holding a path separator (``/x`` writes into a
    directory named after the target, or anywhere), only dots (``.``, ``..``: Windows drops trailing dots, so
    the partial output would be the target), or a character a shell reads (space, ``$``, ``;``, quotes...)."""
    problem = ""
    if not suffix:
        problem = "is empty; commands must write a partial output beside their target"
    elif "/" in suffix or os.sep in suffix or (os.altsep and os.altsep in suffix):
        problem = "holds a path separator; it must only add to the target's file name"
    elif not suffix.strip("."):
        problem = "is only dots; Windows drops trailing dots from file names, so the partial output would be the target"
    elif not _SUFFIX_CHARACTERS.fullmatch(suffix):
        problem = ("holds characters other than letters, digits and . , + ~ @ % = - _; it is appended to file names"
                   " in commands a shell may read")
    if problem:
        raise OffloadError(f"{variable} {suffix!r} {problem} (the default is {DEFAULT_PARTIAL_SUFFIX!r})")
    return suffix


def llvm_extension(name: str) -> str:
    """``llvm::sys::path::extension``: from the last ``.`` of the file name on (``.x`` -> ``.x``; ``..`` -> ``''``)."""
    if name in (".", ".."):
        return ""
    dot = name.rfind(".")
    return "" if dot < 0 else name[dot:]


def _clang_temporary(output: str) -> str:
    """The pattern of Clang's ``-cc1`` temporary of ``output``: ``-XXXXXXXX`` (8 hex digits) before its last
    extension and ``.tmp`` after it (``CompilerInstance::createOutputFile``)."""
    extension = llvm_extension(output)
    return re.escape(output[:len(output) - len(extension)]) + r"-[0-9a-f]{8}" + re.escape(extension) + r"\.tmp"


@functools.lru_cache(maxsize=4096)
def leftover_pattern(target_name: str, partial_suffix: str) -> re.Pattern[str]:
    """The names (in the target's directory) an interrupted command for ``target_name`` can leave."""
    partial = target_name + partial_suffix
    choices = [
        _clang_temporary(partial),  # clang -cc1
        *(_clang_temporary(partial + suffix) for suffix in _COMPILED_SIDE_SUFFIXES),  # ... writing a side file
        re.escape(partial) + f"(?:{re.escape(PACKAGE_SUFFIX)})?" + r"\.tmp[0-9a-f]{7}",  # FileOutputBuffer
        re.escape(partial) + _SIDE_FILE,  # the HIP fat binary before compression; a package
        r"\." + re.escape(partial) + f"{_SIDE_FILE}?" + r"\.[0-9]+\.[0-9]+\.tmp",  # formats' Outputs
    ]
    if partial_suffix:
        choices.append(re.escape(partial))
    return re.compile("|".join(f"(?:{choice})" for choice in choices))


#: A cheap screen for names with a random part that some command's leftover could have (exact: the pattern).
_RANDOM_PART = re.compile(r"-[0-9a-f]{8}.*\.tmp$|\.tmp[0-9a-f]{7}$|\.[0-9]+\.[0-9]+\.tmp$")


class Leftovers:
    """Finds (and sweeps) the leftovers of output paths, listing each directory once.

    A build has many nodes per directory; listing the directory for each would cost milliseconds a
    node in a large one. The first look at a directory keeps the names that could be leftovers (usually
    none); each node then takes the ones made from its own target. Made once per build, before any
    command writes in the directory: a command's live temporaries are never in the list (SCons runs
    each node once a build; every phase action sweeps before its command runs). Thread-safe (``-j``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._candidates: dict[str, set[str]] = {}

    def _take(self, directory: str, name: str, partial_suffix: str) -> list[str]:
        with self._lock:
            candidates = self._candidates.get(directory)
            if candidates is None:
                try:
                    names = os.listdir(directory or ".")
                except OSError:
                    names = []
                candidates = self._candidates[directory] = {
                    entry for entry in names if _RANDOM_PART.search(entry) or entry.endswith(_SIDE_SUFFIXES)}
            if not candidates:
                return []
            pattern = leftover_pattern(name, partial_suffix)
            found = [entry for entry in candidates if pattern.fullmatch(entry)]
            candidates.difference_update(found)
        return found

    def find(self, target: str, partial_suffix: str, scratch_suffixes: Sequence[str] = ()) -> list[str]:
        """The leftovers of the output path ``target`` that exist: files matching :func:`leftover_pattern` in
        its directory, and the directories ``<target><suffix>`` for ``scratch_suffixes``. Each is found once."""
        directory, name = os.path.split(target)
        found = [os.path.join(directory, entry) for entry in self._take(directory, name, partial_suffix)]
        partial = target + partial_suffix
        if partial_suffix and os.path.lexists(partial):
            found.append(partial)
        found.extend(target + suffix for suffix in scratch_suffixes if os.path.isdir(target + suffix))
        return sorted(set(found))

    def sweep(self, target: str, partial_suffix: str, scratch_suffixes: Sequence[str] = ()) -> list[str]:
        """Remove what earlier, interrupted runs of ``target``'s command left; returns what was removed."""
        found = self.find(target, partial_suffix, scratch_suffixes)
        remove_leftovers(found)
        return found


def remove_leftovers(paths: Iterable[str]) -> None:
    """Delete leftovers: files and links unlinked, directories removed with their contents; gone is fine."""
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


@contextlib.contextmanager
def private_tmpdir(environ: Mapping[str, str] | None = None, inside: str | None = None) -> Iterator[dict[str, str]]:
    """``environ`` (default: this process's) with ``$TMPDIR`` set to a new directory inside ``inside`` (a
    node's scratch directory, which a later run sweeps if this one is killed) or else inside the old
    ``$TMPDIR``, removed with whatever the command left in it once the block ends. A tool that fails keeps
    its temporaries (``clang-nvlink-wrapper``: ``<name>.nvptx64-nvidia-cuda.sm_80-XXXXXX.s``, the ``.cubin``
    ``ptxas`` made of it); a run of failed links would fill the user's ``/tmp`` with them."""
    base = dict(os.environ if environ is None else environ)
    parent = next((path for path in (inside, base.get("TMPDIR")) if path and os.path.isdir(path)), None)
    scratch = tempfile.mkdtemp(prefix="offload-tmp-", dir=parent)
    try:
        yield {**base, "TMPDIR": scratch}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class UnrecordedOutputs:
    """A journal of the outputs this build replaced that SCons has not yet recorded.

    SCons writes its record of what it built (``.sconsign``) once, when the build ends. A build killed
    after some commands finished leaves outputs newer than their record; if the sources then change back
    (an edit undone, a branch switched back), SCons finds the recorded signatures matching and takes those
    outputs as up to date: a stale object, a stale program. So each output is journaled *before* it is
    moved into place; the journal is removed once SCons has written its record; and a journal found when a
    build starts (:meth:`recover`) names outputs whose record may be stale: they are deleted, so they are
    built again. One journal per project top directory; thread-safe (``-j``).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file: TextIO | None = None

    def recover(self) -> list[str]:
        """Delete the outputs an interrupted earlier build journaled, and the journal; returns them."""
        try:
            with open(self.path, encoding="utf-8", errors="surrogateescape") as journal:
                outputs = [line.rstrip("\n") for line in journal if line.strip()]
        except FileNotFoundError:
            return []
        remove_leftovers(outputs)
        os.unlink(self.path)
        return outputs

    def add(self, output: str) -> None:
        """Journal ``output`` (an absolute path), before the caller replaces it."""
        with self._lock:
            if self._file is None:
                self._file = open(self.path, "a", encoding="utf-8", errors="surrogateescape")
            self._file.write(output + "\n")
            self._file.flush()  # in the kernel's hands: a SIGKILL of this process cannot lose it

    def settle(self) -> None:
        """SCons has recorded every output: the journal is no longer needed."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass
