"""The ``sglang.Engine`` arguments of an engine group: built from the case, fitted to the installed release.

Also SGLang's own refusals (an argument check that raised) told apart from crashes, the server
facts read back from the engine, and the rendezvous port below the ephemeral range.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path

from specwatch.core.case import Algorithm, Case, Profile, Workload
from specwatch.oracle.shapes import SHAPES
from specwatch.worker.near_full import KV_TOKENS, own_kv_tokens

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


def engine_kwargs(case: Case, target: Path, draft, max_bs: int, kv_tokens: int | None = None) -> dict:
    kw = dict(
        model_path=str(target),
        skip_tokenizer_init=True,
        dtype="bfloat16",
        attention_backend=case.attention_backend.value,
        page_size=case.page_size,
        tp_size=case.tp,
        max_running_requests=max(max_bs, 8),
        max_total_tokens=kv_tokens or KV_TOKENS.get(case.model),
        cuda_graph_max_bs_decode=max(max_bs, 8),
        disable_cuda_graph=not case.cuda_graph,
        # Prefill graphs cost ~1 min of capture per engine and do not touch the decode path timed here.
        disable_prefill_cuda_graph=True,
        random_seed=0,
        log_level="error",
        mem_fraction_static=0.7,
        # An idle SGLang scheduler spins one CPU thread at 100% unless it sleeps on idle; under
        # --parallel-starts the engines waiting for the timing lock would load the CPU that the
        # timed engine's launch path needs (batch-1 decode on small models is CPU-bound).
        sleep_on_idle=True,
        speculative_algorithm=case.algorithm.value,
        speculative_num_steps=case.num_steps,
        speculative_eagle_topk=case.topk,
        speculative_num_draft_tokens=case.num_draft_tokens,
    )
    if not case.algorithm.speculative:
        # the plain-decoding twin: SGLang's own no-speculation path, no draft
        kw = {k: v for k, v in kw.items() if not k.startswith("speculative_")}
        draft = None
    if case.dcp > 1:
        kw["dcp_size"] = case.dcp
    if case.workload is Workload.near_full:
        # No chunked prefill: on the H200 (0.5.17, batch 16 x 6144 in chunks) only 15 requests ever
        # decoded together, none retracted, and the 16th ran alone afterwards. Reading 0.5.17's
        # scheduler: a chunked request holds a req slot and sits in the round's can_run_list, so
        # get_num_allocatable_reqs counts it twice; with one slot left the round marks the running
        # batch full, and that flag holds until a request finishes. Whole prompts admit all 16.
        kw["chunked_prefill_size"] = -1
    _add_draft_args(kw, case, draft)
    if case.own_model is not None:
        # an own model: its dtype, and a KV pool sized from the case (own_kv_tokens)
        kw["dtype"] = case.own_model.dtype
        kw["max_total_tokens"] = kv_tokens or own_kv_tokens(case)
        return kw
    if case.tp > 1 and SHAPES[case.model].arch == "deepseek-v3":
        # SGLang auto-enables FlashInfer's allreduce fusion for DeepSeek at tp > 1 on sm90; its
        # kernels JIT-compile on a fresh host (still compiling after 170 s on the x2 host, nothing
        # recorded). A communication fusion, not what specwatch measures: off, and recorded.
        kw["enforce_disable_flashinfer_allreduce_fusion"] = True
    return kw


def _add_draft_args(kw: dict, case: Case, draft) -> None:
    """The draft's and the algorithm's own engine arguments, into ``kw``."""
    if draft is not None:
        kw["speculative_draft_model_path"] = str(draft)
        if case.profile is Profile.random:
            kw["speculative_draft_load_format"] = "dummy"
    if case.algorithm is Algorithm.NGRAM:
        kw["speculative_ngram_max_bfs_breadth"] = case.topk
    if case.algorithm is Algorithm.DFLASH:
        # SGLang forces both to 1 for DFLASH (``_handle_dflash``, with a warning otherwise); the block
        # size is speculative_num_draft_tokens, which the oracle draft's dflash_config.block_size names.
        kw["speculative_num_steps"] = kw["speculative_eagle_topk"] = 1


RENAMED_ARGS = {
    "cuda_graph_max_bs_decode": "cuda_graph_max_bs",
    "disable_prefill_cuda_graph": "disable_piecewise_cuda_graph",
}
"""Engine arguments specwatch passes under their 0.5.14+ names -> the same setting's name in older
releases (0.5.12-0.5.13: one ``cuda_graph_max_bs``; prefill graphs were the "piecewise" graphs)."""


HARNESS_ARGS = {
    "sleep_on_idle",
    "enforce_disable_flashinfer_allreduce_fusion",
    "disable_prefill_cuda_graph",
    "nccl_port",
}
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


def server_facts(engine) -> dict:
    info = engine.get_server_info()
    states = info.get("internal_states") or [{}]
    return {
        "specwatch": states[0].get("specwatch", {}),
        "avg_spec_accept_length": states[0].get("avg_spec_accept_length"),
        "memory_usage": states[0].get("memory_usage"),
        "step_time_dict": states[0].get("step_time_dict"),
        "version": info.get("version"),
    }


def greedy_sampling(case: Case) -> dict:
    """Sampling parameters of every batch a case sends: greedy (the oracle chain is the expected
    output) for exactly ``output_len`` tokens (``ignore_eos``, which near-full's pool sizing relies on:
    SGLang then reserves each request's whole output at admission)."""
    return {"temperature": 0.0, "max_new_tokens": case.output_len, "ignore_eos": True}
