"""mla_decode through the C ABI (ks.capi -> libkernelset.so, CPU path) against the Python
package's fp32 reference (ks.mla_decode with backend="reference").

- fp32/fp16/bf16 storage and fp8 e4m3fn latent caches (fp16/bf16 queries), a ragged batch with an
  empty sequence and blocks handed out in a random order, token-strided queries, lse optional;
- max_seq_len bounds seq_lens (0 = the block table's capacity);
- every failure class returns its status with a message naming the argument, and
  ks_query_support answers what the call does (data-dependent failures excepted: a query reads
  no data).

Outputs are poisoned with NaN first, so an element the library does not write fails. What the
CUDA path launches (kernels, grids, arguments) is tests/test_capi_aot.py and test_capi_dispatch.py.
"""
from __future__ import annotations

import pytest
import torch

import kernelset as ks
from kernelset import capi
from kernelset.core import registry
from kernelset.core.tolerance import rel_err, tolerance

from capi_helpers import on_cuda  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _library(capi_library):
    """Every test here calls the C library: built once per run by the session fixture (a failed
    build fails the tests with its log)."""
    return capi_library

FP8 = torch.float8_e4m3fn
REF = dict(backend="reference")
INV, DT, LAY, DEV = (capi._abi.INVALID_ARGUMENT, capi._abi.UNSUPPORTED_DTYPE, capi._abi.UNSUPPORTED_LAYOUT,
                     capi._abi.UNSUPPORTED_DEVICE)

