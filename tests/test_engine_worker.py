"""The GPU worker's per-case logic on a fake engine (no GPU): lossless counting, acceptance vs the
oracle, leak and memory checks from the probe's facts."""

import pytest

from specwatch.core.case import Algorithm, Backend, Case, ModelSize, Profile
from specwatch.oracle.predict import Oracle
from specwatch.oracle.prompts import prompt_starts
from specwatch.oracle.shapes import FIRST_ACTIVE, SHAPES
from specwatch.rules.pools import pool_coverage
from specwatch.worker.engine_args import engine_kwargs, sglang_refusal
from specwatch.worker.measure import run_case
from specwatch.worker.memory_facts import memory_and_leaks


class FakeEngine:
    """Greedy oracle chain with a fixed acceptance length; optional corruption and leak."""

    def __init__(
        self,
        case: Case,
        corrupt_every: int = 0,
        leaked_pages: int = 0,
        row_width: int = None,
        draft_page_scaled: bool = True,
        backend_mentions_dcp: bool = True,
    ):
        self.case, self.corrupt_every, self.leaked_pages = case, corrupt_every, leaked_pages
        self.backend_mentions_dcp = backend_mentions_dcp  # False: an attention backend with no DCP code
        self.row_width = row_width
        self.draft_page_scaled = draft_page_scaled  # False: seed 004's draft pool paged by the server page
        self.oracle = Oracle(SHAPES[case.model], 0, Profile.perfect)
        self.cache: list[list[int]] = []  # a radix cache, crudely: sequences whose KV exists

    def cached_tokens(self, prompt):
        best = 0
        for seq in self.cache:
            n = 0
            for a, b in zip(seq, prompt):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return min(best, len(prompt) - 1) // self.case.page_size * self.case.page_size

    def generate(self, input_ids, sampling_params):
        n = sampling_params["max_new_tokens"]
        outs = []
        for prompt in input_ids:
            j = prompt[-1] - FIRST_ACTIVE
            chain = self.oracle.chain(int(j), n + 1)[1:]
            if self.corrupt_every:
                chain = [t + 1 if i % self.corrupt_every == 0 else t for i, t in enumerate(chain)]
            verify = -(-(n - 1) // (self.case.num_steps + 1))
            meta = (
                {"spec_accept_length": n / verify, "spec_verify_ct": verify, "spec_accept_rate": 0.5} if verify else {}
            )
            meta["cached_tokens"] = self.cached_tokens(prompt)
            self.cache.append(list(prompt) + chain[:-1])
            outs.append({"output_ids": chain, "meta_info": meta})
        return outs

    def flush_cache(self):
        return True

    def get_server_info(self):
        c = self.case
        from specwatch.rules.memory_model import SizingInput, reference_sizing

        model = reference_sizing(SizingInput.for_case(c, SHAPES[c.model].max_position, 8))
        row = self.row_width or model.req_to_token_row_width
        pages, p, d = 4096, c.page_size, c.dcp
        # SGLang 0.5.17's layout: allocator over max_total * dcp virtual slots paged p * dcp; the target
        # pool sharded per rank (max_total slots, page p); the draft pool replicated over the virtual slots.
        draft_page = p * d if self.draft_page_scaled else p
        facts = {
            "req_to_token": {"row_width": row, "bytes": 9 * row * 4, "size": 8, "free_slots": 8},
            "allocator": {
                "size": pages * p * d,
                "page_size": p * d,
                "num_pages": pages,
                "free_pages": pages - self.leaked_pages,
                "unique_free_pages": pages - self.leaked_pages,
            },
            "target_kv_pool": {"size": pages * p, "page_size": p, "bytes": 1 << 30, "rows": pages * p + p},
            "draft_kv_pool": {
                "size": pages * p * d,
                "page_size": draft_page,
                "bytes": 1 << 28,
                "rows": pages * p * d + draft_page,
            },
            "cuda": {"max_allocated": 1 << 31},
            "dcp_size": d,
            "target_attention_backend": {"class": "Backend", "module": "m", "mentions_dcp": self.backend_mentions_dcp},
        }
        return {"internal_states": [{"specwatch": facts}], "version": "fake"}


CASE = Case(
    model=ModelSize.tiny,
    algorithm=Algorithm.EAGLE,
    attention_backend=Backend.triton,
    page_size=64,
    topk=1,
    num_steps=3,
    num_draft_tokens=4,
    batch_size=2,
    input_len=32,
    output_len=64,
)


def test_clean_case_passes_every_check():
    eng = FakeEngine(CASE)
    res = run_case(eng, CASE, repeats=2, warmup=True)
    assert res["checks"] == {"lossless": True, "accept_length_matches_oracle": True}
    assert res["metrics"]["accept_length"]["expected"] == res["metrics"]["accept_length"]["value"]
    metrics, checks, _ = memory_and_leaks(eng, CASE)
    assert all(checks.values()), checks
    assert metrics["leaked_tokens"]["value"] == 0


def test_corruption_leak_and_row_mismatch_are_flagged():
    eng = FakeEngine(CASE, corrupt_every=10, leaked_pages=3, row_width=4096)
    res = run_case(eng, CASE, repeats=1, warmup=False)
    assert not res["checks"]["lossless"] and res["metrics"]["lossless_mismatches"]["value"] == 2 * 7
    metrics, checks, _ = memory_and_leaks(eng, CASE)
    assert not checks["no_kv_leak"] and metrics["leaked_tokens"]["value"] == 3 * 64
    assert not checks["req_to_token_matches_model"]


def test_prompts_are_seeded_and_distinct():
    assert prompt_starts(CASE, "timed0", 4) == prompt_starts(CASE, "timed0", 4)
    assert prompt_starts(CASE, "timed0", 4) != prompt_starts(CASE, "timed1", 4)


def test_dcp_case_shares_prompts_with_its_dcp1_twin_and_records_an_output_digest():
    tp2 = CASE.model_copy(update={"tp": 2})
    dcp2 = tp2.model_copy(update={"dcp": 2})
    assert dcp2.case_id != tp2.case_id and dcp2.dcp_twin_id() == tp2.case_id
    assert prompt_starts(dcp2, "timed0", 4) == prompt_starts(tp2, "timed0", 4)
    assert prompt_starts(CASE, "timed0", 4) != prompt_starts(tp2, "timed0", 4)
    details = run_case(FakeEngine(tp2), tp2, repeats=2, warmup=False)["details"]
    a = details["output_digest"]
    b = run_case(FakeEngine(dcp2), dcp2, repeats=2, warmup=False)["details"]["output_digest"]
    c = run_case(FakeEngine(dcp2, corrupt_every=50), dcp2, repeats=2, warmup=False)["details"]["output_digest"]
    assert a == b != c
    # the record says which prompts the digest answers, and a lossless digest is the oracle's
    from specwatch.oracle.prompts import lossless_output_digest, timed_starts

    assert (
        details["prompt_starts"]
        == timed_starts(tp2, 2)
        == [prompt_starts(tp2, f"timed{r}", tp2.batch_size) for r in (0, 1)]
    )
    assert lossless_output_digest(tp2, tp2.input_len, details["prompt_starts"]) == a


@pytest.mark.parametrize("page,dcp,missing", [(64, 2, 64), (64, 8, 448), (1, 2, 1), (16, 4, 48)])
def test_draft_pool_paged_by_the_server_page_misses_rows_under_dcp(page, dcp, missing):
    """Seed 004: a draft pool paged p instead of p*dcp ends p*(dcp-1) slots before the allocator."""
    case = CASE.model_copy(update={"page_size": page, "tp": dcp, "dcp": dcp})
    metrics, checks, details = memory_and_leaks(FakeEngine(case), case)
    assert checks["draft_pool_covers_allocator"] and checks["target_pool_covers_allocator"]
    assert details["pool_coverage"]["target"]["scale"] == dcp and details["pool_coverage"]["draft"]["scale"] == 1
    assert metrics["allocator_tokens"]["value"] == dcp * metrics["kv_pool_tokens"]["value"]
    metrics, checks, details = memory_and_leaks(FakeEngine(case, draft_page_scaled=False), case)
    assert not checks["draft_pool_covers_allocator"] and not checks["draft_pool_page_matches_allocator"]
    assert metrics["draft_pool_missing_rows"]["value"] == missing
    assert details["pool_coverage"]["draft"]["missing_buffer_rows"] == missing
    assert checks["target_pool_covers_allocator"]


@pytest.mark.parametrize("dcp", [2, 8])
def test_a_target_backend_without_dcp_code_is_flagged_at_any_occupancy(dcp):
    # 2xH200, SGLang 0.5.17: flashinfer (no DCP code) at dcp 2 ran right at ~1% usage and hit
    # store_kvcache's bounds assertion near full: it writes at the allocator's virtual slot into a
    # per-rank pool. The probe names the backend; the check fails in the 1% run already.
    case = CASE.model_copy(update={"tp": dcp, "dcp": dcp})
    metrics, checks, details = memory_and_leaks(FakeEngine(case, backend_mentions_dcp=False), case)
    assert not checks["target_pool_covers_allocator"] and checks["draft_pool_covers_allocator"]
    # slots up to the allocator's end (size + page, paged page*dcp) against one rank's size + page
    assert metrics["target_pool_missing_rows"]["value"] == (dcp - 1) * (
        metrics["kv_pool_tokens"]["value"] + case.page_size
    )
    assert details["pool_coverage"]["target"]["scale"] == 1
    assert "virtual slots" in details["pool_coverage"]["target"]["writes"]
    one = CASE.model_copy(update={"tp": dcp})  # dcp 1: nothing to shard, nothing flagged
    assert memory_and_leaks(FakeEngine(one, backend_mentions_dcp=False), one)[1]["target_pool_covers_allocator"]


def test_pool_coverage_without_a_common_slot_space_is_not_judged():
    assert pool_coverage({"size": 1000, "page_size": 64}, {"size": 300, "page_size": 64})["scale"] is None
    assert pool_coverage({"size": 1000, "page_size": 64}, None) is None


def test_engine_kwargs_map_case_fields():
    from pathlib import Path

    kw = engine_kwargs(
        CASE.model_copy(update={"dcp": 2, "tp": 2, "profile": Profile.random}), Path("/t"), Path("/d"), 8
    )
    assert kw["speculative_algorithm"] == "EAGLE" and kw["page_size"] == 64 and kw["dcp_size"] == 2
    assert kw["speculative_draft_load_format"] == "dummy" and kw["tp_size"] == 2
    assert "dcp_size" not in engine_kwargs(CASE, Path("/t"), Path("/d"), 8)
    # near-full prefills whole prompts (a chunked one left the 16th of 16 requests waiting on the H200)
    from specwatch.core.case import Workload

    assert (
        engine_kwargs(CASE.model_copy(update={"workload": Workload.near_full}), Path("/t"), Path("/d"), 16)[
            "chunked_prefill_size"
        ]
        == -1
    )
    assert "chunked_prefill_size" not in engine_kwargs(CASE, Path("/t"), Path("/d"), 8)


def test_acceptance_is_checked_per_repeat_against_its_own_prompts():
    """q=0.3: each repeat's prompts give a different oracle acceptance; a fake engine that reports
    the perfect draft's acceptance must fail the check, one that follows the oracle must pass."""
    case = CASE.model_copy(update={"profile": Profile.q03, "output_len": 128})

    class OracleEngine(FakeEngine):
        def generate(self, input_ids, sampling_params):
            outs = super().generate(input_ids, sampling_params)
            n = sampling_params["max_new_tokens"]
            if n > 1:
                q = Oracle(SHAPES[case.model], 0, Profile.q03)
                for o in outs:
                    v = q.expected_verifies(o["output_ids"][0], n, case.num_steps, 1, case.num_steps + 1)
                    o["meta_info"] = {"spec_accept_length": n / v, "spec_verify_ct": v}
            return outs

    good = run_case(OracleEngine(case), case, repeats=3, warmup=False)
    assert good["checks"]["accept_length_matches_oracle"] and good["checks"]["lossless"]
    assert len(set(good["metrics"]["accept_length"]["samples"])) > 1  # repeats really differ
    bad = run_case(FakeEngine(case), case, repeats=3, warmup=False)
    assert not bad["checks"]["accept_length_matches_oracle"]


class FakeClock:
    """engine_worker's ``time`` with ``perf_counter`` read from ``now`` (the rest is the real module):
    timings exact however loaded the host is."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now

    def __getattr__(self, name):
        import time

        return getattr(time, name)


class TimedFakeEngine(FakeEngine):
    """Takes ``prefill_s`` of ``clock`` for a prefill-only batch, ``full_s`` for a full one."""

    def __init__(self, case, prefill_s, full_s, clock):
        super().__init__(case)
        self.prefill_s, self.full_s, self.clock = prefill_s, full_s, clock

    def generate(self, input_ids, sampling_params):
        self.clock.now += self.prefill_s if sampling_params["max_new_tokens"] == 1 else self.full_s
        return super().generate(input_ids, sampling_params)


def _timed_engine(monkeypatch, prefill_s, full_s):
    from specwatch.worker import measure as engine_worker

    clock = FakeClock()
    monkeypatch.setattr(engine_worker, "time", clock)
    return TimedFakeEngine(CASE, prefill_s, full_s, clock)


def test_decode_split_uses_each_repeats_own_prefill(monkeypatch):
    res = run_case(_timed_engine(monkeypatch, prefill_s=0.02, full_s=0.12), CASE, repeats=2, warmup=False)
    m = res["metrics"]
    assert len(m["prefill_time"]["samples"]) == 2 and res["details"]["decode_split_repeats"] == 2
    # decode ~ 0.10 s for 2 x 63 tokens
    assert 900 < m["decode_throughput"]["value"] < 1400


def test_prefill_dominated_case_gets_no_decode_metrics(monkeypatch):
    """A prefill as long as the whole batch (long prompts, tiny output) must not yield an absurd
    decode throughput: the decode split is dropped, the rest of the case stands."""
    res = run_case(_timed_engine(monkeypatch, prefill_s=0.1, full_s=0.1), CASE, repeats=2, warmup=False)
    assert "decode_throughput" not in res["metrics"] and "step_time" not in res["metrics"]
    assert res["metrics"]["output_throughput"]["value"] > 0 and res["details"]["decode_split_repeats"] == 0


def test_near_full_pool_holds_the_largest_batchs_peak_in_whole_pages():
    from specwatch.core.case import Workload
    from specwatch.rules.validity import skip_reason
    from specwatch.worker.near_full import (
        KV_TOKENS,
        kv_pool_tokens,
        near_full_request_tokens,
    )

    assert kv_pool_tokens([CASE]) == KV_TOKENS[CASE.model]
    nf = [
        CASE.model_copy(update={"workload": Workload.near_full, "batch_size": b, "input_len": 6144, "output_len": 256})
        for b in (4, 16)
    ]
    assert skip_reason(nf[0]) is None
    reserve = 2 * max(CASE.num_steps * CASE.topk, CASE.num_draft_tokens)  # chain: alloc_reserve_per_decode
    if CASE.page_size > 1 and CASE.topk > 1:  # tree on paged KV: whole pages per branch
        reserve = 2 * max(
            CASE.topk * CASE.page_size * -(-(CASE.page_size - 1 + CASE.num_steps) // CASE.page_size),
            CASE.num_draft_tokens,
        )
    per_request = -(-(6144 + 256 + reserve) // CASE.page_size) * CASE.page_size
    assert near_full_request_tokens(nf[0]) == per_request
    pool = kv_pool_tokens(nf)
    assert pool == 16 * per_request and pool % CASE.page_size == 0
    # by specwatch's reserve model, usage after the first decode step would already pass 0.95; measured on
    # the H200 it peaked at 0.9375, so run_case calibrates the prompts (next test)
    assert 16 * (6144 + reserve) / pool > 0.95
    # DCP: SGLang's allocator holds max_total_tokens * dcp virtual slots, so the pool asked for is per
    # rank, in whole pages, and each request is rounded to allocator pages (page * dcp)
    dcp2 = [c.model_copy(update={"tp": 2, "dcp": 2}) for c in nf]
    per_rank = kv_pool_tokens(dcp2)
    assert per_rank % CASE.page_size == 0 and 2 * per_rank == 16 * near_full_request_tokens(dcp2[1])
    # an output that is a large share of each request cannot hold usage above 0.95: refused with the reason
    long_output = nf[0].model_copy(update={"input_len": 1152})
    assert "near-full holds token usage above 0.95 only when output_len is at most 5%" in skip_reason(long_output)


def test_deepseek_at_tp2_runs_without_allreduce_fusion_and_records_its_kwargs():
    from pathlib import Path

    from specwatch.worker.engine_args import recorded_kwargs

    mla = CASE.model_copy(update={"model": ModelSize.tiny_mla, "tp": 2, "dcp": 2})
    kw = engine_kwargs(mla, Path("/t"), None, 8)
    assert kw["enforce_disable_flashinfer_allreduce_fusion"] is True and kw["dcp_size"] == 2
    assert kw["sleep_on_idle"] is True  # idle engines (parallel starts) must not spin a core
    assert "enforce_disable_flashinfer_allreduce_fusion" not in engine_kwargs(
        CASE.model_copy(update={"tp": 2}), Path("/t"), None, 8
    )
    assert "model_path" not in recorded_kwargs(kw) and recorded_kwargs(kw)["page_size"] == CASE.page_size


def test_multi_turn_resends_each_answer_and_reads_the_prefix_cache():
    from specwatch.core.case import Workload
    from specwatch.rules.validity import skip_reason
    from specwatch.worker.multi_turn import run_multi_turn

    case = CASE.model_copy(
        update={"workload": Workload.long_prompt_multi_turn, "input_len": 1024, "output_len": 256, "page_size": 256}
    )
    assert case.prompt_lens() == [1024, 1536, 2048]
    res = run_multi_turn(FakeEngine(case), case, repeats=2, warmup=True)
    assert res["checks"] == {"lossless": True, "accept_length_matches_oracle": True}
    assert res["metrics"]["lossless_mismatches"]["value"] == 0
    # turn 2 finds turn 1's prompt + answer (1279 tokens with KV: 1024 in whole pages) of its 1536;
    # turn 3 finds 1791 (1536 in whole pages) of its 2048
    assert res["metrics"]["prefix_cache_hit_share"]["value"] == (1024 + 1536) / (1536 + 2048)
    bad = run_multi_turn(FakeEngine(case, corrupt_every=100), case, repeats=1, warmup=False)
    assert not bad["checks"]["lossless"] and bad["details"]["output_digest"] != res["details"]["output_digest"]
    too_long = case.model_copy(update={"input_len": 7000})
    assert (
        "context length" in skip_reason(too_long)
        and skip_reason(too_long.model_copy(update={"workload": Workload.standard})) is None
    )


@pytest.mark.parametrize("workload,probe", [("standard", True), ("standard", False), ("long-prompt-multi-turn", True)])
def test_worker_main_end_to_end_on_a_fake_sglang(tmp_path, monkeypatch, workload, probe):
    """The worker's main as the runner starts it (spec file in, JSON lines out), with sglang.Engine
    replaced by the fake engine: the kwargs it gets, the records it writes, bare and multi-turn."""
    import json
    import sys
    import types

    from specwatch.core.case import Workload
    from specwatch.worker import main as worker_main

    case = CASE.model_copy(update={"workload": Workload(workload), "input_len": 256, "output_len": 64})
    got = {}

    class Engine(FakeEngine):
        def __init__(self, **kw):
            got.update(kw)
            super().__init__(case)

        def shutdown(self):
            got["shutdown"] = True

    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=Engine))
    monkeypatch.setattr(worker_main, "case_models", lambda *a, **k: (tmp_path / "t", tmp_path / "d"))
    out = tmp_path / "out.jsonl"
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "cases": [case.params()],
                "repeats": 2,
                "warmup": True,
                "models_dir": str(tmp_path),
                "fault": None,
                "probe": probe,
                "results": str(out),
            }
        )
    )
    assert worker_main.main(str(spec)) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[0]["event"] == "engine_started"
    rec = lines[-1]
    assert rec["case_id"] == case.case_id and rec["status"] == "ok", rec.get("log_tail")
    assert rec["details"]["host_load"]["before"] >= 0 and rec["details"]["host_load"]["after"] >= 0
    assert rec["checks"]["lossless"] and rec["checks"]["accept_length_matches_oracle"]
    assert (
        rec["details"]["engine_kwargs"]["sleep_on_idle"] is True and "model_path" not in rec["details"]["engine_kwargs"]
    )
    assert got["shutdown"] and got["model_path"] == str(tmp_path / "t")
    assert ("no_kv_leak" in rec["checks"]) == probe and rec["details"].get("bare", False) == (not probe)
    assert ("prefix_cache_hit_share" in rec["metrics"]) == (workload == "long-prompt-multi-turn")


@pytest.mark.parametrize(
    "release,status,module",
    [
        ("0.5.12", "skipped", None),
        ("0.5.17", "ok", "sglang.srt.speculative.eagle_utils"),
        ("0.5.23", "ok", "sglang.srt.mem_cache.allocation_sizing"),
    ],
)
def test_the_worker_plans_the_fault_for_the_running_release(tmp_path, monkeypatch, release, status, module):
    """The fault's edit is the running release's (the probe of SGLang's processes gets it through
    the environment); a release without an edit records every case skipped with the adapter's
    reason instead of running it clean."""
    import json
    import os
    import sys
    import types

    from specwatch.inject.faults import PLAN_ENV, FaultPlan
    from specwatch.worker import main as worker_main

    seen = {}

    class Engine(FakeEngine):
        def __init__(self, **kw):
            seen["plan"] = os.environ.get(PLAN_ENV)
            super().__init__(CASE)

    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=Engine, __version__=release))
    monkeypatch.setattr(worker_main, "case_models", lambda *a, **k: (tmp_path / "t", tmp_path / "d"))
    monkeypatch.setenv("SPECWATCH_FAULT", "unaligned-watermark")
    monkeypatch.delenv(PLAN_ENV, raising=False)
    out, spec = tmp_path / "out.jsonl", tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "cases": [CASE.params()],
                "repeats": 1,
                "warmup": False,
                "models_dir": str(tmp_path),
                "fault": "unaligned-watermark",
                "probe": False,
                "results": str(out),
            }
        )
    )
    assert worker_main.main(str(spec)) == 0
    rec = [json.loads(x) for x in out.read_text().splitlines()][-1]
    assert rec["status"] == status, rec.get("reason")
    if module is None:
        assert "0.5.12" in rec["reason"] and "not rounded up" in rec["reason"] and "plan" not in seen
    else:
        plan = FaultPlan.from_json(seen["plan"])
        assert plan.release == release and plan.modules == (module,)


@pytest.mark.sglang
def test_every_engine_argument_is_a_server_arg_of_the_installed_sglang():
    """A misspelt or removed engine argument fails every GPU case at start: check them all here
    against the installed SGLang's ServerArgs (0.5.17 in CI), for every case shape the suites use."""
    import dataclasses
    from pathlib import Path

    from specwatch.core.case import Algorithm, Workload
    from specwatch.core.sglang_host import ensure_import_stubs

    ensure_import_stubs()
    from sglang.srt.server_args import ServerArgs

    names = {f.name for f in dataclasses.fields(ServerArgs)}
    for update in (
        {},
        {"tp": 2, "dcp": 2},
        {"model": ModelSize.tiny_mla, "tp": 2, "dcp": 2},
        {"algorithm": Algorithm.NGRAM},
        {"algorithm": Algorithm.EAGLE3},
        {"profile": Profile.random},
        {"workload": Workload.near_full},
    ):
        case = CASE.model_copy(update=update)
        kw = engine_kwargs(case, Path("/t"), Path("/d"), 8, 4096)
        assert set(kw) <= names, (update, set(kw) - names)


@pytest.mark.sglang
def test_records_carry_the_running_sglangs_own_sizing():
    """Row width checked against SGLang's own sizing functions as well as specwatch's model."""
    metrics, checks, details = memory_and_leaks(FakeEngine(CASE), CASE)
    assert checks["req_to_token_matches_sglang_sizing"]
    assert details["sglang_sizing"]["req_to_token_row_width"] == metrics["req_to_token_row_width"]["value"]
    assert metrics["sglang_alloc_len_per_decode"]["value"] == details["sglang_sizing"]["alloc_len_per_decode"]
    _, checks, _ = memory_and_leaks(FakeEngine(CASE, row_width=4096), CASE)
    assert not checks["req_to_token_matches_sglang_sizing"]


def test_engine_arguments_fit_older_sglang_releases():
    """0.5.12/0.5.13 (read from their ServerArgs): one cuda_graph_max_bs, prefill graphs called
    piecewise, no dcp_size; a harness-only argument an SGLang lacks is dropped and said, a case
    argument it lacks goes through so that SGLang refuses the case (a recorded result)."""
    from pathlib import Path

    from specwatch.worker.engine_args import (
        engine_kwargs,
        fit_server_args,
        server_arg_names,
    )

    kw = engine_kwargs(CASE.model_copy(update={"dcp": 2, "tp": 2}), Path("/t"), Path("/d"), 8)
    old = set(kw) - {"cuda_graph_max_bs_decode", "disable_prefill_cuda_graph", "dcp_size", "sleep_on_idle"} | {
        "cuda_graph_max_bs",
        "disable_piecewise_cuda_graph",
    }
    fitted, dropped = fit_server_args(kw, old)
    assert fitted["cuda_graph_max_bs"] == 8 and fitted["disable_piecewise_cuda_graph"] is True
    assert "cuda_graph_max_bs_decode" not in fitted and "disable_prefill_cuda_graph" not in fitted
    assert dropped == ["sleep_on_idle"] and fitted["dcp_size"] == 2
    current = server_arg_names()
    if current is not None:  # the CPU tier's SGLang 0.5.17: everything fits as is
        assert fit_server_args(kw, current) == (kw, [])


def test_near_full_prompts_are_calibrated_to_the_warmups_measured_peak():
    """The H200 run this was made for: pool from specwatch's reserve model, measured peak 0.9375 at page
    64 and 256 (15 requests' worth of the modelled pool), no decode step above 0.95. The prompts are
    resized by whole pages so the batch fits with one page per request to spare: above 0.95 from the
    first decode step to the last, whichever explains the 0.9375."""
    from specwatch.core.case import Workload
    from specwatch.worker.near_full import near_full_extension

    nf = CASE.model_copy(
        update={
            "workload": Workload.near_full,
            "batch_size": 16,
            "input_len": 6144,
            "output_len": 256,
            "topk": 8,
            "num_draft_tokens": 16,
        }
    )
    for page, slots in ((64, 135168), (256, 233472)):  # the two measured engines
        c = nf.model_copy(update={"page_size": page})
        for running in (16, 15):  # all 16 held less than modelled / one was retracted
            occ = {"peak": 0.9375, "decode_peak": 0.9375, "decode_peak_requests": running}
            ext = near_full_extension(occ, slots, c)
            assert ext % page == 0
            per_request = 0.9375 * slots / running + ext
            peak = 16 * per_request / slots
            assert 16 * (per_request + page) <= slots < 16 * (per_request + 2 * page)  # one spare page each
            assert peak - 256 * 16 / slots > 0.95  # prompts + reserve alone are past 0.95
        assert near_full_extension({"peak": 0.9375, "decode_peak": 0.9375, "decode_peak_requests": 15}, slots, c) < 0
    # an older probe's occupancy (no decode peak): the overall peak over the whole batch
    assert near_full_extension({"peak": 0.9375}, 135168, nf.model_copy(update={"page_size": 64})) == 448
    assert near_full_extension({"peak": 0.0}, 10**9, nf) == 8192 - 6144 - 256  # never past the model's context
    assert near_full_extension({"peak": 1.0, "decode_peak": 1.0, "decode_peak_requests": 1}, 10**5, nf) == -3072
    # ^ one request filled the pool: never below half the planned prompt

    class NearFullEngine(FakeEngine):
        def __init__(self, case):
            super().__init__(case)
            self.prompt_lens, self.reads = [], 0

        def generate(self, input_ids, sampling_params):
            self.prompt_lens.append(len(input_ids[0]))
            return super().generate(input_ids, sampling_params)

        def get_server_info(self):
            info = super().get_server_info()
            self.reads += 1
            info["internal_states"][0]["specwatch"]["occupancy"] = dict(OCC)
            return info

    OCC = {"batches": 90, "near_full": 0, "peak": 0.9375, "decode_peak": 0.9, "decode_peak_requests": 16}
    eng = NearFullEngine(nf)
    res = run_case(eng, nf, repeats=2, warmup=True, calibrate=True)
    ext = near_full_extension(OCC, 4096 * 64, nf)  # the fake allocator: 4096 pages
    assert ext > 0 and eng.reads == 1
    assert eng.prompt_lens == [6144] + [6144 + ext] * 4  # warm-up, then 2 x (prefill, timed)
    assert res["details"]["near_full_calibration"]["input_len"] == 6144 + ext
    assert res["checks"]["lossless"] and res["checks"]["accept_length_matches_oracle"]
    eng = NearFullEngine(nf)  # a bare run has no probe to read
    assert run_case(eng, nf, repeats=1, warmup=True)["details"]["near_full_calibration"] is None
    assert eng.prompt_lens == [6144] * 3 and eng.reads == 0


def test_near_full_share_is_also_counted_over_decode_steps_only():
    from specwatch.worker.memory_facts import memory_and_leaks

    class Eng(FakeEngine):
        def get_server_info(self):
            info = super().get_server_info()
            info["internal_states"][0]["specwatch"]["occupancy"] = {
                "batches": 100,
                "near_full": 60,
                "peak": 0.97,
                "decode_batches": 64,
                "decode_near_full": 60,
            }
            return info

    metrics, _, _ = memory_and_leaks(Eng(CASE), CASE)
    assert metrics["near_full_batch_share"]["value"] == 0.6
    assert metrics["near_full_decode_share"]["value"] == 60 / 64


def _raise_from(tmp_path, rel: str, exc: str):
    """Raise ``exc`` from a function defined in a file at ``tmp_path/rel`` (a stand-in SGLang file)."""
    path = tmp_path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"def check():\n    raise {exc}('speculative_eagle_topk > 1 with page_size > 1 is unstable')\n")
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    try:
        namespace["check"]()
    except Exception as e:  # noqa: BLE001 - the caught exception is the test's subject
        return e
    raise AssertionError("check() did not raise")


