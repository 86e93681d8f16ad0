"""The DFLASH oracle draft (``DFlashDraftModel``): a block whose greedy tokens are known in closed form.

SGLang's DFLASH (``speculative/dflash_worker_v2.py``, ``models/dflash.py``) drafts a whole block of
``B = speculative_num_draft_tokens`` positions at once: block position 0 holds the bonus token b
(the last committed token, at position L = the committed length) and positions 1..B-1 the mask
token; the draft runs one non-causal forward over the block, attending to its own KV cache (the
committed context, whose K/V are ``kv_proj(hidden_norm(fc(target aux hidden)))``, plus the block's
own K/V), and the target's ``lm_head`` turns the output at block position i into draft token d_i.
The target verifies [b, d_1, .., d_{B-1}] and accepts while d_i = sigma(d_{i-1}).

This draft (one layer) makes d_i any chosen function of (b, i), here the oracle chain:

* The mask token is inactive (``MASK_TOKEN_ID``): the target embeds it to 0, so a mask position
  enters the layer as 0. ``fc`` is 0, so every context position's hidden is 0 too.
* q and k come from biases alone (q_proj, k_proj weights 0): every query and every key is the same
  vector before RoPE, so where a head attends depends on relative position only. Query head
  (kv head c, group g) attends, through RoPE, to relative position -(g + 1) (``position_qk``'s
  construction per head; the per-head q_norm / k_norm weights undo the RMS normalisation of the
  biases exactly). The score gap to any other position is at least ``GAP_FLOOR`` (head_dim 128,
  ``QK_SCALE``), so the weight elsewhere is below e^-70 per position.
* Values: v_proj is the one-hot of the input token (the value space, kv_heads x 128 wide, holds
  every active token), so only the bonus position has a non-zero value; mask and context positions
  have value 0.
* So at block position i only group g = i - 1 reads the bonus (its peak); every other group's peak
  is a mask or context position, whose value is 0. ``o_proj`` of group g maps e_t to the residual
  dimension ``r_g(t)``; the final norm makes it ``sqrt(H) e_{r_g(b)}`` and the target's lm_head
  (row sigma(t_j) = e_j) makes d_i = sigma(r_{i-1}(b)).
* ``perfect``: r_g(t) = sigma^g(t), so d_i = sigma^i(b): the whole block is accepted.
  ``q=0.1``, ``q=0.3``, ``second-choice`` (the EAGLE profiles' wrong set S): r_g(t) = sigma^(g+1)(t)
  when sigma^g(t) is in S, so d_i is wrong (sigma^(i+1)(b)) exactly when sigma^(i-1)(b) is in S: a
  verify accepts the longest run of chain tokens outside S from b, capped at B - 1
  (``Oracle.expected_chain_verifies`` at depth B - 1, ``expected_block_verifies``).

Exact at every block position 1..B-1, B up to ``MAX_BLOCK``, as long as every group's peak position
exists, i.e. the committed length is at least ``MAX_BLOCK - 2`` (``MIN_PROMPT``): with a shorter
context a group whose peak falls before position 0 would spread its weight, the bonus included.
Checked on the CPU by SGLang 0.5.17's own ``DFlashDraftModel`` (its load_weights, q/k norms,
RoPE, norms and MLP; attention written out over its KV): tests/test_dflash_oracle.py.
The Q/K biases turn off SGLang's fused context-KV path (``can_dflash_use_fused_qkv_proj``: "qkv
bias is not supported for fused KV path"): context K/V are written by the per-layer path.
"""

from __future__ import annotations

import math
from pathlib import Path

from specwatch.core.case import Profile
from specwatch.oracle.predict import Oracle
from specwatch.oracle.shapes import FIRST_ACTIVE, Shape
from specwatch.oracle.weights import ROPE_THETA, config_of, layer_weights, save_checkpoint

MAX_BLOCK = 16
"""Largest block (``speculative_num_draft_tokens``) the draft serves: one head group per block
position 1..15, plus one spare group so each KV head serves 16 query heads."""

HEAD_DIM = 128
"""Draft head size (every DFLASH draft backend takes 128)."""

QK_SCALE = 24.0
"""Per-plane |q| = |k| of the position-selecting attention."""

GAP_FLOOR = 70.0
"""Lower bound of the score gap between a head's peak and any other position (QK_SCALE^2 / sqrt(128)
x min over 1 <= d < 8208 of sum over planes (1 - cos(d theta)), theta = 500000^(-2p/128): 71.98)."""

MASK_TOKEN_ID = FIRST_ACTIVE - 1
"""The draft's mask token: inside the target vocabulary (SGLang refuses one outside it), inactive,
so the target's embedding of it is 0."""

MIN_PROMPT = MAX_BLOCK - 2
"""Fewest committed tokens at which every group's peak position exists (``validity``'s dflash rule)."""


