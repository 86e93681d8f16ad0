"""Memory-bandwidth roofline for speculative decoding at batch 1.

At batch 1 a verify cycle is bound by the bytes it must read from HBM, not by FLOPs. One cycle
reads (bf16, 2 bytes per parameter):

* the target once (the verify forward over all draft tokens): every layer's q/k/v/o and
  gate/up/down projections, the final norm and the LM head (the embedding is a gather of a few
  rows, not counted);
* the EAGLE draft once per draft step (``num_steps`` forwards per cycle: the extend pass after a
  verify yields the first draft token, the others the rest): its one decoder layer, its ``fc``
  (2h -> h) and the LM head it shares with the target;
* the KV cache of the context, target (all layers) and draft (one layer), once per forward.

The bound is ``tau * BW / bytes_per_cycle`` tokens/s with ``tau`` the measured acceptance length
(tokens committed per cycle) and BW = 4.8 TB/s (H200 HBM3e). It ignores kernel launch gaps and
the CPU scheduler, which is what the measured fraction of the bound shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from specwatch.core.case import Algorithm, Case
from specwatch.oracle.shapes import SHAPES, Shape
from specwatch.store.frame_dicts import row_dicts

if TYPE_CHECKING:
    import pandas as pd

H200_BW = 4.8e12
"""H200 HBM bandwidth, bytes/s."""
BF16 = 2


def layer_params(s: Shape) -> int:
    hd = s.hidden // s.heads
    attn = s.hidden * s.heads * hd * 2 + s.hidden * s.kv_heads * hd * 2  # q, o + k, v
    mlp = 3 * s.hidden * s.intermediate
    return attn + mlp + 2 * s.hidden  # + 2 RMSNorm weights


def kv_bytes_per_token(s: Shape, layers: int) -> int:
    return layers * 2 * s.kv_heads * (s.hidden // s.heads) * BF16


@dataclass(frozen=True)
class CycleBytes:
    """Bytes one verify cycle reads from HBM, by part."""

    target_weights: int
    draft_weights: int
    kv_cache: int

    @property
    def total(self) -> int:
        return self.target_weights + self.draft_weights + self.kv_cache


def cycle_bytes(case: Case, context_len: int) -> CycleBytes:
    """Bytes read per verify cycle for ``case`` (EAGLE, batch 1) at ``context_len`` tokens."""
    if case.algorithm is not Algorithm.EAGLE:
        raise ValueError(f"roofline: only EAGLE is modelled, not {case.algorithm.value}")
    s = SHAPES[case.model]
    head = s.vocab * s.hidden
    target = (s.layers * layer_params(s) + s.hidden + head) * BF16
    draft_pass = (layer_params(s) + 2 * s.hidden * s.hidden + s.hidden + head) * BF16
    kv = (kv_bytes_per_token(s, s.layers) + case.num_steps * kv_bytes_per_token(s, 1)) * context_len
    return CycleBytes(target, case.num_steps * draft_pass, kv)


def bound_tokens_per_s(case: Case, accept_length: float, context_len: int, bandwidth: float = H200_BW) -> float:
    return accept_length * bandwidth / cycle_bytes(case, context_len).total


def roofline_frame(records) -> "pd.DataFrame":
    """One row per ok EAGLE batch-1 record: measured decode tokens/s next to the bound. The context
    is taken at mid-decode (input + output / 2)."""
    import pandas as pd

    rows = []
    for r in records:
        if r.status.value != "ok" or not _modelled(r.case):
            continue
        m = r.metrics
        tput = m.get("decode_throughput") or m.get("output_throughput")
        al = m.get("accept_length")
        if tput is not None and al is not None:
            rows.append(roofline_row(r.case_id, r.case, r.provenance.sglang_version, al.value, tput.value))
    return pd.DataFrame(rows)


def _modelled(case: Case) -> bool:
    """EAGLE at batch 1 on a Llama-shaped oracle model: the byte count is Llama's (MLA: not
    modelled; an own model has no oracle shape to count)."""
    return (
        case.own_model is None
        and case.batch_size == 1
        and case.algorithm is Algorithm.EAGLE
        and SHAPES[case.model].arch == "llama"
    )


def roofline_row(
    case_id: str, case: Case, sglang: str, accept_length: float, tput: float, known: Optional[tuple] = None
) -> dict:
    """One row of the roofline table; ``known``: the case's ``case_facts``, where already found."""
    label, b = known or case_facts(case)
    bound = accept_length * H200_BW / b.total  # bound_tokens_per_s
    return {
        "case_id": case_id,
        "case": label,
        "sglang": sglang,
        "accept_length": round(accept_length, 3),
        "target_GB": round(b.target_weights / 1e9, 2),
        "draft_GB": round(b.draft_weights / 1e9, 2),
        "kv_GB": round(b.kv_cache / 1e9, 3),
        "bound_tok_s": round(bound, 1),
        "measured_tok_s": round(tput, 1),
        "fraction_of_bound": round(tput / bound, 3),
    }


