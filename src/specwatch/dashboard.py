"""Static dashboard: ``dashboards/index.html`` linking the plots, the support matrix of recorded
statuses, and the latest comparison reports (``dashboards/reports/*.md``)."""

from __future__ import annotations

import html
import re
import statistics
from pathlib import Path
from typing import Optional

import pandas as pd

from specwatch.case import CASE_FIELDS, Case
from specwatch.engine_worker import starts_behind_digest
from specwatch.plots import make_all
from specwatch.runner import WORKER_DIED_RE
from specwatch.store import latest_rows, relative_spread
from specwatch.validity import skip_reason

PLOT_TITLES = {
    "memory_vs_topk": "req_to_token and KV reserve vs topk (analytic model lines, measured points)",
    "throughput_vs_topk": "Decode throughput vs topk per backend",
    "acceptance_vs_topk": "Acceptance length vs topk per oracle profile",
    "across_versions": "Metrics across SGLang versions",
}


RELABELS = {
    "check.no_kv_leak": ("leak_is_unflushed_cache", "radix cache left by a refused flush, not a leak"),
    "check.req_to_token_matches_model": ("row_matches_model_now", "match today's model: the model's rule, not SGLang's row"),
}
"""Failed checks a later finding explains: check -> (records-frame column that is True for such a
record, what it was). The recorded verdicts stay (``store.leak_is_unflushed_cache``,
``store.row_matches_model_now``)."""


def _relabel_note(ok: pd.DataFrame, check: str) -> str:
    """Says how many of a check's failures a later finding explains (``RELABELS``)."""
    column, what = RELABELS.get(check, (None, None))
    if column is None or column not in ok:
        return ""
    n = int((ok[check].eq(False) & ok[column].eq(True)).sum())
    return f" (of which {n}: {what})" if n else ""


