"""The ``specwatch`` command line."""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from specwatch.core.errors import SpecwatchInputError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Benchmark and regression tracking for SGLang speculative decoding.")
model_app = typer.Typer(no_args_is_help=True, help="CPU tier: memory model and allocator simulation.")
app.add_typer(model_app, name="model")
console = Console(width=None if sys.stdout.isatty() else 260)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def _fail(e: Exception) -> None:
    err_console.print(f"[red]error:[/red] {e}", highlight=False)
    raise typer.Exit(2)


def _load(path: Path):
    from specwatch.suite import load_suite

    try:
        return load_suite(path)
    except SpecwatchInputError as e:
        _fail(e)


@app.command()
def plan(suite: Path = typer.Argument(..., help="Suite file (suites/*.toml)."),
         as_json: bool = typer.Option(False, "--json", help="Print JSON lines instead of a table."),
         where: list[str] = typer.Option([], help="Only cases with FIELD=V1[,V2] (repeatable), as in run."),
         known: Optional[Path] = typer.Option(None, help="Leave out cases recorded under this results root for "
                                              "--machine and --sglang-version (as run --known does) and estimate "
                                              "the device time of the rest from that machine's runs.ndjson."),
         machine: Optional[str] = typer.Option(None, help="With --known: the machine label, e.g. nvidia-h200-x1."),
         sglang_version: Optional[str] = typer.Option(None, help="With --known: the SGLang version, e.g. 0.5.17."),
         ) -> None:
    """List the cases a suite expands to, with skipped ones and why; with --where / --known, only
    what a run would still do, its engine groups and, from the machine's past runs, its device time."""
    from specwatch.suite import matches, parse_where

    s = _load(suite)
    try:
        flt = parse_where(where)
    except SpecwatchInputError as e:
        _fail(e)
    if known is not None and not (machine and sglang_version):
        _fail(SpecwatchInputError(None, "--known needs --machine and --sglang-version (where the run will happen)",
                                  field="--known"))
    planned = [p for p in s.plan() if not flt or matches(p.case, flt)]
    if known is not None:
        from specwatch.store.jsonl import recorded_case_ids, results_path

        done = recorded_case_ids(results_path(known, machine, sglang_version, s.name))
        left = [p for p in planned if p.case.case_id not in done]
        _print_device_estimate(s.name, left, len(planned) - len(left), known, machine, sglang_version)
        planned = left
    if as_json:
        for p in planned:
            print(json.dumps({"case_id": p.case.case_id, "skip": p.skip, "duplicate": p.duplicate,
                              **p.case.params()}))
        return
    t = Table(title=f"{s.name}: {len(planned)} cases ({sum(p.skip is None for p in planned)} runnable)")
    for col in ("case id", "model", "algo", "backend", "page", "topk", "steps", "draft", "tp", "dcp", "bs",
                "in->out", "profile", "workload", "status"):
        t.add_column(col, overflow="fold")
    for p in planned:
        c = p.case
        t.add_row(c.case_id, c.model.value, c.algorithm.value, c.attention_backend.value, str(c.page_size), str(c.topk),
                  str(c.num_steps), str(c.num_draft_tokens), str(c.tp), str(c.dcp), str(c.batch_size),
                  f"{c.input_len}->{c.output_len}", c.profile.value, c.workload.value,
                  "run" if p.skip is None else f"[yellow]skip[/yellow]: {p.skip}")
    console.print(t)


