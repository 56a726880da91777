"""Public cross_entropy, its custom op and autograd.

The forward writes the gradient (scaled for the reduction) while it reads the logits, so the
backward only multiplies by the incoming gradient: in place and skipped on the device where that
is 1.0 (eager), or as a plain multiply that torch.compile fuses (compiled).
"""
from __future__ import annotations

import numbers

import torch

from ...core import checks, dispatch
from ...core.autograd import AutogradSpec, apply, needs_grad
from ...core.enums import AUTO, Backend, KsEnum
from ...core.errors import ArgumentError
from . import backends  # noqa: F401  (declares the op and registers its implementations)
from . import reference as ref


class Reduction(KsEnum):
    MEAN = "mean"  # over rows whose target is not ignore_index; 0 when all are ignored
    SUM = "sum"
    NONE = "none"


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, *, ignore_index: int = -100,
                  label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: float | None = None,
                  reduction: Reduction | str = Reduction.MEAN, check_target: bool = True,
                  backend: Backend | str = AUTO) -> torch.Tensor:
    """Cross-entropy of logits ``[..., V]`` against integer targets ``[...]``, one fused pass.

    z = softcap * tanh(logits / softcap) when softcap is set; per row
    ``(1 - eps)(lse - z_t) + eps (lse - mean z) + z_loss lse^2``, 0 for ignored rows.
    fp32 math and fp32 loss. ``check_target`` verifies that every target is ignore_index or in
    [0, V) with one host sync and raises on a bad one; it is skipped under CUDA-graph capture and
    torch.compile (and when False), where a bad target is never read past its row: that row's loss
    is NaN (so a mean or sum is NaN) and its gradient row is NaN whatever the incoming gradient,
    so training cannot go on silently.
    """
    op = "cross_entropy"
    checks.tensor(op, "logits", logits)
    checks.tensor(op, "target", target, dtypes=(torch.int64, torch.int32), min_ndim=0)
    checks.shape(op, "target", target, tuple(logits.shape[:-1]), "logits' leading shape")
    checks.same_device(op, "target", target, "logits", logits)
    ignore_index, label_smoothing, z_loss, cap, red = check_options(op, ignore_index, label_smoothing, z_loss, softcap,
                                                                    reduction)
    v = logits.shape[-1]
    if v == 0:
        raise ArgumentError(op, "logits", "of vocabulary size (last dim) >= 1", f"shape {tuple(logits.shape)}")
    if check_target:
        check_targets(op, target, v, ignore_index, "logits' last dim")
    x2, t2 = logits.reshape(-1, v), target.reshape(-1).contiguous()  # the kernel reads target[row]
    args = (x2, t2, ignore_index, label_smoothing, z_loss, cap, red)
    if torch.compiler.is_compiling():
        loss = torch.ops.kernelset.cross_entropy(*args, logits.requires_grad, str(backend))[0]
    elif needs_grad(logits):
        loss = apply(_SPEC, *args, True, str(backend))[0]
    else:
        loss = dispatch.select(op, backend, (x2, t2), {}).forward(*args, False)[0]
    return loss.reshape(target.shape) if red == "none" else loss


def check_targets(op: str, target: torch.Tensor, v: int, ignore_index: int, vocab: str) -> None:
    """Raise unless every target is ignore_index or in [0, v) (``vocab`` names where v comes from):
    one host sync; nothing under torch.compile or CUDA-graph capture, where the kernels' defined
    answer (NaN loss and gradient rows) stands."""
    if not target.numel() or torch.compiler.is_compiling():
        return
    if target.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    t = target.reshape(-1).long()  # int64: an int32 compared with a Python int beyond its range wraps
    bad = (t != ignore_index) & ((t < 0) | (t >= v))
    if bad.any():  # the one host sync
        k = int(bad.nonzero()[0, 0])
        raise ArgumentError(op, "target", f"in [0, {v}) ({vocab}) or ignore_index ({ignore_index})",
                            f"target {int(t[k])} at flat index {k}")


