"""Launch policy and launchers of the softmax kernels."""
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
from .kernels import (_softmax_bwd_kernel, _softmax_bwd_looped_kernel, _softmax_bwd_split_kernel, _softmax_fwd_kernel,
                      _softmax_fwd_looped_kernel, _softmax_fwd_split_kernel)

_fwd, _fwd_looped = FastKernel(_softmax_fwd_kernel), FastKernel(_softmax_fwd_looped_kernel)
_bwd, _bwd_looped = FastKernel(_softmax_bwd_kernel), FastKernel(_softmax_bwd_looped_kernel)
_fwd_split, _bwd_split = FastKernel(_softmax_fwd_split_kernel), FastKernel(_softmax_bwd_split_kernel)


@hash_once
@dataclasses.dataclass(frozen=True)
class SoftmaxTuning:
    max_block_fwd: int = 16384  # widest row kept whole in registers (fp32: 16 values/thread at 32 warps)
    max_block_bwd: int = 8192  # the backward holds dy and y
    tile: int = 2048  # rows per program grow until a program covers this many elements
    elems_per_thread: int = 16
    # looped kernels, measured on H100 (4096 x 131072 bf16, 2026-11-22)
    looped_block: int = 16384
    looped_warps: int = 32
    looped_programs_per_sm: int = 4  # persistent grid: rows in flight per SM
    looped_ept: int = 8  # the looped forward's values per lane (kernels.py)
    # rows whose next power of two is this wide (2-byte inputs) take the looped forward rather
    # than the split one: 4096x131072 bf16, looped against split, H100 91.3 / 89.6% of copy, H200
    # 77.3 / 72.4%; the split wins at 65536 (90.7 / 89.1%, H200 74.8 / 72.8%) and at 262144
    # (87.6 / 75.8%, H200 70.7 / 67.0%), where the rows in flight outgrow L2 (2026-11-27); 0 turns
    # it off
    looped_only_fwd: int = 131072
    # split kernels (rows of split_min_* and wider, next power of two, past max_block_*, in place
    # of the looped ones): one program per chunk of split_chunk_* columns, the row's programs
    # exchange partials (ops/common/row_barrier.py), so the inputs are read once at any width; 0
    # turns one off. H100 (2026-11-25; chunk 8192, 4 warps):
    # - forward: 88.2% of copy against the looped 82.6% at 16384x32768, 85.2 / 74.1% at
    #   4096x32000, 84.7 / 72.3% at 1024x262144; 3% behind at 4096-8192 x 65536 and even from
    #   2048 rows down; at decode sizes 2-7x faster (1 x 128256: 5.4 against 20.1 us; the
    #   looped kernel runs one program per row), so from the first looped width on;
    # - backward: 95.6% against 74.7% at 4096x131072, 94.5 / 65.7% at 1024x262144; the looped
    #   kernel wins at 32768-65536 (97.3 / 92.1%), so from 131072.
    # The C ABI mirrors the forward's choice (capi/aot/ops/softmax.py).
    # H100 2026-11-25: the forward's chunk load evict-first and y
    # streamed, 4096x131072 86.7 -> 89.5-89.8% of copy (87.8-88.1% while another large written
    # buffer is mapped; `ksctl bench` 86.9%); 8 warps 84.0%, chunk 16384 x 8 80.2%, 4096 x 4
    # 80.7%. Keeping the chunk bf16 across the barrier (as the norm does) was slower here (79.9%).
    split_chunk_fwd: int = 8192
    split_chunk_bwd: int = 8192
    split_min_fwd: int = 0
    split_min_bwd: int = 131072
    split_warps: int = 4
    # ring forward (``ring_sm90.py``, sm_90, Gluon: rows held in a TMA ring in shared memory, the
    # row's portions exchanging (max, sum)): 2-byte contiguous rows of ring_from..ring_to columns,
    # a multiple of ring_portion, on sm_90 GPUs with at least ring_min_gbs_per_sm of datasheet
    # bandwidth per SM. Portions of 32768, chunks of 16 x 256, 9 buffers, 8 warps, 3 programs per
    # SM. Through ks.softmax / ks.log_softmax, ring / other, % of copy (2026-11-27):
    # - H200 (36 GB/s per SM): 8192x32768 83.6 / 74.7, 4096x65536 84.7 / 72.5, 2730x98304
    #   84.9 / 77.0, 4096x131072 86.7 / 77.0 (log_softmax 84.5-88.1 / 78.4-81.1): on;
    # - H100 (25): 86.7 / 90.0 at 32768, 89.5 / 89.3 at 65536, 92.7 / 91.2 at 4096x131072;
    #   log_softmax 89.3-93.0 / 91.1-92.6: off there (a loss at 32768 and for log_softmax).
    ring: bool = True
    ring_min_gbs_per_sm: float = 30.0
    ring_from: int = 32768
    ring_to: int = 131072
    ring_portion: int = 32768
    ring_box_rows: int = 16
    ring_buffers: int = 9
    ring_warps: int = 8
    ring_programs_per_sm: int = 3


