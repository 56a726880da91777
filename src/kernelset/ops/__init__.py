"""Op families, one subpackage each. Importing a family declares its ops in the registry and registers
their implementations; its ``__all__`` is what ``kernelset`` exports from it (``PUBLIC`` where the
top-level names differ: optim's AdamW stays ``ks.optim.AdamW``). A new family folder is found here
by itself: no list to edit. ``common/`` (launch machinery) and ``quant/`` (number formats, until it
declares ops) define no ``__all__`` and are not families."""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

FAMILIES: dict[str, ModuleType] = {}
for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _info.ispkg:
        _module = importlib.import_module(f"{__name__}.{_info.name}")
        if getattr(_module, "__all__", None):
            FAMILIES[_info.name] = _module

__all__ = sorted(FAMILIES)
