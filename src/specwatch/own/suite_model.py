"""A suite's own-model entries: the ``model = {name = ..., target = ...}`` table, its prompts, its rules.

A ``[[matrix]]`` ``model`` list takes oracle sizes (``"tiny"``) and model tables. A table's paths
are resolved and its config files hashed when the suite loads (``own_model``), so a missing
checkpoint is one error naming the suite file, the model and the field. Its cases get the
matrix's ``prompts`` (default ``random``), ``prompt_count`` and ``prompt_seed``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StrictInt, StrictStr

from specwatch.core.case import Algorithm, Case, ModelSize, OwnModel, Workload
from specwatch.own.checkpoint import config_sha, context_len, resolve_checkpoint

DTYPES = ("bfloat16", "float16", "float32", "auto")
"""``dtype`` values a model table takes (SGLang's ``--dtype``)."""

MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
"""A model table's ``name``: one plain word (labels, plots), no oracle size's name."""

DRAFTLESS = (Algorithm.NGRAM,)
"""Algorithms that run without a draft model: a model table's ``draft`` is not used by them."""


class ModelTable(BaseModel):
    """``model = {name, target, draft, tokenizer, dtype}``: a checkpoint of the user's own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[StrictStr, Field(pattern=MODEL_NAME_PATTERN, max_length=100)]
    """The model's name in labels and case ids (e.g. ``llama31-8b-eagle3``)."""
    target: StrictStr
    """Target checkpoint: a folder (relative to the current directory) or a cached Hugging Face id."""
    draft: Optional[StrictStr] = None
    """Draft checkpoint (EAGLE, EAGLE3, STANDALONE, DFLASH); none for NGRAM."""
    tokenizer: Optional[StrictStr] = None
    """Tokenizer folder or id (default: the target's)."""
    dtype: Annotated[StrictStr, Field(pattern="^(" + "|".join(DTYPES) + ")$")] = "bfloat16"
    """Weights' dtype in the engine (``bfloat16``, ``float16``, ``float32`` or ``auto``)."""


class PromptFile(BaseModel):
    """``prompts = {file = "x.jsonl", field = "prompt"}``: a JSONL prompt file of the user's own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: StrictStr
    """The JSONL file (relative to the current directory)."""
    field: StrictStr = "prompt"
    """The field holding each prompt's text; an optional ``category`` field groups acceptance."""


ModelEntry = Union[ModelSize, ModelTable]
"""One entry of a matrix's ``model`` list: an oracle size or a model table."""

PromptsValue = Union[StrictStr, PromptFile]
"""A matrix's ``prompts``: a dataset name, ``random`` or a ``PromptFile``."""

PromptCount = Annotated[StrictInt, Field(ge=1, le=100_000)]
"""Prompts per timed repeat of an own model (``prompt_count``)."""


class OwnPromptFields(BaseModel):
    """The ``[[matrix]]`` fields of own models' prompts: per matrix, not axes (``suite.AXES``)."""

    prompts: PromptsValue = "random"
    """A dataset name (``mt-bench``, ``gsm8k``, ``sharegpt``), ``random`` or ``{file, field}``."""
    prompt_count: PromptCount = 8
    """Prompts per timed repeat."""
    prompt_seed: StrictInt = 0
    """Seed of the prompt draw."""
    _own: Optional[dict] = PrivateAttr(default=None)
    """``resolve_own``'s resolution: model table -> ``OwnModel``, and the ``PromptSet``."""


def own_model(table: ModelTable, suite_path: Path | str | None, loc: str) -> OwnModel:
    """The ``OwnModel`` of a table, every path resolved on this host and its configs hashed; one
    error naming the suite file, the model and the field otherwise."""
    if table.name in {s.value for s in ModelSize}:
        from specwatch.core.errors import SpecwatchInputError

        raise SpecwatchInputError(suite_path, f"{table.name!r} names an oracle size; pick another", field=f"{loc}.name")
    folders = {"target": resolve_checkpoint(table.target, suite_path, table.name, f"{loc}.target")}
    folders["draft"] = resolve_checkpoint(table.draft, suite_path, table.name, f"{loc}.draft") if table.draft else None
    folders["tokenizer"] = (
        resolve_checkpoint(table.tokenizer, suite_path, table.name, f"{loc}.tokenizer") if table.tokenizer else None
    )
    return OwnModel(
        name=table.name,
        config_sha=config_sha(folders),
        dtype=table.dtype,
        target=table.target,
        draft=table.draft,
        tokenizer=table.tokenizer,
        context_len=context_len(folders["target"], suite_path, table.name, f"{loc}.target"),
    )


def own_skip_reason(case: Case, rules) -> Optional[str]:
    """Why an own model's case is not run, or None: the draft it needs is missing, the workload is
    built for the oracles (every one but standard and serving), or one of ``rules`` (``rules.validity.RULES``) that read no oracle shape
    (``SHAPE_FREE_RULES``) refuses it."""
    algo = case.algorithm
    if algo.speculative and algo not in DRAFTLESS and case.own_model.draft is None:
        return f"own-model-draft: {algo.value} needs a draft model; model {case.own_model.name!r} names none"
    if case.workload not in (Workload.standard, Workload.serving):
        return f"own-model-workload: the {case.workload.value} workload is sized for the oracle models"
    for rule in (r for r in rules if r.name in SHAPE_FREE_RULES):
        reason = rule.check(case)
        if reason:
            return f"{rule.name}: {reason}"
    return None


SHAPE_FREE_RULES = (
    "page-divides-prefill-chunk",
    "dcp-divides-tp",
    "tree-on-paged-kv",
    "ngram-tree-on-paged-kv",
    "tree-holds-draft-tokens",
    "serving-concurrency",
)
"""Names of the ``rules.validity`` rules that hold for any model (they read no oracle shape)."""


def resolve_own(spec, suite_path: Path | str | None) -> None:
    """Resolve every matrix's model tables (``own_model``) and prompts (``prompt_set``) once, onto
    the matrix's ``_own``; refuses prompts or profiles on a matrix without own models or with them.
    ``spec``: a ``suite.SuiteSpec``."""
    from specwatch.core.case import Profile
    from specwatch.core.errors import SpecwatchInputError
    from specwatch.own.prompts import prompt_set

    for i, m in enumerate(spec.matrix):
        if m._own is not None:
            continue
        tables = [(j, e) for j, e in enumerate(m.model) if isinstance(e, ModelTable)]
        given = {"prompts", "prompt_count", "prompt_seed"} & m.model_fields_set
        if not tables:
            if given:
                raise SpecwatchInputError(
                    suite_path,
                    "prompts are for own models (model tables); this matrix has none",
                    field=f"matrix[{i}].{min(given)}",
                )
            m._own = {}
            continue
        if m.profile != [Profile.perfect]:
            raise SpecwatchInputError(
                suite_path,
                "profiles shape the oracle drafts; a matrix with an own model takes the default",
                field=f"matrix[{i}].profile",
            )
        own = {t: own_model(t, suite_path, f"matrix[{i}].model[{j}]") for j, t in tables}
        ps = prompt_set(m.prompts, m.prompt_count, m.prompt_seed, suite_path, f"matrix[{i}].prompts")
        m._own = {"models": own, "prompts": ps}


def own_fields(m, p: dict) -> dict:
    """A matrix point's ``Case`` fields: an own model's table replaced by ``model = own`` with its
    ``own_model`` and ``prompts`` (``resolve_own`` must have run)."""
    table = p["model"]
    if isinstance(table, ModelTable):
        p.update(model=ModelSize.own, own_model=m._own["models"][table], prompts=m._own["prompts"])
    return p
