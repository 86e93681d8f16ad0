"""A stand-in for specwatch.engine_worker in harness tests: no GPU, no SGLang.

Reports each case ok with a throughput of 100 * page_size, except that a case whose topk is 4
kills the process the way a dying SGLang scheduler does (SIGKILL of the worker), a case with
topk 8 and batch 8 hangs (for timeout tests), and a group with num_steps 5 dies before its engine is up. FAKE_WORKER_STARTS counts process starts in a file.
"""
import json
import os
import signal
import sys
import time

spec = json.load(open(sys.argv[1]))
if os.environ.get("FAKE_WORKER_STARTS"):
    with open(os.environ["FAKE_WORKER_STARTS"], "a") as f:
        f.write("start\n")
from specwatch.case import Case

with open(spec["results"], "a") as out:
    if Case(**spec["cases"][0]).num_steps == 5:
        print("NotImplementedError: engine refused at start (fake)", flush=True)
        os.kill(os.getpid(), signal.SIGQUIT)
    out.write(json.dumps({"event": "engine_started"}) + "\n")
    out.flush()
    for c in spec["cases"]:
        case = Case(**c)
        if case.topk == 4:
            print("RuntimeError: scheduler died (fake)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if case.topk == 8 and case.batch_size == 8:
            time.sleep(60)
        out.write(json.dumps({"case_id": case.case_id, "status": "ok",
                              "metrics": {"output_throughput": {"value": 100.0 * case.page_size,
                                                                "unit": "tokens/s"}}}) + "\n")
        out.flush()
