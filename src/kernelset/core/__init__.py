"""kernelset core: registry, dispatcher, flags, checks. Imports only torch."""
from . import checks, config, dispatch, registry, tolerance
from .enums import AUTO, Backend
from .errors import ArgumentError, ArgumentTypeError, KernelsetError, UnsupportedError

__all__ = ["AUTO", "ArgumentError", "ArgumentTypeError", "Backend", "KernelsetError", "UnsupportedError",
           "checks", "config", "dispatch", "registry", "tolerance"]
