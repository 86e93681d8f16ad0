"""The dashboard's large-store paths give what the plain ones gave: table rows drawn in Python, the
last clean run found once per fault table, the DCP markdown cut past its row limit, and the
Mann-Whitney test kept per sample pair."""

import pandas as pd
from jinja2 import Environment

from records import case, record
from specwatch.store.frame import records_frame

CELL_LOOP = (
    "{% set status = t.columns.index('status') if 'status' in t.columns else -1 %}"
    '{% for row in t.rows %}<tr>{% for text, key in row %}<td{% if t.numeric[loop.index0] %} class="num"'
    '{% elif loop.index0 == status %} class="st st-{{ text }}"{% endif %}'
    '{% if key %} data-v="{{ key }}"{% endif %}>{{ text }}</td>{% endfor %}</tr>\n{% endfor %}'
)
"""The template's per-cell loop the Python rows replace (same markup, autoescaped)."""


def test_table_rows_drawn_in_python_match_the_template_cell_loop():
    from specwatch.present.dashboard import table_view

    df = pd.DataFrame(
        {
            "suite": ["smoke", "a<b>&\"c'"],
            "status": ["ok", "crashed"],
            "decode_throughput": [1234.5678, None],
            "note": ["x & y", "<script>"],
        }
    )
    t = table_view("Cases", df, "cases")
    expected = Environment(autoescape=True).from_string(CELL_LOOP).render(t=t)
    assert "".join(f"{r}\n" for r in t.html_rows()) == expected
    assert "&lt;script&gt;" in expected and 'class="st st-crashed"' in expected


def test_fault_table_names_the_latest_clean_run_of_the_same_version():
    from specwatch.analysis.health import fault_table
    from specwatch.core.record import Status

    c = case(page_size=64, topk=8, num_draft_tokens=16)
    older, newer = record(c), record(c, status=Status.crashed, reason="boom")
    other_version = record(c, sglang_version="0.5.16")
    newer.provenance.started_at = older.provenance.started_at + pd.Timedelta(seconds=5)
    faulty = record(c, fault="accept-off-by-one")
    unmatched = record(case(page_size=256, topk=8, num_draft_tokens=16), fault="row-widen-revert")
    rows = {
        r["fault"]: r
        for r in fault_table(records_frame([older, newer, other_version, faulty, unmatched])).to_dict("records")
    }
    assert rows["accept-off-by-one"]["clean run"] == "crashed: boom"
    assert rows["row-widen-revert"]["clean run"] == "no clean run"


def test_dcp_markdown_cuts_a_long_table_and_counts_the_rest(monkeypatch):
    from specwatch.analysis import dcp

    matrix = pd.DataFrame({"sglang": ["0.5.17"] * 5, "page": range(5)})
    monkeypatch.setattr(dcp, "MARKDOWN_ROWS", 3)
    text = dcp.dcp_markdown({"dcp": (matrix.head(2), matrix)})
    matrix_part = text.split("## Matrix")[1]
    assert matrix_part.count("| 0.5.17") == 3
    assert "2 more rows: see the table on the dashboard's index page" in matrix_part
    assert "more rows" not in text.split("## Matrix")[0]  # the 2-row summary is whole


def test_mann_whitney_p_is_scipys_two_sided_p():
    from scipy.stats import mannwhitneyu

    from specwatch.analysis.compare import mann_whitney_p

    a, b = (1.0, 2.0, 3.0, 4.0), (3.5, 5.0, 6.0, 7.0)
    assert mann_whitney_p(a, b) == float(mannwhitneyu(a, b, alternative="two-sided").pvalue)
    assert mann_whitney_p(a, b) < mann_whitney_p(a, (1.5, 2.5, 3.5, 4.5))
