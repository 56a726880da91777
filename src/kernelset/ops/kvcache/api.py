"""Public KV-cache ops (paged layout ``[num_blocks, block_size, Hkv, D]``) and their custom ops.

What is checked where:
- always, on the host, without touching device data: types, dtypes, shapes, devices, strides,
  scales;
- ``check_slots`` / ``check_blocks`` (default on): the values of slot_mapping / block_mapping,
  with one host sync; skipped under CUDA-graph capture and torch.compile (and when False);
- always, on the device: the kernels skip an out-of-range slot or pair, so bad data never writes
  (or reads) outside a cache, whatever was checked.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ...core import checks, dispatch
from ...core.autograd import mark_written
from ...core.enums import AUTO, Backend
from ...core.errors import ArgumentError, ArgumentTypeError
from ..quant.formats import FP8
from . import backends  # noqa: F401  (declares the ops and registers their implementations)

CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, FP8)
_INT = (torch.int32, torch.int64)


def _hot_path(t: torch.Tensor) -> bool:
    """Under torch.compile or CUDA-graph capture: no host syncs allowed."""
    return torch.compiler.is_compiling() or (t.is_cuda and torch.cuda.is_current_stream_capturing())


def check_cache(op: str, name: str, cache: object) -> torch.Tensor:
    """A paged cache ``[num_blocks, block_size, Hkv, D]`` with a unit-stride last dim."""
    checks.tensor(op, name, cache, dtypes=CACHE_DTYPES, min_ndim=4)
    if cache.dim() != 4:
        raise ArgumentError(op, name, "4-D [num_blocks, block_size, Hkv, D]", f"shape {tuple(cache.shape)}")
    if cache.shape[1] == 0 or cache.shape[3] == 0:
        raise ArgumentError(op, name, "of non-zero block_size and head size", f"shape {tuple(cache.shape)}")
    if cache.stride(-1) != 1 and cache.shape[-1] > 1:
        raise ArgumentError(op, name, "unit-stride in its last dim (D)", f"strides {cache.stride()}")
    return cache


def check_scale(op: str, name: str, scale: object, cache: torch.Tensor, cache_name: str) -> torch.Tensor | None:
    """A per-tensor fp32 scale of an fp8 cache (one element, on the cache's device); None otherwise."""
    if cache.dtype != FP8:
        if scale is not None:
            raise ArgumentError(op, name, f"None unless '{cache_name}' is float8_e4m3fn", "a scale")
        return None
    if scale is None:
        raise ArgumentError(op, name, f"a scalar float32 tensor (the scale of the fp8 '{cache_name}')", None)
    checks.tensor(op, name, scale, dtypes=(torch.float32,), min_ndim=0)
    if scale.numel() != 1:
        raise ArgumentError(op, name, "one element (a per-tensor scale)", f"shape {tuple(scale.shape)}")
    checks.same_device(op, name, scale, cache_name, cache)
    return scale


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, *, k_scale: torch.Tensor | None = None,
                      v_scale: torch.Tensor | None = None, check_slots: bool = True,
                      backend: Backend | str = AUTO) -> None:
    """Write key/value ``[T, Hkv, D]`` into the paged caches ``[num_blocks, block_size, Hkv, D]``.

    Token t goes to slot s = slot_mapping[t] (block s // block_size, offset s % block_size); s = -1
    skips the token (padding). key/value may be token- and head-strided views (a slice of a fused
    qkv projection). fp8 e4m3 caches store value / scale saturated to +-448 (k_scale, v_scale:
    scalar fp32 tensors). ``check_slots`` raises on a slot outside [-1, num_blocks * block_size)
    with one host sync (skipped under graph capture and torch.compile); the kernel itself skips
    such slots, never writing outside the cache.
    """
    op = "reshape_and_cache"
    check_cache(op, "k_cache", k_cache)
    check_cache(op, "v_cache", v_cache)
    checks.no_overlap(op, "k_cache", k_cache)
    checks.no_overlap(op, "v_cache", v_cache)
    checks.disjoint(op, "v_cache", v_cache, "k_cache", k_cache, "values would overwrite keys")
    checks.shape(op, "v_cache", v_cache, tuple(k_cache.shape), "k_cache's shape")
    checks.same_dtype(op, "v_cache", v_cache, "k_cache", k_cache)
    checks.same_device(op, "v_cache", v_cache, "k_cache", k_cache)
    nb, bs, h, d = k_cache.shape
    for name, x in (("key", key), ("value", value)):
        checks.tensor(op, name, x, min_ndim=3)
        if x.dim() != 3 or tuple(x.shape[1:]) != (h, d):
            raise ArgumentError(op, name, f"[T, Hkv={h}, D={d}] (the cache's heads and head size)",
                                f"shape {tuple(x.shape)}")
        if x.stride(-1) != 1 and d > 1:
            raise ArgumentError(op, name, "unit-stride in its last dim", f"strides {x.stride()}")
        checks.same_device(op, name, x, "k_cache", k_cache)
    checks.shape(op, "value", value, tuple(key.shape), "key's shape")
    checks.same_dtype(op, "value", value, "key", key)
    if k_cache.dtype != FP8:
        checks.same_dtype(op, "k_cache", k_cache, "key", key)
    checks.tensor(op, "slot_mapping", slot_mapping, dtypes=_INT)
    checks.shape(op, "slot_mapping", slot_mapping, (key.shape[0],), "one slot per token")
    checks.same_device(op, "slot_mapping", slot_mapping, "key", key)
    if slot_mapping.stride(0) != 1 and slot_mapping.numel() > 1:
        slot_mapping = slot_mapping.contiguous()
    k_scale = check_scale(op, "k_scale", k_scale, k_cache, "k_cache")
    v_scale = check_scale(op, "v_scale", v_scale, v_cache, "v_cache")
    if check_slots and slot_mapping.numel() and not _hot_path(key):
        lo, hi = torch.stack(torch.aminmax(slot_mapping)).tolist()  # one host sync for both bounds
        if lo < -1 or hi >= nb * bs:
            raise ArgumentError(op, "slot_mapping", f"in [-1, {nb * bs}) (num_blocks * block_size; -1 skips)",
                                f"slots from {lo} to {hi}")
    args = (key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    if torch.compiler.is_compiling():
        torch.ops.kernelset.reshape_and_cache_(*args, str(backend))
    else:
        dispatch.select(op, backend, args[:5], {}).forward(*args)
        mark_written(k_cache, v_cache)


@torch.library.custom_op("kernelset::reshape_and_cache_", mutates_args=("k_cache", "v_cache"))
def _cache_op(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              slot_mapping: torch.Tensor, k_scale: Optional[torch.Tensor], v_scale: Optional[torch.Tensor],
              backend: str) -> None:
    dispatch.select("reshape_and_cache", backend, (key, value, k_cache, v_cache, slot_mapping), {}).forward(
        key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)


@_cache_op.register_fake
def _(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale, backend):
    return None


def _check_caches(op: str, k_caches: object, v_caches: object) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    for name, caches in (("k_caches", k_caches), ("v_caches", v_caches)):
        if not isinstance(caches, (list, tuple)) or not caches:
            raise ArgumentTypeError(op, name, "a non-empty list of per-layer caches", type(caches).__name__)
    if len(k_caches) != len(v_caches):
        raise ArgumentError(op, "v_caches", f"as many layers as k_caches ({len(k_caches)})", len(v_caches))
    first = k_caches[0]
    for i, (k, v) in enumerate(zip(k_caches, v_caches)):
        check_cache(op, f"k_caches[{i}]", k)
        check_cache(op, f"v_caches[{i}]", v)
        checks.no_overlap(op, f"k_caches[{i}]", k)
        checks.no_overlap(op, f"v_caches[{i}]", v)
        checks.same_device(op, f"k_caches[{i}]", k, "k_caches[0]", first)
        checks.same_device(op, f"v_caches[{i}]", v, "k_caches[0]", first)
        checks.same_dtype(op, f"k_caches[{i}]", k, "k_caches[0]", first)
        checks.same_dtype(op, f"v_caches[{i}]", v, "k_caches[0]", first)
        if k.shape[0] != first.shape[0] or v.shape != k.shape:
            raise ArgumentError(op, f"v_caches[{i}]", f"the shape of k_caches[{i}] {tuple(k.shape)} with "
                                f"{first.shape[0]} blocks like layer 0", f"shape {tuple(v.shape)}")
    # every cache is written in place: one shared by two layers (or a layer's k and v) would have
    # its blocks copied twice, the second copy reading what the first wrote
    checks.disjoint_all(op, [(f"{kind}_caches[{i}]", t) for i, (k, v) in enumerate(zip(k_caches, v_caches))
                             for kind, t in (("k", k), ("v", v))], "every cache is written in place")
    return list(k_caches), list(v_caches)


def _check_mapping(op: str, block_mapping: object, num_blocks: int, check: bool, name: str = "block_mapping",
                   src_blocks: int | None = None) -> torch.Tensor:
    """``src_blocks`` None: source and destination are the same caches (copy_blocks), whose pairs
    run in parallel, so a destination that is another pair's source, or a repeated destination,
    is a race (refused with the range check's sync); swap_blocks copies one cache into another."""
    checks.tensor(op, name, block_mapping, dtypes=(torch.int64,), min_ndim=2)
    if block_mapping.dim() != 2 or block_mapping.shape[1] != 2:
        raise ArgumentError(op, name, "[N, 2] int64 (src, dst) pairs", f"shape {tuple(block_mapping.shape)}")
    if check and block_mapping.numel() and not _hot_path(block_mapping):
        in_place = src_blocks is None
        src_n = num_blocks if in_place else src_blocks
        src, dst = block_mapping[:, 0], block_mapping[:, 1]
        stats = [*torch.aminmax(src), *torch.aminmax(dst)]
        if in_place:
            # (a pair copying a block onto itself reads and writes the same elements: harmless)
            stats.append((torch.isin(dst, src) & (dst != src)).any().long())
            stats.append((torch.sort(dst).values.diff() == 0).any().long())
        lo_s, hi_s, lo_d, hi_d, *race = torch.stack(stats).tolist()  # one host sync
        if lo_s < 0 or hi_s >= src_n:
            raise ArgumentError(op, name, f"source blocks in [0, {src_n})", f"sources from {lo_s} to {hi_s}")
        if lo_d < 0 or hi_d >= num_blocks:
            raise ArgumentError(op, name, f"destination blocks in [0, {num_blocks})",
                                f"destinations from {lo_d} to {hi_d}")
        if race and race[0]:
            raise ArgumentError(op, name, "destinations that are no other pair's source (the pairs are copied in "
                                "parallel)", "a destination that is also a source")
        if race and race[1]:
            raise ArgumentError(op, name, "distinct destinations (the pairs are copied in parallel)",
                                "a repeated destination")
    return block_mapping


def copy_blocks(k_caches: Sequence[torch.Tensor], v_caches: Sequence[torch.Tensor], block_mapping: torch.Tensor, *,
                check_blocks: bool = True, backend: Backend | str = AUTO) -> None:
    """For every layer and every (src, dst) row of block_mapping ``[N, 2]`` int64: cache[dst] = cache[src]
    in both k_caches and v_caches (lists of per-layer ``[num_blocks, block_size, Hkv, D]`` caches
    of one dtype and device; layers may differ in block_size, heads or head size).

    For copy-on-write of shared prefix blocks: a destination must not also be another pair's source,
    nor repeat (the pairs run in parallel). ``check_blocks`` raises on either, and on a block
    outside [0, num_blocks), with one host sync (skipped under graph capture and torch.compile);
    the kernel skips out-of-range pairs anyway. A mapping
    on another device than the caches is copied over first.
    """
    op = "copy_blocks"
    ks, vs = _check_caches(op, k_caches, v_caches)
    mapping = _check_mapping(op, block_mapping, ks[0].shape[0], check_blocks)
    if mapping.device != ks[0].device:
        mapping = mapping.to(ks[0].device, non_blocking=True)
    mapping = mapping.contiguous()
    if torch.compiler.is_compiling():
        torch.ops.kernelset.copy_blocks_(ks, vs, mapping, str(backend))
    else:
        dispatch.select(op, backend, (ks, vs, mapping), {}).forward(ks, vs, mapping)
        mark_written(*ks, *vs)


@torch.library.custom_op("kernelset::copy_blocks_", mutates_args=("k_caches", "v_caches"))
def _copy_op(k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], block_mapping: torch.Tensor,
             backend: str) -> None:
    dispatch.select("copy_blocks", backend, (k_caches, v_caches, block_mapping), {}).forward(
        k_caches, v_caches, block_mapping)


