"""The documentation's links and its module list: README.md and docs/*.md.

* every relative link (and image) points at a file that exists, and an ``#anchor`` into a Markdown page at
  one of its headings (GitHub's slugs);
* every page under docs/ is linked from README.md;
* the module list of docs/internals.md names every module of ``offload_builders/``, and only those;
* the pages speak of the product, not of how it was made: no development sessions, issue numbers or development
  machines (CHANGELOG.md may name dates and rounds, but no sessions or issues either);
* no link, and no ``../`` path in the text, leads outside the repository, and no link is an absolute filesystem
  path.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PACKAGE = ROOT / "offload_builders"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
CHANGELOG = ROOT / "CHANGELOG.md"

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The text without fenced code blocks and code spans, where a link is not a link."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def _links(page: Path) -> list[str]:
    return _LINK.findall(_prose(page.read_text()))


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: the text (links and code marks dropped), lower case, without punctuation
    other than ``-`` and ``_``, spaces as ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings (a repeated slug gets ``-1``, ``-2``...)."""
    seen: dict[str, int] = {}
    result = set()
    for _, heading in _HEADING.findall(_FENCE.sub("", page.read_text())):
        slug = _slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def _is_relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) and not target.startswith("//")


def test_slugs_are_githubs():
    assert _slug("Image groups: `OFFLOAD_IMAGE_GROUPS=True` (OpenMP)") == "image-groups-offload_image_groupstrue-openmp"
    assert _slug("`scripts/gpu-check`") == "scriptsgpu-check"
    assert _slug("Reading `--debug=explain`") == "reading---debugexplain"


def test_the_link_finder_skips_code():
    text = "[a](x.md) `[b](y.md)` and ``[c](z.md)``\n\n```\n[d](w.md)\n```\n![e](f.png \"t\")"
    assert _LINK.findall(_prose(text)) == ["x.md", "f.png"]


@pytest.mark.parametrize("page", [*PAGES, ROOT / "CHANGELOG.md"], ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_point_at_existing_files_and_headings(page: Path):
    broken = []
    for target in _links(page):
        if not _is_relative(target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_every_docs_page_is_linked_from_the_readme():
    readme = ROOT / "README.md"
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in _links(readme) if _is_relative(target)}
    assert DOCS.is_dir()
    missing = [page.name for page in sorted(DOCS.glob("*.md")) if page.resolve() not in linked]
    assert not missing, f"docs pages not linked from README.md: {missing}"


def _listed_modules() -> list[str]:
    """The module paths of docs/internals.md's list: between ``<!-- modules: begin -->`` and
    ``<!-- modules: end -->``, one bullet per module, starting with its path in code marks."""
    text = (DOCS / "internals.md").read_text()
    begin, end = "<!-- modules: begin -->", "<!-- modules: end -->"
    assert text.count(begin) == 1 and text.count(end) == 1, "internals.md: one delimited module list"
    block = text[text.index(begin) + len(begin):text.index(end)]
    bullets = re.findall(r"^[*-] (.*)$", block, re.M)
    paths = []
    for bullet in bullets:
        match = re.match(r"`([^`]+)`", bullet)
        assert match, f"internals.md: a module bullet that does not start with a path: {bullet!r}"
        path = match.group(1)
        if not path.endswith(".py"):  # a package named by itself: its __init__.py
            path = path.rstrip("/") + "/__init__.py"
        paths.append(path)
    return paths


def test_the_internals_module_list_is_the_package():
    listed = _listed_modules()
    duplicates = sorted({path for path in listed if listed.count(path) > 1})
    on_disk = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
               if "__pycache__" not in path.parts}
    unlisted = sorted(on_disk - set(listed))
    missing = sorted(set(listed) - on_disk)
    assert not (duplicates or unlisted or missing), (
        f"listed twice: {duplicates}\nmodules not in docs/internals.md: {unlisted}\n"
        f"listed in docs/internals.md but not in offload_builders/: {missing}")


# --- The pages speak of the product --------------------------------------------------------------------------------

#: Labels of the project's own history: (pattern, what it is). "Round" alone is a benchmark word ("five rounds").
_HISTORY = (
    (re.compile(r"\bsessions?[ -]#?\d", re.I), "a development session"),
    (re.compile(r"\bissues? #?\d+", re.I), "an issue number"),
    (re.compile(r"(?<![\w/-])\(#\d+\)"), "an issue number"),
    (re.compile(r"\brounds? \d+ of development\b", re.I), "a development round"),
    (re.compile(r"\bborrowed\b", re.I), "a borrowed machine"),
    (re.compile(r"\blent\b", re.I), "a lent machine"),
    (re.compile(r"\bdevelopment machines?\b", re.I), "the development machine"),
)
#: What CHANGELOG.md, a history by date, may still say.
_CHANGELOG_ALLOWS = {"a development round"}


