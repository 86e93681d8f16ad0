"""Timing parity: specwatch's worker against a plain loop of ``sglang.Engine.generate`` on one case.

Three kinds of run, each in a fresh process with an engine of its own, interleaved by round
(``A B C A B C``, as asv's ``--interleave-rounds``), so a drift of the host over the experiment
hits every kind alike:

* ``plain``: ``specwatch.worker.baseline``, the loop ``specwatch run --baseline`` runs: one
  ``sglang.Engine`` with specwatch's own engine arguments (``worker.engine_args``), no specwatch
  code in SGLang's processes: ``flush_cache()``, one warm-up ``generate``, then
  ``--repeats`` timed ``generate`` calls on the worker's timed prompts, each prefilling in full
  (``worker.baseline.fresh_batch``: a flush and an untimed refill before it). The same
  engine then times ``plain_flushed``: each timed batch after a flush, a prefill-only batch and a
  second flush (the worker's repeat before ``warm_after_flush``), which isolates what SGLang's
  flush (it empties the CUDA caching allocator) costs the batch right after it;
* ``probed``: ``python -m specwatch.worker`` as ``specwatch run`` starts it (probe on);
* ``bare``: the same with ``SPECWATCH_PROBE=0`` (``specwatch run --bare``).

Prints one JSON object (with the host's provenance, as records carry it): per kind the per-repeat output tokens/s of every run, the median over all
repeats, the spread ((max - min) / median), per-run medians, and the ratios of each kind's median
to ``plain``'s; the worker's garbage-collector pauses inside each timed batch and the scheduler's
(probed) come with them. Tiny oracle, two rounds: about six engine starts, under 8 minutes on an
H200.

    PYTHONPATH=src python scripts/timing_parity.py [--rounds 2] [--topk 4] [--out parity.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("plain", "probed", "bare")
"""The kinds of run ``--order`` may name (``plain`` also yields ``plain_flushed``)."""
BASELINE = "plain"


class BadOption(Exception):
    """One option's bad value: printed as one line, exit code 2."""


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="triton")
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--topk", type=int, default=4)
    p.add_argument("--num-steps", type=int, default=3)
    p.add_argument("--num-draft-tokens", type=int, default=8)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--input-len", type=int, default=1000)
    p.add_argument("--output-len", type=int, default=300)
    p.add_argument("--profile", default="perfect")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--order", default=",".join(KINDS), help="kinds of run per round, comma-separated")
    p.add_argument("--models-dir", default="/tmp/specwatch-models")
    p.add_argument("--budget-s", type=float, default=480.0, help="start no run past this many seconds")
    p.add_argument("--out", default=None, help="also write the report here (JSON)")
    args = p.parse_args(argv)
    for name in ("repeats", "rounds", "batch"):
        if getattr(args, name) < 1:
            raise BadOption(f"--{name}: must be at least 1, got {getattr(args, name)}")
    order = [k.strip() for k in args.order.split(",") if k.strip()]
    unknown = [k for k in order if k not in KINDS]
    if unknown or not order:
        raise BadOption(f"--order: unknown kind {unknown[0] if unknown else '(none)'!r}; kinds: {', '.join(KINDS)}")
    args.order = order
    return args


def case_from_args(args: argparse.Namespace):
    """The ``Case`` the options name (EAGLE on the tiny oracle); a bad field is a ``BadOption``."""
    from pydantic import ValidationError

    from specwatch.core.case import Case

    try:
        return Case(
            model="tiny",
            algorithm="EAGLE",
            attention_backend=args.backend,
            page_size=args.page_size,
            topk=args.topk,
            num_steps=args.num_steps,
            num_draft_tokens=args.num_draft_tokens,
            batch_size=args.batch,
            input_len=args.input_len,
            output_len=args.output_len,
            profile=args.profile,
        )
    except ValidationError as e:
        err = e.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "case"
        option = {"attention_backend": "backend", "batch_size": "batch"}.get(field, field).replace("_", "-")
        raise BadOption(f"--{option}: {err['msg']}") from None


def interleaved(order: list[str], rounds: int) -> list[tuple[int, str]]:
    """(round, kind) in run order: every kind once per round, rounds one after another."""
    return [(r, kind) for r in range(rounds) for kind in order]


def run_plain(case, args, tmp: Path, timeout_s: float) -> dict:
    """The ``plain`` run: ``specwatch.worker.baseline`` (the loop ``specwatch run --baseline`` runs)
    with the flushed pattern on, in ``run.baseline``'s environment (no probe, no ``SPECWATCH_*``)."""
    from specwatch.core.protocol import BaselineSpec
    from specwatch.run.baseline import baseline_env, run_baseline

    spec = BaselineSpec(
        cases=[case],
        repeats=args.repeats,
        models_dir=args.models_dir,
        results=str(tmp / "plain-out.jsonl"),
        flushed=True,
    )
    env = baseline_env(
        {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)}
    )
    run = run_baseline(spec, "specwatch.worker.baseline", env, timeout_s, tmp / "plain.log")
    line = run.lines.get(case.case_id)
    if line is None or not line.ok:
        return {"error": (line.reason if line is not None else None) or run.error or "no case line"}
    return {
        "plain": {"tps": line.output_throughput, "cached_tokens": line.cached_tokens},
        "plain_flushed": {"tps": line.flushed_output_throughput, "cached_tokens": line.flushed_cached_tokens},
    }