_tuning = TuningStack(SoftmaxTuning())
active = _tuning.active
use = _tuning.use  # tests force the looped kernels on short rows


@dataclasses.dataclass(frozen=True)
class SoftmaxLaunch:
    looped: bool
    block_n: int
    rows: int
    num_warps: int
    grid: int
    ept: int  # the looped forward's values per lane (1 for the block kernels)


@functools.lru_cache(maxsize=4096)
def split_policy(n: int, max_block: int, chunk: int, min_block: int, looped_block: int, esize: int, sms: int,
                 t: SoftmaxTuning) -> SplitLaunch:
    """The split kernels' launch for rows of n elements of esize bytes (chunk, min_block: the
    direction's split_chunk_*, split_min_*; looped_block: its looped_only_* or 0); ``split == 0``
    where the block or looped kernels run (independent of the row count: batch invariance)."""
    block = 1 << max(0, (n - 1).bit_length())
    if chunk <= 0 or block <= max_block or block < min_block or (block == looped_block and esize <= 2):
        return SplitLaunch(0, 0, 1, 1)
    width = min(chunk, block)
    split = -(-n // width)
    if split > 2 * sms:  # a row's programs must all be resident at once: two per SM always fit
        return SplitLaunch(0, 0, 1, 1)
    return SplitLaunch(width, split, 1 << max(0, (split - 1).bit_length()), t.split_warps)


@functools.lru_cache(maxsize=4096)
def policy(m: int, n: int, max_block: int, sms: int, t: SoftmaxTuning) -> SoftmaxLaunch:
    block = 1 << max(0, (n - 1).bit_length())
    if block > max_block:
        grid = min(m, t.looped_programs_per_sm * sms)
        block_n = min(t.looped_block, block)
        return SoftmaxLaunch(True, block_n, 1, t.looped_warps, grid, min(t.looped_ept, block_n))
    rows = max(1, min(t.tile // block, 64))  # independent of m: batch-invariant reduction order
    warps = max(1, min(32, rows * block // (32 * t.elems_per_thread)))
    return SoftmaxLaunch(False, block, rows, 1 << (warps.bit_length() - 1), -(-m // rows), 1)


@functools.lru_cache(maxsize=4096)
def ring_policy(n: int, itemsize: int, t: SoftmaxTuning) -> RingLaunch | None:
    """The ring forward's launch for rows of n (``ring_sm90.py``), or None where another form
    runs; the caller checks the device and the tensors. Independent of the row count."""
    if not t.ring or itemsize != 2 or not (t.ring_from <= n <= t.ring_to):
        return None
    return ring_launch(n, t.ring_portion, t.ring_box_rows, t.ring_buffers, t.ring_warps, t.ring_programs_per_sm)


_RING = ("kernelset.ops.softmax.ring_sm90", "_softmax_ring_fwd_kernel")


def ring_choice(n: int, dtype: torch.dtype, device: torch.device, t: SoftmaxTuning, *,
                arch: tuple[int, int] | None = None, gbs_per_sm: float | None = None) -> RingLaunch | None:
    """The ring forward's launch where it applies to rows of n on this device (sm_90, Gluon, the
    bandwidth class); ``arch`` and ``gbs_per_sm`` describe another GPU (``ksctl plan``)."""
    if not t.ring or not ring_host.on_sm90(device, arch) or not dtype.is_floating_point:
        return None
    if (ring_host.device_gbs_per_sm(device) if gbs_per_sm is None else gbs_per_sm) < t.ring_min_gbs_per_sm:
        return None
    rp = ring_policy(n, dtype.itemsize, t)
    return rp if rp is not None and ring_host.gluon_kernel(*_RING)[0] is not None else None


def _ring_fwd(x: torch.Tensor, y: torch.Tensor, m: int, n: int, temperature: float, log: bool, rp: RingLaunch,
              sms: int) -> bool:
    """Launch the ring forward where the tensors allow it; False where they do not, and nothing ran."""
    spec = (log, y.dtype)
    la = ring_host.launch_args(x, m, n, 2, rp, sms, _RING, spec)
    if la is None:
        return False
    grid, desc, sync, part = la
    ring_host.gluon_kernel(*_RING)[0](grid, desc, y, part, sync, m, n, 1.0 / temperature, LOG=log, S=rp.split,
                                 S_P2=rp.split_p2, NCH=rp.chunks, BOXR=rp.box_rows, NB=rp.buffers,
                                 num_warps=rp.num_warps)
    ring_host.learn(_RING, rp, x.dtype, spec)
    return True


def softmax_fwd(x: torch.Tensor, temperature: float, log: bool, out_dtype: torch.dtype) -> torch.Tensor:
    n = x.shape[-1]
    m = x.numel() // n if n else 0
    y = empty(x.shape, out_dtype, x.device)
    if m == 0:
        return y
    t = active()
    sms = sm_count(x.device)
    # (rows the block kernel holds skip the split policy: sampling at decode calls this per token)
    sp = split_policy(n, t.max_block_fwd, t.split_chunk_fwd, t.split_min_fwd, t.looped_only_fwd, x.element_size(), sms,
                      t) if n > t.max_block_fwd else None
    if n > t.max_block_fwd and t.ring:
        rp = ring_choice(n, x.dtype, x.device, t)
        if rp is not None and _ring_fwd(x, y, m, n, temperature, log, rp, sms):
            return y
    if sp is not None and sp.split:
        for phase, sync, part in launches(x.device, m, 2, sp.split_p2):
            _fwd_split((m * sp.split,), x, y, part, sync, m, n, sp.split, row_stride(x), n, 1.0 / temperature, LOG=log,
                       CHUNK=sp.chunk, SPLIT_P2=sp.split_p2, PHASE=phase, num_warps=sp.num_warps,
                       fp_fusion=False)  # no FMA: both launch forms give the same bits
        return y
    p = policy(m, n, t.max_block_fwd, sms, t)
    args = (x, y, m, n, row_stride(x), n, 1.0 / temperature)
    if p.looped:
        _fwd_looped((p.grid,), *args, LOG=log, BLOCK_N=p.block_n, EPT=p.ept, num_warps=p.num_warps)
    else:
        _fwd((p.grid,), *args, LOG=log, ROWS=p.rows, BLOCK_N=p.block_n, num_warps=p.num_warps)
    return y


def softmax_bwd(dy: torch.Tensor, y: torch.Tensor, temperature: float, log: bool, x_dtype: torch.dtype):
    n = y.shape[-1]
    m = y.numel() // n if n else 0
    dx = empty(y.shape, x_dtype, y.device)
    if m == 0:
        return dx
    t = active()
    sms = sm_count(y.device)
    sp = split_policy(n, t.max_block_bwd, t.split_chunk_bwd, t.split_min_bwd, 0, y.element_size(), sms, t)
    if sp.split:
        for phase, sync, part in launches(y.device, m, 1, sp.split_p2):
            _bwd_split((m * sp.split,), dy, y, dx, part, sync, m, n, sp.split, row_stride(dy), row_stride(y), n,
                       1.0 / temperature, LOG=log, CHUNK=sp.chunk, SPLIT_P2=sp.split_p2, PHASE=phase,
                       num_warps=sp.num_warps, fp_fusion=False)
        return dx
    p = policy(m, n, t.max_block_bwd, sms, t)
    args = (dy, y, dx, m, n, row_stride(dy), row_stride(y), n, 1.0 / temperature)
    if p.looped:
        _bwd_looped((p.grid,), *args, LOG=log, BLOCK_N=p.block_n, num_warps=p.num_warps)
    else:
        _bwd((p.grid,), *args, LOG=log, ROWS=p.rows, BLOCK_N=p.block_n, num_warps=p.num_warps)
    return dx
