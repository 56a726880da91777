"""Launch policy and launcher of MLA decode.

The split count depends only on host integers (batch, heads, max_seq_len, SM count), never on
device data, so a call is CUDA-graph capturable and its scratch has a size fixed by its arguments.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import torch

from ...core import config, gpus
from ...core.alloc import empty
from ...core.tuning import TuningStack, hash_once
from ..attention.kernels import _paged_attn_reduce_kernel
from ..attention.launch import ReduceLaunch, sm_count
from ..common.fast_launch import FastKernel
from .kernels import _mla_decode_fwd_kernel

_fwd = FastKernel(_mla_decode_fwd_kernel)
_reduce = FastKernel(_paged_attn_reduce_kernel)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@hash_once
@dataclasses.dataclass(frozen=True)
class MlaTuning:
    """Knobs of the MLA policy (tests force rare shapes; a GPU sweep passes them through TUNING.use(...))."""

    splits: int | None = None  # force this many KV splits (None: the policy decides)
    block_h: int | None = None  # heads per program (None: up to 64)
    block_n: int | None = None  # cached tokens per iteration (None: 32)
    num_warps: int | None = None
    num_stages: int | None = None
    # rescale the accumulator only when a row max grew by > 2^8: correct, but its branch cost
    # 10-30% on the H100 (the accumulator rescale is not what bounds this kernel), so off
    lazy: bool = False
    prefetch_pages: bool | None = None  # force the block-table prefetch on or off (None: the policy decides)
    waves: float = 1.0  # programs wanted per SM before splitting stops (1 beat 2 by 1-6%)
    # the Gluon wgmma kernel on sm_90 (gluon_sm90.py): None = wherever it applies, False = never
    wgmma: bool | None = None
    wgmma_block_n: int = 64  # tokens per tile of the wgmma kernel (a divisor of the page size)
    # eager calls (not under CUDA-graph capture) take the Gluon kernel only from this much work,
    # batch x heads x max_keys (B64 ctx4096 at 128 heads is 2^25): its launch (two TMA descriptors
    # built and encoded per call) costs 20-65 us more host time than the Triton kernel's on the lent
    # H100 host (2026-11-25), which an eager call earns back only on large batches; calls
    # under capture (how serving engines run decode) always take it
    wgmma_eager_min_work: int = 1 << 24
    wgmma_ws: bool = True  # warp-specialized form (warpgroup 0: QK + softmax + PV half; 1: PV half + loads)
    wgmma_stages: int = 2  # cache tiles in flight (shared memory: 72 KB of queries + 72 KB per 64-token stage)
    min_partition: int = 256  # fewest tokens per split
    max_splits: int = 64  # the reduce kernel holds every split's partial of one row at once


TUNING = TuningStack(MlaTuning())


@dataclasses.dataclass(frozen=True)
class MlaLaunch:
    block_h: int
    block_n: int
    block_r: int
    block_p: int
    head_tiles: int
    splits: int
    partition: int  # tokens per split, a multiple of block_n
    num_warps: int
    num_stages: int
    lazy: bool
    prefetch_pages: bool  # the next step's block-table entries loaded one step ahead


@functools.lru_cache(maxsize=4096)
def mla_policy(batch: int, heads: int, rank: int, rope_dim: int, max_keys: int, sms: int, fp8: bool = False,
               tuning: MlaTuning = MlaTuning()) -> MlaLaunch:
    block_r = _pow2(rank)
    block_p = max(16, _pow2(rope_dim))
    # tl.dot needs M >= 16; 64 heads x 512 fp32 accumulators are 128 registers per thread at 8 warps
    block_h = tuning.block_h or min(64, max(16, _pow2(heads)))
    # measured on an H100 (2026-11-23): 64 tokens per
    # iteration at 64-head tiles (25.5% of copy vs 21% at 32), 32 for small head counts
    block_n = tuning.block_n or (64 if block_h >= 64 else 32)
    head_tiles = -(-heads // block_h)
    base = max(1, batch * head_tiles)
    keys = max(1, max_keys)
    if tuning.splits is not None:
        splits = tuning.splits
    elif base >= 2 * sms:
        splits = 1
    elif block_h >= 64:
        # one program per SM (the 64 x 512 accumulator and the cache tiles): the most splits that
        # still fit one wave, since a second wave of a few programs costs a whole program's time
        # (B4 ctx 32768: the old ceil rule gave 17 splits = 136 programs on 132 SMs, this one 16)
        splits = min(max(1, sms // base), -(-keys // tuning.min_partition))
    else:
        splits = min(math.ceil(tuning.waves * sms / base), -(-keys // tuning.min_partition))
    splits = max(1, min(splits, tuning.max_splits))
    partition = -(-(-(-keys // splits)) // block_n) * block_n
    splits = -(-keys // partition)
    warps = tuning.num_warps or (8 if block_h * block_r >= 32 * 512 else 4)
    # fp8 caches: one stage measured 8% faster than two at 64-head tiles (the e4m3 widening
    # between load and dot leaves nothing for a second buffer to hide)
    stages = (1 if block_h >= 64 else 2) if fp8 else 2  # (nested: the C translation takes no `and` of ints)
    # block-table prefetch, H100 (2026-11-25): 16 heads 167 -> 136 us,
    # 128 heads 416 -> 405 us; an fp8 cache at 64-head tiles (one stage) 445 -> 459 us, so not there
    prefetch = (block_h < 64) if fp8 else True
    if tuning.prefetch_pages is not None:
        prefetch = tuning.prefetch_pages
    return MlaLaunch(block_h, block_n, block_r, block_p, head_tiles, splits, partition, warps,
                     tuning.num_stages or stages, tuning.lazy, prefetch)


def mla_reduce_policy(splits: int) -> ReduceLaunch:
    """_paged_attn_reduce_kernel over MLA's partials: one program per (sequence, head) merges its
    ``splits`` partials of R values (R = 512 in every DeepSeek model: 4 warps)."""
    return ReduceLaunch(_pow2(splits), 4)


@functools.lru_cache(maxsize=None)
def _wgmma_import():
    """(gluon_sm90, None), or (None, why) where Gluon's Hopper module does not import (a Triton
    without Gluon, or one whose Gluon API moved): the why goes into the rejection reason."""
    try:
        from . import gluon_sm90
    except Exception as exc:  # noqa: BLE001 - any import failure makes the kernel unavailable, with its reason
        return None, f"{type(exc).__name__}: {exc}"
    return gluon_sm90, None


def _wgmma_module():
    return _wgmma_import()[0]


def wgmma_shape_reason(arch, device_type: str, q_dtype: torch.dtype, cache_dtype: torch.dtype, heads: int,
                       rank: int, rope_dim: int, block_size: int, tuning: MlaTuning) -> str | None:
    """None when the sm_90 Gluon kernel covers these facts of a call (strides aside), else why not."""
    if tuning.wgmma is False:
        return "turned off (MlaTuning.wgmma=False)"
    if config.get().triton_interpret or device_type != "cuda":
        return "needs an sm_90 GPU (not the interpreter)"
    if not (gpus.has(arch, "wgmma") and gpus.has(arch, "tma")):  # (sm_90 alone: Blackwell has tcgen05)
        return "needs sm_90 (wgmma and TMA)"
    if cache_dtype != q_dtype or q_dtype not in (torch.bfloat16, torch.float16):
        return "needs a bf16/fp16 cache in the query dtype"
    if rank != 512 or rope_dim != 64:
        return "needs kv_lora_rank 512 and rope_dim 64"
    if heads < 64:
        return "needs at least 64 heads (one 64-row wgmma tile per program)"
    if block_size % tuning.wgmma_block_n:
        return f"needs a page size that is a multiple of {tuning.wgmma_block_n}"
    if _wgmma_module() is None:
        return f"Gluon (triton.experimental.gluon, Hopper) is not importable ({_wgmma_import()[1]})"
    return None


def wgmma_reason(q_nope, q_pe, kv_cache, tuning: MlaTuning) -> str | None:
    """None when the Gluon wgmma kernel serves this call, else why not (tests, the launcher)."""
    arch = torch.cuda.get_device_capability(q_nope.device) if q_nope.device.type == "cuda" else None
    nb, bs, _ = kv_cache.shape
    reason = wgmma_shape_reason(arch, q_nope.device.type, q_nope.dtype, kv_cache.dtype, q_nope.shape[1],
                                q_nope.shape[2], q_pe.shape[2], bs, tuning)
    if reason is None and (kv_cache.stride(2) != 1 or kv_cache.stride(0) != bs * kv_cache.stride(1)
                           or (kv_cache.stride(1) * kv_cache.element_size()) % 16 or kv_cache.data_ptr() % 16):
        return "needs a cache whose rows form one 16-byte aligned 2-D view (TMA)"
    return reason


@functools.lru_cache(maxsize=64)
def _wgmma_policy_tuning(tuning: MlaTuning) -> MlaTuning:
    """The split policy's view of the Gluon kernel's tiles (64 heads, wgmma_block_n tokens)."""
    return dataclasses.replace(tuning, block_h=64, block_n=tuning.wgmma_block_n)


@functools.lru_cache(maxsize=16)
def _wgmma_layouts(bn: int, r: int, p_dim: int, dtype: torch.dtype):
    """Shared-memory layouts of the TMA boxes (128-byte swizzle), built once per shape."""
    from triton.experimental.gluon import language as gl
    gdt = gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    return (gl.NVMMASharedLayout.get_default_for([bn, r], gdt), gl.NVMMASharedLayout.get_default_for([bn, p_dim], gdt))


@functools.lru_cache(maxsize=None)
def _gluon_kernel(ws: bool) -> FastKernel:
    """The Gluon kernel behind a FastKernel, as every kernel of the package."""
    kw = _wgmma_module()
    return FastKernel(kw._mla_decode_ws_kernel if ws else kw._mla_decode_wgmma_kernel)


def _mla_decode_wgmma(q_nope, q_pe, kv_cache, block_table, seq_lens, out, lse, scale, max_keys, tuning: MlaTuning):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    b, h, r = q_nope.shape
    p_dim = q_pe.shape[2]
    nb, bs, width = kv_cache.shape
    bn = tuning.wgmma_block_n
    p = mla_policy(b, h, r, p_dim, max_keys, sm_count(q_nope.device), False, _wgmma_policy_tuning(tuning))
    c_layout, pe_layout = _wgmma_layouts(bn, r, p_dim, q_nope.dtype)
    kv2d = kv_cache.view(nb * bs, width) if kv_cache.is_contiguous() else kv_cache.as_strided(
        (nb * bs, width), (kv_cache.stride(1), 1))
    c_desc = TensorDescriptor(kv2d, [nb * bs, width], [kv_cache.stride(1), 1], [bn, r], c_layout)
    pe_desc = TensorDescriptor(kv2d, [nb * bs, width], [kv_cache.stride(1), 1], [bn, p_dim], pe_layout)
    if p.splits > 1:
        po = torch.empty((b, h, p.splits, r), dtype=torch.float32, device=q_nope.device)
        plse = torch.empty((b, h, p.splits), dtype=torch.float32, device=q_nope.device)
    else:
        po = plse = None
    _gluon_kernel(tuning.wgmma_ws)((b * p.head_tiles, p.splits),
        q_nope, q_pe, c_desc, pe_desc, block_table, seq_lens, out, lse, po, plse,
        scale * 1.4426950408889634, h, p.head_tiles, p.partition, nb, max_keys,
        q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), block_table.stride(0),
        R=r, P=p_dim, BS=bs, BLOCK_H=64, BLOCK_N=bn, STAGES=tuning.wgmma_stages, SPLITS=p.splits,
        num_warps=4 if tuning.wgmma_ws else 8)
    if p.splits > 1:
        red = mla_reduce_policy(p.splits)
        _reduce((b * h,), po, plse, None, out, lse, p.splits, D=r, BLOCK_S=red.block_s,
                BLOCK_D=p.block_r, HAS_SINKS=False, Hq=h, num_warps=red.num_warps)


def mla_decode(q_nope, q_pe, kv_cache, block_table, seq_lens, scale, kv_scale, max_seq_len):
    """(out ``[B, H, R]`` like q_nope, lse ``[B, H]`` fp32). Arguments as the public function
    takes them, checked."""
    b, h, r = q_nope.shape
    p_dim = q_pe.shape[2]
    nb, bs, _ = kv_cache.shape
    out = empty((b, h, r), q_nope.dtype, q_nope.device)
    lse = empty((b, h), torch.float32, q_nope.device)
    if b == 0 or h == 0:
        return out, lse
    max_table = block_table.shape[1]
    max_keys = min(max_seq_len, max_table * bs)
    fp8 = kv_cache.dtype == torch.float8_e4m3fn
    tuning = TUNING.active()
    if wgmma_reason(q_nope, q_pe, kv_cache, tuning) is None and (
            b * h * max_keys >= tuning.wgmma_eager_min_work
            or (q_nope.is_cuda and torch.cuda.is_current_stream_capturing())):
        _mla_decode_wgmma(q_nope, q_pe, kv_cache, block_table, seq_lens, out, lse, scale, max_keys, tuning)
        return out, lse
    p = mla_policy(b, h, r, p_dim, max_keys, sm_count(q_nope.device), fp8, tuning)
    f32 = q_nope.dtype == torch.float32 or config.get().triton_interpret
    if p.splits > 1:
        po = torch.empty((b, h, p.splits, r), dtype=torch.float32, device=q_nope.device)
        plse = torch.empty((b, h, p.splits), dtype=torch.float32, device=q_nope.device)
    else:
        po = plse = None
    _fwd((b * p.head_tiles, p.splits), q_nope, q_pe, kv_cache, block_table, seq_lens, kv_scale if fp8 else None,
         out, lse, po, plse, scale * 1.4426950408889634, h, p.head_tiles, p.partition, nb, max_table, max_keys,
         q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), kv_cache.stride(0), kv_cache.stride(1),
         block_table.stride(0), R=r, P=p_dim, BS=bs, BLOCK_H=p.block_h, BLOCK_N=p.block_n, BLOCK_R=p.block_r,
         BLOCK_P=p.block_p, SPLITS=p.splits, LAZY=p.lazy, FP8=fp8, F32=f32, PREFETCH_PAGES=p.prefetch_pages,
         num_warps=p.num_warps, num_stages=p.num_stages)
    if p.splits > 1:
        red = mla_reduce_policy(p.splits)
        _reduce((b * h,), po, plse, None, out, lse, p.splits, D=r, BLOCK_S=red.block_s,
                BLOCK_D=p.block_r, HAS_SINKS=False, Hq=h, num_warps=red.num_warps)
    return out, lse
