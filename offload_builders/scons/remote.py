"""The remote cache for the ``offload`` tool's nodes: ``$OFFLOAD_REMOTE`` (``grpc://HOST:PORT[/INSTANCE]``).

Every offload node (host front end, device compiles and links, bundles, packages, embeds, extraction,
registration code) runs through :class:`RemoteListAction`: when SCons decides to build it, its Action
(:func:`offload_builders.remote.actions.cache_key`) is looked up first; a hit downloads the outputs, checked
against their digests, into the ``.partial`` names and commits them as a local run would, and nothing runs. A
miss runs the node and uploads its outputs. The key is made of what SCons signs the node by, so it is no
weaker than SCons' own rebuild decision: the steps' signatures (the checkout's path replaced where sound), the
content of every file the node depends on (its sources, the headers the scanner found, ``Depends``) by path
under the checkout, and for files and programs outside the checkout their path and content digest.

OpenMP's host front end signs the identity (device, inode) of each file it reads
(:mod:`offload_builders.source_identity`), so OpenMP nodes share only with builds of the same files on the
same machine: their target-region names hold the inode (see the README, "Remote cache and execution").
"""
from __future__ import annotations

import dataclasses
import os
import re
import shlex
import sys
import threading
from collections.abc import Mapping

import SCons.Action
import SCons.Errors
import SCons.Node.FS
import SCons.Node.Python
import SCons.Warnings

from offload_builders.errors import RemoteError
from offload_builders.remote.actions import (
    ContentDigests,
    NodeJob,
    cache_key,
    command_action,
    outside_file_line,
    relative_path,
)
from offload_builders.remote.cache import RemoteCache, remote_cache
from offload_builders.remote.cli_jobs import code_digest
from offload_builders.remote.digests import Digest
from offload_builders.remote.text import MESSAGE_LIMIT, safe_text
from offload_builders.scons.outputs import partial_path
from offload_builders.source_identity import file_identity

#: The flag of an OpenMP device compile (``-cc1``), whose output depends on the inode of the files it reads.
OPENMP_DEVICE_FLAG = "-fopenmp-is-target-device"


class OffloadRemoteWarning(SCons.Warnings.WarningOnByDefault):
    """The remote cache could not be used, or sent something that did not match: the build goes on locally."""


_WARNING_OUTPUT_LOCK = threading.Lock()


def _warning_output() -> None:
    """Route :class:`OffloadRemoteWarning` to one ``scons: warning: ...`` line. SCons' own output of a warning
    (``SCons.Warnings._warningOut``, set by ``SCons.Script.Main``) adds the deepest frame outside SCons (``File
    ".../remote.py", line N, in _warn``), which says nothing about a remote's fault: the output is wrapped, once,
    by one that prints ours alone and passes every other warning on. SCons still decides whether a warning is
    shown (``--warn=no-all``) or raised (warnings as exceptions)."""
    with _WARNING_OUTPUT_LOCK:
        previous = SCons.Warnings._warningOut
        if getattr(previous, "offload_remote", False):
            return

        def output(warning: SCons.Warnings.SConsWarning) -> None:
            if isinstance(warning, OffloadRemoteWarning):
                text = warning.args[0] if warning.args else ""
                text = text[0] if isinstance(text, tuple) and text else text
                sys.stderr.write(f"scons: warning: {safe_text(str(text), MESSAGE_LIMIT)}\n")
                sys.stderr.flush()
            elif previous is not None:
                previous(warning)

        output.offload_remote = True  # type: ignore[attr-defined]
        SCons.Warnings._warningOut = output


def _warn(message: str) -> None:
    """One ``scons: warning:`` line (see :func:`_warning_output`), made safe to print (it may quote the server)."""
    _warning_output()
    SCons.Warnings.warn(OffloadRemoteWarning, safe_text(message, MESSAGE_LIMIT))


def _setting(env, name: str):  # noqa: ANN202 - a construction variable's value, of whatever type it was given
    """The construction variable ``name``, else the environment variable of that name (None: neither)."""
    value = env.get(name)
    return os.environ.get(name) if value is None else value