def _print_device_estimate(name: str, left: list, n_known: int, root: Path, machine: str, version: str) -> None:
    """Engine groups still to run and, from the machine's recorded runs, the device time they cost."""
    from specwatch.run.runner import engine_groups
    from specwatch.store.jsonl import RUNS_FILE, read_runs

    groups = engine_groups(p.case for p in left if p.skip is None and not p.duplicate)
    console.print(f"{name}: {n_known} case(s) already recorded for {machine} / SGLang {version}; "
                  f"{len(left)} left in {len(groups)} engine group(s)")
    runs = [r for f in sorted((Path(root) / machine).glob(f"*/{RUNS_FILE}")) for r in read_runs(f)
            if r.engine_groups and not r.stopped_by]
    if groups and runs:
        per_group = statistics.median(r.wall_s / r.engine_groups for r in runs)
        console.print(f"≈ {len(groups) * per_group / 60:.0f} device minutes at the recorded pace "
                      f"(median {per_group:.0f} s of wall time per engine group over {len(runs)} run(s) on "
                      f"{machine}; first-use compiles on a fresh host come on top)")


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@app.command()
def run(suites: list[Path] = typer.Argument(..., help="Suite file(s); on a GPU their engine groups share waves."),
        results: Path = typer.Option(Path("results"), help="Results root directory."),
        resume: bool = typer.Option(False, help="Skip cases already recorded ok or skipped."),
        shard: Optional[str] = typer.Option(None, help="Run engine groups I of N: 'I/N'."),
        where: list[str] = typer.Option([], help="Only cases with FIELD=V1[,V2] (repeatable), e.g. page_size=64,256."),
        fault: list[str] = typer.Option([], help="Fault to inject (specwatch inject); repeatable, 'none' = a clean "
                                        "run. Each fault's records go to SUITE+fault-NAME.jsonl."),
        models_dir: Path = typer.Option(Path("/tmp/specwatch-models"), help="Where oracle checkpoints live."),
        cpu_tier: bool = typer.Option(False, "--cpu-tier", help="Run the CPU tier even when a GPU is present."),
        out: Path = typer.Option(Path("out/cpu-tier"), help="CPU tier: where tables are written."),
        context_len: int = typer.Option(4096, help="CPU tier: model context length for the memory model."),
        strict: bool = typer.Option(False, help="CPU tier: exit 1 when a simulation finds a leak or row violation."),
        parallel_starts: int = typer.Option(1, min=1, help="GPU: start this many engines at once, time them one at "
                                            "a time (starts never overlap a timed batch)."),
        stop_after: Optional[float] = typer.Option(None, help="GPU: start no new engine group or wave after this "
                                                   "many seconds (finish the rest later with --resume)."),
        overlap_starts: bool = typer.Option(False, "--overlap-starts", help="GPU, with --parallel-starts K: no waves; "
                                            "K engine groups in flight, the next started as soon as one ends, so "
                                            "starts overlap other engines' timed batches (timed batches still "
                                            "never overlap each other). Cheaper sweeps, noisier timing: for "
                                            "memory and correctness sweeps; records say details.overlap_starts."),
        timing_lock: Optional[Path] = typer.Option(None, help="GPU, with --overlap-starts: a lock file shared "
                                                   "with other specwatch runs on this host (e.g. one per "
                                                   "installed SGLang version), so no two timed batches of "
                                                   "any of them overlap."),
        overlay: Optional[Path] = typer.Option(None, help="GPU: a commit overlay (specwatch overlay) to run "
                                               "instead of the installed SGLang's Python code."),
        group_timeout: Optional[int] = typer.Option(None, min=10, help="GPU: wall-clock limit per engine group "
                                                    "(seconds; default: the suite's timeout_s). A group past it "
                                                    "is recorded 'timeout' with its log tail."),
        bare: bool = typer.Option(False, "--bare", help="GPU: run SGLang without specwatch's probe (records in "
                                  "SUITE+bare.jsonl): the baseline for harness overhead ('specwatch overhead')."),
        known: Optional[Path] = typer.Option(None, help="GPU: leave out cases that already have a record of any "
                                             "status under this results root for the same machine, SGLang "
                                             "version, suite and fault (e.g. the committed results/: known "
                                             "crashes are not re-run).")) -> None:
    """Run suites: on a GPU host through sglang.Engine; without a GPU, the CPU tier."""
    from specwatch.suite import parse_where

    if overlay is not None:
        from specwatch.inject.overlay import load as load_overlay

        try:
            ov = load_overlay(overlay)
        except SpecwatchInputError as e:
            _fail(e)
        os.environ.update(ov.env(os.environ.get("PYTHONPATH", "")))
        console.print(f"overlay: SGLang {ov.commit[:12]} from {ov.root}, recorded as {ov.recorded_version}")
    loaded = [_load(p) for p in suites]
    try:
        flt = parse_where(where)
    except SpecwatchInputError as e:
        _fail(e)
    if cpu_tier or not _cuda_available():
        bad = False
        for s in loaded:
            bad |= _cpu_tier(s, flt, context_len, out, strict, announce=not cpu_tier)
        raise typer.Exit(1 if bad else 0)
    from specwatch.inject.faults import get as get_fault
    from specwatch.run.runner import RunOptions, Shard, check_bare, check_overlap, run_suites

    faults = tuple(None if f == "none" else f for f in fault) or (None,)
    try:
        sh = Shard.parse(shard) if shard else None
        for f in faults:
            if f:
                get_fault(f)
        check_bare(faults, bare)
        check_overlap(overlap_starts, parallel_starts, timing_lock)
    except ValueError as e:
        _fail(e)
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from specwatch.suite import matches

    total = len(faults) * sum(1 for s in loaded for p in s.plan()
                              if not p.duplicate and (not flt or matches(p.case, flt)))
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task(" + ".join(s.name for s in loaded), total=total)

        def progress(rec):
            bar.console.print(f"{rec.status.value:8s} {rec.case_id} {rec.suite} {rec.case.label()}"
                              + (f" [{rec.provenance.fault}]" if rec.provenance.fault else "")
                              + (f" — {rec.reason[:160]}" if rec.reason else ""), highlight=False)
            bar.advance(task)

        paths = run_suites(loaded, results, RunOptions(
            faults=faults, resume=resume, shard=sh, models_dir=models_dir, progress=progress, where=flt,
            parallel_starts=parallel_starts, stop_after_s=stop_after, group_timeout_s=group_timeout, bare=bare,
            known_root=known, overlap_starts=overlap_starts, timing_lock=timing_lock))
    for path in dict.fromkeys(paths):
        console.print(f"results in {path}")


