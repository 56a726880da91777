"""Launcher of the rotary-embedding kernel."""
from __future__ import annotations

from ..triton_launch import FastKernel
from .kernels import _rope_fwd_kernel

_fwd = FastKernel(_rope_fwd_kernel)


def rope_fwd(positions, q, k, cache, interleaved, head_size):
    t = positions.numel()
    half = cache.shape[1] // 2
    block_r = 1 << max(0, (half - 1).bit_length())
    for x in (q, k):
        if x is None or t == 0:
            continue
        h = x[0].numel() // head_size if x.shape[0] else 0
        block_h = max(1, min(1 << max(0, (h - 1).bit_length()), 2048 // block_r))
        _fwd((t, -(-h // block_h)), positions, x, cache, h, cache.shape[0], x.stride(0), cache.stride(0),
             D=head_size, HALF=half, INTERLEAVED=interleaved, BLOCK_H=block_h, BLOCK_R=block_r,
             num_warps=4 if block_h * block_r >= 1024 else 2)
