"""The findings page: counts and record ids computed from the latest records."""

from datetime import timedelta

from records import T0, case, record
from specwatch.core.case import Algorithm, Backend
from specwatch.core.record import Metric, Status
from specwatch.present.findings import findings_markdown
from specwatch.store.frame import records_frame
from specwatch.store.latest import record_id


def _at(r, suite, minutes, **prov):
    r.suite = suite
    r.provenance.started_at = r.provenance.finished_at = T0 + timedelta(minutes=minutes)
    for k, v in prov.items():
        setattr(r.provenance, k, v)
    return r


def _store():
    smoke_a, smoke_b = case(topk=4), case(topk=1, num_draft_tokens=4)
    tree = case(topk=8, attention_backend=Backend.triton)
    rs = [
        _at(record(smoke_a, Status.crashed, "worker died"), "smoke", 0),
        _at(record(smoke_a), "smoke", 5),  # a later record of the same case: the one judged
        _at(record(smoke_b, Status.timeout, "ran past 600 s"), "smoke", 1),
        _at(record(tree), "tree-page", 2),
        _at(record(smoke_a), "smoke", 3, sglang_version="0.5.19"),
    ]
    rs[1].metrics["req_to_token_row_width"] = Metric(value=9279, unit="slots", exact=True)
    fault_case = case(page_size=64)
    caught = _at(record(fault_case), "faults", 10, fault="unaligned-watermark")
    caught.checks = {"decode_watermark_page_aligned": False, "lossless": True}
    caught.metrics["fault_code_runs"] = Metric(value=3, unit="calls", exact=True)
    missed = _at(record(case(page_size=16)), "faults", 11, fault="unaligned-watermark")
    missed.metrics["fault_code_runs"] = Metric(value=0, unit="calls", exact=True)
    crashed = _at(record(case(page_size=256), Status.crashed, "assert"), "faults", 12, fault="row-widen-revert")
    twin = _at(record(fault_case), "faults", 13)
    twin.checks = {"decode_watermark_page_aligned": True}
    flash = [case(algorithm=Algorithm.DFLASH, topk=1, num_draft_tokens=8, page_size=p) for p in (1, 64)]
    d1, d64 = _at(record(flash[0]), "dflash", 20), _at(record(flash[1]), "dflash", 21)
    d1.checks = {"lossless": True, "accept_length_matches_oracle": True}
    d64.checks = {"lossless": True, "accept_length_matches_oracle": False, "decode_watermark_page_aligned": False}
    refused = [_at(record(case(page_size=p), Status.skipped, "tree-on-paged-kv: no"), "dcp", 30 + p) for p in (16, 64)]
    rs += [caught, missed, crashed, twin, d1, d64, *refused]
    return rs, records_frame(rs)


def rid(r):
    return record_id(r.case_id, r.provenance.started_at)


def test_record_id_is_case_id_at_utc_start():
    from datetime import datetime, timezone
    from datetime import timedelta as td

    t = datetime(2026, 12, 1, 15, 4, 5, 900000, tzinfo=timezone(td(hours=2)))
    assert record_id("abc", t) == "abc@20261201T130405Z"


def test_versions_section_judges_each_case_by_its_latest_record():
    rs, df = _store()
    text = findings_markdown(df)
    row = next(line for line in text.splitlines() if line.startswith("| m | 0.5.17 |"))
    assert f"1/2 ok (not ok: `{rid(rs[2])}`)" in row  # the crashed record was superseded
    assert rid(rs[0]) not in text
    assert f"| 1/1 ok | 9,279 (1: `{rid(rs[1])}`) |" in row
    assert "| m | 0.5.19 | 1/1 ok | – | – |" in text
    no_width = findings_markdown(df.drop(columns=["req_to_token_row_width"]))
    assert "| m | 0.5.17 | 1/2 ok" in no_width and "9,279" not in no_width


def test_faults_section_counts_catches_misses_unrun_code_and_twins():
    rs, df = _store()
    text = findings_markdown(df)
    fault = text[text.index("**unaligned-watermark**") : text.index("## DFLASH")]
    assert "2 records" in fault and "caught: 1 (by decode_watermark_page_aligned 1)" in fault
    assert f"not caught: 1 (`{rid(rs[6])}`)" in fault
    assert f"faulted code ran 0 times: 1 (`{rid(rs[6])}`)" in fault
    assert "clean twins: 1/1 ok with every check passing" in fault
    revert = text[text.index("**row-widen-revert**") : text.index("**unaligned-watermark**")]
    assert "caught: 1 (by crashed 1)" in revert and f"runs not counted: 1 (`{rid(rs[7])}`)" in revert
    assert "clean twins: 0/0" in revert


def test_a_planted_slowdown_is_said_to_be_judged_by_compare_and_a_check_fault_is_not():
    rs, _ = _store()
    slow = _at(record(case(page_size=64)), "timing", 40, fault="slow-verify-gpu-500us")
    text = findings_markdown(records_frame([*rs, slow]))
    part = text[text.index("**slow-verify-gpu-500us**") : text.index("**unaligned-watermark**")]
    assert "no check catches it by design" in part and "`fault=slow-verify-gpu-500us`" in part
    assert "no check catches it" not in text[text.index("**unaligned-watermark**") :]


def test_the_null_fault_is_said_to_price_the_floor_not_to_be_caught():
    rs, _ = _store()
    null = _at(record(case(page_size=64)), "timing", 40, fault="slow-verify-0us")
    text = findings_markdown(records_frame([*rs, null]))
    part = text[text.index("**slow-verify-0us**") : text.index("**unaligned-watermark**")]
    assert "the null fault" in part and "prices the floor" in part and "no check catches it" not in part


def test_dflash_section_names_the_watermark_failures_and_refusals_their_example():
    rs, df = _store()
    text = findings_markdown(df)
    dflash = text[text.index("## DFLASH") : text.index("## SGLang refusals")]
    assert "- triton: 2/2 ok" in dflash
    assert f"acceptance exact: 1/2 (failing: `{rid(rs[10])}`)" in dflash and "lossless: 2/2" in dflash
    assert f"0 pass, 1 fail (pages 64: `{rid(rs[10])}`)" in dflash
    refusals = text[text.index("## SGLang refusals") :]
    assert f"| 2 | tree-on-paged-kv: no | `{rid(rs[11])}` |" in refusals