def _cpu_tier(s, flt, context_len: int, out: Path, strict: bool, announce: bool) -> bool:
    """Run the CPU tier on one suite and print its tables; True when it should fail the command."""
    from specwatch.cpu.cpu_tier import run_cpu_tier

    console.print(f"[bold]no GPU: CPU tier on {s.path}[/bold]" if announce else f"[bold]CPU tier on {s.path}[/bold]")
    report = run_cpu_tier(s, context_len=context_len, where=flt)
    _print_frame("memory model (specwatch formulas; sglang_agrees compares with SGLang's functions)",
                 report.memory.drop(columns=["label"]))
    if report.simulation is not None:
        _print_frame("allocator simulation (SGLang's pools on CPU)", report.simulation)
    else:
        console.print("[yellow]sglang not importable: allocator simulation skipped[/yellow]")
    for p in report.write(out / s.name):
        console.print(f"wrote {p}")
    disagree = bool(report.memory["sglang_agrees"].eq(False).any())
    unclean = 0 if report.simulation is None else int((~report.simulation["clean"]).sum())
    if disagree:
        console.print("[red]specwatch's memory model and SGLang's functions disagree (see table)[/red]")
    if unclean:
        console.print(f"[yellow]{unclean} of {len(report.simulation)} allocator simulations not clean "
                      "(leak, double free or row violation): see the simulation table[/yellow]")
    return disagree or (strict and bool(unclean))


@app.command("overlay")
def overlay_cmd(repo: Path = typer.Argument(..., help="A local git repository of SGLang."),
                rev: str = typer.Argument(..., help="Commit, tag or branch to export."),
                out: Path = typer.Option(Path(".overlay"), help="Where overlays are written (git-ignored)."),
                force: bool = typer.Option(False, help="Allow a commit of another release line than the "
                                           "installed SGLang.")) -> None:
    """Export SGLang's python/sglang at REV as a commit overlay for `specwatch run --overlay`."""
    from specwatch.core.sglang_host import sglang_version
    from specwatch.inject.overlay import build

    try:
        ov = build(repo, rev, out, sglang_version(), force=force)
    except SpecwatchInputError as e:
        _fail(e)
    console.print(f"overlay {ov.root}: commit {ov.commit}, code version {ov.code_version}, "
                  f"recorded as {ov.recorded_version}")


@app.command("import")
def import_cmd(files: list[Path] = typer.Argument(..., help="JSONL record files (e.g. fetched from a GPU host), "
                                                  "or a folder of them (run summaries, runs.ndjson, too)."),
               results: Path = typer.Option(Path("results"), help="Results root.")) -> None:
    """Validate records and append them to the results store (each to its machine/version/suite file)."""
    from specwatch.store.jsonl import RUNS_FILE, import_records, import_runs

    paths = [q for p in files for q in (sorted(p.rglob("*.jsonl")) + sorted(p.rglob(RUNS_FILE)) if p.is_dir() else [p])]
    try:
        added = import_records([p for p in paths if p.name != RUNS_FILE], results)
        runs = import_runs([p for p in paths if p.name == RUNS_FILE], results)
    except SpecwatchInputError as e:
        _fail(e)
    for dest, n in added.items():
        console.print(f"{dest}: +{n} records")
    if runs:
        console.print(f"+{runs} run summaries")
    if not added and not runs:
        console.print("nothing new")


