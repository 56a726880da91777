"""The RoPE, KV-cache and attention ops of the C ABI (ks.capi -> libkernelset.so, CPU path) against
the Python package's fp32 references (the public functions with backend="reference").

- rotary_embedding, mrope, qk_norm_rope: fp32/fp16/bf16, [T, H, D] and [T, H * D], q/k as views
  of a fused qkv buffer, partial rotary, GPT-J pairs, positions outside the cache (unrotated);
- reshape_and_cache, copy_blocks: bit-exact, strided key/value and caches, fp8 e4m3fn caches;
- paged_attention (decode and cu_seqlens_q prefill, GQA, window, softcap, sinks, lse, fp8 cache),
  merge_attn_states, flash_attention (bottom-right causal, Sq > Sk, Dv != D, strided q/k/v) and
  flash_attention_varlen (an empty sequence, rows past the last one);
- the split-KV workspace size bounds what the Python policy allocates;
- every failure class returns its status with a message naming the argument, and
  ks_query_support answers what the call does (data-dependent failures excepted: a query reads
  no data).

Outputs are poisoned with NaN first, so an element the library does not write fails.
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import inspect
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys

import pytest
import torch

import kernelset as ks
from kernelset import capi
from kernelset.core import config, registry
from kernelset.core.tolerance import rel_err, tolerance
from kernelset.ops.attention import launch as attn_launch
from kernelset.ops.kvcache import launch as kv_launch
from kernelset.ops.rope import launch as rope_launch


# the module's failure tables call the library at import: build it first (tests/conftest.py); a
# failed build fails here with its log
from conftest import build_capi  # noqa: E402

if build_capi() == "no gcc to build the C library":
    pytest.skip(build_capi(), allow_module_level=True)
elif build_capi():
    raise RuntimeError(build_capi())

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
FP8 = torch.float8_e4m3fn
REF = dict(backend="reference")


def _ids(dtypes):
    return [str(d).replace("torch.", "") for d in dtypes]


def _close(out: torch.Tensor, ref: torch.Tensor, op: str, dtype: torch.dtype) -> None:
    """||out - ref|| / ||ref|| within the op's tolerance class for dtype (one table)."""
    err = rel_err(out.float(), ref.float())
    tol = tolerance(registry.op(op).tolerance, dtype)
    assert err <= tol, f"{op} {dtype}: relative error {err:.3g} > {tol:.3g}"


def _ulp_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    """Within one unit in the last place of the storage dtype (same fp32 math, one rounding)."""
    eps = torch.finfo(out.dtype).eps
    torch.testing.assert_close(out.float(), ref.float(), rtol=eps, atol=eps * 1e-3)


def _lse_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    """lse: the same -inf rows, the finite ones close (fp32 sums over fp32 products)."""
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref)), "rows without keys differ"
    fin = ~torch.isneginf(ref)
    torch.testing.assert_close(out[fin], ref[fin].float(), rtol=1e-5, atol=2e-5)


def _nan_like(x: torch.Tensor, shape=None, dtype=None) -> torch.Tensor:
    return torch.full(tuple(x.shape) if shape is None else shape, float("nan"), dtype=dtype or x.dtype)


def _query_ok(op: str, tensors, options) -> None:
    s = capi.query_support(op, tensors, options)
    assert s.ok, f"query_support({op}) = {s.name}: {s.message}"


# ---- RoPE


def _cache(max_pos: int, rot: int, dtype=torch.float32) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    f = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv
    return torch.cat([f.cos(), f.sin()], -1).to(dtype)


ROPE_LAYOUTS = [
    "3d",        # q [T, Hq, D], k [T, Hk, D]
    "2d",        # q [T, Hq * D], k [T, Hk * D], head_size given
    "qkv_view",  # q and k are token-strided 2-D views of a fused [T, (Hq + 2 Hk) * D] projection
    "partial",   # rotary_dim 16 of a head of 24 (the tail stays), k absent
]


def _rope_inputs(layout: str, dtype: torch.dtype, t: int = 6, hq: int = 4, hk: int = 2, d: int = 24):
    """(q, k, holder, head_size option, rotary_dim): holder is the buffer whose every element is
    compared (the whole fused buffer for views)."""
    rot = 16 if layout == "partial" else d
    if layout == "qkv_view":
        qkv = torch.randn(t, (hq + 2 * hk) * d).to(dtype)
        return qkv[:, : hq * d], qkv[:, hq * d: (hq + hk) * d], qkv, d, rot
    q = torch.randn(t, hq, d).to(dtype)
    k = None if layout == "partial" else torch.randn(t, hk, d).to(dtype)
    if layout == "2d":
        return q.reshape(t, hq * d), k.reshape(t, hk * d), None, d, rot
    return q, k, None, 0, rot


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids(DTYPES))
@pytest.mark.parametrize("layout", ROPE_LAYOUTS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
def test_rotary_embedding(dtype, layout, interleaved):
    q, k, holder, hs, rot = _rope_inputs(layout, dtype)
    t = q.shape[0]
    cache = _cache(64, rot, torch.float32 if dtype == torch.float32 or layout != "3d" else dtype)
    pos = torch.randint(0, 64, (t,), dtype=torch.int32 if interleaved else torch.int64)
    before = (holder if holder is not None else q).clone()
    if holder is not None:
        ref_holder = holder.clone()
        rq, rk = ref_holder[:, : q.shape[1]], ref_holder[:, q.shape[1]: q.shape[1] + k.shape[1]]
    else:
        rq, rk = q.clone(), None if k is None else k.clone()
    ks.rotary_embedding(pos, rq, rk, cache, interleaved=interleaved, head_size=hs or None, **REF)
    o = capi.options("rotary_embedding", interleaved=interleaved, head_size=hs)
    _query_ok("rotary_embedding", [pos, q, k, cache], o)
    capi.rotary_embedding(pos, q, k, cache, options=o)
    if holder is not None:
        _ulp_close(holder, ref_holder)  # the v third of the buffer is untouched too
    else:
        _ulp_close(q, rq)
        if k is not None:
            _ulp_close(k, rk)
    _close(q, rq, "rotary_embedding", dtype)
    if layout == "partial":
        assert torch.equal(q[..., rot:], before[..., rot:]), "features past rotary_dim changed"


def test_rotary_embedding_positions_outside_the_cache():
    """A position outside [0, max_pos) leaves its token unrotated (the Python package's
    documented semantics, what its kernels do): nothing is read outside the cache."""
    q = torch.randn(5, 2, 8)
    cache = _cache(10, 8)
    pos = torch.tensor([0, -1, 10, 3, 9])
    rq = q.clone()
    ks.mrope(pos, rq, None, cache, (4, 0, 0), **REF)  # the reference of [T] positions with this guard
    before = q.clone()
    capi.rotary_embedding(pos, q, None, cache)
    _ulp_close(q, rq)
    assert torch.equal(q[1:3], before[1:3])


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids(DTYPES))
@pytest.mark.parametrize("mrope_interleaved", [False, True], ids=["bands", "interleaved"])
@pytest.mark.parametrize("positions", ["3xT", "T"])
def test_mrope(dtype, mrope_interleaved, positions):
    t, d = 5, 32
    q = torch.randn(t, 4 * d).to(dtype)  # [T, H * D]
    k = torch.randn(t, 2, d).to(dtype)
    cache = _cache(40, d)
    pos = torch.randint(-2, 42, (3, t) if positions == "3xT" else (t,))  # a few out of range
    section = (8, 2, 6)  # interleaved: height only below 3 * 2, width below 3 * 6
    rq, rk = q.clone(), k.clone()
    ks.mrope(pos, rq, rk, cache, section, mrope_interleaved=mrope_interleaved, head_size=d, **REF)
    o = capi.options("mrope", mrope_section=section, mrope_interleaved=mrope_interleaved, head_size=d)
    _query_ok("mrope", [pos, q, k, cache], o)
    capi.mrope(pos, q, k, cache, options=o)
    _ulp_close(q, rq)
    _ulp_close(k, rk)


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids(DTYPES))
@pytest.mark.parametrize("cast", ["llama", "gemma"])
@pytest.mark.parametrize("variant", ["rope", "mrope_partial_view", "no_k"])
def test_qk_norm_rope(dtype, cast, variant):
    t, hq, hk, d = 5, 4, 2, 32
    offset = 1.0 if cast == "gemma" else 0.0
    rot = 16 if variant == "mrope_partial_view" else d
    qkv = torch.randn(t, (hq + 2 * hk) * d).to(dtype) * 3
    q, k = qkv[:, : hq * d], qkv[:, hq * d: (hq + hk) * d]  # token-strided views
    if variant != "mrope_partial_view":
        q, k = q.reshape(t, hq, d).clone(), k.reshape(t, hk, d).clone()
    if variant == "no_k":
        k = None
    qw, kw = torch.randn(d).to(dtype), None if k is None else torch.randn(d).to(dtype)
    cache = _cache(30, rot)
    section = (4, 2, 2) if variant == "mrope_partial_view" else None
    pos = torch.randint(0, 30, (3, t)) if section else torch.randint(0, 30, (t,), dtype=torch.int32)
    ref_q, ref_k = q.clone(), None if k is None else k.clone()
    ks.qk_norm_rope(ref_q, ref_k, qw, kw, cache, pos, eps=1e-6, offset=offset, cast=cast, head_size=d,
                    mrope_section=section, **REF)
    o = capi.options("qk_norm_rope", eps=1e-6, offset=offset, cast=cast, head_size=d,
                     mrope_section=section or (0, 0, 0))
    _query_ok("qk_norm_rope", [q, k, qw, kw, cache, pos], o)
    capi.qk_norm_rope(q, k, qw, kw, cache, pos, options=o)
    _close(q, ref_q, "qk_norm_rope", dtype)
    if k is not None:
        _close(k, ref_k, "qk_norm_rope", dtype)
    if dtype != torch.float32:
        # the same chain of roundings as the reference (cast, cos/sin rounded, each product
        # rounded): bit-equal but where the mean's reduction order flips a rounding
        for x, r in ((q, ref_q), (k, ref_k)):
            if x is not None:
                assert (x != r).float().mean() <= 0.01, (x != r).float().mean()


