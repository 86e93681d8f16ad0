"""The repository speaks of the product only: README.md, docs/ and src/ hold no development-history
wording (numbered runs, sessions, first person, issue numbers)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HISTORY = re.compile(
    "|".join(
        (
            # a numbered run or session ("sixth run", "3rd GPU session"; an A/A pair's first and second run are product)
            r"\b(?:third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|\d+(?:st|nd|rd|th))"
            r"\s+(?:(?:GPU|device)\s+)?(?:runs?|rounds?|sessions?)\b",
            r"\b[Rr]un\s+#?\d+\b",  # "run 6", "run #6"
            r"\b[Ss]essions?\b",  # a word of its own: start_new_session is not one
            r"\bI\b(?=\s+[a-z])(?!\s+of\b)",  # "I found"; the index I of "I of N", "I/N", "M = I," is not
            r"\bI'(?:m|ve|d|ll)\b",
            r"\b(?:[Ww]e|[Oo]urs?|[Mm]y|me)\b",  # words of their own: "between", "measure" hold none
            r"(?<![\"'])\bus\b(?![\"'])",  # the unit "us" is quoted
            r"\b[Ii]ssues?\s+#?\d+\b",  # "issue 12", "issue #12"
            r"\b[Ii]ssue(?:'s\b|:)",  # "the goal", "(issue: ...)"
            r"\b(?:[Tt]he|[Tt]his|[Tt]hat|an?|[\w-]+-runner)\s+issues?\b",  # "tissue" is no word "issue"
            r"(?<![\w&])(?<!PR )(?<!: )#\d{2,}\b",  # "#12"; an upstream "PR #26972" and a CSS "color: #000000" are not
        )
    )
)
"""Development-history wording: what the text must not say."""

PENDING: dict[str, str] = {}
"""Hits in files whose rewording is still to land (file -> the words found), skipped below; an entry
that no longer matches fails ``test_pending_wording_still_matches``."""


def texts() -> list[Path]:
    """README.md and every text file under docs/ and src/ (Python, Markdown, Jinja2 templates, TOML suites)."""
    found = [ROOT / "README.md", *(ROOT / "docs").rglob("*"), *(ROOT / "src").rglob("*")]
    return sorted(p for p in found if p.is_file() and p.suffix in {".py", ".md", ".j2", ".toml"})


def hits() -> list[tuple[str, int, str]]:
    """(path from the repository root, line number, words matched) of every history wording."""
    out = []
    for path in texts():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            out += [(path.relative_to(ROOT).as_posix(), n, m.group(0)) for m in HISTORY.finditer(line)]
    return out


@pytest.mark.parametrize(
    "text",
    [
        "learned in the sixth run",
        "the 3rd GPU session",
        "as in run 6",
        "this session's results",
        "I found that the pool",
        "I've checked",
        "we measured",
        "We keep",
        "our budget",
        "my reading of it",
        "it must not be us",
        "see issue 12",
        "fixed in issue #12",
        "the issue's goal",
        "(issue: sweep wall time)",
        "the GPU-runner issue allows",
        "closes #1234",
    ],
)
def test_history_wording_is_found(text):
    assert HISTORY.search(text), text


@pytest.mark.parametrize(
    "text",
    [
        "the first run and the second run of an A/A pair",
        "start_new_session=True",
        "engine groups I of N: 'I/N'",
        "M = I, the draft",
        "``eh_proj = [I, 0]``",
        "between the runs",
        'metrics.put("probe_time_per_batch", t, "us")',
        "tissue",
        "SGLang PR #26972 reverted",
        "color: #000000;",
        "--muted: #57606a;",
        "x  # noqa: E712",
        "https://github.com/sgl-project/sglang/pull/26972",
    ],
)
def test_product_wording_is_not_taken_for_history(text):
    assert not HISTORY.search(text), HISTORY.search(text)


def test_readme_docs_and_src_hold_no_history_wording():
    found = [f"{path}:{n}: {words!r}" for path, n, words in hits() if PENDING.get(path) != words]
    assert not found, "development-history wording:\n" + "\n".join(found)


def test_pending_wording_still_matches():
    """``PENDING`` shrinks as the rewording lands: an entry that no longer matches is struck from it."""
    still = {(path, words) for path, _, words in hits()}
    stale = sorted(path for path, words in PENDING.items() if (path, words) not in still)
    assert not stale, f"PENDING entries that no longer match (strike them): {stale}"


def test_readme_stays_a_product_page_of_at_most_250_lines():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for command in (
        "bash scripts/bootstrap.sh && .venv/bin/specwatch run suites/smoke.toml",
        "bash scripts/bootstrap.sh && .venv/bin/python -m pytest -q\n",
    ):
        assert command in readme
    for page in ("docs/suites.md", "docs/faults.md", "docs/dcp.md", "dashboards/findings.md"):
        assert f"]({page}" in readme and (ROOT / page).exists()
