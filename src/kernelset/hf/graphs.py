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
  Weights computed in the forward (parametrizations) run eagerly; parameters replaced or moved
  between a graphed forward and its backward make the backward raise.
- All layers' graphs share one memory pool. Every forward graph is captured before the first
  backward graph; a layer first seen later stays eager. A forward replay overwrites the memory
  its capture used for temporaries, where later-captured graphs may keep their saved
  activations: it runs only while no later-captured layer still waits for its backward (two
  forwards before a backward: the second runs eagerly), and it marks their activations stale, so
  a backward still to run on them (``retain_graph=True`` across forwards) raises. No graph replays
  inside a backward pass, under autocast or stream capture, or on a GPU other than the current
  one. With activation checkpointing the graphs gain nothing (the recomputation runs eagerly and
  its results go unused): use the eager node there.
- Everything handed out is a copy of the graph's memory: the layer's output, its input gradient
  and the parameter gradients (so ``.grad``, hooks, ``torch.autograd.grad`` results and
  ``output_hidden_states`` never alias memory a replay writes; gradient accumulation and kept
  references work as without graphs). The copies cost one read and write of the layers'
  gradients per step on the GPU (~1 ms for a 1B model on an H200). The backward graph's own
  outputs give their memory back to the pool once copied (later-captured graphs reuse it).
- What the capture saw is fixed: kernel choices, backend overrides, TF32 and determinism
  settings changed after the capture do not reach the replays.
- The captured activations stay allocated between steps (the eager node frees them after the
  backward), so they add to the optimizer step's memory: the step's peak is higher than the
  eager node's (a 1B model at seq 2048: by about the activations, 2.4 GiB).
- No double backward (``create_graph=True``), as with the eager node.
"""
from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.autograd.function import once_differentiable

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
        self.inputs: frozenset = frozenset()  # ids of the graph's input tensors (static copies, parameters)
        self.ptrs: tuple = ()  # the parameters' addresses the graphs read
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

    def replayed(self, e: _Entry) -> None:
        """After ``e``'s forward replay: the memory its capture used for temporaries may hold what
        the layers captured after it saved, so their saved activations are stale now (a backward
        still to run on them raises). The emulation overwrites them with NaN (and every backward
        graph's gradients, which may lie in forward temporaries too), as a replay may."""
        for o in self.entries.values():
            if o.fwd is not None and o.fwd_index > e.fwd_index:
                o.gen += 1
                if EMULATE:
                    for t in _flat(o.outs):
                        if id(t) not in o.inputs and t.is_floating_point():
                            t.fill_(float("nan"))
            if EMULATE:
                for t in _flat(o.grads):
                    if t.is_floating_point():
                        t.fill_(float("nan"))

    def eligible(self, x: torch.Tensor) -> bool:
        if not (x.is_cuda or EMULATE) or torch.compiler.is_compiling():
            return False
        if torch._C._current_graph_task_id() != -1:  # inside a backward pass (checkpoint recomputation)
            return False
        if x.is_cuda and (torch.is_autocast_enabled("cuda") or torch.cuda.is_current_stream_capturing()
                          or x.device.index != torch.cuda.current_device()):  # (capture streams are per device)
            return False
        return True

    def entry(self, layer: torch.nn.Module, args: tuple, cfg: tuple) -> _Entry | None:
        """The layer's entry when this call may run through its graphs, else None (eager)."""
        last = len(args) - 1  # x, cos and sin are copied into the graph's inputs, the parameters read in place
        key = (cfg, tuple((tuple(t.shape), t.dtype, t.device, t.requires_grad,
                           None if i in (0, last - 1, last) else t.data_ptr()) if t is not None else None
                          for i, t in enumerate(args)))
        if any(t is not None and t.grad_fn is not None for t in args[1:last - 1]):
            return None  # a weight computed in the forward (parametrizations): its memory is not the graph's to keep
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
        last = len(tensors) - 1
        ctx.cfg, ctx.has_bias, ctx.eager = cfg, has_bias, None
        # the parameters, kept for the backward as the eager node keeps them, and checked there
        ctx.params = tensors[1:last - 1]
        if e.fwd is None:
            e.statics = tuple(t.detach().clone() if t is not None and i in (0, last - 1, last) else None
                              for i, t in enumerate(tensors))
        ins = tuple(s if s is not None else t for s, t in zip(e.statics, tensors))
        for s, t in zip(e.statics, tensors):
            if s is not None:
                s.copy_(t)
        if e.fwd is None:
            g = graphs._graph()
            try:
                outs = g.capture(lambda: layer_forward(*ins, cfg))
            except Exception as exc:  # noqa: BLE001 (the layer runs eagerly from now on)
                e.failed, e.statics = f"forward capture failed ({type(exc).__name__}: {exc})", ()
                ctx.eager = layer_forward(*tensors, cfg)
                return ctx.eager[0]
            e.outs, e.inputs = outs, frozenset(id(t) for t in ins if t is not None)
            e.ptrs = tuple(t.data_ptr() if t is not None else None for t in ctx.params)
            e.fwd, e.fwd_index = g, graphs.captured
            graphs.captured += 1
            graphs.stats["captures"] += 1
        else:
            e.fwd.replay()
            graphs.replayed(e)
            graphs.stats["replays"] += 1
        e.gen += 1
        token = _Token()
        e.waiting = weakref.ref(token)
        ctx.e, ctx.gen, ctx.token = e, e.gen, token
        ctx.graphs = graphs
        return e.outs[0].clone()  # a tensor of its own: nothing handed out aliases the graph's memory

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        from .layers import layer_backward
        nig = ctx.needs_input_grad[4:]
        if ctx.eager is not None:
            (_, saved, sdpa, impls), ctx.eager = ctx.eager, None
            return (None, None, None, None, *layer_backward(dout, saved, sdpa, impls, ctx.cfg, ctx.has_bias, nig)[:15])
        e, graphs = ctx.e, ctx.graphs
        if ctx.gen != e.gen:
            raise RuntimeError("kernelize(cuda_graphs=True): a later forward replay overwrote the activations this "
                               "decoder layer's graph saved, before this backward ran (a graph kept with "
                               "retain_graph=True across forwards); use cuda_graphs=False for this pattern")
        if tuple(t.data_ptr() if t is not None else None for t in ctx.params) != e.ptrs:
            raise RuntimeError("kernelize(cuda_graphs=True): this decoder layer's parameters were replaced or moved "
                               "between its forward and its backward; the graph reads them where they were")
        e.waiting = None
        first = e.bwd is None
        if first:
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
        else:
            e.dout.copy_(dout)
            e.bwd.replay()
            graphs.stats["replays"] += 1
        # every gradient copied out of the graph's memory, so nothing handed out (.grad, the input's
        # gradient that torch.autograd.grad or a hook may keep) aliases memory a replay writes
        out = (None, None, None, None, *(t.clone() if isinstance(t, torch.Tensor) else t for t in e.grads))
        if first and isinstance(e.bwd, _Cuda):
            # needed only until copied out (here, after each replay): their memory goes back to the
            # pool, for the graphs captured after this one
            e.grads = tuple(_unowned(t) if isinstance(t, torch.Tensor) else t for t in e.grads)
        return out


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
