"""Launch policy, the cached multi-tensor plans and the launchers of the optimizer kernels.

A *plan* is what one launch needs beyond scalars: a device table with one row per tensor
(numel and the addresses of param, grad, states, master and step; see kernels.py) and a chunk
map (table row, chunk index) with one entry per program. Tensors are split into *buckets* by
(param dtype, grad dtype, state dtype, 16-byte alignment), one launch each. Plans are cached in two levels:
the *layout* (buckets, chunk maps: the costly part, ~6 ms of host time for 146 tensors) by the
sizes, dtypes, alignments and the addresses of everything but the grads; the tables by the exact
addresses. ``zero_grad(set_to_none=True)`` (torch's default) gives fresh grads every step, which
the caching allocator need not place where they were: such a step builds only the small tables
(one row per tensor) on the cached layout. A table is copied to the device from pinned memory
without blocking the host, so no step synchronizes.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any, Sequence

import torch

from ...core.alloc import empty
from ..common.fast_launch import FastKernel
from .kernels import (_adamw_fwd_kernel, _adamw_steps_kernel, _norm_finalize_kernel, _norm_partial_kernel,
                      _scale_kernel)

ROW = 8
_PLAN_CACHE_SIZE = 16

_adamw = FastKernel(_adamw_fwd_kernel)
_steps = FastKernel(_adamw_steps_kernel)
_partial = FastKernel(_norm_partial_kernel)
_finalize = FastKernel(_norm_finalize_kernel)
_scale = FastKernel(_scale_kernel)


@dataclasses.dataclass(frozen=True)
class OptLaunch:
    block: int  # elements per loop iteration of one program
    iters: int  # loop iterations per program: a chunk is block * iters elements
    num_warps: int

    @property
    def chunk(self) -> int:
        return self.block * self.iters


@functools.lru_cache(maxsize=None)
def opt_policy(total: int) -> OptLaunch:
    """1024-element blocks, 4 warps: 8 elements per thread, one 16-byte access per bf16 tensor and
    two per fp32 state. Large problems take 32K-element chunks (one table lookup and one fp64
    bias correction amortized over 32 blocks, ~30K programs for 1B parameters); small ones
    (tests, tiny models) 256 x 4 so several programs share a tensor and the tail path runs."""
    if total >= 1 << 22:
        return OptLaunch(1024, 32, 4)
    return OptLaunch(256, 4, 2)


@dataclasses.dataclass(frozen=True)
class Bucket:
    first: int  # index (in the call's lists) of a tensor of this bucket: its dtypes type the pointers
    rows: int
    chunks: int
    aligned: bool
    table: torch.Tensor  # int64 [rows, ROW] on the device
    chunk_map: torch.Tensor  # int32 [chunks, 2] on the device


@dataclasses.dataclass(frozen=True)
class _Layout:
    members: tuple[tuple[int, ...], ...]  # per bucket, the indices of its tensors
    aligned: tuple[bool, ...]
    chunk_maps: tuple[torch.Tensor, ...]  # on the device


_layouts: collections.OrderedDict[tuple, _Layout] = collections.OrderedDict()
_plans: collections.OrderedDict[tuple, tuple[_Layout, tuple[Bucket, ...]]] = collections.OrderedDict()


def clear_plans() -> None:
    _layouts.clear()
    _plans.clear()


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def _chunk_map(numels: list[int], chunk: int) -> torch.Tensor:
    counts = torch.tensor([-(-n // chunk) for n in numels], dtype=torch.int64)
    rows = torch.repeat_interleave(torch.arange(len(numels)), counts)
    firsts = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    return torch.stack([rows, torch.arange(rows.numel()) - firsts], dim=1).to(torch.int32)


def _layout(cols: Sequence[Sequence[int]], numels: list[int], dts: Sequence[Sequence[torch.dtype | None]],
            device: torch.device, chunk: int) -> _Layout:
    groups: dict[tuple, list[int]] = {}
    for i in range(len(numels)):  # empty tensors keep a row (their step still counts), no chunk
        aligned = all(c[i] % 16 == 0 for c in cols if c[i] != 0)
        groups.setdefault((aligned,) + tuple(d[i] for d in dts), []).append(i)
    return _Layout(tuple(tuple(idx) for idx in groups.values()), tuple(k[0] for k in groups),
                   tuple(_to_device(_chunk_map([numels[i] for i in idx], chunk), device) for idx in groups.values()))


def _tables(lay: _Layout, cols: Sequence[Sequence[int]], numels: list[int], device: torch.device) -> tuple[Bucket, ...]:
    buckets = []
    for idx, aligned, cmap in zip(lay.members, lay.aligned, lay.chunk_maps):
        table = torch.tensor([[numels[i]] + [c[i] for c in cols] for i in idx], dtype=torch.int64)
        buckets.append(Bucket(idx[0], len(idx), cmap.shape[0], aligned, _to_device(table, device), cmap))
    return tuple(buckets)


def _addresses(ts: Sequence[torch.Tensor] | None, n: int) -> list[int]:
    return [t.data_ptr() for t in ts] if ts else [0] * n


def _remember(cache: collections.OrderedDict, key: tuple, value: Any) -> None:
    cache[key] = value
    if len(cache) > _PLAN_CACHE_SIZE:
        cache.popitem(last=False)


def plan(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], exp_avgs: Sequence[torch.Tensor] | None,
         exp_avg_sqs: Sequence[torch.Tensor] | None, max_exp_avg_sqs: Sequence[torch.Tensor] | None,
         masters: Sequence[torch.Tensor] | None, steps: Sequence[torch.Tensor] | None,
         chunk: int) -> tuple[Bucket, ...]:
    """The buckets for these tensors: from the cache when every address, size and dtype matches;
    on the cached layout (new tables only) when only grad addresses moved."""
    return _plan(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps, chunk).buckets


@dataclasses.dataclass
class Prepared:
    """A plan with what re-tabling it for other grad addresses needs (``AdamW``'s step cache)."""
    lay: _Layout
    cols: list[list[int]]  # addresses per tensor kind (kernels.py's table columns); cols[1]: the grads
    numels: list[int]
    device: torch.device
    buckets: tuple[Bucket, ...]
    pol: OptLaunch | None = None

    def regrad(self, gcol: list[int]) -> None:
        """The tables for grads at these addresses (same sizes and dtypes), on the same layout
        when every grad keeps its 16-byte alignment; a new plan otherwise."""
        if [a % 16 == 0 for a in gcol] != [a % 16 == 0 for a in self.cols[1]]:
            raise ValueError("a grad changed alignment: plan again")
        self.cols[1] = gcol
        self.buckets = _tables(self.lay, self.cols, self.numels, self.device)


def _plan(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps, chunk: int) -> Prepared:
    n = len(params)
    gcol = _addresses(grads, n)
    cols = [_addresses(params, n), gcol, _addresses(exp_avgs, n), _addresses(exp_avg_sqs, n),
            _addresses(max_exp_avg_sqs, n), _addresses(masters, n), _addresses(steps, n)]
    numels = [p.numel() for p in params]
    dts = ([p.dtype for p in params], [g.dtype for g in grads],
           [m.dtype for m in exp_avgs] if exp_avgs else [None] * n)  # a bucket's dtypes type its pointers
    device = params[0].device
    fixed = (device, chunk, tuple(numels)) + tuple(tuple(d) for d in dts) + tuple(
        tuple(c) for c in cols if c is not gcol)
    key = fixed + (tuple(gcol),)
    hit = _plans.get(key)
    if hit is not None:
        _plans.move_to_end(key)
        return Prepared(hit[0], cols, numels, device, hit[1])
    lkey = fixed + (tuple(a % 16 == 0 for a in gcol),)  # a grad's alignment picks its bucket
    lay = _layouts.get(lkey)
    if lay is None:
        lay = _layout(cols, numels, dts, device, chunk)
        _remember(_layouts, lkey, lay)
    else:
        _layouts.move_to_end(lkey)
    buckets = _tables(lay, cols, numels, device)
    _remember(_plans, key, (lay, buckets))
    return Prepared(lay, cols, numels, device, buckets)


def _hi_lo(x: float) -> tuple[float, float]:
    """A double as two fp32 values whose sum carries ~48 bits (the kernels add them in fp64)."""
    hi = float(torch.tensor(x, dtype=torch.float32))
    return hi, float(torch.tensor(x - hi, dtype=torch.float32))


def adamw(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps, lr: float,
          lr_tensor: torch.Tensor | None, beta1: float, beta2: float, eps: float, weight_decay: float, amsgrad: bool,
          maximize: bool, grad_scale: torch.Tensor | None, found_inf: torch.Tensor | None) -> Prepared | None:
    """One AdamW step over every tensor, in place: 1 update launch + 1 step-counter launch per bucket.
    Returns the plan it ran (None without params)."""
    if not params:
        return None
    prep = prepare(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps, amsgrad)
    adamw_prepared(prep, params, grads, exp_avgs, steps, lr, lr_tensor, beta1, beta2, eps, weight_decay, amsgrad,
                   maximize, bool(masters), grad_scale, found_inf)
    return prep


def prepare(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps, amsgrad: bool) -> Prepared:
    """The plan of an AdamW step over these tensors (non-empty lists)."""
    pol = opt_policy(sum(p.numel() for p in params))
    prep = _plan(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs if amsgrad else None, masters or None, steps,
                 pol.chunk)
    prep.pol = pol
    return prep


def adamw_prepared(prep: Prepared, params, grads, exp_avgs, steps, lr: float, lr_tensor: torch.Tensor | None,
                   beta1: float, beta2: float, eps: float, weight_decay: float, amsgrad: bool, maximize: bool,
                   master: bool, grad_scale: torch.Tensor | None, found_inf: torch.Tensor | None) -> None:
    """The launches of one AdamW step on a plan of these tensors (whose addresses it holds)."""
    pol = prep.pol
    lr_hi, lr_lo = _hi_lo(lr)
    b1_hi, b1_lo = _hi_lo(beta1)
    b2_hi, b2_lo = _hi_lo(beta2)
    decay = 1.0 - lr * weight_decay
    dummy = steps[0]
    for b in prep.buckets:
        if b.chunks:
            _adamw((b.chunks,), b.table, b.chunk_map, params[b.first], grads[b.first], exp_avgs[b.first],
                   lr_tensor if lr_tensor is not None else dummy, grad_scale if grad_scale is not None else dummy,
                   found_inf if found_inf is not None else dummy, lr_hi, lr_lo, b1_hi, b1_lo, b2_hi, b2_lo,
                   1.0 - beta1, beta2, 1.0 - beta2, eps, weight_decay, decay, ROW=ROW, BLOCK=pol.block, ITERS=pol.iters,
                   AMSGRAD=amsgrad, MAXIMIZE=maximize, MASTER=master, LR_TENSOR=lr_tensor is not None,
                   HAS_SCALE=grad_scale is not None, HAS_INF=found_inf is not None, ALIGNED=b.aligned,
                   num_warps=pol.num_warps)
    for b in prep.buckets:
        _steps((1,), b.table, b.rows, found_inf if found_inf is not None else dummy, ROW=ROW,
               HAS_INF=found_inf is not None, BLOCK=128, num_warps=4)


NORMS = {2.0: 0, 1.0: 1, float("inf"): 2}


def norm_kind(norm_type: float) -> int:
    return NORMS.get(norm_type, 3)


def clip_grad_norm(grads: list[torch.Tensor], max_norm: float, norm_type: float, out_dtype: torch.dtype,
                   apply: bool = True) -> torch.Tensor:
    """total = ||concat(grads)||_p (fp32 partials per chunk, one finalize program), then
    g *= min(max_norm / (total + 1e-6), 1) when ``apply``: 2 + 2 x buckets launches, no host sync."""
    device = grads[0].device
    total = empty((), out_dtype, device)
    kind = norm_kind(norm_type)
    pol = opt_policy(sum(g.numel() for g in grads))
    buckets = plan(grads, grads, None, None, None, None, None, pol.chunk)
    n_part = sum(b.chunks for b in buckets)
    partial = torch.empty(max(n_part, 1), dtype=torch.float32, device=device)
    if n_part == 0:
        partial.zero_()
    at = 0
    for b in buckets:
        _partial((b.chunks,), b.table, b.chunk_map, grads[b.first], partial[at:], float(norm_type), ROW=ROW,
                 BLOCK=pol.block, ITERS=pol.iters, NORM=kind, ALIGNED=b.aligned, num_warps=pol.num_warps)
        at += b.chunks
    coef = torch.empty((), dtype=torch.float32, device=device)
    _finalize((1,), partial, max(n_part, 1), total, coef, float(max_norm), float(norm_type), NORM=kind, BLOCK=1024,
              num_warps=4)
    for b in buckets if apply else ():
        _scale((b.chunks,), b.table, b.chunk_map, grads[b.first], coef, ROW=ROW, BLOCK=pol.block, ITERS=pol.iters,
               ALIGNED=b.aligned, num_warps=pol.num_warps)
    return total
