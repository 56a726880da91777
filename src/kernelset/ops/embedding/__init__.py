"""Embedding lookup with a deterministic backward."""
from .api import embedding

__all__ = ["embedding"]
