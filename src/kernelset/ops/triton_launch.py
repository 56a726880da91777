"""Low-overhead launches of ``@triton.jit`` kernels.

``kernel[grid](...)`` costs 20-35 us of host time on the H100 machine (Triton 3.6): it binds
every argument, builds a specialization key and looks the kernel up, on every call. That is
more than the whole of ``F.rms_norm`` at decode sizes. :class:`FastKernel` does the first launch
of each specialization through Triton, keeps the compiled kernel under a key that captures what
Triton specializes on (constexpr values, pointer dtypes and 16-byte alignment, ints equal to 1 or
divisible by 16 and their width, None arguments, num_warps, device), and later launches it
directly, as ``JITFunction.run`` does, minus the launch-hook metadata when no hook is installed.
Installed launch hooks (profilers), the interpreter and a Triton without the expected attributes
all take the ordinary path.
"""
from __future__ import annotations

from typing import Any

import torch

try:
    from triton import knobs as _knobs
except Exception:  # older Triton: no knobs module; always use the ordinary path
    _knobs = None


def _no_hook(hook: Any) -> bool:
    # Triton 3.6+ keeps launch hooks in an always-present HookChain; an empty one calls nothing.
    return hook is None or getattr(hook, "calls", None) == []


def _spec(value: Any) -> Any:
    """What Triton specializes a non-constexpr argument on (the slow path's key; see _fast_key)."""
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.data_ptr() % 16 == 0)
    if value is None:
        return None
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int):
        return (value == 1, value % 16 == 0, -(2**31) <= value < 2**31)
    return type(value)


_Tensor = torch.Tensor
_I32_MIN, _I32_MAX = -(2**31), 2**31


def _fast_key(head: tuple, args: tuple) -> tuple:
    """head + what Triton specializes each positional (non-constexpr) argument on, flattened: a
    tensor adds its dtype and whether its address is 16-byte aligned, an int a code of (== 1,
    divisible by 16, fits int32), None itself, a float its type, anything else its type and value.
    A parameter's kind is fixed by the kernel's signature (a pointer may be None), so the flat
    sequence is unambiguous."""
    key = list(head)
    for v in args:
        c = v.__class__
        if c is int:
            key.append((v == 1) + 2 * (v & 15 == 0) + 4 * (_I32_MIN <= v < _I32_MAX))
        elif v is None:
            key.append(None)
        elif isinstance(v, _Tensor):
            key.append(v.dtype)
            key.append(v.data_ptr() & 15 == 0)
        elif c is float:
            key.append(float)
        else:  # bool, numpy scalars ...: by value (Triton may specialize them on it)
            key.append((c, v))
    return tuple(key)


class FastKernel:
    def __init__(self, fn: Any):
        self.fn = fn
        params = getattr(fn, "params", None)
        self.names = tuple(getattr(fn, "arg_names", ()))
        self.const = tuple(bool(getattr(p, "is_constexpr", False)) for p in params) if params else ()
        self.direct = (_knobs is not None and bool(self.names) and len(self.const) == len(self.names)
                       and type(fn).__name__ == "JITFunction")
        # the fast key needs every constexpr passed by keyword and every other argument by position
        # (the others take the generic key, or Triton's own launch when a default is left out)
        self.first_const = self.const.index(True) if True in self.const else len(self.const)
        self.const_names = frozenset(n for n, c in zip(self.names, self.const) if c)
        self.positional_only = self.direct and all(self.const[self.first_const:])
        self.cache: dict[tuple, Any] = {}

    def __call__(self, grid: tuple[int, ...], *args: Any, num_warps: int, num_stages: int | None = None,
                 fp_fusion: bool = True, **kwargs: Any) -> None:
        """``fp_fusion=False`` stops the compiler contracting a multiply and an add into one FMA,
        which also drops a rounding the kernel wrote between them (bit-exact emulation of a chain
        of bf16 torch ops needs every one of them)."""
        if not self.direct or not args or not isinstance(args[0], _Tensor) or not args[0].is_cuda:
            self.fn[grid](*args, **kwargs, **self._opts(num_warps, num_stages, fp_fusion))
            return
        rt = _knobs.runtime
        if not (_no_hook(rt.launch_enter_hook) and _no_hook(rt.launch_exit_hook)):
            self.fn[grid](*args, **kwargs, **self._opts(num_warps, num_stages, fp_fusion))
            return
        device = args[0].get_device()
        if self.positional_only and len(args) == self.first_const and kwargs.keys() == self.const_names:
            key = _fast_key((device, num_warps, num_stages, fp_fusion, *kwargs.items()), args)
            entry = self.cache.get(key)
            if entry is None:
                kernel = self.fn[grid](*args, **kwargs, **self._opts(num_warps, num_stages, fp_fusion))
                if kernel is not None and hasattr(kernel, "packed_metadata") and not hasattr(kernel, "result"):
                    # the constexpr values are part of the key: their launcher arguments are fixed
                    self.cache[key] = (kernel, tuple(kwargs[n] for n in self.names[self.first_const:]))
                return
            kernel, tail = entry
        elif len(args) + len(kwargs) == len(self.names) and all(n in kwargs for n in self.names[len(args):]):
            full = list(args) + [kwargs[n] for n in self.names[len(args):]]
            key = (device, num_warps, num_stages, fp_fusion) + tuple(
                v if c else _spec(v) for v, c in zip(full, self.const))
            kernel = self.cache.get(key)
            if kernel is None:
                kernel = self.fn[grid](*args, **kwargs, **self._opts(num_warps, num_stages, fp_fusion))
                if kernel is not None and hasattr(kernel, "packed_metadata") and not hasattr(kernel, "result"):
                    self.cache[key] = kernel
                return
            args, tail = tuple(full), ()
        else:  # a parameter left to its default: Triton binds it
            self.fn[grid](*args, **kwargs, **self._opts(num_warps, num_stages, fp_fusion))
            return
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        kernel.run(grid[0], g1, g2, torch._C._cuda_getCurrentRawStream(device), kernel.function,
                   kernel.packed_metadata, None, None, None, *args, *tail)

    @staticmethod
    def _opts(num_warps: int, num_stages: int | None, fp_fusion: bool) -> dict[str, Any]:
        opts: dict[str, Any] = {"num_warps": num_warps}
        if num_stages is not None:
            opts["num_stages"] = num_stages
        if not fp_fusion:
            opts["enable_fp_fusion"] = False
        return opts
