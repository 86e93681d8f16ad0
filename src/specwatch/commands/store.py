"""Commands of the results store: ``import`` adds to it; ``results``, ``dashboard``, ``overhead``,
``roofline`` and ``asv-import`` read it."""

from __future__ import annotations

import statistics
from pathlib import Path

import typer
from rich.text import Text

from specwatch.commands.options import CsvOut, Results, ResultsArg, StoredResults
from specwatch.commands.output import console, print_frame
from specwatch.core.errors import SpecwatchInputError


def import_cmd(
    files: list[Path] = typer.Argument(
        ...,
        exists=True,
        help="JSONL record files (e.g. fetched from a "
        "GPU host), or a folder of them (run summaries, runs.ndjson, too).",
    ),
    results: Results = Path("results"),
) -> None:
    """Validate records and append them to the results store (each to its machine/version/suite file)."""
    from specwatch.store.jsonl import RUNS_FILE, import_records, import_runs

    paths = [q for p in files for q in (sorted(p.rglob("*.jsonl")) + sorted(p.rglob(RUNS_FILE)) if p.is_dir() else [p])]
    added = import_records([p for p in paths if p.name != RUNS_FILE], results)
    runs = import_runs([p for p in paths if p.name == RUNS_FILE], results)
    for dest, n in added.items():
        console.print(f"{dest}: +{n} records")
    if runs:
        console.print(f"+{runs} run summaries")
    if not added and not runs:
        console.print("nothing new")


def dashboard(
    results: StoredResults = Path("results"), out: Path = typer.Option(Path("dashboards"), help="Dashboard folder.")
) -> None:
    """Write the plots (PNG + SVG), dashboards/index.html (opening with the newest release's verdict
    against the previous one), dashboards/cases.html and dashboards/findings.md (+ .html: the measured
    findings, each with its record ids) from the stored results."""
    from specwatch.present.part_cache import PartCache
    from specwatch.store.frame import files_frame
    from specwatch.store.frame_cache import one_pass
    from specwatch.store.jsonl import result_files
    from specwatch.store.prime import start_stale

    with one_pass():  # the store is read several times below: each file hashed once
        parts = PartCache.of(results)  # the inputs as they are before the records are read
        files = result_files(results)
        built = start_stale(files)  # the stale caches built apart (their memory returned), the others read meanwhile
        _dashboard(results, out, files_frame(files, pending=built), parts)


def _dashboard(results: Path, out: Path, df, cache) -> None:
    """The dashboard of the records frame ``df`` of ``results``, written to ``out``: the case and
    report pages, the timing tables, the roofline, the release verdict, the findings and the
    figures shared with a forked child (``core.forked``) while this process writes the other
    tables and the index; every part derived from the records is kept in the store between builds
    (``cache``: a ``present.part_cache.PartCache`` made before ``df`` was read), so a build of an
    unchanged store draws no figure again."""
    from specwatch.analysis.serving import serving_rows, serving_table
    from specwatch.core.forked import Forked
    from specwatch.present.dashboard import build, check_records, clean_mask
    from specwatch.present.dflash_plots import dflash_figure
    from specwatch.present.figure_reads import FIGURE_READS
    from specwatch.present.figures import FIGURE_PARTS
    from specwatch.present.plots import metrics_across_versions
    from specwatch.present.speedup_plots import speedup_figure
    from specwatch.store.runs import runs_frame

    check_records(df, out, results)  # before the child writes anything
    keep = clean_mask(df)
    clean = df[keep]
    # the speedup figure is drawn with the timing tables (the speedup points of both found once);
    # the figures that take longest come first, so the parts either process takes last are small
    large = (dflash_figure, metrics_across_versions)
    parts = sorted((d for d in FIGURE_PARTS if d is not speedup_figure), key=lambda d: d not in large)
    figures = [  # each kept under what it reads of the clean records (figure_reads), not the store's stamps
        lambda d=d: cache.files(
            d.__name__, out / "plots", lambda folder: d(clean, folder), lambda: FIGURE_READS[d](clean)
        )
        for d in parts
    ]
    out.mkdir(parents=True, exist_ok=True)
    named = _parts(results, out, df, keep, clean, cache)
    at = {name: i for i, name in enumerate(named)}
    # the finest parts last: the ones this process takes from the back while it waits
    with Forked(*named.values(), *figures) as side:

        def tables() -> dict:
            roof = side.result(at["roofline"])
            return {
                "Roofline, batch 1 (bound = accept_length x 4.8 TB/s / bytes per verify cycle; specwatch roofline)": (
                    roof.drop(columns=["case_id"]) if not roof.empty else roof
                ),
                "Sweep cost per GPU run (wall time / the cases' own time; K: engines in flight, 'overlap': "
                "--overlap-starts)": runs_frame(results),
                "Serving under load (SGLang's serving benchmark, concurrency = batch_size; TTFT where every "
                "request's first token was timed)": cache.rows_value("serving", serving_rows(clean), serving_table),
                **side.result(at["timing"])[0],
            }

        def drawn() -> list[Path]:  # in FIGURE_PARTS' order
            files = {draw: side.result(len(named) + i) for i, draw in enumerate(parts)}
            files[speedup_figure] = side.result(at["timing"])[1]
            return [p for draw in FIGURE_PARTS for p in files[draw]]

        result = lambda name: lambda: side.result(at[name])  # noqa: E731
        index = build(df, out, tables, result("verdict"), results, drawn, clean, cache, result("pages"), result("dcp"))
    console.print(f"wrote {index}")


