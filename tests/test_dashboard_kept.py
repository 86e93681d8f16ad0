"""The dashboard's tables, verdict, change points, health rows and findings sections kept under what
they read (``part_cache.PartCache.kept``, ``read_value``): a record none of them reads leaves each
kept, a record one reads computes that one again, and the pages are those a build computing
every part writes."""

from datetime import timedelta
from pathlib import Path

from typer.testing import CliRunner

from records import T0, case, record
from specwatch.cli import app
from specwatch.present.part_cache import PART_DIR
from specwatch.store.jsonl import append_record, results_path
from specwatch.store.result_cache import CACHE_DIR


def _add(root: Path, version: str, topk: int, hour: int = 0, suite: str = "smoke", **kw) -> None:
    r = record(
        case(topk=topk), tps=100.0 * topk + hour, sglang_version=version, started_at=T0 + timedelta(hours=hour), **kw
    )
    r.suite = suite
    append_record(results_path(root, "m", version, suite, fault=kw.get("fault")), r)


def _kept(results: Path) -> dict:
    """Each kept part's file stamp: a part computed again is written again."""
    folder = results / CACHE_DIR / PART_DIR
    return {p.stem: p.stat().st_mtime_ns for p in folder.iterdir()} if folder.exists() else {}


def _build(results: Path, out: Path) -> None:
    done = CliRunner().invoke(app, ["dashboard", "--results", str(results), "--out", str(out)])
    assert done.exit_code == 0, done.output


def _recomputed(results: Path, tmp_path: Path, write) -> set[str]:
    before = _kept(results)
    write()
    _build(results, tmp_path / "dash")
    return {name for name, stamp in _kept(results).items() if before.get(name) != stamp}


def _tree(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _store(tmp_path: Path) -> Path:
    results = tmp_path / "results"
    for version in ("0.5.16", "0.5.17", "0.5.19"):
        for k in (1, 4, 8):
            _add(results, version, k)
    _add(results, "0.5.19", 4, 1, suite="other")
    return results


def test_a_record_of_an_older_release_leaves_the_verdict_kept_and_one_of_the_newest_computes_it(tmp_path):
    results = _store(tmp_path)
    assert "verdict.reads" in _recomputed(results, tmp_path, lambda: None)
    again = _recomputed(results, tmp_path, lambda: _add(results, "0.5.16", 2, 2))
    assert "verdict" in again and "verdict.reads" not in again  # the stamps moved; its reads did not
    assert "verdict.reads" in _recomputed(results, tmp_path, lambda: _add(results, "0.5.19", 2, 3))
    assert "verdict.reads" in _recomputed(results, tmp_path, lambda: _add(results, "0.5.17", 2, 4))  # the base


def test_the_change_points_are_found_again_only_for_a_case_of_two_releases(tmp_path):
    results = _store(tmp_path)
    _recomputed(results, tmp_path, lambda: None)
    again = _recomputed(results, tmp_path, lambda: _add(results, "0.5.19", 2, 2))  # one release: no step
    assert "timing" in again and not again & {"timing.reads", "changepoints"}
    again = _recomputed(results, tmp_path, lambda: _add(results, "0.5.17", 2, 3))  # now two
    assert {"timing.reads", "changepoints"} <= again


def test_a_record_computes_again_only_its_own_suites_health_rows_and_the_sections_that_read_it(tmp_path):
    results = _store(tmp_path)
    _recomputed(results, tmp_path, lambda: None)
    groups = {n for n in _kept(results) if n.startswith("health-")}
    assert len(groups) == 4  # machine, version and suite: three smoke groups and one other
    again = _recomputed(results, tmp_path, lambda: _add(results, "0.5.19", 2, 2, suite="other"))
    assert len(again & groups) == 1 and "health.reads" in again
    assert "findings-versions_section" not in again  # it reads smoke and tree-page rows only
    again = _recomputed(results, tmp_path, lambda: _add(results, "0.5.19", 4, 3, fault="accept-off-by-one"))
    assert {"faults.reads", "findings-faults_section"} <= again
    assert not again & {*groups, "findings-versions_section", "findings-dflash_section", "roofline.reads"}
    again = _recomputed(results, tmp_path, lambda: _add(results, "0.5.19", 4, 4, probe=False))  # a bare run
    assert "overhead.reads" in again and not again & {"roofline.reads", "findings-versions_section"}


def test_a_build_from_parts_kept_under_their_reads_writes_what_a_build_computing_all_writes(tmp_path, monkeypatch):
    monkeypatch.setattr("specwatch.present.table_view.INLINE_CELLS", 4)  # tables on pages of their own too
    results = _store(tmp_path)
    _build(results, tmp_path / "first")
    for write in (
        lambda: _add(results, "0.5.16", 2, 2),
        lambda: _add(results, "0.5.19", 4, 3, fault="accept-off-by-one"),
        lambda: _add(results, "0.5.17", 2, 4),
    ):
        write()
        _build(results, tmp_path / "kept")
    for p in (results / CACHE_DIR / PART_DIR).iterdir():
        p.unlink()
    _build(results, tmp_path / "computed")
    assert _tree(tmp_path / "kept") == _tree(tmp_path / "computed") != _tree(tmp_path / "first")
    assert any(name.startswith("tables/") for name in _tree(tmp_path / "kept"))


def test_each_findings_section_draws_from_its_reads_what_it_draws_from_all_latest_records():
    from specwatch.present.findings import SECTIONS, findings_rows
    from specwatch.store.frame import files_frame
    from specwatch.store.jsonl import result_files

    committed = result_files(Path(__file__).resolve().parents[1] / "results")
    latest = findings_rows(files_frame(committed, cache=False))  # no cache written beside the checkout
    for draw, reads in SECTIONS:
        assert len(reads(latest)) < len(latest)
        assert draw(reads(latest)) == draw(latest), draw.__name__
