"""The actions of the tool's nodes and how they run commands: a node's action list (:func:`node_action`: sweep,
steps, commit, the remote cache asked first), :func:`phase_action` and :func:`function_phase`, the
``$OFFLOAD_<PHASE>COM`` actions that run a renderer's words without SCons' substitution (:class:`PhaseCommandAction`),
the host link (:class:`HostLinkAction`), in-process actions (:func:`in_process_action`), the step that removes a
side file (:class:`RemoveSideFile`), and the spawn and quoting helpers: only the user's own words for the shell
ever reach one (:func:`_user_shell_words`), every other word is quoted for it (:func:`_quote_word`).
"""
from __future__ import annotations

import errno
import functools
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import SCons.Action
import SCons.Platform.posix
import SCons.Subst

from offload_builders import leftovers, linking
from offload_builders.driver import memoized
from offload_builders.errors import OffloadError
from offload_builders.phase_table import LINK, OPENMP, Phase, row
from offload_builders.scons.outputs import COMMIT, REMOVE_STALE, side_path
from offload_builders.scons.remote import RemoteListAction, SideStep
from offload_builders.scons.rendering import Renderer, literal_words
from offload_builders.scons.variables import probe_cache_for
from offload_builders.scons.versioned_actions import versioned_action


class CachingLazyAction(SCons.Action.LazyAction):
    """``$VAR`` as SCons makes it (a lazy action), keeping the action it makes of a function: SCons makes a new
    one each time it asks the node anything (its description, signature, scans: five times a node in a
    no-op), and hashes the function's code each time; the same function gives the same action. Other values
    (a command line, a list) take SCons' own path."""

    def __init__(self, var, kw) -> None:
        super().__init__(var, kw)
        self._made: dict[Any, SCons.Action.ActionBase] = {}  # per function value, the action made of it

    def _generate_cache(self, env):
        value = env.get(self.var) if env else None
        if not callable(value) or isinstance(value, SCons.Action.ActionBase):
            return super()._generate_cache(env)
        try:
            return memoized(self._made, value, lambda: super(CachingLazyAction, self)._generate_cache(env))
        except TypeError:  # an unhashable callable object
            return super()._generate_cache(env)


