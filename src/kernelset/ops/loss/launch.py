"""Launchers of the cross-entropy kernels."""
from __future__ import annotations

import dataclasses
import functools

import torch

from ...core.alloc import empty
from ...core.arch import sm_count
from ...core.checks import row_stride
from ...core.tuning import RingLaunch, SplitLaunch, TuningStack, hash_once, ring_launch
from ..common import ring_host
from ..common.fast_launch import FastKernel
from ..common.row_barrier import launches
from .kernels import _ce_fwd_kernel, _ce_fwd_split_kernel, _ce_grad_scale_kernel, _ce_reduce_kernel, _ce_scale_kernel

_fwd = FastKernel(_ce_fwd_kernel)
_fwd_split = FastKernel(_ce_fwd_split_kernel)
_scale = FastKernel(_ce_scale_kernel)
_reduce = FastKernel(_ce_reduce_kernel)
_grad_scale = FastKernel(_ce_grad_scale_kernel)


@hash_once
@dataclasses.dataclass(frozen=True)
class CETuning:
    # measured on H100 (8192 x 128256 bf16, 2026-11-22)
    block: int = 16384  # vocabulary chunk per loop step, with a gradient
    num_warps: int = 32
    programs_per_sm: int = 4  # persistent grid with a gradient: rows in flight per SM
    block_fwd: int = 16384  # forward only (no gradient): one program per row
    num_warps_fwd: int = 8
    # logits per lane of the loop's [block / ept, ept] view: each lane keeps its own online max
    # and sum, merged once per row. H200, 8192x128256 with a gradient
    # (2026-11-27): 77.9% of copy (8 and 16 alike) against 62.7% for the scalar form, which
    # reduced every chunk across the program twice; H100 91.6%
    ept: int = 8
    stream_store: bool = True  # gradient stores marked streaming (.cs): 59.5% vs 58.9% on H100
    scale_block: int = 4096
    reduce_block: int = 1024  # rows per step of the mean/sum reduction (one program)
    reduce_warps: int = 4
    # split kernel (with a gradient, vocabularies wider than split_chunk): one program per chunk
    # of split_chunk logits, the row's programs exchange partials (ops/common/row_barrier.py), so the logits
    # are read once. Off (0): on H100 it measured slower than the looped kernel (8192x128256
    # 73.3% of copy at chunk 8192 against 81.8%, 2026-11-25): the
    # barrier's latency costs more than pass 2's L2 misses at this width
    split_chunk: int = 0
    split_warps: int = 8
    # ring kernel (``ring_sm90.py``, sm_90, Gluon: logits held in a TMA ring in shared memory, S
    # programs per row exchanging (max, sum)): with a gradient, no softcap and no label
    # smoothing, 2-byte contiguous 16-byte aligned logits, ring_from..ring_to wide and a multiple
    # of 256 (portions of ring_portion, the last one ragged), on sm_90 GPUs with at least
    # ring_min_gbs_per_sm of datasheet bandwidth per SM (H100 SXM 25, H200 36; not measured on
    # the PCIe H100's 17.5). Portions of 16384 in chunks of 8 x 256, 9 buffers (36 KB), 4 warps,
    # 6 programs per SM, as the RMSNorm ring. Against the first launch
    # (portions of 32768, 16 x 256 chunks, 8 warps, 3 per SM), % of copy: H200 8192x128256 83.6 /
    # 80.9, 4096x262144 88.1 / 86.2, 16384x65536 89.4 / 85.0 (2026-11-27; 84.9 / 81.1 and 85.8 /
    # 82.4 in a second run that day); H100 93.0 / 91.9, 94.5 / 94.0 (2026-11-27). The looped kernel: H200
    # 73.5-76.1%, H100 90.8% at 8192x128256. With smoothing the kernel needs 92-98 registers, past
    # what 6 programs of 4 warps per SM allow (the first launch: H200 55.8% against the looped
    # 74.9%): those rows stay on the looped kernel. 0 turns it off.
    ring_min_gbs_per_sm: float = 20.0
    ring_from: int = 32768
    ring_to: int = 262144
    ring_portion: int = 16384
    ring_box_rows: int = 8
    ring_buffers: int = 9
    ring_warps: int = 4
    ring_programs_per_sm: int = 6
    # a ragged last portion masked per chunk row (row reductions) instead of per element: fits
    # the launch's registers under Triton 3.9 too (72-79 against 128-144, ptxas); H200
    # (2026-11-27) 84.6 / 84.9% at 8192x128256, 87.5 / 85.8% at 4096x262144 against the element-masked
    # form: mixed, so off under Triton 3.6 (the GPU image), where both fit
    ring_row_masks: bool = False