def _parts(results: Path, out: Path, df, keep, clean, cache) -> dict:
    """The dashboard's parts besides the figures that it shares with a forked child, by name, in
    the order the child takes them: the DCP tables first (the index waits for them before the
    others), the case and report pages, the timing tables, the roofline, the verdict and the
    findings; each kept in ``cache`` under what it reads."""
    from specwatch.analysis.dcp import dcp_rows
    from specwatch.analysis.roofline import roofline_of, roofline_reads
    from specwatch.analysis.verdict import release_verdict, verdict_reads
    from specwatch.present.dashboard import dcp_part, record_pages
    from specwatch.present.timing import timing_part

    probed = df.fault.isna() & (df.probe == True)  # noqa: E712 (the roofline's records)
    return {
        "dcp": lambda: cache.rows_value("dcp", dcp_rows(clean), lambda rows: dcp_part(rows, out / "dcp-support.md")),
        "pages": lambda: record_pages(clean, out),
        "timing": lambda: timing_part(results, df, keep, out / "plots", cache),
        "roofline": lambda: cache.kept("roofline", lambda: roofline_reads(df, probed), roofline_of),
        "verdict": lambda: cache.kept(
            "verdict", lambda: verdict_reads(results, df), lambda _: release_verdict(results, frame=df)
        ),
        "findings": lambda: _findings(out, df, cache),
    }


def _findings(out: Path, df, cache) -> None:
    """``out/findings.md`` (+ .html) of the records frame ``df`` (kept in ``cache``, a
    ``present.part_cache.PartCache``: each section under the latest records it reads, the HTML
    under the markdown)."""
    from specwatch.present.findings import findings_rows, latest_markdown
    from specwatch.present.markdown_pages import page_html, write_markdown_page

    def section(draw, rows) -> list[str]:
        return cache.read_value(f"findings-{draw.__name__}", rows, lambda: draw(rows))

    def pages() -> tuple[str, str]:
        text = latest_markdown(findings_rows(df), section)
        md = out / "findings.md"
        return text, cache.read_value("findings-html", (md.name, text), lambda: page_html(md, text, "index.html"))

    out.mkdir(parents=True, exist_ok=True)
    write_markdown_page(out / "findings.md", cache.value("findings", pages))


def overhead(results: StoredResults = Path("results")) -> None:
    """Harness overhead. Against the plain loop (``specwatch run SUITE --baseline``): per case, the
    rounds of every run pooled (each probed engine start over the plain-loop run of its round), their
    geometric mean, 95% interval and verdict against 0.98. Against bare runs (``specwatch run SUITE
    --bare``): tokens/s with specwatch's probe next to without, medians over all runs of each kind.
    Exit 1 when a case's pooled interval lies below 0.98, or a case is more than 2% slower than its
    bare run and the gap exceeds the spread between runs of one kind (or that spread is
    unmeasured: one run each)."""
    from specwatch.analysis.overhead import OVER_BUDGET, baseline_overhead_table, overhead_table
    from specwatch.store.baseline import OVERHEAD_TARGET, OverheadVerdict
    from specwatch.store.frame import files_frame
    from specwatch.store.jsonl import result_files

    df = files_frame(result_files(results))
    pooled, t = baseline_overhead_table(df), overhead_table(df)
    if pooled.empty and t.empty:
        console.print(
            "no case has plain-loop rounds (specwatch run SUITE --baseline) or both a probed and a bare run "
            "(specwatch run SUITE --bare)"
        )
        return
    past = False
    if not pooled.empty:
        print_frame("harness overhead against the plain loop (run --baseline), rounds pooled over runs", pooled)
        verdicts = pooled[f"verdict vs {OVERHEAD_TARGET}"]
        past = bool((verdicts == OverheadVerdict.past.value).any())
        console.print(
            f"{len(pooled)} cases: "
            + ", ".join(f"{int((verdicts == v.value).sum())} {v.value}" for v in OverheadVerdict)
        )
    if not t.empty:
        print_frame("harness overhead against bare runs (run --bare, output tokens/s)", t)
        ratios = t["specwatch / bare"]
        # one probe cost would slow every case alike; engine-to-engine noise moves cases both ways
        console.print(
            f"all {len(t)} cases: specwatch / bare geometric mean {statistics.geometric_mean(ratios):.4f}, "
            f"probed faster in {int((ratios > 1).sum())} of {len(t)}"
        )
        past = past or bool((t.verdict == OVER_BUDGET).any())
    raise typer.Exit(1 if past else 0)