@pytest.mark.parametrize(
    "rel,exc,where",
    [
        # 0.5.12 on the H200: the tree-page cases at topk 8, page 64/256 on triton
        ("site/sglang/srt/server_args.py", "ValueError", "sglang/srt/server_args.py:check"),
        (
            "site/sglang/srt/arg_groups/speculative_hook.py",
            "ValueError",
            "sglang/srt/arg_groups/speculative_hook.py:check",
        ),
        ("site/sglang/srt/server_args.py", "RuntimeError", None),  # not what argument checks raise
        ("site/sglang/srt/model_executor/model_runner.py", "ValueError", None),  # raised while starting
        ("site/other/server_args.py", "ValueError", None),  # not SGLang's
    ],
)
def test_only_sglangs_own_argument_checks_count_as_a_refusal(tmp_path, rel, exc, where):
    assert sglang_refusal(_raise_from(tmp_path, rel, exc)) == where


def test_prompt_starts_are_distinct_within_a_batch_and_unchanged_where_they_never_collided():
    # 2xH200: this near-full case's warm-up drew start 202 twice (two requests, one prompt in the radix
    # cache), held 0.80 of its pool, and the calibration overfilled the timed batch (3 of 4 decoded)
    nf = Case(
        model=ModelSize.tiny,
        algorithm=Algorithm.EAGLE,
        attention_backend=Backend.flashinfer,
        page_size=64,
        topk=4,
        num_steps=3,
        num_draft_tokens=8,
        tp=2,
        batch_size=4,
        input_len=6144,
        output_len=256,
        workload="near-full",
    )
    assert nf.case_id == "53e14508cc2f"
    warm = prompt_starts(nf, "warmup", 4)
    assert len(set(warm)) == 4 and warm[0] == warm_first_draw(nf) == 202 and warm[2:] == [827, 501]
    assert prompt_starts(nf, "timed0", 4) == [985, 170, 808, 978]  # no collision: as before
    # the tiny-attn oracle has 256 starts: a batch of all of them is still distinct; one more cannot be
    attn = CASE.model_copy(update={"model": ModelSize.tiny_attn, "batch_size": 256})
    assert sorted(prompt_starts(attn, "timed0", 256)) == list(range(256))
    with pytest.raises(ValueError, match="257 distinct prompts"):
        prompt_starts(attn, "timed0", 257)