def remote_url(env) -> str | None:
    """``$OFFLOAD_REMOTE``, else the environment variable of that name; None (or empty): no remote cache."""
    value = _setting(env, "OFFLOAD_REMOTE")
    value = env.subst(value) if isinstance(value, str) and "$" in value else value
    return value or None


def remote_execute_url(env) -> str | None:
    """``$OFFLOAD_REMOTE_EXECUTE`` (or the environment variable): where device compiles, assembles and device
    links run (REAPI ``Execute``); None: here."""
    return _setting(env, "OFFLOAD_REMOTE_EXECUTE") or None


def remote_cache_for(env, url: str | None = None) -> RemoteCache | None:
    """The build's cache at ``url`` (default ``$OFFLOAD_REMOTE``, else the executor's own action cache)."""
    url = url or remote_url(env) or remote_execute_url(env)
    if url is None:
        return None
    settings = dict(os.environ)
    for name in ("OFFLOAD_REMOTE_INSTANCE", "OFFLOAD_REMOTE_HEADERS", "OFFLOAD_REMOTE_TIMEOUT", "OFFLOAD_REMOTE_CA",
                 "OFFLOAD_REMOTE_CERT", "OFFLOAD_REMOTE_KEY", "OFFLOAD_REMOTE_RETRIES", "OFFLOAD_REMOTE_UPLOAD",
                 "OFFLOAD_REMOTE_HEADER_FILE", "OFFLOAD_REMOTE_MAX_BLOB", "OFFLOAD_REMOTE_EXECUTE_TIMEOUT"):
        if env.get(name) is not None:
            settings[name] = str(env[name])
    return remote_cache(url, settings, _warn)


#: A program's stamp as :func:`offload_builders.scons.tool_dependencies.program_stamp` writes it: machine-local (a
#: modification time), so the key names the program by its content instead.
_PROGRAM_STAMP = re.compile(r"^(/.*) (?:size=\d+ mtime_ns=\d+|\(missing\))$")

#: Files under the checkout change during a build (they are other nodes' outputs): hashed by stat, per file.
_INSIDE_DIGESTS = ContentDigests()


def _value_line(node) -> str:
    contents = node.get_contents()
    text = contents.decode("utf-8", "surrogateescape") if isinstance(contents, bytes) else str(contents)
    stamp = _PROGRAM_STAMP.match(text)
    if stamp:
        return outside_file_line(stamp.group(1))
    return f"value {text}"


def _tidying(action, step) -> bool:
    """Whether ``step`` only sweeps, commits or removes a scratch file (writes nothing the node outputs)."""
    return (step is getattr(action, "sweep", None) or step is getattr(action, "commit", None)
            or isinstance(step, SideStep))


