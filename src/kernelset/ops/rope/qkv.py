"""qkv_rope: attention's input side, ``q, k, v = rope(x Wq^T), rope(x Wk^T), x Wv^T``, as one autograd node.

In an eager training step each of the three projections records three or four autograd nodes
(the product, the weight's transpose, the views to ``[B, S, H, D]`` and the transpose to ``[B, H,
S, D]``) and the rotation one more; at a 1B model's training shapes the host's time to record and
run them exceeds the GPU's (issue 5; H200 2026-11-27). This op does the same work as
one node:

- forward: the three weights concatenated (one copy) and one product ``x [Wq; Wk; Wv]^T`` (cuBLAS,
  rounded to the model dtype, as nn.Linear rounds; biases added by the same call), then the
  rotation of q and k (``apply_rotary``'s kernel, reading the product's columns in place); v is a
  view of the product. Outputs ``[B, H, S, D]`` over ``[B, S, H, D]`` memory, as transformers'
  ``view(...).transpose(1, 2)`` gives them;
- backward: the rotation backwards on dq and dk, the three gradients side by side (one copy), then
  ``dx = dqkv [Wq; Wk; Wv]`` and ``d[Wq; Wk; Wv] = dqkv^T x`` (two products); the weights'
  gradients are row blocks of the one result.

Rotation: transformers' ``apply_rotary_pos_emb`` (rotate halves) over the full head size, cos/sin
tables ``[B, S, D]`` or ``[S, D]`` with duplicated halves, as the rotary modules return them.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ...core import checks, dispatch
from ...core.alloc import empty
from ...core.arch import ArchRange, device_arch
from ...core.autograd import AutogradSpec, apply, needs_grad
from ...core.enums import AUTO, Backend
from ...core.errors import ArgumentError
from ...core.registry import BenchCase, Cost, Impl, OpSpec, Problem, declare_op, register_impl
from ...core.support import triton_device
from . import reference as ref

OP = "qkv_rope"


class QKV(NamedTuple):
    q: torch.Tensor  # [B, Hq, S, D]
    k: torch.Tensor  # [B, Hk, S, D]
    v: torch.Tensor  # [B, Hk, S, D]


# ---- the registry ------------------------------------------------------------------------------


def _key(x, w, cos, heads):
    return (x.device, x.dtype, x.shape[-1], w.shape[0], heads, cos.dtype, cos.dim())


def _problem(x, w, cos, heads):
    hq, hk, d = heads
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return Problem(OP, x.device, x.dtype, (m, x.shape[-1], hq, hk, d), device_arch(x.device),
                   {"hidden": x.shape[-1], "heads": hq, "kv_heads": hk, "head_dim": d})


def _cost(shape, dtype, mode):
    if len(shape) == 6:  # a benchmark case's (B, S, H_model, Hq, Hk, D)
        shape = (shape[0] * shape[1], *shape[2:])
    m, h, hq, hk, d = shape
    n = (hq + 2 * hk) * d
    s = torch.empty((), dtype=dtype).element_size()
    if mode == "fwd":
        return Cost((m * h + n * h + m * n) * s, 2 * m * h * n,
                    "read x and the weights, write q, k, v; one product of 2 M H N flops (N = q, k, v)")
    # backward: read dq, dk, dv, x (for dW) and the weights (for dx); write dx and dW
    return Cost((3 * m * h + 3 * n * h + 2 * m * n) * s, 6 * m * h * n, "forward's product, backward's two")


def _reference_out(x, w_q, w_k, w_v, cos, sin, head_dim=None):
    d = head_dim or cos.shape[-1]
    w = torch.cat((w_q, w_k, w_v))
    heads = (w_q.shape[0] // d, w_k.shape[0] // d, d)
    return tuple(t.transpose(1, 2) for t in ref_fwd(x, w, None, cos, sin, heads))


declare_op(OpSpec(
    name=OP, family="rope",
    signature="qkv_rope(x, w_q, w_k, w_v, cos, sin, *, head_dim, b_q=None, b_k=None, b_v=None, norm_weight=None, "
              "norm_eps=1e-6, backend='auto')",
    doc="q, k, v = rope(x w_q^T), rope(x w_k^T), x w_v^T as [B, H, S, D], one autograd node (one product + rotation)",
    reference=_reference_out, tolerance="gemm", key=_key, problem=_problem, cost=_cost,
    # Llama-3-8B's attention input at 4K tokens; no bar: the op exists for a training step's host time
    bench=(BenchCase((1, 4096, 4096, 32, 8, 128), "fwd"), BenchCase((1, 4096, 4096, 32, 8, 128), "fwd+bwd")),
))


# ---- implementations ---------------------------------------------------------------------------
# forward(x [B, S, Hd], w [N, Hd] (q, k, v rows), b [N] or None, cos, sin, heads (Hq, Hk, D))
#   -> (q [B, S, Hq, D], k [B, S, Hk, D], v [B, S, Hk, D]);
# backward(dq, dk, dv [B, S, H, D], x, w, cos, sin, heads, needs (x, w, b))
#   -> (dx [B, S, Hd], dw [N, Hd], db [N]), None where not needed.


def _split(qkv: torch.Tensor, b: int, s: int, heads) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    hq, hk, d = heads
    nq, nk = hq * d, hk * d
    return (qkv[..., :nq].view(b, s, hq, d), qkv[..., nq:nq + nk].view(b, s, hk, d),
            qkv[..., nq + nk:].view(b, s, hk, d))


def ref_fwd(x, w, bias, cos, sin, heads):
    """fp32 product and rotation, each output rounded once to the model dtype."""
    b, s, _ = x.shape
    qkv = x.float() @ w.float().t()
    if bias is not None:
        qkv = qkv + bias.float()
    q, k, v = _split(qkv, b, s, heads)
    d = heads[2]
    return (ref.apply(q, cos, sin, False, d, 2).to(x.dtype), ref.apply(k, cos, sin, False, d, 2).to(x.dtype),
            v.to(x.dtype))


def ref_bwd(dq, dk, dv, x, w, cos, sin, heads, needs):
    """The explicit formulas in fp32 (no autograd: this also runs inside the custom op)."""
    b, s, hd = x.shape
    d = heads[2]
    gq = ref.apply(dq.float(), cos, sin, False, d, 2, -1.0)
    gk = ref.apply(dk.float(), cos, sin, False, d, 2, -1.0)
    hq, hk, _ = heads  # (explicit widths: reshape's -1 is ambiguous for an empty batch)
    g = torch.cat((gq.reshape(b * s, hq * d), gk.reshape(b * s, hk * d), dv.float().reshape(b * s, hk * d)), 1)
    xf = x.float().reshape(b * s, hd)
    dx = (g @ w.float()).view(b, s, hd).to(x.dtype) if needs[0] else None
    dw = (g.t() @ xf).to(w.dtype) if needs[1] else None
    db = g.sum(0).to(w.dtype) if needs[2] else None
    return dx, dw, db


def _unit_last(t):
    """The rotation kernel reads a cos/sin row at unit stride (any batch and sequence strides): a
    table strided in its last dim (a slice of a wider one) is copied, [B, S, D] at most."""
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def t_fwd(x, w, bias, cos, sin, heads):
    from .launch import rope_apply
    b, s, hd = x.shape
    x2 = x.reshape(b * s, hd)
    qkv = empty((b * s, w.shape[0]), x.dtype, x.device)
    if bias is None:
        torch.mm(x2, w.t(), out=qkv)
    else:
        torch.addmm(bias, x2, w.t(), out=qkv)
    q, k, v = _split(qkv, b, s, heads)
    qr, kr = rope_apply(q, k, _unit_last(cos), _unit_last(sin), False, heads[2], 2, 1.0)
    return qr, kr, v


def t_bwd(dq, dk, dv, x, w, cos, sin, heads, needs):
    from .launch import rope_apply
    b, s, hd = x.shape
    m = b * s
    # (the kernel takes any [B, S, H, D] row strides with a unit-stride last dim; autograd may hand
    # in anything, e.g. an expanded ones for a sum: copies only then)
    gq, gk = rope_apply(dq.contiguous(), dk.contiguous(), _unit_last(cos), _unit_last(sin), False, heads[2], 2, -1.0)
    hq, hk, d = heads  # (explicit widths: reshape's -1 is ambiguous for an empty batch)
    g = torch.cat((gq.reshape(m, hq * d), gk.reshape(m, hk * d), dv.reshape(m, hk * d)), 1)
    dx = torch.mm(g, w).view(b, s, hd) if needs[0] else None
    dw = torch.mm(g.t(), x.reshape(m, hd)) if needs[1] else None
    db = g.sum(0, dtype=torch.float32).to(w.dtype) if needs[2] else None
    return dx, dw, db


def _triton_supports(p: Problem) -> str | None:
    return triton_device(p, "x")


register_impl(Impl(op=OP, backend=Backend.TRITON, forward=t_fwd, backward=t_bwd, supports=_triton_supports,
                   priority=100, arch=ArchRange(min=(7, 0)), requires=("triton",),
                   note="one cuBLAS product of the concatenated weights + apply_rotary's kernel, one autograd node"))
register_impl(Impl(op=OP, backend=Backend.REFERENCE, forward=ref_fwd, backward=ref_bwd, supports=lambda p: None,
                   priority=0, note="fp32 math in plain torch ops; any device"))


# ---- public function, custom ops, autograd -----------------------------------------------------


def qkv_rope(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor, *, head_dim: int, b_q: torch.Tensor | None = None, b_k: torch.Tensor | None = None,
             b_v: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None, norm_eps: float = 1e-6,
             backend: Backend | str = AUTO) -> QKV:
    """q, k, v of attention from hidden states: ``rope(x w_q^T + b_q)``, ``rope(x w_k^T + b_k)``,
    ``x w_v^T + b_v``, each ``[B, H, S, D]`` (a view of ``[B, S, H, D]`` memory), one autograd node.

    x ``[B, S, H_model]``; w_q ``[Hq * D, H_model]``, w_k and w_v ``[Hk * D, H_model]`` (nn.Linear
    weights), optional biases; cos/sin ``[B, S, D]``, ``[1, S, D]`` or ``[S, D]``, transformers'
    rotary tables (duplicated halves), rotating the full head size D = ``head_dim`` by rotate-halves.
    Each output is rounded once to x's dtype after its product, then after its rotation, as
    transformers' module does. Gradients for x, the weights and the biases (cos and sin constant).
    ``norm_weight`` ``[H_model]``: x goes through transformers' LlamaRMSNorm first (``norm_eps``),
    inside the same node (a decoder layer's input norm feeding its attention); its weight gets a
    gradient too.
    """
    op = OP
    checks.tensor(op, "x", x, min_ndim=3)
    if x.dim() != 3:
        raise ArgumentError(op, "x", "3-D [B, S, hidden]", f"shape {tuple(x.shape)}")
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
        raise ArgumentError(op, "head_dim", "an even int >= 2", repr(head_dim))
    b, s, hd = x.shape
    rows = []
    for name, w, bias in (("w_q", w_q, b_q), ("w_k", w_k, b_k), ("w_v", w_v, b_v)):
        checks.tensor(op, name, w, min_ndim=2)
        if w.dim() != 2 or w.shape[1] != hd or w.shape[0] % head_dim or w.shape[0] == 0:
            raise ArgumentError(op, name, f"2-D [heads * {head_dim}, {hd}] (nn.Linear's weight)",
                                f"shape {tuple(w.shape)}")
        checks.same_dtype(op, name, w, "x", x)
        checks.same_device(op, name, w, "x", x)
        if bias is not None:
            bname = "b_" + name[2:]
            checks.tensor(op, bname, bias)
            checks.shape(op, bname, bias, (w.shape[0],), f"{name}'s rows")
            checks.same_dtype(op, bname, bias, "x", x)
            checks.same_device(op, bname, bias, "x", x)
        rows.append(w.shape[0])
    if rows[1] != rows[2]:
        raise ArgumentError(op, "w_v", f"of w_k's {rows[1]} rows (as many key as value heads)", f"{rows[2]} rows")
    hq, hk = rows[0] // head_dim, rows[1] // head_dim
    if hq % hk:
        raise ArgumentError(op, "w_q", f"a multiple of the {hk} KV heads in query heads", f"{hq} heads")
    for name, t in (("cos", cos), ("sin", sin)):
        checks.tensor(op, name, t, min_ndim=2)
        checks.same_device(op, name, t, "x", x)
        if tuple(t.shape[-2:]) != (s, head_dim) or t.dim() > 3 or (t.dim() == 3 and t.shape[0] not in (1, b)):
            raise ArgumentError(op, name, f"of shape [S={s}, D={head_dim}] or [B={b}, S, D] (full-width tables)",
                                f"shape {tuple(t.shape)}")
    if norm_weight is not None:
        from ..norm.api import check_prenorm
        norm_eps = check_prenorm(op, norm_weight, norm_eps, x)
    biases = (b_q, b_k, b_v)
    args = (x, w_q, w_k, w_v, *biases, norm_weight, float(norm_eps), cos, sin, hq, hk, head_dim)
    if torch.compiler.is_compiling():
        out = torch.ops.kernelset.qkv_rope(*args, str(backend))
    elif needs_grad(x, w_q, w_k, w_v, *biases, norm_weight):
        out = apply(_SPEC, *args, str(backend))
    else:
        out = _fwd(*args, str(backend))
    return QKV(*out[:3])


def _cat(w_q, w_k, w_v, b_q, b_k, b_v):
    w = torch.cat((w_q, w_k, w_v))
    if b_q is None and b_k is None and b_v is None:
        return w, None
    bs = [t if t is not None else w.new_zeros(r.shape[0]) for t, r in ((b_q, w_q), (b_k, w_k), (b_v, w_v))]
    return w, torch.cat(bs)


def _fwd(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, b_q: Optional[torch.Tensor],
         b_k: Optional[torch.Tensor], b_v: Optional[torch.Tensor], norm_weight: Optional[torch.Tensor],
         norm_eps: float, cos: torch.Tensor, sin: torch.Tensor, hq: int, hk: int, d: int,
         backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, k, v [B, H, S, D] over [B, S, H, D] memory; then what the backward reads: the concatenated
    weight, and with a pre-norm its output and rstd); the transposes happen here, inside the node,
    so autograd records none."""
    w, bias = _cat(w_q, w_k, w_v, b_q, b_k, b_v)
    if norm_weight is not None:
        from ..norm.api import prenorm_forward
        n2, rstd = prenorm_forward(x.reshape(-1, x.shape[-1]), norm_weight, norm_eps, backend)
        inp = n2.view(x.shape)
    else:
        inp, n2, rstd = x, x.new_empty(0), x.new_empty(0)  # (outputs must not alias inputs or each other)
    impl = dispatch.select(OP, backend, (inp, w, cos, (hq, hk, d)), {})
    q, k, v = impl.forward(inp, w, bias, cos, sin, (hq, hk, d))
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), w, n2, rstd


