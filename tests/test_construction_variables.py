"""The SCons tool's construction variables, declared once (:mod:`offload_builders.scons.construction_variables`),
against the documentation and against the tool itself.

* The variable tables of the documentation (each Markdown table whose header starts ``| variable |``; a row may
  name several variables, one default for all) name exactly the variables declared for that page, each with
  its declared default.
* A loaded tool sets each declared default (the in-process actions and classes: the setter's own objects; the
  computed ones: the toolchain's), sets no ``OFFLOAD_*`` variable (nor any other but its private ``_OFFLOAD_*``
  callables) that is not declared, leaves the read-only ones unset, and overwrites no value the user set.
* The list stays at the bottom of the SCons layer: it imports no module of ``offload_builders.scons`` and nothing
  of SCons.
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from offload_builders import phase_table
from offload_builders.phase_table import HIP, OPENMP, Default, Phase, command_defaults, message_defaults, row
from offload_builders.scons import construction_variables
from offload_builders.scons.construction_variables import (
    BY_NAME,
    COMPUTED,
    PHASE_COMMANDS,
    SET_BY_TOOL,
    UNSET,
    VARIABLES,
    ConstructionVariable,
    Marker,
    ModuleObject,
    defaults_of,
    variables_set_by,
)

DOCS = REPO_ROOT / "docs"
PAGES = sorted({variable.page for variable in VARIABLES})

#: A backticked variable name in a table's first cell.
_NAME = re.compile(r"`([A-Z][A-Z0-9_]*)`")


def documented_rows(page: str) -> list[tuple[list[str], str]]:
    """(the variables a row names, its default) for each row of ``docs/<page>``'s variable tables."""
    rows: list[tuple[list[str], str]] = []
    in_table = False
    for line in (DOCS / page).read_text().splitlines():
        if line.startswith("| variable |"):
            in_table = True
            continue
        if not line.startswith("|"):
            in_table = False
        elif in_table and not line.startswith("|---"):
            names, default, _meaning = line.strip().removeprefix("| ").removesuffix(" |").split(" | ", 2)
            assert _NAME.sub("", names).replace(",", "").strip() == "", f"{page}: {names!r} names no variable list"
            rows.append((_NAME.findall(names), default.strip()))
    return rows


def test_documented_rows_reads_a_row_naming_several_variables():
    rows = documented_rows("scons-tool.md")
    assert (["OFFLOAD_CC", "OFFLOAD_CXX"], "found") in rows
    assert (["OFFLOAD_ARCHS"], "`['x86_64']`") in rows


@pytest.mark.parametrize("page", PAGES)
def test_each_page_documents_exactly_its_declared_variables_and_their_defaults(page):
    rows = documented_rows(page)
    named = [name for names, _ in rows for name in names]
    assert sorted(named) == sorted(set(named)), f"{page}: a variable documented twice"
    declared = {variable.name for variable in VARIABLES if variable.page == page}
    assert set(named) == declared, (f"{page}: documented, not declared: {sorted(set(named) - declared)}; declared,"
                                    f" not documented: {sorted(declared - set(named))}")
    wrong = {name: (default, BY_NAME[name].documented_default)
             for names, default in rows for name in names if default != BY_NAME[name].documented_default}
    assert not wrong, f"{page}: (documented, declared) defaults differ: {wrong}"


def test_a_value_default_is_documented_as_its_value():
    """A default the tool sets as it is appears in the documentation as its ``repr`` (the phase commands, on
    their own section, aside)."""
    for variable in VARIABLES:
        if not isinstance(variable.default, (Marker, ModuleObject)) and variable.default_text != PHASE_COMMANDS:
            assert f"`{variable.default!r}`" in variable.documented_default, variable


def test_the_phase_commands_are_the_phase_tables():
    """The ``$OFFLOAD_<PHASE>COM`` and ``COMSTR`` defaults are the phase table's (OpenMP's, the model of an
    environment as the tool loads; HIP's fat binary); in-process ones by their object's name."""
    declared = {variable.name: variable.default for variable in VARIABLES if variable.default_text == PHASE_COMMANDS}
    in_process = {spec.com: ModuleObject(spec.default) for spec in phase_table.PHASES
                  if OPENMP in spec.models and spec.default_kind is Default.ACTION}
    assert declared == {**command_defaults(OPENMP), **in_process}
    for name, message in message_defaults(OPENMP).items():
        assert BY_NAME[name].default == message and BY_NAME[name].set_by == SET_BY_TOOL
    assert BY_NAME["OFFLOAD_BUNDLECOM"].default == ModuleObject(row(Phase.BUNDLE, HIP).default)
    # HIP's objects' device link renders through the same variable, which HIP once set to its own row's default.
    assert BY_NAME["OFFLOAD_DEVICELINKCOM"].default == row(Phase.DEVICELINK, HIP).default


def test_each_variable_is_declared_once_and_each_marker_needs_its_text():
    assert len(BY_NAME) == len(VARIABLES)
    with pytest.raises(ValueError, match="needs its default_text"):
        ConstructionVariable("OFFLOAD_X", COMPUTED, "x", "scons-tool.md", SET_BY_TOOL)
    with pytest.raises(ValueError, match="never sets"):
        ConstructionVariable("OFFLOAD_X", UNSET, "x", "scons-tool.md", SET_BY_TOOL, "unset")


