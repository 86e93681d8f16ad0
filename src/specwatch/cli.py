"""The ``specwatch`` command line: parse options, call the layer below, print.

Bad input anywhere below raises ``SpecwatchInputError``; ``main`` (the console script) prints it as
one line and exits 2, as it does for an OSError and for typer's own usage errors.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from specwatch.core.errors import SpecwatchInputError

try:                                # typer vendors its own click; click's exception classes are not its
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
except ImportError:                 # pragma: no cover (typer on the click package)
    from click.exceptions import ClickException, NoArgsIsHelpError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Benchmark and regression tracking for SGLang speculative decoding.")
model_app = typer.Typer(no_args_is_help=True, help="CPU tier: memory model and allocator simulation.")
app.add_typer(model_app, name="model")


def _width(stderr: bool = False) -> Optional[int]:
    """``COLUMNS`` when set, else a terminal's own width (None: rich asks it); piped output gets
    lines wide enough not to wrap tables."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit():
        return int(columns)
    return None if (sys.stderr if stderr else sys.stdout).isatty() else (200 if stderr else 260)


console = Console(width=_width())
err_console = Console(stderr=True, width=_width(stderr=True))


def main(argv: Optional[list[str]] = None) -> None:
    """The console script: run the app and turn bad input into one line on stderr, exit 2."""
    try:
        code = app(args=argv, prog_name="specwatch", standalone_mode=False)
    except NoArgsIsHelpError as e:
        e.show()
        code = 2
    except ClickException as e:
        where = f"{e.ctx.command_path}: " if getattr(e, "ctx", None) else ""
        code = _error(where + e.format_message(), e.exit_code)
    except typer.Abort:
        code = _error("aborted", 1)
    except SpecwatchInputError as e:
        code = _error(str(e), 2)
    except OSError as e:
        code = _error(f"{e.filename}: {e.strerror}" if e.filename else str(e), 2)
    sys.exit(code if isinstance(code, int) else 0)


def _error(message: str, code: int) -> int:
    err_console.print(Text.assemble(("error:", "red"), " ", " ".join(message.split())), soft_wrap=True)
    return code


def _version(value: bool) -> None:
    if value:
        from specwatch import __version__
        from specwatch.core.sglang_host import sglang_version

        sglang = sglang_version()
        print(f"specwatch {__version__}, " + (f"SGLang {sglang}" if sglang else "SGLang not installed"))
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print specwatch's and the installed SGLang's versions.")]
          = False) -> None:
    """Benchmark and regression tracking for SGLang speculative decoding."""
    console.width, err_console.width = _width(), _width(stderr=True)      # as the invocation's environment says


# -- printing --------------------------------------------------------------------------------------

def _fit(headers: list[str], cells: list[list[Text]], width: int) -> tuple[list[str], list[Optional[int]]]:
    """Headers and column widths for a table at most ``width`` wide: headers longer than their
    column's values give way to short keys (explained by a legend), then the columns wider than a
    common cap shrink to it (their cells fold onto more lines; the first column only if the rest
    cannot make room) and headers wider than that cap give way to keys too."""
    n = len(headers)
    data = [max((max(len(x) for x in row[i].plain.split("\n")) for row in cells), default=1) for i in range(n)]
    heads, keys, avail = list(headers), _keys(headers), width - 3 * n - 1   # rich's box: a rule, two pads a column
    natural = [max(len(h), d, 1) for h, d in zip(heads, data)]
    for i in sorted(range(n), key=lambda i: data[i] - len(heads[i])):
        if sum(natural) <= avail:
            return heads, [None] * n
        if len(heads[i]) > max(data[i], len(keys[i])):
            heads[i], natural[i] = keys[i], max(len(keys[i]), data[i], 1)
    if sum(natural) <= avail:
        return heads, [None] * n
    for keep in (natural[0], 0):          # the first column (a case id, a name) stays whole if it can
        cap = max(natural)
        while cap > 4 and keep + sum(min(w, cap) for w in natural[1 if keep else 0:]) > avail:
            cap -= 1
        widths = [keep or min(natural[0], cap)] + [min(w, cap) for w in natural[1:]]
        if sum(widths) <= avail:
            break
    heads = [keys[i] if len(heads[i]) > widths[i] else heads[i] for i in range(n)]
    return heads, widths


