"""Which summation order torch's CUDA ``x.pow(2).mean(-1)`` uses on this machine (GPU), and
whether Triton's rsqrt equals torch's: the facts behind ``rms_norm(torch_order=True)``.

    python scripts/torch_order_probe.py
"""
from __future__ import annotations

import sys

import torch


def _emulate(xf: torch.Tensor, w: int, hy: int, first: str, tree: str) -> torch.Tensor:
    """Sum of squares per row, lanes L = x + y * w each over vectors L, L + w*hy, ... (4
    accumulators, ((a0 + a1) + a2) + a3), then the y tree (halving) and the x tree (shared-memory
    halving down to 32, then the warp's ``tree``), ``first`` of the two first."""
    m, n = xf.shape
    lanes = w * hy
    j = -(-n // (4 * lanes))
    sq = torch.nn.functional.pad(xf * xf, (0, j * 4 * lanes - n)).view(m, j, hy, w, 4)
    acc = torch.zeros(m, hy, w, 4, dtype=torch.float32, device=xf.device)
    for k in range(j):
        acc = acc + sq[:, k]
    t = ((acc[..., 0] + acc[..., 1]) + acc[..., 2]) + acc[..., 3]  # [m, hy, w]

    def y_reduce(t):
        while t.shape[1] > 1:
            h = t.shape[1] // 2
            t = t[:, :h] + t[:, h:]
        return t

    def x_reduce(t):
        while t.shape[2] > 32:
            h = t.shape[2] // 2
            t = t[:, :, :h] + t[:, :, h:]
        while t.shape[2] > 1:
            h = t.shape[2] // 2
            t = t[:, :, :h] + t[:, :, h:] if tree == "halving" else t[:, :, 0::2] + t[:, :, 1::2]
        return t

    t = x_reduce(y_reduce(t)) if first == "y" else y_reduce(x_reduce(t))
    return t[:, 0, 0]


def main() -> int:
    if not torch.cuda.is_available():
        print("torch_order_probe: no CUDA device")
        return 0
    import triton
    import triton.language as tl

    from kernelset.ops.norm import reference as R
    print(f"device {torch.cuda.get_device_name()}; torch {torch.__version__}; triton {triton.__version__}")
    g = torch.Generator(device="cuda").manual_seed(0)
    for tree in ("halving", "doubling"):
        bad = []
        for m in (1, 2, 3, 5, 8, 15, 16, 17, 100, 2048):
            for n in (132, 256, 1000, 2048, 3072, 4096, 5120, 8192, 16384):
                x = (torch.randn(m, n, device="cuda", generator=g)
                     * torch.exp2(torch.randint(-8, 8, (m, n), device="cuda", generator=g).float())).to(torch.bfloat16)
                xf = x.float()
                if R.torch_cuda_mean_lanes(m, n) is None:
                    continue  # a row split across warps: not claimed (torch's own ops run)
                got = R.torch_cuda_mean_sq(xf, warp_tree=tree)
                want = xf.pow(2).mean(-1)
                if not torch.equal(got, want):
                    bad.append(f"{m}x{n}:{int((got != want).sum())}")
        print(f"warp tree {tree}: {'every claimed shape equals torch' if not bad else 'differs at ' + ' '.join(bad)}")

    @triton.jit
    def rsqrt_kernel(X, Y, Z, N: tl.constexpr):
        i = tl.arange(0, N)
        v = tl.load(X + i)
        tl.store(Y + i, tl.rsqrt(v))
        tl.store(Z + i, 1.0 / tl.sqrt_rn(v))

    v = torch.rand(1 << 16, device="cuda", generator=g) * 100 + 1e-5
    y = torch.empty_like(v)
    z = torch.empty_like(v)
    rsqrt_kernel[(1,)](v, y, z, N=1 << 16)
    t = torch.rsqrt(v)
    print(f"tl.rsqrt == torch.rsqrt on {v.numel()} values: {int((y == t).sum())}; 1/sqrt_rn: {int((z == t).sum())}")

    # rows torch's reduce splits across the warps of a block (block W x Hy, both splitting the
    # row: 2+ rows of 8192-16384): which order its sum follows, among candidates (session 26)
    split = [(m, n) for m in (2, 3, 5, 15, 16, 17, 100, 2048) for n in (8192, 10240, 12288, 16384)]
    cands = {f"{first}-first, warp {tree}": (first, tree) for first in ("y", "x") for tree in ("halving", "doubling")}
    hits = {c: 0 for c in cands}
    for m, n in split:
        w_, hy = R.torch_cuda_reduce_block(m, n)
        x = (torch.randn(m, n, device="cuda", generator=g)
             * torch.exp2(torch.randint(-8, 8, (m, n), device="cuda", generator=g).float())).to(torch.bfloat16)
        xf = x.float()
        want = xf.pow(2).mean(-1)
        res = []
        for c, (first, tree) in cands.items():
            ok = torch.equal(_emulate(xf, w_, hy, first, tree) * R.torch_cuda_mean_factor(m, n), want)
            hits[c] += ok
            res.append(f"{c} {'==' if ok else '!='}")
        lanes = R.torch_cuda_mean_lanes(m, n)
        print(f"split {m}x{n} (block {w_} x {hy}; torch_cuda_mean_lanes {lanes}): {'; '.join(res)}")
    print("split shapes matched per candidate:", hits, "of", len(split))

    # what exactness costs: the torch-order kernel against the default one (device time)
    import kernelset as ks
    for m, n in ((1, 4096), (2048, 4096), (32768, 4096), (16384, 7168)):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        ms = {o: triton.testing.do_bench(lambda o=o: ks.rms_norm(x, w, torch_order=o, backend="triton"),
                                         return_mode="median") for o in (False, True)}
        gbs = 2 * x.numel() * 2 / (ms[True] * 1e-3) / 1e9
        print(f"rms_norm {m}x{n}: default {ms[False] * 1e3:.1f} us, torch_order {ms[True] * 1e3:.1f} us "
              f"({gbs:.0f} GB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
