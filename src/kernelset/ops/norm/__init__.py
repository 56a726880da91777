"""The norm family: RMSNorm (with fused residual add) and LayerNorm, forward and backward."""
from .api import AddNormOutput, NormCast, fused_add_rms_norm, layer_norm, rms_norm

__all__ = ["AddNormOutput", "NormCast", "fused_add_rms_norm", "layer_norm", "rms_norm"]
