"""qk_norm_rope / mrope kernel time on the current GPU by form and num_warps at the bench shape
(T=16384, 32 q / 8 k heads, D=128, bf16) and at 32/4 heads (Qwen3-30B-A3B), replayed from a CUDA
graph of 20 calls (per call), % of copy: the (token, head block) grid at 2, 4, 8 warps and one
program per token for q and k (QK_ONE) at 2, 4, 8. ext_tiles' choice is marked.

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
    for hq, hk in ((32, 8), (32, 4)):
        shape(dev, copy, 16384, hq, hk, 128)


def shape(dev, copy, t, hq, hk, d) -> None:
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d)
    f = torch.outer(torch.arange(t, device=dev, dtype=torch.float32), inv)
    cache = torch.cat([f.cos(), f.sin()], -1)
    pos = torch.randperm(t, device=dev)  # distinct positions: every cache row read from HBM, as counted
    pos3 = torch.stack([torch.randperm(t, device=dev) for _ in range(3)])
    q = torch.randn(t, hq, d, dtype=torch.bfloat16, device=dev)
    k = torch.randn(t, hk, d, dtype=torch.bfloat16, device=dev)
    qw = torch.randn(d, dtype=torch.bfloat16, device=dev)
    kw = torch.randn(d, dtype=torch.bfloat16, device=dev)
    nbytes = 2 * t * (hq + hk) * d * 2 + t * d * 4 + t * 8
    orig = launch.ext_tiles
    shipped = orig.__wrapped__
    print(f"{torch.cuda.get_device_name(dev)}, copy {copy:.0f} GB/s; {hq}/{hk} heads, D={d}, T={t}")
    for qk_one in (0, 1):
        for warps in (2, 4, 8):
            def tiles(*a, _w=warps, _one=qk_one):
                b1, b2, br, bt = shipped(*a)[:4]
                if _one:
                    return b1, b2, br, bt, _w, 1, 1, 1
                nb1 = -(-a[0] // b1)
                return b1, b2, br, bt, _w, nb1, nb1 + -(-a[1] // b2), 0
            launch.ext_tiles = tiles
            for name, norm, fn in (("qk_norm_rope", True, lambda: ks.qk_norm_rope(q, k, qw, kw, cache, pos)),
                                   ("mrope", False, lambda: ks.mrope(pos3, q, k, cache, [16, 24, 24]))):
                w, one = shipped(hq, hk, d, d // 2, norm)[4::3]
                mark = " (ext_tiles' choice)" if (w, one) == (warps, qk_one) else ""
                g = capture(fn, 20)
                ms = cuda_time_ms(g.replay, warmup=3, reps=30) / 20
                print(f"  {name:13s} {'qk_one' if qk_one else 'grid  '} warps={warps}: {ms * 1e3:6.1f} us, "
                      f"{nbytes / ms / 1e6 / copy * 100:5.1f}% of copy{mark}")
    launch.ext_tiles = orig


if __name__ == "__main__":
    main()
