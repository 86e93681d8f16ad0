"""A stand-in for specwatch.worker in harness tests: no GPU, no SGLang.

Reports each case ok with a throughput of 100 * page_size (a plain-decoding twin: 50 * page_size;
FAKE_STEP_MS adds a step_time of that many ms, three times as many for spec cases), except that a case whose topk is 4
kills the process the way a dying SGLang scheduler does (SIGKILL of the worker), a case with topk 6
does so after a CUDA device-side assertion (printed as the H200 printed it, then the cuBLAS error it
surfaced as), a case with
topk 8 and batch 8 hangs (for timeout tests), and a group with num_steps 5 dies before its engine is up. FAKE_WORKER_STARTS counts process starts in a file;
FAKE_WORKER_PIDS collects the worker pids; FAKE_BAD_LINE is written instead of each group's first case line.
FAKE_ORDER: each start appends ``probed`` to that file (``fake_baseline`` appends ``baseline``), under a
fault ``probed FAULT pPAGE`` (the fault and the group's page size);
FAKE_TPS_SAMPLES (comma-separated): a spec case's output_throughput samples, their median its value.
It arms ``specwatch.core.lifeline`` as the real worker does (dies with its runner, and past the spec's timeout).
It takes the timing lock like the real worker; FAKE_WORKER_INTERVALS logs when it "started its engine"
(FAKE_START_S of sleep) and when it "timed" its cases, so tests can check that they never overlap.
FAKE_TURN_UNITS / FAKE_TURNS_LOG: per case that many units of work taken in turns with a paired
plain loop (``turn_units``).
"""

import json
import os
import signal
import statistics
import sys
import time

from fake_turns import turn_units
from specwatch.core import lifeline
from specwatch.core.case import Case
from specwatch.core.timing_lock import WorkerTimingLock

spec = json.load(open(sys.argv[1]))
guard = lifeline.hold(spec.get("timeout_s"))


def await_record(case_id: str) -> None:
    """With ``FAKE_AWAIT_DIR``: before the next case, wait until the driver has the record of this one
    (a file named by its case id, which the test's progress hook writes) and note in
    ``<case id>.await`` whether it came within ``FAKE_AWAIT_S`` (``streamed``) or not (``late``)."""
    folder = os.environ.get("FAKE_AWAIT_DIR")
    if not folder:
        return
    deadline = time.monotonic() + float(os.environ.get("FAKE_AWAIT_S", "60"))
    while not os.path.exists(os.path.join(folder, case_id)) and time.monotonic() < deadline:
        time.sleep(0.05)
    came = os.path.exists(os.path.join(folder, case_id))
    with open(os.path.join(folder, f"{case_id}.await"), "w") as f:
        f.write("streamed" if came else "late")


if os.environ.get("FAKE_WORKER_STARTS"):
    with open(os.environ["FAKE_WORKER_STARTS"], "a") as f:
        f.write("start\n")
if os.environ.get("FAKE_ORDER"):
    with open(os.environ["FAKE_ORDER"], "a") as f:
        f.write("probed" + (f" {spec['fault']} p{spec['cases'][0]['page_size']}" if spec.get("fault") else "") + "\n")
if os.environ.get("FAKE_WORKER_PIDS"):
    with open(os.environ["FAKE_WORKER_PIDS"], "a") as f:
        f.write(f"{os.getpid()}\n")


def interval(kind, t0):
    if os.environ.get("FAKE_WORKER_INTERVALS"):
        with open(os.environ["FAKE_WORKER_INTERVALS"], "a") as f:
            f.write(json.dumps({"kind": kind, "t0": t0, "t1": time.time(), "pid": os.getpid()}) + "\n")


with open(spec["results"], "a") as out:

    def emit(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    lock = WorkerTimingLock()
    lock.starting(emit)
    t0 = time.time()
    if Case(**spec["cases"][0]).num_steps == 5:
        print("NotImplementedError: engine refused at start (fake)", flush=True)
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)  # a background shell starts us with SIGQUIT ignored
        os.kill(os.getpid(), signal.SIGQUIT)
    time.sleep(float(os.environ.get("FAKE_START_S", "0")))
    interval("start", t0)
    emit({"event": "engine_started"})
    # the probe's pool checks at engine start, as engine_worker emits them (a pool 64 rows short)
    emit(
        {
            "event": "engine_facts",
            "checks": {"target_pool_covers_allocator": False},
            "metrics": {"target_pool_missing_rows": {"value": 64.0, "unit": "slots", "exact": True}},
            "details": {"pool_coverage_at_start": {"target": {"scale": 1, "missing_rows": 64}}},
        }
    )
    with guard.paused():
        lock.timing(emit)
    t0 = time.time()
    for i, c in enumerate(spec["cases"]):
        case = Case(**c)
        spec_case = case.algorithm.speculative  # a plain twin (NONE) decodes at half the rate
        if case.topk == 4:
            print("RuntimeError: scheduler died (fake)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if case.topk == 6:
            for thread in range(3):
                print(
                    "/tmp/specwatch-site/sglang/kernels/jit/csrc/elementwise/kvcache.cuh:209: void "
                    "<unnamed>::store_kvcache(<unnamed>::StoreKVCacheParams) [with signed long kKElementBytes = "
                    f"256L]: block: [718,0,0], thread: [{96 + thread},0,0] Assertion `index >= 0 && index < "
                    "size_limit` failed.",
                    flush=True,
                )
            print(
                "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx(...)`", flush=True
            )
            os.kill(os.getpid(), signal.SIGKILL)
        if case.topk == 8 and case.batch_size == 8:
            time.sleep(60)
        if i == 0 and os.environ.get("FAKE_BAD_LINE"):
            out.write(os.environ["FAKE_BAD_LINE"].replace("CASE_ID", case.case_id) + "\n")
            out.flush()
            continue
        turn_units(f"probed:{spec.get('fault') or 'none'} {case.case_id}")
        metrics = {"output_throughput": {"value": (100.0 if spec_case else 50.0) * case.page_size, "unit": "tokens/s"}}
        if spec_case and os.environ.get("FAKE_TPS_SAMPLES"):
            samples = [float(x) for x in os.environ["FAKE_TPS_SAMPLES"].split(",")]
            metrics["output_throughput"].update(value=statistics.median(samples), samples=samples)
        if os.environ.get("FAKE_STEP_MS"):
            metrics["step_time"] = {"value": float(os.environ["FAKE_STEP_MS"]) * (3 if spec_case else 1), "unit": "ms"}
        out.write(
            json.dumps(
                {
                    "case_id": case.case_id,
                    "status": "ok",
                    "metrics": metrics,
                    "details": {"probe_env": os.environ.get("SPECWATCH_PROBE", "1"), "spec_probe": spec.get("probe")},
                }
            )
            + "\n"
        )
        out.flush()
        await_record(case.case_id)
        time.sleep(float(os.environ.get("FAKE_TIME_S", "0")))
    interval("timing", t0)
    from specwatch.core.turns import process_turns

    process_turns().close()
