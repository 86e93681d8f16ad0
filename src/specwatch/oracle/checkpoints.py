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
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Optional

import numpy as np

from specwatch.core.case import Algorithm, ModelSize, Profile
from specwatch.oracle.predict import Oracle
from specwatch.oracle.shapes import (
    EOS_TOKEN_ID,
    FIRST_ACTIVE,
    RIGHT_WEIGHT,
    SHAPES,
    WRONG_WEIGHT,
    Shape,
)

ROPE_THETA = 500000.0


def _config(shape: Shape, layers: int, architecture: str) -> dict:
    return {
        "architectures": [architecture],
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.hidden // shape.heads,
        "vocab_size": shape.vocab,
        "max_position_embeddings": shape.max_position,
        "rms_norm_eps": 1e-5,
        "rope_theta": ROPE_THETA,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": EOS_TOKEN_ID,
        "attention_bias": False,
        "mlp_bias": False,
    }


def _layer_weights(torch, shape: Shape, prefix: str, gen, device, skip_input_norm: bool = False) -> dict:
    h, hd = shape.hidden, shape.hidden // shape.heads
    bf = torch.bfloat16

    def rnd(*s):
        return (torch.randn(*s, generator=gen, device=device) * 0.02).to(bf)

    w = {
        f"{prefix}self_attn.q_proj.weight": rnd(shape.heads * hd, h),
        f"{prefix}self_attn.k_proj.weight": rnd(shape.kv_heads * hd, h),
        f"{prefix}self_attn.v_proj.weight": rnd(shape.kv_heads * hd, h),
        f"{prefix}self_attn.o_proj.weight": torch.zeros(h, shape.heads * hd, dtype=bf, device=device),
        f"{prefix}mlp.gate_proj.weight": rnd(shape.intermediate, h),
        f"{prefix}mlp.up_proj.weight": rnd(shape.intermediate, h),
        f"{prefix}mlp.down_proj.weight": torch.zeros(h, shape.intermediate, dtype=bf, device=device),
        f"{prefix}post_attention_layernorm.weight": torch.ones(h, dtype=bf, device=device),
    }
    if not skip_input_norm:
        w[f"{prefix}input_layernorm.weight"] = torch.ones(h, dtype=bf, device=device)
    return w


def _save(torch, folder: Path, config: dict, weights: dict) -> None:
    """Write a checkpoint atomically: into a private folder, renamed into place at the end, so
    workers starting in parallel never read a half-written model (the first rename wins)."""
    from safetensors.torch import save_file

    final, folder = folder, folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS_TOKEN_ID}))
    shard, shards, size, index = {}, [], 0, {}
    limit = 4 << 30
    for name, t in weights.items():
        nbytes = t.numel() * t.element_size()
        if shard and size + nbytes > limit:
            shards.append(shard)
            shard, size = {}, 0
        shard[name] = t.contiguous().cpu()
        size += nbytes
    shards.append(shard)
    for i, s in enumerate(shards):
        fname = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(s, str(folder / fname), metadata={"format": "pt"})
        index.update({k: fname for k in s})
    if len(shards) > 1:
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    _publish(folder, final)


def _publish(tmp: Path, final: Path) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(tmp, final)
    except OSError:  # another worker published the same (deterministic) checkpoint first
        shutil.rmtree(tmp, ignore_errors=True)


def _embed_and_head(torch, oracle: Oracle, device) -> tuple:
    """Embedding rows sqrt(H) * e_j for the active tokens; lm_head row sigma(t_j) = e_j."""
    s = oracle.shape
    ids = torch.arange(s.active, device=device)
    embed = torch.zeros(s.vocab, s.hidden, dtype=torch.bfloat16, device=device)
    embed[FIRST_ACTIVE + ids, ids] = math.sqrt(s.hidden)
    head = torch.zeros(s.vocab, s.hidden, dtype=torch.bfloat16, device=device)
    head[FIRST_ACTIVE + torch.as_tensor(oracle.successor_index(), device=device), ids] = 1.0
    return embed, head


