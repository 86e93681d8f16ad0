"""Child process of the runner: one ``sglang.Engine`` serving every case of one engine group.

``python -m specwatch.engine_worker SPEC.json``. Writes one JSON line per case to the spec's
``results`` file as soon as the case ends (the parent turns lines into records), plus an
``{"event": "engine_started"}`` line once the engine is up, so the parent can tell a crash at
start (the whole group fails alike) from a crash inside one case.

Per case: a warm-up batch (untimed), a prefill-only batch (``max_new_tokens=1``) to split
prefill from decode time, then ``repeats`` timed batches, each on fresh prompts (oracle chains
from seeded start tokens, so the radix cache never serves a timed prompt). After the case the
cache is flushed and the probe's facts are read from the scheduler: allocator and req slots must
be back to full (leak check).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

from specwatch.case import Algorithm, Case, ModelSize, Profile, Workload
from specwatch.memory_model import Sizing, SizingInput, reference_sizing, sglang_sizing
from specwatch.oracle import SHAPES, NgramCorpusModel, Oracle, ensure_models
from specwatch.timing_lock import ENGINE_FACTS_EVENT, ENGINE_STARTED_EVENT, PARALLEL_ENV, WorkerTimingLock

KV_TOKENS = {ModelSize.tiny: 1 << 18, ModelSize.tiny_attn: 1 << 18, ModelSize.tiny_mla: 1 << 18, ModelSize.llama_1b: 1 << 17,
             ModelSize.llama_8b: 1 << 16}
"""KV pool size per model for standard workloads (keeps start fast, memory numbers comparable
within a model, and several engines on one GPU under ``--parallel-starts``)."""


MIN_DECODE_SHARE = 0.2
"""A repeat gets decode metrics only when wall - prefill is at least this share of its wall time."""


def now() -> str:
    return datetime.now(timezone.utc).isoformat()


ARG_VALIDATION_FILES = ("srt/server_args.py", "srt/arg_groups/")
"""Where SGLang validates an engine's arguments before it starts any process: ``ServerArgs`` and,
from 0.5.17 on, its per-feature hooks (``arg_groups/speculative_hook.py``)."""


def sglang_refusal(e: BaseException) -> str | None:
    """``file:function`` of SGLang's argument check that refused an engine, or None for any other
    exception. A refusal is SGLang saying the case is invalid on this version (0.5.12 refuses
    topk > 1 on paged KV outside flashinfer): the case is recorded ``skipped`` with SGLang's words,
    as the validity rules do for what they know, not ``failed``. The innermost SGLang frame
    decides, and only for the exception types those checks raise. A host problem that SGLang
    reports from the same checks (e.g. too little GPU memory) reads as a refusal too: the reason
    keeps SGLang's words, and ``compare`` calls a case that was ok and is now skipped "now failing"."""
    if not isinstance(e, (ValueError, AssertionError, NotImplementedError)):
        return None
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        path = frame.filename.replace(os.sep, "/")
        if "/sglang/" in path:
            inner = path.rsplit("/sglang/", 1)[1]
            return f"sglang/{inner}:{frame.name}" if inner.startswith(ARG_VALIDATION_FILES) else None
    return None


