"""Where the time of a norm forward+backward goes, kernel by kernel (torch.profiler, CUDA time),
and the host cost of one decode-size rms_norm call split into its stages.
``ab``: host time per call with and without the direct launch (KS_DIRECT_LAUNCH), interleaved in
one process (the lent host's speed drifts 2x between processes), medians of 15 rounds.
Usage (GPU machine): python scripts/norm_profile.py [kernels] [host] [steps] [ab]"""
from __future__ import annotations

import cProfile
import pstats
import sys
import time

import torch
import torch.nn.functional as F

import kernelset as ks
from kernelset.bench import timing


def kernels() -> None:
    dev = torch.device("cuda")
    copy = timing.copy_bandwidth_gbs(dev)
    print(f"{torch.cuda.get_device_name()} copy {copy:.0f} GB/s")
    for name, (m, n) in (("rms_norm", (32768, 4096)), ("rms_norm", (16384, 8192)), ("layer_norm", (16384, 8192))):
        x = torch.randn(m, n, device=dev, dtype=torch.bfloat16, requires_grad=True)
        w = (1 + 0.1 * torch.randn(n, device=dev)).to(torch.bfloat16).requires_grad_(True)
        b = (0.1 * torch.randn(n, device=dev)).to(torch.bfloat16).requires_grad_(True)
        dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        wrt = (x, w) if name == "rms_norm" else (x, w, b)

        def run():
            y = ks.rms_norm(x, w) if name == "rms_norm" else ks.layer_norm(x, w, b)
            return torch.autograd.grad(y, wrt, dy)
        ms = timing.cuda_time_ms(run, warmup=3, reps=30, min_ms=30)
        print(f"\n{name} {m}x{n} fwd+bwd eager: {ms:.3f} ms = {100 * 5 * m * n * 2 / ms / 1e6 / copy:.1f}% (5 passes)")
        t0 = time.perf_counter()
        for _ in range(20):
            run()
        host_ms = (time.perf_counter() - t0) / 20 * 1e3  # enqueue time per step (queue far from full)
        torch.cuda.synchronize()
        gms = timing.cuda_time_ms(timing.capture(run).replay, warmup=3, reps=30, min_ms=30)
        print(f"  CUDA graph: {gms:.3f} ms = {100 * 5 * m * n * 2 / gms / 1e6 / copy:.1f}%; host enqueue {host_ms:.3f} ms")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                                torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(10):
                run()
            torch.cuda.synchronize()
        for ev in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:8]:
            if ev.device_time_total > 0:
                print(f"  {ev.key[:70]:<70} {ev.device_time_total / 10:9.1f} us/iter  x{ev.count // 10}")
        print("  host side (self CPU time):")
        for ev in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:8]:
            print(f"  {ev.key[:70]:<70} {ev.self_cpu_time_total / 10:9.1f} us/iter  x{ev.count // 10}")


def host() -> None:
    dev = torch.device("cuda")
    x = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    w = torch.randn(4096, device=dev, dtype=torch.bfloat16)
    from kernelset.core import dispatch
    from kernelset.ops.norm import launch

    impl = dispatch.select("rms_norm", "auto", (x, w), {})
    y = torch.empty_like(x)
    kern = launch._fwd
    with torch.no_grad():
        rows = [
            ("ks.rms_norm", lambda: ks.rms_norm(x, w)),
            ("F.rms_norm", lambda: F.rms_norm(x, (4096,), w, 1e-6)),
            ("torch.empty_like(x)", lambda: torch.empty_like(x)),
            ("torch.empty x2 (y, rstd)", lambda: (torch.empty((1, 4096), dtype=x.dtype, device=dev),
                                                  torch.empty((1,), dtype=torch.float32, device=dev))),
            ("dispatch.select", lambda: dispatch.select("rms_norm", "auto", (x, w), {})),
            ("impl.forward", lambda: impl.forward(x, w, 1e-6, 0.0, False, False)),
            ("launch.norm_fwd", lambda: launch.norm_fwd(x, w, None, eps=1e-6, is_rms=True, gemma_cast=False,
                                                        stats=False)),
            ("FastKernel call", lambda: kern((1,), x, None, w, None, y, None, None, None, 1, 4096, 4096, 0, 4096, 0,
                                             1e-6, 0.0, IS_RMS=True, HAS_RESIDUAL=False, HAS_WEIGHT=True,
                                             HAS_BIAS=False, GEMMA_CAST=False, STORE_STATS=False, ROWS=1,
                                             BLOCK_N=4096, num_warps=8)),
        ]
        for label, fn in rows:
            print(f"  {label:<28} {timing.host_us_per_call(fn, calls=5000):7.2f} us")
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(20000):
            ks.rms_norm(x, w)
        pr.disable()
        torch.cuda.synchronize()
        pstats.Stats(pr).sort_stats("tottime").print_stats(22)


