"""Work in a forked child (``core.forked``): results and errors come back in order; a cold store's
frame caches are built in a child (``store.prime.build_stale``) and read warm by the caller."""

import os
import time
import warnings

import pytest

from records import case, record
from specwatch.core.errors import SpecwatchInputError
from specwatch.core.forked import FORK, Forked
from specwatch.store.jsonl import InvalidRecordWarning, Quarantine, append_record

needs_fork = pytest.mark.skipif(not FORK, reason="no fork on this platform")


def _claimed(marker):
    """Wait until the child has started the call that writes ``marker``."""
    for _ in range(1000):
        if marker.exists():
            return
        time.sleep(0.01)
    raise AssertionError("the child never started its first call")


@needs_fork
def test_each_call_runs_once_and_its_result_comes_back(tmp_path):
    parent, marker = os.getpid(), tmp_path / "started"
    first = lambda: marker.write_text("") or os.getpid()  # noqa: E731
    with Forked(first, lambda: (tmp_path / "x").write_text("drawn"), lambda: [1, {"a": 2}]) as side:
        _claimed(marker)
        assert side.result(0) != parent  # run by the child
        assert side.result(2) == [1, {"a": 2}]
    assert (tmp_path / "x").read_text() == "drawn"  # the files of every call are there once the block ends


def test_an_input_error_survives_the_pickle_with_its_file_and_field():
    import pickle

    e = pickle.loads(pickle.dumps(SpecwatchInputError("results/x.jsonl", "not a record", field="case")))
    assert (e.path, e.field, e.message, str(e)) == (
        "results/x.jsonl",
        "case",
        "not a record",
        "results/x.jsonl: case: not a record",
    )


@needs_fork
def test_an_input_error_in_the_child_is_raised_in_the_parent_when_the_block_ends(tmp_path):
    marker = tmp_path / "started"

    def bad():
        marker.write_text("")
        raise SpecwatchInputError("results/x.jsonl", "not a record", field="case")

    with pytest.raises(SpecwatchInputError) as e:
        with Forked(bad, lambda: 1) as side:
            _claimed(marker)
            assert side.result(1) == 1  # another call's result still comes back
    assert (e.value.path, e.value.field) == ("results/x.jsonl", "case")


@needs_fork
def test_the_parent_runs_the_calls_left_at_the_back_while_it_waits(tmp_path):
    parent, marker = os.getpid(), tmp_path / "started"
    slow = lambda: marker.write_text("") or time.sleep(1) or os.getpid()  # noqa: E731
    with Forked(slow, lambda: os.getpid(), lambda: os.getpid()) as side:
        _claimed(marker)
        assert side.result(0) != parent
        assert side.result(2) == side.result(1) == parent  # taken here while the child slept


@needs_fork
def test_a_result_that_cannot_be_pickled_fails_in_the_parent(tmp_path):
    marker = tmp_path / "started"
    with pytest.raises(RuntimeError, match="unpicklable"):
        with Forked(lambda: marker.write_text("") or (lambda: 1)) as side:
            _claimed(marker)
            side.result(0)


@needs_fork
def test_leaving_with_an_error_stops_the_child(tmp_path):
    marker = tmp_path / "started"
    with pytest.raises(KeyError):
        with Forked(lambda: marker.write_text("") or time.sleep(30) or (tmp_path / "late").write_text("x")):
            _claimed(marker)
            raise KeyError("parent failed")
    assert not (tmp_path / "late").exists()


def _store(tmp_path):
    path = tmp_path / "m" / "sglang-0.5.17" / "smoke.jsonl"
    append_record(path, record(case(page_size=1), tps=10.0))
    with open(path, "a") as f:
        f.write("[1, 2, 3]\n")  # quarantined
    return path


@needs_fork
def test_stale_caches_are_built_in_a_child_and_read_warm_after(tmp_path, monkeypatch):
    from specwatch.store import frame_cache
    from specwatch.store.frame import files_frame
    from specwatch.store.prime import build_stale

    path = _store(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the child's build warns nothing here
        with frame_cache.one_pass():
            build_stale([path])
    assert frame_cache.cache_path(path).exists()
    with pytest.warns(InvalidRecordWarning):
        hit, _ = frame_cache.fresh_rows(path, Quarantine(), ["output_throughput"])
    assert hit is not None  # built by the child's code, stamped: a hit without hashing
    with pytest.warns(InvalidRecordWarning, match=r"smoke.jsonl:2"):  # the caller's read reports it
        assert files_frame([path]).output_throughput.tolist() == [10.0]
    forks = []
    monkeypatch.setattr("specwatch.store.prime.Forked", lambda *calls: forks.append(calls))
    build_stale([path])  # fresh: no child
    assert forks == []


@needs_fork
def test_a_cache_whose_file_was_written_since_is_built_again(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from specwatch.store import frame_cache
    from specwatch.store.prime import build_stale, stamp_fresh

    path = _store(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_stale([path])
        assert stamp_fresh(path)
        append_record(path, record(case(page_size=16), tps=12.0))
        assert not stamp_fresh(path)  # the schema's stamp is the old file's
        forks = []
        monkeypatch.setattr(
            "specwatch.store.prime.Forked", lambda *calls: forks.append(calls) or SimpleNamespace(join=lambda: None)
        )
        build_stale([path])
    assert len(forks) == 1 and frame_cache.cache_path(path).exists()


@needs_fork
def test_the_fresh_caches_are_read_while_a_child_builds_the_stale_ones(tmp_path, monkeypatch):
    from specwatch.store import frame as frame_mod
    from specwatch.store import frame_cache
    from specwatch.store.frame import files_frame
    from specwatch.store.prime import start_stale

    fresh, stale = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    append_record(fresh, record(case(page_size=1), tps=10.0))
    append_record(stale, record(case(page_size=16), tps=20.0))
    files_frame([fresh, stale])
    append_record(stale, record(case(page_size=64), tps=30.0))  # b's cache stale now
    read, built = [], []
    real_fresh, real_rows = frame_cache.fresh_rows, frame_mod._rows_of_span
    monkeypatch.setattr(frame_cache, "fresh_rows", lambda p, *a: read.append(p.name) or real_fresh(p, *a))
    with frame_cache.one_pass():
        wait = start_stale([fresh, stale])  # the child forked now, with the built rows' spy below unset
        monkeypatch.setattr(frame_mod, "_rows_of_span", lambda *a: built.append(a) or real_rows(*a))
        waited = []
        df = files_frame([fresh, stale], pending=lambda: waited.append(list(read)) or wait())
    assert df.output_throughput.tolist() == [10.0, 20.0, 30.0]
    assert waited == [["a.jsonl", "b.jsonl"]]  # both tried (a read) before the wait
    assert read[-1] == "b.jsonl" and built == []  # b read again after it: built by the child, not here
