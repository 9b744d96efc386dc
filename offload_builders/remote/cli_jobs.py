"""The remote cache (``$OFFLOAD_REMOTE``) for the steps of ``offload-compile`` and ``offload-link``.

The SCons tool keys a node by what SCons signs it with (:mod:`offload_builders.scons.remote`). A command of a
Meson, Ninja or CMake build has no such signature, so a step is keyed here by what it runs and reads, as a
:class:`~offload_builders.remote.actions.NodeJob` of the same form (:func:`step_job`):

* steps: each job's argv (quoted), with the step's scratch directory (a fresh temporary directory each run)
  replaced by :data:`SCRATCH_TOKEN` and the root by ``$CHECKOUT`` where that is sound
  (:func:`~offload_builders.remote.actions.portable_steps`); an in-process step is described by a
  pseudo-command naming what it computes from what;
* inputs: the files it reads under the root, by path relative to the root and content;
* salt: the working directory relative to the root (the argv's relative paths start there), the programs it
  runs and the files it reads outside the root (named by absolute path) by path and content
  (:func:`~offload_builders.remote.actions.outside_file_line`), this package's version and, for an in-process
  step, the digest of this package's code (:func:`code_digest`), and what else the caller names;
* outputs: relative to the root.

The root is the directory the checkout's paths are relative to: ``offload-compile --source-root``, else the
working directory; ``offload-link``'s steps live in its scratch directory. A step with an output outside the
root, or an input named by a relative path outside it (the tree around the root is not in the key), or an input
that cannot be read, is not cached: it runs as without a remote.

A hit writes each output where the caller says (its ``.partial`` name) and the caller commits as after a local
run; a miss runs locally, then :meth:`CachedStep.store` uploads. The remote never fails a step: the server's
errors are one warning per process (:class:`~offload_builders.remote.cache.RemoteCache`), anything unexpected
here too, and the step runs locally.

Without ``$OFFLOAD_REMOTE`` the tools import nothing more than this module's few lines (:func:`remote_steps`).
"""
from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from offload_builders.remote.actions import ActionMessages, NodeJob
    from offload_builders.remote.cache import RemoteCache

#: The environment variable naming the server: ``grpc://HOST:PORT[/INSTANCE]`` (``grpcs://`` with TLS); the other
#: ``OFFLOAD_REMOTE_*`` variables are read by :meth:`~offload_builders.remote.client.RemoteSettings.from_url`.
REMOTE_VARIABLE = "OFFLOAD_REMOTE"
#: What stands for a step's scratch directory in its key.
SCRATCH_TOKEN = "$SCRATCH"


@functools.cache
def code_digest() -> str:
    """The digest of this package's Python sources: keys an in-process step (a fat binary, a package, a
    registration object written by our code), whose output changes with that code and not with a program's."""
    import hashlib
    from pathlib import Path

    package = Path(__file__).resolve().parent.parent
    sha = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        sha.update(path.relative_to(package).as_posix().encode() + b"\0")
        sha.update(path.read_bytes() + b"\0")
    return sha.hexdigest()


def _version_line() -> str:
    try:
        from offload_builders import __version__
    except ImportError:  # pragma: no cover - a package without a version
        return "offload-builders"
    return f"offload-builders {__version__}"


def step_job(root: str, jobs: Sequence[Sequence[str]], *, inputs: Iterable[str] = (), outputs: Sequence[str],
             tools: Iterable[str] = (), values: Iterable[str] = (), scratch: str | None = None,
             in_process: bool = False, cwd: bool = True, persistent: bool = False) -> NodeJob | None:
    """A step's key (see the module's docstring); None where the step is not cached.

    ``jobs``: the argv of each job it runs (or an in-process step's description), paths as the step gives them
    (relative to the working directory, or absolute); ``inputs``: every file it reads (a compile's source and
    headers, as its dependency scan lists them, and its other inputs); ``outputs``: the files it writes, as
    named in ``jobs``' paths' terms; ``tools``: programs and files outside the checkout that decide its output
    (by path and content); ``values``: further salt lines; ``scratch``: its scratch directory; ``cwd``:
    whether relative paths in ``jobs`` can name files (False where every path is absolute); ``persistent``: the
    digests of files outside the root are remembered across processes
    (:data:`~offload_builders.remote.actions.PERSISTENT_DIGESTS`: the same lines, read again only where a file
    changed), for a tool run once per step (``offload-link``)."""
    import shlex

    from offload_builders.remote.actions import (
        OUTSIDE_DIGESTS,
        PERSISTENT_DIGESTS,
        NodeJob,
        outside_file_line,
        relative_path,
    )
    from offload_builders.remote.digests import Digest, digest_of_file

    digests = PERSISTENT_DIGESTS if persistent else OUTSIDE_DIGESTS
    root = os.path.abspath(root)
    if root == os.path.dirname(root):  # "/": every path is "under" it, and "$CHECKOUT" would replace nothing
        return None
    relative_outputs = []
    for path in outputs:
        relative = relative_path(path, root)
        if relative is None:
            return None
        relative_outputs.append(relative)
    files: dict[str, Digest] = {}
    salt = [_version_line(), *values]
    if cwd:
        salt.append(f"cwd {os.path.relpath(os.getcwd(), root)}")
    for path in inputs:
        relative = relative_path(path, root)
        if relative is None:
            if not os.path.isabs(path):
                return None
            salt.append(outside_file_line(path, digests))
            continue
        if relative not in files:
            try:
                files[relative] = digest_of_file(path)
            except OSError:
                return None
    salt += [outside_file_line(tool, digests) for tool in tools]
    if in_process:
        salt.append(f"code {code_digest()}")
    steps = []
    for argv in jobs:
        text = shlex.join(argv)
        if scratch is not None:
            text = text.replace(os.path.abspath(scratch), SCRATCH_TOKEN)
        steps.append(text)
    return NodeJob(root=root, steps=tuple(steps), inputs=files, salt_lines=tuple(sorted(set(salt))),
                   outputs=tuple(relative_outputs))


