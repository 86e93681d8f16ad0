"""The EAGLE3 oracle draft, checked by a written-out forward of SGLang 0.5.17's ``llama_eagle3.py``
(LlamaModel.forward + its LlamaDecoderLayer, one layer; Llama's neox RoPE; causal attention):
it predicts sigma of its input token at every position, after the target (hidden = fc(aux) = 0)
and inside a draft chain (hidden = its own previous output), and a wrong self read changes it."""

import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.xdist_group("eagle3_oracle")
"""One xdist worker runs the module (``--dist loadgroup``): each size's checkpoints are written once."""

from specwatch.core.case import Algorithm, ModelSize, Profile  # noqa: E402
from specwatch.oracle.checkpoints import (
    ROPE_THETA,
    eagle3_shape,
    model_dirs,
    write_eagle3_draft,
    write_target,
)
from specwatch.oracle.predict import Oracle
from specwatch.oracle.shapes import FIRST_ACTIVE, SHAPES
from specwatch.rules.validity import skip_reason  # noqa: E402


def rms(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, hd):
    """Llama's rotate-half RoPE on (n, heads, hd) at integer positions."""
    half = hd // 2
    inv = ROPE_THETA ** (-torch.arange(half, dtype=torch.float64) * 2 / hd)
    ang = pos[:, None].double() * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


class Eagle3:
    """SGLang's Eagle3 LlamaModel, written out (fp64 on the bf16 weights)."""

    def __init__(self, folder, target_folder, shape):
        from safetensors.torch import load_file

        w = {k: v.double() for k, v in load_file(str(folder / "model.safetensors")).items()}
        t = load_file(str(target_folder / "model.safetensors"))
        self.w, self.embed = w, t["model.embed_tokens.weight"].double()  # SGLang shares the target's
        self.d = eagle3_shape(shape)
        self.hot = (w["d2t"] + torch.arange(w["d2t"].shape[0])).long()  # SGLang's hot_token_id

    def forward(self, tokens, hidden, positions, attend=None):
        """Outputs (predicted target ids, aux hidden) for ``tokens`` at ``positions`` with incoming
        ``hidden`` (3H wide: the target's aux states, through fc; H wide: a draft step's own)."""
        w, d = self.w, self.d
        hd, p = d.head_dim, "midlayer."
        if hidden.shape[-1] != d.hidden:
            hidden = hidden @ w["fc.weight"].T
        residual = hidden
        x = torch.cat(
            [rms(self.embed[tokens], w[p + "input_layernorm.weight"]), rms(hidden, w[p + "hidden_norm.weight"])], -1
        )
        n = len(tokens)
        q = rope((x @ w[p + "self_attn.q_proj.weight"].T).view(n, d.heads, hd), positions, hd)
        k = rope((x @ w[p + "self_attn.k_proj.weight"].T).view(n, d.kv_heads, hd), positions, hd)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(n, d.kv_heads, hd)
        if attend is not None:  # a faulty read: query i sees key/value attend[i] in its own slot
            k, v = k.clone(), v.clone()
            k[torch.arange(n)], v[torch.arange(n)] = k[attend].clone(), v[attend].clone()
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        scores = scores.masked_fill(positions[None, :, None] < positions[None, None, :], float("-inf"))
        attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, -1)
        residual = residual + attn @ w[p + "self_attn.o_proj.weight"].T
        mid = rms(residual, w[p + "post_attention_layernorm.weight"])
        mlp = (
            torch.nn.functional.silu(mid @ w[p + "mlp.gate_proj.weight"].T) * (mid @ w[p + "mlp.up_proj.weight"].T)
        ) @ w[p + "mlp.down_proj.weight"].T
        aux = mlp + residual  # norm_output false: the pre-norm sum
        logits = rms(aux, w["norm.weight"]) @ w["lm_head.weight"].T
        return self.hot[logits.argmax(-1)], aux


