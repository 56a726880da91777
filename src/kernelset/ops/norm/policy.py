"""Launch policy of the norm kernels: one pure function per direction, no Triton import.

Used by the launchers and the tests (to force each kernel shape on small inputs); a GPU sweep
passes other :class:`NormTuning` values through ``policy.use(...)``.
"""
from __future__ import annotations

import dataclasses
import functools

from ...core.tuning import RingLaunch, SplitLaunch, TuningStack, hash_once, ring_launch  # noqa: F401


@hash_once
@dataclasses.dataclass(frozen=True)
class NormTuning:
    max_block_fwd: int = 16384  # widest row kept whole in registers by the forward
    max_block_bwd: int = 8192  # same for the backward (holds x, dy and the dw partial)
    fwd_tile: int = 2048  # rows per program are added until a program covers this many elements
    bwd_tile: int = 8192  # rows per backward program grow until this many elements (2 at N=4096;
    # measured equal to 1 row on H100, 2026-11-22)
    # fixes num_warps: tile / (32 * this), at most fwd_max_warps. H100 and H200,
    # 2026-11-27: 32 and 16 warps at most give, at 16384x8192 / 32768x4096 /
    # 8192x16384, LayerNorm 97.4 / 97.4 / 97.7% of copy on the H100 and 96.1 / 95.1 / 92.4% on the
    # H200, against 98.3 / 98.3 / 73.7% and 90.6 / 95.2 / 57.5% with 16 (32 warps at 16384 wide)
    fwd_elems_per_thread: int = 32
    fwd_max_warps: int = 16
    # plain RMSNorm rows of next power of two in [rms_two_pass_from, rms_two_pass_to] take the
    # two-pass forward (``_rms_fwd_two_pass_kernel``: chunks of half the row, the second pass
    # finding the row in L2), rms_two_pass_elems_per_thread per chunk: the block kernel holds
    # the whole row in registers, and on the H200 fewer loads stay in flight. 2026-11-27,
    # 32768x4096 / 16384x8192: H200 97.7-98.1 / 98.0-98.4%
    # of copy against the block kernel's 95.7-96.0 / 96.2-96.3%; H100 98.4 / 98.2% against
    # 98.1 / 98.6%. torch.compile runs this form; the looped forward (persistent, prefetching,
    # pass 2 reversed) reached only 90.7 / 93.4% on the H200. 0 turns it off.
    rms_two_pass_from: int = 4096
    rms_two_pass_to: int = 8192
    rms_two_pass_elems_per_thread: int = 8
    bwd_elems_per_thread: int = 8
    bwd_threads_per_sm: int = 1024  # persistent backward grid: SMs * this / threads per program (registers
    # allow 1-2 programs of 16 warps per SM; more only adds waves and partial-sum rows)
    bwd_prefetch: bool = True  # block backward: next rows' loads in flight during this block's math
    looped_block: int = 8192  # chunk of the looped backward (rows wider than max_block_bwd)
    looped_warps: int = 16
    # looped forward (rows wider than max_block_fwd): persistent grid, rows in flight per SM
    # (pass 2 re-reads them from L2); H100 sweep (2026-11-23):
    # 16 warps 93.9% of copy at 4096x65536 against 88.4-89.3% with 32
    looped_block_fwd: int = 16384
    looped_warps_fwd: int = 16
    looped_programs_per_sm: int = 4
    # split forward (rows of split_min_fwd and wider, next power of two, in place of the looped
    # forward): one program per chunk of split_chunk_fwd columns, the row's programs exchange
    # statistics (ops/common/row_barrier.py), so x is read once at any width; 0 turns it off.
    # H100 (2026-11-25): 1024x262144 81.8% of copy against the looped 67.6%; at 4096x65536 the
    # looped one wins (93.6% against 82.7%: its second pass still finds the row in L2), hence the
    # threshold. With the chunk kept bf16 across the barrier and cache hints (H100, 2026-11-25):
    # 89.3-92.0% at 1024x262144; 8192 x 4 warps stays the best (16384 x 8 87.5%, 8192 x 8 88.5%,
    # 4096 x 2-4 72-74%)
    split_chunk_fwd: int = 8192
    split_warps_fwd: int = 4
    split_min_fwd: int = 131072
    dwdb_block_m: int = 32
    dwdb_block_n: int = 128
    dwdb_programs_per_sm: int = 4
    # split backward (rows wider than max_block_bwd, in place of the looped backward and its dw/db
    # pass): one program per (split_rows_bwd rows, split_chunk_bwd columns) tile, the block's
    # programs exchange the rows' sums (ops/common/row_barrier.py), so dy and x are read once; 0
    # turns it off. H100, fwd+bwd bf16 (2026-11-25): RMSNorm 4096x65536 77.1% of
    # copy against the looped 57.0%, 8192x16384 77-79% against 66.6%, 1024x262144 61.3% against
    # 51.7%; LayerNorm 63.8 / 65.0% against 55.3 / 52.7%. 8 x 1024 x 4 warps is the best of
    # 4-16 rows x 512-4096 columns x 2-8 warps at 65536 and 16384.
    split_chunk_bwd: int = 1024
    split_rows_bwd: int = 8
    split_warps_bwd: int = 4
    # blocks of rows a split-backward program takes one after another, summing their dw / db over
    # its columns: the fp32 partials written and read back shrink by that factor (one per block,
    # they are 10% of RMSNorm's traffic at 8-row blocks and 20% of LayerNorm's, with db; twice
    # that where rows past sms * chunk columns halve the block). ``_wide`` where the policy halved
    # the rows. H100 (2026-11-25): at 1024x262144 (4-row blocks) 8 per program, fwd+bwd RMSNorm
    # 61.5 -> 65.4%, LayerNorm 49.9 -> 55.2% of copy; at 8-row blocks the loop's kernel costs more
    # than the sum it saves (the backward alone, H100 2026-11-25:
    # RMSNorm 0.385 against 0.375 ms at 8192x16384, LayerNorm 1.037 against 0.916 ms at
    # 4096x65536), so one. The loop costs registers, and ptxas's allocation varies with its form
    # (a runtime loop even for one block lost 10 points; an unrolled one spilled): re-measure per
    # change.
    split_blocks_bwd: int = 1
    split_blocks_bwd_wide: int = 8
    split_min_programs_bwd: int = 8  # per SM: fewer blocks per program where the grid would be smaller
    # ring forward (``ring_sm90.py``: plain RMSNorm rows held in a TMA ring in shared memory, S
    # programs per row exchanging sums of squares): 2-byte contiguous rows of ring_from..ring_to
    # columns, a multiple of ring_portion, on sm_90 GPUs with at least ring_min_gbs_per_sm of
    # datasheet bandwidth per SM (the H200's 36; the H100's 25 is below). 2026-11-27:
    # H200 4096x65536 89.4% of copy against the looped 78.9%;
    # H100 93.1-93.7% against 93.5%; portions of 16384 columns, chunks of 8 x 256, 9 buffers, 4
    # warps, 6 programs per SM (48 registers, 36 KB). Through ks.rms_norm on the H200
    # (2026-11-27) at 32768 / 49152 / 65536 / 81920 / 98304 columns:
    # 89.6 / 88.6 / 87.7 / 82.8 / 83.1% against 84.7 / 74.9 / 78.9 / 78.6 / 79.2%; at 131072 and
    # 262144 it loses to the split forward (78.6 / 75.2% against 78.9 / 77.1%). 0 turns it off.
    ring_min_gbs_per_sm: float = 30.0
    ring_from: int = 32768
    ring_to: int = 98304
    ring_portion: int = 16384
    ring_box_rows: int = 8
    ring_buffers: int = 9
    ring_warps: int = 4
    ring_programs_per_sm: int = 6
    # torch_order forward (``_rms_fwd_torch_order_kernel``, transformers' RMSNorm bit for bit): rows
    # per program where torch gives a row 32 lanes (16 rows and more), steps of each lane's sum
    # loaded per iteration, elements per thread in one load (fixes num_warps). The order of the
    # sum does not depend on them. H200 2026-11-27 (calls replayed from a CUDA
    # graph): 1 row x 8 steps is the best of 1-8 x 1-8 at every shape, 2048x4096
    # 17.9 -> 12.3 us (44.5 -> 64.4% of copy; F.rms_norm 57.3%), 8192x4096 50.7 -> 66.9%,
    # 2048x5120 39.1 -> 67.9%, 32x4096 9.6 -> 4.0 us; more rows per program lost 5-15 points.
    torch_order_rows: int = 1
    torch_order_unroll: int = 8
    torch_order_elems_per_thread: int = 4


