"""One command-line parser for every tool, driven by the tool's option table.

Each tool lists its options (:class:`Option`: spellings, what an occurrence does, a check of the value)
and the words of its errors (its own, or LLVM ``cl``'s for the drop-ins of Clang's tools); :class:`Parser`
does the rest the same way for all: ``--name=value`` and ``--name value``, flags, ``--`` ending the
options, positional arguments, and one :class:`~offload_builders.cli._common.UsageError` for a mistake,
raised where the mistake is, so the first bad argument is the one named.

(Plain classes: importing ``dataclasses`` or ``typing`` costs the bundler's command line milliseconds.)
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from offload_builders.cli._common import UsageError

#: What an occurrence of an option does to its attribute.
STORE = "store"        # the value; the last occurrence wins
ONCE = "once"          # the value; a second occurrence is an error
APPEND = "append"      # the value appended to a list (every occurrence)
EXTEND = "extend"      # the values the check returns, added to a list
FLAG = "flag"          # True; ``--name=<bool>`` as the parser's ``bool_values`` allow (else an unknown option)
FLAG_ANY = "flag-any"  # True, whatever ``=value`` follows

_VALUED = (STORE, ONCE, APPEND, EXTEND)

#: LLVM ``cl``'s wording of an unknown option.
LLVM_UNKNOWN = "Unknown command line argument '{arg}'.  Try: '{prog} --help'"
#: The values LLVM ``cl`` takes for a boolean option (``--name=<value>``).
LLVM_BOOL: Mapping[str, bool] = {"true": True, "TRUE": True, "True": True, "1": True,
                                 "false": False, "FALSE": False, "False": False, "0": False}


class Option:
    """One row of an option table: its spellings, the attribute it sets and how, and an optional ``check``
    that turns the text into the stored value (or raises ``UsageError``) as soon as the option is read."""

    __slots__ = ("names", "dest", "action", "check")

    def __init__(self, *names: str, action: str = STORE, dest: str | None = None,
                 check: Callable[[str], object] | None = None) -> None:
        self.names = names
        self.dest = dest or names[0].lstrip("-").replace("-", "_")
        self.action = action
        self.check = check


class Parser:
    """Parses a tool's argv into an options object by its table.

    ``dashes="any"``: ``-name`` and ``--name`` alike (the table spells names without dashes), as LLVM's
    tools do; ``"exact"``: the names as the table spells them. ``missing`` and ``unknown`` are the error
    templates (``{name}``, ``{arg}``, ``{prog}``); ``bool_values`` the texts a ``FLAG`` accepts after
    ``=`` (None: none, ``--flag=x`` is an unknown option); ``dash_dash``: whether ``--`` ends the options.
    """

    def __init__(self, prog: str, table: Iterable[Option], *, dashes: str = "any",
                 missing: str = "option --{name} requires a value",
                 unknown: str = "unknown option '{arg}'; try '{prog} --help'",
                 repeated: str = "for the -{name} option: may only occur zero or one times!",
                 bool_values: Mapping[str, bool] | None = None,
                 bad_bool: str = "for the --{name} option: '{value}' is invalid value for boolean argument! Try 0 or 1",
                 dash_dash: bool = True) -> None:
        self.prog = prog
        self.table = {name: option for option in table for name in option.names}
        self.any_dashes = dashes == "any"
        self.missing, self.unknown, self.repeated, self.bad_bool = missing, unknown, repeated, bad_bool
        self.bool_values = bool_values
        self.dash_dash = dash_dash

    def spelling(self, dest: str) -> str:
        """The first spelling of the option that sets ``dest`` (for messages)."""
        return next(name for name, option in self.table.items() if option.dest == dest)

    def parse(self, argv: Sequence[str], into: object, positional: Callable[[str], None], *,
              rest: Callable[[list[str]], None] | None = None,
              unknown: Callable[[str], None] | None = None) -> None:
        """Set ``into``'s attributes from ``argv``; each positional argument goes to ``positional``.

        After ``--`` (with ``dash_dash``), the remaining arguments go to ``rest``, or one by one to
        ``positional``. An unknown option goes to ``unknown``, else is an error.
        """
        args = list(argv)
        seen: set[str] = set()
        i = 0
        while i < len(args):
            arg = args[i]
            i += 1
            if arg == "--" and self.dash_dash:
                if rest is not None:
                    rest(args[i:])
                else:
                    for later in args[i:]:
                        positional(later)
                return
            if arg == "-" or not arg.startswith("-"):
                positional(arg)
                continue
            name, has_value, value = (arg.lstrip("-") if self.any_dashes else arg).partition("=")
            option = self.table.get(name)
            if option is not None and option.action == FLAG and has_value and self.bool_values is None:
                option = None  # a flag given a value is no option of this tool
            if option is None:
                if unknown is None:
                    raise UsageError(self.unknown.format(arg=arg, prog=self.prog))
                unknown(arg)
            elif option.action == FLAG_ANY or (option.action == FLAG and not has_value):
                setattr(into, option.dest, True)
            elif option.action == FLAG:
                setattr(into, option.dest, self._bool(name, value))
            else:
                if not has_value:
                    if i >= len(args):
                        raise UsageError(self.missing.format(name=name))
                    value = args[i]
                    i += 1
                self._store(into, option, name, value, seen)

    def _bool(self, name: str, value: str) -> bool:
        if self.bool_values is None or value not in self.bool_values:
            raise UsageError(self.bad_bool.format(name=name, value=value))
        return self.bool_values[value]

    def _store(self, into: object, option: Option, name: str, value: str, seen: set[str]) -> None:
        if option.action == ONCE:
            if option.dest in seen:
                raise UsageError(self.repeated.format(name=name))
            seen.add(option.dest)
        checked = option.check(value) if option.check is not None else value
        if option.action == APPEND:
            getattr(into, option.dest).append(checked)
        elif option.action == EXTEND:
            getattr(into, option.dest).extend(checked)
        else:
            setattr(into, option.dest, checked)
