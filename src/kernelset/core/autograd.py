"""Eager-mode autograd for kernelset's custom ops, without the custom-op dispatch.

Every differentiable op is a ``torch.library`` custom op with ``register_autograd`` (what
torch.compile traces). In eager mode, going through the op costs tens of microseconds of host
time per call and again per backward, which dominates a fwd+bwd step at training sizes on a fast
GPU. :class:`EagerAutograd` runs the very same forward implementation, ``setup_context`` and
backward formula as the op, inside one ``torch.autograd.Function``: one definition of the
math, two entry points.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
from torch.autograd.graph import increment_version


def mark_written(*ts: torch.Tensor | None) -> None:
    """Bump the autograd version counter of each tensor an eager call wrote in place, as every
    torch in-place op does. A kernel writing through data pointers does not, and a graph that
    saved one of them (``out = x @ w`` with w requiring grad, then x written under no_grad or as
    an input that needs no grad) would back-propagate through the new values without a word
    instead of raising torch's "modified by an inplace operation". Custom ops declared with
    ``mutates_args`` (the torch.compile path) bump their own. Inference tensors have no counter
    (older torch raises when asked to bump one outside inference mode), so they are skipped."""
    for t in ts:  # one at a time: older torch's increment_version takes a single tensor
        if t is not None and not t.is_inference():
            increment_version(t)


def needs_grad(*ts: torch.Tensor | None) -> bool:
    """Whether an eager call must record autograd (any input requires grad, grad mode on)."""
    if not torch.is_grad_enabled():
        return False
    for t in ts:  # a loop, not any(generator): this runs on every eager call
        if t is not None and t.requires_grad:
            return True
    return False


@dataclasses.dataclass(frozen=True)
class AutogradSpec:
    forward: Callable[..., Any]  # the custom op's implementation (not the op)
    setup: Callable[[Any, tuple, Any], None]  # register_autograd's setup_context
    backward: Callable[..., tuple]  # register_autograd's backward; sees ctx.eager = True here
    # outputs whose incoming gradient the backward reads (None: all). The others (saved statistics
    # such as rstd) get no zero tensor built and launched for them: the backward sees None.
    needed: tuple[int, ...] | None = None
    name: str = ""  # the public op, for errors
    # False: a backward with create_graph=True is refused by name (see EagerAutograd.backward);
    # True: the op's backward handles that case itself
    double_backward: bool = False


_DOUBLE = ("kernelset.{op}: backward with create_graph=True (a gradient of its gradient: a gradient penalty, a "
           "Hessian-vector product) is not supported: the backward is a kernel, or explicit formulas over saved "
           "tensors, that autograd cannot differentiate; use the torch.nn.functional equivalent for second-order "
           "gradients")


class EagerAutograd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, spec: AutogradSpec, *inputs: Any):
        out = spec.forward(*inputs)
        if isinstance(out, tuple):
            # an output that is a view of the op's own result (y.view(x.shape)) would come out as a view
            # of a multi-output node, which refuses in-place ops (Llama 4's MoE adds into its shared
            # expert's output); detached it is a plain tensor over the same memory and version counter
            out = tuple(_unview(o, inputs) for o in out)
        ctx.eager = True
        ctx.spec = spec
        spec.setup(ctx, inputs, out)
        if spec.needed is not None:
            ctx.set_materialize_grads(False)
            ctx.meta = tuple((out[i].shape, out[i].dtype, out[i].device) for i in spec.needed)
        return out

    @staticmethod
    def backward(ctx, *grads: Any):
        if torch.is_grad_enabled() and not ctx.spec.double_backward:
            # create_graph=True turns grad mode on inside the backward. Where a gradient or a saved
            # tensor requires grad, the caller wants the gradient's own graph, which a kernel's
            # output lacks (a second-order term then went missing from a sum without a word) and
            # explicit formulas get wrong (a saved statistic's own dependence ignored). A mark in
            # the style of once_differentiable is not enough: autograd.grad(..., inputs) prunes it.
            for t in (*grads, *ctx.saved_tensors):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    raise RuntimeError(_DOUBLE.format(op=_name(ctx)))
        if ctx.spec.needed is not None:  # zeros only where a read gradient did not flow
            grads = list(grads)
            for i, (shape, dtype, device) in zip(ctx.spec.needed, ctx.meta):
                if grads[i] is None:
                    grads[i] = torch.zeros(shape, dtype=dtype, device=device)
        return (None,) + tuple(ctx.spec.backward(ctx, *grads))


def _unview(t: Any, inputs: tuple) -> Any:
    if not isinstance(t, torch.Tensor) or not t._is_view():
        return t
    ptr = t.untyped_storage().data_ptr()
    for i in inputs:  # a view of an input stays one (aliasing an input must stay visible to autograd)
        if isinstance(i, torch.Tensor) and i.untyped_storage().data_ptr() == ptr:
            return t
    return t.detach()


def _name(ctx) -> str:
    """The public op of an eager node: its spec's name, else the op name a shared spec (the
    activations, softmax / log_softmax) keeps among its options."""
    if ctx.spec.name:
        return ctx.spec.name
    from .registry import _OPS
    return next((o for o in getattr(ctx, "opts", ()) if isinstance(o, str) and o in _OPS), "op")


# torch.autograd.Function.apply's Python layer (the setup_context test, a closure, unwrapping dead
# functorch wrappers through a generator, super()) costs ~20 us of host time per call on the lent
# hosts, a quarter of a whole minimal Function's forward + backward; a training step makes ~70 of
# these calls. ``apply`` goes to the C implementation that layer ends in, under the same
# conditions it does: no functorch transform active and no functorch-wrapped tensor among the
# arguments (a dead wrapper leaked out of a transform); otherwise through Function.apply.
_c_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, EagerAutograd)
_transforms_active = torch._C._are_functorch_transforms_active
_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def apply(spec: AutogradSpec, *inputs: Any) -> Any:
    """``EagerAutograd.apply(spec, *inputs)``, without Function.apply's Python layer where it is a no-op."""
    if _transforms_active():
        return EagerAutograd.apply(spec, *inputs)
    for t in inputs:
        if isinstance(t, torch.Tensor) and _wrapped(t):
            return EagerAutograd.apply(spec, *inputs)
    return _c_apply(spec, *inputs)


class _NoBackward(torch.autograd.Function):
    """Runs a forward-only op's implementation and records a node whose backward raises: a call
    that records autograd (an evaluation loop without ``no_grad`` on parameters that require grad)
    still works, and a loss that back-propagates through the output fails by name instead of
    leaving the inputs' gradients silently incomplete."""

    @staticmethod
    def forward(ctx, op: str, why: str, fn: Callable[..., Any], *args: Any) -> Any:
        ctx.op, ctx.why = op, why
        return fn(*args)

    @staticmethod
    def backward(ctx, *grads: Any):
        raise RuntimeError(f"{ctx.op} has no backward ({ctx.why}); its output carries no gradient to its inputs")


def forward_only(op: str, why: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` for a forward-only op, behind a node whose backward raises when a tensor
    argument requires grad (grad mode on); a plain call otherwise."""
    if torch.is_grad_enabled():  # (serving calls run under no_grad / inference_mode: one test)
        for a in args:
            if isinstance(a, torch.Tensor) and a.requires_grad:
                return _NoBackward.apply(op, why, fn, *args)
    return fn(*args)
