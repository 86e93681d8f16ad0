"""Shared pieces of the oracle checkpoints: Llama config, zero-output layers, the embedding and
lm_head of the sigma chain, position-selecting attention, and the atomic checkpoint writer.

Every oracle writer (``checkpoints``, ``eagle3``, ``deepseek``, ``dflash``) builds on these; the
behaviour they realise is described in ``specwatch.oracle.checkpoints``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

from specwatch.oracle.predict import Oracle
from specwatch.oracle.shapes import EOS_TOKEN_ID, FIRST_ACTIVE, Shape

ROPE_THETA = 500000.0


def config_of(shape: Shape, layers: int, architecture: str) -> dict:
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


def layer_weights(torch, shape: Shape, prefix: str, gen, device, skip_input_norm: bool = False) -> dict:
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


def save_checkpoint(torch, folder: Path, config: dict, weights: dict) -> None:
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
    publish(folder, final)


def publish(tmp: Path, final: Path) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(tmp, final)
    except OSError:  # another worker published the same (deterministic) checkpoint first
        shutil.rmtree(tmp, ignore_errors=True)


def embed_and_head(torch, oracle: Oracle, device) -> tuple:
    """Embedding rows sqrt(H) * e_j for the active tokens; lm_head row sigma(t_j) = e_j."""
    s = oracle.shape
    ids = torch.arange(s.active, device=device)
    embed = torch.zeros(s.vocab, s.hidden, dtype=torch.bfloat16, device=device)
    embed[FIRST_ACTIVE + ids, ids] = math.sqrt(s.hidden)
    head = torch.zeros(s.vocab, s.hidden, dtype=torch.bfloat16, device=device)
    head[FIRST_ACTIVE + torch.as_tensor(oracle.successor_index(), device=device), ids] = 1.0
    return embed, head


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