def write_target(folder: Path, oracle: Oracle, layers: Optional[int] = None, device: str = "cpu") -> None:
    """The oracle target (or, with fewer ``layers``, a STANDALONE draft with the same sigma)."""
    import torch

    s = oracle.shape
    layers = layers or s.layers
    gen = torch.Generator(device=device).manual_seed(oracle.seed)
    bf = torch.bfloat16
    embed, head = _embed_and_head(torch, oracle, device)
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
        w.update(_layer_weights(torch, s, f"model.layers.{i}.", gen, device))
    if s.attn_copy:
        w.update(attention_copy_weights(torch, s, "model.layers.0.", device))
    _save(torch, folder, _config(s, layers, "LlamaForCausalLM"), w)


PREV_WEIGHT = 2.0
"""lm_head weight of the previous-token vote (the current token's vote is 1): with the right
previous token both votes name the chain's next token (3 vs 0); with a wrong one x the vote for
sigma^2(x) (2) beats the current token's (1), so a wrong KV read changes the output."""


COPY_SCALE = 17.0
"""Per-plane |q| = |k| of the previous-position attention: the score gap between the previous
position and any other (rope_theta 500000, head_dim 64: at least 0.843 * 17^2 / sqrt(64) = 30)
keeps softmax weight off every other position below e^-30 per position."""


def position_qk(torch, s: Shape, offset: int, rope_theta: float = ROPE_THETA) -> tuple:
    """q and k (float64) that are the same for every active token, chosen per rotary plane so that
    RoPE makes the attention score peak at relative position ``offset`` (-1: the previous token,
    0: the token itself) whatever the tokens are. Inputs are RMS-normalised ``sqrt(H) * e_t``."""
    h, hd, a = s.hidden, s.head_dim, s.active
    half = hd // 2
    theta = rope_theta ** (-torch.arange(half, dtype=torch.float64) * 2 / hd)
    k_head = torch.zeros(hd, dtype=torch.float64)
    k_head[:half] = COPY_SCALE  # each plane (i, i + hd/2) at angle 0
    q_head = torch.zeros(hd, dtype=torch.float64)
    q_head[:half] = COPY_SCALE * torch.cos(offset * theta)  # angle offset * theta_i: the score
    q_head[half:] = COPY_SCALE * torch.sin(offset * theta)  # peaks at j - i = offset
    act = torch.zeros(h, dtype=torch.float64)
    act[:a] = 1.0 / math.sqrt(h)  # same q, k for every active (current) token
    return torch.outer(q_head.repeat(s.heads), act), torch.outer(k_head.repeat(s.kv_heads), act)


def attention_copy_weights(torch, s: Shape, prefix: str, device, rope_theta: float = ROPE_THETA) -> dict:
    """q/k/v/o of an attention layer that copies the previous position's token into residual dims
    [A, 2A): q and k from ``position_qk`` at offset -1; v is the token's one-hot (A = kv_heads x
    head_dim wide); o_proj takes the first query head of each KV group into the residual (the rest
    stay zero)."""
    h, hd, a = s.hidden, s.head_dim, s.active
    norm = math.sqrt(h)  # the layer sees RMS-normalised sqrt(H) * e_t
    q, k = position_qk(torch, s, -1, rope_theta)
    v = torch.zeros(s.kv_heads * hd, h, dtype=torch.float64)
    v[torch.arange(a), torch.arange(a)] = 1.0 / norm  # value of token t: e_t in value space
    o = torch.zeros(h, s.heads * hd, dtype=torch.float64)
    group = s.heads // s.kv_heads
    for g in range(s.kv_heads):
        rows = a + g * hd + torch.arange(hd)
        cols = g * group * hd + torch.arange(hd)
        o[rows, cols] = norm  # previous token p -> sqrt(H) * e_{A + p}
    bf = torch.bfloat16
    return {
        f"{prefix}self_attn.{n}_proj.weight": t.to(device=device, dtype=bf)
        for n, t in (("q", q), ("k", k), ("v", v), ("o", o))
    }


