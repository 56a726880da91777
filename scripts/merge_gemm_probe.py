"""Separate vs merged projection GEMMs at Llama-3-8B shapes (GPU): does one GEMM for q/k/v
(4096+1024+1024 columns) or gate/up (2 x 14336) beat the separate ones?

    python scripts/merge_gemm_probe.py

Per token count T (1, 32, 2048) and group: GPU time per layer from a CUDA graph replaying 8
layers with distinct weights (weights not L2-resident), and eager wall time per layer over 200
un-synchronized calls (the host's launch rate where it sets the pace). Median of 5 interleaved rounds.
"""
from __future__ import annotations

import statistics
import time

import torch
from torch.nn import functional as F

from kernelset.bench.timing import capture

GROUPS = {"qkv": (4096, 1024, 1024), "gate_up": (14336, 14336)}
LAYERS = 8


def graph_ms(fn) -> float:
    g = capture(fn)
    for _ in range(3):
        g.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(20):
        g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 20 / LAYERS


def eager_us(fn, calls: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls // LAYERS):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / (calls // LAYERS * LAYERS) * 1e6


def main() -> None:
    dev, dt, hid = torch.device("cuda"), torch.bfloat16, 4096
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for name, outs in GROUPS.items():
        ws = [[torch.randn(n, hid, device=dev, dtype=dt) * 0.02 for n in outs] for _ in range(LAYERS)]
        wm = [torch.cat(w) for w in ws]
        for t in (1, 32, 2048):
            x = torch.randn(t, hid, device=dev, dtype=dt)

            def sep():
                return [[F.linear(x, w) for w in layer] for layer in ws]

            def mer():
                return [F.linear(x, w).split(outs, -1) for w in wm]
            res = {"sep_gpu": [], "mer_gpu": [], "sep_host": [], "mer_host": []}
            for _ in range(5):
                res["sep_gpu"].append(graph_ms(sep) * 1e3)
                res["mer_gpu"].append(graph_ms(mer) * 1e3)
                res["sep_host"].append(eager_us(sep))
                res["mer_host"].append(eager_us(mer))
            m = {k: statistics.median(v) for k, v in res.items()}
            same = torch.equal(torch.cat([F.linear(x, w) for w in ws[0]], -1), F.linear(x, wm[0]))
            print(f"{name:8s} T={t:5d}: GPU per layer separate {m['sep_gpu']:8.1f} us, merged {m['mer_gpu']:8.1f} us "
                  f"({m['sep_gpu'] / m['mer_gpu']:.2f}x); eager per layer separate {m['sep_host']:7.1f} us, merged "
                  f"{m['mer_host']:7.1f} us ({m['sep_host'] / m['mer_host']:.2f}x); bits equal {same}", flush=True)


if __name__ == "__main__":
    main()