def check_options(op: str, ignore_index, label_smoothing, z_loss, softcap,
                  reduction) -> tuple[int, float, float, float, str]:
    """The loss options of cross_entropy and linear_cross_entropy, checked: (ignore_index as an int,
    label_smoothing, z_loss, softcap or 0.0, reduction's value)."""
    # any integer type (numpy's, from a tokenizer's config) but bool and tensors (a host sync each call)
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise ArgumentError(op, "ignore_index", "an int", repr(ignore_index))
    ignore_index = int(ignore_index)
    if not -2**63 <= ignore_index < 2**63:  # compared with int64 targets on the device
        raise ArgumentError(op, "ignore_index", "an int64 value", ignore_index)
    label_smoothing = checks.finite(op, "label_smoothing", label_smoothing)
    if not 0.0 <= label_smoothing < 1.0:
        raise ArgumentError(op, "label_smoothing", "in [0, 1)", label_smoothing)
    z_loss = checks.finite(op, "z_loss", z_loss)
    if z_loss < 0:
        raise ArgumentError(op, "z_loss", ">= 0", z_loss)
    cap = 0.0 if softcap is None else checks.positive(op, "softcap", softcap)
    return ignore_index, label_smoothing, z_loss, cap, Reduction.parse(reduction, what="reduction", op=op).value


def _fwd(logits: torch.Tensor, target: torch.Tensor, ignore_index: int, label_smoothing: float, z_loss: float,
         softcap: float, reduction: str, need_grad: bool, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    impl = dispatch.select("cross_entropy", backend, (logits, target), {})
    loss, dlogits = impl.forward(logits, target, ignore_index, label_smoothing, z_loss, softcap or None, reduction,
                                 need_grad)
    return loss, (dlogits if dlogits is not None else logits.new_empty(0))


_op = torch.library.custom_op("kernelset::cross_entropy", mutates_args=())(_fwd)


@_op.register_fake
def _(logits, target, ignore_index, label_smoothing, z_loss, softcap, reduction, need_grad, backend):
    loss = logits.new_empty(logits.shape[:1] if reduction == "none" else (), dtype=torch.float32)
    return loss, (logits.new_empty(logits.shape) if need_grad else logits.new_empty(0))


_DOUBLE = ("kernelset.{op}: double backward (a gradient of its gradient, after create_graph=True) is not "
           "supported: the gradient is computed by the forward's kernel, not by differentiable torch ops")


def _setup(ctx, inputs, output):
    ctx.save_for_backward(output[1])
    ctx.reduction = inputs[6]
    ctx.used = False
    # the backward's implementation chosen now: holding the logits (or target) on ctx until the
    # backward would keep the [M, V] logits alive next to their gradient, twice the memory
    if getattr(ctx, "eager", False):
        ctx.impl = dispatch.select("cross_entropy", inputs[8], (inputs[0], inputs[1]), {}, backward=True)


def _backward(ctx, grad_loss, grad_dlogits):
    (dlogits,) = ctx.saved_tensors
    reduction = ctx.reduction
    if getattr(ctx, "eager", False):
        if grad_dlogits is not None:  # only a gradient of the first gradient reaches the stored dlogits
            raise RuntimeError(_DOUBLE.format(op="cross_entropy"))
        if ctx.used:  # the in-place scaling would apply twice
            raise RuntimeError("kernelset.cross_entropy: backward ran twice (retain_graph=True) and is not "
                               "supported; compute the loss again")
        ctx.used = True
        dx = ctx.impl.backward(grad_loss, dlogits, reduction)
    else:
        dx = ref.bwd(grad_loss, dlogits, reduction)  # plain torch ops: torch.compile fuses the multiply
    return dx, None, None, None, None, None, None, None, None


_op.register_autograd(_backward, setup_context=_setup)
_SPEC = AutogradSpec(_fwd, _setup, _backward, needed=(0,), name="cross_entropy", double_backward=True)  # checked in _backward
