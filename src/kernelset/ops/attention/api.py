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

from ...core import checks, config, dispatch, registry
from ...core.autograd import AutogradSpec, apply, forward_only, needs_grad
from ...core.enums import AUTO, Backend
from ...core.errors import ArgumentError, UnsupportedError
from ...core.op import trace_constant
from ...core.registry import Impl
from ..kvcache.api import check_cache, check_scale
from ..quant.formats import FP8
from . import backends  # noqa: F401  (declares the ops and registers their implementations)
from .backends import AttnBackend

_HALF = (torch.float16, torch.bfloat16)


class AttentionOutput(NamedTuple):
    out: torch.Tensor  # like q (head size Dv)
    lse: torch.Tensor  # fp32, natural log of the softmax denominator: [T, Hq] paged, [B, Hq, S] dense, [Hq, T] varlen


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
        # forward only: a call that records autograd (q or sinks requiring grad) gets a node whose
        # backward raises, instead of an output that silently carries no gradient
        out, lse = forward_only(op, "an inference op: flash_attention(_varlen) is the differentiable one",
                                dispatch.select(op, backend, args[:6], {}).forward, *args)
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
    # forward only, as paged_attention: a recording call gets a node whose backward raises (the
    # Triton output carried no gradient, the reference's a real one: dropped on the GPU, silently)
    return AttentionOutput(*forward_only(op, "an inference op (cascade decode)",
                                         dispatch.select(op, backend, (out_a, lse_a, out_b, lse_b), {}).forward,
                                         out_a, lse_a, out_b, lse_b))


