"""Training mode: a LLaMA-style decoder layer's training call as one autograd node.

``input_layernorm -> self_attn -> + residual -> post_attention_layernorm -> mlp -> + residual``
runs as ``qkv_rope(norm_weight=input norm)`` (the norm, the q/k/v projections and the rotation),
attention, ``o_proj`` with the residual add, ``gated_mlp(norm_weight=post-attention norm)`` (the
norm and the MLP) and the residual add: by default those ops' implementations in sequence inside
one node (``_LayerNode``), or, under torch.compile or with an o_proj bias, as the ops themselves
(``_fused``: ``qkv_rope``, SDPA's node through ``flash_attention(layout="bhsd")``, ``o_proj``,
``gated_mlp``). The modules' own code (already patched module by module) records ~30 autograd
nodes per layer; a training step of a 1B model is host-bound on them.

A layer joins only where its norms were patched as Llama RMSNorm (weight, rounded before it), its
attention as qkv_rope's (``attention.patch_qkv``), its MLP as a split gated MLP, and a probe on
random inputs (the fp32 references) shows the layer's own forward equal to the fused one.
Everything else (padding masks, a cache, dropout, inference, and a call where the node would skip a
hook on one of the layer's modules: ``_hooked``) runs the layer's own forward.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from .mapping import unhooked

_ACT = {"swiglu": "silu", "gelu_and_mul tanh": "gelu_tanh", "gelu_and_mul none": "gelu"}
NODE = True  # the layer as one autograd node (_LayerNode); False: the four-node form (_fused); tests compare them
# inside the node, attention through SDPA's kernels where flash_attention's training choice is SDPA
# (cuDNN on H100/H200): 3.3 ms of attention kernels per 1B step against 6.7 for kernelset's Triton
# backward; on an H100 the step went 53.8 -> 51.6 ms (2026-11-27; GPU test in test_hf.py)
NODE_SDPA = True


def _fused(m: nn.Module, ops: Any, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps1: float,
           eps2: float, act: str) -> torch.Tensor:
    a, mlp = m.self_attn, m.mlp
    q, k, v = ops.qkv_rope(hidden, a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, cos, sin, head_dim=a.head_dim,
                           b_q=a.q_proj.bias, b_k=a.k_proj.bias, b_v=a.v_proj.bias,
                           norm_weight=m.input_layernorm.weight, norm_eps=eps1)
    o = ops.flash_attention(q, k, v, causal=True, scale=a.scaling, layout="bhsd")
    h = hidden + a.o_proj(o.transpose(1, 2).reshape(*hidden.shape[:-1], -1))
    return h + ops.gated_mlp(h, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight, activation=act,
                             norm_weight=m.post_attention_layernorm.weight, norm_eps=eps2)


def layer_forward(x, wn1, wq, wk, wv, bq, bk, bv, wo, wn2, wg, wu, wd, cos, sin, cfg) -> tuple:
    """The fused layer's forward as plain calls (no autograd): (out [B, S, hidden], what
    ``layer_backward`` reads). Shared by ``_LayerNode`` and the CUDA-graphed layers (graphs.py)."""
    from ..core import dispatch
    from ..ops.attention.api import _flash_fwd
    from ..ops.norm.api import prenorm_forward
    from ..ops.rope.qkv import _cat
    eps1, eps2, act, hq, hk, d, scale = cfg
    b, s, hd = x.shape
    m = b * s
    x2 = x.reshape(m, hd)
    n1, r1 = prenorm_forward(x2, wn1, eps1, "auto")
    w, bias = _cat(wq, wk, wv, bq, bk, bv)
    heads = (hq, hk, d)
    n1v = n1.view(b, s, hd)
    qi = dispatch.select("qkv_rope", "auto", (n1v, w, cos, heads), {})
    q, k, v = qi.forward(n1v, w, bias, cos, sin, heads)
    sdpa = _attention(q, k, v, s, scale) if NODE_SDPA else None
    if sdpa is not None:  # SDPA's kernel, its backward called in ours
        o, lse = sdpa[1].transpose(1, 2), None
    else:
        o, lse = _flash_fwd(q, k, v, None, None, s, s, True, scale, -1, -1, 0.0, None, True, "flash_attention",
                            "auto")
    o2 = o.reshape(m, hq * d)
    h = torch.addmm(x2, o2, wo.t())  # x + o_proj(attention), one cuBLAS call
    n2, r2 = prenorm_forward(h, wn2, eps2, "auto")
    mi = dispatch.select("gated_mlp", "auto", (n2, wg, wu, wd), {})
    y, g, u, hh = mi.forward(n2, wg, wu, wd, act)
    out = h + y
    saved = (x2, wn1, n1, r1, w, q, k, v, o, lse, wo, h, wn2, n2, r2, wg, wu, wd, g, u, hh, cos, sin)
    return out.view(b, s, hd), saved, sdpa, (qi, mi)


def layer_backward(dout, saved, sdpa, impls, cfg, has_bias, nig) -> tuple:
    """The gradients ``_LayerNode.backward`` returns (``nig``: its needs_input_grad), from
    ``layer_forward``'s saved tensors; the q/k/v weight and bias gradients are slices of one
    tensor each."""
    from ..core.checks import row_strided
    from ..ops.attention.api import _flash_bwd
    from ..ops.norm.api import prenorm_backward
    (x2, wn1, n1, r1, w, q, k, v, o, lse, wo, h, wn2, n2, r2, wg, wu, wd, g, u, hh, cos, sin) = saved
    eps1, eps2, act, hq, hk, d, scale = cfg
    qi, mi = impls
    b, s = q.shape[0], q.shape[1]
    m, hd = x2.shape
    do2 = row_strided(dout.reshape(m, hd))
    dn2, dwg, dwu, dwd = mi.backward(do2, n2, wg, wu, wd, g, u, hh, act, (True, nig[10], nig[11], nig[12]))
    dh, dwn2 = prenorm_backward(dn2, h, wn2, r2, eps2, "auto")
    dh += do2
    dwo = torch.mm(dh.t(), o.reshape(m, hq * d)) if nig[8] else None
    do = torch.mm(dh, wo).view(b, s, hq, d)
    if sdpa is not None:
        from ..ops.attention.backends import sdpa_bwd_saved
        be, out, extra = sdpa
        dq, dk, dv = (t.transpose(1, 2) for t in sdpa_bwd_saved(
            be, do.transpose(1, 2), q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), out, extra, True, scale))
    else:
        dq, dk, dv, _ = _flash_bwd(do, q, k, v, o, lse, None, None, s, s, True, scale, -1, -1, 0.0, None,
                                   "flash_attention", "auto")
    need_w, need_b = any(nig[2:5]), any(nig[5:8])
    dn1, dw, db = qi.backward(dq, dk, dv, n1.view(b, s, hd), w, cos, sin, (hq, hk, d), (True, need_w, need_b))
    dx1, dwn1 = prenorm_backward(dn1.reshape(m, hd), x2, wn1, r1, eps1, "auto")
    dh += dx1
    nq, nk = hq * d, hk * d
    cuts = ((0, nq), (nq, nq + nk), (nq + nk, nq + 2 * nk))
    dws = tuple(dw[a:z] if (need_w and n) else None for (a, z), n in zip(cuts, nig[2:5]))
    dbs = tuple(db[a:z] if (need_b and n and has) else None for (a, z), n, has in zip(cuts, nig[5:8], has_bias))
    return (dh.view(b, s, hd), dwn1 if nig[1] else None, *dws, *dbs, dwo, dwn2 if nig[9] else None,
            dwg, dwu, dwd, None, None, None)


class _LayerNode(torch.autograd.Function):
    """The whole layer as one autograd node: the same sub-ops' forward and backward implementations
    (dispatched as their public functions dispatch them), called in sequence here, with attention
    through SDPA's kernels called as functions (NODE_SDPA, where AUTO picks SDPA for a training
    call) or kernelset's flash_attention op (forward with its LSE, its own backward). One node per
    layer where ``_fused`` records six; a training step of a 1B model spends most of its host time
    recording and running nodes."""

    @staticmethod
    def forward(ctx, x, wn1, wq, wk, wv, bq, bk, bv, wo, wn2, wg, wu, wd, cos, sin, cfg):
        out, saved, sdpa, impls = layer_forward(x, wn1, wq, wk, wv, bq, bk, bv, wo, wn2, wg, wu, wd, cos, sin, cfg)
        ctx.save_for_backward(*saved)
        ctx.sdpa = sdpa  # (backend, out [B, H, S, D], what its backward needs) or None
        ctx.cfg = cfg
        ctx.impls = impls
        ctx.bias = (bq is not None, bk is not None, bv is not None)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        sdpa, ctx.sdpa = ctx.sdpa, None
        return layer_backward(dout, ctx.saved_tensors, sdpa, ctx.impls, ctx.cfg, ctx.bias, ctx.needs_input_grad)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: int, scale: float) -> tuple | None:
    """Causal attention of q, k, v [B, S, H, D] inside _LayerNode's forward where flash_attention's
    AUTO choice for a training call is an SDPA backend (its "train" table rows: cuDNN on H100/H200):
    SDPA's kernel called as a function, its backward kernel called by the node's backward. Returns
    (backend, out [B, H, S, D], saved), or None: the caller runs kernelset's op (forward with its
    LSE, its own backward)."""
    from ..ops.attention import backends as attn_backends
    from ..ops.attention.api import _train_backend
    # (the choice as for q, k, v recording gradients, which the node's inputs do)
    be = _train_backend("flash_attention", "auto", *(t.detach().requires_grad_() for t in (q, k, v)), None, None, s,
                        s, True, -1, -1, 0.0, None)
    res = attn_backends.sdpa_fwd_saved(be, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), True,
                                       scale) if be else None
    return None if res is None else (be, res[0], res[1])


def _node(m: nn.Module, ops: Any, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps1: float,
          eps2: float, act: str, graphs: Any = None) -> torch.Tensor:
    a, mlp = m.self_attn, m.mlp
    counts = getattr(ops, "counts", None)
    if counts is not None:  # (the proof's op counts: these ops' implementations run inside the node)
        for name in ("qkv_rope", "flash_attention", "gated_mlp"):
            counts[name] += 1
    cfg = (eps1, eps2, act, a.q_proj.weight.shape[0] // a.head_dim, a.k_proj.weight.shape[0] // a.head_dim,
           a.head_dim, float(a.scaling))
    args = (hidden, m.input_layernorm.weight, a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.q_proj.bias,
            a.k_proj.bias, a.v_proj.bias, a.o_proj.weight, m.post_attention_layernorm.weight, mlp.gate_proj.weight,
            mlp.up_proj.weight, mlp.down_proj.weight, cos, sin)
    if graphs is not None:  # kernelize(cuda_graphs=True): the layer's CUDA graphs where their contract allows
        from .graphs import call
        return call(graphs, m, args, cfg, (a.q_proj.bias is not None, a.k_proj.bias is not None,
                                           a.v_proj.bias is not None))
    return _LayerNode.apply(*args, cfg)


def _capturing(hook: Any) -> bool:
    """transformers' own forward hook recording a module's output (``output_attentions=True``
    and the like): it records nothing unless a model call asked for that output."""
    return getattr(hook, "__module__", "").startswith("transformers.") and "capturing" in getattr(
        hook, "__qualname__", "")


def _recording() -> bool:
    """A model call collects outputs of modules inside a decoder layer (attention weights, router
    logits): transformers' collector holds a key other than the layers' hidden states."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # (a version without it passes output_attentions to the layer)
        return False
    got = _active_collector.get()
    return bool(got) and any(k not in ("hidden_states", "_hidden_states_layers") for k in got)


