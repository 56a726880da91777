"""Declaration of rotary_embedding (serving layout, in place) and its implementations:
fwd(positions, q, k, cos_sin_cache, interleaved, head_size) rotates q and k in place."""
from __future__ import annotations

import functools

import torch

from ...core.arch import ArchRange, device_arch
from ...core.enums import Backend
from ...core.registry import BenchCase, Cost, Impl, OpSpec, Problem, declare_op, register_impl
from ...core.support import triton_rows
from . import reference as ref


def _packed(x: torch.Tensor | None, head_size: int) -> bool:
    """Each token's heads lie back to back with unit-stride features (any token stride)."""
    if x is None:
        return True
    if x.dim() == 2:
        return x.stride(1) == 1 or x.shape[1] <= 1
    return (x.stride(2) == 1 or x.shape[2] <= 1) and (x.stride(1) == head_size or x.shape[1] <= 1)


def _key(positions, q, k, cache, head_size):
    return (q.device, q.dtype, head_size, cache.shape[1], cache.dtype, k is None,
            _packed(q, head_size) and _packed(k, head_size) and cache.stride(1) == 1)


def _problem(positions, q, k, cache, head_size):
    t = q.shape[0]
    attrs = {"head_size": head_size, "rotary_dim": cache.shape[1], "k": "none" if k is None else "tensor",
             "packed": _packed(q, head_size) and _packed(k, head_size) and cache.stride(1) == 1}
    return Problem("rotary_embedding", q.device, q.dtype, (t, q[0].numel() if t else 0), device_arch(q.device), attrs)


def _cost(shape, dtype, mode):
    t, hq, hk, d = shape
    s = torch.empty((), dtype=dtype).element_size()
    return Cost(2 * t * (hq + hk) * d * s + t * d * 4 + t * 8, 0,
                "read and write q and k, read the cache rows and the positions")


declare_op(OpSpec(
    name="rotary_embedding", family="rope",
    signature="rotary_embedding(positions, q, k, cos_sin_cache, *, interleaved=False, rotary_dim=None, "
              "head_size=None, backend='auto') -> (q, k)",
    doc="in place: (a, b) -> (a cos - b sin, b cos + a sin) over the first rotary_dim features of each head",
    reference=ref.fwd, tolerance="elementwise", key=_key, problem=_problem, cost=_cost,
    bench=(BenchCase((16384, 32, 8, 128), "fwd", bar_pct=90.0),), c_abi=True, differentiable=False,
))


_triton_supports = functools.partial(
    triton_rows, flag="packed", what="q",
    message="q/k heads are not packed with unit-stride features, or the cache is strided (pass .contiguous())")


def _t_fwd(*args):
    from .launch import rope_fwd
    return rope_fwd(*args)


register_impl(Impl(op="rotary_embedding", backend=Backend.TRITON, forward=_t_fwd, backward=None,
                   supports=_triton_supports, priority=100, arch=ArchRange(min=(7, 0)), requires=("triton",),
                   note="one program per (token, head block); cos/sin read once per token"))
register_impl(Impl(op="rotary_embedding", backend=Backend.REFERENCE, forward=ref.fwd, backward=None,
                   supports=lambda p: None, priority=0, note="fp32 math in plain torch ops; any device"))


def _unit(*ts) -> bool:
    # (an empty tensor reads nothing: autograd's expanded zero-stride gradient of an empty batch,
    # which .contiguous() keeps as it is, must not turn the Triton backward away)
    return all(t is None or t.stride(-1) == 1 or t.shape[-1] <= 1 or t.numel() == 0 for t in ts)


def _apply_key(q, k, cos, sin):
    return (q.device, q.dtype, q.shape[-1], cos.dtype, cos.shape[-1], _unit(q, k, cos, sin))


def _apply_problem(q, k, cos, sin):
    return Problem("apply_rotary", q.device, q.dtype, tuple(q.shape), device_arch(q.device),
                   {"rotary_dim": cos.shape[-1], "unit_stride": _unit(q, k, cos, sin)})


def _apply_cost(shape, dtype, mode):
    b, hq, hk, s, d = shape
    e = torch.empty((), dtype=dtype).element_size()
    passes = 2 if mode == "fwd" else 4
    return Cost(passes * b * s * (hq + hk) * d * e, 0, "read q, k, write q', k'" + ("; read dq', dk', write dq, dk"
                                                                                  if mode != "fwd" else ""))