def eagle3_shape(s: Shape) -> Shape:
    """The EAGLE3 draft's own shape: the target's width and head size, one layer, and as many KV
    heads as query heads so the value space (kv_heads x head_dim = hidden) holds every active token."""
    return Shape(
        hidden=s.hidden,
        layers=1,
        intermediate=s.intermediate,
        heads=s.heads,
        kv_heads=s.heads,
        vocab=s.vocab,
        max_position=s.max_position,
    )


def eagle3_draft_ids(s: Shape) -> np.ndarray:
    """Target token id of each draft-vocabulary id: reversed active order, so ``d2t`` is not a shift."""
    return FIRST_ACTIVE + np.arange(s.active)[::-1]


def write_eagle3_draft(folder: Path, oracle: Oracle, device: str = "cpu") -> None:
    """The EAGLE3 draft of the module docstring (profile ``perfect``)."""
    import torch

    s, d = oracle.shape, eagle3_shape(oracle.shape)
    if oracle.profile is not Profile.perfect:
        raise ValueError("the EAGLE3 oracle is built for profile 'perfect' only")
    h, hd, a = d.hidden, d.head_dim, s.active
    bf = torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(oracle.seed + 3)
    config = _config(d, 1, "LlamaForCausalLMEagle3")
    config.update(
        {
            "draft_vocab_size": a,
            "target_hidden_size": s.hidden,
            # outputs of these target layers (SGLang captures them at the input of layer id + 1,
            # so the last id must be below the target's last layer)
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, s.layers // 2 - 1, s.layers - 2]},
        }
    )
    layer = _layer_weights(torch, d, "midlayer.", gen, device)
    # attention over [embeds; hidden] (2H wide): q, k constant for every active token at angle 0 in
    # every rotary plane (the score peaks at the token's own position); v = e_x - e_h; o -> residual
    norm = math.sqrt(h)
    for n, t in zip(("q", "k"), position_qk(torch, d, 0)):
        layer[f"midlayer.self_attn.{n}_proj.weight"] = torch.cat([t, torch.zeros_like(t)], dim=1).to(
            device=device, dtype=bf
        )  # the hidden half of the input plays no part
    v = torch.zeros(d.kv_heads * hd, 2 * h, dtype=torch.float64)
    v[torch.arange(a), torch.arange(a)] = 1.0 / norm
    v[torch.arange(a), h + torch.arange(a)] = -1.0 / norm
    o = torch.zeros(h, d.heads * hd, dtype=torch.float64)
    o[torch.arange(a), torch.arange(a)] = norm  # one KV head per query head: value dim t -> residual t
    layer["midlayer.self_attn.v_proj.weight"] = v.to(device=device, dtype=bf)
    layer["midlayer.self_attn.o_proj.weight"] = o.to(device=device, dtype=bf)
    layer["midlayer.hidden_norm.weight"] = torch.ones(h, dtype=bf, device=device)
    ids = torch.as_tensor(eagle3_draft_ids(s).copy(), device=device)
    succ = torch.as_tensor(oracle.successor_index(), device=device)
    inv = torch.empty_like(succ)
    inv[succ] = torch.arange(a, device=device)  # inv[k]: the active index whose successor is k
    head = torch.zeros(a, h, dtype=bf, device=device)
    head[torch.arange(a, device=device), inv[ids - FIRST_ACTIVE]] = 1.0  # draft id i <- x with sigma(x) = ids[i]
    w = {
        **layer,
        "fc.weight": torch.zeros(h, 3 * s.hidden, dtype=bf, device=device),
        "norm.weight": torch.ones(h, dtype=bf, device=device),
        "lm_head.weight": head,
        "d2t": (ids - torch.arange(a, device=device)).to(torch.int64),
    }
    _save(torch, folder, config, w)


