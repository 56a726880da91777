"""paged_attention and merge_attn_states against the fp32 reference on contiguous tensors.

Properties: paged equals contiguous (sequences scattered over random blocks give the reference's
result on the gathered keys), split-KV equals one pass, merging two halves equals the whole, GQA
equals MHA with repeated KV; block boundaries, length 1 and empty sequences, window, softcap,
sinks, several query tokens per sequence (cu_seqlens_q), fp8 caches.
"""
from __future__ import annotations

import math

import pytest
import torch
from aot import compile_report

import kernelset as ks
from kernelset.core.registry import impls
from kernelset.core.tolerance import rel_err, tolerance
from kernelset.ops.attention import launch as L
from kernelset.ops.attention import reference as R

BACKENDS = [str(i.backend) for i in impls("paged_attention")]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
FP8 = torch.float8_e4m3fn


def _paged(keys, values, bs, device, cache_dtype=None, spare=3, scales=(None, None)):
    """Scatter per-sequence keys/values ``[L_b, Hkv, D]`` into random blocks of fresh random caches.

    Returns (k_cache, v_cache, block_table, seq_lens); unused table entries hold random valid ids,
    unused cache slots random values: neither may leak into the result."""
    hkv, d = keys[0].shape[1:]
    need = [-(-k.shape[0] // bs) for k in keys]
    nb = sum(need) + spare
    width = max(need + [1]) + 1
    dtype = cache_dtype or keys[0].dtype
    k_cache = torch.randn(nb, bs, hkv, d, device=device).to(dtype)
    v_cache = torch.randn(nb, bs, hkv, d, device=device).to(dtype)
    perm = torch.randperm(nb, device=device)
    table = torch.randint(0, nb, (len(keys), width), device=device, dtype=torch.int32)
    used = 0
    for b, (k, v) in enumerate(zip(keys, values)):
        blocks = perm[used: used + need[b]]
        used += need[b]
        table[b, : need[b]] = blocks.int()
        for i, blk in enumerate(blocks.tolist()):
            rows = slice(i * bs, min((i + 1) * bs, k.shape[0]))
            n = rows.stop - rows.start
            for cache, x, s in ((k_cache, k, scales[0]), (v_cache, v, scales[1])):
                src = x[rows] if s is None else (x[rows].float() / s).clamp(-448, 448)
                cache[blk, :n] = src.to(dtype)
    lens = torch.tensor([k.shape[0] for k in keys], dtype=torch.int32, device=device)
    return k_cache, v_cache, table, lens


def _seqs(lens, hkv, d, dtype, device):
    ks_ = [torch.randn(n, hkv, d, device=device).to(dtype) for n in lens]
    vs_ = [torch.randn(n, hkv, d, device=device).to(dtype) for n in lens]
    return ks_, vs_


def _expected(q, keys, values, starts, **opts):
    """The reference per sequence on contiguous keys: (out, lse) fp32."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full(q.shape[:2], float("-inf"), device=q.device)
    for b, (k, v) in enumerate(zip(keys, values)):
        t0, t1 = starts[b], starts[b + 1]
        if t1 > t0:
            out[t0:t1], lse[t0:t1] = R.attention(q[t0:t1], k, v, **opts)
    return out, lse


def _check(got, want, dtype, what=""):
    assert torch.isfinite(got.out).all(), f"{what}: non-finite output"
    assert rel_err(got.out, want[0]) <= tolerance("norm", dtype), what
    fin = torch.isfinite(want[1])
    assert torch.equal(torch.isfinite(got.lse), fin), f"{what}: -inf LSEs differ"
    assert rel_err(got.lse[fin], want[1][fin]) <= (1e-5 if dtype == torch.float32 else 1e-3), what


# (id, seq lens, Hq, Hkv, D, block size, why)
DECODE_CASES = [
    ("gqa4-d64-bs16", [37, 1, 16, 70], 8, 2, 64, 16, "GQA group of 4, lengths off/on block boundaries, length 1"),
    ("mha-d80-bs32", [33, 5], 3, 3, 80, 32, "MHA, a non power-of-two head size, 32-token blocks"),
    ("mqa-d96-bs64", [130, 64], 8, 1, 96, 64, "MQA (8 heads on one KV head), head size 96, 64-token blocks"),
    ("gqa2-d128-empty", [0, 19, 0], 4, 2, 128, 16, "empty sequences in the batch: out 0, lse -inf, no NaN"),
    ("gqa8-d256", [41], 16, 2, 256, 16, "head size 256 (32-key iterations)"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: c[0])
def test_decode_paged_equals_contiguous(backend, dtype, case, device):
    _, lens, hq, hkv, d, bs, _ = case
    keys, values = _seqs(lens, hkv, d, dtype, device)
    kc, vc, table, seq_lens = _paged(keys, values, bs, device)
    q = torch.randn(len(lens), hq, d, device=device).to(dtype)
    got = ks.paged_attention(q, kc, vc, table, seq_lens, return_lse=True, backend=backend)
    assert got.out.dtype == dtype and got.lse.dtype == torch.float32 and got.lse.shape == (len(lens), hq)
    _check(got, _expected(q, keys, values, list(range(len(lens) + 1))), dtype, "decode")
    for b, n in enumerate(lens):
        if n == 0:
            assert torch.equal(got.out[b], torch.zeros_like(got.out[b])) and torch.isneginf(got.lse[b]).all()


@pytest.mark.parametrize("splits", [1, 2, 5, 64])
def test_split_kv_equals_one_pass(splits, device):
    """The flash-decoding merge is exact up to fp32 rounding, whatever the split count."""
    lens = [300, 77, 1, 0]
    keys, values = _seqs(lens, 2, 64, torch.float32, device)
    kc, vc, table, seq_lens = _paged(keys, values, 16, device)
    q = torch.randn(len(lens), 4, 64, device=device)
    with L.TUNING.use(L.PagedTuning(splits=1)):
        one = ks.paged_attention(q, kc, vc, table, seq_lens, return_lse=True, backend="triton")
    with L.TUNING.use(L.PagedTuning(splits=splits, block_n=16)):
        many = ks.paged_attention(q, kc, vc, table, seq_lens, return_lse=True, backend="triton")
    p = L.paged_policy(4, 2, 2, 64, 1, table.shape[1] * 16, L.sm_count(q.device), L.PagedTuning(splits=splits,
                                                                                                  block_n=16))
    assert p.splits == min(splits, -(-table.shape[1] * 16 // 16))
    assert rel_err(many.out, one.out) < 1e-5
    fin = torch.isfinite(one.lse)
    assert torch.equal(fin, torch.isfinite(many.lse)) and rel_err(many.lse[fin], one.lse[fin]) < 1e-6


def test_default_policy_splits_a_long_single_sequence():
    p = L.paged_policy(1, 8, 4, 128, 1, 32768, 132)
    assert p.splits >= 32 and p.partition * p.splits >= 32768
    assert L.paged_policy(64, 8, 4, 128, 1, 4096, 132).splits == 1  # 512 programs: no split


def test_gqa_equals_mha_with_repeated_kv(device):
    lens = [45, 16]
    keys, values = _seqs(lens, 2, 64, torch.float32, device)
    kc, vc, table, seq_lens = _paged(keys, values, 16, device)
    q = torch.randn(2, 8, 64, device=device)
    gqa = ks.paged_attention(q, kc, vc, table, seq_lens, backend="triton")
    mha = ks.paged_attention(q, kc.repeat_interleave(4, 2), vc.repeat_interleave(4, 2), table, seq_lens,
                             backend="triton")
    assert rel_err(gqa, mha) < 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
def test_recording_call_runs_and_its_backward_raises(backend, device):
    """paged_attention is forward only. With q (or sinks) requiring grad and grad mode on (an
    evaluation loop without no_grad) the output used to carry no gradient at all, so a loss through
    it left q's gradient silently incomplete; the call still runs, and a backward raises by name."""
    keys, values = _seqs([9, 20], 2, 64, torch.float32, device)
    kc, vc, table, seq_lens = _paged(keys, values, 16, device)
    q = torch.randn(2, 4, 64, device=device, requires_grad=True)
    out = ks.paged_attention(q, kc, vc, table, seq_lens, backend=backend)
    with torch.no_grad():
        want = ks.paged_attention(q, kc, vc, table, seq_lens, backend=backend)
    assert torch.equal(out.detach(), want) and out.requires_grad
    with pytest.raises(RuntimeError, match="paged_attention has no backward"):
        (out.sum() + q.sum()).backward()


# (id, options, why)
FEATURE_CASES = [
    ("window-left", dict(window=(20, -1)), "sliding window: only the last 21 keys"),
    ("softcap", dict(softcap=5.0), "Gemma-2 logit softcap"),
    ("sinks", dict(sinks="random"), "gpt-oss attention sinks in the denominator"),
    ("all", dict(window=(7, 0), softcap=3.0, sinks="random", scale=0.2), "every option at once, explicit scale"),
    ("non-causal", dict(causal=False), "decode is unaffected: the query is the last token"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("case", FEATURE_CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_options(backend, dtype, case, splits, device):
    _, opts, _ = case
    opts = dict(opts)
    lens = [50, 3, 0]
    hq, hkv, d = 4, 2, 64
    if opts.get("sinks") == "random":
        opts["sinks"] = torch.randn(hq, device=device) * 2
    keys, values = _seqs(lens, hkv, d, dtype, device)
    kc, vc, table, seq_lens = _paged(keys, values, 16, device)
    q = (torch.randn(len(lens), hq, d, device=device) * 2).to(dtype)
    with L.TUNING.use(L.PagedTuning(splits=splits, block_n=16)):
        got = ks.paged_attention(q, kc, vc, table, seq_lens, return_lse=True, backend=backend, **opts)
    ref_opts = {k: v for k, v in opts.items()}
    _check(got, _expected(q, keys, values, [0, 1, 2, 3], **ref_opts), dtype, case[0])
    if "sinks" in opts:  # empty sequence with a sink: out 0, lse = the sink
        assert torch.equal(got.out[2], torch.zeros_like(got.out[2]))
        assert torch.allclose(got.lse[2], opts["sinks"].float(), atol=1e-5)


# (id, new tokens per sequence, cached lengths, Hq, Hkv, window, why)
VARLEN_CASES = [
    ("chunked-prefill", [5, 1, 0, 9], [40, 17, 8, 9], 4, 2, (-1, -1), "a chunk after a cached prefix, decode, "
     "an idle sequence, a whole prompt"),
    ("spec-verify", [4, 4], [21, 64], 8, 1, (-1, -1), "speculative verification: 4 draft tokens, MQA"),
    ("window", [6, 3], [30, 3], 4, 4, (4, 0), "sliding window over several query tokens"),
    ("long-chunk", [40], [70], 2, 1, (-1, -1), "more query rows (80) than one 64-row tile"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("case", VARLEN_CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("splits", [1, 2])
def test_varlen_queries(backend, dtype, case, splits, device):
    _, new, lens, hq, hkv, window, _ = case
    d = 64
    keys, values = _seqs(lens, hkv, d, dtype, device)
    kc, vc, table, seq_lens = _paged(keys, values, 16, device)
    starts = [0]
    for n in new:
        starts.append(starts[-1] + n)
    cu = torch.tensor(starts, dtype=torch.int32, device=device)
    q = torch.randn(starts[-1], hq, d, device=device).to(dtype)
    with L.TUNING.use(L.PagedTuning(splits=splits, block_n=16)):
        got = ks.paged_attention(q, kc, vc, table, seq_lens, cu_seqlens_q=cu, max_seqlen_q=max(new), window=window,
                                 return_lse=True, backend=backend)
    _check(got, _expected(q, keys, values, starts, window=window), dtype, case[0])


def test_varlen_with_one_token_each_equals_decode(device):
    lens = [33, 8, 1]
    keys, values = _seqs(lens, 2, 64, torch.bfloat16, device)
    kc, vc, table, seq_lens = _paged(keys, values, 16, device)
    q = torch.randn(3, 4, 64, device=device).to(torch.bfloat16)
    cu = torch.arange(4, dtype=torch.int32, device=device)
    a = ks.paged_attention(q, kc, vc, table, seq_lens, backend="triton")
    b = ks.paged_attention(q, kc, vc, table, seq_lens, cu_seqlens_q=cu, max_seqlen_q=1, backend="triton")
    assert rel_err(a, b) < 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("mag", [1.0, 1e5, 1e-6], ids=["q1", "q1e5", "q1e-6"])
def test_fp8_cache(backend, dtype, mag, device):
    """An e4m3 cache with per-tensor scales equals the reference on the dequantized cache; queries
    far outside fp16's range (bf16 holds 1e5; the kernel's fp16 dot must rescale them) or tiny,
    against keys scaled the other way so the scores stay the same."""
    if dtype == torch.float16 and mag > 1e4:
        pytest.skip("an fp16 query cannot hold 1e5")
    lens = [70, 9, 0]
    keys, values = _seqs(lens, 2, 128, torch.float32, device)
    keys = [k / mag for k in keys]
    k_scale, v_scale = torch.tensor(0.02 / mag, device=device), torch.tensor(0.015, device=device)
    kc, vc, table, seq_lens = _paged(keys, values, 16, device, cache_dtype=FP8, scales=(k_scale, v_scale))
    deq_k = [(k.float() / k_scale).clamp(-448, 448).to(FP8).float() * k_scale for k in keys]
    deq_v = [(v.float() / v_scale).clamp(-448, 448).to(FP8).float() * v_scale for v in values]
    q = (torch.randn(3, 8, 128, device=device) * mag).to(dtype)
    got = ks.paged_attention(q, kc, vc, table, seq_lens, k_scale=k_scale, v_scale=v_scale, return_lse=True,
                             backend=backend)
    _check(got, _expected(q, deq_k, deq_v, [0, 1, 2, 3]), dtype, "fp8")
    exact = _expected(q, keys, values, [0, 1, 2, 3])[0]
    assert rel_err(got.out, exact) < 0.1, "fp8 quantization error far beyond e4m3's"


def test_strided_q_and_cache_views(device):
    """q sliced from a fused qkv projection; caches as views of one [NB, 2, BS, H, D] allocation."""
    lens = [29, 40]
    keys, values = _seqs(lens, 2, 64, torch.float32, device)
    kc, vc, table, seq_lens = _paged(keys, values, 16, device)
    kv = torch.stack([kc, vc], 1)
    qkv = torch.randn(2, (4 + 2 * 2) * 64, device=device)
    q = qkv[:, : 4 * 64].view(2, 4, 64)
    got = ks.paged_attention(q, kv[:, 0], kv[:, 1], table, seq_lens, backend="triton")
    want = ks.paged_attention(q.contiguous(), kc, vc, table, seq_lens, backend="reference")
    assert rel_err(got, want) < 1e-5


def test_merge_of_two_halves_equals_whole(device):
    """Keys [0, 32) and [32, L) as two paged calls (the second through a shifted block table),
    merged, equal one call over [0, L)."""
    lens = [32 + 21, 32 + 40]
    keys, values = _seqs(lens, 2, 64, torch.float32, device)
    kc, vc, table, seq_lens = _paged(keys, values, 16, device)
    q = torch.randn(2, 4, 64, device=device)
    whole = ks.paged_attention(q, kc, vc, table, seq_lens, return_lse=True, backend="triton")
    first = ks.paged_attention(q, kc, vc, table, torch.full_like(seq_lens, 32), causal=False, return_lse=True,
                               backend="triton")
    second = ks.paged_attention(q, kc, vc, table[:, 2:].contiguous(), seq_lens - 32, causal=False, return_lse=True,
                                backend="triton")
    for backend in ("triton", "reference"):
        merged = ks.merge_attn_states(first.out, first.lse, second.out, second.lse, backend=backend)
        assert rel_err(merged.out, whole.out) < 1e-5 and rel_err(merged.lse, whole.lse) < 1e-6


@pytest.mark.parametrize("backend", [str(i.backend) for i in impls("merge_attn_states")])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_merge_attn_states(backend, dtype, device):
    t, h, d = 7, 3, 80
    oa = torch.randn(t, h, d, device=device).to(dtype)
    ob = torch.randn(t, 2 * h, d, device=device).to(dtype)[:, ::2]  # head-strided view
    la = torch.randn(t, h, device=device) * 3
    lb = torch.randn(h, t, device=device).t()  # transposed: any lse strides
    la[0, 0] = lb[0, 0] = float("-inf")  # both parts empty
    la[1, :] = float("-inf")  # one part empty
    out, lse = ks.merge_attn_states(oa, la, ob, lb, backend=backend)
    w_a = torch.exp(la - torch.logaddexp(la, lb)).unsqueeze(-1)
    w_b = torch.exp(lb - torch.logaddexp(la, lb)).unsqueeze(-1)
    want = torch.nan_to_num(w_a) * oa.float() + torch.nan_to_num(w_b) * ob.float()
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert rel_err(out, want) <= tolerance("elementwise", dtype)
    assert torch.equal(out[0, 0].float(), torch.zeros(d, device=device)) and torch.isneginf(lse[0, 0])
    assert torch.allclose(lse[1], lb[1]) and torch.equal(out[1], ob[1])
    fin = torch.isfinite(lse)
    assert torch.allclose(lse[fin], torch.logaddexp(la, lb)[fin], atol=1e-5)


def test_bad_block_id_is_refused_or_nan(device):
    keys, values = _seqs([40, 20], 2, 64, torch.float32, device)
    kc, vc, table, seq_lens = _paged(keys, values, 16, device)
    q = torch.randn(2, 4, 64, device=device)
    table[0, 1] = kc.shape[0] + 5
    with pytest.raises(ks.ArgumentError, match="block_table"):
        ks.paged_attention(q, kc, vc, table, seq_lens, backend="triton")
    out = ks.paged_attention(q, kc, vc, table, seq_lens, check_bounds=False, backend="triton")
    assert torch.isnan(out[0]).all(), "a bad block id must show, never read another block"
    assert rel_err(out[1], _expected(q, keys, values, [0, 1, 2])[0][1]) < 1e-5
    table[0, 1] = 0
    table[1, 3] = -7  # past the sequence's blocks: never used, never checked
    ks.paged_attention(q, kc, vc, table, seq_lens, backend="triton")


def test_sequence_longer_than_max_seq_len(device):
    keys, values = _seqs([40, 20], 2, 64, torch.float32, device)
    kc, vc, table, seq_lens = _paged(keys, values, 16, device)
    q = torch.randn(2, 4, 64, device=device)
    with pytest.raises(ks.ArgumentError, match="seq_lens"):
        ks.paged_attention(q, kc, vc, table, seq_lens, max_seq_len=32, backend="triton")
    out = ks.paged_attention(q, kc, vc, table, seq_lens, max_seq_len=32, check_bounds=False, backend="triton")
    assert torch.isnan(out[0]).all() and torch.isfinite(out[1]).all()


def _base():
    kc = torch.randn(4, 16, 2, 64)
    return dict(q=torch.randn(2, 4, 64), k_cache=kc, v_cache=kc.clone(),
                block_table=torch.zeros(2, 2, dtype=torch.int32), seq_lens=torch.tensor([3, 5], dtype=torch.int32))


@pytest.mark.parametrize("change,match", [
    (dict(q=torch.randn(2, 4, 32)), "head size"),
    (dict(q=torch.randn(2, 3, 64)), "multiple"),
    (dict(q=torch.randn(3, 4, 64)), "one token per sequence"),
    (dict(q=torch.randn(2, 4, 64, dtype=torch.float16)), "dtype"),
    (dict(k_cache=torch.randn(4, 16, 128)), "4-D"),
    (dict(v_cache=torch.randn(4, 16, 2, 32)), "v_cache"),
    (dict(block_table=torch.zeros(2, 2, dtype=torch.int64)), "block_table"),
    (dict(seq_lens=torch.tensor([3, 5, 1], dtype=torch.int32)), "block_table"),
    (dict(seq_lens=torch.tensor([3, 40], dtype=torch.int32)), "seq_lens"),
    (dict(scale=-1.0), "scale"),
    (dict(softcap=float("nan")), "softcap"),
    (dict(window=(3,)), "window"),
    (dict(window=(-2, 0)), "window"),
    (dict(sinks=torch.randn(3)), "sinks"),
    (dict(k_scale=torch.tensor(1.0)), "k_scale"),
    (dict(cu_seqlens_q=torch.tensor([0, 1], dtype=torch.int32)), "cu_seqlens_q"),
    (dict(cu_seqlens_q=torch.tensor([0, 2, 1], dtype=torch.int32)), "cu_seqlens_q"),
    (dict(cu_seqlens_q=torch.tensor([0, 2, 2], dtype=torch.int32), max_seqlen_q=1), "max_seqlen_q"),
    (dict(max_seq_len=-1), "max_seq_len"),
], ids=["head-size", "heads-not-multiple", "decode-batch", "q-dtype", "cache-3d", "v-shape", "table-int64",
        "lens-length", "lens-too-long", "neg-scale", "nan-softcap", "window-arity", "window-value", "sinks-shape",
        "scale-without-fp8", "cu-length", "cu-decreasing", "max-seqlen-q", "max-seq-len"])
def test_bad_input(change, match):
    args = _base()
    args.update(change)
    pos = [args.pop(k) for k in ("q", "k_cache", "v_cache", "block_table", "seq_lens")]
    with pytest.raises((ValueError, TypeError), match=match):
        ks.paged_attention(*pos, **args)


def test_fp8_cache_needs_scales_and_half_q():
    kc = torch.randn(4, 16, 2, 64).to(FP8)
    base = (kc, kc.clone(), torch.zeros(2, 2, dtype=torch.int32), torch.tensor([3, 5], dtype=torch.int32))
    with pytest.raises(ks.ArgumentError, match="k_scale"):
        ks.paged_attention(torch.randn(2, 4, 64, dtype=torch.bfloat16), *base)
    with pytest.raises(ks.ArgumentError, match="q"):
        ks.paged_attention(torch.randn(2, 4, 64), *base, k_scale=torch.tensor(1.0), v_scale=torch.tensor(1.0))


@pytest.mark.parametrize("bad", ["out_b-shape", "lse-dtype", "lse-shape"])
def test_merge_bad_input(bad):
    o, lse = torch.randn(3, 2, 8), torch.randn(3, 2)
    args = [o, lse, o.clone(), lse.clone()]
    if bad == "out_b-shape":
        args[2] = torch.randn(3, 2, 4)
    elif bad == "lse-dtype":
        args[1] = lse.double()
    else:
        args[3] = torch.randn(2, 3)
    with pytest.raises((ValueError, TypeError), match=bad.split("-")[0].replace("lse", "lse_")):
        ks.merge_attn_states(*args)


def test_compile_fullgraph(device):
    keys, values = _seqs([20, 9], 2, 64, torch.float32, device)
    kc, vc, table, seq_lens = _paged(keys, values, 16, device)
    q = torch.randn(2, 4, 64, device=device)
    sinks = torch.randn(4, device=device)

    def f(x):
        a = ks.paged_attention(x, kc, vc, table, seq_lens, sinks=sinks, softcap=4.0, return_lse=True)
        m = ks.merge_attn_states(a.out, a.lse, a.out * 2, a.lse)
        return m.out * 2, m.lse

    eager = f(q)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(q)
    assert rel_err(got[0], eager[0]) < 1e-6 and torch.allclose(got[1], eager[1])


def test_explain_and_catalog(device):
    keys, values = _seqs([5], 1, 64, torch.float32, device)
    kc, vc, table, seq_lens = _paged(keys, values, 16, device)
    exp = ks.explain("paged_attention", torch.randn(1, 2, 64, device=device), kc, vc, table, seq_lens, verbose=False)
    assert exp.chosen is not None and str(exp.candidates[-1].backend) == "reference"
    names = {e.name for e in ks.catalog() if e.spec.family == "attention"}
    assert {"paged_attention", "merge_attn_states"} <= names  # the dense prefill ops are in the family too


def test_reference_dense_batched_matches_loop():
    """The reference takes dense [B, S, H, D] too (for dense prefill ops): batch = loop."""
    q, k, v = torch.randn(2, 5, 4, 32), torch.randn(2, 9, 2, 32), torch.randn(2, 9, 2, 32)
    out, lse = R.attention(q, k, v, window=(3, 1), causal=False, softcap=2.0)
    for b in range(2):
        o, l = R.attention(q[b], k[b], v[b], window=(3, 1), causal=False, softcap=2.0)
        assert torch.allclose(out[b], o, atol=1e-6) and torch.allclose(lse[b], l)
    # causal, bottom-right aligned: the last query sees every key; the first sees Sk - Sq + 1
    s = torch.einsum("qhd,khd->hqk", q[0], k[0].repeat_interleave(2, 1)) / math.sqrt(32)
    assert torch.allclose(R.attention(q[0], k[0], v[0])[1][0], torch.logsumexp(s[:, 0, :5], -1), atol=1e-5)


# ---- GPU-only: real sizes, CUDA-graph capture --------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_gpu_decode_real_size(fp8):
    lens = [4096, 1, 0, 2049, 3000, 17, 4095, 512]
    keys, values = _seqs(lens, 8, 128, torch.bfloat16, "cuda")
    scales = (torch.tensor(0.02, device="cuda"), torch.tensor(0.02, device="cuda")) if fp8 else (None, None)
    kc, vc, table, seq_lens = _paged(keys, values, 16, "cuda", cache_dtype=FP8 if fp8 else None, scales=scales)
    q = torch.randn(len(lens), 32, 128, device="cuda").to(torch.bfloat16)
    got = ks.paged_attention(q, kc, vc, table, seq_lens, k_scale=scales[0], v_scale=scales[1], return_lse=True)
    want = ks.paged_attention(q, kc, vc, table, seq_lens, k_scale=scales[0], v_scale=scales[1], return_lse=True,
                              backend="reference")
    assert rel_err(got.out, want.out) <= tolerance("norm", torch.bfloat16)
    fin = torch.isfinite(want.lse)
    assert torch.equal(torch.isfinite(got.lse), fin) and rel_err(got.lse[fin], want.lse[fin]) < 1e-3


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_follows_new_lengths():
    lens = [1000, 3000, 5]
    keys, values = _seqs(lens, 8, 128, torch.bfloat16, "cuda")
    kc, vc, table, seq_lens = _paged(keys, values, 16, "cuda")
    q = torch.randn(3, 32, 128, device="cuda").to(torch.bfloat16)
    kw = dict(max_seq_len=4096, return_lse=True)
    ks.paged_attention(q, kc, vc, table, seq_lens, **kw)  # warm up: compile, dispatch cache
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        res = ks.paged_attention(q, kc, vc, table, seq_lens, **kw)
    for new in ([1000, 3000, 5], [7, 2999, 0], [1, 1, 1]):
        seq_lens.copy_(torch.tensor(new, dtype=torch.int32))
        g.replay()
        torch.cuda.synchronize()
        want = ks.paged_attention(q, kc, vc, table, seq_lens, backend="reference", **kw)
        assert rel_err(res.out, want.out) <= tolerance("norm", torch.bfloat16), new


_AOT = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernelset.ops.attention import kernels as K
from kernelset.ops.attention.launch import paged_policy

def run(fn, sig, consts, warps, arch, name, stages=None):
    # as @triton.jit specializes real calls: 16-byte aligned pointers, strides % 16 == 0, None as constexpr
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n, ty in sig.items()
             if ty is not None and (ty.startswith("*") or n.startswith("stride"))}
    consts = {**consts, **{n: None for n, ty in sig.items() if ty is None}}
    full = {n: sig[n] if sig.get(n) is not None else "constexpr" for n in fn.arg_names}
    src = ASTSource(fn, signature=full, constexprs=consts, attrs=attrs)
    opts = dict(num_warps=warps, **({"num_stages": stages} if stages else {}))
    c = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=opts)
    ptx = c.asm["ptx"]
    return dict(case=name, local="ld.local" in ptx or "st.local" in ptx, vec=".v4" in ptx or ".v2" in ptx)

out = []
def fwd_sig(dt, kv, varlen, sinks, fp8, splits):
    return dict(Q=f"*{dt}", KC=f"*{kv}", VC=f"*{kv}", BT="*i32", SEQ="*i32", CUQ="*i32" if varlen else None,
                SINKS="*fp32" if sinks else None, KSCALE="*fp32" if fp8 else None, VSCALE="*fp32" if fp8 else None,
                O=f"*{dt}", LSE="*fp32", PO="*fp32" if splits > 1 else None, PLSE="*fp32" if splits > 1 else None,
                qk_mul="fp32", cap_mul="fp32", window_left="i32", window_right="i32", num_kv_heads="i32",
                num_tiles="i32", partition="i32", num_blocks="i32", max_table="i32", max_keys="i32",
                stride_qt="i32", stride_qh="i32", stride_kb="i32", stride_ks="i32", stride_kh="i32", stride_vb="i32",
                stride_vs="i32", stride_vh="i32", stride_bt="i32", Hq="i32", num_splits="i32")
# (name, arch, head dim, group, kv dtype, varlen, sinks/softcap/window, splits)
for name, arch, d, g, kv, varlen, extra, splits in (
        ("decode-d128-sm90", 90, 128, 4, "bf16", False, False, 1),
        ("decode-d128-split-sm90", 90, 128, 4, "bf16", False, False, 8),
        ("decode-d256-sm90", 90, 256, 8, "bf16", False, False, 1),
        ("decode-d128-fp8-sm90", 90, 128, 4, "fp8e4nv", False, False, 1),
        ("varlen-d128-opts-sm90", 90, 128, 4, "bf16", True, True, 2),
        ("decode-d80-sm90", 90, 80, 4, "bf16", False, False, 1),
        ("decode-d128-sm80", 80, 128, 4, "bf16", False, False, 1),
        ("decode-d256-sm80", 80, 256, 8, "bf16", False, False, 1),
        ("varlen-d128-sm80", 80, 128, 4, "bf16", True, True, 2)):
    p = paged_policy(1, 8, g, d, 16 if varlen else 1, 32768, 132)
    consts = dict(G=g, D=d, BS=16, BLOCK_M=p.block_m, BLOCK_N=p.block_n, BLOCK_D=p.block_d, SPLIT=splits > 1,
                  VARLEN=varlen, MASK_RIGHT=varlen, MASK_LEFT=extra, SOFTCAP=extra, HAS_SINKS=extra,
                  FP8=kv.startswith("fp8"), F32=False)
    out.append(run(K._paged_attn_fwd_kernel, fwd_sig("bf16", kv, varlen, extra, kv.startswith("fp8"), splits), consts,
                   p.num_warps, arch, name, p.num_stages))
rsig = dict(PO="*fp32", PLSE="*fp32", SINKS="*fp32", O="*bf16", LSE="*fp32", Hq="i32", num_splits="i32")
out.append(run(K._paged_attn_reduce_kernel, rsig, dict(D=128, BLOCK_S=64, BLOCK_D=128, HAS_SINKS=True), 4,
               90, "reduce-64-splits"))
msig = dict(OA="*bf16", LA="*fp32", OB="*bf16", LB="*fp32", O="*bf16", LSE="*fp32", R="i32", H="i32",
            stride_oat="i32", stride_oah="i32", stride_obt="i32", stride_obh="i32", stride_lat="i32",
            stride_lah="i32", stride_lbt="i32", stride_lbh="i32")
out.append(run(K._merge_attn_states_kernel, msig, dict(D=128, BLOCK_R=16, BLOCK_D=128), 4, 90, "merge"))
print(json.dumps(out))
"""


def test_kernels_compile_for_sm90_and_sm80():
    """The decode kernel (tl.dot over the GQA group) compiles for sm_90 and sm_80 at D 128 and 256
    without spills, with vector loads; the split reduce and the merge kernel too."""
    compile_report(_AOT, 11)