def history_labels(text: str, allowed: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """``line: label (what it is)`` for each development-history label in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, what in _HISTORY:
            if what not in allowed:
                found.extend(f"{number}: {match.group(0)!r} ({what})" for match in pattern.finditer(line))
    return found


def test_the_history_check_finds_labels_and_leaves_product_words():
    for bad in ("Session 15 ran its bundle", "sessions 12 and 13", "the session-4 figures", "see issue #31",
                "issue 27 asked for it", "fixed (#42)", "in round 3 of development", "on a borrowed H100",
                "a lent GPU", "on the 2-CPU development machine"):
        assert history_labels(bad), bad
    for good in ("five rounds of each side", "best of 3 interleaved rounds", "a REAPI session's channel",
                 "llvm/llvm-project#159088", "silently merged", "the equivalent command", "issues a warning",
                 "measured 2026-11-26 on 2 cores"):
        assert not history_labels(good), good
    assert not history_labels("in round 3 of development", _CHANGELOG_ALLOWS)
    assert history_labels("session 3", _CHANGELOG_ALLOWS)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_pages_carry_no_development_history(page: Path):
    found = history_labels(page.read_text())
    assert not found, f"{page.relative_to(ROOT)} (move history to CHANGELOG.md):\n" + "\n".join(found)


def test_the_changelog_names_no_sessions_or_issues():
    assert CHANGELOG.is_file()
    found = history_labels(CHANGELOG.read_text(), _CHANGELOG_ALLOWS)
    assert not found, "CHANGELOG.md:\n" + "\n".join(found)


# --- Nothing leads outside the repository --------------------------------------------------------------------------

#: A ``../`` path written in the text (a code span included), not inside a longer path such as ``$ORIGIN/../lib``.
_PARENT_PATH = re.compile(r"(?<![\w./$-])((?:\.\./)+[\w.-][\w./-]*)")


def _inside(path: Path) -> bool:
    return path == ROOT or ROOT in path.parents


def links_leaving_the_repository(text: str, directory: Path) -> list[str]:
    """What in ``text`` (a page in ``directory``) leads outside the repository: absolute filesystem links
    (``/x``, ``file:``), relative links that resolve outside it, and ``../`` paths in the prose or code spans that
    resolve to nothing inside it."""
    found = []
    targets = _LINK.findall(_prose(text))
    for target in targets:
        path = target.partition("#")[0]
        if re.match(r"file:", target, re.I):
            found.append(f"{target}: a file: URL")
        elif target.startswith("/") and not target.startswith("//"):
            found.append(f"{target}: an absolute filesystem path")
        elif _is_relative(target) and path and not _inside((directory / path).resolve()):
            found.append(f"{target}: outside the repository")
    linked = {target.partition("#")[0] for target in targets}
    for path in _PARENT_PATH.findall(_FENCE.sub("", text)):
        if path in linked:  # a link's own target: checked above
            continue
        resolved = (directory / path).resolve()
        if not _inside(resolved) or not resolved.exists():
            found.append(f"{path}: not a path inside the repository")
    return found


def test_the_outside_check_finds_links_and_paths_out_of_the_repository():
    docs = DOCS
    for bad in ("[notes](../../shared/x.md)", "[x](/etc/passwd)", "[x](file:///tmp/x.md)",
                "see (`../shared/reference/gpu-runs-and-remote.md`)", "![plot](../../elsewhere.png)"):
        assert links_leaving_the_repository(bad, docs), bad
    for good in ("[perf](performance.md#no-op-at-scale)", "![plot](../bench/results/scale.png)",
                 "[LLVM](https://llvm.org/docs/)", "run path `$ORIGIN/../lib`", "a `../` path that leaves the top",
                 "```sh\ncd ../shared/elsewhere\n```", "[changelog](../CHANGELOG.md)"):
        assert not links_leaving_the_repository(good, docs), good


@pytest.mark.parametrize("page", [*PAGES, CHANGELOG], ids=lambda page: str(page.relative_to(ROOT)))
def test_nothing_leads_outside_the_repository(page: Path):
    found = links_leaving_the_repository(page.read_text(), page.parent)
    assert not found, f"{page.relative_to(ROOT)}:\n" + "\n".join(found)
