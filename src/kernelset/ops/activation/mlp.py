"""gated_mlp: a LLaMA-style gated MLP, ``down(act(gate(x)) * up(x))``, as one autograd node.

Why an op of three GEMMs and an activation: in eager training every ``nn.Linear`` and the
activation each record their own autograd nodes (a linear records three or four: the product,
the weight's transpose, the input's view, the output's view), and at a 1B model's training shapes
the host's time to record and run those nodes exceeds the GPU's time for the whole step (issue 5;
H200 2026-11-27: 85-96 us of host time per autograd Function, 150-200 per F.linear). One node does the same work with six fewer nodes per layer:

- forward: ``g = x Wg^T``, ``u = x Wu^T`` (cuBLAS, rounded to the model dtype as nn.Linear
  rounds), ``h = act(g) * u`` (the activation kernel of this family, the activation rounded
  before the multiply, as transformers rounds), ``y = h Wd^T``; saves x, g, u and h (one tensor
  fewer than the separate modules keep alive: silu(g) is not stored);
- backward: ``dh = dy Wd``, ``dWd = dy^T h``, ``(dg, du)`` by the activation's backward kernel,
  ``dx = dg Wg + du Wu`` (the second product accumulated into the first's output by cuBLAS,
  rounded once), ``dWg = dg^T x``, ``dWu = du^T x``; only the gradients autograd asks for.

The products are cuBLAS's (torch.mm) in every backend but the fp32 reference; the "triton" backend
is named for the activation kernel. No biases (LLaMA, Mistral, Qwen, Gemma MLPs have none).
"""
from __future__ import annotations

import torch

from typing import Optional

from ...core import checks, dispatch
from ...core.alloc import empty
from ...core.arch import ArchRange, device_arch
from ...core.autograd import AutogradSpec, apply, needs_grad
from ...core.enums import AUTO, Backend
from ...core.errors import ArgumentError
from ...core.registry import BenchCase, Cost, Impl, OpSpec, Problem, declare_op, register_impl
from ...core.support import triton_device
from . import reference as ref

OP = "gated_mlp"
ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


# ---- the registry ------------------------------------------------------------------------------


def _key(x, w_gate, w_up, w_down):
    return (x.device, x.dtype, x.shape[-1], w_gate.shape[0], w_down.shape[0])


def _problem(x, w_gate, w_up, w_down):
    h, i = x.shape[-1], w_gate.shape[0]
    m = x.numel() // h if h else 0
    return Problem(OP, x.device, x.dtype, (m, h, i), device_arch(x.device),
                   {"hidden": h, "intermediate": i, "out": w_down.shape[0]})


def _cost(shape, dtype, mode):
    m, h = shape[0], shape[1]
    i = shape[2] if len(shape) > 2 else h
    s = torch.empty((), dtype=dtype).element_size()
    weights = 3 * h * i * s
    if mode == "fwd":
        return Cost(weights + 2 * m * h * s, 6 * m * h * i, "3 products of 2 M H I flops (gate, up, down)")
    return Cost(2 * weights + 4 * m * h * s, 18 * m * h * i,
                "forward's 3 products, backward's 6 (dh, dWd, dx twice, dWg, dWu): 18 M H I flops")


def _reference_out(x, w_gate, w_up, w_down, activation="silu"):
    return ref_fwd(x.reshape(-1, x.shape[-1]), w_gate, w_up, w_down, activation)[0].reshape(
        *x.shape[:-1], w_down.shape[0])


declare_op(OpSpec(
    name=OP, family="activation",
    signature="gated_mlp(x, w_gate, w_up, w_down, *, activation='silu', norm_weight=None, norm_eps=1e-6, backend='auto')",
    doc="y = (act(x w_gate^T) * (x w_up^T)) w_down^T, one autograd node (cuBLAS products + the activation kernel)",
    reference=_reference_out, tolerance="gemm", key=_key, problem=_problem, cost=_cost,
    # Llama-3-8B's MLP at 4K tokens; no bar: the op exists for the host time of a training step
    # (issue 5's bar), its GPU time is three to nine cuBLAS products either way
    bench=(BenchCase((4096, 4096, 14336), "fwd"), BenchCase((4096, 4096, 14336), "fwd+bwd")),
))


