"""Launch policy and launchers of the KV-cache kernels."""
from __future__ import annotations

import dataclasses
import functools

import torch

from ..common.fast_launch import FastKernel
from .kernels import _copy_blocks_kernel, _reshape_and_cache_kernel

_cache = FastKernel(_reshape_and_cache_kernel)
_copy = FastKernel(_copy_blocks_kernel)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclasses.dataclass(frozen=True)
class CacheLaunch:
    block_t: int
    block_h: int
    block_d: int
    num_warps: int


@functools.lru_cache(maxsize=1024)
def cache_policy(h: int, d: int, tile: int = 2048) -> CacheLaunch:
    """~``tile`` elements of key (and as many of value) per program: all heads of a token when
    they fit, then whole tokens stacked; 16 bytes of bf16 per thread per tensor at 4 warps."""
    block_d = _pow2(d)
    block_h = max(1, min(_pow2(h), tile // block_d))
    block_t = max(1, tile // (block_h * block_d))
    warps = max(1, min(8, block_t * block_h * block_d // 512))
    return CacheLaunch(block_t, block_h, block_d, warps)


def reshape_and_cache(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale) -> None:
    t, h, d = key.shape
    if t == 0 or h == 0:
        return
    nb, bs = k_cache.shape[:2]
    p = cache_policy(h, d)
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    _cache((-(-t // p.block_t), -(-h // p.block_h)), key, value, k_cache, v_cache, slot_mapping,
           k_scale if fp8 else None, v_scale if fp8 else None, t, h, nb * bs,
           key.stride(0), key.stride(1), value.stride(0), value.stride(1),
           k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
           v_cache.stride(2), BS=bs, D=d, BLOCK_T=p.block_t, BLOCK_H=p.block_h, BLOCK_D=p.block_d, FP8=fp8,
           num_warps=p.num_warps)


@dataclasses.dataclass(frozen=True)
class CopyLaunch:
    chunk: int
    num_warps: int
    grid: tuple[int, int]


@functools.lru_cache(maxsize=1024)
def copy_policy(n: int, elems: int) -> CopyLaunch:
    """copy_blocks of ``n`` pairs of blocks of ``elems`` elements: chunks of up to 4096 elements."""
    chunk = min(_pow2(elems), 4096)
    return CopyLaunch(chunk, 4, (n, -(-elems // chunk)))


def copy_blocks(k_caches, v_caches, block_mapping) -> None:
    """One launch per layer (key and value together); block_mapping already on the device."""
    n = block_mapping.shape[0]
    if n == 0:
        return
    pairs = block_mapping.contiguous()
    for k_cache, v_cache in zip(k_caches, v_caches):
        elems = k_cache[0].numel()
        if elems == 0:
            continue
        p = copy_policy(n, elems)
        _copy(p.grid, k_cache, v_cache, pairs, k_cache.shape[0], k_cache.stride(0),
              v_cache.stride(0), BLOCK_ELEMS=elems, CHUNK=p.chunk, num_warps=p.num_warps)