def asv_import_cmd(
    results: StoredResults = Path("results"),
    work: Path = typer.Option(Path(".asv/offline"), help="asv work folder (results, version ledger)."),
    html: Path = typer.Option(Path("dashboards/asv"), help="Where asv publish writes."),
    publish: bool = typer.Option(True, help="Run asv publish afterwards."),
) -> None:
    """Turn stored tree-page records into asv results (one asv commit per SGLang version) and publish."""
    from specwatch.present.asv_bridge import asv_import

    try:
        done = asv_import(results, work, html, publish, log=console.print, console=console)
    except (ValueError, RuntimeError) as e:
        raise SpecwatchInputError(work, str(e)) from None
    if publish and done:
        console.print(f"asv publish wrote {html}/index.html")


def results_cmd(
    root: ResultsArg = Path("results"),
    csv: CsvOut = None,
    strict: bool = typer.Option(
        False,
        "--strict",
        help="Refuse the store at its first invalid line (file:line, exit 2) instead of skipping and counting it.",
    ),
) -> None:
    """Load every record under ROOT into one table (one row per case run) and print its health:
    statuses per machine / SGLang version / suite, and every failed check by name. Invalid lines are
    skipped with a warning each and counted (``--strict`` refuses them)."""
    from specwatch.analysis.health import (
        failed_checks,
        start_phase_medians,
        status_counts,
        throughput_spread,
    )
    from specwatch.store.frame import files_frame
    from specwatch.store.jsonl import Quarantine, result_files
    from specwatch.store.runs import runs_frame

    quarantine = Quarantine()
    df = files_frame(result_files(root), strict=strict, quarantine=quarantine)
    if quarantine:
        console.print(
            f"{len(quarantine)} invalid line(s) skipped under {root} (specwatch results --strict refuses them)"
        )
    if csv:
        df.to_csv(csv, index=False)
    if df.empty:
        console.print(f"no records under {root}")
        return
    for title, table in (
        ("records", status_counts(df)),
        ("sweep cost per run (wall / case time; goal < 2)", runs_frame(root)),
        ("decode tokens/s spread within a case's repeats ((max - min) / median; clean runs)", throughput_spread(df)),
        (
            "engine start breakdown (median s; scheduler phases from SGLang's own startup timing)",
            start_phase_medians(df),
        ),
    ):
        if not table.empty:
            print_frame(title, table)
    failing = failed_checks(df)
    if failing.empty:
        console.print(f"[green]every check passed on all {int((df.status == 'ok').sum())} ok records[/green]")
    for row in failing.itertuples(index=False):
        console.print(Text.assemble((row.case_id, "red"), f" {row.where}: failed {', '.join(row.failed)}{row.note}"))


def roofline_cmd(
    root: ResultsArg = Path("results"),
    model: str = typer.Option("8b", help="Only this model size ('all' for every size)."),
) -> None:
    """Batch-1 EAGLE records against the HBM-bandwidth bound tau x 4.8 TB/s / bytes per verify cycle."""
    from specwatch.analysis.roofline import roofline_frame
    from specwatch.store.jsonl import load_records, result_files

    df = roofline_frame([r for r in load_records(result_files(root)) if model in ("all", r.case.model_label)])
    if df.empty:
        console.print("no batch-1 EAGLE records")
        return
    print_frame(
        "roofline (bytes per verify cycle; bound = accept_length x 4.8 TB/s / bytes)", df.drop(columns=["case_id"])
    )
