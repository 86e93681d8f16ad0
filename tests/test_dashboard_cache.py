"""The dashboard's parts kept in the store (``present.part_cache``): taken from it while the store's
files and the code are unchanged, computed again once a records file, the noise budgets or a file
of the package changes; a build from kept parts draws no figure and writes the same files as a
build that computes them all."""

from datetime import timedelta
from pathlib import Path

from typer.testing import CliRunner

from records import T0, case, record
from specwatch.cli import app
from specwatch.core.record import Metric
from specwatch.present.part_cache import PART_DIR, PartCache
from specwatch.store.frame import files_frame
from specwatch.store.jsonl import append_record, result_files, results_path
from specwatch.store.result_cache import CACHE_DIR


def _record(topk: int, hour: int = 0, throughput: float = 1000.0):
    r = record(case(topk=topk, num_draft_tokens=8 if topk > 1 else 4), started_at=T0 + timedelta(hours=hour))
    r.metrics["req_to_token_bytes"] = Metric(value=9 * (8192 + 100 * topk) * 4, unit="bytes", exact=True)
    r.metrics["decode_throughput"] = Metric(value=throughput / topk, unit="tokens/s", samples=[throughput / topk])
    r.metrics["accept_length"] = Metric(value=4.0, unit="tokens/verify", exact=True)
    return r


def _store(root) -> None:
    for k in (1, 4, 8):
        append_record(results_path(root, "m", "0.5.17", "smoke"), _record(k))


def _counter():
    calls = []

    def compute() -> int:
        calls.append(1)
        return len(calls)

    return compute


def test_a_part_is_kept_while_the_store_is_unchanged_and_computed_again_once_a_file_changes(tmp_path):
    _store(tmp_path)
    compute = _counter()
    assert PartCache.of(tmp_path).value("n", compute) == 1
    assert PartCache.of(tmp_path).value("n", compute) == 1  # kept
    files_frame(result_files(tmp_path))  # the store's own caches (Parquet beside the JSONL) are no input
    assert PartCache.of(tmp_path).value("n", compute) == 1
    append_record(results_path(tmp_path, "m", "0.5.17", "smoke"), _record(2, hour=1))
    assert PartCache.of(tmp_path).value("n", compute) == 2  # a records file written
    (tmp_path / "noise-budgets.json").write_text('{"pairs": [], "budgets": {}}')
    assert PartCache.of(tmp_path).value("n", compute) == 3  # a file added
    (tmp_path / "noise-budgets.json").write_text('{"pairs": [], "budgets": {"tiny": 0.1}}')
    assert PartCache.of(tmp_path).value("n", compute) == 4  # and written again
    assert PartCache.of(tmp_path).value("n", compute) == 4


def test_a_part_computed_while_a_file_was_written_is_not_taken_for_the_new_file(tmp_path):
    _store(tmp_path)
    compute = _counter()
    before = PartCache.of(tmp_path)  # the stamps as the records were read
    append_record(results_path(tmp_path, "m", "0.5.17", "smoke"), _record(2, hour=1))
    assert before.value("n", compute) == 1  # computed from the records read before the write
    assert PartCache.of(tmp_path).value("n", compute) == 2


def test_a_part_of_some_records_is_kept_across_writes_to_the_others_and_computed_again_for_its_own(tmp_path):
    _store(tmp_path)
    calls = []

    def compute(rows) -> tuple:
        calls.append(1)
        return len(calls), rows.topk.tolist()

    def part(pick=lambda df: df[df.topk == 4]):
        df = files_frame(result_files(tmp_path))
        return PartCache.of(tmp_path).rows_value("topk-4", pick(df), compute)

    assert part() == (1, [4])
    append_record(results_path(tmp_path, "m", "0.5.18", "smoke"), _record(2, hour=1))
    assert part() == (1, [4])  # another case's record: the rows read are unchanged
    assert part(lambda df: df[df.topk == 4].assign(accept_length=4)) == (2, [4])  # 4, not 4.0: other rows
    append_record(results_path(tmp_path, "m", "0.5.18", "smoke"), _record(4, hour=2))
    assert part() == (3, [4, 4])