@torch.library.custom_op("kernelset::merge_attn_states", mutates_args=())
def _merge_op(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor,
              backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    return dispatch.select("merge_attn_states", backend, (out_a, lse_a, out_b, lse_b), {}).forward(
        out_a, lse_a, out_b, lse_b)


@_merge_op.register_fake
def _(out_a, lse_a, out_b, lse_b, backend):
    return out_a.new_empty(out_a.shape), out_a.new_empty(out_a.shape[:2], dtype=torch.float32)


# ---- dense / varlen prefill --------------------------------------------------------------------


def _check_qkv(op: str, q, k, v, ndim: int, layout: str) -> None:
    """Every check of _check_qkv_detail; the common valid call reads each attribute once (this runs
    on every decode step of every layer), and anything off goes through the detailed checks for
    their error."""
    T = torch.Tensor
    if isinstance(q, T) and isinstance(k, T) and isinstance(v, T):
        qs, ks_, vs = q.shape, k.shape, v.shape
        dt = q.dtype
        if (dt in _FLOAT and k.dtype == dt and v.dtype == dt and len(qs) == ndim and len(ks_) == ndim
                and len(vs) == ndim and (q.stride(-1) == 1 or qs[-1] <= 1) and (k.stride(-1) == 1 or ks_[-1] <= 1)
                and (v.stride(-1) == 1 or vs[-1] <= 1) and vs[:-1] == ks_[:-1] and ks_[-1] == qs[-1]
                and ks_[-2] and not qs[-2] % ks_[-2] and qs[-1] and vs[-1]):
            dev = q.device
            if k.device == dev and v.device == dev:
                return
    _check_qkv_detail(op, q, k, v, ndim, layout)


_FLOAT = frozenset(checks.FLOAT_DTYPES)


def _check_qkv_detail(op: str, q, k, v, ndim: int, layout: str) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        checks.tensor(op, name, t, min_ndim=ndim)
        if t.dim() != ndim:
            raise ArgumentError(op, name, f"{ndim}-D {layout}", f"shape {tuple(t.shape)}")
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ArgumentError(op, name, "unit-stride in its last dim (head size)", f"strides {t.stride()}")
    for name, t in (("k", k), ("v", v)):
        checks.same_dtype(op, name, t, "q", q)
        checks.same_device(op, name, t, "q", q)
    if tuple(v.shape[:-1]) != tuple(k.shape[:-1]):
        raise ArgumentError(op, "v", f"of k's shape {tuple(k.shape[:-1])} up to the head size", f"shape {tuple(v.shape)}")
    if k.shape[-1] != q.shape[-1]:
        raise ArgumentError(op, "k", f"of q's head size {q.shape[-1]}", f"shape {tuple(k.shape)}")
    hq, hkv = q.shape[-2], k.shape[-2]
    if hkv == 0 or hq % hkv:
        raise ArgumentError(op, "q", f"a multiple of k's {hkv} KV heads in query heads", f"{hq} heads")
    if q.shape[-1] == 0 or v.shape[-1] == 0:
        raise ArgumentError(op, "q", "head sizes >= 1", f"q {tuple(q.shape)}, v {tuple(v.shape)}")


def _options(op: str, q, scale, softcap, window, sinks):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else checks.positive(op, "scale", scale)
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not 0 <= softcap < math.inf:
        raise ArgumentError(op, "softcap", "a finite number >= 0 (0: off)", repr(softcap))
    left, right = _window(op, window)
    if sinks is not None:
        checks.tensor(op, "sinks", sinks)
        checks.shape(op, "sinks", sinks, (q.shape[-2],), "one logit per query head")
        checks.same_device(op, "sinks", sinks, "q", q)
        # the kernels index sinks by head with unit stride; a strided view (sinks_all[::2]) read
        # the wrong heads' logits (.contiguous() is differentiable: its gradient reaches the view)
        sinks = sinks.contiguous()
    return float(scale), float(softcap), left, right, sinks


def _request(op: str, backend: Backend | str) -> str:
    """'auto', or the named backend's value (a core Backend or one of AttnBackend's SDPA names).
    Membership tests, not the enums' parse: torch.compile traces this, and Dynamo cannot trace the
    ValueError an Enum lookup raises and catches (every named backend failed to compile)."""
    if isinstance(backend, (Backend, AttnBackend)):
        return str(backend)
    if isinstance(backend, str):
        name = backend.strip().lower()
        if name == AUTO or name in _REQUEST_NAMES:
            return name
    valid = ", ".join([AUTO] + [b.value for b in Backend] + [b.value for b in AttnBackend])
    raise ValueError(f"{op}: argument 'backend' must be one of {valid}, got {backend!r}")


_REQUEST_NAMES = frozenset([b.value for b in Backend] + [b.value for b in AttnBackend])


_family_cache: dict[tuple, Impl] = {}
config.on_change(_family_cache.clear)


def _select(op: str, backend: str, args: tuple, kw: dict, backward: bool = False) -> Impl:
    """dispatch.select, plus requests for SDPA's backends (which core's Backend enum cannot name):
    those run or raise UnsupportedError with the reason, as any named backend."""
    kw = {**kw, "request": backend}
    if backend not in _SDPA_NAMES:
        return dispatch.select(op, backend, args, kw, backward=backward)
    spec = registry.op(op)
    ck = (config.generation(), op, backend, backward, spec.key(*args, **kw))
    impl = _family_cache.get(ck)
    if impl is None:
        impl = next((i for i in registry.impls(op) if str(i.backend) == backend), None)
        if impl is None:
            have = ", ".join(str(i.backend) for i in registry.impls(op))
            raise UnsupportedError(op, backend, f"no such implementation (have: {have})")
        reason = dispatch.rejection(impl, spec.problem(*args, **kw), backward=backward)
        if reason:
            raise UnsupportedError(op, backend, reason)
        _family_cache[ck] = impl
    return impl


_SDPA_NAMES = frozenset(str(b) for b in AttnBackend)


def _train_backend(op, backend, q, k, v, cu_q, cu_k, max_q, max_k, causal, left, right, softcap, sinks) -> str | None:
    """The SDPA backend that runs a training call (autograd, no LSE asked) with its own backward, or
    None: the call goes through our op (forward with LSE, our backward). Under AUTO the table's
    "train" rows rank the candidates (priorities without a row); a named SDPA backend runs or raises."""
    if op != "flash_attention" or (backend not in _SDPA_NAMES and backend != AUTO):
        return None
    kw = {**_kw(causal, left, right, softcap, sinks, False, max_q, max_k), "train": True}
    impl = _select(op, backend, (q, k, v, cu_q, cu_k), kw)
    return str(impl.backend) if str(impl.backend) in _SDPA_NAMES else None


@trace_constant
def _traced_train_backend(op: str, backend: str, device: str, dtype: str, shapes: tuple, strides: tuple,
                          grads: tuple, opts: tuple) -> str:
    """_train_backend at torch.compile trace time, from constants only (a constant of the graph,
    guarded by the tensors' shapes, dtypes, devices and requires_grad): builds stand-ins of q, k, v
    of the same shapes and strides for torch's can_use_* checks. "" means our op."""
    causal, left, right, softcap, has_sinks = opts
    dt = getattr(torch, dtype)
    q, k, v = (torch.empty_strided(sh, st, dtype=dt, device=device).requires_grad_(g)
               for sh, st, g in zip(shapes, strides, grads))
    sinks = torch.zeros(q.shape[2], device=device) if has_sinks else None
    return _train_backend(op, backend, q, k, v, None, None, q.shape[1], k.shape[1], causal, left, right, softcap,
                          sinks) or ""


def _static(*ts: torch.Tensor) -> bool:
    return all(type(n) is int for t in ts for n in (*t.shape, *t.stride()))


def _run(op, q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, left, right, softcap, sinks, return_lse, backend,
         heads=None):
    """``heads``: the caller's q, k, v ``[B, H, S, D]`` (layout="bhsd"; q, k, v are their [B, S, H, D]
    views): SDPA's training path takes them as they are, the others take the views, and the output
    is returned ``[B, H, S, D]``."""
    train = needs_grad(q, k, v, sinks) and not return_lse
    if train and cu_q is None:
        if not torch.compiler.is_compiling():
            sdpa = _train_backend(op, backend, q, k, v, cu_q, cu_k, max_q, max_k, causal, left, right, softcap, sinks)
        elif _static(q, k, v):  # symbolic shapes (dynamic=True) keep our op: the choice needs sizes
            sdpa = _traced_train_backend(op, backend, str(q.device), str(q.dtype).replace("torch.", ""),
                                         (tuple(q.shape), tuple(k.shape), tuple(v.shape)),
                                         (q.stride(), k.stride(), v.stride()),
                                         (q.requires_grad, k.requires_grad, v.requires_grad),
                                         (causal, left, right, softcap, sinks is not None))
        else:
            sdpa = None
        if sdpa:
            return backends.sdpa_train(sdpa, q, k, v, causal, scale, heads)
    need_lse = bool(return_lse) or needs_grad(q, k, v, sinks)
    args = (q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, left, right, softcap, sinks, need_lse, op, backend)
    if torch.compiler.is_compiling():
        out, lse = torch.ops.kernelset.flash_attention(*args)
    elif needs_grad(q, k, v, sinks):
        # the choice first, outside the autograd node: a backend that cannot run raises here, not
        # inside autograd's C entry while the warnings of torch's can_use_* checks are still pending
        # there (which torch reports as a SystemError); the forward's own select is then a cache hit
        _select(op, backend, (q, k, v, cu_q, cu_k), _kw(causal, left, right, softcap, sinks, need_lse, max_q, max_k))
        out, lse = apply(_FLASH, *args)
    else:
        out, lse = _flash_fwd(*args)
    if heads is not None:
        out = out.transpose(1, 2)
    return AttentionOutput(out, lse) if return_lse else out


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    scale: float | None = None, window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    sinks: torch.Tensor | None = None, return_lse: bool = False, layout: str = "bshd",
                    backend: Backend | str = AUTO) -> torch.Tensor | AttentionOutput:
    """out = softmax(scale * q K^T) V per batch and head (FlashAttention's interface), fp32 accumulation.

    q ``[B, Sq, Hq, D]``, k ``[B, Sk, Hkv, D]``, v ``[B, Sk, Hkv, Dv]`` (Dv may differ: MLA prefill
    192/128); any strides with a unit-stride last dim. GQA/MQA when Hq is a multiple of Hkv.
    ``causal``: bottom-right aligned (query i sits at position Sk - Sq + i); ``window=(left,
    right)``: keys p - left <= j <= p + right (-1 unbounded); ``softcap``: s = softcap tanh(s /
    softcap); ``sinks [Hq]``: a logit per head in the denominator (gpt-oss). A row with no
    visible key gets out 0 and lse -inf (the sink's logit with sinks). Differentiable in q, k, v
    and sinks, through out and the returned lse. Returns out ``[B, Sq, Hq, Dv]``, or with
    ``return_lse`` (out, lse ``[B, Hq, Sq]`` fp32, natural log; FlashAttention's layout).
    ``layout="bhsd"``: q, k, v and out are ``[B, H, S, D]`` instead (SDPA's and transformers' layout;
    out is then a view of ``[B, Sq, Hq, Dv]`` memory where the kernel writes that). A training call
    that SDPA runs then takes the tensors as they are: no transpose enters the autograd graph.
    """
    op = "flash_attention"
    heads = None
    if layout != "bshd":
        if layout != "bhsd":
            raise ArgumentError(op, "layout", '"bshd" ([B, S, H, D]) or "bhsd" ([B, H, S, D])', repr(layout))
        heads = (q, k, v)
        q, k, v = (t.transpose(1, 2) if isinstance(t, torch.Tensor) and t.dim() == 4 else t for t in heads)
    _check_qkv(op, q, k, v, 4, "[B, S, H, D]" if heads is None else "[B, H, S, D]")
    if k.shape[0] != q.shape[0]:
        raise ArgumentError(op, "k", f"of q's batch size {q.shape[0]}", f"shape {tuple(k.shape)}")
    scale, softcap, left, right, sinks = _options(op, q, scale, softcap, window, sinks)
    return _run(op, q, k, v, None, None, q.shape[1], k.shape[1], bool(causal), scale, left, right, softcap, sinks,
                return_lse, _request(op, backend), heads)


