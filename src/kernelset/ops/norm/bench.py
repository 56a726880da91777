"""Benchmark adapters of the norm family: inputs, kernelset's runners, the peers, the reference.

Peers: HuggingFace-style eager torch (what a model runs unpatched), torch.compile of it, the
native ``F.rms_norm`` / ``F.layer_norm``, and Liger when importable. Imported by the harness
only (it may import peers).
"""
from __future__ import annotations

import statistics

from typing import Any

import torch
import torch.nn.functional as F

from ...bench.adapter import ROWS_HIDDEN, BenchAdapter, compiled, runner
from .api import fused_add_rms_norm, layer_norm, rms_norm
from .reference import fused_add_rms_norm_ref, layer_norm_ref, rms_norm_ref

EPS = 1e-6


def _hf_rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # transformers' LlamaRMSNorm.forward
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


def _hf_add_rms_norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor):
    h = x + r
    return _hf_rms_norm(h, w), h


def _ln(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def _liger(name: str):
    try:
        module = __import__("liger_kernel.ops." + name, fromlist=["x"])
    except Exception as exc:
        return f"liger not importable ({type(exc).__name__})"
    return module


def _inputs(shape, dtype, device, mode, *, params: int, residual: bool = False) -> dict[str, Any]:
    m, n = shape
    grad = mode != "fwd"
    x = torch.randn(m, n, dtype=dtype, device=device, requires_grad=grad)
    r = torch.randn(m, n, dtype=dtype, device=device, requires_grad=grad) if residual else None
    w = (1.0 + 0.1 * torch.randn(n, device=device)).to(dtype).requires_grad_(grad)
    b = (0.1 * torch.randn(n, device=device)).to(dtype).requires_grad_(grad) if params == 2 else None
    outs = ("y", "h") if residual else ("y",)
    wrt = (x, r, w) if residual else tuple(t for t in (x, w, b) if t is not None)
    wrt_names = ("dx", "dresidual", "dw") if residual else ("dx", "dw", "db")[: len(wrt)]
    cot = tuple(torch.randn(m, n, dtype=dtype, device=device) for _ in outs) if grad else ()
    return {"x": x, "r": r, "w": w, "b": b, "wrt": wrt, "cot": cot,
            "names": outs if not grad else outs + wrt_names}


def _reference(fn, inp, mode):
    leaves = [t.detach().float().requires_grad_(mode != "fwd") for t in inp["wrt"]] if mode != "fwd" else None
    if mode == "fwd":
        args = [inp[k].float() if inp[k] is not None else None for k in ("x", "r", "w", "b")]
        out = fn(*args)
        return tuple(o.detach() for o in (out if isinstance(out, tuple) else (out,)))
    named = dict(zip(("x", "r", "w") if inp["r"] is not None else ("x", "w", "b"), leaves))
    out = fn(named.get("x"), named.get("r"), named.get("w"), named.get("b"))
    outs = out if isinstance(out, tuple) else (out,)
    grads = torch.autograd.grad(outs, leaves, [c.float() for c in inp["cot"]])
    return tuple(o.detach() for o in outs) + tuple(grads)


# ---- rms_norm ---------------------------------------------------------------------------------


def _rms_peers(inp, mode):
    x, w = inp["x"], inp["w"]
    peers: dict[str, Any] = {
        "torch-eager": runner(lambda: _hf_rms_norm(x, w), inp, mode),
        "torch.compile": runner(lambda: compiled(_hf_rms_norm)(x, w), inp, mode),
        "F.rms_norm": runner(lambda: F.rms_norm(x, (x.shape[-1],), w, EPS), inp, mode),
    }
    liger = _liger("rms_norm")
    peers["liger"] = liger if isinstance(liger, str) else runner(
        lambda: liger.LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False), inp, mode)
    return peers


