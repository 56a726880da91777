"""Public attention ops over a paged KV cache and their custom ops.

What is checked where (paged_attention):
- always, on the host, without reading device data: types, dtypes, shapes, devices, strides,
  scale/softcap/window values, sinks and fp8 scales;
- ``check_bounds`` (default on; one host sync; skipped under CUDA-graph capture and
  torch.compile): seq_lens within [0, max_seq_len] and the block table's width, every block id a
  sequence uses within [0, num_blocks), cu_seqlens_q non-decreasing from 0 to T with at most
  max_seqlen_q and at most seq_len new tokens per sequence;
- always, on the device: a bad block id or a sequence the launch cannot serve turns that
  sequence's output into NaN; nothing is read outside the cache or the block table.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch

from ...core import checks, dispatch
from ...core.enums import AUTO, Backend
from ...core.errors import ArgumentError
from ..kvcache.api import check_cache, check_scale
from ..kvcache.reference import FP8
from . import backends  # noqa: F401  (declares the ops and registers their implementations)

_HALF = (torch.float16, torch.bfloat16)


class AttentionOutput(NamedTuple):
    out: torch.Tensor  # like q
    lse: torch.Tensor  # [T, Hq] fp32, natural log of the softmax denominator


def _hot_path(t: torch.Tensor) -> bool:
    return torch.compiler.is_compiling() or (t.is_cuda and torch.cuda.is_current_stream_capturing())


def _window(op: str, window: object) -> tuple[int, int]:
    if (not isinstance(window, (tuple, list)) or len(window) != 2
            or not all(isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window)):
        raise ArgumentError(op, "window", "a pair (left, right) of ints >= -1 (-1: unbounded)", repr(window))
    return int(window[0]), int(window[1])


def _check_bounds(op, block_table, seq_lens, cu_seqlens_q, max_seqlen_q, t, num_blocks, bs, max_keys):
    b, width = block_table.shape
    lens = seq_lens.long()
    used = torch.arange(width, device=lens.device)[None, :] < ((lens + bs - 1) // bs)[:, None]
    bt = block_table.long()
    bad_blocks = (used & ((bt < 0) | (bt >= num_blocks))).sum()
    zero = torch.zeros((), dtype=torch.long, device=lens.device)
    if cu_seqlens_q is not None:
        cu = cu_seqlens_q.long()
        n_new = cu[1:] - cu[:-1]
        stats = [cu[0], cu[-1], n_new.min(), n_new.max(), (n_new - lens).max()]
    else:
        stats = [zero, zero, zero, zero, zero]
    lo, hi, blocks, c0, c1, nmin, nmax, over = torch.stack(
        [lens.min(), lens.max(), bad_blocks, *stats]).tolist()  # one host sync
    if lo < 0 or hi > max_keys:
        raise ArgumentError(op, "seq_lens", f"in [0, {max_keys}] (max_seq_len and the block table's {width} blocks "
                            f"of {bs})", f"lengths from {lo} to {hi}")
    if blocks:
        raise ArgumentError(op, "block_table", f"block ids in [0, {num_blocks}) for every block a sequence uses",
                            f"{blocks} out-of-range entries")
    if cu_seqlens_q is not None:
        if c0 != 0 or c1 != t or nmin < 0:
            raise ArgumentError(op, "cu_seqlens_q", f"non-decreasing from 0 to T={t}",
                                f"cu_seqlens_q[0]={c0}, cu_seqlens_q[-1]={c1}, smallest step {nmin}")
        if nmax > max_seqlen_q:
            raise ArgumentError(op, "max_seqlen_q", f">= the most query tokens of a sequence ({nmax})", max_seqlen_q)
        if over > 0:
            raise ArgumentError(op, "seq_lens", "at least each sequence's query tokens (they are cached before "
                                "attention runs)", f"a sequence with {over} more query tokens than cached tokens")


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    seq_lens: torch.Tensor, *, cu_seqlens_q: torch.Tensor | None = None, max_seqlen_q: int = 1,
                    causal: bool = True, scale: float | None = None, window: tuple[int, int] = (-1, -1),
                    softcap: float = 0.0, sinks: torch.Tensor | None = None, k_scale: torch.Tensor | None = None,
                    v_scale: torch.Tensor | None = None, max_seq_len: int | None = None, return_lse: bool = False,
                    check_bounds: bool = True, backend: Backend | str = AUTO) -> torch.Tensor | AttentionOutput:
    """Attention of query tokens to their sequences' paged KV cache (vLLM / FlashAttention layout).

    out = softmax(scale * q K^T) V per sequence, fp32 accumulation. Caches ``[num_blocks,
    block_size, Hkv, D]``; sequence b's token j lives in block ``block_table[b, j // block_size]``
    ``[B, max_blocks]`` int32, and it has ``seq_lens[b]`` ``[B]`` int32 cached tokens. Decode: q
    ``[B, Hq, D]``, one token per sequence at position seq_len - 1. With ``cu_seqlens_q`` ``[B+1]``
    int32: q ``[T, Hq, D]``, sequence b's n = cu[b+1] - cu[b] tokens (at most ``max_seqlen_q``) sit
    at positions seq_len - n .. seq_len - 1 (chunked prefill, prefix caching, speculative
    verification), causal relative to those positions. GQA when Hq is a multiple of Hkv; window
    (left, right) as FlashAttention (-1 unbounded; causal forces right = 0); ``softcap``:
    s = softcap * tanh(s / softcap); ``sinks`` ``[Hq]``: a logit per head in the denominator
    (gpt-oss); fp8 e4m3 caches with scalar fp32 ``k_scale``/``v_scale``. ``max_seq_len`` (default:
    the block table's capacity) bounds seq_lens and sizes the split-KV scratch: no host sync, no
    data-dependent allocation, so the call is CUDA-graph capturable. A sequence with no key to see
    gets out = 0 and lse = -inf (= the sink with sinks). Returns out, or (out, lse ``[T, Hq]``
    fp32) with ``return_lse``.
    """
    op = "paged_attention"
    checks.tensor(op, "q", q, min_ndim=3)
    if q.dim() != 3:
        raise ArgumentError(op, "q", "3-D [B, Hq, D] (decode) or [T, Hq, D] (with cu_seqlens_q)",
                            f"shape {tuple(q.shape)}")
    if q.stride(-1) != 1 and q.shape[-1] > 1:
        raise ArgumentError(op, "q", "unit-stride in its last dim", f"strides {q.stride()}")
    check_cache(op, "k_cache", k_cache)
    check_cache(op, "v_cache", v_cache)
    checks.shape(op, "v_cache", v_cache, tuple(k_cache.shape), "k_cache's shape")
    checks.same_dtype(op, "v_cache", v_cache, "k_cache", k_cache)
    nb, bs, hkv, d = k_cache.shape
    t, hq = q.shape[:2]
    if q.shape[2] != d:
        raise ArgumentError(op, "q", f"of head size D={d} (the cache's)", f"shape {tuple(q.shape)}")
    if hkv == 0 or hq % hkv:
        raise ArgumentError(op, "q", f"a multiple of the cache's {hkv} KV heads in query heads", f"{hq} heads")
    if k_cache.dtype == FP8:
        if q.dtype not in _HALF:
            raise ArgumentError(op, "q", "float16 or bfloat16 with an fp8 cache", str(q.dtype))
    else:
        checks.same_dtype(op, "k_cache", k_cache, "q", q)
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        checks.same_device(op, name, x, "q", q)
    checks.tensor(op, "block_table", block_table, dtypes=(torch.int32,), min_ndim=2)
    checks.tensor(op, "seq_lens", seq_lens, dtypes=(torch.int32,))
    if block_table.dim() != 2 or seq_lens.dim() != 1 or block_table.shape[0] != seq_lens.shape[0]:
        raise ArgumentError(op, "block_table", f"[B, max_blocks] with B = len(seq_lens) ({seq_lens.shape[0]})",
                            f"shape {tuple(block_table.shape)}")
    b = seq_lens.shape[0]
    for name, x in (("block_table", block_table), ("seq_lens", seq_lens)):
        checks.same_device(op, name, x, "q", q)
    if block_table.stride(1) != 1 and block_table.shape[1] > 1:
        block_table = block_table.contiguous()
    seq_lens = seq_lens.contiguous()
    if cu_seqlens_q is None:
        if t != b:
            raise ArgumentError(op, "q", f"one token per sequence [B={b}, Hq, D] without cu_seqlens_q",
                                f"shape {tuple(q.shape)}")
        max_seqlen_q = 1
    else:
        checks.tensor(op, "cu_seqlens_q", cu_seqlens_q, dtypes=(torch.int32,))
        checks.shape(op, "cu_seqlens_q", cu_seqlens_q, (b + 1,), "B + 1 offsets")
        checks.same_device(op, "cu_seqlens_q", cu_seqlens_q, "q", q)
        cu_seqlens_q = cu_seqlens_q.contiguous()
        if isinstance(max_seqlen_q, bool) or not isinstance(max_seqlen_q, int) or max_seqlen_q < 1:
            raise ArgumentError(op, "max_seqlen_q", "an int >= 1", repr(max_seqlen_q))
    scale = 1.0 / math.sqrt(d) if scale is None else checks.positive(op, "scale", scale)
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not 0 <= softcap < math.inf:
        raise ArgumentError(op, "softcap", "a finite number >= 0 (0: off)", repr(softcap))
    left, right = _window(op, window)
    if sinks is not None:
        checks.tensor(op, "sinks", sinks)
        checks.shape(op, "sinks", sinks, (hq,), "one logit per query head")
        checks.same_device(op, "sinks", sinks, "q", q)
        sinks = sinks.to(torch.float32).contiguous()
    k_scale = check_scale(op, "k_scale", k_scale, k_cache, "k_cache")
    v_scale = check_scale(op, "v_scale", v_scale, v_cache, "v_cache")
    capacity = block_table.shape[1] * bs
    if max_seq_len is None:
        max_seq_len = capacity
    elif isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 0:
        raise ArgumentError(op, "max_seq_len", "an int >= 0 (or None: the block table's capacity)", repr(max_seq_len))
    max_seq_len = min(max_seq_len, capacity)
    if check_bounds and b and not _hot_path(q):
        _check_bounds(op, block_table, seq_lens, cu_seqlens_q, max_seqlen_q, t, nb, bs, max_seq_len)
    args = (q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, max_seqlen_q, causal, float(scale),
            (left, right), float(softcap), sinks, k_scale, v_scale, max_seq_len)
    if torch.compiler.is_compiling():
        out, lse = torch.ops.kernelset.paged_attention(*args[:9], left, right, *args[10:], str(backend))
    else:
        out, lse = dispatch.select(op, backend, args[:6], {}).forward(*args)
    return AttentionOutput(out, lse) if return_lse else out


@torch.library.custom_op("kernelset::paged_attention", mutates_args=())
def _paged_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
              seq_lens: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor], max_seqlen_q: int, causal: bool,
              scale: float, window_left: int, window_right: int, softcap: float, sinks: Optional[torch.Tensor],
              k_scale: Optional[torch.Tensor], v_scale: Optional[torch.Tensor], max_seq_len: int,
              backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    impl = dispatch.select("paged_attention", backend, (q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q), {})
    return impl.forward(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, max_seqlen_q, causal, scale,
                        (window_left, window_right), softcap, sinks, k_scale, v_scale, max_seq_len)


@_paged_op.register_fake
def _(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, max_seqlen_q, causal, scale, window_left,
      window_right, softcap, sinks, k_scale, v_scale, max_seq_len, backend):
    return q.new_empty(q.shape), q.new_empty(q.shape[:2], dtype=torch.float32)


def merge_attn_states(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor, *,
                      backend: Backend | str = AUTO) -> AttentionOutput:
    """Attention over the union of two disjoint key sets from its parts (cascade / split attention).

    lse = logaddexp(lse_a, lse_b), out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b, fp32 math;
    out_* ``[T, H, D]`` (any token/head strides), lse_* ``[T, H]`` fp32 (natural log, as
    paged_attention returns it). An empty part (lse -inf) contributes nothing; both empty: out 0,
    lse -inf. Returns (out like out_a, lse ``[T, H]`` fp32).
    """
    op = "merge_attn_states"
    checks.tensor(op, "out_a", out_a, min_ndim=3)
    if out_a.dim() != 3:
        raise ArgumentError(op, "out_a", "3-D [T, H, D]", f"shape {tuple(out_a.shape)}")
    checks.tensor(op, "out_b", out_b, min_ndim=3)
    checks.shape(op, "out_b", out_b, tuple(out_a.shape), "out_a's shape")
    checks.same_device(op, "out_b", out_b, "out_a", out_a)
    for name, lse in (("lse_a", lse_a), ("lse_b", lse_b)):
        checks.tensor(op, name, lse, dtypes=(torch.float32,), min_ndim=2)
        checks.shape(op, name, lse, tuple(out_a.shape[:2]), "[T, H] like out_a")
        checks.same_device(op, name, lse, "out_a", out_a)
    for name, x in (("out_a", out_a), ("out_b", out_b)):
        if x.stride(-1) != 1 and x.shape[-1] > 1:
            raise ArgumentError(op, name, "unit-stride in its last dim", f"strides {x.stride()}")
    if torch.compiler.is_compiling():
        return AttentionOutput(*torch.ops.kernelset.merge_attn_states(out_a, lse_a, out_b, lse_b, str(backend)))
    return AttentionOutput(*dispatch.select(op, backend, (out_a, lse_a, out_b, lse_b), {}).forward(
        out_a, lse_a, out_b, lse_b))


@torch.library.custom_op("kernelset::merge_attn_states", mutates_args=())
def _merge_op(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor,
              backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    return dispatch.select("merge_attn_states", backend, (out_a, lse_a, out_b, lse_b), {}).forward(
        out_a, lse_a, out_b, lse_b)


@_merge_op.register_fake
def _(out_a, lse_a, out_b, lse_b, backend):
    return out_a.new_empty(out_a.shape), out_a.new_empty(out_a.shape[:2], dtype=torch.float32)
