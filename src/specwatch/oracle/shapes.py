"""The oracle models' shapes: vocabulary layout, layer sizes and the token ids every oracle shares."""

from __future__ import annotations

from dataclasses import dataclass

from specwatch.core.case import ModelSize

FIRST_ACTIVE = 1000
"""First active token id (clear of special tokens)."""


EOS_TOKEN_ID = 2
"""Never an active token, so the chain never stops on EOS."""


WRONG_WEIGHT, RIGHT_WEIGHT = 1.0, 0.75
"""Draft logits scale for the wrong first choice and the right second choice (imperfect profiles)."""


@dataclass(frozen=True)
class Shape:
    """Llama shapes of one model size."""

    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    max_position: int = 8192
    attn_copy: bool = False
    """Layer 0 copies the previous position's token into the residual stream (attention-sensitive)."""
    arch: str = "llama"
    """``llama`` (LlamaForCausalLM) or ``deepseek-v3`` (DeepseekV3ForCausalLM: MLA, MTP draft layer)."""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def active(self) -> int:
        """Active tokens: one residual dimension each (two with ``attn_copy``: current and previous,
        the previous one carried by the values, kv_heads x head_dim wide)."""
        return self.kv_heads * self.head_dim if self.attn_copy else self.hidden


SHAPES = {
    ModelSize.tiny: Shape(hidden=1024, layers=4, intermediate=2816, heads=16, kv_heads=4, vocab=32000),
    ModelSize.llama_1b: Shape(hidden=2048, layers=16, intermediate=8192, heads=32, kv_heads=8, vocab=128256),
    ModelSize.llama_8b: Shape(hidden=4096, layers=32, intermediate=14336, heads=32, kv_heads=8, vocab=128256),
    ModelSize.tiny_mla: Shape(
        hidden=1024, layers=2, intermediate=2816, heads=16, kv_heads=16, vocab=32000, arch="deepseek-v3"
    ),
    ModelSize.tiny_attn: Shape(
        hidden=1024, layers=4, intermediate=2816, heads=16, kv_heads=4, vocab=32000, attn_copy=True
    ),
}
