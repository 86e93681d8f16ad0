"""The fake worker's and fake baseline's units of "engine work" taken in turns (``core.turns``)."""

import os
import time

from specwatch.core.turns import process_turns


def turn_units(what: str) -> None:
    """FAKE_TURN_UNITS=N: N units, each in a turn of this process's turns (``process_turns``: the
    worker's from its environment, the baseline's from its command line), each logged to
    FAKE_TURNS_LOG as ``what``, its start and end, and the side the process was given (``-``: none)."""
    for _ in range(int(os.environ.get("FAKE_TURN_UNITS", "0"))):
        with process_turns().hold():
            t0 = time.time()
            time.sleep(0.02)
            with open(os.environ["FAKE_TURNS_LOG"], "a") as f:
                f.write(f"{what} {t0} {time.time()} {process_turns().side or '-'}\n")
