"""The DeepSeek-V3 oracle (``tiny-mla``): MLA target whose MTP layer SGLang loads as the NextN draft; see
``specwatch.oracle.checkpoints``."""

from __future__ import annotations

from pathlib import Path

from specwatch.oracle.predict import Oracle
from specwatch.oracle.shapes import EOS_TOKEN_ID, Shape
from specwatch.oracle.weights import embed_and_head, save_checkpoint

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

    embed, head = embed_and_head(torch, oracle, device)
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
    cfg = _deepseek_config(s)
    w.update(_mtp_layer(torch, s, cfg, rnd, ones, zero_out_mlp, device))
    save_checkpoint(torch, folder, cfg, w)


def _mtp_layer(torch, s, cfg: dict, rnd, ones, zero_out_mlp, device: str) -> dict:
    """The MTP layer's own weights (``model.layers.<L>``): MoE MLP with zero down projections and
    ``eh_proj = [I, 0]``."""
    w = {}
    bf = torch.bfloat16
    h = s.hidden
    mtp = f"model.layers.{s.layers}."
    # SGLang builds the NextN layer's MLP as MoE whatever first_k_dense_replace says
    # (DeepseekV2DecoderLayer._is_layer_sparse: is_nextn or ...): routed and shared experts with zero
    # down projections, so the MTP layer's MLP still adds nothing.
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
    return w
