"""Attention: dense and varlen prefill (flash_attention, flash_attention_varlen: Triton forward and
backward, SDPA / flash_attn candidates chosen from a measured table), paged decode / multi-token
attention over the paged KV cache (GQA, split-KV, window, softcap, sinks, fp8 KV), merging attention
states, and the fp32 reference (dense, varlen and paged)."""
from .api import AttentionOutput, flash_attention, flash_attention_varlen, merge_attn_states, paged_attention
from .backends import AttnBackend

__all__ = ["AttentionOutput", "AttnBackend", "flash_attention", "flash_attention_varlen", "merge_attn_states",
           "paged_attention"]
