"""Benchmark adapter of embedding. Peers: F.embedding (eager) and torch.compile of it."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...bench.adapter import BenchAdapter, ShapeGrammar, compiled, runner
from . import api


def _eager(ids, w):
    return F.embedding(ids, w)


def _inputs(shape, dtype, device, mode):
    if len(shape) == 2:  # (tokens, dim) from ksctl verify / plan: a small vocabulary
        shape = (shape[0], 97, shape[1])
    t, v, d = shape
    grad = mode != "fwd"
    w = torch.randn(v, d, dtype=dtype, device=device, requires_grad=grad)
    ids = torch.randint(0, v, (t,), device=device)
    cot = (torch.randn(t, d, dtype=dtype, device=device),) if grad else ()
    return {"ids": ids, "w": w, "wrt": (w,), "cot": cot, "names": ("y", "dweight") if grad else ("y",)}


def _reference(inp, mode):
    wr = inp["w"].detach().float().requires_grad_(mode != "fwd")
    y = F.embedding(inp["ids"], wr)
    if mode == "fwd":
        return (y.detach(),)
    return (y.detach(),) + torch.autograd.grad(y, (wr,), (inp["cot"][0].float(),))


ADAPTERS = {"embedding": BenchAdapter(
    inputs=_inputs,
    ours=lambda inp, mode, backend: runner(lambda: api.embedding(inp["ids"], inp["w"], check_ids=False,
                                                                 backend=backend), inp, mode),
    peers=lambda inp, mode: {"torch-eager": runner(lambda: _eager(inp["ids"], inp["w"]), inp, mode),
                             "torch.compile": runner(lambda: compiled(_eager)(inp["ids"], inp["w"]), inp, mode)},
    reference=_reference,
    args=lambda inp: (inp["ids"], inp["w"]),
    shape=ShapeGrammar("TxVxD", "T token ids, a table of V rows (the vocabulary) of D elements"),
)}
