"""Helpers that build records for harness tests."""

import itertools
from datetime import datetime, timezone

from specwatch.core.case import Algorithm, Backend, Case, ModelSize
from specwatch.core.record import CaseRecord, Metric, Provenance, Status
from specwatch.rules.memory_model import ModelAlgorithm

T0 = datetime(2026, 11, 30, tzinfo=timezone.utc)


def case(**kw) -> Case:
    base = dict(
        model=ModelSize.tiny,
        algorithm=Algorithm.EAGLE,
        attention_backend=Backend.triton,
        page_size=64,
        topk=4,
        num_steps=3,
        num_draft_tokens=8,
        batch_size=1,
        input_len=128,
        output_len=256,
    )
    base.update(kw)
    return Case(**base)


def prov(**kw) -> Provenance:
    base = dict(
        specwatch_version="0.1.0",
        hostname="h",
        machine="m",
        python_version="3.12",
        sglang_version="0.5.17",
        started_at=T0,
        finished_at=T0,
    )
    base.update(kw)
    return Provenance(**base)


def record(c: Case = None, status=Status.ok, reason=None, tps=100.0, **kw) -> CaseRecord:
    c = c or case()
    metrics = (
        {"output_throughput": Metric(value=tps, unit="tokens/s", samples=[tps], higher_is_better=True)}
        if status is Status.ok
        else {}
    )
    return CaseRecord(
        suite="smoke", case_id=c.case_id, case=c, status=status, reason=reason, metrics=metrics, provenance=prov(**kw)
    )


SIZING_GRID = list(
    itertools.product(
        [None, ModelAlgorithm.EAGLE, ModelAlgorithm.EAGLE3, ModelAlgorithm.STANDALONE, ModelAlgorithm.NGRAM],
        [1, 16, 64, 256],  # page
        [1, 2, 4, 8],  # topk
        [1, 3, 5],  # steps
        [4, 16],  # draft tokens
        [2048, 131072],  # context
        [1, 2],  # dcp
    )
)
"""The 1,920 (algorithm, page, topk, steps, draft tokens, context, dcp) sizing configurations the
memory model is checked on against SGLang's own sizing (installed and per cached release)."""