# (query dtype, cache dtype): the cache holds the query's dtype, or fp8 with a half-precision query
STORAGE = [(torch.float32, torch.float32), (torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
           (torch.float16, FP8), (torch.bfloat16, FP8)]


def _id(p) -> str:
    return "-".join(str(d).replace("torch.", "") for d in p)


def _problem(qdt, cdt, lens, *, b_strided=False, h=5, r=32, p=8, bs=4, nb=16, width=4, seed=0):
    """q_nope/q_pe (token-strided views when b_strided), a cache whose blocks are handed out in a
    random order, its block table and seq_lens."""
    g = torch.Generator().manual_seed(seed)
    b = len(lens)
    if b_strided:  # q_nope and q_pe as views of one [B, H, R + P + 3] projection
        qbuf = torch.randn(b, h, r + p + 3, generator=g).to(qdt)
        qn, qp = qbuf[..., :r], qbuf[..., r + 3:]
    else:
        qn, qp = torch.randn(b, h, r, generator=g).to(qdt), torch.randn(b, h, p, generator=g).to(qdt)
    kv = (torch.randn(nb, bs, r + p, generator=g) * (4.0 if cdt == FP8 else 1.0)).to(cdt)
    bt = torch.randperm(nb, generator=g)[: b * width].view(b, width).int().contiguous()
    kv_scale = torch.tensor(0.375) if cdt == FP8 else None
    return qn, qp, kv, bt, torch.tensor(lens, dtype=torch.int32), kv_scale


def _check(out, lse, ref, dtype):
    err = rel_err(out.float(), ref.out.float())
    tol = tolerance(registry.op("mla_decode").tolerance, dtype)
    assert err <= tol, f"mla_decode {dtype}: relative error {err:.3g} > {tol:.3g}"
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref.lse)), "sequences without keys differ"
    fin = ~torch.isneginf(ref.lse)
    torch.testing.assert_close(lse[fin], ref.lse[fin].float(), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("storage", STORAGE, ids=[_id(s) for s in STORAGE])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided_q"])
def test_mla_decode_matches_the_reference(storage, strided):
    qdt, cdt = storage
    lens = [9, 0, 16, 1]  # ragged: a partial last block, an empty sequence, a full table, one token
    qn, qp, kv, bt, sl, kv_scale = _problem(qdt, cdt, lens, b_strided=strided)
    r, p = qn.shape[-1], qp.shape[-1]
    ref = ks.mla_decode(qn, qp, kv, bt, sl, scale=0.3, kv_lora_rank=r, rope_dim=p, kv_scale=kv_scale,
                        return_lse=True, **REF)
    out = torch.full(qn.shape, float("nan"), dtype=qdt)
    lse = torch.full(qn.shape[:2], float("nan"))
    o = capi.options("mla_decode", scale=0.3, kv_lora_rank=r, rope_dim=p)
    s = capi.query_support("mla_decode", [qn, qp, kv, bt, sl, kv_scale, out, lse], o)
    assert s.ok, f"{s.name}: {s.message}"
    capi.mla_decode(qn, qp, kv, bt, sl, 0, kv_scale, out=out, lse=lse, options=o)
    _check(out, lse, ref, qdt)
    assert torch.equal(out[1], torch.zeros_like(out[1])), "an empty sequence gets out 0"


def test_mla_decode_without_lse_and_with_deepseek_sizes():
    """R = 512, P = 64 (the defaults: no rank options), 16 heads, no lse asked for."""
    qn, qp, kv, bt, sl, _ = _problem(torch.bfloat16, torch.bfloat16, [70, 33], h=16, r=512, p=64, bs=16, nb=12,
                                     width=5)
    ref = ks.mla_decode(qn, qp, kv, bt, sl, scale=192 ** -0.5, return_lse=True, **REF)
    out = capi.mla_decode(qn, qp, kv, bt, sl, scale=192 ** -0.5)
    err = rel_err(out.float(), ref.out.float())
    assert err <= tolerance(registry.op("mla_decode").tolerance, torch.bfloat16), err


def test_max_seq_len_bounds_seq_lens():
    qn, qp, kv, bt, sl, _ = _problem(torch.float32, torch.float32, [9, 3])
    kw = dict(scale=0.3, kv_lora_rank=32, rope_dim=8)
    ref = ks.mla_decode(qn, qp, kv, bt, sl, max_seq_len=9, **kw, **REF)
    torch.testing.assert_close(capi.mla_decode(qn, qp, kv, bt, sl, 9, **kw), ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(capi.KsError) as e:
        capi.mla_decode(qn, qp, kv, bt, sl, 8, **kw)
    assert e.value.status == INV and "seq_lens: expected lengths in [0, 8]" in e.value.message, e.value.message


# ---- failures: status, message naming the argument, and ks_query_support agreeing


def _args(**over):
    qn, qp, kv, bt, sl, _ = _problem(torch.float32, torch.float32, [5, 2], h=2, r=8, p=4, bs=4, nb=6, width=2)
    a = dict(qn=qn, qp=qp, kv=kv, bt=bt, sl=sl, ks=None, out=torch.empty_like(qn), lse=torch.empty(2, 2))
    a.update(over)
    return a


def _call(opts=None, max_seq_len=0, **over):
    a = _args(**over)
    o = capi.options("mla_decode", **{"scale": 0.5, "kv_lora_rank": 8, "rope_dim": 4, **(opts or {})})
    tensors = [a["qn"], a["qp"], a["kv"], a["bt"], a["sl"], a["ks"], a["out"], a["lse"]]
    return (lambda: capi.mla_decode(a["qn"], a["qp"], a["kv"], a["bt"], a["sl"], max_seq_len, a["ks"], out=a["out"],
                                    lse=a["lse"], options=o), tensors, o)


def _strided_last(x: torch.Tensor) -> torch.Tensor:
    return torch.stack([x, x], -1).flatten(-2)[..., ::2]


# id -> (builder of (call, query tensors, options), status, text the message contains, whether only
# the data shows it: then the query, which reads no data, answers KS_OK)
FAILURES = {
    "q_nope_null": (lambda: _call(qn=None), INV, "q_nope:", False),
    "q_pe_null": (lambda: _call(qp=None), INV, "q_pe:", False),
    "q_nope_int": (lambda: _call(qn=torch.zeros(2, 2, 8, dtype=torch.int32)), DT, "q_nope:", False),
    "q_pe_dtype": (lambda: _call(qp=torch.randn(2, 2, 4).half()), DT, "q_pe:", False),
    "cache_dtype": (lambda: _call(kv=torch.randn(6, 4, 12).half()), DT, "kv_cache:", False),
    "fp8_cache_fp32_query": (lambda: _call(kv=torch.zeros(6, 4, 12).to(FP8), ks=torch.tensor(1.0)), DT, "q_nope:",
                             False),
    "block_table_int64": (lambda: _call(bt=torch.zeros(2, 2, dtype=torch.int64)), DT, "block_table:", False),
    "q_nope_2d": (lambda: _call(qn=torch.randn(2, 8)), INV, "q_nope:", False),
    "q_pe_shape": (lambda: _call(qp=torch.randn(2, 2, 5)), INV, "q_pe:", False),
    "cache_width": (lambda: _call(kv=torch.randn(6, 4, 13)), INV, "kv_cache:", False),
    "out_shape": (lambda: _call(out=torch.empty(2, 2, 4)), INV, "out:", False),
    "lse_shape": (lambda: _call(lse=torch.empty(2, 3)), INV, "lse:", False),
    "seq_lens_shape": (lambda: _call(sl=torch.tensor([1, 2, 3], dtype=torch.int32)), INV, "seq_lens:", False),
    "scale_for_plain_cache": (lambda: _call(ks=torch.tensor(1.0)), INV, "kv_scale:", False),
    "fp8_missing_scale": (lambda: _call(qn=torch.randn(2, 2, 8).half(), qp=torch.randn(2, 2, 4).half(),
                                        out=torch.empty(2, 2, 8).half(), kv=torch.zeros(6, 4, 12).to(FP8)),
                          INV, "kv_scale:", False),
    "mixed_devices": (lambda: _call(kv=on_cuda(torch.randn(6, 4, 12))), DEV, "kv_cache:", False),
    "q_nope_strided_last": (lambda: _call(qn=_strided_last(torch.randn(2, 2, 8))), LAY, "q_nope:", False),
    "out_overlapping": (lambda: _call(out=torch.empty(1, 2, 8).expand(2, 2, 8)), LAY, "out:", False),
    "scale_missing": (lambda: _call(dict(scale=0.0)), INV, "scale:", False),
    "scale_nan": (lambda: _call(dict(scale=float("nan"))), INV, "scale:", False),
    "kv_lora_rank_mismatch": (lambda: _call(dict(kv_lora_rank=16)), INV, "q_nope: expected [B, H, kv_lora_rank=16]",
                              False),
    "rope_dim_zero": (lambda: _call(dict(rope_dim=0)), INV, "rope_dim:", False),
    "max_seq_len_negative": (lambda: _call(max_seq_len=-1), INV, "max_seq_len:", None),
    "seq_len_past_the_table": (lambda: _call(sl=torch.tensor([9, 2], dtype=torch.int32)), INV,
                               "seq_lens: expected lengths in [0, 8]", True),
    "block_id_out_of_range": (lambda: _call(bt=torch.tensor([[0, 6], [2, 1]], dtype=torch.int32)), INV,
                              "block_table: expected block ids in [0, 6) for every block a sequence uses, got 6 at "
                              "[0, 1]", True),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_failure(case):
    build, status, text, data_only = FAILURES[case]
    call, tensors, options = build()
    with pytest.raises(capi.KsError) as e:
        call()
    assert e.value.status == status, f"{e.value.status_name}: {e.value.message}"
    assert text in e.value.message, e.value.message
    if data_only is None:  # an integer argument: the query does not take it
        return
    s = capi.query_support("mla_decode", tensors, options)
    if data_only:
        assert s.ok, f"a query reads no data, yet: {s.name} {s.message}"
    else:
        assert s.status == status and text in s.message, s


def test_failure_leaves_outputs_untouched():
    a = _args(bt=torch.tensor([[0, 6], [2, 1]], dtype=torch.int32))
    a["out"].fill_(7.0)
    with pytest.raises(capi.KsError):
        capi.mla_decode(a["qn"], a["qp"], a["kv"], a["bt"], a["sl"], out=a["out"], scale=0.5, kv_lora_rank=8,
                        rope_dim=4)
    assert bool((a["out"] == 7.0).all())


def test_defaults_and_query_arity():
    o = capi.options("mla_decode")
    assert (o.scale, o.kv_lora_rank, o.rope_dim) == (0.0, 512, 64)  # the Python API's defaults; scale has none
    s = capi.query_support("mla_decode", [None] * 7, o)
    assert s.status == INV and "mla_decode takes 8 tensors, got 7" in s.message, s
