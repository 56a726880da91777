"""Op families. Importing one declares its ops in the registry and registers its implementations."""
from . import activation, norm, softmax

__all__ = ["activation", "norm", "softmax"]
