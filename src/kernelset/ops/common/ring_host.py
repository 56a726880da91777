"""Host side of the sm_90 ring kernels (each family's ``ring_sm90.py``, Gluon, built on
``tma_ring_sm90.py``): where they can run, their TMA descriptor, grid and row counters. No Gluon
import at module level: a Triton without Gluon only makes :func:`gluon_kernel` return its reason.
"""
from __future__ import annotations

import functools
import importlib

import torch

from ...core import gpus
from ...core.arch import device_arch
from ...core.tuning import RingLaunch
from .fast_launch import FastKernel
from .row_barrier import launches


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
    """Whether ``device`` is an sm_90 GPU (wgmma-era TMA and mbarriers, what the Gluon ring kernels
    are written for); ``arch`` stands for another GPU's (``ksctl plan``)."""
    return device.type == "cuda" and gpus.has(device_arch(device) if arch is None else arch, "wgmma")


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


@functools.lru_cache(maxsize=None)
def _descriptor_type():
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    return TensorDescriptor


# programs per SM that a compiled ring kernel really fits, learned after its first launch, per
# (kernel, launch, dtype, the caller's specialization flags): the policies' programs_per_sm hold
# for the Triton the kernels were measured with (3.6); another may compile them to more registers
# (3.9: the ragged cross-entropy ring 128-144 against 80), and a grid whose groups are not all
# resident at once runs its last groups after the first (correct, slower)
_RESIDENT: dict[tuple, int] = {}


def resident(kernel, num_warps: int, want: int) -> int:
    """Programs of a compiled sm_90 kernel that one SM holds at once, at most ``want``: its
    registers against the 64K-register file (allocated per warp in units of 256), its shared
    memory against 228 KB (1 KB reserved per block); ``want`` where the kernel does not say."""
    try:  # (a Triton whose compiled kernels say neither: the policy's figure)
        regs = getattr(kernel, "n_regs", None)
        shared = getattr(getattr(kernel, "metadata", None), "shared", None)
    except Exception:  # noqa: BLE001 - an attribute that fails to load is as good as absent
        return want
    if not isinstance(regs, int) or regs <= 0 or not isinstance(shared, int):
        return want
    per_warp = -(-regs * 32 // 256) * 256
    return max(1, min(want, 65536 // (per_warp * num_warps), 228 * 1024 // (shared + 1024)))


def learn(ref: tuple[str, str], rp: RingLaunch, dtype: torch.dtype, spec: tuple = ()) -> None:
    """After a launch of the ring kernel ``ref``: note how many of its programs an SM fits."""
    key = (ref, rp, dtype, spec)
    if key not in _RESIDENT:
        kernel = gluon_kernel(*ref)[0]
        _RESIDENT[key] = resident(getattr(kernel, "last", None), rp.num_warps, rp.programs_per_sm)


def launch_args(x: torch.Tensor, m: int, n: int, nslot: int, rp: RingLaunch, sms: int,
                ref: tuple[str, str] | None = None, spec: tuple = ()) -> tuple | None:
    """(grid, TMA descriptor of x, zeroed SYNC, PART) of one ring launch over x [m, n], or None
    where x does not allow it (rows not contiguous, x not 16-byte aligned: the TMA needs both) or
    the two-launch form was asked for (``row_barrier.two_launches``: the ring has none). The grid
    keeps every group resident: the policy's programs per SM, or fewer where the compiled kernel
    ``ref`` (with ``spec``) was found to fit fewer (:func:`learn`)."""
    if not (x.is_contiguous() and x.data_ptr() % 16 == 0):
        return None
    phases = launches(x.device, m, nslot, rp.split_p2)
    if len(phases) != 1:
        return None
    _, sync, part = phases[0]
    desc = _descriptor_type()(x.view(-1, 256), [m * n // 256, 256], [256, 1], [rp.box_rows, 256],
                            _layout(rp.box_rows, x.dtype))
    per_sm = _RESIDENT.get((ref, rp, x.dtype, spec), rp.programs_per_sm)
    groups = max(1, min(m, per_sm * sms // rp.split))  # every group resident at once
    return (groups * rp.split,), desc, sync, part