# ---- implementations ---------------------------------------------------------------------------
# forward(x2, w_gate, w_up, w_down, activation) -> (y2, g, u, h), x2 [M, H] and y2 [M, H_out];
# g, u, h [M, I] are what the backward reads; backward(dy2, x2, w_gate, w_up, w_down, g, u, h,
# activation, needs) -> (dx2, dw_gate, dw_up, dw_down), None where needs (4 bools) says not needed.


def ref_fwd(x2, w_gate, w_up, w_down, activation):
    """fp32 math; the stored g, u, h rounded to the model dtype (the backward recomputes in fp32)."""
    dt = x2.dtype
    xf = x2.float()
    g = xf @ w_gate.float().t()
    u = xf @ w_up.float().t()
    h = ref.act(g, activation) * u
    y = h @ w_down.float().t()
    return y.to(dt), g.to(dt), u.to(dt), h.to(dt)


def ref_bwd(dy2, x2, w_gate, w_up, w_down, g, u, h, activation, needs):
    """Gradients of the fp32 math by the explicit formulas (no autograd: this also runs inside the
    custom op, where autograd does not record); g, u, h recomputed in fp32."""
    xf, wg, wu, wd, dyf = (t.float() for t in (x2, w_gate, w_up, w_down, dy2))
    gf = xf @ wg.t()
    uf = xf @ wu.t()
    a, da = ref._dact(gf, activation)
    dh = dyf @ wd
    dg, du = dh * uf * da, dh * a
    grads = (dg @ wg + du @ wu, dg.t() @ xf, du.t() @ xf, dyf.t() @ (a * uf))
    return tuple(gr.to(t.dtype) if n else None for gr, t, n in zip(grads, (x2, w_gate, w_up, w_down), needs))


def t_fwd(x2, w_gate, w_up, w_down, activation):
    from .launch import act_fwd
    m, i = x2.shape[0], w_gate.shape[0]
    dt, dev = x2.dtype, x2.device
    g, u = empty((m, i), dt, dev), empty((m, i), dt, dev)
    torch.mm(x2, w_gate.t(), out=g)
    torch.mm(x2, w_up.t(), out=u)
    h = act_fwd(g, u, activation, "pair")
    y = empty((m, w_down.shape[0]), dt, dev)
    torch.mm(h, w_down.t(), out=y)
    return y, g, u, h


def t_bwd(dy2, x2, w_gate, w_up, w_down, g, u, h, activation, needs):
    from .launch import act_bwd
    need_x, need_g, need_u, need_d = needs
    dw_down = torch.mm(dy2.t(), h) if need_d else None
    dx = dw_gate = dw_up = None
    if need_x or need_g or need_u:
        dh = torch.mm(dy2, w_down)
        dg, du = act_bwd(dh, g, u, activation, "pair")
        if need_x:
            dx = torch.mm(dg, w_gate)
            dx.addmm_(du, w_up)
        if need_g:
            dw_gate = torch.mm(dg.t(), x2)
        if need_u:
            dw_up = torch.mm(du.t(), x2)
    return dx, dw_gate, dw_up, dw_down


def _triton_supports(p: Problem) -> str | None:
    return triton_device(p, "x")


register_impl(Impl(op=OP, backend=Backend.TRITON, forward=t_fwd, backward=t_bwd, supports=_triton_supports,
                   priority=100, arch=ArchRange(min=(7, 0)), requires=("triton",),
                   note="cuBLAS products (torch.mm) + kernelset's activation kernel forward and backward, "
                        "one autograd node"))
register_impl(Impl(op=OP, backend=Backend.REFERENCE, forward=ref_fwd, backward=ref_bwd, supports=lambda p: None,
                   priority=0, note="fp32 math in plain torch ops; any device"))


# ---- public function, custom ops, autograd -----------------------------------------------------