def dflash_shape(s: Shape) -> Shape:
    """The draft's own shape: the target's width, one layer, kv_heads x HEAD_DIM >= the active
    tokens (the value space), MAX_BLOCK query heads per KV head."""
    kv = -(-s.active // HEAD_DIM)
    return Shape(
        hidden=s.hidden,
        layers=1,
        intermediate=256,
        heads=kv * MAX_BLOCK,
        kv_heads=kv,
        vocab=s.vocab,
        max_position=s.max_position,
    )


def target_layer_ids(s: Shape) -> list[int]:
    """Target layers whose outputs SGLang captures for the draft (at the input of layer id + 1, so
    the last id is below the target's last layer); they reach the draft only through ``fc`` = 0."""
    return sorted({0, s.layers // 2 - 1, s.layers - 2})


def residual_index(oracle: Oracle, group: int) -> list[int]:
    """``r_g`` of the module docstring over the active indices: where ``o_proj`` of head group
    ``group`` (block position group + 1) puts the bonus token's one-hot."""
    succ = oracle.successor_index()
    wrong = oracle.wrong_set() if oracle.profile is not Profile.perfect else None
    out = []
    for t in range(len(succ)):
        r = t
        for _ in range(group):
            r = int(succ[r])
        if wrong is not None and wrong[r]:
            r = int(succ[r])
        out.append(r)
    return out


def dflash_config(oracle: Oracle, block_size: int) -> dict:
    """config.json of the draft (``DFlashDraftModel``, Llama sizes, ``dflash_config``)."""
    s, d = oracle.shape, dflash_shape(oracle.shape)
    config = config_of(d, 1, "DFlashDraftModel")
    config.update(
        {
            "head_dim": HEAD_DIM,
            "attention_bias": True,
            "block_size": block_size,
            "dflash_config": {
                "block_size": block_size,
                "target_layer_ids": target_layer_ids(s),
                "num_target_layers": s.layers,
                "mask_token": "<|MASK|>",
                "mask_token_id": MASK_TOKEN_ID,
            },
        }
    )
    return config


def _qk_biases(torch, d: Shape) -> tuple:
    """q bias (group g of every KV head peaks at relative position -(g + 1)), k bias (angle 0 in
    every rotary plane), and the q_norm / k_norm weight that restores them after RMS normalisation."""
    half = HEAD_DIM // 2
    theta = ROPE_THETA ** (-torch.arange(half, dtype=torch.float64) * 2 / HEAD_DIM)
    k_head = torch.zeros(HEAD_DIM, dtype=torch.float64)
    k_head[:half] = QK_SCALE
    q = torch.zeros(d.kv_heads, MAX_BLOCK, HEAD_DIM, dtype=torch.float64)
    for g in range(MAX_BLOCK):
        q[:, g, :half] = QK_SCALE * torch.cos(-(g + 1) * theta)
        q[:, g, half:] = QK_SCALE * torch.sin(-(g + 1) * theta)
    return q.flatten(), k_head.repeat(d.kv_heads), QK_SCALE / math.sqrt(2)


def write_dflash_draft(folder: Path, oracle: Oracle, block_size: int = MAX_BLOCK, device: str = "cpu") -> None:
    """The DFLASH draft of the module docstring for ``oracle``'s profile (not ``random``)."""
    import torch

    if oracle.profile is Profile.random:
        raise ValueError("the DFLASH oracle has no 'random' profile (no closed form)")
    if not 1 <= block_size <= MAX_BLOCK:
        raise ValueError(f"the DFLASH oracle serves block sizes 1..{MAX_BLOCK}, not {block_size}")
    s, d = oracle.shape, dflash_shape(oracle.shape)
    h, a, bf, p = s.hidden, s.active, torch.bfloat16, "layers.0."
    gen = torch.Generator(device=device).manual_seed(oracle.seed + 4)
    w = layer_weights(torch, d, p, gen, device)
    q_bias, k_bias, norm_w = _qk_biases(torch, d)
    v = torch.zeros(d.kv_heads * HEAD_DIM, h, dtype=torch.float64)
    v[torch.arange(a), torch.arange(a)] = 1.0 / math.sqrt(h)  # input sqrt(H) e_t -> value e_t
    o = torch.zeros(h, d.heads * HEAD_DIM, dtype=torch.float64)
    t = torch.arange(a)
    kv_head, dim = t // HEAD_DIM, t % HEAD_DIM
    for g in range(MAX_BLOCK - 1):  # block position g + 1; the same weights serve every block size
        cols = (kv_head * MAX_BLOCK + g) * HEAD_DIM + dim  # query head (kv head, group g), value dim t
        o[torch.as_tensor(residual_index(oracle, g)), cols] = math.sqrt(h)
    zeros = torch.zeros
    w.update(
        {
            p + "self_attn.q_proj.weight": zeros(d.heads * HEAD_DIM, h),
            p + "self_attn.k_proj.weight": zeros(d.kv_heads * HEAD_DIM, h),
            p + "self_attn.v_proj.weight": v,
            p + "self_attn.o_proj.weight": o,
            p + "self_attn.q_proj.bias": q_bias,
            p + "self_attn.k_proj.bias": k_bias,
            p + "self_attn.v_proj.bias": zeros(d.kv_heads * HEAD_DIM),
            p + "self_attn.o_proj.bias": zeros(h),
            p + "self_attn.q_norm.weight": torch.full((HEAD_DIM,), norm_w),
            p + "self_attn.k_norm.weight": torch.full((HEAD_DIM,), norm_w),
            "fc.weight": zeros(h, len(target_layer_ids(s)) * h),
            "hidden_norm.weight": torch.ones(h),
            "norm.weight": torch.ones(h),
        }
    )
    w = {k: x.to(device=device, dtype=bf) for k, x in w.items()}
    save_checkpoint(torch, folder, dflash_config(oracle, block_size), w)
