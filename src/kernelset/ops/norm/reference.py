"""fp32 references for the norm family. Plain torch ops: run on any device, differentiable.

These are also the ``reference`` backend, so they honour the same options as the kernels,
including where the result is rounded (``gemma_cast``), and return the same saved statistics.
"""
from __future__ import annotations

import functools

import numpy as np
import torch


def _acc(t: torch.Tensor) -> torch.Tensor:
    """fp32 for fp32/fp16/bf16 storage; fp64 stays fp64 (finite-difference checks of the math)."""
    return t if t.dtype == torch.float64 else t.float()


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor | None, eps: float, offset: float,
                 gemma_cast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """y = x * rsqrt(mean(x^2) + eps) * (offset + w); fp32 math. Returns (y [..., N], rstd [...] fp32)."""
    xf = _acc(x)
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    xn = xf * rstd
    if weight is None:
        y = xn
    elif gemma_cast:  # Gemma: multiply in fp32, round once
        y = xn * (offset + _acc(weight))
    else:  # Llama: round the normalized value to x.dtype, then multiply by the weight
        y = _acc(xn.to(x.dtype)) * (offset + _acc(weight))
    return y.to(x.dtype), rstd.squeeze(-1)


@functools.lru_cache(maxsize=4096)
def torch_cuda_mean_lanes(m: int, n: int) -> int | None:
    """Threads that sum one row in torch's CUDA ``t.mean(-1)`` (``torch_cuda_mean_block``'s
    width x height), or None where ``torch_order`` does not reproduce the order."""
    block = torch_cuda_mean_block(m, n)
    return None if block is None else block[0] * block[1]