def _check_cu(op, cu_q, cu_k, max_q, max_k, q, k, check_bounds):
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        checks.tensor(op, name, cu, dtypes=(torch.int32,))
        if cu.dim() != 1 or cu.shape[0] < 1:
            raise ArgumentError(op, name, "1-D [B + 1] int32 offsets", f"shape {tuple(cu.shape)}")
        checks.same_device(op, name, cu, "q", q)
    checks.shape(op, "cu_seqlens_k", cu_k, tuple(cu_q.shape), "as many offsets as cu_seqlens_q")
    for name, m in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ArgumentError(op, name, "an int >= 0", repr(m))
    if not check_bounds or cu_q.shape[0] == 1 or _hot_path(q):
        return
    stats = []
    for cu in (cu_q, cu_k):
        c = cu.long()
        n = c[1:] - c[:-1]
        stats += [c[0], c[-1], n.min(), n.max()]
    q0, q1, qmin, qmax, k0, k1, kmin, kmax = torch.stack(stats).tolist()  # one host sync
    for name, c0, c1, nmin, total in (("cu_seqlens_q", q0, q1, qmin, q.shape[0]),
                                      ("cu_seqlens_k", k0, k1, kmin, k.shape[0])):
        if c0 != 0 or c1 > total or nmin < 0:
            raise ArgumentError(op, name, f"non-decreasing from 0 to at most {total} (the packed tokens)",
                                f"first {c0}, last {c1}, smallest step {nmin}")
    if qmax > max_q:
        raise ArgumentError(op, "max_seqlen_q", f">= the longest query sequence ({qmax})", max_q)
    if kmax > max_k:
        raise ArgumentError(op, "max_seqlen_k", f">= the longest key sequence ({kmax})", max_k)


