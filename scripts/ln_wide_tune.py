"""Sweep LayerNorm's forward launch at wide rows (issue 2's "no cliff"): looped chunk/warps/programs
and the split forward below its RMSNorm threshold. GPU only.

Session 15: LayerNorm fwd 4096x65536 ran at 72% of copy against RMSNorm's 94.5% with the same
looped launch (pass 1 merges per-chunk (mean, M2) pairs: two CTA reductions per chunk). Every
variant is checked against F.layer_norm in fp32 before it is timed.

    python scripts/ln_wide_tune.py
"""
from __future__ import annotations

import dataclasses
import itertools
import sys

import torch

from kernelset.bench.timing import copy_bandwidth_gbs, cuda_time_ms
from kernelset.ops.norm import policy
from kernelset.ops.norm.launch import norm_fwd


def main() -> int:
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(), torch.__version__)
    copy = copy_bandwidth_gbs(dev)
    print(f"copy {copy:.0f} GB/s")
    base = policy.DEFAULT_TUNING
    looped = [dataclasses.replace(base, split_chunk_fwd=0, looped_block_fwd=b, looped_warps_fwd=w, looped_programs_per_sm=p)
              for b, w, p in itertools.product((4096, 8192, 16384), (8, 16, 32), (1, 2, 4))]
    split = [dataclasses.replace(base, split_min_fwd=32768, split_chunk_fwd=c, split_warps_fwd=w)
             for c, w in itertools.product((4096, 8192, 16384), (4, 8, 16))]
    for m, n in ((4096, 65536), (8192, 32768), (2048, 131072)):
        x = torch.randn(m, n, device=dev, dtype=torch.bfloat16) * 2 + 0.5
        w = torch.randn(n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, device=dev, dtype=torch.bfloat16)
        ref = torch.nn.functional.layer_norm(x.float(), (n,), w.float(), b.float(), 1e-5)
        rows = []
        for kind, space in (("looped", looped), ("split", split)):
            for t in space:
                if kind == "split" and not policy.fwd_split_policy(n, 132, t).split:
                    continue
                y = norm_fwd(x, w, b, eps=1e-5, is_rms=False, gemma_cast=False, stats=False, tuning=t)[0]
                err = ((y.float() - ref).norm() / ref.norm()).item()
                if err > 1e-2:
                    print(f"   WRONG {kind} {t}: rel err {err:.2e}")
                    continue
                ms = cuda_time_ms(lambda: norm_fwd(x, w, b, eps=1e-5, is_rms=False, gemma_cast=False, stats=False,
                                                   tuning=t), warmup=3, reps=20, min_ms=20)
                knobs = (f"chunk {t.looped_block_fwd} warps {t.looped_warps_fwd} programs/SM {t.looped_programs_per_sm}"
                         if kind == "looped" else f"chunk {t.split_chunk_fwd} warps {t.split_warps_fwd}")
                rows.append((100 * 4 * m * n / ms / 1e6 / copy, ms, f"{kind} {knobs}"))
        rms = cuda_time_ms(lambda: norm_fwd(x, w, None, eps=1e-5, is_rms=True, gemma_cast=False, stats=False),
                           warmup=3, reps=20, min_ms=20)
        shipped = cuda_time_ms(lambda: norm_fwd(x, w, b, eps=1e-5, is_rms=False, gemma_cast=False, stats=False),
                               warmup=3, reps=20, min_ms=20)
        rows.sort(key=lambda r: -r[0])
        print(f"layer_norm fwd {m}x{n}: shipped {100 * 4 * m * n / shipped / 1e6 / copy:.1f}%, "
              f"rms_norm shipped {100 * 4 * m * n / rms / 1e6 / copy:.1f}%")
        for pct, ms, what in rows[:8]:
            print(f"   {pct:5.1f}% {ms:.4f} ms  {what}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
