"""The ``specwatch`` command line: parse options, call the layer below, print.

Bad input anywhere below raises ``SpecwatchInputError``; ``main`` (the console script) prints it as
one line and exits 2, as it does for an OSError and for typer's own usage errors.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from specwatch.commands import noise, store
from specwatch.commands.model import model_app
from specwatch.commands.options import Results, Where, check_shard, load_suite_file
from specwatch.commands.output import (
    console,
    err_console,
    print_frame,
    print_table,
    width_for,
)
from specwatch.core.errors import SpecwatchInputError

try:  # typer vendors its own click; click's exception classes are not its
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
except ImportError:  # pragma: no cover (typer on the click package)
    from click.exceptions import ClickException, NoArgsIsHelpError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Benchmark and regression tracking for SGLang speculative decoding.",
)


_load = load_suite_file


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
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print specwatch's and the installed SGLang's versions."
        ),
    ] = False,
) -> None:
    """Benchmark and regression tracking for SGLang speculative decoding."""
    console.width, err_console.width = width_for(), width_for(stderr=True)  # as the invocation's environment says


# -- commands --------------------------------------------------------------------------------------


@app.command()
def plan(
    suite: Path = typer.Argument(..., help="Suite file (suites/*.toml)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines instead of a table."),
    where: Where = [],
    known: Optional[Path] = typer.Option(
        None,
        exists=True,
        file_okay=False,
        help="Leave out cases recorded under this results root for "
        "--machine and --sglang-version (as run --known does) and estimate "
        "the device time of the rest from that machine's runs.ndjson.",
    ),
    machine: Optional[str] = typer.Option(None, help="With --known: the machine label, e.g. nvidia-h200-x1."),
    sglang_version: Optional[str] = typer.Option(None, help="With --known: the SGLang version, e.g. 0.5.17."),
) -> None:
    """List the cases a suite expands to, with skipped ones and why; with --where / --known, only
    what a run would still do, its engine groups and, from the machine's past runs, its device time."""
    from specwatch.suite import matches, parse_where

    s = _load(suite)
    flt = parse_where(where)
    if known is not None and not (machine and sglang_version):
        raise SpecwatchInputError(
            None, "--known needs --machine and --sglang-version (where the run will happen)", field="--known"
        )
    planned = [p for p in s.plan() if not flt or matches(p.case, flt)]
    if flt and not planned:
        raise SpecwatchInputError(suite, f"no case matches --where {' '.join(where)}", field="--where")
    if known is not None:
        from specwatch.run.estimate import estimate

        est = estimate(s.name, planned, known, machine, sglang_version)
        console.print(
            f"{s.name}: {est.known} case(s) already recorded for {machine} / SGLang {sglang_version}; "
            f"{len(est.left)} left in {est.groups} engine group(s)"
        )
        if est.device_minutes is not None:
            console.print(
                f"≈ {est.device_minutes:.0f} device minutes at the recorded pace (median "
                f"{est.per_group_s:.0f} s of wall time per engine group over {est.runs} run(s) on "
                f"{machine}; first-use compiles on a fresh host come on top)"
            )
        planned = est.left
    if as_json:
        for p in planned:
            print(json.dumps({"case_id": p.case.case_id, "skip": p.skip, "duplicate": p.duplicate, **p.case.params()}))
        return
    reasons = list(dict.fromkeys(p.skip for p in planned if p.skip))  # listed once, under the table
    headers = [
        "case id",
        "model",
        "algo",
        "backend",
        "page",
        "topk",
        "steps",
        "draft",
        "tp",
        "dcp",
        "bs",
        "in->out",
        "profile",
        "workload",
        "status",
    ]
    rows = [
        [
            c.case_id,
            c.model.value,
            c.algorithm.value,
            c.attention_backend.value,
            c.page_size,
            c.topk,
            c.num_steps,
            c.num_draft_tokens,
            c.tp,
            c.dcp,
            c.batch_size,
            f"{c.input_len}->{c.output_len}",
            c.profile.value,
            c.workload.value,
            Text("run") if p.skip is None else Text(f"skip #{reasons.index(p.skip) + 1}", "yellow"),
        ]
        for p in planned
        for c in [p.case]
    ]
    # a parameter every case shares is said once, under the table
    same = [i for i in range(1, len(headers) - 1) if len(rows) > 1 and len({str(r[i]) for r in rows}) == 1]
    print_table(
        f"{s.name}: {len(planned)} cases ({sum(p.skip is None for p in planned)} runnable)",
        [h for i, h in enumerate(headers) if i not in same],
        [[v for i, v in enumerate(r) if i not in same] for r in rows],
    )
    if same:
        console.print("every case: " + ", ".join(f"{headers[i]} {rows[0][i]}" for i in same), highlight=False)
    for i, why in enumerate(reasons, 1):
        console.print(f"skip #{i}: {why}", highlight=False)
    for said in dict.fromkeys(a for p in planned for a in p.adjusted):  # SGLang's words for what it overrides
        console.print(f"SGLang: {said}", highlight=False)


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@app.command()
def run(
    suites: list[Path] = typer.Argument(..., help="Suite file(s); on a GPU their engine groups share waves."),
    results: Results = Path("results"),
    resume: bool = typer.Option(False, help="Skip cases already recorded ok or skipped."),
    shard: Optional[str] = typer.Option(None, callback=check_shard, help="Run engine groups I of N: 'I/N'."),
    where: Where = [],
    fault: list[str] = typer.Option(
        [],
        help="Fault to inject (specwatch inject); repeatable, 'none' = a clean "
        "run. Each fault's records go to SUITE+fault-NAME.jsonl.",
    ),
    models_dir: Path = typer.Option(Path("/tmp/specwatch-models"), help="Where oracle checkpoints live."),
    cpu_tier: bool = typer.Option(False, "--cpu-tier", help="Run the CPU tier even when a GPU is present."),
    out: Path = typer.Option(Path("out/cpu-tier"), help="CPU tier: where tables are written."),
    context_len: int = typer.Option(4096, min=1, help="CPU tier: model context length for the memory model."),
    strict: bool = typer.Option(False, help="CPU tier: exit 1 when a simulation finds a leak or row violation."),
    parallel_starts: int = typer.Option(
        1,
        min=1,
        help="GPU: start this many engines at once, time them one at a time (starts never overlap a timed batch).",
    ),
    stop_after: Optional[float] = typer.Option(
        None,
        help="GPU: start no new engine group or wave after this many seconds (finish the rest later with --resume).",
    ),
    overlap_starts: bool = typer.Option(
        False,
        "--overlap-starts",
        help="GPU, with --parallel-starts K: no waves; "
        "K engine groups in flight, the next started as soon as one ends, so "
        "starts overlap other engines' timed batches (timed batches still "
        "never overlap each other). Cheaper sweeps, noisier timing: for "
        "memory and correctness sweeps; records say details.overlap_starts.",
    ),
    timing_lock: Optional[Path] = typer.Option(
        None,
        help="GPU, with --overlap-starts: a lock file shared "
        "with other specwatch runs on this host (e.g. one per "
        "installed SGLang version), so no two timed batches of "
        "any of them overlap.",
    ),
    overlay: Optional[Path] = typer.Option(
        None, help="GPU: a commit overlay (specwatch overlay) to run instead of the installed SGLang's Python code."
    ),
    group_timeout: Optional[int] = typer.Option(
        None,
        min=10,
        help="GPU: wall-clock limit per engine group "
        "(seconds; default: the suite's timeout_s). A group past it "
        "is recorded 'timeout' with its log tail.",
    ),
    bare: bool = typer.Option(
        False,
        "--bare",
        help="GPU: run SGLang without specwatch's probe (records in "
        "SUITE+bare.jsonl): the baseline for harness overhead ('specwatch overhead').",
    ),
    known: Optional[Path] = typer.Option(
        None,
        help="GPU: leave out cases that already have a record of any "
        "status under this results root for the same machine, SGLang "
        "version, suite and fault (e.g. the committed results/: known "
        "crashes are not re-run).",
    ),
) -> None:
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
        raise SpecwatchInputError(None, str(e)) from None
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from specwatch.suite import matches

    total = len(faults) * sum(
        1 for s in loaded for p in s.plan() if not p.duplicate and (not flt or matches(p.case, flt))
    )
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task(" + ".join(s.name for s in loaded), total=total)

        def progress(rec):
            bar.console.print(
                f"{rec.status.value:8s} {rec.case_id} {rec.suite} {rec.case.label()}"
                + (f" [{rec.provenance.fault}]" if rec.provenance.fault else "")
                + (f" — {rec.reason[:160]}" if rec.reason else ""),
                highlight=False,
            )
            bar.advance(task)

        paths = run_suites(
            loaded,
            results,
            RunOptions(
                faults=faults,
                resume=resume,
                shard=sh,
                models_dir=models_dir,
                progress=progress,
                where=flt,
                parallel_starts=parallel_starts,
                stop_after_s=stop_after,
                group_timeout_s=group_timeout,
                bare=bare,
                known_root=known,
                overlap_starts=overlap_starts,
                timing_lock=timing_lock,
            ),
        )
    for path in dict.fromkeys(paths):
        console.print(f"results in {path}")


