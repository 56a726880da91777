"""Paged KV cache: write tokens to their slots (bf16/fp16/fp32 or fp8 e4m3 with per-tensor scales),
copy blocks within a cache, swap blocks across devices."""
from .api import copy_blocks, reshape_and_cache, swap_blocks

__all__ = ["copy_blocks", "reshape_and_cache", "swap_blocks"]
