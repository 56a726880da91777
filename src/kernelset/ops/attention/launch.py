"""Launch policy and launchers of the attention kernels (paged decode, merge, dense/varlen prefill).

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
from ...core.arch import device_arch
from ...core.tuning import TuningStack, hash_once
from ..common.fast_launch import FastKernel
from .kernels import (_flash_attn_bwd_dkdv_kernel, _flash_attn_bwd_dq_kernel, _flash_attn_bwd_pre_kernel,
                      _flash_attn_fwd_kernel, _merge_attn_states_kernel, _paged_attn_fwd_kernel,
                      _paged_attn_reduce_kernel)

_fwd = FastKernel(_paged_attn_fwd_kernel)
_reduce = FastKernel(_paged_attn_reduce_kernel)
_merge = FastKernel(_merge_attn_states_kernel)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@hash_once
@dataclasses.dataclass(frozen=True)
class PagedTuning:
    """Knobs of the paged-attention policy (tests force rare shapes; GPU sweeps compare values)."""

    splits: int | None = None  # force this many KV splits (None: the policy decides)
    waves: float = 4.0  # programs wanted per SM before splitting stops
    min_partition: int = 256  # fewest keys per split
    max_splits: int = 64  # the reduce kernel holds every split's partial of one row at once
    block_n: int | None = None  # keys per iteration (None: the policy's choice, see paged_policy)
    num_warps: int | None = None  # None: 4
    num_stages: int | None = None  # None: 3 (2 at head size 256)


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
                 tuning: PagedTuning = PagedTuning(), fp8: bool = False) -> PagedLaunch:
    block_d = _pow2(head_dim)
    rows = max_seqlen_q * group
    # decode: the group's heads of one token (a tile of 16 to 64 rows); more query tokens: 64-row tiles
    block_m = min(64, max(16, _pow2(rows)))
    # keys per iteration, from the H100 sweep (2026-11-23):
    # decode over a 16/32-bit cache at D <= 128: 32 (97% of copy at B64 ctx4096 against 90% with 64);
    # an fp8 cache: 128 (dequantising in wider tiles: 270 us against 383 us with 32)
    if tuning.block_n:
        block_n = tuning.block_n
    elif block_d > 128:
        block_n = 32
    elif fp8:
        block_n = 128
    else:
        block_n = 32 if max_seqlen_q == 1 else 64
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
    # the policy's own splits cover whole multiples of 512 keys: on the H100 at B8 ctx32768, 9 splits
    # of 3648 keys ran 37% slower than 8 of 4096 (505 against 369 us, 2026-11-23)
    gran = block_n if tuning.splits is not None else max(block_n, 512)
    partition = -(-(-(-keys // splits)) // gran) * gran
    splits = -(-keys // partition)
    return PagedLaunch(block_m, block_n, block_d, tiles, splits, partition, tuning.num_warps or 4,
                       tuning.num_stages or (3 if block_d <= 128 else 2))


@dataclasses.dataclass(frozen=True)
class ReduceLaunch:
    block_s: int  # splits held at once (all of them)
    num_warps: int


def paged_reduce_policy(splits: int, block_d: int) -> ReduceLaunch:
    """_paged_attn_reduce_kernel: one program per (token, head) merges its ``splits`` partials."""
    return ReduceLaunch(_pow2(splits), 4 if block_d >= 128 else 2)


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
    p = paged_policy(b, hkv, g, d, max_seqlen_q if varlen else 1, max_keys, sm_count(q.device), TUNING.active(),
                     k_cache.dtype.itemsize == 1)
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
         v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_table.stride(0), hq, p.splits,
         G=g, D=d, BS=bs, BLOCK_M=p.block_m, BLOCK_N=p.block_n, BLOCK_D=p.block_d, SPLIT=p.splits > 1, VARLEN=varlen,
         MASK_RIGHT=mask_right, MASK_LEFT=mask_left, SOFTCAP=softcap > 0, HAS_SINKS=sinks is not None, FP8=fp8,
         F32=f32, num_warps=p.num_warps, num_stages=p.num_stages)
    if p.splits > 1:
        r = paged_reduce_policy(p.splits, p.block_d)
        _reduce((t * hq,), po, plse, sinks, out, lse, p.splits, D=d, BLOCK_S=r.block_s,
                BLOCK_D=p.block_d, HAS_SINKS=sinks is not None, Hq=hq, num_warps=r.num_warps)
    return out, lse


@dataclasses.dataclass(frozen=True)
class MergeLaunch:
    block_r: int  # (token, head) rows per program
    block_d: int
    num_warps: int
    grid: int


def merge_policy(rows: int, d: int) -> MergeLaunch:
    """merge_attn_states: ~2048 elements (at most 64 rows) per program."""
    block_d = _pow2(d)
    block_r = max(1, min(64, 2048 // block_d))
    return MergeLaunch(block_r, block_d, 4, -(-rows // block_r))


def merge_attn_states(out_a, lse_a, out_b, lse_b):
    t, h, d = out_a.shape
    out = empty(out_a.shape, out_a.dtype, out_a.device)
    lse = empty((t, h), torch.float32, out_a.device)
    rows = t * h
    if rows == 0:
        return out, lse
    if d == 0:  # no values to merge, only the lse (torch's logaddexp: -inf, +inf and NaN as the kernel's)
        torch.logaddexp(lse_a.float(), lse_b.float(), out=lse)
        return out, lse
    p = merge_policy(rows, d)
    _merge((p.grid,), out_a, lse_a, out_b, lse_b, out, lse, rows, h, out_a.stride(0), out_a.stride(1),
           out_b.stride(0), out_b.stride(1), lse_a.stride(0), lse_a.stride(1), lse_b.stride(0), lse_b.stride(1),
           D=d, BLOCK_R=p.block_r, BLOCK_D=p.block_d, num_warps=p.num_warps)
    return out, lse


# ---- dense / varlen prefill --------------------------------------------------------------------

_flash_fwd = FastKernel(_flash_attn_fwd_kernel)
_flash_pre = FastKernel(_flash_attn_bwd_pre_kernel)
_flash_dkdv = FastKernel(_flash_attn_bwd_dkdv_kernel)
_flash_dq = FastKernel(_flash_attn_bwd_dq_kernel)


@dataclasses.dataclass(frozen=True)
class FlashLaunch:
    """Tiles of the prefill kernels: forward (block_m query rows x block_n keys per step), dK/dV
    (block_n keys per program, block_m query rows per step) and dQ (as the forward)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    dkdv_m: int
    dkdv_n: int
    dkdv_warps: int
    dkdv_stages: int
    dq_m: int
    dq_n: int
    dq_warps: int
    dq_stages: int
    # dQ by atomic fp32 adds from the dK/dV kernel (5 products per tile pair; the dQ kernel and its
    # 2 recomputed products are skipped) unless torch's deterministic algorithms are on
    atomic_dq: bool = False
    # atomic dQ computed as (K^T dS^T)^T: at 32-row tiles a 128-row wgmma instead of a 32-row
    # mma.sync (H100: backward 8.6 vs 10.2 ms at B8 S4096 D128 causal); head sizes <= 128 only
    dq_trans: bool = False


