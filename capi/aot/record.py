"""Run a Python launcher on ``meta`` tensors and record the kernel launches it would make.

Every launcher in kernelset calls its kernels through :class:`FastKernel`; while recording,
``FastKernel.__call__`` stores (kernel, grid, arguments, num_warps, num_stages, fp_fusion)
instead of launching, and the launch modules' ``sm_count`` and ``device_arch`` answer a chosen
SM count and compute capability. Nothing is
compiled or run, so this works on any machine and in any process (with or without the Triton
interpreter: only the kernel's Python function and parameter list are read).

The generator enumerates its kernel variants from these recordings (the constexprs, warps and
stages the launcher really picks), and tests/test_capi_aot.py compares them with the generated C
plans, argument by argument.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
from typing import Any, Iterator

import torch

DTYPES = {  # torch dtype -> (Triton type name, KS_DT_* of capi/src/cuda/ks_cuda.h)
    torch.float32: ("fp32", 1),
    torch.float16: ("fp16", 2),
    torch.bfloat16: ("bf16", 3),
    torch.float8_e4m3fn: ("fp8e4nv", 4),
    torch.float8_e5m2: ("fp8e5", 5),
    torch.int8: ("i8", 6),
    torch.uint8: ("u8", 7),
    torch.int16: ("i16", 8),
    torch.int32: ("i32", 9),
    torch.int64: ("i64", 10),
}
DT_BY_NAME = {name: code for name, code in DTYPES.values()}
NAME_BY_DT = {code: name for name, code in DTYPES.values()}
TORCH_BY_NAME = {name: dt for dt, (name, _) in DTYPES.items()}


def jit_function(kernel: Any) -> Any:
    """The plain Python function of a @triton.jit kernel (JITFunction or the interpreter's)."""
    fn = getattr(kernel, "fn", kernel)
    while hasattr(fn, "fn") and not inspect.isfunction(fn):
        fn = fn.fn
    return fn


def constexpr_flags(kernel: Any) -> list[bool]:
    params = getattr(kernel, "params", None)
    if params is not None:
        return [bool(p.is_constexpr) for p in params]
    # the interpreter's function: read the annotations
    sig = inspect.signature(jit_function(kernel))
    return ["constexpr" in str(p.annotation) for p in sig.parameters.values()]


@dataclasses.dataclass
class Launch:
    kernel: str  # function name
    module: str
    grid: tuple[int, int, int]
    params: list[tuple[str, bool, Any]]  # (name, is_constexpr, value) in the kernel's order
    num_warps: int
    num_stages: int  # -1: the launcher left it to Triton
    fp_fusion: int  # 1: Triton's default, 0: disabled by the launcher
    jit: list | None = None  # Triton's own specialization of these arguments: [type, attribute] per parameter


_binders: dict = {}


def jit_specialization(fn: Any, args: tuple, kwargs: dict) -> list | None:
    """[type, attribute] per parameter, as Triton's JIT computes them before compiling (its own
    binder: ``("i32", "D")`` an int divisible by 16, ``("constexpr", 1)`` an int equal to 1,
    ``("*bf16", "D")`` a 16-byte aligned pointer); None in the interpreter."""
    if not hasattr(fn, "params") or type(fn).__name__ != "JITFunction":
        return None
    binder = _binders.get(id(fn))
    if binder is None:
        from triton.backends.nvidia.compiler import CUDABackend
        from triton.runtime.jit import create_function_from_signature
        binder = _binders[id(fn)] = (fn, create_function_from_signature(fn.signature, fn.params, CUDABackend))
    _, spec, _ = binder[1](*args, **kwargs)
    out = []
    for p, (ty, attr) in zip(fn.params, spec):
        if ty == "constexpr" and not p.is_constexpr:
            attr = int(attr) if isinstance(attr, (bool, int)) else None  # the int specialized to 1 (None: a None pointer)
        elif p.is_constexpr:
            attr = None
        out.append([ty, attr])
    return out


@contextlib.contextmanager
def recording(sms: int = 132, modules: tuple = (), cc: int = 90) -> Iterator[list[Launch]]:
    """Records instead of launching; the launch ``modules``' ``sm_count`` answers ``sms`` and their
    ``device_arch`` answers compute capability ``cc`` (90: sm_90) for any tensor."""
    from kernelset.ops.common.fast_launch import FastKernel

    launches: list[Launch] = []
    original = FastKernel.__call__

    def record(self, grid, *args, num_warps, num_stages=None, fp_fusion=True, site=None, **kwargs):
        # (site: a bound launch, FastKernel.at; never bound while recording, so every call comes here)
        fn = jit_function(self.fn)
        bound = inspect.signature(fn).bind(*args, **kwargs)
        bound.apply_defaults()
        flags = constexpr_flags(self.fn)
        names = list(inspect.signature(fn).parameters)
        g = tuple(int(v) for v in grid) + (1,) * (3 - len(grid))
        launches.append(Launch(fn.__name__, fn.__module__, g,
                               [(n, c, bound.arguments[n]) for n, c in zip(names, flags)], int(num_warps),
                               -1 if num_stages is None else int(num_stages), 1 if fp_fusion else 0,
                               jit_specialization(self.fn, args, kwargs)))

    saved = [(m, attr, getattr(m, attr)) for m in modules for attr in ("sm_count", "device_arch") if hasattr(m, attr)]
    FastKernel.__call__ = record
    for m, attr, _ in saved:
        if attr == "sm_count":
            m.sm_count = lambda device, _sms=sms: _sms
        else:
            m.device_arch = lambda device, _cc=cc: (_cc // 10, _cc % 10)
    try:
        yield launches
    finally:
        FastKernel.__call__ = original
        for m, attr, f in saved:
            setattr(m, attr, f)


def meta(shape, dtype: str, strides=None) -> torch.Tensor:
    dt = TORCH_BY_NAME[dtype]
    if strides is None:
        return torch.empty(shape, dtype=dt, device="meta")
    return torch.empty_strided(shape, strides, dtype=dt, device="meta")


def describe(launch: Launch, names: dict[int, str]) -> dict:
    """JSON-able view of a launch: tensors by name (``names``: id(tensor) -> name; a view is named
    after its base), ints, floats, constexprs. A tensor the launcher allocated for itself (split-KV
    partials) is named ``~<parameter>`` after the first parameter it was passed as; ``names`` is
    updated, so later launches of one recording see the same name."""
    params = []
    for name, is_const, v in launch.params:
        if isinstance(v, torch.Tensor):
            base = v
            while id(base) not in names and base._base is not None:
                base = base._base
            if id(base) not in names:
                names[id(base)] = "~" + name
            params.append([name, is_const, "tensor", names[id(base)], DTYPES[v.dtype][0]])
        elif v is None:
            params.append([name, is_const, "none", None, None])
        elif isinstance(v, bool):
            params.append([name, is_const, "bool", int(v), None])
        elif isinstance(v, int):
            params.append([name, is_const, "int", v, None])
        elif isinstance(v, float):
            params.append([name, is_const, "float", v, None])
        else:
            raise TypeError(f"{launch.kernel}.{name}: unsupported argument {v!r}")
    return dict(kernel=launch.kernel, module=launch.module, grid=list(launch.grid), params=params,
                num_warps=launch.num_warps, num_stages=launch.num_stages, fp_fusion=launch.fp_fusion, jit=launch.jit)
