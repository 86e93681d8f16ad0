"""One benchmark case: the full, normalized parameter set of a single GPU workload."""

from __future__ import annotations

import hashlib
import json
from enum import Enum
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator


class Algorithm(str, Enum):
    """Speculative decoding algorithm, spelled as SGLang's ``--speculative-algorithm``."""

    EAGLE = "EAGLE"
    EAGLE3 = "EAGLE3"
    STANDALONE = "STANDALONE"
    NGRAM = "NGRAM"
    DFLASH = "DFLASH"
    """Block-diffusion drafting (SGLang 0.5.11 on): one draft forward proposes a block of
    ``num_draft_tokens`` (its block size); SGLang forces num_steps = topk = 1."""
    NONE = "NONE"
    """No speculation: the plain-decoding twin of a timing case (``[suite] speedup = true``,
    ``Case.plain_twin``). SGLang gets no ``speculative_*`` argument; never written in a matrix."""

    @property
    def has_draft_kv(self) -> bool:
        """Whether the draft phase writes KV chains (SGLang: ``SpeculativeAlgorithm.has_draft_kv``)."""
        return self not in (Algorithm.NGRAM, Algorithm.NONE)

    @property
    def speculative(self) -> bool:
        """Whether the case decodes speculatively (every algorithm but ``NONE``)."""
        return self is not Algorithm.NONE


class Backend(str, Enum):
    """Attention backend, spelled as SGLang's ``--attention-backend``."""

    triton = "triton"
    flashinfer = "flashinfer"
    fa3 = "fa3"
    flashmla = "flashmla"
    """MLA models only (DeepSeek family); SGLang runs it at page_size 64."""


class Profile(str, Enum):
    """Acceptance profile of the oracle draft model (see ``specwatch.oracle``)."""

    perfect = "perfect"
    q01 = "q=0.1"
    q03 = "q=0.3"
    second_choice = "second-choice"
    random = "random"


class Workload(str, Enum):
    """Shape of the request stream a case sends."""

    standard = "standard"
    """``batch_size`` requests of ``input_len`` prompt tokens, ``output_len`` new tokens each."""
    near_full = "near-full"
    """KV pool sized so that token usage stays above 0.95 for most of the run (seed 004)."""
    long_prompt_multi_turn = "long-prompt-multi-turn"
    """Long prompts re-sent with their answers appended, several turns (seed 000): turn t's prompt
    is turn t-1's prompt + its answer + ``output_len`` new user tokens, so each turn after the
    first reuses the radix cache's pages of the previous one (``MULTI_TURN_TURNS`` turns)."""
    serving = "serving"
    """SGLang's HTTP server with the case's engine arguments, driven by SGLang's own serving
    benchmark (``sglang.benchmark.serving``; ``sglang.bench_serving`` before 0.5.15): prompts of
    ``input_len`` (oracle chains for an oracle model, random token ids for an own one) and
    ``output_len`` new tokens, ``batch_size`` requests at most in flight, all sent at once
    (``Case.serving_prompts`` of them); latency percentiles, throughput and acceptance under load."""


NEAR_FULL_MAX_OUTPUT_SHARE = 0.05
"""near-full cases keep output_len at most this share of prompt + output (a ``validity`` rule): the
KV pool holds the batch's peak (``engine_worker.kv_pool_tokens``) and token usage climbs from about
(prompt + reserve) / peak to 1 during decode, so it stays above 0.95 for the whole decode only when
the output is this small a share."""


MULTI_TURN_TURNS = 3
"""Turns per conversation of the long-prompt multi-turn workload."""


SERVING_PROMPTS_DEFAULT = 64
"""Requests the serving benchmark sends per repeat when the case names no ``serving_prompts``."""


class ModelSize(str, Enum):
    """Shape family of the generated oracle checkpoints."""

    tiny = "tiny"
    llama_1b = "1b"
    llama_8b = "8b"
    tiny_mla = "tiny-mla"
    """DeepSeek-V3 architecture (MLA attention, an MTP/NextN layer as the EAGLE draft), tiny sizes:
    for the MLA attention backends and DCP."""
    tiny_attn = "tiny-attn"
    """tiny shapes with an attention-sensitive layer 0: the next token also depends on the KV read
    at the previous position, so wrong KV reads (pages, masks, stale slots) change outputs."""
    own = "own"
    """A checkpoint the suite names by path or Hugging Face id (``Case.own_model``): no oracle
    shapes and no closed form; its outputs are checked against the target without speculation."""


class Expectation(str, Enum):
    """What a case's outputs and acceptance are checked against (``details.expectation``)."""

    oracle = "oracle"
    """The closed form of an oracle model: exact acceptance and the lossless oracle chain."""
    parity = "parity"
    """An own model: the same prompts decoded greedily by the target without speculation
    (``parity_with_plain``); acceptance is measured, not expected."""


