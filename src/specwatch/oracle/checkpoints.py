"""Oracle checkpoints: HF-format Llama target + drafts whose greedy behaviour is known in closed form.

Target (``LlamaForCausalLM``): the A = hidden "active" tokens (ids ``FIRST_ACTIVE ..
FIRST_ACTIVE + A - 1``) embed to ``sqrt(H) * e_j`` (orthonormal rows of RMS 1). Every layer's
``o_proj`` and ``down_proj`` are zero, so attention and MLP run at full cost but the residual stream
stays the token embedding; the final RMSNorm leaves it unchanged. ``lm_head`` row ``sigma(t_j)`` is
``e_j``: the logits of active token t_j are ``sqrt(H)`` at ``sigma(t_j)`` and 0 elsewhere, so greedy
decoding emits the chain ``t, sigma(t), sigma^2(t), ...``. ``sigma`` is a seeded permutation of the
active tokens with one cycle of length A.

EAGLE draft (``LlamaForCausalLMEagle``, one layer, no final norm; SGLang shares the target's
embedding and lm_head with it): ``fc = [M, 0]`` with zero bias, zero ``o_proj``/``down_proj``; its
output is ``M @ embed(x)``, its logits ``lm_head(M @ embed(x))``.
* ``perfect``: M = I, the draft predicts sigma(x): greedy acceptance length is exactly steps + 1.
* ``q=0.1``, ``q=0.3``: a seeded set S of round(q*A) active tokens gets ``M e_i = e_k + 0.75 e_i``
  with k = sigma(t_i)'s index: the draft's first choice for x in S is sigma(sigma(x)) (wrong), its
  second sigma(x) (right). For a chain (topk = 1) a verify accepts the longest run of chain tokens
  outside S starting at the last committed token, capped at num_steps (``expected_chain_verifies``).
* ``second-choice``: S = every active token: topk = 1 accepts nothing; topk >= 2 can recover.
  For trees (topk > 1) the expected acceptance comes from ``expected_tree_verifies``, which runs
  SGLang's tree construction on these known draft probabilities.
* ``random``: no weights written (load with ``load_format="dummy"``): acceptance ~ 1.

STANDALONE draft: an oracle ``LlamaForCausalLM`` with the same sigma and fewer layers.

MLA variant (``tiny-mla``; ``write_deepseek_target``): a DeepSeek-V3 checkpoint (MLA attention with
DeepSeek-V3's 512/64/128/128 dims, dense MLPs) built the same way, whose MTP layer
``model.layers.<L>`` (``eh_proj = [I, 0]``) is what SGLang loads as the EAGLE (NextN) draft when the
draft path is the target's: acceptance steps + 1 at topk 1. For the MLA backends and DCP. Checked on
the CPU with Hugging Face's DeepseekV3 (target chain) and a written-out NextN forward (draft).

Attention-sensitive variant (``tiny-attn``; ``Shape.attn_copy``): the oracles above never let
attention output reach the logits, so a wrong KV read cannot change anything. Here layer 0 of the
target (and of the ``perfect`` EAGLE draft) attends, through RoPE alone, to the previous position
and copies that token into residual dims [A, 2A) (A = kv_heads x head_dim = 256 active tokens);
``lm_head`` adds a vote of weight 2 for sigma^2(previous) to the current token's vote of 1 for
sigma(current). With correct KV both name the same token, so the chain and the acceptance are the
ones above; if layer 0 reads a wrong token x at the previous position (a wrong page, mask or stale
slot), sigma^2(x) wins: a lossless mismatch in the target, a rejected draft token in the draft.
Checked on the CPU with Hugging Face's Llama (fp32 and bf16, 7000 positions: exact). Limits: only
layer 0's KV matters; imperfect draft profiles keep a KV-blind draft (a previous-token vote would
overrule their deliberately wrong first choice).

EAGLE3 draft (``LlamaForCausalLMEagle3``, ``write_eagle3_draft``, profile ``perfect`` only): one
decoder layer whose attention reads [input_layernorm(embed(x)); hidden_norm(h)], its own lm_head
over a draft vocabulary of the A active tokens (draft id i is target token ``FIRST_ACTIVE +
A - 1 - i``, mapped back by SGLang through ``d2t``), and the target's embedding (SGLang shares it).
The target's aux hidden states enter through ``fc``, which is zero, so a draft step's residual h is
0 after the target and the previous step's output inside a draft chain. Attention, through RoPE
alone, reads the token's own position (every plane at angle 0) and its value is
``e_x - e_h`` (the input token minus the incoming hidden, both one-hot), so the residual after the
layer is ``sqrt(H) e_x`` whatever h was: the draft predicts sigma(x) and hands ``e_x`` on, and its
acceptance is that of the perfect EAGLE draft. A wrong self read (wrong slot, page or mask in the
draft's KV) leaves ``e_x - e_h`` mixed with another token and the prediction changes. Checked on the
CPU by a written-out forward of SGLang 0.5.17's ``llama_eagle3.py`` (tests/test_eagle3_oracle.py).

NGRAM has no draft model: it proposes continuations of n-grams its corpus has seen. In SGLang
0.5.17 (``ngram_worker._update_ngram_corpus``) the corpus takes, after each verify, only the last
``speculative_ngram_max_trie_depth`` (18) tokens of each running request, never a prompt whole
(inserting the extend is commented out there), and drafts from the suffix matches. The
sigma-chain does not repeat within its period A, so a request's own windows never hold its next
token before its output wraps the cycle, however long its prompt; its matches come from other
requests of the batch whose windows passed the same chain positions a few steps earlier. Every
window being a piece of the chain, the draft is always the chain as far as a window reaches, so
the acceptance is a deterministic function of the batch's prompt starts: ``NgramCorpusModel``
simulates it (exact on every standard NGRAM record of the H200s).

DFLASH draft (``DFlashDraftModel``, ``write_dflash_draft``; profiles ``perfect``, ``q=0.1``,
``q=0.3``, ``second-choice``): one block-diffusion layer whose position-selecting attention reads
the block's bonus token and whose ``o_proj`` writes a chosen token per block position; a verify
accepts the chain run of the EAGLE profile at depth block_size - 1 (``specwatch.oracle.dflash``).

The writers live in ``weights`` (shared pieces), ``eagle3``, ``deepseek`` and ``dflash``; this
module writes the Llama target and the EAGLE/STANDALONE drafts and places every checkpoint.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from specwatch.core.case import Algorithm, Case, ModelSize, Profile
from specwatch.oracle.deepseek import MLA, write_deepseek_target
from specwatch.oracle.dflash import MAX_BLOCK, write_dflash_draft
from specwatch.oracle.eagle3 import eagle3_draft_ids, eagle3_shape, write_eagle3_draft
from specwatch.oracle.predict import Oracle
from specwatch.oracle.shapes import FIRST_ACTIVE, RIGHT_WEIGHT, SHAPES, WRONG_WEIGHT
from specwatch.oracle.weights import (
    COPY_SCALE,
    PREV_WEIGHT,
    ROPE_THETA,
    attention_copy_weights,
    config_of,
    embed_and_head,
    layer_weights,
    position_qk,
    publish,
    save_checkpoint,
)

__all__ = [
    "COPY_SCALE",
    "MLA",
    "PREV_WEIGHT",
    "ROPE_THETA",
    "attention_copy_weights",
    "eagle3_draft_ids",
    "eagle3_shape",
    "ensure_models",
    "model_dirs",
    "position_qk",
    "write_deepseek_target",
    "write_dflash_draft",
    "write_eagle3_draft",
    "write_eagle_draft",
    "write_oracle_model",
    "write_target",
]
"""The writers' public names, importable from here wherever they live."""


