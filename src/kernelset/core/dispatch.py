"""The dispatcher: picks an implementation per problem and explains the choice.

AUTO walks the implementations in priority order and takes the first whose backend is not
disabled, whose module imports, whose arch range covers the device and whose ``supports``
passes; the reference is last and always works. The decision is cached per problem key, so a
repeated call costs a dict lookup. A named backend (argument or ``KS_BACKEND``) runs or raises
:class:`UnsupportedError`; it never falls back.
"""
from __future__ import annotations

import dataclasses
import inspect
import os
import sys
from typing import Any

from . import config
from .enums import AUTO, Backend, KsEnum
from .errors import UnsupportedError
from .registry import _IMPLS, _OPS, Impl, OpSpec, Problem, impls, op

_cache: dict[tuple, Impl] = {}
config.on_change(_cache.clear)


def clear_cache() -> None:
    _cache.clear()


def _check_forced_ops() -> None:
    """KS_BACKEND naming an op that does not exist is a typo that would silently do nothing."""
    unknown = sorted(set(config.get().backend) - set(_OPS))
    if unknown:
        raise ValueError(f"KS_BACKEND names unknown op(s) {', '.join(unknown)}; declared ops: {', '.join(sorted(_OPS))}")


def check_forced_backends() -> None:
    """KS_BACKEND entries that are not core backends must name one of their op's implementations
    (``kernelset`` runs this once every op is registered, so a typo stops the import as a core
    backend's typo does while the environment is parsed)."""
    for name, forced in config.get().backend.items():
        if isinstance(forced, str) and name in _OPS:
            try:
                _forced(_OPS[name])
            except ValueError as exc:
                raw = os.environ.get("KS_BACKEND", "")
                raise ValueError(f"environment variable KS_BACKEND={raw!r}: {exc}") from None


def _forced(spec: OpSpec) -> Backend | KsEnum | None:
    """KS_BACKEND's entry for this op: a core Backend, or a name of one of the op's own
    implementations (kept as a string by the config, which loads before the registry)."""
    forced = config.get().backend.get(spec.name)
    if not isinstance(forced, str):
        return forced
    for i in _IMPLS.get(spec.name, ()):
        if i.backend.value == forced:
            return i.backend
    valid = ", ".join(repr(v) for v in dict.fromkeys([*(b.value for b in Backend),
                                                      *(str(i.backend) for i in impls(spec.name))]))
    raise ValueError(f"KS_BACKEND backend for {spec.name} must be one of {valid}, got {forced!r}")


def _requested(spec: OpSpec, backend: object) -> Backend | KsEnum | None:
    """The backend a call names (argument first, then KS_BACKEND), None for AUTO. A name is a
    core :class:`Backend` or the backend of one of this op's implementations (the attention
    family registers SDPA's backends under names of its own)."""
    _check_forced_ops()
    if isinstance(backend, Backend):
        return backend
    if isinstance(backend, str):
        name = backend.strip().lower()
        if name == AUTO:
            return _forced(spec)
        for b in (*Backend, *(i.backend for i in _IMPLS.get(spec.name, ()))):
            if b.value == name:
                return b
    valid = ", ".join(dict.fromkeys([AUTO, *(b.value for b in Backend), *(str(i.backend) for i in impls(spec.name))]))
    raise ValueError(f"{spec.name}: argument 'backend' must be one of {valid}, got {backend!r}")


def rejection(impl: Impl, problem: Problem, *, backward: bool = False) -> str | None:
    """Why ``impl`` cannot run ``problem`` (None if it can). Never raises."""
    if backward and impl.backward is None:
        return "has no backward"
    missing = impl.availability()
    if missing:
        return missing
    reason = impl.arch.check(problem.arch)
    if reason:
        return reason
    try:
        return impl.supports(problem)
    except Exception as exc:  # a buggy supports() must not take the call down
        return f"supports() raised {type(exc).__name__}: {exc}"


