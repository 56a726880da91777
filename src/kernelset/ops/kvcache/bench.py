"""Benchmark adapters of the KV-cache ops.

reshape_and_cache shape: (tokens, Hkv, D[, 8 for an fp8 cache]); key and value are slices of one
fused qkv projection (token-strided, as a serving engine passes them) and tokens land in 16-token
blocks drawn at random from the cache. Peers: vLLM's torch-native path
(``cache.view(-1, H, D)[slots] = key``) and torch.compile of it.
copy_blocks shape: (layers, pairs, block_size, Hkv, D); peer: torch indexing per layer.
Every runner writes its own copies of the caches, so each first call starts from the same state.
"""
from __future__ import annotations

import torch

from ...bench.adapter import BenchAdapter, ShapeGrammar, compiled
from ..quant.formats import FP8, quantize
from . import api
from . import reference as R

_BS = 16


def _cache_inputs(shape, dtype, device, mode):
    if len(shape) == 2:  # (tokens, anything) from ksctl verify / plan: a small GQA layer
        shape = (min(shape[0], 64), 2, 64)
    t, h, d = shape[:3]
    fp8 = len(shape) > 3 and shape[3] == 8
    nb = -(-t // _BS) + 1
    qkv = torch.randn(t, (4 * h + 2 * h) * d, dtype=dtype, device=device)
    key = qkv[:, 4 * h * d: 5 * h * d].view(t, h, d)
    value = qkv[:, 5 * h * d:].view(t, h, d)
    blocks = torch.randperm(nb, device=device)[: -(-t // _BS)]
    pos = torch.arange(t, device=device)
    slots = blocks[pos // _BS] * _BS + pos % _BS
    cdt = FP8 if fp8 else dtype
    k_cache = torch.randn(nb, _BS, h, d, device=device).to(cdt)
    v_cache = torch.randn(nb, _BS, h, d, device=device).to(cdt)
    scales = (torch.tensor(0.05, device=device), torch.tensor(0.04, device=device)) if fp8 else (None, None)
    return {"key": key, "value": value, "k_cache": k_cache, "v_cache": v_cache, "slots": slots, "scales": scales,
            "names": ("k_cache", "v_cache")}


def _native_cache(key, value, k_cache, v_cache, slots, k_scale, v_scale):
    h, d = key.shape[1:]
    k_cache.view(-1, h, d)[slots] = quantize(key, k_scale, k_cache.dtype)
    v_cache.view(-1, h, d)[slots] = quantize(value, v_scale, v_cache.dtype)
    return k_cache, v_cache


def _own_cache(fn, inp):
    kc, vc = inp["k_cache"].clone(), inp["v_cache"].clone()

    def run():
        fn(inp["key"], inp["value"], kc, vc, inp["slots"], *inp["scales"])
        return kc, vc
    return run


def _cache_reference(inp, mode):
    kc, vc = inp["k_cache"].clone(), inp["v_cache"].clone()
    R.reshape_and_cache(inp["key"], inp["value"], kc, vc, inp["slots"], *inp["scales"])
    return kc, vc


def _ours_cache(inp, mode, backend):
    def fn(k, v, kc, vc, s, ks, vs):
        api.reshape_and_cache(k, v, kc, vc, s, k_scale=ks, v_scale=vs, check_slots=False, backend=backend)
    return _own_cache(fn, inp)


def _copy_inputs(shape, dtype, device, mode):
    if len(shape) == 2:  # (pairs, anything) from ksctl verify / plan: two small layers
        shape = (2, min(shape[0], 16), 4, 2, 64)
    layers, pairs, bs, h, d = shape
    nb = 2 * pairs + 1
    ks = [torch.randn(nb, bs, h, d, device=device).to(dtype) for _ in range(layers)]
    vs = [torch.randn(nb, bs, h, d, device=device).to(dtype) for _ in range(layers)]
    perm = torch.randperm(nb, device=device)
    mapping = torch.stack([perm[:pairs], perm[pairs: 2 * pairs]], 1).contiguous()
    names = tuple(f"k_cache{i}" for i in range(layers)) + tuple(f"v_cache{i}" for i in range(layers))
    return {"k_caches": ks, "v_caches": vs, "mapping": mapping, "names": names}


def _native_copy(k_caches, v_caches, mapping):
    src, dst = mapping[:, 0], mapping[:, 1]
    for c in (*k_caches, *v_caches):
        c[dst] = c[src]


def _own_copy(fn, inp):
    ks = [c.clone() for c in inp["k_caches"]]
    vs = [c.clone() for c in inp["v_caches"]]

    def run():  # the caches themselves: a torch.stack here would be timed too (2 GiB moved per call)
        fn(ks, vs, inp["mapping"])
        return (*ks, *vs)
    return run


def _copy_reference(inp, mode):
    ks = [c.clone() for c in inp["k_caches"]]
    vs = [c.clone() for c in inp["v_caches"]]
    R.copy_blocks(ks, vs, inp["mapping"])
    return (*ks, *vs)


def _swap_inputs(shape, dtype, device, mode):
    pairs, bs, h, d = (min(shape[0], 16), 4, 2, 64) if len(shape) == 2 else shape
    src = torch.randn(2 * pairs + 3, bs, h, d, device=device).to(dtype)
    dst = torch.randn(2 * pairs + 1, bs, h, d).to(dtype)
    if device.type == "cuda":
        dst = dst.pin_memory()
    perm_s, perm_d = torch.randperm(src.shape[0])[:pairs], torch.randperm(dst.shape[0])[:pairs]
    return {"src": src, "dst": dst, "mapping": torch.stack([perm_s, perm_d], 1), "names": ("swapped",)}  # (a name starting with "d" is judged as a gradient)


def _own_swap(fn, inp):
    dst = inp["dst"].clone()

    def run():
        fn(inp["src"], dst, inp["mapping"])
        if inp["src"].is_cuda:  # the host copy is asynchronous (pinned): wait before it is read
            torch.cuda.synchronize()
        return (dst,)
    return run


def _swap_reference(inp, mode):
    dst = inp["dst"].clone()
    dst[inp["mapping"][:, 1]] = inp["src"].cpu()[inp["mapping"][:, 0]]
    return (dst,)


ADAPTERS = {
    "reshape_and_cache": BenchAdapter(
        inputs=_cache_inputs, ours=_ours_cache,
        peers=lambda inp, mode: {"torch-eager": _own_cache(_native_cache, inp),
                                 "torch.compile": _own_cache(compiled(_native_cache), inp)},
        reference=_cache_reference,
        args=lambda inp: (inp["key"], inp["value"], inp["k_cache"], inp["v_cache"], inp["slots"]),
        shape=ShapeGrammar("TxHxDxBITS", f"T tokens, H KV heads, D head dim, into blocks of {_BS} tokens; BITS 16 "
                           "(the dtype's cache) or 8 (fp8 e4m3)", short=("TxHxD",), defaults={"BITS": 16},
                           choices={"BITS": (8, 16)}),
    ),
    "copy_blocks": BenchAdapter(
        inputs=_copy_inputs,
        ours=lambda inp, mode, backend: _own_copy(
            lambda k, v, m: api.copy_blocks(k, v, m, check_blocks=False, backend=backend), inp),
        peers=lambda inp, mode: {"torch-eager": _own_copy(_native_copy, inp)},
        reference=_copy_reference,
        args=lambda inp: (inp["k_caches"], inp["v_caches"], inp["mapping"]),
        shape=ShapeGrammar("LAYERSxPAIRSxBLOCKxHxD", "LAYERS k and v caches, PAIRS (src, dst) block pairs, blocks "
                           "of BLOCK tokens x H heads x D"),
    ),
    "swap_blocks": BenchAdapter(
        inputs=_swap_inputs,
        ours=lambda inp, mode, backend: _own_swap(lambda s, d, m: api.swap_blocks(s, d, m, backend=backend), inp),
        peers=lambda inp, mode: {},
        reference=_swap_reference,
        args=lambda inp: (inp["src"], inp["dst"], inp["mapping"]),
        shape=ShapeGrammar("PAIRSxBLOCKxHxD", "PAIRS (src, dst) block pairs, device to host, blocks of BLOCK tokens "
                           "x H heads x D"),
    ),
}
