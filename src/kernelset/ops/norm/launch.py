"""Launchers of the norm Triton kernels: shapes, strides, outputs, and the policy's choice.

The caller (the dispatcher, through ``supports``) has already checked dtypes, devices and that
every tensor's rows share one stride with a unit-stride last dim.
"""
from __future__ import annotations

import torch

from ...core.alloc import empty, empty_like
from ...core.arch import sm_count
from ...core.checks import row_stride
from ..common import ring_host
from ..common.fast_launch import FastKernel
from ..common.row_barrier import launches
from .kernels import (_norm_bwd_dwdb_kernel, _norm_bwd_kernel, _norm_bwd_looped_kernel, _norm_bwd_split_kernel,
                      _norm_fwd_kernel, _norm_fwd_looped_kernel, _norm_fwd_split_kernel, _rms_fwd_torch_order_kernel,
                      _rms_fwd_two_pass_kernel)
from .policy import (NormTuning, RingLaunch, active, bwd_policy, bwd_split_per_prog, bwd_split_policy, fwd_policy,
                     fwd_split_policy, ring_fwd_policy, torch_order_policy)
from .reference import torch_cuda_mean_block, torch_cuda_mean_factor

_fwd = FastKernel(_norm_fwd_kernel)
_fwd_looped = FastKernel(_norm_fwd_looped_kernel)
_fwd_split = FastKernel(_norm_fwd_split_kernel)
_fwd_two_pass = FastKernel(_rms_fwd_two_pass_kernel)
_bwd = FastKernel(_norm_bwd_kernel)
_bwd_looped = FastKernel(_norm_bwd_looped_kernel)
_bwd_dwdb = FastKernel(_norm_bwd_dwdb_kernel)
_bwd_split = FastKernel(_norm_bwd_split_kernel)
_fwd_torch_order = FastKernel(_rms_fwd_torch_order_kernel)


device_gbs_per_sm = ring_host.device_gbs_per_sm  # (a module global: tests stand another GPU in)


def ring_fwd_choice(n: int, dtype: torch.dtype, device: torch.device, tuning: NormTuning, *,
                    arch: tuple[int, int] | None = None, gbs_per_sm: float | None = None) -> RingLaunch | None:
    """The ring forward's launch where it applies to rows of n on this device (the tensor checks
    are the launcher's): sm_90, Gluon importable, the policy's widths and bandwidth class. ``arch``
    and ``gbs_per_sm`` describe another GPU than this device's (``ksctl plan``)."""
    if not ring_host.on_sm90(device, arch):
        return None
    gbs = device_gbs_per_sm(device) if gbs_per_sm is None else gbs_per_sm
    rp = ring_fwd_policy(n, dtype.itemsize if dtype.is_floating_point else 0, gbs, tuning)
    return rp if rp is not None and ring_host.gluon_kernel(*_RING)[0] is not None else None


_RING = ("kernelset.ops.norm.ring_sm90", "_rms_ring_fwd_kernel")


def _ring_fwd(x, weight, y, rstd, m, n, eps, offset, gemma_cast, stats, rp: RingLaunch, sms) -> bool:
    """Launch the ring forward where the tensors allow it; False where they do not, and nothing ran."""
    spec = (weight is not None, gemma_cast, stats)
    la = ring_host.launch_args(x, m, n, 1, rp, sms, _RING, spec) if y.is_contiguous() else None
    if la is None:
        return False
    grid, desc, sync, part = la
    ring_host.gluon_kernel(*_RING)[0](grid, desc, weight, y, rstd, part, sync, m, n, eps, offset,
                                 HAS_WEIGHT=weight is not None, GEMMA_CAST=gemma_cast, STORE_STATS=stats,
                                 S=rp.split, S_P2=rp.split_p2, NCH=rp.chunks, BOXR=rp.box_rows, NB=rp.buffers,
                                 num_warps=rp.num_warps)
    ring_host.learn(_RING, rp, x.dtype, spec)
    return True


# Sites of the bound launches (FastKernel.at): each fixes every constexpr and num_warps of its
# kernel; norm_fwd and rms_replay build them here, so a replay can only find a launch bound by the
# same constexprs.
def _two_pass_site(p, n: int, hw: bool, gemma_cast: bool, stats: bool, ho: bool) -> tuple:
    return (p.block_n, p.num_warps, hw, gemma_cast, stats, n % p.block_n == 0, ho)  # EVEN as launched


