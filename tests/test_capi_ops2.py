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

Outputs are poisoned with NaN first, so an element the library does not write fails. What the
CUDA path would launch for these ops (kernels, grids, arguments) is tests/test_capi_dispatch.py.
"""
from __future__ import annotations

import ctypes
import inspect
import os
import re
import shutil
import subprocess

import pytest
import torch

import kernelset as ks
from kernelset import capi
from kernelset.core import registry
from kernelset.core.tolerance import rel_err, tolerance
from kernelset.ops.attention import launch as attn_launch


# the module's failure tables call the library at import: build it first (tests/conftest.py); a
# failed build fails here with its log
from conftest import build_capi  # noqa: E402
from capi_helpers import on_cuda  # noqa: E402

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


def test_copy_blocks_self_copy_and_chain_order():
    """A block copied onto itself may sit beside a pair reading it (as in Python); the racing
    mappings (test_failure's copy_destination_*) are refused before any block is written."""
    kc, vc = [torch.randn(4, 2, 1, 8)], [torch.randn(4, 2, 1, 8)]
    mapping = torch.tensor([[1, 1], [1, 3], [0, 2]])
    rk, rv = [c.clone() for c in kc], [c.clone() for c in vc]
    ks.copy_blocks(rk, rv, mapping, **REF)
    capi.copy_blocks(kc, vc, mapping)
    assert torch.equal(kc[0], rk[0]) and torch.equal(vc[0], rv[0])
    before = kc[0].clone()
    with pytest.raises(capi.KsError, match="no other pair's source"):
        capi.copy_blocks(kc, vc, torch.tensor([[0, 1], [1, 2]]))
    assert torch.equal(kc[0], before)


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
    # k as the Python API takes it: [T, Hk, D] or [T, Hk * D] (a 4-D k, or a 3-D k of another head
    # size, was accepted by the Python package and rotated the wrong features)
    "rope_k_4d": (lambda: _rope_call(_rope_args(), k=torch.randn(3, 1, 1, 8)), INV, "k:", False),
    "rope_k_head_size": (lambda: _rope_call(_rope_args(), k=torch.randn(3, 2, 4)), INV, "k: expected [T=3, Hk, 8]",
                         False),
    "rope_k_2d_width": (lambda: _rope_call(_rope_args(), k=torch.randn(3, 12)), INV, "k: expected [T=3, Hk, 8]",
                        False),
    "mrope_k_4d": (lambda: _mrope_call(_rope_args(), pos=torch.zeros(3, 3, dtype=torch.int64),
                                       k=torch.randn(3, 1, 1, 8)), INV, "k:", False),
    "qk_k_head_size": (lambda: _qk_call(_rope_args(), k=torch.randn(3, 2, 4), kw=torch.ones(4)), INV, "k:", False),
    "rope_interleaved_value": (lambda: _rope_call(_rope_args(), dict(interleaved=2)), INV, "interleaved:", False),
    "rope_mixed_devices": (lambda: _rope_call(_rope_args(), cache=on_cuda(_cache(8, 8))), DEV, "cos_sin_cache:",
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
    # the pairs run in parallel (kvcache.api._check_mapping): a destination that is another pair's
    # source, or a repeated destination, makes the copy depend on the order
    "copy_destination_is_source": (lambda: _copy_call([torch.zeros(3, 2, 1, 4)], [torch.zeros(3, 2, 1, 4)],
                                                      torch.tensor([[0, 1], [1, 2]])), INV,
                                   "block_mapping: expected destinations that are no other pair's source (the pairs "
                                   "are copied in parallel), got destination 1 at row 0", True),
    "copy_destination_repeated": (lambda: _copy_call([torch.zeros(3, 2, 1, 4)], [torch.zeros(3, 2, 1, 4)],
                                                     torch.tensor([[0, 2], [1, 2]])), INV,
                                  "block_mapping: expected distinct destinations (the pairs are copied in parallel), "
                                  "got destination 2 more than once", True),
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
    return capi.query_support(op, [None if t is None else on_cuda(t) for t in tensors], options)


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
