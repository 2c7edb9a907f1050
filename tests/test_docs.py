"""The README is a front door (short, the two set-up commands first) and every relative link and
heading anchor in README.md, docs/*.md and the benchmarks' results (docs/benchmarks/results/)
resolves, by GitHub's rules for heading anchors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.paths import ROOT

README = ROOT / "README.md"
PAGES = [
    README,
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs" / "benchmarks" / "results").glob("*.md")),
]
MAX_README_LINES = 400
SETUP_COMMANDS = ("bash scripts/run_sample.sh", "bash scripts/test.sh")

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def prose_lines(text: str) -> list[str]:
    """The lines of a Markdown file outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: markup dropped, lowercased, punctuation other than
    '-' and '_' removed, each space a '-'."""
    text = INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters, digits and '_'
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a page, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(page.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(page: Path) -> list[str]:
    """The link targets of a page, outside code blocks and inline code."""
    targets = []
    for line in prose_lines(page.read_text(encoding="utf-8")):
        targets.extend(LINK.findall(INLINE_CODE.sub("", line)))
    return targets


def test_slugs_follow_githubs_rules() -> None:
    assert slug("`serve`: the OpenAI Files and Batches API") == (
        "serve-the-openai-files-and-batches-api"
    )
    assert slug("Reasoning models (`--reasoning-parser`)") == "reasoning-models---reasoning-parser"
    assert slug("`/v1/score` and `/v1/rerank` (vLLM's scoring APIs)") == (
        "v1score-and-v1rerank-vllms-scoring-apis"
    )
    assert slug("max_tokens, the rest") == "max_tokens-the-rest"


def test_readme_is_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES
    first = [line.strip() for line in lines[:40]]
    for command in SETUP_COMMANDS:
        assert command in first, command


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            broken.append(f"{target}: no heading #{anchor} in {where.relative_to(ROOT)}")
    assert not broken, broken


def test_the_manual_moved_to_docs_pages() -> None:
    """Each topic has its page, and the architecture page names the packages that exist."""
    docs = ROOT / "docs"
    for name in ("commands", "input", "models", "serve", "operations", "echo", "architecture"):
        assert (docs / f"{name}.md").is_file(), name
    architecture = (docs / "architecture.md").read_text(encoding="utf-8")
    packages = sorted(
        p.name for p in (ROOT / "batchrun").iterdir() if p.is_dir() and (p / "__init__.py").exists()
    )
    for package in packages:
        assert f"`{package}/`" in architecture, package


def test_every_echo_fault_is_documented() -> None:
    """Every BATCHRUN_ECHO_* variable the echo engine reads is on the echo page."""
    source = "".join(
        (ROOT / "batchrun" / "engines" / name).read_text(encoding="utf-8")
        for name in ("echo.py", "echo_faults.py")
    )
    page = (ROOT / "docs" / "echo.md").read_text(encoding="utf-8")
    names = set(re.findall(r"BATCHRUN_ECHO_[A-Z_]*[A-Z]", source))
    assert names >= {"BATCHRUN_ECHO_START_ERROR", "BATCHRUN_ECHO_OOM_ON"}
    assert sorted(n for n in names if n not in page) == []
