"""Fused linear cross-entropy: the loss of ``hidden @ weight.T (+ bias)`` without the [T, V] logits.

Per chunk of ``rows`` tokens: one cuBLAS product into a reused ``[rows, V]`` buffer (model
dtype), the cross-entropy kernel of ``launch.py`` reading it and overwriting it in place with
d(loss)/d(logits) (already scaled for the reduction), then dhidden[chunk] = dlogits @ weight,
dweight += dlogits.T @ hidden[chunk] and dbias += column sums. So the gradients are complete when
the forward returns; the backward only multiplies them by the incoming gradient, in place and
skipped on the device when that is exactly 1.0 (``loss.backward()``), no host sync.

Extra memory, bytes (s = element size of the model dtype, r = chunk rows):
    r * V * s               logits chunk, overwritten by its gradient (the only scratch)
  + T * H * s + V * H * s   dhidden and dweight (the results themselves)
  + 4 V + V * s + 8 T       dbias (fp32 accumulator, result), per-row loss and lse
r is the largest power of two with r * V * s <= ``LCETuning.chunk_bytes`` (16 <= r <= T).
dweight accumulates in its own dtype: cuBLAS adds each chunk's product in fp32 and rounds the
running sum once per chunk (relative error ~ sqrt(T / r) * 2^-9 in bf16, as Liger's). An fp32
accumulator would cost 4 V H bytes, twice the bf16 gradient (2 GiB at V 128256, H 4096), more
than the whole budget of the lean peers, so it is not used.

``reduction='none'`` with a gradient for weight or bias cannot be scaled afterwards (each row
has its own incoming gradient inside dweight's sum): the forward then computes the loss only and
the backward recomputes the chunks with the per-row gradient applied (four products instead of
three). dhidden alone scales per row, so that case stays single-pass.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import torch

from ...core import checks, dispatch
from ...core.alloc import empty
from ...core.arch import ArchRange, device_arch, sm_count
from ...core.autograd import AutogradSpec, apply, needs_grad
from ...core.enums import AUTO, Backend
from ...core.errors import ArgumentError
from ...core.registry import BenchCase, Cost, Impl, OpSpec, Problem, declare_op, register_impl
from ...core.support import triton_device
from ...core.tuning import TuningStack, hash_once
from . import linear_reference as ref
from .api import _DOUBLE, Reduction, check_options, check_targets

OP = "linear_cross_entropy"


@hash_once
@dataclasses.dataclass(frozen=True)
class LCETuning:
    # 256 MiB: 1024 rows at V 128256 bf16, where the dweight update (K = rows) stops being bound
    # by reading and writing dweight (4 V H bytes per chunk); 64 MiB (256 rows) matches Liger's
    # memory and costs ~1.4x the time (scripts/lce_memory.py sweeps it)
    chunk_bytes: int = 256 << 20
    chunk_rows: int = 0  # > 0: this many rows per chunk whatever the size (tests force several chunks)


_tuning = TuningStack(LCETuning())
active = _tuning.active
use = _tuning.use


def chunk_rows(t: int, v: int, itemsize: int) -> int:
    """Rows per chunk: forced, or the largest power of two whose logits fit ``chunk_bytes``."""
    tun = active()
    if tun.chunk_rows > 0:
        return max(1, min(tun.chunk_rows, t))
    r = max(16, 1 << max(0, (tun.chunk_bytes // max(1, v * itemsize)).bit_length() - 1))
    return max(1, min(r, t))


# ---- the registry ------------------------------------------------------------------------------


def _key(hidden, weight, target):
    return (hidden.device, hidden.dtype, hidden.shape[-1], weight.shape[0], target.dtype)


def _problem(hidden, weight, target):
    t, h = hidden.shape
    v = weight.shape[0]
    return Problem(OP, hidden.device, hidden.dtype, (t, h, v), device_arch(hidden.device),
                   {"hidden": h, "vocab": v, "target": str(target.dtype).replace("torch.", "")})


def _cost(shape, dtype, mode):
    t, h, v = shape if len(shape) == 3 else (shape[0], 64, shape[-1])
    s = torch.empty((), dtype=dtype).element_size()
    if mode == "fwd":
        return Cost((t * h + v * h) * s, 2 * t * h * v, "read hidden and weight (loss only)")
    return Cost(2 * (t * h + v * h) * s, 6 * t * h * v,
                "read hidden and weight, write dhidden and dweight; 3 products of 2 T H V flops")


declare_op(OpSpec(
    name=OP, family="loss",
    signature="linear_cross_entropy(hidden, weight, target, *, bias=None, ignore_index=-100, label_smoothing=0.0, "
              "z_loss=0.0, softcap=None, reduction='mean', check_target=True, backend='auto')",
    doc="cross_entropy(hidden @ weight.T + bias, target) chunked over tokens, [T, V] logits never stored",
    reference=lambda hidden, weight, target: ref.fwd(hidden, weight, None, target, -100, 0.0, 0.0, 0.0, "mean",
                                                     False, False, False)[0],
    tolerance="norm", key=_key, problem=_problem, cost=_cost,
    # bar (issue 3): time <= torch.compile's and peak extra memory <= Liger's; the harness has no
    # memory column yet, scripts/lce_memory.py measures it
    bench=(BenchCase((8192, 4096, 128256), "fwd+bwd"), BenchCase((8192, 4096, 128256), "fwd"),
           BenchCase((4096, 2560, 262144), "fwd+bwd")),
))


# ---- the chunked implementation (cuBLAS products + the cross-entropy kernel) ------------------


def _ce_in_place(logits, target, loss, lse, scale, ignore_index, smoothing, z_loss, softcap, need_grad):
    """The cross-entropy kernel of launch.py on one chunk, its gradient written over the logits
    (``launch.ce_rows`` with DX = X: every element, and the target logit, is read before any
    program of its row writes)."""
    from .launch import ce_rows
    ce_rows(logits, target, loss, lse, logits if need_grad else None, scale, ignore_index, smoothing, z_loss, softcap,
            need_grad)


def _t_fwd(hidden, weight, bias, target, ignore_index, smoothing, z_loss, softcap, reduction, need_h, need_w, need_b,
           row_grad=None):
    """Same contract as ``linear_reference.fwd``; the gradients in the model dtype."""
    from .launch import ce_bwd, grad_scale
    t, h = hidden.shape
    v = weight.shape[0]
    dev, dt = hidden.device, hidden.dtype
    need = need_h or need_w or need_b
    loss = empty((t,), torch.float32, dev)
    lse = torch.empty((t,), dtype=torch.float32, device=dev)
    scale = grad_scale(target, ignore_index, reduction)  # on the device: no host sync
    gh = empty((t, h), dt, dev) if need_h else None
    # written by the first chunk's product (beta = 0); zeros only if there is no chunk
    gw = (empty((v, h), weight.dtype, dev) if t else torch.zeros((v, h), dtype=weight.dtype, device=dev)) \
        if need_w else None
    gb = torch.zeros((v,), dtype=torch.float32, device=dev) if need_b else None
    rg = row_grad.float().contiguous() if row_grad is not None else None
    rows = chunk_rows(t, v, dt.itemsize)
    buf = torch.empty((rows, v), dtype=dt, device=dev) if t else None
    wt = weight.t()
    for s in range(0, t, rows):
        e = min(t, s + rows)
        x = hidden[s:e]
        logits = buf[: e - s]
        if bias is None:
            torch.mm(x, wt, out=logits)
        else:
            torch.addmm(bias, x, wt, out=logits)
        _ce_in_place(logits, target[s:e], loss[s:e], lse[s:e], scale, ignore_index, smoothing, z_loss, softcap, need)
        if not need:
            continue
        if rg is not None:
            ce_bwd(rg[s:e], logits, "none")  # per-row upstream gradient, in place
        if need_h:
            torch.mm(logits, weight, out=gh[s:e])
        if need_w:
            if s == 0:
                torch.mm(logits.t(), x, out=gw)
            else:
                gw.addmm_(logits.t(), x)
        if need_b:
            gb += logits.sum(0, dtype=torch.float32)
    del buf
    if reduction == "none":
        out = loss
    else:
        out = loss.sum() * scale if reduction == "mean" else loss.sum()
    return out, gh, gw, (gb.to(bias.dtype) if gb is not None else None)


def _t_bwd(grad_out, grads, reduction):
    """The stored gradients times grad_out, in place; returns at once on the device where it is 1.0."""
    from .launch import ce_bwd
    out = []
    for g in grads:
        if g is not None and g.numel():
            ce_bwd(grad_out, g.view(1, -1) if g.dim() == 1 else g, reduction)
        out.append(g)
    return tuple(out)


def _triton_supports(p: Problem) -> str | None:
    return triton_device(p, "hidden")


def _kernels(p: Problem) -> str:
    """The chunking and the cross-entropy kernel a problem takes (what ``ks.explain`` and
    ``ksctl plan`` print for the Triton impl)."""
    from .backends import kernels_for
    t, _, v = p.shape
    s = torch.empty((), dtype=p.dtype).element_size()
    r = chunk_rows(t, v, s)
    b = r * v * s
    size = f"{b / 2**20:.0f} MiB" if b >= 2**20 else f"{b / 2**10:.0f} KiB"
    return (f"chunks of {r} tokens ({size} of logits, overwritten by their gradient), "
            f"cuBLAS products; cross-entropy: {kernels_for(v, p)}")


register_impl(Impl(op=OP, backend=Backend.TRITON, forward=_t_fwd, backward=_t_bwd, supports=_triton_supports,
                   detail=_kernels, priority=100, arch=ArchRange(min=(7, 0)), requires=("triton",),
                   note="token chunks: cuBLAS products + the fused cross-entropy kernel writing dlogits in place"))
register_impl(Impl(op=OP, backend=Backend.REFERENCE, forward=ref.fwd, backward=ref.bwd, supports=lambda p: None,
                   priority=0, note="fp32 logits in blocks of rows, plain torch ops; any device"))


# ---- public function, custom op, autograd ------------------------------------------------------


class _Plan(NamedTuple):
    h: bool  # gradients computed by this call
    w: bool
    b: bool
    deferred: bool  # reduction 'none' with dweight or dbias: the backward recomputes


def _plan(reduction: str, need_h: bool, need_w: bool, need_b: bool, row_grad_given: bool) -> _Plan:
    if reduction == "none" and (need_w or need_b) and not row_grad_given:
        return _Plan(False, False, False, True)
    return _Plan(need_h, need_w, need_b, False)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, *,
                         bias: torch.Tensor | None = None, ignore_index: int = -100, label_smoothing: float = 0.0,
                         z_loss: float = 0.0, softcap: float | None = None, reduction: Reduction | str = Reduction.MEAN,
                         check_target: bool = True, backend: Backend | str = AUTO) -> torch.Tensor:
    """Cross-entropy of ``hidden @ weight.T (+ bias)`` against ``target``, chunked over tokens.

    hidden ``[..., H]``, weight ``[V, H]`` (an LM head or tied embedding), bias ``[V]``, target
    ``[...]`` int; same semantics as :func:`kernelset.cross_entropy` on those logits (softcap,
    label smoothing, z-loss, ignore_index, all-ignored mean = 0). Logits in the model dtype from
    cuBLAS, softmax math and the loss in fp32; the ``[T, V]`` logits are never stored (see the
    module docstring for the memory formula). Gradients for hidden, weight and bias.
    ``check_target`` verifies that every target is ignore_index or in [0, V) with one host sync
    and raises on a bad one; it is skipped under CUDA-graph capture and torch.compile (and when
    False), where a bad target's loss is NaN and so are the gradients it reaches: its dhidden row,
    and all of dweight and dbias (sums over the rows).
    """
    op = OP
    checks.tensor(op, "hidden", hidden)
    checks.tensor(op, "weight", weight, min_ndim=2)
    if weight.dim() != 2:
        raise ArgumentError(op, "weight", "2-D [V, H]", f"shape {tuple(weight.shape)}")
    checks.same_device(op, "weight", weight, "hidden", hidden)
    checks.same_dtype(op, "weight", weight, "hidden", hidden)
    h = hidden.shape[-1]
    v = weight.shape[0]
    if weight.shape[1] != h:
        raise ArgumentError(op, "weight", f"of shape [V, {h}] (H = hidden's last dim)", f"shape {tuple(weight.shape)}")
    if v == 0:
        raise ArgumentError(op, "weight", "of vocabulary size (first dim) >= 1", f"shape {tuple(weight.shape)}")
    if bias is not None:
        checks.tensor(op, "bias", bias)
        checks.shape(op, "bias", bias, (v,), "weight's first dim")
        checks.same_device(op, "bias", bias, "hidden", hidden)
        checks.same_dtype(op, "bias", bias, "hidden", hidden)
    checks.tensor(op, "target", target, dtypes=(torch.int64, torch.int32), min_ndim=0)
    checks.shape(op, "target", target, tuple(hidden.shape[:-1]), "hidden's leading shape")
    checks.same_device(op, "target", target, "hidden", hidden)
    ignore_index, label_smoothing, z_loss, cap, red = check_options(op, ignore_index, label_smoothing, z_loss, softcap,
                                                                    reduction)
    if check_target:
        check_targets(op, target, v, ignore_index, "weight's first dim")
    h2, t2 = hidden.reshape(-1, h), target.reshape(-1).contiguous()  # the kernel reads targets unit-stride
    grad_on = torch.is_grad_enabled()
    nh, nw = grad_on and hidden.requires_grad, grad_on and weight.requires_grad
    nb = grad_on and bias is not None and bias.requires_grad
    args = (h2, weight, bias, t2, ignore_index, label_smoothing, z_loss, cap, red)
    if torch.compiler.is_compiling():
        loss = torch.ops.kernelset.linear_cross_entropy(*args, nh, nw, nb, str(backend), None)[0]
    elif needs_grad(hidden, weight, bias):
        loss = apply(_SPEC, *args, nh, nw, nb, str(backend), None)[0]
    else:
        loss = dispatch.select(op, backend, (h2, weight, t2), {}).forward(*args, False, False, False)[0]
    return loss.reshape(target.shape) if red == "none" else loss


def _fwd(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], target: torch.Tensor,
         ignore_index: int, label_smoothing: float, z_loss: float, softcap: float, reduction: str, need_h: bool,
         need_w: bool, need_b: bool, backend: str, row_grad: Optional[torch.Tensor]
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    plan = _plan(reduction, need_h, need_w, need_b, row_grad is not None)
    impl = dispatch.select(OP, backend, (hidden, weight, target), {})
    loss, gh, gw, gb = impl.forward(hidden, weight, bias, target, ignore_index, label_smoothing, z_loss, softcap,
                                    reduction, plan.h, plan.w, plan.b, row_grad)
    return (loss, *(g if g is not None else hidden.new_empty(0) for g in (gh, gw, gb)))  # returns never alias


_op = torch.library.custom_op("kernelset::linear_cross_entropy", mutates_args=())(_fwd)


@_op.register_fake
def _(hidden, weight, bias, target, ignore_index, label_smoothing, z_loss, softcap, reduction, need_h, need_w, need_b,
      backend, row_grad):
    plan = _plan(reduction, need_h, need_w, need_b, row_grad is not None)
    loss = hidden.new_empty(hidden.shape[:1] if reduction == "none" else (), dtype=torch.float32)
    return (loss, hidden.new_empty(hidden.shape if plan.h else (0,)),
            weight.new_empty(weight.shape if plan.w else (0,)), hidden.new_empty(bias.shape if plan.b else (0,)))


def _setup(ctx, inputs, output):
    hidden, weight, bias, target, ignore_index, smoothing, z_loss, softcap, reduction, nh, nw, nb, backend, _ = inputs
    ctx.plan = _plan(reduction, nh, nw, nb, False)
    ctx.needs = (nh, nw, nb)
    ctx.opts = (ignore_index, smoothing, z_loss, softcap, reduction, backend)
    if ctx.plan.deferred:
        ctx.save_for_backward(hidden, weight, bias, target)
    else:
        ctx.save_for_backward(output[1], output[2], output[3])
    ctx.used = False
    if getattr(ctx, "eager", False):
        ctx.impl = dispatch.select(OP, backend, (hidden, weight, target), {}, backward=True)


def _backward(ctx, grad_loss, *grad_stored):
    nh, nw, nb = ctx.needs
    ignore_index, smoothing, z_loss, softcap, reduction, backend = ctx.opts
    eager = getattr(ctx, "eager", False)
    # only a gradient of the first gradients reaches the stored ones (eager: the others are None)
    if eager and any(g is not None for g in grad_stored):
        raise RuntimeError(_DOUBLE.format(op=OP))
    if ctx.plan.deferred:
        hidden, weight, bias, target = ctx.saved_tensors
        args = (hidden, weight, bias, target, ignore_index, smoothing, z_loss, softcap, reduction, nh, nw, nb)
        if eager and torch.is_grad_enabled() and ctx.impl.backend != Backend.REFERENCE:
            # create_graph=True: the chunked recompute writes into buffers (mm out=), which autograd
            # cannot record; the reference's plain torch ops can
            raise RuntimeError(f"kernelset.{OP}: backward with create_graph=True is not supported by the "
                               f"{ctx.impl.backend} backend (reduction='none' recomputes in buffers autograd "
                               "cannot record); backend='reference' supports it")
        if eager:
            _, gh, gw, gb = ctx.impl.forward(*args, grad_loss)
        else:
            _, gh, gw, gb = torch.ops.kernelset.linear_cross_entropy(*args, backend, grad_loss)
    else:
        gh, gw, gb = ctx.saved_tensors
        stored = (gh if nh else None, gw if nw else None, gb if nb else None)
        if eager:
            if ctx.used:  # the in-place scaling would apply twice
                raise RuntimeError("kernelset.linear_cross_entropy: backward ran twice (retain_graph=True) and is "
                                   "not supported; compute the loss again")
            ctx.used = True
            gh, gw, gb = ctx.impl.backward(grad_loss, stored, reduction)
        else:
            gh, gw, gb = ref.bwd(grad_loss, stored, reduction)  # plain torch ops: torch.compile fuses them
    return ((gh if nh else None), (gw if nw else None), (gb if nb else None)) + (None,) * 11


_op.register_autograd(_backward, setup_context=_setup)
# only the loss's gradient is read: the stored dhidden/dweight/dbias outputs get no zero [T, H] and
# [V, H] tensors materialised for them (on the GPU test, 106 MiB over the memory formula)
_SPEC = AutogradSpec(_fwd, _setup, _backward, needed=(0,), name="linear_cross_entropy",
                     double_backward=True)  # checked in _backward (the reference handles reduction="none")
