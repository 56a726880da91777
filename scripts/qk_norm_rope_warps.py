"""qk_norm_rope / mrope kernel time on the current GPU by num_warps (2, 4, 8) at the bench shape
(T=16384, 32 q / 8 k heads, D=128, bf16), replayed from a CUDA graph of 20 calls (per call),
% of copy. The shipped choice is ext_tiles' warps (4 at this shape).

Usage: python scripts/qk_norm_rope_warps.py
"""
from __future__ import annotations

import torch

import kernelset as ks
from kernelset.bench.timing import copy_bandwidth_gbs, cuda_time_ms, capture
from kernelset.ops.rope import launch


def main() -> None:
    dev = torch.device("cuda")
    copy = copy_bandwidth_gbs(dev)
    t, hq, hk, d = 16384, 32, 8, 128
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d)
    f = torch.outer(torch.arange(4096, device=dev, dtype=torch.float32), inv)
    cache = torch.cat([f.cos(), f.sin()], -1)
    pos = torch.randint(0, 4096, (t,), device=dev)
    pos3 = torch.randint(0, 4096, (3, t), device=dev)
    q = torch.randn(t, hq, d, dtype=torch.bfloat16, device=dev)
    k = torch.randn(t, hk, d, dtype=torch.bfloat16, device=dev)
    qw = torch.randn(d, dtype=torch.bfloat16, device=dev)
    kw = torch.randn(d, dtype=torch.bfloat16, device=dev)
    nbytes = 2 * t * (hq + hk) * d * 2 + t * d * 4
    orig = launch.ext_tiles
    shipped = orig.__wrapped__
    print(f"{torch.cuda.get_device_name(dev)}, copy {copy:.0f} GB/s")
    for warps in (2, 4, 8):
        def tiles(*a, _w=warps):
            b1, b2, br, bt, _, nb1, nb = shipped(*a)
            return b1, b2, br, bt, _w, nb1, nb
        launch.ext_tiles = tiles
        for name, fn in (("qk_norm_rope", lambda: ks.qk_norm_rope(q, k, qw, kw, cache, pos)),
                         ("mrope", lambda: ks.mrope(pos3, q, k, cache, [16, 24, 24]))):
            g = capture(fn, 20)
            ms = cuda_time_ms(g.replay, warmup=3, reps=30) / 20
            print(f"  {name:13s} warps={warps}: {ms * 1e3:6.1f} us, {nbytes / ms / 1e6 / copy * 100:5.1f}% of copy")
    launch.ext_tiles = orig


if __name__ == "__main__":
    main()
