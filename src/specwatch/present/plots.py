"""Dashboard plots (matplotlib, PNG + SVG): memory vs topk, throughput vs topk, acceptance vs topk,
and each metric across SGLang versions. Measured points come from the results store; the memory
plot draws the analytic model as lines and the measured req_to_token bytes as points on the same axes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pandas as pd

from specwatch.core.case import Algorithm
from specwatch.core.sglang_host import version_key
from specwatch.present.version_history import (
    CASE_NAME_FIELDS,
    TIMED_METRICS,
    VERSION_METRICS,
    case_name,
    ranked_trajectories,
    version_lines,
    version_machine,
)
from specwatch.rules.memory_model import SizingInput, reference_sizing
from specwatch.store.latest import LATEST_COLUMNS

PAGES = (1, 16, 64, 256)
TOPKS = (1, 2, 4, 8)

LEGEND_LIMIT = 12
"""Most entries a legend lists; the artists past it are drawn grey under one "+N more" entry."""

FOLDED_COLOR = "#9a9a9a"
"""The colour of the artists a legend folds into "other"."""

PANEL_WIDTH_PER_VERSION = 0.6
"""Inches of an across-versions panel per SGLang version (at least 5 in a panel)."""

FIGURE_MAX_WIDTH = 16
"""Inches past which the across-versions panels wrap into rows (one per metric) instead of growing
wider; a panel itself is never wider (its version ticks thin out instead)."""

MAX_VERSION_TICKS = 40
"""Most version labels an across-versions axis shows; past it every k-th version is labelled."""


def pyplot():
    """matplotlib's ``pyplot`` on the Agg backend, SVG ids salted with a fixed string (the same data
    gives the same files); imported on the first figure drawn, so a build whose figures all come
    from the store (``part_cache``) never imports matplotlib."""
    import matplotlib

    if matplotlib.rcParams["svg.hashsalt"] != SVG_SALT:
        matplotlib.use("Agg")
        matplotlib.rcParams["svg.hashsalt"] = SVG_SALT
    import matplotlib.pyplot as plt

    return plt


SVG_SALT = "specwatch"
"""matplotlib's ``svg.hashsalt`` for the figures: fixed ids in every SVG."""


def capped_legend(ax, limit: int = LEGEND_LIMIT, **kw):
    """``ax.legend`` listing at most ``limit`` entries: past ``limit - 1`` the artists are recoloured
    grey (their data as drawn) and share one entry, "+N more"."""
    handles, labels = ax.get_legend_handles_labels()
    if len(handles) > limit:
        folded = handles[limit - 1 :]
        for h in folded:
            for setter in ("set_color", "set_facecolor", "set_edgecolor"):
                if hasattr(h, setter):
                    getattr(h, setter)(FOLDED_COLOR)
        handles, labels = handles[: limit - 1] + [folded[0]], labels[: limit - 1] + [f"+{len(folded)} more"]
    return ax.legend(handles, labels, **kw)