def flash_attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *, causal: bool = False,
                           scale: float | None = None, window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           sinks: torch.Tensor | None = None, return_lse: bool = False, check_bounds: bool = True,
                           backend: Backend | str = AUTO) -> torch.Tensor | AttentionOutput:
    """flash_attention over packed sequences (FlashAttention's varlen interface).

    q ``[T, Hq, D]``, k ``[Tk, Hkv, D]``, v ``[Tk, Hkv, Dv]``; sequence b owns query rows
    cu_seqlens_q[b]:cu_seqlens_q[b+1] and key rows cu_seqlens_k[b]:cu_seqlens_k[b+1] (``[B + 1]``
    int32); ``max_seqlen_*`` bound the lengths (they size the launch: no host sync). Options as
    :func:`flash_attention`, causal bottom-right aligned per sequence; an empty sequence is
    skipped. ``check_bounds`` (one host sync; skipped under CUDA-graph capture and torch.compile)
    checks the offsets against T, Tk and the max lengths: offsets past the tensors would read out of
    bounds. Query rows past cu_seqlens_q[-1] (padding of a packed batch) belong to no sequence:
    the kernels leave their out, lse and gradient rows unspecified, as FlashAttention's varlen
    does (the reference writes zeros); so are the dk, dv rows of keys past cu_seqlens_k[-1]. They
    never reach the sinks' gradient. Returns out ``[T, Hq, Dv]``, or (out, lse ``[Hq, T]`` fp32)
    with ``return_lse``.
    """
    op = "flash_attention_varlen"
    _check_qkv(op, q, k, v, 3, "[T, H, D]")
    _check_cu(op, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q, k, check_bounds)
    scale, softcap, left, right, sinks = _options(op, q, scale, softcap, window, sinks)
    return _run(op, q, k, v, cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), max_seqlen_q, max_seqlen_k,
                bool(causal), scale, left, right, softcap, sinks, return_lse, _request(op, backend))


