"""kernelset as a transformers attention implementation ("kernelset"), when ``ks.flash_attention`` exists.

Registered through transformers' ``AttentionInterface`` with a mask function of its own (``mask``), so
prefill and cached decode both come here. The mask function reads the pattern transformers asks for:

- causal, or causal with a sliding window (transformers' own mask functions, recognised by their
  code): None without padding (a windowed pattern: a small tensor tagged with its window, so that
  models which build a windowed mask without passing ``sliding_window`` to the attention, such as
  Phi-3.5-MoE, keep their window), else the 2D padding mask tagged likewise;
- causal within packed sequences (``position_ids`` restarting in a row, padding-free training): a
  small tensor tagged with the packed sequence ids; the attention runs ``flash_attention_varlen``
  over the [B * S] rows (``cu_seqlens`` built once per forward, one host sync). Not under
  torch.compile: there transformers tags every call without a cache as packed, and the offsets
  would need that sync, so a compiled call without a cache (training) gets the dense mask below;
- anything else (a window within packed sequences, chunked or bidirectional blocks, a mask
  function of the model's own): transformers' dense SDPA mask, which the attention hands to
  transformers' attention untouched.

The attention then runs ``flash_attention(causal, window, softcap, sinks, layout="bhsd")`` on q
``[B, H, Sq, D]`` and the cache's k/v without a mask, prefill and decode alike (kernelset's causal mask
and window are bottom-right aligned, as transformers' are with a cache). Padding, a dense mask,
dropout in training or ``output_attentions`` run transformers' own SDPA (eager with softcap or sinks)
with an explicit mask, counted as ``attention_fallback``.

Only models whose classes declare FlashAttention support (``_supports_flash_attn``) get it: the
others (DeepSeek-V4, Doge, Llama 4 ...) edit or combine the mask tensor in their attention code,
which a None mask would skip. When this build of kernelset has no ``flash_attention`` the model
keeps its attention and the kernelize report says so.
"""
from __future__ import annotations

import collections
import sys
import weakref
from typing import Any, NamedTuple

import torch

NAME = "kernelset"

# the counting ops of the kernelize call that owns each attention module: the registered function is
# global (one per process), so two kernelized models each count their own calls, and a model whose
# handle is gone counts nowhere
_OWNERS: "weakref.WeakKeyDictionary[torch.nn.Module, Any]" = weakref.WeakKeyDictionary()


def available() -> bool:
    import kernelset as ks
    return hasattr(ks, "flash_attention")


# ---- the mask function: which pattern transformers asks for ----------------------------------

class _Unknown:
    """A mask function other than causal or causal with a sliding window."""


UNKNOWN = _Unknown()


def _closure(fn: Any, name: str) -> Any:
    if torch.compiler.is_compiling():
        # dynamo cannot read a closure's cells (torch 2.11 stops the trace: "does not know how to wrap
        # <class 'cell'>"; 2.13 cannot for a mask function built inside the graph): the pattern is then
        # unknown and the call takes transformers' dense mask, as any unrecognised pattern does
        raise ValueError("closure cells are not readable under torch.compile")
    code = fn.__code__
    return fn.__closure__[code.co_freevars.index(name)].cell_contents


class _Codes(NamedTuple):
    """transformers' causal mask function and the code objects of the closures its mask factories
    build: ``mask`` recognises a mask function by them."""

    causal: Any
    and_: Any  # and_masks(...)
    window: Any  # sliding_window_overlay(w)
    pack: Any  # packed_sequence_mask_function(ids), None before transformers had it
    remap: Any  # remap_positions_for_packed_sequence(fn, pos), None before transformers had it


_CODES: _Codes | None = None


def _codes() -> _Codes:
    """The ``_Codes`` of the installed transformers, built at the first call (``patch`` makes it: the
    mask function runs at every forward, and under torch.compile dynamo then reads a module global)."""
    global _CODES
    if _CODES is None:
        from transformers import masking_utils as mu
        pack = getattr(mu, "packed_sequence_mask_function", None)
        remap = getattr(mu, "remap_positions_for_packed_sequence", None)
        _CODES = _Codes(causal=mu.causal_mask_function, and_=mu.and_masks(mu.causal_mask_function).__code__,
                        window=mu.sliding_window_overlay(1).__code__,
                        pack=None if pack is None else pack(torch.zeros(1, 1)).__code__,
                        remap=None if remap is None else remap(mu.causal_mask_function, None).__code__)
    return _CODES


