"""Public softmax / log_softmax, their custom ops and autograd (same pattern as the norm family)."""
from __future__ import annotations

import torch

from ...core import checks, dispatch
from ...core.autograd import AutogradSpec, apply, needs_grad
from ...core.enums import AUTO, Backend
from ...core.errors import ArgumentError, ArgumentTypeError
from . import backends  # noqa: F401  (declares the ops and registers their implementations)


def _prepare(op: str, x: torch.Tensor, dim: int, temperature: float, out_dtype: torch.dtype | None):
    checks.tensor(op, "x", x)
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise ArgumentTypeError(op, "dim", "an int", repr(dim))
    if not -x.dim() <= dim < x.dim():
        raise ArgumentError(op, "dim", f"in [-{x.dim()}, {x.dim() - 1}] for a {x.dim()}-D x", dim)
    temperature = checks.positive(op, "temperature", temperature)
    if out_dtype is None:
        out_dtype = x.dtype
    elif out_dtype not in checks.FLOAT_DTYPES:
        raise ArgumentTypeError(op, "out_dtype", "None, float32, float16 or bfloat16", out_dtype)
    return dim % x.dim(), temperature, out_dtype


def _run(op: str, x: torch.Tensor, dim: int, temperature: float, out_dtype: torch.dtype | None,
         backend: Backend | str) -> torch.Tensor:
    dim, temperature, out_dtype = _prepare(op, x, dim, temperature, out_dtype)
    last = dim == x.dim() - 1
    # kernels reduce the last dim: another dim is moved there and made contiguous (one copy)
    xt = x if last else x.movedim(dim, -1).contiguous()
    log = op == "log_softmax"
    if x.shape[dim] == 0:  # nothing to reduce; a copy (of nothing) keeps y on x's autograd graph
        y = xt.to(out_dtype, copy=True)
    elif torch.compiler.is_compiling():
        y = torch.ops.kernelset.softmax(xt, temperature, log, out_dtype, op, str(backend))
    elif needs_grad(x):
        y = apply(_SPEC, xt, temperature, log, out_dtype, op, str(backend))
    else:
        y = dispatch.select(op, backend, (xt,), {}).forward(xt, temperature, log, out_dtype)
    # contiguous, as torch's result is: a view of the moved layout would refuse .view() and the like
    return y if last else y.movedim(-1, dim).contiguous()


def softmax(x: torch.Tensor, *, dim: int = -1, temperature: float = 1.0, out_dtype: torch.dtype | None = None,
            backend: Backend | str = AUTO) -> torch.Tensor:
    """y = softmax(x / temperature) along ``dim``; fp32 math, y in ``out_dtype`` (default x.dtype)."""
    return _run("softmax", x, dim, temperature, out_dtype, backend)


def log_softmax(x: torch.Tensor, *, dim: int = -1, temperature: float = 1.0, out_dtype: torch.dtype | None = None,
                backend: Backend | str = AUTO) -> torch.Tensor:
    """y = log_softmax(x / temperature) along ``dim``; fp32 math, y in ``out_dtype`` (default x.dtype)."""
    return _run("log_softmax", x, dim, temperature, out_dtype, backend)


def _fwd(x: torch.Tensor, temperature: float, log: bool, out_dtype: torch.dtype, op: str,
         backend: str) -> torch.Tensor:
    return dispatch.select(op, backend, (x,), {}).forward(x, temperature, log, out_dtype)


_op = torch.library.custom_op("kernelset::softmax", mutates_args=())(_fwd)


@_op.register_fake
def _(x, temperature, log, out_dtype, op, backend):
    return x.new_empty(x.shape, dtype=out_dtype)


def _bwd(dy: torch.Tensor, y: torch.Tensor, temperature: float, log: bool, x_dtype: torch.dtype, op: str,
         backend: str) -> torch.Tensor:
    dy = checks.row_strided(dy)
    return dispatch.select(op, backend, (y,), {}, backward=True).backward(dy, y, temperature, log, x_dtype)


_bwd_op = torch.library.custom_op("kernelset::softmax_backward", mutates_args=())(_bwd)


@_bwd_op.register_fake
def _(dy, y, temperature, log, x_dtype, op, backend):
    return y.new_empty(y.shape, dtype=x_dtype)


def _setup(ctx, inputs, output):
    x, temperature, log, out_dtype, op, backend = inputs
    ctx.save_for_backward(output)
    ctx.opts = (temperature, log, x.dtype, op, backend)


def _backward(ctx, dy):
    (y,) = ctx.saved_tensors
    temperature, log, x_dtype, op, backend = ctx.opts
    bwd = _bwd if getattr(ctx, "eager", False) else torch.ops.kernelset.softmax_backward
    return bwd(dy, y, temperature, log, x_dtype, op, backend), None, None, None, None, None


_op.register_autograd(_backward, setup_context=_setup)
_SPEC = AutogradSpec(_fwd, _setup, _backward)