def _kw(causal, left, right, softcap, sinks, need_lse, max_q, max_k):
    return dict(causal=causal, window=(left, right), softcap=softcap, sinks=sinks, need_lse=need_lse,
                max_seqlen_q=max_q, max_seqlen_k=max_k, train=False)


def _flash_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: Optional[torch.Tensor],
               cu_k: Optional[torch.Tensor], max_q: int, max_k: int, causal: bool, scale: float, left: int, right: int,
               softcap: float, sinks: Optional[torch.Tensor], need_lse: bool, op: str,
               backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    impl = _select(op, backend, (q, k, v, cu_q, cu_k), _kw(causal, left, right, softcap, sinks, need_lse, max_q, max_k))
    return impl.forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, (left, right), softcap, sinks, need_lse)


_flash_op = torch.library.custom_op("kernelset::flash_attention", mutates_args=())(_flash_fwd)


@_flash_op.register_fake
def _(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, left, right, softcap, sinks, need_lse, op, backend):
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    lse_shape = (q.shape[1], q.shape[0]) if cu_q is not None else (q.shape[0], q.shape[2], q.shape[1])
    return out, q.new_empty(lse_shape, dtype=torch.float32)


def _flash_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
               lse: torch.Tensor, cu_q: Optional[torch.Tensor], cu_k: Optional[torch.Tensor], max_q: int, max_k: int,
               causal: bool, scale: float, left: int, right: int, softcap: float, sinks: Optional[torch.Tensor],
               op: str, backend: str, dlse: Optional[torch.Tensor] = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``dlse``: the gradient reaching the returned LSE (return_lse=True and the LSE used, as ring /
    cascade attention merges do), or None."""
    impl = _select(op, backend, (q, k, v, cu_q, cu_k), _kw(causal, left, right, softcap, sinks, True, max_q, max_k),
                   backward=True)
    dq, dk, dv, ds = impl.backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, (left, right),
                                   softcap, sinks, dlse)
    return dq, dk, dv, (ds.to(sinks.dtype) if ds is not None else q.new_empty(0))


_flash_bwd_op = torch.library.custom_op("kernelset::flash_attention_backward", mutates_args=())(_flash_bwd)


@_flash_bwd_op.register_fake
def _(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, left, right, softcap, sinks, op, backend,
      dlse=None):
    ds = sinks.new_empty(sinks.shape) if sinks is not None else q.new_empty(0)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), ds


def _flash_setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, left, right, softcap, sinks, need_lse, op, backend = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], cu_q, cu_k, sinks)
    ctx.opts = (max_q, max_k, causal, scale, left, right, softcap)
    ctx.tail = (op, backend)


def _flash_backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_q, cu_k, sinks = ctx.saved_tensors
    bwd = _flash_bwd if getattr(ctx, "eager", False) else torch.ops.kernelset.flash_attention_backward
    # dlse: None where the LSE reached no loss (the eager path builds no zeros for it, see _FLASH)
    dq, dk, dv, ds = bwd(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.opts, sinks, *ctx.tail, dlse)
    return (dq, dk, dv, None, None, None, None, None, None, None, None, None,
            ds if sinks is not None else None, None, None, None)


_flash_op.register_autograd(_flash_backward, setup_context=_flash_setup)
_FLASH = AutogradSpec(_flash_fwd, _flash_setup, _flash_backward, needed=(0,), name="flash_attention")
