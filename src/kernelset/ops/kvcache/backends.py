"""Declarations of the KV-cache ops and their implementations.

reshape_and_cache: fwd(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale) writes in place.
copy_blocks: fwd(k_caches, v_caches, block_mapping) copies blocks in place, every layer.
swap_blocks: fwd(src, dst, block_mapping) copies blocks across devices (torch copies only).
"""
from __future__ import annotations

import torch

from ...core import gpus
from ...core.arch import ArchRange, device_arch
from ...core.enums import Backend
from ...core.registry import BenchCase, Cost, Impl, OpSpec, Problem, declare_op, register_impl
from ...core.support import triton_device
from . import reference as ref



def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _unit(*ts: torch.Tensor) -> bool:
    return all(t.stride(-1) == 1 or t.shape[-1] <= 1 for t in ts)


def _fp8_reason(p: Problem) -> str | None:
    if p["cache_dtype"] == "float8_e4m3fn" and p.arch is not None and not gpus.has(p.arch, "fp8"):
        return f"an fp8 e4m3 cache needs {gpus.first_arch('fp8')} or newer (device is sm_{p.arch[0]}{p.arch[1]})"
    return None


# ---- reshape_and_cache -------------------------------------------------------------------------


def _cache_key(key, value, k_cache, v_cache, slot_mapping):
    return (key.device, key.dtype, k_cache.dtype, key.shape[-1], _unit(key, value, k_cache, v_cache))


def _cache_problem(key, value, k_cache, v_cache, slot_mapping):
    attrs = {"cache_dtype": _dt(k_cache.dtype), "block_size": k_cache.shape[1],
             "unit_stride": _unit(key, value, k_cache, v_cache)}
    return Problem("reshape_and_cache", key.device, key.dtype, tuple(key.shape), device_arch(key.device), attrs)


def _cache_cost(shape, dtype, mode):
    t, h, d = shape[:3]
    cache_bytes = 1 if len(shape) > 3 and shape[3] == 8 else _size(dtype)
    return Cost(2 * t * h * d * (_size(dtype) + cache_bytes) + 8 * t, 0,
                "read key and value, write them to their slots, read slot_mapping")


declare_op(OpSpec(
    name="reshape_and_cache", family="kvcache",
    signature="reshape_and_cache(key, value, k_cache, v_cache, slot_mapping, *, k_scale=None, v_scale=None, "
              "check_slots=True, backend='auto')",
    doc="k_cache[s // bs, s % bs] = key[t] / k_scale (s = slot_mapping[t], -1 skips), values likewise",
    reference=lambda k, v, kc, vc, slots: ref.reshape_and_cache(k, v, kc, vc, slots, None, None),
    tolerance="copy", key=_cache_key, problem=_cache_problem, cost=_cache_cost,
    # shape: (tokens, Hkv, D[, cache bits]); a prefill of 16K tokens of a Llama-3-8B layer
    # timed as CUDA-graph replays, as serving engines run it (an eager call costs more host time
    # than the ~49 us kernel on the H100 machine)
    bench=(BenchCase((16384, 8, 128), "fwd", bar_pct=80.0, graph=True),
           BenchCase((16384, 8, 128, 8), "fwd", graph=True)),
    c_abi=True, differentiable=False,
))


def _cache_supports(p: Problem) -> str | None:
    reason = triton_device(p, "key")
    if reason is None and not p["unit_stride"]:
        reason = "key, value or a cache has a strided last dim (pass .contiguous())"
    return reason or _fp8_reason(p)


def _t_cache(*args):
    from .launch import reshape_and_cache
    return reshape_and_cache(*args)


register_impl(Impl(op="reshape_and_cache", backend=Backend.TRITON, forward=_t_cache, backward=None,
                   supports=_cache_supports, priority=100, arch=ArchRange(min=(7, 0)), requires=("triton",),
                   note="(token, head) rows per program; out-of-range slots skipped on the device"))
register_impl(Impl(op="reshape_and_cache", backend=Backend.REFERENCE, forward=ref.reshape_and_cache, backward=None,
                   supports=lambda p: None, priority=0, graph_safe=False,
                   note="torch indexing (boolean mask: a host sync)"))