def fault_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (fault, case) of fault-injection runs, with the clean run of the same case and
    SGLang version beside it: what flagged the fault (status, failed checks) and whether clean stayed clean."""
    if "fault" not in df or df.fault.isna().all():
        return pd.DataFrame()
    checks = [c for c in df.columns if c.startswith("check.")]

    def verdict(row) -> str:
        bad = [c[len("check."):] for c in checks if row.get(c) == False]  # noqa: E712 (numpy bools, NaN)
        if row.status != "ok":
            return f"{row.status}: {str(row.reason)[:140]}"
        return "failed: " + ", ".join(bad) if bad else "all checks pass"

    faulty = df[df.fault.notna()]
    clean = df[df.fault.isna() & df.case_id.isin(faulty.case_id)]
    rows = []
    for _, r in faulty.sort_values(["fault", "page_size", "batch_size"]).iterrows():
        c = clean[(clean.case_id == r.case_id) & (clean.sglang_version == r.sglang_version)]
        runs = r.get("fault_code_runs")
        rows.append({"fault": r.fault, "sglang": r.sglang_version, "case": f"{r.attention_backend} p{r.page_size} "
                     f"k{r.topk} bs{r.batch_size} {r.input_len}->{r.output_len}", "fault run": verdict(r),
                     # an edit that never ran cannot be caught (records before the count say "not counted")
                     "faulted code ran": "not counted" if runs is None or pd.isna(runs) else f"{int(runs)} times in its engine",
                     "clean run": verdict(c.iloc[-1]) if len(c) else "no clean run"})
    return pd.DataFrame(rows)


DCP_SUITES = ("dcp", "dcp-large")
"""Suites whose records make a DCP support matrix: ``dcp`` (tp 2) and ``dcp-large`` (tp 4 and 8)."""


def dcp_matrix(df: pd.DataFrame, suite: str = "dcp") -> pd.DataFrame:
    """DCP support matrix: one row per engine configuration of a DCP suite (``DCP_SUITES``; latest
    record per case and SGLang version) with its status or SGLang's reason, acceptance against the oracle,
    lossless mismatches, whether each KV pool covers every slot the allocator hands out (seed 004),
    and, for dcp > 1, whether the greedy outputs equal those of the same case at dcp 1 (the two
    share prompts by construction)."""
    if df.empty or "dcp" not in df or "suite" not in df:
        return pd.DataFrame()
    d = df[df.suite == suite]
    if d.empty:
        return pd.DataFrame()
    d = latest_rows(d, ["sglang_version", "case_id"])
    recs = d.sort_values(["model", "algorithm", "attention_backend", "page_size", "topk", "workload", "dcp"]) \
        .to_dict("records")                    # dicts: check.* columns are not attribute names
    by_id = {(r["sglang_version"], r["case_id"]): r for r in recs}

    rows = []
    for r in recs:
        case = case_of(r)
        outcome = r["status"] if r["status"] == "ok" else f"{r['status']}: {str(r['reason'])[:160]}"
        rule = skip_reason(case) if r["status"] == "crashed" else None
        if rule and rule.split(": ", 1)[-1] in str(r["reason"]):
            # SGLang refused it at start with the words of a rule specwatch learnt since: a skip
            outcome = f"skipped: {rule} (SGLang refused it at start; recorded crashed before the rule)"
        if cell(r, "host_interference"):
            outcome = f"not measured (host interference): {r['host_interference']}"
        equiv = ""
        if r["dcp"] > 1 and r["status"] == "ok":
            twin = by_id.get((r["sglang_version"], case.dcp_twin_id()))
            equiv = ("no dcp 1 run" if twin is None else f"dcp 1 {twin['status']}") \
                if twin is None or twin["status"] != "ok" else twin_outputs(r, twin)
        covers = [cell(r, c) for c in ("check.target_pool_covers_allocator", "check.draft_pool_covers_allocator")]
        cover_text = ", ".join("yes" if c else "NO" for c in covers if c is not None)
        if cover_text and r["dcp"] > 1 and cell(r, "probe_read_attention_backend") is False:
            # an older probe: the target pool was taken as sharded per rank whatever the backend does
            cover_text += " (target judged as sharded: probe predates the backend check)"
        al = cell(r, "accept_length")
        mismatch = cell(r, "draft_pool_page_mismatch")
        rows.append({
            "sglang": r["sglang_version"], "model": r["model"], "algo": r["algorithm"],
            "backend": r["attention_backend"], "page": r["page_size"], "topk": r["topk"], "tp": r["tp"], "dcp": r["dcp"],
            "workload": r["workload"], "lengths": f"{r['input_len']}→{r['output_len']}", "outcome": outcome,
            "accept length": "" if al is None else f"{al:.3f}" + {True: " (= oracle)", False: " (≠ oracle)"}.get(
                cell(r, "check.accept_length_matches_oracle"), ""),
            "lossless mismatches": cell(r, "lossless_mismatches"),
            "peak token usage": cell(r, "peak_token_usage"),
            "pools cover allocator": cover_text,
            "allocator page": cell(r, "allocator_page_size"),
            "target pool": pool_text(r, "target"), "draft pool": pool_text(r, "draft"),
            # seed 004's flag: the draft pool paged other than the allocator (in the pool's slot space)
            "draft_pool_page_mismatch": "" if mismatch is None else ("YES" if mismatch else "no"),
            "draft pool missing rows": cell(r, "draft_pool_missing_rows"),
            "same outputs as dcp 1": equiv,
        })
    return pd.DataFrame(rows)


def case_of(r: dict) -> Case:
    """The case of a records-frame row (a dict)."""
    return Case(**{f: r[f] for f in CASE_FIELDS})


def cell(r: dict, name: str):
    """A record row's value, None where the frame has none (NaN)."""
    v = r.get(name)
    return None if v is None or (isinstance(v, float) and pd.isna(v)) else v


def pool_text(r: dict, role: str) -> str:
    """A KV pool's page and where its valid slots end, of where the allocator's last page ends in the
    pool's slot space (seed 004: "valid to X of Y" with X < Y is a pool the allocator overruns)."""
    page, valid, needed = (cell(r, f"{role}_pool_{k}") for k in ("page_size", "valid_end", "needed_end"))
    return "" if page is None else f"page {int(page)}, valid to {int(valid)} of {int(needed)}"