def test_an_unreadable_kept_part_is_computed_again(tmp_path):
    _store(tmp_path)
    compute = _counter()
    assert PartCache.of(tmp_path).value("n", compute) == 1
    kept = tmp_path / CACHE_DIR / PART_DIR / "n.pkl"
    kept.write_bytes(kept.read_bytes().split(b"\n")[0] + b"\nnot a pickle")
    assert PartCache.of(tmp_path).value("n", compute) == 2


def test_the_code_key_changes_with_any_file_of_the_package(tmp_path, monkeypatch):
    from specwatch.store import result_cache

    pkg = tmp_path / "specwatch"
    (pkg / "templates").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "templates" / "page.html.j2").write_text("<p>{{ x }}</p>\n")
    monkeypatch.setattr(result_cache, "_PKG", pkg)

    def key() -> str:
        monkeypatch.setattr(result_cache, "_code", [])  # computed once per process: again here
        return result_cache.code_key()

    first = key()
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"bytecode")
    assert key() == first  # bytecode is no source
    (pkg / "templates" / "page.html.j2").write_text("<p>{{ x }}!</p>\n")
    assert key() != first  # a template drawn differently: every kept part computed again


def _tree(folder) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_build_from_kept_parts_draws_no_figure_and_writes_the_same_files(tmp_path, monkeypatch):
    import matplotlib.figure

    results = tmp_path / "results"
    _store(results)

    def build(out):
        return CliRunner().invoke(app, ["dashboard", "--results", str(results), "--out", str(tmp_path / out)])

    def no_drawing(m) -> None:
        m.setattr(matplotlib.figure.Figure, "savefig", lambda *a, **k: (_ for _ in ()).throw(AssertionError("drawn")))

    assert build("computed").exit_code == 0
    assert (results / CACHE_DIR / PART_DIR / "memory_vs_topk.pkl").exists()
    with monkeypatch.context() as m:
        no_drawing(m)
        kept = build("kept")
    assert kept.exit_code == 0, kept.output
    assert _tree(tmp_path / "kept") == _tree(tmp_path / "computed") and _tree(tmp_path / "kept")
    # a newer record of one case: the kept figures and tables are stale, drawn again
    append_record(results_path(results, "m", "0.5.17", "smoke"), _record(4, hour=1, throughput=600.0))
    with monkeypatch.context() as m:
        no_drawing(m)
        stale = build("stale")
    assert stale.exit_code != 0 and "drawn" in str(stale.exception)
    assert build("again").exit_code == 0
    for p in (results / CACHE_DIR / PART_DIR).iterdir():
        p.unlink()
    assert build("fresh").exit_code == 0
    assert _tree(tmp_path / "again") == _tree(tmp_path / "fresh") != _tree(tmp_path / "computed")


def test_a_build_from_kept_parts_never_imports_matplotlib(tmp_path):
    import subprocess
    import sys

    results = tmp_path / "results"
    _store(results)
    argv = ["dashboard", "--results", str(results), "--out", str(tmp_path / "dash")]
    script = (
        "import sys\nfrom specwatch.cli import app\n"
        f"app({argv!r}, standalone_mode=False)\n"
        "print('matplotlib' in sys.modules)\n"
    )
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[-1].stderr
    assert [r.stdout.split()[-1] for r in runs] == ["True", "False"]  # drawn once, then kept


def test_the_health_matrix_is_kept_only_while_the_suite_files_plan_the_same(tmp_path, monkeypatch):
    import specwatch
    from specwatch.present.dashboard import build

    results = tmp_path / "results"
    _store(results)
    monkeypatch.chdir(tmp_path)  # the matrix plans the suites of ./suites: none here yet
    df = files_frame(result_files(results))
    build(df, tmp_path / "before", parts=PartCache.of(results))
    (tmp_path / "suites").symlink_to(Path(specwatch.__file__).parent / "suites")  # smoke.toml plans no topk 8
    kept = build(df, tmp_path / "kept", parts=PartCache.of(results)).read_text()
    fresh = build(df, tmp_path / "fresh").read_text()
    before = (tmp_path / "before" / "index.html").read_text()
    assert kept == fresh != before and "topk 8" in before and "topk 8" not in fresh
