"""Host time of one eager ``ks.rotary_embedding`` call, through the replay table
(``rope.api._ROT_EAGER``) and through the full path (checks, dispatcher, launch), against torch's
own ops for the same rotation; and the eager wall time per call at the bar's shape (T=16384, 32/8
heads, D128), where a host slower than the 88 us kernel leaves the GPU idle (session 26: 78% of
copy in ``ksctl bench`` on a lent H200 host). Interleaved rounds, medians.

Usage (GPU): python scripts/rope_host.py [rounds]
"""
from __future__ import annotations

import statistics
import sys
from contextlib import contextmanager

import torch

import kernelset as ks
from kernelset.bench.timing import copy_bandwidth_gbs, cuda_time_ms, host_us_per_call
from kernelset.ops.rope import api


@contextmanager
def full_path():
    key = api._rot_eager_key
    api._rot_eager_key = lambda *a: None
    try:
        yield
    finally:
        api._rot_eager_key = key


def inputs(t: int, dev: torch.device):
    q = torch.randn(t, 32, 128, device=dev, dtype=torch.bfloat16)
    k = torch.randn(t, 8, 128, device=dev, dtype=torch.bfloat16)
    inv = 1.0 / 10000 ** (torch.arange(0, 128, 2, device=dev).float() / 128)
    f = torch.outer(torch.arange(32768, device=dev).float(), inv)
    cache = torch.cat([f.cos(), f.sin()], -1)
    pos = torch.randint(0, 32768, (t,), device=dev)
    return pos, q, k, cache


def torch_ops(pos, q, k, cache):  # vLLM's forward_native form: gather, split, rotate halves, write back
    cs = cache[pos]
    cos, sin = cs.chunk(2, -1)
    for x in (q, k):
        x1, x2 = x.float().chunk(2, -1)
        c, s = cos[:, None], sin[:, None]
        x.copy_(torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1))


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    small = inputs(1, dev)
    big = inputs(16384, dev)
    nbytes = 2 * (big[1].numel() + big[2].numel()) * 2 + big[0].numel() * 8
    copy = copy_bandwidth_gbs(dev)
    res: dict[str, list[float]] = {}
    for _ in range(rounds):
        res.setdefault("T=1 replay us", []).append(host_us_per_call(lambda: ks.rotary_embedding(*small)))
        with full_path():
            res.setdefault("T=1 full path us", []).append(host_us_per_call(lambda: ks.rotary_embedding(*small)))
        res.setdefault("T=1 torch ops us", []).append(host_us_per_call(lambda: torch_ops(*small), calls=500))
        ms = cuda_time_ms(lambda: ks.rotary_embedding(*big))
        res.setdefault("T=16384 eager replay % of copy", []).append(nbytes / ms / 1e6 / copy * 100)
        with full_path():
            ms = cuda_time_ms(lambda: ks.rotary_embedding(*big))
        res.setdefault("T=16384 eager full path % of copy", []).append(nbytes / ms / 1e6 / copy * 100)
    print(f"copy {copy:.0f} GB/s; {rounds} interleaved rounds, medians (all rounds in brackets)")
    for name, v in res.items():
        print(f"  {name:34s} {statistics.median(v):8.1f}   [{', '.join(f'{x:.1f}' for x in v)}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