def warm_first_draw(case: Case) -> int:
    import hashlib

    return int.from_bytes(hashlib.sha256(f"{case.dcp_twin_id()}/warmup/0".encode()).digest()[:4], "little") % 1024


def test_every_batch_of_a_case_starts_from_an_empty_radix_cache(monkeypatch):
    from specwatch.worker import measure as engine_worker

    monkeypatch.setattr(engine_worker, "FLUSH_WAIT_S", 0.05)
    flushes = []

    class Counting(FakeEngine):
        def flush_cache(self):
            flushes.append(True)
            return True

    res = run_case(Counting(CASE), CASE, repeats=3, warmup=True)
    # one flush per repeat: its three batches draw disjoint starts (worker.measure.warm_after_flush)
    assert len(flushes) == 3 and res["details"]["cache_flush_failures"] == 0
    ngram = CASE.model_copy(update={"algorithm": Algorithm.NGRAM})
    flushes.clear()
    run_case(Counting(ngram), ngram, repeats=3, warmup=True)
    assert len(flushes) == 6  # NGRAM: before the prefill-only batch and before the timed one

    class Refusing(FakeEngine):
        def flush_cache(self):
            return False

    details = run_case(Refusing(CASE), CASE, repeats=2, warmup=True)["details"]
    assert details["cache_flush_failures"] == 2 and details["cache_flush_refusals"] > 2  # retried first