@_copy_op.register_fake
def _(k_caches, v_caches, block_mapping, backend):
    return None


def swap_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor, *,
                backend: Backend | str = AUTO) -> None:
    """dst[d] = src[s] for each row (s, d) of block_mapping ``[N, 2]`` int64 on the CPU, where src
    and dst are caches of one layer (``[num_blocks, ...]``, same block shape and dtype, block counts
    may differ) on any devices: GPU <-> CPU for offload (pin the CPU side for asynchronous copies),
    or GPU <-> GPU. Every block index is checked on the host (no device sync: the mapping is a
    host tensor). Runs of consecutive blocks become one copy.
    """
    op = "swap_blocks"
    for name, t in (("src", src), ("dst", dst)):
        checks.tensor(op, name, t, dtypes=CACHE_DTYPES, min_ndim=2)
    if tuple(src.shape[1:]) != tuple(dst.shape[1:]):
        raise ArgumentError(op, "dst", f"blocks of src's shape {tuple(src.shape[1:])}", f"shape {tuple(dst.shape)}")
    checks.same_dtype(op, "dst", dst, "src", src)
    checks.no_overlap(op, "dst", dst)
    if src.device == dst.device:  # (one address space per device pair otherwise: nothing to share)
        checks.disjoint(op, "dst", dst, "src", src, "dst is written while src is read")
    checks.tensor(op, "block_mapping", block_mapping, dtypes=(torch.int64,), min_ndim=2)
    if block_mapping.device.type != "cpu":
        raise ArgumentError(op, "block_mapping", "a CPU tensor (the copies are issued from the host)",
                            f"device {block_mapping.device}")
    mapping = _check_mapping(op, block_mapping, dst.shape[0], True, src_blocks=src.shape[0])
    if torch.compiler.is_compiling():
        torch.ops.kernelset.swap_blocks_(src, dst, mapping, str(backend))
    else:
        dispatch.select(op, backend, (src, dst, mapping), {}).forward(src, dst, mapping)
        mark_written(dst)


@torch.library.custom_op("kernelset::swap_blocks_", mutates_args=("dst",))
def _swap_op(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor, backend: str) -> None:
    dispatch.select("swap_blocks", backend, (src, dst, block_mapping), {}).forward(src, dst, block_mapping)


@_swap_op.register_fake
def _(src, dst, block_mapping, backend):
    return None
