"""Public RoPE functions and their custom ops: rotary_embedding, mrope and qk_norm_rope (serving
layout, in place, forward only) and apply_rotary (transformers' layout, differentiable)."""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional, Sequence

import torch

from ...core import checks, config, dispatch
from ...core.autograd import AutogradSpec, apply, mark_written, needs_grad
from ...core.enums import AUTO, Backend, KsEnum
from ...core.errors import ArgumentError
from . import backends  # noqa: F401  (declares the ops and registers their implementations)
from .cache import mrope_sections


class RotaryOutput(NamedTuple):
    q: torch.Tensor
    k: Optional[torch.Tensor]


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor | None, cos_sin_cache: torch.Tensor,
                     *, interleaved: bool = False, rotary_dim: int | None = None, head_size: int | None = None,
                     backend: Backend | str = AUTO) -> RotaryOutput:
    """Rotate q ``[T, Hq, D]`` / ``[T, Hq*D]`` and k in place at ``positions [T]`` (vLLM semantics).

    cos_sin_cache ``[max_pos, R]`` holds cos in its first R/2 columns and sin in the last R/2; the
    first R = rotary_dim features of each head rotate (partial rotary when R < D), NeoX style
    (x[i], x[i + R/2]) or, with ``interleaved``, GPT-J style (x[2i], x[2i+1]). fp32 math. A
    position outside [0, max_pos) leaves its token unrotated. Returns ``(q, k)`` themselves.
    """
    key = None
    # (plain tensors first: anything else goes to the checks, which name it; a training call builds no key)
    if (not torch.compiler.is_compiling() and type(q) is torch.Tensor and type(cos_sin_cache) is torch.Tensor
            and (k is None or type(k) is torch.Tensor) and not needs_grad(q, k, cos_sin_cache)):
        key = _rot_eager_key(positions, q, k, cos_sin_cache, interleaved, rotary_dim, head_size, backend)
        if key is not None:
            replay = _ROT_EAGER.get(key)
            if replay is not None and replay(positions, q, k, cos_sin_cache):
                mark_written(q, k)
                return RotaryOutput(q, k)
    op = "rotary_embedding"
    checks.tensor(op, "positions", positions, dtypes=(torch.int64, torch.int32))
    hs = _check_serving(op, q, k, cos_sin_cache, rotary_dim, head_size)
    checks.shape(op, "positions", positions, (q.shape[0],), "one position per token")
    checks.same_device(op, "positions", positions, "q", q)
    _forward_only(op, q, k, cos_sin_cache)  # in place behind autograd's back would give wrong gradients
    if positions.stride(0) != 1 and positions.numel() > 1:
        positions = positions.contiguous()  # the kernel reads positions[t] at t (T ints: a cheap copy)
    if torch.compiler.is_compiling():
        torch.ops.kernelset.rotary_embedding_(positions, q, k, cos_sin_cache, interleaved, hs, str(backend))
        return RotaryOutput(q, k)
    impl = dispatch.select(op, backend, (positions, q, k, cos_sin_cache, hs), {})
    impl.forward(positions, q, k, cos_sin_cache, interleaved, hs)
    mark_written(q, k)
    if key is not None and impl.backend is Backend.TRITON and key not in _ROT_EAGER:
        from .launch import rope_fwd_replay
        replay = rope_fwd_replay(positions, q, k, cos_sin_cache, interleaved, hs)
        if replay is not None:
            if len(_ROT_EAGER) >= 1024:
                _ROT_EAGER.clear()
            _ROT_EAGER[key] = replay
    return RotaryOutput(q, k)


# Eager calls whose every argument property matches a call validated before launch the kernel
# again through ``launch.rope_fwd_replay`` (the policy and integer arguments computed once),
# without the checks and the dispatcher: a serving engine calls this op once per layer per step,
# and at T=16384 32/8 D128 the full path's host time (~100 us on a lent H200 host) exceeded the
# 88 us kernel. Besides shapes, strides, dtypes and devices, the key holds where k lies relative
# to q when both share a storage (a fused qkv buffer's slices: validated disjoint once, at that
# offset); k in another storage cannot overlap q. As ``norm.api._EAGER``: emptied on any
# configuration change; the replay refuses tensors whose alignment differs from the compiled
# kernel's (then the full path runs and checks everything).
_ROT_EAGER: dict[tuple, Any] = {}
config.on_change(_ROT_EAGER.clear)


