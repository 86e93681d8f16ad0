"""The DFLASH oracle draft, run through SGLang 0.5.17's own ``DFlashDraftModel`` on the CPU (its
load_weights, fused QKV, per-head q/k norms, RoPE, norms, MLP and ``project_target_hidden``; the
context K/V written as its per-layer path writes them, ``kv_proj_only`` + ``apply_k_norm`` +
``apply_k_rope``). Only the attention kernel is written out: non-causal (the draft's layers are
ENCODER_ONLY without ``layer_types``) over the context and the block, GQA by head // group.
A decode loop with SGLang's greedy verify (``compute_dflash_correct_drafts_and_bonus``) then
checks the acceptance against ``Oracle.expected_block_verifies``."""

import contextlib
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang")

pytestmark = pytest.mark.xdist_group("dflash_oracle")
"""One xdist worker runs the module (``--dist loadgroup``): SGLang's draft models are built once."""

from specwatch.core.case import ModelSize, Profile  # noqa: E402
from specwatch.oracle.dflash import MASK_TOKEN_ID, MAX_BLOCK, write_dflash_draft  # noqa: E402
from specwatch.oracle.predict import Oracle  # noqa: E402
from specwatch.oracle.shapes import FIRST_ACTIVE, SHAPES  # noqa: E402
from specwatch.oracle.weights import embed_and_head  # noqa: E402


class ReferenceAttention(torch.nn.Module):
    """Stands in for ``RadixAttention``: attention of the block's queries over ``batch.ctx`` (this
    layer's context K/V) followed by the block's own K/V, no mask (ENCODER_ONLY)."""

    def __init__(self, radix):
        super().__init__()
        self.heads, self.kv_heads = radix.tp_q_head_num, radix.tp_k_head_num
        self.hd, self.scaling, self.layer_id = radix.head_dim, radix.scaling, radix.layer_id

    def forward(self, q, k, v, batch):
        ck, cv = batch.ctx[self.layer_id]
        k = torch.cat([ck, k.view(-1, self.kv_heads, self.hd)])
        v = torch.cat([cv, v.view(-1, self.kv_heads, self.hd)])
        if batch.corrupt is not None:  # a wrong KV read: slot a holds slot b's K/V
            a, b = batch.corrupt
            k, v = k.clone(), v.clone()
            k[a], v[a] = k[b], v[b]
        group = self.heads // self.kv_heads
        qh = q.view(-1, self.heads, self.hd).float()
        kh = k.float().repeat_interleave(group, dim=1)
        vh = v.float().repeat_interleave(group, dim=1)
        w = torch.softmax(torch.einsum("qhd,khd->hqk", qh, kh) * self.scaling, dim=-1)
        return torch.einsum("hqk,khd->qhd", w, vh).reshape(q.shape[0], -1).to(q.dtype)


class Batch:
    def __init__(self, ctx, corrupt=None):
        self.ctx, self.corrupt = ctx, corrupt


@contextlib.contextmanager
def single_rank(linear):
    """Run SGLang's row-parallel linears in this process as TP rank 0 of 1: no process group, so
    no symmetric-memory context (tp_size 1 never reduces)."""
    saved = linear.get_tp_group, linear.use_symmetric_memory
    linear.get_tp_group, linear.use_symmetric_memory = (lambda: None), (lambda *a, **k: contextlib.nullcontext())
    try:
        yield
    finally:
        linear.get_tp_group, linear.use_symmetric_memory = saved


