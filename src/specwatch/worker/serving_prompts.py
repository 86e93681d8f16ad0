"""The prompts SGLang's serving benchmark sends to an oracle model, and the outputs they must give.

SGLang's ``random-ids`` dataset draws consecutive token ids from the whole tokenizer vocabulary,
so about half of its prompts end on an id below ``FIRST_ACTIVE``. The oracle embeds such an id to
zero and the target then answers ``[UNK]`` for every new token, a special token that the server
streams as empty text. The benchmark takes a request's first-token time from its first non-empty
text chunk: such a request records TTFT 0 and no inter-token latency, and its TPOT spans the
prefill (the serving records of 0.5.23 at e3a0771 read ``ttft_p50`` 0.0, e.g. ``e8105d81c8aa``).

For an oracle model the benchmark reads instead its ``random`` dataset from a local ShareGPT-form
file written here (``--dataset-name random --dataset-path FILE``, with ``--tokenize-prompt``: each
prompt's token ids as they are). Every prompt is an oracle chain of exactly ``input_len`` active
tokens from a seeded start (distinct per request, so the radix cache serves none of them), every
new token is a word of the oracle tokenizer, and every output has a closed form:
``mismatched_tokens`` compares the benchmark's generated texts with it.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from specwatch.core.case import Case
from specwatch.oracle.predict import Oracle
from specwatch.oracle.prompts import prompt_starts
from specwatch.oracle.shapes import SHAPES
from specwatch.oracle.tokenizer import vocabulary
from specwatch.worker.measure import Prompts

DATASET_NAME = "random"
"""The benchmark's dataset that samples token ids from a local ShareGPT-form file."""

SERVING_TAG = "serving"
"""``prompt_starts`` tag of the serving prompts."""


def _words(case: Case) -> dict[int, str]:
    return {i: w for w, i in vocabulary(SHAPES[case.model]).items()}


def oracle_requests(case: Case) -> tuple[list[list[int]], list[list[int]]]:
    """Each request's prompt (``input_len`` token ids) and its greedy output (``output_len``), as
    the offline workloads cut them (``measure.Prompts``)."""
    starts = prompt_starts(case, SERVING_TAG, case.serving_requests)
    prompts, outputs, _ = Prompts(case, Oracle(SHAPES[case.model], 0, case.profile)).from_starts(starts)
    return prompts, outputs


def write_dataset(case: Case, folder: Path) -> Path:
    """The case's prompts as a ShareGPT-form JSON file in ``folder`` (a human turn of oracle words
    and a reply the benchmark does not read); its path."""
    words = _words(case)
    rows = [
        {
            "id": f"{case.case_id}-{i}",
            "conversations": [
                {"from": "human", "value": " ".join(words[t] for t in prompt)},
                {"from": "gpt", "value": "answer"},
            ],
        }
        for i, prompt in enumerate(oracle_requests(case)[0])
    ]
    path = Path(folder) / f"{case.case_id}-prompts.json"
    path.write_text(json.dumps(rows))
    return path


def mismatched_tokens(case: Case, generated_texts: list) -> int:
    """Output tokens that differ from the oracle's: each generated text (its words) against the
    expected output that begins with the same word, position by position; a text whose first word
    begins no expected output, or one expected output claimed twice, counts whole. Texts come in
    the benchmark's request order, which its shuffle makes differ from the file's."""
    words = _words(case)
    expected = {}
    for output in oracle_requests(case)[1]:
        out = [words[t] for t in output]
        expected[out[0]] = out
    claimed: Counter = Counter()
    bad = 0
    for text in generated_texts:
        got = str(text or "").split()
        want = expected.get(got[0]) if got else None
        claimed[got[0] if got else None] += 1
        if want is None or claimed[got[0]] > 1:
            bad += max(len(got), case.output_len)
            continue
        bad += sum(a != b for a, b in zip(got, want)) + abs(len(got) - len(want))
    return bad
