from specwatch.analysis.roofline import BF16, bound_tokens_per_s, cycle_bytes
from specwatch.core.case import Algorithm, Backend, Case, ModelSize
from specwatch.oracle.shapes import SHAPES

CASE = Case(
    model=ModelSize.llama_8b,
    algorithm=Algorithm.EAGLE,
    attention_backend=Backend.triton,
    page_size=64,
    topk=1,
    num_steps=3,
    num_draft_tokens=4,
    batch_size=1,
    input_len=512,
    output_len=256,
)


def test_target_bytes_are_llama_3_1_8b_parameters_without_the_embedding_gather():
    s = SHAPES[ModelSize.llama_8b]
    b = cycle_bytes(CASE, 640)
    assert b.target_weights // BF16 + s.vocab * s.hidden == 8_030_261_248  # Llama-3.1-8B's parameter count


def test_bound_scales_with_acceptance_and_falls_with_context():
    assert bound_tokens_per_s(CASE, 4.0, 640) == 4 * bound_tokens_per_s(CASE, 1.0, 640)
    assert bound_tokens_per_s(CASE, 4.0, 8000) < bound_tokens_per_s(CASE, 4.0, 640)
    # 15.0 GB target + 3 draft passes of ~1.55 GB (layer, fc, shared 1.05 GB LM head) at 4.8 TB/s
    assert 960 < bound_tokens_per_s(CASE, 4.0, 640) < 980
