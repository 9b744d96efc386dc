#!/usr/bin/env python3
"""The record of the SCons tool's in-process actions (``tests/action_versions.json``): for each declared action
(:mod:`offload_builders.scons.versioned_actions`), its version and the digests of the code it stands for, each
with why it was accepted. ``tests/test_action_versions.py`` fails where an action's code is not in the record
for its version.

    python tests/action_versions.py --show
    python tests/action_versions.py --record "why"   # new actions and new versions: the code they now have
    python tests/action_versions.py --no-behaviour-change "why"   # code changed, output the same: accept it

A new version replaces the action's entry; ``--no-behaviour-change`` adds the code of an unchanged version to
it, with the reason, and is the one way to accept a change that keeps the version.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import pkgutil
import sys
from pathlib import Path

RECORD = Path(__file__).with_name("action_versions.json")


def declared_actions() -> dict:
    """Every action the tool's modules declare (importing them all declares them)."""
    import offload_builders.scons
    from offload_builders.scons.versioned_actions import DECLARED

    for module in pkgutil.walk_packages(offload_builders.scons.__path__, "offload_builders.scons."):
        importlib.import_module(module.name)
    return dict(DECLARED)


def _covered(name: str) -> object:
    module_name, _, qualname = name.partition(":")
    found: object = importlib.import_module(module_name)
    for part in qualname.split(".") if qualname else ():
        found = getattr(found, part)
    return found


def code_digest(declared) -> str:
    """The digest of the source text of the action's function and of what it covers, in order: a change of any
    of it, comments and docstrings too, needs a new version or a ``--no-behaviour-change`` entry."""
    digest = hashlib.sha256()
    for part in [declared.function, *(_covered(name) for name in declared.covers)]:
        digest.update(inspect.getsource(part).encode() + b"\0")  # type: ignore[arg-type]
    return digest.hexdigest()[:20]


def read_record() -> dict:
    return json.loads(RECORD.read_text()) if RECORD.exists() else {}


def write_record(record: dict) -> None:
    RECORD.write_text(json.dumps(dict(sorted(record.items())), indent=2) + "\n")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--show", action="store_true", help="each action's version and whether the record has it")
    what.add_argument("--record", metavar="WHY", help="record new actions and new versions")
    what.add_argument("--no-behaviour-change", metavar="WHY",
                      help="accept changed code of an unchanged version: the output does not change")
    args = parser.parse_args(argv)
    record = read_record()
    declared_now = declared_actions()
    changed = False
    for name in [name for name in record if name not in declared_now]:
        if args.show:
            print(f"{name}: recorded, but no longer declared")
        elif args.record:
            del record[name]  # an action that is gone
            changed = True
    for name, declared in declared_now.items():
        digest = code_digest(declared)
        entry = record.get(name)
        if args.show:
            known = entry is not None and entry["version"] == declared.version and digest in entry["code"]
            print(f"{name}: v{declared.version} {digest} {'recorded' if known else 'NOT RECORDED'}")
        elif entry is None or entry["version"] < declared.version:
            if args.record:
                record[name] = {"version": declared.version, "code": {digest: args.record}}
                changed = True
        elif entry["version"] > declared.version:
            print(f"{name}: the code declares v{declared.version}, the record v{entry['version']}: versions only"
                  " go up", file=sys.stderr)
            return 1
        elif digest not in entry["code"] and args.no_behaviour_change:
            entry["code"][digest] = f"no behaviour change: {args.no_behaviour_change}"
            changed = True
    if changed:
        write_record(record)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main(sys.argv[1:]))
