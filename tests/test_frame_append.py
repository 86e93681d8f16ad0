"""A results file grown by appends has only its new lines built (``store.frame_append``): its cache
then holds what a build of the whole file gives, and a file whose cached bytes changed, or whose
cache ends inside a line, is built whole."""

import json
import shutil
import warnings
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from pandas.testing import assert_frame_equal

from records import T0, case, record
from specwatch.core.record import Status
from specwatch.store import frame as frame_mod
from specwatch.store.frame import files_frame
from specwatch.store.frame_append import join_rows
from specwatch.store.frame_cache import META_KEY, cache_meta, cache_path, cached_frame
from specwatch.store.jsonl import Quarantine, append_record

COMMITTED = Path(__file__).resolve().parents[1] / "results"


def _spans(monkeypatch) -> list[tuple]:
    """The byte spans the rows are built from, as the build is asked for them."""
    spans = []
    real = frame_mod._rows_of_span
    monkeypatch.setattr(frame_mod, "_rows_of_span", lambda p, span, strict: spans.append(span) or real(p, span, strict))
    return spans


def _cache(path: Path) -> tuple[pd.DataFrame, dict, pq.ParquetSchema]:
    """Every column a cache holds (read back), what it says of itself and its Parquet schema."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = cached_frame(cache_path(path), cache_meta(cache_path(path)), Quarantine(), hidden=True)
    schema = pq.read_schema(cache_path(path))
    return rows, json.loads(schema.metadata[META_KEY]), schema


def _same_as_whole(grown: Path, tmp_path: Path) -> None:
    """``grown``'s cache holds what a cache built from the whole file holds: rows, dtypes, Arrow
    schema (the pandas metadata in it too), JSON columns and quarantined lines."""
    whole = tmp_path / "whole" / grown.name
    whole.parent.mkdir(exist_ok=True)
    shutil.copyfile(grown, whole)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        files_frame([whole], columns=[])
    (a, meta_a, schema_a), (b, meta_b, schema_b) = _cache(grown), _cache(whole)
    assert_frame_equal(a, b, check_exact=True)
    assert schema_a.remove_metadata().equals(schema_b.remove_metadata())
    assert {k: v for k, v in schema_a.metadata.items() if k != META_KEY} == {
        k: v for k, v in schema_b.metadata.items() if k != META_KEY
    }
    assert meta_a["json_columns"] == meta_b["json_columns"]
    assert [q.replace(str(grown), "F") for q in meta_a["quarantined"]] == [
        q.replace(str(whole), "F") for q in meta_b["quarantined"]
    ]


def _store(tmp_path: Path) -> Path:
    path = tmp_path / "grown" / "smoke.jsonl"
    path.parent.mkdir()
    for k in (1, 2, 4):
        append_record(path, record(case(topk=k), tps=10.0 * k))
    return path


def test_a_file_grown_by_appends_has_only_its_new_lines_built(tmp_path, monkeypatch):
    path = _store(tmp_path)
    files_frame([path])
    size = path.stat().st_size
    append_record(path, record(case(topk=8), tps=80.0, started_at=T0 + timedelta(hours=1)))
    append_record(path, record(case(topk=8, page_size=1), status=Status.crashed, reason="boom"))  # no metric
    spans = _spans(monkeypatch)
    df = files_frame([path])
    assert [s[0] for s in spans] == [size]  # the appended lines alone, from the cached size on
    assert df.output_throughput.tolist()[:4] == [10.0, 20.0, 40.0, 80.0] and df.status.tolist()[-1] == "crashed"
    _same_as_whole(path, tmp_path)
    spans.clear()
    assert files_frame([path]).output_throughput.tolist()[:4] == [10.0, 20.0, 40.0, 80.0]
    assert spans == []  # the grown cache is fresh


def test_a_file_whose_cached_bytes_changed_is_built_whole(tmp_path, monkeypatch):
    path = _store(tmp_path)
    files_frame([path])
    path.write_text(path.read_text().replace('"value":10.0', '"value":15.0', 1))  # same size, other bytes
    append_record(path, record(case(topk=8), tps=80.0))
    spans = _spans(monkeypatch)
    assert files_frame([path]).output_throughput.tolist() == [15.0, 20.0, 40.0, 80.0]
    assert [s[0] for s in spans] == [0]


def test_a_cache_that_ends_inside_a_line_is_not_joined_to_its_rest(tmp_path, monkeypatch):
    path = _store(tmp_path)
    line = record(case(topk=8), tps=80.0).model_dump_json() + "\n"
    with open(path, "a") as f:
        f.write(line[:40])  # a torn last line, quarantined by the cached build
    with pytest.warns(Warning, match="incomplete last line"):
        assert len(files_frame([path])) == 3
    with open(path, "a") as f:
        f.write(line[40:])  # the write completed: the line is whole now
    spans = _spans(monkeypatch)
    q = Quarantine()
    assert files_frame([path], quarantine=q).output_throughput.tolist() == [10.0, 20.0, 40.0, 80.0]
    assert [s[0] for s in spans] == [0] and not q


def test_a_line_appended_invalid_is_quarantined_as_a_whole_build_would(tmp_path):
    path = _store(tmp_path)
    files_frame([path])
    with open(path, "a") as f:
        f.write("[1, 2]\n")
    append_record(path, record(case(topk=8), tps=80.0))
    with pytest.warns(Warning, match=r"smoke.jsonl:4"):
        assert files_frame([path]).output_throughput.tolist() == [10.0, 20.0, 40.0, 80.0]
    with pytest.warns(Warning, match=r"smoke.jsonl:4"):  # kept with the cache, reported again
        assert len(files_frame([path])) == 4
    _same_as_whole(path, tmp_path)


@pytest.mark.parametrize(
    "head, tail",
    [
        ([{"a": 1}, {"a": 2}], [{"a": None}]),  # int and None: float
        ([{"a": None}, {"a": None}], [{"a": 1.5}]),  # None only, then a float: float
        ([{"a": None}], [{}]),  # None, then missing: float
        ([{"a": None}], [{"a": None}]),  # None only: object
        ([{"a": True}, {"a": False}], [{}]),  # bools, then missing: object
        ([{"a": "x"}], [{"a": None}]),  # text and None: text
        ([{"a": 1}], [{"a": 2.5}]),  # int and float: float
        ([{"a": [1, 2]}], [{"a": None}]),  # lists (JSON text in the cache), then None
        ([{"a": True}], [{"a": 1.5}]),  # bool and float: not joined
        ([{"a": 1.5}], [{"a": "x"}]),  # float and text: not joined
        ([{"a": 1}], [{"a": 1, "b": 2}]),  # a new column: not joined
        ([{"a": T0}], [{"a": None}]),  # datetimes and None
    ],
)
def test_joined_rows_are_the_rows_of_a_whole_build_or_none(tmp_path, head, tail):
    from specwatch.store.frame_cache import _write

    def cached(rows: list[dict], name: str) -> pd.DataFrame:  # written and read back as a cache is
        path = tmp_path / f"{name}.jsonl"
        _write(cache_path(path), pd.DataFrame(rows), {"size": 1}, [])
        return cached_frame(cache_path(path), cache_meta(cache_path(path)), Quarantine(), hidden=True)

    joined = join_rows(cached(head, "head"), pd.DataFrame(tail))
    if joined is None:
        return  # built whole instead
    _write(cache_path(tmp_path / "joined.jsonl"), joined, {"size": 1}, [])
    back = cached_frame(
        cache_path(tmp_path / "joined.jsonl"), cache_meta(cache_path(tmp_path / "joined.jsonl")), Quarantine()
    )
    assert_frame_equal(back, cached(head + tail, "whole"), check_exact=True)


def test_joins_cover_the_usual_appends():
    a = pd.DataFrame([{"a": 1, "b": "x", "c": True}])
    assert join_rows(a, pd.DataFrame([{"a": 2, "b": "y", "c": False}])) is not None
    assert join_rows(a, pd.DataFrame([{"a": 1.5}])) is not None
    assert join_rows(a, pd.DataFrame([{"a": 1, "d": 1}])) is None


@pytest.mark.parametrize(
    "name, cut",
    [
        ("nvidia-h200-x1/sglang-0.5.17/smoke.jsonl", 20),
        ("nvidia-h200-x1/sglang-0.5.17/dflash.jsonl", 30),
        ("nvidia-h200-x1/sglang-0.5.17/faults.jsonl", 3),
        ("nvidia-h200-x2/sglang-0.5.17/dcp.jsonl", 400),
        ("nvidia-h200-x1/sglang-0.5.17/tree-page.jsonl", 380),
    ],
)
def test_a_committed_file_grown_by_its_own_last_lines_caches_what_a_whole_build_does(tmp_path, name, cut):
    lines = (COMMITTED / name).read_bytes().splitlines(keepends=True)
    path = tmp_path / "grown" / Path(name).name
    path.parent.mkdir()
    path.write_bytes(b"".join(lines[:cut]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        files_frame([path], columns=[])
        with open(path, "ab") as f:
            f.write(b"".join(lines[cut:]))
        files_frame([path], columns=[])
    _same_as_whole(path, tmp_path)