def near_full_request_tokens(case: Case) -> int:
    """KV slots one request of a near-full case holds at its peak, in whole allocator pages: prompt +
    max_new_tokens (SGLang admits a request only when both fit: with ``ignore_eos`` its new-token
    ratio is 1, ``schedule_policy.add_req_state``) + the per-decode reserve speculative decoding
    allocates ahead from the first decode step on (``alloc_reserve_per_decode``, specwatch's model;
    it exceeds what admission reserves, so the whole batch is admitted)."""
    reserve = reference_sizing(SizingInput.for_case(case, context_len=case.input_len + case.output_len,
                                                    max_running_requests=case.batch_size)).alloc_reserve_per_decode
    page = case.page_size * case.dcp
    return -(-(case.input_len + case.output_len + reserve) // page) * page


def near_full_extension(occupancy: dict, allocator_slots: int, case: Case) -> int:
    """Prompt tokens to add to (negative: take from) each request of a near-full batch, measured on
    its warm-up batch, so that the whole batch fits the pool with one allocator page per request to
    spare and no more: whole pages, within the model's context.

    The pool (``kv_pool_tokens``) comes from specwatch's model of SGLang's per-decode reserve. On the
    H200 (0.5.17, tiny, topk 8, 6144 -> 256, batch 16) the first peak was 0.9375 at page 64 and 256:
    15 requests decoded, each holding exactly the modelled peak, while the 16th waited (chunked
    prefill; ``engine_kwargs``). With whole-prompt prefill the warm-up filled the pool (1.000) and
    this took one page off each prompt (timed peak 0.98-0.99). The probe's decode peak and the
    requests running at it give the real per-request hold whatever the pool model says, so a model
    that is off moves the prompts, not the occupancy. A prompt token more is a KV slot more at every
    step; the spare page per request covers a last verify step that commits past ``output_len`` (up
    to num_steps tokens), and
    ``validity`` keeps output_len within 5% of the request, so usage stays above 0.95 from the first
    decode step on. Occupancy without a decode peak (older probes): the overall peak, whole batch."""
    page = case.page_size * case.dcp                 # a prompt token is one allocator (virtual) slot
    usage = occupancy.get("decode_peak") or occupancy["peak"]
    running = occupancy.get("decode_peak_requests") or case.batch_size
    per_request = usage * allocator_slots / running
    spare = allocator_slots - case.batch_size * (per_request + page)
    pages = math.floor(spare / (case.batch_size * page))
    room = SHAPES[case.model].max_position - case.input_len - case.output_len   # the context still fits
    floor_pages = -(case.input_len // 2 // page)      # never below half the planned prompt
    return max(floor_pages, min(pages, room // page)) * page


def kv_pool_tokens(cases: list[Case]) -> int:
    """``max_total_tokens`` for an engine group: fixed per model, or sized to the batch (near-full).

    near-full: the largest batch's peak (``near_full_request_tokens`` per request), so SGLang admits
    the whole batch at once and its own reservations, not a queue, decide the occupancy. (The first
    design, 97% of prompts + a quarter of the outputs, let only three of four requests in: measured
    on 2xH200, peak usage 0.93-0.96 and 0-22% of batches above 0.95.) Whatever the reserve model
    gets wrong, ``run_case`` then resizes the prompts to the warm-up's measured decode peak
    (``near_full_extension``; on the H200 the model was exact and a chunked prefill had kept one
    request out, ``engine_kwargs``).
    Under DCP, SGLang takes ``max_total_tokens`` per rank and sizes its allocator to
    ``max_total_tokens * dcp`` virtual slots (0.5.17's kv_cache_configurator; seen on the x2 host:
    2^18 passed, an allocator of 2^19), so near-full asks for the need / dcp, in whole pages."""
    first = cases[0]
    if first.workload is not Workload.near_full:
        return KV_TOKENS[first.model]
    need = max(c.batch_size * near_full_request_tokens(c) for c in cases)
    return -(-need // (first.dcp * first.page_size)) * first.page_size


def engine_kwargs(case: Case, target: Path, draft, max_bs: int, kv_tokens: int | None = None) -> dict:
    kw = dict(
        model_path=str(target), skip_tokenizer_init=True, dtype="bfloat16",
        attention_backend=case.attention_backend.value, page_size=case.page_size,
        tp_size=case.tp, max_running_requests=max(max_bs, 8), max_total_tokens=kv_tokens or KV_TOKENS[case.model],
        cuda_graph_max_bs_decode=max(max_bs, 8), disable_cuda_graph=not case.cuda_graph,
        # Prefill graphs cost ~1 min of capture per engine and do not touch the decode path timed here.
        disable_prefill_cuda_graph=True,
        random_seed=0, log_level="error", mem_fraction_static=0.7,
        # An idle SGLang scheduler spins one CPU thread at 100% unless it sleeps on idle; under
        # --parallel-starts the engines waiting for the timing lock would load the CPU that the
        # timed engine's launch path needs (batch-1 decode on small models is CPU-bound).
        sleep_on_idle=True,
        speculative_algorithm=case.algorithm.value, speculative_num_steps=case.num_steps,
        speculative_eagle_topk=case.topk, speculative_num_draft_tokens=case.num_draft_tokens,
    )
    if case.dcp > 1:
        kw["dcp_size"] = case.dcp
    if case.workload is Workload.near_full:
        # No chunked prefill: on the H200 (0.5.17, batch 16 x 6144 in chunks) only 15 requests ever
        # decoded together, none retracted, and the 16th ran alone afterwards. Reading 0.5.17's
        # scheduler: a chunked request holds a req slot and sits in the round's can_run_list, so
        # get_num_allocatable_reqs counts it twice; with one slot left the round marks the running
        # batch full, and that flag holds until a request finishes. Whole prompts admit all 16.
        kw["chunked_prefill_size"] = -1
    if draft is not None:
        kw["speculative_draft_model_path"] = str(draft)
        if case.profile is Profile.random:
            kw["speculative_draft_load_format"] = "dummy"
    if case.algorithm is Algorithm.NGRAM:
        kw["speculative_ngram_max_bfs_breadth"] = case.topk
    if case.tp > 1 and SHAPES[case.model].arch == "deepseek-v3":
        # SGLang auto-enables FlashInfer's allreduce fusion for DeepSeek at tp > 1 on sm90; its
        # kernels JIT-compile on a fresh host (still compiling after 170 s on the x2 host, nothing
        # recorded). A communication fusion, not what specwatch measures: off, and recorded.
        kw["enforce_disable_flashinfer_allreduce_fusion"] = True
    return kw


RENAMED_ARGS = {
    "cuda_graph_max_bs_decode": "cuda_graph_max_bs",
    "disable_prefill_cuda_graph": "disable_piecewise_cuda_graph",
}
"""Engine arguments specwatch passes under their 0.5.14+ names -> the same setting's name in older
releases (0.5.12-0.5.13: one ``cuda_graph_max_bs``; prefill graphs were the "piecewise" graphs)."""
HARNESS_ARGS = {"sleep_on_idle", "enforce_disable_flashinfer_allreduce_fusion", "disable_prefill_cuda_graph",
                "nccl_port"}
"""Arguments that only tune how specwatch runs the engine, not the case: dropped (and recorded)
where the installed SGLang lacks them. Any other unknown argument goes to SGLang, which refuses
it: a version without a feature the case needs (e.g. ``dcp_size`` before 0.5.15) is a result."""


def fit_server_args(kw: dict, known: set[str]) -> tuple[dict, list[str]]:
    """``kw`` for an SGLang whose ``ServerArgs`` has the fields ``known``: renamed where an older
    release names the setting differently, harness-only arguments it lacks dropped (returned)."""
    out, dropped = {}, []
    for k, v in kw.items():
        if k in known:
            out[k] = v
        elif RENAMED_ARGS.get(k) in known:
            out[RENAMED_ARGS[k]] = v
        elif k in HARNESS_ARGS:
            dropped.append(k)
        else:
            out[k] = v
    return out, dropped


def server_arg_names() -> set[str] | None:
    """Field names of the installed SGLang's ``ServerArgs`` (None: not importable)."""
    try:
        import dataclasses

        from sglang.srt.server_args import ServerArgs
        return {f.name for f in dataclasses.fields(ServerArgs)}
    except Exception:
        return None


def recorded_kwargs(kw: dict) -> dict:
    """The engine arguments a record keeps (paths and the rendezvous port dropped: they differ per
    host and per run)."""
    return {k: v for k, v in kw.items() if not k.endswith("_path") and k != "nccl_port"}


RENDEZVOUS_PORTS_FROM = 20000
"""Lowest port ``rendezvous_port`` hands out; it stays below the kernel's ephemeral range."""


def ephemeral_port_floor() -> int:
    """The first port of the kernel's ephemeral range (``ip_local_port_range``; Linux's default 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def rendezvous_port(seed: int | None = None) -> int:
    """A free TCP port for torch.distributed's rendezvous (SGLang's ``nccl_port``), below the
    ephemeral range. SGLang's own choice (``get_free_port``: bind port 0, release) races every other
    process that binds port 0 before its TCP store binds: on the x2 host one of six parallel tp-2
    starts lost that race (EADDRINUSE). Below the ephemeral range only an explicit bind takes a
    port, and parallel workers start their search at different places (``seed``: the pid)."""
    import socket

    lo, hi = RENDEZVOUS_PORTS_FROM, ephemeral_port_floor()
    span = max(hi - lo, 1)
    first = (os.getpid() if seed is None else seed) % span
    for i in range(span):
        port = lo + (first + i) % span
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free TCP port in [{lo}, {hi})")


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


def server_facts(engine) -> dict:
    info = engine.get_server_info()
    states = info.get("internal_states") or [{}]
    return {"specwatch": states[0].get("specwatch", {}), "avg_spec_accept_length": states[0].get("avg_spec_accept_length"),
            "memory_usage": states[0].get("memory_usage"), "version": info.get("version")}


def metric(value, unit, samples=None, expected=None, exact=False, higher_is_better=None) -> dict:
    return {"value": float(value), "unit": unit, "samples": [float(s) for s in (samples or [])],
            "expected": None if expected is None else float(expected), "exact": exact,
            "higher_is_better": higher_is_better}


def host_load() -> float | None:
    """The host's 1-minute load average: a timed case on a busy host (another engine compiling,
    leftover processes) is slower for reasons of its own; ``compare.aa_differences`` names it."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def greedy_sampling(case: Case) -> dict:
    """Sampling parameters of every batch a case sends: greedy (the oracle chain is the expected
    output) for exactly ``output_len`` tokens (``ignore_eos``, which near-full's pool sizing relies on:
    SGLang then reserves each request's whole output at admission)."""
    return {"temperature": 0.0, "max_new_tokens": case.output_len, "ignore_eos": True}


def draft_oracle_for(case: Case, oracle: Oracle) -> Oracle | None:
    """The oracle the draft follows, where its acceptance has a closed form: the case's own profile
    for EAGLE/EAGLE3, the perfect chain for STANDALONE; None for NGRAM and random drafts."""
    if case.profile is Profile.random or case.algorithm not in (Algorithm.EAGLE, Algorithm.EAGLE3,
                                                                Algorithm.STANDALONE):
        return None
    return oracle if case.algorithm is not Algorithm.STANDALONE else Oracle(oracle.shape, 0, Profile.perfect)


def expected_accept_length(draft_oracle: Oracle, case: Case, expected_output: list[int]) -> float:
    """Oracle acceptance length of one request whose greedy output is ``expected_output``."""
    return case.output_len / draft_oracle.expected_verifies(expected_output[0], case.output_len, case.num_steps,
                                                            case.topk, case.num_draft_tokens)


def mismatched_tokens(output_ids: list[int], expected: list[int]) -> int:
    """Output tokens that differ from the oracle chain, plus any length difference."""
    return sum(1 for a, b in zip(output_ids, expected) if a != b) + abs(len(output_ids) - len(expected))


def matches_oracle(measured: list[float], expected: list[float]) -> bool:
    """Every repeat's acceptance length equal to its oracle value (relative 1e-6: float noise only)."""
    return all(abs(m - e) <= 1e-6 * e for m, e in zip(measured, expected, strict=True))


def run_multi_turn(engine, case: Case, repeats: int, warmup: bool) -> dict:
    """Long-prompt multi-turn: each repeat is one batch per turn (``Case.prompt_lens``), sent in order,
    every prompt a prefix of the oracle chain that contains the previous turn's prompt and answer
    (so the radix cache serves it) plus new tokens. Outputs, acceptance and the share of prompt
    tokens the cache served are recorded per repeat; timing covers the whole conversation."""
    oracle = Oracle(SHAPES[case.model], 0, case.profile)
    sp = greedy_sampling(case)
    lens = case.prompt_lens()
    if warmup:
        starts = prompt_starts(case, "warmup", case.batch_size)
        engine.generate(input_ids=[oracle.chain(s, lens[0]) for s in starts], sampling_params=sp)
    tps, walls, als, expected_als, hit_shares = [], [], [], [], []
    mismatches, digest = 0, OutputDigest()
    draft_oracle = draft_oracle_for(case, oracle)
    for starts in timed_starts(case, repeats):
        chains = [oracle.chain(s, lens[-1] + case.output_len) for s in starts]
        n_out, wall, al_turns, exp_turns, cached, later_prompt = 0, 0.0, [], [], 0, 0
        for t, n in enumerate(lens):
            t0 = time.perf_counter()
            outs = engine.generate(input_ids=[c[:n] for c in chains], sampling_params=sp)
            wall += time.perf_counter() - t0
            for o, c in zip(outs, chains):
                exp = c[n:n + case.output_len]
                digest.add(o["output_ids"])
                mismatches += mismatched_tokens(o["output_ids"], exp)
                n_out += len(o["output_ids"])
                m = o["meta_info"]
                al_turns.append(m.get("spec_accept_length", 0.0))
                if draft_oracle is not None:
                    exp_turns.append(expected_accept_length(draft_oracle, case, exp))
                if t > 0:
                    cached += m.get("cached_tokens", 0)
                    later_prompt += n
        walls.append(wall)
        tps.append(n_out / wall)
        als.append(statistics.mean(al_turns))
        if exp_turns:
            expected_als.append(statistics.mean(exp_turns))
        hit_shares.append(cached / max(later_prompt, 1))
    med = statistics.median
    metrics = {
        "output_throughput": metric(med(tps), "tokens/s", tps, higher_is_better=True),
        "wall_time": metric(med(walls), "s", walls, higher_is_better=False),
        "accept_length": metric(med(als), "tokens/verify", als, expected=med(expected_als) if expected_als else None,
                                exact=True, higher_is_better=True),
        "lossless_mismatches": metric(mismatches, "tokens", exact=True, higher_is_better=False),
        # prompt tokens of turns 2.. served by the radix cache (the previous turn's prompt + answer)
        "prefix_cache_hit_share": metric(med(hit_shares), "1", hit_shares, higher_is_better=True),
    }
    checks = {"lossless": mismatches == 0}
    if expected_als:
        checks["accept_length_matches_oracle"] = matches_oracle(als, expected_als)
    return {"metrics": metrics, "checks": checks,
            "details": {"output_digest": digest.hexdigest(), "turn_prompt_lens": lens}}


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


def run_case(engine, case: Case, repeats: int, warmup: bool, calibrate: bool = False) -> dict:
    """One case's timed batches. ``calibrate`` (a probed near-full case): after the warm-up batch,
    resize every prompt by ``near_full_extension`` of the decode peak the probe measured on it."""
    oracle = Oracle(SHAPES[case.model], 0, case.profile)
    sp = greedy_sampling(case)
    input_len = case.input_len

    def batch(tag):
        """(prompts, expected outputs, the chain starts they come from)."""
        starts = prompt_starts(case, tag, case.batch_size)
        chains = [oracle.chain(s, input_len + case.output_len) for s in starts]
        return [c[:input_len] for c in chains], [c[input_len:] for c in chains], starts

    calibration = None
    if warmup:
        engine.generate(input_ids=batch("warmup")[0], sampling_params=sp)
        if calibrate and case.workload is Workload.near_full:
            sw = server_facts(engine)["specwatch"]      # reads (and resets) the warm-up's occupancy
            occ, alloc = sw.get("occupancy") or {}, sw.get("allocator") or {}
            if occ.get("batches") and alloc.get("size"):
                extension = near_full_extension(occ, alloc["size"], case)
                input_len += extension
                calibration = {"warmup_peak_token_usage": occ["peak"], "prompt_extension": extension,
                               "input_len": input_len, "warmup_occupancy": occ}

    tps, decode_tps, als, rates, step_ms, itl_ms, walls, mismatches, verify = [], [], [], [], [], [], [], 0, []
    prefills: list[float] = []
    digest = OutputDigest()
    draft_oracle = draft_oracle_for(case, oracle)
    # NGRAM: its corpus simulated (flushed before the timed batch, so it starts empty); only where
    # the batch decodes together from its prefill on: not near full, and prompts that one prefill
    # batch takes whole (SGLang's chunked_prefill_size on the H200s: 8192)
    ngram = NgramCorpusModel(oracle) if case.algorithm is Algorithm.NGRAM \
        and case.workload is Workload.standard and case.batch_size * case.input_len <= NGRAM_ONE_PREFILL_TOKENS \
        else None
    expected_per_repeat: list[float] = []
    timed: list[list[int]] = []          # each timed batch's chain starts
    hist = None
    flush_failures = flush_refusals = 0   # SGLang refuses a flush until idle: retried (flush_cache)

    def fresh_cache() -> None:
        nonlocal flush_failures, flush_refusals
        flushed, refused = flush_cache(engine)
        flush_failures, flush_refusals = flush_failures + (not flushed), flush_refusals + refused

    for r in range(repeats):
        # Nothing of an earlier batch stays in the radix cache: a timed prompt whose start an earlier
        # batch drew (the tiny-attn oracle has 256 starts) would skip its prefill, and the pairwise
        # decode split below assumes the prefill-only batch and the timed one both prefill in full.
        fresh_cache()
        # A prefill-only batch of the same shape right before each timed batch: decode time is
        # the timed batch's wall time minus it, pairwise, so one slow prefill spoils one repeat only.
        t = time.perf_counter()
        engine.generate(input_ids=batch(f"prefill{r}")[0], sampling_params={**sp, "max_new_tokens": 1})
        prefill_s = time.perf_counter() - t
        prefills.append(prefill_s)
        prompts, expected, starts = batch(timed_tag(r))
        timed.append(starts)
        fresh_cache()
        t = time.perf_counter()
        outs = engine.generate(input_ids=prompts, sampling_params=sp)
        wall = time.perf_counter() - t
        walls.append(wall)
        n_out = sum(len(o["output_ids"]) for o in outs)
        tps.append(n_out / wall)
        decode_s = wall - prefill_s
        if decode_s < MIN_DECODE_SHARE * wall:
            decode_s = None  # prefill-dominated or a noisy prefill sample: no decode split this repeat
        else:
            decode_tps.append(sum(len(o["output_ids"]) - 1 for o in outs) / decode_s)
        for o in outs:
            digest.add(o["output_ids"])
        for o, exp in zip(outs, expected):
            mismatches += mismatched_tokens(o["output_ids"], exp)
        metas = [o["meta_info"] for o in outs]
        als.append(statistics.mean(m.get("spec_accept_length", 0.0) for m in metas))
        rates.append(statistics.mean(m.get("spec_accept_rate", 0.0) for m in metas))
        vct = max(m.get("spec_verify_ct", 0) for m in metas)
        verify.append(vct)
        if decode_s is not None:
            step_ms.append(1e3 * decode_s / max(vct, 1))
            itl_ms.append(1e3 * decode_s / max(case.output_len - 1, 1))
        hist = metas[0].get("spec_accept_histogram", hist)
        if ngram is not None:
            ngram.flush()
            expected_per_repeat.append(statistics.mean(ngram.decode_batch(
                starts, input_len, case.output_len, case.num_draft_tokens)))
        if draft_oracle is not None:
            expected_per_repeat.append(statistics.mean(expected_accept_length(draft_oracle, case, exp)
                                                       for exp in expected))
    med = statistics.median
    expected_al = med(expected_per_repeat) if expected_per_repeat else None
    metrics = {
        "output_throughput": metric(med(tps), "tokens/s", tps, higher_is_better=True),
        "request_throughput": metric(med([case.batch_size / w for w in walls]), "requests/s",
                                     [case.batch_size / w for w in walls], higher_is_better=True),
        "wall_time": metric(med(walls), "s", walls, higher_is_better=False),
        "prefill_time": metric(med(prefills), "s", prefills, higher_is_better=False),
    }
    if decode_tps:
        metrics.update({
            "decode_throughput": metric(med(decode_tps), "tokens/s", decode_tps, higher_is_better=True),
            "step_time": metric(med(step_ms), "ms", step_ms, higher_is_better=False),
            "itl": metric(med(itl_ms), "ms", itl_ms, higher_is_better=False),
        })
    metrics.update({
        "accept_length": metric(med(als), "tokens/verify", als, expected=expected_al, exact=True,
                                higher_is_better=True),
        # SGLang's own: correct drafts / (verify steps x (num_draft_tokens - 1))
        "accept_rate": metric(med(rates), "1", rates, exact=True, higher_is_better=True),
        "verify_steps": metric(med(verify), "steps", verify, exact=True, higher_is_better=False),
        "lossless_mismatches": metric(mismatches, "tokens", exact=True, higher_is_better=False),
    })
    checks = {"lossless": mismatches == 0}
    if expected_per_repeat:
        # every repeat (its own prompts) against its own oracle value
        checks["accept_length_matches_oracle"] = matches_oracle(als, expected_per_repeat)
    return {"metrics": metrics, "checks": checks,
            "details": {"accept_histogram": hist, "prefill_s": prefills, "near_full_calibration": calibration,
                        "cache_flush_failures": flush_failures, "cache_flush_refusals": flush_refusals,
                        # identical prompts (seeded by dcp_twin_id) must give identical outputs
                        "output_digest": digest.hexdigest(),
                        # what the outputs answer: a twin's digest is comparable only with the same
                        "prompt_starts": timed,
                        "decode_split_repeats": len(decode_tps)}}


def pool_coverage(allocator: dict, pool: dict | None, virtual_slot_writes: bool = False) -> dict | None:
    """Does ``pool`` hold every slot the shared allocator can hand out (seed 004)?

    The allocator's pages are 1..num_pages, so its last page ends at ``size + page_size`` (virtual
    slots; with DCP the allocator is ``max_total * dcp`` slots paged ``page * dcp``). A pool is valid
    to ``size + page_size`` in its own slot space, which is the allocator's divided by
    ``scale = allocator.size / pool.size`` (DCP's sharded target pool: dcp; a replicated draft
    pool: 1). ``virtual_slot_writes``: the pool is written at the allocator's virtual slots although
    it is per rank (a target whose attention backend has no DCP code, ``writes_at_virtual_slots``),
    so its slot space is the allocator's (scale 1).
    ``missing_rows`` counts allocator slots past the pool's end, by that definition and, where the
    probe saw the buffer, by the buffer's real row count (``missing_buffer_rows``)."""
    if not pool or not pool.get("size") or pool.get("page_size") is None:
        return None
    structural = allocator["size"] // pool["size"]
    if structural < 1 or structural * pool["size"] != allocator["size"]:
        return {"scale": None, "reason": f"allocator size {allocator['size']} is not a multiple of pool size {pool['size']}"}
    scale = 1 if virtual_slot_writes else structural
    needed = -(-(allocator["size"] + allocator["page_size"]) // scale)
    valid = pool["size"] + pool["page_size"]
    out = {"scale": scale, "allocator_slot_end": needed, "pool_valid_end": valid, "pool_page_size": pool["page_size"],
           "allocator_page_in_pool_slots": allocator["page_size"] // scale, "missing_rows": max(0, needed - valid)}
    if virtual_slot_writes:
        out["writes"] = "at the allocator's virtual slots: the attention backend has no DCP code"
    if pool.get("rows") is not None:
        out["buffer_rows"] = pool["rows"]
        out["missing_buffer_rows"] = max(0, needed - pool["rows"])
    return out


def writes_at_virtual_slots(probe_facts: dict) -> bool:
    """Under DCP, whether the target's KV writes ignore the DCP rank: its attention backend's source
    never mentions DCP (the probe's ``target_attention_backend``), so each rank writes every token at
    the allocator's virtual slot into a pool of allocator size / dcp rows (SGLang 0.5.17's
    flashinfer and fa3 backends; seen on 2xH200 as store_kvcache's bounds assertion near full)."""
    backend = probe_facts.get("target_attention_backend") or {}
    return probe_facts.get("dcp_size", 1) > 1 and backend.get("mentions_dcp") is False


def pool_checks(sw: dict) -> tuple[dict, dict, dict]:
    """Whether each KV pool holds every slot the shared allocator hands out (seed 004), from the
    probe's facts ``sw``: (metrics, checks, coverage details per role). Structural, the same right
    after the engine starts as after a case, so a group that crashes before its first record still
    gets it (``ENGINE_FACTS_EVENT``: on 2xH200 every dcp-2 flashinfer near-full case crashed)."""
    metrics, checks, coverage = {}, {}, {}
    a, dp = sw.get("allocator"), sw.get("draft_kv_pool")
    if not a:
        return metrics, checks, coverage
    virtual = writes_at_virtual_slots(sw)
    for role, pool in (("target", sw.get("target_kv_pool")), ("draft", dp)):
        cov = pool_coverage(a, pool, virtual_slot_writes=role == "target" and virtual)
        if cov and cov.get("scale"):
            coverage[role] = cov
            metrics[f"{role}_pool_missing_rows"] = metric(cov["missing_rows"], "slots", exact=True,
                                                          higher_is_better=False)
            checks[f"{role}_pool_covers_allocator"] = (cov["missing_rows"] == 0
                                                       and cov.get("missing_buffer_rows", 0) == 0)
    if "draft" in coverage:
        checks["draft_pool_page_matches_allocator"] = draft_page_matches(coverage["draft"])
    return metrics, checks, coverage


def draft_page_matches(draft_coverage: dict) -> bool:
    """Seed 004's page rule, from a draft pool's ``pool_coverage``: its page is the allocator's page
    in the pool's own slot space (a replicated draft pool under DCP: page x dcp)."""
    return draft_coverage["pool_page_size"] == draft_coverage["allocator_page_in_pool_slots"]


def radix_cache_tokens(probe_facts: dict) -> int:
    """Tokens SGLang's radix cache held when the probe read it (evictable + protected): not free, and
    not leaked either (SGLang's idle invariant: free + these == capacity)."""
    return sum(probe_facts.get(f"tree_cache_{k}_size") or 0 for k in ("evictable", "protected"))


def req_to_token_vs_model(case: Case, size: int, row_width: float, row_bytes: float,
                          sglang_version: str | None) -> tuple[SizingInput, Sizing, bool]:
    """The memory model beside a measured req_to_token pool of ``size`` request slots: the sizing
    inputs of the case's engine, the model's sizing for that SGLang release (the row rule moved at
    0.5.13 and 0.5.16), and whether the row's width and bytes are the model's."""
    inputs = SizingInput.for_case(case, SHAPES[case.model].max_position, size)
    model = reference_sizing(inputs, sglang_version)
    return inputs, model, model.req_to_token_row_width == row_width and model.req_to_token_bytes == row_bytes


def memory_and_leaks(engine, case: Case) -> tuple[dict, dict, dict]:
    ok_flush, flush_refusals = flush_cache(engine)
    facts = server_facts(engine)
    sw = facts["specwatch"]
    metrics, checks, coverage, sizing_details = {}, {}, {}, None
    if "allocator" in sw:
        a, r = sw["allocator"], sw["req_to_token"]
        capacity_pages = a["num_pages"]
        free_pages = a["unique_free_pages"] if a["unique_free_pages"] is not None else a["free_pages"]
        # After a flush the cache holds nothing; if the flush was refused, what it holds is not a leak.
        leaked = (capacity_pages - free_pages) * a["page_size"] - radix_cache_tokens(sw)
        metrics["leaked_tokens"] = metric(leaked, "tokens", exact=True, higher_is_better=False)
        metrics["leaked_req_slots"] = metric(r["size"] - r["free_slots"], "slots", exact=True, higher_is_better=False)
        checks["no_kv_leak"] = leaked == 0
        checks["no_req_slot_leak"] = r["size"] == r["free_slots"]
        checks["no_double_free"] = a["unique_free_pages"] in (None, a["free_pages"])
        metrics["req_to_token_row_width"] = metric(r["row_width"], "tokens", exact=True)
        metrics["req_to_token_bytes"] = metric(r["bytes"], "bytes", exact=True, higher_is_better=False)
        metrics["allocator_page_size"] = metric(a["page_size"], "tokens", exact=True)
        # token slots the allocator hands out: with DCP, max_total_tokens x dcp virtual slots, while
        # kv_pool_tokens below is the target pool of one rank
        metrics["allocator_tokens"] = metric(a["size"], "tokens", exact=True)
        if sw.get("target_kv_pool"):
            tp = sw["target_kv_pool"]
            metrics["kv_pool_tokens"] = metric(tp["size"], "tokens", exact=True)
            if tp.get("bytes"):
                metrics["kv_pool_bytes"] = metric(tp["bytes"], "bytes", exact=True, higher_is_better=False)
        dp = sw.get("draft_kv_pool")
        if dp:
            if dp.get("bytes"):
                metrics["draft_kv_pool_bytes"] = metric(dp["bytes"], "bytes", exact=True, higher_is_better=False)
        pool_metrics, pool_verdicts, coverage = pool_checks(sw)
        metrics.update(pool_metrics)
        checks.update(pool_verdicts)
        occ = sw.get("occupancy")
        if occ and occ.get("batches"):
            metrics["peak_token_usage"] = metric(occ["peak"], "1", exact=False, higher_is_better=None)
            metrics["near_full_batch_share"] = metric(occ["near_full"] / occ["batches"], "1")
            if occ.get("decode_batches"):
                # decode steps only (prefill chunks and the prefill-only batches run below it by design)
                metrics["near_full_decode_share"] = metric(occ["decode_near_full"] / occ["decode_batches"], "1")
            if "probe_s" in occ:
                # what the probe's per-batch sample itself costs (timed inside the scheduler): the
                # harness-overhead bound that engine-to-engine noise cannot blur (specwatch overhead)
                metrics["probe_time_per_batch"] = metric(occ["probe_s"] / occ["batches"] * 1e6, "us",
                                                         higher_is_better=False)
            if "retracted_requests" in occ:
                # requests SGLang took out of a decode batch for lack of KV slots (each one then reruns)
                metrics["retracted_requests"] = metric(occ["retracted_requests"], "requests", exact=True,
                                                       higher_is_better=False)
        if "fault_code_runs" in sw:
            # a fault run whose edited code never ran in this case could not have been caught
            metrics["fault_code_runs"] = metric(sw["fault_code_runs"], "calls", exact=False, higher_is_better=None)
        warn = sw.get("leak_warnings") or {}
        if any(v is not None for v in warn.values()):
            # SGLang's own idle leak check (strict by default: a leak would have crashed the scheduler)
            checks["sglang_idle_check_clean"] = not any(warn.values())
        if sw.get("cuda"):
            metrics["peak_gpu_memory"] = metric(sw["cuda"]["max_allocated"], "bytes", higher_is_better=False)
        # The CPU-tier memory model next to the real objects
        inputs, model, checks["req_to_token_matches_model"] = req_to_token_vs_model(
            case, r["size"], r["row_width"], r["bytes"], facts.get("version"))
        metrics["model_req_to_token_bytes"] = metric(model.req_to_token_bytes, "bytes", exact=True)
        # ...and the running SGLang's own sizing functions on the same inputs: when a row width moves
        # between versions, this says whether the sizing rule moved or something else did
        try:
            own = sglang_sizing(inputs)
        except Exception as e:                       # an older SGLang without the sizing module
            sizing_details = {"error": f"{type(e).__name__}: {e}"[:300]}
        else:
            sizing_details = own.as_dict()
            metrics["sglang_alloc_len_per_decode"] = metric(own.alloc_len_per_decode, "tokens", exact=True)
            checks["req_to_token_matches_sglang_sizing"] = own.req_to_token_row_width == r["row_width"]
    checks["flush_cache"] = ok_flush
    return metrics, checks, {"probe": sw, "pool_coverage": coverage, "sglang_sizing": sizing_details,
                             "engine_memory_usage": facts.get("memory_usage"),
                             "leak_check_flush_refusals": flush_refusals}


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    cases = [Case(**c) for c in spec["cases"]]
    probe = spec.get("probe", True)       # False: a bare run, no probe in SGLang's processes
    out = open(spec["results"], "a")

    def emit(obj):
        out.write(json.dumps(obj, default=str) + "\n")
        out.flush()
        os.fsync(out.fileno())

    first = cases[0]
    lock = WorkerTimingLock()
    lock.starting(emit)
    t0 = time.perf_counter()
    target, draft = ensure_models(Path(spec["models_dir"]), first.model, first.profile, first.algorithm, device="cuda")
    gen_s = time.perf_counter() - t0
    import sglang

    known = server_arg_names()       # before the clock: the engine imports it anyway
    t0 = time.perf_counter()
    try:
        kwargs = engine_kwargs(first, target, draft, max(c.batch_size for c in cases), kv_pool_tokens(cases))
        kwargs["nccl_port"] = rendezvous_port()     # tp 1 too: its process group has a TCP store
        kwargs, dropped_args = fit_server_args(kwargs, known) if known else (kwargs, [])
        engine = sglang.Engine(**kwargs)
    except Exception as e:
        tail = traceback.format_exc()[-4000:]
        where = sglang_refusal(e)
        status, reason = (("skipped", f"refused by SGLang {getattr(sglang, '__version__', '?')} ({where}): {e}") if where else
                          ("failed", f"engine start: {type(e).__name__}: {e}"))
        for c in cases:
            emit({"case_id": c.case_id, "status": status, "started_at": now(), "finished_at": now(),
                  "reason": reason[:2000], "log_tail": tail})
        return 0
    start_s = time.perf_counter() - t0
    emit({"event": ENGINE_STARTED_EVENT, "engine_start_s": start_s})
    waited_s = lock.timing(emit)
    facts_start = server_facts(engine)
    if probe and "allocator" in facts_start["specwatch"]:
        # the pool layout before any case runs: a crashed or timed-out case still records it
        pool_metrics, pool_verdicts, coverage = pool_checks(facts_start["specwatch"])
        emit({"event": ENGINE_FACTS_EVENT, "metrics": pool_metrics, "checks": pool_verdicts,
              "details": {"pool_coverage_at_start": coverage}})
    for c in cases:
        started = now()
        load_before = host_load()
        try:
            if c.workload is Workload.long_prompt_multi_turn:
                res = run_multi_turn(engine, c, spec["repeats"], spec["warmup"])
            else:
                res = run_case(engine, c, spec["repeats"], spec["warmup"], calibrate=probe)
            if probe:
                mem_metrics, mem_checks, details = memory_and_leaks(engine, c)
            else:   # bare run: no probe in SGLang's processes, so no facts to read (timing baseline)
                mem_metrics, mem_checks, details = {}, {"flush_cache": flush_cache(engine)[0]}, {"bare": True}
            res["metrics"].update(mem_metrics)
            res["metrics"]["engine_start_time"] = metric(start_s, "s", higher_is_better=False)
            res["metrics"]["model_generation_time"] = metric(gen_s, "s")
            res["checks"].update(mem_checks)
            res["details"].update(details)
            res["details"]["sglang_version"] = facts_start.get("version")
            res["details"]["engine_kwargs"] = recorded_kwargs(kwargs)
            res["details"]["host_load"] = {"before": load_before, "after": host_load()}
            if dropped_args:
                res["details"]["engine_args_not_in_this_sglang"] = dropped_args
            if lock.enabled:
                res["details"]["parallel_starts"] = int(os.environ.get(PARALLEL_ENV, "0")) or None
                if lock.overlapping:
                    res["details"]["overlap_starts"] = True     # timed while other engines started
                res["details"]["waited_for_timing_s"] = round(waited_s, 3)
            emit({"case_id": c.case_id, "status": "ok", "started_at": started, "finished_at": now(), **res})
        except Exception as e:
            emit({"case_id": c.case_id, "status": "failed", "started_at": started, "finished_at": now(),
                  "reason": f"{type(e).__name__}: {e}"[:2000], "log_tail": traceback.format_exc()[-4000:]})
    try:
        engine.shutdown()
    except Exception:
        pass
    lock.release()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
