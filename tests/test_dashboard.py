import shutil
import subprocess

import pytest

from specwatch.dashboard import build
from specwatch.store import append_record, load_records, records_frame, result_files, results_path
from records import case, record


def _frame(tmp_path):
    for k in (1, 4, 8):
        r = record(case(topk=k, num_draft_tokens=8 if k > 1 else 4))
        from specwatch.record import Metric
        r.metrics["req_to_token_bytes"] = Metric(value=9 * (8192 + 100 * k) * 4, unit="bytes", exact=True)
        r.metrics["decode_throughput"] = Metric(value=1000 / k, unit="tokens/s", samples=[1000 / k])
        r.metrics["accept_length"] = Metric(value=4.0, unit="tokens/verify", exact=True)
        append_record(results_path(tmp_path / "results", "m", "0.5.17", "smoke"), r)
    return records_frame(load_records(result_files(tmp_path / "results")))


def test_dashboard_writes_plots_and_index(tmp_path):
    index = build(_frame(tmp_path), tmp_path / "dash")
    text = index.read_text()
    for name in ("memory_vs_topk", "throughput_vs_topk", "acceptance_vs_topk", "across_versions"):
        assert f"plots/{name}.png" in text
        assert (tmp_path / "dash" / "plots" / f"{name}.png").stat().st_size > 10_000
        assert (tmp_path / "dash" / "plots" / f"{name}.svg").exists()
    assert "<table" in text and "decode_throughput" in text


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(not _chromium(), reason="chromium not installed (apt-get install chromium) — browser check skipped")
def test_dashboard_renders_in_headless_chromium(tmp_path):
    index = build(_frame(tmp_path), tmp_path / "dash")
    shot = tmp_path / "shot.png"
    subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run",
                    f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,2400",
                    f"--screenshot={shot}", index.as_uri()], check=True, timeout=120, capture_output=True)
    dom = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                          f"--user-data-dir={tmp_path / 'profile2'}", "--dump-dom", index.as_uri()],
                         check=True, timeout=120, capture_output=True, text=True).stdout
    assert shot.stat().st_size > 20_000
    assert dom.count("<img") == 4 and "<table" in dom


def test_fault_table_puts_each_fault_run_beside_the_clean_run():
    from specwatch.dashboard import fault_table
    from specwatch.record import Status

    c = case(page_size=64, topk=8, num_draft_tokens=16)
    clean, faulty = record(c), record(c, fault="accept-off-by-one")
    clean.checks["lossless"], faulty.checks["lossless"] = True, False
    crashed = record(case(page_size=256, topk=8, num_draft_tokens=16), status=Status.crashed,
                     reason="AssertionError: draft over-allocation", fault="row-widen-revert")
    t = fault_table(records_frame([clean, faulty, crashed]))
    rows = {r["fault"]: r for r in t.to_dict("records")}
    assert rows["accept-off-by-one"]["fault run"] == "failed: lossless"
    assert rows["accept-off-by-one"]["clean run"] == "all checks pass"
    assert rows["row-widen-revert"]["fault run"].startswith("crashed: AssertionError")
    assert rows["row-widen-revert"]["clean run"] == "no clean run"
