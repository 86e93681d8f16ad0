"""An own model's case on the worker: its checkpoints, its prompts as token ids, its timed repeats.

Each timed repeat sends every prompt of the case's ``PromptSet``, ``batch_size`` at a time, on an
empty radix cache; acceptance is measured per request and grouped by the prompts' categories. No
oracle expectation applies (``Expectation.parity``): the outputs of the first timed repeat are
compared with the plain target's (``worker.parity``).
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from functools import lru_cache
from pathlib import Path
from typing import Optional

from specwatch.core.case import Case
from specwatch.own.checkpoint import resolve_checkpoint
from specwatch.own.prompts import DATASETS, RANDOM, load_prompts, random_token_prompts
from specwatch.worker.engine_args import greedy_sampling
from specwatch.worker.measure import MetricSet, flush_cache
from specwatch.worker.parity import PlainRun, parity_result


def checkpoint_paths(case: Case) -> tuple[Path, Optional[Path]]:
    """(target, draft) folders of an own model's case on this host."""
    m = case.own_model
    target = resolve_checkpoint(m.target, None, m.name, "target")
    return target, (resolve_checkpoint(m.draft, None, m.name, "draft") if m.draft else None)


@lru_cache(maxsize=8)
def _tokenizer(folder: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def tokenizer_of(case: Case):
    """The case's tokenizer (its ``tokenizer``, else the target's), loaded once per folder."""
    m = case.own_model
    ref, role = (m.tokenizer, "tokenizer") if m.tokenizer else (m.target, "target")
    return _tokenizer(str(resolve_checkpoint(ref, None, m.name, role)))


def encode(tok, text: str) -> list[int]:
    """A prompt's token ids: through the tokenizer's chat template as one user turn where it has
    one (with the generation prompt), else the plain text."""
    if getattr(tok, "chat_template", None):
        out = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)
    return list(tok(text)["input_ids"])


def case_prompts(case: Case) -> tuple[list[list[int]], list[Optional[str]]]:
    """The case's prompts as token ids (each cut to ``input_len``) and their categories."""
    tok, ps = tokenizer_of(case), case.prompts
    if ps.source == RANDOM:
        special = set(getattr(tok, "all_special_ids", []) or [])
        vocab = sorted(i for i in tok.get_vocab().values() if i not in special)
        return random_token_prompts(vocab, ps.count, case.input_len, ps.seed), [None] * ps.count
    drawn = load_prompts(ps)
    return [encode(tok, p.text)[: case.input_len] for p in drawn], [p.category for p in drawn]


def by_category(als: list[float], categories: list[Optional[str]]) -> dict[str, dict]:
    """Mean acceptance length and request count per prompt category (empty: no categories)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for al, cat in zip(als, categories):
        if cat is not None:
            groups[cat].append(al)
    return {c: {"accept_length": statistics.mean(v), "requests": len(v)} for c, v in sorted(groups.items())}


def run_own_case(engine, case: Case, repeats: int, warmup: bool, plain: Optional[PlainRun]) -> dict:
    """An own model's case: a warm-up batch, ``repeats`` timed passes over its prompts, parity."""
    prompts, categories = case_prompts(case)
    sp, bs = greedy_sampling(case), case.batch_size
    if warmup:
        engine.generate(input_ids=prompts[:bs], sampling_params=sp)
    walls, tps, als, rates, first_outs, req_als = [], [], [], [], None, []
    for _ in range(repeats):
        flush_cache(engine)
        outs, t = [], time.perf_counter()
        for i in range(0, len(prompts), bs):
            outs += engine.generate(input_ids=prompts[i : i + bs], sampling_params=sp)
        walls.append(time.perf_counter() - t)
        tps.append(sum(len(o["output_ids"]) for o in outs) / walls[-1])
        metas = [o["meta_info"] for o in outs]
        req = [m.get("spec_accept_length", 0.0) for m in metas]
        als.append(statistics.mean(req))
        rates.append(statistics.mean(m.get("spec_accept_rate", 0.0) for m in metas))
        req_als += req
        first_outs = first_outs or [o["output_ids"] for o in outs]
    med, m = statistics.median, MetricSet()
    m.put("output_throughput", med(tps), "tokens/s", tps, higher_is_better=True)
    m.put("request_throughput", med([len(prompts) / w for w in walls]), "requests/s", higher_is_better=True)
    m.put("wall_time", med(walls), "s", walls, higher_is_better=False)
    m.put("accept_length", med(als), "tokens/verify", als, higher_is_better=True)
    m.put("accept_rate", med(rates), "1", rates, higher_is_better=True)
    p_metrics, checks, details = parity_result(case, first_outs, plain)
    for name, (value, unit, kw) in p_metrics.items():
        m.put(name, value, unit, **kw)
    details.update(
        expectation=case.expectation.value,
        accept_by_category=by_category(req_als, categories * repeats),
        prompt_source={
            "source": case.prompts.source,
            "sha256": case.prompts.sha256,
            "url": DATASETS[case.prompts.source].url if case.prompts.source in DATASETS else None,
            "count": len(prompts),
        },
    )
    return {"metrics": m, "checks": checks, "details": details}
