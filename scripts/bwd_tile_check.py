"""fwd+bwd of ks.rms_norm (autograd, bf16) under two backward tiles: the policy change behind
docs/benchmarks (one row vs two rows per backward program at hidden 4096)."""
import dataclasses

import torch

import kernelset as ks
from kernelset.bench.timing import copy_bandwidth_gbs, cuda_time_ms
from kernelset.ops.norm import policy

copy = copy_bandwidth_gbs(torch.device("cuda"))
for m, n in [(32768, 4096), (16384, 8192)]:
    x = torch.randn(m, n, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    w = torch.randn(n, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    dy = torch.randn_like(x)
    for tile in (1024, 8192):
        t = dataclasses.replace(policy.DEFAULT_TUNING, bwd_tile=tile)
        with policy.use(t):
            ms = cuda_time_ms(lambda: torch.autograd.grad(ks.rms_norm(x, w), (x, w), dy))
        print(f"{m}x{n} bwd_tile {tile}: {ms:.3f} ms, {100 * 5 * 2 * m * n / ms / 1e6 / copy:.1f}% of copy (5-pass model)"
              f"; policy {policy.bwd_policy(m, n, 132, t)}")