def _block_site(p, n: int, is_rms: bool, hr: bool, hw: bool, hb: bool, gemma_cast: bool, stats: bool,
                ho: bool) -> tuple:
    return (p.rows, p.block_n, p.num_warps, is_rms, hr, hw, hb, gemma_cast, stats, n == p.block_n, ho)


def _torch_order_site(block: tuple[int, int], n: int, hw: bool, gemma_cast: bool, stats: bool) -> tuple:
    lanes = block[0] * block[1]
    rows, unroll, nw = torch_order_policy(lanes, n, active())
    return (lanes, rows, unroll, nw, block[1], hw, gemma_cast, stats)  # (lanes, rows, unroll, num_warps, lanes_y, ...)


def _rows(x: torch.Tensor) -> int:
    n = x.shape[-1]
    return x.numel() // n if n else 0


def norm_fwd(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, *, eps: float,
             offset: float = 0.0, is_rms: bool, gemma_cast: bool, stats: bool = True,
             residual: torch.Tensor | None = None, out: torch.Tensor | None = None,
             h_out: torch.Tensor | None = None, tuning: NormTuning | None = None):
    """Returns (y, h or None, mean or None, rstd or None); y/h written into out/h_out when given."""
    # the decode-size hot path (one row): every attribute read and call here is host time
    shape = x.shape
    n = shape[-1]
    m = x.numel() // n if n else 0
    dev = x.device
    y = out if out is not None else empty_like(x)
    h = None
    if residual is not None:
        h = h_out if h_out is not None else empty_like(x)
    rstd = empty(shape[:-1], torch.float32, dev) if stats else None
    mean = empty(shape[:-1], torch.float32, dev) if stats and not is_rms else None
    if m == 0:
        return y, h, mean, rstd
    tuning = tuning or active()
    sms = sm_count(dev)
    p = fwd_policy(m, n, sms, is_rms and residual is None, tuning)
    # Unused pointers are passed as None: Triton specializes them away, and each tensor argument
    # costs host time at launch.
    sx = row_stride(x)
    sy = row_stride(y) if out is not None else n
    sr = row_stride(residual) if residual is not None else 0
    sh = (row_stride(h) if h_out is not None else n) if h is not None else 0
    sp = fwd_split_policy(n, sms, tuning) if p.looped else None  # (no extra call on the decode path)
    if p.looped and is_rms and residual is None:
        rp = ring_fwd_choice(n, x.dtype, dev, tuning)
        if rp is not None and _ring_fwd(x, weight, y, rstd, m, n, eps, offset, gemma_cast, stats, rp, sms):
            return y, h, mean, rstd
    if sp is not None and sp.split:
        for phase, sync, part in launches(dev, m, 1 if is_rms else 2, sp.split_p2):
            _fwd_split((m * sp.split,), x, residual, weight, bias, y, h, mean, rstd, part, sync, m, n, sp.split, sx,
                       sr, sy, sh, eps, offset, IS_RMS=is_rms, HAS_RESIDUAL=residual is not None,
                       HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, GEMMA_CAST=gemma_cast,
                       STORE_STATS=stats, CHUNK=sp.chunk, SPLIT_P2=sp.split_p2, PHASE=phase,
                       num_warps=sp.num_warps, fp_fusion=False)  # no FMA: both launch forms give the same bits
    elif p.looped:
        _fwd_looped((p.grid,), x, residual, weight, bias, y, h, mean, rstd, m, n, sx, sr, sy, sh, eps, offset,
                    IS_RMS=is_rms, HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None,
                    HAS_BIAS=bias is not None, GEMMA_CAST=gemma_cast, STORE_STATS=stats, BLOCK_N=p.block_n,
                    num_warps=p.num_warps)
    elif p.two_pass:
        # the site fixes every constexpr and num_warps (FastKernel.at checks the rest)
        hw, even, ho = weight is not None, n % p.block_n == 0, offset != 0.0
        site = _two_pass_site(p, n, hw, gemma_cast, stats, ho)
        if not _fwd_two_pass.at(site, (p.grid,), x, weight, y, rstd, n, sx, sy, eps, offset):
            _fwd_two_pass((p.grid,), x, weight, y, rstd, n, sx, sy, eps, offset, site=site, HAS_WEIGHT=hw,
                          GEMMA_CAST=gemma_cast, STORE_STATS=stats, CHUNK=p.block_n, EVEN=even, HAS_OFFSET=ho,
                          num_warps=p.num_warps)
    else:
        hr, hw, hb, even, ho = residual is not None, weight is not None, bias is not None, n == p.block_n, offset != 0.0
        site = _block_site(p, n, is_rms, hr, hw, hb, gemma_cast, stats, ho)
        if not _fwd.at(site, (p.grid,), x, residual, weight, bias, y, h, mean, rstd, m, n, sx, sr, sy, sh, eps,
                       offset):
            _fwd((p.grid,), x, residual, weight, bias, y, h, mean, rstd, m, n, sx, sr, sy, sh, eps, offset, site=site,
                 IS_RMS=is_rms, HAS_RESIDUAL=hr, HAS_WEIGHT=hw, HAS_BIAS=hb, GEMMA_CAST=gemma_cast, STORE_STATS=stats,
                 ROWS=p.rows, BLOCK_N=p.block_n, EVEN=even, HAS_OFFSET=ho, num_warps=p.num_warps)
    return y, h, mean, rstd


