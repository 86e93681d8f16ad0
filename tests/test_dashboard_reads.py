"""The dashboard's parts kept under what they read of the records (``present.figure_reads``,
``part_cache.PartCache.read_value``): a record a part never reads leaves it kept, a record it
reads computes it again."""

from datetime import timedelta

from typer.testing import CliRunner

from records import T0, case, prov, record
from specwatch.cli import app
from specwatch.core.case import ModelSize
from specwatch.core.record import Metric
from specwatch.present.part_cache import PART_DIR, READS_SUFFIX
from specwatch.store.jsonl import append_record, results_path
from specwatch.store.result_cache import CACHE_DIR

FIGURES = tuple(
    f"{name}{READS_SUFFIX}"
    for name in (
        "memory_vs_topk",
        "throughput_vs_topk",
        "acceptance_vs_topk",
        "metrics_across_versions",
        "speedup_figure",
    )
)


def _record(topk: int, hour: int = 0, model=ModelSize.tiny, **prov_kw):
    r = record(case(topk=topk, model=model), started_at=T0 + timedelta(hours=hour))
    r.metrics["req_to_token_bytes"] = Metric(value=9 * (8192 + 100 * topk) * 4, unit="bytes", exact=True)
    r.metrics["decode_throughput"] = Metric(value=1000.0 / topk, unit="tokens/s", samples=[1000.0 / topk])
    r.metrics["accept_length"] = Metric(value=4.0, unit="tokens/verify", exact=True)
    if prov_kw:
        r.provenance = prov(started_at=T0 + timedelta(hours=hour), **prov_kw)
    return r


def _kept(results) -> dict:
    """Each kept part's file stamp: a part computed again is written again."""
    folder = results / CACHE_DIR / PART_DIR
    return {p.stem: p.stat().st_mtime_ns for p in folder.iterdir()} if folder.exists() else {}


def _recomputed(results, tmp_path, write) -> set[str]:
    before = _kept(results)
    write()
    out = CliRunner().invoke(app, ["dashboard", "--results", str(results), "--out", str(tmp_path / "dash")])
    assert out.exit_code == 0, out.output
    return {name for name, stamp in _kept(results).items() if before.get(name) != stamp}


def test_a_figure_the_change_points_or_the_health_matrix_are_found_again_only_for_a_record_they_read(tmp_path):
    results = tmp_path / "results"
    for k in (1, 4, 8):
        append_record(results_path(results, "m", "0.5.17", "smoke"), _record(k))
    assert _recomputed(results, tmp_path, lambda: None) >= set(FIGURES)
    assert _recomputed(results, tmp_path, lambda: None) == set()  # nothing written: every part kept

    def fault_run() -> None:  # shown in the fault table only
        append_record(results_path(results, "m", "0.5.17", "faults"), _record(4, 1, fault="accept-off-by-one"))

    again = _recomputed(results, tmp_path, fault_run)
    assert "faults.reads" in again and not again & {*FIGURES, "timing.reads", "health.reads", "overhead.reads"}

    def bare_run() -> None:  # a bare run measures the harness: no finding reads it
        append_record(results_path(results, "m", "0.5.17", "smoke"), _record(4, 4, probe=False))

    again = _recomputed(results, tmp_path, bare_run)
    assert "overhead.reads" in again and not again & {"findings-versions_section", "findings-html", "roofline.reads"}

    def other_model() -> None:  # the by-topk figures show the tiny model only
        append_record(results_path(results, "m", "0.5.17", "eight"), _record(2, 2, model=ModelSize.llama_8b))

    again = _recomputed(results, tmp_path, other_model)
    assert {"memory_vs_topk.reads", "metrics_across_versions.reads"} <= again
    assert not again & {"throughput_vs_topk.reads", "acceptance_vs_topk.reads"}

    def tiny_again() -> None:
        append_record(results_path(results, "m", "0.5.17", "smoke"), _record(2, 3))

    again = _recomputed(results, tmp_path, tiny_again)
    assert {"throughput_vs_topk.reads", "acceptance_vs_topk.reads", "health.reads"} <= again
    assert "timing.reads" not in again  # a case of one release: no change point, no twin
    assert {"findings-versions_section", "findings-html"} <= again and "findings-faults_section" not in again
