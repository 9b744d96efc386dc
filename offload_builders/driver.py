"""The shared driver layer: what every offload model asks the installed Clang driver, and how.

A model (OpenMP in :mod:`offload_builders.models.openmp`, HIP in :mod:`offload_builders.models.hip`) probes
the driver (``clang -### ...``) once per configuration, classifies the jobs it prints and turns each
into a :class:`CommandTemplate` whose input and output paths are named slots. This module owns the parts
that do not depend on the model: running and caching probes (:func:`probe`, :func:`remembered_jobs`),
parsing jobs, making templates from them (:func:`job_template`), dependency-file slots, target-selection
flags and portable build signatures.

This module has no SCons imports.
"""
from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from offload_builders.errors import ToolchainError
from offload_builders.job_words import (
    DEPENDENCY_OPTIONS,
    DEPENDENCY_VALUE_OPTIONS,
    parse_driver_jobs,
)
from offload_builders.toolchain import ProbeCache, user_cache

PROBE_STEM = "__offload_probe__"

class ProbeError(ToolchainError):
    """The driver rejected a configuration (bad flags, unsupported target) while we probed it."""


@dataclass(frozen=True)
class Slot:
    """A place in a command template filled per build node (``prefix`` + the path)."""

    name: str
    prefix: str = ""


Arg = str | Slot


@dataclass(frozen=True)
class CommandTemplate:
    """A command line whose per-node paths are named :class:`Slot` objects.

    Rendered for every node of a build (a no-op build too: SCons reads each node's command for its
    signature), so the words are kept as runs of fixed words between slots, and :meth:`signature` rewrites
    the fixed words for :func:`portable_signature` once per top directory rather than once per node."""

    argv: tuple[Arg, ...]
    #: (fixed words, the slot after them or None), in order: what :meth:`render` concatenates.
    _runs: tuple[tuple[tuple[str, ...], Slot | None], ...] = field(init=False, repr=False, compare=False)
    _slots: frozenset[str] = field(init=False, repr=False, compare=False)
    #: Per top directory: this template with its fixed words as :func:`portable_signature` writes them.
    _portable: dict[str, CommandTemplate] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        runs: list[tuple[tuple[str, ...], Slot | None]] = []
        fixed: list[str] = []
        for arg in self.argv:
            if isinstance(arg, str):
                fixed.append(arg)
            else:
                runs.append((tuple(fixed), arg))
                fixed = []
        runs.append((tuple(fixed), None))
        object.__setattr__(self, "_runs", tuple(runs))
        object.__setattr__(self, "_slots", frozenset(arg.name for arg in self.argv if isinstance(arg, Slot)))
        object.__setattr__(self, "_portable", {})

    @property
    def slots(self) -> frozenset[str]:
        return self._slots

    def render(self, **values: str | Sequence[str]) -> list[str]:
        """Fill every slot; a list value fills its slot with as many arguments. A missing or unexpected
        value is a programming error, so it raises."""
        return self._fill(values)[0]

    def _fill(self, values: Mapping[str, str | Sequence[str]]) -> tuple[list[str], bool]:
        """The words, and whether a slot's word starts with a flag :func:`portable_signature` reads."""
        if not self._slots.issuperset(values):
            raise KeyError(f"no slot named {sorted(set(values) - self._slots)} in this command")
        argv: list[str] = []
        read = False
        for fixed, slot in self._runs:
            argv += fixed
            if slot is None:
                continue
            value = values[slot.name]
            if isinstance(value, str):
                word = slot.prefix + value
                read = read or word.startswith(_SIGNATURE_FLAGS)
                argv.append(word)
            else:
                words = [slot.prefix + item for item in value]
                read = read or any(word.startswith(_SIGNATURE_FLAGS) for word in words)
                argv += words
        return argv, read

    def signature(self, top: str, **values: str | Sequence[str]) -> list[str]:
        """``portable_signature(self.render(**values), top)``, the fixed words rewritten once per ``top``.

        The same words: :func:`portable_signature` decides from, and rewrites, only words that start with
        one of the flags it reads (:data:`_SIGNATURE_FLAGS`), each on its own; while no slot's word starts
        with one, those are all fixed words, in the same order, whatever the slots hold."""
        portable = self._portable.get(top)
        if portable is None:
            fixed = [arg for arg in self.argv if isinstance(arg, str)]
            rewritten = iter(portable_signature(fixed, top))
            portable = CommandTemplate(tuple(next(rewritten) if isinstance(arg, str) else arg for arg in self.argv))
            self._portable[top] = portable
        argv, read = portable._fill(values)
        return portable_signature(self.render(**values), top) if read else argv

    def bind(self, **values: str | Sequence[str]) -> BoundCommand:
        """This command for one node: its words or its signature words, rendered when asked."""
        return BoundCommand(self, values)


