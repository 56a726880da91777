"""References of the paged KV-cache ops in plain torch (any device).

Cache layout (vLLM / FlashAttention): ``[num_blocks, block_size, Hkv, D]``; a slot is
``block * block_size + offset``. An fp8 e4m3 cache stores ``value / scale`` saturated to
[-448, 448] (round to nearest even), one fp32 scale per tensor (``ops/quant/formats.py``).
"""
from __future__ import annotations

import torch

from ..quant.formats import quantize


def reshape_and_cache(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale) -> None:
    """k_cache[slot // bs, slot % bs] = quantize(key[t]) for each token t whose slot is in range
    (a padding slot, -1, and any other out-of-range slot is skipped); the same for values."""
    nb, bs = k_cache.shape[:2]
    slots = slot_mapping.long()
    keep = (slots >= 0) & (slots < nb * bs)
    idx = slots[keep]
    blk, off = idx // bs, idx % bs
    k_cache[blk, off] = quantize(key[keep], k_scale, k_cache.dtype)
    v_cache[blk, off] = quantize(value[keep], v_scale, v_cache.dtype)


def copy_blocks(k_caches, v_caches, block_mapping) -> None:
    """For every layer and every (src, dst) row of block_mapping: cache[dst] = cache[src], in row
    order (pairs whose blocks are out of range are skipped)."""
    for k_cache, v_cache in zip(k_caches, v_caches):
        nb = k_cache.shape[0]
        pairs = block_mapping.to(device=k_cache.device, dtype=torch.long)
        keep = (pairs >= 0).all(1) & (pairs < nb).all(1)
        src, dst = pairs[keep, 0], pairs[keep, 1]
        for cache in (k_cache, v_cache):
            cache[dst] = cache[src]


def swap_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """dst[d] = src[s] for each row (s, d) of block_mapping (a host tensor), across devices;
    runs of consecutive blocks become one copy. Non-blocking when the host side is pinned."""
    pairs = block_mapping.tolist()
    i = 0
    while i < len(pairs):
        s, d = pairs[i]
        n = 1
        while i + n < len(pairs) and pairs[i + n] == [s + n, d + n]:
            n += 1
        dst[d: d + n].copy_(src[s: s + n], non_blocking=True)
        i += n
