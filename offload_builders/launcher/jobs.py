"""An offload compile run job by job, as the driver would run it, each job's output kept in the cache on its own.

``clang -###`` prints the jobs the driver would run (for OpenMP: the host front end, a device compile per target,
``clang-offload-packager``, the host back end that embeds the package). The launcher runs the same jobs in the
same order with the same words, but for

* the driver's temporary files, which get names in a private scratch directory (each keeps its suffix: the
  packager takes an image's kind from it); the object is written to ``<object>.partial`` and renamed;
* dependency files: each job's ``-dependency-file`` writes into the scratch directory; the driver's file is the
  one the last such job writes (every job writes the same name), so that one is copied to the name asked for;
* each compile that reads the source also lists every file it read (system headers too) for the key: its own
  dependency file where it writes one with system headers, else one added for the purpose, else (``-MMD``) a
  preprocessing-only scan of the same job after it ran.

A job's key (:mod:`offload_builders.launcher.keys`) holds its words with those names replaced by placeholders,
the digests of the earlier jobs' outputs it reads, and for the compiles of the source the files they read. Adding
a target of the same triple leaves the host front end's words and every other target's device compile as they
were: only the new device compile, the packager and the embedding back end run. Diagnostics are kept per job and
printed in the driver's order, from the cache too. A failed job is handled as the driver handles it: the jobs that
do not read its output still run (HIP and CUDA: no further offloading job), and the first failure's exit status is the
command's.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from offload_builders.depfiles import read_make_dependencies
from offload_builders.job_words import (
    CompileTimeLink,
    is_cc1,
    parse_driver_jobs,
    scan_reads,
    split_dependency_options,
    value_after,
    with_dependency_file,
)
from offload_builders.launcher.command import diagnostics_shown
from offload_builders.launcher.in_process import (
    Embedding,
    embedded_here,
    embedding_of,
    packaged_here,
    remember_embedding,
)
from offload_builders.launcher.keys import (
    Key,
    file_digest,
    job_records_directory,
    lookup_by_files,
    program_identity,
    store_by_files,
)
from offload_builders.launcher.store import CacheStore, Entry, remove_tree, scratch_directory

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from offload_builders.launcher.command import Command
    from offload_builders.launcher.jobserver import Slots

#: Lines of ``-###`` output that are the driver describing itself, not a diagnostic it would print when compiling.
_DRIVER_BANNER = ("Target: ", "Thread model: ", "InstalledDir: ", "Configuration file: ", "Build config: ",
                  "System configuration file directory: ", "User configuration file directory: ")

#: The options by which the driver's jobs name their output (``-o``; ``ptxas``: ``--output-file``; CUDA's
#: ``fatbinary``: ``--create``), and those that hold it in the same word (``clang-offload-bundler``: ``-output=``).
_OUTPUT_OPTIONS = ("-o", "--output-file", "--create")
_OUTPUT_PREFIXES = ("-output=",)


class UnfollowedJobs(Exception):
    """The driver printed jobs whose outputs the launcher cannot tell: it runs the command unchanged."""


class JobsFailed(Exception):
    """A job failed: its diagnostics (and the earlier jobs') were printed; the command's exit status."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class DriverJobs:
    """The jobs ``-###`` printed for a command, and what the driver itself said (its warnings)."""

    __slots__ = ("jobs", "said")

    def __init__(self, jobs: list[list[str]], said: str) -> None:
        self.jobs = jobs
        self.said = said


def driver_jobs(command: Command, store: CacheStore | None, base: Key) -> DriverJobs | None:
    """The jobs of ``command`` (``base``: its key without files), from the cache unless the command names
    ``native`` (this machine's GPUs, asked at every compile) or the cache is off. None: ``-###`` failed (the
    command then runs as it is, so that the driver says why)."""
    cached = "native" not in " ".join(command.expanded) and store is not None
    key = base.copy().add("-###").hex()
    if cached and store is not None and (entry := store.lookup(key)) is not None:
        with entry:
            try:
                record = json.loads(entry.meta)
                return DriverJobs([list(job) for job in record["jobs"]], str(record["said"]))
            except (ValueError, KeyError, TypeError):
                pass
    try:
        done = subprocess.run([command.compiler, "-###", *command.arguments], capture_output=True,
                              text=True, errors="surrogateescape", check=False)
    except OSError:
        return None
    if done.returncode != 0:
        return None
    jobs = parse_driver_jobs(done.stderr)
    lines = [line for line in done.stderr.splitlines(keepends=True) if not line.startswith(' "')]
    if lines and " version " in lines[0]:
        lines = lines[1:]
    said = "".join(line for line in lines if not line.startswith(_DRIVER_BANNER))
    if cached and store is not None and jobs:
        store.store(key, {}, json.dumps({"jobs": jobs, "said": said}).encode())
    return DriverJobs(jobs, said)


class _Job:
    """One job: its words as the driver printed them, where it writes, and what it reads of the earlier jobs."""

    __slots__ = ("index", "words", "output", "output_at", "output_prefix", "reads_source", "depfile")

    def __init__(self, index: int, words: list[str], source: str) -> None:
        self.index = index
        self.words = words
        at = [(i + 1, "") for i, word in enumerate(words[:-1]) if word in _OUTPUT_OPTIONS]
        at += [(i, prefix) for i, word in enumerate(words) for prefix in _OUTPUT_PREFIXES if word.startswith(prefix)]
        if len(at) != 1:
            raise UnfollowedJobs(f"job {index} ({os.path.basename(words[0])}) names {len(at)} outputs")
        #: Where the output's name is in the words, and what precedes it in that word.
        self.output_at, self.output_prefix = at[0]
        self.output = words[self.output_at][len(self.output_prefix):]
        self.reads_source = is_cc1(words) and source in words and value_after(words, "-x") != "ir"
        self.depfile = value_after(words, "-dependency-file") if is_cc1(words) else None


class Result:
    """What a run gave: the files every compile of the source read, the driver's dependency file, diagnostics,
    and the exit status of the first job that failed (0: none)."""

    __slots__ = ("read", "depfile", "depfile_text", "stderr", "status", "colour", "programs", "read_listed",
                 "failures")

    def __init__(self) -> None:
        #: Whether ``read`` lists every file of every compile (else the command as a whole is not stored).
        self.read_listed = True
        self.colour = "auto"
        #: The programs the jobs run besides the compiler (its identity is in the command's key).
        self.programs: list[str] = []
        self.read: list[str] = []
        self.depfile: str | None = None
        self.depfile_text: bytes | None = None
        self.stderr = b""
        self.status = 0
        #: The driver's "command failed" lines of the jobs that failed, printed after every job's diagnostics.
        self.failures = b""


class _Outcome:
    """One job's part of the run, applied in the driver's order: its diagnostics, the files it read, its
    dependency file, and its exit status where it failed (then the jobs after it do not count)."""

    __slots__ = ("stderr", "read", "depfile_text", "status", "unlisted", "failure")

    def __init__(self, stderr: bytes, read: list[str], depfile_text: bytes | None = None, status: int = 0, *,
                 unlisted: bool = False) -> None:
        self.stderr = stderr
        self.read = read
        self.depfile_text = depfile_text
        self.status = status
        #: It ran, but which files it read could not be had (so the command as a whole is not stored).
        self.unlisted = unlisted
        #: Where it failed: the driver's own line about it (:func:`failure_message`).
        self.failure = b""


#: A job the driver would not run: one whose input's job failed.
_SKIPPED = _Outcome(b"", [], status=-1)


def job_slots_for(command: Command, jobs: int) -> Slots:
    """How a command's jobs may run at once. One after another, as the driver runs them, unless the build's
    GNU make jobserver is really there (:mod:`offload_builders.launcher.jobserver`: then on the build's own
    slots, this process's implicit one and the tokens it can take) or ``$OFFLOAD_CACHE_JOBS=<n>`` allows n
    (within the jobserver's slots where there is one). HIP and CUDA compiles run one after another: after a
    failed job the driver runs no further offloading job."""
    from offload_builders.launcher.jobserver import Slots, job_slots

    if command.gpu:
        return Slots(1)
    try:
        asked: int | None = max(1, int(os.environ["OFFLOAD_CACHE_JOBS"]))
    except (KeyError, ValueError):
        asked = None
    slots = job_slots(jobs if asked is None else asked, os.environ)
    if asked is not None and slots.limit == 1 and asked > 1:  # no jobserver: the variable's own number
        slots.close()
        return Slots(asked)
    return slots


def run_jobs(command: Command, found: DriverJobs, store: CacheStore | None, cwd: str, output: str,
             log: list[str]) -> Result:
    """Run (or take from the cache) every job of ``found``; the object goes to ``output`` (atomically). Raises
    :class:`JobsFailed` where a job fails, after printing the diagnostics the driver would have printed."""
    assert command.source is not None
    if command.gpu and not any(word.startswith("-cuid=") or word == "-fuse-cuid=none" for word in command.expanded) \
            and any(word.startswith("-cuid=") for job in found.jobs for word in job):
        raise UnfollowedJobs("HIP or CUDA without -cuid=: the driver's default CUID hashes the whole command,"
                             " -### included, so no split run gives its objects; pass -cuid=<id> (one per source)"
                             " to cache it per target")
    jobs = [_Job(index, words, command.source) for index, words in enumerate(split_compile_time_link(found.jobs))]
    final = command.output
    if not jobs or jobs[-1].output != final:
        raise UnfollowedJobs("the driver's last job does not write the object")
    records = _records_directory(jobs)
    result = Result()
    result.colour = command.colour
    result.programs = list(dict.fromkeys([*(job.words[0] for job in jobs),
                                          *(linker for job in jobs for linker in linkers_of(job.words))]))
    result.stderr = found.said.encode(errors="surrogateescape")
    _print(result.stderr, result.colour)
    digests: dict[int, str] = {}
    entries: dict[int, Entry] = {}
    scratch = scratch_directory()
    try:
        names = _scratch_names(jobs, scratch)

        def one(job: _Job) -> _Outcome:
            outcome = _run_one(job, jobs, names, digests, entries, store, cwd, records, scratch, log, command.colour)
            if outcome.status:
                outcome.failure = failure_message(command.compiler, job.words, outcome.status, command.gpu,
                                                  result.colour != "never")
            return outcome

        slots = job_slots_for(command, len(jobs))
        try:
            if slots.limit == 1:
                failed: set[int] = set()
                for job in jobs:
                    skip = (command.gpu and bool(failed)) or bool(_inputs_of(job, jobs) & failed)
                    outcome = _SKIPPED if skip else one(job)
                    if outcome.status:
                        failed.add(job.index)
                    _apply(job, outcome, result)
            else:
                _run_in_parallel(jobs, one, slots, result)
        finally:
            slots.close()
            for entry in entries.values():
                entry.close()
        if result.status:  # the driver's own lines come after every job's diagnostics, as it prints them
            _print(result.failures, result.colour)
            result.stderr += result.failures
            raise JobsFailed(result.status)
        last = jobs[-1]
        partial = output + ".partial"
        copy_file(names[last.index], partial)
        os.replace(partial, output)
    finally:
        remove_tree(scratch)
    return result


def copy_file(source: str, destination: str) -> None:
    """``source``'s bytes to ``destination`` (made or truncated), in the kernel where it can."""
    with open(source, "rb") as src, open(destination, "wb") as dst:
        size = os.fstat(src.fileno()).st_size
        offset = 0
        try:
            while offset < size:
                sent = os.sendfile(dst.fileno(), src.fileno(), offset, size - offset)
                if sent == 0:
                    break
                offset += sent
        except OSError:
            src.seek(offset)
            dst.seek(offset)
            while chunk := src.read(1 << 20):
                dst.write(chunk)


def split_compile_time_link(jobs: Sequence[Sequence[str]]) -> list[list[str]]:
    """The driver's jobs with Clang 22's compile-time ``clang-linker-wrapper --emit-fatbin-only`` (and the
    ``llvm-offload-binary`` that feeds it) replaced by what the wrapper runs: per target, its device link
    (``clang --target=amdgcn-amd-amdhsa -mcpu=<arch> -flto``, the bitcode named as an object file, as the wrapper
    names what it extracts), then ``clang-offload-bundler`` with the wrapper's entries (by target descending) to
    the wrapper's output. So adding a target links that target alone; the other links are hits. Jobs without
    such a wrapper are returned as they are; a wrapper option not followed raises :class:`UnfollowedJobs`."""
    wrappers = [job for job in jobs if os.path.basename(job[0]) == "clang-linker-wrapper"]
    if not wrappers:
        return [list(job) for job in jobs]
    wrapper = wrappers[0]
    packagers = [job for job in jobs if os.path.basename(job[0]) == "llvm-offload-binary"]
    if len(wrappers) != 1 or "--emit-fatbin-only" not in wrapper or len(packagers) != 1:
        raise UnfollowedJobs("a linker wrapper at compile time that is not one --emit-fatbin-only of one package")
    link = CompileTimeLink(wrapper)
    if link.unfollowed is not None:
        raise UnfollowedJobs(f"the compile-time linker wrapper has {link.unfollowed}")
    output, device_args, bundler_args = link.output, link.device_args, link.bundler_args
    images = []
    for word in packagers[0]:
        if word.startswith("--image="):
            fields = dict(part.partition("=")[::2] for part in word[len("--image="):].split(","))
            if fields.get("triple") != "amdgcn-amd-amdhsa" or not fields.get("file") or not fields.get("arch"):
                raise UnfollowedJobs(f"the package's image {word} is not an AMDGPU one")
            images.append((fields["file"], fields["arch"]))
    if output is None or not images:
        raise UnfollowedJobs("the compile-time linker wrapper names no output or no image")
    tools = os.path.dirname(wrapper[0])
    as_object = {file: file + ".o" for file, _ in images}
    result: list[list[str]] = []
    for job in jobs:
        if job is wrapper:
            linked = {}
            for file, arch in images:
                linked[arch] = file + ".img"
                result.append([os.path.join(tools, "clang"), "--no-default-config", "-o", linked[arch],
                               "--target=amdgcn-amd-amdhsa", f"-mcpu={arch}", "-flto", "-Wl,--no-undefined",
                               as_object[file], *device_args])
            order = sorted(linked, reverse=True)
            result.append([os.path.join(tools, "clang-offload-bundler"), "-type=o", "-bundle-align=4096",
                           "-targets=" + ",".join(["host-x86_64-unknown-linux-gnu",
                                                    *(f"hip-amdgcn-amd-amdhsa--{arch}" for arch in order)]),
                           "-input=/dev/null", *(f"-input={linked[arch]}" for arch in order), f"-output={output}",
                           *bundler_args])
        elif job is not packagers[0]:
            result.append([as_object.get(word, word) for word in job])
    return result


def _run_in_parallel(jobs: Sequence[_Job], one: Callable[[_Job], _Outcome], slots: Slots, result: Result) -> None:
    """Each job once the earlier jobs whose outputs it reads are done, on one of ``slots`` (at most its limit at
    once); their outcomes applied in the driver's order, up to the first failure. A job waits for its inputs
    holding no slot, and only for earlier jobs, which started before it (the pool takes them in order), so the
    pool always makes progress."""
    from concurrent.futures import Future, ThreadPoolExecutor

    futures: dict[int, Future[_Outcome]] = {}

    def task(job: _Job) -> _Outcome:
        if any(futures[index].result().status for index in _inputs_of(job, jobs)):
            return _SKIPPED  # an input's job failed: the driver never runs this one
        return slots.run(one, job)

    with ThreadPoolExecutor(max_workers=slots.limit) as pool:
        try:
            for job in jobs:
                futures[job.index] = pool.submit(task, job)
            for job in jobs:
                _apply(job, futures[job.index].result(), result)
        except BaseException:
            for future in futures.values():
                future.cancel()
            raise


def _inputs_of(job: _Job, jobs: Sequence[_Job]) -> set[int]:
    """The earlier jobs whose outputs ``job`` reads."""
    return {other.index for other in jobs[:job.index] if other.output and any(other.output in word
                                                                              for word in job.words)}


def _apply(job: _Job, outcome: _Outcome, result: Result) -> None:
    """Print a job's diagnostics and take its files and dependency file into ``result``. A failure is kept (the
    first one's exit status is the command's, as the driver's); the driver goes on with the jobs that do not read
    a failed job's output (OpenMP: the other targets' device compiles), so the caller does too."""
    result.stderr += outcome.stderr
    _print(outcome.stderr, result.colour)
    if outcome.status:
        if not result.status and outcome is not _SKIPPED:
            result.status = outcome.status if outcome.status > 0 else 1
        result.failures += outcome.failure
        return
    if outcome.unlisted:
        result.read_listed = False
    for path in outcome.read:
        if path not in result.read:
            result.read.append(path)
    if job.depfile is not None and outcome.depfile_text is not None:
        result.depfile, result.depfile_text = job.depfile, outcome.depfile_text


def _records_directory(jobs: Sequence[_Job]) -> bool:
    return any(job_records_directory(job.words) for job in jobs if is_cc1(job.words))


def _scratch_names(jobs: Sequence[_Job], scratch: str) -> dict[int, str]:
    """Each job's output in the scratch directory, keeping the driver's suffix."""
    names = {}
    for job in jobs:
        suffix = os.path.splitext(job.output or "")[1]
        names[job.index] = os.path.join(scratch, f"job{job.index}{suffix}")
    return names


def _replaced(word: str, mapping: dict[str, str]) -> str:
    for old, new in sorted(mapping.items(), key=lambda item: -len(item[0])):  # a name inside a longer one: last
        if old in word:
            word = word.replace(old, new)
    return word


def _run_one(job: _Job, jobs: Sequence[_Job], names: dict[int, str], digests: dict[int, str],
             entries: dict[int, Entry], store: CacheStore | None, cwd: str, records: bool, scratch: str,
             log: list[str], colour: str) -> _Outcome:
    """One job from the cache, or run here and stored; its outcome for :func:`_apply`."""
    reads = [jobs[index] for index in sorted(_inputs_of(job, jobs))]
    # An earlier output is named by its content, not by its job's place in the list, which adding a target shifts.
    placeholders = {other.output: f"@{digests[other.index]}@" for other in reads}
    to_scratch = {other.output: names[other.index] for other in reads}
    run_words = [_replaced(word, to_scratch) for word in job.words]
    key_words = [_replaced(word, placeholders) for word in job.words]
    run_words[job.output_at] = job.output_prefix + names[job.index]
    if colour == "auto" and is_cc1(run_words) and "-fcolor-diagnostics" not in run_words:
        run_words.insert(2, "-fcolor-diagnostics")  # kept coloured; shown as the terminal (or not) asks
    key_words[job.output_at] = job.output_prefix + "@output@"
    dependency_values, key_words = split_dependency_options(key_words)
    if dependency_values:  # where they were does not matter; what they are does
        key_words.append(f"deps {' '.join(dependency_values)}")
    if not records:
        key_words = [_cwd_free(word, cwd) for word in key_words]
    if job.reads_source and "-fopenmp-is-target-device" not in job.words:
        key_words = [_targets_free(word) for word in key_words]
    libraries = libraries_of(job.words)
    key_parts = [program_identity(job.words[0]), *key_words,
                 *(f"library {path} {file_digest(path)}" for path in libraries),
                 *(f"linker {program_identity(linker)}" for linker in linkers_of(job.words)),
                 *(("cwd", cwd) if records else ())]
    base = Key("job", *key_parts).hex()
    entry = _lookup(store, base, job.reads_source)
    if entry is not None:
        kept = json.loads(entry.meta)
        digests[job.index] = kept["digest"]
        entries[job.index] = entry
        if job is jobs[-1]:
            entry.copy_to("out", names[job.index])
        depfile_text = kept["depfile"].encode(errors="surrogateescape") if "depfile" in kept else None
        return _Outcome(kept["stderr"].encode(errors="surrogateescape"), [*kept.get("read", []), *libraries],
                        depfile_text)
    for other in reads:  # earlier outputs this job reads, taken from the cache where they were hits
        if other.index in entries and not os.path.exists(names[other.index]):
            entries[other.index].copy_to("out", names[other.index])
    output = names[job.index]
    depfile = os.path.join(scratch, f"job{job.index}.d")
    argv = _with_output(run_words, output, depfile, dependency_values, job.reads_source)
    embedding = embedding_of(job.words, key_parts) if store is not None else None
    stderr = _made_here(job, argv, output, reads, names, embedding, store)
    if stderr is not None:
        log.append(f"job {job.index} ({os.path.basename(job.words[0])}) made here")
    else:
        log.append(f"job {job.index} ({os.path.basename(job.words[0])}) ran")
        done = subprocess.run(argv, stderr=subprocess.PIPE, check=False)
        if done.returncode != 0:  # a signal's negative number is kept for the driver's message
            return _Outcome(done.stderr, [], status=done.returncode)
        stderr = done.stderr
    meta: dict[str, object] = {"stderr": stderr.decode(errors="surrogateescape")}
    read: list[str] = []
    text: bytes | None = None
    if job.reads_source:
        listed = _files_read(argv, depfile, dependency_values, scratch)
        if listed is None:  # which files it read is unknown: nothing of this command can be keyed by them
            return _Outcome(stderr, [], _read_file(depfile) if job.depfile is not None else None, unlisted=True)
        read = listed
        if job.depfile is not None:
            text = _read_file(depfile)
            meta["depfile"] = text.decode(errors="surrogateescape")
        meta["read"] = read
    digest = file_digest(output)
    assert digest is not None
    digests[job.index] = meta["digest"] = digest
    if store is not None:
        encoded = json.dumps(meta).encode()
        if job.reads_source:
            store_by_files(store, base, read, {"out": output}, encoded)
        else:
            store.store(base, {"out": output}, encoded)
        if embedding is not None:
            remember_embedding(store, embedding, base)
    return _Outcome(stderr, [*read, *libraries], text)


def _made_here(job: _Job, argv: list[str], output: str, reads: Sequence[_Job], names: dict[int, str],
               embedding: Embedding | None, store: CacheStore | None) -> bytes | None:
    """Where this process can make the job's output itself (:mod:`offload_builders.launcher.in_process`), make it
    at ``output``: the diagnostics the job would print. None: the job is to run."""
    if embedding is not None and store is not None and not _recaching():
        package = next((names[other.index] for other in reads if other.output == embedding.named), None)
        if package is not None and (made := embedded_here(store, embedding, package, output)) is not None:
            return made.encode(errors="surrogateescape")
        return None
    return b"" if packaged_here(argv, output) else None


def failure_message(compiler: str, words: Sequence[str], status: int, gpu: bool, colour: bool) -> bytes:
    """What the driver adds where one of its jobs failed: nothing for a front end that exited with 1 (it said why
    itself), else ``<driver>: error: <tool> command failed with exit code N`` with the tool's short name, the one
    the driver's ``Tool`` has (``-cc1``: "clang frontend"; HIP's ``lld``: "amdgcn-link"), whatever file runs it
    (``--ptxas-path``). Coloured as the driver colours it, for :func:`diagnostics_shown` to take out."""
    if status == 74:  # EX_IOERR (standard output closed, ...): the driver says nothing more
        return b""
    if is_cc1(words):
        if status == 1:
            return b""
        tool = "clang frontend"
    elif "--gpu-name" in words:
        tool = "ptxas"
    elif "--create" in words:
        tool = "fatbinary"
    elif os.path.basename(words[0]) in ("lld", "ld.lld"):
        tool = "amdgcn-link" if gpu else "ld.lld"
    else:
        tool = os.path.basename(words[0])
    what = (f"{tool} command failed due to signal (use -v to see invocation)" if status < 0 else
            f"{tool} command failed with exit code {status} (use -v to see invocation)")
    driver = os.path.basename(compiler)
    if colour:
        return f"{driver}: \x1b[0;1;31merror: \x1b[0m\x1b[1m{what}\x1b[0m\n".encode()
    return f"{driver}: error: {what}\n".encode()


def _recaching() -> bool:
    """``OFFLOAD_CACHE_RECACHE``: every job runs (and is stored anew)."""
    return os.environ.get("OFFLOAD_CACHE_RECACHE", "") not in ("", "0")


def _lookup(store: CacheStore | None, base: str, reads_source: bool) -> Entry | None:
    if store is None or _recaching():
        return None
    return lookup_by_files(store, base) if reads_source else store.lookup(base)


#: How an OpenMP host job names the offload triples (Clang 19: ``-fopenmp-targets=``; Clang 22: ``--offload-targets=``).
_HOST_TARGET_LISTS = ("-fopenmp-targets=", "--offload-targets=")
#: Options by which a ``-cc1`` job reads a library no dependency file lists (the GPU device libraries).
_LIBRARY_OPTIONS = ("-mlink-builtin-bitcode", "-mlink-bitcode-file")


def _targets_free(word: str) -> str:
    """The OpenMP host front end's list of offload triples: its output depends only on there being offload
    targets, not on which triples (checked byte for byte for Clang 19 and 22; the SCons tool's host nodes rely on
    the same), so adding a target of a new triple reuses it where nothing else in its words changed."""
    for prefix in _HOST_TARGET_LISTS:
        if word.startswith(prefix) and len(word) > len(prefix):
            return prefix + "@some@"
    return word


def linkers_of(words: Sequence[str]) -> list[str]:
    """The linker a ``clang -flto`` device link job runs (the ``ld.lld`` beside that clang, where LTO's code
    generation happens), which its own program's identity does not cover."""
    if os.path.basename(words[0]).startswith("clang") and not is_cc1(words) and "-flto" in words:
        return [os.path.join(os.path.dirname(os.path.realpath(words[0])), "ld.lld")]
    return []


def libraries_of(words: Sequence[str]) -> list[str]:
    """The libraries a job links in (``-mlink-builtin-bitcode``): read, though no dependency file names them."""
    return [words[index + 1] for index, word in enumerate(words[:-1]) if word in _LIBRARY_OPTIONS]


def _cwd_free(word: str, cwd: str) -> str:
    """``-fdebug-compilation-dir=<cwd>`` and its kin name the working directory, which the output does not
    record without debug information or coverage: the key leaves it out, so two build trees share."""
    for flag in ("-fdebug-compilation-dir=", "-fcoverage-compilation-dir=", "-ffile-compilation-dir="):
        if word.startswith(flag) and word[len(flag):] == cwd:
            return flag + "@cwd@"
    return word


def _with_output(words: list[str], output: str, depfile: str, dependency: list[str], reads_source: bool
                 ) -> list[str]:
    """The job's words as run here (its output already in the scratch directory), with its dependency file there
    too (a compile of the source writes one with system headers where it wrote none: the files it reads are its
    key)."""
    if not reads_source:
        return list(words)
    _, cleaned = split_dependency_options(words)
    if dependency:
        return [*cleaned[:2], "-dependency-file", depfile, *dependency, *cleaned[2:]]
    return with_dependency_file(cleaned, depfile, "x", system_headers=True)


def _files_read(argv: Sequence[str], depfile: str, dependency: list[str], scratch: str) -> list[str] | None:
    """Every file a compile of the source read: its dependency file where it lists system headers, else those of a
    preprocessing-only scan of the same job (``-MMD``); None where that scan fails."""
    if not dependency or "-sys-header-deps" in dependency:
        return read_make_dependencies(depfile)
    return scan_reads(argv, scratch, system_headers=True)


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _print(data: bytes, colour: str) -> None:
    data = diagnostics_shown(data, colour, sys.stderr.isatty())
    if data:
        sys.stderr.flush()
        sys.stderr.buffer.write(data)
        sys.stderr.buffer.flush()


__all__ = ["DriverJobs", "JobsFailed", "Result", "UnfollowedJobs", "copy_file", "driver_jobs", "failure_message",
           "job_slots_for", "run_jobs", "split_compile_time_link"]
