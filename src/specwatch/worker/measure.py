"""Child process of the runner: one ``sglang.Engine`` serving every case of one engine group.

``python -m specwatch.worker SPEC.json``. Writes one JSON line per case to the spec's ``results`` file
as soon as the case ends (the parent turns lines into records), plus an ``{"event": "engine_started"}``
line once the engine is up: a crash at start (the whole group fails alike) is told from one in a case.

Per case: a warm-up batch (untimed), then ``repeats`` times a prefill-only batch
(``max_new_tokens=1``, to split prefill from decode time) and a timed batch, on fresh prompts
(oracle chains from seeded starts: the radix cache never serves a timed prompt). After the case the
cache is flushed and the probe's facts are read: allocator and req slots back to full (leak check).

SGLang's ``flush_cache`` also empties the CUDA caching allocator (0.5.17
``Scheduler.flush_cache(empty_cache=True)``; ``Engine.flush_cache`` cannot ask otherwise), so a
batch right after a flush allocates its activations afresh. Where the radix cache cannot touch the
timed batch (``warm_after_flush``), each repeat is: flush, an untimed prefill-only batch that
fills the allocator again, the timed prefill-only batch, the timed batch, on mutually disjoint
chain starts: both timed batches run on a warm allocator, as in a plain loop of ``generate`` calls.
"""

from __future__ import annotations

import os
import statistics
import time
from datetime import datetime, timezone

from specwatch.core.case import Algorithm, Case, Profile, Workload
from specwatch.core.turns import process_turns
from specwatch.oracle.predict import NgramCorpusModel, Oracle
from specwatch.oracle.prompts import (
    OutputDigest,
    prompt_starts,
    timed_tag,
)
from specwatch.oracle.shapes import SHAPES
from specwatch.rules.releases import adapter_for, running_version
from specwatch.worker.engine_args import greedy_sampling, server_facts
from specwatch.worker.gc_pauses import GcPauses
from specwatch.worker.metric_set import MetricSet
from specwatch.worker.near_full import KV_TOKENS, MIN_DECODE_SHARE, near_full_extension
from specwatch.worker.windows import RepeatLoop, RepeatPlan, TimedBatch, window_samples


def histogram_key() -> str:
    """The ``meta_info`` key of the running SGLang's per-request acceptance histogram (its release
    adapter's; the old ``spec_accept_histogram`` alias is gone from 0.5.21)."""
    return adapter_for(running_version()).correct_drafts_histogram_key


def now() -> str:
    return datetime.now(timezone.utc).isoformat()


def host_load() -> float | None:
    """The host's 1-minute load average: a timed case on a busy host (another engine compiling,
    leftover processes) is slower for reasons of its own; ``compare.aa_differences`` names it."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def draft_oracle_for(case: Case, oracle: Oracle) -> Oracle | None:
    """The oracle the draft follows, where its acceptance has a closed form: the case's own profile
    for EAGLE/EAGLE3/DFLASH, the perfect chain for STANDALONE; None for NGRAM and random drafts."""
    if case.profile is Profile.random or case.algorithm not in (
        Algorithm.EAGLE,
        Algorithm.EAGLE3,
        Algorithm.STANDALONE,
        Algorithm.DFLASH,
    ):
        return None
    return oracle if case.algorithm is not Algorithm.STANDALONE else Oracle(oracle.shape, 0, Profile.perfect)


def expected_accept_length(draft_oracle: Oracle, case: Case, expected_output: list[int]) -> float:
    """Oracle acceptance length of one request whose greedy output is ``expected_output``."""
    return case.output_len / draft_oracle.expected_case_verifies(
        case.algorithm, expected_output[0], case.output_len, case.num_steps, case.topk, case.num_draft_tokens
    )


def mismatched_tokens(output_ids: list[int], expected: list[int]) -> int:
    """Output tokens that differ from the oracle chain, plus any length difference."""
    return sum(1 for a, b in zip(output_ids, expected) if a != b) + abs(len(output_ids) - len(expected))


def matches_oracle(measured: list[float], expected: list[float]) -> bool:
    """Every repeat's acceptance length equal to its oracle value (relative 1e-6: float noise only)."""
    return all(abs(m - e) <= 1e-6 * e for m, e in zip(measured, expected, strict=True))