def _rot_eager_key(positions, q, k, cache, interleaved, rotary_dim, head_size, backend) -> tuple | None:
    if (type(q) is not torch.Tensor or type(positions) is not torch.Tensor or type(cache) is not torch.Tensor
            or not (k is None or type(k) is torch.Tensor) or type(interleaved) is not bool
            or not (rotary_dim is None or type(rotary_dim) is int) or not (head_size is None or type(head_size) is int)
            or type(backend) is not str):
        return None
    if k is None:
        kk = None
    else:
        same = k.untyped_storage().data_ptr() == q.untyped_storage().data_ptr()
        kk = (k.shape, k.stride(), k.dtype, k.device, k.data_ptr() - q.data_ptr() if same else None)
    # the config generation, as the norm table's key: a replay recorded under an older config is not found
    return (config.generation(), positions.shape, positions.stride(), positions.dtype, positions.device, q.shape,
            q.stride(), q.dtype, q.device, kk, cache.shape, cache.stride(), cache.dtype, cache.device, interleaved,
            rotary_dim, head_size, backend)


def _check_serving(op: str, q: torch.Tensor, k: torch.Tensor | None, cos_sin_cache: torch.Tensor,
                   rotary_dim: int | None, head_size: int | None) -> int:
    """Checks shared by the serving-layout ops: q ``[T, H, D]`` / ``[T, H*D]``, k alike,
    cos_sin_cache ``[max_pos, R]``. Returns the head size D."""
    checks.tensor(op, "q", q, min_ndim=2)
    checks.no_overlap(op, "q", q)
    checks.tensor(op, "cos_sin_cache", cos_sin_cache, min_ndim=2)
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] % 2 or cos_sin_cache.shape[0] == 0:
        raise ArgumentError(op, "cos_sin_cache", "2-D [max_pos >= 1, rotary_dim] with an even rotary_dim",
                            f"shape {tuple(cos_sin_cache.shape)}")
    r = cos_sin_cache.shape[1]
    if rotary_dim is not None and rotary_dim != r:
        raise ArgumentError(op, "rotary_dim", f"cos_sin_cache.shape[1] ({r})", rotary_dim)
    if q.dim() == 3:
        hs = q.shape[2]
        if head_size is not None and head_size != hs:
            raise ArgumentError(op, "head_size", f"q.shape[-1] ({hs}) for a 3-D q", head_size)
    elif q.dim() == 2:
        if isinstance(head_size, bool) or not isinstance(head_size, int):
            raise ArgumentError(op, "head_size", "an int, given when q is 2-D [T, H * D]", head_size)
        hs = head_size
    else:
        raise ArgumentError(op, "q", "[T, H, D] or [T, H * D]", f"shape {tuple(q.shape)}")
    if hs < max(r, 1) or (q.shape[-1] if q.dim() == 2 else hs) % hs:
        raise ArgumentError(op, "q", f"heads of size {hs} >= rotary_dim {r}", f"shape {tuple(q.shape)}")
    checks.same_device(op, "cos_sin_cache", cos_sin_cache, "q", q)
    if k is not None:
        checks.tensor(op, "k", k, min_ndim=2)
        checks.same_dtype(op, "k", k, "q", q)
        checks.same_device(op, "k", k, "q", q)
        checks.no_overlap(op, "k", k)
        # both rotate in place: shared elements would turn twice (a slice of one fused qkv buffer
        # is fine: its q and k interleave without meeting)
        checks.disjoint(op, "k", k, "q", q, "both are rotated in place")
        # (2-D or 3-D only, as q: the kernels read a token's heads in memory order, which is not a
        # permuted 4-D k's element order; per-token sizes from the shape: k[0] fails on an empty batch)
        if (k.dim() not in (2, 3) or k.shape[0] != q.shape[0] or (k.dim() == 3 and k.shape[2] != hs)
                or math.prod(k.shape[1:]) % hs):
            raise ArgumentError(op, "k", f"[T={q.shape[0]}, Hk, {hs}] or [T, Hk * {hs}]", f"shape {tuple(k.shape)}")
    return hs