@app.command()
def compare(base: str = typer.Argument(..., help="Base selection: results file/folder or FIELD=VALUE[,...]."),
            head: str = typer.Argument(..., help="Head selection, same forms."),
            results: Path = typer.Option(Path("results"), help="Results root for FIELD=VALUE selections."),
            threshold: float = typer.Option(0.05, help="Relative change a timed metric must exceed."),
            alpha: float = typer.Option(0.1, help="Mann-Whitney U p-value a timed change must reach."),
            output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the markdown report here."),
            all_rows: bool = typer.Option(False, "--all", help="Also list unchanged metrics."),
            budgets: Optional[Path] = typer.Option(None, help="Noise budgets JSON (specwatch noise): per "
                                                   "model/batch-size class and metric, the change a timed "
                                                   "metric must exceed.")) -> None:
    """Markdown report of HEAD vs BASE; exit code 1 when anything regressed or now fails."""
    from specwatch.analysis.compare import compare_records, has_regression, markdown

    b, h = _selections(base, head, results)
    rows = compare_records(b, h, threshold=threshold, alpha=alpha, budgets=_budgets(budgets))
    text = markdown(rows, base, head, show_unchanged=all_rows)
    if output:
        output.write_text(text)
    print(text)
    raise typer.Exit(1 if has_regression(rows) else 0)


def _selections(base: str, head: str, results: Path):
    from specwatch.store.select import select

    try:
        b, h = select(base, results), select(head, results)
    except SpecwatchInputError as e:
        _fail(e)
    if not b or not h:
        _fail(SpecwatchInputError(None, f"empty selection: base has {len(b)} records, head {len(h)}"))
    return b, h


