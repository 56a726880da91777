"""Benchmark adapter of cross_entropy. Peers: what a HuggingFace trainer runs
(``F.cross_entropy(logits.float(), target)``), torch.compile of it, and Liger when importable."""
from __future__ import annotations


import torch
import torch.nn.functional as F

from ...bench.adapter import BenchAdapter, ShapeGrammar, compiled, runner
from . import api, reference


def _hf(x, t):
    return F.cross_entropy(x.float(), t, ignore_index=-100)


def _inputs(shape, dtype, device, mode):
    m, v = shape
    grad = mode != "fwd"
    x = torch.randn(m, v, dtype=dtype, device=device, requires_grad=grad)
    t = torch.randint(0, v, (m,), device=device)
    t[1::10] = -100  # some rows ignored, as padding in a batch
    cot = (torch.ones((), device=device),) if grad else ()  # loss.backward()
    return {"x": x, "t": t, "wrt": (x,), "cot": cot, "names": ("loss", "dlogits") if grad else ("loss",)}


def _reference(inp, mode):
    # kernelset's own fp32 reference: the same mean over non-ignored rows (0 when all are ignored,
    # where F.cross_entropy gives NaN)
    xr = inp["x"].detach().float().requires_grad_(mode != "fwd")
    loss = reference.fwd(xr, inp["t"], -100, 0.0, 0.0, None, "mean", False)[0]
    if mode == "fwd":
        return (loss.detach(),)
    return (loss.detach(),) + torch.autograd.grad(loss, (xr,))


def _peers(inp, mode):
    x, t = inp["x"], inp["t"]
    peers = {"torch-eager": runner(lambda: _hf(x, t), inp, mode),
             "torch.compile": runner(lambda: compiled(_hf)(x, t), inp, mode)}
    try:
        from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
        peers["liger"] = runner(lambda: LigerCrossEntropyFunction.apply(x, t)[0], inp, mode)
    except Exception as exc:
        peers["liger"] = f"liger not importable ({type(exc).__name__})"
    return peers


ADAPTERS = {"cross_entropy": BenchAdapter(
    inputs=_inputs,
    # no target check: its host sync per call is not part of the kernel (the peers check on the device or not at all)
    ours=lambda inp, mode, backend: runner(lambda: api.cross_entropy(inp["x"], inp["t"], check_target=False,
                                                                     backend=backend), inp, mode),
    peers=_peers,
    reference=_reference,
    args=lambda inp: (inp["x"], inp["t"]),
    shape=ShapeGrammar("TxV", "T tokens' logits over a vocabulary of V (every tenth target ignored)"),
)}
from .linear_bench import ADAPTERS as _L; ADAPTERS.update(_L)  # noqa: E402,E702  (linear_cross_entropy)
