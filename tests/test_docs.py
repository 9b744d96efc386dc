"""The documentation's links and its module list: README.md and docs/*.md.

* every relative link (and image) points at a file that exists, and an ``#anchor`` into a Markdown page at
  one of its headings (GitHub's slugs);
* every page under docs/ is linked from README.md;
* the module list of docs/internals.md names every module of ``offload_builders/``, and only those.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PACKAGE = ROOT / "offload_builders"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

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


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
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
