"""Host side of the sm_90 ring kernels (``ring_sm90.py``, Gluon): where they can run, their TMA
descriptor, grid and row counters. No Gluon import at module level: a Triton without Gluon only
makes :func:`gluon_kernel` return its reason.
"""
from __future__ import annotations

import functools
import importlib

import torch

from ..core import gpus
from ..core.arch import device_arch
from ..core.tuning import RingLaunch
from .rowsync import launches
from .triton_launch import FastKernel


@functools.lru_cache(maxsize=None)
def gluon_kernel(module: str, name: str) -> tuple[FastKernel | None, str | None]:
    """(the kernel ``name`` of ``module`` ready to launch, None), or (None, why) where the module
    (Gluon's Hopper API) does not import."""
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure makes the kernel unavailable, with its reason
        return None, f"{type(exc).__name__}: {exc}"
    return FastKernel(getattr(mod, name)), None


def on_sm90(device: torch.device, arch: tuple[int, int] | None = None) -> bool:
    """Whether ``device`` is an sm_90 GPU; ``arch`` stands for another GPU's (``ksctl plan``)."""
    return device.type == "cuda" and (device_arch(device) if arch is None else arch) == (9, 0)


@functools.lru_cache(maxsize=None)
def device_gbs_per_sm(device: torch.device) -> float:
    """Datasheet memory bandwidth per SM of a CUDA device (GB/s), 0 where the GPU table does not
    list it: the ring policies' bandwidth class (the ring pays where HBM keeps up with L2)."""
    g = gpus.for_device(device)
    return g.bandwidth_gbs / g.sms if g is not None else 0.0


@functools.lru_cache(maxsize=None)
def _layout(box_rows: int, dtype: torch.dtype):
    from triton.experimental.gluon import language as gl
    return gl.NVMMASharedLayout.get_default_for([box_rows, 256], gl.bfloat16 if dtype == torch.bfloat16 else gl.float16)


def launch_args(x: torch.Tensor, m: int, n: int, nslot: int, rp: RingLaunch, sms: int) -> tuple | None:
    """(grid, TMA descriptor of x, zeroed SYNC, PART) of one ring launch over x [m, n], or None
    where x does not allow it (rows not contiguous, x not 16-byte aligned: the TMA needs both) or
    the two-launch form was asked for (``rowsync.two_launches``: the ring has none)."""
    if not (x.is_contiguous() and x.data_ptr() % 16 == 0):
        return None
    phases = launches(x.device, m, nslot, rp.split_p2)
    if len(phases) != 1:
        return None
    _, sync, part = phases[0]
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    desc = TensorDescriptor(x.view(-1, 256), [m * n // 256, 256], [256, 1], [rp.box_rows, 256],
                            _layout(rp.box_rows, x.dtype))
    groups = max(1, min(m, rp.programs_per_sm * sms // rp.split))  # every group resident at once
    return (groups * rp.split,), desc, sync, part
