"""The op registry: the single source of truth for what kernelset provides.

Each logical op is declared once with :func:`declare_op` (name, family, signature, fp32
reference, tolerance class, byte/FLOP model, benchmark shapes, C-ABI flag, and how to describe
a call as a :class:`Problem`). Each implementation is an :class:`Impl` record added with
:func:`register_impl`. Dispatch, ``ksctl list``, ``ksctl bench``, the tests and the docs
catalog all read from here.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Mapping

import torch

from .arch import ANY_ARCH, Arch, ArchRange
from .enums import Backend


@dataclasses.dataclass(frozen=True)
class Problem:
    """One call described for the dispatcher: where it runs and the facts ``supports`` needs."""

    op: str
    device: torch.device
    dtype: torch.dtype
    shape: tuple[int, ...]
    arch: Arch | None = None
    attrs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        return self.attrs[name]

    def describe(self) -> str:
        dt = str(self.dtype).replace("torch.", "")
        arch = f" sm_{self.arch[0]}{self.arch[1]}" if self.arch else ""
        extra = " ".join(f"{k}={v}" for k, v in self.attrs.items())
        shape = "x".join(map(str, self.shape))
        return f"{self.op} [{shape}] {dt} on {self.device}{arch}" + (f" ({extra})" if extra else "")


@dataclasses.dataclass(frozen=True)
class Cost:
    """Fewest bytes the op must move and the FLOPs it must do (for % of ceiling)."""

    bytes: int
    flops: int = 0
    model: str = ""  # in words: "read x and w, write y"


@dataclasses.dataclass(frozen=True)
class BenchCase:
    """One benchmark case: a shape, a mode and the bar it is held to (None if no bar)."""

    shape: tuple[int, ...]
    mode: str = "fwd"  # fwd | fwd+bwd
    dtype: torch.dtype = torch.bfloat16
    bar_pct: float | None = None  # minimum % of the ceiling
    sweep: bool = False  # part of the hidden-size sweep plotted
    # time every implementation replayed from a CUDA graph (as serving engines run decode steps),
    # so microsecond-scale kernels are not measured as host launch overhead
    graph: bool = False


@dataclasses.dataclass(frozen=True)
class OpSpec:
    name: str
    family: str
    signature: str
    doc: str  # the formula in one line
    reference: Callable[..., Any]
    tolerance: str  # a class of core.tolerance.TOLERANCES
    key: Callable[..., tuple]  # cheap cache key from the call's arguments
    problem: Callable[..., Problem]  # full description from the same arguments
    cost: Callable[[tuple[int, ...], torch.dtype, str], Cost]  # (shape, dtype, mode)
    bench: tuple[BenchCase, ...] = ()
    c_abi: bool = False
    differentiable: bool = True
    # device -> (args, kwargs): small valid inputs of a call, fresh each time (the contract tests'
    # case; None where tests/test_contract.py still keeps the op's case itself)
    example: Callable[[torch.device], tuple[tuple, dict]] | None = None


@dataclasses.dataclass(frozen=True)
class Impl:
    """One implementation of one op. ``supports`` returns None or the reason it cannot run."""

    op: str
    backend: Backend
    forward: Callable[..., Any]
    backward: Callable[..., Any] | None
    supports: Callable[[Problem], str | None]
    priority: int
    arch: ArchRange = ANY_ARCH
    graph_safe: bool = True  # capturable in a CUDA graph: no host sync, no data-dependent allocation
    compile_safe: bool = True  # runs inside torch.compile(fullgraph=True) through its custom op
    requires: tuple[str, ...] = ()  # importable modules it needs (checked lazily, once)
    note: str = ""
    # which kernel the implementation runs for a problem, in words (ks.explain shows it for the
    # chosen candidate); None: the note says it all
    detail: Callable[[Problem], str] | None = None

    def availability(self) -> str | None:
        return _module_missing(self.requires)


_import_failures: dict[tuple[str, ...], str | None] = {}


def _module_missing(modules: tuple[str, ...]) -> str | None:
    """Reason a module cannot be imported, None if all import. Cached; never raises."""
    if modules not in _import_failures:
        reason = None
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception as exc:  # a broken install is a rejection reason, not a crash
                reason = f"cannot import {name}: {type(exc).__name__}: {exc}"
                break
        _import_failures[modules] = reason
    return _import_failures[modules]


_OPS: dict[str, OpSpec] = {}
_IMPLS: dict[str, list[Impl]] = {}


def declare_op(spec: OpSpec) -> OpSpec:
    if spec.name in _OPS:
        raise ValueError(f"op {spec.name!r} is declared twice")
    _OPS[spec.name] = spec
    _IMPLS[spec.name] = []
    return spec


def register_impl(impl: Impl) -> Impl:
    if impl.op not in _OPS:
        raise ValueError(f"implementation for undeclared op {impl.op!r}")
    impls = _IMPLS[impl.op]
    if any(i.backend == impl.backend for i in impls):
        raise ValueError(f"{impl.op}: backend {impl.backend} registered twice")
    impls.append(impl)
    # Priority order, the reference always last whatever its number.
    impls.sort(key=lambda i: (i.backend == Backend.REFERENCE, -i.priority))
    return impl


def op(name: str) -> OpSpec:
    try:
        return _OPS[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}; declared ops: {', '.join(sorted(_OPS))}") from None


def impls(name: str) -> tuple[Impl, ...]:
    op(name)
    return tuple(_IMPLS[name])


@dataclasses.dataclass(frozen=True)
class CatalogEntry:
    spec: OpSpec
    impls: tuple[Impl, ...]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def backends(self) -> tuple[str, ...]:
        return tuple(str(i.backend) for i in self.impls)


def catalog() -> tuple[CatalogEntry, ...]:
    """Every declared op with its implementations in priority order."""
    return tuple(CatalogEntry(spec, tuple(_IMPLS[name])) for name, spec in sorted(_OPS.items()))


def catalog_markdown() -> str:
    """The README's catalog table (``ksctl list --markdown``), one row per declared op, by family and name;
    every public op also takes ``backend=`` (AUTO or a backend name), left out of the signatures."""
    rows = ["| family | op | backends (priority order) | C ABI | formula |", "|---|---|---|---|---|"]
    for e in sorted(catalog(), key=lambda e: (e.spec.family, e.name)):
        sig = e.spec.signature.replace(", *, backend='auto')", ")").replace(", backend='auto')", ")")
        sig = sig.replace("(*, backend='auto')", "()")
        cells = (e.spec.family, f"`{sig}`", ", ".join(e.backends), "yes" if e.spec.c_abi else "no", e.spec.doc)
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"
