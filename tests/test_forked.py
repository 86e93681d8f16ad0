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


@needs_fork
def test_each_call_runs_in_a_child_and_its_result_comes_back_in_order(tmp_path):
    parent = os.getpid()
    with Forked(lambda: os.getpid(), lambda: (tmp_path / "x").write_text("drawn"), lambda: [1, {"a": 2}]) as side:
        time.sleep(0.5)  # the child has claimed the calls meanwhile
        assert side.result(2) == [1, {"a": 2}]
        assert side.result(0) != parent
    assert (tmp_path / "x").read_text() == "drawn"  # the child's files are there once the block ends


def test_an_input_error_in_the_child_is_raised_in_the_parent_with_its_file_and_field():
    def bad():
        raise SpecwatchInputError("results/x.jsonl", "not a record", field="case")

    with pytest.raises(SpecwatchInputError) as e:
        with Forked(bad, lambda: 1) as side:
            assert side.result(1) == 1  # another call's result comes back; leaving raises the failure
    assert (e.value.path, e.value.field, str(e.value)) == ("results/x.jsonl", "case", "results/x.jsonl: case: not a record")


@needs_fork
def test_the_parent_runs_the_calls_left_at_the_back_while_it_waits():
    parent = os.getpid()
    with Forked(lambda: time.sleep(1) or os.getpid(), lambda: os.getpid(), lambda: os.getpid()) as side:
        time.sleep(0.3)  # the child has claimed the first call meanwhile
        assert side.result(0) != parent  # the child took the first call at once
        assert side.result(2) == side.result(1) == parent  # taken here while the child slept


@needs_fork
def test_a_result_that_cannot_be_pickled_fails_in_the_parent():
    with pytest.raises(RuntimeError, match="unpicklable"):
        with Forked(lambda: (lambda: 1)) as side:
            time.sleep(0.5)  # claimed by the child meanwhile
            side.result(0)


@needs_fork
def test_leaving_with_an_error_stops_the_child(tmp_path):
    with pytest.raises(KeyError):
        with Forked(lambda: time.sleep(30) or (tmp_path / "late").write_text("x")):
            time.sleep(0.3)  # claimed by the child meanwhile
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
