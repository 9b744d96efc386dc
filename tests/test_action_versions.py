"""The SCons tool's in-process actions are signed by the name and version each declares
(:mod:`offload_builders.scons.versioned_actions`), never by their code: moving code rebuilds nothing, and a change
of what an action writes must come with a new version. ``tests/action_versions.json`` records each action's code
per version (``tests/action_versions.py`` writes it); a change without a new version or an explicit "no
behaviour change" entry fails here. (A tree built while the steps were signed by their bytecode rebuilds once:
``tests/test_scons_tool.py``.)
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import action_versions
from test_scons_tool import SCONS

REPO_ROOT = Path(__file__).resolve().parent.parent

#: Put first in the sample's SConstruct: log every signature SCons takes from a function's code (``FunctionAction``'s
#: own, which signs by bytecode, called by SCons or by a subclass) where the function or callable object is the
#: tool's.
PROBE = '''\
import os
import SCons.Action
_signed_by_code = SCons.Action.FunctionAction.get_presig
def _logged(self, target, source, env, executor=None):
    function = self.execfunction
    module = getattr(function, "__module__", None) or type(function).__module__
    name = getattr(function, "__qualname__", None) or type(function).__qualname__
    ours = str(module).startswith("offload_builders")
    with open(os.environ["SIGNED_BY_CODE_LOG"] + ("" if ours else ".others"), "a") as log:
        log.write(f"{module}.{name}\\n")
    return _signed_by_code(self, target, source, env, executor)
SCons.Action.FunctionAction.get_presig = _logged
'''

def test_every_declared_action_is_recorded_with_its_code():
    """Each action's version is the record's, and its code (and what it covers) is recorded for that version."""
    record = action_versions.read_record()
    problems = []
    for name, declared in action_versions.declared_actions().items():
        entry = record.get(name)
        digest = action_versions.code_digest(declared)
        if entry is None:
            problems.append(f"{name}: a new action; record it: python tests/action_versions.py --record 'why'")
        elif entry["version"] != declared.version:
            problems.append(f"{name}: the code declares v{declared.version}, the record v{entry['version']}:"
                            " python tests/action_versions.py --record 'why'")
        elif digest not in entry["code"]:
            problems.append(f"{name} v{declared.version}: its code (or what it covers: {declared.covers}) changed;"
                            " raise its version where its output can change, else python tests/action_versions.py"
                            " --no-behaviour-change 'why'")
    assert not problems, "\n".join(problems)


def test_the_record_names_only_declared_actions():
    assert sorted(set(action_versions.read_record()) - set(action_versions.declared_actions())) == []


def test_signatures_are_the_declaration_not_the_code():
    """Two actions of one function differ by version alone, and the signature names them."""
    from offload_builders.scons.versioned_actions import DeclaredAction

    def step(target, source, env) -> int:
        return 0

    first, second = DeclaredAction("step", 1, step), DeclaredAction("step", 2, step)
    assert first.signature == b"offload-builders action step v1"
    assert first.signature != second.signature


def test_a_name_declared_twice_is_an_error(monkeypatch):
    from offload_builders.scons import versioned_actions
    from offload_builders.scons.versioned_actions import declare

    monkeypatch.setattr(versioned_actions, "DECLARED", dict(versioned_actions.DECLARED))  # the tool's, untouched

    def one(target, source, env) -> int:
        return 0

    def other(target, source, env) -> int:
        return 1

    declare("test: declared twice", 1, one)
    assert declare("test: declared twice", 1, one).function is one  # the same one again (a reloaded module)
    with pytest.raises(ValueError, match="declared twice"):
        declare("test: declared twice", 1, other)
    with pytest.raises(ValueError, match="positive integer"):
        declare("test: version zero", 0, one)


def _sample(tmp_path: Path, prelude: str) -> Path:
    root = tmp_path / "sample"
    shutil.copytree(REPO_ROOT / "sample_project", root,
                    ignore=shutil.ignore_patterns("build", ".sconsign*", "cmake", "meson"))
    sconstruct = root / "SConstruct"
    flags = 'OFFLOAD_FLAGS=["-O2", "-fcx-limited-range"],'
    assert flags in sconstruct.read_text()
    sconstruct.write_text(prelude + sconstruct.read_text().replace(
        flags, flags + ' OFFLOAD_IMAGE_GROUPS=bool(ARGUMENTS.get("groups")),'))
    return root


def _scons(root: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([SCONS, "-Q", "verbose=1", *args], cwd=root, capture_output=True, text=True,
                          env=env or os.environ.copy())
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_sample_signs_no_action_of_the_tool_by_its_code(tmp_path):
    """OpenMP (x86_64, NVPTX with its device runtime's nodes, AMDGPU), HIP and CUDA, plain and RDC, in the sample's
    three programs, then with image groups: no signature SCons takes of them comes from the tool's bytecode."""
    root = _sample(tmp_path, PROBE)
    log = tmp_path / "signed-by-code.log"
    probed = dict(os.environ, SIGNED_BY_CODE_LOG=str(log))
    _scons(root, "offload_archs=x86_64,sm_80,gfx90a", env=probed)
    assert (root / "build" / "zaxpy").is_file()
    assert "offload_group_link(" in _scons(root, "offload_archs=x86_64,sm_80,gfx90a", "groups=1", "build/zaxpy",
                                           env=probed)  # (image groups: OpenMP programs only)
    assert not log.exists(), log.read_text()
    assert "run_program" in Path(f"{log}.others").read_text()  # the sample's own step: the probe sees code signing
