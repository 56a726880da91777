"""Benchmark adapters of the activation family: inputs, kernelset's runners, peers, reference.

Peers: transformers-style eager torch (``act_fn(gate) * up``), torch.compile of it, and Liger's
SwiGLU/GeGLU when importable.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ...bench.adapter import BenchAdapter, ShapeGrammar, compiled, runner
from . import api, mlp
from . import reference as R


def _liger(module: str, cls: str):
    try:
        return getattr(__import__("liger_kernel.ops." + module, fromlist=["x"]), cls)
    except Exception as exc:
        return f"liger not importable ({type(exc).__name__})"


def _eager_silu_mul(x):
    i = x.shape[-1] // 2
    return F.silu(x[..., :i]) * x[..., i:]


def _eager_gelu_mul(x):
    i = x.shape[-1] // 2
    return F.gelu(x[..., :i]) * x[..., i:]


def _eager_swiglu(g, u):
    return F.silu(g) * u


def _eager_gelu(x):
    return F.gelu(x)


def _eager_oai(x):
    gate, up = x[..., ::2].clamp(max=7.0), x[..., 1::2].clamp(min=-7.0, max=7.0)
    return (up + 1) * (gate * torch.sigmoid(gate * 1.702))


def _inputs(shape, dtype, device, mode, *, pair=False, halves=False):
    m, n = shape
    if halves:
        n += n % 2
    grad = mode != "fwd"
    x = torch.randn(m, n, dtype=dtype, device=device, requires_grad=grad)
    up = torch.randn(m, n, dtype=dtype, device=device, requires_grad=grad) if pair else None
    out_n = n // 2 if halves else n
    wrt = (x, up) if pair else (x,)
    cot = (torch.randn(m, out_n, dtype=dtype, device=device),) if grad else ()
    names = ("y",) if not grad else ("y", "dx", "dup")[: 1 + len(wrt)]
    return {"x": x, "up": up, "wrt": wrt, "cot": cot, "names": names}


def _reference(fn, inp, mode):
    if mode == "fwd":
        args = [t.detach().float() for t in inp["wrt"]]
        return (fn(*args).detach(),)
    leaves = [t.detach().float().requires_grad_() for t in inp["wrt"]]
    y = fn(*leaves)
    return (y.detach(),) + tuple(torch.autograd.grad(y, leaves, [c.float() for c in inp["cot"]]))


def _adapter(public, eager, ref_fn, *, pair=False, halves=False, liger=None):
    def peers(inp, mode):
        args = inp["wrt"]
        out: dict[str, Any] = {"torch-eager": runner(lambda: eager(*args), inp, mode),
                               "torch.compile": runner(lambda: compiled(eager)(*args), inp, mode)}
        if liger is not None:
            fn = _liger(*liger)
            out["liger"] = fn if isinstance(fn, str) else runner(lambda: fn.apply(*_liger_args(args, halves)),
                                                                  inp, mode)
        return out

    return BenchAdapter(
        inputs=lambda shape, dtype, device, mode: _inputs(shape, dtype, device, mode, pair=pair, halves=halves),
        ours=lambda inp, mode, backend: runner(lambda: public(*inp["wrt"], backend=backend), inp, mode),
        peers=peers,
        reference=lambda inp, mode: _reference(ref_fn, inp, mode),
        args=lambda inp: tuple(inp["wrt"]) if pair else (inp["x"],),
        shape=ShapeGrammar("ROWSxN", "ROWS rows of N elements, in x and in up" if pair else
                           "ROWS rows of N elements: N/2 gate and N/2 up columns (an odd N is rounded up)" if halves
                           else "ROWS rows of N elements"),
    )


def _liger_args(args, halves):
    if not halves:
        return args
    x = args[0]
    i = x.shape[-1] // 2
    return x[..., :i], x[..., i:]


def _mlp_inputs(shape, dtype, device, mode):
    """(M, H, I); a 2-D shape (rows, hidden) takes an intermediate size of 64 (the verifier's and
    ``ksctl plan``'s example calls). Weights scaled by 1/sqrt(fan-in), as initialised models are."""
    m, h = shape[0], shape[1]
    i = shape[2] if len(shape) > 2 else 64
    grad = mode != "fwd"
    x = torch.randn(m, h, dtype=dtype, device=device, requires_grad=grad)
    ws = [(torch.randn(o, n, device=device) / n ** 0.5).to(dtype).requires_grad_(grad)
          for o, n in ((i, h), (i, h), (h, i))]
    wrt = (x, *ws)
    cot = (torch.randn(m, h, dtype=dtype, device=device),) if grad else ()
    names = ("y",) if not grad else ("y", "dx", "dw_gate", "dw_up", "dw_down")
    return {"x": x, "wrt": wrt, "cot": cot, "names": names}


def _eager_mlp(x, wg, wu, wd):  # transformers' LlamaMLP
    return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)


def _mlp_reference(inp, mode):
    return _reference(lambda x, wg, wu, wd: (R.act(x @ wg.t(), "silu") * (x @ wu.t())) @ wd.t(), inp, mode)


_MLP = BenchAdapter(
    inputs=_mlp_inputs,
    ours=lambda inp, mode, backend: runner(lambda: mlp.gated_mlp(*inp["wrt"], backend=backend), inp, mode),
    peers=lambda inp, mode: {"torch-eager": runner(lambda: _eager_mlp(*inp["wrt"]), inp, mode),
                             "torch.compile": runner(lambda: compiled(_eager_mlp)(*inp["wrt"]), inp, mode)},
    reference=_mlp_reference,
    args=lambda inp: tuple(inp["wrt"]),
    shape=ShapeGrammar("MxHxI", "M tokens, hidden size H, intermediate size I"),
)

ADAPTERS = {
    "silu_and_mul": _adapter(api.silu_and_mul, _eager_silu_mul, R.autograd_ref("silu", "halves"), halves=True,
                             liger=("swiglu", "LigerSiLUMulFunction")),
    "gelu_and_mul": _adapter(api.gelu_and_mul, _eager_gelu_mul, R.autograd_ref("gelu", "halves"), halves=True),
    "swiglu": _adapter(api.swiglu, _eager_swiglu, R.autograd_ref("silu", "pair"), pair=True,
                       liger=("swiglu", "LigerSiLUMulFunction")),
    "gelu": _adapter(api.gelu, _eager_gelu, R.autograd_ref("gelu", "single")),
    "swiglu_oai": _adapter(api.swiglu_oai, _eager_oai, lambda x: R.swiglu_oai(x, 1.702, 7.0), halves=True),
    "gated_mlp": _MLP,
}
