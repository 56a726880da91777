"""Declarations of the norm ops and their implementations (the registry's records).

Every backend's forward/backward takes the same arguments, so the one autograd path in
``api.py`` serves them all:

- rms_norm: fwd(x, w, eps, offset, gemma_cast, stats, torch_order=False) -> (y, rstd); bwd(dy, x, w, rstd,
  eps, offset, gemma_cast, dres) -> (dx, dw)
- fused_add_rms_norm: fwd(x, residual, w, eps, offset, gemma_cast, stats, in_place) -> (y, h, rstd);
  bwd as rms_norm at h (dres carries the gradient of h)
- layer_norm: fwd(x, w, b, eps, stats) -> (y, mean, rstd); bwd(dy, x, w, b, mean, rstd, eps) -> (dx, dw, db)

dw/db come back in the parameter's dtype; stats are fp32 [...] (x's leading shape).
"""
from __future__ import annotations

import torch

from ...core.arch import ArchRange, device_arch
from ...core.checks import row_stride
from ...core.enums import Backend
from ...core.registry import BenchCase, Cost, Impl, OpSpec, Problem, declare_op, register_impl
from ...core.support import triton_rows
from . import reference as ref

# ---- problems -------------------------------------------------------------------------------


def _rows_ok(t: torch.Tensor | None) -> bool:
    return t is None or t.is_contiguous() or row_stride(t) is not None


# Keys are on the hot path of every call (a few hundred ns each): plain tuples, no generators.
def _dt(t: torch.Tensor | None):
    return None if t is None else t.dtype


def _problem(op: str, x: torch.Tensor, named: dict[str, torch.Tensor | None], **extra) -> Problem:
    n = x.shape[-1]
    rows = x.numel() // n if n else 0
    attrs = {"hidden": n, **extra}
    for name, t in named.items():
        attrs[name] = "none" if t is None else str(t.dtype).replace("torch.", "")
    attrs["rows_ok"] = _rows_ok(x) and all(_rows_ok(t) for t in named.values())
    return Problem(op, x.device, x.dtype, (rows, n), device_arch(x.device), attrs)


def _rms_key(x, weight=None, torch_order=False):
    return (x.device, x.dtype, x.shape[-1], _dt(weight), x.is_contiguous() or row_stride(x) is not None,
            torch_order)


def _rms_problem(x, weight=None, torch_order=False):
    return _problem("rms_norm", x, {"weight": weight}, **({"torch_order": True} if torch_order else {}))


def _add_key(x, residual, weight):
    return (x.device, x.dtype, x.shape[-1], _dt(weight), _rows_ok(x) and _rows_ok(residual))


def _add_problem(x, residual, weight):
    return _problem("fused_add_rms_norm", x, {"residual": residual, "weight": weight})


def _ln_key(x, weight, bias):
    return (x.device, x.dtype, x.shape[-1], _dt(weight), _dt(bias), x.is_contiguous() or row_stride(x) is not None)


def _ln_problem(x, weight, bias):
    return _problem("layer_norm", x, {"weight": weight, "bias": bias})


# ---- byte models ----------------------------------------------------------------------------


def _cost(passes_fwd: int, passes_bwd: int, what_fwd: str, what_bwd: str, params: int):
    def cost(shape: tuple[int, ...], dtype: torch.dtype, mode: str) -> Cost:
        m, n = shape
        s = torch.empty((), dtype=dtype).element_size()
        if mode == "fwd":
            return Cost(passes_fwd * m * n * s + params * n * s, 0, what_fwd)
        # parameters: read by the forward, the weight read again by the backward, the gradients written
        return Cost((passes_fwd + passes_bwd) * m * n * s + (2 * params + 1) * n * s, 0, f"{what_fwd}; {what_bwd}")
    return cost


