"""Benchmark adapters of the sampling family. Peers: torch.argmax (eager) and torch.compile of it."""
from __future__ import annotations

import torch

from ...bench.adapter import BenchAdapter, ShapeGrammar, compiled, runner
from . import api


def _eager_argmax(x):
    return torch.argmax(x, dim=-1)


def _inputs(shape, dtype, device, mode):
    return {"x": torch.randn(*shape, dtype=dtype, device=device), "wrt": (), "cot": (), "names": ("ids",)}


ADAPTERS = {"argmax": BenchAdapter(
    inputs=_inputs,
    ours=lambda inp, mode, backend: runner(lambda: api.argmax(inp["x"], backend=backend), inp, mode),
    peers=lambda inp, mode: {"torch-eager": runner(lambda: _eager_argmax(inp["x"]), inp, mode),
                             "torch.compile": runner(lambda: compiled(_eager_argmax)(inp["x"]), inp, mode)},
    reference=lambda inp, mode: (torch.argmax(inp["x"].float(), dim=-1),),
    args=lambda inp: (inp["x"],),
    shape=ShapeGrammar("BxV", "B rows of logits over a vocabulary of V"),
)}