# ---- KV cache


def _fp8_bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.uint8) if x.dtype == FP8 else x


CACHE_CASES = [(torch.float32, torch.float32), (torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
               (torch.bfloat16, FP8), (torch.float16, FP8), (torch.float32, FP8)]


@pytest.mark.parametrize("kv_dtype,cache_dtype", CACHE_CASES, ids=[f"{_ids([a])[0]}-{_ids([b])[0]}"
                                                                     for a, b in CACHE_CASES])
def test_reshape_and_cache(kv_dtype, cache_dtype):
    t, h, d, nb, bs = 7, 2, 16, 5, 4
    qkv = torch.randn(t, 3 * h, d).to(kv_dtype) * 100  # saturates some fp8 values
    key, value = qkv[:, h: 2 * h], qkv[:, 2 * h:]  # token- and head-strided views
    kv = torch.randn(nb, 2, bs, h, d).to(cache_dtype)  # caches as kv[:, 0] / kv[:, 1] views
    k_cache, v_cache = kv[:, 0], kv[:, 1]
    slots = torch.tensor([3, -1, 19, 0, 7, -1, 12], dtype=torch.int32 if cache_dtype == FP8 else torch.int64)
    scales = (torch.tensor(2.5), torch.tensor([0.75])) if cache_dtype == FP8 else (None, None)
    ref = kv.clone()
    ks.reshape_and_cache(key, value, ref[:, 0], ref[:, 1], slots, k_scale=scales[0], v_scale=scales[1], **REF)
    _query_ok("reshape_and_cache", [key, value, k_cache, v_cache, slots, *scales], None)
    capi.reshape_and_cache(key, value, k_cache, v_cache, slots, *scales)
    assert torch.equal(_fp8_bits(kv), _fp8_bits(ref))


@pytest.mark.parametrize("dtype", [torch.float16, FP8], ids=["float16", "float8_e4m3fn"])
def test_copy_blocks(dtype):
    nb = 6
    shapes = [(nb, 4, 2, 8), (nb, 2, 3, 16)]  # layers may differ in block shape
    kc = [torch.randn(s).to(dtype) for s in shapes]
    vc = [torch.randn(s).to(dtype) for s in shapes]
    mapping = torch.tensor([[0, 3], [5, 1], [2, 4]])
    rk, rv = [c.clone() for c in kc], [c.clone() for c in vc]
    ks.copy_blocks(rk, rv, mapping, **REF)
    _query_ok("copy_blocks", [*kc, *vc, mapping], None)
    capi.copy_blocks(kc, vc, mapping)
    for a, b in zip(kc + vc, rk + rv):
        assert torch.equal(_fp8_bits(a), _fp8_bits(b))


# ---- attention


def _paged_setup(dtype, cache_dtype, lens, nb=12, bs=4, hkv=2, g=2, d=16, width=4):
    """Random caches; each sequence's blocks are distinct random block ids (entries past its
    length are garbage ids, never read)."""
    kc = torch.randn(nb, bs, hkv, d).to(cache_dtype)
    vc = torch.randn(nb, bs, hkv, d).to(cache_dtype)
    perm = torch.randperm(nb)
    bt = torch.full((len(lens), width), 10**6, dtype=torch.int32)
    i = 0
    for b, n in enumerate(lens):
        used = -(-n // bs)
        bt[b, :used] = perm[i: i + used].to(torch.int32)
        i += used
    return kc, vc, bt, torch.tensor(lens, dtype=torch.int32), hkv * g, d


PAGED_VARIANTS = {
    # name: (cache fp8, prefill, options); decode lengths include an empty sequence
    "decode": (False, False, dict()),
    "decode_window_softcap_sinks": (False, False, dict(window=(3, -1), softcap=2.0, sinks=True)),
    "decode_noncausal_scale": (False, False, dict(causal=False, scale=0.3)),
    "prefill_causal": (False, True, dict()),
    "prefill_window": (False, True, dict(causal=False, window=(2, 1), sinks=True)),
    "fp8": (True, False, dict(softcap=5.0)),
    "fp8_prefill": (True, True, dict()),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids(DTYPES))
@pytest.mark.parametrize("variant", list(PAGED_VARIANTS))
def test_paged_attention(dtype, variant):
    fp8, prefill, opt = PAGED_VARIANTS[variant]
    if fp8 and dtype == torch.float32:
        pytest.skip("an fp8 cache takes fp16/bf16 queries (as the Python package)")
    lens = [7, 3, 13] if prefill else [5, 0, 13]
    kc, vc, bt, seq_lens, hq, d = _paged_setup(dtype, FP8 if fp8 else dtype, lens)
    if prefill:
        cu = torch.tensor([0, 3, 5, 9], dtype=torch.int32)  # 3, 2 and 4 new tokens
        t, max_q = 9, 4
    else:
        cu, t, max_q = None, len(lens), 0
    qbuf = torch.randn(t, hq + 3, d).to(dtype)
    q = qbuf[:, 1: hq + 1]  # token-strided view
    sinks = torch.randn(hq) if opt.get("sinks") else None
    k_scale, v_scale = (torch.tensor(0.5), torch.tensor([1.5])) if fp8 else (None, None)
    causal = opt.get("causal", True)
    window = opt.get("window", (-1, -1))
    ref_out, ref_lse = ks.paged_attention(q, kc, vc, bt, seq_lens, cu_seqlens_q=cu, max_seqlen_q=max(max_q, 1),
                                          causal=causal, scale=opt.get("scale"), window=window,
                                          softcap=opt.get("softcap", 0.0), sinks=sinks, k_scale=k_scale,
                                          v_scale=v_scale, return_lse=True, **REF)
    out = _nan_like(q)
    lse = _nan_like(q, (t, hq), torch.float32)
    o = capi.options("paged_attention", scale=opt.get("scale") or 0.0, causal=causal, window_left=window[0],
                     window_right=window[1], softcap=opt.get("softcap", 0.0))
    _query_ok("paged_attention", [q, kc, vc, bt, seq_lens, cu, sinks, k_scale, v_scale, out, lse, None], o)
    capi.paged_attention(q, kc, vc, bt, seq_lens, cu, max_q, 0, sinks, k_scale, v_scale, out=out, lse=lse, options=o)
    _close(out, ref_out, "paged_attention", dtype)
    _lse_close(lse, ref_lse)


POLICY_PARAMS = inspect.signature(attn_launch.paged_policy).parameters


def test_paged_attention_workspace_size_bounds_the_python_policy():
    """ks_paged_attention_workspace_size holds the split-KV scratch the Python launcher would
    allocate ([T, Hq, splits, D] + [T, Hq, splits] fp32) on any GPU (any SM count)."""
    for t, hkv, g, d, max_q, keys in [(1, 8, 4, 128, 1, 32768), (4, 1, 8, 64, 1, 2000), (64, 8, 1, 128, 1, 100000),
                                      (9, 2, 2, 256, 4, 5000), (3, 4, 2, 64, 1, 200)]:
        hq = hkv * g
        q = torch.empty(t, hq, d, dtype=torch.bfloat16)
        cache = torch.empty(1, 16, hkv, d, dtype=torch.bfloat16)
        have = capi.paged_attention_workspace_size(q, cache, keys)
        b = t if max_q == 1 else max(1, t // max_q)
        for sms in (1, 8, 78, 132, 1000):
            for extra in ({}, {"fp8": True}) if "fp8" in POLICY_PARAMS else ({},):
                p = attn_launch.paged_policy(b, hkv, g, d, max_q, keys, sms, **extra)
                need = 0 if p.splits == 1 else t * hq * p.splits * (d + 1) * 4
                assert need <= have, (t, hkv, g, d, keys, sms, p.splits, need, have)
    assert capi.paged_attention_workspace_size(torch.empty(2, 4, 8), torch.empty(1, 16, 2, 8), 1000) == 1152


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids(DTYPES))
def test_merge_attn_states(dtype):
    t, h, d = 6, 3, 16
    buf = torch.randn(t, h, 2 * d).to(dtype)
    out_a, out_b = buf[..., :d], torch.randn(t, h, d).to(dtype)  # out_a head-strided
    lse_a, lse_b = torch.randn(t, h) * 3, torch.randn(t, h) * 3
    lse_a[0, 1] = float("-inf")  # an empty part
    lse_a[2, :] = lse_b[2, :] = float("-inf")  # both empty: out 0, lse -inf
    ref_out, ref_lse = ks.merge_attn_states(out_a, lse_a, out_b, lse_b, **REF)
    out, lse = _nan_like(out_b), _nan_like(lse_a)
    _query_ok("merge_attn_states", [out_a, lse_a, out_b, lse_b, out, lse], None)
    capi.merge_attn_states(out_a, lse_a, out_b, lse_b, out=out, lse=lse)
    _close(out, ref_out, "merge_attn_states", dtype)
    _lse_close(lse, ref_lse)
    assert torch.equal(out[2], torch.zeros_like(out[2]))


FLASH_VARIANTS = {
    # name: (Sq, Sk, Dv, strided qkv, options)
    "plain": (5, 7, 16, False, dict()),
    "causal": (5, 7, 16, False, dict(causal=True)),  # bottom-right: query i sits at position Sk - Sq + i
    "causal_strided": (6, 6, 16, True, dict(causal=True)),
    "causal_more_queries": (6, 3, 16, False, dict(causal=True)),  # the first rows see no key
    "window_softcap": (7, 7, 16, True, dict(window=(2, 1), softcap=3.0)),
    "sinks_dv": (4, 9, 8, False, dict(causal=True, sinks=True, scale=0.5)),
    "no_keys_sinks": (3, 0, 16, False, dict(sinks=True)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids(DTYPES))
@pytest.mark.parametrize("variant", list(FLASH_VARIANTS))
def test_flash_attention(dtype, variant):
    sq, sk, dv, strided, opt = FLASH_VARIANTS[variant]
    b, hq, hkv, d = 2, 4, 2, 16
    if strided:  # q, k, v as views of one [B, S, Hq + 2 Hkv, D] projection (Sq = Sk)
        qkv = torch.randn(b, sq, hq + 2 * hkv, d).to(dtype)
        q, k, v = qkv[:, :, :hq], qkv[:, :, hq: hq + hkv], qkv[:, :, hq + hkv:]
    else:
        q = torch.randn(b, sq, hq, d).to(dtype)
        k, v = torch.randn(b, sk, hkv, d).to(dtype), torch.randn(b, sk, hkv, dv).to(dtype)
    sinks = torch.randn(hq) if opt.get("sinks") else None
    causal, window = opt.get("causal", False), opt.get("window", (-1, -1))
    ref_out, ref_lse = ks.flash_attention(q, k, v, causal=causal, scale=opt.get("scale"), window=window,
                                          softcap=opt.get("softcap", 0.0), sinks=sinks, return_lse=True, **REF)
    out = _nan_like(q, (b, sq, hq, v.shape[-1]))
    lse = _nan_like(q, (b, hq, sq), torch.float32)
    o = capi.options("flash_attention", scale=opt.get("scale") or 0.0, causal=causal, window_left=window[0],
                     window_right=window[1], softcap=opt.get("softcap", 0.0))
    _query_ok("flash_attention", [q, k, v, sinks, out, lse], o)
    capi.flash_attention(q, k, v, sinks, out=out, lse=lse, options=o)
    _close(out, ref_out, "flash_attention", dtype)
    _lse_close(lse, ref_lse)


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids(DTYPES))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flash_attention_varlen(dtype, causal):
    hq, hkv, d, dv = 4, 1, 16, 8
    cu_q = torch.tensor([0, 3, 3, 8], dtype=torch.int32)  # sequence 1 is empty; rows 8, 9 belong to none
    cu_k = torch.tensor([0, 5, 7, 10], dtype=torch.int32)
    q = torch.randn(10, hq, d).to(dtype)
    kv = torch.randn(10, hkv, d + dv).to(dtype)
    k, v = kv[..., :d], kv[..., d:]  # head-strided views
    sinks = torch.randn(hq) if causal else None
    ref_out, ref_lse = ks.flash_attention_varlen(q, k, v, cu_q, cu_k, 5, 5, causal=causal, window=(3, -1),
                                                 sinks=sinks, return_lse=True, **REF)
    out = _nan_like(q, (10, hq, dv))
    lse = _nan_like(q, (hq, 10), torch.float32)
    o = capi.options("flash_attention_varlen", causal=causal, window_left=3)
    _query_ok("flash_attention_varlen", [q, k, v, cu_q, cu_k, sinks, out, lse], o)
    capi.flash_attention_varlen(q, k, v, cu_q, cu_k, 5, 5, sinks, out=out, lse=lse, options=o)
    _close(out, ref_out, "flash_attention_varlen", dtype)
    _lse_close(lse, ref_lse)


# ---- failures: status, message naming the argument, and ks_query_support agreeing


def _rope_args():
    return dict(pos=torch.tensor([1, 2, 3]), q=torch.randn(3, 2, 8), k=torch.randn(3, 1, 8), cache=_cache(8, 8))


def _kv_args():
    return dict(key=torch.randn(3, 2, 8), value=torch.randn(3, 2, 8), kc=torch.zeros(4, 2, 2, 8),
                vc=torch.zeros(4, 2, 2, 8), slots=torch.tensor([0, 8, -1]))  # 8: the first slot past the cache


def _paged_args():
    kc, vc, bt, lens, hq, d = _paged_setup(torch.float32, torch.float32, [5, 2], nb=6, bs=4, hkv=2, g=1, d=8, width=2)
    q = torch.randn(2, hq, d)
    return dict(q=q, kc=kc, vc=vc, bt=bt, lens=lens, out=torch.empty_like(q), lse=torch.empty(2, hq))


def _flash_args():
    q, k, v = torch.randn(1, 3, 2, 8), torch.randn(1, 4, 1, 8), torch.randn(1, 4, 1, 8)
    return dict(q=q, k=k, v=v, out=torch.empty_like(q), lse=torch.empty(1, 2, 3))


def _varlen_args():
    q, k, v = torch.randn(5, 2, 8), torch.randn(6, 1, 8), torch.randn(6, 1, 8)
    return dict(q=q, k=k, v=v, cu_q=torch.tensor([0, 2, 5], dtype=torch.int32),
                cu_k=torch.tensor([0, 3, 6], dtype=torch.int32), out=torch.empty_like(q), lse=torch.empty(2, 5))


def _rope_call(a, opts=None, **over):
    a = {**a, **over}
    o = capi.options("rotary_embedding", **(opts or {}))
    return ("rotary_embedding", lambda: capi.rotary_embedding(a["pos"], a["q"], a["k"], a["cache"], options=o),
            [a["pos"], a["q"], a["k"], a["cache"]], o)


def _qk_call(a, opts=None, **over):
    a = {**dict(qw=torch.ones(8), kw=torch.ones(8)), **a, **over}
    o = capi.options("qk_norm_rope", **(opts or {}))
    return ("qk_norm_rope", lambda: capi.qk_norm_rope(a["q"], a["k"], a["qw"], a["kw"], a["cache"], a["pos"],
                                                      options=o),
            [a["q"], a["k"], a["qw"], a["kw"], a["cache"], a["pos"]], o)


def _mrope_call(a, opts=None, **over):
    a = {**a, **over}
    o = capi.options("mrope", **{"mrope_section": (2, 1, 1), **(opts or {})})
    return ("mrope", lambda: capi.mrope(a["pos"], a["q"], a["k"], a["cache"], options=o),
            [a["pos"], a["q"], a["k"], a["cache"]], o)


def _kv_call(a, **over):
    a = {**dict(ks=None, vs=None), **a, **over}
    args = [a["key"], a["value"], a["kc"], a["vc"], a["slots"], a["ks"], a["vs"]]
    return ("reshape_and_cache", lambda: capi.reshape_and_cache(*args), args, None)


def _copy_call(kc, vc, mapping):
    return ("copy_blocks", lambda: capi.copy_blocks(kc, vc, mapping), [*kc, *vc, mapping], None)


def _paged_call(a, opts=None, cu=None, max_q=0, max_seq_len=0, **over):
    a = {**dict(sinks=None, ks=None, vs=None, ws=None), **a, **over}
    o = capi.options("paged_attention", **(opts or {}))
    return ("paged_attention",
            lambda: capi.paged_attention(a["q"], a["kc"], a["vc"], a["bt"], a["lens"], cu, max_q, max_seq_len,
                                         a["sinks"], a["ks"], a["vs"], out=a["out"], lse=a["lse"], workspace=a["ws"],
                                         options=o),
            [a["q"], a["kc"], a["vc"], a["bt"], a["lens"], cu, a["sinks"], a["ks"], a["vs"], a["out"], a["lse"],
             a["ws"]], o)


def _merge_call(**over):
    a = dict(oa=torch.randn(2, 3, 4), la=torch.randn(2, 3), ob=torch.randn(2, 3, 4), lb=torch.randn(2, 3),
             out=torch.empty(2, 3, 4), lse=torch.empty(2, 3))
    a.update(over)
    args = [a["oa"], a["la"], a["ob"], a["lb"], a["out"], a["lse"]]
    return ("merge_attn_states", lambda: capi.merge_attn_states(*args[:4], out=a["out"], lse=a["lse"]), args, None)


def _flash_call(a, opts=None, **over):
    a = {**dict(sinks=None), **a, **over}
    o = capi.options("flash_attention", **(opts or {}))
    return ("flash_attention", lambda: capi.flash_attention(a["q"], a["k"], a["v"], a["sinks"], out=a["out"],
                                                            lse=a["lse"], options=o),
            [a["q"], a["k"], a["v"], a["sinks"], a["out"], a["lse"]], o)


def _varlen_call(a, opts=None, max_q=3, max_k=3, **over):
    a = {**dict(sinks=None), **a, **over}
    o = capi.options("flash_attention_varlen", **(opts or {}))
    return ("flash_attention_varlen",
            lambda: capi.flash_attention_varlen(a["q"], a["k"], a["v"], a["cu_q"], a["cu_k"], max_q, max_k,
                                                a["sinks"], out=a["out"], lse=a["lse"], options=o),
            [a["q"], a["k"], a["v"], a["cu_q"], a["cu_k"], a["sinks"], a["out"], a["lse"]], o)


def _strided_last(x: torch.Tensor) -> torch.Tensor:
    """x's values with a last dim of stride 2."""
    return torch.stack([x, x], -1).flatten(-2)[..., ::2]


def _on_cuda(t: torch.Tensor) -> capi.DLTensor:
    """t's descriptor claiming CUDA memory: only for calls that are refused before any data is
    touched (mixed devices) and for queries (which read no data)."""
    dl = capi.to_dltensor(t)
    dl.device = capi._abi.DLDevice(capi._abi.KDL_CUDA, 0)
    return dl


INV, DT, LAY, DEV, NI = (capi._abi.INVALID_ARGUMENT, capi._abi.UNSUPPORTED_DTYPE, capi._abi.UNSUPPORTED_LAYOUT,
                         capi._abi.UNSUPPORTED_DEVICE, capi._abi.NOT_IMPLEMENTED)

# id -> (builder of (op, call, query tensors, options), status, text the message contains, whether
# only the data shows it: then the query, which reads no data, answers KS_OK)
FAILURES = {
    "rope_q_null": (lambda: _rope_call(_rope_args(), q=None), INV, "q:", False),
    "rope_q_int": (lambda: _rope_call(_rope_args(), q=torch.zeros(3, 2, 8, dtype=torch.int32)), DT, "q:", False),
    "rope_positions_float": (lambda: _rope_call(_rope_args(), pos=torch.zeros(3)), DT, "positions:", False),
    "rope_positions_shape": (lambda: _rope_call(_rope_args(), pos=torch.zeros(4, dtype=torch.int64)), INV,
                             "positions:", False),
    "rope_2d_without_head_size": (lambda: _rope_call(_rope_args(), q=torch.randn(3, 16)), INV, "head_size:", False),
    "rope_head_size_mismatch": (lambda: _rope_call(_rope_args(), dict(head_size=4)), INV, "head_size:", False),
    "rope_rotary_dim": (lambda: _rope_call(_rope_args(), dict(rotary_dim=4)), INV, "rotary_dim:", False),
    "rope_cache_odd": (lambda: _rope_call(_rope_args(), cache=torch.randn(8, 5)), INV, "cos_sin_cache:", False),
    "rope_cache_wider_than_head": (lambda: _rope_call(_rope_args(), cache=_cache(8, 16)), INV, "q:", False),
    "rope_k_dtype": (lambda: _rope_call(_rope_args(), k=torch.randn(3, 1, 8).half()), DT, "k:", False),
    "rope_k_tokens": (lambda: _rope_call(_rope_args(), k=torch.randn(4, 1, 8)), INV, "k:", False),
    "rope_interleaved_value": (lambda: _rope_call(_rope_args(), dict(interleaved=2)), INV, "interleaved:", False),
    "rope_mixed_devices": (lambda: _rope_call(_rope_args(), cache=_on_cuda(_cache(8, 8))), DEV, "cos_sin_cache:",
                           False),
    "rope_q_overlapping": (lambda: _rope_call(_rope_args(), q=torch.randn(1, 2, 8).expand(3, 2, 8)), LAY, "q:",
                           False),
    "mrope_section_sum": (lambda: _mrope_call(_rope_args(), dict(mrope_section=(2, 2, 2))), INV, "mrope_section:",
                          False),
    "mrope_positions_shape": (lambda: _mrope_call(_rope_args(), pos=torch.zeros(2, 3, dtype=torch.int64)), INV,
                              "positions:", False),
    "qk_eps": (lambda: _qk_call(_rope_args(), dict(eps=0.0)), INV, "eps:", False),
    "qk_cast": (lambda: _qk_call(_rope_args(), dict(cast=5)), INV, "cast:", False),
    "qk_weight_shape": (lambda: _qk_call(_rope_args(), qw=torch.ones(4)), INV, "q_weight:", False),
    "qk_k_weight_without_k": (lambda: _qk_call(_rope_args(), k=None), INV, "k_weight:", False),
    "kv_slot_out_of_range": (lambda: _kv_call(_kv_args()), INV,
                             "slot_mapping: expected slots in [-1, 8) (num_blocks * block_size; -1 skips), got 8 at "
                             "index 1", True),
    "kv_key_shape": (lambda: _kv_call(_kv_args(), key=torch.randn(3, 1, 8)), INV, "key:", False),
    "kv_value_dtype": (lambda: _kv_call(_kv_args(), value=torch.randn(3, 2, 8).half()), DT, "value:", False),
    "kv_key_strided_last": (lambda: _kv_call(_kv_args(), key=_strided_last(torch.randn(3, 2, 8))), LAY, "key:",
                            False),
    "kv_cache_3d": (lambda: _kv_call(_kv_args(), kc=torch.zeros(4, 2, 16)), INV, "k_cache:", False),
    "kv_cache_dtype": (lambda: _kv_call(_kv_args(), kc=torch.zeros(4, 2, 2, 8).half(), vc=torch.zeros(4, 2, 2, 8)
                                        .half()), DT, "k_cache:", False),
    "kv_scale_for_plain_cache": (lambda: _kv_call(_kv_args(), ks=torch.tensor(1.0)), INV, "k_scale:", False),
    "kv_fp8_missing_scale": (lambda: _kv_call(_kv_args(), kc=torch.zeros(4, 2, 2, 8).to(FP8),
                                              vc=torch.zeros(4, 2, 2, 8).to(FP8), vs=torch.tensor(1.0)),
                             INV, "k_scale:", False),
    "kv_slots_dtype": (lambda: _kv_call(_kv_args(), slots=torch.zeros(3, dtype=torch.int16)), DT, "slot_mapping:",
                       False),
    "copy_block_out_of_range": (lambda: _copy_call([torch.zeros(3, 2, 1, 4)], [torch.zeros(3, 2, 1, 4)],
                                                   torch.tensor([[0, 1], [2, 3]])), INV,
                                "block_mapping: expected destination blocks in [0, 3), got 3 at row 1", True),
    "copy_layers_blocks": (lambda: _copy_call([torch.zeros(3, 2, 1, 4), torch.zeros(2, 2, 1, 4)],
                                              [torch.zeros(3, 2, 1, 4), torch.zeros(2, 2, 1, 4)],
                                              torch.tensor([[0, 1]])), INV, "k_caches[1]:", False),
    "copy_v_shape": (lambda: _copy_call([torch.zeros(3, 2, 1, 4)], [torch.zeros(3, 2, 1, 2)], torch.tensor([[0, 1]])),
                     INV, "v_caches[0]:", False),
    "copy_mapping_int32": (lambda: _copy_call([torch.zeros(3, 2, 1, 4)], [torch.zeros(3, 2, 1, 4)],
                                              torch.tensor([[0, 1]], dtype=torch.int32)), DT, "block_mapping:", False),
    "paged_block_id": (lambda: _paged_call(_paged_args(), bt=torch.tensor([[0, 6], [1, 2]], dtype=torch.int32)), INV,
                       "block_table: expected block ids in [0, 6) for every block a sequence uses, got 6 at [0, 1]",
                       True),
    "paged_seq_len_past_table": (lambda: _paged_call(_paged_args(), lens=torch.tensor([9, 2], dtype=torch.int32)),
                                 INV, "seq_lens:", True),
    "paged_seq_len_past_max": (lambda: _paged_call(_paged_args(), max_seq_len=4), INV, "in [0, 4] (max_seq_len and the "
                               "block table's 2 blocks of 4), got 5 at index 0", True),
    "paged_negative_block_id": (lambda: _paged_call(_paged_args(),
                                                    bt=torch.tensor([[0, 1], [-1, 2]], dtype=torch.int32)),
                                INV, "got -1 at [1, 0]", True),
    "paged_cu_not_to_T": (lambda: _paged_call(_paged_args(), cu=torch.tensor([0, 1, 1], dtype=torch.int32), max_q=2),
                          INV, "cu_seqlens_q:", True),
    "paged_cu_shape": (lambda: _paged_call(_paged_args(), cu=torch.tensor([0, 2], dtype=torch.int32), max_q=2), INV,
                       "cu_seqlens_q:", False),
    "paged_q_not_one_per_sequence": (lambda: _paged_call(_paged_args(), q=torch.randn(3, 2, 8),
                                                         out=torch.empty(3, 2, 8)), INV, "q:", False),
    "paged_gqa": (lambda: _paged_call(_paged_args(), q=torch.randn(2, 3, 8), out=torch.empty(2, 3, 8),
                                      lse=torch.empty(2, 3)), INV, "q: expected a multiple of the cache's 2 KV heads",
                  False),
    "paged_out_dtype": (lambda: _paged_call(_paged_args(), out=torch.empty(2, 2, 8).half()), DT, "out:", False),
    "paged_lse_shape": (lambda: _paged_call(_paged_args(), lse=torch.empty(2, 3)), INV, "lse:", False),
    "paged_sinks_dtype": (lambda: _paged_call(_paged_args(), sinks=torch.zeros(2).half()), DT, "sinks:", False),
    "paged_block_table_dtype": (lambda: _paged_call(_paged_args(), bt=torch.zeros(2, 2, dtype=torch.int64)), DT,
                                "block_table:", False),
    "paged_q_strided_last": (lambda: _paged_call(_paged_args(), q=_strided_last(torch.randn(2, 2, 8))), LAY, "q:",
                             False),
    "paged_softcap": (lambda: _paged_call(_paged_args(), dict(softcap=-1.0)), INV, "softcap:", False),
    "paged_window": (lambda: _paged_call(_paged_args(), dict(window_right=-3)), INV, "window_right:", False),
    "paged_causal_value": (lambda: _paged_call(_paged_args(), dict(causal=3)), INV, "causal:", False),
    "paged_workspace_dtype": (lambda: _paged_call(_paged_args(), ws=torch.zeros(16)), DT, "workspace:", False),
    "paged_fp8_with_fp32_q": (lambda: _paged_call(_paged_args(), kc=torch.zeros(6, 4, 2, 8).to(FP8),
                                                  vc=torch.zeros(6, 4, 2, 8).to(FP8), ks=torch.tensor(1.0),
                                                  vs=torch.tensor(1.0)), DT, "q:", False),
    "merge_lse_dtype": (lambda: _merge_call(la=torch.randn(2, 3).double()), DT, "lse_a:", False),
    "merge_out_b_shape": (lambda: _merge_call(ob=torch.randn(2, 3, 5)), INV, "out_b:", False),
    "merge_out_dtype": (lambda: _merge_call(out=torch.empty(2, 3, 4).half()), DT, "out:", False),
    "flash_k_batch": (lambda: _flash_call(_flash_args(), k=torch.randn(2, 4, 1, 8), v=torch.randn(2, 4, 1, 8)), INV,
                      "k:", False),
    "flash_v_tokens": (lambda: _flash_call(_flash_args(), v=torch.randn(1, 5, 1, 8)), INV, "v:", False),
    "flash_k_dtype": (lambda: _flash_call(_flash_args(), k=torch.randn(1, 4, 1, 8).bfloat16()), DT, "k:", False),
    "flash_out_shape": (lambda: _flash_call(_flash_args(), out=torch.empty(1, 3, 2, 4)), INV, "out:", False),
    "flash_lse_layout": (lambda: _flash_call(_flash_args(), lse=torch.empty(1, 3, 2)), INV, "lse:", False),
    "flash_scale": (lambda: _flash_call(_flash_args(), dict(scale=float("nan"))), INV, "scale:", False),
    "flash_sinks_shape": (lambda: _flash_call(_flash_args(), sinks=torch.zeros(3)), INV, "sinks:", False),
    "flash_v_strided_last": (lambda: _flash_call(_flash_args(), v=_strided_last(torch.randn(1, 4, 1, 8))), LAY, "v:",
                             False),
    "flash_out_overlapping": (lambda: _flash_call(_flash_args(), out=torch.empty(1, 1, 2, 8).expand(1, 3, 2, 8)), LAY,
                              "out:", False),
    "varlen_cu_decreasing": (lambda: _varlen_call(_varlen_args(), cu_k=torch.tensor([0, 4, 3], dtype=torch.int32),
                                                  max_k=4), INV,
                             "cu_seqlens_k: expected non-decreasing offsets from 0 to at most 6", True),
    "varlen_cu_past_tokens": (lambda: _varlen_call(_varlen_args(), cu_q=torch.tensor([0, 2, 6], dtype=torch.int32),
                                                   max_q=4), INV, "got 6 at index 2", True),
    "varlen_max_seqlen_k": (lambda: _varlen_call(_varlen_args(), max_k=2), INV, "max_seqlen_k:", True),
    "varlen_cu_dtype": (lambda: _varlen_call(_varlen_args(), cu_q=torch.tensor([0, 2, 5])), DT, "cu_seqlens_q:",
                        False),
    "varlen_cu_lengths": (lambda: _varlen_call(_varlen_args(), cu_k=torch.tensor([0, 6], dtype=torch.int32)), INV,
                          "cu_seqlens_k:", False),
    "varlen_lse_layout": (lambda: _varlen_call(_varlen_args(), lse=torch.empty(5, 2)), INV, "lse:", False),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_failure(case):
    build, status, text, data_only = FAILURES[case]
    op, call, tensors, options = build()
    if call is not None:
        with pytest.raises(capi.KsError) as e:
            call()
        assert e.value.status == status, f"{e.value.status_name}: {e.value.message}"
        assert text in e.value.message, e.value.message
    s = capi.query_support(op, tensors, options)
    if data_only:
        assert s.ok, f"a query reads no data, yet: {s.name} {s.message}"
    else:
        assert s.status == status and text in s.message, s


def test_failure_leaves_outputs_untouched():
    """Every index is checked before anything is written."""
    a = _kv_args()
    before = a["kc"].clone()
    with pytest.raises(capi.KsError):
        capi.reshape_and_cache(a["key"], a["value"], a["kc"], a["vc"], a["slots"])
    assert torch.equal(a["kc"], before)
    p = _paged_args()
    p["out"].fill_(7.0)
    with pytest.raises(capi.KsError):
        capi.paged_attention(p["q"], p["kc"], p["vc"], torch.tensor([[0, 6], [2, 1]], dtype=torch.int32), p["lens"],
                             out=p["out"])
    assert bool((p["out"] == 7.0).all())


def test_options_size_checked():
    """An option struct from a newer header (larger size) is refused, naming options; an older,
    shorter one keeps the defaults of the fields it lacks."""
    a = _rope_args()
    o = capi.options("rotary_embedding")
    o.size = ctypes.sizeof(o) + 8
    with pytest.raises(capi.KsError) as e:
        capi.rotary_embedding(a["pos"], a["q"], a["k"], a["cache"], options=o)
    assert e.value.status == INV and "options" in e.value.message
    f = _flash_args()
    short = capi.options("flash_attention", size=capi.OPTIONS["flash_attention"].causal.offset, scale=1.0)
    out = capi.flash_attention(f["q"], f["k"], f["v"], options=short)  # causal: its default (0) applies
    ref = ks.flash_attention(f["q"], f["k"], f["v"], scale=1.0, **REF)
    _close(out, ref, "flash_attention", torch.float32)


def _cuda_query(op: str, tensors, options=None) -> capi.Support:
    return capi.query_support(op, [None if t is None else _on_cuda(t) for t in tensors], options)


def _cuda_layout_cases():
    """(op, tensors, options, status, text): layouts the CPU takes and the CUDA kernels do not
    address; refused before any CUDA call, so the same answer with or without a GPU."""
    a = _rope_args()
    q_gaps = torch.randn(3, 2, 16)[..., :8]  # head stride 16 != D
    yield "rotary_embedding", [a["pos"], q_gaps, None, a["cache"]], None, LAY, "q:"
    yield "rotary_embedding", [torch.tensor([1, 9, 2, 9, 3, 9])[::2], a["q"], a["k"], a["cache"]], None, LAY, \
        "positions:"
    op, _, tensors, o = _mrope_call(a, q=q_gaps)
    yield op, tensors, o, LAY, "q:"
    op, _, tensors, o = _qk_call(a, qw=torch.ones(16)[::2])
    yield op, tensors, o, LAY, "q_weight:"
    op, _, tensors, o = _qk_call(a, kw=torch.ones(8).half())
    yield op, tensors, o, DT, "k_weight:"
    kv = _kv_args()
    yield "reshape_and_cache", [kv["key"], kv["value"], kv["kc"], kv["vc"], torch.tensor([0, 9, 1, 9, 2, 9])[::2],
                                None, None], None, LAY, "slot_mapping:"
    buf = torch.zeros(3, 2, 2, 1, 4)  # [block, slot, {k, v}, head, D]: a block of k is not one run
    yield "copy_blocks", [buf[:, :, 0], buf[:, :, 1], torch.tensor([[0, 1]])], None, LAY, "k_caches[0]:"
    pairs = torch.tensor([[0, 1, 9], [1, 2, 9]])[:, :2]  # rows 3 apart
    yield "copy_blocks", [torch.zeros(3, 2, 1, 4), torch.zeros(3, 2, 1, 4), pairs], None, LAY, "block_mapping:"
    p = _paged_args()
    op, _, tensors, o = _paged_call(p, out=torch.empty(2, 2, 16)[..., :8])
    yield op, tensors, o, LAY, "out:"
    op, _, tensors, o = _paged_call(p, bt=torch.zeros(2, 4, dtype=torch.int32)[:, ::2])
    yield op, tensors, o, LAY, "block_table:"
    op, _, tensors, o = _merge_call(out=torch.empty(3, 2, 4).transpose(0, 1))
    yield op, tensors, o, LAY, "out:"
    f = _flash_args()
    op, _, tensors, o = _flash_call(f, lse=torch.empty(1, 3, 2).transpose(1, 2))
    yield op, tensors, o, LAY, "lse:"
    op, _, tensors, o = _varlen_call(_varlen_args(), lse=torch.empty(5, 2).t())
    yield op, tensors, o, LAY, "lse:"


@pytest.mark.parametrize("case", range(13))
def test_cuda_layouts_refused_in_query(case):
    """Descriptors claiming CUDA memory over host tensors, only queried (a query reads no data)."""
    op, tensors, o, status, text = list(_cuda_layout_cases())[case]
    assert capi.query_support(op, tensors, o).ok, "the CPU path takes this layout"
    s = _cuda_query(op, tensors, o)
    assert s.status == status and text in s.message, s


def test_c_suite(tmp_path):
    """capi/tests/test_ops2.c: handwritten cases and failure statuses, in C against the library."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    libdir = os.path.dirname(capi.library_path())
    exe = str(tmp_path / "test_ops2")
    subprocess.run(["gcc", "-std=c99", "-Wall", "-Wextra", "-Werror", f"-I{ROOT}/capi/include",
                    f"{ROOT}/capi/tests/test_ops2.c", f"-L{libdir}", "-lkernelset", f"-Wl,-rpath,{libdir}", "-lm",
                    "-o", exe], check=True, capture_output=True, text=True, timeout=120)
    proc = subprocess.run([exe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"test_ops2: \d{3,} checks, 0 failures", proc.stdout), proc.stdout


# ---- CUDA dispatch, planned on this machine: the op files' arguments against the Python launchers
#
# A test build of the library whose op files call, instead of ks_cuda_<op>_launch, a spy that
# plans the launch (ks_cuda_<op>_plan, 132 SMs, sm_90) and records the plan. Descriptors claim
# CUDA memory over host tensors (nothing is launched or read). The Python launcher runs on meta
# tensors of the same shapes and strides under capi/aot/record.py's recording; each kernel launch
# must agree: kernel, grid, specialization (dtypes, constexprs, warps, stages) and every argument
# (tensors by identity, ints, floats as fp32).

GEN = f"{ROOT}/capi/generated"
SPY_SMS, SPY_CC = 132, 90


def _spy_source(header: str) -> tuple[str, list[str]]:
    protos = re.findall(r"ks_status_t ks_cuda_(\w+)_launch\(int device, ks_stream_t stream, char \*err, size_t errlen,"
                        r"\s*(.*?)\);", header, re.S)
    out = ['#include <string.h>\n#include "ks_cuda_ops.h"\n',
           "__attribute__((visibility(\"default\"))) char ks_spy_buf[1 << 20];\n",
           "__attribute__((visibility(\"default\"))) size_t ks_spy_len;\n",
           "static void spy_add(const ks_cuda_plan *p) {\n"
           "  if (ks_spy_len) ks_spy_buf[ks_spy_len++] = ',';\n"
           "  int n = ks_cuda_plan_json(p, ks_spy_buf + ks_spy_len, sizeof ks_spy_buf - ks_spy_len - 1);\n"
           "  if (n > 0) ks_spy_len += (size_t)n;\n}\n"]
    for op, params in protos:
        names = ", ".join(re.findall(r"(\w+)\s*(?:,|$)", " ".join(params.split())))
        out.append(f"ks_status_t ks_spy_{op}_launch(int device, ks_stream_t stream, char *err, size_t errlen,\n"
                   f"    {params}) {{\n"
                   f"  static ks_cuda_plan plan;\n  (void)device; (void)stream;\n"
                   f"  ks_status_t s = ks_cuda_{op}_plan(&plan, {SPY_SMS}, {SPY_CC}, err, errlen, {names});\n"
                   f"  if (s != KS_OK && s != KS_ERR_NOT_IMPLEMENTED) return s;\n"
                   f"  spy_add(&plan);\n  return KS_OK;\n}}\n")
    return "".join(out), [op for op, _ in protos]


@pytest.fixture(scope="module")
def spy(tmp_path_factory):
    if shutil.which("gcc") is None or not os.path.exists(f"{GEN}/ks_cuda_ops.h"):
        pytest.skip("needs gcc and capi/generated (scripts/build_capi.sh)")
    tmp = tmp_path_factory.mktemp("capi_spy")
    src, ops = _spy_source(open(f"{GEN}/ks_cuda_ops.h").read())
    (tmp / "spy.c").write_text(src)
    inc = [f"-I{ROOT}/capi/include", f"-I{ROOT}/capi/src/core", f"-I{ROOT}/capi/src/cuda", f"-I{GEN}"]
    flags = ["gcc", "-std=c99", "-O0", "-fPIC", "-w", *inc, "-c"]
    renames = [f"-Dks_cuda_{op}_launch=ks_spy_{op}_launch" for op in ops]
    objs, jobs = [], []
    for f in sorted(glob.glob(f"{ROOT}/capi/src/*/*.c") + glob.glob(f"{GEN}/*.c") + [str(tmp / "spy.c")]):
        o = str(tmp / (f.replace("/", "_") + ".o"))
        extra = renames if "/capi/src/ops/" in f else []
        jobs.append(subprocess.Popen([*flags, *extra, f, "-o", o], stderr=subprocess.PIPE, text=True))
        objs.append(o)
    for j in jobs:
        assert j.wait() == 0, j.stderr.read()
    lib = str(tmp / "libks_spy.so")
    subprocess.run(["gcc", "-shared", "-Wl,-Bsymbolic", "-o", lib, *objs, "-ldl", "-lpthread", "-lm"], check=True)
    so = ctypes.CDLL(lib)
    for name, (restype, argtypes) in capi._abi.FUNCTIONS.items():
        fn = getattr(so, name)
        fn.restype, fn.argtypes = restype, argtypes
    aot = f"{ROOT}/capi/aot"
    if aot not in sys.path:
        sys.path.insert(0, aot)
    manifest = json.load(open(f"{GEN}/manifest.json"))
    kernels = {k["name"]: k for k in manifest["kernels"]}
    compiled: dict = {}  # kernel -> the variant keys compiled in
    for v in manifest["variants"]:
        compiled.setdefault(v["kernel"], set()).add(tuple(v["key"]))
    return so, kernels, compiled


class _Case:
    """Host tensors for the C call and meta twins (same shape, strides, dtype) for the launcher."""

    def __init__(self):
        self.host, self.meta = {}, {}

    def t(self, name, shape, dtype, strides=None):
        strides = strides or torch.empty(shape).stride()
        self.host[name] = torch.empty_strided(shape, strides, dtype=dtype)
        self.meta[name] = torch.empty_strided(shape, strides, dtype=dtype, device="meta")
        return self.meta[name]

    def dl(self, name):
        return None if name is None else _on_cuda(self.host[name])


def _spy_plans(so) -> list[dict]:
    n = ctypes.c_size_t.in_dll(so, "ks_spy_len").value
    text = ctypes.string_at(ctypes.addressof(ctypes.c_char.in_dll(so, "ks_spy_buf")), n).decode()
    ctypes.c_size_t.in_dll(so, "ks_spy_len").value = 0
    return json.loads("[" + text + "]")


def _python_launches(fn, case: _Case, modules=()) -> list[dict]:
    from record import describe, recording
    # as on a GPU: the launchers pick fp32 paths for the Triton interpreter these tests may run under
    with config.override(triton_interpret=False), recording(sms=SPY_SMS, modules=modules, cc=SPY_CC) as launches:
        fn(case.meta)
    names = {id(t): n for n, t in case.meta.items()}
    return [describe(ln, names) for ln in launches]


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _int_class(v: int) -> int:
    """Triton's own JIT specialization of an int argument: 2 = equals 1 (a constexpr), 1 =
    divisible by 16, 0 = neither (the key's spec slot)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend
    kind, attr = native_specialize_impl(CUDABackend, v, False, True, True)
    return 2 if kind == "constexpr" else 1 if attr == "D" else 0


def _compare(plans, py, case: _Case, kernels, compiled, internal: dict) -> None:
    """internal: what the launcher allocates for itself ("~PARAM" names) -> (tensor name, byte
    offset) the C call passed instead, or "scratch" (the plan's discard buffer).

    The key (capi/aot/README.md): pointer dtypes and constexprs, a spec slot per pointer (16-byte
    aligned 1, not 0, None -1) and per int (_int_class), warps, stages, fp_fusion, then the mode:
    2 (Triton's exact JIT specialization) when that key is compiled in, else the fallback: spec
    slots -1 and mode 1 if the pointers are aligned and the kernel's align_ints divisible by 16,
    else 0. An exact variant takes no argument for an int equal to 1 (a constexpr there)."""
    from record import DT_BY_NAME
    got = [ln for p in plans for ln in p["launches"]]
    want = [ln for ln in py if all(g > 0 for g in ln["grid"])]
    assert [g["kernel"] for g in got] == [w["kernel"] for w in want]
    ptr = {n: t.data_ptr() for n, t in case.host.items()}
    for g, w in zip(got, want):
        where = w["kernel"]
        assert g["grid"] == w["grid"], where
        kernel = kernels[w["kernel"]]
        align_ints = set(kernel["align_ints"])
        prefix, spec, aligned, args = [], [], 1, []  # args: (value, dropped by an exact variant)
        for (name, is_const, kind, value, dtype), role in zip(w["params"], [p["role"] for p in kernel["params"]]):
            if role == "ptr":
                prefix.append(None if kind == "none" else DT_BY_NAME[dtype])
            elif role == "constexpr":
                prefix.append(None if value is None else int(value))
            if kind == "tensor":
                where_ = internal.get(value, (value, 0))
                if where_ == "scratch":  # the discard buffer: 256-byte aligned offsets
                    address, arg = 0, ["scratch"]
                else:
                    address = ptr[where_[0]] + where_[1]
                    arg = ["ptr", address]
                if role == "ptr":
                    spec.append(int(address % 16 == 0))
                    aligned &= address % 16 == 0
            elif kind == "none" and role == "ptr":
                spec.append(-1)
            elif role == "int":
                spec.append(_int_class(value))
                if name in align_ints and value % 16:
                    aligned = 0
            if is_const or kind == "none":
                continue
            if kind in ("int", "bool"):
                args.append((["int", int(value)], kind == "int" and value == 1))
            elif kind != "tensor":
                args.append((["f32", _f32(value)], False))
            else:
                args.append((arg, False))
        tail = [w["num_warps"], w["num_stages"], w["fp_fusion"]]
        key = prefix + spec + tail + [2]
        exact = tuple(key) in compiled.get(w["kernel"], ())
        if not exact:
            key = prefix + [-1] * len(spec) + tail + [int(aligned)]
        assert g["key"] == key, f"{where}: specialization {g['key']} != {key}"
        args = [a for a, one in args if not (exact and one)]
        have = [["scratch"] if k == "scratch" else ["int", v] if k in ("i32", "i64") else
                ["f32", _f32(v)] if k == "f32" else [k, v] for k, v in g["args"]]
        assert have == args, f"{where}: arguments differ"


def _rope_spy_cases():
    launch = rope_launch

    def rotary(token_stride, interleaved, pos_dtype, dtype, cache_dtype):
        c = _Case()
        t, hq, hk, d, rot = 5, 8, 2, 128, 64
        c.t("pos", (t,), pos_dtype)
        c.t("q", (t, hq * d), dtype, (token_stride, 1))
        c.t("k", (t, hk, d), dtype, (token_stride, d, 1))
        c.t("cache", (300, rot), cache_dtype)
        o = capi.options("rotary_embedding", interleaved=interleaved, head_size=d)
        return ("ks_rotary_embedding", lambda so: so.ks_rotary_embedding(c.dl("pos"), c.dl("q"), c.dl("k"),
                                                                          c.dl("cache"), ctypes.byref(o), None),
                lambda m: launch.rope_fwd(m["pos"], m["q"], m["k"], m["cache"], interleaved, d), c, {})

    def ext(op, sections, pos2d, mi, norm, cast, wdt, dtype=torch.bfloat16):
        c = _Case()
        t, hq, hk, d = 4, 16, 4, 128
        c.t("pos", (3, t) if pos2d else (t,), torch.int64)
        c.t("q", (t, hq, d), dtype)
        c.t("k", (t, hk * d), dtype, (3 * hk * d, 1))
        c.t("cache", (500, d), torch.float32)
        if norm:
            c.t("qw", (d,), wdt)
            c.t("kw", (d,), wdt)
        sec = sections or (0, 0, 0)
        if op == "mrope":
            o = capi.options("mrope", mrope_section=sec, mrope_interleaved=mi, head_size=d)
            call = lambda so: so.ks_mrope(c.dl("pos"), c.dl("q"), c.dl("k"), c.dl("cache"), ctypes.byref(o), None)
            py = lambda m: launch.rope_ext(m["pos"], m["q"], m["k"], m["cache"], d, False, list(sec), mi)
        else:
            offset = 1.0 if cast == "gemma" else 0.0
            o = capi.options("qk_norm_rope", eps=1e-6, offset=offset, cast=cast, head_size=d, mrope_section=sec,
                             mrope_interleaved=mi)
            call = lambda so: so.ks_qk_norm_rope(c.dl("q"), c.dl("k"), c.dl("qw"), c.dl("kw"), c.dl("cache"),
                                                 c.dl("pos"), ctypes.byref(o), None)
            py = lambda m: launch.rope_ext(m["pos"], m["q"], m["k"], m["cache"], d, False,
                                           list(sec) if sections else None, mi, m["qw"], m["kw"], 1e-6, offset, cast)
        return (f"ks_{op}", call, py, c, {})

    yield "rotary_bf16", rotary(8 * 128, False, torch.int64, torch.bfloat16, torch.bfloat16)
    yield "rotary_fp32_gptj_strided", rotary(12 * 128, True, torch.int32, torch.float32, torch.float32)
    yield "mrope_bands", ext("mrope", (16, 24, 24), True, False, False, None, None)
    yield "mrope_interleaved", ext("mrope", (24, 20, 20), True, True, False, None, None)
    yield "mrope_text_positions", ext("mrope", (16, 24, 24), False, False, False, None, None)
    yield "qk_norm_rope_qwen3", ext("qk_norm_rope", None, False, False, True, "llama", torch.bfloat16)
    yield "qk_norm_rope_gemma", ext("qk_norm_rope", None, False, False, True, "gemma", torch.float32)
    yield "qk_norm_rope_vl", ext("qk_norm_rope", (24, 20, 20), True, True, True, "llama", torch.bfloat16)


def _kv_spy_cases():
    launch = kv_launch

    def cache(kv_dtype, cache_dtype, slot_dtype):
        c = _Case()
        t, h, d, nb, bs = 6, 4, 128, 64, 16
        c.t("key", (t, h, d), kv_dtype, (3 * h * d, d, 1))
        c.t("value", (t, h, d), kv_dtype, (3 * h * d, d, 1))
        c.t("kc", (nb, bs, h, d), cache_dtype)
        c.t("vc", (nb, bs, h, d), cache_dtype, (2 * bs * h * d, h * d, d, 1))
        c.t("slots", (t,), slot_dtype)
        fp8 = cache_dtype == FP8
        if fp8:
            c.t("ks", (), torch.float32)
            c.t("vs", (1,), torch.float32)
        names = ["key", "value", "kc", "vc", "slots", "ks" if fp8 else None, "vs" if fp8 else None]
        return ("ks_reshape_and_cache", lambda so: so.ks_reshape_and_cache(*[c.dl(n) for n in names], None),
                lambda m: launch.reshape_and_cache(*[m[n] if n else None for n in names]), c, {})

    def copy():
        c = _Case()
        c.t("k0", (64, 16, 8, 128), torch.bfloat16)
        c.t("v0", (64, 16, 8, 128), torch.bfloat16, (2 * 16 * 8 * 128, 8 * 128, 128, 1))
        c.t("k1", (64, 32, 2, 64), torch.bfloat16)
        c.t("v1", (64, 32, 2, 64), torch.bfloat16)
        c.t("map", (3, 2), torch.int64)
        ks_ = (ctypes.POINTER(capi.DLTensor) * 2)()
        vs_ = (ctypes.POINTER(capi.DLTensor) * 2)()

        def call(so):
            keep = [c.dl(n) for n in ("k0", "k1", "v0", "v1")]
            for i in range(2):
                ks_[i], vs_[i] = ctypes.pointer(keep[i]), ctypes.pointer(keep[2 + i])
            return so.ks_copy_blocks(ks_, vs_, 2, c.dl("map"), None)
        return ("ks_copy_blocks", call, lambda m: launch.copy_blocks([m["k0"], m["k1"]], [m["v0"], m["v1"]], m["map"]),
                c, {})

    yield "reshape_and_cache_bf16", cache(torch.bfloat16, torch.bfloat16, torch.int64)
    yield "reshape_and_cache_fp8", cache(torch.float16, FP8, torch.int32)
    yield "copy_blocks", copy()


def _attn_spy_cases():
    launch = attn_launch

    def paged(dtype, cache_dtype, varlen, ws, lse, window=(-1, -1), softcap=0.0, sinks=False, causal=True):
        c = _Case()
        b, hq, hkv, d, bs, nb, width = 3, 32, 8, 128, 16, 256, 64
        qlens = (9, 1, 4)
        t = sum(qlens) if varlen else b
        c.t("q", (t, hq, d), dtype, (3 * hq * d, d, 1))
        c.t("kc", (nb, bs, hkv, d), cache_dtype)
        c.t("vc", (nb, bs, hkv, d), cache_dtype)
        c.t("bt", (b, width), torch.int32)
        c.t("seq", (b,), torch.int32)
        c.t("out", (t, hq, d), dtype)
        fp8 = cache_dtype == FP8
        for name, shape, dt, on in (("cu", (b + 1,), torch.int32, varlen), ("sinks", (hq,), torch.float32, sinks),
                                    ("ks", (), torch.float32, fp8), ("vs", (), torch.float32, fp8),
                                    ("lse", (t, hq), torch.float32, lse)):
            if on:
                c.t(name, shape, dt)
        if ws:
            q_ = torch.empty(t, hq, d)
            c.t("ws", (capi.paged_attention_workspace_size(q_, torch.empty(1, bs, hkv, d), 0),), torch.uint8)
        max_q = max(qlens) if varlen else 0
        o = capi.options("paged_attention", causal=causal, window_left=window[0], window_right=window[1],
                         softcap=softcap)
        g = lambda n: c.dl(n) if n in c.host else None

        def call(so):
            return so.ks_paged_attention(g("q"), g("kc"), g("vc"), g("bt"), g("seq"), g("cu"), max_q, 0, g("sinks"),
                                         g("ks"), g("vs"), g("out"), g("lse"), g("ws"), ctypes.byref(o), None)

        def py(m):
            tuning = contextlib.nullcontext() if ws else launch.TUNING.use(launch.PagedTuning(splits=1))
            with tuning:
                launch.paged_attention(m["q"], m["kc"], m["vc"], m["bt"], m["seq"], m.get("cu"), max_q or 1, causal,
                                       1.0 / math.sqrt(d), window, softcap, m.get("sinks"), m.get("ks"), m.get("vs"),
                                       width * bs)
        internal = {"~O": ("out", 0), "~LSE": ("lse", 0) if lse else "scratch", "~PO": ("ws", 0)}
        internal["~PLSE"] = ("ws", -1)  # placed after the partial outputs: filled in by the test
        return ("ks_paged_attention", call, py, c, internal)

    def merge(dtype, lse):
        c = _Case()
        t, h, d = 5, 32, 128
        c.t("oa", (t, h, d), dtype, (3 * h * d, d, 1))
        c.t("la", (t, h), torch.float32)
        c.t("ob", (t, h, d), dtype)
        c.t("lb", (t, h), torch.float32, (1, t))
        c.t("out", (t, h, d), dtype)
        if lse:
            c.t("lse", (t, h), torch.float32)
        return ("ks_merge_attn_states",
                lambda so: so.ks_merge_attn_states(c.dl("oa"), c.dl("la"), c.dl("ob"), c.dl("lb"), c.dl("out"),
                                                   c.dl("lse") if lse else None, None),
                lambda m: launch.merge_attn_states(m["oa"], m["la"], m["ob"], m["lb"]), c,
                {"~O": ("out", 0), "~LSE": ("lse", 0) if lse else "scratch"})

    def flash(dtype, varlen, lse, causal=True, window=(-1, -1), softcap=0.0, sinks=False, dv=128):
        c = _Case()
        b, s, hq, hkv, d = 2, 100, 32, 8, 128
        if varlen:
            c.t("q", (200, hq, d), dtype)
            c.t("k", (220, hkv, d), dtype, (2 * hkv * d, d, 1))
            c.t("v", (220, hkv, dv), dtype)
            c.t("cu_q", (b + 1,), torch.int32)
            c.t("cu_k", (b + 1,), torch.int32)
            c.t("out", (200, hq, dv), dtype)
            if lse:
                c.t("lse", (hq, 200), torch.float32)
        else:
            c.t("q", (b, s, hq, d), dtype, (hq * s * d, d, s * d, 1))  # a [B, S, H, D] view of [B, H, S, D]
            c.t("k", (b, s + 20, hkv, d), dtype)
            c.t("v", (b, s + 20, hkv, dv), dtype)
            c.t("out", (b, s, hq, dv), dtype)
            if lse:
                c.t("lse", (b, hq, s), torch.float32)
        if sinks:
            c.t("sinks", (hq,), torch.float32)
        o = capi.options("flash_attention_varlen" if varlen else "flash_attention", causal=causal,
                         window_left=window[0], window_right=window[1], softcap=softcap)
        g = lambda n: c.dl(n) if n in c.host else None
        if varlen:
            call = lambda so: so.ks_flash_attention_varlen(g("q"), g("k"), g("v"), g("cu_q"), g("cu_k"), 150, 170,
                                                           g("sinks"), g("out"), g("lse"), ctypes.byref(o), None)
        else:
            call = lambda so: so.ks_flash_attention(g("q"), g("k"), g("v"), g("sinks"), g("out"), g("lse"),
                                                    ctypes.byref(o), None)

        def py(m):
            launch.flash_attention_fwd(m["q"], m["k"], m["v"], m.get("cu_q"), m.get("cu_k"), 150 if varlen else s,
                                       170 if varlen else s + 20, causal, 1.0 / math.sqrt(d), window, softcap,
                                       m.get("sinks"), lse)
        return ("ks_flash_attention", call, py, c, {"~O": ("out", 0), "~LSE": ("lse", 0) if lse else "scratch"})

    yield "paged_decode_split", paged(torch.bfloat16, torch.bfloat16, False, True, True)
    yield "paged_decode_one_pass", paged(torch.bfloat16, torch.bfloat16, False, False, False)
    yield "paged_prefill", paged(torch.float16, torch.float16, True, False, True, (100, 0), 30.0, True)
    yield "paged_prefill_split_noncausal", paged(torch.float16, torch.float16, True, True, True, (5, 3), 0.0, False,
                                                 False)
    yield "paged_fp8", paged(torch.bfloat16, FP8, False, False, True)
    yield "merge_bf16", merge(torch.bfloat16, True)
    yield "merge_fp32_no_lse", merge(torch.float32, False)
    yield "flash_dense_causal", flash(torch.bfloat16, False, True)
    yield "flash_dense_dv", flash(torch.float32, False, False, False, (16, 4), 0.0, True, dv=64)
    yield "flash_varlen", flash(torch.float16, True, False, True, (16, 0), 20.0, True)
    yield "flash_varlen_lse", flash(torch.bfloat16, True, True, False)


def _spy_cases():
    return [*_rope_spy_cases(), *_kv_spy_cases(), *_attn_spy_cases()]


@pytest.mark.parametrize("case", [name for name, _ in _spy_cases()])
def test_cuda_dispatch_matches_the_python_launcher(spy, case):
    so, kernels, compiled = spy
    fn_name, call, py, c, internal = dict(_spy_cases())[case]
    modules = (attn_launch, rope_launch, kv_launch)
    _spy_plans(so)
    status = call(so)
    assert status == 0, so.ks_last_error().decode()
    plans = _spy_plans(so)
    launches = _python_launches(py, c, modules)
    if internal.get("~PLSE") == ("ws", -1):
        splits = [dict((p[0], p[3]) for p in ln["params"])["num_splits"] for ln in launches
                  if ln["kernel"] == "_paged_attn_fwd_kernel"][0]
        t, hq, d = c.host["q"].shape
        internal["~PLSE"] = ("ws", -(-(t * hq * splits * d * 4) // 256) * 256)
    _compare(plans, launches, c, kernels, compiled, internal)