NGRAM_ONE_PREFILL_TOKENS = 8192
"""Prompt tokens one prefill batch takes whole (SGLang's chunked_prefill_size for the tiny oracles on
the H200s, ``details.probe.scheduler_limits``): a larger NGRAM batch starts decoding in parts, which
``NgramCorpusModel`` does not model."""


FLUSH_WAIT_S = 5.0
"""How long ``flush_cache`` retries a flush SGLang refuses (seconds)."""


def flush_cache(engine, wait_s: float | None = None) -> tuple[bool, int]:
    """Flush SGLang's radix cache and pools; returns (flushed, refusals before the answer).

    ``Engine.flush_cache()`` returns a ``FlushCacheReqOutput`` (0.5.12-0.5.17), an object that is
    true whatever its ``success``; only ``success`` says whether the scheduler flushed. It refuses
    while it is not fully idle, and right after ``generate`` returns it can still hold the last
    batch (seen on the H200 under ``--overlap-starts``' host load: a 9984-token "leak" that was the
    radix cache). So a refusal is retried for ``wait_s``."""
    deadline = time.monotonic() + (FLUSH_WAIT_S if wait_s is None else wait_s)
    refusals = 0
    while True:
        out = engine.flush_cache()
        if bool(getattr(out, "success", out)):
            return True, refusals
        refusals += 1
        if time.monotonic() >= deadline:
            return False, refusals
        time.sleep(0.02)


class Prompts:
    """A case's prompt batches: oracle chains from seeded starts, cut at the (calibrated) input length."""

    def __init__(self, case: Case, oracle: Oracle):
        self.case, self.oracle, self.input_len = case, oracle, case.input_len

    def batch(self, tag: str) -> tuple[list[list[int]], list[list[int]], list[int]]:
        """(prompts, expected outputs, the chain starts they come from)."""
        return self.from_starts(prompt_starts(self.case, tag, self.case.batch_size))

    def from_starts(self, starts: list[int]) -> tuple[list[list[int]], list[list[int]], list[int]]:
        chains = [self.oracle.chain(s, self.input_len + self.case.output_len) for s in starts]
        return [c[: self.input_len] for c in chains], [c[self.input_len :] for c in chains], starts

    def starts_avoiding(self, tag: str, avoid: set[int]) -> list[int]:
        """``batch_size`` distinct seeded starts, none in ``avoid`` (``warm_after_flush`` checks
        that the oracle has enough): a prompt from another start shares no prefix with its batch."""
        n = self.case.batch_size
        return [s for s in prompt_starts(self.case, tag, n + len(avoid)) if s not in avoid][:n]