@dataclass(frozen=True)
class BoundCommand:
    """A :class:`CommandTemplate` with its slots' values: what a build tool's renderer returns, so the tool
    asks for the words it needs (the command's, or its portable signature's, see
    :meth:`CommandTemplate.signature`)."""

    template: CommandTemplate
    values: Mapping[str, str | Sequence[str]]

    def words(self) -> list[str]:
        return self.template.render(**self.values)

    def signature(self, top: str) -> list[str]:
        return self.template.signature(top, **self.values)


@functools.lru_cache(maxsize=512)
def probe(driver: str, language: str, flags: tuple[str, ...], cwd: str, cache: ProbeCache | None = None, *,
           mode: tuple[str, ...] = ("-fopenmp",), extension: str | None = None,
           what: str = "offload") -> tuple[tuple[str, ...], ...]:
    """Run ``driver -### <mode> <flags> -c`` on an empty probe source and return the jobs it would run
    (memoized, and kept in ``cache``). ``mode`` selects the offload model (``-fopenmp``; the HIP model
    passes ``-x hip``), ``extension`` the probe file's (default: from ``language``), ``what`` names the
    flags in the error."""
    def ask_driver() -> tuple[tuple[str, ...], ...]:
        import tempfile  # a probe runs once per flag set (then it is cached): not every command's start-up

        with tempfile.TemporaryDirectory(prefix="offload-probe-") as scratch:
            source = Path(scratch) / f"{PROBE_STEM}{extension or ('.c' if language == 'c' else '.cpp')}"
            source.write_text("")
            argv = [driver, "-###", *mode, *flags, "-c", str(source), "-o", str(Path(scratch) / f"{PROBE_STEM}.o")]
            done = run_driver(argv, cwd)
        if done.returncode != 0:
            raise ProbeError(f"{driver_errors(done.stderr)} ({driver} -### rejected the {what} flags"
                             f" {_shortened(' '.join(flags))})")
        return tuple(tuple(job) for job in parse_driver_jobs(done.stderr))

    key = ProbeCache.key(driver, language, flags, cwd) if cache is not None else ""
    return remembered_jobs(key, cache, ask_driver)


def driver_errors(stderr: str) -> str:
    """The driver's own diagnostics in ``-###`` output (``clang: error: ...``), each once, without the jobs it
    printed around them (5 KB of ``-cc1`` lines that hide the one line that matters)."""
    said = [line.strip() for line in stderr.splitlines() if line.strip() and not line.startswith(' "')]
    errors = [line for line in said if ": error: " in line or line.startswith("error: ")]
    chosen = list(dict.fromkeys(errors)) or said[-3:]
    return "; ".join(chosen) or "no message"


def _shortened(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit - 5] + " ..."


#: Flags by which the driver itself would choose the offload targets; our nodes choose them per target.
_TARGET_SELECTION_PREFIXES = ("--offload-arch=", "--no-offload-arch=", "-fopenmp-targets=", "--offload-targets=",
                              "--cuda-gpu-arch=", "--no-cuda-gpu-arch=")


def target_selection_flags(flags: Iterable[str]) -> list[str]:
    """The flags in ``flags`` that select offload targets (``--offload-arch=``, ``-fopenmp-targets=``...):
    a build system that makes one node per target has its own list of targets, and such a flag would make
    the driver print jobs for other targets besides the one probed."""
    return [flag for flag in flags if flag.startswith(_TARGET_SELECTION_PREFIXES)]


