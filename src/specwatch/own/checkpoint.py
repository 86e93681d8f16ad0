"""Where an own model's checkpoints are on this host, and the hash of their config files.

A checkpoint is a folder or a Hugging Face id. An id is looked up in the local Hugging Face cache
only (``local_files_only``): specwatch never downloads weights. A relative folder is read from the
current directory. Nothing found is one ``SpecwatchInputError`` naming the suite file, the model
and the field.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Optional

from specwatch.core.errors import SpecwatchInputError

CONFIG_FILES: tuple[str, ...] = ("config.json", "tokenizer_config.json", "generation_config.json")
"""The files whose bytes make a checkpoint's ``config_sha`` (those present): what a model is,
never where it lies or its weights."""

HF_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"
"""A Hugging Face model id (``owner/name``); a string that is no existing folder and matches it is
looked up in the local Hugging Face cache."""


def hf_cached_snapshot(repo_id: str) -> Optional[Path]:
    """The local Hugging Face cache's snapshot folder of ``repo_id`` (None: not cached). Never
    touches the network."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:
        return None


def resolve_checkpoint(ref: str, suite_path: Path | str | None, model: str, field: str) -> Path:
    """The local folder of checkpoint ``ref`` (a folder or a cached Hugging Face id), or one error
    naming the suite file, the model and ``field`` (``target``, ``draft``, ``tokenizer``)."""
    where = f"{field} (model {model!r})"
    path = Path(ref).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file() and field != "tokenizer":
            raise SpecwatchInputError(suite_path, f"{ref} has no config.json: not a checkpoint folder", field=where)
        return path.resolve()
    if re.fullmatch(HF_ID_PATTERN, ref) and not path.exists():
        snap = hf_cached_snapshot(ref)
        if snap is not None:
            return snap
        raise SpecwatchInputError(
            suite_path,
            f"{ref} is neither a folder nor in the local Hugging Face cache (specwatch never downloads "
            f"weights; where there is network: huggingface-cli download {ref})",
            field=where,
        )
    raise SpecwatchInputError(suite_path, f"{ref}: no such checkpoint folder", field=where)


def config_sha(folders: dict[str, Optional[Path]]) -> str:
    """sha256 (16 hex digits) over ``CONFIG_FILES`` of each role's folder (``target``, ``draft``,
    ``tokenizer``; None: the role has none), role and file name included."""
    h = hashlib.sha256()
    for role in sorted(folders):
        folder = folders[role]
        if folder is None:
            continue
        for name in CONFIG_FILES:
            f = folder / name
            if f.is_file():
                h.update(f"{role}/{name}\0".encode())
                h.update(f.read_bytes())
                h.update(b"\0")
    return h.hexdigest()[:16]


CONTEXT_KEYS: tuple[str, ...] = ("max_position_embeddings", "max_sequence_length", "seq_length")
"""config.json keys that give a model's context length, in the order read."""


def context_len(target: Path, suite_path: Path | str | None, model: str, field: str) -> int:
    """The target's context length from its config.json (``CONTEXT_KEYS``), or one error."""
    import json

    try:
        config = json.loads((target / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise SpecwatchInputError(
            suite_path, f"cannot read {target / 'config.json'}: {e}", field=f"{field} (model {model!r})"
        ) from None
    for key in CONTEXT_KEYS:
        if isinstance(config.get(key), int) and config[key] > 0:
            return config[key]
    raise SpecwatchInputError(
        suite_path,
        f"{target / 'config.json'} names no context length ({', '.join(CONTEXT_KEYS)})",
        field=f"{field} (model {model!r})",
    )
