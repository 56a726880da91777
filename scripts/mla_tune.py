"""Sweep the MLA decode launch knobs (heads per program, tokens per iteration, warps, stages,
split waves) on a GPU at the issue's bar shape and a TP slice; prints % of copy bandwidth (latent
cache bytes) and TFLOP/s per configuration, graph-replayed as serving engines run decode.
Usage (GPU machine): python scripts/mla_tune.py [--quick | --prefetch]
--prefetch: the block-table prefetch (MlaTuning.prefetch_pages) on and off at the tiles that stay in
contention (64 heads: 64 tokens x 2 stages, 32 x 2, 64 x 1)."""
from __future__ import annotations

import itertools
import sys

import torch

import kernelset as ks
from kernelset.bench import timing
from kernelset.ops.mla import launch as L
from kernelset.ops.mla.bench import ADAPTERS


def main() -> None:
    quick = "--quick" in sys.argv
    dev = torch.device("cuda")
    copy = timing.copy_bandwidth_gbs(dev)
    print(f"{torch.cuda.get_device_name()} copy {copy:.0f} GB/s")
    spec = ks.core.registry.op("mla_decode")
    space = [(bh, bn, w, st, waves, lazy) for bh, bn, w, st, waves, lazy in
             itertools.product((32, 64), (32, 64), (4, 8), (1, 2), (1.0, 2.0), (True, False))
             if w == (8 if bh == 64 else 4)]
    prefetch = "--prefetch" in sys.argv
    if quick:
        space = [c for c in space if c[0] == 64]
    if prefetch:
        space = [(64, bn, 8, st, 1.0, pf) for pf in (False, True) for bn, st in ((64, 2), (32, 2), (64, 1))]
    shapes = [(64, 4096, 128, 512, 64, 64, 16), (64, 4096, 128, 512, 64, 64, 8), (64, 4096, 16, 512, 64, 64, 16)]
    if prefetch:  # long contexts at a small batch: many splits
        shapes += [(4, 32768, 128, 512, 64, 64, 16), (1, 32768, 16, 512, 64, 64, 16)]
    for shape in shapes:
        inp = ADAPTERS["mla_decode"].inputs(shape, torch.bfloat16, dev, "fwd")
        ref = ADAPTERS["mla_decode"].reference(inp, "fwd")[0]
        cost = spec.cost(shape, torch.bfloat16, "fwd")
        rows = []
        for bh, bn, w, st, waves, lazy in space:
            if shape[2] <= 16:
                bh, w = 16, 4
            flag = {"prefetch_pages": lazy} if prefetch else {"lazy": lazy}  # the last axis of the space
            t = L.MlaTuning(block_h=bh, block_n=bn, num_warps=w, num_stages=st, waves=waves, **flag)
            with L.TUNING.use(t):
                fn = ADAPTERS["mla_decode"].ours(inp, "fwd", "triton")
                try:
                    out = fn()[0]
                    err = ((out.float() - ref).norm() / ref.norm()).item()
                    graph = timing.capture(fn, 20)
                    us = timing.cuda_time_ms(graph.replay, warmup=2, reps=10, min_ms=20.0) * 1e3 / 20
                except Exception as exc:  # out of shared memory etc.: reported, not fatal
                    print(f"  {shape} {t}: {type(exc).__name__} {str(exc)[:80]}")
                    continue
            gbs = cost.bytes / us / 1e3
            rows.append((us, bh, bn, w, st, waves, lazy, err, 100 * gbs / copy, cost.flops / us / 1e6))
        rows.sort()
        print(f"shape {shape}: best first (us, block_h, block_n, warps, stages, waves, "
              f"{'prefetch' if prefetch else 'lazy'}, rel_err, % copy, "
              "TFLOP/s)", flush=True)
        word = "prefetch" if prefetch else "lazy"
        for r in rows[:8]:
            print(("  %.1f us  h%d n%d w%d s%d waves%.0f " + word + " %d  err %.1e  %.1f%%  %.0f TFLOP/s") % r,
                  flush=True)


if __name__ == "__main__":
    main()