class OwnModel(BaseModel):
    """A model the suite names by path or Hugging Face id (``model = {name = ..., target = ...}``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: StrictStr
    """The suite's name for the model; part of the case id."""
    config_sha: StrictStr
    """sha256 (16 hex digits) of the config files of target, draft and tokenizer (config.json,
    tokenizer_config.json, generation_config.json), not of paths or weights: part of the case id,
    so records of one checkpoint on two machines join."""
    dtype: StrictStr = "bfloat16"
    """``--dtype`` the engine loads the weights in; part of the case id."""
    target: StrictStr
    """Target checkpoint as the suite names it: a folder or a Hugging Face id (never in the id)."""
    draft: Optional[StrictStr] = None
    """Draft checkpoint (None: the model has none, e.g. for NGRAM)."""
    tokenizer: Optional[StrictStr] = None
    """Tokenizer folder or id (None: the target's)."""
    context_len: StrictInt = Field(ge=1)
    """The target's context length (config.json's ``max_position_embeddings``): what SGLang sizes
    its request rows by (``rules.pools``)."""


class PromptSet(BaseModel):
    """Where an own model's prompts come from (the suite's ``prompts``, ``prompt_count``, ``prompt_seed``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: StrictStr
    """A dataset name (``mt-bench``, ``gsm8k``, ``sharegpt``), ``random`` or ``file``."""
    count: StrictInt = Field(ge=1)
    """Prompts drawn from the source; each timed repeat sends all of them."""
    seed: StrictInt = 0
    """Seed of the draw (which prompts, and ``random``'s token ids)."""
    sha256: Optional[StrictStr] = None
    """sha256 (16 hex digits) of the prompt file's bytes (None: ``random``); part of the case id."""
    file: Optional[StrictStr] = None
    """The prompt file read on this host (never in the id)."""
    field: StrictStr = "prompt"
    """JSONL field holding each prompt's text (``file``); a dataset's own field otherwise."""


class Case(BaseModel):
    """A fully specified case. Every field is normalized, so equal cases hash equal.

    Numbers and flags are strict (``true``, ``"64"`` or ``64.0`` is no page size): a record whose
    case says otherwise is refused, not coerced to a case id it was never run under."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)

    model: ModelSize = Field(description="Oracle model size (target shapes; draft derived from it).")
    algorithm: Algorithm = Field(description="Speculative algorithm (``NONE``: a plain-decoding twin).")
    attention_backend: Backend = Field(description="Attention backend for target and draft.")
    page_size: StrictInt = Field(ge=1, description="KV page size in tokens (SGLang --page-size).")
    topk: StrictInt = Field(ge=1, description="EAGLE tree branching (--speculative-eagle-topk); NGRAM: BFS breadth.")
    num_steps: StrictInt = Field(ge=1, description="Draft depth (--speculative-num-steps).")
    num_draft_tokens: StrictInt = Field(
        ge=1, description="Verified tree size (--speculative-num-draft-tokens), normalized."
    )
    tp: StrictInt = Field(default=1, ge=1, description="Tensor parallel size.")
    dcp: StrictInt = Field(default=1, ge=1, description="Decode context parallel size (must divide tp).")
    batch_size: StrictInt = Field(ge=1, description="Concurrent requests in the timed batch.")
    input_len: StrictInt = Field(ge=1, description="Prompt length in tokens.")
    output_len: StrictInt = Field(ge=1, description="New tokens generated per request.")
    profile: Profile = Field(default=Profile.perfect, description="Oracle acceptance profile.")
    workload: Workload = Field(default=Workload.standard, description="Request-stream shape.")
    cuda_graph: StrictBool = Field(default=True, description="Whether CUDA graphs are enabled.")
    own_model: Optional[OwnModel] = Field(default=None, description="The checkpoint of a model 'own' (else None).")
    prompts: Optional[PromptSet] = Field(default=None, description="An own model's prompts (else None).")
    serving_prompts: Optional[StrictInt] = Field(
        default=None,
        ge=1,
        description="Serving workload only: requests per benchmark run (None: SERVING_PROMPTS_DEFAULT).",
    )
    """Requests the serving benchmark sends per repeat (its ``--num-prompts``); ``batch_size`` is
    its ``--max-concurrency``. Only the serving workload takes it; None (the default) runs
    ``SERVING_PROMPTS_DEFAULT`` and stays out of ``params()`` and the case id, so every case of
    another workload hashes as it always did."""

    @model_validator(mode="after")
    def _own_model_consistent(self) -> "Case":
        if (self.model is ModelSize.own) != (self.own_model is not None):
            raise ValueError("own_model is given exactly when model is 'own'")
        if (self.own_model is None) != (self.prompts is None):
            raise ValueError("prompts are given exactly when own_model is")
        if self.serving_prompts is not None and self.workload is not Workload.serving:
            raise ValueError("serving_prompts is given only with the serving workload")
        return self

    @property
    def serving_requests(self) -> int:
        """Requests one serving benchmark run sends (``serving_prompts`` or its default)."""
        return SERVING_PROMPTS_DEFAULT if self.serving_prompts is None else self.serving_prompts

    @property
    def case_id(self) -> str:
        """Stable id: hash of the normalized parameters (joins results across days and hosts)."""
        return case_id_of(self.params())

    @property
    def expectation(self) -> Expectation:
        """What the case's outputs are checked against: the oracle's closed form, or parity."""
        return Expectation.oracle if self.own_model is None else Expectation.parity

    def params(self) -> dict:
        """Plain JSON-able parameter dict (enum values as strings). An oracle case's has exactly the
        ``CASE_FIELDS``; an own model's adds ``OWN_PARAMS`` (name, config hash, dtype, prompt set),
        never the paths, which differ per host; a serving case naming ``serving_prompts`` adds it."""
        p = json.loads(self.model_dump_json(exclude=set(EXTRA_FIELDS)))
        if self.serving_prompts is not None:
            p["serving_prompts"] = self.serving_prompts
        if self.own_model is not None:
            m, q = self.own_model, self.prompts
            p.update(
                model_name=m.name,
                model_config_sha=m.config_sha,
                model_dtype=m.dtype,
                prompts=q.source,
                prompt_count=q.count,
                prompt_seed=q.seed,
                prompts_sha=q.sha256,
                prompt_field=q.field if q.file else None,
            )
        return p

    def engine_key(self) -> tuple:
        """Parameters that need a new engine when they change; the rest reuse one engine."""
        p = self.params()
        key = tuple(p[f] for f in ENGINE_FIELDS)
        return key if self.own_model is None else key + (self.own_model,)  # its checkpoint, paths too

    def prompt_lens(self) -> list[int]:
        """Prompt length of each batch a conversation sends: ``[input_len]``, or for the multi-turn
        workload each turn's (the previous prompt + its answer + ``output_len`` user tokens)."""
        if self.workload is not Workload.long_prompt_multi_turn:
            return [self.input_len]
        return [self.input_len + t * 2 * self.output_len for t in range(MULTI_TURN_TURNS)]

    def dcp_twin_id(self) -> str:
        """Case id of the same case at dcp 1: DCP and its twin share prompts (equivalence check)."""
        return self.case_id if self.dcp == 1 else self.model_copy(update={"dcp": 1}).case_id

    def plain_twin(self) -> "Case":
        """The same target decoding without speculation: algorithm ``NONE``, the draft's parameters
        at 1 and the profile ``perfect`` (they shape the draft only), everything the target engine
        and the timed batch depend on (model, backend, page, tp, dcp, batch, lengths, workload, CUDA
        graphs) kept. Spec cases that differ only in their draft share one twin (and one engine)."""
        return self.model_copy(update=PLAIN_TWIN_RESETS)

    @property
    def model_label(self) -> str:
        """The model as reports, tables, plots and selections name it: an own model's name (never
        an oracle size's, ``own.suite_model``), else the oracle size."""
        return self.own_model.name if self.own_model else self.model.value

    def label(self) -> str:
        """Short human label used in tables and plots."""
        return (
            f"{self.model_label}/{self.algorithm.value}/{self.attention_backend.value}"
            f" p{self.page_size} k{self.topk} s{self.num_steps} d{self.num_draft_tokens}"
            f" tp{self.tp} dcp{self.dcp} bs{self.batch_size} {self.input_len}->{self.output_len}"
            f" {self.profile.value} {self.workload.value}{'' if self.cuda_graph else ' eager'}"
            + ("" if self.serving_prompts is None else f" n{self.serving_prompts}")
        )


PLAIN_TWIN_RESETS = {
    "algorithm": Algorithm.NONE,
    "topk": 1,
    "num_steps": 1,
    "num_draft_tokens": 1,
    "profile": Profile.perfect,
}
"""The parameters ``Case.plain_twin`` sets (the draft's and the profile); every other one is kept."""

ENGINE_FIELDS: tuple[str, ...] = (
    "model",
    "algorithm",
    "attention_backend",
    "page_size",
    "topk",
    "num_steps",
    "num_draft_tokens",
    "tp",
    "dcp",
    "profile",
    "workload",
    "cuda_graph",
)
"""Case fields that are engine-level (a change restarts ``sglang.Engine``)."""

EXTRA_FIELDS: tuple[str, ...] = ("own_model", "prompts", "serving_prompts")
"""Case fields outside ``CASE_FIELDS``: in ``params()`` (and the id) only where the case sets them."""

CASE_FIELDS: tuple[str, ...] = tuple(f for f in Case.model_fields if f not in EXTRA_FIELDS)
"""The parameters every case has (``params()`` of an oracle case, ``--where`` keys, frame columns)."""

OWN_PARAMS: tuple[str, ...] = (
    "model_name",
    "model_config_sha",
    "model_dtype",
    "prompts",
    "prompt_count",
    "prompt_seed",
    "prompts_sha",
    "prompt_field",
)
"""The parameters an own model's case adds to ``params()`` (and to its id)."""


def case_id_of(params: dict) -> str:
    """Hash of a normalized parameter dict; 12 hex digits."""
    blob = json.dumps(params, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