def _and_parts(fn: Any, c: Any) -> list | None:
    """The two mask functions an ``and_masks`` of two combines, else None."""
    if getattr(fn, "__code__", None) is not c.and_:
        return None
    parts = list(_closure(fn, "mask_functions"))
    return parts if len(parts) == 2 else None


def window_of(fn: Any) -> Any:
    """None for transformers' causal mask function, the window W (keys q-W < k <= q) for its sliding-
    window causal one, ``UNKNOWN`` for any other (recognised by code object: the patterns are exact)."""
    try:
        c = _codes()
        if fn is c.causal:
            return None
        parts = _and_parts(fn, c)
        if parts is not None and c.causal in parts:
            other = parts[1 - parts.index(c.causal)]
            if getattr(other, "__code__", None) is c.window:
                w = _closure(other, "sliding_window")
                if isinstance(w, int) and not isinstance(w, bool) and w > 0:
                    return w
    except (AttributeError, ValueError, TypeError, IndexError):  # another transformers' internals
        pass
    return UNKNOWN


def packed_of(fn: Any) -> Any:
    """The packed-sequence ids [B, S] when ``fn`` is transformers' causal mask within packed sequences
    (padding-free training: ``causal AND same sequence``, the causal part on positions remapped per
    sequence in newer versions, which is the same within a sequence: its positions step by one), else None."""
    try:
        c = _codes()
        parts = _and_parts(fn, c)
        if parts is None or c.pack is None:
            return None
        base, last = parts
        if getattr(last, "__code__", None) is not c.pack:
            return None
        if base is not c.causal:
            if c.remap is None or getattr(base, "__code__", None) is not c.remap:
                return None
            if _closure(base, "mask_function") is not c.causal:
                return None
        ids = _closure(last, "packed_sequence_mask")
        return ids if isinstance(ids, torch.Tensor) and ids.dim() == 2 else None
    except (AttributeError, ValueError, TypeError, IndexError):
        return None


def mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """kernelset's entry in transformers' ``AttentionMaskInterface`` (its arguments: those of
    ``sdpa_mask``). Causal without padding: None. A sliding window, or padding: a 2D bool tensor
    tagged ``_ks_window`` (W or None) and ``_ks_padded``. Any other pattern: SDPA's dense mask."""
    from transformers.masking_utils import flash_attention_mask, sdpa_mask
    window = window_of(kwargs.get("mask_function"))
    batch, kv_len, device = kwargs.get("batch_size"), kwargs.get("kv_length"), kwargs.get("device")
    # packed sequences need their offsets on the host (cu_seqlens, one sync): a compiled graph cannot
    # have them, and under compile transformers tags every no-cache call as packed (it cannot look at
    # position_ids there), so a compiled call gets the dense mask of the pattern, as SDPA's own does
    packed = packed_of(kwargs.get("mask_function")) if window is UNKNOWN and not torch.compiler.is_compiling() \
        else None
    if (packed is not None and not args and kwargs.get("attention_mask") is None and device is not None
            and isinstance(batch, int) and tuple(packed.shape) == (batch, kv_len)):
        m = torch.ones(batch, kv_len, dtype=torch.bool, device=device)
        m._ks_window, m._ks_padded, m._ks_packed = None, False, packed
        return m
    if window is UNKNOWN or args or not isinstance(batch, int) or not isinstance(kv_len, int):
        kwargs["allow_is_causal_skip"] = False
        return sdpa_mask(*args, **kwargs)
    if torch.compiler.is_compiling():
        # whether a key is padding is known only from the mask's values: a compiled graph keeps any
        # mask it is given (the dense path), as transformers' own SDPA mask does under compile
        given = kwargs.get("attention_mask")
        m = None if given is None else given[:, -kv_len:]
    else:
        m = flash_attention_mask(**kwargs)  # None, or the 2D mask when a key is padding
    padded = m is not None
    if m is None:
        if window is None:
            return None
        if device is None:
            kwargs["allow_is_causal_skip"] = False
            return sdpa_mask(**kwargs)
        m = torch.ones(batch, kv_len, dtype=torch.bool, device=device)
    m._ks_window, m._ks_padded = window, padded
    return m


