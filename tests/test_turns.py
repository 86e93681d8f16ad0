"""Turns between the probed worker and a paired plain loop (``core.turns``): one unit of engine work
each, in turn, until one ends; then the other runs on alone."""

import os
import subprocess
import sys
import textwrap

import pytest

from specwatch.core.turns import SIDE_A, SIDE_B, TOKEN, TurnPipes, Turns, ends_arg

CHILD = textwrap.dedent(
    """
    import sys, time
    from specwatch.core.turns import Turns
    name, ends, units, log = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    turns = Turns.parse(ends)
    for i in range(units):
        with turns.hold():
            with turns.hold():  # a unit inside a held one keeps the turn
                t0 = time.time()
                time.sleep(0.01)
            with open(log, "a") as f:
                f.write(f"{name} {i} {t0} {time.time()}\\n")
    turns.close()
    """
)


@pytest.fixture
def recorded():
    """This process's turns replaced by one that records each take and hand-on (restored after)."""
    from specwatch.core.turns import process_turns, use

    seen = []

    class Recording(Turns):
        def _take(self):
            seen.append("take")

        def _hand_on(self):
            seen.append("hand on")

    previous = process_turns()
    use(Recording())
    yield seen
    use(previous)


class Scripted(Turns):
    """A side whose takes read ``script`` (then plain turns; ``b""``: the other process ended) and
    whose hand-ons are recorded in ``sent``; ``queued``: what the leader said before."""

    def __init__(self, side, script=(), queued=()):
        super().__init__(None, None, side)
        self.alone, self.script, self.sent = False, list(script), []
        self.from_lead = list(queued)

    def _take(self):
        got = self.script.pop(0) if self.script else TOKEN
        if not got:
            self.alone = True
        elif got != TOKEN and self.side == SIDE_B:
            self.from_lead.append(got)

    def _hand_on(self):
        self.sent.append(self.signal)
        self.signal = TOKEN


def _pair(tmp_path, probed_units, plain_units, first=SIDE_A, start=(SIDE_A, SIDE_B)):
    """Two children taking turns through one round's pipes (each child started only if in ``start``);
    their log lines in the order they were written."""
    log = tmp_path / "turns.log"
    pipes, procs = TurnPipes(first=first), []
    for side, units in ((SIDE_A, probed_units), (SIDE_B, plain_units)):
        if side in start:
            ends = pipes.take(side)
            cmd = [sys.executable, "-c", CHILD, side, ",".join(map(str, ends)), str(units), str(log)]
            procs.append(subprocess.Popen(cmd, pass_fds=ends))
        pipes.started(side)
    for p in procs:
        assert p.wait(timeout=60) == 0
    return [line.split()[0] for line in log.read_text().splitlines()]


def test_two_processes_alternate_unit_by_unit_and_the_longer_one_runs_on_alone(tmp_path):
    assert _pair(tmp_path, 3, 3) == [SIDE_A, SIDE_B] * 3
    (tmp_path / "turns.log").unlink()
    assert _pair(tmp_path, 2, 4, first=SIDE_B) == [SIDE_B, SIDE_A, SIDE_B, SIDE_A, SIDE_B, SIDE_B]


def test_a_side_that_never_starts_leaves_the_other_alone(tmp_path):
    assert _pair(tmp_path, 3, 0, first=SIDE_B, start=(SIDE_A,)) == [SIDE_A] * 3


def test_ends_are_given_once_and_a_process_without_ends_never_waits():
    pipes = TurnPipes()
    assert pipes.take(SIDE_A) is not None and pipes.take(SIDE_A) is None  # a restarted worker: no turns
    pipes.close()
    assert pipes.take(SIDE_B) is None
    alone = Turns.parse(None)
    with alone.hold():
        pass
    assert alone.alone and not alone.paired and alone.units == 1
    r, w = os.pipe()
    os.close(w)
    ended = Turns(r, None)  # the other side's write end is gone: end-of-file, then alone
    with ended.hold():
        pass
    assert ended.paired and ended.alone and ended.details() == {"units": 1, "waited_s": ended.details()["waited_s"]}
    ended.close()


