"""``specwatch run``: suites on a GPU host through ``sglang.Engine`` (with a progress bar), or the CPU
tier's tables where there is no GPU (or ``--cpu-tier``)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from specwatch.commands.options import (
    EngineStarts,
    Results,
    Twins,
    Where,
    check_gpu_ids,
    check_shard,
    fault_passes,
    load_suite_file,
)
from specwatch.commands.output import console, print_frame
from specwatch.core.errors import SpecwatchInputError
from specwatch.core.placement import ExecutorKind, TimingScope

SuiteFiles = Annotated[list[Path], typer.Argument(help="Suite file(s); on a GPU their engine groups share waves.")]
Resume = Annotated[bool, typer.Option(help="Skip cases already recorded ok or skipped.")]
ShardOpt = Annotated[Optional[str], typer.Option(callback=check_shard, help="Run engine groups I of N: 'I/N'.")]
Faults = Annotated[
    list[str],
    typer.Option(
        help="Fault to inject (specwatch inject); repeatable, 'none' = a clean "
        "run. Each fault's records go to SUITE+fault-NAME.jsonl. Several: each engine group's "
        "passes alternate start by start, in this order (not with --executor ray).",
    ),
]
ModelsDir = Annotated[Path, typer.Option(help="Where oracle checkpoints live.")]
CpuTier = Annotated[bool, typer.Option("--cpu-tier", help="Run the CPU tier even when a GPU is present.")]
CpuOut = Annotated[Path, typer.Option(help="CPU tier: where tables are written.")]
ContextLen = Annotated[int, typer.Option(min=1, help="CPU tier: model context length for the memory model.")]
Strict = Annotated[bool, typer.Option(help="CPU tier: exit 1 when a simulation finds a leak or row violation.")]
ParallelStarts = Annotated[
    int,
    typer.Option(
        min=1,
        help="GPU: start this many engines at once, time them one at a time (starts never overlap a timed batch).",
    ),
]
StopAfter = Annotated[
    Optional[float],
    typer.Option(
        help="GPU: start no new engine group or wave after this many seconds (finish the rest later with --resume).",
    ),
]
OverlapStarts = Annotated[
    bool,
    typer.Option(
        "--overlap-starts",
        help="GPU, with --parallel-starts K: no waves; "
        "K engine groups in flight, the next started as soon as one ends, so "
        "starts overlap other engines' timed batches (timed batches still "
        "never overlap each other). Cheaper sweeps, noisier timing: for "
        "memory and correctness sweeps; records say details.overlap_starts.",
    ),
]
TimingLockFile = Annotated[
    Optional[Path],
    typer.Option(
        help="GPU, with --overlap-starts: a lock file shared "
        "with other specwatch runs on this host (e.g. one per "
        "installed SGLang version), so no two timed batches of "
        "any of them overlap.",
    ),
]
Overlay = Annotated[
    Optional[Path],
    typer.Option(
        help="GPU: a commit overlay (specwatch overlay) to run instead of the installed SGLang's Python code."
    ),
]
GroupTimeout = Annotated[
    Optional[int],
    typer.Option(
        min=10,
        help="GPU: wall-clock limit per engine group "
        "(seconds; default: the suite's timeout_s). A group past it "
        "is recorded 'timeout' with its log tail.",
    ),
]
Bare = Annotated[
    bool,
    typer.Option(
        "--bare",
        help="GPU: run SGLang without specwatch's probe (records in "
        "SUITE+bare.jsonl): the baseline for harness overhead ('specwatch overhead').",
    ),
]
BaselineOpt = Annotated[
    bool,
    typer.Option(
        "--baseline",
        help="GPU: beside each engine start of a group (after it, before it on odd rounds), time its speculative cases in a plain "
        "sglang.Engine loop with no specwatch code in SGLang's processes (A B B A ...); records gain "
        "baseline_output_throughput and overhead (probed / baseline). Not with --bare, --fault, "
        "--parallel-starts or another --executor.",
    ),
]
PairedOpt = Annotated[
    bool,
    typer.Option(
        "--paired",
        help="GPU, with --baseline: keep the plain loop's engine up beside the probed one; with two --fault "
        "passes: both passes' engines up together. The two take turns batch by batch, so both are timed in "
        "the same seconds of the host's state.",
    ),
]
FloorsRoot = Annotated[
    Optional[Path],
    typer.Option(
        "--floors",
        exists=True,
        file_okay=False,
        help="GPU: the results root whose A/A pairs give the floors behind the 'noisy host:' line "
        "(default: --results), e.g. the committed results/ when --results is a scratch folder.",
    ),
]
KnownRoot = Annotated[
    Optional[Path],
    typer.Option(
        help="GPU: leave out cases that already have a record of any "
        "status under this results root for the same machine, SGLang "
        "version, suite and fault (e.g. the committed results/: known "
        "crashes are not re-run).",
    ),
]

ExecutorOpt = Annotated[
    ExecutorKind,
    typer.Option(
        "--executor",
        help="GPU: who runs the engine groups: 'local' (this host's GPUs as one pool), "
        "'gpus' (one GPU set per group, sized by its tp, inside one NVLink island), "
        "'ray' (one Ray task per group on a Ray cluster; pip install 'specwatch[ray]'). See docs/scale-out.md.",
    ),
]
GpuIds = Annotated[
    Optional[str],
    typer.Option(
        "--gpus",
        callback=check_gpu_ids,
        help="With --executor gpus: the GPUs to use, e.g. 0,1,2,3 (default: every GPU nvidia-smi -L lists).",
    ),
]
TimingScopeOpt = Annotated[
    TimingScope,
    typer.Option(
        "--timing-scope",
        help="With --executor gpus or ray: 'host' (no two timed batches on a host overlap, nor a "
        "timed batch and an engine start) or 'gpu' (timed batches exclude only their own GPU set's work).",
    ),
]
RayAddress = Annotated[
    Optional[str],
    typer.Option(
        "--address", help="With --executor ray: the Ray cluster to join (default: RAY_ADDRESS, or a local Ray)."
    ),
]


def run(
    suites: SuiteFiles,
    results: Results = Path("results"),
    resume: Resume = False,
    shard: ShardOpt = None,
    where: Where = [],
    twins: Twins = True,
    engine_starts: EngineStarts = None,
    fault: Faults = [],
    models_dir: ModelsDir = Path("/tmp/specwatch-models"),
    cpu_tier: CpuTier = False,
    out: CpuOut = Path("out/cpu-tier"),
    context_len: ContextLen = 4096,
    strict: Strict = False,
    parallel_starts: ParallelStarts = 1,
    stop_after: StopAfter = None,
    overlap_starts: OverlapStarts = False,
    timing_lock: TimingLockFile = None,
    overlay: Overlay = None,
    group_timeout: GroupTimeout = None,
    bare: Bare = False,
    baseline: BaselineOpt = False,
    paired: PairedOpt = False,
    known: KnownRoot = None,
    executor: ExecutorOpt = ExecutorKind.local,
    gpus: GpuIds = None,
    timing_scope: TimingScopeOpt = TimingScope.host,
    address: RayAddress = None,
    floors: FloorsRoot = None,
) -> None:
    """Run suites: on a GPU host through sglang.Engine; without a GPU, the CPU tier.
    \f
    Long because typer takes each of the command's options as a parameter of its own (the form
    feed above ends the help text there)."""
    from specwatch.run.options import RunOptions
    from specwatch.suite import parse_where

    if overlay is not None:
        use_overlay(overlay)
    loaded, flt = [load_suite_file(p, twins, engine_starts) for p in suites], parse_where(where)
    if cpu_tier or (executor is ExecutorKind.local and not _cuda_available()):
        bad = [cpu_tier_tables(s, flt, context_len, out, strict, announce=not cpu_tier) for s in loaded]
        raise typer.Exit(1 if any(bad) else 0)
    faults = fault_passes(fault)
    options = RunOptions(
        faults=faults,
        resume=resume,
        shard=check_gpu_options(shard, faults, bare, overlap_starts, parallel_starts, timing_lock),
        models_dir=models_dir,
        where=flt,
        parallel_starts=parallel_starts,
        stop_after_s=stop_after,
        group_timeout_s=group_timeout,
        bare=bare,
        baseline=baseline,
        paired=paired,
        known_root=known,
        overlap_starts=overlap_starts,
        timing_lock=timing_lock,
        executor=executor,
        gpu_ids=tuple(g.strip() for g in gpus.split(",")) if gpus else None,
        timing_scope=timing_scope,
        ray_address=address,
    )
    check_executor_options(options)
    for path in dict.fromkeys(run_with_progress(loaded, results, options, floors)):
        console.print(f"results in {path}")


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def use_overlay(path: Path) -> None:
    """Put a commit overlay's SGLang first on this process's (and so the workers') PYTHONPATH."""
    from specwatch.inject.overlay import load as load_overlay

    ov = load_overlay(path)
    os.environ.update(ov.env(os.environ.get("PYTHONPATH", "")))
    console.print(f"overlay: SGLang {ov.commit[:12]} from {ov.root}, recorded as {ov.recorded_version}")


def check_gpu_options(shard, faults, bare: bool, overlap_starts: bool, parallel_starts: int, timing_lock):
    """The GPU run's options checked together (``--bare`` without a fault, ``--overlap-starts`` with
    its partners; the faults are known: ``options.fault_passes``), one line on bad input; returns the
    parsed ``--shard``."""
    from specwatch.run.runner import Shard, check_bare, check_overlap

    try:
        sh = Shard.parse(shard) if shard else None
        check_bare(faults, bare)
        check_overlap(overlap_starts, parallel_starts, timing_lock)
    except ValueError as e:
        raise SpecwatchInputError(None, str(e)) from None
    return sh


def check_executor_options(options) -> None:
    """``--executor`` and ``--baseline`` with their partners (``runner.check_executor``,
    ``baseline.check_baseline``): one line on bad input."""
    from specwatch.run.baseline import check_baseline
    from specwatch.run.runner import check_executor

    try:
        check_executor(options)
        check_baseline(options)
    except ValueError as e:
        raise SpecwatchInputError(None, str(e)) from None


def run_with_progress(loaded: list, results: Path, options, floors: Optional[Path] = None) -> list[Path]:
    """``run_suites`` under a progress bar, a line per record as it lands (and one more where its
    decode windows spread wider than the A/A runs behind its class's floor under ``floors``, else
    ``results``: ``pair_noise``); returns the results files."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from specwatch.analysis.pair_noise import store_noise_check
    from specwatch.run.runner import run_suites
    from specwatch.suite import selected

    flt = options.where
    noise_check = store_noise_check(floors or results, [s.name for s in loaded])
    total = len(options.faults) * sum(1 for s in loaded for p in selected(s.plan(), flt or {}) if not p.duplicate)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task(" + ".join(s.name for s in loaded), total=total)

        def progress(rec):
            bar.console.print(
                f"{rec.status.value:8s} {rec.case_id} {rec.suite} {rec.case.label()}"
                + (f" [{rec.provenance.fault}]" if rec.provenance.fault else "")
                + (f" — {rec.reason[:160]}" if rec.reason else ""),
                highlight=False,
                markup=False,  # "[slow-verify-0us]" is no style tag
            )
            if noisy := noise_check(rec):  # the host against the A/A runs behind the floor
                bar.console.print(f"  {noisy}", highlight=False, markup=False)
            bar.advance(task)

        def start_progress(rec, n: int, planned: int):
            bar.console.print(
                f"start {n}/{planned} {rec.case_id} {rec.suite} {rec.case.label()}"
                + (f" [{rec.provenance.fault}]" if rec.provenance.fault else ""),
                highlight=False,
                markup=False,
            )

        return run_suites(
            loaded, results, dataclasses.replace(options, progress=progress, start_progress=start_progress)
        )


def cpu_tier_tables(s, flt, context_len: int, out: Path, strict: bool, announce: bool) -> bool:
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