def gated_mlp(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, *,
              activation: str = "silu", norm_weight: torch.Tensor | None = None, norm_eps: float = 1e-6,
              backend: Backend | str = AUTO) -> torch.Tensor:
    """y = (act(x w_gate^T) * (x w_up^T)) w_down^T: a gated MLP without biases, as one autograd node.

    x ``[..., H]``, w_gate and w_up ``[I, H]``, w_down ``[H_out, I]`` (nn.Linear's weight layout),
    one float dtype and device. ``activation``: "silu" (SwiGLU: LLaMA, Mistral, Qwen), "gelu"
    (erf) or "gelu_tanh" (Gemma's GeGLU). Rounds where transformers' modules round (each product
    to the dtype, the activation before the multiply), so the forward gives their output; the
    backward keeps g, u and h. Returns ``[..., H_out]`` in x's dtype. Gradients for x and all
    three weights.
    ``norm_weight`` ``[H]``: x goes through transformers' LlamaRMSNorm first (``norm_eps``; fp32
    statistics in torch's summation order, rounded before the weight), inside the same node (a
    pre-norm MLP block, as a decoder layer's post-attention norm feeds its MLP); its weight gets a
    gradient too.
    """
    op = OP
    checks.tensor(op, "x", x)
    for name, w in (("w_gate", w_gate), ("w_up", w_up), ("w_down", w_down)):
        checks.tensor(op, name, w, min_ndim=2)
        if w.dim() != 2:
            raise ArgumentError(op, name, "2-D (nn.Linear's [out, in] weight)", f"shape {tuple(w.shape)}")
        checks.same_dtype(op, name, w, "x", x)
        checks.same_device(op, name, w, "x", x)
    h = x.shape[-1]
    i = w_gate.shape[0]
    if w_gate.shape[1] != h or h == 0 or i == 0:
        raise ArgumentError(op, "w_gate", f"of shape [I, {h}] with I >= 1 (H = x's last dim, >= 1)",
                            f"shape {tuple(w_gate.shape)}")
    checks.shape(op, "w_up", w_up, (i, h), "w_gate's shape")
    if w_down.shape[1] != i or w_down.shape[0] == 0:
        raise ArgumentError(op, "w_down", f"of shape [H_out, {i}] with H_out >= 1 (I = w_gate's rows)",
                            f"shape {tuple(w_down.shape)}")
    if activation not in ACTIVATIONS:
        raise ArgumentError(op, "activation", " or ".join(repr(a) for a in ACTIVATIONS), repr(activation))
    if norm_weight is not None:
        from ..norm.api import check_prenorm
        norm_eps = check_prenorm(op, norm_weight, norm_eps, x)
    args = (x, w_gate, w_up, w_down, norm_weight, float(norm_eps), activation, str(backend))
    if torch.compiler.is_compiling():
        return torch.ops.kernelset.gated_mlp(*args)[0]
    if needs_grad(x, w_gate, w_up, w_down, norm_weight):  # (x's rows are flattened inside: no view node of ours)
        return apply(_SPEC, *args)[0]
    return _fwd(*args)[0]


