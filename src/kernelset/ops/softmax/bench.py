"""Benchmark adapters of softmax / log_softmax. Peers: torch's native (eager) kernels and
torch.compile of the same expression."""
from __future__ import annotations

import functools

import torch

from ...bench.adapter import BenchAdapter, grads_runner
from . import api


@functools.lru_cache(maxsize=None)
def _compiled(fn):
    import torch._dynamo.config as dcfg
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dcfg, name):
            setattr(dcfg, name, max(getattr(dcfg, name), 256))
    return torch.compile(fn, dynamic=False)


def _eager_softmax(x):
    return torch.softmax(x, dim=-1)


def _eager_log_softmax(x):
    return torch.log_softmax(x, dim=-1)


def _inputs(shape, dtype, device, mode):
    grad = mode != "fwd"
    x = torch.randn(*shape, dtype=dtype, device=device, requires_grad=grad)
    cot = (torch.randn(*shape, dtype=dtype, device=device),) if grad else ()
    return {"x": x, "wrt": (x,), "cot": cot, "names": ("y", "dx") if grad else ("y",)}


def _runner(fn, inp, mode):
    if mode == "fwd":
        return lambda: (fn(),)
    return grads_runner(fn, inp["wrt"], inp["cot"])


def _reference(eager, inp, mode):
    if mode == "fwd":
        return (eager(inp["x"].detach().float()),)
    xr = inp["x"].detach().float().requires_grad_()
    y = eager(xr)
    return (y.detach(),) + torch.autograd.grad(y, (xr,), (inp["cot"][0].float(),))


def _adapter(public, eager):
    return BenchAdapter(
        inputs=_inputs,
        ours=lambda inp, mode, backend: _runner(lambda: public(inp["x"], backend=backend), inp, mode),
        peers=lambda inp, mode: {"torch-eager": _runner(lambda: eager(inp["x"]), inp, mode),
                                 "torch.compile": _runner(lambda: _compiled(eager)(inp["x"]), inp, mode)},
        reference=lambda inp, mode: _reference(eager, inp, mode),
    )


ADAPTERS = {"softmax": _adapter(api.softmax, _eager_softmax), "log_softmax": _adapter(api.log_softmax,
                                                                                     _eager_log_softmax)}