@pytest.fixture(scope="module", params=[ModelSize.tiny, ModelSize.tiny_attn])
def draft(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param.value)
    oracle = Oracle(SHAPES[request.param], 0, Profile.perfect)
    target, folder = model_dirs(root, request.param, Profile.perfect, Algorithm.EAGLE3)
    write_target(target, oracle)
    write_eagle3_draft(folder, oracle)
    return Eagle3(folder, target, oracle.shape), oracle


def test_draft_predicts_sigma_after_the_target_and_along_its_own_chain(draft):
    model, oracle = draft
    chain = oracle.chain(5, 120)
    toks = torch.tensor(chain[:100])
    pos = torch.arange(100)
    aux = torch.randn(100, 3 * oracle.shape.hidden, dtype=torch.float64)  # whatever the target sends
    pred, out = model.forward(toks, aux, pos)
    assert pred.tolist() == chain[1:101]  # draft extend over the prompt
    # a draft chain: each step feeds its predicted token and its own output hidden at the next
    # position, over the KV of everything before it (recomputed here; causal, so the same values)
    toks_, hids = chain[:100], [torch.zeros(100, oracle.shape.hidden, dtype=torch.float64)]
    tok, hid = chain[100], out[-1:]
    for step in range(6):
        toks_.append(tok)
        hids.append(hid)
        pred, out = model.forward(torch.tensor(toks_), torch.cat(hids), torch.arange(len(toks_)))
        assert int(pred[-1]) == chain[101 + step]
        tok, hid = int(pred[-1]), out[-1:]


def test_a_wrong_self_read_changes_the_draft(draft):
    model, oracle = draft
    chain = oracle.chain(11, 64)
    toks, pos = torch.tensor(chain), torch.arange(64)
    hidden = torch.zeros(64, oracle.shape.hidden, dtype=torch.float64)
    stale = torch.arange(64)
    stale[40] = 39  # position 40 reads the slot of position 39
    pred, _ = model.forward(toks, hidden, pos, attend=stale)
    assert int(pred[40]) != chain[41] and pred[:40].tolist() == chain[1:41]


def test_d2t_maps_a_reversed_draft_vocabulary_and_only_perfect_is_built(draft, tmp_path):
    model, oracle = draft
    a = oracle.shape.active
    assert model.hot.tolist() == [FIRST_ACTIVE + a - 1 - i for i in range(a)]
    assert model.w["d2t"].shape == (a,) and model.w["lm_head.weight"].shape == (a, oracle.shape.hidden)
    with pytest.raises(ValueError, match="perfect"):
        write_eagle3_draft(tmp_path / "x", Oracle(oracle.shape, 0, Profile.q01))


def test_eagle3_cases_are_perfect_llama_only():
    from specwatch.core.case import Backend, Case

    base = dict(
        algorithm=Algorithm.EAGLE3,
        attention_backend=Backend.triton,
        page_size=64,
        topk=1,
        num_steps=3,
        num_draft_tokens=4,
        batch_size=1,
        input_len=128,
        output_len=64,
    )
    assert skip_reason(Case(model=ModelSize.tiny, **base)) is None
    assert "perfect" in skip_reason(Case(model=ModelSize.tiny, profile=Profile.q01, **base))
    assert skip_reason(Case(model=ModelSize.tiny_mla, **base)) is not None


def test_aux_layers_exist_in_the_target(draft, tmp_path):
    """SGLang captures aux states at the input of layer id + 1 (llama.py set_eagle3_layers_to_capture):
    an id of the last layer would capture nothing and hand fc 2H instead of 3H."""
    import json

    model, oracle = draft
    folder = tmp_path / "d"
    write_eagle3_draft(folder, oracle)
    cfg = json.loads((folder / "config.json").read_text())
    ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert len(ids) == 3 and all(0 <= i + 1 < oracle.shape.layers for i in ids)
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == oracle.shape.active
