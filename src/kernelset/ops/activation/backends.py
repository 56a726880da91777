"""Declarations of the activation ops and their implementations.

Every backend takes fwd(x, up, kind, layout, alpha, limit) -> y and bwd(dy, x, up, kind,
layout) -> (dx, dup); ``kind`` and ``layout`` are fixed per op (see kernels.py).
"""
from __future__ import annotations

import torch

from ...core.arch import ArchRange, device_arch
from ...core.checks import row_stride
from ...core.enums import Backend
from ...core.registry import BenchCase, Cost, Impl, OpSpec, Problem, declare_op, register_impl
from ...core.support import triton_rows
from . import reference as ref


def _rows_ok(t: torch.Tensor | None) -> bool:
    return t is None or t.is_contiguous() or row_stride(t) is not None


def _key(x, up=None):
    return (x.device, x.dtype, x.shape[-1], None if up is None else up.dtype, _rows_ok(x) and _rows_ok(up))


def _problem_fn(op: str):
    def problem(x, up=None):
        n = x.shape[-1]
        rows = x.numel() // n if n else 0
        attrs = {"last_dim": n, "up": "none" if up is None else "tensor", "rows_ok": _rows_ok(x) and _rows_ok(up)}
        return Problem(op, x.device, x.dtype, (rows, n), device_arch(x.device), attrs)
    return problem


def _cost(fwd_passes: float, bwd_passes: float, what_fwd: str, what_bwd: str, halves: bool = False):
    """Passes counted in units of one [rows, I] tensor, I the output width (half of x's last dim
    when gate and up share x)."""
    def cost(shape, dtype, mode):
        s = torch.empty((), dtype=dtype).element_size()
        m, i = shape[0], shape[1] // 2 if halves else shape[1]
        passes = fwd_passes if mode == "fwd" else fwd_passes + bwd_passes
        return Cost(int(passes * m * i * s), 0, what_fwd if mode == "fwd" else f"{what_fwd}; {what_bwd}")
    return cost


def _declare(name, signature, doc, reference, cost, bench, differentiable=True):
    return declare_op(OpSpec(name=name, family="activation", signature=signature, doc=doc, reference=reference,
                             tolerance="elementwise", key=_key, problem=_problem_fn(name), cost=cost, bench=bench,
                             c_abi=True, differentiable=differentiable))


_GLU_COST = _cost(3, 5, "read x [M, 2I], write y [M, I]", "read dy and x, write dx", halves=True)
_BIG = (16384, 2 * 14336)  # Llama-3-8B MLP at 16K tokens

_declare("silu_and_mul", "silu_and_mul(x, *, backend='auto')", "y = silu(x[..., :I]) * x[..., I:] (vLLM layout)",
         lambda x: ref.fwd(x, None, "silu", "halves", 0.0, 0.0), _GLU_COST,
         (BenchCase(_BIG, "fwd", bar_pct=95.0), BenchCase(_BIG, "fwd+bwd", bar_pct=85.0)))
_declare("gelu_and_mul", "gelu_and_mul(x, *, approximate='none', backend='auto')",
         "y = gelu(x[..., :I]) * x[..., I:] (GeGLU)", lambda x: ref.fwd(x, None, "gelu", "halves", 0.0, 0.0),
         _GLU_COST, (BenchCase(_BIG, "fwd", bar_pct=95.0), BenchCase(_BIG, "fwd+bwd")))
_declare("swiglu", "swiglu(gate, up, *, backend='auto')", "y = silu(gate) * up",
         lambda g, u: ref.fwd(g, u, "silu", "pair", 0.0, 0.0),
         _cost(3, 5, "read gate and up, write y", "read dy, gate, up, write dgate, dup"),
         (BenchCase((16384, 14336), "fwd"), BenchCase((16384, 14336), "fwd+bwd")))
_declare("gelu", "gelu(x, *, approximate='none', backend='auto')", "y = gelu(x), erf or tanh approximation",
         lambda x: ref.fwd(x, None, "gelu", "single", 0.0, 0.0),
         _cost(2, 3, "read x, write y", "read dy and x, write dx"), (BenchCase((16384, 14336), "fwd"),))
_declare("swiglu_oai", "swiglu_oai(x, *, alpha=1.702, limit=7.0, backend='auto')",
         "gpt-oss: g = x[..., ::2].clamp(max=limit), u = x[..., 1::2].clamp(-limit, limit), y = (u + 1) * g * "
         "sigmoid(alpha * g)", lambda x: ref.fwd(x, None, "oai", "interleaved", 1.702, 7.0), _GLU_COST,
         (BenchCase((16384, 2 * 2880), "fwd"),), differentiable=False)


def _t_fwd(x, up, kind, layout, alpha, limit):
    from .launch import act_fwd
    return act_fwd(x, up, kind, layout, alpha, limit)


def _t_bwd(dy, x, up, kind, layout):
    from .launch import act_bwd
    return act_bwd(dy, x, up, kind, layout)


for _op, _bwd_fn in (("silu_and_mul", _t_bwd), ("gelu_and_mul", _t_bwd), ("swiglu", _t_bwd), ("gelu", _t_bwd),
                     ("swiglu_oai", None)):
    register_impl(Impl(op=_op, backend=Backend.TRITON, forward=_t_fwd, backward=_bwd_fn, supports=triton_rows,
                       priority=100, arch=ArchRange(min=(7, 0)), requires=("triton",),
                       note="kernelset's own elementwise kernel, 2-D tiles"))
    register_impl(Impl(op=_op, backend=Backend.REFERENCE, forward=ref.fwd,
                       backward=ref.bwd if _bwd_fn is not None else None, supports=lambda p: None, priority=0,
                       note="fp32 math in plain torch ops; any device"))
