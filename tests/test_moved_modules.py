"""The modules' names before issue 31's layout still import, as the modules themselves
(offload_builders.moved_modules)."""
from __future__ import annotations

import importlib
import importlib.resources
import subprocess
import sys

import pytest

from offload_builders.moved_modules import MOVED_MODULES


@pytest.mark.parametrize(("old", "new"), sorted(MOVED_MODULES.items()))
def test_an_old_name_imports_the_module_itself(old, new):
    """In a fresh interpreter, both ways an old SConstruct or action imports it: the same module object, which
    keeps its own name and spec, and the package attribute is it too."""
    script = (f"import importlib, offload_builders; old = importlib.import_module('offload_builders.{old}'); "
              f"from offload_builders import {old} as attribute; new = importlib.import_module('{new}'); "
              "print(old is new, attribute is new, new.__name__, new.__spec__.name)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "True", new, new]


def test_names_that_never_existed_still_fail():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("offload_builders.no_such_module")
    with pytest.raises(ImportError):
        exec("from offload_builders import no_such_module", {})


def test_the_old_names_are_not_files_any_more():
    """Aliases, not modules left behind: the package root holds none of the old names."""
    import offload_builders

    root = importlib.resources.files(offload_builders)
    assert not [old for old in MOVED_MODULES if (root / f"{old}.py").is_file()]