def _run(cmd: list[str], env: dict, timeout_s: float, log: Path) -> Optional[str]:
    """Run ``cmd`` in a process group of its own (SGLang kills its parent's group when a scheduler
    dies), kill the group afterwards; returns an error line or None."""
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
        try:
            rc = proc.wait(timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            try:
                os.killpg(proc.pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    if rc is None:
        return f"timed out after {timeout_s:.0f} s"
    return None if rc == 0 else f"exit code {rc}; log tail: {log.read_text(errors='replace')[-600:]}"


def run_worker(case, args, tmp: Path, timeout_s: float, probe: bool) -> dict:
    """``python -m specwatch.worker`` on the case, with the runner's environment (``worker_env``)."""
    from types import SimpleNamespace

    from specwatch.core.protocol import WorkerSpec
    from specwatch.run.group import worker_env

    kind = "probed" if probe else "bare"
    spec, results = tmp / f"{kind}-spec.json", tmp / f"{kind}-out.jsonl"
    results.unlink(missing_ok=True)
    spec.write_text(
        WorkerSpec(
            cases=[case],
            repeats=args.repeats,
            warmup=True,
            models_dir=args.models_dir,
            probe=probe,
            results=str(results),
            timeout_s=timeout_s,
        ).model_dump_json()
    )
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    env = worker_env(SimpleNamespace(fault=None, probe=probe), {"PYTHONPATH": path})
    err = _run([sys.executable, "-m", "specwatch.worker", str(spec)], env, timeout_s + 10, tmp / f"{kind}.log")
    lines = [json.loads(x) for x in results.read_text().splitlines()] if results.exists() else []
    line = next((x for x in lines if x.get("case_id") == case.case_id), None)
    if line is None or line.get("status") != "ok":
        return {kind: {"error": err or (line or {}).get("reason", "no case line")}}
    details = line.get("details") or {}
    return {
        kind: {
            "tps": line["metrics"]["output_throughput"]["samples"],
            "timed_gc_pauses": details.get("timed_gc_pauses"),
            "scheduler_gc": (details.get("probe") or {}).get("gc"),
            "warm_after_flush": details.get("warm_after_flush"),
        }
    }


def summary(runs: dict[str, list[dict]]) -> dict:
    """Per kind: every run's per-repeat tokens/s, median over all repeats, spread, per-run medians;
    and each kind's median over ``plain``'s (``<kind>/plain``)."""
    kinds = {}
    for kind, rs in runs.items():
        ok = [r for r in rs if r.get("tps")]
        values = [v for r in ok for v in r["tps"]]
        med = statistics.median(values) if values else None
        kinds[kind] = {
            "per_repeat": [[round(v, 1) for v in r["tps"]] for r in ok],
            "median": None if med is None else round(med, 1),
            "spread": round((max(values) - min(values)) / med, 4) if med and len(values) > 1 else None,
            "run_medians": [round(statistics.median(r["tps"]), 1) for r in ok],
            "errors": [r["error"] for r in rs if r.get("error")],
            **{
                k: [r.get(k) for r in ok]
                for k in ("cached_tokens", "timed_gc_pauses", "scheduler_gc")
                if any(k in r for r in ok)
            },
        }
    base = kinds.get(BASELINE, {}).get("median")
    ratios = {
        f"{kind}/{BASELINE}": round(v["median"] / base, 4)
        for kind, v in kinds.items()
        if kind != BASELINE and base and v["median"] is not None
    }
    return {"kinds": kinds, "ratios": ratios}


def experiment(
    case, args, runners: dict[str, Callable[[int], dict]], clock: Callable[[], float] = time.monotonic
) -> dict:
    """Run ``interleaved(args.order, args.rounds)`` with ``runners[kind](timeout_s)``; a run that
    would start past ``args.budget_s`` is left out (named in ``not_run``)."""
    t0, runs, not_run, sequence = clock(), {}, [], []
    for r, kind in interleaved(args.order, args.rounds):
        left = args.budget_s - (clock() - t0)
        if left <= 0:
            not_run.append(f"round {r} {kind}")
            continue
        sequence.append(f"{kind}{r}")
        got = runners[kind](left)
        if "error" in got:
            got = {kind: got}
        for name, res in got.items():
            runs.setdefault(name, []).append(res)
    return {
        "case": case.case_id,
        "case_params": case.params(),
        "repeats": args.repeats,
        "sequence": sequence,
        "not_run": not_run,
        "elapsed_s": round(clock() - t0, 1),
        **summary(runs),
    }


def main(argv: Optional[list[str]] = None) -> int:
    try:
        args = parse_args(argv)
        case = case_from_args(args)
    except BadOption as e:
        print(f"timing_parity: {e}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="specwatch-parity-") as d:
        tmp = Path(d)
        runners = {
            "plain": lambda left: run_plain(case, args, tmp, left),
            "probed": lambda left: run_worker(case, args, tmp, left, probe=True),
            "bare": lambda left: run_worker(case, args, tmp, left, probe=False),
        }
        from specwatch.run import provenance

        started = datetime.now(timezone.utc)
        report = experiment(case, args, runners)
    report["provenance"] = provenance.collect(started, datetime.now(timezone.utc)).model_dump(mode="json")
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