def steps() -> None:
    """Host time of the phases of one eager fwd+bwd step (no sync inside the loop), ours and
    F.rms_norm's, at 32768x4096 bf16; a synchronizing call inside the step is reported."""
    dev = torch.device("cuda")
    m, n = 32768, 4096
    x = torch.randn(m, n, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w = (1 + 0.1 * torch.randn(n, device=dev)).to(torch.bfloat16).requires_grad_(True)
    dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
    for label, fwd in (("ks.rms_norm", lambda: ks.rms_norm(x, w)),
                       ("F.rms_norm", lambda: F.rms_norm(x, (n,), w, 1e-6))):
        for _ in range(5):
            torch.autograd.grad(fwd(), (x, w), dy)
        torch.cuda.synchronize()
        tf = tb = 0.0
        k = 30
        for _ in range(k):
            t0 = time.perf_counter()
            y = fwd()
            t1 = time.perf_counter()
            torch.autograd.grad(y, (x, w), dy)
            tb += time.perf_counter() - t1
            tf += t1 - t0
            del y
        t2 = time.perf_counter()
        torch.cuda.synchronize()
        print(f"{label}: host fwd {tf / k * 1e6:.0f} us, grad {tb / k * 1e6:.0f} us per step; "
              f"final sync waited {(time.perf_counter() - t2) * 1e3:.2f} ms")
        torch.cuda.set_sync_debug_mode("warn")
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.autograd.grad(fwd(), (x, w), dy)
        torch.cuda.set_sync_debug_mode(0)
        print(f"  synchronizing calls in one step: {[str(c.message)[:120] for c in caught]}")
        print(f"  allocator: {torch.cuda.memory_stats().get('num_alloc_retries', 0)} retries, "
              f"{torch.cuda.memory_stats().get('num_device_alloc', 0)} device allocs, "
              f"{torch.cuda.memory_stats().get('num_device_free', 0)} device frees")
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(20):
            torch.autograd.grad(fwd(), (x, w), dy)
        pr.disable()
        torch.cuda.synchronize()
        pstats.Stats(pr).sort_stats("tottime").print_stats(12)


def ab() -> None:
    import statistics

    dev = torch.device("cuda")
    x = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    w = torch.randn(4096, device=dev, dtype=torch.bfloat16)
    r = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    g = torch.randn(1, 2 * 14336, device=dev, dtype=torch.bfloat16)
    cases = [("ks.rms_norm 1x4096", lambda: ks.rms_norm(x, w)),
             ("ks.fused_add_rms_norm 1x4096", lambda: ks.fused_add_rms_norm(x, r, w)),
             ("ks.silu_and_mul 1x28672", lambda: ks.silu_and_mul(g)),
             ("F.rms_norm 1x4096", lambda: F.rms_norm(x, (4096,), w, 1e-6))]
    times: dict = {}
    with torch.no_grad():
        for _ in range(15):
            for direct in (True, False):
                with ks.config.override(direct_launch=direct):
                    for label, fn in cases:
                        times.setdefault((label, direct), []).append(timing.host_us_per_call(fn, calls=1000))
    print(f"{'host us per eager call (median of 15 interleaved rounds)':<40} {'direct':>8} {'triton':>8}")
    for label, _ in cases:
        a, b = (statistics.median(times[(label, d)]) for d in (True, False))
        print(f"  {label:<38} {a:8.2f} {b:8.2f}")


if __name__ == "__main__":
    what = sys.argv[1:] or ["kernels", "host", "steps"]
    if "steps" in what:
        steps()
    if "kernels" in what:
        kernels()
    if "host" in what:
        host()
    if "ab" in what:
        ab()
