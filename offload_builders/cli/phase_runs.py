"""How an ``offload-compile`` phase runs its jobs and writes its outputs: atomically, untouched when unchanged, with
one depfile per node, through the remote cache where one is set.

* Each output is written to ``<output>.partial`` and renamed; an output whose bytes did not change is left
  untouched, mtime included, so Ninja's ``restat`` stops the work downstream; a failure leaves no partial file.
* The depfile is ours (:func:`write_depfile`): the output, the source and headers the compile read (Clang's own
  dependency file of the ``-cc1`` job, :func:`read_make_dependencies`), the programs run and the compiler drivers.
* With ``$OFFLOAD_REMOTE`` each step is looked up in that REAPI cache first (:func:`remote_lookup`).
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from offload_builders.cli._common import UsageError
from offload_builders.cli.phase_options import PROG, PhaseOptions
from offload_builders.depfiles import escape, read_make_dependencies
from offload_builders.job_words import scan_reads, with_dependency_file
from offload_builders.source_identity import file_identity

if TYPE_CHECKING:
    from offload_builders.models.base import BasePhaseModel
    from offload_builders.remote.cli_jobs import CachedStep, RemoteSteps


def run_job(argv: Sequence[str]) -> None:
    """Run one job; its own diagnostics go to stderr as they are, a failure is one line naming the tool."""
    try:
        done = subprocess.run(list(argv), check=False)
    except OSError as error:
        raise UsageError(f"cannot run {argv[0]}: {error.strerror}") from None
    if done.returncode != 0:
        raise UsageError(f"{os.path.basename(argv[0])} failed (exit status {done.returncode})")


def write_depfile(opts: PhaseOptions, prerequisites: Sequence[str]) -> None:
    """One rule, the output and each prerequisite escaped as Clang escapes them (:func:`escape`); with
    ``--absolute-depfile`` each prerequisite named relatively (as the compile named it, from the working
    directory) made absolute: CMake reads relative depfile paths from its binary directory, not from the
    command's ``WORKING_DIRECTORY``."""
    depfile, output = opts.depfile, opts.output
    if depfile is None or output is None:
        return
    if opts.absolute_depfile:
        prerequisites = [os.path.abspath(path) for path in prerequisites]
    unique = list(dict.fromkeys(prerequisites))
    text = f"{escape(output)}:" + "".join(f" \\\n  {escape(path)}" for path in unique) + "\n"
    partial = partial_path(depfile)
    with open(partial, "wb") as f:  # the names' bytes as the file system has them, whatever the locale
        f.write(os.fsencode(text))
    commit(partial, depfile)


def job_files(argv: Sequence[str]) -> list[str]:
    """The program a job runs (the real file behind it) and the bitcode libraries it links."""
    files = [os.path.realpath(argv[0])]
    files += [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "-mlink-builtin-bitcode"]
    return files


def compiler_files(model: BasePhaseModel) -> list[str]:
    """The drivers asked for the jobs: a wrapper (ccache's, Spack's) and what it runs."""
    toolchain = model.toolchain
    return list(dict.fromkeys([str(toolchain.clang), os.path.realpath(toolchain.clang),
                               str(toolchain.clangxx), os.path.realpath(toolchain.clangxx)]))


def partial_path(output: str) -> str:
    return output + ".partial"


def commit(partial: str, output: str) -> None:
    """Rename ``partial`` over ``output``, unless ``output`` already has these bytes: then it stays untouched
    (its mtime too), so Ninja's ``restat`` skips what depends on it."""
    if _same_bytes(partial, output):
        os.unlink(partial)
    else:
        os.replace(partial, output)


def commit_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through its partial name, names in it as the file system has their bytes."""
    partial = partial_path(path)
    with open(partial, "wb") as f:
        f.write(os.fsencode(text))
    commit(partial, path)


def _same_bytes(a: str, b: str) -> bool:
    try:
        if os.path.getsize(a) != os.path.getsize(b):
            return False
        with open(a, "rb") as fa, open(b, "rb") as fb:
            while True:
                block = fa.read(1 << 20)
                if block != fb.read(1 << 20):
                    return False
                if not block:
                    return True
    except OSError:
        return False


def remove_file(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# --- the remote cache ($OFFLOAD_REMOTE) -------------------------------------------------------------------
#
# Every phase runs through :func:`produce_outputs`: with $OFFLOAD_REMOTE set, the step is keyed first
# (:mod:`offload_builders.remote.cli_jobs`: its jobs' argv, the files it reads under the root, the programs and
# outside files by content), a hit is downloaded into the outputs' ``.partial`` names and committed as a local
# run's outputs are (unchanged bytes keep the old file, for ``restat``), and the depfile (and the OpenMP host's
# ``.identity``) is written as a local run writes it; a miss runs here, then uploads. A compile's headers are
# known before it runs from a dependency scan (:func:`~offload_builders.job_words.scan_reads`). The root of the key's
# paths is ``--source-root``, else the working directory.
#
# OpenMP's host front end and device compiles are keyed with the identity (device, inode) of every file they
# read (:func:`~offload_builders.source_identity.file_identity`): their target-region names hold it, so such an
# output is right only for those very files. They share with a build of the same files on the same machine (a
# cleaned or re-created build directory, a CI workspace that keeps its checkout), never with another checkout,
# which is sound, as the SCons tool keys them. The phases that only read what these wrote (OpenMP's package and
# embed) and every HIP and CUDA phase are keyed by content and share across checkouts.

def _remote_steps() -> RemoteSteps | None:
    """The remote cache where ``$OFFLOAD_REMOTE`` names one."""
    from offload_builders.remote.cli_jobs import remote_steps

    return remote_steps(PROG)


def _root(opts: PhaseOptions) -> str:
    """What the remote cache's paths are relative to: ``--source-root``, else the working directory."""
    return os.path.abspath(opts.source_root) if opts.source_root is not None else os.getcwd()


