"""The DeepSeek-V3 (MLA) oracle: Hugging Face's DeepseekV3 on the CPU follows the sigma chain, the
MTP layer predicts sigma of the next token, and the plan gives MLA-only backends their SGLang rules."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from specwatch.core.case import Algorithm, Backend, Case, ModelSize, Profile  # noqa: E402
from specwatch.oracle.checkpoints import model_dirs, write_deepseek_target  # noqa: E402
from specwatch.oracle.predict import Oracle
from specwatch.oracle.shapes import FIRST_ACTIVE, SHAPES
from specwatch.rules.validity import skip_reason  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-mla") / "target"
    oracle = Oracle(SHAPES[ModelSize.tiny_mla], 0, Profile.perfect)
    write_deepseek_target(folder, oracle)
    return folder, oracle


def test_hf_deepseek_v3_follows_the_chain(checkpoint):
    folder, oracle = checkpoint
    m = transformers.DeepseekV3ForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    chain = oracle.chain(9, 300)
    with torch.no_grad():
        pred = m(input_ids=torch.tensor([chain])).logits[0].argmax(-1).tolist()
    assert pred[:-1] == chain[1:]


def test_mtp_layer_predicts_sigma_of_the_next_token(checkpoint):
    """SGLang's NextN forward, written out: eh_proj([enorm(embed(next)), hnorm(hidden)]), a decoder
    layer whose o_proj and down_proj are zero, shared_head.norm, lm_head."""
    from safetensors.torch import load_file

    folder, oracle = checkpoint
    w = load_file(str(folder / "model.safetensors"))
    L = SHAPES[ModelSize.tiny_mla].layers
    p = f"model.layers.{L}."
    assert w[p + "self_attn.o_proj.weight"].abs().sum() == 0
    # SGLang always builds the NextN layer's MLP as MoE (a dense MTP MLP failed to load on the H200:
    # KeyError 'model.decoder.mlp.gate_up_proj.weight'): routed + shared experts, every down_proj zero
    assert not any(k.startswith(p + "mlp.gate_proj") for k in w)
    n_exp = 8
    assert w[p + "mlp.gate.weight"].shape == (n_exp, oracle.shape.hidden)
    assert w[p + "mlp.gate.e_score_correction_bias"].shape == (n_exp,)
    downs = [k for k in w if k.startswith(p + "mlp.") and k.endswith("down_proj.weight")]
    assert len(downs) == n_exp + 1 and all(w[k].abs().sum() == 0 for k in downs)
    assert all(w[f"model.layers.{i}.mlp.down_proj.weight"].abs().sum() == 0 for i in range(L))

    def rms(x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    succ = oracle.successor_index()
    for j in (0, 17, 500):
        e = w["model.embed_tokens.weight"][FIRST_ACTIVE + j].float()
        hidden = torch.randn(e.shape)  # any target hidden state
        x = w[p + "eh_proj.weight"].float() @ torch.cat([rms(e), rms(hidden)])
        logits = w["lm_head.weight"].float() @ rms(x)
        assert int(logits.argmax()) == FIRST_ACTIVE + succ[j]


def test_mla_cases_get_sglangs_rules_and_share_one_checkpoint(tmp_path):
    base = dict(
        model=ModelSize.tiny_mla,
        algorithm=Algorithm.EAGLE,
        topk=1,
        num_steps=3,
        num_draft_tokens=4,
        batch_size=1,
        input_len=128,
        output_len=64,
    )
    assert skip_reason(Case(**base, attention_backend=Backend.flashmla, page_size=64)) is None
    assert "page_size of 64" in skip_reason(Case(**base, attention_backend=Backend.flashmla, page_size=1))
    assert "MLA backend" in skip_reason(
        Case(**{**base, "model": ModelSize.tiny}, attention_backend=Backend.flashmla, page_size=64)
    )
    assert "perfect" in skip_reason(
        Case(**base, attention_backend=Backend.triton, page_size=64, profile=Profile.second_choice)
    )
    # SGLang 0.5.17 raised this at engine start on 2xH200 (FlashInferMLAMultiStepDraftBackend); topk 1 ran
    tree = {**base, "topk": 4, "num_draft_tokens": 8}
    assert (
        skip_reason(Case(**tree, attention_backend=Backend.flashinfer, page_size=1))
        == "mla-backend: Currently Flashinfer MLA only supports topk=1 for speculative decoding"
    )
    assert skip_reason(Case(**base, attention_backend=Backend.flashinfer, page_size=1)) is None
    assert (
        skip_reason(Case(**{**tree, "model": ModelSize.tiny}, attention_backend=Backend.flashinfer, page_size=1))
        is None
    )
    target, draft = model_dirs(tmp_path, ModelSize.tiny_mla, Profile.perfect, Algorithm.EAGLE)
    assert draft == target