class PhaseCommandAction(CachingLazyAction):
    """``$OFFLOAD_<PHASE>COM`` as SCons makes it (a lazy action), without ``Subst`` while the variable is
    just the name of one of our renderers.

    SCons substitutes a node's command three times (signature, message, run), and each time walks the
    ~80 words of a ``-cc1`` line through its expansion machinery, about 1 ms a node; a
    :class:`~offload_builders.scons.rendering.Renderer` already holds the final words. Any other value
    (``ccache $_OFFLOAD_HOST_CC1``, a function, a ``$( $)`` section) takes SCons' own path, as do overrides
    passed to the action.
    """

    def __init__(self, phase: str, varlist: Sequence[str] = ()) -> None:
        super().__init__(f"OFFLOAD_{phase}COM", {"cmdstr": f"$OFFLOAD_{phase}COMSTR", "varlist": tuple(varlist)})

    def renderer(self, env) -> Renderer | None:
        value = env.get(self.var)
        if isinstance(value, str) and value[:1] == "$" and value[1:].isidentifier():
            renderer = env.get(value[1:])
            if isinstance(renderer, Renderer):
                return renderer
        return None

    def _node_renderer(self, target, env) -> Renderer | None:
        """:meth:`renderer`, once per node, for what SCons asks of every node in every build (its signature,
        its command scan, its action's description): after the SConscripts are read, a node's build
        environment no longer changes."""
        memo = getattr(target[0].attributes, "_offload_renderers", None) if target else None
        if memo is None:
            if not target:
                return self.renderer(env)
            memo = target[0].attributes._offload_renderers = {}
        if self.var not in memo:
            memo[self.var] = self.renderer(env)
        return memo[self.var]

    @staticmethod
    def _render(renderer: Renderer, target, source, env, executor, for_signature: bool) -> list[str]:
        """The renderer's words for the nodes SCons' substitution would give it (the executor's, sources
        through their repository copies)."""
        if executor:
            target, source = executor.get_all_targets(), executor.get_all_sources()
        return renderer.words(target, [SCons.Action.rfile(node) for node in source], env, for_signature)

    def process(self, target, source, env, executor=None, overrides=None):
        renderer = None if overrides else self.renderer(env)
        if renderer is None:
            return super().process(target, source, env, executor, overrides)
        words = self._render(renderer, target, source, env, executor, False)
        return [literal_words(words)], False, False  # as Renderer's __call__ gives them

    def argv(self, target, source, env, executor=None) -> list[str] | None:
        """The words the node runs, where the variable is just one of our renderers (None otherwise: a
        command of the user's, a function): what remote execution sends."""
        renderer = self._node_renderer(executor.get_all_targets() if executor else target, env)
        return None if renderer is None else self._render(renderer, target, source, env, executor, False)

    def get_targets(self, env, executor):
        # A lazy action would make an action of the renderer (and hash its code) to answer this.
        return self.targets if self.renderer(env) is not None else super().get_targets(env, executor)

    def batch_key(self, env, target, source):
        return None if self.renderer(env) is not None else super().batch_key(env, target, source)

    def genstring(self, target, source, env, executor=None):
        # What SCons records as the node's action (shown by --debug=explain), as a lazy action words it.
        renderer = self._node_renderer(executor.get_all_targets() if executor else target, env)
        if renderer is None:
            return super().genstring(target, source, env, executor)
        return f"{renderer.__name__}(target, source, env)"

    def execute(self, target, source, env, executor=None):
        """With SCons' own POSIX ``$SPAWN``, run the rendered argv without ``sh -c``: it is an argv list
        from the driver, never shell syntax, and the shell's start costs about 1 ms a node. Only words of the
        user's own flags written for the shell (:func:`_user_shell_words`) ever reach one; any other value of
        the variable takes SCons' path, its words quoted by :class:`_Escape` (SCons' own leaves backticks active)."""
        renderer = self.renderer(env)
        if renderer is not None and env.get("SPAWN") is SHELL_SPAWN:
            words = self.shell_words(renderer, target, source, env, executor)
            env = env.Override({"SPAWN": functools.partial(_spawn_argv, shell_words=words), "ESCAPE": str})
        elif env.get("ESCAPE") is _SHELL_ESCAPE:
            env = env.Override({"ESCAPE": _Escape(env, executor.get_all_targets() if executor else target, source)})
        return super().execute(target, source, env, executor)

    def shell_words(self, renderer: Renderer, target, source, env, executor) -> frozenset[str]:
        """:func:`_user_shell_words` for a node whose rendered words hold something a shell acts on, else none
        (the usual case: the user's flags are not read at all)."""
        words = self._render(renderer, target, source, env, executor, False)
        if not any(_SHELL_ACTIVE.search(word) for word in words):
            return frozenset()
        return _user_shell_words(env, executor.get_all_targets() if executor else target, source)

    def get_presig(self, target, source, env, executor=None):
        renderer = self._node_renderer(executor.get_all_targets() if executor else target, env)
        if renderer is None:
            return super().get_presig(target, source, env, executor)
        return " ".join(self._render(renderer, target, source, env, executor, True))

    def get_implicit_deps(self, target, source, env, executor=None):
        """SCons' default command scan (``$IMPLICIT_COMMAND_DEPENDENCIES`` unset or true: the program, the first
        word found on ``$ENV['PATH']``) read from the rendered words, which SCons would substitute once more
        (about 1 ms a node); any other setting takes SCons' own path."""
        if env.get("IMPLICIT_COMMAND_DEPENDENCIES", True) not in (True, 1):  # our compile nodes: 0
            return super().get_implicit_deps(target, source, env, executor)
        renderer = self._node_renderer(executor.get_all_targets() if executor else target, env)
        if renderer is None:
            return super().get_implicit_deps(target, source, env, executor)
        words = self._render(renderer, target, source, env, executor, True)
        program = env.WhereIs(words[0]) if words else None
        return [env.fs.File(program)] if program else []