def test_each_timed_batch_of_a_repeat_loop_is_one_turn_and_the_warm_up_another(recorded):
    """The worker's and the plain loop's timed batches each take a turn of the process's turns
    (``RepeatLoop.run``), and ``run_case``'s warm-up with the window's start one more."""
    from specwatch.worker.measure import run_case
    from specwatch.worker.windows import RepeatLoop, RepeatPlan
    from test_timing_noise import CASE, SteppingEngine

    samples = []
    RepeatLoop(RepeatPlan(3)).run(lambda: samples.append(1.0) or 1.0, lambda: samples, None)
    assert recorded == ["take", "hand on"] * 3
    recorded.clear()
    run_case(SteppingEngine(CASE), CASE, repeats=2, warmup=True, before_timed=lambda: recorded.append("start"))
    assert recorded == ["take", "start", "hand on", "take", "hand on", "take", "hand on"]


def test_the_plain_loop_takes_a_turn_for_its_warm_up_each_timed_call_and_its_step_window(recorded):
    from specwatch.rules.release_step_times import step_time_source
    from specwatch.worker import step_times
    from specwatch.worker.baseline import plain_loop
    from specwatch.worker.windows import RepeatPlan
    from test_timing_noise import CASE, SteppingEngine

    eng = SteppingEngine(CASE)
    out = plain_loop(eng, CASE, repeats=2, window=step_times.StepWindow(eng, "0.5.17", step_time_source("0.5.17")))
    assert len(out["output_throughput"]) == 2 and "sglang_step_times" in out
    assert recorded == ["take", "hand on"] * 4  # warm-up and window start, two timed calls, the window's read
    recorded.clear()
    out = plain_loop(SteppingEngine(CASE), CASE, repeats=3, plan=RepeatPlan(3, min_timed_s=0.0))
    assert recorded == ["take", "hand on"] * 4  # windowed: each call a turn of the repeat loop
    assert out["windows_stopped_by"] == "repeats"  # its own windows: no leader to follow


def test_work_alongside_a_block_is_waited_for_stopped_when_the_block_raises_and_its_error_raised():
    import threading

    from specwatch.run.engine_starts import alongside

    done = threading.Event()
    with pytest.raises(KeyboardInterrupt):
        with alongside(lambda: done.wait(30), stop=done.set):
            raise KeyboardInterrupt  # Ctrl-C in the probed start: the paired process is stopped, not awaited
    assert done.is_set()

    def fails():
        raise RuntimeError("baseline launch failed")

    with pytest.raises(RuntimeError, match="baseline launch failed"):
        with alongside(fails):
            pass


def test_the_worker_takes_a_turn_for_a_cases_warm_up_each_timed_batch_and_its_reads_after(recorded, tmp_path):
    """``worker.main.run_one`` on a fake engine: the warm-up (with the step window's start) one turn,
    each timed batch one, the probe's reads and the window's read after the case one more."""
    from specwatch.core.protocol import WorkerSpec
    from specwatch.core.timing_lock import WorkerTimingLock
    from specwatch.worker.main import Engine, run_one
    from test_engine_worker import CASE, FakeEngine

    spec = WorkerSpec(cases=[CASE], repeats=2, warmup=True, models_dir=str(tmp_path), results=str(tmp_path / "r"))
    line = run_one(spec, Engine(FakeEngine(CASE), {}, [], 1.0, 0.0), CASE, WorkerTimingLock(None))
    assert line["status"] == "ok", line.get("log_tail")
    assert recorded == ["take", "hand on"] * 4
    assert "turns" not in line["details"]  # a process given no ends takes no turns worth recording
    from specwatch.core.turns import process_turns

    process_turns().paired = True  # as a worker given its round's ends is
    line = run_one(spec, Engine(FakeEngine(CASE), {}, [], 1.0, 0.0), CASE, WorkerTimingLock(None))
    assert line["details"]["turns"]["units"] == 8  # both cases' turns so far


