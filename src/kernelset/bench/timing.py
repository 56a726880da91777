"""Timing and ceilings on a CUDA device: events after warm-up, median of many runs."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def cuda_time_ms(fn: Callable[[], object], *, warmup: int = 10, reps: int = 50, min_ms: float = 150.0) -> float:
    """Median device time of one call of ``fn`` in ms, each call between its own event pair.

    Warm-up runs first (compilation, autotuning, allocator). Calls are queued back to back and
    synchronized once per batch, as a training or serving loop runs them: host overhead is hidden
    when it is shorter than the kernels (``host_us_per_call`` measures it separately). Batches
    repeat until ``reps`` calls and ``min_ms`` of timed work.
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times: list[float] = []
    while len(times) < reps or sum(times) < min_ms:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        times += [s.elapsed_time(e) for s, e in events]
        if len(times) >= 20 * reps:
            break
    return statistics.median(times)


def copy_bandwidth_gbs(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy of ``nbytes``: (bytes read + bytes written) / time, GB/s."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = cuda_time_ms(lambda: dst.copy_(src), warmup=5, reps=30)
    return 2 * nbytes / ms / 1e6


def matmul_tflops(device: torch.device, n: int = 8192, dtype: torch.dtype = torch.bfloat16) -> float:
    """Dense n^3 matrix product on random data (never zeros), TFLOP/s."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ms = cuda_time_ms(lambda: a @ b, warmup=5, reps=20)
    return 2 * n**3 / ms / 1e9


def host_us_per_call(fn: Callable[[], object], *, calls: int = 2000) -> float:
    """Wall-clock host time per eager call (small ops: the GPU keeps up, launch cost dominates)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def capture(fn: Callable[[], object], calls: int = 1) -> "torch.cuda.CUDAGraph":
    """``calls`` calls of ``fn`` captured in one CUDA graph, after a warm-up on a side stream."""
    return capture_outputs(fn, calls)[0]


def capture_outputs(fn: Callable[[], object], calls: int = 1) -> tuple["torch.cuda.CUDAGraph", object]:
    """(the graph of ``calls`` captured calls of ``fn``, what the last captured call returned: the
    graph's static outputs, which each replay rewrites)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    out = None
    with torch.cuda.graph(graph):
        for _ in range(calls):
            out = fn()
    return graph, out


def graph_replay_us(fn: Callable[[], object], *, calls_in_graph: int = 100, replays: int = 50) -> tuple[float, float]:
    """(us per call when ``calls_in_graph`` calls replay from one CUDA graph, us of kernel time per call).

    Kernel time comes from the profiler's device-side kernel durations of one replay.
    """
    graph = capture(fn, calls_in_graph)
    graph.replay()
    torch.cuda.synchronize()
    ms = cuda_time_ms(graph.replay, warmup=3, reps=replays, min_ms=50.0)
    per_call = ms * 1e3 / calls_in_graph
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernel_us = sum(getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0) for e in prof.events()
                    if e.device_type == torch.autograd.DeviceType.CUDA) / calls_in_graph
    return per_call, kernel_us
