"""Sweep reshape_and_cache's tile (elements of key, and as many of value, per program) on a GPU at
the issue's bar shape (16384 tokens, 8 heads, D128, block size 16; bf16 and fp8 caches); prints %
of copy bandwidth (bytes: key and value read, both caches written, slots read), 20 calls per
CUDA graph replay.
Usage (GPU machine): python scripts/kvcache_tune.py"""
from __future__ import annotations

import torch

import kernelset as ks
from kernelset.bench import timing
from kernelset.ops.kvcache import launch
from kernelset.ops.kvcache import reference as R


def main() -> None:
    dev = torch.device("cuda")
    copy = timing.copy_bandwidth_gbs(dev)
    print(f"{torch.cuda.get_device_name()} copy {copy:.0f} GB/s")
    t, h, d, bs = 16384, 8, 128, 16
    nb = t // bs + 1
    qkv = torch.randn(t, 6 * h * d, dtype=torch.bfloat16, device=dev)
    key, value = qkv[:, 4 * h * d: 5 * h * d].view(t, h, d), qkv[:, 5 * h * d:].view(t, h, d)
    blocks = torch.randperm(nb, device=dev)[: t // bs]
    pos = torch.arange(t, device=dev)
    slots = blocks[pos // bs] * bs + pos % bs
    original = launch.cache_policy
    for fp8 in (False, True):
        cdt = R.FP8 if fp8 else torch.bfloat16
        kc = torch.zeros(nb, bs, h, d, device=dev).to(cdt)
        vc = torch.zeros_like(kc)
        scales = (torch.tensor(0.05, device=dev), torch.tensor(0.04, device=dev)) if fp8 else (None, None)
        nbytes = 2 * key.numel() * 2 + 2 * key.numel() * kc.element_size() + slots.numel() * 8
        for tile in (1024, 2048, 4096, 8192, 16384):
            launch.cache_policy = lambda h_, d_, _t=tile: original(h_, d_, _t)
            try:
                fn = lambda: ks.reshape_and_cache(key, value, kc, vc, slots, k_scale=scales[0],  # noqa: E731
                                                  v_scale=scales[1], check_slots=False, backend="triton")
                # replayed from a CUDA graph, as serving engines run it (eager calls are host-bound here)
                ms = timing.cuda_time_ms(timing.capture(fn, 20).replay, warmup=3, reps=50, min_ms=50) / 20
            finally:
                launch.cache_policy = original
            print(f"reshape_and_cache {'fp8' if fp8 else 'bf16'} cache tile {tile:5d} {original(h, d, tile)}: "
                  f"{ms * 1e3:.1f} us {100 * nbytes / ms / 1e6 / copy:.1f}%", flush=True)


if __name__ == "__main__":
    main()