def test_sglangs_flush_answer_is_read_by_its_success_field_and_a_refusal_retried(monkeypatch):
    """Engine.flush_cache() returns a FlushCacheReqOutput, an object that is true whatever it says."""
    import types

    from specwatch.worker import measure as engine_worker
    from specwatch.worker.measure import flush_cache

    class Busy(FakeEngine):  # not idle for its first two asks (the last batch still held)
        asks = 0

        def flush_cache(self):
            self.asks += 1
            return types.SimpleNamespace(success=self.asks > 2, message="")

    assert flush_cache(Busy(CASE)) == (True, 2)
    never = types.SimpleNamespace(success=False, message="pending requests")
    monkeypatch.setattr(engine_worker.time, "sleep", lambda s: None)
    assert flush_cache(types.SimpleNamespace(flush_cache=lambda: never), wait_s=0.05)[0] is False


def test_what_an_unflushed_radix_cache_holds_is_not_a_leak_but_a_lost_page_is(monkeypatch):
    import types

    from specwatch.worker import measure as engine_worker

    monkeypatch.setattr(engine_worker, "FLUSH_WAIT_S", 0.0)

    class Unflushed(FakeEngine):  # the flush refused: 3 pages sit in the radix cache, evictable
        def flush_cache(self):
            return types.SimpleNamespace(success=False)

        def get_server_info(self):
            info = super().get_server_info()
            info["internal_states"][0]["specwatch"]["tree_cache_evictable_size"] = 3 * CASE.page_size
            return info

    metrics, checks, details = memory_and_leaks(Unflushed(CASE, leaked_pages=3), CASE)
    assert metrics["leaked_tokens"]["value"] == 0 and checks["no_kv_leak"] and not checks["flush_cache"]
    assert details["leak_check_flush_refusals"] >= 1
    metrics, checks, _ = memory_and_leaks(Unflushed(CASE, leaked_pages=4), CASE)
    assert metrics["leaked_tokens"]["value"] == CASE.page_size and not checks["no_kv_leak"]


