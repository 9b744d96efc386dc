"""What every command-line tool shares: one error line on stderr, exit status 1, never a traceback."""
from __future__ import annotations

import os
import sys

from offload_builders.errors import OffloadError

TYPE_CHECKING = False  # typing costs the bundler's command line milliseconds: for type checkers only
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Protocol, TypeVar

    class _HelpOrVersion(Protocol):
        help: bool
        version: bool

    _Opts = TypeVar("_Opts", bound=_HelpOrVersion)


class UsageError(Exception):
    """A mistake on the command line: printed as one ``error:`` line, exit status 1."""


def llvm_version_option(value: str, *, option: str = "--llvm-version:") -> int:
    """The value of ``--llvm-version``: a release whose OffloadBinary kind numbers we know (15 or later).

    ``option`` starts the error message (the packager words it as LLVM's ``cl::opt`` does).
    """
    from offload_builders.formats.offload_binary import kind_table  # lazily: not every tool needs it

    try:
        version = int(value)
        kind_table(version)
    except ValueError:
        raise UsageError(f"{option} '{value}' is not an LLVM release with OffloadBinary (15 or later)") from None
    return version


def answered_help_or_version(help: bool, version: bool, help_text: str, version_line: str) -> bool:
    """Print ``help_text`` for ``--help`` (it wins) or ``version_line`` for ``--version``; whether either
    was asked for, in which case the tool does nothing else."""
    if help:
        sys.stdout.write(help_text)
    elif version:
        print(version_line)
    return help or version


def os_message(exc: OSError) -> str:
    """``'<file>': <reason>`` for an OSError, the way Clang's tools word it."""
    reason = exc.strerror or str(exc)
    if exc.filename is not None:
        return f"'{os.fsdecode(exc.filename)}': {reason}"
    return reason


def run_guarded(prog: str, body: Callable[[], int], *, user_errors: tuple[type[BaseException], ...] = ()) -> int:
    """Run ``body``; turn any failure into one ``<prog>: error: ...`` line and exit status 1.

    ``user_errors`` are further exception types whose message is meant for the user as it is.
    """
    expected: tuple[type[BaseException], ...] = (UsageError, OffloadError, *user_errors)
    try:
        return body()
    except expected as exc:
        message = str(exc)
    except OSError as exc:
        message = os_message(exc)
    except KeyboardInterrupt:
        message = "interrupted"
    except Exception as exc:  # noqa: BLE001 - the contract is one line, never a traceback
        message = f"internal error ({type(exc).__name__}): {exc}"
    sys.stdout.flush()
    print(f"{prog}: error: {' '.join(message.splitlines())}", file=sys.stderr)
    return 1


def run_tool(prog: str, argv: Sequence[str] | None, parse: Callable[[Sequence[str]], _Opts], help_text: str,
             version_line: str, body: Callable[[_Opts], int]) -> int:
    """A tool's life: parse ``argv`` (default ``sys.argv[1:]``), answer ``--help``/``--version``, else run
    ``body``; every failure, a usage error included, is one ``<prog>: error:`` line and exit status 1."""
    def run() -> int:
        opts = parse(sys.argv[1:] if argv is None else argv)
        if answered_help_or_version(opts.help, opts.version, help_text, version_line):
            return 0
        return body(opts)

    return run_guarded(prog, run)