def _prompt_starts(r: dict) -> Optional[list]:
    """A record's timed chain starts: recorded, or (older records) reproduced from its output digest."""
    starts = r.get("prompt_starts")
    if isinstance(starts, list):
        return starts
    reps, digest = cell(r, "timed_repeats"), cell(r, "output_digest")
    if cell(r, "lossless_mismatches") != 0 or not digest or reps is None:
        return None
    case = case_of(r)
    return starts_behind_digest(case, cell(r, "calibrated_input_len") or case.input_len, int(reps), digest)


def twin_outputs(r: dict, twin: dict) -> str:
    """Whether a dcp > 1 record's greedy outputs equal its dcp-1 twin's. The two share prompts by
    construction, unless near-full calibration lengthened each to its own pool or the two ran under
    different prompt draws of specwatch; then each is judged by the oracle (lossless) instead."""
    lossless = cell(r, "lossless_mismatches") == 0 and cell(twin, "lossless_mismatches") == 0
    if cell(r, "calibrated_input_len") != cell(twin, "calibrated_input_len"):
        # each engine lengthened its near-full prompts to its own pool: the outputs cannot match,
        # but each is checked token by token against the oracle chain of its own prompts
        return "prompts calibrated apart; both lossless" if lossless else "DIFFERENT"
    if cell(r, "output_digest") and r["output_digest"] == twin.get("output_digest"):
        return "identical"
    if lossless:
        mine, theirs = _prompt_starts(r), _prompt_starts(twin)
        if mine is not None and theirs is not None and mine != theirs:
            return "prompts drawn apart (specwatch's draw changed between the runs); both lossless"
    return "DIFFERENT"


ASSERTION_LINES_RE = re.compile(r"(failed) \(\d+ l.*$")   # "... failed (288 lines of it in the log); surfaced as ..."


def crash_cause(outcome: str) -> str:
    """An outcome as a summary names its cause: without the worker's exit prefix, the count of
    assertion lines in that run's log and what the assertion surfaced as (they vary run to run)."""
    return ASSERTION_LINES_RE.sub(r"\1", WORKER_DIED_RE.sub("", outcome))[:140]


def dcp_summary(matrix: pd.DataFrame) -> pd.DataFrame:
    """The DCP support matrix folded over page size and topk: one row per SGLang version, tp, model,
    algorithm and backend; per (dcp, workload, prompt→output lengths) how many cases ran ok out of those that were not
    skipped by SGLang's own rules, with the distinct failure causes, and how many dcp > 1 cases
    gave greedy outputs identical to their dcp-1 twins."""
    if matrix.empty:
        return pd.DataFrame()
    rows = []
    lead = ["sglang", "tp", "model", "algo", "backend"]
    for key, g in matrix.groupby(lead, sort=True):
        row = dict(zip(lead, key))
        for (dcp, workload, lengths), h in g.groupby(["dcp", "workload", "lengths"], sort=True):
            col = f"dcp {dcp} {workload} {lengths}"
            unmeasured = int(h.outcome.str.startswith("not measured").sum())
            ran = h[~h.outcome.str.startswith("skipped") & ~h.outcome.str.startswith("not measured")]
            if ran.empty:
                row[col] = f"{unmeasured} not measured (host interference)" if unmeasured else "all skipped by rule"
                continue
            ok = int((ran.outcome == "ok").sum())
            causes = sorted({crash_cause(o) for o in ran.outcome if o != "ok"})
            skipped = int(h.outcome.str.startswith("skipped").sum())
            row[col] = f"{ok}/{len(ran)} ok" + "".join(f"; {c}" for c in causes) + (
                f"; {unmeasured} more not measured (host interference)" if unmeasured else "") + (
                f"; {skipped} more skipped by rule" if skipped else "")
        same = g.loc[g.dcp > 1, "same outputs as dcp 1"]
        compared = same[same.isin(["identical", "DIFFERENT"])]
        apart = int(same.str.startswith("prompts drawn apart").sum())
        parts = [f"{int((compared == 'identical').sum())}/{len(compared)} identical"] if not compared.empty else []
        parts += [f"{apart} on prompts drawn apart (both lossless)"] if apart else []
        row["outputs = dcp 1"] = "; ".join(parts) or ("no ok dcp-1 twin" if (same != "").any() else "")
        rows.append(row)
    out = pd.DataFrame(rows)
    return out[lead + sorted(c for c in out.columns if c not in lead and c != "outputs = dcp 1")
               + ["outputs = dcp 1"]].fillna("not run")


