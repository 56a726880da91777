"""Rotary position embeddings: the scaled tables (rope_cache), the serving-layout in-place
rotations (rotary_embedding, mrope, qk_norm_rope; vLLM semantics) and transformers'
apply_rotary_pos_emb (apply_rotary, differentiable)."""
from .api import QKNormCast, RotaryOutput, RotatedQK, apply_rotary, mrope, qk_norm_rope, rotary_embedding
from .cache import RopeCache, rope_cache

__all__ = ["QKNormCast", "RopeCache", "RotaryOutput", "RotatedQK", "apply_rotary", "mrope", "qk_norm_rope",
           "rope_cache", "rotary_embedding"]
