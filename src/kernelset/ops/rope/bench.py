"""Benchmark adapter of rotary_embedding. Peers: vLLM-style native torch (gather cos/sin, rotate
halves) and torch.compile of it. Each runner rotates its own copies, so every first call (the
correctness check) starts from the same q and k."""
from __future__ import annotations

import torch

from ...bench.adapter import BenchAdapter, compiled
from . import api
from . import reference as ref


def _native(positions, q, k, cache):
    rot = cache.shape[1]
    cs = cache[positions]
    cos, sin = cs[:, None, : rot // 2], cs[:, None, rot // 2:]
    for x in (q, k):
        half = x[..., : rot // 2].float(), x[..., rot // 2: rot].float()
        x[..., :rot] = torch.cat([half[0] * cos - half[1] * sin, half[1] * cos + half[0] * sin], -1).to(x.dtype)
    return q, k


def _inputs(shape, dtype, device, mode):
    if len(shape) == 2:  # (tokens, anything) from ksctl verify/explain: a small GQA layer
        shape = (shape[0], 4, 2, 64)
    t, hq, hk, d = shape
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
    f = torch.outer(torch.arange(4096, device=device, dtype=torch.float32), inv)
    return {"pos": torch.randint(0, 4096, (t,), device=device), "q": torch.randn(t, hq, d, dtype=dtype, device=device),
            "k": torch.randn(t, hk, d, dtype=dtype, device=device), "cache": torch.cat([f.cos(), f.sin()], -1),
            "names": ("q", "k")}


def _own(fn, inp):
    q, k = inp["q"].clone(), inp["k"].clone()
    return lambda: tuple(fn(inp["pos"], q, k, inp["cache"]))


def _reference(inp, mode):
    q, k = inp["q"].to(torch.float32, copy=True), inp["k"].to(torch.float32, copy=True)
    ref.fwd(inp["pos"], q, k, inp["cache"], False, q.shape[-1])
    return q, k


ADAPTERS = {"rotary_embedding": BenchAdapter(
    inputs=_inputs,
    ours=lambda inp, mode, backend: _own(lambda p, q, k, c: api.rotary_embedding(p, q, k, c, backend=backend), inp),
    peers=lambda inp, mode: {"torch-eager": _own(_native, inp), "torch.compile": _own(compiled(_native), inp)},
    reference=_reference,
    args=lambda inp: (inp["pos"], inp["q"], inp["k"], inp["cache"], inp["q"].shape[-1]),
)}
