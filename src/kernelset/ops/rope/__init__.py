"""Rotary position embeddings. So far: the serving-layout in-place rotation (vLLM semantics)."""
from .api import RotaryOutput, rotary_embedding

__all__ = ["RotaryOutput", "rotary_embedding"]
