"""Training mode, opt-in: each fused decoder layer's training call replays CUDA graphs
(``kernelize(model, mode="training", cuda_graphs=True)``).

A 1B-parameter training step is host-bound even with each layer as one autograd node
(``layers._LayerNode``): enqueueing it takes longer than its kernels run. Here each layer's
forward and backward are captured once (``layers.layer_forward`` / ``layer_backward``, the same
code the node runs) and then replayed: per layer and step a few copies and two graph launches.

The contract, checked at run time (a call outside it runs the eager node, never a wrong graph):

- Per layer one signature is captured: the shapes, dtypes and devices of its inputs, which of
  them record gradients, and the addresses of its parameters. The first call of a layer runs
  eagerly (it compiles and tunes the kernels), the second captures; a call with another signature
  (another sequence length, parameters moved) runs eagerly. Fixed-shape (packed) batches suit it.
- All layers' graphs share one memory pool. Every forward graph is captured before the first
  backward graph; a layer first seen later stays eager. A forward replay overwrites the memory
  its capture used for temporaries, which later-captured graphs may hold data in: it runs only
  while no later-captured layer still waits for its backward (two forwards before a backward:
  the second runs eagerly). No graph replays inside a backward pass (activation checkpointing's
  recomputation) or under autocast or stream capture.
- A layer's output and saved activations live in its graph until its next forward replay, which
  bumps the output's version counter: a backward that needs the old ones after that
  (``retain_graph=True`` across steps) raises, in our node or in the op that saved the output.
- Parameter gradients are copies of the graph's outputs (so ``.grad`` never aliases memory a
  replay writes: gradient accumulation and kept references work as without graphs); this costs
  one read and write of the layers' gradients per step on the GPU. The graph's own gradient
  outputs give their memory back to the pool once copied (later-captured graphs reuse it).
- The captured activations stay allocated between steps (the eager node frees them after the
  backward), so they add to the optimizer step's memory: the step's peak is higher than the
  eager node's (a 1B model at seq 2048: by about the activations, 2.4 GiB).
"""
from __future__ import annotations

import weakref
from typing import Any

import torch

# tests: on CPU tensors, "capture" runs the function and "replay" runs it again, copying its
# tensors into the captured ones (what a CUDA graph's replay does to its outputs)
EMULATE = False


def _flat(obj: Any):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _flat(o)


class _Emulated:
    def capture(self, fn):
        self.fn, self.outs = fn, fn()
        return self.outs

    def replay(self) -> None:
        for static, new in zip(_flat(self.outs), _flat(self.fn())):
            if new is not static:  # (the parameters among the saved tensors: read in place)
                static.copy_(new)


class _Cuda:
    def __init__(self, pool) -> None:
        self.graph, self.pool = torch.cuda.CUDAGraph(), pool

    def capture(self, fn):
        # thread_local: the backward's capture runs on autograd's device thread
        with torch.cuda.graph(self.graph, pool=self.pool, capture_error_mode="thread_local"):
            outs = fn()
        self.graph.replay()  # capturing records the work; this runs it
        return outs

    def replay(self) -> None:
        self.graph.replay()


class _Token:
    """Lives as long as the autograd node of one graphed forward (weakly referenced by its entry)."""


class _Entry:
    """One layer's captured signature: static inputs, graphs, their outputs."""

    def __init__(self, key: tuple) -> None:
        self.key = key
        self.fwd = self.bwd = None
        self.fwd_index = -1
        self.statics: tuple = ()
        self.outs: Any = None  # layer_forward's (out, saved, sdpa, impls)
        self.dout: torch.Tensor | None = None
        self.grads: tuple = ()
        self.gen = 0
        self.waiting: weakref.ref | None = None  # the pending forward's token
        self.failed: str | None = None

    def pending(self) -> bool:
        if self.waiting is not None and self.waiting() is None:
            self.waiting = None  # its autograd graph was freed without a backward
        return self.waiting is not None


class LayerGraphs:
    """The CUDA graphs of one kernelize handle's decoder layers (see the module docstring)."""

    def __init__(self) -> None:
        self.pool = None
        self.entries: dict[int, _Entry] = {}
        self.captured = 0  # graphs captured (their order in the pool)
        self.backward_captured = False
        self.stats = {"eager": 0, "captures": 0, "replays": 0}

    def _graph(self):
        if EMULATE:
            return _Emulated()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        return _Cuda(self.pool)

    def eligible(self, x: torch.Tensor) -> bool:
        if not (x.is_cuda or EMULATE) or torch.compiler.is_compiling():
            return False
        if torch._C._current_graph_task_id() != -1:  # inside a backward pass (checkpoint recomputation)
            return False
        if x.is_cuda and (torch.is_autocast_enabled("cuda") or torch.cuda.is_current_stream_capturing()):
            return False
        return True

    def entry(self, layer: torch.nn.Module, args: tuple, cfg: tuple) -> _Entry | None:
        """The layer's entry when this call may run through its graphs, else None (eager)."""
        last = len(args) - 1  # x, cos and sin are copied into the graph's inputs, the parameters read in place
        key = (cfg, tuple((tuple(t.shape), t.dtype, t.device, t.requires_grad,
                           None if i in (0, last - 1, last) else t.data_ptr()) if t is not None else None
                          for i, t in enumerate(args)))
        e = self.entries.get(id(layer))
        if e is None:  # the first call runs eagerly (kernels compiled and tuned, dispatch cached)
            self.entries[id(layer)] = _Entry(key)
            return None
        if e.failed is not None or e.key != key:
            return None
        if e.fwd is None:
            if self.backward_captured:
                e.failed = "first seen after the backward graphs were captured"
                return None
            return e
        if any(o.fwd_index >= e.fwd_index and o.pending() for o in self.entries.values()):
            return None  # replaying would overwrite a pending later-captured layer's memory
        return e