def node_job(action: SCons.Action.ListAction, target, source, env, executor) -> NodeJob | None:
    """The node as the remote cache keys it; None where it cannot be cached (an output or input that is not a
    file under the checkout... an output outside the checkout)."""
    root = env.fs.Top.get_abspath()
    targets = executor.get_all_targets() if executor else target
    outputs = []
    for node in targets:
        relative = relative_path(node.get_abspath(), root)
        if relative is None or not isinstance(node, SCons.Node.FS.File):
            return None
        outputs.append(relative)
    steps = []
    in_process = False
    for step in action.list:
        sources = executor.get_all_sources() if executor else source
        if not _tidying(action, step):
            argv = getattr(step, "argv", None)
            # A step that is not one of our commands runs in this process (a fat binary, a package, registration
            # code): its signature is its declared version (a user's function: its bytecode), which a machine with
            # other code of the package may share, so the package's code keys it too.
            in_process = in_process or argv is None or argv(targets, sources, env, executor) is None
        contents = step.get_contents(targets, sources, env)
        steps.append(contents.decode("utf-8", "surrogateescape") if isinstance(contents, bytes) else str(contents))
    inputs: dict[str, Digest] = {}
    salt_lines: list[str] = []
    files: list[str] = []
    children = executor.get_all_children() if executor else [child for node in targets for child in node.children()]
    for child in children:
        if isinstance(child, SCons.Node.Python.Value):
            salt_lines.append(_value_line(child))
            continue
        if not isinstance(child, SCons.Node.FS.Base):
            salt_lines.append(f"node {child} {child.get_csig()}")
            continue
        path = child.rfile().get_abspath() if isinstance(child, SCons.Node.FS.File) else child.get_abspath()
        files.append(path)
        relative = relative_path(path, root)
        if relative is None:
            salt_lines.append(outside_file_line(path))
        elif os.path.isfile(path):
            digest = _INSIDE_DIGESTS(path)
            if digest is None:
                return None
            inputs[relative] = digest
        else:
            salt_lines.append(f"not a file {relative} {child.get_csig()}")
    if in_process:
        salt_lines.append(f"offload-builders code {code_digest()}")
    if any(OPENMP_DEVICE_FLAG in step for step in steps):
        # An OpenMP device compile keeps the regions whose names (the inode of each file it reads) the host
        # bitcode lists: the same bytes from another file give no kernels, so the files' identity is keyed too
        # (an output made from a re-created file is never shared with a build whose files have their own).
        salt_lines += [file_identity(path) for path in files]
    return NodeJob(root=root, steps=tuple(steps), inputs=inputs, salt_lines=tuple(sorted(set(salt_lines))),
                   outputs=tuple(outputs))


def _print_line(text: str, target, source, env) -> None:
    """What SCons does with a command's line: ``$PRINT_CMD_LINE_FUNC``, else standard output."""
    print_function = env.get("PRINT_CMD_LINE_FUNC")
    if print_function:
        print_function(text, target, source, env)
    else:
        sys.stdout.write(text + "\n")


