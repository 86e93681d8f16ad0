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


def _history(versions: int, cases: int):
    """Records of ``cases`` tiny-oracle cases on each of ``versions`` SGLang versions: case 0's
    throughput doubles at the last version, case 1's halves, every other case stays at 100."""
    from specwatch.core.record import Metric

    recs = []
    for v in range(versions):
        for c in range(cases):
            r = record(case(output_len=256 + c), sglang_version=f"0.6.{v}", tps=100.0)
            moved = {0: 200.0, 1: 50.0}.get(c, 100.0) if v == versions - 1 else 100.0
            r.metrics["output_throughput"] = Metric(value=moved, unit="tokens/s", samples=[moved])
            r.metrics["accept_length"] = Metric(value=4.0, unit="tokens/verify", exact=True)
            recs.append(r)
    return records_frame(recs)


def test_across_versions_stays_bounded_and_its_legends_name_the_cases_that_moved(tmp_path, monkeypatch):
    from PIL import Image

    from specwatch.present import plots

    legends = []
    save = plots.save_figure

    def keep_legends(fig, out, name):
        legends.extend([t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes if ax.get_legend())
        return save(fig, out, name)

    monkeypatch.setattr(plots, "save_figure", keep_legends)
    png = plots.across_versions(_history(versions=60, cases=40), tmp_path)[0]
    width, height = Image.open(png).size
    assert height <= 3000 and width <= 3000
    throughput, accept = legends[:2]
    # the two cases that moved lead the legend; the 38 that never moved share one line
    assert len(throughput) == 3 and "(+37 same)" in throughput[2] and "k4 bs1" in throughput[0]
    assert accept == [accept[0]] and accept[0].endswith("(+39 same)")
    assert all(len(entries) <= plots.LEGEND_LIMIT for entries in legends)


def test_across_versions_folds_lines_past_the_legend_limit_into_one_more_entry():
    from specwatch.present.plots import LEGEND_LIMIT
    from specwatch.present.version_history import ranked_trajectories

    values = pd.DataFrame([[1.0, 1.0 + i] for i in range(20)], index=[f"c{i}" for i in range(20)])
    names = pd.Series([f"case {i}" for i in range(20)], index=values.index)
    ranked = ranked_trajectories(values, names)
    assert [name for _, name, _ in ranked[:3]] == ["case 19", "case 18", "case 17"]  # largest relative change first
    assert len(ranked) == 20 > LEGEND_LIMIT


def test_a_table_too_large_for_the_index_is_linked_there_and_paged_on_its_own(tmp_path, monkeypatch):
    from specwatch.present import dashboard, table_view

    monkeypatch.setattr(table_view, "INLINE_CELLS", 40)
    monkeypatch.setattr(dashboard, "PAGE_ROWS", 7)
    monkeypatch.setattr(dashboard, "CASE_PAGE_ROWS", 2)
    recs = [record(case(output_len=256 + i), sglang_version="0.5.17") for i in range(5)]
    df = records_frame(recs)
    big = pd.DataFrame({"n": range(20), "m": range(20), "k": range(20)})  # 60 cells: past the index's 40
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "old-table-9.html").write_text("left by an earlier build")
    (tmp_path / "cases-9.html").write_text("left by an earlier build")
    index = dashboard.build(df, tmp_path, tables={"Big table": big, "Small table": big.head(3)}).read_text()
    pages = sorted(p.name for p in (tmp_path / "tables").iterdir())
    assert pages == ["big-table-2.html", "big-table-3.html", "big-table.html"]  # 20 rows, 7 a page
    assert 'href="tables/big-table.html">3 pages of its own</a>' in index
    assert 'data-v="19.0">19</td>' not in index  # its rows are not on the index
    last = (tmp_path / "tables" / "big-table-3.html").read_text()
    assert last.count("<tr>") == 1 + 6 and 'href="big-table.html">1</a>' in last and "../index.html#big-table" in last
    assert 'id="table-small-table"' in index  # a small table stays on the index
    # the case table runs on over pages of 2 rows; the earlier build's extra page is gone
    assert sorted(p.name for p in tmp_path.glob("cases*.html")) == ["cases-2.html", "cases-3.html", "cases.html"]
    assert "page 1 of 3 (5 rows in all)" in (tmp_path / "cases.html").read_text()


def test_the_verdict_lists_a_bounded_number_of_regressed_cases_and_counts_the_rest(tmp_path):
    from specwatch.analysis.verdict import ReleaseVerdict, SuiteComparison
    from specwatch.present.dashboard import VERDICT_LINES, build

    regressed = [f"case {i}: output_throughput -{i}%" for i in range(VERDICT_LINES + 7)]
    verdict = ReleaseVerdict(
        head_version="0.5.17",
        base_version="0.5.16",
        budgets=None,
        compared=[SuiteComparison(suite="smoke", base="b", head="h", counts={"regressed": 32}, regressed=regressed)],
    )
    index = build(records_frame([record(case())]), tmp_path, verdict=verdict).read_text()
    assert index.count("<li>regressed: ") == VERDICT_LINES and f"case {VERDICT_LINES - 1}:" in index
    assert f"case {VERDICT_LINES}:" not in index and "+7 more regressed: in the suite's report" in index