@hash_once
@dataclasses.dataclass(frozen=True)
class FlashTuning:
    """Forces a whole FlashLaunch (tests: 16-row tiles so small shapes cross block boundaries;
    a GPU sweep passes other launches through FLASH_TUNING.use(...))."""

    launch: FlashLaunch | None = None


FLASH_TUNING = TuningStack(FlashTuning())


@functools.lru_cache(maxsize=256)
def flash_policy(head_dim: int, v_dim: int, arch: tuple[int, int] | None) -> FlashLaunch:
    """Tiles per padded head size. Register budget (255 per thread): the forward holds q
    [M, D] and the fp32 accumulator [M, Dv]; dK/dV holds k, v and two fp32 accumulators
    [N, D]; dQ holds q, dO and one accumulator. 8 warps at D 128 keep each under ~160 registers
    (no spills at sm_80/sm_90, checked by tests/test_flash_attention.py's AOT test)."""
    bd = max(_pow2(head_dim), _pow2(v_dim), 16)
    hopper = arch is not None and arch >= (9, 0)
    if bd <= 64:
        return FlashLaunch(128, 64, 4, 3 if hopper else 2, 64, 128, 8, 2, 128, 64, 4, 2, atomic_dq=hopper)
    if bd <= 128:
        if hopper:  # atomic dQ: 32 rows x 128 keys, 8 warps, dQ^T = K^T dS^T (H100, 2026-11-25)
            return FlashLaunch(128, 64, 8, 3, 32, 128, 8, 3, 128, 32, 8, 2, atomic_dq=True, dq_trans=True)
        return FlashLaunch(128, 64, 8, 2, 64, 64, 8, 2, 128, 32, 8, 2)
    if hopper:  # atomic dQ, 2 stages: 9.1 vs 14.2 ms backward at D256, 6.8 vs 9.5 at 192/128 (H100, 2026-11-25)
        return FlashLaunch(64, 64, 8, 2, 32, 64, 8, 2, 64, 32, 8, 1, atomic_dq=True)
    return FlashLaunch(64, 64, 8, 2, 32, 64, 8, 1, 64, 32, 8, 1)


def _launch_for(q: torch.Tensor, v: torch.Tensor) -> FlashLaunch:
    forced = FLASH_TUNING.active().launch
    if forced is not None:
        return forced
    return flash_policy(q.shape[-1], v.shape[-1], device_arch(q.device))


