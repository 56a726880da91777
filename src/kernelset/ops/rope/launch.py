"""Launch policy and launchers of the rotary-embedding kernels."""
from __future__ import annotations

import dataclasses
import functools

import torch

from ..common.fast_launch import FastKernel
from .kernels import _rope_apply_kernel, _rope_ext_fwd_kernel, _rope_fwd_kernel

_fwd = FastKernel(_rope_fwd_kernel)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _qk_one_warps(hk: int, nb: int, qpairs: int, kpairs: int, most: int) -> int:
    """Warps of the one-program-per-token form of the serving RoPE kernels, or 0 where the
    (token, head block) grid runs: that form where k is at most a quarter of q (GQA), each in one
    block (``nb == 2``) and k's tile of at least 256 pairs; warps by q's tile, at most k's pairs /
    64 (2 elements per thread of k's tile; ``kpairs`` is a power of two) and ``most``."""
    if hk > 0 and nb == 2 and 256 <= kpairs and 4 * kpairs <= qpairs:
        return min(8 if qpairs >= 2048 else (4 if qpairs >= 512 else 2), kpairs // 64, most)
    return 0


def _heads_per_program(h: int, cap: int) -> int:
    """Heads of one tensor per program: all of them (next power of two), at most ``cap``."""
    return max(1, min(_pow2(h), cap))


@dataclasses.dataclass(frozen=True)
class RopeLaunch:
    block_h1: int  # q heads per program
    block_h2: int  # k heads per program
    block_r: int
    num_warps: int
    nb1: int  # programs per token over q's heads
    grid: tuple[int, int]  # (tokens, q's and k's head blocks; 1 with qk_one)
    qk_one: int = 0  # 1: one program per token rotates all of q's and k's heads


@functools.lru_cache(maxsize=4096)
def rope_fwd_policy(t: int, hq: int, hk: int, half: int) -> RopeLaunch:
    """Tiles of _rope_fwd_kernel over ``t`` tokens of q (``hq`` heads) and k (``hk``, 0 without
    k) rotating ``half`` pairs per head: all pairs of a head, each tensor's heads stacked up to
    ~2048 pairs per program, q and k in one launch.

    Where k is a quarter of q or less (GQA) and both fit one program, one program per token
    takes both (``qk_one``), its q and k loads in flight before the position's cos/sin row: the
    (token, tensor) grid then gives a q and a k program of very different sizes. H200, T=16384,
    % of copy (H200 2026-11-28): 28/4 heads D128
    92.1 against the grid's 88.6-88.9, 32/4 89.3 against 86.8, 32/8 91.2-91.4 against 90.4; warps
    by q's tile, at most k's pairs / 64 (k's tile keeps 2 elements per thread: 8 warps at 32/4
    ran 77%). Equal q and k (32/32 D96: grid 97.3, qk_one 95.0) and small k tiles (8/1 D256:
    grid 82.8, qk_one 61-69) keep the grid, tokens fastest. One launch instead of one per tensor:
    a second launch's start and tail cost 3 points of copy at 32/8 (a copy of the same bytes:
    97.4% in one launch, 94.4% in two); tokens fastest 89.2% against 85.3% with a token's q and k
    blocks adjacent, and 92.3% with the kernel's evict_first hints (H200 2026-11-27)."""
    block_r = _pow2(half)
    cap = max(1, 2048 // block_r)
    b1 = _heads_per_program(hq, cap)
    b2 = _heads_per_program(hk, cap) if hk else 1
    nb1 = -(-hq // b1)
    nb = nb1 + -(-hk // b2)
    one = _qk_one_warps(hk, nb, b1 * block_r, b2 * block_r, 8)
    if one > 0:
        return RopeLaunch(b1, b2, block_r, one, 1, (t, 1), 1)
    warps = 4 if max(b1, b2) * block_r >= 1024 else 2
    return RopeLaunch(b1, b2, block_r, warps, nb1, (t, nb), 0)


def _fwd_launch(positions, q, k, cache, interleaved, head_size):
    """(policy, site, ints after the four tensors, whether k has heads) of _rope_fwd_kernel, or
    None for an empty problem; rope_fwd and its replay both build their launch here."""
    t = positions.numel()
    half = cache.shape[1] // 2
    hq = (q.numel() // t) // head_size if t else 0
    hk = (k.numel() // t) // head_size if k is not None and t else 0
    if t == 0 or hq + hk == 0:
        return None
    p = rope_fwd_policy(t, hq, hk, half)
    # without k (or with no k heads) the k blocks are empty: q stands in for the pointer
    kx = k if hk else q
    ints = (hq, hk, p.nb1, cache.shape[0], q.stride(0), kx.stride(0), cache.stride(0))
    site = (head_size, half, bool(interleaved), p.block_h1, p.block_h2, p.block_r, p.num_warps, bool(p.qk_one))
    return p, site, ints, hk > 0


def rope_fwd(positions, q, k, cache, interleaved, head_size):
    la = _fwd_launch(positions, q, k, cache, interleaved, head_size)
    if la is None:
        return
    p, site, ints, has_k = la
    kx = k if has_k else q
    if not _fwd.at(site, p.grid, positions, q, kx, cache, *ints):
        _fwd(p.grid, positions, q, kx, cache, *ints, site=site, D=head_size, HALF=site[1], INTERLEAVED=site[2],
             BLOCK_H1=p.block_h1, BLOCK_H2=p.block_h2, BLOCK_R=p.block_r, QK_ONE=site[7], num_warps=p.num_warps)


def rope_fwd_replay(positions, q, k, cache, interleaved, head_size):
    """A launcher for later calls like this one (same shapes, strides, dtypes, devices, options
    and q/k placement; the caller's table keys on them): ``replay(positions, q, k, cache) ->
    bool``, one bound launch (``FastKernel.at``) with the policy and the integer arguments
    computed here once; False, nothing launched, where the tensors differ in what the kernel was
    compiled for (then the full call runs). None where this call is not replayed (the CPU, an
    empty problem, positions with a stride)."""
    if not q.is_cuda or (positions.numel() > 1 and positions.stride(0) != 1):
        return None
    la = _fwd_launch(positions, q, k, cache, interleaved, head_size)
    if la is None:
        return None
    p, site, ints, has_k = la
    grid, at = p.grid, _fwd.at
    if has_k:
        return lambda positions, q, k, cache: at(site, grid, positions, q, k, cache, *ints)
    return lambda positions, q, k, cache: at(site, grid, positions, q, q, cache, *ints)


_apply = FastKernel(_rope_apply_kernel)
_INT32_SPAN = 2**31  # head offsets at or past this take int64 (a test lowers it to run that form)


@dataclasses.dataclass(frozen=True)
class RopeApplyLaunch:
    block_h1: int  # q heads per program
    block_h2: int  # k heads per program
    block_r: int
    num_warps: int
    nb1: int  # programs per token over q's heads
    nb2: int  # and over k's


@functools.lru_cache(maxsize=4096)
def rope_apply_policy(hq: int, hk: int, half: int) -> RopeApplyLaunch:
    """Tiles of _rope_apply_kernel: per token, q's heads and k's heads each in blocks of about
    1024 rotated pairs, sized to the tensor (a k of 8 heads in a 32-head tile left 3/4 of its
    programs' lanes masked: 82.7% of copy on the H200 at B4 S4096 32/8 D128, against 89.3% with
    16-head q tiles; H200 2026-11-27)."""
    block_r = _pow2(half)
    cap = max(1, 1024 // block_r)
    b1, b2 = _heads_per_program(hq, cap), _heads_per_program(hk, cap)
    warps = 4 if max(b1, b2) * block_r >= 1024 else 2
    return RopeApplyLaunch(b1, b2, block_r, warps, -(-hq // b1), -(-hk // b2) if hk else 0)


def _apply_launch(q, k, yq, yk, cos, sin, interleaved, rotary_dim, unsqueeze_dim, sign):
    """(grid, site, args) of _rope_apply_kernel for these tensors, or None for an empty problem;
    rope_apply and its replay both build their launch here."""
    if unsqueeze_dim == 2:  # [B, S, H, D] views
        qs, ks_, yqs, yks = q, k, yq, yk
    else:
        qs, ks_, yqs, yks = q.transpose(1, 2), k.transpose(1, 2), yq.transpose(1, 2), yk.transpose(1, 2)
    bsz, s, hq, _ = qs.shape
    hk = ks_.shape[2]
    if bsz * s == 0 or hq + hk == 0:
        return None
    c3 = cos if cos.dim() == 3 else cos.unsqueeze(0)
    s3 = sin if sin.dim() == 3 else sin.unsqueeze(0)
    cb = c3.stride(0) if c3.shape[0] > 1 else 0
    sb = s3.stride(0) if s3.shape[0] > 1 else 0
    half = rotary_dim // 2
    p = rope_apply_policy(hq, hk, half)
    span = max((h - 1) * abs(x.stride(2)) for h, x in ((hq, qs), (hk, ks_), (hq, yqs), (hk, yks)) if h) + 2 * half
    grid, wide = (bsz * s, p.nb1 + p.nb2), span >= _INT32_SPAN
    args = (qs, yqs, ks_, yks, c3, s3, s, hq, hk, p.nb1,
            qs.stride(0), qs.stride(1), qs.stride(2), yqs.stride(0), yqs.stride(1), yqs.stride(2),
            ks_.stride(0), ks_.stride(1), ks_.stride(2), yks.stride(0), yks.stride(1), yks.stride(2),
            cb, c3.stride(1), sb, s3.stride(1), sign)
    return grid, (half, interleaved, p, wide), args


def _apply_site(half: int, interleaved: bool, p: RopeApplyLaunch, wide: bool) -> tuple:
    """The bound-launch site of _rope_apply_kernel (FastKernel.at): every constexpr and num_warps."""
    return (half, interleaved, p.block_h1, p.block_h2, p.block_r, wide, p.num_warps)


def rope_apply(q, k, cos, sin, interleaved, rotary_dim, unsqueeze_dim, sign=1.0):
    """(q, k) rotated, out of place, in one launch (features past rotary_dim copied). q/k
    [B, H, S, D] when unsqueeze_dim == 1 else [B, S, H, D]; cos/sin [B, S, R] or [S, R]
    (transformers' format)."""
    ys = []
    for x in (q, k):
        y = torch.empty_like(x)
        if rotary_dim < x.shape[-1]:
            y[..., rotary_dim:].copy_(x[..., rotary_dim:])
        ys.append(y)
    yq, yk = ys
    launch = _apply_launch(q, k, yq, yk, cos, sin, interleaved, rotary_dim, unsqueeze_dim, sign)
    if launch is None:
        return yq, yk
    grid, (half, interleaved, p, wide), args = launch
    site = _apply_site(half, interleaved, p, wide)
    if not _apply.at(site, grid, *args):
        _apply(grid, *args, site=site, HALF=half, INTERLEAVED=interleaved, BLOCK_H1=p.block_h1,
               BLOCK_H2=p.block_h2, BLOCK_R=p.block_r, WIDE=wide, num_warps=p.num_warps, fp_fusion=False)
    return yq, yk


def rope_apply_replay(q, k, cos, sin, interleaved, rotary_dim, unsqueeze_dim):
    """A launcher for later forward calls like this one (same shapes, strides, dtypes, devices and
    options; the caller's table keys on them): ``replay(q, k, cos, sin) -> (yq, yk) or None``, one
    bound launch (``FastKernel.at``) with every stride and the policy computed here once; None from
    the replay where the tensors differ in what the kernel was compiled for (then the full call
    runs). None here where this call is not replayed (a pass-through tail, an empty problem, the CPU)."""
    if not q.is_cuda or rotary_dim < q.shape[-1]:
        return None
    # outputs of the layout rope_apply gives them, for their strides (same shapes and strides later)
    launch = _apply_launch(q, k, torch.empty_like(q), torch.empty_like(k), cos, sin, interleaved, rotary_dim,
                           unsqueeze_dim, 1.0)
    if launch is None:
        return None
    grid, consts, args = launch
    site, tail = _apply_site(*consts), args[6:]  # the six tensors come first
    at, empty_like = _apply.at, torch.empty_like

    def replay(q, k, cos, sin):
        yq, yk = empty_like(q), empty_like(k)
        # a view's data pointer is its base's: q stands in for its transpose, cos for its unsqueeze
        return (yq, yk) if at(site, grid, q, yq, k, yk, cos, sin, *tail) else None
    return replay


_ext = FastKernel(_rope_ext_fwd_kernel)
_CASTS = {"fp32": 0, "llama": 1, "gemma": 2}


@functools.lru_cache(maxsize=4096)
def ext_tiles(hq: int, hk: int, head_size: int, half: int, norm: bool) -> tuple[int, int, int, int, int, int, int, int]:
    """(BLOCK_H1, BLOCK_H2, BLOCK_R, BLOCK_T, num_warps, NB1, NB, QK_ONE) of _rope_ext_fwd_kernel:
    q's ``hq`` heads and k's ``hk`` (0 without k) each in blocks of about 2048 rotated pairs (a
    [T=16384, 32, 128] q takes one program per token), NB1 blocks of q and NB in all per token,
    one launch for both tensors (as _rope_fwd_kernel: two launches cost a launch's host time,
    which made the eager call host-bound on the lent H200 host); one program per token for both
    (QK_ONE, NB = 1) where rope_fwd_policy takes it: k a quarter of q or less, both in one block.
    H200, T=16384 D128, CUDA-graph replay (2026-11-28): qk_norm_rope 32/8 heads 92.4% of copy against the grid's
    86.0%, 32/4 91.2 against 82.1; mrope 32/8 92.9 against 92.6, 32/4 92.0 against 88.7."""
    block_r = _pow2(half)
    block_t = _pow2(max(1, head_size - 2 * half)) if norm else 1
    cap = max(1, 2048 // block_r)
    b1 = _heads_per_program(hq, cap)
    b2 = _heads_per_program(hk, cap) if hk else 1
    nb1 = -(-hq // b1)
    nb = nb1 + -(-hk // b2)
    # the per-head norm's sums run slower on 8 warps (32/8 D128 on the H200: 80.7% of copy against
    # 92.4% on 4; without the norm 92.9 / 90.2%)
    one = _qk_one_warps(hk, nb, b1 * block_r, b2 * block_r, 4 if norm else 8)
    if one > 0:
        return b1, b2, block_r, block_t, one, 1, 1, 1
    return b1, b2, block_r, block_t, 4 if max(b1, b2) * block_r >= 1024 else 2, nb1, nb, 0


def rope_ext(positions, q, k, cache, head_size, interleaved, sections=None, mrope_interleaved=False,
             q_weight=None, k_weight=None, eps=0.0, offset=0.0, cast="fp32"):
    """mrope (sections given, positions [3, T] or [T]) and/or the per-head RMSNorm (weights
    given) before the rotation, in place on q and k (token-strided [T, H*D] or [T, H, D]), in
    one launch."""
    t = q.shape[0]
    half = cache.shape[1] // 2
    norm = q_weight is not None
    mrope = sections is not None and positions.dim() == 2
    s0, s1, s2 = sections if mrope else (half, 0, 0)  # text-only positions: one section for all pairs
    sps = positions.stride(0) if mrope else 0
    hq = q[0].numel() // head_size if t else 0
    hk = k[0].numel() // head_size if k is not None and t else 0
    if t == 0 or hq + hk == 0:
        return
    b1, b2, block_r, block_t, warps, nb1, nb, qk_one = ext_tiles(hq, hk, head_size, half, norm)
    # without k (or with no k heads) its blocks are empty: q stands in for its pointers; without
    # the norm the weights are never read: the cache stands in
    kx = k if hk else q
    wq = q_weight if norm else cache
    wk = (k_weight if hk else q_weight) if norm else cache
    _ext((t, nb), positions, q, kx, wq, wk, cache, hq, hk, nb1, cache.shape[0], q.stride(0), kx.stride(0), sps,
         positions.stride(-1), cache.stride(0), float(eps), float(offset), D=head_size, HALF=half,
         INTERLEAVED=interleaved, NORM=norm, CAST=_CASTS[cast] if norm else 0, MROPE=mrope, S0=s0, S1=s1, S2=s2,
         MROPE_INTERLEAVED=mrope_interleaved, BLOCK_H1=b1, BLOCK_H2=b2, BLOCK_R=block_r, BLOCK_T=block_t,
         QK_ONE=bool(qk_one), num_warps=warps, fp_fusion=not (norm and cast != "fp32"))  # keep each rounding of the bf16 chain
