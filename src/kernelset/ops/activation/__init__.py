"""Gated activations (SwiGLU, GeGLU, gpt-oss clamped SwiGLU) and GELU, forward and backward; the
gated MLP (three products and the activation) as one autograd node."""
from .api import GeluApprox, gelu, gelu_and_mul, silu_and_mul, swiglu, swiglu_oai
from .mlp import gated_mlp

__all__ = ["GeluApprox", "gated_mlp", "gelu", "gelu_and_mul", "silu_and_mul", "swiglu", "swiglu_oai"]
