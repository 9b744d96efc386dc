"""Text from outside made safe to print, and the remote's URL without its credentials.

A server's words (a status message, a failed command's stderr, an operation's name, the file names and digests of
an action result) reach warnings on the user's terminal, so they are never printed as they came: every character
that is not printable (C0 and C1 controls, ``ESC`` and with it every ANSI escape sequence, bidi overrides, line
separators) is shown as a Python escape (``\\x1b``), runs of white space become one space, and the text is cut to
a length (:func:`safe_text`). The URL of ``$OFFLOAD_REMOTE`` may hold a credential (``grpc://user:password@...``,
``?token=...``): wherever it is printed or put in an exception it goes through :func:`redact_url`. Needs no grpcio.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

#: The most characters of one piece of a server's text in a message (a status message, a stderr line).
TEXT_LIMIT = 400
#: The most characters of a whole warning (what :func:`safe_text` leaves of it at the end, where it is printed).
MESSAGE_LIMIT = 4000
#: How many names of a list from a server a message shows (then "and N more").
NAMES_SHOWN = 5


def safe_text(text: object, limit: int = TEXT_LIMIT) -> str:
    """``text`` (a ``str``; ``bytes`` are decoded as UTF-8, bad bytes replaced) on one line, every character that
    is not printable escaped, white space runs made one space, cut to ``limit`` characters (``...`` at the end)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    line = " ".join(str(text).split())
    if not line.isprintable():
        line = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in line)
    return line if len(line) <= limit else line[:max(0, limit - 3)] + "..."


def safe_names(names: Iterable[object], limit: int = NAMES_SHOWN) -> str:
    """A list of names from a server (output paths) for a message: each made safe (:func:`safe_text`, at most
    200 characters), at most ``limit`` of them, then how many more there are; ``[]`` for none."""
    items = list(names)
    shown = [f"'{safe_text(name, 200)}'" for name in items[:limit]]
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return f"[{', '.join(shown)}{more}]"


#: ``scheme://`` (optional) and the rest.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
#: One entry of a query or fragment (``name=value`` or a bare value), with the separator before it.
_ENTRY = re.compile(r"([?#&;])([^?#&;]*)")


def _redact_entry(entry: re.Match[str]) -> str:
    name, equals, value = entry[2].partition("=")
    if equals:
        return f"{entry[1]}{name}=***" if value else entry[0]
    return f"{entry[1]}***" if name else entry[0]


def redact_url(url: str) -> str:
    """``url`` with what may be a credential replaced by ``***``: the password of its user information
    (``user:***@``; a user name alone, which may be a token, becomes ``***@``) and every value of its query and
    fragment (``?token=***&key=***``), then made safe to print (:func:`safe_text`). Any text is taken: the user
    information ends at the last ``@`` (a password with an unescaped ``/``, ``?`` or ``#`` is hidden too)."""
    text = url.strip()
    scheme = match[0] if (match := _SCHEME.match(text)) else ""
    rest = text[len(scheme):]
    if "@" in rest:
        user_info, _, rest = rest.rpartition("@")
        user, colon, _ = user_info.partition(":")
        shown_user = user if colon and not any(character in user for character in "/?#") else ""
        rest = f"{shown_user}:***@{rest}" if shown_user else f"***@{rest}"
    cut = min((index for index in (rest.find("?"), rest.find("#")) if index >= 0), default=len(rest))
    rest = rest[:cut] + _ENTRY.sub(_redact_entry, rest[cut:])
    return safe_text(scheme + rest, MESSAGE_LIMIT)


__all__ = ["MESSAGE_LIMIT", "NAMES_SHOWN", "TEXT_LIMIT", "redact_url", "safe_names", "safe_text"]
