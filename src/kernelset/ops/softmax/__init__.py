"""softmax and log_softmax with temperature, forward and backward, rows up to 262144 and beyond."""
from .api import log_softmax, softmax

__all__ = ["log_softmax", "softmax"]
