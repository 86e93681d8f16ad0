"""``specwatch model``: the CPU tier's memory model and allocator simulation for one configuration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.text import Text

from specwatch.commands.options import CsvOut, bounded
from specwatch.commands.output import console, print_table
from specwatch.core.errors import SpecwatchInputError

model_app = typer.Typer(no_args_is_help=True, help="CPU tier: memory model and allocator simulation.")


@model_app.command("memory")
def model_memory(
    page: bounded(4096) = 1,
    topk: bounded(64) = 1,
    steps: bounded(32) = 3,
    draft: bounded(1024) = 4,
    context_len: bounded(1048576) = 4096,
    max_running: bounded(4096) = 48,
    dcp: bounded(64) = 1,
    algorithm: str = typer.Option("EAGLE", help="EAGLE, EAGLE3, STANDALONE, NGRAM, DFLASH or none."),
    csv: CsvOut = None,
    json_out: Optional[Path] = typer.Option(None, "--json"),
) -> None:
    """Spec-decode KV sizing for one configuration: specwatch's formulas next to SGLang's."""
    from specwatch.rules.memory_model import (
        COMPARED_FIELDS,
        SIZING_FIELDS,
        ModelAlgorithm,
        SizingInput,
        compare,
    )

    try:
        algo = None if algorithm.lower() == "none" else ModelAlgorithm(algorithm.upper())
    except ValueError:
        raise SpecwatchInputError(None, f"unknown algorithm {algorithm!r}", field="--algorithm") from None
    ref, sgl, diffs = compare(SizingInput(algo, page, topk, steps, draft, context_len, max_running, dcp))
    rows = [
        {
            "field": f,
            "specwatch": getattr(ref, f),
            "sglang": getattr(sgl, f) if (sgl is not None and f in COMPARED_FIELDS) else None,
        }
        for f in SIZING_FIELDS
    ]
    print_table(
        f"memory model: page {page}, topk {topk}, steps {steps}, draft {draft}, ctx {context_len}, "
        f"max running {max_running}, dcp {dcp}, {algorithm}",
        ["field", "specwatch", "sglang " + ("(not importable)" if sgl is None else ""), "agree"],
        [
            [
                r["field"],
                r["specwatch"],
                r["sglang"],
                "" if r["sglang"] is None else Text("yes") if r["specwatch"] == r["sglang"] else Text("NO", "red"),
            ]
            for r in rows
        ],
    )
    if csv:
        import pandas as pd

        pd.DataFrame(rows).to_csv(csv, index=False)
    if json_out:
        json_out.write_text(json.dumps(rows, indent=1))
    if diffs:
        raise typer.Exit(1)


def _sim_config(o: dict):
    """The ``SimConfig`` of ``model simulate``'s options (one line naming the option when bad)."""
    from specwatch.cpu.allocator_sim import AcceptPattern, SimConfig
    from specwatch.inject.faults import SimFault

    try:
        return SimConfig(
            o["page"],
            o["topk"],
            o["steps"],
            o["draft"],
            context_len=o["context_len"],
            num_requests=o["requests"],
            input_len=o["input_len"],
            output_len=o["output_len"],
            accept=AcceptPattern(o["accept"]),
            dcp=o["dcp"],
            seed=o["seed"],
            near_full=o["near_full"],
            kv_write_ignores_dcp=o["kv_write_ignores_dcp"],
            fault=SimFault(o["fault"]) if o["fault"] else None,
            algorithm=o["algorithm"].upper(),
            release=o["release"],
        )
    except ValueError as e:
        raise SpecwatchInputError(None, str(e), field="--accept/--fault/--algorithm") from None


