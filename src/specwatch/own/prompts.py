"""Prompt sets of own models: datasets read from local files, prompt files, and random token ids.

Datasets (``DATASETS``) are read from the prompts folder (``prompts_dir``: ``$SPECWATCH_PROMPTS_DIR``,
else ``~/.cache/specwatch/prompts``), one file each under the name ``DATASETS`` gives it. Where there
is network, ``fetch_dataset`` (``specwatch model fetch-prompts NAME``) fetches it once and writes its
sha256 beside it; runs only read. A prompt file is JSON lines with the prompt's text under ``field``
and, optionally, a ``category``. Each draw takes ``count`` prompts seeded by ``seed``; each prompt
is tokenized by the model's tokenizer through its chat template where it has one.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from specwatch.core.case import PromptSet
from specwatch.core.errors import SpecwatchInputError

PROMPTS_DIR_ENV = "SPECWATCH_PROMPTS_DIR"
"""Environment variable naming the prompts folder (default ``~/.cache/specwatch/prompts``)."""

RANDOM = "random"
"""The prompt source of random token ids (``input_len`` each, seeded): no file."""

FILE = "file"
"""The prompt source of a suite's own JSONL file (``prompts = {file = ..., field = ...}``)."""


@dataclass(frozen=True)
class Dataset:
    """A public prompt dataset: where it is fetched from and how a record gives its prompt."""

    file: str
    """Its file name in the prompts folder."""
    url: str
    """Where ``fetch_dataset`` fetches it from."""
    text: Callable[[dict], Optional[str]]
    """A record's prompt text (None: the record has none, e.g. a conversation without a human turn)."""
    category: Callable[[dict], Optional[str]] = lambda r: None
    """A record's category (None: the dataset has none)."""


def _first_human_turn(r: dict) -> Optional[str]:
    return next((t.get("value") for t in r.get("conversations", []) if t.get("from") == "human"), None)


DATASETS: dict[str, Dataset] = {
    "mt-bench": Dataset(
        "mt-bench.jsonl",
        "https://raw.githubusercontent.com/lm-sys/FastChat/main/fastchat/llm_judge/data/mt_bench/question.jsonl",
        lambda r: (r.get("turns") or [None])[0],
        lambda r: r.get("category"),
    ),
    "gsm8k": Dataset(
        "gsm8k.jsonl",
        "https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data/test.jsonl",
        lambda r: r.get("question"),
    ),
    "sharegpt": Dataset(
        "sharegpt.json",
        "https://huggingface.co/datasets/anon8231489123/ShareGPT_Vicuna_unfiltered/resolve/main/"
        "ShareGPT_V3_unfiltered_cleaned_split.json",
        _first_human_turn,
    ),
}
"""The dataset names a suite's ``prompts`` takes, besides ``random`` and a file table."""


@dataclass(frozen=True)
class Prompt:
    """One prompt's text and its category (None: the source has none)."""

    text: str
    category: Optional[str] = None


def prompts_dir() -> Path:
    """The folder datasets are read from (``PROMPTS_DIR_ENV``, else ``~/.cache/specwatch/prompts``)."""
    return Path(os.environ.get(PROMPTS_DIR_ENV) or Path.home() / ".cache" / "specwatch" / "prompts")