def write_eagle_draft(folder: Path, oracle: Oracle, device: str = "cpu") -> None:
    """The EAGLE draft of module docstring (one layer, fc = [M, 0])."""
    import torch

    s = oracle.shape
    bf = torch.bfloat16
    config = _config(s, 1, "LlamaForCausalLMEagle")
    if oracle.profile is Profile.random:
        tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        _publish(tmp, folder)
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
    w.update(_layer_weights(torch, s, "layers.0.", gen, device, skip_input_norm=True))
    if s.attn_copy and oracle.profile is Profile.perfect:
        # the perfect draft reads its KV like the target: a wrong read there lowers acceptance.
        # Imperfect profiles keep a KV-blind draft: a previous-token vote would overrule their
        # deliberately wrong first choice.
        w.update(attention_copy_weights(torch, s, "layers.0.", device))
    _save(torch, folder, config, w)


def model_dirs(
    root: Path, size: ModelSize, profile: Profile, algorithm: Algorithm, seed: int = 0
) -> tuple[Path, Optional[Path]]:
    """(target, draft) folders for a case; the draft is None for NGRAM."""
    target = root / f"{size.value}-seed{seed}" / "target"
    if algorithm is Algorithm.NGRAM:
        return target, None
    if SHAPES[size].arch == "deepseek-v3":
        return target, target  # the MTP layer ships inside the target checkpoint (SGLang loads it as NextN)
    if algorithm is Algorithm.STANDALONE:
        return target, root / f"{size.value}-seed{seed}" / "standalone-draft"
    if algorithm is Algorithm.EAGLE3:
        return target, root / f"{size.value}-seed{seed}" / f"eagle3-draft-{profile.value}"
    return target, root / f"{size.value}-seed{seed}" / f"eagle-draft-{profile.value}"


def ensure_models(
    root: Path, size: ModelSize, profile: Profile, algorithm: Algorithm, seed: int = 0, device: str = "cpu"
) -> tuple[Path, Optional[Path]]:
    """Write the checkpoints a case needs unless already there; returns (target, draft). Workers
    starting in parallel take turns (a lock file per model size), so each checkpoint is written once."""
    import fcntl

    oracle = Oracle(SHAPES[size], seed, profile)
    target, draft = model_dirs(root, size, profile, algorithm, seed)
    Path(root).mkdir(parents=True, exist_ok=True)
    with open(Path(root) / f".{size.value}-seed{seed}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _write_missing(target, draft, oracle, size, seed, algorithm, device)
    return target, draft


def _write_missing(
    target: Path, draft: Optional[Path], oracle: "Oracle", size: ModelSize, seed: int, algorithm: Algorithm, device: str
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
        else:
            write_eagle_draft(draft, oracle, device=device)


MLA = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128}
"""DeepSeek-V3's MLA dimensions (what FlashMLA and the other MLA kernels are built for)."""


def _deepseek_config(s: Shape) -> dict:
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": s.hidden,
        "intermediate_size": s.intermediate,
        "moe_intermediate_size": 256,
        "num_hidden_layers": s.layers,
        "num_nextn_predict_layers": 1,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.heads,
        "q_lora_rank": None,
        **MLA,
        # dense MLP in the target layers; SGLang builds the MTP (NextN) layer's MLP as MoE always
        "first_k_dense_replace": s.layers + 1,
        "moe_layer_freq": 1,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "vocab_size": s.vocab,
        "max_position_embeddings": s.max_position,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": EOS_TOKEN_ID,
    }


