import numpy as np
import pytest

from specwatch.case import Algorithm, ModelSize, Profile
from specwatch.oracle import FIRST_ACTIVE, SHAPES, Oracle, ensure_models


def test_sigma_is_one_cycle():
    o = Oracle(SHAPES[ModelSize.tiny], 0, Profile.perfect)
    succ = o.successor_index()
    j, seen = 0, set()
    for _ in range(o.shape.active):
        seen.add(j)
        j = succ[j]
    assert j == 0 and len(seen) == o.shape.active


def test_expected_verifies():
    perfect = Oracle(SHAPES[ModelSize.tiny], 0, Profile.perfect)
    assert perfect.expected_chain_verifies(FIRST_ACTIVE + 5, 256, 3) == 64   # ceil(255 / 4)
    second = Oracle(SHAPES[ModelSize.tiny], 0, Profile.second_choice)
    assert second.expected_chain_verifies(FIRST_ACTIVE + 5, 256, 3) == 255   # nothing accepted
    q = Oracle(SHAPES[ModelSize.tiny], 0, Profile.q03)
    assert q.wrong_set().sum() == round(0.3 * 1024)
    assert 64 < q.expected_chain_verifies(FIRST_ACTIVE + 5, 256, 3) < 255


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("models")
    return root, ensure_models(root, ModelSize.tiny, Profile.q03, Algorithm.EAGLE)


def test_target_greedy_is_the_chain(tiny):
    import torch
    from transformers import AutoModelForCausalLM

    _, (target, _) = tiny
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16)
    o = Oracle(SHAPES[ModelSize.tiny], 0, Profile.perfect)
    chain = o.chain(17, 40)
    out = model.generate(torch.tensor([chain[:24]]), max_new_tokens=16, do_sample=False)
    assert out[0, 24:].tolist() == chain[24:]


def test_eagle_draft_ranks(tiny):
    """Draft logits = target lm_head(fc([embed(x), h])): perfect tokens -> sigma(x) first;
    wrong-set tokens -> sigma(sigma(x)) first, sigma(x) second."""
    import torch
    from safetensors.torch import load_file

    root, (target, draft) = tiny
    t = load_file(str(target / "model.safetensors"))
    d = load_file(str(draft / "model.safetensors"))
    o = Oracle(SHAPES[ModelSize.tiny], 0, Profile.q03)
    succ, wrong = o.successor_index(), o.wrong_set()
    x = torch.arange(FIRST_ACTIVE, FIRST_ACTIVE + 1024)
    h = torch.cat([t["model.embed_tokens.weight"][x], torch.zeros(1024, 1024, dtype=torch.bfloat16)], dim=1)
    logits = (h.float() @ d["fc.weight"].float().T) @ t["lm_head.weight"].float().T
    top2 = logits.topk(2, dim=-1).indices.numpy() - FIRST_ACTIVE
    right = succ[np.arange(1024)]
    assert (top2[~wrong, 0] == right[~wrong]).all()
    assert (top2[wrong, 0] == succ[right[wrong]]).all() and (top2[wrong, 1] == right[wrong]).all()


def test_tree_simulation_perfect_and_second_choice():
    perfect = Oracle(SHAPES[ModelSize.tiny], 0, Profile.perfect)
    assert perfect.expected_verifies(FIRST_ACTIVE + 5, 256, 3, 8, 8) == 64          # steps + 1 per verify
    second = Oracle(SHAPES[ModelSize.tiny], 0, Profile.second_choice)
    assert second.expected_verifies(FIRST_ACTIVE + 5, 256, 3, 1, 4) == 255          # chain: nothing accepted
    assert second.expected_verifies(FIRST_ACTIVE + 5, 256, 3, 8, 8) < 255           # the tree recovers


def test_tree_simulation_matches_committed_h200_measurements():
    """The oracle's tree simulation against acceptance measured by SGLang on the H200 (results/)."""
    import statistics
    from conftest import ROOT
    from specwatch.engine_worker import prompt_starts
    from specwatch.store import load_records, result_files

    recs = [r for r in load_records(result_files(ROOT / "results")) if r.status.value == "ok"
            and r.provenance.fault is None and r.case.topk > 1 and r.case.algorithm is Algorithm.EAGLE and r.case.profile is not Profile.random]
    assert any(r.case.profile is Profile.second_choice for r in recs)
    for r in recs:
        c = r.case
        o = Oracle(SHAPES[c.model], 0, c.profile)
        per_repeat = []
        for rep in range(len(r.metrics["accept_length"].samples)):
            per_repeat.append(statistics.mean(
                c.output_len / o.expected_verifies(o.chain(start, c.input_len + 1)[-1], c.output_len,
                                                   c.num_steps, c.topk, c.num_draft_tokens)
                for start in prompt_starts(c, f"timed{rep}", c.batch_size)))
        assert per_repeat == r.metrics["accept_length"].samples, c.label()
