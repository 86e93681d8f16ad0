"""The harness's cost: probed runs against bare runs (``specwatch run --bare``) of the same cases,
and against the plain loop of ``specwatch run --baseline``, its rounds pooled over every run of a
case (``baseline_overhead_table``)."""

from __future__ import annotations

import statistics
from types import SimpleNamespace
from typing import Optional

import pandas as pd

from specwatch.store.baseline import (
    MAX_ROUNDS_SHOWN,
    OVERHEAD_TARGET,
    OverheadVerdict,
    RoundsKind,
    relative_spread,
    rounds_interval,
    rounds_to_resolve,
)
from specwatch.store.repeat_spread import SPREAD_ROUNDS, spread_rounds_text
from specwatch.store.step_state import LOOPS, shares_column, shares_text

OVERHEAD_BUDGET = 0.02
"""Harness overhead allowed: specwatch's tokens/s within 2% of a bare run's."""


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
    return overhead_rows(overhead_reads(df, metric), metric)


def overhead_reads(df: pd.DataFrame, metric: str = "output_throughput") -> Optional[pd.DataFrame]:
    """All ``overhead_table`` reads of a records frame: the ok clean runs of the cases with both a
    probed and a bare run, cut to the columns a row reads; None: no bare run."""
    if df.empty or "probe" not in df or not (df.probe == False).any():  # noqa: E712
        return None
    used = ["machine", "sglang_version", "case_id", "probe", metric, "probe_time_per_batch", "step_time", "suite"]
    used += ["model", "algorithm", "attention_backend", "page_size", "topk", "batch_size"]
    keep = (df.status == "ok") & df.fault.isna() & df[metric].notna()
    ok = df.loc[keep, [c for c in dict.fromkeys(used) if c in df]]  # the groups cut only what a row reads
    # only cases with both kinds of run make a row: the rest are left out before grouping
    both = set(ok.case_id[ok.probe == False].tolist()) & set(ok.case_id[ok.probe == True].tolist())  # noqa: E712
    return ok[ok.case_id.isin(both)]


def overhead_rows(ok: Optional[pd.DataFrame], metric: str = "output_throughput") -> pd.DataFrame:
    """``overhead_table`` of what ``overhead_reads`` gave."""
    if ok is None:
        return pd.DataFrame()
    rows = []
    for (machine, version, _case_id), g in ok.groupby(["machine", "sglang_version", "case_id"], sort=False):
        col = g.to_dict("list")  # the group's columns as lists: a case's few runs read in Python
        probe, values = col["probe"], col[metric]
        bare = [v for v, p in zip(values, probe) if p == False]  # noqa: E712
        probed = [v for v, p in zip(values, probe) if p == True]  # noqa: E712 (the probed runs)
        if not bare or not probed:
            continue
        b = SimpleNamespace(**{c: v[-1] for c, v in col.items()})
        bare_med, probed_med = statistics.median(bare), statistics.median(probed)
        ratio = probed_med / bare_med
        spreads = [s for s in (relative_spread(bare), relative_spread(probed)) if s is not None]  # None: one run
        noise = max(spreads) if spreads else None
        gap = abs(ratio - 1)
        # the probe's own clock: its per-batch cost over the step time (ms), in its probed runs
        share = None
        if "probe_time_per_batch" in col:
            share = step_share(_probed(col["probe_time_per_batch"], probe), _probed(col["step_time"], probe))
        if gap <= OVERHEAD_BUDGET:
            verdict = f"within {OVERHEAD_BUDGET:.0%}"
        elif noise is not None and gap <= noise:
            verdict = PROBE_CLOCK if share is not None and share < OVERHEAD_BUDGET / 10 else WITHIN_NOISE
        else:
            verdict = OVER_BUDGET if ratio < 1 else f"faster by more than {OVERHEAD_BUDGET:.0%}"
        rows.append(
            {
                "machine": machine,
                "sglang": version,
                "suite": b.suite,
                "case": case_label(b),
                "runs bare / probed": f"{len(bare)} / {len(probed)}",
                f"bare {metric}": round(bare_med, 1),
                f"specwatch {metric}": round(probed_med, 1),
                "specwatch / bare": round(ratio, 4),
                "run-to-run spread": "unmeasured" if noise is None else f"{noise:.1%}",
                "probe per step": "not recorded" if share is None else f"{share:.3%}",
                "verdict": verdict,
            }
        )
    return pd.DataFrame(rows)


