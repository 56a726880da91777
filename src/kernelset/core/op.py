"""One definition of an op's call paths: the custom op and its fake, the eager / compile / autograd routing.

Every public op runs in three ways: under torch.compile through a ``torch.ops.kernelset.*`` custom op
(with a fake implementation, so compiled graphs have no breaks), in eager mode with autograd through
one ``torch.autograd.Function`` (``core/autograd.py``: the custom-op dispatch costs tens of
microseconds per call), and in eager mode without a gradient straight through the dispatcher's
cached choice. :class:`RoutedOp` builds all three from one implementation function::

    def _argmax_impl(x: torch.Tensor, backend: str) -> torch.Tensor:   # annotated: torch infers the schema
        return dispatch.select("argmax", backend, (x,), {}).forward(x=x)

    _ARGMAX = RoutedOp("argmax", _argmax_impl, fake=lambda x, backend: x.new_empty(x.shape[:-1], dtype=torch.int64))

    def argmax(x, *, backend=AUTO):        # the public function: check the arguments, then route
        checks.tensor("argmax", "x", x)
        return _ARGMAX(x, str(backend))

A differentiable op adds ``setup`` and ``backward`` (``register_autograd``'s pair; the backward sees
``ctx.eager`` and calls :meth:`RoutedOp.backward_entry` to reach its backward op's eager function or
its custom op). A forward-only op with inputs that require grad records a node whose backward raises
(``forward_only``), so a loss through it fails by name instead of silently missing gradients.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .autograd import AutogradSpec, apply, forward_only, needs_grad


def trace_constant(fn: Callable) -> Callable:
    """Marks ``fn`` as ``torch.compiler.assume_constant_result`` does (the attribute dynamo reads): under
    torch.compile dynamo calls it with its arguments' values at trace time and keeps the result as a
    constant of the graph instead of tracing it (probes, caches, lru_cache'd policies: host work whose
    answer depends only on constants). Set directly: the decorator imports ``torch._dynamo`` (2.9 s of a
    6.4 s ``import kernelset``); tests/test_compile.py checks the attribute is still torch's."""
    fn._dynamo_marked_constant = True
    return fn


class RoutedOp:
    """``name``'s custom op (``kernelset::name``), its fake, and the routing of a call to it."""

    def __init__(self, name: str, impl: Callable[..., Any], *, fake: Callable[..., Any],
                 setup: Callable[[Any, tuple, Any], None] | None = None, backward: Callable[..., tuple] | None = None,
                 needed: tuple[int, ...] | None = None, mutates_args: tuple[str, ...] = (),
                 no_grad_reason: str = "") -> None:
        if (setup is None) != (backward is None):
            raise ValueError(f"RoutedOp {name!r}: setup and backward come together")
        self.name = name
        self.impl = impl
        self.op = torch.library.custom_op(f"kernelset::{name}", mutates_args=mutates_args)(impl)
        self.op.register_fake(fake)
        self.spec: AutogradSpec | None = None
        if backward is not None:
            self.op.register_autograd(backward, setup_context=setup)
            self.spec = AutogradSpec(impl, setup, backward, needed=needed, name=name)
        # why a forward-only op has no gradient, said when a backward reaches it
        self.no_grad_reason = no_grad_reason or "it has no gradient"

    def __call__(self, *args: Any) -> Any:
        if torch.compiler.is_compiling():
            return self.op(*args)
        if needs_grad(*(a for a in args if isinstance(a, torch.Tensor))):
            if self.spec is not None:
                return apply(self.spec, *args)
            return forward_only(self.name, self.no_grad_reason, self.impl, *args)
        return self.impl(*args)

    @staticmethod
    def backward_entry(ctx: Any, eager: Callable[..., Any], op: Any) -> Callable[..., Any]:
        """The backward op to call from ``backward``: its plain function in eager autograd, its custom
        op under torch.compile (``op``: the object ``torch.library.custom_op`` returned)."""
        return eager if getattr(ctx, "eager", False) else op
