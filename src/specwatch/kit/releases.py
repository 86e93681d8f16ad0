"""Which of an SGLang release's requirements a kit carries, and the per-release special cases.

SGLang's METADATA lists far more than the LLM serving path imports (video and audio decoders,
diffusion, other GPU generations' kernels, model hubs). A kit follows only the requirements named
in :data:`SERVING_PATH` plus the special cases of :data:`RELEASE_RULES`; everything those need is
then followed recursively through each wheel's own ``Requires-Dist``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

SERVING_PATH = frozenset(
    canonicalize_name(n)
    for n in (
        # GPU side
        "torch",
        "sglang-kernel",
        "flashinfer-python",
        "apache-tvm-ffi",
        "xgrammar",
        # models and tokenizers, at the versions SGLang pins
        "transformers",
        "tokenizers",
        "compressed-tensors",
        "gguf",
        # the HTTP server, the scheduler's IPC and the OpenAI-compatible API
        "fastapi",
        "uvicorn",
        "pydantic",
        "pyzmq",
        "orjson",
        "msgspec",
        "pybase64",
        "setproctitle",
        "zstandard",
        "partial-json-parser",
        "openai",
        "distro",
        # the HTTP server imports it at start from 0.5.19 (entrypoints/openai/audio_chunking.py,
        # through http_server's serving_transcription): without it `launch_server` exits
        "soundfile",
        # every release's http_server declares Form/File routes, which FastAPI refuses at import
        # without it ("Form data requires python-multipart to be installed"): the server exits
        "python-multipart",
        # SGLang's serving benchmark (bench_serving, benchmark/serving.py) imports its dataset
        # registry at start, whose MMMU and LongBench loaders import Hugging Face datasets at
        # module level (every release 0.5.12-0.5.23): without it the benchmark exits at import
        "datasets",
        # imported when the HTTP server is imported (every release 0.5.12-0.5.23): aiohttp by
        # sglang/__init__ (lang/backend/runtime_endpoint.py) and the serving benchmark, uvloop by
        # http_server, sentencepiece by configs/internvl.py. The default host's image has them
        # (host.HOST_IMAGE_PACKAGES), so its kits leave them to it, except sentencepiece where
        # SGLang pins it exactly (==0.2.1 from 0.5.21); a kit for a host without them carries them
        "aiohttp",
        "uvloop",
        "sentencepiece",
    )
)
"""Names from SGLang's own ``Requires-Dist`` that every kit follows (at SGLang's pin)."""


@dataclass(frozen=True)
class ReleaseRule:
    """One special case: a requirement added to, or left out of, some releases' kits."""

    name: str
    """Distribution name."""

    releases: SpecifierSet
    """SGLang versions the rule applies to."""

    action: Literal["carry", "omit"]
    """``carry``: follow it (at SGLang's pin where SGLang lists it, else at ``requirement``);
    ``omit``: leave it out even where something else requires it."""

    why: str
    """What goes wrong without the rule."""

    requirement: str = ""
    """Version specifier used where SGLang's METADATA does not name it (``==0.1.5``)."""

    def applies_to(self, sglang_version: Version) -> bool:
        return self.releases.contains(sglang_version, prereleases=True)


RELEASE_RULES: tuple[ReleaseRule, ...] = (
    ReleaseRule(
        "sgl-deep-gemm",
        SpecifierSet(">=0.5.12"),
        "carry",
        "EAGLE's draft CUDA-graph capture imports deep_gemm, even for models that never run a DeepGEMM kernel",
    ),
    ReleaseRule(
        "sgl-flash-mla",
        SpecifierSet(">=0.5.23"),
        "carry",
        "EAGLE's draft CUDA-graph capture imports the FlashMLA backend, whose kernels module imports "
        "flash_mla at module level (0.5.23 on an H200 host: ModuleNotFoundError: No module named "
        "'flash_mla' at every EAGLE engine start)",
    ),
    ReleaseRule(
        "ipython",
        SpecifierSet(">=0.5.12"),
        "carry",
        "a few sglang utilities import IPython at module level, so the server does not start without it",
    ),
    ReleaseRule(
        "dill",
        SpecifierSet(">=0.5.12"),
        "carry",
        "engine start imports dill, which SGLang's METADATA does not list (0.5.20 on an H200 host: "
        "ModuleNotFoundError: No module named 'dill' at engine start)",
        requirement="==0.4.1",
    ),
    ReleaseRule(
        "jsonschema",
        SpecifierSet(">=0.5.12"),
        "carry",
        "the HTTP server imports it at start (entrypoints/openai/serving_chat.py: from jsonschema "
        "import Draft202012Validator, every release 0.5.12-0.5.23), and SGLang's METADATA names it "
        "only through outlines, which the kit does not follow (0.5.17 on an H200 host: "
        "ModuleNotFoundError: No module named 'jsonschema' at every launch_server start)",
        requirement="==4.26.0",
    ),
    ReleaseRule(
        "nvidia-cutlass-dsl",
        SpecifierSet("==0.5.15"),
        "carry",
        "0.5.15's EAGLE graph capture imports the DSA backend, whose jit_kernel/dsa "
        "imports cutlass (CuTe DSL) at module level (0.5.12-0.5.14 do not import it "
        "there; 0.5.16 and later import it lazily)",
    ),
    ReleaseRule(
        "nvidia-cutlass-dsl-libs-cu12",
        SpecifierSet(">=0"),
        "omit",
        "the CuTe DSL's CUDA 12 libraries (about 90 MB), which flashinfer's "
        "nvidia-cutlass-dsl requires by default: the host runs CUDA 13",
    ),
    ReleaseRule(
        "flashinfer-cubin",
        SpecifierSet(">=0"),
        "omit",
        "hundreds of MB of prebuilt kernels: flashinfer JIT-compiles what it needs on "
        "first use instead (build with cubin=True to carry it)",
    ),
)
"""The per-release special cases, each saying why."""


def rules_for(sglang_version: Version, *, cubin: bool) -> list[ReleaseRule]:
    """The rules that apply to one release (the cubin omission dropped when ``cubin``)."""
    rules = [r for r in RELEASE_RULES if r.applies_to(sglang_version)]
    if cubin:
        rules = [r for r in rules if canonicalize_name(r.name) != "flashinfer-cubin"]
    return rules