def _resolve(spec: OpSpec, requested: Backend | KsEnum | None, problem: Problem, backward: bool) -> Impl:
    cfg = config.get()
    candidates = impls(spec.name)
    if requested is not None:
        impl = next((i for i in candidates if i.backend == requested), None)
        if impl is None:
            have = ", ".join(str(i.backend) for i in candidates)
            raise UnsupportedError(spec.name, str(requested), f"no such implementation (have: {have})")
        disabled = cfg.disabled_reason(requested)
        if disabled:
            raise UnsupportedError(spec.name, str(requested), disabled)
        reason = rejection(impl, problem, backward=backward)
        if reason:
            raise UnsupportedError(spec.name, str(requested), reason)
        if cfg.log_dispatch:
            print(f"[kernelset] {problem.describe()}{' backward' if backward else ''} -> {impl.backend}"
                  " (requested)", file=sys.stderr)
        return impl
    reasons = []
    for impl in candidates:
        reason = cfg.disabled_reason(impl.backend) or rejection(impl, problem, backward=backward)
        if reason is None:
            if cfg.log_dispatch:
                skipped = "; ".join(f"{b}: {r}" for b, r in reasons) or "none"
                print(f"[kernelset] {problem.describe()}{' backward' if backward else ''} -> {impl.backend}"
                      f" (rejected: {skipped})", file=sys.stderr)
            return impl
        reasons.append((impl.backend, reason))
    detail = "; ".join(f"{b}: {r}" for b, r in reasons)
    raise UnsupportedError(spec.name, AUTO, f"no implementation supports {problem.describe()} ({detail})")


def select(name: str, backend: str | Backend, args: tuple, kwargs: dict, *, backward: bool = False) -> Impl:
    """The implementation to run for this call; cached per (configuration, op, request, problem key).

    The configuration's generation is part of the key: a decision made under another
    configuration (a ``config.override`` entered by another thread while this one decided) is
    never found again, even when it is stored after the change cleared the cache."""
    spec = _OPS.get(name) or op(name)
    ck = (config.generation(), name, backend, backward, spec.key(*args, **kwargs))
    try:
        impl = _cache.get(ck)
    except TypeError:  # an unhashable backend argument: the error that lists the valid names
        _requested(spec, backend)
        raise
    if impl is None:
        problem = spec.problem(*args, **kwargs)
        impl = _resolve(spec, _requested(spec, backend), problem, backward)
        _cache[ck] = impl
    return impl


@dataclasses.dataclass(frozen=True)
class Candidate:
    backend: Backend
    priority: int
    status: str  # "chosen" | "rejected" | "supported" (would run, lower priority)
    reason: str | None


@dataclasses.dataclass(frozen=True)
class Explanation:
    op: str
    problem: Problem
    requested: Backend | KsEnum | None
    chosen: Backend | KsEnum | None
    candidates: tuple[Candidate, ...]
    error: str | None = None

    def __str__(self) -> str:
        lines = [f"{self.problem.describe()}",
                 f"request: {self.requested or AUTO}; chosen: {self.chosen or 'none'}"]
        if self.error:
            lines.append(f"error: {self.error}")
        width = max(len(str(c.backend)) for c in self.candidates) if self.candidates else 8
        for c in self.candidates:
            mark = {"chosen": "->", "rejected": " x", "supported": " ."}[c.status]
            why = f"  {c.reason}" if c.reason else ""
            lines.append(f"  {mark} {str(c.backend):<{width}}  prio {c.priority:>4}  {c.status}{why}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Explanation(op={self.op!r}, chosen={str(self.chosen) if self.chosen else None!r})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op, "problem": self.problem.describe(),
            "requested": str(self.requested) if self.requested else AUTO,
            "chosen": str(self.chosen) if self.chosen else None, "error": self.error,
            "candidates": [{"backend": str(c.backend), "priority": c.priority, "status": c.status,
                            "reason": c.reason} for c in self.candidates],
        }


def explain(name: str, *args: Any, backend: str | Backend = AUTO, backward: bool = False,
            verbose: bool = True, **kwargs: Any) -> Explanation:
    """Ordered candidates for this call, which one wins, and why each other was rejected."""
    spec = op(name)
    requested = _requested(spec, backend)
    if "request" in inspect.signature(spec.problem).parameters:
        # as the family's own select tells its problem function (the attention ops: a named
        # backend is not held to AUTO's measured table or its decode rules), so that explain
        # judges the call that runs
        auto = isinstance(backend, str) and backend.strip().lower() == AUTO
        kwargs.setdefault("request", AUTO if auto else str(requested))
    problem = spec.problem(*args, **kwargs)
    chosen, error = None, None
    try:
        chosen = _resolve(spec, requested, problem, backward).backend
    except UnsupportedError as exc:
        error = str(exc)
    cfg = config.get()
    cands = []
    for impl in impls(name):
        reason = cfg.disabled_reason(impl.backend) or rejection(impl, problem, backward=backward)
        if impl.backend == chosen:
            status = "chosen"
            reason = impl.detail(problem) if impl.detail is not None else None
        elif reason is None:
            status = "supported"
            if requested is not None:
                reason = f"not requested (request: {requested})"
            else:
                reason = f"lower priority than {chosen}"
        else:
            status = "rejected"
        cands.append(Candidate(impl.backend, impl.priority, status, reason))
    exp = Explanation(name, problem, requested, chosen, tuple(cands), error)
    if verbose:
        print(exp)
    return exp
