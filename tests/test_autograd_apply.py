"""core.autograd.apply: the C entry of autograd.Function, Function.apply's Python layer skipped only
where that layer does nothing (no functorch transform active, no functorch-wrapped argument)."""
from __future__ import annotations

import pytest
import torch

import kernelset as ks
from kernelset.core import autograd
from kernelset.ops.norm import api as norm_api


def _rms_args(x, w):
    return (x, w, 1e-6, 0.0, False, "reference", False)


def test_apply_matches_function_apply():
    g = torch.Generator().manual_seed(0)
    x0, w0 = torch.randn(4, 32, generator=g), torch.randn(32, generator=g)
    dy = torch.randn(4, 32, generator=g)
    res = []
    for entry in (autograd.apply, autograd.EagerAutograd.apply):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        y = entry(norm_api._RMS, *_rms_args(x, w))[0]
        assert y.grad_fn is not None and "EagerAutograd" in type(y.grad_fn).__name__
        y.backward(dy)
        res.append((y.detach(), x.grad, w.grad))
    for a, b in zip(*res):
        assert torch.equal(a, b)


def test_apply_defers_to_function_apply_under_functorch(monkeypatch):
    calls = []
    real = autograd.EagerAutograd.apply

    def spy(*args):
        calls.append(len(args))
        return real(*args)
    monkeypatch.setattr(autograd.EagerAutograd, "apply", spy)
    x = torch.randn(3, 16)
    w = torch.randn(16)
    ks.rms_norm(x.requires_grad_(), w, backend="reference").sum().backward()  # the C entry: no spy call
    assert calls == []
    try:  # Function.apply's own answer under a transform (EagerAutograd defines no setup_context)
        torch.func.grad(lambda t: ks.rms_norm(t, w, backend="reference").sum())(x.detach())
    except RuntimeError as e:
        assert "setup_context" in str(e)
    assert calls, "under torch.func.grad the call must go through Function.apply"


# (op, a call on x [4, 32] that requires grad): every differentiable op that runs through the eager node
_DOUBLE_CASES = {
    "rms_norm": lambda x, b: ks.rms_norm(x, torch.ones(32, device=x.device), backend=b),
    "silu_and_mul": lambda x, b: ks.silu_and_mul(x, backend=b),
    "gelu": lambda x, b: ks.gelu(x, backend=b),
    "log_softmax": lambda x, b: ks.log_softmax(x, backend=b),
    "apply_rotary": lambda x, b: ks.apply_rotary(x.view(1, 4, 1, 32), x.view(1, 4, 1, 32) * 2,
                                                 torch.ones(1, 1, 32, device=x.device),
                                                 torch.zeros(1, 1, 32, device=x.device), backend=b).q,
    "flash_attention": lambda x, b: ks.flash_attention(x.view(1, 4, 1, 32), x.view(1, 4, 1, 32),
                                                       x.view(1, 4, 1, 32), backend=b),
}


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("op", _DOUBLE_CASES, ids=list(_DOUBLE_CASES))
def test_second_order_gradient_is_refused_by_name(op, backend, device):
    """create_graph=True, then a gradient of the gradient (a gradient penalty): the eager node's
    backward is a kernel (its output carries no graph: the op's second-order term silently vanished
    from a sum with other terms) or explicit formulas (wrong where a saved statistic depends on the
    input). It raises by name for every op; first-order gradients and retain_graph are unaffected."""
    x = torch.randn(4, 32, device=device, requires_grad=True)  # (a CUDA tensor on the GPU machine)
    y = _DOUBLE_CASES[op](x, backend)
    with pytest.raises(RuntimeError, match=f"kernelset.{op}: backward with create_graph=True"):
        torch.autograd.grad((y.float().pow(2).sum() + x.pow(3).sum()), x, create_graph=True)
    y = _DOUBLE_CASES[op](x, backend)
    (g,) = torch.autograd.grad(y.float().pow(2).sum(), x)
    assert torch.isfinite(g).all()


@pytest.mark.parametrize("op", ["gated_mlp", "rms_norm", "silu_and_mul"])
def test_outputs_take_in_place_ops(op, device):
    """An op's output is a plain tensor to autograd: an in-place add on it works and its gradient
    flows (Llama 4's MoE adds the routed experts into its shared expert's output with add_; the
    gated MLP's output was a view of a multi-output node, which refuses in-place ops)."""
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(2, 3, 16, generator=g).to(device)
    if op == "gated_mlp":
        ws = [(torch.randn(*s, generator=g) * 0.2).to(device).requires_grad_() for s in ((24, 16), (24, 16), (16, 24))]
        fn = lambda x: ks.gated_mlp(x, *ws)  # noqa: E731
        ref_fn = lambda x: (torch.nn.functional.silu(x @ ws[0].t()) * (x @ ws[1].t())) @ ws[2].t()  # noqa: E731
    elif op == "rms_norm":
        ws = [torch.randn(16, generator=g).to(device).requires_grad_()]
        fn = lambda x: ks.rms_norm(x, ws[0])  # noqa: E731
        ref_fn = lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * ws[0]  # noqa: E731
    else:
        ws = []
        fn = ks.silu_and_mul
        ref_fn = lambda x: torch.nn.functional.silu(x[..., :8]) * x[..., 8:]  # noqa: E731
    extra = torch.randn(2, 3, 16 if op != "silu_and_mul" else 8, generator=g).to(device)
    grads = []
    for f in (fn, ref_fn):
        x = x0.clone().requires_grad_()
        for w in ws:
            w.grad = None
        y = f(x)
        y.add_(extra)
        (y * y).sum().backward()
        grads.append([x.grad] + [w.grad for w in ws])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