def _sweep(mode: str = "fwd") -> tuple[BenchCase, ...]:
    # % of copy bandwidth vs hidden size, 256 MiB of bf16 input per case.
    return tuple(BenchCase(((1 << 27) // n, n), mode, sweep=True) for n in (1024, 2048, 4096, 8192, 16384, 32768,
                                                                            65536, 131072, 262144))


RMS_NORM = declare_op(OpSpec(
    name="rms_norm", family="norm",
    signature="rms_norm(x, weight=None, *, eps=1e-6, offset=0.0, cast=NormCast.LLAMA, torch_order=False, "
              "backend='auto')",
    doc="y = x * rsqrt(mean(x^2, -1) + eps) * (offset + weight); fp32 statistics",
    reference=lambda x, weight=None, eps=1e-6, offset=0.0, gemma_cast=False: ref.rms_norm_ref(
        x, weight, eps, offset, gemma_cast)[0],
    tolerance="norm", key=_rms_key, problem=_rms_problem,
    cost=_cost(2, 3, "read x, write y", "read x and dy, write dx", 1),
    bench=(BenchCase((32768, 4096), "fwd", bar_pct=95.0), BenchCase((16384, 8192), "fwd", bar_pct=95.0),
           BenchCase((4096, 65536), "fwd", bar_pct=90.0), BenchCase((1024, 262144), "fwd", bar_pct=90.0),
           # fwd+bwd twice: replayed from a CUDA graph, every implementation (the kernels' device time,
           # which the bar judges), and eager (what a plain training loop sees: on the lent H100 host
           # the Python and autograd enqueue of one step, 0.3-0.7 ms, is as long as the kernels)
           BenchCase((32768, 4096), "fwd+bwd", bar_pct=80.0, graph=True),
           BenchCase((16384, 8192), "fwd+bwd", bar_pct=80.0, graph=True),
           BenchCase((32768, 4096), "fwd+bwd"), BenchCase((16384, 8192), "fwd+bwd"),
           BenchCase((4096, 65536), "fwd+bwd")) + _sweep(),
    c_abi=True,
))

FUSED_ADD_RMS_NORM = declare_op(OpSpec(
    name="fused_add_rms_norm", family="norm",
    signature="fused_add_rms_norm(x, residual, weight, *, eps=1e-6, offset=0.0, cast=NormCast.LLAMA, "
              "in_place=False, backend='auto') -> (out, residual)",
    doc="h = x + residual; y = rms_norm(h); returns (y, h), or writes h into residual and y into x",
    reference=lambda x, residual, weight=None, eps=1e-6, offset=0.0, gemma_cast=False: ref.fused_add_rms_norm_ref(
        x, residual, weight, eps, offset, gemma_cast)[:2],
    tolerance="norm", key=_add_key, problem=_add_problem,
    cost=_cost(4, 4, "read x and residual, write y and h", "read h, dy and dh, write dx", 1),
    bench=(BenchCase((32768, 4096), "fwd", bar_pct=95.0), BenchCase((32768, 4096), "fwd+bwd")),
    c_abi=True,
))

LAYER_NORM = declare_op(OpSpec(
    name="layer_norm", family="norm",
    signature="layer_norm(x, weight=None, bias=None, *, eps=1e-5, backend='auto')",
    doc="y = (x - mean(x)) * rsqrt(var(x) + eps) * weight + bias over the last dim; fp32 statistics",
    reference=lambda x, weight=None, bias=None, eps=1e-5: ref.layer_norm_ref(x, weight, bias, eps)[0],
    tolerance="norm", key=_ln_key, problem=_ln_problem,
    cost=_cost(2, 3, "read x, write y", "read x and dy, write dx", 2),
    # fwd+bwd's bar judged on CUDA-graph replay, as RMSNorm's (the eager row includes the host's launches)
    bench=(BenchCase((16384, 8192), "fwd", bar_pct=90.0),
           BenchCase((16384, 8192), "fwd+bwd", bar_pct=75.0, graph=True), BenchCase((16384, 8192), "fwd+bwd"),
           BenchCase((32768, 4096), "fwd"), BenchCase((4096, 65536), "fwd")),
    c_abi=True,
))

# ---- triton ---------------------------------------------------------------------------------


_launch = None


def _lx():
    """The launch module, imported on first use (importing kernelset compiles no Triton code);
    kept in a global because an import statement in the call path costs host time per call."""
    global _launch
    if _launch is None:
        from . import launch
        _launch = launch
    return _launch


def _cast(t: torch.Tensor | None, like: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None or like is None else t.to(like.dtype)


def _t_rms_fwd(x, weight, eps, offset, gemma_cast, stats, torch_order=False):
    if torch_order:
        return _lx().rms_fwd_torch_order(x, weight, eps=eps, offset=offset, gemma_cast=gemma_cast, stats=stats)
    y, _, _, rstd = _lx().norm_fwd(x, weight, None, eps=eps, offset=offset, is_rms=True, gemma_cast=gemma_cast,
                             stats=stats)
    return y, rstd


def _t_rms_supports(p: Problem) -> str | None:
    reason = triton_rows(p)
    if reason is None and p.attrs.get("torch_order"):
        if p.device.type != "cuda":
            return "torch_order reproduces torch's CUDA reduction; on the CPU torch's own ops (the reference) run"
        if ref.torch_cuda_mean_lanes(2, p.shape[1]) is None:
            return (f"torch_order needs a hidden size in (128, 16384] divisible by 4 (torch splits other rows "
                    f"across blocks or does not vectorize them), got {p.shape[1]}; the reference runs torch's own ops")
    return reason


def _t_rms_bwd(dy, x, weight, rstd, eps, offset, gemma_cast, dres):
    dx, dw, _ = _lx().norm_bwd(dy, x, weight, None, rstd, offset=offset, is_rms=True, gemma_cast=gemma_cast,
                         has_bias=False, dres=dres)
    return dx, _cast(dw, weight)


def _t_add_fwd(x, residual, weight, eps, offset, gemma_cast, stats, in_place):
    y, h, _, rstd = _lx().norm_fwd(x, weight, None, eps=eps, offset=offset, is_rms=True, gemma_cast=gemma_cast,
                             stats=stats, residual=residual, out=x if in_place else None,
                             h_out=residual if in_place else None)
    return y, h, rstd


def _t_ln_fwd(x, weight, bias, eps, stats):
    y, _, mean, rstd = _lx().norm_fwd(x, weight, bias, eps=eps, is_rms=False, gemma_cast=True, stats=stats)
    return y, mean, rstd


def _t_ln_bwd(dy, x, weight, bias, mean, rstd, eps):
    dx, dw, db = _lx().norm_bwd(dy, x, weight, mean, rstd, is_rms=False, gemma_cast=True, has_bias=bias is not None)
    return dx, _cast(dw, weight), _cast(db, bias)


def _target(p: Problem) -> tuple[int, float | None]:
    """(SMs, bandwidth per SM or None: this device's) of the GPU a problem runs on: the GPU
    ``ksctl plan`` names (its attrs), else this machine's device."""
    from ...core.arch import sm_count
    if "target_sms" in p.attrs:
        return p.attrs["target_sms"], p.attrs["target_gbs_per_sm"]
    return sm_count(p.device), None


def _kernels(p: Problem) -> str:
    """Which kernels this row width takes (what ``ks.explain`` prints for the chosen Triton impl)."""
    from . import policy as pol
    from .launch import ring_fwd_choice
    n, t = p.shape[-1], pol.active()
    sms, gbs = _target(p)
    fsp = pol.fwd_split_policy(n, sms, t)
    ring = None
    if p.op == "rms_norm" and not p.attrs.get("torch_order"):
        ring = ring_fwd_choice(n, p.dtype, p.device, t, arch=p.arch, gbs_per_sm=gbs)
    if ring is not None:
        fwd = (f"ring forward on sm_90 (Gluon: {ring.split} programs of {n // ring.split} columns per row, rows "
               f"in a TMA ring in shared memory; contiguous 16-byte aligned rows, else "
               + ("split" if fsp.split else "looped") + " forward)")
    elif fsp.split:
        fwd = f"split forward ({fsp.split} programs of {fsp.chunk} columns per row)"
    else:
        fp = pol.fwd_policy(1, n, sms, p.op == "rms_norm", t)
        fwd = "looped forward" if fp.looped else (f"two-pass forward ({fp.block_n}-column chunks)" if fp.two_pass
                                                  else "block forward")
    bsp, rows = pol.bwd_split_policy(n, sms, t)
    if bsp.split:
        per = pol.bwd_split_blocks(rows, t)
        bwd = (f"split backward (tiles of {rows} rows x {bsp.chunk} columns, {bsp.split} per row"
               + (f", up to {per} row blocks per program)" if per > 1 else ")"))
    else:
        bwd = "looped backward + dw/db pass" if pol.bwd_policy(1, n, sms, t).looped else "block backward"
    return f"kernels: {fwd}; {bwd}"


_TRITON = dict(backend=Backend.TRITON, supports=triton_rows, priority=100, arch=ArchRange(min=(7, 0)),
               requires=("triton",), detail=_kernels,
               note="kernelset's own; rows in registers (block kernels), or split over programs that meet at a "
                    "row barrier (wide rows), or looped")

register_impl(Impl(op="rms_norm", forward=_t_rms_fwd, backward=_t_rms_bwd, **{**_TRITON, "supports": _t_rms_supports}))
register_impl(Impl(op="fused_add_rms_norm", forward=_t_add_fwd, backward=_t_rms_bwd, **_TRITON))
register_impl(Impl(op="layer_norm", forward=_t_ln_fwd, backward=_t_ln_bwd, **_TRITON))

# ---- reference ------------------------------------------------------------------------------


def _always(p: Problem) -> str | None:
    return None


def _r_rms_fwd(x, weight, eps, offset, gemma_cast, stats, torch_order=False):
    # torch's own pow(2).mean(-1): the torch order by construction, on every device
    return ref.rms_norm_ref(x, weight, eps, offset, gemma_cast)


def _r_add_fwd(x, residual, weight, eps, offset, gemma_cast, stats, in_place):
    y, h, rstd = ref.fused_add_rms_norm_ref(x, residual, weight, eps, offset, gemma_cast)
    if in_place:
        residual.copy_(h)
        x.copy_(y)
        return x, residual, rstd
    return y, h, rstd


def _r_ln_fwd(x, weight, bias, eps, stats):
    return ref.layer_norm_ref(x, weight, bias, eps)


_REFERENCE = dict(backend=Backend.REFERENCE, supports=_always, priority=0,
                  note="fp32 math in plain torch ops; any device")

register_impl(Impl(op="rms_norm", forward=_r_rms_fwd, backward=ref.rms_norm_bwd_ref, **_REFERENCE))
register_impl(Impl(op="fused_add_rms_norm", forward=_r_add_fwd, backward=ref.rms_norm_bwd_ref, **_REFERENCE))
register_impl(Impl(op="layer_norm", forward=_r_ln_fwd, backward=ref.layer_norm_bwd_ref, **_REFERENCE))