def test_the_row_check_uses_the_model_of_the_running_sglang_release():
    # the H200's 0.5.13-0.5.15 rows stop at the reserve; a 0.5.17-wide row is then a mismatch
    tree = CASE.model_copy(update={"topk": 8, "num_draft_tokens": 8})

    class Release(FakeEngine):
        version = "fake"

        def get_server_info(self):
            return {**super().get_server_info(), "version": self.version}

    engine = Release(tree)
    assert memory_and_leaks(engine, tree)[1]["req_to_token_matches_model"]  # unparsed: newest rule
    engine.version = "0.5.13"
    assert not memory_and_leaks(engine, tree)[1]["req_to_token_matches_model"]
    engine.version, engine.row_width = "0.5.13", SHAPES[tree.model].max_position + 2 * 2 * 64 * 8
    assert memory_and_leaks(engine, tree)[1]["req_to_token_matches_model"]


def test_ngram_standard_cases_are_judged_against_the_corpus_model():
    """NGRAM has no draft oracle; a standard case's acceptance is expected from NgramCorpusModel
    (a corpus emptied by the flush before the timed batch); a near-full one has no expectation."""
    import statistics

    from specwatch.core.case import Workload
    from specwatch.oracle.predict import NgramCorpusModel, Oracle
    from specwatch.oracle.prompts import prompt_starts

    ng = CASE.model_copy(update={"algorithm": Algorithm.NGRAM, "topk": 1, "batch_size": 4, "input_len": 1152})
    res = run_case(FakeEngine(ng), ng, repeats=2, warmup=True)
    model = NgramCorpusModel(Oracle(SHAPES[ng.model], 0, ng.profile))
    want = []
    for r in range(2):
        model.flush()
        want.append(
            statistics.mean(
                model.decode_batch(prompt_starts(ng, f"timed{r}", 4), 1152, ng.output_len, ng.num_draft_tokens)
            )
        )
    assert res["metrics"]["accept_length"]["expected"] == statistics.median(want)
    assert res["checks"]["accept_length_matches_oracle"] is False  # the fake engine drafts like EAGLE
    near = ng.model_copy(update={"workload": Workload.near_full})
    res = run_case(FakeEngine(near), near, repeats=1, warmup=False)
    assert res["metrics"]["accept_length"]["expected"] is None and "accept_length_matches_oracle" not in res["checks"]


