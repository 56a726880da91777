"""Per-call times of the norm backward at one width (GPU): is the split backward's spread between
runs per call (some calls slow) or per process? Times each call with its own CUDA events.

    python scripts/split_jitter.py [m] [n] [calls]
"""
from __future__ import annotations

import dataclasses
import statistics
import sys

import torch

import kernelset as ks
from kernelset.ops.norm import launch as L
from kernelset.ops.norm import policy


def main() -> None:
    m, n, calls = (int(a) for a in (sys.argv[1:] + ["8192", "16384", "60"][len(sys.argv) - 1:])[:3])
    dev = torch.device("cuda")
    x = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, device=dev, dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    xf = x.float()
    mean = xf.mean(-1)
    rstd = torch.rsqrt(xf.pow(2).mean(-1) + 1e-6)
    lrstd = torch.rsqrt(xf.var(-1, unbiased=False) + 1e-5)
    del xf
    base = policy.active()
    forms = {"split": base,
             "split x8": dataclasses.replace(base, split_blocks_bwd=8, split_blocks_bwd_wide=8),
             "looped": dataclasses.replace(base, split_chunk_bwd=0)}
    print(f"{torch.cuda.get_device_name()}: norm backward {m}x{n} bf16, {calls} calls each, ms per call", flush=True)

    def call(rms):
        if rms:
            L.norm_bwd(dy, x, w, None, rstd, is_rms=True, gemma_cast=False, has_bias=False)
        else:
            L.norm_bwd(dy, x, w, mean, lrstd, is_rms=False, gemma_cast=True, has_bias=True)
    for rnd, rms in ((0, True), (1, True), (2, False), (3, False)):
        for name, tun in forms.items():
            with policy.use(tun):
                for _ in range(5):
                    call(rms)
                torch.cuda.synchronize()
                ts = []
                for _ in range(calls):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    call(rms)
                    b.record()
                    ts.append((a, b))
                torch.cuda.synchronize()
                t = sorted(a.elapsed_time(b) for a, b in ts)
                q = lambda f: t[min(len(t) - 1, int(f * len(t)))]
                print(f"  round {rnd} {'rms' if rms else 'ln':3s} {name:8s} min {t[0]:.4f} p25 {q(.25):.4f} median {q(.5):.4f} p75 {q(.75):.4f} "
                      f"max {t[-1]:.4f}", flush=True)
    # the kernel alone, from the profiler (split: zeroing + split kernel + torch sum)
    from torch.profiler import ProfilerActivity, profile
    for name, tun in forms.items():
        with policy.use(tun), profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                call(True)
            torch.cuda.synchronize()
        print(f"-- {name}")
        for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:4]:
            print(f"   {e.key[:60]:60s} n={e.count:3d} avg {e.device_time_total / max(1, e.count) / 1e3:.4f} ms")


if __name__ == "__main__":
    main()