def _window_flags(causal: bool, left: int, right: int) -> tuple[int, int, bool, bool]:
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right, right >= 0, left >= 0


def _mults(scale: float, softcap: float) -> tuple[float, float]:
    log2e = 1.4426950408889634
    return (scale / softcap, softcap * log2e) if softcap > 0 else (scale * log2e, 1.0)


def _strides3(t: torch.Tensor, varlen: bool) -> tuple[int, int, int]:
    """(batch, token, head) strides of a dense [B, S, H, D] or varlen [T, H, D] tensor."""
    if varlen:
        return 0, t.stride(0), t.stride(1)
    return t.stride(0), t.stride(1), t.stride(2)


def _geometry(q, k, cu_q, max_q, max_k):
    varlen = cu_q is not None
    if varlen:
        b, sq, sk = cu_q.shape[0] - 1, max_q, max_k
    else:
        b, sq, sk = q.shape[0], q.shape[1], k.shape[1]
    return varlen, b, sq, sk


def flash_attention_fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window, softcap, sinks, need_lse):
    """(out [B, Sq, Hq, Dv] / [T, Hq, Dv] in q.dtype, lse fp32 [B, Hq, Sq] / [Hq, T]). Checked args."""
    varlen, b, sq, sk = _geometry(q, k, cu_q, max_q, max_k)
    hq, d = q.shape[-2:]
    hkv, dv = v.shape[-2:]
    out = empty((*q.shape[:-1], dv), q.dtype, q.device)
    lse = empty((hq, q.shape[0]) if varlen else (b, hq, sq), torch.float32, q.device)
    if q.numel() == 0 or b == 0 or sq == 0:
        return out, lse
    if k.shape[-3] == 0 and not varlen:  # no key at all: out 0, lse -inf (or the sink)
        out.zero_()
        lse.copy_(sinks.float()[:, None].expand(hq, sq) if sinks is not None else torch.full_like(lse, float("-inf")))
        return out, lse
    p = _launch_for(q, v)
    left, right, mask_right, mask_left = _window_flags(causal, *window)
    qk_mul, cap_mul = _mults(scale, softcap)
    f32 = q.dtype == torch.float32 or config.get().triton_interpret
    lse_b, lse_h = (0, lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1))
    grid = (-(-sq // p.block_m), b * hq)
    _flash_fwd(grid, q, k, v, out, lse, sinks, cu_q, cu_k, qk_mul, cap_mul, left, right, sq, sk,
               *_strides3(q, varlen), *_strides3(k, varlen), *_strides3(v, varlen), *_strides3(out, varlen),
               lse_b, lse_h, hq, G=hq // hkv, D=d, DV=dv, BLOCK_M=p.block_m, BLOCK_N=p.block_n,
               BLOCK_D=max(_pow2(d), 16), BLOCK_DV=max(_pow2(dv), 16), VARLEN=varlen, MASK_RIGHT=mask_right,
               MASK_LEFT=mask_left, SOFTCAP=softcap > 0, HAS_SINKS=sinks is not None, F32=f32,
               num_warps=p.num_warps, num_stages=p.num_stages)
    return out, lse


def _dsinks(sinks, lse, delta, varlen, cu_q, hq):
    """d sink_h = -sum_rows e^(sink_h - lse) * delta (the sink's probability times delta, which is
    rowsum(dO * O) - dLSE); fp32 [Hq]. ``delta`` in lse's layout."""
    lse_rows = lse if varlen else lse.transpose(0, 1).reshape(hq, -1)
    delta_rows = delta if varlen else delta.transpose(0, 1).reshape(hq, -1)
    terms = torch.exp(sinks.float()[:, None] - lse_rows) * delta_rows
    if varlen:
        # rows past cu_seqlens_q[-1] (padding) belong to no sequence: their lse and delta come from
        # unwritten out/lse rows and must not reach the shared sinks' gradient (compared on the
        # device: no host sync)
        terms = torch.where(torch.arange(terms.shape[1], device=terms.device) < cu_q[-1], terms, 0.0)
    return -terms.sum(1)


def flash_attention_bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, window, softcap, sinks,
                        dlse=None):
    """(dq like q, dk like k, dv like v, dsinks [Hq] fp32 or None); fp32 accumulation. dQ by fp32
    atomics from the dK/dV kernel (the order of its additions varies between runs) where the policy
    asks for it, else (and under torch.use_deterministic_algorithms) by its own kernel. ``dlse``
    (lse's shape, or None): the gradient reaching the returned LSE; since d lse_i / d s_ij = P_ij it
    enters as delta = rowsum(dO * O) - dlse (dS = P (dP - delta))."""
    varlen, b, sq, sk = _geometry(q, k, cu_q, max_q, max_k)
    hq, d = q.shape[-2:]
    hkv, dvh = v.shape[-2:]
    dq = empty(q.shape, q.dtype, q.device)
    dk = empty(k.shape, k.dtype, k.device)
    dv = empty(v.shape, v.dtype, v.device)
    delta = empty(lse.shape, torch.float32, q.device)
    if q.numel() == 0 or k.numel() == 0 or b == 0 or sq == 0 or sk == 0:
        dq.zero_(), dk.zero_(), dv.zero_()
        dsinks = None if sinks is None else torch.zeros_like(sinks, dtype=torch.float32)
        if sinks is not None and dlse is not None and lse.numel():
            # no key at all: out = 0 (delta = 0) and lse = the sink, so only dlse reaches it
            dsinks = _dsinks(sinks, lse, -dlse.float(), varlen, cu_q, hq)
        return dq, dk, dv, dsinks
    if dout.stride(-1) != 1 and dvh > 1:
        dout = dout.contiguous()
    p = _launch_for(q, v)
    left, right, mask_right, mask_left = _window_flags(causal, *window)
    qk_mul, cap_mul = _mults(scale, softcap)
    f32 = q.dtype == torch.float32 or config.get().triton_interpret
    lse_b, lse_h = (0, lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1))
    bd, bdv = max(_pow2(d), 16), max(_pow2(dvh), 16)
    # delta = rowsum(dO * O): rows (token, head) need one token stride over the batch
    tokens = q.shape[0] if varlen else b * sq
    o2 = out.reshape(tokens, hq, dvh)
    do2 = dout if (varlen or dout.stride(0) == sq * dout.stride(1) or b == 1) else dout.contiguous()
    do2 = do2.reshape(tokens, hq, dvh) if do2.stride(-1) == 1 else do2.contiguous().reshape(tokens, hq, dvh)
    rows = tokens * hq
    block_r = max(1, min(64, 4096 // bdv))
    _flash_pre((-(-rows // block_r),), o2, do2, delta, rows, hq, sq, o2.stride(0), o2.stride(1), do2.stride(0),
               do2.stride(1), lse_b, lse_h, DV=dvh, BLOCK_R=block_r, BLOCK_DV=bdv, VARLEN=varlen, num_warps=4)
    if dlse is not None:
        delta.sub_(dlse)
    common = dict(D=d, DVH=dvh, BLOCK_D=bd, BLOCK_DV=bdv, VARLEN=varlen, MASK_RIGHT=mask_right, MASK_LEFT=mask_left,
                  SOFTCAP=softcap > 0, F32=f32)
    g = hq // hkv
    atomic = p.atomic_dq and not torch.are_deterministic_algorithms_enabled()
    # the transposed dQ product at head sizes padded to 256 gave a wrong dQ on an H100 (Triton 3.6,
    # D 192: rel err 0.64, 2026-11-25); it is only claimed up to 128
    trans = atomic and p.dq_trans and bd <= 128
    # the fp32 dQ accumulator (zeroed: query rows no key block reaches get 0); without atomics the
    # kernel gets dk as a pointer it never dereferences
    dqa = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if atomic else dk
    _flash_dkdv((-(-sk // p.dkdv_n), b * hkv), q, k, v, dout, lse, delta, dk, dv, dqa, cu_q, cu_k, qk_mul, cap_mul,
                scale, scale, left, right, sq, sk, *_strides3(q, varlen), *_strides3(k, varlen),
                *_strides3(v, varlen), *_strides3(dout, varlen), *_strides3(dk, varlen), *_strides3(dv, varlen),
                *_strides3(dqa, varlen), lse_b, lse_h, hkv, G=g, BLOCK_M=p.dkdv_m, BLOCK_N=p.dkdv_n,
                ATOMIC_DQ=atomic, DQ_TRANS=trans, num_warps=p.dkdv_warps, num_stages=p.dkdv_stages, **common)
    if atomic:
        dq = dqa if q.dtype == torch.float32 else dq.copy_(dqa)
    else:
        _flash_dq((-(-sq // p.dq_m), b * hq), q, k, v, dout, lse, delta, dq, cu_q, cu_k, qk_mul, cap_mul, scale, left,
                  right, sq, sk, *_strides3(q, varlen), *_strides3(k, varlen), *_strides3(v, varlen),
                  *_strides3(dout, varlen), *_strides3(dq, varlen), lse_b, lse_h, hq, G=g, BLOCK_M=p.dq_m,
                  BLOCK_N=p.dq_n, num_warps=p.dq_warps, num_stages=p.dq_stages, **common)
    dsinks = None if sinks is None else _dsinks(sinks, lse, delta, varlen, cu_q, hq)
    return dq, dk, dv, dsinks
