"""The torch_order RMSNorm forward (transformers' RMSNorm bit for bit, what ``kernelize`` runs)
across launch shapes, against HF's module and F.rms_norm, bf16, % of copy.

Session 26: the kernel ran one warp per row with one 8-byte load per thread in flight at 32
lanes (16 rows and more): 20 us per 2048x4096 call in the 8B prefill on an H200 (40% of copy,
``prefill_gaps.py``). Now ROWS rows per program and UNROLL steps of each lane's sum loaded per
iteration (``NormTuning.torch_order_*``); this sweep picks the defaults. Each launch shape is
checked bitwise against HF's module before it is timed; every variant's calls replay from one
CUDA graph (at these sizes an eager loop times the host).

Usage: python scripts/torch_order_tune.py [--quick]   (--quick: the default, the old form, 16 and 32 steps)
"""
from __future__ import annotations

import itertools
import sys

import torch

from kernelset.bench.timing import capture, copy_bandwidth_gbs, cuda_time_ms
from kernelset.ops.norm import launch, policy

SHAPES = [(2048, 4096), (8192, 4096), (4096, 2048), (512, 4096), (2048, 5120), (32, 4096), (1, 4096), (2048, 8192),
          (512, 16384)]


def _hf(x, w, eps=1e-5):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def main() -> int:
    quick = "--quick" in sys.argv
    dev = torch.device("cuda")
    copy = copy_bandwidth_gbs(dev)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; copy {copy:.0f} GB/s")
    d = policy.DEFAULT_TUNING
    dflt = (d.torch_order_rows, d.torch_order_unroll, d.torch_order_elems_per_thread)
    grid = [(1, 1, 4)] + list(itertools.product((1, 2, 4, 8), (1, 2, 4, 8, 16, 32), (4, 8)))
    if quick:
        grid = [(1, 1, 4), dflt, (1, 16, 4), (1, 32, 4)]
    grid = list(dict.fromkeys([dflt] + grid))
    for m, n in SHAPES:
        x = torch.randn(m, n, device=dev).to(torch.bfloat16)
        w = (torch.randn(n, device=dev) * 0.3 + 1).to(torch.bfloat16)
        nbytes = 2 * x.numel() * 2 + n * 2
        want = _hf(x, w)
        reps = max(1, (256 << 20) // nbytes)  # calls per timing: more than L2 in all
        xs = [torch.randn_like(x) for _ in range(min(reps, 64))]

        def gbs(fn):  # the calls replayed from one CUDA graph: eager launches are host-bound here
            graph = capture(lambda: [fn(t) for t in xs])
            ms = cuda_time_ms(graph.replay, min_ms=60.0) / len(xs)
            return ms, nbytes / ms / 1e6

        ms_hf, g_hf = gbs(lambda t: _hf(t, w))
        ms_f, g_f = gbs(lambda t: torch.nn.functional.rms_norm(t, (n,), w, 1e-5))
        print(f"[{m}, {n}] HF module {ms_hf * 1e3:.1f} us {g_hf / copy:.1%}; F.rms_norm {ms_f * 1e3:.1f} us "
              f"{g_f / copy:.1%}")
        rows_out = []
        for rows, unroll, ept in grid:
            tun = policy.NormTuning(torch_order_rows=rows, torch_order_unroll=unroll,
                                    torch_order_elems_per_thread=ept)
            with policy.use(tun):
                y, _ = launch.rms_fwd_torch_order(x, w, eps=1e-5, offset=0.0, gemma_cast=False, stats=False)
                assert torch.equal(y, want), f"[{m}, {n}] rows {rows} unroll {unroll}: not HF's bits"
                ms, g = gbs(lambda t: launch.rms_fwd_torch_order(t, w, eps=1e-5, offset=0.0, gemma_cast=False,
                                                                stats=False))
                site = launch._torch_order_site(launch.torch_cuda_mean_block(m, n), n, True, False, False)
            rows_out.append((g, ms, rows, unroll, ept, site))
        rows_out.sort(reverse=True)
        old = next(r for r in rows_out if r[2:5] == (1, 1, 4))
        dr = next(r for r in rows_out if r[2:5] == dflt)
        for g, ms, rows, unroll, ept, site in rows_out[:6]:
            print(f"    rows {rows} unroll {unroll} ept {ept} (lanes, rows, unroll, warps = {site[:4]}): "
                  f"{ms * 1e3:.1f} us {g / copy:.1%}")
        print(f"    before (rows 1 unroll 1): {old[1] * 1e3:.1f} us {old[0] / copy:.1%}; default {dflt}: "
              f"{dr[1] * 1e3:.1f} us {dr[0] / copy:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
