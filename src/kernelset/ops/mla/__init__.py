"""MLA decode (DeepSeek-V2/V3 multi-head latent attention, weight-absorbed) over a paged latent
cache: Triton kernel with a head tile per program and split-KV, and the fp32 reference."""
from .api import mla_decode

__all__ = ["mla_decode"]