def test_an_engine_goes_down_in_a_turn_of_its_own_even_when_its_shutdown_fails(recorded):
    from specwatch.core.turns import process_turns

    turns = process_turns()
    calls = []
    turns.last_unit(lambda: calls.append("shutdown"))
    assert calls == ["shutdown"] and recorded == ["take", "hand on"] and turns.alone

    def failing():
        raise RuntimeError("scheduler already gone")

    turns.last_unit(failing)  # the process is ending: its error is not the run's
    assert recorded == ["take", "hand on"] * 2


LOCKSTEP_CHILD = textwrap.dedent(
    """
    import json, sys
    from specwatch.core.turns import Turns, use
    from specwatch.worker.windows import RepeatLoop, RepeatPlan
    ends, decode_s, untimed, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    turns = use(Turns.parse(ends))
    for _ in range(untimed):  # units before the case's timed batches (a warm-up, reads of the scheduler)
        with turns.hold():
            pass
    loop, samples, windows = RepeatLoop(RepeatPlan(2, min_timed_s=3.0)), [], []
    loop.run(lambda: decode_s, lambda: [1.0] * len(windows), windows)
    turns.close()
    json.dump({"batches": loop.batches, "stopped_by": loop.stopped_by.value, "passed": turns.passed}, open(out, "w"))
    """
)


@pytest.mark.parametrize(
    "first, lead_untimed, passed", [(SIDE_A, 0, 0), (SIDE_B, 0, 1), (SIDE_A, 3, 3), (SIDE_B, 3, 4)]
)
def test_the_following_side_times_its_windows_and_repeats_with_the_leaders(tmp_path, first, lead_untimed, passed):
    """Side a's windows (1 s of decode a batch, 3 s a window) lead; side b's batches count 10 s each,
    so on its own it would end a window every batch. It hands turns straight back until the leader
    has timed its first batch (one for each unit the leader held before it), then ends its windows
    on the batch after the leader's ends and stops with the leader's last: the same batches each
    side whichever side took the first turn and however many untimed units the leader ran first."""
    import json

    pipes, procs = TurnPipes(first=first), []
    for side, decode_s, untimed in ((SIDE_A, 1.0, lead_untimed), (SIDE_B, 10.0, 0)):
        ends = pipes.take(side)
        cmd = [
            sys.executable,
            "-c",
            LOCKSTEP_CHILD,
            ends_arg(ends, side),
            str(decode_s),
            str(untimed),
            str(tmp_path / side),
        ]
        procs.append(subprocess.Popen(cmd, pass_fds=ends))
        pipes.started(side)
    for p in procs:
        assert p.wait(timeout=60) == 0
    got = {side: json.loads((tmp_path / side).read_text()) for side in (SIDE_A, SIDE_B)}
    assert got[SIDE_A] == {"batches": [3, 3], "stopped_by": "repeats", "passed": 0}
    assert got[SIDE_B] == {"batches": [3, 3], "stopped_by": "lead", "passed": passed}


def test_a_follower_whose_leader_ends_early_judges_its_own_windows():
    """The leader's end of file mid-case: the follower's windows end by its own plan from then on;
    an end the leader sent for an earlier case is dropped when the next case's loop begins."""
    from specwatch.core.turns import LAST_WINDOW, use
    from specwatch.worker.windows import RepeatLoop, RepeatPlan

    r, w = os.pipe()
    os.write(w, LAST_WINDOW)  # an earlier case's last end, read by the warm-up's turn
    os.close(w)
    follower = use(Turns(r, None, SIDE_B))
    with follower.hold():
        pass
    assert follower.from_lead == [LAST_WINDOW] and follower.following
    loop, windows = RepeatLoop(RepeatPlan(2, min_timed_s=3.0)), []
    loop.run(lambda: 1.0, lambda: [1.0] * len(windows), windows)
    assert follower.alone and loop.batches == [3, 3] and loop.stopped_by.value == "repeats"
    assert follower.from_lead == []
    follower.close()
    use(Turns())