def file_sha(path: Path) -> str:
    """sha256 of a file's bytes, 16 hex digits (``PromptSet.sha256``)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _records(path: Path) -> list[dict]:
    """A JSON list or JSON lines -> its records (dicts only)."""
    text = path.read_text()
    if text.lstrip().startswith("["):
        rows = json.loads(text)
    else:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [r for r in rows if isinstance(r, dict)]


def read_prompts(path: Path, source: str, field: str = "prompt") -> list[Prompt]:
    """Every prompt of a dataset file (``source`` one of ``DATASETS``) or a prompt file (``field``)."""
    ds = DATASETS.get(source)
    out = []
    for r in _records(path):
        text = ds.text(r) if ds else r.get(field)
        if isinstance(text, str) and text.strip():
            cat = ds.category(r) if ds else r.get("category")
            out.append(Prompt(text, cat if isinstance(cat, str) else None))
    return out


def draw(prompts: list[Prompt], count: int, seed: int) -> list[Prompt]:
    """``count`` of ``prompts``, drawn without replacement by ``seed``, in draw order."""
    return [prompts[i] for i in random.Random(seed).sample(range(len(prompts)), count)]


def prompt_set(value, count: int, seed: int, suite_path: Path | str | None, field: str) -> PromptSet:
    """The ``PromptSet`` of a suite's ``prompts`` value (a name, ``random`` or a ``PromptFile``),
    its file hashed and its size checked against ``count``; one error naming ``field`` otherwise."""
    if value == RANDOM:
        return PromptSet(source=RANDOM, count=count, seed=seed)
    if not isinstance(value, str):  # a prompt file table (``suite_model.PromptFile``)
        path, source, text_field = Path(value.file).expanduser(), FILE, value.field
    elif value in DATASETS:
        path, source, text_field = prompts_dir() / DATASETS[value].file, value, "prompt"
        if not path.is_file():
            raise SpecwatchInputError(
                suite_path,
                f"dataset {value!r} is not in the prompts folder ({path}); where there is network: "
                f"specwatch model fetch-prompts {value} (or set {PROMPTS_DIR_ENV})",
                field=field,
            )
    else:
        names = ", ".join([*DATASETS, RANDOM])
        raise SpecwatchInputError(
            suite_path, f"unknown prompts {value!r}: one of {names} or {{file = ...}}", field=field
        )
    try:
        found = read_prompts(path, source, text_field)
    except OSError as e:
        raise SpecwatchInputError(suite_path, f"cannot read prompt file {path}: {e.strerror}", field=field) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecwatchInputError(suite_path, f"prompt file {path} is not JSON lines: {e}", field=field) from None
    if len(found) < count:
        raise SpecwatchInputError(
            suite_path, f"prompt_count {count} > the {len(found)} prompts of {path} (field {text_field!r})", field=field
        )
    return PromptSet(
        source=source,
        count=count,
        seed=seed,
        sha256=file_sha(path),
        file=str(path),
        field=text_field if source == FILE else "prompt",
    )


def load_prompts(ps: PromptSet) -> list[Prompt]:
    """The drawn prompts of a ``PromptSet`` with a file (``random`` has none: ``random_token_prompts``)."""
    return draw(read_prompts(Path(ps.file), ps.source, ps.field), ps.count, ps.seed)


def fetch_dataset(name: str, folder: Optional[Path] = None, opener=None) -> tuple[Path, str]:
    """Fetch dataset ``name`` into ``folder`` (default ``prompts_dir()``) unless already there;
    writes its full sha256 beside it (``FILE.sha256``). Returns (path, sha256). The only function
    that touches the network (``opener``: ``urllib.request.urlopen`` unless given)."""
    ds = DATASETS[name]
    folder = Path(folder or prompts_dir())
    path, sidecar = folder / ds.file, folder / f"{ds.file}.sha256"
    if not path.is_file():
        if opener is None:
            from urllib.request import urlopen as opener
        folder.mkdir(parents=True, exist_ok=True)
        with opener(ds.url) as resp:
            data = resp.read()
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_bytes(data)
        tmp.replace(path)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    sidecar.write_text(f"{sha}  {ds.file}\n{ds.url}\n")
    return path, sha


def random_token_prompts(vocab_ids: list[int], count: int, length: int, seed: int) -> list[list[int]]:
    """``count`` prompts of ``length`` token ids drawn from ``vocab_ids`` by ``seed``."""
    rng = random.Random(seed)
    return [[rng.choice(vocab_ids) for _ in range(length)] for _ in range(count)]