def _cu_seqlens(tag: torch.Tensor, packed: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Sequence offsets over the [B * S] rows of a packed batch, and the longest sequence; computed
    once per forward (kept on the mask tensor all layers share: one host sync)."""
    got = getattr(tag, "_ks_cu", None)
    if got is None:
        b, s = packed.shape
        ids = (packed.to(torch.int64) + torch.arange(b, device=packed.device)[:, None] * (s + 1)).reshape(-1)
        starts = torch.nonzero(torch.diff(ids, prepend=ids[:1] - 1)).flatten()
        cu = torch.cat([starts, starts.new_tensor([ids.numel()])]).to(torch.int32)
        got = tag._ks_cu = (cu, int((cu[1:] - cu[:-1]).max()))
    return got


def _dense_packed(packed: torch.Tensor) -> torch.Tensor:
    """[B, 1, S, S] bool: causal within each packed sequence."""
    s = packed.shape[1]
    idx = torch.arange(s, device=packed.device)
    same = packed[:, :, None] == packed[:, None, :]
    return (same & (idx[None, :, None] >= idx[None, None, :]))[:, None]


def _dense_mask(mask2d: torch.Tensor | None, b: int, q_len: int, k_len: int, window: int | None,
                device: torch.device) -> torch.Tensor:
    """[B, 1, Sq, Sk] bool (True attends): causal aligned to the last key, window, padding."""
    qi = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    ki = torch.arange(k_len, device=device)[None, :]
    m = ki <= qi
    if window:
        m = m & (qi - ki < window)
    m = m[None, None].expand(b, 1, q_len, k_len)
    if mask2d is not None:
        m = m & mask2d[:, None, None, -k_len:].bool()
    return m


def _fallback(module, query, key, value, attention_mask, scaling, dropout, sliding_window, softcap, kwargs,
              weights=False):
    """transformers' own attention on a dense mask: SDPA, or the module's eager attention where SDPA
    cannot (softcap, sinks) or where the caller asked for the attention weights (``weights``). A 4D
    mask (transformers' own) is used as given; a 2D one is padding over causal + window."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    b, _, q_len, _ = query.shape
    if attention_mask is not None and attention_mask.dim() == 4:
        dense = attention_mask
    else:
        dense = _dense_mask(attention_mask, b, q_len, key.shape[2], sliding_window, query.device)
        if not bool(getattr(module, "is_causal", True)) and attention_mask is None:
            dense = torch.ones_like(dense)  # a non-causal module without a mask attends to every key
    if softcap is None and kwargs.get("s_aux") is None and not weights:
        return sdpa_attention_forward(module, query, key, value, dense, dropout=dropout, scaling=scaling, **kwargs)
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward")
    additive = dense if dense.dtype != torch.bool else torch.zeros(
        dense.shape, dtype=query.dtype, device=query.device).masked_fill(~dense, torch.finfo(query.dtype).min)
    return eager(module, query, key, value, additive, scaling=scaling, dropout=dropout, sliding_window=sliding_window,
                 softcap=softcap, **kwargs)


def make_attention(ops: Any = None):
    """The attention function transformers calls: (module, q, k, v [B, H, S, D], mask, ...) -> ([B, S, H, D], None).
    ``ops``: the ops it calls; None: those of the kernelize call that owns ``module`` (uncounted if none)."""
    fixed = ops

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None,
                  softcap=None, **kwargs):
        if fixed is None:
            ops = _OWNERS.get(module)
            if ops is None:
                from .patching import _PLAIN
                ops = _Uncounted(_PLAIN)
        else:
            ops = fixed
        sinks = kwargs.get("s_aux")
        weights = bool(kwargs.get("output_attentions", False))  # kernelset's kernels return no weights
        packed = None
        if attention_mask is not None and hasattr(attention_mask, "_ks_window"):
            # from ``mask``: the window transformers' mask has (authoritative), and whether keys are padding
            sliding_window = attention_mask._ks_window
            packed = getattr(attention_mask, "_ks_packed", None)
            if packed is not None and (query.shape[2] != key.shape[2] or weights or (module.training and dropout > 0.0)):
                attention_mask = _dense_packed(packed)  # the general path, on SDPA
                packed = None
            elif packed is not None:
                tag = attention_mask
                attention_mask = None
            elif not attention_mask._ks_padded:
                attention_mask = None
        if attention_mask is not None or (module.training and dropout > 0.0) or weights:
            ops.counts["attention_fallback"] += 1
            kwargs.pop("is_causal", None)
            return _fallback(module, query, key, value, attention_mask, scaling, dropout, sliding_window, softcap,
                             kwargs, weights)
        query, key, value = (t if t.stride(-1) == 1 else t.contiguous() for t in (query, key, value))
        if packed is not None:  # packed sequences: flash_attention_varlen over [B * S] rows, causal per sequence
            b, hq, s, d = query.shape
            cu, longest = _cu_seqlens(tag, packed)
            rows = [t.transpose(1, 2).reshape(b * s, t.shape[1], t.shape[3]) for t in (query, key, value)]
            out = ops.flash_attention_varlen(*rows, cu, cu, longest, longest, causal=True, scale=scaling,
                                             softcap=softcap or 0.0, sinks=sinks, check_bounds=False)
            return out.view(b, s, hq, value.shape[3]), None
        window = (sliding_window - 1, 0) if sliding_window else (-1, -1)
        # one query token with the mask aligned to the last key sees every key: not causal, which
        # lets the dispatcher take SDPA's decode kernels (cuDNN rejects bottom-right causal masks)
        causal = bool(getattr(module, "is_causal", True)) and query.shape[2] > 1
        # q, k, v as transformers holds them ([B, H, S, D]): a training call through SDPA then records
        # no transposes of ours; the output comes back [B, H, S, D] over [B, S, H, D] memory
        out = ops.flash_attention(query, key, value, causal=causal, scale=scaling, window=window,
                                  softcap=softcap or 0.0, sinks=sinks, layout="bhsd")
        out = (out[0] if isinstance(out, tuple) else out).transpose(1, 2)
        # [B, S, H, D] contiguous, as transformers' implementations return it (some models .view() it)
        return (out if out.is_contiguous() else out.contiguous()), None
    return attention


class _Uncounted:
    """Ops with a ``counts`` that nobody reads (attention modules of no kernelized model)."""

    def __init__(self, ops: Any) -> None:
        self._ops = ops
        self.counts: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ops, name)