_op = torch.library.custom_op("kernelset::qkv_rope", mutates_args=())(_fwd)


@_op.register_fake
def _(x, w_q, w_k, w_v, b_q, b_k, b_v, norm_weight, norm_eps, cos, sin, hq, hk, d, backend):
    b, s, hd = x.shape
    n = (hq + 2 * hk) * d
    qkv = x.new_empty((b, s, n))
    normed = norm_weight is not None
    return (x.new_empty((b, s, hq, d)).transpose(1, 2), x.new_empty((b, s, hk, d)).transpose(1, 2),
            qkv[..., (hq + hk) * d:].view(b, s, hk, d).transpose(1, 2), w_q.new_empty((n, hd)),
            x.new_empty((b * s, hd) if normed else (0,)),
            x.new_empty((b * s,) if normed else (0,), dtype=torch.float32 if normed else x.dtype))


def _bwd(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
         norm_weight: Optional[torch.Tensor], n2: torch.Tensor, rstd: torch.Tensor, norm_eps: float, cos: torch.Tensor,
         sin: torch.Tensor, hq: int, hk: int, d: int, backend: str, need_x: bool, need_w: bool, need_b: bool,
         need_norm: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    normed = norm_weight is not None
    inp = n2.view(x.shape) if normed else x
    impl = dispatch.select(OP, backend, (inp, w, cos, (hq, hk, d)), {}, backward=True)
    # dq, dk, dv come [B, H, S, D]; the implementations read them [B, S, H, D] (any strides)
    dn, dw, db = impl.backward(dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2), inp, w, cos, sin,
                               (hq, hk, d), (need_x or need_norm, need_w, need_b))
    dx = dwn = None
    if normed and (need_x or need_norm):
        from ..norm.api import prenorm_backward
        dx, dwn = prenorm_backward(dn.reshape(-1, x.shape[-1]), x.reshape(-1, x.shape[-1]), norm_weight, rstd,
                                   norm_eps, backend)
        dx = dx.view(x.shape)
    elif need_x:
        dx = dn
    return tuple(g if g is not None else x.new_empty(0) for g in (dx, dw, db, dwn))