def _hooked(m: nn.Module) -> bool:
    """The node calls none of the layer's modules (norms, attention, MLP, their projections): a
    forward or backward hook on one of them (a user's, registered before or after kernelize; or
    transformers' output capture while it records), or a global module hook, would be skipped
    silently."""
    a, mlp = m.self_attn, m.mlp
    return not unhooked(m.input_layernorm, a, a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.post_attention_layernorm, mlp,
                        mlp.gate_proj, mlp.up_proj, mlp.down_proj,
                        idle=lambda hook: _capturing(hook) and not _recording())


def _forward(m: nn.Module, ops: Any, original: Any, eps1: float, eps2: float, act: str, graphs: Any = None):
    a = m.self_attn

    def forward(hidden_states, attention_mask=None, position_ids=None, past_key_values=None, cache=None,
                use_cache=False, position_embeddings=None, **kwargs):
        # a training call without padding, cache, dropout or hooks on the modules the node replaces, on
        # full-width rotary tables
        if (attention_mask is None and past_key_values is None and cache is None and position_embeddings is not None
                and not kwargs.get("output_attentions") and not _hooked(m)
                and torch.is_grad_enabled() and hidden_states.dim() == 3
                and (hidden_states.requires_grad or a.q_proj.weight.requires_grad)
                and not (a.training and a.attention_dropout > 0.0)
                and position_embeddings[0].shape[-1] == a.head_dim):
            if NODE and not torch.compiler.is_compiling() and a.o_proj.bias is None:
                return _node(m, ops, hidden_states, *position_embeddings, eps1, eps2, act, graphs)
            return _fused(m, ops, hidden_states, *position_embeddings, eps1, eps2, act)
        if past_key_values is not None:
            kwargs["past_key_values"] = past_key_values
        if cache is not None:
            kwargs["cache"] = cache
        return original(m, hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                        use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
    return forward


def _probe(m: nn.Module, eps1: float, eps2: float, act: str, compare, reference_only, plain, tolerance) -> str | None:
    """None when the layer's own forward equals the fused one on random inputs (fp32 references)."""
    from .attention import probe_inputs
    p = m.self_attn.q_proj.weight
    hidden, cos, sin = probe_inputs(p, m.self_attn.head_dim, 1)
    try:
        with torch.no_grad(), reference_only():
            want = type(m).forward(m, hidden, attention_mask=None, position_embeddings=(cos, sin))
            if not isinstance(want, torch.Tensor):  # (older transformers: a tuple the model unpacks)
                return f"its forward returns {type(want).__name__}, not the hidden states alone"
            got = _fused(m, plain, hidden, cos, sin, eps1, eps2, act)
    except Exception as exc:
        return f"probe failed ({type(exc).__name__}: {exc})"
    err = compare(want, got) / tolerance("norm", p.dtype)
    return None if err <= 1.0 else f"its forward differs from the fused layer (err/tol {err:.3g})"


def patch(handle: Any, model: nn.Module, ops: frozenset[str] | None) -> None:
    """Training mode: fuse the decoder layers whose parts were all patched as above and whose probe
    agrees (the report lists each layer as ``decoder_layer``)."""
    from ..core.tolerance import tolerance
    from .mapping import eps_of
    from .patching import Mode, Patched, Skipped, _compare, _PLAIN, _reference_only, _set_method
    if handle.mode is not Mode.TRAINING or (ops is not None and not {"qkv_rope", "gated_mlp"} <= ops):
        return
    done = {p.where: p for p in handle.patched}
    probed: dict[tuple, str | None] = {}
    for path, m in model.named_modules():
        if not all(hasattr(m, c) for c in ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")):
            continue
        pre = f"{path}." if path else ""
        n1, att, n2, mlp = (done.get(pre + c) for c in ("input_layernorm", "self_attn", "post_attention_layernorm",
                                                         "mlp"))
        act = _ACT.get(mlp.behaviour) if mlp is not None and mlp.rule == "gated_mlp" else None
        eps1, eps2 = eps_of(m.input_layernorm), eps_of(m.post_attention_layernorm)
        if not (n1 is not None and n2 is not None and n1.behaviour == n2.behaviour == "w, llama rounding"
                and att is not None and att.rule == "attention_qkv" and act is not None and eps1 and eps2
                and m.input_layernorm.weight is not None and m.post_attention_layernorm.weight is not None):
            continue
        key = (type(m), m.self_attn.q_proj.weight.shape, m.mlp.gate_proj.weight.shape, act)
        if key not in probed:
            probed[key] = _probe(m, eps1, eps2, act, _compare, _reference_only, _PLAIN, tolerance)
        why = probed[key]
        if why is not None:
            handle.skipped.append(Skipped("decoder_layer", path, why))
            continue
        _set_method(handle, m, "forward", _forward(m, handle.ops, type(m).forward, eps1, eps2, act, handle.graphs))
        handle.patched.append(Patched("decoder_layer", path, "norm + qkv_rope, attention, o_proj, norm + gated_mlp "
                                      f"(training calls{', CUDA graphs' if handle.graphs is not None else ''})",
                                      ("qkv_rope", "flash_attention", "gated_mlp")))
