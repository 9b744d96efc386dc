"""Clang's jobs as words: what ``clang -###`` prints, and the ``-cc1`` options that the driver layer
(:mod:`offload_builders.driver`) and the compiler launcher (:mod:`offload_builders.launcher.jobs`) both read.

Its own module, importing little, because the launcher starts for every compile of a build: it needs these
words, not the driver layer's templates, probes and caches.
"""
from __future__ import annotations

import os
import re

TYPE_CHECKING = False  # typing costs every compile's start-up: for type checkers only
if TYPE_CHECKING:
    from collections.abc import Sequence


def parse_driver_jobs(text: str) -> list[list[str]]:
    """Split ``clang -###`` output into one argv per job (job lines start with a space and a quote)."""
    return [_job_words(line) for line in text.splitlines() if line.startswith(' "')]


#: One word as ``clang -###`` prints it (``llvm::sys::printArg``): in double quotes, with ``"``, ``\`` and ``$``
#: escaped by a backslash.
_PRINTED_WORD = re.compile(r' "((?:[^"\\]|\\.)*)"', re.DOTALL)
_PRINTED_ESCAPE = re.compile(r"\\(.)", re.DOTALL)


def _job_words(line: str) -> list[str]:
    """A job line's words exactly as the driver would pass them. Not ``shlex.split``: in double quotes it keeps
    the backslash of ``\\$``, so a ``$`` in the project's path (``-fdebug-compilation-dir=``) or in a flag
    became ``\\$``, a word the job never had. A line in another form falls back to ``shlex.split``."""
    words, end = [], 0
    for match in _PRINTED_WORD.finditer(line):
        if match.start() != end:
            break
        words.append(_PRINTED_ESCAPE.sub(r"\1", match.group(1)))
        end = match.end()
    else:
        if not line[end:].strip():
            return words
    import shlex  # a line in another form: rare

    return shlex.split(line)


def value_after(argv: Sequence[str], flag: str) -> str | None:
    for index, arg in enumerate(argv[:-1]):
        if arg == flag:
            return argv[index + 1]
    return None


def is_cc1(job: Sequence[str]) -> bool:
    return len(job) > 1 and job[1] == "-cc1"


def tool_name(job: Sequence[str]) -> str:
    return os.path.basename(job[0])


#: The ``-cc1`` options of a dependency file (``-MD``, ``-MMD``, ``-MF``, ``-MT``, ``-MQ``, ``-MP``, ``-MG``, ``-MV``
#: as the driver forwards them): those followed by a value, then the bare ones.
DEPENDENCY_VALUE_OPTIONS = ("-dependency-file", "-MT")
DEPENDENCY_OPTIONS = ("-sys-header-deps", "-module-file-deps", "-MP", "-MG", "-MV")


#: A ``-cc1`` job's action flags: a dependency scan replaces the one a job has by ``-Eonly``.
_CC1_ACTIONS = frozenset({"-emit-obj", "-emit-llvm-bc", "-emit-llvm", "-S", "-emit-llvm-only", "-emit-codegen-only"})


def split_dependency_options(job: Sequence[str]) -> tuple[list[str], list[str]]:
    """A ``-cc1`` job's dependency-file options but the file's name (``-MT`` values and the bare flags), and its
    words without any of them."""
    options: list[str] = []
    rest: list[str] = []
    index = 0
    while index < len(job):
        word = job[index]
        if word in DEPENDENCY_VALUE_OPTIONS and index + 1 < len(job):
            if word != "-dependency-file":
                options += [word, job[index + 1]]
            index += 2
            continue
        (options if word in DEPENDENCY_OPTIONS else rest).append(word)
        index += 1
    return options, rest


def with_dependency_file(job: Sequence[str], depfile: str, target: str, *, system_headers: bool = False
                         ) -> list[str]:
    """A ``-cc1`` job that also writes the files it reads to ``depfile`` (``-MMD`` semantics; ``system_headers``:
    ``-MD``'s)."""
    return [*job[:2], "-dependency-file", depfile, "-MT", target, *(["-sys-header-deps"] if system_headers else []),
            *job[2:]]


def scan_reads(job: Sequence[str], scratch: str, *, system_headers: bool = False) -> list[str] | None:
    """The files a ``-cc1`` job reads (the source, then the headers; ``system_headers``: those too), from the same
    job preprocessing only (``-Eonly``, no ``-o``, its own dependency options replaced by a file in ``scratch``);
    None where that cannot be had (its diagnostics are for the real compile to print)."""
    from offload_builders.depfiles import read_make_dependencies

    _, scan = split_dependency_options(job)
    actions = [index for index, word in enumerate(scan) if word in _CC1_ACTIONS]
    outputs = [index for index, word in enumerate(scan[:-1]) if word == "-o"]
    if not is_cc1(scan) or len(actions) != 1 or len(outputs) != 1:
        return None
    scan[actions[0]] = "-Eonly"
    del scan[outputs[0]:outputs[0] + 2]
    depfile = os.path.join(scratch, "scan.d")
    try:
        import subprocess  # only for a scan: a launcher hit never runs one

        done = subprocess.run(with_dependency_file(scan, depfile, "scan", system_headers=system_headers),
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              check=False)
        return read_make_dependencies(depfile) if done.returncode == 0 else None
    except OSError:
        return None


#: The options of Clang 22's compile-time ``clang-linker-wrapper --emit-fatbin-only`` (HIP, new offload driver,
#: no RDC) that a split of it follows (or that do not change its output): which images, where the bundler is.
_WRAPPER_FOLLOWED = ("--should-extract=", "--host-triple=amdgcn-amd-amdhsa", "--linker-path=")


class CompileTimeLink:
    """What a compile-time ``clang-linker-wrapper --emit-fatbin-only`` job says, read as the wrapper reads it:
    its output, the device compiler's arguments for AMDGPU (``--device-compiler=[<triple>=]<arg>``), the bundler's
    compression options, and the first option a split does not follow (None: every one is followed). One reader
    for the models (which split it into nodes) and the compiler launcher (which splits it into jobs)."""

    __slots__ = ("output", "device_args", "bundler_args", "unfollowed")

    def __init__(self, wrapper: Sequence[str]) -> None:
        self.output: str | None = None
        self.device_args: list[str] = []
        self.bundler_args: list[str] = []
        self.unfollowed: str | None = None
        words = list(wrapper[1:])
        index = 0
        while index < len(words):
            word = words[index]
            if word == "-o" and index + 1 < len(words):
                self.output = words[index + 1]
                index += 1
            elif word.startswith("--device-compiler="):
                value = word[len("--device-compiler="):]
                triple, sep, arg = value.partition("=")
                if not sep or triple.startswith("-"):
                    self.device_args.append(value)
                elif triple == "amdgcn-amd-amdhsa":
                    self.device_args.append(arg)
            elif word in ("--compress", "-compress") or word.startswith(("--compression-level=",
                                                                          "-compression-level=")):
                self.bundler_args.append("-" + word.lstrip("-"))  # the bundler's spelling, as the wrapper passes it
            elif not (word == "--emit-fatbin-only" or word.startswith(_WRAPPER_FOLLOWED) or not word.startswith("-")):
                if self.unfollowed is None:
                    self.unfollowed = word
            index += 1
