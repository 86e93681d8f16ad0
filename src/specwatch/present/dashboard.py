"""Static dashboard: ``dashboards/index.html`` linking the plots, the support matrix of recorded
statuses, and the latest comparison reports (``dashboards/reports/*.md``)."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Optional

import pandas as pd

from specwatch.analysis.dcp import DCP_SUITES, dcp_markdown, dcp_matrix, dcp_summary
from specwatch.analysis.health import fault_table, health_matrix
from specwatch.analysis.overhead import overhead_table
from specwatch.present.plots import make_all

PLOT_TITLES = {
    "memory_vs_topk": "req_to_token and KV reserve vs topk (analytic model lines, measured points)",
    "throughput_vs_topk": "Decode throughput vs topk per backend",
    "acceptance_vs_topk": "Acceptance length vs topk per oracle profile",
    "across_versions": "Metrics across SGLang versions",
}


def build(df: pd.DataFrame, out: Path, tables: Optional[dict[str, pd.DataFrame]] = None) -> Path:
    """``tables``: further titled tables (roofline, sweep cost) shown after the fault table."""
    faults, overhead = fault_table(df), overhead_table(df)
    if "fault" in df:
        df = df[df.fault.isna()]          # the rest shows clean runs only
    if "probe" in df:
        df = df[df.probe != False]        # noqa: E712 (bare runs: only in the overhead table)
    dcp = {suite: (dcp_summary(m), m) for suite in DCP_SUITES if not (m := dcp_matrix(df, suite)).empty}
    tables = {"Coverage and health per suite (latest record of each case; rows with no record left out; "
              "DCP and faults have tables of their own)":
              health_matrix(df),
              **{title: t for suite, (summary, matrix) in dcp.items() for title, t in (
                  (f"DCP support summary (suites/{suite}.toml, folded over page size and topk)", summary),
                  (f"DCP support matrix (suites/{suite}.toml)", matrix))},
              "Harness overhead (specwatch run --bare)": overhead, **(tables or {})}
    if dcp:
        out.mkdir(parents=True, exist_ok=True)
        (out / "dcp-support.md").write_text(dcp_markdown(dcp))
    plots = make_all(df, out / "plots")
    names = [p.stem for p in plots if p.suffix == ".png"]
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>specwatch dashboard</title>",
             "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}img{max-width:100%}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}</style>",
             "</head><body><h1>specwatch: SGLang speculative decoding</h1>"]
    if not df.empty:
        counts = df.groupby(["machine", "sglang_version", "suite", "status"]).size().unstack(fill_value=0)
        parts += ["<h2>Recorded cases</h2>", counts.to_html(classes="summary")]
        cols = [c for c in ("sglang_version", "suite", "model", "attention_backend", "page_size", "topk", "batch_size", "profile", "status",
                            "decode_throughput", "accept_length", "leaked_tokens", "lossless_mismatches",
                            "req_to_token_bytes") if c in df]
        parts += ["<h2>Cases</h2>", df.sort_values(["suite", "attention_backend", "page_size", "topk"])[cols]
                  .to_html(index=False, float_format=lambda v: f"{v:.4g}", classes="cases")]
    if not faults.empty:
        parts += ["<h2>Fault injection (specwatch inject)</h2>", faults.to_html(index=False, classes="faults")]
    for title, t in (tables or {}).items():
        if t is not None and not t.empty:
            parts += [f"<h2>{html.escape(title)}</h2>", t.to_html(index=False, classes="extra")]
    parts.append("<h2>Plots</h2>")
    for n in names:
        parts.append(f"<h3>{html.escape(PLOT_TITLES.get(n, n))}</h3><img src='plots/{n}.png' alt='{n}'>")
    if (out / "asv" / "index.html").exists():
        parts.append("<h2>asv</h2><p><a href='asv/index.html'>asv dashboard</a> (trend across SGLang versions; "
                     "written by <code>specwatch asv-import</code>)</p>")
    reports = sorted((out / "reports").glob("*.md")) if (out / "reports").exists() else []
    if (out / "dcp-support.md").exists() and dcp:
        parts.append("<p>The DCP tables as markdown: <a href='dcp-support.md'>dcp-support.md</a></p>")
    parts.append("<h2>Comparison reports</h2>")
    parts.append("<ul>" + "".join(f"<li><a href='reports/{r.name}'>{html.escape(r.stem)}</a></li>" for r in reports)
                 + "</ul>" if reports else "<p>none yet</p>")
    parts.append("</body></html>")
    index = out / "index.html"
    index.write_text("\n".join(parts))
    return index
