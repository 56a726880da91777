"""Attention: paged decode / multi-token attention over the paged KV cache (GQA, split-KV, window,
softcap, sinks, fp8 KV), merging attention states, and the fp32 reference (dense and paged)."""
from .api import AttentionOutput, merge_attn_states, paged_attention

__all__ = ["AttentionOutput", "merge_attn_states", "paged_attention"]