def test_defaults_of_copies_values_and_takes_objects_and_computed_ones_from_the_setter():
    first, second = (defaults_of(SET_BY_TOOL, {"JournalingCacheDir": object},
                                 {"OFFLOAD_CC": "cc", "OFFLOAD_CXX": "c++", "OFFLOAD_LINKFLAGS": []})
                     for _ in range(2))
    assert list(first) == [variable.name for variable in variables_set_by(SET_BY_TOOL)]
    assert first["CACHEDIR_CLASS"] is object and first["OFFLOAD_CC"] == "cc"
    assert first["OFFLOAD_TARGET_FLAGS"] == {} and first["OFFLOAD_TARGET_FLAGS"] is not second["OFFLOAD_TARGET_FLAGS"]
    first["OFFLOAD_ARCHS"].append("sm_90")  # an environment's own copy: the declaration keeps its value
    assert BY_NAME["OFFLOAD_ARCHS"].default == ["x86_64"]
    with pytest.raises(ValueError, match="computes the defaults of"):
        defaults_of(SET_BY_TOOL, {"JournalingCacheDir": object}, {"OFFLOAD_CC": "cc"})
    with pytest.raises(ValueError, match="JournalingCacheDir is not an object of tool"):
        defaults_of(SET_BY_TOOL, {}, {"OFFLOAD_CC": "cc", "OFFLOAD_CXX": "c++", "OFFLOAD_LINKFLAGS": []})


def test_the_list_imports_nothing_of_the_scons_layer():
    """It sits below every module of ``offload_builders.scons`` (:mod:`~offload_builders.scons.variables`
    included), so each may import it: the standard library and core modules only, and no SCons."""
    tree = ast.parse(Path(construction_variables.__file__).read_text())
    imported = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    for module in imported:
        top = module.split(".")[0]
        assert top in sys.stdlib_module_names or (top == "offload_builders" and not module.startswith(
            "offload_builders.scons")), module


#: Declares the tool in an environment of SCons' default tools (with the user's values, JSON on the command line),
#: and prints as JSON what loading it added and the declared variables' values.
LOAD_THE_TOOL = textwrap.dedent("""
    import collections
    import importlib
    import json
    import sys

    import SCons.Environment

    import offload_builders.scons
    from offload_builders.scons.construction_variables import VARIABLES, ModuleObject
    from offload_builders.scons.variables import toolchain_for

    env = SCons.Environment.Environment(tools=["default"], **json.loads(sys.argv[1]))
    before = set(env.Dictionary())
    env.Tool("offload", toolpath=[offload_builders.scons.toolpath()])


    def shown(value):
        if isinstance(value, (list, collections.UserList)):
            return [str(item) for item in value]
        if value is None or isinstance(value, (str, int, dict)):
            return value
        return {"object": repr(value)}


    def is_the_setters(variable):
        setter = importlib.import_module(f"offload_builders.scons.{variable.set_by}")
        return env.get(variable.name) is getattr(setter, variable.default.name)


    toolchain = toolchain_for(env)
    print(json.dumps({
        "added": sorted(set(env.Dictionary()) - before),
        "values": {variable.name: shown(env[variable.name]) for variable in VARIABLES if variable.name in env},
        "setters_objects": {variable.name: is_the_setters(variable) for variable in VARIABLES
                            if isinstance(variable.default, ModuleObject)},
        "clang": str(toolchain.clang), "cxx": list(toolchain.cxx_command),
        "lld": toolchain.optional_tool("ld.lld") is not None,
    }))
""")


def load_the_tool(directory: Path, user_values: dict) -> dict:
    script = directory / "load_the_tool.py"
    script.write_text(LOAD_THE_TOOL)
    done = subprocess.run([sys.executable, str(script), json.dumps(user_values)], cwd=directory, capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def loaded(tmp_path_factory, llvm19) -> dict:
    """What loading the tool with no variable of the user's sets."""
    llvm19("clang")
    return load_the_tool(tmp_path_factory.mktemp("defaults"), {})


def test_a_loaded_tool_sets_each_declared_default(loaded):
    values = loaded["values"]
    for variable in VARIABLES:
        if variable.default is UNSET:
            assert variable.name not in values, variable.name
        elif isinstance(variable.default, ModuleObject):
            assert loaded["setters_objects"][variable.name], variable.name
        elif variable.default is not COMPUTED:
            assert values[variable.name] == variable.default, variable.name
    cxx = loaded["cxx"]
    assert values["OFFLOAD_CC"] == loaded["clang"]
    assert values["OFFLOAD_CXX"] == (cxx[0] if len(cxx) == 1 else cxx)
    assert values["OFFLOAD_LINKFLAGS"] == (["-fuse-ld=lld"] if loaded["lld"] else [])


def test_a_loaded_tool_sets_no_variable_that_is_not_declared(loaded):
    """Besides the declared ones, only the tool's private ``$_OFFLOAD_*`` callables (renderers, signatures)."""
    added = set(loaded["added"])
    public = {name for name in added if not name.startswith("_OFFLOAD_")}
    assert public == {variable.name for variable in VARIABLES if variable.set_by is not None}
    assert not {name for name in added - public if not name.startswith("_OFFLOAD_")}


def test_a_loaded_tool_overwrites_no_value_of_the_users(tmp_path, llvm19):
    """Every variable the tool sets, set by the user first (``OFFLOAD_MODEL`` to another model, the others to
    a word), keeps the user's value."""
    users = {variable.name: f"user {variable.name}" for variable in VARIABLES if variable.set_by is not None}
    users["OFFLOAD_MODEL"] = "hip"
    loaded = load_the_tool(tmp_path, users)
    assert {name: loaded["values"][name] for name in users} == users
    assert not {name for name in loaded["added"] if not name.startswith("_OFFLOAD_")}


def test_a_users_empty_link_flags_are_kept(tmp_path, llvm19):
    """``OFFLOAD_LINKFLAGS=[]`` of the user's chooses no linker: the tool does not put ``-fuse-ld=lld`` in it."""
    assert load_the_tool(tmp_path, {"OFFLOAD_LINKFLAGS": []})["values"]["OFFLOAD_LINKFLAGS"] == []
