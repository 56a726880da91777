"""Sweep launch-policy values of the norm kernels on a GPU; prints the best per case.

Run by scripts/gpu_check.sh with --tune. Results inform policy.DEFAULT_TUNING (and are kept in
docs/benchmarks/ next to the benchmark that uses them). ``python scripts/norm_tune.py wide`` sweeps
only the looped forward at the issue's wide-row cases (4096x65536, 1024x262144).
"""
from __future__ import annotations

import dataclasses
import itertools
import sys

import torch

from kernelset.bench.timing import copy_bandwidth_gbs, cuda_time_ms
from kernelset.ops.norm import policy
from kernelset.ops.norm.launch import norm_bwd, norm_fwd


def variants(base: policy.NormTuning, **axes):
    keys = list(axes)
    for values in itertools.product(*(axes[k] for k in keys)):
        yield dataclasses.replace(base, **dict(zip(keys, values)))


def report(title: str, rows: list) -> None:
    """The best four distinct launches of a case, fastest first."""
    rows.sort(key=lambda r: -r[0])
    seen = []
    for _, _, p in rows:
        if p not in seen:
            seen.append(p)
    print(title)
    for pct, ms, p in rows:
        if p in seen[:4]:
            seen.remove(p)
            print(f"   {pct:5.1f}% copy {ms:.4f} ms  {p}")
    sys.stdout.flush()


def main() -> int:
    dev = torch.device("cuda")
    copy = copy_bandwidth_gbs(dev)
    base = policy.DEFAULT_TUNING
    print(f"copy {copy:.0f} GB/s")
    fwd_cases = [(32768, 4096), (16384, 8192), (8192, 16384), (4096, 32768), (4096, 65536), (1024, 262144)]
    fwd_space = list(variants(base, fwd_elems_per_thread=(8, 16, 32), fwd_tile=(2048, 8192),
                              max_block_fwd=(16384, 32768))) + \
        list(variants(base, max_block_fwd=(8192,), looped_block_fwd=(8192, 16384), looped_warps_fwd=(16, 32),
                      looped_programs_per_sm=(1, 2, 4, 8)))
    if "wide" in sys.argv[1:]:
        fwd_cases = [(4096, 65536), (1024, 262144)]
        fwd_space = list(variants(base, looped_block_fwd=(8192, 16384, 32768), looped_warps_fwd=(16, 32),
                                  looped_programs_per_sm=(1, 2, 3, 4)))
    for m, n in fwd_cases:
        x = torch.randn(m, n, dtype=torch.bfloat16, device=dev)
        w = torch.randn(n, dtype=torch.bfloat16, device=dev)
        rows = []
        for t in fwd_space:
            p = policy.fwd_policy(m, n, 132, True, t)
            ms = cuda_time_ms(lambda: norm_fwd(x, w, None, eps=1e-6, is_rms=True, gemma_cast=False, stats=False,
                                               tuning=t), warmup=3, reps=20, min_ms=20)
            rows.append((100 * 4 * m * n / ms / 1e6 / copy, ms, p))
        report(f"fwd {m}x{n}:", rows)
    if "wide" in sys.argv[1:]:
        return 0
    bwd_space = list(variants(base, bwd_elems_per_thread=(4, 8, 16), bwd_threads_per_sm=(1024, 2048),
                              bwd_tile=(1024, 4096), max_block_bwd=(8192, 16384)))
    for m, n in [(32768, 4096), (16384, 8192), (8192, 16384), (4096, 65536)]:
        x = torch.randn(m, n, dtype=torch.bfloat16, device=dev)
        w = torch.randn(n, dtype=torch.bfloat16, device=dev)
        dy = torch.randn_like(x)
        rstd = torch.rand(m, device=dev) + 0.5
        rows = []
        for t in bwd_space:
            p = policy.bwd_policy(m, n, 132, t)
            ms = cuda_time_ms(lambda: norm_bwd(dy, x, w, None, rstd, is_rms=True, gemma_cast=False, has_bias=False,
                                               tuning=t), warmup=3, reps=20, min_ms=20)
            rows.append((100 * 6 * m * n / ms / 1e6 / copy, ms, p))
        report(f"bwd {m}x{n} (3 passes):", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