def _budget_file(path: Path) -> tuple[dict, dict]:
    """A noise-budget file: its whole JSON and its budgets (CLASS[/METRIC] -> relative change)."""
    try:
        data = json.loads(path.read_text())
        return data, {str(k): float(v) for k, v in data["budgets"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        _fail(SpecwatchInputError(path, f"not a noise-budget file ({type(e).__name__}: {e})", field="budgets"))


def _budgets(path: Optional[Path]) -> Optional[dict]:
    return None if path is None else _budget_file(path)[1]


@app.command()
def noise(base: str = typer.Argument(..., help="First run of an A/A pair (same SGLang): selection."),
          head: str = typer.Argument(..., help="Second run: selection."),
          results: Path = typer.Option(Path("results"), help="Results root for FIELD=VALUE selections."),
          threshold: float = typer.Option(0.05, help="Default relative threshold (as in compare)."),
          alpha: float = typer.Option(0.1, help="Mann-Whitney U p-value (as in compare)."),
          margin: float = typer.Option(1.5, help="Budget = margin x the largest A/A change seen."),
          output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write noise budgets JSON here."),
          budgets: Optional[Path] = typer.Option(None, help="Also report the false-positive rate under these "
                                                 "budgets (derived from another A/A pair: a held-out check)."),
          merge: bool = typer.Option(False, "--merge", help="With --output naming an existing budget file: keep its "
                                     "pairs and budgets, take per class/metric the larger of old and new.")) -> None:
    """A/A comparison: the false-positive rate of `compare` on two runs of the same version, and
    per-class noise budgets derived from their spread (use with `compare --budgets`)."""
    from specwatch.analysis.compare import compare_records
    from specwatch.analysis.noise import aa_differences, merge_budgets, noise_report

    b, h = _selections(base, head, results)
    for line in aa_differences(b, h):
        console.print(f"[yellow]not a clean A/A: {line}[/yellow]")
    rep = noise_report(compare_records(b, h, threshold=threshold, alpha=alpha))
    console.print(f"A/A: {rep.flagged} of {rep.timed} timed metrics flagged at threshold {threshold:.0%}, "
                  f"alpha {alpha}: false-positive rate {rep.false_positive_rate:.1%}")
    if budgets:
        held = noise_report(compare_records(b, h, threshold=threshold, alpha=alpha, budgets=_budgets(budgets)))
        console.print(f"A/A under the budgets in {budgets}: {held.flagged} of {held.timed} flagged: "
                      f"false-positive rate {held.false_positive_rate:.1%}")
    import pandas as pd

    _print_frame("largest A/A change per noise class and metric",
                 pd.DataFrame([{"class/metric": k, "max |change|": f"{v:.1%}"} for k, v in sorted(rep.spread.items())]))
    if output:
        # run=-N is relative to the store's newest run: keep the run ids it meant when this was written
        pair = {"base": base, "head": head,
                "base_runs": sorted({r.provenance.run_id for r in b if r.provenance.run_id}),
                "head_runs": sorted({r.provenance.run_id for r in h if r.provenance.run_id}),
                "timed_metrics": rep.timed, "flagged": rep.flagged,
                "false_positive_rate": rep.false_positive_rate, "margin": margin}
        new_budgets = rep.budgets(margin, threshold)
        pairs = [pair]
        if merge and output.exists():
            prev, old = _budget_file(output)
            # a file from one pair kept that pair's fields at the top level
            pairs = prev.get("pairs") or [{k: prev[k] for k in pair if k in prev}]
            pairs.append(pair)
            new_budgets = merge_budgets(old, new_budgets)
        output.write_text(json.dumps({"pairs": pairs, "budgets": new_budgets}, indent=1) + "\n")
        console.print(f"wrote {output} ({len(pairs)} A/A pair(s), {len(new_budgets)} budgets)")


@app.command("noise-holdout")
def noise_holdout(budget_file: Path = typer.Argument(Path("results/noise-budgets.json"),
                                                     help="Budget file whose A/A pairs to check (specwatch noise -o)."),
                  results: Path = typer.Option(Path("results"), help="Results root the pairs' selections read."),
                  threshold: float = typer.Option(0.05, help="Default relative threshold (as in compare)."),
                  alpha: float = typer.Option(0.1, help="Mann-Whitney U p-value (as in compare)."),
                  output: Optional[Path] = typer.Option(None, "--output", "-o", help="Also write the table as markdown.")
                  ) -> None:
    """Held-out false-positive rate of `compare --budgets`: each A/A pair of a budget file judged
    under the budgets of the other pairs only (leave one out), at the pairs' own margin."""
    import pandas as pd

    from specwatch.analysis.noise import aa_differences, held_out, pair_selections

    data, budgets = _budget_file(budget_file)
    pairs = data.get("pairs") or []
    if len(pairs) < 2:
        _fail(SpecwatchInputError(budget_file, "a held-out check needs two or more A/A pairs", field="pairs"))
    specs = [pair_selections(p) for p in pairs]
    selected = [_selections(*spec, results) for spec in specs]
    margin = float(pairs[0].get("margin", 1.5))
    rows, clean = [], []
    for h in held_out(selected, threshold=threshold, alpha=alpha, margin=margin):
        base, head = specs[h.pair]
        differ = aa_differences(*selected[h.pair])
        clean.append(not differ)
        rows.append({"pair": f"{base} -> {head}",
                     # a pair whose runs differ is no A/A: its budgets count (larger, as compare uses
                     # them), its own flags do not
                     "conditions": "not clean, not counted: " + "; ".join(differ) if differ else "clean",
                     "timed metrics": h.timed, f"flagged at {threshold:.0%}": h.flagged_plain,
                     "flagged under the other pairs' budgets": h.flagged,
                     "held-out false-positive rate": f"{h.flagged / h.timed:.1%}" if h.timed else "-",
                     "no budget from another pair": h.unbudgeted})
    t = pd.DataFrame(rows)
    counted = t[clean]
    total, flagged = int(counted["timed metrics"].sum()), int(counted["flagged under the other pairs' budgets"].sum())
    summary = (f"held out, clean pairs: {flagged} of {total} timed metrics flagged ({flagged / max(total, 1):.1%}; "
               f"goal <= 1%)")
    # the price of a low false-positive rate: the smallest change `compare --budgets` calls a
    # regression, per noise class and metric (a class without a budget gets the plain threshold)
    price = pd.Series(budgets, name="budget").rename_axis("key").reset_index()
    price[["class", "metric"]] = price.key.str.rsplit("/", n=1, expand=True)
    price = price.pivot(index="class", columns="metric", values="budget").apply(lambda col: col.map(
        lambda v: f"{v:.0%}" if v == v else "-")).reset_index()
    _print_frame("A/A pairs, each under the other pairs' noise budgets", t)
    console.print(summary)
    _print_frame("smallest change called a regression (the budgets of all pairs)", price)
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        table = t.assign(pair=t.pair.str.replace("|", "\\|", regex=False)).to_markdown(index=False)   # run=A|B
        output.write_text(f"# Held-out A/A check of {budget_file}\n\n{summary}\n\n{table}\n\n"
                          "## Smallest change called a regression\n\n"
                          "Per noise class and timed metric, the budget `compare --budgets` applies (all pairs "
                          "merged): a change below it is noise by the A/A pairs' measure. Classes not listed "
                          f"use the plain {threshold:.0%} threshold.\n\n{price.to_markdown(index=False)}\n")
        console.print(f"wrote {output}")


@app.command()
def dashboard(results: Path = typer.Option(Path("results"), help="Results root."),
              out: Path = typer.Option(Path("dashboards"), help="Dashboard folder.")) -> None:
    """Write the plots (PNG + SVG), dashboards/index.html (opening with the newest release's verdict
    against the previous one) and dashboards/cases.html from the stored results."""
    from specwatch.analysis.roofline import roofline_frame
    from specwatch.analysis.verdict import release_verdict
    from specwatch.present.dashboard import build
    from specwatch.store.frame import records_frame
    from specwatch.store.jsonl import load_records, result_files

    try:
        records = load_records(result_files(results))
        df = records_frame(records)
        verdict = release_verdict(results)
    except SpecwatchInputError as e:
        _fail(e)
    roof = roofline_frame([r for r in records if r.provenance.fault is None and r.provenance.probe])
    from specwatch.store.frame import runs_frame

    tables = {"Roofline, batch 1 (bound = accept_length x 4.8 TB/s / bytes per verify cycle; specwatch roofline)":
              roof.drop(columns=["case_id"]) if not roof.empty else roof,
              "Sweep cost per GPU run (wall time / the cases' own time; issue 3 aims under 2; K: engines in "
              "flight, 'overlap': --overlap-starts)": runs_frame(results)}
    try:
        console.print(f"wrote {build(df, out, tables, verdict=verdict, source=results)}")
    except SpecwatchInputError as e:
        _fail(e)


@app.command()
def overhead(results: Path = typer.Option(Path("results"), help="Results root.")) -> None:
    """Harness overhead: tokens/s of each case run with specwatch's probe next to its bare run
    (``specwatch run SUITE --bare``), medians over all runs of each kind. Exit 1 when a case is more
    than 2% slower with the probe and the gap exceeds the spread between runs of one kind (or that
    spread is unmeasured: one run each); interleave bare and probed runs to measure it."""
    from specwatch.analysis.overhead import OVER_BUDGET, overhead_table
    from specwatch.store.frame import records_frame
    from specwatch.store.jsonl import load_records, result_files

    try:
        t = overhead_table(records_frame(load_records(result_files(results))))
    except SpecwatchInputError as e:
        _fail(e)
    if t.empty:
        console.print("no case has both a probed and a bare run (specwatch run SUITE --bare)")
        return
    _print_frame("harness overhead (output tokens/s)", t)
    ratios = t["specwatch / bare"]
    # one probe cost would slow every case alike; engine-to-engine noise moves cases both ways
    console.print(f"all {len(t)} cases: specwatch / bare geometric mean {statistics.geometric_mean(ratios):.4f}, "
                  f"probed faster in {int((ratios > 1).sum())} of {len(t)}")
    raise typer.Exit(1 if (t.verdict == OVER_BUDGET).any() else 0)


@app.command()
def inject(name: Optional[str] = typer.Argument(None, help="Fault to check against the installed SGLang."),
           ) -> None:
    """List the injectable faults; with NAME, apply and restore it here to check it fits this SGLang.
    Use ``specwatch run SUITE --fault NAME`` to run a sweep with the fault active in SGLang's processes."""
    from specwatch.inject import faults

    if name is None:
        t = Table(title="faults (specwatch run SUITE --fault NAME)")
        for col in ("name", "re-creates", "expected to be flagged by"):
            t.add_column(col, overflow="fold")
        for f in faults.FAULTS.values():
            t.add_row(f.name, f.recreates, f.expected_flag)
        console.print(t)
        return
    try:
        with faults.applied(name):
            pass
    except ValueError as e:
        _fail(e)
    console.print(f"{name}: applies to the installed SGLang and restores cleanly")


@app.command("asv-import")
def asv_import_cmd(results: Path = typer.Option(Path("results"), help="Results root."),
                   work: Path = typer.Option(Path(".asv/offline"), help="asv work folder (results, version ledger)."),
                   html: Path = typer.Option(Path("dashboards/asv"), help="Where asv publish writes."),
                   publish: bool = typer.Option(True, help="Run asv publish afterwards.")) -> None:
    """Turn stored tree-page records into asv results (one asv commit per SGLang version) and publish."""
    from specwatch.present.asv_bridge import asv_import

    try:
        done = asv_import(results, work, html, publish, log=console.print)
    except (SpecwatchInputError, ValueError, RuntimeError) as e:
        _fail(e)
    if publish and done:
        console.print(f"asv publish wrote {html}/index.html")


@app.command("results")
def results_cmd(root: Path = typer.Argument(Path("results"), help="Results root."),
                csv: Optional[Path] = typer.Option(None, help="Also write the frame as CSV.")) -> None:
    """Load every record under ROOT into one table (one row per case run) and print its health:
    statuses per machine / SGLang version / suite, and every failed check by name."""
    from specwatch.store.frame import records_frame
    from specwatch.store.jsonl import load_records, result_files

    try:
        df = records_frame(load_records(result_files(root)))
    except SpecwatchInputError as e:
        _fail(e)
    if csv:
        df.to_csv(csv, index=False)
    if df.empty:
        console.print("no records")
        return
    counts = df.groupby(["machine", "sglang_version", "suite", "status"]).size().unstack(fill_value=0)
    _print_frame("records", counts.reset_index())
    from specwatch.store.frame import runs_frame

    runs = runs_frame(root)
    if not runs.empty:
        _print_frame("sweep cost per run (wall / case time; goal < 2)", runs)
    if "decode_throughput_spread" in df:
        clean = df.decode_throughput_spread.notna() & df.fault.isna() & (df.probe != False)  # noqa: E712
        spread = df[clean].groupby(["machine", "sglang_version", "suite", "model", "batch_size"])
        _print_frame("decode tokens/s spread within a case's repeats ((max - min) / median; clean runs)", spread.agg(
            cases=("decode_throughput_spread", "size"),
            median=("decode_throughput_spread", "median"),
            p90=("decode_throughput_spread", lambda v: v.quantile(0.9))).round(3).reset_index())
    phases = [c for c in df.columns if c.startswith("start.")]
    if phases and "engine_start_time" in df:
        started = df[df[phases].notna().any(axis=1)]
        table = (started.groupby(["machine", "sglang_version", "attention_backend"])[["engine_start_time"] + phases]
                 .median().round(1).reset_index())
        table.columns = [c.removeprefix("start.") for c in table.columns]
        _print_frame("engine start breakdown (median s; scheduler phases from SGLang's own startup timing)", table)
    checks = [c for c in df.columns if c.startswith("check.")]
    failing = df[df[checks].eq(False).any(axis=1)] if checks else df.iloc[0:0]
    if failing.empty:
        console.print(f"[green]every check passed on all {int((df.status == 'ok').sum())} ok records[/green]")
    for _, row in failing.iterrows():
        bad = [c[len("check."):] for c in checks if row[c] == False]  # noqa: E712 (numpy bools, NaN)
        note = " (the radix cache a refused flush left, not a leak)" if row.get("leak_is_unflushed_cache") else ""
        if "req_to_token_matches_model" in bad and row.get("row_matches_model_now") is True:
            note += " (the row matches today's model: the model's rule was learned later)"
        console.print(f"[red]{row.case_id}[/red] {row.suite} {row.attention_backend} p{row.page_size} k{row.topk} "
                      f"bs{row.batch_size}: failed {', '.join(bad)}{note}", highlight=False)


@app.command("roofline")
def roofline_cmd(root: Path = typer.Argument(Path("results"), help="Results root."),
                 model: str = typer.Option("8b", help="Only this model size ('all' for every size).")) -> None:
    """Batch-1 EAGLE records against the HBM-bandwidth bound tau x 4.8 TB/s / bytes per verify cycle."""
    from specwatch.analysis.roofline import roofline_frame
    from specwatch.store.jsonl import load_records, result_files

    recs = [r for r in load_records(result_files(root)) if model == "all" or r.case.model.value == model]
    df = roofline_frame(recs)
    if df.empty:
        console.print("no batch-1 EAGLE records")
        return
    _print_frame("roofline (bytes per verify cycle; bound = accept_length x 4.8 TB/s / bytes)", df.drop(columns=["case_id"]))


def _print_frame(title: str, df) -> None:
    t = Table(title=title)
    for c in df.columns:
        t.add_column(str(c))
    for row in df.itertuples(index=False):
        t.add_row(*("" if v is None else str(v) for v in row))
    console.print(t)


@model_app.command("memory")
def model_memory(page: int = typer.Option(1, "--page"), topk: int = typer.Option(1, "--topk"),
                 steps: int = typer.Option(3, "--steps"), draft: int = typer.Option(4, "--draft"),
                 context_len: int = typer.Option(4096, "--context-len"),
                 max_running: int = typer.Option(48, "--max-running"), dcp: int = typer.Option(1, "--dcp"),
                 algorithm: str = typer.Option("EAGLE", help="EAGLE, EAGLE3, STANDALONE, NGRAM or none."),
                 csv: Optional[Path] = typer.Option(None), json_out: Optional[Path] = typer.Option(None, "--json")) -> None:
    """Spec-decode KV sizing for one configuration: specwatch's formulas next to SGLang's."""
    from specwatch.core.case import Algorithm
    from specwatch.rules.memory_model import (
        COMPARED_FIELDS,
        SIZING_FIELDS,
        SizingInput,
        compare,
    )

    try:
        algo = None if algorithm.lower() == "none" else Algorithm(algorithm)
    except ValueError:
        _fail(SpecwatchInputError(None, f"unknown algorithm {algorithm!r}", field="--algorithm"))
    x = SizingInput(algo, page, topk, steps, draft, context_len, max_running, dcp)
    ref, sgl, diffs = compare(x)
    t = Table(title=f"memory model: page {page}, topk {topk}, steps {steps}, draft {draft}, ctx {context_len}, "
                    f"max running {max_running}, dcp {dcp}, {algorithm}")
    t.add_column("field")
    t.add_column("specwatch")
    t.add_column("sglang " + ("(not importable)" if sgl is None else ""))
    t.add_column("agree")
    rows = []
    for f in SIZING_FIELDS:
        a = getattr(ref, f)
        b = getattr(sgl, f) if (sgl is not None and f in COMPARED_FIELDS) else None
        agree = "" if b is None else ("yes" if a == b else "[red]NO[/red]")
        t.add_row(f, str(a), "" if b is None else str(b), agree)
        rows.append({"field": f, "specwatch": a, "sglang": b})
    console.print(t)
    if csv:
        import pandas as pd

        pd.DataFrame(rows).to_csv(csv, index=False)
    if json_out:
        json_out.write_text(json.dumps(rows, indent=1))
    if diffs:
        raise typer.Exit(1)


@model_app.command("simulate")
def model_simulate(page: int = typer.Option(64, "--page"), topk: int = typer.Option(8, "--topk"),
                   steps: int = typer.Option(3, "--steps"), draft: int = typer.Option(16, "--draft"),
                   context_len: int = typer.Option(512, "--context-len"),
                   requests: int = typer.Option(4, "--requests"), input_len: int = typer.Option(300, "--input-len"),
                   accept: str = typer.Option("random", help="full, one or random."),
                   dcp: int = typer.Option(1, "--dcp"), seed: int = typer.Option(0, "--seed"),
                   output_len: int = typer.Option(10_000, "--output-len"),
                   near_full: bool = typer.Option(False, "--near-full", help="Pool sized to the peak demand."),
                   kv_write_ignores_dcp: bool = typer.Option(
                       False, "--kv-write-ignores-dcp", help="The target's attention backend writes KV at the "
                       "allocator's virtual slot into its per-rank pool (no DCP code, e.g. 0.5.17's flashinfer)."),
                   fault: Optional[str] = typer.Option(None, help="Plant a fault: row-widen-revert, "
                                                               "unaligned-watermark, draft-page-mismatch."),
                   as_json: bool = typer.Option(False, "--json")) -> None:
    """Drive SGLang's real ReqToTokenPool and paged allocator on CPU through spec-decode steps."""
    from specwatch.cpu.allocator_sim import AcceptPattern, SimConfig, simulate
    from specwatch.inject.faults import SimFault

    try:
        cfg = SimConfig(page, topk, steps, draft, context_len=context_len, num_requests=requests,
                        input_len=input_len, output_len=output_len, accept=AcceptPattern(accept), dcp=dcp,
                        seed=seed, near_full=near_full, kv_write_ignores_dcp=kv_write_ignores_dcp,
                        fault=SimFault(fault) if fault else None)
    except ValueError as e:
        _fail(SpecwatchInputError(None, str(e), field="--accept/--fault"))
    try:
        res = simulate(cfg)
    except ImportError as e:
        _fail(SpecwatchInputError(None, f"sglang is not importable here ({e}); install requirements/sglang-cpu*.txt"))
    d = res.as_dict()
    if as_json:
        print(json.dumps(d, default=str))
    else:
        t = Table(title="allocator simulation" + (f" with fault {fault}" if fault else ""))
        t.add_column("quantity")
        t.add_column("value")
        for k, v in d.items():
            if k != "config":
                t.add_row(k, str(v))
        console.print(t)
        for v in res.row_violations[:3]:
            console.print(f"[red]row violation[/red]: request {v.request} committed {v.committed_len} "
                          f"watermark {v.watermark} > row width {v.row_width}")
    raise typer.Exit(0 if res.clean else 1)


def main() -> None:  # pragma: no cover
    try:
        app()
    except SpecwatchInputError as e:
        err_console.print(f"error: {e}")
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
