"""Sweep the split backward of RMSNorm / LayerNorm (rows wider than max_block_bwd) against the
looped backward it replaces (GPU). forward+backward through autograd, bf16, the bench's 5-pass
byte model (x read, y written; dy and x read, dx written); each configuration is checked against
fp32 torch first; configurations are interleaved over rounds (median, min-max).

    python scripts/norm_bwd_tune.py [rounds] [ops=rms_norm,layer_norm] [shapes=4096x65536,...] [configs=8x1024x4x4,...]

A config is rows x chunk x warps x blocks per program (the last optional: the tuning's default).
"""
from __future__ import annotations

import dataclasses
import statistics
import sys

import torch

import kernelset as ks
from kernelset.bench.timing import copy_bandwidth_gbs, cuda_time_ms
from kernelset.core.tolerance import rel_err
from kernelset.ops.norm import policy

SHAPES = [(4096, 65536), (8192, 16384), (1024, 262144)]
# (rows, chunk, warps, blocks per program); None: the looped backward
CONFIGS = [None, (8, 1024, 4, 1), (8, 1024, 4, 2), (8, 1024, 4, 4), (8, 1024, 4, 8), (4, 1024, 4, 4), (4, 2048, 4, 4),
           (4, 2048, 4, 8), (4, 2048, 8, 4), (4, 1024, 4, 8)]


def main() -> int:
    args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
    plain = [a for a in sys.argv[1:] if "=" not in a]
    rounds = int(plain[0]) if plain else 3
    ops = args.get("ops", "rms_norm,layer_norm").split(",")
    shapes = [tuple(map(int, s.split("x"))) for s in args["shapes"].split(",")] if "shapes" in args else SHAPES
    configs = ([None] + [tuple(map(int, c.split("x"))) for c in args["configs"].split(",")] if "configs" in args
               else CONFIGS)
    dev = torch.device("cuda")
    copy = copy_bandwidth_gbs(dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    print(f"{torch.cuda.get_device_name()}, copy {copy:.0f} GB/s", flush=True)
    base = policy.active()
    for op in ops:
        for m, n in shapes:
            x = torch.randn(m, n, device=dev, dtype=torch.bfloat16, requires_grad=True)
            w = (1 + 0.1 * torch.randn(n, device=dev)).to(torch.bfloat16).requires_grad_(True)
            b = (0.1 * torch.randn(n, device=dev)).to(torch.bfloat16).requires_grad_(True)
            dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
            wrt = (x, w) if op == "rms_norm" else (x, w, b)
            fn = ((lambda: ks.rms_norm(x, w)) if op == "rms_norm" else (lambda: ks.layer_norm(x, w, b)))

            def step(fn=fn, wrt=wrt, dy=dy):
                return torch.autograd.grad(fn(), wrt, dy)
            leaves = [t.detach().float().requires_grad_() for t in wrt]
            if op == "rms_norm":
                yr = leaves[0] * torch.rsqrt(leaves[0].pow(2).mean(-1, keepdim=True) + 1e-6)
                yr = yr.to(torch.bfloat16).float() * leaves[1]
            else:
                yr = torch.nn.functional.layer_norm(leaves[0], (n,), leaves[1], leaves[2], 1e-5)
            refs = torch.autograd.grad(yr, leaves, dy.float())
            del yr, leaves
            runs = {}
            for cfg in configs:
                if cfg is None:
                    tuning, label = dataclasses.replace(base, split_chunk_bwd=0), "looped"
                else:
                    rows, chunk, warps, *per = cfg
                    fixed = {"split_blocks_bwd": per[0], "split_blocks_bwd_wide": per[0]} if per else {}
                    tuning = dataclasses.replace(base, split_chunk_bwd=chunk, split_rows_bwd=rows, split_warps_bwd=warps,
                                                 **fixed)
                    sp, rows = policy.bwd_split_policy(n, sms, tuning)
                    blocks = policy.bwd_split_per_prog(-(-m // rows), rows, sp.split, sms, tuning)
                    label = f"split {rows}x{sp.chunk} {warps}w x{blocks}"
                    if not sp.split or label in runs:
                        continue
                with policy.use(tuning):
                    got = step()
                errs = [rel_err(g.float(), r) for g, r in zip(got, refs)]
                if not max(errs) < 2e-2:
                    print(f"  {op} {m}x{n} {label}: WRONG {[f'{e:.2e}' for e in errs]}", flush=True)
                    continue
                runs[label] = tuning
            del refs
            torch.cuda.empty_cache()
            times = {k: [] for k in runs}
            for _ in range(rounds):
                for label, tuning in runs.items():
                    with policy.use(tuning):
                        times[label].append(cuda_time_ms(step, warmup=3, reps=20, min_ms=40))
            nbytes = 5 * m * n * 2
            print(f"{op} fwd+bwd {m}x{n}, {rounds} rounds, median (min-max), % of copy (5 passes):", flush=True)
            for label, ts in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
                med = statistics.median(ts)
                print(f"  {label:22s} {med:.4f} ms {100 * nbytes / med / 1e6 / copy:5.1f}% ({min(ts):.4f}-{max(ts):.4f})",
                      flush=True)
            del x, w, b, dy
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