def warm_after_flush(case: Case) -> bool:
    """Whether a repeat's timed batches may follow an untimed one without a flush in between
    (module docstring): a standard workload whose radix cache holds nothing but other prompts, not
    NGRAM (its corpus, reset by the flush, is modelled as empty at the timed batch), with chain
    starts for three disjoint batches and a KV pool that holds two prefill-only batches and the
    timed batch without evicting (each request rounded up to whole pages)."""
    if case.workload is not Workload.standard or case.algorithm is Algorithm.NGRAM or case.own_model is not None:
        return False
    pages = lambda n: -(-n // case.page_size) * case.page_size  # noqa: E731
    need = case.batch_size * (2 * pages(case.input_len + 1) + pages(case.input_len + case.output_len + 1))
    return 3 * case.batch_size <= SHAPES[case.model].active and need <= KV_TOKENS.get(case.model, 0)


def calibrate_near_full(engine, case: Case, prompts: Prompts) -> dict | None:
    """A probed near-full case after its warm-up: lengthen every prompt by ``near_full_extension``
    of the decode peak the probe measured on the warm-up; returns what was done (None: nothing)."""
    sw = server_facts(engine)["specwatch"]  # reads (and resets) the warm-up's occupancy
    occ, alloc = sw.get("occupancy") or {}, sw.get("allocator") or {}
    if not (occ.get("batches") and alloc.get("size")):
        return None
    extension = near_full_extension(occ, alloc["size"], case)
    prompts.input_len += extension
    return {
        "warmup_peak_token_usage": occ["peak"],
        "prompt_extension": extension,
        "input_len": prompts.input_len,
        "warmup_occupancy": occ,
    }


def ngram_model_for(case: Case, oracle: Oracle) -> NgramCorpusModel | None:
    """NGRAM: its corpus simulated (flushed before the timed batch, so it starts empty); only where
    the batch decodes together from its prefill on: not near full, and prompts that one prefill
    batch takes whole (SGLang's chunked_prefill_size on the H200s: 8192)."""
    if (
        case.algorithm is Algorithm.NGRAM
        and case.workload is Workload.standard
        and case.batch_size * case.input_len <= NGRAM_ONE_PREFILL_TOKENS
    ):
        return NgramCorpusModel(oracle)
    return None


class CaseTally:
    """What a case's timed batches measured, repeat by repeat (one list entry per repeat)."""

    def __init__(self, case: Case):
        self.case = case
        self.tps: list[float] = []
        self.decode_tps: list[float] = []
        self.als: list[float] = []
        self.rates: list[float] = []
        self.step_ms: list[float] = []
        self.itl_ms: list[float] = []
        self.walls: list[float] = []
        self.verify: list[int] = []
        self.prefills: list[float] = []
        self.expected_per_repeat: list[float] = []
        self.timed: list[list[int]] = []  # each timed batch's chain starts
        self.mismatches = 0
        self.digest = OutputDigest()
        self.hist = None
        self.hist_key = histogram_key()
        self.flush_failures = self.flush_refusals = 0  # SGLang refuses a flush until idle: retried
        self.gc_pauses: list[dict] = []  # this process's collections inside each timed batch
        self.batches: list[TimedBatch] = []
        self.windows: list[int] | None = None  # timed batches per repeat (None: one each)

    def fresh_cache(self, engine) -> None:
        flushed, refused = flush_cache(engine)
        self.flush_failures, self.flush_refusals = self.flush_failures + (not flushed), self.flush_refusals + refused

    def add_batch(self, outs: list[dict], expected: list[list[int]], wall: float, prefill_s: float) -> None:
        """One timed batch: its outputs against the oracle's, its wall time, its prefill's time."""
        case = self.case
        self.walls.append(wall)
        tokens = sum(len(o["output_ids"]) for o in outs)
        self.tps.append(tokens / wall)
        decode_s = wall - prefill_s
        if decode_s < MIN_DECODE_SHARE * wall:
            decode_s = None  # prefill-dominated or a noisy prefill sample: no decode split this repeat
        else:
            self.decode_tps.append(sum(len(o["output_ids"]) - 1 for o in outs) / decode_s)
        for o in outs:
            self.digest.add(o["output_ids"])
        for o, exp in zip(outs, expected):
            self.mismatches += mismatched_tokens(o["output_ids"], exp)
        metas = [o["meta_info"] for o in outs]
        self.als.append(statistics.mean(m.get("spec_accept_length", 0.0) for m in metas))
        self.rates.append(statistics.mean(m.get("spec_accept_rate", 0.0) for m in metas))
        # plain decoding (the NONE twin) takes one step per token after the prefill's first
        vct = max(m.get("spec_verify_ct", 0) for m in metas) if case.algorithm.speculative else case.output_len - 1
        self.verify.append(vct)
        self.batches.append(TimedBatch(tokens, len(outs), wall, prefill_s, tokens - len(outs), decode_s, vct))
        if decode_s is not None:
            self.step_ms.append(1e3 * decode_s / max(vct, 1))
            self.itl_ms.append(1e3 * decode_s / max(case.output_len - 1, 1))
        self.hist = metas[0].get(self.hist_key, self.hist)

    def metrics(self) -> MetricSet:
        med, b, m = statistics.median, self.case.batch_size, MetricSet()
        t = self.timed_samples()
        m.put("output_throughput", med(t["tps"]), "tokens/s", t["tps"], higher_is_better=True)
        m.put(
            "request_throughput",
            med([b / w for w in t["walls"]]),
            "requests/s",
            [b / w for w in t["walls"]],
            higher_is_better=True,
        )
        m.put("wall_time", med(t["walls"]), "s", t["walls"], higher_is_better=False)
        m.put("prefill_time", med(t["prefills"]), "s", t["prefills"], higher_is_better=False)
        if t["decode_tps"]:
            m.put("decode_throughput", med(t["decode_tps"]), "tokens/s", t["decode_tps"], higher_is_better=True)
            m.put("step_time", med(t["step_ms"]), "ms", t["step_ms"], higher_is_better=False)
            m.put("itl", med(t["itl_ms"]), "ms", t["itl_ms"], higher_is_better=False)
        if not self.case.algorithm.speculative:  # a plain twin: no acceptance to report
            m.put("lossless_mismatches", self.mismatches, "tokens", exact=True, higher_is_better=False)
            return m
        expected_al = med(self.expected_per_repeat) if self.expected_per_repeat else None
        m.put(
            "accept_length",
            med(self.als),
            "tokens/verify",
            self.als,
            expected=expected_al,
            exact=True,
            higher_is_better=True,
        )
        # SGLang's own: correct drafts / (verify steps x (num_draft_tokens - 1))
        m.put("accept_rate", med(self.rates), "1", self.rates, exact=True, higher_is_better=True)
        m.put("verify_steps", med(self.verify), "steps", self.verify, exact=True, higher_is_better=False)
        m.put("lossless_mismatches", self.mismatches, "tokens", exact=True, higher_is_better=False)
        return m

    def timed_samples(self) -> dict[str, list[float]]:
        """Each repeat's timed samples: one per timed batch, or per window (``worker.windows``)."""
        if self.windows is not None:
            return window_samples(self.batches, self.windows, self.case.output_len)
        keys = ("tps", "walls", "prefills", "decode_tps", "step_ms", "itl_ms")
        return dict(zip(keys, (self.tps, self.walls, self.prefills, self.decode_tps, self.step_ms, self.itl_ms)))

    def checks(self) -> dict:
        checks = {"lossless": self.mismatches == 0}
        if self.expected_per_repeat:
            # every repeat (its own prompts) against its own oracle value
            checks["accept_length_matches_oracle"] = matches_oracle(self.als, self.expected_per_repeat)
        return checks

    def details(self, calibration: dict | None) -> dict:
        return {
            "accept_histogram": self.hist,
            "prefill_s": self.prefills,
            "near_full_calibration": calibration,
            "cache_flush_failures": self.flush_failures,
            "cache_flush_refusals": self.flush_refusals,
            # identical prompts (seeded by dcp_twin_id) must give identical outputs
            "output_digest": self.digest.hexdigest(),
            # what the outputs answer: a twin's digest is comparable only with the same
            "prompt_starts": self.timed,
            "decode_split_repeats": len(self.timed_samples()["decode_tps"]),
            "timed_gc_pauses": self.gc_pauses,
            "warm_after_flush": warm_after_flush(self.case),
        }


def run_case(
    engine, case: Case, repeats: int, warmup: bool, calibrate: bool = False, plan=None, before_timed=None, reader=None
) -> dict:
    """One case's timed batches. ``calibrate`` (a probed near-full case): after the warm-up batch,
    resize every prompt by ``near_full_extension`` of the decode peak the probe measured on it.
    ``plan``: a ``RepeatPlan`` (windows and a CI target; default ``repeats`` single batches);
    ``before_timed``: called right before the first timed repeat (the step-time window's start);
    ``reader``: a ``worker.cpu_readings.CpuReader`` around each repeat."""
    oracle = Oracle(SHAPES[case.model], 0, case.profile)
    sp = greedy_sampling(case)
    prompts = Prompts(case, oracle)
    calibration = None
    with process_turns().hold():  # the warm-up and the window's start: one turn (core.turns)
        if warmup:
            engine.generate(input_ids=prompts.batch("warmup")[0], sampling_params=sp)
            if calibrate and case.workload is Workload.near_full:
                calibration = calibrate_near_full(engine, case, prompts)
        if before_timed is not None:
            before_timed()
    tally = CaseTally(case)
    draft_oracle, ngram = draft_oracle_for(case, oracle), ngram_model_for(case, oracle)
    plan = plan or RepeatPlan(repeats)
    loop, tally.windows = RepeatLoop(plan), None if plan.fixed else []

    def one_batch() -> float:
        """One timed batch with its oracle expectation; returns the decode seconds it counts."""
        expected, starts = _timed_repeat(engine, case, len(tally.batches), prompts, sp, tally)
        if ngram is not None:
            ngram.flush()
            tally.expected_per_repeat.append(
                statistics.mean(ngram.decode_batch(starts, prompts.input_len, case.output_len, case.num_draft_tokens))
            )
        if draft_oracle is not None:
            tally.expected_per_repeat.append(
                statistics.mean(expected_accept_length(draft_oracle, case, exp) for exp in expected)
            )
        return tally.batches[-1].timed_decode_s

    loop.run(one_batch, lambda: tally.timed_samples()["tps"], tally.windows, reader)
    details = tally.details(calibration)
    if not plan.fixed:
        details["timed_windows"] = loop.details()
    return {"metrics": tally.metrics(), "checks": tally.checks(), "details": details}


def refill_allocator(engine, prompts: Prompts, sp: dict, r: int, avoid: set[int]) -> list[int]:
    """After a flush (it empties the CUDA caching allocator): repeat ``r``'s untimed prefill-only batch
    on seeded starts not in ``avoid`` (no prefix shared with the timed batch), refilling the allocator;
    its starts. Run by ``_timed_repeat`` and ``worker.baseline.fresh_batch`` (``warm_after_flush``)."""
    refill = prompts.starts_avoiding(f"refill{r}", avoid)
    engine.generate(input_ids=prompts.from_starts(refill)[0], sampling_params={**sp, "max_new_tokens": 1})
    return refill


def _timed_repeat(
    engine, case: Case, r: int, prompts: Prompts, sp: dict, tally: CaseTally
) -> tuple[list[list[int]], list[int]]:
    """Repeat ``r``: a prefill-only batch, then the timed batch, each prefilling in full (no prompt
    served by the radix cache); returns the timed batch's expected outputs and chain starts.

    Nothing of an earlier batch may serve a timed prompt: a timed prompt whose start an earlier batch
    drew (the tiny-attn oracle has 256 starts) would skip its prefill, and the pairwise decode split
    assumes the prefill-only batch and the timed one both prefill in full. So the repeat begins on an
    empty radix cache. Where ``warm_after_flush`` holds, an untimed prefill-only batch then refills
    the CUDA allocator the flush emptied, and the three batches draw disjoint starts; elsewhere a
    second flush separates the prefill-only batch from the timed one."""
    batch, expected, starts = prompts.batch(timed_tag(r))
    warm = warm_after_flush(case)
    tally.fresh_cache(engine)
    prefill_starts = None
    if warm:
        refill = refill_allocator(engine, prompts, sp, r, set(starts))
        prefill_starts = prompts.starts_avoiding(f"prefill{r}", set(starts) | set(refill))
    prefill_batch = (prompts.from_starts(prefill_starts) if warm else prompts.batch(f"prefill{r}"))[0]
    # A prefill-only batch of the same shape right before each timed batch: decode time is
    # the timed batch's wall time minus it, pairwise, so one slow prefill spoils one repeat only.
    t = time.perf_counter()
    engine.generate(input_ids=prefill_batch, sampling_params={**sp, "max_new_tokens": 1})
    prefill_s = time.perf_counter() - t
    tally.prefills.append(prefill_s)
    tally.timed.append(starts)
    if not warm:
        tally.fresh_cache(engine)
    with GcPauses() as pauses:
        t = time.perf_counter()
        outs = engine.generate(input_ids=batch, sampling_params=sp)
        wall = time.perf_counter() - t
    tally.add_batch(outs, expected, wall, prefill_s)
    tally.gc_pauses.append({"collections": pauses.collections, "pause_s": round(pauses.pause_s, 6)})
    return expected, starts
