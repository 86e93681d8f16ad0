"""Options several ``specwatch`` commands share, their checks, and the loaders behind them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from specwatch.core.errors import SpecwatchInputError


def check_where(terms: list[str]) -> list[str]:
    """``--where``: known fields, and values the field can take (an int field's ``abc`` would match
    no case and pass silently)."""

    from specwatch.suite import parse_where

    try:
        parse_where(terms)  # a value no case can take is refused there, naming the term
    except SpecwatchInputError as e:
        raise typer.BadParameter(f"{e.field}: {e.message}") from None
    return terms


def check_shard(text: Optional[str]) -> Optional[str]:
    from specwatch.run.runner import Shard

    if text is not None:
        try:
            Shard.parse(text)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    return text


def check_gpu_ids(text: Optional[str]) -> Optional[str]:
    """``--gpus``: GPU indexes, comma-separated (``0,1,2,3``); whether the host has them is checked
    when the GPUs are discovered (``run.executors.topology``)."""
    if text is not None and not all(g.strip().isdigit() for g in text.split(",")):
        raise typer.BadParameter(f"{text!r}: give GPU indexes, comma-separated (e.g. 0,1,2,3)")
    return text


Where = Annotated[
    list[str],
    typer.Option(
        "--where", callback=check_where, help="Only cases with FIELD=V1[,V2] (repeatable), e.g. page_size=64,256."
    ),
]
Twins = Annotated[
    bool,
    typer.Option(
        "--twins/--no-twins",
        help="With [suite] speedup: plan each timing case's plain-decoding twin. --no-twins leaves "
        "them out (spec records then carry no speedup), e.g. to repeat spec cases whose twins are measured.",
    ),
]
EngineStarts = Annotated[
    Optional[int],
    typer.Option(
        min=1,
        max=50,
        help="GPU: fresh engines per case (rounds), in place of the suites' [suite] engine_starts, e.g. "
        "the rounds 'specwatch overhead' says a case needs to resolve.",
    ),
]
Results = Annotated[Path, typer.Option("--results", help="Results root directory.")]
StoredResults = Annotated[Path, typer.Option("--results", exists=True, file_okay=False, help="Results root.")]
ResultsArg = Annotated[Path, typer.Argument(exists=True, file_okay=False, help="Results root.")]
Threshold = Annotated[float, typer.Option(help="Relative change a timed metric must exceed (default threshold).")]
Alpha = Annotated[float, typer.Option(help="Mann-Whitney U p-value a timed change must reach.")]
BudgetsOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--budgets",
        exists=True,
        dir_okay=False,
        help="Noise budgets "
        "JSON (specwatch noise): per model/batch-size class and metric, "
        "the change a timed metric must exceed.",
    ),
]
Output = Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the output file here.")]
Positive = Annotated[int, typer.Option(min=1)]


def bounded(hi: int) -> object:
    """An integer option from 1 to ``hi`` (the suite axes' bounds: ``suite.AXIS_BOUNDS``)."""
    return Annotated[int, typer.Option(min=1, max=hi)]


def check_output_folder(path: Optional[Path]) -> Optional[Path]:
    """An output file's folder must exist: one line naming the file, not pandas' message about its folder."""
    if path is not None and not path.parent.is_dir():
        raise typer.BadParameter(f"{path}: its folder {path.parent} does not exist")
    return path


CsvOut = Annotated[Optional[Path], typer.Option(callback=check_output_folder, help="Also write the table as CSV.")]


def load_suite_file(path: Path, twins: bool = True, engine_starts: Optional[int] = None):
    """The suite at ``path``; without its plain-decoding twins when ``twins`` is False, on
    ``engine_starts`` fresh engines per case where given (else its ``[suite] engine_starts``)."""
    from specwatch.suite import load_suite

    header = {} if twins else {"speedup": False}
    if engine_starts is not None:
        header["engine_starts"] = engine_starts
    s = load_suite(path)
    return s.with_header(**header) if header else s


def selections(base: str, head: str, results: Path):
    from specwatch.store.select import select

    b, h = select(base, results), select(head, results)
    if not b or not h:
        raise SpecwatchInputError(None, f"empty selection: base has {len(b)} records, head {len(h)}")
    return b, h


def budget_values(path: Optional[Path]) -> Optional[dict]:
    from specwatch.analysis.noise import BudgetFile

    return None if path is None else BudgetFile.load(path).budgets


def fault_passes(names: list[str]) -> tuple[Optional[str], ...]:
    """The passes ``--fault`` names, in order (``none``: None, the clean pass; none named: one clean
    pass), each a known fault: one line naming an unknown one otherwise."""
    from specwatch.inject.faults import get as get_fault

    for name in names:
        if name != "none":
            try:
                get_fault(name)
            except ValueError as e:
                raise SpecwatchInputError(None, str(e), field="--fault") from None
    return tuple(None if name == "none" else name for name in names) or (None,)
