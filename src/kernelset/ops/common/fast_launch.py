"""Low-overhead launches of ``@triton.jit`` kernels.

``kernel[grid](...)`` costs 20-35 us of host time on the H100 machine (Triton 3.6): it binds
every argument, builds a specialization key and looks the kernel up, on every call. That is
more than the whole of ``F.rms_norm`` at decode sizes. :class:`FastKernel` does the first launch
of each specialization through Triton, keeps the compiled kernel under a key that captures what
Triton specializes on (constexpr values, pointer dtypes and 16-byte alignment, ints equal to 1 or
divisible by 16 and their width, None arguments, num_warps, device), and later launches it
directly.

The key is computed by a small function generated once per layout of argument types (which
slots hold a tensor, None, an int, a float ...), so a call evaluates one straight-line expression
instead of a loop of type tests. The same function turns each tensor into its address, so the
launch needs no ``data_ptr`` call and no ``cuPointerGetAttribute`` per tensor in Triton's
launcher (the dispatcher has already checked that every tensor is on the kernel's CUDA device).
Where the compiled kernel's launcher is a per-signature C function (Triton 3.6's
``__triton_launcher``) and needs no scratch memory, it is called directly with those addresses;
other Triton versions go through ``CompiledKernel.run`` with the tensors, as Triton does.
Gluon kernels (``triton.experimental.gluon``) take the same path; a host TMA descriptor argument
(``TensorDescriptor``) is keyed on what Triton could specialize on and passed to
``CompiledKernel.run``, whose launcher encodes it. ``KS_DIRECT_LAUNCH=0`` turns the direct call off. Installed launch hooks (profilers), the
interpreter and a Triton without the expected attributes all take the ordinary path.

Bound launches (``site=`` and :meth:`FastKernel.at`), for the decode-size hot paths: even the
direct path spends a few microseconds building the call's keyword arguments, its key and hashing
it. A caller that can name a *site* (a small tuple that fixes every constexpr value, num_warps,
num_stages, fp_fusion and the device) passes ``site=`` once; after that ``fk.at(site, grid,
*args)`` launches with the kernel compiled for the site through a function generated for it,
which only checks what Triton specializes on and the site does not fix (each tensor's dtype and
16-byte alignment, each int's divisibility class, None slots, the device, launch hooks) and
returns False, launching nothing, where any of them differs: the caller then makes the full call.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable

import torch

from ...core import config

try:
    from triton import knobs as _knobs
except Exception:  # older Triton: no knobs module; always use the ordinary path
    _knobs = None


def _no_hook(hook: Any) -> bool:
    # Triton 3.6+ keeps launch hooks in an always-present HookChain; an empty one calls nothing.
    return hook is None or getattr(hook, "calls", None) == []


def _spec(value: Any) -> Any:
    """What Triton specializes a non-constexpr argument on (the generic path's key; the fast
    path's is generated per layout of argument types: see _make_keyfn)."""
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


class _Layout:
    """The key function for one tuple of positional argument types, and the kernels cached under it.

    ``keyfn(args, head)`` returns ``(key, addresses)``: the key is head + what Triton specializes
    each argument on (a tensor: its dtype and whether its address is 16-byte aligned; an int: a code
    of == 1, divisible by 16, fits int32; None: itself; a float: nothing beyond its type, which the
    layout fixes; anything else, bools included: its value), and ``addresses`` is args with each
    tensor replaced by its address.
    """

    __slots__ = ("keyfn", "cache")

    def __init__(self, types: tuple[type, ...]):
        keyfn = _keyfns.get(types)
        if keyfn is None:
            keyfn = _keyfns[types] = _make_keyfn(types)
        self.keyfn = keyfn
        self.cache: dict[tuple, tuple] = {}


def _make_keyfn(types: tuple[type, ...]) -> Callable[[tuple, tuple], tuple[tuple, tuple]]:
    n = len(types)
    names = [f"a{i}" for i in range(n)]
    pre, key, out = [], ["head"], []
    for i, t in enumerate(types):
        a = names[i]
        if issubclass(t, torch.Tensor):
            pre.append(f"p{i} = {a}.data_ptr()")
            key += [f"{a}.dtype", f"p{i} & 15 == 0"]
            out.append(f"p{i}")
        elif t is type(None):
            key.append("None")
            out.append("None")
        elif getattr(t, "__name__", "") == "TensorDescriptor":  # a host TMA descriptor (Gluon, tl)
            # everything Triton could specialize on: element type, block, layout, base alignment,
            # and each shape and stride as 1 / divisible by 16; the launcher encodes it per call
            pre.append(f"b{i} = {a}.base")
            key += [f"b{i}.dtype", f"b{i}.data_ptr() & 15 == 0", f"tuple({a}.block_shape)",
                    f"getattr({a}, 'layout', None)", f"getattr({a}, 'padding', None)",
                    f"tuple((s == 1) + 2 * (s & 15 == 0) for s in {a}.shape)",
                    f"tuple((s == 1) + 2 * (s & 15 == 0) for s in {a}.strides)"]
            out.append(a)
        elif t is int:
            key.append(f"({a} == 1) + 2 * ({a} & 15 == 0) + 4 * (-2147483648 <= {a} < 2147483648)")
            out.append(a)
        elif t is float:
            out.append(a)
        else:  # bool, numpy scalars ...: by value (Triton may specialize them on it)
            key.append(a)
            out.append(a)
    unpack = f"    {', '.join(names)}{',' if n == 1 else ''} = args\n" if n else ""
    src = (f"def keyfn(args, head):\n{unpack}"
           + "".join(f"    {s}\n" for s in pre)
           + f"    return ({', '.join(key)},), ({', '.join(out)}{',' if len(out) == 1 else ''})\n")
    scope: dict[str, Any] = {}
    exec(compile(src, f"<FastKernel key {types}>", "exec"), scope)  # noqa: S102 (generated from types only)
    return scope["keyfn"]


_keyfns: dict[tuple[type, ...], Callable[[tuple, tuple], tuple[tuple, tuple]]] = {}


def _fast_key(head: tuple, args: tuple) -> tuple:
    """The cache key of a direct launch (tests check what it separates)."""
    return _Layout(tuple(map(type, args))).keyfn(args, head)[0]


def _raw_launcher(kernel: Any) -> tuple | None:
    """(C launch function, cooperative flag, PDL flag) when the compiled kernel's launcher is a
    per-signature C function taking (grid, stream, function, coop, pdl, global scratch, profile
    scratch, metadata, launch metadata, hooks, *args) and needs no scratch memory (Triton 3.6);
    None otherwise (the launch then goes through ``kernel.run``)."""
    try:
        launcher = kernel.run
        fn = launcher.launch
        module = getattr(getattr(fn, "__self__", None), "__name__", "")
        if (module != "__triton_launcher" or hasattr(launcher, "arg_annotations")
                or launcher.global_scratch_size or launcher.profile_scratch_size):
            return None
        return fn, bool(launcher.launch_cooperative_grid), bool(launcher.launch_pdl)
    except Exception:
        return None


_raw_stream = torch._C._cuda_getCurrentRawStream if hasattr(torch._C, "_cuda_getCurrentRawStream") else None


def _int_class(v: int) -> int:
    """What Triton specializes an int argument on, as one code (the key functions inline it)."""
    return (v == 1) + 2 * (v & 15 == 0) + 4 * (-2147483648 <= v < 2147483648)


def _make_bound(args: tuple, kernel: Any, tail: tuple, raw: tuple, device: int) -> Callable[[tuple, tuple], bool] | None:
    """A launcher for later calls like ``args``: ``bound(grid, args) -> bool``. It launches
    ``kernel`` (compiled for ``args`` and the site's constexprs, ``tail``) through the raw C
    launcher and returns True, or returns False and launches nothing where an argument differs in
    anything Triton specializes on. None where an argument cannot be bound (a TMA descriptor)."""
    launch, coop, pdl = raw
    n = len(args)
    scope: dict[str, Any] = {"LAUNCH": launch, "FUNC": kernel.function, "META": kernel.packed_metadata,
                             "COOP": coop, "PDL": pdl, "TAIL": tuple(tail), "DEV": device, "RT": _knobs.runtime,
                             "NOHOOK": _no_hook, "STREAM": _raw_stream}
    pre, bad, out = [], [], []
    first = None
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            scope[f"D{i}"] = a.dtype
            pre.append(f"p{i} = a{i}.data_ptr()")
            bad += [f"a{i}.dtype is not D{i}", f"(p{i} & 15 == 0) is not {a.data_ptr() & 15 == 0}"]
            out.append(f"p{i}")
            first = i if first is None else first
        elif a is None:
            bad.append(f"a{i} is not None")
            out.append("None")
        elif type(a) is int:
            bad.append(f"type(a{i}) is not int or ((a{i} == 1) + 2 * (a{i} & 15 == 0) + "
                       f"4 * (-2147483648 <= a{i} < 2147483648)) != {_int_class(a)}")
            out.append(f"a{i}")
        elif type(a) is float:
            bad.append(f"type(a{i}) is not float")
            out.append(f"a{i}")
        elif type(a) is bool:
            bad.append(f"a{i} is not {a}")
            out.append(f"a{i}")
        else:  # a TMA descriptor, numpy scalars ...: the full call keys them
            return None
    if first is None:
        return None
    bad.append(f"a{first}.get_device() != DEV")
    bad.append("not (NOHOOK(RT.launch_enter_hook) and NOHOOK(RT.launch_exit_hook))")
    names = ", ".join(f"a{i}" for i in range(n)) + ("," if n == 1 else "")
    src = ("def bound(grid, args):\n"
           f"    {names} = args\n"
           + "".join(f"    {p}\n" for p in pre)
           + f"    if {' or '.join(bad)}:\n        return False\n"
           + "    g1 = grid[1] if len(grid) > 1 else 1\n    g2 = grid[2] if len(grid) > 2 else 1\n"
           + "    LAUNCH(grid[0], g1, g2, STREAM(DEV), FUNC, COOP, PDL, None, None, META, None, None, None, "
           + f"{', '.join(out)}, *TAIL)\n    return True\n")
    exec(compile(src, f"<FastKernel bound launch of {n} args>", "exec"), scope)  # noqa: S102 (from types only)
    return scope["bound"]


_ALL: list["FastKernel"] = []  # every FastKernel, so a configuration change drops their bound launches


def _drop_bound() -> None:
    for fk in _ALL:
        fk.sites.clear()


config.on_change(_drop_bound)


def _interpreter_rounding(fn: Any) -> None:
    """Under TRITON_INTERPRET=1 ``@triton.jit`` gives an InterpretedFunction, whose fp32 -> bf16
    casts truncate where a GPU rounds to nearest even (bf16 results off by up to an ulp in most
    elements): the first such kernel installs the fix (idempotent; never at import of kernelset,
    which does not import Triton)."""
    if type(fn).__name__ == "InterpretedFunction":
        from ...testing.interpreter import patch_bf16_rounding
        patch_bf16_rounding()


class FastKernel:
    def __init__(self, fn: Any):
        _interpreter_rounding(fn)
        self.fn = fn
        params = getattr(fn, "params", None)
        self.names = tuple(getattr(fn, "arg_names", ()))
        self.const = tuple(bool(getattr(p, "is_constexpr", False)) for p in params) if params else ()
        self.direct = (_knobs is not None and bool(self.names) and len(self.const) == len(self.names)
                       and type(fn).__name__ in ("JITFunction", "GluonJITFunction"))
        # the fast key needs every constexpr passed by keyword and every other argument by position
        # (the others take the generic key, or Triton's own launch when a default is left out)
        self.first_const = self.const.index(True) if True in self.const else len(self.const)
        self.const_names = frozenset(n for n, c in zip(self.names, self.const) if c)
        self.positional_only = self.direct and all(self.const[self.first_const:])
        # Gluon kernels name ``num_warps`` as a constexpr parameter: the launch option binds it
        self.nw_param = "num_warps" in self.const_names
        self.last: Any = None  # the compiled kernel of the latest direct or generic-key launch (ring_host reads it)
        self.cache: dict[tuple, Any] = {}  # generic-key launches
        self.layouts: dict[tuple[type, ...], _Layout] = {}  # fast-key launches, per layout of argument types
        self.sites: dict[Hashable, Callable[[tuple, tuple], bool]] = {}  # bound launches (see ``at``)
        self.bound: dict[tuple, Callable[[tuple, tuple], bool] | None] = {}  # per fast key, generated once
        _ALL.append(self)

    def entries(self) -> int:
        """How many specializations are cached for direct launch."""
        return len(self.cache) + sum(len(lay.cache) for lay in self.layouts.values())

    def at(self, site: Hashable, grid: tuple[int, ...], *args: Any) -> bool:
        """Launch through the launcher bound to ``site`` by an earlier ``fk(grid, *args,
        site=site, ...)``: True when it ran; False, with nothing launched, when none is bound or an
        argument differs from the bound specialization (then make the full call, with ``site=``).
        The site must fix every constexpr value, num_warps, num_stages, fp_fusion and the device,
        and the same argument types at each position."""
        b = self.sites.get(site)
        return b is not None and b(grid, args)

    def __call__(self, grid: tuple[int, ...], *args: Any, num_warps: int, num_stages: int | None = None,
                 fp_fusion: bool = True, site: Hashable | None = None, **kwargs: Any) -> None:
        """``fp_fusion=False`` stops the compiler contracting a multiply and an add into one FMA,
        which also drops a rounding the kernel wrote between them (bit-exact emulation of a chain
        of bf16 torch ops needs every one of them). ``site``: bind this launch for :meth:`at`."""
        # the device comes from the first argument: a tensor, or a host TMA descriptor's base
        # (the ring kernels take the descriptor first)
        first = args[0] if args else None
        if first is not None and not isinstance(first, _Tensor):
            first = getattr(first, "base", None)
        if not self.direct or not isinstance(first, _Tensor) or not first.is_cuda:
            self.fn[grid](*args, **kwargs, **self._opts(num_warps, num_stages, fp_fusion))
            return
        rt = _knobs.runtime
        if not (_no_hook(rt.launch_enter_hook) and _no_hook(rt.launch_exit_hook)):
            self.fn[grid](*args, **kwargs, **self._opts(num_warps, num_stages, fp_fusion))
            return
        device = first.get_device()
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        ck = {**kwargs, "num_warps": num_warps} if self.nw_param else kwargs  # every constexpr by name
        if self.positional_only and len(args) == self.first_const and ck.keys() == self.const_names:
            types = tuple(map(type, args))
            lay = self.layouts.get(types)
            if lay is None:
                lay = self.layouts[types] = _Layout(types)
            key, addresses = lay.keyfn(args, (device, num_warps, num_stages, fp_fusion, *kwargs.items()))
            entry = lay.cache.get(key)
            if entry is None:
                kernel = self.fn[grid](*args, **kwargs, **self._opts(num_warps, num_stages, fp_fusion))
                self.last = kernel
                if kernel is not None and hasattr(kernel, "packed_metadata") and not hasattr(kernel, "result"):
                    # the constexpr values are part of the key: their launcher arguments are fixed
                    tail = tuple(ck[n] for n in self.names[self.first_const:])
                    lay.cache[key] = entry = (kernel, tail, _raw_launcher(kernel))
                    if site is not None:
                        self._bind(site, key, args, entry, device)
                return
            kernel, tail, raw = entry
            self.last = kernel
            if site is not None:
                self._bind(site, key, args, entry, device)
            stream = torch._C._cuda_getCurrentRawStream(device)
            if raw is not None and config.get().direct_launch:
                launch, coop, pdl = raw
                launch(grid[0], g1, g2, stream, kernel.function, coop, pdl, None, None, kernel.packed_metadata,
                       None, None, None, *addresses, *tail)
            else:
                kernel.run(grid[0], g1, g2, stream, kernel.function, kernel.packed_metadata, None, None, None,
                           *args, *tail)
            return
        if len(args) + len(ck) == len(self.names) and all(n in ck for n in self.names[len(args):]):
            full = list(args) + [ck[n] for n in self.names[len(args):]]
            key = (device, num_warps, num_stages, fp_fusion) + tuple(
                v if c else _spec(v) for v, c in zip(full, self.const))
            kernel = self.cache.get(key)
            if kernel is None:
                kernel = self.fn[grid](*args, **kwargs, **self._opts(num_warps, num_stages, fp_fusion))
                if kernel is not None and hasattr(kernel, "packed_metadata") and not hasattr(kernel, "result"):
                    self.cache[key] = kernel
                return
            kernel.run(grid[0], g1, g2, torch._C._cuda_getCurrentRawStream(device), kernel.function,
                       kernel.packed_metadata, None, None, None, *full)
            return
        # a parameter left to its default: Triton binds it
        self.fn[grid](*args, **kwargs, **self._opts(num_warps, num_stages, fp_fusion))

    def _bind(self, site: Hashable, key: tuple, args: tuple, entry: tuple, device: int) -> None:
        """Bind ``site`` to the launcher of this specialization (generated once per key: a site
        whose calls alternate between two specializations rebinds with a dict lookup)."""
        kernel, tail, raw = entry
        if raw is None or _raw_stream is None or not config.get().direct_launch:
            return
        bound = self.bound.get(key)
        if bound is None:
            bound = self.bound[key] = _make_bound(args, kernel, tail, raw, device)
        if bound is None:
            return
        if len(self.sites) >= 256:  # a caller whose sites never repeat must not grow this without bound
            self.sites.clear()
        self.sites[site] = bound

    @staticmethod
    def _opts(num_warps: int, num_stages: int | None, fp_fusion: bool) -> dict[str, Any]:
        # FMA contraction is always stated: Triton 3.10 turns its default off, which would change
        # the kernels' speed and rounding under a newer Triton (the C ABI's AOT build states it too)
        opts: dict[str, Any] = {"num_warps": num_warps, "enable_fp_fusion": bool(fp_fusion)}
        if num_stages is not None:
            opts["num_stages"] = num_stages
        return opts