def _probed(values: list, probe: list) -> list:
    """The measured values (NaN and None left out) of the probed runs among ``values``."""
    return [v for v, p in zip(values, probe) if p == True and not pd.isna(v)]  # noqa: E712


def case_label(row) -> str:
    """``tiny EAGLE triton p64 k1 bs16``: a case as the overhead tables name it."""
    return f"{row.model} {row.algorithm} {row.attention_backend} p{row.page_size} k{row.topk} bs{row.batch_size}"


ROUNDS = "overhead_round_ratios"
"""The frame's column of a record's full-prefill rounds (``store.baseline.prefilled_round_ratios``)."""

ROUNDS_KIND = "overhead_rounds_kind"
"""The frame's column of how a record's rounds ran (``store.baseline.RoundsKind``); records without it ran
sequential rounds."""

STEP_ROUNDS = "overhead_step_round_ratios"
"""The frame's column of a record's rounds on SGLang's step clock (``store.baseline.step_round_ratios``)."""


def baseline_overhead_table(df: pd.DataFrame) -> pd.DataFrame:
    """Harness overhead against the plain loop (``specwatch run --baseline``), rounds pooled over
    every run of a case: each round pairs one probed engine start with the plain-loop run of its
    round on the same host (its ratio drops the host's drift between rounds), so rounds of
    several runs, on one host or several of one machine kind, are samples of the same ratio.
    Paired rounds (``specwatch run --paired``: both loops up at once, taking turns) pool apart from
    sequential ones: their ratios also drop the host's changes within a round, so the two kinds
    sample one ratio at different noise. Per machine, SGLang version, case and kind of rounds
    (``taken``): the geometric mean of all its full-prefill rounds with the 95% t interval and its
    verdict against 0.98 (``OverheadVerdict``), and the median spread of the probed repeats beside
    that of the plain loop's timed calls (``overhead_probed_spread``, ``overhead_baseline_spread``),
    and the two loops' spreads compared round by round (``store.repeat_spread``: whether the probed
    repeats spread wider than the plain loop's within the rounds),
    and the probe's own clock: its timed cost per batch over the step
    time (``probe_share``), the part of the gap the probe in SGLang's scheduler can explain where the
    rounds cannot resolve the ratio; and where both loops recorded SGLang's own step times, the
    rounds pooled on that clock (``step_clock_cell``) and the share of their steps that ran in the
    host's slow state (``slow_steps_cell``)."""
    return baseline_overhead_rows(baseline_overhead_reads(df))


def baseline_overhead_reads(df: pd.DataFrame) -> Optional[pd.DataFrame]:
    """The ok clean probed records with full-prefill rounds, cut to the columns a row reads; None:
    no such record."""
    if df.empty or ROUNDS not in df:
        return None
    keep = (df.status == "ok") & df.fault.isna() & df[ROUNDS].map(lambda v: isinstance(v, list) and len(v) > 0)
    used = ["machine", "sglang_version", "case_id", "suite", "run_id", ROUNDS, ROUNDS_KIND, STEP_ROUNDS]
    used += ["overhead_probed_spread", "overhead_baseline_spread", SPREAD_ROUNDS, "probe_time_per_batch", "step_time"]
    used += [shares_column(loop) for loop in LOOPS]
    used += ["model", "algorithm", "attention_backend", "page_size", "topk", "batch_size"]
    ok = df.loc[keep, [c for c in used if c in df]]
    if ok.empty:
        return None
    kind = ok[ROUNDS_KIND] if ROUNDS_KIND in ok else pd.Series(None, index=ok.index, dtype=object)
    return ok.assign(**{ROUNDS_KIND: kind.fillna(RoundsKind.sequential.value)})