class RemoteListAction(SCons.Action.ListAction):
    """A node's list of actions that asks ``$OFFLOAD_REMOTE`` first (see the module's docstring).

    Its signature, string and everything SCons records are the list's own, so setting or unsetting the
    remote rebuilds nothing. ``sweep`` and ``commit`` are the node's own first and committing steps: a hit
    sweeps what interrupted runs left, downloads into the ``.partial`` names, and commits."""

    def __init__(self, actions, sweep: SCons.Action.FunctionAction, commit: SCons.Action.FunctionAction) -> None:
        super().__init__(actions)
        self.sweep = sweep
        self.commit = commit

    def __call__(self, target, source, env, exitstatfunc=SCons.Action._null, presub=SCons.Action._null,
                 show=SCons.Action._null, execute=SCons.Action._null, chdir=SCons.Action._null, executor=None):
        run = SCons.Action.execute_actions if execute is SCons.Action._null else execute
        cache = remote_cache_for(env) if run else None
        if cache is not None and cache.disabled is not None and remote_execute_url(env) is None:
            cache = None  # given up on: no keys to compute
        job = node_job(self, target, source, env, executor) if cache is not None else None
        if cache is None or job is None:
            return super().__call__(target, source, env, exitstatfunc, presub, show, execute, chdir, executor)
        targets = executor.get_all_targets() if executor else target
        sources = executor.get_all_sources() if executor else source
        try:
            messages = cache_key(job)
        except RemoteError as error:  # the client cannot be imported (the extra 'remote' is not installed)
            cache.give_up(error)
            return super().__call__(target, source, env, exitstatfunc, presub, show, execute, chdir, executor)
        except (ValueError, UnicodeError):  # a name that is not UTF-8 cannot go into a REAPI message
            return super().__call__(target, source, env, exitstatfunc, presub, show, execute, chdir, executor)
        self.sweep.execute(targets, sources, env)
        suffix = env.subst("$OFFLOAD_PARTIAL_SUFFIX")
        destinations = {relative: partial_path(env, node) for relative, node in zip(job.outputs, targets)}
        printing = SCons.Action.print_actions if show is SCons.Action._null else show
        if cache.fetch(messages, destinations):
            if printing:
                _print_line(f"remote cache: {' '.join(str(node) for node in targets)}", targets, sources, env)
            return self.commit.execute(targets, sources, env)
        if self._executed_remotely(job, targets, sources, env, executor, suffix):
            if printing:
                _print_line(f"remote execution: {' '.join(str(node) for node in targets)}", targets, sources, env)
            status = self.commit.execute(targets, sources, env)
        else:
            status = super().__call__(target, source, env, exitstatfunc, presub, show, execute, chdir, executor)
        if status == 0:
            outputs: Mapping[str, str] = {relative: node.get_abspath() for relative, node in zip(job.outputs, targets)}
            # Not shared where an input changed while the node ran (an editor saving mid-build): the outputs
            # may be of the new bytes, the key is of the old.
            if all(os.path.isfile(path) for path in outputs.values()) and all(
                    _INSIDE_DIGESTS(os.path.join(job.root, relative)) == digest
                    for relative, digest in job.inputs.items()):
                cache.store(messages, outputs)
        return status

    def _executed_remotely(self, job: NodeJob, targets, sources, env, executor, suffix: str) -> bool:
        """Run the node's commands on ``$OFFLOAD_REMOTE_EXECUTE``'s workers, where it names one and the node's
        steps are all commands of ours (a device compile, its assemble or link): one ``sh -c`` running them in
        order from the input root, its outputs the ``.partial`` files, downloaded here."""
        url = remote_execute_url(env)
        if url is None:
            return False
        commands = []
        for step in self.list:
            if step is self.sweep or step is self.commit or isinstance(step, SideStep):
                continue
            argv = step.argv(targets, sources, env, executor) if hasattr(step, "argv") else None
            if argv is None or OPENMP_DEVICE_FLAG in argv:
                # An OpenMP device compile names regions by the inode of the source it reads, which in a
                # worker's sandbox is not the one the host front end saw here: it would emit no kernels.
                return False
            commands.append(" ".join(shlex.quote(word) for word in argv))
        service = remote_cache_for(env, url)
        if not commands or service is None:
            return False
        partials = tuple(f"{relative}{suffix}" for relative in job.outputs)
        remote_job = dataclasses.replace(job, outputs=partials)
        messages = command_action([SHELL, "-c", " && ".join(commands)], remote_job, environment=EXECUTE_ENVIRONMENT,
                                  platform=platform_properties(env))
        inputs = {digest: os.path.join(job.root, relative) for relative, digest in job.inputs.items()}
        destinations = {partial: os.path.join(job.root, partial) for partial in partials}
        return service.execute(messages, inputs, destinations)


def platform_properties(env) -> dict[str, str]:
    """``$OFFLOAD_REMOTE_PLATFORM`` (or the environment variable): ``NAME=VALUE`` entries, comma-separated, the
    Platform of every executed Action. Servers pick the workers by it (an image with the same toolchain: the
    commands name their programs by absolute path); it is part of the Action's key."""
    value = _setting(env, "OFFLOAD_REMOTE_PLATFORM") or ""
    properties: dict[str, str] = {}
    for entry in str(value).split(","):
        if not entry.strip():
            continue
        name, equals, text = entry.partition("=")
        if not equals or not name.strip():
            raise SCons.Errors.UserError(f"$OFFLOAD_REMOTE_PLATFORM={value!r}: entry {entry!r} is not NAME=VALUE "
                                         "(e.g. OSFamily=linux,container-image=docker://...)")
        properties[name.strip()] = text.strip()
    return properties


#: The shell a remote node's commands run in, and its environment (the commands name their programs by path).
SHELL = "/bin/sh"
EXECUTE_ENVIRONMENT = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}


class SideStep:
    """Marks a step of a node's list that only tidies up here (removes a scratch file or directory): remote
    execution skips it."""


__all__ = ["OffloadRemoteWarning", "RemoteListAction", "node_job", "remote_cache_for", "remote_url"]