def case_facts(case: Case) -> tuple[str, CycleBytes]:
    """What a roofline row takes from its case alone: its label and the bytes of one verify cycle
    at mid-decode (input + output / 2)."""
    return case.label(), cycle_bytes(case, case.input_len + case.output_len // 2)


def roofline_rows(df: "pd.DataFrame") -> "pd.DataFrame":
    """``roofline_frame`` from a records frame: only the rows it keeps become cases (no record is
    read). A metric the frame shows as missing counts as not recorded (``decode_throughput`` first,
    else ``output_throughput``)."""
    return roofline_of(roofline_reads(df))


def roofline_reads(df: "pd.DataFrame", where: Optional["pd.Series"] = None) -> Optional["pd.DataFrame"]:
    """All ``roofline_rows`` reads of a records frame (of its rows ``where`` holds, where given):
    its ok batch-1 EAGLE rows of an oracle model with an acceptance length and a throughput, cut
    to the case's fields, case id, version, acceptance length and the throughput
    (``THROUGHPUT``); None: the frame has no acceptance length."""
    import pandas as pd

    from specwatch.core.case import CASE_FIELDS

    if df.empty or "accept_length" not in df:
        return None
    tput = df["decode_throughput"] if "decode_throughput" in df else pd.Series(float("nan"), index=df.index)
    if "output_throughput" in df:
        tput = tput.where(tput.notna(), df["output_throughput"])
    keep = (df.status == "ok") & (df.batch_size == 1) & (df.algorithm == Algorithm.EAGLE.value)
    keep &= df.accept_length.notna() & tput.notna()
    if where is not None:
        keep &= where
    if "model_name" in df:  # own models: no oracle shape (``_modelled``), nor a Case the row rebuilds
        keep &= df.model_name.isna()
    wanted = list(dict.fromkeys([*CASE_FIELDS, "case_id", "sglang_version", "accept_length"]))
    return df.loc[keep, wanted].assign(**{THROUGHPUT: tput[keep]})


THROUGHPUT = "_throughput"
"""``roofline_reads``' column of each row's throughput (``decode_throughput``, else ``output_throughput``)."""


def roofline_of(reads: Optional["pd.DataFrame"]) -> "pd.DataFrame":
    """``roofline_rows`` of what ``roofline_reads`` gave."""
    import pandas as pd

    from specwatch.core.case import CASE_FIELDS

    if reads is None:
        return pd.DataFrame()
    rows = []
    cases: dict[tuple, tuple] = {}  # a case's records (releases, repeats) build it (and its facts) once
    for rec, t in zip(row_dicts(reads.drop(columns=[THROUGHPUT])), reads[THROUGHPUT]):  # t: numpy floats
        fields = tuple(rec[f] for f in CASE_FIELDS)
        try:
            case, known = cases[fields]
        except (KeyError, TypeError):  # new, or a field value that cannot be a key
            case = Case.model_validate(dict(zip(CASE_FIELDS, fields)))
            known = case_facts(case) if _modelled(case) else None
            try:
                cases[fields] = case, known
            except TypeError:
                pass
        if known is not None:
            rows.append(roofline_row(rec["case_id"], case, rec["sglang_version"], rec["accept_length"], t, known))
    return pd.DataFrame(rows)
