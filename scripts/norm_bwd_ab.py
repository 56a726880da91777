"""A/B of the norm block backward knobs on a GPU (prefetch on/off, threads per SM), rms_norm bf16.
Usage (GPU machine): python scripts/norm_bwd_ab.py"""
import dataclasses

import torch

from kernelset.bench import timing
from kernelset.ops.norm import policy
from kernelset.ops.norm.launch import norm_bwd
dev = torch.device("cuda")
copy = timing.copy_bandwidth_gbs(dev)
for m, n in ((32768, 4096), (16384, 8192), (65536, 2048)):
    x = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, device=dev, dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    rstd = torch.rand(m, device=dev) + 0.5
    for pf in (False, True):
        for tps in (1024, 2048):
            t = dataclasses.replace(policy.DEFAULT_TUNING, bwd_prefetch=pf, bwd_threads_per_sm=tps)
            ms = timing.cuda_time_ms(lambda: norm_bwd(dy, x, w, None, rstd, is_rms=True, gemma_cast=False,
                                                      has_bias=False, tuning=t), warmup=3, reps=30, min_ms=30)
            print(f"bwd {m}x{n} prefetch {pf} threads/SM {tps}: {ms:.3f} ms "
                  f"{100 * 6 * m * n / ms / 1e6 / copy:.1f}% (3 passes)", flush=True)
