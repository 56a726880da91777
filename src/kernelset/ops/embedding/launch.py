"""Launch policy and launchers of the embedding kernels."""
from __future__ import annotations

import dataclasses
import functools

import torch

from ...core.alloc import empty
from ..common.fast_launch import FastKernel
from .kernels import _embedding_bwd_kernel, _embedding_fwd_kernel

_fwd = FastKernel(_embedding_fwd_kernel)
_bwd = FastKernel(_embedding_bwd_kernel)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclasses.dataclass(frozen=True)
class EmbeddingLaunch:
    block_m: int
    block_d: int
    num_warps: int
    grid: tuple[int, int]


@functools.lru_cache(maxsize=4096)
def embedding_policy(m: int, d: int) -> EmbeddingLaunch:
    """Forward tiles: up to 1024 columns of a row, rows stacked to ~2048 elements per program."""
    block_d = min(_pow2(d), 1024)
    block_m = max(1, min(2048 // block_d, _pow2(m)))
    return EmbeddingLaunch(block_m, block_d, 4, (-(-m // block_m), -(-d // block_d)))


def embedding_fwd(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    v, d = weight.shape
    out = empty((*ids.shape, d), weight.dtype, weight.device)
    m = ids.numel()
    if m and d:
        p = embedding_policy(m, d)
        # the kernel reads ids[row] unit-stride: reshape(-1) of 1-D ids is the same view, strided
        # (ids[::2]) or stride 0 (an expand) alike, so it is made contiguous (a no-op when it is)
        _fwd(p.grid, ids.reshape(-1).contiguous(), weight, out, m, v, d, weight.stride(0),
             BLOCK_M=p.block_m, BLOCK_D=p.block_d, num_warps=p.num_warps)
    return out


def embedding_bwd(dy: torch.Tensor, ids: torch.Tensor, num_embeddings: int, weight_dtype: torch.dtype):
    d = dy.shape[-1]
    dw = torch.zeros(num_embeddings, d, dtype=weight_dtype, device=dy.device)
    m = ids.numel()
    if m and d:
        sorted_ids, order = torch.sort(ids.reshape(-1).long(), stable=True)
        block_d = min(_pow2(d), 2048)
        _bwd((m, -(-d // block_d)), sorted_ids, order, dy.reshape(-1, d).contiguous(), dw, m, d, num_embeddings, d,
             BLOCK_D=block_d, num_warps=4)
    return dw