@functools.lru_cache(maxsize=4096)
def torch_cuda_mean_block(m: int, n: int) -> tuple[int, int] | None:
    """(width, height): the threads of torch's CUDA reduce kernel that sum one row of ``t.mean(-1)``
    over a contiguous fp32 ``[m, n]`` tensor (ReduceConfig: 512 threads, rows vectorized by 4
    when n > 128): ``width`` lanes of a warp row, and ``height`` warp rows where the block's warps
    split the row too (else 1). None where that kernel would split a row across blocks or not
    vectorize (n <= 128, n % 4, n > 16384): the orders ``torch_order`` reproduces."""
    if n <= 128 or n % 4 or n > 16384 or m < 1:
        return None
    width, height = torch_cuda_reduce_block(m, n)
    per_thread = -(-n // width)  # counted in elements, not vectors (measured on an H200, 2026-11-27)
    if per_thread < height * 16 and per_thread < 256:
        return width, 1  # each warp row sums one output: lanes = block width
    if height == 1 and per_thread < 256:
        return width, 1  # the "split" across one warp row changes nothing
    # the block's warps split the row too (n >= 8192 from 2 rows up): thread (x, y) sums vectors
    # x + y * width + k * width * height; the block reduces x first (shared memory down to 32,
    # then the warp), then y (shared memory, halving): of four candidate orders only this one gave
    # torch's bits at all 32 shapes of 2-2048 rows x 8192-16384 (2026-11-27,
    # torch 2.11 on an H200). Rows split across blocks too (256+
    # values per thread) are not reproduced: torch's own ops run there.
    if -(-n // (width * height)) < 256:
        return width, height
    return None


def torch_cuda_reduce_block(m: int, n: int) -> tuple[int, int]:
    """torch's ReduceConfig block (width lanes x height warp rows, 512 threads) for a reduction of
    m contiguous rows of n fp32 values vectorized by 4 (``set_block_dimension``), before it decides
    whether the warp rows split a row or each sum their own."""
    dim0 = n // 4
    d0 = 1 << (dim0.bit_length() - 1) if dim0 < 512 else 512
    d1 = 1 << (m.bit_length() - 1) if m < 512 else 512
    width = min(d0, 32)
    height = min(d1, 512 // width)
    return min(d0, 512 // height), height


@functools.lru_cache(maxsize=4096)
def torch_cuda_mean_factor(m: int, n: int) -> float:
    """torch's MeanOps factor: float(outputs) / numel in fp32 arithmetic."""
    return float(np.float32(m) / np.float32(m * n))


def torch_cuda_mean_sq(xf: torch.Tensor, warp_tree: str = "halving") -> torch.Tensor:
    """``xf.pow(2).mean(-1)`` of a 2-D fp32 tensor, summed in the order of torch's CUDA reduce
    kernel (torch_cuda_mean_lanes), with elementwise fp32 additions: the same value on any device.
    The specification of ``_rms_fwd_torch_order_kernel``; the GPU tests check it against torch.

    Lane t keeps 4 accumulators over x[(j * lanes + t) * 4 + i], j in order, combined
    ((a0 + a1) + a2) + a3. With lanes t = x + y * width (``torch_cuda_mean_block``), the x lanes of
    each warp row fold first: above 32 through shared memory (x += x + half, halving), then the
    warp's shuffle-down tree, ``"halving"`` (offsets 16, 8, ..., 1: torch on CUDA since it aligned
    its order with Triton's) or ``"doubling"`` (offsets 1, 2, ..., 16: older torch); then the warp
    rows y, halving."""
    m, n = xf.shape
    block = torch_cuda_mean_block(m, n)
    if block is None:
        raise ValueError(f"torch_cuda_mean_sq: no reproducible order for [{m}, {n}]")
    width, height = block
    lanes = width * height
    sq = xf * xf
    j = -(-n // (4 * lanes))
    sq = torch.nn.functional.pad(sq, (0, j * 4 * lanes - n)).view(m, j, lanes, 4)
    acc = torch.zeros(m, lanes, 4, dtype=torch.float32, device=xf.device)
    for k in range(j):
        acc = acc + sq[:, k]
    t = (((acc[..., 0] + acc[..., 1]) + acc[..., 2]) + acc[..., 3]).view(m, height, width)
    while t.shape[2] > (1 if warp_tree == "halving" else 32):
        h = t.shape[2] // 2
        t = t[..., :h] + t[..., h:]
    while t.shape[2] > 1:
        t = t[..., 0::2] + t[..., 1::2]
    t = t[..., 0]
    while t.shape[1] > 1:
        h = t.shape[1] // 2
        t = t[:, :h] + t[:, h:]
    return t[:, 0] * torch_cuda_mean_factor(m, n)


def fused_add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float,
                           offset: float, gemma_cast: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """h = x + residual (rounded to x.dtype, as torch adds); y = rms_norm(h). Returns (y, h, rstd)."""
    h = x + residual
    y, rstd = rms_norm_ref(h, weight, eps, offset, gemma_cast)
    return y, h, rstd


def layer_norm_ref(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """y = (x - mean) * rsqrt(var + eps) * w + b; fp32 math. Returns (y, mean [...] fp32, rstd [...] fp32)."""
    xf = _acc(x)
    mean = xf.mean(-1, keepdim=True)
    var = (xf - mean).pow(2).mean(-1, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    y = (xf - mean) * rstd
    if weight is not None:
        y = y * _acc(weight)
    if bias is not None:
        y = y + _acc(bias)
    return y.to(x.dtype), mean.squeeze(-1), rstd.squeeze(-1)


def _rowsum(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1]).sum(0)


def rms_norm_bwd_ref(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, rstd: torch.Tensor,
                     eps: float, offset: float, gemma_cast: bool, dres: torch.Tensor | None):
    """(dx, dw) of rms_norm in fp32; the forward's rounding is treated as identity; dx += dres.

    xhat = x * rstd, g = dy * (offset + w): dx = rstd * (g - xhat * mean(xhat * g)), dw = sum_rows(dy * xhat).
    Explicit formulas, not autograd: this also runs inside a custom op, where autograd is off.
    """
    del eps
    xf, dyf = x.float(), dy.float()
    r = rstd.unsqueeze(-1)
    xhat = xf * r
    g = dyf * (offset + _acc(weight)) if weight is not None else dyf
    dx = (g - xhat * (xhat * g).mean(-1, keepdim=True)) * r
    if dres is not None:
        dx = dx + dres.float()
    dw = None
    if weight is not None:
        xw = xhat if gemma_cast else xhat.to(x.dtype).float()
        dw = _rowsum(dyf * xw).to(weight.dtype)
    return dx.to(x.dtype), dw


def layer_norm_bwd_ref(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None,
                       bias: torch.Tensor | None, mean: torch.Tensor, rstd: torch.Tensor, eps: float):
    """(dx, dw, db) of layer_norm in fp32.

    xhat = (x - mean) * rstd, g = dy * w: dx = rstd * (g - mean(g) - xhat * mean(xhat * g)),
    dw = sum_rows(dy * xhat), db = sum_rows(dy).
    """
    del eps
    xf, dyf = x.float(), dy.float()
    r = rstd.unsqueeze(-1)
    xhat = (xf - mean.unsqueeze(-1)) * r
    g = dyf * weight.float() if weight is not None else dyf
    dx = (g - g.mean(-1, keepdim=True) - xhat * (xhat * g).mean(-1, keepdim=True)) * r
    dw = _rowsum(dyf * xhat).to(weight.dtype) if weight is not None else None
    db = _rowsum(dyf).to(bias.dtype) if bias is not None else None
    return dx.to(x.dtype), dw, db