def write_deepseek_target(folder: Path, oracle: Oracle, device: str = "cpu") -> None:
    """DeepSeek-V3 oracle: MLA layers with zero ``o_proj`` and ``down_proj`` (the residual stream stays
    the token embedding, as in the Llama oracle), ``lm_head`` = sigma, plus the MTP layer
    ``model.layers.<L>`` that SGLang loads as the EAGLE (NextN) draft: ``eh_proj = [I, 0]`` over
    [enorm(embed(next token)), hnorm(hidden)], zero decoder outputs, so it predicts sigma(next
    token) exactly (acceptance = steps + 1 at topk 1)."""
    import torch

    s = oracle.shape
    gen = torch.Generator(device=device).manual_seed(oracle.seed)
    bf = torch.bfloat16
    h, heads = s.hidden, s.heads

    def rnd(*shape):
        return (torch.randn(*shape, generator=gen, device=device) * 0.02).to(bf)

    def ones(n):
        return torch.ones(n, dtype=bf, device=device)

    def zero_out_mlp(prefix, inter):
        """A SwiGLU MLP (dense or one expert) that runs at full cost and adds nothing: down_proj zero."""
        return {
            prefix + "gate_proj.weight": rnd(inter, h),
            prefix + "up_proj.weight": rnd(inter, h),
            prefix + "down_proj.weight": torch.zeros(h, inter, dtype=bf, device=device),
        }

    embed, head = _embed_and_head(torch, oracle, device)
    w = {"model.embed_tokens.weight": embed, "lm_head.weight": head, "model.norm.weight": ones(h)}
    qk = MLA["qk_nope_head_dim"] + MLA["qk_rope_head_dim"]
    for i in range(s.layers + 1):  # layer L is the MTP layer
        p = f"model.layers.{i}."
        w.update(
            {
                p + "self_attn.q_proj.weight": rnd(heads * qk, h),
                p + "self_attn.kv_a_proj_with_mqa.weight": rnd(MLA["kv_lora_rank"] + MLA["qk_rope_head_dim"], h),
                p + "self_attn.kv_a_layernorm.weight": ones(MLA["kv_lora_rank"]),
                p + "self_attn.kv_b_proj.weight": rnd(
                    heads * (MLA["qk_nope_head_dim"] + MLA["v_head_dim"]), MLA["kv_lora_rank"]
                ),
                p + "self_attn.o_proj.weight": torch.zeros(h, heads * MLA["v_head_dim"], dtype=bf, device=device),
                p + "input_layernorm.weight": ones(h),
                p + "post_attention_layernorm.weight": ones(h),
            }
        )
        if i < s.layers:
            w.update(zero_out_mlp(p + "mlp.", s.intermediate))
    mtp = f"model.layers.{s.layers}."
    # SGLang builds the NextN layer's MLP as MoE whatever first_k_dense_replace says
    # (DeepseekV2DecoderLayer._is_layer_sparse: is_nextn or ...): routed and shared experts with zero
    # down projections, so the MTP layer's MLP still adds nothing.
    cfg = _deepseek_config(s)
    moe, n_exp, n_shared = cfg["moe_intermediate_size"], cfg["n_routed_experts"], cfg["n_shared_experts"]
    w[mtp + "mlp.gate.weight"] = rnd(n_exp, h)
    w[mtp + "mlp.gate.e_score_correction_bias"] = torch.zeros(n_exp, dtype=torch.float32, device=device)
    for e, inter in [(f"experts.{i}.", moe) for i in range(n_exp)] + [("shared_experts.", moe * n_shared)]:
        w.update(zero_out_mlp(mtp + "mlp." + e, inter))
    eye = torch.eye(h, dtype=bf, device=device)
    w.update(
        {
            mtp + "eh_proj.weight": torch.cat([eye, torch.zeros_like(eye)], dim=1),
            mtp + "enorm.weight": ones(h),
            mtp + "hnorm.weight": ones(h),
            mtp + "shared_head.norm.weight": ones(h),
        }
    )
    _save(torch, folder, cfg, w)
