"""Experiment (GPU): does the split RMSNorm / softmax forward's speed depend on where the caching
allocator puts the output relative to the input? Times ks.rms_norm 1024x262144 and ks.softmax
4096x131072 with a spacer allocation of several sizes made between the input and the output
(the output block is then reused by every call), interleaved over rounds.

    python scripts/split_placement.py [rounds]
"""
from __future__ import annotations

import statistics
import sys

import torch

import kernelset as ks
from kernelset.bench.timing import copy_bandwidth_gbs, cuda_time_ms


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    dev = torch.device("cuda")
    copy = copy_bandwidth_gbs(dev)
    print(f"{torch.cuda.get_device_name(dev)}; copy {copy:.0f} GB/s", flush=True)
    for name, shape, fn in (("rms_norm", (1024, 262144), lambda x, w, y: ks.rms_norm(x, w)),
                            ("softmax", (4096, 131072), lambda x, w, y: ks.softmax(x))):
        m, n = shape
        times: dict[str, list[float]] = {}
        for r in range(rounds):
            for spacer_mib in (0, 2, 18, 64, 258, 1024):
                torch.cuda.empty_cache()
                x = torch.randn(m, n, dtype=torch.bfloat16, device=dev)
                w = torch.randn(n, dtype=torch.bfloat16, device=dev)
                spacer = torch.empty(spacer_mib << 20, dtype=torch.uint8, device=dev) if spacer_mib else None
                y = fn(x, w, None)  # the output block: freed and reused by each timed call
                label = f"spacer {spacer_mib:5d} MiB, y - x = {(y.data_ptr() - x.data_ptr()) / 2**20:8.1f} MiB"
                del y
                t = cuda_time_ms(lambda: fn(x, w, None), warmup=3, reps=20, min_ms=40)
                times.setdefault(f"spacer {spacer_mib:5d} MiB", []).append(t)
                print(f"  {name} round {r} {label}: {t:.4f} ms {100 * 4 * m * n / t / 1e6 / copy:5.1f}%", flush=True)
                del x, w, spacer
        for label, ts in times.items():
            med = statistics.median(ts)
            print(f"{name} {m}x{n} {label}: median {med:.4f} ms {100 * 4 * m * n / med / 1e6 / copy:5.1f}% "
                  f"({min(ts):.4f}-{max(ts):.4f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
