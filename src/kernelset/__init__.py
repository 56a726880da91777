"""kernelset: fast GPU kernels for LLM inference and training behind one API.

    import kernelset as ks
    y = ks.rms_norm(x, w)            # the dispatcher picks the implementation
    ks.explain("rms_norm", x, w)     # ... and says why

Importing kernelset imports torch only; Triton and optional peers are imported when first used.
"""
from __future__ import annotations

from .core import AUTO, ArgumentError, ArgumentTypeError, Backend, KernelsetError, UnsupportedError, config
from .core.dispatch import Explanation, explain
from .core.registry import catalog
from .ops.activation import GeluApprox, gated_mlp, gelu, gelu_and_mul, silu_and_mul, swiglu, swiglu_oai
from .ops.embedding import embedding
from .ops.loss import Reduction, cross_entropy
from .ops.loss import linear_cross_entropy
from .ops.norm import AddNormOutput, NormCast, fused_add_rms_norm, layer_norm, rms_norm
from .ops.rope import (QKV, QKNormCast, RopeCache, RotaryOutput, RotatedQK, apply_rotary, mrope, qk_norm_rope,
                       qkv_rope, rope_cache, rotary_embedding)
from .ops.softmax import log_softmax, softmax
from .ops import optim
from .ops.optim import clip_grad_norm_
from .ops.attention import AttentionOutput, merge_attn_states, paged_attention
from .ops.attention import AttnBackend, flash_attention, flash_attention_varlen
from .ops.kvcache import copy_blocks, reshape_and_cache, swap_blocks
from .ops.mla import mla_decode

from .core.dispatch import check_forced_backends as _check_forced_backends

_check_forced_backends()  # every op is registered now: KS_BACKEND's family backend names are checked

__version__ = "0.1.0"

__all__ = [
    "AUTO", "AddNormOutput", "apply_rotary", "ArgumentError", "ArgumentTypeError", "Backend", "Explanation", "GeluApprox",
    "KernelsetError", "NormCast", "Reduction", "RotaryOutput", "RotatedQK", "UnsupportedError", "__version__", "catalog", "config", "explain",
    "cross_entropy", "embedding", "fused_add_rms_norm", "gelu", "gelu_and_mul", "layer_norm", "log_softmax", "rms_norm", "rotary_embedding", "silu_and_mul", "softmax",
    "mrope", "qk_norm_rope", "rope_cache", "QKNormCast", "RopeCache", "qkv_rope", "QKV",
    "swiglu", "swiglu_oai", "gated_mlp",
    "linear_cross_entropy",
    "optim", "clip_grad_norm_",
    "AttentionOutput", "merge_attn_states", "paged_attention", "copy_blocks", "reshape_and_cache", "swap_blocks",
    "AttnBackend", "flash_attention", "flash_attention_varlen", "mla_decode",
]


def __getattr__(name: str):
    # ks.hf (HuggingFace integration) and ks.capi (the C library through ctypes) are imported on first
    # use, so `import kernelset` never imports transformers nor loads libkernelset.so
    if name in ("hf", "capi"):
        import importlib
        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
