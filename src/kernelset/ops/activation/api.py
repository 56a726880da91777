"""Public functions of the activation family, their custom ops and autograd.

One pair of custom ops serves every op here (``kernelset::act`` / ``kernelset::act_backward``),
told apart by the registry name, the activation and the layout; each public op still dispatches
under its own name, so ``KS_BACKEND=silu_and_mul:reference`` and ``ks.explain("gelu", x)`` work
per op. Eager calls use the same functions through one autograd.Function (core/autograd.py).
"""
from __future__ import annotations

from typing import Optional

import torch

from ...core import checks, dispatch
from ...core.autograd import AutogradSpec, apply, forward_only, needs_grad
from ...core.enums import AUTO, Backend, KsEnum
from ...core.errors import ArgumentError
from . import backends  # noqa: F401  (declares the ops and registers their implementations)


class GeluApprox(KsEnum):
    NONE = "none"  # exact, erf
    TANH = "tanh"  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))


def _gelu_kind(op: str, approximate: GeluApprox | str) -> str:
    return "gelu_tanh" if GeluApprox.parse(approximate, what="approximate", op=op) is GeluApprox.TANH else "gelu"


def _even_last(op: str, x: torch.Tensor) -> None:
    checks.tensor(op, "x", x)
    if x.shape[-1] % 2:
        raise ArgumentError(op, "x", "of even last dim [..., 2 * I] (gate and up)", f"shape {tuple(x.shape)}")


def _run(op: str, x: torch.Tensor, up: torch.Tensor | None, kind: str, layout: str, alpha: float, limit: float,
         backend: Backend | str) -> torch.Tensor:
    if torch.compiler.is_compiling():
        return torch.ops.kernelset.act(x, up, kind, layout, alpha, limit, op, str(backend))
    if needs_grad(x, up):
        return apply(_ACT, x, up, kind, layout, alpha, limit, op, str(backend))
    return dispatch.select(op, backend, (x, up), {}).forward(x, up, kind, layout, alpha, limit)


def silu_and_mul(x: torch.Tensor, *, backend: Backend | str = AUTO) -> torch.Tensor:
    """y = silu(x[..., :I]) * x[..., I:]: x ``[..., 2I]`` -> y ``[..., I]`` (vLLM layout, gate first).

    fp32 math; silu(gate) is rounded to x.dtype before the multiply, as transformers and vLLM do.
    """
    _even_last("silu_and_mul", x)
    return _run("silu_and_mul", x, None, "silu", "halves", 0.0, 0.0, backend)


def gelu_and_mul(x: torch.Tensor, *, approximate: GeluApprox | str = GeluApprox.NONE,
                 backend: Backend | str = AUTO) -> torch.Tensor:
    """y = gelu(x[..., :I]) * x[..., I:] (GeGLU): x ``[..., 2I]`` -> ``[..., I]``; fp32 math."""
    _even_last("gelu_and_mul", x)
    return _run("gelu_and_mul", x, None, _gelu_kind("gelu_and_mul", approximate), "halves", 0.0, 0.0, backend)


def swiglu(gate: torch.Tensor, up: torch.Tensor, *, backend: Backend | str = AUTO) -> torch.Tensor:
    """y = silu(gate) * up for split tensors ``[..., I]``; fp32 math, silu rounded first."""
    op = "swiglu"
    checks.tensor(op, "gate", gate)
    checks.tensor(op, "up", up)
    checks.shape(op, "up", up, tuple(gate.shape), "gate's shape")
    checks.same_dtype(op, "up", up, "gate", gate)
    checks.same_device(op, "up", up, "gate", gate)
    return _run(op, gate, up, "silu", "pair", 0.0, 0.0, backend)


def gelu(x: torch.Tensor, *, approximate: GeluApprox | str = GeluApprox.NONE,
         backend: Backend | str = AUTO) -> torch.Tensor:
    """y = gelu(x) elementwise (erf, or the tanh approximation); fp32 math."""
    checks.tensor("gelu", "x", x)
    return _run("gelu", x, None, _gelu_kind("gelu", approximate), "single", 0.0, 0.0, backend)


def swiglu_oai(x: torch.Tensor, *, alpha: float = 1.702, limit: float = 7.0,
               backend: Backend | str = AUTO) -> torch.Tensor:
    """gpt-oss clamped SwiGLU: x ``[..., 2I]`` interleaved (gate at even, up at odd columns).

    g = min(gate, limit), u = clamp(up, -limit, limit), y = (u + 1) * g * sigmoid(alpha * g);
    fp32 math, rounded once. Forward only: with x requiring grad the call runs and a backward
    through its output raises.
    """
    op = "swiglu_oai"
    _even_last(op, x)
    alpha = checks.finite(op, "alpha", alpha)
    limit = checks.positive(op, "limit", limit)
    if needs_grad(x) and not torch.compiler.is_compiling():
        # forward only, as the other inference ops: the call runs, and a backward through it raises
        return forward_only(op, "an inference op: gpt-oss's clamped SwiGLU", _act_fwd, x, None, "oai",
                            "interleaved", alpha, limit, op, str(backend))
    return _run(op, x, None, "oai", "interleaved", alpha, limit, backend)


def _act_fwd(x: torch.Tensor, up: Optional[torch.Tensor], kind: str, layout: str, alpha: float, limit: float,
             op: str, backend: str) -> torch.Tensor:
    return dispatch.select(op, backend, (x, up), {}).forward(x, up, kind, layout, alpha, limit)


_act_op = torch.library.custom_op("kernelset::act", mutates_args=())(_act_fwd)


@_act_op.register_fake
def _(x, up, kind, layout, alpha, limit, op, backend):
    i = x.shape[-1] // 2 if layout in ("halves", "interleaved") else x.shape[-1]
    return x.new_empty((*x.shape[:-1], i))


def _act_bwd(dy: torch.Tensor, x: torch.Tensor, up: Optional[torch.Tensor], kind: str, layout: str, op: str,
             backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    dy = checks.row_strided(dy)
    dx, du = dispatch.select(op, backend, (x, up), {}, backward=True).backward(dy, x, up, kind, layout)
    return dx, (du if du is not None else x.new_empty(0))


_act_bwd_op = torch.library.custom_op("kernelset::act_backward", mutates_args=())(_act_bwd)


@_act_bwd_op.register_fake
def _(dy, x, up, kind, layout, op, backend):
    return x.new_empty(x.shape), (up.new_empty(up.shape) if up is not None else x.new_empty(0))


def _setup(ctx, inputs, output):
    x, up, kind, layout, alpha, limit, op, backend = inputs
    ctx.save_for_backward(x, up)
    ctx.opts = (kind, layout, op, backend)


def _backward(ctx, dy):
    x, up = ctx.saved_tensors
    kind, layout, op, backend = ctx.opts
    bwd = _act_bwd if getattr(ctx, "eager", False) else torch.ops.kernelset.act_backward
    dx, du = bwd(dy, x, up, kind, layout, op, backend)
    return dx, (du if up is not None else None), None, None, None, None, None, None


_act_op.register_autograd(_backward, setup_context=_setup)
_ACT = AutogradSpec(_act_fwd, _setup, _backward)
