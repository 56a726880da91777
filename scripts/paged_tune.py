"""Sweep the paged-attention decode knobs (keys per iteration, KV splits) on a GPU at the issue's
decode shapes, bf16 and fp8 caches; prints % of copy bandwidth (KV bytes) per configuration,
graph-replayed as serving engines run decode.
Usage (GPU machine): python scripts/paged_tune.py [fp8]  (fp8: only the B64 ctx4096 fp8-cache case)"""
from __future__ import annotations

import itertools
import sys

import torch

import kernelset as ks
from kernelset.bench import timing
from kernelset.ops.attention import launch as L
from kernelset.ops.attention.bench import ADAPTERS


def _grid(fp8: bool):
    """(block_n, splits, num_warps, num_stages); None: the policy's value. bf16: keys per
    iteration x splits; fp8: also warps and stages (its tiles carry half the bytes)."""
    if not fp8:
        return [(n, s, None, None) for n, s in itertools.product((None, 32, 64, 128), (None, 2, 4, 8))]
    return [(n, s, w, st) for n, s, w, st in itertools.product((None, 64, 128, 256), (None, 2), (4, 8), (None, 2, 4, 5))]


def main() -> None:
    dev = torch.device("cuda")
    copy = timing.copy_bandwidth_gbs(dev)
    print(f"{torch.cuda.get_device_name()} copy {copy:.0f} GB/s")
    spec = ks.core.registry.op("paged_attention")
    adapter = ADAPTERS["paged_attention"]
    shapes = ((64, 4096, 32, 8, 128, 16, 16), (64, 4096, 32, 8, 128, 16, 8), (8, 32768, 32, 8, 128, 16, 16),
              (8, 32768, 32, 8, 128, 16, 8), (1, 32768, 32, 8, 128, 16, 16))
    if "fp8" in sys.argv[1:]:
        shapes = ((64, 4096, 32, 8, 128, 16, 8),)
    for shape in shapes:
        inp = adapter.inputs(shape, torch.bfloat16, dev, "fwd")
        ref = adapter.reference(inp, "fwd")[0]
        cost = spec.cost(shape, torch.bfloat16, "fwd")
        rows = []
        for block_n, splits, warps, stages in _grid(shape[-1] == 8):
            t = L.PagedTuning(block_n=block_n, splits=splits, num_warps=warps, num_stages=stages)
            with L.TUNING.use(t):
                fn = adapter.ours(inp, "fwd", "triton")
                try:
                    out = fn()[0]
                    err = ((out.float() - ref).norm() / ref.norm()).item()
                    graph = timing.capture(fn, 20)
                    us = timing.cuda_time_ms(graph.replay, warmup=2, reps=10, min_ms=20.0) * 1e3 / 20
                except Exception as exc:  # out of resources: reported, not fatal
                    print(f"  {shape} {t}: {type(exc).__name__} {str(exc)[:80]}")
                    continue
            rows.append((us, block_n or 0, splits or 0, warps or 0, stages or 0, err,
                         100 * cost.bytes / us / 1e3 / copy))
        rows.sort()
        print(f"shape {shape}: best first (us, block_n, splits, warps, stages (0: the policy's), rel_err, % copy)",
              flush=True)
        for r in rows[:12]:
            print("  %.1f us  n%d splits %d warps %d stages %d  err %.1e  %.1f%%" % r, flush=True)
        print("  policy: %s" % next((f"{r[0]:.1f} us" for r in rows if r[1:5] == (0, 0, 0, 0)), "failed"), flush=True)


if __name__ == "__main__":
    main()
