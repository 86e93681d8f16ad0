"""The GPU-time planted slowdown on a real GPU: ``gpu_stall`` queues its microseconds on the current
stream, and work queued after it (a CUDA graph's replay, as SGLang's verify step runs) waits for it.
Needs CUDA only (no SGLang): skipped without a GPU."""

import pytest

from specwatch.inject import stalls

pytestmark = pytest.mark.gpu


def _elapsed_ms(work) -> float:
    """Milliseconds of GPU time between events recorded around ``work()`` on the current stream."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    work()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def test_the_gpu_slowdown_takes_its_microseconds_of_gpu_time():
    stalls.gpu_stall(100)  # calibrates
    assert 1.8 <= _elapsed_ms(lambda: stalls.gpu_stall(2000)) <= 2.5


def test_a_cuda_graph_replayed_after_the_slowdown_on_a_side_stream_finishes_that_much_later():
    """The verify step's shape: a captured graph replayed on a non-default stream (SGLang's forward
    stream), the stall queued just before it, the host never waiting."""
    import time

    import torch

    stalls.gpu_stall(100)  # calibrates
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            b = a @ a  # warm-up before capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(8):
                b = b @ a
        torch.cuda.synchronize()

        def step(micros: int) -> tuple[float, float]:
            """GPU milliseconds of stall plus replay, and host seconds the stall call took."""
            host = []

            def work():
                t = time.perf_counter()
                stalls.gpu_stall(micros)
                host.append(time.perf_counter() - t)
                graph.replay()

            return _elapsed_ms(work), host[0]

        clean = sorted(step(0)[0] for _ in range(21))[10]
        slowed = sorted(step(500) for _ in range(21))
    added = slowed[10][0] - clean
    host_s = sorted(s for _, s in slowed)[10]
    assert 0.45 <= added <= 0.6, (clean, slowed[10])
    assert host_s < 0.00025, host_s  # queued: the median call returned in under half the stall
