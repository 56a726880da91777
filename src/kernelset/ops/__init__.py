"""Op families. Importing one declares its ops in the registry and registers its implementations."""
from . import activation, loss, norm, softmax

__all__ = ["activation", "loss", "norm", "softmax"]