declare_op(OpSpec(
    name="apply_rotary", family="rope",
    signature="apply_rotary(q, k, cos, sin, *, interleaved=False, rotary_dim=None, unsqueeze_dim=1, "
              "backend='auto') -> (q, k)",
    doc="transformers' apply_rotary_pos_emb: x * cos + rotate_half(x) * sin on the first rotary_dim features",
    reference=lambda q, k, cos, sin: (ref.apply(q, cos, sin, False, cos.shape[-1], 1),
                                      ref.apply(k, cos, sin, False, cos.shape[-1], 1)),
    tolerance="elementwise", key=_apply_key, problem=_apply_problem, cost=_apply_cost,
    # fwd+bwd of a small op is host-bound eagerly (autograd's enqueue outlasts the kernels): the bar
    # case replays a CUDA graph (device time, every implementation alike), the eager case has no bar
    bench=(BenchCase((4, 32, 8, 4096, 128), "fwd"),
           BenchCase((4, 32, 8, 4096, 128), "fwd+bwd", bar_pct=85.0, graph=True),
           BenchCase((4, 32, 8, 4096, 128), "fwd+bwd")),
    # training-side (transformers' layout, differentiable); the C ABI exports rotary_embedding
    c_abi=False,
))

_apply_supports = functools.partial(triton_rows, flag="unit_stride", what="q",
                                    message="q, k, cos or sin has a strided last dim (pass .contiguous())")


def _t_apply(q, k, cos, sin, interleaved, rotary_dim, unsqueeze_dim, sign):
    from .launch import rope_apply
    return rope_apply(q, k, cos, sin, interleaved, rotary_dim, unsqueeze_dim, sign)


def _r_apply(q, k, cos, sin, interleaved, rotary_dim, unsqueeze_dim, sign):
    return tuple(ref.apply(x, cos, sin, interleaved, rotary_dim, unsqueeze_dim, sign) for x in (q, k))


# forward and backward are the same rotation, the backward with sign = -1
register_impl(Impl(op="apply_rotary", backend=Backend.TRITON, forward=_t_apply, backward=_t_apply,
                   supports=_apply_supports, priority=100, arch=ArchRange(min=(7, 0)), requires=("triton",),
                   note="any [B, S, H, D] strides; cos/sin read once per token"))
register_impl(Impl(op="apply_rotary", backend=Backend.REFERENCE, forward=_r_apply, backward=_r_apply,
                   supports=lambda p: None, priority=0, note="fp32 math in plain torch ops; any device"))


def _serving_packed(q, k, cache, head_size) -> bool:
    return _packed(q, head_size) and _packed(k, head_size) and cache.stride(1) == 1


def _mrope_key(positions, q, k, cache, head_size):
    return (q.device, q.dtype, head_size, cache.shape[1], cache.dtype, k is None, positions.dim(),
            _serving_packed(q, k, cache, head_size))


def _mrope_problem(positions, q, k, cache, head_size):
    t = q.shape[0]
    attrs = {"head_size": head_size, "rotary_dim": cache.shape[1], "k": "none" if k is None else "tensor",
             "positions": "[3, T]" if positions.dim() == 2 else "[T]",
             "packed": _serving_packed(q, k, cache, head_size)}
    return Problem("mrope", q.device, q.dtype, (t, q[0].numel() if t else 0), device_arch(q.device), attrs)


def _mrope_cost(shape, dtype, mode):
    t, hq, hk, d = shape
    s = torch.empty((), dtype=dtype).element_size()
    return Cost(2 * t * (hq + hk) * d * s + 3 * t * 8 + t * d * 4, 0,
                "read and write q and k, read 3 positions and R cache floats per token")


declare_op(OpSpec(
    name="mrope", family="rope",
    signature="mrope(positions, q, k, cos_sin_cache, mrope_section, *, mrope_interleaved=False, interleaved=False, "
              "rotary_dim=None, head_size=None, backend='auto') -> (q, k)",
    doc="in place: frequency i rotates by the position of its section (temporal, height, width); Qwen2/3-VL",
    reference=ref.mrope_fwd, tolerance="elementwise", key=_mrope_key, problem=_mrope_problem, cost=_mrope_cost,
    # the eager call's host time (checks, dispatch, one launch) was 100-140 us on the lent H200
    # host, more than the 88-91 us kernel, so the eager case measured the host (57-75% of copy;
    # 86-87% on quieter hosts): the bar case replays a CUDA graph, as vLLM runs it; eager is shown
    bench=(BenchCase((16384, 32, 8, 128), "fwd", bar_pct=85.0, graph=True),
           BenchCase((16384, 32, 8, 128), "fwd")), c_abi=True, differentiable=False,
))