@torch.library.custom_op("kernelset::rotary_embedding_", mutates_args=("q", "k"))
def _rope_op(positions: torch.Tensor, q: torch.Tensor, k: Optional[torch.Tensor], cos_sin_cache: torch.Tensor,
             interleaved: bool, head_size: int, backend: str) -> None:
    dispatch.select("rotary_embedding", backend, (positions, q, k, cos_sin_cache, head_size), {}).forward(
        positions, q, k, cos_sin_cache, interleaved, head_size)


@_rope_op.register_fake
def _(positions, q, k, cos_sin_cache, interleaved, head_size, backend):
    return None


class RotatedQK(NamedTuple):
    q: torch.Tensor
    k: torch.Tensor


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
                 interleaved: bool = False, rotary_dim: int | None = None, unsqueeze_dim: int = 1,
                 backend: Backend | str = AUTO) -> RotatedQK:
    """transformers' ``apply_rotary_pos_emb``: new q, k = x * cos + rotate_half(x) * sin.

    q ``[B, Hq, S, D]`` and k ``[B, Hk, S, D]`` (``unsqueeze_dim=1``, the default) or
    ``[B, S, H, D]`` (``unsqueeze_dim=2``); cos/sin ``[B, S, R]`` or ``[S, R]`` as transformers'
    rotary modules return them (halves duplicated; pairs duplicated for ``interleaved``). The first
    R = cos.shape[-1] features rotate (``rotary_dim``, if given, must equal it); the rest pass
    through. fp32 math; differentiable in q and k
    (cos and sin are treated as constants).
    """
    key = None
    if (not torch.compiler.is_compiling() and type(q) is torch.Tensor and type(k) is torch.Tensor
            and not needs_grad(q, k)):  # (a training call builds no key)
        key = _apply_eager_key(q, k, cos, sin, interleaved, rotary_dim, unsqueeze_dim, backend)
        if key is not None:
            replay = _APPLY_EAGER.get(key)
            if replay is not None:
                out = replay(q, k, cos, sin)
                if out is not None:
                    return RotatedQK(*out)
    op = "apply_rotary"
    for name, t in (("q", q), ("k", k)):
        checks.tensor(op, name, t, min_ndim=4)
        if t.dim() != 4:
            raise ArgumentError(op, name, "4-D", f"shape {tuple(t.shape)}")
    checks.same_dtype(op, "k", k, "q", q)
    checks.same_device(op, "k", k, "q", q)
    if unsqueeze_dim not in (1, 2):
        raise ArgumentError(op, "unsqueeze_dim", "1 ([B, H, S, D]) or 2 ([B, S, H, D])", unsqueeze_dim)
    s_dim = 2 if unsqueeze_dim == 1 else 1
    b, s, d = q.shape[0], q.shape[s_dim], q.shape[-1]
    checks.tensor(op, "cos", cos, min_ndim=2)
    r = cos.shape[-1]
    if rotary_dim is not None and rotary_dim != r:
        raise ArgumentError(op, "rotary_dim", f"cos.shape[-1] ({r}): transformers' tables are rotary_dim wide",
                            rotary_dim)
    for name, t in (("cos", cos), ("sin", sin)):
        checks.tensor(op, name, t, min_ndim=2)
        checks.same_device(op, name, t, "q", q)
        if tuple(t.shape[-2:]) != (s, r) or t.dim() > 3 or (t.dim() == 3 and t.shape[0] not in (1, b)):
            raise ArgumentError(op, name, f"of shape [S={s}, R={r}] or [B={b}, S, R]", f"shape {tuple(t.shape)}")
    if r % 2 or r > d or r < 2:
        raise ArgumentError(op, "rotary_dim", f"even and in [2, {d}]", r)
    if k.shape[0] != b or k.shape[s_dim] != s or k.shape[-1] != d:
        raise ArgumentError(op, "k", f"batch {b}, seq {s}, head size {d} like q", f"shape {tuple(k.shape)}")
    args = (q, k, cos, sin, interleaved, r, unsqueeze_dim)
    if torch.compiler.is_compiling():
        return RotatedQK(*torch.ops.kernelset.apply_rotary(*args, str(backend)))
    if needs_grad(q, k):
        return RotatedQK(*apply(_APPLY, *args, str(backend)))
    impl = dispatch.select(op, backend, (q, k, cos, sin), {})
    out = RotatedQK(*impl.forward(*args, 1.0))
    if key is not None and impl.backend is Backend.TRITON and key not in _APPLY_EAGER:
        from .launch import rope_apply_replay
        replay = rope_apply_replay(q, k, cos, sin, interleaved, r, unsqueeze_dim)
        if replay is not None:
            if len(_APPLY_EAGER) >= 1024:
                _APPLY_EAGER.clear()
            _APPLY_EAGER[key] = replay
    return out