def _keys(headers: list[str]) -> list[str]:
    """Short distinct keys for headers: their words' initials (``flagged at 5%`` -> ``fa5``)."""
    out: list[str] = []
    for h in headers:
        words = [w for w in h.replace("_", " ").replace("/", " ").replace("-", " ").split() if w[:1].isalnum()]
        key = "".join(w[0] for w in words)[:3].lower() or h[:2]
        k, i = key, 2
        while k in out or (k in headers and k != h):
            k, i = f"{key}{i}", i + 1
        out.append(k)
    return out


def _print_table(title: str, headers: list[str], rows: list[list]) -> None:
    """A table that fits the console: no header or cell cut to "…"; abbreviated headers listed below."""
    cells = [[v if isinstance(v, Text) else Text("" if v is None else str(v)) for v in row] for row in rows]
    heads, widths = _fit([str(h) for h in headers], cells, console.width)
    t = Table(title=title)
    for h, w in zip(heads, widths):
        t.add_column(h, overflow="fold", width=w)
    for row in cells:
        t.add_row(*row)
    console.print(t)
    legend = [f"{k} = {h}" for k, h in zip(heads, headers) if k != h]
    if legend:
        console.print("; ".join(legend), highlight=False)


def _print_frame(title: str, df) -> None:
    _print_table(title, list(df.columns), [list(row) for row in df.itertuples(index=False)])


# -- shared options --------------------------------------------------------------------------------

def _check_where(terms: list[str]) -> list[str]:
    """``--where``: known fields, and values the field can take (an int field's ``abc`` would match
    no case and pass silently)."""
    from pydantic import TypeAdapter, ValidationError

    from specwatch.core.case import Case
    from specwatch.suite import parse_where

    try:
        flt = parse_where(terms)
    except SpecwatchInputError as e:
        raise typer.BadParameter(f"{e.field}: {e.message}") from None
    for key, values in flt.items():
        info = Case.model_fields.get(key)
        if info is None:
            continue                                             # case_id: any text
        kind = info.annotation
        for v in sorted(values):
            if isinstance(kind, type) and issubclass(kind, Enum):
                ok = v in {str(m.value).lower() for m in kind}
            else:
                try:
                    TypeAdapter(Annotated[(kind, *info.metadata)] if info.metadata else kind).validate_python(v)
                    ok = True
                except ValidationError:
                    ok = False
            if not ok:
                raise typer.BadParameter(f"{key}={v}: {v!r} is not a valid {key}")
    return terms


def _check_shard(text: Optional[str]) -> Optional[str]:
    from specwatch.run.runner import Shard

    if text is not None:
        try:
            Shard.parse(text)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    return text


Where = Annotated[list[str], typer.Option("--where", callback=_check_where, help="Only cases with FIELD=V1[,V2] "
                                          "(repeatable), e.g. page_size=64,256.")]
Results = Annotated[Path, typer.Option("--results", help="Results root directory.")]
StoredResults = Annotated[Path, typer.Option("--results", exists=True, file_okay=False, help="Results root.")]
ResultsArg = Annotated[Path, typer.Argument(exists=True, file_okay=False, help="Results root.")]
Threshold = Annotated[float, typer.Option(help="Relative change a timed metric must exceed (default threshold).")]
Alpha = Annotated[float, typer.Option(help="Mann-Whitney U p-value a timed change must reach.")]
BudgetsOpt = Annotated[Optional[Path], typer.Option("--budgets", exists=True, dir_okay=False, help="Noise budgets "
                                                    "JSON (specwatch noise): per model/batch-size class and metric, "
                                                    "the change a timed metric must exceed.")]
