"""kernelset as a transformers attention implementation ("kernelset"), when ``ks.flash_attention`` exists.

Registered through transformers' ``AttentionInterface`` with the FlashAttention mask function (None
unless there is padding), so prefill and cached decode both come here:

- no padding (the mask function returns None): ``flash_attention(causal, window, softcap, sinks,
  layout="bhsd")`` on q ``[B, H, Sq, D]`` and the cache's k/v, prefill and decode alike (kernelset's causal
  mask and window are bottom-right aligned, as transformers' are with a cache);
- padding or dropout in training: transformers' own SDPA (eager with softcap or sinks) with an
  explicit mask, counted as ``attention_fallback``.

When this build of kernelset has no ``flash_attention`` the model keeps its attention and the
kernelize report says so.
"""
from __future__ import annotations

import sys
from typing import Any

import torch

NAME = "kernelset"


def available() -> bool:
    import kernelset as ks
    return hasattr(ks, "flash_attention")


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


def _fallback(module, query, key, value, attention_mask, scaling, dropout, sliding_window, softcap, kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    b, _, q_len, _ = query.shape
    dense = _dense_mask(attention_mask, b, q_len, key.shape[2], sliding_window, query.device)
    if softcap is None and kwargs.get("s_aux") is None:
        return sdpa_attention_forward(module, query, key, value, dense, dropout=dropout, scaling=scaling, **kwargs)
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward")
    additive = torch.zeros(dense.shape, dtype=query.dtype, device=query.device).masked_fill(
        ~dense, torch.finfo(query.dtype).min)
    return eager(module, query, key, value, additive, scaling=scaling, dropout=dropout, sliding_window=sliding_window,
                 softcap=softcap, **kwargs)


def make_attention(ops: Any):
    """The attention function transformers calls: (module, q, k, v [B, H, S, D], mask, ...) -> ([B, S, H, D], None)."""
    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None,
                  softcap=None, **kwargs):
        sinks = kwargs.get("s_aux")
        if attention_mask is not None or (module.training and dropout > 0.0):
            ops.counts["attention_fallback"] += 1
            kwargs.pop("is_causal", None)
            return _fallback(module, query, key, value, attention_mask, scaling, dropout, sliding_window, softcap,
                             kwargs)
        window = (sliding_window - 1, 0) if sliding_window else (-1, -1)
        # one query token with the mask aligned to the last key sees every key: not causal, which
        # lets the dispatcher take SDPA's decode kernels (cuDNN rejects bottom-right causal masks)
        causal = bool(getattr(module, "is_causal", True)) and query.shape[2] > 1
        # q, k, v as transformers holds them ([B, H, S, D]): a training call through SDPA then records
        # no transposes of ours; the output comes back [B, H, S, D] over [B, S, H, D] memory
        out = ops.flash_attention(query, key, value, causal=causal, scale=scaling, window=window,
                                  softcap=softcap or 0.0, sinks=sinks, layout="bhsd")
        out = out[0] if isinstance(out, tuple) else out
        return out.transpose(1, 2), None
    return attention


def patch(handle: Any, model: torch.nn.Module, ops: frozenset[str] | None) -> None:
    """Register and select the "kernelset" attention implementation on ``model`` (undone by restore)."""
    from .patching import Patched, Skipped
    if not available():
        return
    if ops is not None and "flash_attention" not in ops:
        handle.skipped.append(Skipped("attention", "config._attn_implementation", "not among the requested ops"))
        return
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(model, "set_attn_implementation"):
        handle.skipped.append(Skipped("attention", type(model).__name__, "not a transformers PreTrainedModel"))
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    AttentionInterface.register(NAME, make_attention(handle.ops))
    AttentionMaskInterface.register(NAME, flash_attention_mask)
    previous = cfg._attn_implementation
    model.set_attn_implementation(NAME)
    if cfg._attn_implementation != NAME:
        handle.skipped.append(Skipped("attention", type(model).__name__,
                                      "the model does not let its attention implementation be set"))
        return
    handle._undo.append(lambda: model.set_attn_implementation(previous))
    handle.patched.append(Patched("attention", "config._attn_implementation", f"{previous} -> {NAME}",
                                  ("flash_attention",)))
