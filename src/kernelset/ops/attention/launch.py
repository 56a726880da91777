"""Launch policy and launchers of the attention kernels.

The split count (flash-decoding) depends only on host integers (batch, heads, max_seqlen_q,
max_seq_len and the SM count), never on device data: the same call is capturable in a CUDA
graph and the scratch it allocates has a size fixed by its arguments.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import torch

from ...core import config
from ...core.alloc import empty
from ...core.tuning import TuningStack
from ..triton_launch import FastKernel
from .kernels import _merge_attn_states_kernel, _paged_attn_fwd_kernel, _paged_attn_reduce_kernel

_fwd = FastKernel(_paged_attn_fwd_kernel)
_reduce = FastKernel(_paged_attn_reduce_kernel)
_merge = FastKernel(_merge_attn_states_kernel)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclasses.dataclass(frozen=True)
class PagedTuning:
    """Knobs of the paged-attention policy (tests force rare shapes; GPU sweeps compare values)."""

    splits: int | None = None  # force this many KV splits (None: the policy decides)
    waves: float = 4.0  # programs wanted per SM before splitting stops
    min_partition: int = 256  # fewest keys per split
    max_splits: int = 64  # the reduce kernel holds every split's partial of one row at once
    block_n: int | None = None  # keys per iteration (None: 64, or 32 at head size 256)


TUNING = TuningStack(PagedTuning())


@dataclasses.dataclass(frozen=True)
class PagedLaunch:
    block_m: int  # query rows (token x head of the group) per program, >= 16 for tl.dot
    block_n: int
    block_d: int
    tiles: int  # row tiles per (sequence, KV head)
    splits: int
    partition: int  # keys per split, a multiple of block_n
    num_warps: int
    num_stages: int


@functools.lru_cache(maxsize=1024)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: a small machine, so tests see several splits
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=4096)
def paged_policy(batch: int, kv_heads: int, group: int, head_dim: int, max_seqlen_q: int, max_keys: int, sms: int,
                 tuning: PagedTuning = PagedTuning()) -> PagedLaunch:
    block_d = _pow2(head_dim)
    rows = max_seqlen_q * group
    # decode: the group's heads of one token (a tile of 16 to 64 rows); more query tokens: 64-row tiles
    block_m = min(64, max(16, _pow2(rows)))
    block_n = tuning.block_n or (64 if block_d <= 128 else 32)
    tiles = -(-rows // block_m)
    base = max(1, batch * kv_heads * tiles)
    keys = max(1, max_keys)
    if tuning.splits is not None:
        splits = tuning.splits
    elif base >= 2 * sms:  # enough programs without splitting the context
        splits = 1
    else:
        splits = min(math.ceil(tuning.waves * sms / base), -(-keys // tuning.min_partition))
    splits = max(1, min(splits, tuning.max_splits))
    partition = -(-(-(-keys // splits)) // block_n) * block_n
    splits = -(-keys // partition)
    return PagedLaunch(block_m, block_n, block_d, tiles, splits, partition, 4, 3 if block_d <= 128 else 2)


def paged_attention(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, max_seqlen_q, causal, scale, window,
                    softcap, sinks, k_scale, v_scale, max_seq_len):
    """(out like q, lse [T, Hq] fp32). Arguments as the public function takes them, checked."""
    t, hq, d = q.shape
    nb, bs, hkv, _ = k_cache.shape
    b = seq_lens.shape[0]
    g = hq // hkv
    out = empty(q.shape, q.dtype, q.device)
    lse = empty((t, hq), torch.float32, q.device)
    if t == 0 or b == 0:
        return out, lse
    varlen = cu_seqlens_q is not None
    max_table = block_table.shape[1]
    max_keys = min(max_seq_len, max_table * bs)
    p = paged_policy(b, hkv, g, d, max_seqlen_q if varlen else 1, max_keys, sm_count(q.device), TUNING.active())
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    mask_right = right >= 0 and (varlen or right > 0 or not causal)
    mask_left = left >= 0
    log2e = 1.4426950408889634
    qk_mul = scale / softcap if softcap > 0 else scale * log2e
    cap_mul = softcap * log2e
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    f32 = q.dtype == torch.float32 or config.get().triton_interpret
    if p.splits > 1:
        po = torch.empty((t, hq, p.splits, d), dtype=torch.float32, device=q.device)
        plse = torch.empty((t, hq, p.splits), dtype=torch.float32, device=q.device)
    else:
        po = plse = None
    grid = (b * hkv * p.tiles, p.splits)
    _fwd(grid, q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, sinks, k_scale if fp8 else None,
         v_scale if fp8 else None, out, lse, po, plse, qk_mul, cap_mul, left, right, hkv, p.tiles, p.partition, nb,
         max_table, max_keys, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
         v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_table.stride(0), hq,
         G=g, D=d, BS=bs, BLOCK_M=p.block_m, BLOCK_N=p.block_n, BLOCK_D=p.block_d, SPLITS=p.splits, VARLEN=varlen,
         MASK_RIGHT=mask_right, MASK_LEFT=mask_left, SOFTCAP=softcap > 0, HAS_SINKS=sinks is not None, FP8=fp8,
         F32=f32, num_warps=p.num_warps, num_stages=p.num_stages)
    if p.splits > 1:
        _reduce((t * hq,), po, plse, sinks, out, lse, D=d, SPLITS=p.splits, BLOCK_S=_pow2(p.splits),
                BLOCK_D=p.block_d, HAS_SINKS=sinks is not None, Hq=hq, num_warps=4 if p.block_d >= 128 else 2)
    return out, lse


def merge_attn_states(out_a, lse_a, out_b, lse_b):
    t, h, d = out_a.shape
    out = empty(out_a.shape, out_a.dtype, out_a.device)
    lse = empty((t, h), torch.float32, out_a.device)
    rows = t * h
    if rows == 0 or d == 0:
        return out, lse
    block_d = _pow2(d)
    block_r = max(1, min(64, 2048 // block_d))
    _merge((-(-rows // block_r),), out_a, lse_a, out_b, lse_b, out, lse, rows, h, out_a.stride(0), out_a.stride(1),
           out_b.stride(0), out_b.stride(1), lse_a.stride(0), lse_a.stride(1), lse_b.stride(0), lse_b.stride(1),
           D=d, BLOCK_R=block_r, BLOCK_D=block_d, num_warps=4)
    return out, lse
