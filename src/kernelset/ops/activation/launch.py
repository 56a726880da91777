"""Launch policy and launchers of the activation kernels."""
from __future__ import annotations

import dataclasses
import functools

import torch

from ...core.alloc import empty
from ...core.checks import row_stride
from ..common.fast_launch import FastKernel
from .kernels import _act_bwd_kernel, _act_fwd_kernel

ACTS = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "oai": 3}
LAYOUTS = {"halves": 0, "pair": 1, "single": 2, "interleaved": 3}

_fwd = FastKernel(_act_fwd_kernel)
_bwd = FastKernel(_act_bwd_kernel)


@dataclasses.dataclass(frozen=True)
class ActLaunch:
    block_m: int
    block_n: int
    num_warps: int
    grid: tuple[int, int]


@functools.lru_cache(maxsize=4096)
def act_policy(m: int, i: int, act: int, tile: int = 4096) -> ActLaunch:
    """Tiles of ~``tile`` elements: up to 2048 columns, rows stacked to fill the rest; 8 elements
    (16 bytes of bf16) per thread per tensor, 32 for erf GELU (``act`` 1, ``ACTS``), whose erfc
    needs more independent work per thread to hide its latency. H200, gelu_and_mul 16384 x
    2*14336 (2026-11-27): 4096 x 4 warps (32 per thread) 95.4% of copy,
    8192 x 8 95.3%, 2048 x 4 94.7%, 4096 x 8 92.4%, 4096 x 16 (8 per thread) 91.1%; silu_and_mul
    measured 99.4% with 8 and 97.3% with 32 (H200, 2026-11-27), so it keeps 8."""
    per_thread = 8
    if act == 1:
        per_thread = 32
    block_n = min(1 << max(0, (i - 1).bit_length()), 2048)
    block_m = max(1, min(tile // block_n, 1 << max(0, (m - 1).bit_length())))
    warps = max(1, min(16, block_m * block_n // (32 * per_thread)))
    return ActLaunch(block_m, block_n, warps, (-(-m // block_m), -(-i // block_n)))


def _rows(t: torch.Tensor) -> int:
    n = t.shape[-1]
    return t.numel() // n if n else 0


def act_fwd(x: torch.Tensor, up: torch.Tensor | None, kind: str, layout: str, alpha: float = 0.0,
            limit: float = 0.0) -> torch.Tensor:
    """y [..., I]; I = x.shape[-1] // 2 for halves/interleaved, x.shape[-1] otherwise."""
    i = x.shape[-1] // 2 if layout in ("halves", "interleaved") else x.shape[-1]
    m = _rows(x) if x.shape[-1] else 0
    y = empty((*x.shape[:-1], i), x.dtype, x.device)
    if m == 0 or i == 0:
        return y
    act, lay = ACTS[kind], LAYOUTS[layout]
    p = act_policy(m, i, act)
    site = (act, lay, p.block_m, p.block_n, p.num_warps)  # every constexpr (FastKernel.at checks the rest)
    args = (x, up, y, m, i, row_stride(x), row_stride(up) if up is not None else 0, i, alpha, limit)
    if not _fwd.at(site, p.grid, *args):
        _fwd(p.grid, *args, site=site, ACT=act, LAYOUT=lay, BLOCK_M=p.block_m, BLOCK_N=p.block_n,
             num_warps=p.num_warps)
    return y


def act_bwd(dy: torch.Tensor, x: torch.Tensor, up: torch.Tensor | None, kind: str, layout: str):
    """(dx like x, dup like up or None)."""
    i = dy.shape[-1]
    m = _rows(dy) if i else 0
    dx = empty(x.shape, x.dtype, x.device)
    du = empty(up.shape, up.dtype, up.device) if up is not None else None
    if m == 0 or i == 0:
        return dx, du
    act, lay = ACTS[kind], LAYOUTS[layout]
    p = act_policy(m, i, act)
    args = (dy, x, up, dx, du, m, i, row_stride(dy), row_stride(x), row_stride(up) if up is not None else 0,
            x.shape[-1], i if du is not None else 0)
    site = (act, lay, p.block_m, p.block_n, p.num_warps)  # every constexpr (FastKernel.at checks the rest)
    if not _bwd.at(site, p.grid, *args):
        _bwd(p.grid, *args, site=site, ACT=act, LAYOUT=lay, BLOCK_M=p.block_m, BLOCK_N=p.block_n,
             num_warps=p.num_warps)
    return dx, du