def _cpu_tier(s, flt, context_len: int, out: Path, strict: bool, announce: bool) -> bool:
    """Run the CPU tier on one suite and print its tables; True when it should fail the command."""
    from specwatch.cpu.cpu_tier import run_cpu_tier

    console.print(f"[bold]no GPU: CPU tier on {s.path}[/bold]" if announce else f"[bold]CPU tier on {s.path}[/bold]")
    report = run_cpu_tier(s, context_len=context_len, where=flt)
    print_frame(
        "memory model (specwatch formulas; sglang_agrees compares with SGLang's functions)",
        report.memory.drop(columns=["label"]),
    )
    if report.simulation is not None:
        print_frame("allocator simulation (SGLang's pools on CPU)", report.simulation)
    else:
        console.print("[yellow]sglang not importable: allocator simulation skipped[/yellow]")
    for p in report.write(out / s.name):
        console.print(f"wrote {p}")
    disagree = bool(report.memory["sglang_agrees"].eq(False).any())
    unclean = 0 if report.simulation is None else int((~report.simulation["clean"]).sum())
    if disagree:
        console.print("[red]specwatch's memory model and SGLang's functions disagree (see table)[/red]")
    if unclean:
        console.print(
            f"[yellow]{unclean} of {len(report.simulation)} allocator simulations not clean "
            "(leak, double free or row violation): see the simulation table[/yellow]"
        )
    return disagree or (strict and bool(unclean))


