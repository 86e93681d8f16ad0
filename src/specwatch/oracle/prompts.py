"""Prompts and outputs of the oracle workloads: seeded prompt starts, the output digest and the lossless reference.

Each batch's prompts are chain pieces of the oracle, drawn from seeded start tokens (distinct
within a batch, so the radix cache never serves a timed prompt). ``OutputDigest`` defines the
``output_digest`` format one way for the worker and for the reader that reproduces a record's
prompts on the CPU (``starts_behind_digest``).
"""

from __future__ import annotations

import hashlib
import json

from specwatch.core.case import Case
from specwatch.oracle.predict import Oracle
from specwatch.oracle.shapes import SHAPES


def prompt_starts(case: Case, tag: str, n: int, distinct: bool = True) -> list[int]:
    """Seeded start indices of the oracle chain, per case, purpose and request (a DCP case uses its
    dcp-1 twin's, so the two must give identical outputs), distinct within the batch: two requests
    from one start share their whole prompt in the radix cache. (They did: on 2xH200 a tiny
    near-full warm-up drew start 202 twice, held 0.80 of the pool instead of 1.0, and the calibration
    then lengthened the prompts past what the pool holds.) A repeated draw is redrawn with a counter;
    starts that never collided are the same as before. ``distinct=False`` draws as specwatch did
    before that (commit b9372a5): records of that time used it."""
    a = SHAPES[case.model].active
    if distinct and n > a:
        raise ValueError(f"{n} distinct prompts need {n} chain starts; the {case.model.value} oracle has {a}")
    out: list[int] = []
    for i in range(n):
        key, k = f"{case.dcp_twin_id()}/{tag}/{i}", 0
        while True:
            s = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little") % a
            if not distinct or s not in out:
                break
            k += 1
            key = f"{case.dcp_twin_id()}/{tag}/{i}/{k}"
        out.append(s)
    return out


class OutputDigest:
    """The ``output_digest`` records carry: sha256 over each output's token ids as JSON, in the
    order the outputs came, as 16 hex digits (run_case, run_multi_turn, lossless_output_digest)."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()

    def add(self, output_ids: list[int]) -> None:
        self._sha.update(json.dumps(output_ids).encode())

    def hexdigest(self) -> str:
        return self._sha.hexdigest()[:16]


def timed_tag(r: int) -> str:
    """``prompt_starts``'s purpose tag of timed batch ``r`` (``run_case``, ``run_multi_turn``)."""
    return f"timed{r}"


def timed_starts(case: Case, repeats: int, distinct: bool = True) -> list[list[int]]:
    """The chain starts of each timed batch of ``run_case`` (records keep them: ``prompt_starts``)."""
    return [prompt_starts(case, timed_tag(r), case.batch_size, distinct) for r in range(repeats)]


def lossless_output_digest(case: Case, input_len: int, starts: list[list[int]]) -> str:
    """The ``output_digest`` ``run_case`` records for a lossless run whose timed batches prompted
    ``input_len`` tokens of the oracle chain from ``starts``: every output is the chain's next tokens."""
    oracle, digest = Oracle(SHAPES[case.model], 0, case.profile), OutputDigest()
    for batch_starts in starts:
        for s in batch_starts:
            digest.add(oracle.chain(s, input_len + case.output_len)[input_len:])
    return digest.hexdigest()


def starts_behind_digest(case: Case, input_len: int, repeats: int, output_digest: str) -> list[list[int]] | None:
    """For a lossless record without recorded ``prompt_starts`` (made before specwatch kept them):
    the timed starts, under either draw specwatch has used, whose oracle outputs reproduce its
    ``output_digest``; None when neither does."""
    for distinct in (True, False):
        starts = timed_starts(case, repeats, distinct)
        if lossless_output_digest(case, input_len, starts) == output_digest:
            return starts
    return None