def _configs(model: torch.nn.Module) -> list[Any]:
    """Every config whose attention implementation ``set_attn_implementation`` may change: the
    model's and its submodels', and their sub-configs (text_config, vision_config ...)."""
    out: dict[int, Any] = {}
    todo = [m.config for m in model.modules() if getattr(m, "config", None) is not None
            and hasattr(m.config, "_attn_implementation_internal")]
    while todo:
        cfg = todo.pop()
        if id(cfg) in out:
            continue
        out[id(cfg)] = cfg
        for key in getattr(cfg, "sub_configs", None) or ():
            sub = getattr(cfg, key, None)
            if sub is not None and hasattr(sub, "_attn_implementation_internal"):
                todo.append(sub)
    return list(out.values())


def _no_flash_support(model: torch.nn.Module) -> list[str]:
    """The model classes in ``model`` that do not declare FlashAttention support. kernelset's
    attention has FlashAttention's contract (no mask tensor without padding): transformers declares
    it per class (``_supports_flash_attn``, before 4.5x ``_supports_flash_attn_2``)."""
    from transformers import PreTrainedModel
    out = set()
    for m in model.modules():
        if isinstance(m, PreTrainedModel):
            cls = type(m)
            ok = getattr(cls, "_supports_flash_attn", None)
            if ok is None:
                ok = getattr(cls, "_supports_flash_attn_2", False)
            if not ok:
                out.add(cls.__name__)
    return sorted(out)


