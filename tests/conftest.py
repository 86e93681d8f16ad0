import os
from pathlib import Path

import pytest

# pytest-xdist runs one test process per core: each one's OpenMP pool (torch's CPU ops) gets its
# share of the cores, set before torch is first imported. A full pool in every worker oversubscribes
# the cores, and OpenMP's spin-waiting threads then make a torch-heavy test ~6x slower (the DFLASH
# greedy-decode check: 2 s with one thread per worker, 12 s with two, two workers on two cores).
# The runner sizes its parallel workers' pools the same way (run/schedule.py).
_XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _XDIST_WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _XDIST_WORKERS)))

from specwatch.core.sglang_host import ensure_import_stubs  # noqa: E402

# Tests that import transformers (the HF oracle checks) must see the same torchvision stub SGLang
# sees, or transformers caches "no torchvision" and SGLang's later import fails (CI's CPU venv).
ensure_import_stubs()

ROOT = Path(__file__).resolve().parents[1]
SUITES = ROOT / "suites"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _sglang_ok() -> bool:
    from specwatch.core.sglang_host import sglang_importable

    return sglang_importable()


def _cuda_ok() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    need_sglang = any("sglang" in it.keywords for it in items)
    sglang_ok = _sglang_ok() if need_sglang else True
    if need_sglang and not sglang_ok and os.environ.get("SPECWATCH_REQUIRE_SGLANG") == "1":
        raise pytest.UsageError("SPECWATCH_REQUIRE_SGLANG=1 but sglang is not importable")
    cuda_ok = _cuda_ok()
    for it in items:
        if "sglang" in it.keywords and not sglang_ok:
            it.add_marker(pytest.mark.skip(reason="sglang not importable (install requirements/sglang-cpu*.txt)"))
        if "gpu" in it.keywords and not cuda_ok:
            it.add_marker(pytest.mark.skip(reason="no CUDA GPU"))


def own_tmpdir_env(tmp_path, env=None) -> dict:
    """``env`` (default: this process's environment) with ``TMPDIR`` at ``tmp_path/tmp`` (made):
    a runner started with it keeps its workers' temporary folders there, where a test that
    SIGKILLs it (no handler runs) or checks what a stopped runner removed can find them."""
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    return {**(os.environ if env is None else env), "TMPDIR": str(scratch)}


def harness_suite(tmp_path, name="harness", topks="[1, 2]", draft=7, extra="", timeout_s=10, header=""):
    """A small triton suite for the fake worker (page 1 and 64, batch 1 and 8), written under ``tmp_path``;
    ``header``: more ``[suite]`` keys, ``extra``: more matrix keys."""
    from specwatch.suite import load_suite

    p = tmp_path / "s.toml"
    p.write_text(f"""
[suite]
name = "{name}"
repeats = 1
timeout_s = {timeout_s}
{header}
[[matrix]]
attention_backend = ["triton"]
page_size = [1, 64]
topk = {topks}
num_draft_tokens = [{draft}]
batch_size = [1, 8]
{extra}
""")
    return load_suite(p)