def save_figure(fig, out: Path, name: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.svg"]
    for p in paths:  # no dates, fixed ids: regenerating the same data gives the same files
        meta = {"Date": None} if p.suffix == ".svg" else {}
        fig.savefig(p, dpi=110, bbox_inches="tight", metadata=meta)
    pyplot().close(fig)
    return paths


def measured_on_line(df: pd.DataFrame, page: int, steps: int, line_bytes: dict[int, int]) -> pd.DataFrame:
    """Records measured at a model line's settings: same page and steps, and the record's own
    model value (``model_req_to_token_bytes``, from its real sizing inputs) equal to the line's at
    its topk. Other draft counts, contexts, request slots or dcp belong to other lines."""
    pts = df[(df.page_size == page) & (df.num_steps == steps) & df.req_to_token_bytes.notna()]
    if "model_req_to_token_bytes" not in pts:
        return pts.iloc[0:0]
    return pts[pts.model_req_to_token_bytes == pts.topk.map(line_bytes)]


def newest_release(df: pd.DataFrame) -> tuple[Optional[str], pd.DataFrame]:
    """The newest SGLang release the records hold and its records only (all records and None when
    none says its release)."""
    versions = sorted(df.sglang_version.dropna().unique(), key=version_key) if "sglang_version" in df else []
    return (versions[-1], df[df.sglang_version == versions[-1]]) if versions else (None, df)


def _line_input(page: int, k: int, steps: int, context_len: int, max_running: int, draft_tokens: int) -> SizingInput:
    """The sizing input of one model line point: the suites' draft tokens, capped at the tree size
    (steps*topk+1; steps+1 for a chain)."""
    tokens = min(draft_tokens, k * steps + 1) if k > 1 else steps + 1
    return SizingInput(Algorithm.EAGLE, page, k, steps, tokens, context_len, max_running)


def _measured_points(ax, df: pd.DataFrame, page: int, steps: int, model: list, color) -> None:
    """The records on a page's model line, drawn over it."""
    pts = measured_on_line(df, page, steps, dict(zip(TOPKS, (m.req_to_token_bytes for m in model))))
    if not pts.empty:
        ax.scatter(
            pts.topk,
            pts.req_to_token_bytes / 1024,
            color=color,
            marker="o",
            s=40,
            zorder=3,
            label=f"page {page} (measured)",
        )


def memory_vs_topk(
    df: pd.DataFrame, out: Path, steps: int = 3, context_len: int = 8192, max_running: int = 8, draft_tokens: int = 8
) -> list[Path]:
    """req_to_token bytes and per-decode KV reserve vs topk, one line per page size.

    Model lines use the suites' settings (num_draft_tokens 8, capped at the tree size steps*topk+1;
    steps+1 for a chain) and the runner's engine (context 8192, 8 request slots); measured points
    are the records whose sizing inputs are the line's, so a point off its line is a finding. Lines
    and points are the newest SGLang release's that the records hold."""
    # the lines are one release's rules (the row rule moved at 0.5.13 and 0.5.16): the newest
    # measured release's, with only its records as points (an older release's row is not a finding)
    from matplotlib.ticker import NullFormatter

    newest, df = newest_release(df)
    fig, (ax1, ax2) = pyplot().subplots(1, 2, figsize=(11, 4.2))
    for page in PAGES:
        model = [
            reference_sizing(_line_input(page, k, steps, context_len, max_running, draft_tokens), newest) for k in TOPKS
        ]
        line = ax1.plot(TOPKS, [m.req_to_token_bytes / 1024 for m in model], marker="", label=f"page {page} (model)")
        ax2.plot(TOPKS, [m.alloc_reserve_per_decode for m in model], color=line[0].get_color(), label=f"page {page}")
        if not df.empty and "req_to_token_bytes" in df:
            _measured_points(ax1, df, page, steps, model, line[0].get_color())
    ax1.set(
        xlabel="topk",
        ylabel="req_to_token size (KiB)",
        xscale="log",
        xticks=TOPKS,
        xticklabels=TOPKS,
        title=f"req_to_token, ctx {context_len}, {max_running} req slots, steps {steps}"
        + (f", SGLang {newest}" if newest else ""),
    )
    ax2.set(
        xlabel="topk",
        ylabel="KV reserved per request per decode (tokens)",
        xscale="log",
        yscale="log",
        xticks=TOPKS,
        xticklabels=TOPKS,
        title="per-decode KV reserve (2 x holey tree footprint)",
    )
    for ax in (ax1, ax2):
        ax.xaxis.set_minor_formatter(NullFormatter())
        capped_legend(ax, fontsize=7)
    return save_figure(fig, out, "memory_vs_topk")


def _by_topk(df: pd.DataFrame, metric: str, group: str, out: Path, name: str, ylabel: str, title: str) -> list[Path]:
    fig, ax = pyplot().subplots(figsize=(6.5, 4.2))
    sub = df[df.status == "ok"].dropna(subset=[metric]) if metric in df else df.iloc[0:0]
    for key, g in sub.groupby(group):
        agg = g.groupby("topk")[metric].median()
        ax.plot(agg.index, agg.values, marker="o", label=f"{group}={key}")
    ax.set(xlabel="topk", ylabel=ylabel, title=title)
    if not sub.empty:
        capped_legend(ax, fontsize=7)
    else:
        ax.text(0.5, 0.5, "no measured results yet", ha="center", va="center", transform=ax.transAxes)
    return save_figure(fig, out, name)


def _version_ticks(ax, labels: list[str]) -> None:
    """Version labels under an across-versions panel: every one up to ``MAX_VERSION_TICKS``, every
    k-th past it; slanted once they would crowd each other."""
    step = -(-len(labels) // MAX_VERSION_TICKS)
    shown = list(range(0, len(labels), step))
    ax.set_xticks(shown, [labels[i] for i in shown], fontsize=8)
    if len(labels) > 6:
        ax.tick_params(axis="x", labelrotation=45)
        for t in ax.get_xticklabels():
            t.set_horizontalalignment("right")
    ax.set_xlim(-0.5, len(labels) - 0.5)


def _panel_lines(ax, latest: pd.DataFrame, versions: list, metric: str) -> None:
    """One panel's lines (``ranked_trajectories``): the first ``LEGEND_LIMIT - 1`` in colour and
    named in the legend below the panel, the rest grey under one "+N more" entry."""
    # one pivot (case x version) instead of a frame per case: a large store has thousands
    values = latest.pivot(index="case_id", columns="sglang_version", values=metric).reindex(columns=versions)
    firsts = latest.drop_duplicates("case_id").set_index("case_id").loc[values.index]
    names = pd.Series([case_name(f) for f in firsts.itertuples()], index=values.index)
    lines = ranked_trajectories(values, names)
    xs = list(range(len(versions)))
    for i, (line, name, _) in enumerate(lines[: LEGEND_LIMIT - 1]):
        ax.plot(xs, line, marker="o", alpha=0.8, lw=1.2, label=name, zorder=3 + LEGEND_LIMIT - i)
    rest = lines[LEGEND_LIMIT - 1 :]
    for j, (line, _, _) in enumerate(rest):
        label = f"+{sum(n for _, _, n in rest)} more cases ({len(rest)} lines)" if j == 0 else None
        ax.plot(xs, line, color=FOLDED_COLOR, marker=".", alpha=0.5, lw=0.8, label=label, zorder=2)
    ax.legend(fontsize=7, title="case", title_fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2))


def across_versions(df: pd.DataFrame, out: Path, metrics=VERSION_METRICS) -> list[Path]:
    """One line per case present (ok) in every SGLang version that has an ok case, so a change in the
    case mix can never look like a change in SGLang; one machine's records (``version_machine``,
    named in each panel's title), so neither can a change of host; the latest record of each case per version
    (``version_axis``: versions that ran nothing ok stay on the axis, as a gap in every line). Each
    panel takes the records that may show its metric (``version_lines``); cases with equal values
    share a line and the legend names the lines that moved most (``_panel_lines``). Panels widen
    with the number of versions up to ``FIGURE_MAX_WIDTH`` and wrap into one row per metric past
    it, so the figure's size is bounded however long the history."""
    n_versions = df.sglang_version.nunique() if "sglang_version" in df else 0
    read = [
        "fault",
        "overlap_starts",
        "status",
        "sglang_version",
        "case_id",
        "machine",
        *LATEST_COLUMNS,
        *CASE_NAME_FIELDS,
    ]
    df = df[[c for c in dict.fromkeys([*read, *(m for m, _ in metrics)]) if c in df]]  # the columns read, cut once
    width = min(FIGURE_MAX_WIDTH, max(5.0, PANEL_WIDTH_PER_VERSION * n_versions))
    cols = len(metrics) if width * len(metrics) <= FIGURE_MAX_WIDTH else 1
    rows = -(-len(metrics) // cols)
    machine = version_machine(df) if not df.empty else None
    fig, axes = pyplot().subplots(rows, cols, figsize=(width * cols, 6 * rows), squeeze=False)
    for ax, (m, unit) in zip(axes.ravel(), metrics):
        versions, labels, common, latest = version_lines(df, m) if not df.empty else ([], [], [], df)
        if common and m in latest:
            _panel_lines(ax, latest, versions, m)
        if labels:
            _version_ticks(ax, labels)
        ax.set(
            xlabel="SGLang version",
            ylabel=f"{m} ({unit})",
            title=f"{m}\n{len(common)} cases ok on every version"
            + (" (wave runs)" if m in TIMED_METRICS else " (all runs)")
            + (f", {machine}" if machine else ""),
        )
    fig.tight_layout()
    return save_figure(fig, out, "across_versions")


def timing_records(df: pd.DataFrame) -> pd.DataFrame:
    """The records whose timing the plots show: not those of runs whose starts overlapped other
    engines' timed batches (``--overlap-starts``: noisier timing; their exact metrics equal a wave run's)."""
    return df[df.overlap_starts != True] if "overlap_starts" in df else df  # noqa: E712


def newest_tiny(df: pd.DataFrame, timed: bool = False) -> tuple[pd.DataFrame, str]:
    """The clean records of the tiny oracle on the newest SGLang version that has any, and a label
    for them: the by-topk plots take one model and one version, not a median over the 1b/8b
    checkpoints and every release. ``timed``: of ``timing_records`` only (one mask, one copy)."""
    if df.empty or "model" not in df:
        return df, ""
    keep = df.model == "tiny"
    if "fault" in df:
        keep &= df.fault.isna()
    if timed and "overlap_starts" in df:
        keep &= df.overlap_starts != True  # noqa: E712
    tiny = df[keep]
    newest, tiny = newest_release(tiny)
    return tiny, f"tiny, SGLang {newest}" if newest else ""


def throughput_vs_topk(df: pd.DataFrame, out: Path) -> list[Path]:
    """Decode throughput vs topk per backend, batch 1, newest tiny-model release (none: no records)."""
    if df.empty:
        return []
    newest, label = newest_tiny(df, timed=True)
    chain_or_tree = newest[(newest.batch_size == 1)] if "batch_size" in newest else newest
    return _by_topk(
        chain_or_tree,
        "decode_throughput",
        "attention_backend",
        out,
        "throughput_vs_topk",
        "decode throughput (tokens/s), batch 1",
        f"throughput vs topk per backend ({label})",
    )


def acceptance_vs_topk(df: pd.DataFrame, out: Path) -> list[Path]:
    """Acceptance length vs topk per oracle profile, newest tiny-model release (none: no records)."""
    if df.empty:
        return []
    newest, label = newest_tiny(df)
    return _by_topk(
        newest,
        "accept_length",
        "profile",
        out,
        "acceptance_vs_topk",
        "acceptance length (tokens/verify)",
        f"acceptance vs topk per oracle profile ({label})",
    )


def metrics_across_versions(df: pd.DataFrame, out: Path) -> list[Path]:
    """``across_versions`` (none: no records)."""
    return [] if df.empty else across_versions(df, out)


PLOT_PARTS = (memory_vs_topk, throughput_vs_topk, acceptance_vs_topk, metrics_across_versions)
"""``make_all``'s plots, each ``(records frame, folder) -> files``, in order; independent of each other."""


def make_all(df: pd.DataFrame, out: Path) -> list[Path]:
    """Every dashboard plot from a records frame (``store.records_frame``)."""
    return [p for part in PLOT_PARTS for p in part(df, out)]


__all__ = ["make_all", "memory_vs_topk"]
