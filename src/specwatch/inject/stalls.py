"""The planted decode slowdowns (``slow-verify-*``): a fixed cost added to every EAGLE verify step,
outputs and acceptance unchanged, in two kinds a maintainer's change can cost.

* Host time (``SLOW_VERIFY_US``): the scheduler's thread spins. Where the step is bound by the GPU
  and SGLang's overlap scheduler runs the host ahead of it (8b on the H200), a host stall shorter
  than the host's slack costs nothing: under ``slow-verify-500us`` 8b's batch-1 step took 7.886 ms
  (``da5dc8f2c251@20261203T075650Z``), clean 7.883 ms (``da5dc8f2c251@20261203T074546Z``).
* GPU time (``SLOW_VERIFY_GPU_US``): ``torch.cuda._sleep`` queued on the verify step's stream, so
  the step's kernels wait for it however far ahead the host runs.
"""

from __future__ import annotations

import functools

NULL_SLOWDOWN = "slow-verify-0us"
"""The null fault: the slowdowns' edit with no time added."""

NULL_GPU_SLOWDOWN = "slow-verify-gpu-0us"
"""The GPU slowdowns' null fault: their edit, nothing queued. A second null beside
``slow-verify-0us``: a run with ``--fault none --fault slow-verify-0us --fault slow-verify-gpu-0us``
gives three A/A pairs, enough for a class's held-out false-positive rate (``analysis.floor``)."""

NULL_SLOWDOWNS: tuple[str, ...] = (NULL_SLOWDOWN, NULL_GPU_SLOWDOWN)
"""Every null fault: the edit of a planted slowdown with no time added."""

SLOW_VERIFY_US: dict[str, int] = {
    NULL_SLOWDOWN: 0,
    "slow-verify-100us": 100,
    "slow-verify-150us": 150,
    "slow-verify-500us": 500,
    "slow-verify-2000us": 2000,
}
"""Host-time slowdowns, by fault name -> microseconds the scheduler spins per EAGLE verify step
(the tiny oracle's steps take about 3-8 ms on the H200, so 100, 500 and 2000 µs are about 2%, 10% and
40%; its EAGLE chain step at batch 8 took 2.8 ms on an H100 host, ``bf707c02b1ca`` in run
``20261206T021311Z-d11376``, where 150 µs is about 5%).
``slow-verify-0us`` is the null fault: the same edit, its hit counted, no time added; interleaved
with a clean pass (``--fault none --fault slow-verify-0us``) it gives A/A pairs timed as a fault
pair is (``run.interleave``)."""

SLOW_VERIFY_GPU_US: dict[str, int] = {
    NULL_GPU_SLOWDOWN: 0,
    "slow-verify-gpu-100us": 100,
    "slow-verify-gpu-150us": 150,
    "slow-verify-gpu-250us": 250,
    "slow-verify-gpu-500us": 500,
    "slow-verify-gpu-2000us": 2000,
}
"""GPU-time slowdowns, by fault name -> microseconds of GPU time queued per EAGLE verify step
(8b's steps take 7.9 ms at batch 1 and 9.8 ms at batch 8 on the H200: 500 µs is 6.3% and 5.1%;
the tiny oracle's EAGLE chain steps take 4.2 ms at batch 8 and 5.4 ms at batch 16 in
``timing`` run ``20261202T061432Z-9222c9``: 250 µs is 5.9% and 4.6%; at batch 16 on an H100 host its
fast steps, ``sglang_step_time_p10``, took 2.97-2.99 ms in ``8fa79f993a7d@20261206T224223Z``: 150 µs
is 5.0%)."""

CALIBRATION_CYCLES = 2_000_000
"""GPU clock cycles of one calibration sleep (about 1 ms on an H200)."""


def stall(micros: int) -> None:
    """Spin for ``micros`` microseconds on the calling thread (``time.sleep`` overshoots at this scale)."""
    if micros <= 0:
        return
    import time

    end = time.perf_counter() + micros / 1e6
    while time.perf_counter() < end:
        pass


def gpu_stall(micros: int) -> None:
    """Queue ``micros`` microseconds of GPU time on the current CUDA stream (the host does not wait);
    nothing for 0 (the null fault), while that stream is being captured into a CUDA graph, or
    without CUDA."""
    if micros <= 0:
        return
    import torch

    if not torch.cuda.is_available() or torch.cuda.is_current_stream_capturing():
        return
    torch.cuda._sleep(max(1, round(micros * cycles_per_us())))


CALIBRATION_ROUNDS = 5
"""Timed calibration sleeps; their median is kept (a GPU whose clock is still ramping up from
idle reads slow on the first ones)."""


@functools.cache
def cycles_per_us() -> float:
    """The current GPU's ``torch.cuda._sleep`` cycles per microsecond: the median of
    ``CALIBRATION_ROUNDS`` sleeps of ``CALIBRATION_CYCLES`` timed with CUDA events, once per process."""
    import statistics

    import torch

    torch.cuda._sleep(CALIBRATION_CYCLES // 10)  # the first launch loads the kernel
    rates = []
    for _ in range(CALIBRATION_ROUNDS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(CALIBRATION_CYCLES)
        end.record()
        end.synchronize()
        rates.append(CALIBRATION_CYCLES / (start.elapsed_time(end) * 1000.0))
    return statistics.median(rates)


def stall_statement(name: str) -> str:
    """The statement a ``slow-verify-*`` edit adds to each verify step (host spin or GPU sleep)."""
    if name in SLOW_VERIFY_GPU_US:
        return f'__import__("specwatch.inject.stalls", fromlist=["gpu_stall"]).gpu_stall({SLOW_VERIFY_GPU_US[name]})'
    return f'__import__("specwatch.inject.stalls", fromlist=["stall"]).stall({SLOW_VERIFY_US[name]})'


SLOW_VERIFY: tuple[str, ...] = (*SLOW_VERIFY_US, *SLOW_VERIFY_GPU_US)
"""Every planted slowdown's fault name."""