def test_rendezvous_port_is_below_the_ephemeral_range_and_skips_a_taken_one():
    import socket

    from specwatch.worker.engine_args import (
        RENDEZVOUS_PORTS_FROM,
        ephemeral_port_floor,
        recorded_kwargs,
        rendezvous_port,
    )

    floor = ephemeral_port_floor()
    seed = 4242
    first = rendezvous_port(seed)
    assert RENDEZVOUS_PORTS_FROM <= first < floor
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("", first))
        held.listen()
        second = rendezvous_port(seed)
    assert second != first and RENDEZVOUS_PORTS_FROM <= second < floor
    assert rendezvous_port(seed + 1000) != rendezvous_port(seed)  # parallel workers start apart
    assert "nccl_port" not in recorded_kwargs({"nccl_port": first, "page_size": 1})


@pytest.mark.parametrize(
    "version,page,unaligned,verdict",
    [
        ("0.5.23", 64, 3, False),
        ("0.5.23", 64, 0, True),
        ("0.5.17", 64, 3, False),
        ("0.5.12", 64, 3, None),  # its own watermark is unaligned: not judged by this rule
        ("0.5.23", 1, 3, None),  # page 1: every length is whole pages
    ],
)
def test_a_decode_watermark_left_unrecorded_is_judged_where_the_release_rounds_it_up(version, page, unaligned, verdict):
    from specwatch.worker.memory_facts import memory_and_leaks

    case = CASE.model_copy(update={"page_size": page})

    class Eng(FakeEngine):
        def get_server_info(self):
            info = super().get_server_info()
            info["version"] = version
            info["internal_states"][0]["specwatch"]["occupancy"] = {
                "batches": 10,
                "near_full": 0,
                "peak": 0.5,
                "decode_unrecorded_tail_max": 56 * unaligned,
                "decode_unaligned_batches": unaligned,
            }
            return info

    metrics, checks, _ = memory_and_leaks(Eng(case), case)
    assert checks.get("decode_watermark_page_aligned") is verdict
    assert metrics["decode_unaligned_batches"]["value"] == unaligned


