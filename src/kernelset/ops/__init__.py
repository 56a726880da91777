"""Op families. Importing one declares its ops in the registry and registers its implementations."""
from . import norm

__all__ = ["norm"]
