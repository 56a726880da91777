"""kernelset: fast GPU kernels for LLM inference and training behind one API.

    import kernelset as ks
    y = ks.rms_norm(x, w)            # the dispatcher picks the implementation
    ks.explain("rms_norm", x, w)     # ... and says why

Importing kernelset imports torch only; Triton and optional peers are imported when first used.
"""
from __future__ import annotations

from .core import AUTO, ArgumentError, ArgumentTypeError, Backend, KernelsetError, UnsupportedError, config
from .core.dispatch import Explanation, explain
from .core.registry import catalog
from . import ops as _ops
from .ops import optim
from .core.dispatch import check_forced_backends as _check_forced_backends

_check_forced_backends()  # every op is registered now: KS_BACKEND's family backend names are checked

__version__ = "0.1.0"

__all__ = ["AUTO", "ArgumentError", "ArgumentTypeError", "Backend", "Explanation", "KernelsetError", "UnsupportedError",
           "__version__", "catalog", "config", "explain", "optim"]
# every family's public names (ops/__init__.py finds the families): a new family needs no edit here
for _family in _ops.FAMILIES.values():
    for _name in getattr(_family, "PUBLIC", _family.__all__):
        globals()[_name] = getattr(_family, _name)
        __all__.append(_name)


def __getattr__(name: str):
    # ks.hf (HuggingFace integration) and ks.capi (the C library through ctypes) are imported on first
    # use, so `import kernelset` never imports transformers nor loads libkernelset.so
    if name in ("hf", "capi"):
        import importlib
        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
