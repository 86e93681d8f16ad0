"""``specwatch plan``: the cases a suite expands to, with the skipped ones and why; with ``--where`` /
``--known``, only what a run would still do, and its device time from the machine's past runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.text import Text

from specwatch.commands.options import EngineStarts, Twins, Where, fault_passes, load_suite_file
from specwatch.commands.output import console, print_table
from specwatch.core.errors import SpecwatchInputError
from specwatch.core.placement import TimingScope

HEADERS = [
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
"""The plan table's columns: the case id, the case's parameters, and whether it runs or is skipped."""


def plan(
    suite: Path = typer.Argument(..., help="Suite file (suites/*.toml)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines instead of a table."),
    where: Where = [],
    twins: Twins = True,
    engine_starts: EngineStarts = None,
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
    hosts: Optional[int] = typer.Option(
        None,
        min=1,
        help="Estimate the sweep's wall time on this many hosts of --gpus-per-host GPUs: the recorded "
        "engine starts and case times (of --pace, else --known, for --machine / --sglang-version) "
        "list-scheduled over the GPUs (docs/scale-out.md).",
    ),
    gpus_per_host: int = typer.Option(1, min=1, help="With --hosts: GPUs per host (one NVLink island)."),
    parallel_starts: int = typer.Option(1, min=1, help="With --hosts: engine groups one GPU holds at once."),
    timing_scope: TimingScope = typer.Option(
        TimingScope.host, help="With --hosts: the run's --timing-scope (host: timed cases one at a time per host)."
    ),
    pace: Optional[Path] = typer.Option(
        None, exists=True, file_okay=False, help="With --hosts: the results root whose records give the times."
    ),
    fault: list[str] = typer.Option(
        [], help="With --known: a pass of the run, as run --fault names it (repeatable): each priced, then summed."
    ),
) -> None:
    """List the cases a suite expands to, with skipped ones and why; with --where / --known, only
    what a run would still do, its engine groups and, from the machine's past runs, its device time."""
    from specwatch.suite import parse_where, selected

    s = load_suite_file(suite, twins, engine_starts)
    flt = parse_where(where)
    if known is not None and not (machine and sglang_version):
        raise SpecwatchInputError(
            None, "--known needs --machine and --sglang-version (where the run will happen)", field="--known"
        )
    planned = selected(s.plan(), flt)
    if flt and not planned:
        raise SpecwatchInputError(suite, f"no case matches --where {' '.join(where)}", field="--where")
    passes = check_faults(fault, known)
    if known is not None:
        planned = still_to_run(s.name, planned, known, machine, sglang_version, s.spec.suite.engine_starts, passes)
    if as_json:
        for p in planned:
            print(json.dumps({"case_id": p.case.case_id, "skip": p.skip, "duplicate": p.duplicate, **p.case.params()}))
        return
    print_plan(s.name, planned)
    if hosts is not None:
        lanes = (gpus_per_host, parallel_starts, timing_scope)
        print_wall(s.name, planned, pace or known, machine, sglang_version, hosts, lanes)


def check_faults(faults: list[str], known: Optional[Path]) -> tuple[Optional[str], ...]:
    """The passes ``--fault`` names (``options.fault_passes``), only with ``--known``."""
    if faults and known is None:
        raise SpecwatchInputError(None, "prices a run's passes from recorded ones: give --known too", field="--fault")
    return fault_passes(faults)