SHELL_SPAWN = SCons.Platform.posix.subprocess_spawn


#: What a POSIX shell acts on in a word as SCons passes it (bare, or in "..." when it holds a space).
_SHELL_ACTIVE = re.compile(r"""[\\"'$`*?\[~#;&|<>()\n]""")


#: SCons' own ``$ESCAPE`` on POSIX. It puts a literal word in double quotes with only ``\``, ``"`` and ``$``
#: escaped, where a backtick still runs a command: our actions replace it (:func:`_quote_word`).
_SHELL_ESCAPE = SCons.Platform.posix.escape


def _user_shell_words(env, target, source) -> frozenset[str]:
    """The words of the user's own flags that SCons' ``$CCCOM`` would hand a shell to read, and the values a
    driver job repeats them as (``-DV=\\"1\\"`` becomes ``-D`` ``V=\\"1\\"`` in a ``-cc1`` line).

    The user's flags are every ``*FLAGS`` variable of theirs (``{target: flags}`` tables included) and the
    defines; a word counts where SCons would not quote it (it is not literal) and a shell would change it.
    Words that the tool or the driver made (paths, the top directory in ``-fdebug-compilation-dir=``) are not
    among them: they must reach the program as they are, whatever the project's path holds."""
    names = ["_CPPDEFFLAGS"]
    tables: list[Any] = []
    for name, value in env.Dictionary().items():
        if not name.endswith("FLAGS") or name.startswith("_"):
            continue
        if isinstance(value, dict):
            tables.extend(flags for flags in value.values() if flags)
        else:
            names.append(name)
    lines = env.subst_list(" ".join(f"${name}" for name in names), SCons.Subst.SUBST_CMD, target=target,
                           source=source)
    for flags in tables:
        lines += env.subst_list(flags, SCons.Subst.SUBST_CMD, target=target, source=source)
    words: set[str] = set()
    for line in lines:
        for word in line:
            text = str(word)
            if _SHELL_ACTIVE.search(text) and not getattr(word, "is_literal", lambda: False)():
                words.update((text, *_option_values(text)))
    return frozenset(words)


def _option_values(word: str) -> list[str]:
    """What a driver job may repeat of a flag: the value of a one-letter option (``V=1`` of ``-DV=1``, as
    ``-D V=1`` in a ``-cc1`` line), and that of an ``-f...=`` option (``-ffile-prefix-map=V`` becomes
    ``-fdebug-prefix-map=V``)."""
    values = []
    if len(word) > 2 and word[0] == "-" and word[1].isalpha():
        values.append(word[2:])
    if word.startswith("-f") and "=" in word:
        values.append(word.split("=", 1)[1])
    return values


def _from_user(word: str, shell_words: frozenset[str]) -> bool:
    """Whether ``word`` of a command is one of the user's words for the shell, or one's value under the same
    or another option."""
    return word in shell_words or any(value in shell_words for value in _option_values(word))


def _quote_word(word: str, shell_words: frozenset[str] = frozenset()) -> str:
    """``word`` for a shell command line: the user's own words for the shell as SCons passes them (in double
    quotes where they hold a space, so the shell reads the rest), any other word quoted so that the shell
    passes it unchanged."""
    word = str(word)
    if _from_user(word, shell_words):
        return SCons.Subst.quote_spaces(word)
    return shlex.quote(word)


class _Escape:
    """``$ESCAPE`` for one command that SCons' own path runs (a wrapped phase command): :func:`_quote_word`,
    the user's words read only once a word holds something a shell acts on."""

    def __init__(self, env, target, source) -> None:
        self._env, self._target, self._source = env, target, source
        self._shell_words: frozenset[str] | None = None

    def __call__(self, word) -> str:
        text = str(word)
        if _SHELL_ACTIVE.search(text) is None:
            return shlex.quote(text)
        if self._shell_words is None:
            self._shell_words = _user_shell_words(self._env, self._target, self._source)
        return _quote_word(text, self._shell_words)