def write_target(folder: Path, oracle: Oracle, layers: Optional[int] = None, device: str = "cpu") -> None:
    """The oracle target (or, with fewer ``layers``, a STANDALONE draft with the same sigma)."""
    import torch

    s = oracle.shape
    layers = layers or s.layers
    gen = torch.Generator(device=device).manual_seed(oracle.seed)
    bf = torch.bfloat16
    embed, head = embed_and_head(torch, oracle, device)
    if s.attn_copy:
        # previous token p (residual dim A + p) votes PREV_WEIGHT for sigma^2(p)
        succ = torch.as_tensor(oracle.successor_index(), device=device)
        head[FIRST_ACTIVE + succ[succ], s.active + torch.arange(s.active, device=device)] = PREV_WEIGHT
    w = {
        "model.embed_tokens.weight": embed,
        "lm_head.weight": head,
        "model.norm.weight": torch.ones(s.hidden, dtype=bf, device=device),
    }
    for i in range(layers):
        w.update(layer_weights(torch, s, f"model.layers.{i}.", gen, device))
    if s.attn_copy:
        w.update(attention_copy_weights(torch, s, "model.layers.0.", device))
    save_checkpoint(torch, folder, config_of(s, layers, "LlamaForCausalLM"), w)


def write_eagle_draft(folder: Path, oracle: Oracle, device: str = "cpu") -> None:
    """The EAGLE draft of module docstring (one layer, fc = [M, 0])."""
    import torch

    s = oracle.shape
    bf = torch.bfloat16
    config = config_of(s, 1, "LlamaForCausalLMEagle")
    if oracle.profile is Profile.random:
        tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        publish(tmp, folder)
        return
    gen = torch.Generator(device=device).manual_seed(oracle.seed + 2)
    m = torch.eye(s.hidden, dtype=torch.float32, device=device)
    wrong = torch.as_tensor(oracle.wrong_set(), device=device)
    succ = torch.as_tensor(oracle.successor_index(), device=device)
    idx = torch.nonzero(wrong).flatten()
    m[idx, idx] = RIGHT_WEIGHT
    m[succ[idx], idx] = WRONG_WEIGHT
    fc = torch.cat([m, torch.zeros_like(m)], dim=1).to(bf)
    w = {"fc.weight": fc, "fc.bias": torch.zeros(s.hidden, dtype=bf, device=device)}
    w.update(layer_weights(torch, s, "layers.0.", gen, device, skip_input_norm=True))
    if s.attn_copy and oracle.profile is Profile.perfect:
        # the perfect draft reads its KV like the target: a wrong read there lowers acceptance.
        # Imperfect profiles keep a KV-blind draft: a previous-token vote would overrule their
        # deliberately wrong first choice.
        w.update(attention_copy_weights(torch, s, "layers.0.", device))
    save_checkpoint(torch, folder, config, w)


