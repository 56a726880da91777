"""Launcher of the rotary-embedding kernel."""
from __future__ import annotations

import torch

from ..triton_launch import FastKernel
from .kernels import _rope_apply_kernel, _rope_fwd_kernel

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


_apply = FastKernel(_rope_apply_kernel)


def rope_apply(x, cos, sin, interleaved, rotary_dim, unsqueeze_dim, sign=1.0):
    """y = x rotated (out of place; features past rotary_dim copied). x [B, H, S, D] when
    unsqueeze_dim == 1 else [B, S, H, D]; cos/sin [B, S, R] or [S, R] (transformers' format)."""
    y = torch.empty_like(x)
    if rotary_dim < x.shape[-1]:
        y[..., rotary_dim:].copy_(x[..., rotary_dim:])
    xs = x if unsqueeze_dim == 2 else x.transpose(1, 2)  # [B, S, H, D] view
    ys = y if unsqueeze_dim == 2 else y.transpose(1, 2)
    bsz, s, h, _ = xs.shape
    if bsz * s * h == 0:
        return y
    c3 = cos if cos.dim() == 3 else cos.unsqueeze(0)
    s3 = sin if sin.dim() == 3 else sin.unsqueeze(0)
    cb = c3.stride(0) if c3.shape[0] > 1 else 0
    sb = s3.stride(0) if s3.shape[0] > 1 else 0
    half = rotary_dim // 2
    block_r = 1 << max(0, (half - 1).bit_length())
    block_h = max(1, min(1 << max(0, (h - 1).bit_length()), 2048 // block_r))
    _apply((bsz * s, -(-h // block_h)), xs, ys, c3, s3, s, h, xs.stride(0), xs.stride(1), xs.stride(2),
           ys.stride(0), ys.stride(1), ys.stride(2), cb, c3.stride(1), sb, s3.stride(1), sign, HALF=half,
           INTERLEAVED=interleaved, BLOCK_H=block_h, BLOCK_R=block_r, num_warps=4 if block_h * block_r >= 1024 else 2)
    return y