RMS = BenchAdapter(
    inputs=lambda shape, dtype, device, mode: _inputs(shape, dtype, device, mode, params=1),
    ours=lambda inp, mode, backend: runner(lambda: rms_norm(inp["x"], inp["w"], eps=EPS, backend=backend), inp, mode),
    peers=_rms_peers,
    reference=lambda inp, mode: _reference(lambda x, r, w, b: rms_norm_ref(x, w, EPS, 0.0, False)[0], inp, mode),
    args=lambda inp: (inp["x"], inp["w"]),
    shape=ROWS_HIDDEN,
)

# ---- fused_add_rms_norm -----------------------------------------------------------------------


def _add_peers(inp, mode):
    x, r, w = inp["x"], inp["r"], inp["w"]
    return {
        "torch-eager": runner(lambda: _hf_add_rms_norm(x, r, w), inp, mode),
        "torch.compile": runner(lambda: compiled(_hf_add_rms_norm)(x, r, w), inp, mode),
    }


ADD = BenchAdapter(
    inputs=lambda shape, dtype, device, mode: _inputs(shape, dtype, device, mode, params=1, residual=True),
    ours=lambda inp, mode, backend: runner(
        lambda: tuple(fused_add_rms_norm(inp["x"], inp["r"], inp["w"], eps=EPS, backend=backend)), inp, mode),
    peers=_add_peers,
    reference=lambda inp, mode: _reference(
        lambda x, r, w, b: fused_add_rms_norm_ref(x, r, w, EPS, 0.0, False)[:2], inp, mode),
    args=lambda inp: (inp["x"], inp["r"], inp["w"]),
    shape=ROWS_HIDDEN,
)

# ---- layer_norm -------------------------------------------------------------------------------


def _ln_peers(inp, mode):
    x, w, b = inp["x"], inp["w"], inp["b"]
    peers: dict[str, Any] = {
        "F.layer_norm": runner(lambda: _ln(x, w, b), inp, mode),
        "torch.compile": runner(lambda: compiled(_ln)(x, w, b), inp, mode),
    }
    liger = _liger("layer_norm")
    peers["liger"] = liger if isinstance(liger, str) else runner(
        lambda: liger.LigerLayerNormFunction.apply(x, w, b, 1e-5), inp, mode)
    return peers


LN = BenchAdapter(
    inputs=lambda shape, dtype, device, mode: _inputs(shape, dtype, device, mode, params=2),
    ours=lambda inp, mode, backend: runner(
        lambda: layer_norm(inp["x"], inp["w"], inp["b"], eps=1e-5, backend=backend), inp, mode),
    peers=_ln_peers,
    reference=lambda inp, mode: _reference(lambda x, r, w, b: layer_norm_ref(x, w, b, 1e-5)[0], inp, mode),
    args=lambda inp: (inp["x"], inp["w"], inp["b"]),
    shape=ROWS_HIDDEN,
)

ADAPTERS = {"rms_norm": RMS, "fused_add_rms_norm": ADD, "layer_norm": LN}


def host_overhead(device: torch.device) -> dict[str, float]:
    """rms_norm at decode size (1 x 4096 bf16): host us per eager call, and CUDA-graph replay vs kernel time."""
    from ...bench.timing import graph_replay_us, host_us_per_call
    x = torch.randn(1, 4096, dtype=torch.bfloat16, device=device)
    w = torch.randn(4096, dtype=torch.bfloat16, device=device)
    fns = {"kernelset_host_us": lambda: rms_norm(x, w), "F.rms_norm_host_us": lambda: F.rms_norm(x, (4096,), w, EPS),
           "torch-eager_host_us": lambda: _hf_rms_norm(x, w)}
    with torch.no_grad():
        # interleaved rounds, the median of each: the lent hosts' CPU speed drifts within a run
        rounds: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(5):
            for k, f in fns.items():
                rounds[k].append(host_us_per_call(f))
        out = {k: statistics.median(v) for k, v in rounds.items()}
        replay, kernel = graph_replay_us(lambda: rms_norm(x, w))
        out["kernelset_graph_replay_us_per_call"] = replay
        out["kernelset_kernel_us"] = kernel
    return out
