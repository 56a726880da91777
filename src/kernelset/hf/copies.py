"""What a copy of a kernelized model holds: the plain model.

``copy.deepcopy`` (TRL's reference model, an EMA copy), ``pickle`` and ``torch.save(model)`` of a
kernelized model, or of any module ``kernelize`` touched, give the model as it was before
``kernelize``: its own forwards, no kernelset hooks, the attention implementation each config
had, no handle. The replacements are closures over the original modules (a copy would run the
original's weights) and the hooks and the handle hold thread-locals (which cannot be pickled at
all); a loaded or copied model is kernelized again by calling ``kernelize`` on it.

How: each touched module gets an instance ``__getstate__`` (pickle and the copy module take the
state from there) and an instance ``__deepcopy__`` (it wins over one a class defines, as
torch's parametrizations do) that build the module's usual state with kernelize's attributes put
back, its hooks left out, and every config kernelset changed replaced by a plain copy of it;
``restore()`` removes both. Configs themselves carry no such attribute (``to_dict`` would
serialize it); the plain copies are made once for all changed configs (a composite model's
sub-configs inside its config) and again when any attribute of any of them is set, so the copy's
modules share their configs as the original's do. Not covered: ``copy.copy`` (a shallow copy
shares the patched children) and a config pickled on its own.
"""
from __future__ import annotations

import copy
import functools
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    from .patching import Kernelized

# Module attributes keyed by hook id (torch 2.x): where a hook kernelize registered is listed
_HOOK_DICTS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
               "_forward_hooks_with_kwargs", "_forward_hooks_always_called")
_OWN = ("__getstate__", "__deepcopy__", "_ks_kernelized")  # instance attributes that are kernelize's alone


def guarded(model: nn.Module) -> str | None:
    """The name of a module of ``model`` (``""``: the model itself) that a kernelize handle has
    touched and not restored, or None: kernelize refuses to patch a model twice over."""
    for name, m in model.named_modules():
        get = m.__dict__.get("__getstate__")
        if isinstance(get, functools.partial) and isinstance(getattr(get.func, "__self__", None), PlainCopies):
            return name
    return None


class PlainCopies:
    """Installs the plain-state ``__getstate__`` / ``__deepcopy__`` on every module a handle touched."""

    def __init__(self, handle: "Kernelized") -> None:
        self.handle = handle
        self._lock = threading.Lock()  # two pickles at once (a checkpoint thread) build one set of configs
        self._seen: list[tuple[Any, tuple, tuple]] = []  # (config, its attribute names, their values) then
        self._plain: dict[int, Any] = {}  # id(config): its plain copy

    def install(self) -> None:
        h = self.handle
        changed = {id(c) for c, _ in h._configs}
        # the modules kernelize changed, and those holding a config it changed (attention layers)
        holders = [m for m in h.model.modules() if changed and any(id(v) in changed for v in m.__dict__.values())]
        seen: set[int] = set()
        for m in (h.model, *(m for m, *_ in h._attrs), *(m for m, _ in h._hooks), *holders):
            if id(m) in seen:
                continue
            seen.add(id(m))
            object.__setattr__(m, "__getstate__", functools.partial(self.state, m))
            object.__setattr__(m, "__deepcopy__", functools.partial(self.deepcopy, m))
            h._undo.append(functools.partial(_drop, m))

    def state(self, m: nn.Module) -> dict:
        """``m``'s state for pickle, as the plain module's: its class's state (a class may refuse,
        as a parametrized module's does), cleaned."""
        return self._clean(m, dict(type(m).__getstate__(m)))

    def _clean(self, m: nn.Module, state: dict) -> dict:
        """``state`` (a new dict of ``m``'s attributes) with kernelize's changes to ``m`` undone."""
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
            plain = self.plain_configs()
            for key, value in state.items():
                if id(value) in plain:
                    state[key] = plain[id(value)]
        return state

    def deepcopy(self, m: nn.Module, memo: dict) -> nn.Module:
        """``copy.deepcopy`` of ``m``: a new module built from its plain state, as the copy module's
        own reconstruction does."""
        c = type(m).__new__(type(m))
        memo[id(m)] = c
        state = dict(m.__dict__)  # what Module.__getstate__ returns, which copy's reconstruction uses
        state.pop("_compiled_call_impl", None)
        state = copy.deepcopy(self._clean(m, state), memo)
        setstate = getattr(c, "__setstate__", None)
        if setstate is not None:
            setstate(state)
        else:
            c.__dict__.update(state)
        return c

    def plain_configs(self) -> dict[int, Any]:
        """id(config) -> its plain copy (the attention implementation it had before kernelize), for
        every config kernelize changed, sub-configs replaced by their plain copies."""
        with self._lock:
            now = [(c, tuple(c.__dict__), tuple(c.__dict__.values())) for c, _ in self.handle._configs]
            fresh = len(now) == len(self._seen) and all(
                c is c0 and k == k0 and all(a is b for a, b in zip(v, v0))
                for (c, k, v), (c0, k0, v0) in zip(now, self._seen))
            if not fresh:
                plain = {}
                for cfg, before in self.handle._configs:
                    p = object.__new__(type(cfg))
                    p.__dict__.update(cfg.__dict__)
                    p.__dict__["_attn_implementation_internal"] = before
                    plain[id(cfg)] = p
                for p in plain.values():  # a composite config's sub-configs: their plain copies
                    for key, value in p.__dict__.items():
                        if id(value) in plain and plain[id(value)] is not p:
                            p.__dict__[key] = plain[id(value)]
                self._plain, self._seen = plain, now
            return self._plain


def _drop(m: nn.Module) -> None:
    m.__dict__.pop("__getstate__", None)
    m.__dict__.pop("__deepcopy__", None)