def dcp_markdown(tables: dict[str, tuple[pd.DataFrame, pd.DataFrame]]) -> str:
    """The DCP support summaries and matrices (suite -> (summary, matrix)) as markdown
    (``dashboards/dcp-support.md``, readable where the HTML dashboard is not served): generated from
    the store, so no count in it is typed by hand."""
    def md(t: pd.DataFrame) -> str:
        return t.astype(str).replace({r"\|": r"\\|", "\n": " ", "^nan$": "", "^None$": ""}, regex=True) \
            .to_markdown(index=False)
    names = ", ".join(f"`suites/{suite}.toml`" for suite in tables)
    versions = ", ".join(sorted({v for _, m in tables.values() for v in m.sglang.unique()}))
    parts = [f"# DCP support ({names})\n\nWritten by `specwatch dashboard` from `results/` "
             f"(SGLang {versions}); each case's latest record.\n"]
    for suite, (summary, matrix) in tables.items():
        parts.append(f"\n## Summary, folded over page size and topk (`suites/{suite}.toml`)\n\n{md(summary)}\n"
                     f"\n## Matrix (`suites/{suite}.toml`)\n\n{md(matrix)}\n")
    return "".join(parts)


OWN_TABLES = DCP_SUITES + ("faults",)
"""Suites the dashboard shows in tables of their own (DCP support, fault injection)."""


def health_matrix(df: pd.DataFrame, suites_dir: Optional[Path] = Path("suites")) -> pd.DataFrame:
    """Every other suite's coverage and health at a glance: one row per machine, SGLang version,
    suite, model, algorithm, backend and page size, one column per topk; a cell says how many of
    the cases the suite plans there have an ok latest record, then what went wrong in the rest (a
    non-ok status, or a failed check such as ``lossless`` or ``accept_length_matches_oracle``, with
    counts). Cells the suite plans but nothing recorded say "not run" (rows without any record are
    left out); batch sizes and profiles fold. Only cases the suite file plans today count (a case
    its validity rules now skip, or a matrix since edited, is not a gap)."""
    if df.empty:
        return pd.DataFrame()
    from specwatch.suite import load_suite

    clean = df[~df.suite.isin(OWN_TABLES)]
    latest = latest_rows(clean, ["machine", "sglang_version", "suite", "case_id"])
    key = ["model", "algorithm", "attention_backend", "page_size"]
    checks = [c for c in latest.columns if c.startswith("check.")]
    rows = []
    for (machine, version, suite), g in latest.groupby(["machine", "sglang_version", "suite"], sort=True):
        path = suites_dir / f"{suite}.toml" if suites_dir else None
        planned = pd.DataFrame([{**p.case.params(), "case_id": p.case.case_id} for p in load_suite(path).plan()
                                if not p.skip and not p.duplicate]) \
            if path and path.exists() else g[key + ["topk", "case_id"]]
        for k, plan in planned.groupby(key, sort=True):
            row = dict(zip(("machine", "sglang", "suite", "model", "algo", "backend", "page"), (machine, version, suite, *k)))
            rec = g[(g[key] == pd.Series(dict(zip(key, k)))).all(axis=1)]
            for topk, want in plan.groupby("topk"):
                got = rec[rec.case_id.isin(want.case_id)]     # records of cases the suite no longer plans: out
                if got.empty:
                    row[f"topk {topk}"] = "not run"
                    continue
                ok = got[got.status == "ok"]
                issues = [f"{n} {st}" for st, n in got[got.status != "ok"].status.value_counts().items()]
                if (missing := len(want) - len(got)) > 0:
                    issues.append(f"{missing} not run")
                issues += [f"{c[len('check.'):]} ✗ {n}" + _relabel_note(ok, c)
                           for c in checks if (n := int((ok[c] == False).sum()))]  # noqa: E712
                row[f"topk {topk}"] = f"{len(ok)}/{len(want)} ok" + "".join(f"; {i}" for i in issues)
            if not rec.empty:         # a row with no record at all (e.g. a reduced run of an old version): left out
                rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    topks = sorted((c for c in out.columns if c.startswith("topk ")), key=lambda c: int(c.split()[1]))
    return out[[c for c in out.columns if not c.startswith("topk ")] + topks].fillna("–")


