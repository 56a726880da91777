"""Rotary position embeddings: the scaled tables (rope_cache), the serving-layout in-place
rotations (rotary_embedding, mrope, qk_norm_rope; vLLM semantics) and transformers'
apply_rotary_pos_emb (apply_rotary, differentiable); attention's q/k/v projections and rotation
as one autograd node (qkv_rope)."""
from .api import QKNormCast, RotaryOutput, RotatedQK, apply_rotary, mrope, qk_norm_rope, rotary_embedding
from .cache import RopeCache, rope_cache
from .qkv import QKV, qkv_rope

__all__ = ["QKNormCast", "QKV", "RopeCache", "RotaryOutput", "RotatedQK", "apply_rotary", "mrope", "qk_norm_rope",
           "qkv_rope", "rope_cache", "rotary_embedding"]