def run_driver(argv: Sequence[str], cwd: str, environ: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a driver probe (``argv`` holds ``-###``); a driver that cannot start is a ToolchainError. Its output is
    decoded as the OS gives names (``surrogateescape``): a path that is not UTF-8 comes back as the same bytes."""
    try:
        return subprocess.run(argv, cwd=cwd, env=environ, capture_output=True, text=True, errors="surrogateescape",
                              check=False, timeout=120)
    except OSError as error:
        raise ToolchainError(f"cannot run {argv[0]}: {error.strerror}") from None


JobList = tuple[tuple[str, ...], ...]


def remembered_jobs(key: str, cache: ProbeCache | None, ask_driver: Callable[[], JobList]) -> JobList:
    """The driver's jobs for ``key``: from ``cache``, else from the per-user probe cache (copied into
    ``cache``), else ``ask_driver()``, then kept in both, an empty answer too (a probe that failed is
    not asked again: that would start a process in every run, no-op builds included). Without ``cache``
    nothing is read or kept."""
    if cache is None:
        return ask_driver()
    if (cached := cache.get(key)) is not None:
        return cached
    # A fresh checkout (or `git clean`) of a project probed before finds the answers in the per-user cache.
    shared = user_cache("driver-probes.json", max_entries=256)
    if shared is not None and shared is not cache and (cached := shared.get(key)) is not None:
        cache.put(key, cached)
        return cached
    jobs = ask_driver()
    cache.put(key, jobs)
    if shared is not None and shared is not cache:
        shared.put(key, jobs)
    return jobs


def _from_probe(arg: str) -> bool:
    """Whether ``arg`` names a file of a probe: its scratch directory, or a driver temporary named after it."""
    return PROBE_STEM in arg or "offload-probe-" in arg


def quote_make_target(path: str) -> str:
    """``path`` as the driver writes it after ``-MT`` when it names the output itself (Clang's ``QuoteTarget``)."""
    quoted: list[str] = []
    for index, char in enumerate(path):
        if char in " \t":
            backslashes = len(path[:index]) - len(path[:index].rstrip("\\"))
            quoted.append("\\" * backslashes + "\\")
        elif char == "$":
            quoted.append("$")
        elif char == "#":
            quoted.append("\\")
        quoted.append(char)
    return "".join(quoted)


def dependency_values(template: CommandTemplate, output: str) -> dict[str, str]:
    """The values of ``template``'s dependency slots for a job whose result is ``output`` (what the
    user's ``-o`` would name): the driver's own ``-MT`` for it, and, for a bare ``-MD``/``-MMD``, its
    dependency file (``output`` with the suffix ``.d``)."""
    values = {}
    if "dependency_target" in template.slots:
        values["dependency_target"] = quote_make_target(output)
    if "dependency_file" in template.slots:
        values["dependency_file"] = os.path.splitext(output)[0] + ".d"
    return values


def job_template(job: Sequence[str], *, input_slot: str, input_value: str | None = None, output_slot: str = "output",
              value_slots: Mapping[str, str] | None = None, prefix_slots: Mapping[str, str] | None = None,
              replace_prefix: Mapping[str, str] | None = None, dependencies: bool = False) -> CommandTemplate:
    """Turn a probed job into a template: the ``-o`` value, the input and named flags become slots.

    The input is ``input_value`` where given (ptxas puts ``-c`` after it), else the last argument
    (cc1 jobs end in ``-x <lang> <input>``). A dependency file (``-MD`` and friends) stays where
    ``dependencies`` is true, with the driver's names derived from the probe's output as the slots
    ``dependency_target`` and ``dependency_file`` (see :func:`dependency_values`); elsewhere the job
    writes none, so one source's nodes never write one file. Any other argument naming a probe file
    is a :class:`ProbeError`: it would put a temporary path into a real command.
    """
    input_value = job[-1] if input_value is None else input_value
    value_slots = value_slots or {}
    prefix_slots = prefix_slots or {}
    replace_prefix = replace_prefix or {}
    argv: list[Arg] = []
    skip_next = False
    for index, arg in enumerate(job):
        if skip_next:
            skip_next = False
            continue
        if arg in DEPENDENCY_VALUE_OPTIONS and index + 1 < len(job) and arg not in value_slots:
            skip_next = True
            if dependencies:
                value = job[index + 1]
                slot = "dependency_target" if arg == "-MT" else "dependency_file"
                argv.extend([arg, Slot(slot) if _from_probe(value) else value])
            continue
        if arg in DEPENDENCY_OPTIONS:
            if dependencies:
                argv.append(arg)
            continue
        if arg == input_value:
            argv.append(Slot(input_slot))
            continue
        if arg in ("-o", "--output-file"):
            argv.extend([arg, Slot(output_slot)])
            skip_next = True
            continue
        if arg in value_slots:
            argv.extend([arg, Slot(value_slots[arg])])
            skip_next = True
            continue
        for prefix, slot in prefix_slots.items():
            if arg.startswith(prefix):
                argv.append(Slot(slot, prefix))
                break
        else:
            for prefix, replacement in replace_prefix.items():
                if arg.startswith(prefix):
                    argv.append(prefix + replacement)
                    break
            else:
                if _from_probe(arg):
                    raise ProbeError(f"the driver's job names a temporary file of the probe ({arg}): a flag derives"
                                     " a path from the output or the input, which build nodes cannot reproduce;"
                                     " name that path in the flag instead")
                argv.append(arg)
    return CommandTemplate(tuple(argv))

#: The ``-cc1`` flags that name the directory the compile runs in (for us: the top directory).
COMPILATION_DIR_FLAGS: tuple[str, ...] = ("-fdebug-compilation-dir=", "-fcoverage-compilation-dir=")

#: The ``-cc1`` prefix maps (``-ffile-prefix-map=OLD=NEW`` becomes all three): paths under OLD are recorded as NEW.
PREFIX_MAP_FLAGS: tuple[str, ...] = ("-fdebug-prefix-map=", "-fmacro-prefix-map=", "-fcoverage-prefix-map=")

#: The ``-cc1`` flags through which the working directory (or paths made absolute from it) reaches the output,
#: each with the flags that say which directory it records and how prefix maps rewrite it, or None where
#: nothing keeps it out (gcov's absolute file names, the recorded command line, split DWARF).
_RECORDS_DIRECTORY: Mapping[str, tuple[str, str] | None] = {
    "-debug-info-kind=": ("-fdebug-compilation-dir=", "-fdebug-prefix-map="),
    "-fcoverage-mapping": ("-fcoverage-compilation-dir=", "-fcoverage-prefix-map="),
    "-coverage-notes-file": None,
    "-coverage-data-file": None,
    "-split-dwarf-file": None,
    "-split-dwarf-output": None,
    "-dwarf-debug-flags": None,
    "-record-command-line": None,
}

#: What a portable signature writes for the top directory (SCons' own name for it).
SIGNATURE_TOP = "#"


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _records_top(argv: Sequence[str], directory_flag: str, map_flag: str, tops: Sequence[str]) -> bool:
    """Whether the output records the top directory's own path: the compilation directory (``directory_flag``,
    the last one wins; the driver always passes one) is in it, and no ``map_flag`` prefix map rewrites the top
    directory itself to one NEW wherever it is (one maps exactly it, none a directory above it)."""
    directories = [arg[len(directory_flag):] for arg in argv if arg.startswith(directory_flag)]
    if directories and not any(_under(directories[-1], top) for top in tops):
        return False  # -ffile-compilation-dir=. and the like
    olds = [arg[len(map_flag):].split("=", 1)[0].rstrip("/") or "/" for arg in argv if arg.startswith(map_flag)]
    exact = any(old in tops for old in olds)
    above = any(_under(top, old) and old not in tops for old in olds for top in tops)
    return not exact or above


def portable_signature(argv: Sequence[str], top: str) -> list[str]:
    """``argv`` as the build signature of a command run in ``top``, without ``top`` where the output cannot
    depend on it, so another checkout of the project (or this one moved) has the same signature: its nodes
    stay up to date and a shared ``CacheDir`` gives back what this one built.

    The driver names its working directory in every ``-cc1`` job (``-fdebug-compilation-dir=<top>``), but
    it reaches the output only through the flags of :data:`_RECORDS_DIRECTORY` (debug info above all). So
    when the job has none of them, or each records another directory (the user's ``-ffile-compilation-dir=.``)
    or a prefix map of ``top`` itself (``-ffile-prefix-map=<top>=.``), the words that name ``top`` in
    compilation-directory and prefix-map flags are written with :data:`SIGNATURE_TOP`. Otherwise ``argv``
    stays as it is: the output records this checkout, and another checkout must not reuse it.
    """
    # Every node's signature goes through here (~80 words a -cc1 line): the words are searched as one string
    # (no word holds a NUL) for the few that start with a flag of interest, which are looked at one by one.
    joined = "\0" + "\0".join(argv)
    positions = _words_starting_with(joined, _SIGNATURE_FLAGS)
    if not positions:
        return list(argv)
    found = [word for _, word in positions]
    tops = _tops(top)
    if any(arg.startswith(_RECORDERS) for arg in found):
        for recorder, flags in _RECORDS_DIRECTORY.items():
            if any(arg.startswith(recorder) for arg in found) and (flags is None or _records_top(found, *flags, tops)):
                return list(argv)

    def portable(arg: str) -> str:
        for flag in _PORTABLE_FLAGS:
            if arg.startswith(flag):
                value = arg[len(flag):]
                for path in tops:
                    if _under(value.split("=", 1)[0] if flag in PREFIX_MAP_FLAGS else value, path):
                        return flag + SIGNATURE_TOP + value[len(path):]
        return arg

    pieces, done = [], 0
    for start, word in positions:
        if word.startswith(_PORTABLE_FLAGS) and (rewritten := portable(word)) != word:
            pieces += [joined[done:start], rewritten]
            done = start + len(word)
    pieces.append(joined[done:])
    return "".join(pieces).split("\0")[1:]


def _words_starting_with(joined: str, flags: Sequence[str]) -> list[tuple[int, str]]:
    """(offset, word) of each word of a NUL-joined, NUL-prefixed argv that starts with one of ``flags``, in
    argv order (substring searches: no Python loop over the words)."""
    found = []
    for flag in flags:
        start = joined.find("\0" + flag)
        while start >= 0:
            end = joined.find("\0", start + 1)
            found.append((start + 1, joined[start + 1:end if end >= 0 else len(joined)]))
            start = joined.find("\0" + flag, start + 1)
    return sorted(found)


#: The flags :func:`portable_signature` rewrites, and every flag it reads to decide whether it may.
_PORTABLE_FLAGS: tuple[str, ...] = (*COMPILATION_DIR_FLAGS, *PREFIX_MAP_FLAGS)
_RECORDERS: tuple[str, ...] = tuple(_RECORDS_DIRECTORY)
_SIGNATURE_FLAGS: tuple[str, ...] = tuple(dict.fromkeys((*_PORTABLE_FLAGS, *_RECORDS_DIRECTORY, *(
    flag for flags in _RECORDS_DIRECTORY.values() if flags for flag in flags))))


@functools.lru_cache(maxsize=64)
def _tops(top: str) -> tuple[str, ...]:
    """``top`` as given and resolved (one ``realpath`` per top directory, not per node)."""
    return tuple(dict.fromkeys(path.rstrip("/") for path in (top, os.path.realpath(top))))


def image_spec(packager_job: Sequence[str]) -> tuple[str, ...]:
    images = [arg for arg in packager_job if arg.startswith("--image=")]
    if len(images) != 1:
        raise ToolchainError(f"expected one --image in the driver's packager job, got {len(images)}: {packager_job}")
    pairs = images[0][len("--image="):].split(",")
    return tuple(pair for pair in pairs if not pair.startswith("file="))


_Made = TypeVar("_Made")


def memoized(memo: dict[Any, Any], key: Hashable, make: Callable[[], _Made]) -> _Made:
    """``make()`` once per ``key`` in ``memo``: what a phase model derives from the driver's jobs per target and
    flags, which every node of every source with those flags renders from."""
    if key not in memo:
        memo[key] = make()
    return memo[key]