class RemoteSteps:
    """One tool's remote cache in this process: ``$OFFLOAD_REMOTE``'s server, its warnings on stderr."""

    def __init__(self, prog: str, url: str) -> None:
        from offload_builders.remote.cache import remote_cache

        self.prog = prog
        self.cache: RemoteCache = remote_cache(url, os.environ, self.warn)
        self._failed = False

    def warn(self, message: str) -> None:
        """One ``<prog>: warning: ...`` line on stderr, made safe to print (it may quote the server)."""
        from offload_builders.remote.text import MESSAGE_LIMIT, safe_text

        sys.stderr.write(f"{self.prog}: warning: {safe_text(message, MESSAGE_LIMIT)}\n")
        sys.stderr.flush()

    def failed(self, error: Exception) -> None:
        """Stop asking, with one warning: ``error`` is the cache's kind (the REAPI client cannot be imported, ...)
        or something unexpected (the server's answers are the cache's to handle)."""
        from offload_builders.errors import RemoteError

        if isinstance(error, RemoteError):
            self.cache.give_up(error)
        elif not self._failed:
            self.warn(f"remote {self.cache.url} not used ({type(error).__name__}: {error}); building locally")
        self._failed = True

    @property
    def usable(self) -> bool:
        return not self._failed and self.cache.disabled is None

    def step(self, root: str, jobs: Sequence[Sequence[str]], *, inputs: Iterable[str] = (), outputs: Sequence[str],
             tools: Iterable[str] = (), values: Iterable[str] = (), scratch: str | None = None,
             in_process: bool = False, cwd: bool = True, persistent: bool = False) -> CachedStep | None:
        """The step through the cache (arguments as :func:`step_job`); None where it is not cached."""
        if not self.usable:
            return None
        try:
            job = step_job(root, jobs, inputs=inputs, outputs=outputs, tools=tools, values=values, scratch=scratch,
                           in_process=in_process, cwd=cwd, persistent=persistent)
        except (ValueError, UnicodeError):  # a name that is not UTF-8 cannot go into a REAPI message
            return None
        except Exception as error:  # noqa: BLE001 - the remote never fails a step (a missing extra, ...)
            self.failed(error)
            return None
        return None if job is None else self.keyed(job, outputs)

    def keyed(self, job: NodeJob, outputs: Sequence[str]) -> CachedStep | None:
        """The step of an already keyed ``job`` (:func:`step_job`'s) through the cache; ``outputs`` as the step
        names them. None where it is not cached."""
        if not self.usable:
            return None
        from offload_builders.remote.actions import cache_key

        try:
            messages = cache_key(job)
        except (ValueError, UnicodeError):  # a name that is not UTF-8 cannot go into a REAPI message
            return None
        except Exception as error:  # noqa: BLE001 - the remote never fails a step (a missing extra, ...)
            self.failed(error)
            return None
        return CachedStep(self, job, messages, dict(zip(job.outputs, outputs)))


class CachedStep:
    """A keyed step: :meth:`fetch` before running it, :meth:`store` after a local run."""

    def __init__(self, remote: RemoteSteps, job: NodeJob, messages: ActionMessages, outputs: dict[str, str]) -> None:
        self.remote = remote
        self.job = job
        self.messages = messages
        #: Each output: its path relative to the root -> its path as the step names it.
        self.outputs = outputs

    def fetch(self, destination: Callable[[str], str]) -> bool:
        """On a hit, write each output to ``destination(output)`` (checked against its digest) and answer True;
        anything else leaves none of them behind and answers False. First, what a download to a destination
        left when its process was killed is swept."""
        destinations = {relative: destination(path) for relative, path in self.outputs.items()}
        from offload_builders.remote.downloads import sweep_downloads

        for path in destinations.values():
            sweep_downloads(path)
        if not self.remote.usable:
            return False
        try:
            return self.remote.cache.fetch(self.messages, destinations)
        except Exception as error:  # noqa: BLE001 - the remote never fails a step
            self.remote.failed(error)
            for path in destinations.values():
                try:
                    os.unlink(path)
                except OSError:
                    pass
            return False

    def store(self) -> None:
        """Upload the outputs of a local run (warned about and otherwise ignored where that fails)."""
        if not self.remote.usable:
            return
        try:
            self.remote.cache.store(self.messages, self.outputs)
        except Exception as error:  # noqa: BLE001 - the remote never fails a step
            self.remote.failed(error)


_STEPS: dict[tuple[str, str], RemoteSteps] = {}


def remote_steps(prog: str) -> RemoteSteps | None:
    """The process's remote cache for ``prog``'s steps where ``$OFFLOAD_REMOTE`` names one, else None."""
    url = os.environ.get(REMOTE_VARIABLE, "").strip()
    if not url:
        return None
    if (prog, url) not in _STEPS:
        _STEPS[prog, url] = RemoteSteps(prog, url)
    return _STEPS[prog, url]


__all__ = ["REMOTE_VARIABLE", "SCRATCH_TOKEN", "CachedStep", "RemoteSteps", "code_digest", "remote_steps",
           "step_job"]
