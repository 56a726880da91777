"""Benchmark adapter of linear_cross_entropy. Peers: what a HuggingFace trainer runs
(``F.cross_entropy((hidden @ weight.T).float(), target)``, the [T, V] logits materialized),
torch.compile of it, and Liger's fused linear cross-entropy when importable.

The bar is time AND peak extra memory; the harness times only, so ``peak_extra_bytes`` (used by
scripts/lce_memory.py) measures what a runner allocates above what exists before it runs.
"""
from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F

from ...bench.adapter import BenchAdapter, Runner, ShapeGrammar, compiled, runner
from . import linear, linear_reference


def dims(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(T, H, V) from a bench shape; ``ksctl verify``/``plan`` pass [rows, vocab] (H = 64 then)."""
    return tuple(shape) if len(shape) == 3 else (shape[0], 64, shape[-1])  # type: ignore[return-value]


def _hf(hidden, weight, target):
    return F.cross_entropy((hidden @ weight.t()).float(), target, ignore_index=-100)


def _inputs(shape, dtype, device, mode):
    t, h, v = dims(shape)
    grad = mode != "fwd"
    hidden = torch.randn(t, h, dtype=dtype, device=device, requires_grad=grad)
    weight = torch.randn(v, h, dtype=dtype, device=device).mul_(2.0 / h**0.5).requires_grad_(grad)  # logits ~ N(0, 4)
    target = torch.randint(0, v, (t,), device=device)
    target[1::10] = -100  # some rows ignored, as padding in a batch
    cot = (torch.ones((), device=device),) if grad else ()  # loss.backward()
    return {"hidden": hidden, "weight": weight, "t": target, "wrt": (hidden, weight) if grad else (), "cot": cot,
            "names": ("loss", "dhidden", "dweight") if grad else ("loss",)}


def _reference(inp, mode):
    grad = mode != "fwd"
    loss, gh, gw, _ = linear_reference.fwd(inp["hidden"].detach().float(), inp["weight"].detach().float(), None,
                                           inp["t"], -100, 0.0, 0.0, 0.0, "mean", grad, grad, False)
    return (loss,) + ((gh, gw) if grad else ())


def _liger(hidden, weight, target):
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
    out = LigerFusedLinearCrossEntropyFunction.apply(hidden, weight, target)  # bias None, ignore_index -100, mean
    return out[0] if isinstance(out, tuple) else out


def _peers(inp, mode):
    h, w, t = inp["hidden"], inp["weight"], inp["t"]
    peers: dict[str, Runner | str] = {"torch-eager": runner(lambda: _hf(h, w, t), inp, mode),
                                      "torch.compile": runner(lambda: compiled(_hf)(h, w, t), inp, mode)}
    try:
        importlib.import_module("liger_kernel.ops.fused_linear_cross_entropy")
        peers["liger"] = runner(lambda: _liger(h, w, t), inp, mode)
    except Exception as exc:
        peers["liger"] = f"liger not importable ({type(exc).__name__})"
    return peers


def _ours(inp, mode, backend):
    # no target check: its host sync per call is not part of the kernels (as cross_entropy's bench)
    return runner(lambda: linear.linear_cross_entropy(inp["hidden"], inp["weight"], inp["t"], check_target=False,
                                                      backend=backend), inp, mode)


def peak_extra_bytes(run: Runner) -> int:
    """Peak bytes allocated while ``run`` runs (its returned loss and gradients included) above
    what was allocated before it: the "extra memory" of the bar. CUDA only."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    outs = run()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del outs
    return peak


ADAPTERS = {"linear_cross_entropy": BenchAdapter(
    inputs=_inputs,
    ours=_ours,
    peers=_peers,
    reference=_reference,
    args=lambda inp: (inp["hidden"], inp["weight"], inp["t"]),
    shape=ShapeGrammar("TxHxV", "T tokens of hidden size H, an LM head over a vocabulary of V (every tenth target "
                       "ignored)"),
)}