def _fwd(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
         norm_weight: Optional[torch.Tensor], norm_eps: float, activation: str,
         backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, then what the backward reads: g, u, h, and with a pre-norm its output n and rstd)."""
    x2 = x.reshape(-1, x.shape[-1])
    if norm_weight is not None:
        from ..norm.api import prenorm_forward
        n2, rstd = prenorm_forward(x2, norm_weight, norm_eps, backend)
    else:
        n2, rstd = x2, None
    impl = dispatch.select(OP, backend, (n2, w_gate, w_up, w_down), {})
    y, g, u, h = impl.forward(n2, w_gate, w_up, w_down, activation)
    if rstd is None:  # (a custom op's outputs must not alias its inputs or each other)
        n2, rstd = x.new_empty(0), x.new_empty(0)
    return y.view(*x.shape[:-1], w_down.shape[0]), g, u, h, n2, rstd


_op = torch.library.custom_op("kernelset::gated_mlp", mutates_args=())(_fwd)


@_op.register_fake
def _(x, w_gate, w_up, w_down, norm_weight, norm_eps, activation, backend):
    m, i = x.numel() // x.shape[-1], w_gate.shape[0]
    normed = norm_weight is not None
    return (x.new_empty((*x.shape[:-1], w_down.shape[0])), x.new_empty((m, i)), x.new_empty((m, i)),
            x.new_empty((m, i)), x.new_empty((m, x.shape[-1]) if normed else (0,)),
            x.new_empty((m,) if normed else (0,), dtype=torch.float32 if normed else x.dtype))


def _bwd(dy: torch.Tensor, x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
         norm_weight: Optional[torch.Tensor], g: torch.Tensor, u: torch.Tensor, h: torch.Tensor, n2: torch.Tensor,
         rstd: torch.Tensor, norm_eps: float, activation: str, backend: str, need_x: bool, need_gate: bool,
         need_up: bool, need_down: bool, need_norm: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                    torch.Tensor, torch.Tensor]:
    x2 = x.reshape(-1, x.shape[-1])
    normed = norm_weight is not None
    inp = n2 if normed else x2
    impl = dispatch.select(OP, backend, (inp, w_gate, w_up, w_down), {}, backward=True)
    dy2 = checks.row_strided(dy.reshape(-1, dy.shape[-1]))
    dn, dwg, dwu, dwd = impl.backward(dy2, inp, w_gate, w_up, w_down, g, u, h, activation,
                                      (need_x or need_norm, need_gate, need_up, need_down))
    dx = dwn = None
    if normed and (need_x or need_norm):
        from ..norm.api import prenorm_backward
        dx, dwn = prenorm_backward(dn, x2, norm_weight, rstd, norm_eps, backend)
    elif need_x:
        dx = dn
    if dx is not None:
        dx = dx.view(x.shape)
    # (a gradient not asked for comes back empty: a custom op returns tensors only)
    return tuple(gr if gr is not None else x.new_empty(0) for gr in (dx, dwg, dwu, dwd, dwn))


_bwd_op = torch.library.custom_op("kernelset::gated_mlp_backward", mutates_args=())(_bwd)


@_bwd_op.register_fake
def _(dy, x, w_gate, w_up, w_down, norm_weight, g, u, h, n2, rstd, norm_eps, activation, backend, need_x, need_gate,
      need_up, need_down, need_norm):
    return tuple(t.new_empty(t.shape) if (n and t is not None) else x.new_empty(0)
                 for t, n in ((x, need_x), (w_gate, need_gate), (w_up, need_up), (w_down, need_down),
                              (norm_weight, need_norm)))


def _setup(ctx, inputs, output):
    x, w_gate, w_up, w_down, norm_weight, norm_eps, activation, backend = inputs
    _, g, u, h, n2, rstd = output
    ctx.save_for_backward(x, w_gate, w_up, w_down, norm_weight, g, u, h, n2, rstd)
    ctx.opts = (norm_eps, activation, backend)


def _backward(ctx, dy, *_):
    x, w_gate, w_up, w_down, norm_weight, g, u, h, n2, rstd = ctx.saved_tensors
    norm_eps, activation, backend = ctx.opts
    eager = getattr(ctx, "eager", False)
    nig = ctx.needs_input_grad  # (EagerAutograd's first input is the spec)
    needs = tuple(bool(n) for n in (nig[1:6] if eager else nig[:5]))
    entry = _bwd if eager else torch.ops.kernelset.gated_mlp_backward
    grads = entry(dy, x, w_gate, w_up, w_down, norm_weight, g, u, h, n2, rstd, norm_eps, activation, backend, *needs)
    return (*(gr if n else None for gr, n in zip(grads, needs)), None, None, None)


_op.register_autograd(_backward, setup_context=_setup)
# (only y's gradient is read: the saved g, u, h, n, rstd get none built for them)
_SPEC = AutogradSpec(_fwd, _setup, _backward, needed=(0,), name="gated_mlp")

