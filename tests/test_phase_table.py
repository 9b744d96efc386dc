"""The documentation's phase tables and node names (docs/openmp.md, docs/hip.md) against the one phase table
(offload_builders.phase_table)."""
from __future__ import annotations

import re
from pathlib import Path

from offload_builders.phase_table import (
    COMPILE,
    HIP,
    LINK,
    OPENMP,
    PHASES,
    Default,
    Phase,
    command_defaults,
    message_defaults,
    row,
)

DOCS = Path(__file__).resolve().parent.parent / "docs"
OPENMP_PAGE = (DOCS / "openmp.md").read_text()
HIP_PAGE = (DOCS / "hip.md").read_text()


def _table_after(heading: str) -> list[list[str]]:
    """The rows (cells) of the first Markdown table in docs/openmp.md after the line that starts with ``heading``."""
    lines = OPENMP_PAGE[OPENMP_PAGE.index(heading):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| phase |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _pattern(node: str, stem: str) -> re.Pattern[str]:
    """A node pattern of the table as the documentation writes its examples (a target ID or ``<target>``)."""
    text = re.escape(node)
    for field, regex in (("stem", re.escape(stem)), ("program", re.escape(stem)), ("target", r"(<target>|[\w:]+)"),
                         ("suffix", r"(\.\{[a-z,]+\}|\.\w+)"), ("obj", r"\.o")):
        text = text.replace(re.escape("{" + field + "}"), regex)
    return re.compile(text)


def _rows(model: str, side: str) -> list:
    return [spec for spec in PHASES if model in spec.models and spec.side == side and spec.phase is not Phase.AR]


def _check_table(cells: list[list[str]], specs: list) -> None:
    assert [c[0] for c in cells] == [spec.title for spec in specs]
    for (title, node, command), spec in zip(cells, specs):
        assert _pattern(spec.node, "zaxpy").fullmatch(node.strip("`")), (title, node, spec.node)
        assert f"${spec.com}" in command, (title, command)


def test_docs_source_table_is_the_openmp_compile_phases():
    _check_table(_table_after("Each source becomes these nodes"), _rows(OPENMP, COMPILE))


def test_docs_program_table_is_the_openmp_link_phases():
    _check_table(_table_after("and each `OffloadProgram` these"), _rows(OPENMP, LINK))


def test_docs_hip_page_names_the_hip_nodes():
    section = HIP_PAGE  # the page is the HIP section
    named = set(re.findall(r"`(<stem>\.[^`]+)`", section))
    expected = {row(phase, HIP).node for phase in (Phase.DEVICE, Phase.DEVICELINK, Phase.BUNDLE)}
    for node in expected:
        assert any(_pattern(node, "<stem>").fullmatch(name) for name in named), node
    for name in named:
        assert any(_pattern(spec.node, "<stem>").fullmatch(name) for spec in PHASES if HIP in spec.models), name


def test_every_phase_has_its_variables_and_one_row_per_model_and_side():
    seen = set()
    for spec in PHASES:
        assert spec.com == f"OFFLOAD_{spec.phase.value}COM" and spec.comstr == spec.com + "STR"
        for model in spec.models:
            key = (spec.phase, model, spec.side)
            assert key not in seen, key
            seen.add(key)
        if spec.default_kind is Default.ACTION:
            assert spec.default.isidentifier()
    assert set(command_defaults(OPENMP)) == {"OFFLOAD_HOSTCOM", "OFFLOAD_DEVICECOM", "OFFLOAD_ASSEMBLECOM",
                                             "OFFLOAD_EMBEDCOM", "OFFLOAD_ARCOM", "OFFLOAD_DEVICELINKCOM",
                                             "OFFLOAD_LINKCOM"}


def test_in_process_defaults_are_the_model_modules_actions():
    """Each ACTION default names an object of its model's SCons module (the link side's: the program
    module every model shares), and the tool installs it."""
    from offload_builders.scons import hip, openmp, program

    modules = {OPENMP: openmp, HIP: hip}
    for spec in PHASES:
        if spec.default_kind is Default.ACTION:
            for model in spec.models:
                module = program if spec.side == LINK else modules[model]
                assert hasattr(module, spec.default), (model, spec.default)


def test_the_nvptx_runtime_phases_have_default_messages():
    """The tool's own NVPTX device runtime nodes, which a project's phase labels may not know, print a message
    (their table title, the target, the node) rather than their in-process function's repr; other phases none."""
    defaults = message_defaults(OPENMP)
    assert defaults == {row(phase, OPENMP, LINK).comstr: f"{row(phase, OPENMP, LINK).title} [$OFFLOAD_TARGET]: $TARGET"
                        for phase in (Phase.RUNTIMESYMS, Phase.RUNTIMELINK)}
    assert message_defaults(HIP) == {}