Output = Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the output file here.")]
Positive = Annotated[int, typer.Option(min=1)]


def _load(path: Path):
    from specwatch.suite import load_suite

    return load_suite(path)


def _selections(base: str, head: str, results: Path):
    from specwatch.store.select import select

    b, h = select(base, results), select(head, results)
    if not b or not h:
        raise SpecwatchInputError(None, f"empty selection: base has {len(b)} records, head {len(h)}")
    return b, h


def _budgets(path: Optional[Path]) -> Optional[dict]:
    from specwatch.analysis.noise import BudgetFile

    return None if path is None else BudgetFile.load(path).budgets


# -- commands --------------------------------------------------------------------------------------

@app.command()
def plan(suite: Path = typer.Argument(..., help="Suite file (suites/*.toml)."),
         as_json: bool = typer.Option(False, "--json", help="Print JSON lines instead of a table."),
         where: Where = [],
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
    flt = parse_where(where)
    if known is not None and not (machine and sglang_version):
        raise SpecwatchInputError(None, "--known needs --machine and --sglang-version (where the run will happen)",
                                  field="--known")
    planned = [p for p in s.plan() if not flt or matches(p.case, flt)]
    if flt and not planned:
        raise SpecwatchInputError(suite, f"no case matches --where {' '.join(where)}", field="--where")
    if known is not None:
        from specwatch.run.estimate import estimate

        est = estimate(s.name, planned, known, machine, sglang_version)
        console.print(f"{s.name}: {est.known} case(s) already recorded for {machine} / SGLang {sglang_version}; "
                      f"{len(est.left)} left in {est.groups} engine group(s)")
        if est.device_minutes is not None:
            console.print(f"≈ {est.device_minutes:.0f} device minutes at the recorded pace (median "
                          f"{est.per_group_s:.0f} s of wall time per engine group over {est.runs} run(s) on "
                          f"{machine}; first-use compiles on a fresh host come on top)")
        planned = est.left
    if as_json:
        for p in planned:
            print(json.dumps({"case_id": p.case.case_id, "skip": p.skip, "duplicate": p.duplicate,
                              **p.case.params()}))
        return
    reasons = list(dict.fromkeys(p.skip for p in planned if p.skip))           # listed once, under the table
    headers = ["case id", "model", "algo", "backend", "page", "topk", "steps", "draft", "tp", "dcp", "bs",
               "in->out", "profile", "workload", "status"]
    rows = [[c.case_id, c.model.value, c.algorithm.value, c.attention_backend.value, c.page_size, c.topk,
             c.num_steps, c.num_draft_tokens, c.tp, c.dcp, c.batch_size, f"{c.input_len}->{c.output_len}",
             c.profile.value, c.workload.value,
             Text("run") if p.skip is None else Text(f"skip #{reasons.index(p.skip) + 1}", "yellow")]
            for p in planned for c in [p.case]]
    # a parameter every case shares is said once, under the table
    same = [i for i in range(1, len(headers) - 1) if len(rows) > 1 and len({str(r[i]) for r in rows}) == 1]
    _print_table(f"{s.name}: {len(planned)} cases ({sum(p.skip is None for p in planned)} runnable)",
                 [h for i, h in enumerate(headers) if i not in same],
                 [[v for i, v in enumerate(r) if i not in same] for r in rows])
    if same:
        console.print("every case: " + ", ".join(f"{headers[i]} {rows[0][i]}" for i in same), highlight=False)
    for i, why in enumerate(reasons, 1):
        console.print(f"skip #{i}: {why}", highlight=False)


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@app.command()
def run(suites: list[Path] = typer.Argument(..., help="Suite file(s); on a GPU their engine groups share waves."),
        results: Results = Path("results"),
        resume: bool = typer.Option(False, help="Skip cases already recorded ok or skipped."),
        shard: Optional[str] = typer.Option(None, callback=_check_shard, help="Run engine groups I of N: 'I/N'."),
        where: Where = [],
        fault: list[str] = typer.Option([], help="Fault to inject (specwatch inject); repeatable, 'none' = a clean "
                                        "run. Each fault's records go to SUITE+fault-NAME.jsonl."),
        models_dir: Path = typer.Option(Path("/tmp/specwatch-models"), help="Where oracle checkpoints live."),
        cpu_tier: bool = typer.Option(False, "--cpu-tier", help="Run the CPU tier even when a GPU is present."),
        out: Path = typer.Option(Path("out/cpu-tier"), help="CPU tier: where tables are written."),
        context_len: int = typer.Option(4096, min=1, help="CPU tier: model context length for the memory model."),
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

        ov = load_overlay(overlay)
        os.environ.update(ov.env(os.environ.get("PYTHONPATH", "")))
        console.print(f"overlay: SGLang {ov.commit[:12]} from {ov.root}, recorded as {ov.recorded_version}")
    loaded = [_load(p) for p in suites]
    flt = parse_where(where)
    if cpu_tier or not _cuda_available():
        bad = False
        for s in loaded:
            bad |= _cpu_tier(s, flt, context_len, out, strict, announce=not cpu_tier)
        raise typer.Exit(1 if bad else 0)
    from specwatch.inject.faults import get as get_fault
    from specwatch.run.runner import Shard, check_bare, check_overlap, run_suites

    faults = tuple(None if f == "none" else f for f in fault) or (None,)
    try:
        sh = Shard.parse(shard) if shard else None
        for f in faults:
            if f:
                get_fault(f)
        check_bare(faults, bare)
        check_overlap(overlap_starts, parallel_starts, timing_lock)
    except ValueError as e:
        raise SpecwatchInputError(None, str(e)) from None
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

        paths = run_suites(loaded, results, faults=faults, resume=resume, shard=sh, models_dir=models_dir,
                           progress=progress, where=flt, parallel_starts=parallel_starts, stop_after_s=stop_after,
                           group_timeout_s=group_timeout, bare=bare, known_root=known, overlap_starts=overlap_starts,
                           timing_lock=timing_lock)
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

    ov = build(repo, rev, out, sglang_version(), force=force)
    console.print(f"overlay {ov.root}: commit {ov.commit}, code version {ov.code_version}, "
                  f"recorded as {ov.recorded_version}")


@app.command("import")
def import_cmd(files: list[Path] = typer.Argument(..., exists=True, help="JSONL record files (e.g. fetched from a "
                                                  "GPU host), or a folder of them (run summaries, runs.ndjson, too)."),
               results: Results = Path("results")) -> None:
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


@app.command()
def compare(base: str = typer.Argument(..., help="Base selection: results file/folder or FIELD=VALUE[,...]."),
            head: str = typer.Argument(..., help="Head selection, same forms."),
            results: Results = Path("results"), threshold: Threshold = 0.05, alpha: Alpha = 0.1,
            output: Output = None,
            all_rows: bool = typer.Option(False, "--all", help="Also list unchanged metrics."),
            budgets: BudgetsOpt = None) -> None:
    """Markdown report of HEAD vs BASE; exit code 1 when anything regressed or now fails."""
    from specwatch.analysis.compare import compare_records, has_regression, markdown

    b, h = _selections(base, head, results)
    rows = compare_records(b, h, threshold=threshold, alpha=alpha, budgets=_budgets(budgets))
    text = markdown(rows, base, head, show_unchanged=all_rows)
    if output:
        output.write_text(text)
    print(text)
    raise typer.Exit(1 if has_regression(rows) else 0)


@app.command()
def noise(base: str = typer.Argument(..., help="First run of an A/A pair (same SGLang): selection."),
          head: str = typer.Argument(..., help="Second run: selection."),
          results: Results = Path("results"), threshold: Threshold = 0.05, alpha: Alpha = 0.1,
          margin: float = typer.Option(1.5, help="Budget = margin x the largest A/A change seen."),
          output: Output = None, budgets: BudgetsOpt = None,
          merge: bool = typer.Option(False, "--merge", help="With --output naming an existing budget file: keep its "
                                     "pairs and budgets, take per class/metric the larger of old and new.")) -> None:
    """A/A comparison: the false-positive rate of `compare` on two runs of the same version, and
    per-class noise budgets derived from their spread (use with `compare --budgets`); --budgets also
    reports the rate under budgets from another A/A pair (a held-out check)."""
    from specwatch.analysis.compare import compare_records
    from specwatch.analysis.noise import BudgetFile, aa_differences, aa_pair, noise_report, spread_table

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
    _print_frame("largest A/A change per noise class and metric", spread_table(rep))
    if output:
        pair, new = aa_pair(base, head, b, h, rep, margin), rep.budgets(margin, threshold)
        f = BudgetFile.load(output).merged(pair, new) if merge and output.exists() else \
            BudgetFile(pairs=[pair], budgets=new)
        f.save(output)
        console.print(f"wrote {output} ({len(f.pairs)} A/A pair(s), {len(f.budgets)} budgets)")


@app.command("noise-holdout")
def noise_holdout(budget_file: Path = typer.Argument(Path("results/noise-budgets.json"), help="Budget file whose "
                                                     "A/A pairs to check (specwatch noise -o)."),
                  results: Results = Path("results"), threshold: Threshold = 0.05, alpha: Alpha = 0.1,
                  output: Output = None) -> None:
    """Held-out false-positive rate of `compare --budgets`: each A/A pair of a budget file judged
    under the budgets of the other pairs only (leave one out), at the pairs' own margin."""
    from specwatch.analysis.noise import BudgetFile, holdout_report

    f = BudgetFile.load(budget_file)
    if len(f.pairs) < 2:
        raise SpecwatchInputError(budget_file, "a held-out check needs two or more A/A pairs", field="pairs")
    rep = holdout_report(f, [_selections(*p.selections(), results) for p in f.pairs], threshold, alpha)
    _print_frame("A/A pairs, each under the other pairs' noise budgets", rep.pairs)
    console.print(rep.summary)
    _print_frame("smallest change called a regression (the budgets of all pairs)", rep.price)
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(rep.markdown(budget_file, threshold))
        console.print(f"wrote {output}")


@app.command()
def dashboard(results: StoredResults = Path("results"),
              out: Path = typer.Option(Path("dashboards"), help="Dashboard folder.")) -> None:
    """Write the plots (PNG + SVG) and dashboards/index.html from the stored results."""
    from specwatch.analysis.roofline import roofline_frame
    from specwatch.present.dashboard import build
    from specwatch.store.frame import records_frame, runs_frame
    from specwatch.store.jsonl import load_records, result_files

    records = load_records(result_files(results))
    df = records_frame(records)
    roof = roofline_frame([r for r in records if r.provenance.fault is None and r.provenance.probe])
    tables = {"Roofline, batch 1 (bound = accept_length x 4.8 TB/s / bytes per verify cycle; specwatch roofline)":
              roof.drop(columns=["case_id"]) if not roof.empty else roof,
              "Sweep cost per GPU run (wall time / the cases' own time; issue 3 aims under 2; K: engines in "
              "flight, 'overlap': --overlap-starts)": runs_frame(results)}
    console.print(f"wrote {build(df, out, tables)}")


@app.command()
def overhead(results: StoredResults = Path("results")) -> None:
    """Harness overhead: tokens/s of each case run with specwatch's probe next to its bare run
    (``specwatch run SUITE --bare``), medians over all runs of each kind. Exit 1 when a case is more
    than 2% slower with the probe and the gap exceeds the spread between runs of one kind (or that
    spread is unmeasured: one run each); interleave bare and probed runs to measure it."""
    from specwatch.analysis.overhead import OVER_BUDGET, overhead_table
    from specwatch.store.frame import records_frame
    from specwatch.store.jsonl import load_records, result_files

    t = overhead_table(records_frame(load_records(result_files(results))))
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
def inject(name: Optional[str] = typer.Argument(None, help="Fault to check against the installed SGLang.")) -> None:
    """List the injectable faults; with NAME, apply and restore it here to check it fits this SGLang.
    Use ``specwatch run SUITE --fault NAME`` to run a sweep with the fault active in SGLang's processes."""
    from specwatch.inject import faults

    if name is None:
        _print_table("faults (specwatch run SUITE --fault NAME)", ["name", "re-creates", "expected to be flagged by"],
                     [[f.name, f.recreates, f.expected_flag] for f in faults.FAULTS.values()])
        return
    try:
        with faults.applied(name):
            pass
    except ImportError as e:
        raise SpecwatchInputError(None, f"sglang is not importable here ({e}): a fault is checked against the "
                                  "installed SGLang", field=name) from None
    except ValueError as e:
        raise SpecwatchInputError(None, str(e), field=name) from None
    console.print(f"{name}: applies to the installed SGLang and restores cleanly")


@app.command("asv-import")
def asv_import_cmd(results: StoredResults = Path("results"),
                   work: Path = typer.Option(Path(".asv/offline"), help="asv work folder (results, version ledger)."),
                   html: Path = typer.Option(Path("dashboards/asv"), help="Where asv publish writes."),
                   publish: bool = typer.Option(True, help="Run asv publish afterwards.")) -> None:
    """Turn stored tree-page records into asv results (one asv commit per SGLang version) and publish."""
    from specwatch.present.asv_bridge import asv_import
    from specwatch.store.jsonl import load_records, result_files

    try:
        done = asv_import(load_records(result_files(results)), results, work, html, publish)
    except (ValueError, RuntimeError) as e:
        raise SpecwatchInputError(work, str(e)) from None
    for (machine, version), h in done.items():
        console.print(f"{machine} sglang {version}: asv commit {h[:8]}")
    if publish and done:
        console.print(f"asv publish wrote {html}/index.html")


@app.command("results")
def results_cmd(root: ResultsArg = Path("results"),
                csv: Optional[Path] = typer.Option(None, help="Also write the frame as CSV.")) -> None:
    """Load every record under ROOT into one table (one row per case run) and print its health:
    statuses per machine / SGLang version / suite, and every failed check by name."""
    from specwatch.analysis.health import failed_checks, start_breakdown, status_counts, throughput_spread
    from specwatch.store.frame import records_frame, runs_frame
    from specwatch.store.jsonl import load_records, result_files

    df = records_frame(load_records(result_files(root)))
    if csv:
        df.to_csv(csv, index=False)
    if df.empty:
        console.print(f"no records under {root}")
        return
    for title, table in (("records", status_counts(df)),
                         ("sweep cost per run (wall / case time; goal < 2)", runs_frame(root)),
                         ("decode tokens/s spread within a case's repeats ((max - min) / median; clean runs)",
                          throughput_spread(df)),
                         ("engine start breakdown (median s; scheduler phases from SGLang's own startup timing)",
                          start_breakdown(df))):
        if not table.empty:
            _print_frame(title, table)
    failing = failed_checks(df)
    if failing.empty:
        console.print(f"[green]every check passed on all {int((df.status == 'ok').sum())} ok records[/green]")
    for row in failing.itertuples(index=False):
        console.print(Text.assemble((row.case_id, "red"), f" {row.where}: failed {', '.join(row.failed)}{row.note}"))


@app.command("roofline")
def roofline_cmd(root: ResultsArg = Path("results"),
                 model: str = typer.Option("8b", help="Only this model size ('all' for every size).")) -> None:
    """Batch-1 EAGLE records against the HBM-bandwidth bound tau x 4.8 TB/s / bytes per verify cycle."""
    from specwatch.analysis.roofline import roofline_frame
    from specwatch.store.jsonl import load_records, result_files

    df = roofline_frame([r for r in load_records(result_files(root)) if model == "all" or r.case.model.value == model])
    if df.empty:
        console.print("no batch-1 EAGLE records")
        return
    _print_frame("roofline (bytes per verify cycle; bound = accept_length x 4.8 TB/s / bytes)", df.drop(columns=["case_id"]))


@model_app.command("memory")
def model_memory(page: Positive = 1, topk: Positive = 1, steps: Positive = 3, draft: Positive = 4,
                 context_len: Positive = 4096, max_running: Positive = 48, dcp: Positive = 1,
                 algorithm: str = typer.Option("EAGLE", help="EAGLE, EAGLE3, STANDALONE, NGRAM or none."),
                 csv: Optional[Path] = typer.Option(None), json_out: Optional[Path] = typer.Option(None, "--json")) -> None:
    """Spec-decode KV sizing for one configuration: specwatch's formulas next to SGLang's."""
    from specwatch.core.case import Algorithm
    from specwatch.rules.memory_model import COMPARED_FIELDS, SIZING_FIELDS, SizingInput, compare

    try:
        algo = None if algorithm.lower() == "none" else Algorithm(algorithm)
    except ValueError:
        raise SpecwatchInputError(None, f"unknown algorithm {algorithm!r}", field="--algorithm") from None
    ref, sgl, diffs = compare(SizingInput(algo, page, topk, steps, draft, context_len, max_running, dcp))
    rows = [{"field": f, "specwatch": getattr(ref, f),
             "sglang": getattr(sgl, f) if (sgl is not None and f in COMPARED_FIELDS) else None} for f in SIZING_FIELDS]
    _print_table(f"memory model: page {page}, topk {topk}, steps {steps}, draft {draft}, ctx {context_len}, "
                 f"max running {max_running}, dcp {dcp}, {algorithm}",
                 ["field", "specwatch", "sglang " + ("(not importable)" if sgl is None else ""), "agree"],
                 [[r["field"], r["specwatch"], r["sglang"], "" if r["sglang"] is None else
                   Text("yes") if r["specwatch"] == r["sglang"] else Text("NO", "red")] for r in rows])
    if csv:
        import pandas as pd

        pd.DataFrame(rows).to_csv(csv, index=False)
    if json_out:
        json_out.write_text(json.dumps(rows, indent=1))
    if diffs:
        raise typer.Exit(1)


@model_app.command("simulate")
def model_simulate(page: Positive = 64, topk: Positive = 8, steps: Positive = 3, draft: Positive = 16,
                   context_len: Positive = 512, requests: Positive = 4, input_len: Positive = 300,
                   accept: str = typer.Option("random", help="full, one or random."),
                   dcp: Positive = 1, seed: int = typer.Option(0, "--seed"), output_len: Positive = 10_000,
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
        raise SpecwatchInputError(None, str(e), field="--accept/--fault") from None
    try:
        res = simulate(cfg)
    except ImportError as e:
        raise SpecwatchInputError(None, f"sglang is not importable here ({e}); install "
                                  "requirements/sglang-cpu*.txt") from None
    d = res.as_dict()
    if as_json:
        print(json.dumps(d, default=str))
    else:
        _print_table("allocator simulation" + (f" with fault {fault}" if fault else ""), ["quantity", "value"],
                     [[k, v] for k, v in d.items() if k != "config"])
        for v in res.row_violations[:3]:
            console.print(f"[red]row violation[/red]: request {v.request} committed {v.committed_len} "
                          f"watermark {v.watermark} > row width {v.row_width}")
    raise typer.Exit(0 if res.clean else 1)


if __name__ == "__main__":  # pragma: no cover
    main()