def test_the_probed_worker_leads_and_the_plain_loop_follows_window_for_window():
    """The real loops: ``run_case`` on side a hands its window ends on with its turns (a plain turn
    for the warm-up, an end after each window's last batch, the last end after its last repeat);
    ``plain_loop`` on side b, whose own rule (``min_timed_s`` 0) would end a window every call, ends
    its windows on the calls the leader's ends came before and stops with the last; its first
    timed call waits for the turn the leader's first timed batch handed on."""
    from specwatch.core.turns import LAST_WINDOW, WINDOW_END, use
    from specwatch.worker.baseline import plain_loop
    from specwatch.worker.measure import run_case
    from specwatch.worker.windows import RepeatPlan
    from test_timing_noise import CASE, SteppingEngine

    leader = use(Scripted(SIDE_A))
    try:
        run_case(SteppingEngine(CASE), CASE, repeats=2, warmup=True, plan=RepeatPlan(2, min_timed_s=0.0))
        assert leader.sent == [TOKEN, WINDOW_END, LAST_WINDOW]
        # the turns the follower reads, each after a unit of the leader's: the first turn (its own
        # warm-up), the leader's warm-up (handed straight back), its two timed batches' ends
        follower = use(Scripted(SIDE_B, [TOKEN, TOKEN, WINDOW_END, LAST_WINDOW]))
        out = plain_loop(SteppingEngine(CASE), CASE, repeats=2, plan=RepeatPlan(2, min_timed_s=0.0))
        assert out["batches_per_repeat"] == [1, 1] and out["windows_stopped_by"] == "lead"
        assert follower.passed == 1 and follower.sent == [TOKEN] * 4
    finally:
        use(Turns())


def test_the_leaders_first_timed_batch_says_so_unless_it_ended_a_repeat():
    from specwatch.core.turns import LAST_WINDOW, WINDOW_END, WINDOW_START, use
    from specwatch.worker.windows import RepeatLoop, RepeatPlan

    try:
        for min_timed_s, sent in (
            (2.0, [WINDOW_START, WINDOW_END, TOKEN, LAST_WINDOW]),
            (1.0, [WINDOW_END, LAST_WINDOW]),  # the first batch's end says it began too
        ):
            leader = use(Scripted(SIDE_A))
            loop, windows = RepeatLoop(RepeatPlan(2, min_timed_s=min_timed_s)), []
            loop.run(lambda: 1.0, lambda w=windows: [1.0] * len(w), windows)
            assert leader.sent == sent
        leader, loop = use(Scripted(SIDE_A)), RepeatLoop(RepeatPlan(2))
        loop.run(lambda: 1.0, lambda: [1.0] * len(loop.batches), None)  # fixed repeats: no windows
        assert leader.sent == [TOKEN, TOKEN]
    finally:
        use(Turns())


@pytest.mark.parametrize(
    "queued, reads, kept, left",
    [
        ([b"e", b"w", b"e"], [b"t", b"s"], True, []),  # an earlier case's ends dropped; waits for the start
        ([b"e", b"s", b"w"], [], False, [b"w"]),  # the leader began first: its start is taken, nothing waited
        ([], [b"t", b"w"], True, [b"w"]),  # a first batch that ended a repeat starts the follower too
        ([], [b"t", b""], False, []),  # the leader ended: the follower goes on alone
    ],
)
def test_a_follower_waits_for_the_leaders_first_timed_batch_of_the_case(queued, reads, kept, left):
    follower = Scripted(SIDE_B, reads, queued)
    follower.wait_for_lead()
    assert follower._kept is kept and follower.from_lead == left and follower.script == []
    assert follower.passed == len(follower.sent) == max(len(reads) - 1, 0)
    with follower.hold():  # the kept turn serves the next unit; otherwise it takes one
        pass
    assert follower.units == 1 and not follower._kept
