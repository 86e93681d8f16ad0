import re
import subprocess
import sys

from records import case, record
from specwatch.core.case import Backend, Profile
from specwatch.core.record import Metric
from specwatch.present.asv_bridge import (
    asv_import,
    bench_regex,
    offline_config,
    read_cases,
    tree_page_cases,
    version_ledger,
    write_cases,
)
from specwatch.store.jsonl import (
    append_record,
    results_path,
)


def _tree_record(version, tps, al=4.0, batch_size=1):
    c = case(
        page_size=64,
        topk=8,
        num_draft_tokens=8,
        batch_size=batch_size,
        input_len=512,
        output_len=256,
        attention_backend=Backend.triton,
        profile=Profile.perfect,
    )
    r = record(c, sglang_version=version, machine="h200test")
    r.suite = "tree-page"
    r.metrics.update(
        {
            "decode_throughput": Metric(value=tps, unit="tokens/s", samples=[tps]),
            "accept_length": Metric(value=al, unit="tokens/verify", exact=True),
            "req_to_token_bytes": Metric(value=370908, unit="bytes", exact=True),
            "leaked_tokens": Metric(value=0, unit="tokens", exact=True),
            "lossless_mismatches": Metric(value=0, unit="tokens", exact=True),
        }
    )
    return r


def test_version_ledger_is_ordered_and_stable(tmp_path):
    first = version_ledger(tmp_path / "l", ["0.5.16", "0.5.12"])
    again = version_ledger(tmp_path / "l", ["0.5.17", "0.5.16"])
    assert first.items() <= again.items() and set(again) == {"0.5.12", "0.5.16", "0.5.17"}
    try:
        version_ledger(tmp_path / "l", ["0.5.13"])
    except ValueError as e:
        assert "older than the ledger's newest" in str(e)
    else:
        raise AssertionError("out-of-order version accepted")


def test_bench_regex_selects_every_track_of_exactly_the_recorded_cases():
    pattern = re.compile(bench_regex({("triton", 64, 8, 1, "perfect"): {}, ("fa3", 1, 2, 8, "second-choice"): {}}))
    assert pattern.search("eagle_tree.EagleTree.track_accept_length('triton', 64, 8, 1, 'perfect')")
    assert pattern.search("eagle_tree.EagleTree.track_leaked_tokens('fa3', 1, 2, 8, 'second-choice')")
    for neighbour in ("('triton', 64, 8, 8, 'perfect')", "('triton', 64, 8, 1, 'second-choice')", "('fa3', 1, 2, 8)"):
        assert not pattern.search(f"eagle_tree.EagleTree.track_accept_length{neighbour}")


def test_version_cases_hold_the_latest_ok_wave_record_and_round_trip_through_their_file(tmp_path):
    path = results_path(tmp_path, "h200test", "0.5.16", "tree-page")
    append_record(path, _tree_record("0.5.16", 900.0))
    append_record(path, _tree_record("0.5.16", 1000.0))  # the later record of the same case wins
    overlapped = _tree_record("0.5.16", 5.0, batch_size=8)
    overlapped.details.overlap_starts = True  # timed while other engines started: not a trend point
    append_record(path, overlapped)
    cases = tree_page_cases(tmp_path, "0.5.16", "h200test")
    assert cases == {
        ("triton", 64, 8, 1, "perfect"): {**cases[("triton", 64, 8, 1, "perfect")], "decode_throughput": 1000.0}
    }
    assert cases[("triton", 64, 8, 1, "perfect")]["accept_length"] == 4.0
    assert read_cases(write_cases(tmp_path / "c.json", cases)) == cases
    assert tree_page_cases(tmp_path, "0.5.16", "other-machine") == {}


def test_records_become_asv_results_that_publish_and_compare(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # asv's machine file goes to $HOME
    res_root = tmp_path / "results"
    work, html = tmp_path / "asv", tmp_path / "html"
    # 0.5.17 imported first, 0.5.16 later (an older version run afterwards): the ledger is rebuilt
    for version, tps, al in (("0.5.17", 800.0, 3.5), ("0.5.16", 1000.0, 4.0)):
        append_record(results_path(res_root, "h200test", version, "tree-page"), _tree_record(version, tps, al))
        lines = []
        done = asv_import(res_root, work, html, publish=version == "0.5.16", log=lines.append)
        assert len(lines) == len(done) + (version == "0.5.16") and "sglang 0.5.17" in lines[-1 - (version == "0.5.16")]
    assert set(done) == {("h200test", "0.5.16"), ("h200test", "0.5.17")}
    assert (html / "index.html").exists() and (html / "graphs").exists()
    # where the checkout lives leaves no trace in what asv wrote
    assert [p.name for p in (html / "graphs" / "branch-main" / "machine-h200test").iterdir()] == ["python-specwatch"]
    written = "".join(p.read_text() for p in (work / "results").rglob("*.json")) + (html / "index.json").read_text()
    assert str(tmp_path) not in written.replace(str(work.resolve()), "") and sys.executable not in written
    cfg = offline_config(work, work / "sglang-versions", html)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "asv",
            "compare",
            "--config",
            str(cfg),
            "--machine",
            "h200test",
            done[("h200test", "0.5.16")],
            done[("h200test", "0.5.17")],
        ],
        capture_output=True,
        text=True,
        cwd=work,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {
        cells[-2].strip(): [c.strip() for c in cells[2:5]]
        for cells in (line.split("|") for line in out.stdout.splitlines() if line.startswith("|"))
    }
    tracked = "eagle_tree.EagleTree.track_{}('triton', 64, 8, 1, 'perfect')"
    assert rows[tracked.format("decode_throughput")] == ["1000.0", "800.0", "0.80"]
    assert rows[tracked.format("accept_length")] == ["4.0", "3.5", "0.88"]