def baseline_overhead_rows(ok: Optional[pd.DataFrame]) -> pd.DataFrame:
    """``baseline_overhead_table`` of what ``baseline_overhead_reads`` gave."""
    if ok is None:
        return pd.DataFrame()
    rows = []
    for (machine, version, _case_id, kind), g in ok.groupby(
        ["machine", "sglang_version", "case_id", ROUNDS_KIND], sort=False
    ):
        ratios = pooled_values(g, ROUNDS)
        pooled = rounds_interval(ratios)
        b = g.iloc[-1]
        rows.append(
            {
                "machine": machine,
                "sglang": version,
                "suite": b.suite,
                "case": case_label(b),
                "runs": len(g),
                "rounds": len(ratios),
                "taken": kind,
                "probed / plain loop": round(statistics.geometric_mean(ratios), 3),
                "95% CI": "one round" if pooled is None else f"{pooled.low:.3f}-{pooled.high:.3f}",
                f"verdict vs {OVERHEAD_TARGET}": (pooled.verdict if pooled else OverheadVerdict.unresolved).value,
                "rounds to resolve": _rounds_needed(ratios, pooled),
                "repeat spread probed / plain": f"{_median_pct(g, 'overhead_probed_spread')} / "
                f"{_median_pct(g, 'overhead_baseline_spread')}",
                "spread per round probed / plain": spread_rounds_text(pooled_values(g, SPREAD_ROUNDS)),
                "probe per step": _probe_share(g),
                "step clock p10 plain / probed": step_clock_cell(g),
                "slow steps probed / plain": slow_steps_cell(g),
                "run ids": ", ".join(g.run_id.astype(str)),
            }
        )
    return pd.DataFrame(rows)


def pooled_values(g: pd.DataFrame, column: str) -> list[float]:
    """A list-valued column's values over a case's records, in record order (records without it skipped)."""
    return [x for xs in (g[column] if column in g else []) if isinstance(xs, list) for x in xs]


def step_clock_cell(g: pd.DataFrame) -> str:
    """The overhead on SGLang's own step clock, a case's rounds pooled over its records
    (``STEP_ROUNDS``): ``0.962 (0.908-1.019, unresolved; 9 rounds to resolve)``, the geometric mean
    with its 95% interval and verdict against 0.98 (and, unresolved, ``rounds_to_resolve``); ``not
    recorded`` where no round has it."""
    ratios = pooled_values(g, STEP_ROUNDS)
    if not ratios:
        return "not recorded"
    pooled = rounds_interval(ratios)
    if pooled is None:
        return f"{ratios[0]:.3f} (one round)"
    unresolved = pooled.verdict is OverheadVerdict.unresolved
    more = f"; {_rounds_needed(ratios, pooled)} rounds to resolve" if unresolved else ""
    return f"{pooled.ratio:.3f} ({pooled.low:.3f}-{pooled.high:.3f}, {pooled.verdict.value}{more})"


def slow_steps_cell(g: pd.DataFrame) -> str:
    """The host's slow state over a case's records: the share of SGLang's decode steps that ran slow
    (``store.step_state``) per probed engine start and per plain-loop run, pooled over the records,
    ``41% (6-75%, 3 windows) / 21% (9-51%, 3 windows)``; ``not recorded`` where neither side has one.
    Two loops whose shares differ read a throughput gap that is the host's."""

    probed, plain = (pooled_values(g, shares_column(loop)) for loop in LOOPS)
    if not probed and not plain:
        return "not recorded"
    return f"{shares_text(probed)} / {shares_text(plain)}"


def _rounds_needed(ratios: list[float], pooled) -> str:
    """The table's ``rounds to resolve`` cell: ``–`` where resolved, else ``rounds_to_resolve`` at
    these rounds' mean and spread (``> 1000``: the host's noise hides the target)."""
    if pooled is not None and pooled.verdict is not OverheadVerdict.unresolved:
        return "–"
    n = rounds_to_resolve(ratios)
    return f"> {MAX_ROUNDS_SHOWN}" if n is None else str(n)


def _median_pct(g: pd.DataFrame, column: str) -> str:
    """The median of ``column`` over a case's records as a percentage, ``–`` where unmeasured."""
    values = g[column].dropna() if column in g else pd.Series(dtype=float)
    return "–" if values.empty else f"{values.median():.1%}"


def step_share(costs_us: list, steps_ms: list) -> Optional[float]:
    """The probe's own clock: the median of its timed cost per batch (``probe_time_per_batch``, µs)
    over the median step time (ms); None where either is unrecorded."""
    if not costs_us or not steps_ms or statistics.median(steps_ms) <= 0:
        return None
    return statistics.median(costs_us) / 1000 / statistics.median(steps_ms)


def probe_share(g: pd.DataFrame) -> Optional[float]:
    """``step_share`` over a case's records."""
    if "probe_time_per_batch" not in g or "step_time" not in g:
        return None
    return step_share(g.probe_time_per_batch.dropna().tolist(), g.step_time.dropna().tolist())


def _probe_share(g: pd.DataFrame) -> str:
    """The table's ``probe per step`` cell (``probe_share``), ``not recorded`` where it is None."""
    share = probe_share(g)
    return "not recorded" if share is None else f"{share:.2%}"