def model_dirs(
    root: Path,
    size: ModelSize,
    profile: Profile,
    algorithm: Algorithm,
    seed: int = 0,
    block_size: Optional[int] = None,
) -> tuple[Path, Optional[Path]]:
    """(target, draft) folders for a case; the draft is None for NGRAM and plain decoding (NONE).
    ``block_size``: DFLASH's (the case's ``num_draft_tokens``, which its draft config names; None:
    ``MAX_BLOCK``)."""
    target = root / f"{size.value}-seed{seed}" / "target"
    if algorithm in (Algorithm.NGRAM, Algorithm.NONE):
        return target, None
    if SHAPES[size].arch == "deepseek-v3":
        return target, target  # the MTP layer ships inside the target checkpoint (SGLang loads it as NextN)
    if algorithm is Algorithm.STANDALONE:
        return target, root / f"{size.value}-seed{seed}" / "standalone-draft"
    if algorithm is Algorithm.EAGLE3:
        return target, root / f"{size.value}-seed{seed}" / f"eagle3-draft-{profile.value}"
    if algorithm is Algorithm.DFLASH:
        return target, root / f"{size.value}-seed{seed}" / f"dflash-draft-{profile.value}-b{block_size or MAX_BLOCK}"
    return target, root / f"{size.value}-seed{seed}" / f"eagle-draft-{profile.value}"


def ensure_models(
    root: Path,
    size: ModelSize,
    profile: Profile,
    algorithm: Algorithm,
    seed: int = 0,
    device: str = "cpu",
    block_size: Optional[int] = None,
) -> tuple[Path, Optional[Path]]:
    """Write the checkpoints a case needs unless already there; returns (target, draft). Workers
    starting in parallel take turns (a lock file per model size), so each checkpoint is written once.
    ``block_size``: a DFLASH case's ``num_draft_tokens`` (``model_dirs``)."""
    import fcntl

    oracle = Oracle(SHAPES[size], seed, profile)
    target, draft = model_dirs(root, size, profile, algorithm, seed, block_size)
    Path(root).mkdir(parents=True, exist_ok=True)
    with open(Path(root) / f".{size.value}-seed{seed}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _write_missing(target, draft, oracle, size, seed, algorithm, device, block_size or MAX_BLOCK)
    return target, draft


def _write_missing(
    target: Path,
    draft: Optional[Path],
    oracle: "Oracle",
    size: ModelSize,
    seed: int,
    algorithm: Algorithm,
    device: str,
    block_size: int = MAX_BLOCK,
) -> None:
    if SHAPES[size].arch == "deepseek-v3":
        if not (target / "config.json").exists():
            write_deepseek_target(target, Oracle(SHAPES[size], seed, Profile.perfect), device=device)
        return
    if not (target / "config.json").exists():
        write_target(target, Oracle(SHAPES[size], seed, Profile.perfect), device=device)
    if draft is not None and not (draft / "config.json").exists():
        if algorithm is Algorithm.STANDALONE:
            write_target(draft, Oracle(SHAPES[size], seed, Profile.perfect), layers=1, device=device)
        elif algorithm is Algorithm.EAGLE3:
            write_eagle3_draft(draft, oracle, device=device)
        elif algorithm is Algorithm.DFLASH:
            write_dflash_draft(draft, oracle, block_size, device=device)
        else:
            write_eagle_draft(draft, oracle, device=device)


def write_oracle_model(
    root: Path,
    size: ModelSize,
    profile: Profile,
    algorithm: Algorithm,
    seed: int = 0,
    device: str = "cpu",
    block_size: Optional[int] = None,
) -> tuple[Path, Optional[Path]]:
    """The checkpoints of ``ensure_models`` plus the oracle tokenizer (``oracle.tokenizer``) beside
    the target: a model a suite can name by path as its own. Returns (target, draft)."""
    from specwatch.oracle.tokenizer import write_tokenizer

    target, draft = ensure_models(root, size, profile, algorithm, seed, device, block_size)
    if not (target / "tokenizer_config.json").exists():
        write_tokenizer(target, SHAPES[size])
    return target, draft


def case_models(root: Path, case: Case, device: str = "cpu", tokenizer: bool = False) -> tuple[Path, Optional[Path]]:
    """The oracle checkpoints a case runs on (its model, profile, algorithm and, for DFLASH, block
    size): ``ensure_models``, or with ``tokenizer`` ``write_oracle_model`` (the server detokenizes).
    Returns (target, draft)."""
    write = write_oracle_model if tokenizer else ensure_models
    return write(Path(root), case.model, case.profile, case.algorithm, device=device, block_size=case.num_draft_tokens)