def _t_ext(*args, **kwargs):
    from .launch import rope_ext
    return rope_ext(*args, **kwargs)


def _t_mrope(positions, q, k, cache, sections, mrope_interleaved, interleaved, head_size):
    _t_ext(positions, q, k, cache, head_size, interleaved, sections, mrope_interleaved)


register_impl(Impl(op="mrope", backend=Backend.TRITON, forward=_t_mrope, backward=None,
                   supports=_triton_supports, priority=100, arch=ArchRange(min=(7, 0)), requires=("triton",),
                   note="one program per (token, head block); the 3 cos/sin rows gathered per frequency"))
register_impl(Impl(op="mrope", backend=Backend.REFERENCE, forward=ref.mrope_fwd, backward=None,
                   supports=lambda p: None, priority=0, note="fp32 math in plain torch ops; any device"))


def _qk_key(q, k, q_weight, k_weight, cache, positions, head_size):
    return (q.device, q.dtype, head_size, cache.shape[1], cache.dtype, k is None, positions.dim(),
            q_weight.dtype, _serving_packed(q, k, cache, head_size))


def _qk_problem(q, k, q_weight, k_weight, cache, positions, head_size):
    t = q.shape[0]
    attrs = {"head_size": head_size, "rotary_dim": cache.shape[1], "k": "none" if k is None else "tensor",
             "positions": "[3, T]" if positions.dim() == 2 else "[T]",
             "weight": str(q_weight.dtype).replace("torch.", ""),
             "packed": _serving_packed(q, k, cache, head_size)}
    return Problem("qk_norm_rope", q.device, q.dtype, (t, q[0].numel() if t else 0), device_arch(q.device), attrs)


def _qk_cost(shape, dtype, mode):
    t, hq, hk, d = shape
    s = torch.empty((), dtype=dtype).element_size()
    return Cost(2 * t * (hq + hk) * d * s + t * 8 + t * d * 4 + 2 * d * s, 0,
                "read and write q and k, read the positions and the cache rows (and the two weights)")


declare_op(OpSpec(
    name="qk_norm_rope", family="rope",
    signature="qk_norm_rope(q, k, q_weight, k_weight, cos_sin_cache, positions, *, eps=1e-6, offset=0.0, "
              "cast='llama', interleaved=False, rotary_dim=None, head_size=None, mrope_section=None, "
              "mrope_interleaved=False, backend='auto') -> (q, k)",
    doc="in place, per head: x * rsqrt(mean(x^2) + eps) * (offset + w), then RoPE (Qwen3, Gemma 3)",
    reference=ref.qk_norm_rope_fwd,
    tolerance="norm", key=_qk_key, problem=_qk_problem, cost=_qk_cost,
    # the eager call's host time (checks, dispatch, one launch) was 100-140 us on the lent H200
    # host, more than the 88-91 us kernel, so the eager case measured the host (57-75% of copy;
    # 86-87% on quieter hosts): the bar case replays a CUDA graph, as vLLM runs it; eager is shown
    bench=(BenchCase((16384, 32, 8, 128), "fwd", bar_pct=85.0, graph=True),
           BenchCase((16384, 32, 8, 128), "fwd")), c_abi=True, differentiable=False,
))


def _t_qk(q, k, q_weight, k_weight, cache, positions, eps, offset, cast, interleaved, head_size, sections,
          mrope_interleaved):
    _t_ext(positions, q, k, cache, head_size, interleaved, sections, mrope_interleaved, q_weight, k_weight, eps,
           offset, cast)


register_impl(Impl(op="qk_norm_rope", backend=Backend.TRITON, forward=_t_qk, backward=None,
                   supports=_triton_supports, priority=100, arch=ArchRange(min=(7, 0)), requires=("triton",),
                   note="one pass per (token, head block): RMSNorm of each head, then the rotation"))
register_impl(Impl(op="qk_norm_rope", backend=Backend.REFERENCE, forward=ref.qk_norm_rope_fwd, backward=None,
                   supports=lambda p: None, priority=0, note="fp32 math in plain torch ops; any device"))
