"""``specwatch compare``, ``noise`` and ``noise-holdout``: reports under noise budgets and the A/A pairs behind them."""

from __future__ import annotations

from pathlib import Path

import typer

from specwatch.commands.options import (
    Alpha,
    BudgetsOpt,
    Output,
    Results,
    Threshold,
    budget_values,
    selections,
)
from specwatch.commands.output import console, print_frame
from specwatch.core.errors import SpecwatchInputError


def compare(
    base: str = typer.Argument(..., help="Base selection: results file/folder or FIELD=VALUE[,...]."),
    head: str = typer.Argument(..., help="Head selection, same forms."),
    results: Results = Path("results"),
    threshold: float = typer.Option(
        0.05, help="Relative change a timed metric must exceed in a class no A/A pair or budget measured."
    ),
    alpha: Alpha = 0.1,
    output: Output = None,
    all_rows: bool = typer.Option(False, "--all", help="Also list unchanged metrics."),
    budgets: BudgetsOpt = None,
) -> None:
    """Markdown report of HEAD vs BASE, opening with the detection floor of its timed metrics (from the
    A/A pairs of --budgets, else RESULTS/noise-budgets-SUITE.json where both name that suite and it
    exists, else RESULTS/noise-budgets.json) and a noise check: timed metrics whose windows spread
    over twice as wide as in those A/A runs are named, with the change that could hide at that
    noise; exit code 1 when anything regressed or now fails.
    Without --budgets a timed change must exceed that floor to be called (``compare_budgets``), so
    the report calls exactly what its header says it can."""
    from dataclasses import replace

    from specwatch.analysis.compare import compare_frames, compared_sides
    from specwatch.analysis.compare_report import has_regression, markdown
    from specwatch.analysis.floor import budget_file_for, compare_budgets, file_threshold, store_floor
    from specwatch.analysis.host_state import COLUMN as SLOW_COLUMN
    from specwatch.analysis.host_state import host_state_lines, side_shares
    from specwatch.analysis.pair_noise import mark_noisier, noise_lines
    from specwatch.analysis.planted import planted_lines, side_fault
    from specwatch.store.select_frame import SELECT_COLUMNS

    source = budgets or budget_file_for(results, (base, head))
    # floors measured at the file's own threshold; a class its pairs never measured: compare's
    measured = store_floor(results, source, file_threshold(source, threshold), alpha)
    floor = replace(measured, threshold=threshold, spread_min=measured.least_scaled)
    applied = budget_values(budgets) if budgets else compare_budgets(floor)
    # each side read once: the rows compared, their slow-step shares and fault for the header
    sides = compared_sides(base, head, results, columns=[*SELECT_COLUMNS, SLOW_COLUMN])
    rows = compare_frames(*sides, threshold=threshold, alpha=alpha, budgets=applied)
    mark_noisier(rows, floor)
    spreads: dict[str, float] = {}  # the widest window spread of the report's rows per class and metric
    for r in rows:
        if r.timed and r.spread is not None:
            key = f"{r.noise_class}/{r.metric}"
            spreads[key] = max(spreads.get(key, 0.0), r.spread)
    header = floor.header((f"{r.noise_class}/{r.metric}" for r in rows if r.timed), spreads) + noise_lines(rows, floor)
    header += host_state_lines(*(side_shares(df) for df in sides))
    header += planted_lines(rows, floor, *(side_fault(df) for df in sides))
    text = markdown(rows, base, head, show_unchanged=all_rows, header=header)
    if output:
        output.write_text(text)
    print(text)
    raise typer.Exit(1 if has_regression(rows) else 0)


def noise(
    base: str = typer.Argument(..., help="First run of an A/A pair (same SGLang): selection."),
    head: str = typer.Argument(..., help="Second run: selection."),
    results: Results = Path("results"),
    threshold: Threshold = 0.05,
    alpha: Alpha = 0.1,
    margin: float = typer.Option(1.5, help="Budget = margin x the largest A/A change seen."),
    output: Output = None,
    budgets: BudgetsOpt = None,
    merge: bool = typer.Option(
        False,
        "--merge",
        help="With --output naming an existing budget file: keep its "
        "pairs and budgets, take per class/metric the larger of old and new.",
    ),
) -> None:
    """A/A comparison: the false-positive rate of `compare` on two runs of the same version, and
    per-class noise budgets derived from their spread (use with `compare --budgets`); --budgets also
    reports the rate under budgets from another A/A pair (a held-out check)."""
    from specwatch.analysis.compare import compare_records
    from specwatch.analysis.noise import (
        BudgetFile,
        aa_differences,
        aa_pair,
        noise_report,
        spread_table,
    )

    b, h = selections(base, head, results)
    for line in aa_differences(b, h):
        console.print(f"[yellow]not a clean A/A: {line}[/yellow]")
    rep = noise_report(compare_records(b, h, threshold=threshold, alpha=alpha))
    console.print(
        f"A/A: {rep.flagged} of {rep.timed} timed metrics flagged at threshold {threshold:.0%}, "
        f"alpha {alpha}: false-positive rate {rep.false_positive_rate:.1%}"
    )
    if budgets:
        held = noise_report(compare_records(b, h, threshold=threshold, alpha=alpha, budgets=budget_values(budgets)))
        console.print(
            f"A/A under the budgets in {budgets}: {held.flagged} of {held.timed} flagged: "
            f"false-positive rate {held.false_positive_rate:.1%}"
        )
    print_frame("largest A/A change per noise class and metric", spread_table(rep))
    if output:
        pair, new = aa_pair(base, head, b, h, rep, margin), rep.budgets(margin, threshold)
        f = (
            BudgetFile.load(output).merged(pair, new, threshold)
            if merge and output.exists()
            else BudgetFile(pairs=[pair], budgets=new, threshold=threshold)
        )
        f.save(output)
        console.print(f"wrote {output} ({len(f.pairs)} A/A pair(s), {len(f.budgets)} budgets)")


def noise_holdout(
    budget_file: Path = typer.Argument(
        Path("results/noise-budgets.json"), help="Budget file whose A/A pairs to check (specwatch noise -o)."
    ),
    results: Results = Path("results"),
    threshold: Threshold = 0.05,
    alpha: Alpha = 0.1,
    output: Output = None,
) -> None:
    """Held-out false-positive rate of `compare --budgets`: each A/A pair of a budget file judged
    under the budgets of the other pairs only (leave one out), at the pairs' own margin."""
    from specwatch.analysis.noise import BudgetFile, holdout_report

    f = BudgetFile.load(budget_file)
    if len(f.pairs) < 2:
        raise SpecwatchInputError(budget_file, "a held-out check needs two or more A/A pairs", field="pairs")
    rep = holdout_report(f, [selections(*p.selections(), results) for p in f.pairs], threshold, alpha)
    print_frame("A/A pairs, each under the other pairs' noise budgets", rep.pairs)
    console.print(rep.summary)
    print_frame("smallest change called a regression (the budgets of all pairs)", rep.price)
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(rep.markdown(budget_file, threshold))
        console.print(f"wrote {output}")
