"""A tokenizer for the oracle checkpoints, so they load as a model of the user's own.

A word-level ``tokenizers`` model over the oracle's active vocabulary: the words of ``WORDS``
(lower-cased, split on whitespace and punctuation) name the first active tokens, ``w<i>`` the rest;
``[UNK]``, ``<s>`` and ``</s>`` keep ids 0, 1 and ``EOS_TOKEN_ID``, ``<unused<i>>`` the other ids
below ``FIRST_ACTIVE``. A simple chat template renders a
conversation as ``role : content`` lines and ends on ``assistant :``, an active token, so greedy
decoding continues the oracle chain from it. Saved as ``tokenizer.json`` + ``tokenizer_config.json``
beside the checkpoint's ``config.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

from specwatch.oracle.shapes import EOS_TOKEN_ID, FIRST_ACTIVE, Shape

SPECIALS = {"[UNK]": 0, "<s>": 1, "</s>": EOS_TOKEN_ID}
"""Special tokens and their ids (below ``FIRST_ACTIVE``, never active)."""

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)
"""The oracle tokenizer's chat template (Jinja, as ``apply_chat_template`` reads it)."""

WORDS = """
user assistant system : . , ? ! ' " - ( ) + = * / % 0 1 2 3 4 5 6 7 8 9
a an the and or but if then so because of to in on at by for with from as into over under about
is are was were be been am do does did have has had can could will would should may might must
i you he she it they him her them your his its their this that these those what
which who how why when where there here all any some no not one two three four five ten hundred
write tell give make explain describe list name find show say think know help plan compare
short long story poem letter email note essay summary list steps idea ideas reason reasons
cat dog bird fish tree river sea sun moon star city town house room school book car train road
water food bread apple tea coffee rain snow wind fire time day night week year today morning
good bad big small new old fast slow happy sad warm cold easy hard simple kind best first last
number numbers sum add many much more less half each every price cost pay buy sell money total
math count numbers question answer problem solve farmer eggs sells dollars apples boxes students
friend family child children people man woman teacher doctor work job game music song art color
travel trip visit walk run read learn play cook grow build keep start stop open close like love
please thanks hello very also just only than too again other same different between after before
birds blue books cats costs difference eat get left rooms sing sky stars tom trees
""".split()
"""Words the oracle tokenizer knows, in id order from ``FIRST_ACTIVE`` (the prompts shipped with
specwatch use only these)."""


def vocabulary(shape: Shape) -> dict[str, int]:
    """Word -> token id: the specials, then ``WORDS`` and ``w<i>`` over the active tokens."""
    vocab = dict(SPECIALS)
    taken = set(SPECIALS.values())
    vocab.update({f"<unused{i}>": i for i in range(FIRST_ACTIVE) if i not in taken})  # no holes below
    words = list(dict.fromkeys(WORDS))[: shape.active]
    words += [f"w{i}" for i in range(len(words), shape.active)]
    vocab.update({w: FIRST_ACTIVE + i for i, w in enumerate(words)})
    return vocab


def write_tokenizer(folder: Path, shape: Shape) -> None:
    """``tokenizer.json`` and ``tokenizer_config.json`` of the oracle of ``shape`` into ``folder``."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel

    tok = Tokenizer(WordLevel(vocabulary(shape), unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace()])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "[UNK]",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "model_max_length": shape.max_position,
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
