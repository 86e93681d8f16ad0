"""The dashboard's Jinja2 environment (``present/templates``, autoescaping on) and its markdown
pages: a markdown file (a comparison report, the DCP tables, the findings) rendered to HTML beside it."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote

from jinja2 import Environment, PackageLoader
from markdown_it import MarkdownIt
from markupsafe import Markup

ENV = Environment(
    loader=PackageLoader("specwatch.present", "templates"),
    autoescape=True,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)
ENV.filters["href"] = lambda s: quote(str(s))


SUMMARY_LINE = re.compile(r"^<details><summary>(.*)</summary>$")
"""The one raw-HTML construct ``analysis.compare_report.markdown`` writes (``</details>`` closes it)."""


def markdown_html(text: str) -> Markup:
    """Markdown (GFM tables) to HTML with raw HTML escaped, except the ``<details><summary>``
    folds the comparison reports write, which stay folds (their summary text escaped)."""
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    out, chunk = [], []

    def flush():
        out.append(md.render("\n".join(chunk)))
        chunk.clear()

    for line in text.splitlines():
        if m := SUMMARY_LINE.match(line):
            flush()
            out.append(f"<details><summary>{md.renderInline(m.group(1))}</summary>")
        elif line == "</details>":
            flush()
            out.append("</details>")
        else:
            chunk.append(line)
    flush()
    return Markup("\n".join(out))


def render_markdown_page(md_path: Path, back: str) -> Path:
    """``md_path`` rendered to ``<same name>.html`` beside it; ``back``: the link to the dashboard."""
    html_path = md_path.with_suffix(".html")
    html_path.write_text(page_html(md_path, md_path.read_text(), back))
    return html_path


def page_html(md_path: Path, text: str, back: str) -> str:
    """The HTML page of the markdown ``text`` of ``md_path`` (``render_markdown_page``'s, which
    reads only the file's name)."""
    return ENV.get_template("report.html.j2").render(
        title=md_path.stem, body=markdown_html(text), back=back, source=md_path.name
    )


def write_markdown_page(md_path: Path, pair: tuple[str, str]) -> None:
    """``md_path`` and its HTML page beside it from (markdown, ``page_html``)."""
    md_path.write_text(pair[0])
    md_path.with_suffix(".html").write_text(pair[1])


def render_reports(out: Path) -> list[Path]:
    """Every ``out/reports/*.md`` rendered to HTML; returns the markdown files, by name."""
    reports = sorted((out / "reports").glob("*.md")) if (out / "reports").exists() else []
    for r in reports:
        render_markdown_page(r, "../index.html")
    return reports