@dataclass
class RemoteLookup:
    """A step keyed in the remote cache, and the files a dependency scan found it reads (None: no scan)."""

    step: CachedStep
    scanned: list[str] | None


def remote_lookup(opts: PhaseOptions, jobs: Sequence[Sequence[str]], outputs: Sequence[str], *, tools: Sequence[str],
            scan: Sequence[str] | None = None, scratch: str | None = None, inputs: Sequence[str] = (),
            identity: bool = False, in_process: bool = False) -> RemoteLookup | None:
    """The step of ``jobs`` (run here as they are) writing ``outputs``, keyed, where ``$OFFLOAD_REMOTE`` is set:
    it reads ``inputs`` and, for the ``-cc1`` job ``scan``, what a dependency scan of it lists (each file's
    identity keyed too with ``identity``); it runs the jobs' programs (``in_process``: ``jobs`` describe what
    our code does here) and depends on ``tools``. None: not cached (no remote, a failed scan, a file outside
    the root)."""
    remote = _remote_steps()
    if remote is None:
        return None
    scanned = None
    if scan is not None:
        assert scratch is not None
        scanned = scan_reads(scan, scratch)
        if scanned is None:
            return None
    read = scanned or []
    root = _root(opts)
    values = [file_identity(path) for path in read] if identity else []
    if scan is not None and file_names_hold_root(read, root, scan):
        values.append(f"checkout {root}")
    step = remote.step(root, jobs, inputs=[*read, *inputs], outputs=outputs, scratch=scratch,
                       tools=[*(path for argv in jobs if not in_process for path in job_files(argv)), *tools],
                       values=values, in_process=in_process)
    return RemoteLookup(step, scanned) if step is not None else None


def file_names_hold_root(read: Sequence[str], root: str, argv: Sequence[str]) -> bool:
    """Whether ``__FILE__`` (an ``assert``'s message) in the files a compile reads would spell the checkout's
    path: one is named by an absolute path under ``root`` (a CMake build names sources so) that no
    ``-fmacro-prefix-map`` (``-ffile-prefix-map``) rewrites. Its output then holds that path, so its key does
    too: it shares only with checkouts at the same place."""
    from offload_builders.remote.actions import relative_path

    maps = [word.split("=", 1)[1].partition("=")[0] for word in argv if word.startswith("-fmacro-prefix-map=")]
    return any(os.path.isabs(path) and relative_path(path, root) is not None
               and not any(old and path.startswith(old) for old in maps) for path in read)


def produce_outputs(outputs: Sequence[str], produce: Callable[[], list[str]], lookup: RemoteLookup | None) -> list[str]:
    """Write every output's ``.partial`` file, by ``produce`` (which returns the files the step read) or from the
    remote cache, then commit them all in order (no partial file left on failure). Returns the files read: from
    ``produce``, or on a hit from the dependency scan. A step run here is stored, unless it read other files
    than its scan found (the key would not cover them)."""
    if lookup is not None and lookup.step.fetch(partial_path):
        for output in outputs:
            commit(partial_path(output), output)
        return list(lookup.scanned or [])
    try:
        read = produce()
    except BaseException:
        for output in outputs:
            remove_file(partial_path(output))
        raise
    for output in outputs:
        commit(partial_path(output), output)
    if lookup is not None:
        if lookup.scanned is None or set(read) == set(lookup.scanned):
            lookup.step.store()
        else:
            lookup.step.remote.warn(f"remote cache: not storing {', '.join(outputs)}: the compile read other files"
                                    " than its dependency scan listed")
    return read


def run_to(opts: PhaseOptions, argv: Sequence[str], output: str, *, inputs: Sequence[str], tools: Sequence[str]
            ) -> None:
    """Run one job writing ``output``'s partial file (it reads ``inputs``), then commit it; through the remote
    cache where one is set."""
    def produce() -> list[str]:
        run_job(argv)
        return list(inputs)

    produce_outputs([output], produce, remote_lookup(opts, [argv], [output], inputs=inputs, tools=tools))


def compile_one_job(opts: PhaseOptions, argv: Sequence[str], output: str, *, tools: Sequence[str],
                     inputs: Sequence[str] = (), identity: bool = False) -> list[str]:
    """Run a one-job compile writing ``output``'s partial file with its own dependency file, then commit it (no
    partial file left on failure), through the remote cache where one is set; returns the files the compile
    read (the source, then its headers)."""
    with tempfile.TemporaryDirectory(prefix="offload-compile-") as scratch:
        return compile_jobs(opts, [argv], [output], scratch, tools=tools, inputs=inputs, identity=identity)


def compile_jobs(opts: PhaseOptions, jobs: Sequence[Sequence[str]], outputs: Sequence[str], scratch: str, *,
                  tools: Sequence[str], inputs: Sequence[str] = (), identity: bool = False) -> list[str]:
    """Run a compile (``jobs[0]``, with its own dependency file) and the jobs after it (its assemble or link),
    which write ``outputs``' partial files, then commit them, through the remote cache where one is set; returns
    the files the compile read (the source, then its headers). Intermediate files live in ``scratch``."""
    headers_file = os.path.join(scratch, "deps.d")

    def produce() -> list[str]:
        run_job(with_dependency_file(jobs[0], headers_file, outputs[-1]))
        for job in jobs[1:]:
            run_job(job)
        return read_make_dependencies(headers_file)

    lookup = remote_lookup(opts, jobs, outputs, tools=tools, scan=jobs[0], scratch=scratch, inputs=inputs,
                     identity=identity)
    return produce_outputs(outputs, produce, lookup)