def still_to_run(
    name: str,
    planned: list,
    known: Path,
    machine: str,
    sglang_version: str,
    engine_starts: int = 1,
    faults: tuple = (None,),
) -> list:
    """The planned cases some pass (``faults``, None the clean one) has not yet recorded under
    ``known`` for the machine and SGLang version, after printing, per pass, how many are left, in
    how many engine groups and, at the recorded pace, in how long, and with several passes their total."""
    from specwatch.run.estimate import estimate

    left_ids: set = set()
    minutes, idle = [], 0
    for fault in faults:
        est = estimate(name, planned, known, machine, sglang_version, engine_starts, fault)
        left_ids |= {p.case.case_id for p in est.left}
        idle += est.groups == 0
        starts = f", each on {engine_starts} fresh engines" if engine_starts > 1 else ""
        label = name if len(faults) == 1 else f"{name}, pass {fault or 'none'}"
        console.print(
            f"{label}: {est.known} case(s) already recorded for {machine} / SGLang {sglang_version}; "
            f"{len(est.left)} left in {est.groups} engine group(s){starts}",
            highlight=False,
        )
        if est.device_minutes is None:
            continue
        minutes.append(est.device_minutes)
        if est.suite_spans_s is not None:
            console.print(
                f"≈ {est.device_minutes:.0f} device minutes at {name}'s own recorded pace (its recorded "
                f"engine groups on {machine}, by model; first-use compiles on a fresh host come on top)"
            )
        else:
            console.print(
                f"≈ {est.device_minutes:.0f} device minutes at the recorded pace (median "
                f"{est.per_group_s:.0f} s of wall time per engine group over {est.runs} run(s) on "
                f"{machine}; first-use compiles on a fresh host come on top)"
            )
    if len(faults) > 1 and minutes:
        unpriced = len(faults) - idle - len(minutes)
        console.print(
            f"≈ {sum(minutes):.0f} device minutes for the {len(faults)} passes together"
            + (f" ({unpriced} pass(es) without a recorded pace not counted)" if unpriced else ""),
            highlight=False,
        )
    return [p for p in planned if p.case.case_id in left_ids]


def print_wall(name: str, planned: list, root, machine, sglang_version, hosts: int, shape: tuple) -> None:
    """Print the wall time of ``planned`` on ``hosts`` hosts of ``shape`` = (GPUs, groups per GPU,
    timing scope) at the pace recorded under ``root``."""
    from specwatch.run.estimate import wall_estimate

    if root is None or not (machine and sglang_version):
        raise SpecwatchInputError(
            None, "--hosts needs --pace (or --known), --machine and --sglang-version (whose times)", field="--hosts"
        )
    gpus, lanes, scope = shape
    est = wall_estimate(name, planned, root, machine, sglang_version, hosts, gpus, lanes, scope)
    how = ", ".join(f"{k} {v}" for k, v in sorted(est.priced.items()))
    console.print(
        f"{name}: {est.groups} engine group(s) on {hosts} host(s) x {gpus} GPU(s)"
        + (f", {lanes} groups per GPU" if lanes > 1 else "")
        + f", timing scope {scope.value}: ≈ {est.wall_s:.0f} s of wall time ({est.serial_s:.0f} s one group at a time on one GPU); "
        f"priced from {machine} / SGLang {sglang_version} records ({how})",
        highlight=False,
    )


def print_plan(name: str, planned: list) -> None:
    """The plan as a table: a parameter every case shares and each skip reason are said once, under it."""
    reasons = list(dict.fromkeys(p.skip for p in planned if p.skip))
    rows = [
        plan_row(p.case, Text("run") if p.skip is None else Text(f"skip #{reasons.index(p.skip) + 1}", "yellow"))
        for p in planned
    ]
    same = [i for i in range(1, len(HEADERS) - 1) if len(rows) > 1 and len({str(r[i]) for r in rows}) == 1]
    print_table(
        f"{name}: {len(planned)} cases ({sum(p.skip is None for p in planned)} runnable)",
        [h for i, h in enumerate(HEADERS) if i not in same],
        [[v for i, v in enumerate(r) if i not in same] for r in rows],
    )
    if same:
        console.print("every case: " + ", ".join(f"{HEADERS[i]} {rows[0][i]}" for i in same), highlight=False)
    for i, why in enumerate(reasons, 1):
        console.print(f"skip #{i}: {why}", highlight=False)
    for said in dict.fromkeys(a for p in planned for a in p.adjusted):  # SGLang's words for what it overrides
        console.print(f"SGLang: {said}", highlight=False)


def plan_row(c, status: Text) -> list:
    """One case's row of the plan table (``HEADERS``)."""
    return [
        c.case_id,
        c.model_label,  # an own model by its name
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
        status,
    ]