def _command(shell: str, args: Sequence[str], shell_words: frozenset[str]) -> list[str]:
    """The argv that runs ``args``: themselves, or ``sh -c`` where one of the user's words needs the shell."""
    if not any(_SHELL_ACTIVE.search(arg) and _from_user(arg, shell_words) for arg in args):
        return list(args)
    return [shell, "-c", " ".join(_quote_word(arg, shell_words) for arg in args)]


def spawn_keeping_stderr(messages: list[str], scratch: str | None, shell: str, escape, command: str,
                         args: list[str], environ: dict[str, str], shell_words: frozenset[str] = frozenset()) -> int:
    """Like :func:`_spawn_argv`, with the command's standard error passed on and appended to ``messages``, and
    its ``$TMPDIR`` a directory of its own inside ``scratch`` (the device link's unpacked inputs)."""
    try:
        with leftovers.private_tmpdir(environ, scratch) as private:
            done = subprocess.run(_command(shell, args, shell_words), env=private, stderr=subprocess.PIPE,
                                  close_fds=True, check=False)
    except OSError as error:
        print(f"{args[0]}: {error.strerror}", file=sys.stderr)
        return 127 if error.errno == errno.ENOENT else 126
    text = done.stderr.decode(errors="replace")
    if text:
        sys.stderr.write(text)
        sys.stderr.flush()
    messages.append(text)
    return done.returncode


def _spawn_argv(shell: str, escape, command: str, args: list[str], environ: dict[str, str],
                shell_words: frozenset[str] = frozenset()) -> int:
    """``$SPAWN`` for argv that needs no shell; the exit status ``sh`` would give for a missing program.

    Only the user's own words for the shell (``shell_words``, see :func:`_user_shell_words`) send it through
    one, every other word quoted for it: users write flags for the shell (``CPPDEFINES=[("V",
    '\\\\"1.0\\\\"')]`` relies on it to drop the backslashes), while a word the tool or the driver made
    (``-fdebug-compilation-dir=`` with a project path holding a backtick or a ``"``) is never shell syntax."""
    try:
        return SCons.Platform.posix.exec_subprocess(_command(shell, args, shell_words), environ)
    except OSError as error:
        print(f"{args[0]}: {error.strerror}", file=sys.stderr)
        return 127 if error.errno == errno.ENOENT else 126


#: The host link's default command line (``$OFFLOAD_LINKCOM``): while it is this line, :class:`HostLinkAction`
#: runs the driver's own link job without starting the driver.
HOST_LINKCOM = row(Phase.LINK, OPENMP, LINK).default


class HostLinkAction(SCons.Action.LazyAction):
    """``$OFFLOAD_LINKCOM`` as SCons makes it. While it is our default line and SCons' POSIX ``$SPAWN``
    runs it, the spawn runs the one job the driver would run for that line (its ``ld.lld``), known from
    a probe kept in the project's probe cache, instead of starting the driver: about 20 ms a link.
    Signature and message stay the driver line's, so nothing relinks for this and the printed command
    still does what it says."""

    def __init__(self) -> None:
        super().__init__("OFFLOAD_LINKCOM", {"cmdstr": "$OFFLOAD_LINKCOMSTR"})

    def execute(self, target, source, env, executor=None):
        if (env.get("SPAWN") is SHELL_SPAWN and env.get(self.var) == HOST_LINKCOM
                and (cache := probe_cache_for(env)) is not None):
            if executor:
                target, source = executor.get_all_targets(), executor.get_all_sources()
            lines = self.process(target, [SCons.Action.rfile(node) for node in source], env, executor)[0]
            if len(lines) == 1 and not any(_for_the_shell(word) for word in lines[0]):
                return super().execute(target, source, env.Override(
                    {"SPAWN": functools.partial(_spawn_link_job, cache), "ESCAPE": str}), executor)
        if env.get("ESCAPE") is _SHELL_ESCAPE:  # its literal words (file names) as they are, backticks too
            env = env.Override({"ESCAPE": _quote_word})
        return super().execute(target, source, env, executor)