_bwd_op = torch.library.custom_op("kernelset::qkv_rope_backward", mutates_args=())(_bwd)


@_bwd_op.register_fake
def _(dq, dk, dv, x, w, norm_weight, n2, rstd, norm_eps, cos, sin, hq, hk, d, backend, need_x, need_w, need_b,
      need_norm):
    return (x.new_empty(x.shape) if need_x else x.new_empty(0), w.new_empty(w.shape) if need_w else x.new_empty(0),
            w.new_empty((w.shape[0],)) if need_b else x.new_empty(0),
            norm_weight.new_empty(norm_weight.shape) if (need_norm and norm_weight is not None) else x.new_empty(0))


def _setup(ctx, inputs, output):
    x, w_q, w_k, w_v, b_q, b_k, b_v, norm_weight, norm_eps, cos, sin, hq, hk, d, backend = inputs
    ctx.save_for_backward(x, output[3], norm_weight, output[4], output[5], cos, sin)
    ctx.opts = (norm_eps, hq, hk, d, backend)
    ctx.bias = (b_q is not None, b_k is not None, b_v is not None)


def _backward(ctx, dq, dk, dv, *_):
    x, w, norm_weight, n2, rstd, cos, sin = ctx.saved_tensors
    norm_eps, hq, hk, d, backend = ctx.opts
    eager = getattr(ctx, "eager", False)
    nig = ctx.needs_input_grad[1:] if eager else ctx.needs_input_grad  # (EagerAutograd's first input is the spec)
    need_x, need_w, need_b, need_norm = bool(nig[0]), any(nig[1:4]), any(nig[4:7]), bool(nig[7])
    entry = _bwd if eager else torch.ops.kernelset.qkv_rope_backward
    b, s = x.shape[0], x.shape[1]
    dq, dk, dv = (g if g is not None else torch.zeros((b, h, s, d), dtype=x.dtype, device=x.device)
                  for g, h in ((dq, hq), (dk, hk), (dv, hk)))
    dx, dw, db, dwn = entry(dq, dk, dv, x, w, norm_weight, n2, rstd, norm_eps, cos, sin, hq, hk, d, backend, need_x,
                            need_w, need_b, need_norm)
    nq, nk = hq * d, hk * d
    gw = (dw[:nq], dw[nq:nq + nk], dw[nq + nk:]) if need_w else (None, None, None)
    gb = tuple(db[a:z] if (need_b and has) else None
               for (a, z), has in zip(((0, nq), (nq, nq + nk), (nq + nk, nq + 2 * nk)), ctx.bias))
    return (dx if need_x else None, *(g if n else None for g, n in zip(gw, nig[1:4])),
            *(g if n else None for g, n in zip(gb, nig[4:7])), dwn if need_norm else None,
            None, None, None, None, None, None, None)


_op.register_autograd(_backward, setup_context=_setup)
# q, k, v's gradients are read; the concatenated weight (an output so the backward can save it) gets none
_SPEC = AutogradSpec(_fwd, _setup, _backward, needed=(0, 1, 2), name="qkv_rope")  # (the other outputs are saved, not used)
