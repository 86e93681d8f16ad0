"""The attention-sensitive oracle (``tiny-attn``) run through Hugging Face's Llama on the CPU: the
greedy chain is exact at every position of a long prompt, and a wrong token at the previous
position (what a wrong KV read looks like to layer 0) changes the next token."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.xdist_group("attention_oracle")
"""One xdist worker runs the module (``--dist loadgroup``): the Llama model is written and loaded once."""

from specwatch.core.case import ModelSize, Profile  # noqa: E402
from specwatch.oracle.checkpoints import write_target  # noqa: E402
from specwatch.oracle.predict import Oracle
from specwatch.oracle.shapes import FIRST_ACTIVE, SHAPES


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-attn") / "target"
    oracle = Oracle(SHAPES[ModelSize.tiny_attn], 0, Profile.perfect)
    write_target(folder, oracle)
    m = transformers.LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32, attn_implementation="sdpa")
    return m.eval(), oracle


def _next_tokens(m, ids):
    with torch.no_grad():
        h = m.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
        return (h.to(m.lm_head.weight.dtype) @ m.lm_head.weight.T).argmax(-1).tolist()


def test_chain_is_exact_at_every_position_of_a_long_prompt(model):
    m, oracle = model
    chain = oracle.chain(5, 2000)
    pred = _next_tokens(m, chain)
    # position 0 has no previous token (it attends to itself); every later one predicts sigma(t)
    assert pred[1:-1] == chain[2:]


def test_a_wrong_previous_token_changes_the_next_token(model):
    m, oracle = model
    succ = oracle.successor_index()
    chain = oracle.chain(7, 300)
    for x in (0, 11, 200):
        bad = list(chain)
        bad[-2] = FIRST_ACTIVE + x  # what a stale or misplaced KV slot would hold
        assert bad[-2] != chain[-2]
        assert _next_tokens(m, bad)[-1] == FIRST_ACTIVE + succ[succ[x]] != FIRST_ACTIVE + succ[chain[-1] - FIRST_ACTIVE]


def test_only_layer_zero_reads_kv_and_the_active_set_fits_the_values():
    s = SHAPES[ModelSize.tiny_attn]
    assert s.active == s.kv_heads * s.head_dim == 256 and 2 * s.active <= s.hidden
