"""One benchmark case: the full, normalized parameter set of a single GPU workload."""

from __future__ import annotations

import hashlib
import json
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt


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


NEAR_FULL_MAX_OUTPUT_SHARE = 0.05
"""near-full cases keep output_len at most this share of prompt + output (a ``validity`` rule): the
KV pool holds the batch's peak (``engine_worker.kv_pool_tokens``) and token usage climbs from about
(prompt + reserve) / peak to 1 during decode, so it stays above 0.95 for the whole decode only when
the output is this small a share."""


MULTI_TURN_TURNS = 3
"""Turns per conversation of the long-prompt multi-turn workload."""


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

    @property
    def case_id(self) -> str:
        """Stable id: hash of the normalized parameters (joins results across days and hosts)."""
        return case_id_of(self.params())

    def params(self) -> dict:
        """Plain JSON-able parameter dict (enum values as strings)."""
        return json.loads(self.model_dump_json())

    def engine_key(self) -> tuple:
        """Parameters that need a new engine when they change; the rest reuse one engine."""
        p = self.params()
        return tuple(p[f] for f in ENGINE_FIELDS)

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
        return self.model_copy(
            update={
                "algorithm": Algorithm.NONE,
                "topk": 1,
                "num_steps": 1,
                "num_draft_tokens": 1,
                "profile": Profile.perfect,
            }
        )

    def label(self) -> str:
        """Short human label used in tables and plots."""
        return (
            f"{self.model.value}/{self.algorithm.value}/{self.attention_backend.value}"
            f" p{self.page_size} k{self.topk} s{self.num_steps} d{self.num_draft_tokens}"
            f" tp{self.tp} dcp{self.dcp} bs{self.batch_size} {self.input_len}->{self.output_len}"
            f" {self.profile.value} {self.workload.value}{'' if self.cuda_graph else ' eager'}"
        )


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

CASE_FIELDS: tuple[str, ...] = tuple(Case.model_fields)


def case_id_of(params: dict) -> str:
    """Hash of a normalized parameter dict; 12 hex digits."""
    blob = json.dumps(params, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