def _for_the_shell(word) -> bool:
    """A word SCons would hand the shell to read (file names are literal: SCons quotes them, meaning them
    as they are)."""
    literal = getattr(word, "is_literal", lambda: False)()
    return not literal and (_SHELL_ACTIVE.search(str(word)) is not None or " " in str(word) or "\t" in str(word))


def _spawn_link_job(cache, shell: str, escape, command: str, args: list[str], environ: dict[str, str]) -> int:
    """``$SPAWN`` for the host link (words as they are, none for the shell): the driver's own job."""
    try:
        job = linking.host_link_job(args, os.getcwd(), environ, cache)
    except OffloadError:
        job = None  # the driver does not start: running it says so
    return _spawn_argv(shell, escape, command, list(job or args), environ)


class RemoveSideFile(SideStep, SCons.Action.ActionBase):
    """The last step of a node whose steps pass a file along (:func:`~offload_builders.scons.outputs.side_path`):
    the file is in the target now. Its signature is its description (a function action's would be its code's
    bytes, so editing the function would rebuild every such node)."""

    def __init__(self, suffix: str, what: str) -> None:
        self.suffix = suffix
        self.description = f"remove {what}"

    def __call__(self, target, source, env, *args, **kwargs) -> int:
        try:
            os.unlink(side_path(env, target[0], self.suffix))
        except FileNotFoundError:
            pass
        return 0

    def __str__(self) -> str:
        return self.description

    def get_presig(self, target, source, env, executor=None) -> bytes:
        return self.description.encode()

    def get_implicit_deps(self, target, source, env, executor=None) -> list:
        return []

    def get_varlist(self, target, source, env, executor=None) -> tuple:
        return ()


def node_action(actions: Sequence) -> RemoteListAction:
    """The action list of an offload node: its steps, which start by sweeping leftovers
    (:data:`~offload_builders.scons.outputs.REMOVE_STALE`) and commit with
    :data:`~offload_builders.scons.outputs.COMMIT`, asking the remote cache first where ``$OFFLOAD_REMOTE`` names one
    (:class:`offload_builders.scons.remote.RemoteListAction`; its signature is the list's own)."""
    return RemoteListAction(list(actions), sweep=REMOVE_STALE, commit=COMMIT)


def phase_action(phase: str) -> SCons.Action.ListAction:
    return node_action([REMOVE_STALE, PhaseCommandAction(phase), COMMIT])


def function_phase(phase: str, before=(), after=(), varlist: Sequence[str] | None = None,
                    command: type[PhaseCommandAction] = PhaseCommandAction) -> SCons.Action.ListAction:
    """Like :func:`phase_action` for phases whose ``$OFFLOAD_<PHASE>COM`` may be a Python function
    (``varlist``: what its signature reads, default :data:`FUNCTION_PHASE_VARLIST`)."""
    return node_action([
        REMOVE_STALE, *before,
        command(phase, FUNCTION_PHASE_VARLIST if varlist is None else varlist),
        COMMIT, *after,
    ])


def in_process_action(function, phase: str, varlist: Sequence[str], *, name: str | None = None, version: int = 1,
                      covers: Sequence[str] = ()) -> SCons.Action.FunctionAction:
    """A default ``$OFFLOAD_<PHASE>COM`` that runs ``function`` in the SCons process, as one action object
    signed by ``name`` and ``version`` (:mod:`offload_builders.scons.versioned_actions`; every one of the tool's
    has them). Without a name (a SConstruct's own function), SCons signs it by its code, as any function action.

    Given a bare function, SCons makes a new action from it each time it resolves the variable (for
    the signature, the dependencies, the message and the run: five times a node). An action object is used
    as it is; it carries the message and ``varlist`` the builder's ``$VAR`` action would have passed.
    """
    if name is None:
        return SCons.Action.Action(function, f"$OFFLOAD_{phase}COMSTR", varlist=list(varlist))
    return versioned_action(function, name, version, f"$OFFLOAD_{phase}COMSTR", varlist, covers)


FUNCTION_PHASE_VARLIST = ("OFFLOAD_TARGET", "OFFLOAD_CLANG", "_OFFLOAD_WRAP_TARGETS")
