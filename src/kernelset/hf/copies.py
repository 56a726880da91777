"""What a copy of a kernelized model holds: the plain model.

``copy.deepcopy`` (TRL's reference model, an EMA copy), ``pickle`` and ``torch.save(model)`` of a
kernelized model, or of any module ``kernelize`` touched, give the model as it was before
``kernelize``: its own forwards, no kernelset hooks, the attention implementation each config
had, no handle. The replacements are closures over the original modules (a copy would run the
original's weights) and the hooks and the handle hold thread-locals (which cannot be pickled at
all); a loaded or copied model is kernelized again by calling ``kernelize`` on it.

How: each touched module gets an instance ``__getstate__`` (Python's copy and pickle protocols
take the state from there; ``restore()`` removes it) that returns the module's usual state with
kernelize's attributes put back, its hooks left out, and every config kernelset changed replaced
by a plain copy of it. Configs themselves carry no such attribute (``to_dict`` would serialize
it); one plain copy per config, made again when the config changed, keeps the copy's modules
sharing one config as the original's do.
"""
from __future__ import annotations

import functools
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    from .patching import Kernelized

# Module attributes keyed by hook id (torch 2.x): where a hook kernelize registered is listed
_HOOK_DICTS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
               "_forward_hooks_with_kwargs", "_forward_hooks_always_called")
_OWN = ("__getstate__", "_ks_kernelized")  # instance attributes that are kernelize's alone


class PlainCopies:
    """Installs the plain-state ``__getstate__`` on every module a handle touched (``install``)."""

    def __init__(self, handle: "Kernelized") -> None:
        self.handle = handle
        self._plain_cfg: dict[int, tuple[dict, Any]] = {}  # id(config): (its __dict__ then, plain copy)

    def install(self) -> None:
        h = self.handle
        changed = {id(c) for c, _ in h._configs}
        # the modules kernelize changed, and those holding a config it changed (attention layers)
        holders = [m for m in h.model.modules() if changed and any(id(v) in changed for v in m.__dict__.values())]
        seen: set[int] = set()
        for m in (h.model, *(m for m, *_ in h._attrs), *(m for m, _ in h._hooks), *holders):
            if id(m) in seen or "__getstate__" in m.__dict__:
                continue
            seen.add(id(m))
            object.__setattr__(m, "__getstate__", functools.partial(self.state, m))
            h._undo.append(functools.partial(m.__dict__.pop, "__getstate__", None))

    def state(self, m: nn.Module) -> dict:
        """``m``'s state as the plain module's: a new dict (the module is not changed)."""
        state = dict(type(m).__getstate__(m))
        for name in _OWN:
            state.pop(name, None)
        h = self.handle
        for mod, name, had, old in h._attrs:
            if mod is m:
                if had:
                    state[name] = old
                else:
                    state.pop(name, None)
        ids = {hid for mod, hid in h._hooks if mod is m}
        for key in _HOOK_DICTS:
            hooks = state.get(key)
            if ids and hooks and any(i in hooks for i in ids):
                state[key] = OrderedDict((i, v) for i, v in hooks.items() if i not in ids)
        if h._configs:
            for key, value in state.items():
                plain = self.plain_config(value)
                if plain is not value:
                    state[key] = plain
        return state

    def plain_config(self, cfg: Any) -> Any:
        """The plain copy of ``cfg`` where kernelize changed its attention implementation (with its
        sub-configs' plain copies in it); anything else as it is."""
        before = {id(c): v for c, v in self.handle._configs}
        if id(cfg) not in before:
            return cfg
        now = dict(cfg.__dict__)
        cached = self._plain_cfg.get(id(cfg))
        if cached is not None and cached[0].keys() == now.keys() and all(now[k] is v for k, v in cached[0].items()):
            return cached[1]  # no attribute of the config was set since
        plain = object.__new__(type(cfg))
        plain.__dict__.update(now)
        plain.__dict__["_attn_implementation_internal"] = before[id(cfg)]
        for key, value in now.items():
            if id(value) in before and value is not cfg:
                plain.__dict__[key] = self.plain_config(value)
        self._plain_cfg[id(cfg)] = (now, plain)
        return plain