class _GraphNode(torch.autograd.Function):
    """A fused layer's training call through its entry's graphs (capturing them on first use)."""

    @staticmethod
    def forward(ctx, e, graphs, cfg, has_bias, x, *args):
        from .layers import layer_forward
        tensors = (x, *args)
        if e.fwd is None:
            e.statics = tuple(t.detach().clone() if t is not None and i in (0, len(tensors) - 2, len(tensors) - 1)
                              else None for i, t in enumerate(tensors))
        ins = tuple(s if s is not None else t for s, t in zip(e.statics, tensors))
        for s, t in zip(e.statics, tensors):
            if s is not None:
                s.copy_(t)
        if e.fwd is None:
            g = graphs._graph()
            try:
                e.outs = g.capture(lambda: layer_forward(*ins, cfg))
            except Exception as exc:  # noqa: BLE001 (the layer runs eagerly from now on)
                e.failed = f"forward capture failed ({type(exc).__name__}: {exc})"
                e.outs = layer_forward(*tensors, cfg)
                ctx.eager = e.outs
                ctx.cfg, ctx.has_bias = cfg, has_bias
                return e.outs[0]
            e.fwd, e.fwd_index = g, graphs.captured
            graphs.captured += 1
            graphs.stats["captures"] += 1
        else:
            e.fwd.replay()
            if not isinstance(e.fwd, _Emulated):  # (the emulation's copy does it)
                # the output tensors handed out before (and their aliases) were overwritten: an op
                # that saved one for a backward still to run (retain_graph) raises instead of reading it
                torch.autograd.graph.increment_version(e.outs[0])
            graphs.stats["replays"] += 1
        e.gen += 1
        token = _Token()
        e.waiting = weakref.ref(token)
        ctx.e, ctx.graphs, ctx.gen, ctx.token, ctx.eager = e, graphs, e.gen, token, None
        ctx.cfg, ctx.has_bias = cfg, has_bias
        return e.outs[0].detach()

    @staticmethod
    def backward(ctx, dout):
        from .layers import layer_backward
        nig = ctx.needs_input_grad[4:]
        if ctx.eager is not None:
            _, saved, sdpa, impls = ctx.eager
            return (None, None, None, None, *layer_backward(dout, saved, sdpa, impls, ctx.cfg, ctx.has_bias, nig)[:15])
        e, graphs = ctx.e, ctx.graphs
        if ctx.gen != e.gen:
            raise RuntimeError("kernelize(cuda_graphs=True): a later forward of this decoder layer replaced the "
                               "activations its graph saved before this backward ran (a graph kept with "
                               "retain_graph=True across forwards); use cuda_graphs=False for this pattern")
        e.waiting = None
        if e.bwd is None:
            e.dout = dout.detach().clone()
            _, saved, sdpa, impls = e.outs
            cfg, has_bias = ctx.cfg, ctx.has_bias
            g = graphs._graph()
            graphs.backward_captured = True
            try:
                e.grads = g.capture(lambda: layer_backward(e.dout, saved, sdpa, impls, cfg, has_bias, nig)[:15])
            except Exception as exc:  # noqa: BLE001 (this backward from the graph's saved tensors, eagerly)
                e.failed = f"backward capture failed ({type(exc).__name__}: {exc})"
                return (None, None, None, None,
                        *layer_backward(dout, saved, sdpa, impls, ctx.cfg, ctx.has_bias, nig)[:15])
            e.bwd = g
            graphs.captured += 1
            graphs.stats["captures"] += 1
            dx, *rest = e.grads
            out = (None, None, None, None, dx, *(t.clone() if isinstance(t, torch.Tensor) else t for t in rest))
            if isinstance(g, _Cuda):
                # the parameter gradients are needed only until copied out (above, and after each
                # replay): their memory goes back to the pool, for the graphs captured after this one
                e.grads = (dx, *(_unowned(t) if isinstance(t, torch.Tensor) else t for t in rest))
            return out
        else:
            e.dout.copy_(dout)
            e.bwd.replay()
            graphs.stats["replays"] += 1
        dx, *rest = e.grads
        # parameter gradients copied out of the graph's memory; the input's gradient is consumed by
        # the layer below within this backward pass
        return (None, None, None, None, dx, *(t.clone() if isinstance(t, torch.Tensor) else t for t in rest))


def _unowned(t: torch.Tensor) -> torch.Tensor:
    """A tensor over ``t``'s memory that does not keep it allocated (torch.compile's CUDA graph
    trees build the same from a data pointer); ``t`` itself where this torch has no such call."""
    make = getattr(torch._C, "_construct_storage_from_data_pointer", None)
    if make is None or t.numel() == 0:
        return t
    span = (sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1) * t.element_size()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(make(t.data_ptr(), t.device, span), 0, t.shape,
                                                                t.stride())


def call(graphs: LayerGraphs, layer: torch.nn.Module, args: tuple, cfg: tuple, has_bias: tuple) -> torch.Tensor:
    """The fused layer's training call (args: layers._LayerNode's tensors, x first, cos and sin
    last), through the layer's graphs where the contract allows, else the eager node."""
    from .layers import _LayerNode
    e = graphs.entry(layer, args, cfg) if graphs.eligible(args[0]) else None
    if e is None:
        graphs.stats["eager"] += 1
        return _LayerNode.apply(*args, cfg)
    return _GraphNode.apply(e, graphs, cfg, has_bias, *args)