def has_attention(model: torch.nn.Module) -> bool:
    """Whether ``model`` has attention modules (a class named ``*Attention*``, as transformers names
    them); state-space models (Mamba, Mamba-2, xLSTM) have none, and the report says nothing of
    attention for them."""
    return any("Attention" in type(m).__name__ for m in model.modules())


def patch(handle: Any, model: torch.nn.Module, ops: frozenset[str] | None) -> None:
    """Register and select the "kernelset" attention implementation on ``model`` (undone by restore)."""
    from .patching import Patched, Skipped
    if not available() or not has_attention(model):
        return
    if ops is not None and "flash_attention" not in ops:
        handle.skipped.append(Skipped("attention", "config._attn_implementation", "not among the requested ops"))
        return
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(model, "set_attn_implementation"):
        handle.skipped.append(Skipped("attention", type(model).__name__, "not a transformers PreTrainedModel"))
        return
    unsupported = _no_flash_support(model)
    if unsupported:
        handle.skipped.append(Skipped("attention", ", ".join(unsupported),
                                      "declares no FlashAttention support (_supports_flash_attn): its attention "
                                      "code needs transformers' mask tensor"))
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    _codes()
    AttentionInterface.register(NAME, make_attention())
    AttentionMaskInterface.register(NAME, mask)
    previous = cfg._attn_implementation
    before = [(c, c._attn_implementation_internal) for c in _configs(model)]

    def undo() -> None:  # each config's own value back (a composite model's may differ per sub-config)
        for c, value in before:
            c._attn_implementation_internal = value
    handle._undo.append(undo)
    model.set_attn_implementation(NAME)
    if cfg._attn_implementation != NAME:
        handle.skipped.append(Skipped("attention", type(model).__name__,
                                      "the model does not let its attention implementation be set"))
        return
    handle._configs += before
    mods = [m for m in model.modules() if m not in _OWNERS]
    for m in mods:
        _OWNERS[m] = handle.ops

    def disown() -> None:
        for m in mods:
            _OWNERS.pop(m, None)
    handle._undo.append(disown)
    handle.patched.append(Patched("attention", "config._attn_implementation", f"{previous} -> {NAME}",
                                  ("flash_attention",)))


# ---- training: projections, rotation and attention with fewer autograd nodes ------------------

_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")


def _qkv_candidate(m: torch.nn.Module) -> bool:
    """A LLaMA-style attention module: plain q/k/v/o nn.Linear children without hooks, full causal
    attention (no sliding window, softcap, sinks or q/k norms), an int head_dim and a float scaling.
    The probe then checks that its forward computes what the fused one does."""
    from torch import nn
    lins = [getattr(m, a, None) for a in _PROJ]
    if not all(type(lin) is nn.Linear and not lin._forward_hooks and not lin._forward_pre_hooks for lin in lins):
        return False
    if any(hasattr(m, a) for a in ("q_norm", "k_norm", "sinks", "q_layernorm", "k_layernorm")):
        return False
    cfg = getattr(m, "config", None)
    # a window: the module's own attribute where it has one (set per layer: Qwen2, Gemma 2), else the
    # config's (Mistral passes config.sliding_window to the attention function); a probe of a few
    # tokens would not see a window
    window = m.sliding_window if hasattr(m, "sliding_window") else getattr(cfg, "sliding_window", None)
    return (window is None and getattr(m, "is_causal", True) is True
            and isinstance(getattr(m, "head_dim", None), int) and isinstance(getattr(m, "scaling", None), float)
            and not getattr(cfg, "attn_logit_softcapping", None) and hasattr(m, "attention_dropout"))


def _qkv_attention(m: torch.nn.Module, ops: Any, hidden: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor) -> torch.Tensor:
    """o_proj(attention(rope(q), rope(k), v)) with qkv_rope (one node) and flash_attention
    (layout="bhsd": no transposes recorded)."""
    q, k, v = ops.qkv_rope(hidden, m.q_proj.weight, m.k_proj.weight, m.v_proj.weight, cos, sin, head_dim=m.head_dim,
                           b_q=m.q_proj.bias, b_k=m.k_proj.bias, b_v=m.v_proj.bias)
    out = ops.flash_attention(q, k, v, causal=True, scale=m.scaling, layout="bhsd")
    return m.o_proj(out.transpose(1, 2).reshape(*hidden.shape[:-1], -1))