# No-grad eager calls whose every argument property matches a call validated before launch its
# kernel again through ``launch.rope_apply_replay`` (strides and policy computed once), without the
# checks and the dispatcher: in HF's decode loop this op runs once per layer per token. As
# ``norm.api._EAGER``: emptied on any configuration change; the replay refuses tensors whose
# alignment differs from the compiled kernel's (then the full call runs).
_APPLY_EAGER: dict[tuple, Any] = {}
config.on_change(_APPLY_EAGER.clear)


def _apply_eager_key(q, k, cos, sin, interleaved, rotary_dim, unsqueeze_dim, backend) -> tuple | None:
    if (type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(cos) is not torch.Tensor
            or type(sin) is not torch.Tensor or type(interleaved) is not bool or type(unsqueeze_dim) is not int
            or not (rotary_dim is None or type(rotary_dim) is int) or type(backend) is not str):
        return None
    return (config.generation(), q.shape, q.stride(), k.shape, k.stride(), cos.shape, cos.stride(), sin.shape,
            sin.stride(), q.dtype, k.dtype, cos.dtype, sin.dtype, q.device, k.device, cos.device, sin.device,
            interleaved, rotary_dim, unsqueeze_dim, backend)


def _apply_fwd(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
               rotary_dim: int, unsqueeze_dim: int, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    impl = dispatch.select("apply_rotary", backend, (q, k, cos, sin), {})
    return impl.forward(q, k, cos, sin, interleaved, rotary_dim, unsqueeze_dim, 1.0)


_apply_op = torch.library.custom_op("kernelset::apply_rotary", mutates_args=())(_apply_fwd)


@_apply_op.register_fake
def _(q, k, cos, sin, interleaved, rotary_dim, unsqueeze_dim, backend):
    return torch.empty_like(q), torch.empty_like(k)


def _apply_bwd(dq: torch.Tensor, dk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
               rotary_dim: int, unsqueeze_dim: int, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    impl = dispatch.select("apply_rotary", backend, (dq, dk, cos, sin), {}, backward=True)
    return impl.backward(dq, dk, cos, sin, interleaved, rotary_dim, unsqueeze_dim, -1.0)


_apply_bwd_op = torch.library.custom_op("kernelset::apply_rotary_backward", mutates_args=())(_apply_bwd)


@_apply_bwd_op.register_fake
def _(dq, dk, cos, sin, interleaved, rotary_dim, unsqueeze_dim, backend):
    return torch.empty_like(dq), torch.empty_like(dk)


def _apply_setup(ctx, inputs, output):
    q, k, cos, sin, interleaved, rotary_dim, unsqueeze_dim, backend = inputs
    ctx.save_for_backward(cos, sin)
    ctx.opts = (interleaved, rotary_dim, unsqueeze_dim, backend)


def _apply_backward(ctx, dq, dk):
    cos, sin = ctx.saved_tensors
    bwd = _apply_bwd if getattr(ctx, "eager", False) else torch.ops.kernelset.apply_rotary_backward
    gq, gk = bwd(dq.contiguous(), dk.contiguous(), cos, sin, *ctx.opts)
    return gq, gk, None, None, None, None, None, None


_apply_op.register_autograd(_apply_backward, setup_context=_apply_setup)
_APPLY = AutogradSpec(_apply_fwd, _apply_setup, _apply_backward, name="apply_rotary")


def _check_positions(op: str, positions: torch.Tensor, q: torch.Tensor, multimodal: bool) -> None:
    checks.tensor(op, "positions", positions, dtypes=(torch.int64, torch.int32))
    t = q.shape[0]
    if positions.dim() == 1 or not multimodal:
        checks.shape(op, "positions", positions, (t,), "one position per token" if not multimodal else
                     "[T] (text only) or [3, T] (temporal, height, width)")
    elif tuple(positions.shape) != (3, t):
        raise ArgumentError(op, "positions", f"[T={t}] (text only) or [3, T] (temporal, height, width)",
                            f"shape {tuple(positions.shape)}")
    checks.same_device(op, "positions", positions, "q", q)


def _forward_only(op: str, *ts: torch.Tensor | None) -> None:
    if needs_grad(*ts):
        name = ("q", "k", "cos_sin_cache")[next(i for i, t in enumerate(ts) if t is not None and t.requires_grad)]
        raise ArgumentError(op, name, f"a tensor that does not require grad ({op} is in place and forward-only)",
                            "requires_grad=True")


def mrope(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor | None, cos_sin_cache: torch.Tensor,
          mrope_section: Sequence[int], *, mrope_interleaved: bool = False, interleaved: bool = False,
          rotary_dim: int | None = None, head_size: int | None = None,
          backend: Backend | str = AUTO) -> RotaryOutput:
    """Multimodal RoPE of Qwen2-VL / Qwen2.5-VL (and Qwen3-VL with ``mrope_interleaved``), in place.

    positions ``[3, T]`` (temporal, height, width) or ``[T]`` (text only: equals
    :func:`rotary_embedding`); q ``[T, Hq, D]`` / ``[T, Hq*D]`` and k as in rotary_embedding;
    cos_sin_cache ``[max_pos, R]`` = [cos | sin]. Frequency i < R/2 rotates by the position of its
    section: mrope_section = (s_t, s_h, s_w), summing to R/2, as contiguous bands (Qwen2-VL) or,
    with ``mrope_interleaved``, Qwen3-VL's interleaved t, h, w layout. ``interleaved`` selects
    GPT-J pairs as in rotary_embedding (Qwen models use NeoX halves, the default). fp32 math. An
    out-of-range position leaves the frequencies of its section unrotated. Returns ``(q, k)``.
    """
    op = "mrope"
    hs = _check_serving(op, q, k, cos_sin_cache, rotary_dim, head_size)
    _check_positions(op, positions, q, True)
    sections = list(mrope_sections(mrope_section, cos_sin_cache.shape[1], op))
    _forward_only(op, q, k)
    args = (positions, q, k, cos_sin_cache, sections, bool(mrope_interleaved), bool(interleaved), hs)
    if torch.compiler.is_compiling():
        torch.ops.kernelset.mrope_(*args, str(backend))
    else:
        dispatch.select(op, backend, (positions, q, k, cos_sin_cache, hs), {}).forward(*args)
        mark_written(q, k)
    return RotaryOutput(q, k)


@torch.library.custom_op("kernelset::mrope_", mutates_args=("q", "k"))
def _mrope_op(positions: torch.Tensor, q: torch.Tensor, k: Optional[torch.Tensor], cos_sin_cache: torch.Tensor,
              sections: list[int], mrope_interleaved: bool, interleaved: bool, head_size: int, backend: str) -> None:
    dispatch.select("mrope", backend, (positions, q, k, cos_sin_cache, head_size), {}).forward(
        positions, q, k, cos_sin_cache, sections, mrope_interleaved, interleaved, head_size)


@_mrope_op.register_fake
def _(positions, q, k, cos_sin_cache, sections, mrope_interleaved, interleaved, head_size, backend):
    return None


class QKNormCast(KsEnum):
    """Where qk_norm_rope rounds to q.dtype."""

    FP32 = "fp32"  # fp32 from load to store, one rounding (the most accurate; vLLM's fused kernel)
    LLAMA = "llama"  # transformers' Qwen3: Qwen3RMSNorm (round x * rstd, times w, round), then
    #                  apply_rotary_pos_emb in q.dtype (cos/sin rounded, each product rounded, the sum)
    GEMMA = "gemma"  # transformers' Gemma 3: Gemma3RMSNorm (x * rstd * (offset + w) in fp32, round), same RoPE


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor | None, q_weight: torch.Tensor, k_weight: torch.Tensor | None,
                 cos_sin_cache: torch.Tensor, positions: torch.Tensor, *, eps: float = 1e-6, offset: float = 0.0,
                 cast: QKNormCast | str = QKNormCast.LLAMA, interleaved: bool = False,
                 rotary_dim: int | None = None, head_size: int | None = None,
                 mrope_section: Sequence[int] | None = None, mrope_interleaved: bool = False,
                 backend: Backend | str = AUTO) -> RotaryOutput:
    """Per-head RMSNorm then RoPE of q and k, in one pass, in place (Qwen3, Gemma 3, Qwen3-VL).

    x = x * rsqrt(mean(x^2) + eps) * (offset + w) over each head's D features (w ``[D]``; Gemma 3:
    ``offset=1.0, cast='gemma'``), then the first R features rotate as :func:`rotary_embedding`
    (or :func:`mrope` with ``mrope_section`` and positions ``[3, T]``). q ``[T, Hq, D]`` /
    ``[T, Hq*D]``, k alike, any token stride (views into a fused qkv buffer). fp32 statistics;
    ``cast`` picks the roundings (QKNormCast): the default reproduces transformers' Qwen3
    attention bit for bit up to the reduction order of the mean. Forward only. Returns ``(q, k)``.
    """
    op = "qk_norm_rope"
    hs = _check_serving(op, q, k, cos_sin_cache, rotary_dim, head_size)
    _check_positions(op, positions, q, mrope_section is not None)
    sections = list(mrope_sections(mrope_section, cos_sin_cache.shape[1], op)) if mrope_section is not None else None
    weights = []
    for name, w, x in (("q_weight", q_weight, q), ("k_weight", k_weight, k)):
        if x is None:
            if w is not None:
                raise ArgumentError(op, name, "None when k is None", f"a {type(w).__name__}")
            weights.append(None)
            continue
        checks.tensor(op, name, w)
        checks.shape(op, name, w, (hs,), "the head size")
        checks.same_device(op, name, w, "q", q)
        weights.append(w if w.is_contiguous() else w.contiguous())
    eps = checks.positive(op, "eps", eps)
    offset = checks.finite(op, "offset", offset)
    mode = QKNormCast.parse(cast, what="cast", op=op).value
    _forward_only(op, q, k)
    args = (q, k, weights[0], weights[1], cos_sin_cache, positions, eps, offset, mode, bool(interleaved), hs,
            sections, bool(mrope_interleaved))
    if torch.compiler.is_compiling():
        torch.ops.kernelset.qk_norm_rope_(*args, str(backend))
    else:
        dispatch.select(op, backend, (q, k, weights[0], weights[1], cos_sin_cache, positions, hs), {}).forward(*args)
        mark_written(q, k)
    return RotaryOutput(q, k)


@torch.library.custom_op("kernelset::qk_norm_rope_", mutates_args=("q", "k"))
def _qk_op(q: torch.Tensor, k: Optional[torch.Tensor], q_weight: torch.Tensor, k_weight: Optional[torch.Tensor],
           cos_sin_cache: torch.Tensor, positions: torch.Tensor, eps: float, offset: float, cast: str,
           interleaved: bool, head_size: int, sections: Optional[list[int]], mrope_interleaved: bool,
           backend: str) -> None:
    dispatch.select("qk_norm_rope", backend, (q, k, q_weight, k_weight, cos_sin_cache, positions, head_size),
                    {}).forward(q, k, q_weight, k_weight, cos_sin_cache, positions, eps, offset, cast, interleaved,
                                head_size, sections, mrope_interleaved)


@_qk_op.register_fake
def _(q, k, q_weight, k_weight, cos_sin_cache, positions, eps, offset, cast, interleaved, head_size, sections,
      mrope_interleaved, backend):
    return None
