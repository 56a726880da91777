"""Gated activations (SwiGLU, GeGLU, gpt-oss clamped SwiGLU) and GELU, forward and backward."""
from .api import GeluApprox, gelu, gelu_and_mul, silu_and_mul, swiglu, swiglu_oai

__all__ = ["GeluApprox", "gelu", "gelu_and_mul", "silu_and_mul", "swiglu", "swiglu_oai"]