OVERHEAD_BUDGET = 0.02
"""Harness overhead the GPU-runner issue allows: specwatch's tokens/s within 2% of a bare run's."""
OVER_BUDGET = f"slower by more than {OVERHEAD_BUDGET:.0%}"
"""``overhead_table``'s verdict for a case past the budget and past the run-to-run noise."""
WITHIN_NOISE = "inconclusive: the gap is within run-to-run noise"
"""``overhead_table``'s verdict when the gap exceeds the budget but not the spread between runs of one kind."""
PROBE_CLOCK = f"within {OVERHEAD_BUDGET:.0%} by the probe's own clock; the gap is run-to-run noise"
"""``overhead_table``'s verdict for such a gap when the probe's timed cost per batch (``probe_time_per_batch``,
measured inside the scheduler) is under a tenth of the budget of a step."""


def overhead_table(df: pd.DataFrame, metric: str = "output_throughput") -> pd.DataFrame:
    """Harness overhead: each case measured with specwatch's probe in SGLang's processes and bare
    (``specwatch run --bare``: SGLang as installed, same engine arguments, same prompts), side by
    side per SGLang version and machine. Every ok run of each kind counts: the ratio is of the
    medians over runs, and the spread between runs of one kind (engine restarts move tokens/s by
    more than the repeats inside one run do) decides whether a gap past the 2% budget is the probe
    (``OVER_BUDGET``: past the budget and past that spread, or the spread unmeasured) or noise
    (``WITHIN_NOISE``). Interleave bare and probed runs (ABAB) to measure it."""
    if df.empty or "probe" not in df or not (df.probe == False).any():  # noqa: E712
        return pd.DataFrame()
    ok = df[(df.status == "ok") & df.fault.isna() & df[metric].notna()]
    rows = []
    for (machine, version, case_id), g in ok.groupby(["machine", "sglang_version", "case_id"], sort=False):
        own = g[g.probe == True]                        # noqa: E712 (the probed runs)
        bare = g[g.probe == False][metric].tolist()     # noqa: E712
        probed = own[metric].tolist()
        if not bare or not probed:
            continue
        b = g.iloc[-1]
        bare_med, probed_med = statistics.median(bare), statistics.median(probed)
        ratio = probed_med / bare_med
        spreads = [s for s in (relative_spread(bare), relative_spread(probed)) if s is not None]   # None: one run
        noise = max(spreads) if spreads else None
        gap = abs(ratio - 1)
        # the probe's own clock: its per-batch cost over the step time (ms), in its probed runs
        share = None
        if "probe_time_per_batch" in own and own.probe_time_per_batch.notna().any():
            share = own.probe_time_per_batch.median() / 1000 / own.step_time.median()
        if gap <= OVERHEAD_BUDGET:
            verdict = f"within {OVERHEAD_BUDGET:.0%}"
        elif noise is not None and gap <= noise:
            verdict = PROBE_CLOCK if share is not None and share < OVERHEAD_BUDGET / 10 else WITHIN_NOISE
        else:
            verdict = OVER_BUDGET if ratio < 1 else f"faster by more than {OVERHEAD_BUDGET:.0%}"
        rows.append({"machine": machine, "sglang": version, "suite": b.suite,
                     "case": f"{b.model} {b.algorithm} {b.attention_backend} p{b.page_size} k{b.topk} bs{b.batch_size}",
                     "runs bare / probed": f"{len(bare)} / {len(probed)}",
                     f"bare {metric}": round(bare_med, 1), f"specwatch {metric}": round(probed_med, 1),
                     "specwatch / bare": round(ratio, 4),
                     "run-to-run spread": "unmeasured" if noise is None else f"{noise:.1%}",
                     "probe per step": "not recorded" if share is None else f"{share:.3%}",
                     "verdict": verdict})
    return pd.DataFrame(rows)


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