def _qkv_forward(m: torch.nn.Module, ops: Any, original: Any):
    from .mapping import unhooked

    def forward(hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None, cache=None,
                **kwargs):
        # a training call without padding, cache or dropout, on full-width rotary tables
        if (attention_mask is None and past_key_values is None and cache is None and position_embeddings is not None
                and torch.is_grad_enabled() and hidden_states.dim() == 3
                and (hidden_states.requires_grad or m.q_proj.weight.requires_grad)
                and not (m.training and m.attention_dropout > 0.0)
                and position_embeddings[0].shape[-1] == m.head_dim
                and unhooked(m.q_proj, m.k_proj, m.v_proj, m.o_proj)):
            return _qkv_attention(m, ops, hidden_states, *position_embeddings), None
        if past_key_values is not None:
            kwargs["past_key_values"] = past_key_values
        if cache is not None:
            kwargs["cache"] = cache
        return original(m, hidden_states, position_embeddings=position_embeddings, attention_mask=attention_mask,
                        **kwargs)
    return forward


def patch_qkv(handle: Any, model: torch.nn.Module, ops: frozenset[str] | None) -> None:
    """Training mode, with kernelset's attention registered: LLaMA-style attention modules whose
    forward the probe shows equal to ``_qkv_attention`` run it for training calls (qkv_rope +
    flash_attention + o_proj: ~10 fewer autograd nodes per layer than the module's code)."""
    from .patching import Mode, Patched, Skipped, _compare, _reference_only, _set_method, _PLAIN
    from ..core.tolerance import tolerance
    if handle.mode is not Mode.TRAINING or not available():
        return
    if ops is not None and not {"qkv_rope", "flash_attention"} <= ops:
        return
    if getattr(getattr(model, "config", None), "_attn_implementation", None) != NAME:
        return
    probed: dict[tuple, str | None] = {}
    for path, m in model.named_modules():
        if not _qkv_candidate(m):
            continue
        key = (type(m), m.q_proj.weight.shape, m.k_proj.weight.shape, m.head_dim, m.q_proj.bias is not None)
        if key not in probed:
            probed[key] = _probe_qkv(m, _compare, _reference_only, _PLAIN, tolerance)
        why = probed[key]
        if why is not None:
            handle.skipped.append(Skipped("attention_qkv", path, why))
            continue
        _set_method(handle, m, "forward", _qkv_forward(m, handle.ops, type(m).forward))
        handle.patched.append(Patched("attention_qkv", path, "q/k/v + rope one node, attention, o_proj (training "
                                      "calls)", ("qkv_rope", "flash_attention")))


def probe_inputs(weight: torch.Tensor, head_dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random hidden states [2, 5, weight.shape[1]] and rotary tables [2, 5, head_dim] (duplicated
    halves, as transformers' rotary modules return them) in the weight's dtype and device."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    hidden = torch.randn(2, 5, weight.shape[1], generator=g).to(device=weight.device, dtype=weight.dtype)
    ang = torch.randn(2, 5, head_dim // 2, generator=g) * 2
    cos = torch.cat([ang.cos()] * 2, -1).to(device=weight.device, dtype=weight.dtype)
    sin = torch.cat([ang.sin()] * 2, -1).to(device=weight.device, dtype=weight.dtype)
    return hidden, cos, sin


def _probe_qkv(m, compare, reference_only, plain, tolerance) -> str | None:
    """None when the module's own forward equals the fused one on random inputs (fp32 references),
    else why not."""
    p = m.q_proj.weight
    hidden, cos, sin = probe_inputs(p, m.head_dim, 0)
    try:
        with torch.no_grad(), reference_only():
            want = type(m).forward(m, hidden, position_embeddings=(cos, sin), attention_mask=None)[0]
            got = _qkv_attention(m, plain, hidden, cos, sin)
    except Exception as exc:
        return f"probe failed ({type(exc).__name__}: {exc})"
    err = compare(want, got) / tolerance("norm", p.dtype)
    return None if err <= 1.0 else f"its forward differs from q/k/v + rope + attention + o_proj (err/tol {err:.3g})"
