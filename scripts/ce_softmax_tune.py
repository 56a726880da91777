"""Sweep the launch knobs of the looped cross-entropy and softmax kernels on a GPU (block, warps,
programs per SM) at the issue's bar shapes; prints % of copy bandwidth per configuration.
Usage (GPU machine): python scripts/ce_softmax_tune.py [ce] [softmax]  (both by default)"""
from __future__ import annotations

import dataclasses
import itertools
import sys

import torch

import kernelset as ks
from kernelset.bench import timing
from kernelset.ops.loss import launch as ce_launch
from kernelset.ops.softmax import launch as sm_launch


def main() -> None:
    which = set(sys.argv[1:]) or {"ce", "softmax"}
    dev = torch.device("cuda")
    copy = timing.copy_bandwidth_gbs(dev)
    print(f"{torch.cuda.get_device_name()} copy {copy:.0f} GB/s")
    grid = list(itertools.product((8192, 16384, 32768), (16, 32), (2, 4)))
    m, v = 8192, 128256
    if "ce" in which:
        tune_ce(dev, copy, grid, m, v)
    if "softmax" in which:
        tune_softmax(dev, copy, grid)


def tune_ce(dev, copy, grid, m, v):
    x = torch.randn(m, v, device=dev, dtype=torch.bfloat16, requires_grad=True)
    t = torch.randint(0, v, (m,), device=dev)
    nbytes = 2 * m * v * 2  # read logits, write dlogits
    rows = []
    for (block, warps, pps), ept in itertools.product(grid, (8, 16)):
        cfg = dataclasses.replace(ce_launch.CETuning(), block=block, num_warps=warps, programs_per_sm=pps, ept=ept)
        with ce_launch.use(cfg):
            fn = lambda: torch.autograd.grad(ks.cross_entropy(x, t), (x,))  # noqa: E731
            try:
                ms = timing.cuda_time_ms(fn, warmup=3, reps=20, min_ms=30)
            except Exception as exc:
                print("ce", block, warps, pps, "failed", type(exc).__name__)
                continue
        rows.append((100 * nbytes / ms / 1e6 / copy, block, warps, pps, ept))
        print(f"ce fwd+bwd 8192x128256 block {block:5d} warps {warps:2d} progs/SM {pps} ept {ept}: {ms:.3f} ms "
              f"{rows[-1][0]:.1f}%", flush=True)
    print("ce best:", sorted(rows, reverse=True)[:3])
    with torch.no_grad():
        for block, warps in itertools.product((8192, 16384, 32768), (4, 8, 16)):
            cfg = dataclasses.replace(ce_launch.CETuning(), block_fwd=block, num_warps_fwd=warps)
            with ce_launch.use(cfg):
                ms = timing.cuda_time_ms(lambda: ks.cross_entropy(x, t), warmup=3, reps=20, min_ms=30)
            print(f"ce fwd only block {block:5d} warps {warps:2d}: {ms:.3f} ms {100 * m * v * 2 / ms / 1e6 / copy:.1f}%")


def tune_softmax(dev, copy, grid):
    for shape, mode in (((4096, 131072), "fwd"), ((4096, 131072), "fwd+bwd")):
        xs = torch.randn(*shape, device=dev, dtype=torch.bfloat16, requires_grad=mode != "fwd")
        gy = torch.randn_like(xs)
        nbytes = xs.numel() * 2 * (2 if mode == "fwd" else 5)
        best = []
        for block, warps, pps in grid:
            cfg = dataclasses.replace(sm_launch.SoftmaxTuning(), looped_block=block, looped_warps=warps,
                                      looped_programs_per_sm=pps)
            with sm_launch.use(cfg):
                if mode == "fwd":
                    fn = lambda: ks.softmax(xs)  # noqa: E731
                else:
                    fn = lambda: torch.autograd.grad(ks.softmax(xs), (xs,), gy)  # noqa: E731
                try:
                    ms = timing.cuda_time_ms(fn, warmup=3, reps=20, min_ms=30)
                except Exception as exc:
                    print("softmax", block, warps, pps, "failed", type(exc).__name__)
                    continue
            best.append((100 * nbytes / ms / 1e6 / copy, block, warps, pps))
            print(f"softmax {mode} {shape} block {block:5d} warps {warps:2d} progs/SM {pps}: {ms:.3f} ms "
                  f"{best[-1][0]:.1f}%", flush=True)
        print(f"softmax {mode} best:", sorted(best, reverse=True)[:3])


if __name__ == "__main__":
    main()