DEFAULT_TUNING = NormTuning()
_tuning = TuningStack(DEFAULT_TUNING)
active = _tuning.active
use = _tuning.use  # ``with policy.use(NormTuning(...)):`` launches with other values inside the block


@dataclasses.dataclass(frozen=True)
class NormLaunch:
    looped: bool
    block_n: int
    rows: int  # rows per program (block kernels); 1 for looped
    num_warps: int
    grid: int  # programs of the main kernel
    dwdb_grid: tuple[int, int] = (0, 0)  # looped backward: (column tiles, row groups)
    dwdb_rows_per_prog: int = 0
    two_pass: bool = False  # plain RMSNorm's two-pass forward, one row per program in block_n chunks


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _clamp(v: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, v))


@functools.lru_cache(maxsize=4096)
def fwd_policy(m: int, n: int, sms: int, plain_rms: bool, t: NormTuning) -> NormLaunch:
    """The forward's launch for m rows of n; ``plain_rms``: RMSNorm without the residual add.
    Which kernel and how many rows per program never depend on m: a row's reduction order is
    then the same in any batch (batch invariance); a short batch only leaves some rows of one
    program masked."""
    block = _pow2(n)
    if block > t.max_block_fwd:
        chunk = min(t.looped_block_fwd, block)
        return NormLaunch(True, chunk, 1, t.looped_warps_fwd, min(m, t.looped_programs_per_sm * sms))
    if plain_rms:
        if t.rms_two_pass_from > 0 and t.rms_two_pass_from <= block and block <= t.rms_two_pass_to:
            chunk = block // 2
            warps = _clamp(chunk // (32 * t.rms_two_pass_elems_per_thread), 1, 32)
            return NormLaunch(False, chunk, 1, _pow2(warps), m, (0, 0), 0, True)
    rows = _clamp(t.fwd_tile // block, 1, 64)
    warps = _clamp(rows * block // (32 * t.fwd_elems_per_thread), 1, t.fwd_max_warps)
    return NormLaunch(False, block, rows, _pow2(warps), -(-m // rows))


@functools.lru_cache(maxsize=4096)
def fwd_split_policy(n: int, sms: int, t: NormTuning) -> SplitLaunch:
    """The split forward's launch for rows of n; ``split == 0`` where the block or looped forward
    runs. Independent of the row count, like the others (batch invariance)."""
    if t.split_chunk_fwd <= 0 or _pow2(n) <= t.max_block_fwd or _pow2(n) < t.split_min_fwd:
        return SplitLaunch(0, 0, 1, 1)
    chunk = min(t.split_chunk_fwd, _pow2(n))
    split = -(-n // chunk)
    if split > 2 * sms:  # a row's programs must all be resident at once: two per SM always fit
        return SplitLaunch(0, 0, 1, 1)
    return SplitLaunch(chunk, split, _pow2(split), t.split_warps_fwd)


@functools.lru_cache(maxsize=4096)
def ring_fwd_policy(n: int, itemsize: int, gbs_per_sm: float, t: NormTuning) -> RingLaunch | None:
    """The ring forward's launch for plain RMSNorm rows of n (``ring_sm90.py``), or None where
    another form runs. The caller checks the rest (sm_90, Gluon, contiguous aligned rows).
    Independent of the row count (batch invariance)."""
    if t.ring_min_gbs_per_sm <= 0 or gbs_per_sm < t.ring_min_gbs_per_sm or itemsize != 2:
        return None
    if not (t.ring_from <= n <= t.ring_to):
        return None
    return ring_launch(n, t.ring_portion, t.ring_box_rows, t.ring_buffers, t.ring_warps, t.ring_programs_per_sm)


@functools.lru_cache(maxsize=4096)
def bwd_split_policy(n: int, sms: int, t: NormTuning) -> tuple[SplitLaunch, int]:
    """The split backward's launch for rows of n and its rows per block; ``split == 0`` where the
    block or looped backward runs. A block's programs must all be resident at once: at most one
    per SM is assumed (the chunk doubles, and the rows per block halve, until ``split <= sms``)."""
    if t.split_chunk_bwd <= 0 or _pow2(n) <= t.max_block_bwd:
        return SplitLaunch(0, 0, 1, 1), 0
    chunk, rows = min(t.split_chunk_bwd, _pow2(n)), t.split_rows_bwd
    while -(-n // chunk) > min(sms, 256):  # 256: tree_sum_rows' widest
        chunk *= 2
        rows = max(1, rows // 2)
    split = -(-n // chunk)
    return SplitLaunch(chunk, split, _pow2(split), t.split_warps_bwd), rows


def bwd_split_blocks(rows: int, t: NormTuning) -> int:
    """The most row blocks a split-backward program takes (``rows`` per block, as
    ``bwd_split_policy`` gave): ``split_blocks_bwd``, or ``split_blocks_bwd_wide`` where the policy
    halved the rows."""
    return max(1, t.split_blocks_bwd_wide if rows < t.split_rows_bwd else t.split_blocks_bwd)


@functools.lru_cache(maxsize=4096)
def bwd_split_per_prog(blocks: int, rows: int, split: int, sms: int, t: NormTuning) -> int:
    """Row blocks per split-backward program: ``bwd_split_blocks``, halved while the grid would
    have fewer than ``split_min_programs_bwd`` programs per SM (short batches keep every SM busy)."""
    per = bwd_split_blocks(rows, t)
    while per > 1 and -(-blocks // per) * split < t.split_min_programs_bwd * sms:
        per //= 2
    return per


@functools.lru_cache(maxsize=4096)
def bwd_policy(m: int, n: int, sms: int, t: NormTuning) -> NormLaunch:
    block = _pow2(n)
    if block > t.max_block_bwd:
        chunk = min(t.looped_block, block)
        col_tiles = -(-n // t.dwdb_block_n)
        groups = _clamp(sms * t.dwdb_programs_per_sm // col_tiles, 1, -(-m // t.dwdb_block_m))
        rows_per_prog = -(-m // groups)
        rows_per_prog = -(-rows_per_prog // t.dwdb_block_m) * t.dwdb_block_m
        groups = -(-m // rows_per_prog)
        return NormLaunch(True, chunk, 1, t.looped_warps, m, (col_tiles, groups), rows_per_prog)
    rows = _clamp(t.bwd_tile // block, 1, 32)  # independent of m, as in the forward
    warps = _pow2(_clamp(rows * block // (32 * t.bwd_elems_per_thread), 1, 16))
    per_sm = max(1, t.bwd_threads_per_sm // (32 * warps))
    grid = max(1, min(-(-m // rows), sms * per_sm))
    return NormLaunch(False, block, rows, warps, grid)


@functools.lru_cache(maxsize=1024)
def torch_order_policy(lanes: int, n: int, t: NormTuning) -> tuple[int, int, int]:
    """(rows per program, unroll, num_warps) of the torch_order forward for rows of n that torch's
    reduce gives ``lanes`` threads: several rows per program only at 32 lanes (wider lanes mean
    few rows); no more steps per iteration than the row has (one 4096 row: 2.8 against 2.0 us)."""
    rows = _pow2(max(1, t.torch_order_rows)) if lanes == 32 else 1
    unroll = min(_pow2(max(1, t.torch_order_unroll)), _pow2(-(-n // (4 * lanes))))
    warps = _clamp(rows * lanes * 4 // (32 * max(1, t.torch_order_elems_per_thread)), 1, 8)
    return rows, unroll, 1 << (warps.bit_length() - 1)