@app.command("overlay")
def overlay_cmd(
    repo: Path = typer.Argument(..., help="A local git repository of SGLang."),
    rev: str = typer.Argument(..., help="Commit, tag or branch to export."),
    out: Path = typer.Option(Path(".overlay"), help="Where overlays are written (git-ignored)."),
    force: bool = typer.Option(False, help="Allow a commit of another release line than the installed SGLang."),
) -> None:
    """Export SGLang's python/sglang at REV as a commit overlay for `specwatch run --overlay`."""
    from specwatch.core.sglang_host import sglang_version
    from specwatch.inject.overlay import build

    ov = build(repo, rev, out, sglang_version(), force=force)
    console.print(
        f"overlay {ov.root}: commit {ov.commit}, code version {ov.code_version}, recorded as {ov.recorded_version}"
    )


@app.command("import")
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


@app.command()
def inject(name: Optional[str] = typer.Argument(None, help="Fault to check against the installed SGLang.")) -> None:
    """List the injectable faults; with NAME, apply and restore it here to check it fits this SGLang.
    Use ``specwatch run SUITE --fault NAME`` to run a sweep with the fault active in SGLang's processes."""
    from specwatch.inject import faults

    if name is None:
        print_table(
            "faults (specwatch run SUITE --fault NAME)",
            ["name", "re-creates", "expected to be flagged by"],
            [[f.name, f.recreates, f.expected_flag] for f in faults.FAULTS.values()],
        )
        return
    try:
        with faults.applied(name):
            pass
    except ImportError as e:
        raise SpecwatchInputError(
            None, f"sglang is not importable here ({e}): a fault is checked against the installed SGLang", field=name
        ) from None
    except ValueError as e:
        raise SpecwatchInputError(None, str(e), field=name) from None
    console.print(f"{name}: applies to the installed SGLang and restores cleanly")


# the commands of their own modules, listed after these in --help
for name, command in (
    ("compare", noise.compare),
    ("noise", noise.noise),
    ("noise-holdout", noise.noise_holdout),
    ("dashboard", store.dashboard),
    ("overhead", store.overhead),
    ("asv-import", store.asv_import_cmd),
    ("results", store.results_cmd),
    ("roofline", store.roofline_cmd),
):
    app.command(name)(command)
app.add_typer(model_app, name="model")


if __name__ == "__main__":  # pragma: no cover
    main()
