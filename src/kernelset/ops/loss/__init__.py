"""Losses: fused cross-entropy (label smoothing, z-loss, logit softcap, ignore_index)."""
from .api import Reduction, cross_entropy
from .linear import linear_cross_entropy

__all__ = ["Reduction", "cross_entropy", "linear_cross_entropy"]
