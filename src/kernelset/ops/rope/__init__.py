"""Rotary position embeddings: the serving-layout in-place rotation (vLLM semantics) and
transformers' apply_rotary_pos_emb (differentiable)."""
from .api import RotaryOutput, RotatedQK, apply_rotary, rotary_embedding

__all__ = ["RotaryOutput", "RotatedQK", "apply_rotary", "rotary_embedding"]