class SGLangDFlash:
    """SGLang's ``DFlashDraftModel`` built from a written draft, with the target's embedding and lm_head."""

    def __init__(self, folder, oracle):
        from transformers import LlamaConfig

        from specwatch.core.sglang_host import _quiet_import

        dflash = _quiet_import("sglang.srt.models.dflash")
        rope_base = _quiet_import("sglang.srt.layers.rotary_embedding.base")
        rc = _quiet_import("sglang.srt.runtime_context")
        from safetensors.torch import load_file
        from sglang.srt.server_args import ServerArgs

        self.linear = _quiet_import("sglang.srt.layers.linear")
        self.accept = _quiet_import("sglang.srt.speculative.dflash_utils").compute_dflash_correct_drafts_and_bonus
        was_cpu, dtype = rope_base._is_cpu, torch.get_default_dtype()
        rope_base._is_cpu = True  # torch-native RoPE: the CUDA kernels are absent here
        rc.publish(ServerArgs(model_path=str(folder), device="cpu", skip_tokenizer_init=True), role="test")
        torch.set_default_dtype(torch.bfloat16)
        try:
            with rc.get_parallel().override(tp_size=1, tp_rank=0):
                self.model = dflash.DFlashDraftModel(LlamaConfig.from_pretrained(str(folder)))
        finally:
            torch.set_default_dtype(dtype)
            rope_base._is_cpu = was_cpu
            rc.reset_context()
        self.model.load_weights(load_file(str(folder / "model.safetensors")).items())
        for layer in self.model.layers:
            layer.self_attn.attn = ReferenceAttention(layer.self_attn.attn)
        self.embed, self.head = embed_and_head(torch, oracle, "cpu")
        self.layers = SHAPES[ModelSize.tiny].layers

    def context(self, tokens):
        """Per-layer context K/V of committed ``tokens`` (positions 0..n-1), from the target's aux
        hidden states (the oracle target's residual stream is the token embedding at every layer)."""
        n_feat = self.model.num_context_features
        hidden = torch.cat([self.embed[tokens]] * n_feat, dim=-1)
        with torch.no_grad():
            ctx = self.model.project_target_hidden(hidden)
        pos = torch.arange(len(tokens))
        out = []
        for layer in self.model.layers:
            attn = layer.self_attn
            k, v = attn.kv_proj_only(ctx)
            k = attn.apply_k_rope(pos, attn.apply_k_norm(k))
            out.append((k.view(-1, attn.num_kv_heads, attn.head_dim), v.view(-1, attn.num_kv_heads, attn.head_dim)))
        return out

    def draft(self, committed, bonus, block, corrupt=None):
        """Draft tokens d_1..d_{block-1} after ``committed`` tokens and the bonus token."""
        ids = torch.tensor([bonus] + [MASK_TOKEN_ID] * (block - 1))
        pos = len(committed) + torch.arange(block)
        with torch.no_grad(), single_rank(self.linear):
            out = self.model(
                ids, pos, Batch(self.context(torch.tensor(committed)), corrupt), input_embeds=self.embed[ids]
            )
            logits = out.hidden_states[1:].float() @ self.head.float().T
        return torch.argmax(logits, dim=-1).tolist()


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    root = tmp_path_factory.mktemp("dflash")
    out = {}
    for profile, block in ((Profile.perfect, MAX_BLOCK), (Profile.q03, MAX_BLOCK), (Profile.perfect, 4)):
        oracle = Oracle(SHAPES[ModelSize.tiny], 0, profile)
        folder = root / f"{profile.name}-b{block}"
        write_dflash_draft(folder, oracle, block)
        out[profile, block] = (SGLangDFlash(folder, oracle), oracle)
    return out


def chain_after(oracle, token, n):
    return oracle.chain(token - FIRST_ACTIVE, n + 1)[1:]


@pytest.mark.parametrize("context_len", [14, 300, 7000])
def test_perfect_draft_proposes_the_whole_chain_block(drafts, context_len):
    model, oracle = drafts[Profile.perfect, MAX_BLOCK]
    chain = oracle.chain(123, context_len + 1)
    committed, bonus = chain[:-1], chain[-1]
    assert model.draft(committed, bonus, MAX_BLOCK) == chain_after(oracle, bonus, MAX_BLOCK - 1)