@model_app.command("simulate")
def model_simulate(
    page: bounded(4096) = 64,
    topk: bounded(64) = 8,
    steps: bounded(32) = 3,
    draft: bounded(1024) = 16,
    context_len: bounded(1048576) = 512,
    requests: bounded(4096) = 4,
    input_len: bounded(1048576) = 300,
    accept: str = typer.Option("random", help="full, one or random."),
    dcp: bounded(64) = 1,
    seed: int = typer.Option(0, "--seed"),
    output_len: bounded(1048576) = 10_000,
    near_full: bool = typer.Option(False, "--near-full", help="Pool sized to the peak demand."),
    kv_write_ignores_dcp: bool = typer.Option(
        False,
        "--kv-write-ignores-dcp",
        help="The target's attention backend writes KV at the "
        "allocator's virtual slot into its per-rank pool (no DCP code, e.g. 0.5.17's flashinfer).",
    ),
    fault: Optional[str] = typer.Option(
        None, help="Plant a fault: row-widen-revert, unaligned-watermark, draft-page-mismatch."
    ),
    algorithm: str = typer.Option("EAGLE", help="EAGLE, EAGLE3, STANDALONE, NGRAM or DFLASH."),
    release: Optional[str] = typer.Option(
        None,
        help="Run this unpacked SGLang release's own pool and allocator classes and sizing "
        "(.cache/sglang-src/VERSION, scripts/fetch_sglang_sources.sh; e.g. 0.5.23); default: the installed one.",
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Drive a release's real ReqToTokenPool and paged allocator on CPU through spec-decode steps."""
    from specwatch.cpu.allocator_sim import simulate

    opts = dict(locals())
    cfg = _sim_config(opts)
    try:
        res = simulate(cfg)
    except ImportError as e:
        raise SpecwatchInputError(
            None, f"sglang is not importable here ({e}); install requirements/sglang-cpu*.txt"
        ) from None
    d = res.as_dict()
    if as_json:
        print(json.dumps(d, default=str))
    else:
        ran = d["sglang_classes"]
        print_table(
            f"allocator simulation on SGLang {ran['version']}'s classes ({ran['origin']}: {ran['path']})"
            + (f" with fault {fault}" if fault else ""),
            ["quantity", "value"],
            [[k, v] for k, v in d.items() if k not in ("config", "sglang_classes")],
        )
        for v in res.row_violations[:3]:
            console.print(
                f"[red]row violation[/red]: request {v.request} committed {v.committed_len} "
                f"watermark {v.watermark} > row width {v.row_width}"
            )
    raise typer.Exit(0 if res.clean else 1)


@model_app.command("write-oracle")
def model_write_oracle(
    folder: Path = typer.Argument(..., help="Folder to write the checkpoints into."),
    size: str = typer.Option("tiny", help="Oracle size: tiny, tiny-attn, 1b, 8b."),
    algorithm: str = typer.Option("EAGLE", help="EAGLE, EAGLE3, STANDALONE, NGRAM or DFLASH: which draft."),
    profile: str = typer.Option("perfect", help="Draft acceptance profile (perfect, q=0.1, ...)."),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Write an oracle target and draft with a tokenizer, to name by path in a suite as an own model."""
    from specwatch.core.case import Algorithm, ModelSize, Profile

    try:
        size_v, algo_v, profile_v = ModelSize(size), Algorithm(algorithm.upper()), Profile(profile)
    except ValueError as e:
        raise SpecwatchInputError(None, str(e), field="--size/--algorithm/--profile") from None
    if size_v is ModelSize.own:
        raise SpecwatchInputError(None, "'own' is no oracle size", field="--size")
    from specwatch.oracle.checkpoints import write_oracle_model

    target, draft = write_oracle_model(folder, size_v, profile_v, algo_v, seed)
    console.print(f"target: {target}")
    console.print(f"draft: {draft if draft is not None else 'none'}")
    draft_kv = f', draft = "{draft}"' if draft is not None else ""
    console.print(f'suite: model = [{{name = "oracle-{size_v.value}", target = "{target}"{draft_kv}}}]')


@model_app.command("fetch-prompts")
def model_fetch_prompts(
    name: str = typer.Argument(..., help="Dataset: mt-bench, gsm8k or sharegpt."),
    folder: Optional[Path] = typer.Option(None, help="Prompts folder (default: $SPECWATCH_PROMPTS_DIR or ~/.cache)."),
) -> None:
    """Fetch a prompt dataset once into the prompts folder (needs network) and write its sha256 beside it."""
    from specwatch.own.prompts import DATASETS, fetch_dataset

    if name not in DATASETS:
        raise SpecwatchInputError(None, f"unknown dataset {name!r}: one of {', '.join(DATASETS)}", field="NAME")
    path, sha = fetch_dataset(name, folder)
    console.print(f"{path}: sha256 {sha}")
