"""Benchmark adapters of softmax / log_softmax. Peers: torch's native (eager) kernels and
torch.compile of the same expression."""
from __future__ import annotations


import torch

from ...bench.adapter import BenchAdapter, ShapeGrammar, compiled, runner
from . import api


def _eager_softmax(x):
    return torch.softmax(x, dim=-1)


def _eager_log_softmax(x):
    return torch.log_softmax(x, dim=-1)


def _inputs(shape, dtype, device, mode):
    grad = mode != "fwd"
    x = torch.randn(*shape, dtype=dtype, device=device, requires_grad=grad)
    cot = (torch.randn(*shape, dtype=dtype, device=device),) if grad else ()
    return {"x": x, "wrt": (x,), "cot": cot, "names": ("y", "dx") if grad else ("y",)}


def _reference(eager, inp, mode):
    if mode == "fwd":
        return (eager(inp["x"].detach().float()),)
    xr = inp["x"].detach().float().requires_grad_()
    y = eager(xr)
    return (y.detach(),) + torch.autograd.grad(y, (xr,), (inp["cot"][0].float(),))


def _adapter(public, eager):
    return BenchAdapter(
        inputs=_inputs,
        ours=lambda inp, mode, backend: runner(lambda: public(inp["x"], backend=backend), inp, mode),
        peers=lambda inp, mode: {"torch-eager": runner(lambda: eager(inp["x"]), inp, mode),
                                 "torch.compile": runner(lambda: compiled(eager)(inp["x"]), inp, mode)},
        reference=lambda inp, mode: _reference(eager, inp, mode),
        shape=ShapeGrammar("ROWSxN", "ROWS rows of N elements, normalized over each row"),
    )


ADAPTERS = {"softmax": _adapter(api.softmax, _eager_softmax), "log_softmax": _adapter(api.log_softmax,
                                                                                     _eager_log_softmax)}