def rms_replay(x: torch.Tensor, weight: torch.Tensor | None, *, offset: float, gemma_cast: bool,
               torch_order: bool):
    """A launcher for later calls like this plain RMSNorm forward (no stats, y allocated by the
    caller): ``replay(x, weight, y, eps, offset) -> bool``, through the site its launch bound
    (``FastKernel.at``: False, nothing launched, where the tensors differ in what the kernel was
    compiled for). None where this call takes another form (looped, split, ring, the CPU). The
    public function keeps one per validated call signature (``api._EAGER``)."""
    n = x.shape[-1]
    m = x.numel() // n if n else 0
    if m == 0 or not x.is_cuda:
        return None
    sx = row_stride(x)
    hw = weight is not None
    if torch_order:
        block = torch_cuda_mean_block(m, n)
        if block is None:
            return None
        site = _torch_order_site(block, n, hw, gemma_cast, False)
        grid, factor, at = (-(-m // site[1]),), torch_cuda_mean_factor(m, n), _fwd_torch_order.at
        return lambda x, w, y, eps, offset: at(site, grid, x, w, y, None, m, n, sx, n, eps, factor, offset)
    p = fwd_policy(m, n, sm_count(x.device), True, active())
    ho, grid = offset != 0.0, (p.grid,)
    if p.looped:
        return None
    if p.two_pass:
        site, at = _two_pass_site(p, n, hw, gemma_cast, False, ho), _fwd_two_pass.at
        return lambda x, w, y, eps, offset: at(site, grid, x, w, y, None, n, sx, n, eps, offset)
    site = _block_site(p, n, True, False, hw, False, gemma_cast, False, ho)
    at = _fwd.at
    return lambda x, w, y, eps, offset: at(site, grid, x, None, w, None, y, None, None, None, m, n, sx, 0, n, 0,
                                           eps, offset)


def rms_fwd_torch_order(x: torch.Tensor, weight: torch.Tensor | None, *, eps: float, offset: float, gemma_cast: bool,
                        stats: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RMSNorm summing mean(x^2) in torch's CUDA order (the caller checked
    ``torch_cuda_mean_lanes(rows, n)`` is not None for some rows: whether it is depends on n only)."""
    shape = x.shape
    n = shape[-1]
    m = x.numel() // n
    dev = x.device
    y = empty(shape, x.dtype, dev)
    rstd = empty(shape[:-1], torch.float32, dev) if stats else None
    if m == 0:
        return y, rstd
    block = torch_cuda_mean_block(m, n)
    hw = weight is not None
    site = _torch_order_site(block, n, hw, gemma_cast, stats)
    lanes, rows, unroll, nw = site[:4]
    grid = (-(-m // rows),)
    args = (x, weight, y, rstd, m, n, row_stride(x), n, eps, torch_cuda_mean_factor(m, n), offset)
    if not _fwd_torch_order.at(site, grid, *args):
        _fwd_torch_order(grid, *args, site=site, HAS_WEIGHT=hw, GEMMA_CAST=gemma_cast, STORE_STATS=stats,
                         LANES=lanes, LANES_Y=block[1], ROWS=rows, UNROLL=unroll, num_warps=nw, fp_fusion=False)
    return y, rstd


def norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, mean: torch.Tensor | None,
             rstd: torch.Tensor, *, offset: float = 0.0, is_rms: bool, gemma_cast: bool, has_bias: bool,
             dres: torch.Tensor | None = None, tuning: NormTuning | None = None):
    """Returns (dx, dw or None, db or None) with dw/db in fp32; dx += dres when given."""
    n = x.shape[-1]
    m = _rows(x)
    dx = empty(x.shape, x.dtype, x.device)
    if m == 0:
        zero = torch.zeros(n, dtype=torch.float32, device=x.device)
        return dx, (zero if weight is not None else None), (zero.clone() if has_bias else None)
    tuning = tuning or active()
    has_w = weight is not None
    dummy = dx
    st = (mean if mean is not None else rstd, rstd)
    sms = sm_count(x.device)
    sp, rows = bwd_split_policy(n, sms, tuning)
    if sp.split:
        blocks = -(-m // rows)
        per = bwd_split_per_prog(blocks, rows, sp.split, sms, tuning)
        groups = -(-blocks // per)
        dw_part = empty((groups, n), torch.float32, x.device) if has_w else None
        db_part = empty((groups, n), torch.float32, x.device) if has_bias else None
        # counters and partials for every block of every group (the last group's blocks past m
        # run fully masked)
        for phase, sync, part in launches(x.device, groups * per, (1 if is_rms else 2) * rows, sp.split_p2):
            _bwd_split((groups * sp.split,), dy, x, weight if has_w else dummy, st[0], st[1],
                       dres if dres is not None else dummy, dx, dw_part if has_w else dummy,
                       db_part if has_bias else dummy, part, sync, m, n, sp.split, row_stride(dy), row_stride(x),
                       row_stride(dres) if dres is not None else 0, row_stride(dx), offset, IS_RMS=is_rms,
                       HAS_WEIGHT=has_w, HAS_BIAS=has_bias, HAS_DRES=dres is not None, GEMMA_CAST=gemma_cast,
                       ROWS=rows, CHUNK=sp.chunk, SPLIT_P2=sp.split_p2, PER=per, PHASE=phase, num_warps=sp.num_warps,
                       fp_fusion=False)  # no FMA: both launch forms give the same bits
        return dx, (dw_part.sum(0) if has_w else None), (db_part.sum(0) if has_bias else None)
    p = bwd_policy(m, n, sms, tuning)
    parts = p.dwdb_grid[1] if p.looped else p.grid
    dw_part = empty((parts, n), torch.float32, x.device) if has_w else None
    db_part = empty((parts, n), torch.float32, x.device) if has_bias else None
    if p.looped:
        _bwd_looped((p.grid,), 
            dy, x, weight if has_w else dummy, st[0], st[1], dres if dres is not None else dummy, dx, m, n,
            row_stride(dy), row_stride(x), row_stride(dres) if dres is not None else 0, row_stride(dx), offset,
            IS_RMS=is_rms, HAS_WEIGHT=has_w, HAS_DRES=dres is not None, BLOCK_N=p.block_n,
            num_warps=p.num_warps)
        if has_w or has_bias:
            _bwd_dwdb(p.dwdb_grid, 
                dy, x, st[0], st[1], dw_part if has_w else dummy, db_part if has_bias else dummy, m, n,
                row_stride(dy), row_stride(x), p.dwdb_rows_per_prog, IS_RMS=is_rms, HAS_WEIGHT=has_w,
                HAS_BIAS=has_bias, GEMMA_CAST=gemma_cast, BLOCK_M=tuning.dwdb_block_m,
                BLOCK_N=tuning.dwdb_block_n, num_warps=4)
    else:
        hd, pf = dres is not None, tuning.bwd_prefetch and x.element_size() == 2  # fp32: spills with the prefetch
        args = (dy, x, weight if has_w else dummy, st[0], st[1], dres if hd else dummy, dx,
                dw_part if has_w else dummy, db_part if has_bias else dummy, m, n, row_stride(dy), row_stride(x),
                row_stride(dres) if hd else 0, row_stride(dx), offset)
        site = (is_rms, has_w, has_bias, hd, gemma_cast, p.rows, p.block_n, pf, p.num_warps)  # every constexpr
        if not _bwd.at(site, (p.grid,), *args):
            _bwd((p.grid,), *args, site=site, IS_RMS=is_rms, HAS_WEIGHT=has_w, HAS_BIAS=has_bias, HAS_DRES=hd,
                 GEMMA_CAST=gemma_cast, ROWS=p.rows, BLOCK_N=p.block_n, PREFETCH=pf, num_warps=p.num_warps)
    return dx, (dw_part.sum(0) if has_w else None), (db_part.sum(0) if has_bias else None)