def _worker_record(tmp_path, monkeypatch, case, engine_base=None, **spec) -> dict:
    """The worker's main on a fake sglang whose engine is ``engine_base`` (default ``FakeEngine``)
    built for ``case``: its record of the case (a spec of ``spec`` over one warm-up, no fault)."""
    import json
    import sys
    import types

    from specwatch.worker import main as worker_main

    class Engine(engine_base or FakeEngine):
        def __init__(self, **kw):
            super().__init__(case)

        def shutdown(self):
            pass

    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=Engine))
    monkeypatch.setattr(worker_main, "case_models", lambda *a, **k: (tmp_path / "t", tmp_path / "d"))
    out, path = tmp_path / "out.jsonl", tmp_path / "spec.json"
    base = {"cases": [case.params()], "warmup": True, "models_dir": str(tmp_path), "fault": None, "results": str(out)}
    path.write_text(json.dumps({**base, **spec}))
    assert worker_main.main(str(path)) == 0
    rec = json.loads(out.read_text().splitlines()[-1])
    assert rec["status"] == "ok", rec.get("log_tail")
    return rec


def test_with_step_times_the_worker_reads_cpu_and_steal_around_each_timed_repeat(tmp_path, monkeypatch):
    import sys

    case = CASE.model_copy(update={"input_len": 256, "output_len": 64})
    rec = _worker_record(tmp_path, monkeypatch, case, repeats=3, probe=False, step_times=True)
    cpu = rec["details"]["timed_cpu"]
    assert len(cpu["repeats"]) == 3 and all(r["span_s"] >= 0 for r in cpu["repeats"])
    if sys.platform.startswith("linux"):
        assert all(r["host_steal_s"] is not None for r in cpu["repeats"])


@pytest.mark.parametrize("windows", [False, True])
def test_case_totals_are_exact_only_where_the_number_of_batches_is_fixed(tmp_path, monkeypatch, windows):
    """With timed windows the number of batches follows the timing (0.5.17 timing records: 13970
    vs 15748 unaligned decode batches across engines of one plain case), so counts over every batch
    cannot be exact there; they stay exact with fixed repeats."""
    case = CASE.model_copy(update={"input_len": 256, "output_len": 64, "page_size": 64})

    class Counting(FakeEngine):
        def get_server_info(self):
            info = super().get_server_info()
            occ = {"batches": 10, "near_full": 0, "peak": 0.5, "decode_unrecorded_tail_max": 0}
            info["internal_states"][0]["specwatch"]["occupancy"] = {**occ, "decode_unaligned_batches": 0}
            return info

    windows_s = 0.001 if windows else None
    rec = _worker_record(tmp_path, monkeypatch, case, Counting, repeats=2, probe=True, min_timed_s=windows_s)
    assert rec["metrics"]["decode_unaligned_batches"]["exact"] is (not windows)
    assert rec["metrics"]["accept_length"]["exact"]  # per-batch exact metrics stay exact