def test_a_smaller_block_proposes_the_same_first_tokens(drafts):
    model, oracle = drafts[Profile.perfect, 4]
    chain = oracle.chain(77, 501)
    assert model.draft(chain[:-1], chain[-1], 4) == chain_after(oracle, chain[-1], 3)


def test_q03_draft_is_wrong_exactly_after_wrong_set_tokens(drafts):
    model, oracle = drafts[Profile.q03, MAX_BLOCK]
    wrong, checked = oracle.wrong_set(), 0
    for start in (5, 400, 901):
        chain = oracle.chain(start, 200 + MAX_BLOCK + 1)
        committed, bonus = chain[:200], chain[200]
        got = model.draft(committed, bonus, MAX_BLOCK)
        for i, d in enumerate(got, start=1):
            prev = chain[200 + i - 1] - FIRST_ACTIVE  # sigma^(i-1)(bonus)
            expected = chain[200 + i + 1] if wrong[prev] else chain[200 + i]
            assert d == expected, (start, i)
            checked += bool(wrong[prev])
    assert checked > 0  # the sample met the wrong set


def test_a_wrong_kv_read_of_the_bonus_slot_changes_the_draft(drafts):
    model, oracle = drafts[Profile.perfect, MAX_BLOCK]
    chain = oracle.chain(9, 301)
    right = model.draft(chain[:-1], chain[-1], MAX_BLOCK)
    stale = model.draft(chain[:-1], chain[-1], MAX_BLOCK, corrupt=(300, 299))  # bonus slot reads a context slot
    assert right == chain_after(oracle, chain[-1], MAX_BLOCK - 1)
    assert stale != right


@pytest.mark.parametrize(
    "profile,block", [(Profile.perfect, MAX_BLOCK), (Profile.q03, MAX_BLOCK), (Profile.perfect, 4)]
)
def test_greedy_decode_with_sglangs_verify_matches_the_closed_form(drafts, profile, block):
    model, oracle = drafts[profile, block]
    start, prompt, output_len = 31, 64, 60
    chain = oracle.chain(start, prompt + output_len + MAX_BLOCK + 1)
    committed, out, verifies = chain[:prompt], [chain[prompt]], 0  # the first output comes from prefill
    while len(out) < output_len:
        bonus = out[-1]
        cand = torch.tensor([[bonus] + model.draft(committed, bonus, block)])
        target = torch.tensor([[FIRST_ACTIVE + int(oracle.successor_index()[c - FIRST_ACTIVE]) for c in cand[0]]])
        accepted, new_bonus = model.accept(candidates=cand, target_predict=target)
        n = int(accepted[0])
        committed = committed + [bonus] + cand[0, 1 : n + 1].tolist()
        out += cand[0, 1 : n + 1].tolist() + [int(new_bonus[0])]
        verifies += 1
    assert out[:output_len] == chain[prompt : prompt + output_len]
    assert verifies == oracle.expected_block_verifies(chain[prompt], output_len, block)
    if profile is Profile.perfect:
        assert verifies == -(-(output_len - 1) // block)


def test_sglang_reads_the_draft_config_as_the_oracle_means_it(tmp_path):
    from specwatch.core.sglang_host import _quiet_import

    utils = _quiet_import("sglang.srt.speculative.dflash_utils")
    oracle = Oracle(SHAPES[ModelSize.tiny], 0, Profile.perfect)
    folder = tmp_path / "d8"
    write_dflash_draft(folder, oracle, 8)
    config = json.loads((folder / "config.json").read_text())
    parsed = utils.parse_dflash_draft_config(draft_hf_config=config)
    target_layers = SHAPES[ModelSize.tiny].layers
    assert parsed.resolve_block_size(default=16) == 8
    assert parsed.mask_token_id == MASK_TOKEN_ID < SHAPES[ModelSize.tiny].vocab
    assert parsed.resolve_target_layer_ids(target_num_layers=target_layers) == [0, 1, 2]
    assert config["architectures"] == ["DFlashDraftModel"] and utils.get_dflash_layer_types(config) is None
