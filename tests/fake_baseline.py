"""A stand-in for specwatch.worker.baseline in harness tests: no GPU, no SGLang.

Writes one ``BaselineLine`` per case of its spec, each timed call's tokens/s taken in turn from
FAKE_BASELINE_TPS (comma-separated; default 100). FAKE_ORDER: appends ``baseline`` to that file
as it starts; FAKE_BASELINE_ENV: writes its ``SPECWATCH_*`` variables and ``PYTHONPATH`` there as
JSON; FAKE_BASELINE_CRASH=N: after N case lines the process dies as a dying SGLang scheduler
takes it down (SIGKILL), N=0 before any. FAKE_BASELINE_HANG=PIDFILE: arms the lifeline the runner
passes on the command line (as ``specwatch.worker.baseline`` does), writes its pid there, and hangs.
FAKE_TURN_UNITS / FAKE_TURNS_LOG: per case that many units of work in turns with the probed worker
(the ends of a paired run, its fourth argument); FAKE_BASELINE_ARGV: writes its arguments there.
"""

import json
import os
import signal
import sys
import time
from datetime import datetime, timezone

from fake_turns import turn_units
from specwatch.core import lifeline
from specwatch.core.protocol import BaselineLine, BaselineSpec
from specwatch.core.turns import Turns, use

spec = BaselineSpec.model_validate_json(open(sys.argv[1]).read())
if os.environ.get("FAKE_ORDER"):
    with open(os.environ["FAKE_ORDER"], "a") as f:
        f.write("baseline\n")
if os.environ.get("FAKE_BASELINE_ENV"):
    seen = {k: v for k, v in os.environ.items() if k.startswith("SPECWATCH_") or k == "PYTHONPATH"}
    with open(os.environ["FAKE_BASELINE_ENV"], "w") as f:
        json.dump(seen, f)
if os.environ.get("FAKE_BASELINE_HANG"):
    lifeline.hold(None, int(sys.argv[2]), int(sys.argv[3]))
    with open(os.environ["FAKE_BASELINE_HANG"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)
turns = use(Turns.parse(sys.argv[4] if len(sys.argv) > 4 else None))  # a paired run's ends (core.turns)
if os.environ.get("FAKE_BASELINE_ARGV"):
    with open(os.environ["FAKE_BASELINE_ARGV"], "w") as f:
        json.dump(sys.argv[1:], f)
tps = [float(x) for x in os.environ.get("FAKE_BASELINE_TPS", "100").split(",")]
crash = int(os.environ["FAKE_BASELINE_CRASH"]) if os.environ.get("FAKE_BASELINE_CRASH") else None
with open(spec.results, "a") as out:
    for i, case in enumerate(spec.cases):
        if crash is not None and i >= crash:
            print("RuntimeError: scheduler died (fake baseline)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        turn_units(f"baseline {case.case_id}")
        now = datetime.now(timezone.utc)
        calls = [tps[r % len(tps)] for r in range(spec.repeats)]
        line = BaselineLine(
            case_id=case.case_id,
            started_at=now,
            finished_at=now,
            output_throughput=calls,
            cached_tokens=[0] * len(calls),
        )
        out.write(line.model_dump_json() + "\n")
        out.flush()
turns.close()