# ---- copy_blocks -------------------------------------------------------------------------------


def _packed_blocks(caches) -> bool:
    """Each block of each cache is one contiguous run (the kernel copies it as a flat array)."""
    return all(c.shape[0] == 0 or c[0].is_contiguous() for c in caches)


def _copy_key(k_caches, v_caches, block_mapping):
    return (k_caches[0].device, k_caches[0].dtype, _packed_blocks(k_caches) and _packed_blocks(v_caches))


def _copy_problem(k_caches, v_caches, block_mapping):
    k = k_caches[0]
    attrs = {"layers": len(k_caches), "pairs": block_mapping.shape[0],
             "packed": _packed_blocks(k_caches) and _packed_blocks(v_caches)}
    return Problem("copy_blocks", k.device, k.dtype, tuple(k.shape), device_arch(k.device), attrs)


def _copy_cost(shape, dtype, mode):
    layers, pairs, bs, h, d = shape
    return Cost(2 * 2 * layers * pairs * bs * h * d * _size(dtype) + 16 * pairs, 0,
                "per layer and pair: read the source block of k and v, write the destination block")


declare_op(OpSpec(
    name="copy_blocks", family="kvcache",
    signature="copy_blocks(k_caches, v_caches, block_mapping, *, check_blocks=True, backend='auto')",
    doc="for every layer and (src, dst) in block_mapping: k_cache[dst] = k_cache[src], v_cache likewise",
    reference=ref.copy_blocks, tolerance="copy", key=_copy_key, problem=_copy_problem, cost=_copy_cost,
    # shape: (layers, pairs, block_size, Hkv, D): copy-on-write of 256 blocks in 32 Llama-3-8B layers
    bench=(BenchCase((32, 256, 16, 8, 128), "fwd"),), c_abi=True, differentiable=False,
))


def _copy_supports(p: Problem) -> str | None:
    reason = triton_device(p, "k_caches[0]")
    if reason is None and not p["packed"]:
        return "a block of a cache is not contiguous (each cache[b] must be one run)"
    return reason


def _t_copy(*args):
    from .launch import copy_blocks
    return copy_blocks(*args)


register_impl(Impl(op="copy_blocks", backend=Backend.TRITON, forward=_t_copy, backward=None, supports=_copy_supports,
                   priority=100, arch=ArchRange(min=(7, 0)), requires=("triton",),
                   note="one launch per layer (key and value together); out-of-range pairs skipped"))
register_impl(Impl(op="copy_blocks", backend=Backend.REFERENCE, forward=ref.copy_blocks, backward=None,
                   supports=lambda p: None, priority=0, graph_safe=False, note="torch indexing per layer"))


# ---- swap_blocks -------------------------------------------------------------------------------


def _swap_key(src, dst, block_mapping):
    return (src.device, dst.device, src.dtype)


def _swap_problem(src, dst, block_mapping):
    return Problem("swap_blocks", src.device, src.dtype, tuple(src.shape), device_arch(src.device),
                   {"dst_device": str(dst.device), "pairs": block_mapping.shape[0]})


def _swap_cost(shape, dtype, mode):
    pairs, bs, h, d = shape
    return Cost(2 * pairs * bs * h * d * _size(dtype), 0, "read each source block, write its destination")


declare_op(OpSpec(
    name="swap_blocks", family="kvcache", signature="swap_blocks(src, dst, block_mapping, *, backend='auto')",
    doc="dst[d] = src[s] for (s, d) in block_mapping, across devices (GPU <-> pinned CPU offload)",
    reference=ref.swap_blocks, tolerance="copy", key=_swap_key, problem=_swap_problem, cost=_swap_cost,
    bench=(), c_abi=False, differentiable=False,
))
register_impl(Impl(op="swap_blocks", backend=Backend.REFERENCE, forward=ref.swap_blocks, backward=None,
                   supports=lambda p: None, priority=0, graph_safe=False,
                   note="torch copies (DMA across devices), runs of consecutive blocks merged; the mapping is "
                        "read on the host"))