_tuning = TuningStack(CETuning())
active = _tuning.active
use = _tuning.use  # tests force several vocabulary chunks on short rows


@dataclasses.dataclass(frozen=True)
class CELaunch:
    block: int  # vocabulary chunk per loop step
    num_warps: int
    grid: int
    ept: int  # logits per lane


def ce_fwd_policy(m: int, v: int, sms: int, need_grad: bool, t: CETuning) -> CELaunch:
    """_ce_fwd_kernel's launch: with a gradient, few rows in flight (a persistent grid) so pass 2
    finds them in L2; without, one row per program."""
    block = min(t.block if need_grad else t.block_fwd, 1 << max(0, (v - 1).bit_length()))
    warps = min(t.num_warps if need_grad else t.num_warps_fwd, max(1, block // 256))
    return CELaunch(block, warps, min(m, t.programs_per_sm * sms) if need_grad else m, min(t.ept, block))


def ce_split_policy(v: int, sms: int, need_grad: bool, t: CETuning) -> SplitLaunch:
    """_ce_fwd_split_kernel's launch; ``split == 0`` where _ce_fwd_kernel runs (no gradient: one
    read of the logits either way; a vocabulary of one chunk)."""
    if not need_grad or t.split_chunk <= 0 or v <= t.split_chunk:
        return SplitLaunch(0, 0, 1, 1)
    split = -(-v // t.split_chunk)
    if split > 2 * sms:  # a row's programs must all be resident at once: two per SM always fit
        return SplitLaunch(0, 0, 1, 1)
    return SplitLaunch(t.split_chunk, split, 1 << max(0, (split - 1).bit_length()), t.split_warps)


@functools.lru_cache(maxsize=4096)
def ring_policy(v: int, itemsize: int, gbs_per_sm: float, t: CETuning) -> RingLaunch | None:
    """The ring kernel's launch for vocabularies of v (``ring_sm90.py``), or None where the
    looped or split kernel runs (the caller checks the gradient, softcap and tensors)."""
    if t.ring_min_gbs_per_sm <= 0 or gbs_per_sm < t.ring_min_gbs_per_sm or itemsize != 2:
        return None
    if not (t.ring_from <= v <= t.ring_to):
        return None
    return ring_launch(v, t.ring_portion, t.ring_box_rows, t.ring_buffers, t.ring_warps, t.ring_programs_per_sm,
                       ragged=True)


_RING = ("kernelset.ops.loss.ring_sm90", "_ce_ring_kernel")


def ring_choice(v: int, dtype: torch.dtype, device: torch.device, t: CETuning, *, need_grad: bool = True,
                softcap: float | None = None, smoothing: float = 0.0, arch: tuple[int, int] | None = None,
                gbs_per_sm: float | None = None) -> RingLaunch | None:
    """The ring kernel's launch where it applies to vocabularies of v on this device (the tensor
    checks are the launcher's): a gradient, no softcap, no label smoothing, sm_90, Gluon
    importable, the policy's widths and bandwidth class. ``arch`` and ``gbs_per_sm`` describe
    another GPU (``ksctl plan``)."""
    if not need_grad or softcap or smoothing or not ring_host.on_sm90(device, arch) or not dtype.is_floating_point:
        return None
    gbs = ring_host.device_gbs_per_sm(device) if gbs_per_sm is None else gbs_per_sm
    rp = ring_policy(v, dtype.itemsize, gbs, t)
    return rp if rp is not None and ring_host.gluon_kernel(*_RING)[0] is not None else None


def _ring_rows(logits, target, loss, lse, dx, scale, ignore_index, z_loss, rp: RingLaunch, sms) -> bool:
    """Launch the ring kernel where the tensors allow it; False where they do not, and nothing ran."""
    m, v = logits.shape
    ragged = rp.split * rp.chunks * rp.box_rows * 256 != v
    row_masks = ragged and active().ring_row_masks
    spec = (ragged, row_masks, target.dtype)
    la = ring_host.launch_args(logits, m, v, 2, rp, sms, _RING, spec) if dx.is_contiguous() else None
    if la is None:
        return False
    grid, desc, sync, part = la
    ring_host.gluon_kernel(*_RING)[0](grid, desc, logits, target, loss, lse, dx, scale, part, sync, m, v, ignore_index,
                                 z_loss, RAGGED=ragged, ROW_MASKS=row_masks, S=rp.split, S_P2=rp.split_p2, NCH=rp.chunks,
                                 BOXR=rp.box_rows, NB=rp.buffers, num_warps=rp.num_warps)
    ring_host.learn(_RING, rp, logits.dtype, spec)
    return True


def ce_rows(logits, target, loss, lse, dx, scale, ignore_index, smoothing, z_loss, softcap, need_grad):
    """Launch the cross-entropy kernel over logits [M, V] (M > 0): per-row loss and lse, and the
    gradient into dx (which may be logits itself: every element is read before it is written)."""
    m, v = logits.shape
    t = active()
    sms = sm_count(logits.device)
    sx, sdx = row_stride(logits), (row_stride(dx) if dx is not None else v)
    rp = ring_choice(v, logits.dtype, logits.device, t, need_grad=need_grad, softcap=softcap, smoothing=smoothing)
    if rp is not None and _ring_rows(logits, target, loss, lse, dx, scale, ignore_index, z_loss, rp, sms):
        return
    sp = ce_split_policy(v, sms, need_grad, t)
    if sp.split:
        for phase, sync, part in launches(logits.device, m, 4 if smoothing > 0.0 else 3, sp.split_p2):
            _fwd_split((m * sp.split,), logits, target, loss, lse, dx, scale, part, sync, m, v, sp.split, sx, sdx,
                       ignore_index, smoothing, z_loss, softcap or 0.0, SOFTCAP=bool(softcap), SMOOTH=smoothing > 0.0,
                       CHUNK=sp.chunk, SPLIT_P2=sp.split_p2, PHASE=phase, num_warps=sp.num_warps,
                       fp_fusion=False)  # no FMA: both launch forms give the same bits
        return
    p = ce_fwd_policy(m, v, sms if need_grad else 0, need_grad, t)  # sms: grad only
    _fwd((p.grid,), logits, target, loss, lse, dx, scale, m, v, sx, sdx, ignore_index, smoothing, z_loss,
         softcap or 0.0, SOFTCAP=bool(softcap), SMOOTH=smoothing > 0.0, HAS_GRAD=need_grad, BLOCK=p.block,
         STREAM_STORE=t.stream_store, EPT=p.ept, num_warps=p.num_warps)


def grad_scale(target: torch.Tensor, ignore_index: int, reduction: str) -> torch.Tensor:
    """The gradient's 0-d fp32 scale, on the device in one launch (no host sync):
    1 / max(1, rows not ignored) for mean, 1 for sum/none."""
    out = empty((), torch.float32, target.device)
    t = active()
    _grad_scale((1,), target, out, target.shape[0], ignore_index, MEAN=reduction == "mean", BLOCK=t.reduce_block,
                num_warps=t.reduce_warps)
    return out


def _scale_tensor(target: torch.Tensor, ignore_index: int, reduction: str, need_grad: bool) -> torch.Tensor | None:
    """The gradient's scale when a gradient is written, else nothing."""
    return grad_scale(target, ignore_index, reduction) if need_grad else None


def ce_fwd(logits, target, ignore_index, smoothing, z_loss, softcap, reduction, need_grad):
    """(loss reduced as asked, in fp32; dlogits already scaled for the reduction, or None)."""
    m, v = logits.shape
    loss = empty((m,), torch.float32, logits.device)
    lse = empty((m,), torch.float32, logits.device)
    dx = empty((m, v), logits.dtype, logits.device) if need_grad else None
    scale = _scale_tensor(target, ignore_index, reduction, need_grad)
    if m:
        ce_rows(logits, target, loss, lse, dx, scale, ignore_index, smoothing, z_loss, softcap, need_grad)
    if reduction == "none":
        return loss, dx
    return ce_reduce(loss, target, ignore_index, reduction), dx


def ce_reduce(loss: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: str) -> torch.Tensor:
    """The 0-d mean or sum of per-row losses [M], in one program (a fixed summation order)."""
    out = empty((), torch.float32, loss.device)
    t = active()
    _reduce((1,), loss, target, out, loss.shape[0], ignore_index, MEAN=reduction == "mean", BLOCK=t.reduce_block,
            num_warps=t.reduce_warps)
    return out


def ce_bwd(grad_out: torch.Tensor, dlogits: torch.Tensor, reduction: str) -> torch.Tensor:
    """dlogits *= grad_out in place (rows where it is 1.0 are skipped on the device); returns dlogits."""
    m, v = dlogits.shape
    if m:
        t = active()
        block = min(t.scale_block, 1 << max(0, (v - 1).bit_length()))
        go = grad_out.float() if grad_out.dtype != torch.float32 else grad_out
        items = m * -(-v // block)
        _scale((min(items, 4 * sm_count(dlogits.device)),), dlogits, go.contiguous(), m, v, v,
               PER_ROW=reduction == "none", BLOCK=block, num_warps=4)
    return dlogits
