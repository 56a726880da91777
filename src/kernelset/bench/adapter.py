"""What the harness needs from an op family to benchmark one case; each family's ``bench.py``
defines ``ADAPTERS = {op_name: BenchAdapter(...)}``."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import torch

Outputs = tuple[torch.Tensor, ...]
Runner = Callable[[], Outputs]


@dataclasses.dataclass(frozen=True)
class BenchAdapter:
    # (shape, dtype, device, mode) -> inputs: a dict the other callables understand, with "names",
    # the names of the outputs every closure returns in order (gradients start with "d")
    inputs: Callable[[tuple[int, ...], torch.dtype, torch.device, str], dict[str, Any]]
    # (inputs, mode, backend) -> a closure running kernelset's op (forward, or forward+backward)
    ours: Callable[[dict[str, Any], str, str], Runner]
    # (inputs, mode) -> {peer name: closure, or a string saying why it is not available}
    peers: Callable[[dict[str, Any], str], dict[str, Runner | str]]
    # (inputs, mode) -> fp32 reference outputs, in the order the closures return them
    reference: Callable[[dict[str, Any], str], Outputs]
    # inputs -> the op's positional tensor arguments (for ks.explain / ksctl explain and plan)
    args: Callable[[dict[str, Any]], tuple] = lambda inp: (inp["x"],)


def runner(fn: Callable[[], torch.Tensor | tuple[torch.Tensor, ...]], inputs: dict[str, Any], mode: str) -> Runner:
    """The closure for one mode: fn's outputs ("fwd"), or its outputs and the gradients to
    ``inputs["wrt"]`` against ``inputs["cot"]`` ("fwd+bwd")."""
    if mode == "fwd":
        def run():
            out = fn()
            return out if isinstance(out, tuple) else (out,)
        return run
    return grads_runner(fn, inputs["wrt"], inputs["cot"])


@functools.lru_cache(maxsize=None)
def compiled(fn: Callable) -> Callable:
    """torch.compile of a peer, one per function for every benchmark shape (static shapes, one
    graph each); dynamo's recompile limit is raised so it never falls back to eager after 8."""
    import torch._dynamo.config as dcfg
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dcfg, name):
            setattr(dcfg, name, max(getattr(dcfg, name), 256))
    return torch.compile(fn, dynamic=False)


def grads_runner(fn: Callable[[], torch.Tensor | tuple[torch.Tensor, ...]], wrt: tuple[torch.Tensor, ...],
                 cotangents: tuple[torch.Tensor, ...]) -> Runner:
    """A closure running fn's forward and its backward to ``wrt`` (no .grad accumulation)."""
    def run():
        out = fn()
        outs = out if isinstance(out, tuple) else (out,)
        grads = torch.autograd.grad(outs, wrt, cotangents[: len(outs)])
        return tuple(outs) + tuple(grads)
    return run
