"""The EAGLE3 oracle draft (``LlamaForCausalLMEagle3``, profile ``perfect``): see ``specwatch.oracle.checkpoints``."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from specwatch.core.case import Profile
from specwatch.oracle.predict import Oracle
from specwatch.oracle.shapes import FIRST_ACTIVE, Shape
from specwatch.oracle.weights import config_of, layer_weights, position_qk, save_checkpoint


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
    config = config_of(d, 1, "LlamaForCausalLMEagle3")
    config.update(
        {
            "draft_vocab_size": a,
            "target_hidden_size": s.hidden,
            # outputs of these target layers (SGLang captures them at the input of layer id + 1,
            # so the last id must be below the target's last layer)
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, s.layers // 2 - 1, s.layers - 2]},
        }
    )
    layer = layer_weights(torch, d, "midlayer.", gen, device)
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
    save_checkpoint(torch, folder, config, w)
