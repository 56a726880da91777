"""Benchmark adapters of the optimizer family.

A case shape ``(n, per)`` means n tensors of ``per`` elements on average (sizes vary
deterministically by up to +-50%, in pairs that keep the total at exactly n * per, and are
rarely multiples of the block, so tails are timed too). The generic harness times a closure
that returns outputs; here the closure is one ``optimizer.step()`` (or one clip), each runner
owning its own copy of params and states, so the first call of every runner starts from the same
state and is checked against the fp32 reference. Every tensor is checked (a multi-tensor kernel's
fault can sit in any one of its address-table chunks: a sample of four tensors would miss it);
the fp32 reference of the 1B-parameter case holds 12 GB on the GPU.

Peers: torch.optim.AdamW(fused=True) and (foreach=True), with torch's own dtype rule (states in
the parameter dtype, so they move fewer bytes than kernelset's fp32 states: the byte model
counts kernelset's traffic); torch.nn.utils.clip_grad_norm_(foreach=True).
"""
from __future__ import annotations

from typing import Any

import torch

from ...bench.adapter import BenchAdapter, ShapeGrammar
from . import api
from . import reference as R

LR, WD, BETAS, EPS, STEP0 = 0.05, 0.1, (0.9, 0.999), 1e-8, 9.0


def bench_sizes(n: int, per: int) -> list[int]:
    """n sizes averaging ``per``, varied in +- pairs so they sum to exactly n * per."""
    sizes = []
    for k in range(n // 2):
        d = (k * 7919 + 13) % max(1, per // 2)
        sizes += [per + d, per - d]
    if n % 2:
        sizes.append(per)
    return sizes


def _sample(n: int) -> list[int]:
    """The tensors returned and checked: all of them."""
    return list(range(n))


def _adamw_inputs(shape, dtype, device, mode):
    sizes = bench_sizes(*shape)
    params = [torch.randn(s, dtype=dtype, device=device) for s in sizes]
    grads = [torch.randn(s, dtype=dtype, device=device) for s in sizes]
    m0 = [torch.randn(s, device=device) * 0.1 for s in sizes]
    v0 = [torch.rand(s, device=device) * 0.1 + 0.01 for s in sizes]
    sample = _sample(len(sizes))
    names = tuple(f"{k}{i}" for i in sample for k in ("p", "m", "v"))
    return {"params": params, "grads": grads, "m0": m0, "v0": v0, "sample": sample, "names": names}


def _optimizer(inp, make, state_dtype, step_device):
    """A fresh optimizer over copies of the inputs' params, states set to (m0, v0, STEP0)."""
    params = []
    for p, g in zip(inp["params"], inp["grads"]):
        q = p.clone()
        q.grad = g  # read-only for every runner (no grad scaling here)
        params.append(q)
    opt = make(params)
    for q, m, v in zip(params, inp["m0"], inp["v0"]):
        opt.state[q] = {"step": torch.tensor(STEP0, dtype=torch.float32, device=step_device or q.device),
                        "exp_avg": m.to(state_dtype or q.dtype, copy=True),
                        "exp_avg_sq": v.to(state_dtype or q.dtype, copy=True)}

    outs: list[tuple] = []

    def run():
        opt.step()
        if not outs:  # the first call's (checked); built once: 6000 look-ups per call would be timed
            out = []
            for i in inp["sample"]:
                st = opt.state[params[i]]
                out += [params[i], st["exp_avg"], st["exp_avg_sq"]]
            outs.append(tuple(out))
        return outs[0]
    return run


def _adamw_ours(inp, mode, backend):
    return _optimizer(inp, lambda ps: api.AdamW(ps, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, backend=backend),
                      torch.float32, None)


def _adamw_peers(inp, mode) -> dict[str, Any]:
    def torch_adamw(**kw):
        return lambda ps: torch.optim.AdamW(ps, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, **kw)
    return {"torch-fused": _optimizer(inp, torch_adamw(fused=True), None, None),
            "torch-foreach": _optimizer(inp, torch_adamw(foreach=True), None, torch.device("cpu"))}


def _adamw_reference(inp, mode):
    out = []
    for i in inp["sample"]:
        p = inp["params"][i].to(torch.float32, copy=True)
        m, v = inp["m0"][i].clone(), inp["v0"][i].clone()
        step = torch.tensor(STEP0, dtype=torch.float32, device=p.device)
        R.adamw([p], [inp["grads"][i]], [m], [v], [], [], [step], LR, None, BETAS[0], BETAS[1], EPS, WD, False, False,
                None, None)
        out += [p, m, v]
    return tuple(out)


MAX_NORM = 1.0


def _clip_inputs(shape, dtype, device, mode):
    sizes = bench_sizes(*shape)
    grads = [torch.randn(s, dtype=dtype, device=device) for s in sizes]
    sample = _sample(len(sizes))
    return {"grads": grads, "sample": sample, "names": ("total",) + tuple(f"g{i}" for i in sample)}


def _clip_runner(inp, fn):
    params = []
    for g in inp["grads"]:
        p = torch.zeros((), dtype=g.dtype, device=g.device).expand(g.shape)  # no memory: only .grad is read
        p.grad = g.clone()
        params.append(p)

    def run():
        total = fn(params)
        return (total,) + tuple(params[i].grad for i in inp["sample"])
    return run


def _clip_reference(inp, mode):
    grads = inp["grads"]
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dtype=torch.float64) for g in grads]))
    coef = torch.clamp(MAX_NORM / (total + 1e-6), max=1.0)
    # fp32 (exact enough for bf16 grads): every tensor is checked, 8 GB in float64 at 1B
    return (total,) + tuple(grads[i].float() * coef.float() for i in inp["sample"])


_TENSORS = ShapeGrammar("NxPER", "N tensors of PER elements on average (sizes varied around it)")

ADAPTERS = {
    "adamw": BenchAdapter(inputs=_adamw_inputs, ours=_adamw_ours, peers=_adamw_peers, reference=_adamw_reference,
                          args=lambda inp: (inp["params"], inp["grads"]), shape=_TENSORS),
    "clip_grad_norm": BenchAdapter(
        inputs=_clip_inputs,
        ours=lambda inp, mode, backend: _clip_runner(
            inp, lambda ps: api.clip_grad_norm_(ps, MAX_NORM, backend=backend)),
        peers=lambda inp, mode: {"torch-foreach": _clip_runner(
            inp, lambda ps: torch.nn.utils.clip_grad_norm_(ps, MAX_NORM, foreach=True))},
        reference=_clip_reference,
        args=lambda inp: (inp["grads"],), shape=_TENSORS),
}
