"""``specwatch changepoints``: steps in each case's metrics across SGLang releases (asv's step detector)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from specwatch.commands.options import CsvOut, StoredResults
from specwatch.commands.output import console, print_frame


def changepoints(
    results: StoredResults = Path("results"),
    metric: Optional[list[str]] = typer.Option(None, "--metric", help="Only this metric (repeatable)."),
    threshold: float = typer.Option(0.05, help="Smallest relative step reported."),
    csv: CsvOut = None,
) -> None:
    """Per machine, case and metric, the steps ``asv.step_detect`` finds over the SGLang releases
    (in version order; each release's latest clean record, every repeat a point), larger than THRESHOLD."""
    from specwatch.analysis.changepoints import COLUMNS
    from specwatch.analysis.changepoints import changepoints as find
    from specwatch.store.frame import files_frame
    from specwatch.store.jsonl import result_files

    t = find(files_frame(result_files(results), columns=COLUMNS), metric or None, threshold)
    if t.empty:
        console.print("no step: no case has a metric that moved between two measured releases")
        return
    print_frame(f"change points across SGLang releases ({len(t)} steps)", t)
    if csv:
        t.to_csv(csv, index=False)
