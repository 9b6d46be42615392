"""The docs are a reference for users: no private machine paths, lock-file commands or work-log language,
and every relative link points at a file that exists.

A page says how things are now. Numbers carry the command, the machine and the date of their run; how a
number moved over time lives in git history (and, where it matters, `docs/benchmarks/history.md`).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
HISTORY = ROOT / "docs" / "benchmarks" / "history.md"

# Things that mean nothing to a user: the developers' machines and their coordination.
PRIVATE = re.compile(
    r"/work/|/root/|flock\s+/|\bheavy\.lock\b|\bbigmem\.lock\b|\bdev (?:box|VM|machine)\b|engineers' (?:jobs|tests)"
)
# Work-log language: whose session, which pass, what happened when.
WORK_LOG = re.compile(
    r"\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|this|earlier|previous|next) session\b"
    r"|\b(?:before|since|until) \d{1,2} (?:Nov|Dec)\b"
    r"|\bbranch `[\w-]+`",
    re.IGNORECASE,
)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
ANCHOR_LINK = re.compile(r"\]\(([^)\s#]*)#([^)\s]+)\)")
# Docs a newcomer reads in an evening: docs/ at most half of the 5,476 lines it once had, README no longer.
DOCS_LINE_BUDGET = 2738
README_LINE_BUDGET = 118


def _lines(path: Path):
    in_code = False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        yield n, line, in_code
        if line.lstrip().startswith("```"):
            in_code = not in_code


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_paths_or_work_log(path: Path) -> None:
    bad = [f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}" for n, line, _ in _lines(path) if PRIVATE.search(line)]
    if path != HISTORY:
        bad += [
            f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}"
            for n, line, _ in _lines(path)
            if WORK_LOG.search(line)
        ]
    assert not bad, "docs must read as a reference (see tests/test_docs.py):\n" + "\n".join(bad)


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    missing = []
    for n, line, in_code in _lines(path):
        if in_code:
            continue
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            if not (path.parent / target).exists():
                missing.append(f"{path.relative_to(ROOT)}:{n}: {target}")
    assert not missing, "links to files that do not exist:\n" + "\n".join(missing)


def _anchors(path: Path) -> set[str]:
    """The heading anchors GitHub gives a page: lower case, punctuation dropped, spaces as hyphens."""
    out: set[str] = set()
    seen: dict[str, int] = {}
    for _, line, in_code in _lines(path):
        m = re.match(r"#{1,6}\s+(.*)$", line)
        if m and not in_code and not line.lstrip().startswith("```"):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_anchor_links_resolve(path: Path) -> None:
    missing = []
    for n, line, in_code in _lines(path):
        if in_code:
            continue
        for target, fragment in ANCHOR_LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue
            page = (path.parent / target) if target else path
            if page.exists() and fragment not in _anchors(page):
                missing.append(f"{path.relative_to(ROOT)}:{n}: {target}#{fragment}")
    assert not missing, "links to headings that do not exist:\n" + "\n".join(missing)


def test_docs_stay_within_their_line_budget() -> None:
    per_page = {p.relative_to(ROOT): len(p.read_text(encoding="utf-8").splitlines()) for p in PAGES}
    readme = per_page.pop(Path("README.md"))
    total = sum(per_page.values())
    biggest = ", ".join(f"{p} {n}" for p, n in sorted(per_page.items(), key=lambda x: -x[1])[:5])
    assert total <= DOCS_LINE_BUDGET, (
        f"docs/ holds {total} lines, over its budget of {DOCS_LINE_BUDGET} (largest: {biggest}): say a thing "
        "once and link to it; field lists belong in the generated configuration.md"
    )
    assert readme <= README_LINE_BUDGET, f"README.md holds {readme} lines, over {README_LINE_BUDGET}"


def test_anchor_slugs_follow_github() -> None:
    tmp = ROOT / "docs" / "configuration.md"
    assert "trainlosssdpo-with-type-entropy_opd" in _anchors(tmp)
    assert "replayteachers" in _anchors(tmp)


def test_the_patterns_catch_what_they_are_for() -> None:
    assert PRIVATE.search("flock /work/coord/heavy.lock python3 bench.py")
    assert PRIVATE.search("run it under `flock /tmp/bigmem.lock`")
    assert WORK_LOG.search("2 Dec 2026, fifth session")
    assert WORK_LOG.search("the demo trained without DPO until 3 Dec")
    assert not WORK_LOG.search("measured on 3 Dec 2026 on a 2-vCPU AMD EPYC")
    assert not PRIVATE.search("composer-replication run runs/demo")
