"""mla_decode against an fp32 computation on contiguous latent sequences.

Properties: paged equals contiguous (each sequence's latent rows scattered over random blocks give
the dense formula's result on the rows in order), split-KV equals one pass, fp8 cache equals the
dequantized cache; empty and length-1 sequences, block boundaries, head counts that are not a
power of two, DeepSeek's real rank (512) and rope dim (64).
"""
from __future__ import annotations

import pytest
import torch
from aot import compile_report

import kernelset as ks
from kernelset.core.registry import impls
from kernelset.core.tolerance import rel_err, tolerance
from kernelset.ops.mla import launch as L

BACKENDS = [str(i.backend) for i in impls("mla_decode")]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
FP8 = torch.float8_e4m3fn


def _paged(seqs, bs, device, cache_dtype=None, scale=None, spare=3):
    """Scatter per-sequence latent rows ``[L_b, R + P]`` into random blocks of a fresh random cache;
    unused table entries hold random valid ids and unused slots random values (neither may leak)."""
    width = seqs[0].shape[1]
    need = [-(-s.shape[0] // bs) for s in seqs]
    nb = sum(need) + spare
    dtype = cache_dtype or seqs[0].dtype
    cache = torch.randn(nb, bs, width, device=device).to(dtype)
    perm = torch.randperm(nb, device=device)
    table = torch.randint(0, nb, (len(seqs), max(need + [1]) + 1), device=device, dtype=torch.int32)
    used = 0
    for b, s in enumerate(seqs):
        blocks = perm[used: used + need[b]]
        used += need[b]
        table[b, : need[b]] = blocks.int()
        for i, blk in enumerate(blocks.tolist()):
            rows = s[i * bs: (i + 1) * bs]
            src = rows if scale is None else (rows.float() / scale).clamp(-448, 448)
            cache[blk, : rows.shape[0]] = src.to(dtype)
    return cache, table, torch.tensor([s.shape[0] for s in seqs], dtype=torch.int32, device=device)


def _expected(q_nope, q_pe, seqs, scale):
    """The formula on contiguous rows, fp32: (out [B, H, R], lse [B, H])."""
    b, h, r = q_nope.shape
    out = torch.zeros(b, h, r, device=q_nope.device)
    lse = torch.full((b, h), float("-inf"), device=q_nope.device)
    for i, s in enumerate(seqs):
        if s.shape[0]:
            c, k_pe = s[:, :r].float(), s[:, r:].float()
            logits = (q_nope[i].float() @ c.T + q_pe[i].float() @ k_pe.T) * scale
            lse[i] = torch.logsumexp(logits, -1)
            out[i] = torch.softmax(logits, -1) @ c
    return out, lse


def _check(got, want, dtype, what=""):
    assert torch.isfinite(got.out).all(), f"{what}: non-finite output"
    assert rel_err(got.out, want[0]) <= tolerance("norm", dtype), what
    fin = torch.isfinite(want[1])
    assert torch.equal(torch.isfinite(got.lse), fin), f"{what}: -inf LSEs differ"
    assert rel_err(got.lse[fin], want[1][fin]) <= (1e-5 if dtype == torch.float32 else 1e-3), what


# (id, seq lens, heads, kv_lora_rank, rope_dim, block size, why)
CASES = [
    ("h16-r64-bs16", [37, 1, 16, 70], 16, 64, 16, 16, "lengths off/on block boundaries, length 1"),
    ("h20-r64-bs64-empty", [0, 130, 0], 20, 64, 16, 64, "20 heads (a masked head tile), empty sequences"),
    ("h8-r512-p64", [45, 3], 8, 512, 64, 16, "DeepSeek's rank and rope dim; fewer heads than a dot tile"),
    ("h128-r128-p32", [33], 128, 128, 32, 32, "128 heads: two 64-head tiles read the same rows"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_paged_equals_contiguous(backend, dtype, case, device):
    _, lens, h, r, p, bs, _ = case
    seqs = [torch.randn(n, r + p, device=device).to(dtype) for n in lens]
    cache, table, seq_lens = _paged(seqs, bs, device)
    q_nope = torch.randn(len(lens), h, r, device=device).to(dtype)
    q_pe = torch.randn(len(lens), h, p, device=device).to(dtype)
    scale = (r + p) ** -0.5
    got = ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, scale=scale, kv_lora_rank=r, rope_dim=p,
                        return_lse=True, backend=backend)
    assert got.out.dtype == dtype and got.out.shape == (len(lens), h, r) and got.lse.shape == (len(lens), h)
    _check(got, _expected(q_nope, q_pe, seqs, scale), dtype, "mla")
    for b, n in enumerate(lens):
        if n == 0:
            assert torch.equal(got.out[b], torch.zeros_like(got.out[b])) and torch.isneginf(got.lse[b]).all()


@pytest.mark.parametrize("prefetch", [False, True], ids=["table-in-step", "table-prefetched"])
@pytest.mark.parametrize("splits", [2, 5, 64])
def test_split_kv_equals_one_pass(splits, prefetch, device):
    lens = [300, 77, 1, 0]
    seqs = [torch.randn(n, 80, device=device) for n in lens]
    cache, table, seq_lens = _paged(seqs, 16, device)
    q_nope, q_pe = torch.randn(4, 16, 64, device=device), torch.randn(4, 16, 16, device=device)
    kw = dict(scale=0.125, kv_lora_rank=64, rope_dim=16, return_lse=True, backend="triton")
    with L.TUNING.use(L.MlaTuning(splits=1, prefetch_pages=prefetch)):
        one = ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, **kw)
    with L.TUNING.use(L.MlaTuning(splits=splits, block_n=16, prefetch_pages=prefetch)):
        many = ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, **kw)
    pol = L.mla_policy(4, 16, 64, 16, table.shape[1] * 16, L.sm_count(q_nope.device), False,
                       L.MlaTuning(splits=splits, block_n=16))
    assert pol.splits == min(splits, table.shape[1])
    assert rel_err(many.out, one.out) < 1e-5
    fin = torch.isfinite(one.lse)
    assert torch.equal(fin, torch.isfinite(many.lse)) and rel_err(many.lse[fin], one.lse[fin]) < 1e-6


@pytest.mark.parametrize("scale", [0.05, 1.0, 4.0], ids=["flat", "steep", "steeper"])
def test_lazy_rescale_equals_eager(scale, device):
    """Rows whose max keeps growing (later tokens score ever higher) cross the lazy threshold
    several times: the result equals the rescale-every-block kernel's."""
    lens = [200, 64, 1]
    seqs = [torch.randn(n, 80, device=device) * torch.linspace(0.2, 3.0, n, device=device)[:, None] for n in lens]
    cache, table, seq_lens = _paged(seqs, 16, device)
    q_nope, q_pe = torch.randn(3, 16, 64, device=device), torch.randn(3, 16, 16, device=device)
    kw = dict(scale=scale, kv_lora_rank=64, rope_dim=16, return_lse=True, backend="triton")
    with L.TUNING.use(L.MlaTuning(splits=1, block_n=16, lazy=True)):
        lazy = ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, **kw)
    with L.TUNING.use(L.MlaTuning(splits=1, block_n=16, lazy=False)):
        eager = ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, **kw)
    assert rel_err(lazy.out, eager.out) < 1e-5 and rel_err(lazy.lse, eager.lse) < 1e-6
    _check(lazy, _expected(q_nope, q_pe, seqs, scale), torch.float32, "lazy")


def test_default_policy():
    p = L.mla_policy(64, 128, 512, 64, 4096, 132)
    assert (p.block_h, p.head_tiles, p.num_warps) == (64, 2, 8) and p.splits * p.partition >= 4096
    # 64-head tiles run one program per SM: the most splits that fit one wave
    assert p.splits == 1 and p.prefetch_pages
    long = L.mla_policy(4, 128, 512, 64, 32768, 132)
    assert long.splits == 16 and 4 * long.head_tiles * long.splits <= 132
    assert not L.mla_policy(64, 128, 512, 64, 4096, 132, True).prefetch_pages  # fp8, one stage: off
    assert L.mla_policy(1, 16, 512, 64, 32768, 132).splits >= 32  # one long sequence fills the GPU
    assert L.mla_policy(512, 128, 512, 64, 4096, 132).splits == 1  # 1024 programs: no split


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fp8_cache(dtype, device):
    lens = [50, 17]
    seqs = [torch.randn(n, 80, device=device).to(dtype) for n in lens]
    kv_scale = torch.tensor(0.02, device=device)
    cache, table, seq_lens = _paged(seqs, 16, device, cache_dtype=FP8, scale=0.02)
    q_nope, q_pe = torch.randn(2, 16, 64, device=device).to(dtype), torch.randn(2, 16, 16, device=device).to(dtype)
    got = ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, scale=0.11, kv_lora_rank=64, rope_dim=16,
                        kv_scale=kv_scale, return_lse=True, backend="triton")
    # the expectation on the values the cache holds (dequantized), not on the unquantized inputs
    deq = [torch.cat([cache[table[b, j // 16].long(), j % 16].float()[None] for j in range(n)]) * 0.02
           for b, n in enumerate(lens)]
    _check(got, _expected(q_nope, q_pe, deq, 0.11), dtype, "fp8")
    ref = ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, scale=0.11, kv_lora_rank=64, rope_dim=16,
                        kv_scale=kv_scale, return_lse=True, backend="reference")
    assert rel_err(got.out, ref.out) <= tolerance("norm", dtype)


def test_strided_queries(device):
    """q_nope and q_pe as views into one [B, H, R + P] query (how an absorbed projection leaves them)."""
    seqs = [torch.randn(n, 80, device=device) for n in (20, 9)]
    cache, table, seq_lens = _paged(seqs, 16, device)
    q = torch.randn(2, 16, 80, device=device)
    got = ks.mla_decode(q[..., :64], q[..., 64:], cache, table, seq_lens, scale=0.1, kv_lora_rank=64, rope_dim=16,
                        return_lse=True, backend="triton")
    _check(got, _expected(q[..., :64], q[..., 64:], seqs, 0.1), torch.float32, "strided")


def test_bad_block_id_is_refused_or_nan(device):
    seqs = [torch.randn(n, 80, device=device) for n in (40, 20)]
    cache, table, seq_lens = _paged(seqs, 16, device)
    q_nope, q_pe = torch.randn(2, 16, 64, device=device), torch.randn(2, 16, 16, device=device)
    kw = dict(scale=0.1, kv_lora_rank=64, rope_dim=16, backend="triton")
    table[0, 1] = cache.shape[0] + 5
    with pytest.raises(ks.ArgumentError, match="block_table"):
        ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, **kw)
    out = ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, check_bounds=False, **kw)
    assert torch.isnan(out[0]).all(), "a bad block id must show, never read another block"
    assert rel_err(out[1], _expected(q_nope, q_pe, seqs, 0.1)[0][1]) < 1e-5
    table[0, 1] = 0
    with pytest.raises(ks.ArgumentError, match="seq_lens"):
        ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, max_seq_len=32, **kw)
    out = ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, max_seq_len=32, check_bounds=False, **kw)
    assert torch.isnan(out[0]).all() and torch.isfinite(out[1]).all()


def _base():
    return dict(q_nope=torch.randn(2, 4, 64), q_pe=torch.randn(2, 4, 16), kv_cache=torch.randn(4, 16, 80),
                block_table=torch.zeros(2, 2, dtype=torch.int32), seq_lens=torch.tensor([3, 5], dtype=torch.int32),
                scale=0.1, kv_lora_rank=64, rope_dim=16)


@pytest.mark.parametrize("change,match", [
    (dict(q_nope=torch.randn(2, 4, 32)), "kv_lora_rank"),
    (dict(q_nope=torch.randn(8, 64)), "3-D"),
    (dict(q_pe=torch.randn(2, 4, 8)), "q_pe"),
    (dict(q_pe=torch.randn(2, 4, 16, dtype=torch.float16)), "q_pe"),
    (dict(kv_cache=torch.randn(4, 16, 64)), "kv_cache"),
    (dict(kv_cache=torch.randn(4, 16, 80, dtype=torch.float16)), "kv_cache"),
    (dict(block_table=torch.zeros(2, 2, dtype=torch.int64)), "block_table"),
    (dict(block_table=torch.zeros(3, 2, dtype=torch.int32)), "block_table"),
    (dict(seq_lens=torch.tensor([3, 5, 1], dtype=torch.int32)), "seq_lens"),
    (dict(seq_lens=torch.tensor([3, 40], dtype=torch.int32)), "seq_lens"),
    (dict(scale=0.0), "scale"),
    (dict(rope_dim=0), "rope_dim"),
    (dict(kv_scale=torch.tensor(1.0)), "kv_scale"),
    (dict(max_seq_len=-1), "max_seq_len"),
], ids=["rank", "q-2d", "pe-shape", "pe-dtype", "cache-width", "cache-dtype", "table-int64", "table-rows",
        "lens-length", "lens-too-long", "zero-scale", "rope-dim", "scale-without-fp8", "max-seq-len"])
def test_bad_input(change, match):
    args = _base()
    args.update(change)
    pos = [args.pop(k) for k in ("q_nope", "q_pe", "kv_cache", "block_table", "seq_lens")]
    with pytest.raises((ValueError, TypeError), match=match):
        ks.mla_decode(*pos, **args)


def test_fp8_cache_needs_scale_and_half_q():
    base = (torch.randn(4, 16, 80).to(FP8), torch.zeros(2, 2, dtype=torch.int32), torch.tensor([3, 5], dtype=torch.int32))
    kw = dict(scale=0.1, kv_lora_rank=64, rope_dim=16)
    with pytest.raises(ks.ArgumentError, match="kv_scale"):
        ks.mla_decode(torch.randn(2, 4, 64, dtype=torch.bfloat16), torch.randn(2, 4, 16, dtype=torch.bfloat16),
                      *base, **kw)
    with pytest.raises(ks.ArgumentError, match="q_nope"):
        ks.mla_decode(torch.randn(2, 4, 64), torch.randn(2, 4, 16), *base, kv_scale=torch.tensor(1.0), **kw)


def test_compile_fullgraph_and_explain(device):
    seqs = [torch.randn(n, 80, device=device) for n in (20, 9)]
    cache, table, seq_lens = _paged(seqs, 16, device)
    q_nope, q_pe = torch.randn(2, 16, 64, device=device), torch.randn(2, 16, 16, device=device)

    def f(x):
        return ks.mla_decode(x, q_pe, cache, table, seq_lens, scale=0.1, kv_lora_rank=64, rope_dim=16) * 2

    got = torch.compile(f, fullgraph=True, backend="aot_eager")(q_nope)
    assert rel_err(got, f(q_nope)) < 1e-6
    exp = ks.explain("mla_decode", q_nope, q_pe, cache, table, seq_lens, verbose=False)
    assert exp.chosen is not None and str(exp.candidates[-1].backend) == "reference"
    if str(exp.chosen) == "triton":  # the chosen candidate says which kernel, and why not the sm_90 one
        assert exp.candidates[0].reason.startswith("kernel: Triton tl.dot (the sm_90 Gluon kernel needs"), exp


def test_explain_names_the_sm90_kernel_from_the_problem():
    """The wgmma kernel's coverage, decided from the dispatcher's Problem (no tensors), as explain shows it."""
    from kernelset.core import config
    from kernelset.core.registry import Problem
    from kernelset.ops.mla.backends import _detail

    def prob(arch=(9, 0), heads=128, bs=64, cache="bfloat16", dtype=torch.bfloat16):
        return Problem("mla_decode", torch.device("cuda"), dtype, (4, heads, 512), arch,
                       {"heads": heads, "kv_lora_rank": 512, "rope_dim": 64, "block_size": bs, "cache_dtype": cache})
    with config.override(triton_interpret=False):
        gluon = L._wgmma_module() is not None
        assert _detail(prob()).startswith("kernel: warp-specialized Gluon wgmma" if gluon else "kernel: Triton")
        assert "needs sm_90" in _detail(prob(arch=(8, 0)))
        assert "at least 64 heads" in _detail(prob(heads=16))
        assert "multiple of 64" in _detail(prob(bs=16))
        assert "bf16/fp16 cache" in _detail(prob(cache="float8_e4m3fn"))
        with L.TUNING.use(L.MlaTuning(wgmma=False)):
            assert "turned off" in _detail(prob())


# ---- GPU-only: real sizes, CUDA-graph capture --------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [128, 16])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_gpu_real_size(heads, fp8):
    lens = [4096, 1, 0, 2049, 3000, 17]
    scale = 0.02 if fp8 else None
    seqs = [torch.randn(n, 576, device="cuda").to(torch.bfloat16) for n in lens]
    cache, table, seq_lens = _paged(seqs, 64, "cuda", cache_dtype=FP8 if fp8 else None, scale=scale)
    kv_scale = torch.tensor(0.02, device="cuda") if fp8 else None
    q_nope = torch.randn(len(lens), heads, 512, device="cuda").to(torch.bfloat16)
    q_pe = torch.randn(len(lens), heads, 64, device="cuda").to(torch.bfloat16)
    kw = dict(scale=192 ** -0.5, kv_scale=kv_scale, return_lse=True)
    got = ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, **kw)
    want = ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, backend="reference", **kw)
    assert rel_err(got.out, want.out) <= tolerance("norm", torch.bfloat16)
    fin = torch.isfinite(want.lse)
    assert torch.equal(torch.isfinite(got.lse), fin) and rel_err(got.lse[fin], want.lse[fin]) < 1e-3


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_follows_new_lengths():
    seqs = [torch.randn(n, 576, device="cuda").to(torch.bfloat16) for n in (1000, 3000, 5)]
    cache, table, seq_lens = _paged(seqs, 64, "cuda")
    q_nope = torch.randn(3, 128, 512, device="cuda").to(torch.bfloat16)
    q_pe = torch.randn(3, 128, 64, device="cuda").to(torch.bfloat16)
    kw = dict(scale=0.07, max_seq_len=4096, return_lse=True)
    ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, **kw)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        res = ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, **kw)
    for new in ([1000, 3000, 5], [7, 2999, 0], [1, 1, 1]):
        seq_lens.copy_(torch.tensor(new, dtype=torch.int32))
        g.replay()
        torch.cuda.synchronize()
        want = ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, backend="reference", **kw)
        assert rel_err(res.out, want.out) <= tolerance("norm", torch.bfloat16), new


_AOT = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernelset.ops.mla import kernels as K
from kernelset.ops.mla.launch import mla_policy

def run(fn, sig, consts, warps, stages, arch, name):
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n, ty in sig.items()
             if ty is not None and (ty.startswith("*") or n.startswith("stride"))}
    consts = {**consts, **{n: None for n, ty in sig.items() if ty is None}}
    full = {n: sig[n] if sig.get(n) is not None else "constexpr" for n in fn.arg_names}
    c = triton.compile(ASTSource(fn, signature=full, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", arch, 32), options=dict(num_warps=warps, num_stages=stages))
    ptx = c.asm["ptx"]
    return dict(case=name, local="ld.local" in ptx or "st.local" in ptx, vec=".v4" in ptx or ".v2" in ptx)

def sig(kv, splits):
    return dict(QN="*bf16", QP="*bf16", KV=f"*{kv}", BT="*i32", SEQ="*i32",
                KVSCALE="*fp32" if kv.startswith("fp8") else None, O="*bf16", LSE="*fp32",
                PO="*fp32" if splits > 1 else None, PLSE="*fp32" if splits > 1 else None, s_mul="fp32", H="i32",
                num_head_tiles="i32", partition="i32", num_blocks="i32", max_table="i32", max_keys="i32",
                stride_qnb="i32", stride_qnh="i32", stride_qpb="i32", stride_qph="i32", stride_kvb="i32",
                stride_kvs="i32", stride_bt="i32")
out = []
# (name, arch, batch, heads, cache dtype): the policy picks the tiles, as at run time
for name, arch, b, h, kv in (("h128-sm90", 90, 64, 128, "bf16"), ("h128-fp8-sm90", 90, 64, 128, "fp8e4nv"),
                             ("h16-sm90", 90, 64, 16, "bf16"), ("h128-sm80", 80, 64, 128, "bf16")):
    p = mla_policy(b, h, 512, 64, 4096, 132, kv.startswith("fp8"))
    consts = dict(R=512, P=64, BS=64, BLOCK_H=p.block_h, BLOCK_N=p.block_n, BLOCK_R=p.block_r, BLOCK_P=p.block_p,
                  SPLITS=p.splits, LAZY=p.lazy, FP8=kv.startswith("fp8"), F32=False, PREFETCH_PAGES=p.prefetch_pages)
    out.append(run(K._mla_decode_fwd_kernel, sig(kv, p.splits), consts, p.num_warps, p.num_stages, arch, name))
print(json.dumps(out))
"""


def test_kernel_compiles_for_sm90_and_sm80():
    """DeepSeek-V3 shapes (rank 512, rope 64, 128 or 16 heads) compile without spills, vectorized."""
    compile_report(_AOT, 4)


_AOT_WGMMA = r"""
import collections, json, re
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from kernelset.ops.mla import gluon_sm90 as KW

out = []
for ws, splits in ((True, 1), (True, 4), (False, 1)):
    bn, stages = 64, 2
    lay = {w: gl.NVMMASharedLayout.get_default_for([bn, w], gl.bfloat16) for w in (512, 64)}
    sig = dict(c_desc=f"tensordesc<bf16[{bn}, 512],{lay[512]!r}>", pe_desc=f"tensordesc<bf16[{bn}, 64],{lay[64]!r}>",
               QN="*bf16", QP="*bf16", BT="*i32", SEQ="*i32", O="*bf16", LSE="*fp32",
               PO="*fp32" if splits > 1 else None, PLSE="*fp32" if splits > 1 else None, s_mul="fp32", H="i32",
               num_head_tiles="i32", partition="i32", num_blocks="i32", max_keys="i32", stride_qnb="i32",
               stride_qnh="i32", stride_qpb="i32", stride_qph="i32", stride_bt="i32")
    fn = KW._mla_decode_ws_kernel if ws else KW._mla_decode_wgmma_kernel
    warps = 4 if ws else 8
    consts = dict(R=512, P=64, BS=64, BLOCK_H=64, BLOCK_N=bn, STAGES=stages, SPLITS=splits)
    consts.update({n: None for n, t in sig.items() if t is None})
    full = {n: sig.get(n) or "constexpr" for n in fn.arg_names}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n, t in sig.items()
             if t is not None and (t.startswith("*") or n.startswith("stride"))}
    c = triton.compile(GluonASTSource(fn, signature=full, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))
    ptx = c.asm["ptx"]
    mma = collections.Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx))
    out.append(dict(case=f"{'ws' if ws else 'split'}-splits{splits}", ws=ws, maxnreg="setmaxnreg" in ptx, local="ld.local" in ptx or "st.local" in ptx,
                    vec=".v4" in ptx or ".v2" in ptx, tma="cp.async.bulk.tensor" in ptx, mma=dict(mma),
                    smem=c.metadata.shared))
print(json.dumps(out))
"""


def test_wgmma_kernel_compiles_for_sm90():
    """Both Gluon kernels compile for sm_90 with this machine's Triton: no spills, TMA loads, within
    the 227 KB of shared memory, and S computed once per 64-token tile, never per warpgroup:
    - warp-specialized: warpgroup 0 issues the whole QK as 36 m64n64k16 (K = 576), each warpgroup
      4 m64n256k16 for its half of the output (8 in the code), registers reallocated (setmaxnreg);
    - split form: each warpgroup 36 m64n32k16 over its half of the tokens, 4 m64n256k16."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    for r in compile_report(_AOT_WGMMA, 3):
        assert r["tma"], r
        want = {"m64n64k16": 36, "m64n256k16": 8} if r["ws"] else {"m64n32k16": 36, "m64n256k16": 4}
        assert r["mma"] == want, r
        assert r["maxnreg"] == r["ws"], r
        assert r["smem"] <= 232448, r  # the sm_90 limit per block


@pytest.mark.gpu
def test_gpu_wgmma_kernel_serves_128_heads_and_matches_triton():
    """On sm_90 the default path for 128 heads is the wgmma kernel; it agrees with the Triton kernel
    and the reference on ragged lengths (partial tiles, length 0 and 1), forced splits, and NaN bytes
    in the unused rows of the last pages (zeroed before the PV product)."""
    from kernelset.ops.mla import launch as L
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel is sm_90 only")
    lens = [4096, 1, 0, 65, 3000, 17, 64]
    seqs = [torch.randn(n, 576, device="cuda").to(torch.bfloat16) for n in lens]
    cache, table, seq_lens = _paged(seqs, 64, "cuda")
    for i, n in enumerate(lens):
        if n % 64:
            cache[table[i, n // 64].long(), n % 64:] = float("nan")
    q_nope = torch.randn(len(lens), 128, 512, device="cuda").to(torch.bfloat16)
    q_pe = torch.randn(len(lens), 128, 64, device="cuda").to(torch.bfloat16)
    assert L.wgmma_reason(q_nope, q_pe, cache, L.MlaTuning()) is None
    kw = dict(scale=192 ** -0.5, return_lse=True)
    want = ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, backend="reference", **kw)
    fin = torch.isfinite(want.lse)
    eager = dict(wgmma_eager_min_work=0)  # this small batch would take the Triton kernel eagerly
    for tuning in (L.MlaTuning(**eager), L.MlaTuning(splits=3, **eager), L.MlaTuning(wgmma_ws=False, **eager),
                   L.MlaTuning(wgmma=False)):
        with L.TUNING.use(tuning):
            got = ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, **kw)
        assert torch.isfinite(got.out).all(), tuning
        assert rel_err(got.out, want.out) <= tolerance("norm", torch.bfloat16), tuning
        assert torch.equal(torch.isfinite(got.lse), fin) and rel_err(got.lse[fin], want.lse[fin]) < 1e-3, tuning


def test_eager_calls_take_the_gluon_kernel_only_from_the_work_threshold(monkeypatch, device):
    """Where the sm_90 kernel applies, an eager call takes it from batch x heads x max_keys >=
    MlaTuning.wgmma_eager_min_work (its launch costs more host time), below that the Triton kernel."""
    seqs = [torch.randn(n, 80, device=device) for n in (20, 9)]
    cache, table, seq_lens = _paged(seqs, 16, device)
    q_nope, q_pe = torch.randn(2, 16, 64, device=device), torch.randn(2, 16, 16, device=device)
    calls = []
    monkeypatch.setattr(L, "wgmma_reason", lambda *a: None)
    monkeypatch.setattr(L, "_mla_decode_wgmma", lambda *a: calls.append(a[-2]))  # max_keys
    work = 2 * 16 * 48  # batch x heads x max_keys (3 table columns of 16)
    for threshold, gluon in ((work + 1, False), (work, True)):
        calls.clear()
        with L.TUNING.use(L.MlaTuning(wgmma_eager_min_work=threshold)):
            L.mla_decode(q_nope, q_pe, cache, table, seq_lens, 0.1, None, 1 << 30)
        assert bool(calls) == gluon and (not calls or calls[0] == 48)


def test_gluon_launcher_merges_split_partials(monkeypatch, device):
    """The sm_90 launcher's host side on any machine: a stand-in for the Gluon kernel writes equal
    partials per split (out 1, log2-sum-exp 0); with splits the launcher must merge them (the
    paged-attention reduce kernel) into out = 1, lse = ln(splits); without, write out itself."""
    b, h, bs, nb = 2, 64, 64, 8
    q_nope = torch.randn(b, h, 512, device=device).to(torch.bfloat16)
    q_pe = torch.randn(b, h, 64, device=device).to(torch.bfloat16)
    cache = torch.randn(nb, bs, 576, device=device).to(torch.bfloat16)
    table = torch.arange(nb, dtype=torch.int32, device=device).view(b, nb // b)
    seq_lens = torch.full((b,), 256, dtype=torch.int32, device=device)
    seen = []

    class FakeKernel:
        def __getitem__(self, grid):
            def run(qn, qp, c_desc, pe_desc, bt, sl, o, lse, po, plse, *rest, SPLITS, **kw):
                assert qn is q_nope and c_desc.block_shape == [64, 512] and pe_desc.block_shape == [64, 64]
                seen.append((grid, SPLITS))
                if SPLITS > 1:
                    po.fill_(1.0)
                    plse.fill_(0.0)
                else:
                    o.fill_(1.0)
                    lse.fill_(0.0)
            return run
    monkeypatch.setattr(L, "_gluon_kernel", lambda ws: L.FastKernel(FakeKernel()))
    monkeypatch.setattr(L, "wgmma_reason", lambda *a: None)
    for splits in (1, 3):
        out = torch.full((b, h, 512), float("nan"), device=device).to(torch.bfloat16)
        lse = torch.full((b, h), float("nan"), device=device)
        with L.TUNING.use(L.MlaTuning(splits=splits, wgmma_eager_min_work=0)):
            L._mla_decode_wgmma(q_nope, q_pe, cache, table, seq_lens, out, lse, 0.1, 256, L.TUNING.active())
        grid, used = seen[-1]  # the policy rounds a split to whole 64-token tiles: 3 asked -> 2 of 128
        assert grid == (b, used) and used == (1 if splits == 1 else 2)
        assert torch.all(out.float() == 1.0)
        want = torch.log(torch.tensor(float(used)))
        assert torch.allclose(lse.cpu(), want.expand(b, h), atol=1e-5), (splits, lse)


def test_gluon_import_failure_is_a_stated_reason(monkeypatch):
    """A Triton whose Gluon does not import: the sm_90 kernel is rejected with the import error."""
    monkeypatch.setattr(L, "_wgmma_import", lambda: (None, "ImportError: no gluon here"))
    from kernelset.core import config
    with config.override(triton_interpret=False):
        why = L.wgmma_shape_reason((9, 0), "cuda", torch.bfloat16, torch.bfloat16, 128, 512, 64, 64, L.MlaTuning())
    assert why == "Gluon (triton.experimental.gluon, Hopper) is not importable (ImportError: no gluon here)"


@pytest.mark.parametrize("splits", [1, 3], ids=["one-pass", "split-kv"])
@pytest.mark.parametrize("bad_id", [-1, 100], ids=["negative-id", "id-past-the-cache"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_unchecked_bad_block_id_gives_nan_out_and_lse(backend, bad_id, splits, device):
    """check_bounds=False with a bad block id: that sequence's out AND lse are NaN in every backend
    and split count, the other sequence exact. The Triton kernel gave NaN out but an lse of -inf
    (one pass: "no keys", so a merge drops the part) or a finite value (split-KV: the bad split's
    -inf partial was merged away); the reference read block -1 as the cache's last block (a
    silent wrong read) and raised IndexError past the cache."""
    seqs = [torch.randn(n, 80, device=device) for n in (40, 20)]
    cache, table, seq_lens = _paged(seqs, 16, device)
    q_nope, q_pe = torch.randn(2, 16, 64, device=device), torch.randn(2, 16, 16, device=device)
    table[0, 1] = bad_id
    with L.TUNING.use(L.MlaTuning(splits=splits, block_n=16)):
        got = ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, scale=0.1, kv_lora_rank=64, rope_dim=16,
                            return_lse=True, check_bounds=False, backend=backend)
    assert torch.isnan(got.out[0]).all() and torch.isnan(got.lse[0]).all()
    want = _expected(q_nope, q_pe, seqs, 0.1)
    assert rel_err(got.out[1], want[0][1]) < 1e-5 and rel_err(got.lse[1], want[1][1]) < 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_unchecked_sequence_past_max_seq_len_is_nan(backend, device):
    """A length past max_seq_len (check_bounds=False) is NaN in the reference as in the kernel: the
    reference ignored max_seq_len and attended to every key."""
    seqs = [torch.randn(n, 80, device=device) for n in (40, 20)]
    cache, table, seq_lens = _paged(seqs, 16, device)
    q_nope, q_pe = torch.randn(2, 16, 64, device=device), torch.randn(2, 16, 16, device=device)
    got = ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, scale=0.1, kv_lora_rank=64, rope_dim=16,
                        max_seq_len=32, return_lse=True, check_bounds=False, backend=backend)
    assert torch.isnan(got.out[0]).all() and torch.isnan(got.lse[0]).all()
    assert rel_err(got.out[1], _expected(q_nope, q_pe, seqs, 0.1)[0][1]) < 1e-5


# merge_attn_states combines MLA decode parts (cascade / split attention over a shared prefix):
# its cases sit here with the MLA parts they merge.


@pytest.mark.parametrize("backend", [str(i.backend) for i in impls("merge_attn_states")])
def test_merged_mla_parts_equal_the_whole(backend, device):
    """Latent keys [0, 32) and [32, L) decoded separately (the second through a shifted block
    table), merged by their LSEs, equal one decode over [0, L); a sequence of length 32 has an
    empty second part (lse -inf)."""
    lens = [32 + 21, 32]
    seqs = [torch.randn(n, 80, device=device) for n in lens]
    cache, table, seq_lens = _paged(seqs, 16, device)
    q_nope, q_pe = torch.randn(2, 16, 64, device=device), torch.randn(2, 16, 16, device=device)
    kw = dict(scale=0.1, kv_lora_rank=64, rope_dim=16, return_lse=True, backend="triton")
    whole = ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, **kw)
    first = ks.mla_decode(q_nope, q_pe, cache, table, torch.full_like(seq_lens, 32), **kw)
    second = ks.mla_decode(q_nope, q_pe, cache, table[:, 2:].contiguous(), seq_lens - 32, **kw)
    assert torch.isneginf(second.lse[1]).all()
    merged = ks.merge_attn_states(first.out, first.lse, second.out, second.lse, backend=backend)
    assert rel_err(merged.out, whole.out) < 1e-5 and rel_err(merged.lse, whole.lse) < 1e-6


@pytest.mark.parametrize("backend", [str(i.backend) for i in impls("merge_attn_states")])
def test_merge_lse_is_logaddexp_for_nan_and_inf(backend, device):
    """lse = logaddexp(lse_a, lse_b) also where a part's lse is NaN (a bad sequence: NaN, as the
    output) or +inf (+inf). The Triton kernel wrote -inf for both, an "empty" row that a later
    merge drops while its output is NaN."""
    oa, ob = torch.randn(3, 2, 16, device=device), torch.randn(3, 2, 16, device=device)
    la, lb = torch.randn(3, 2, device=device), torch.randn(3, 2, device=device)
    la[0, 0] = float("nan")
    lb[0, 1], la[1, 1] = float("nan"), float("-inf")
    la[2, 0] = float("inf")
    out, lse = ks.merge_attn_states(oa, la, ob, lb, backend=backend)
    assert torch.isnan(lse[0]).all() and torch.isnan(out[0]).all()
    assert lse[2, 0] == float("inf")
    want = torch.logaddexp(la, lb)
    ok = torch.isfinite(want)
    assert torch.allclose(lse[ok], want[ok], atol=1e-6) and torch.allclose(lse[1, 1], lb[1, 1])


@pytest.mark.parametrize("backend", [str(i.backend) for i in impls("merge_attn_states")])
def test_merge_with_empty_head_dim_still_writes_lse(backend, device):
    """D = 0: the Triton launcher returned before launching, leaving the lse unwritten (NaN under
    poisoning, garbage otherwise); it is logaddexp(lse_a, lse_b)."""
    la, lb = torch.randn(4, 3, device=device), torch.randn(4, 3, device=device)
    e = torch.empty(4, 3, 0, device=device)
    out, lse = ks.merge_attn_states(e, la, e.clone(), lb, backend=backend)
    assert out.shape == (4, 3, 0) and torch.allclose(lse, torch.logaddexp(la, lb), atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_recording_call_gets_a_raising_node(backend, device):
    """Forward only, as paged_attention: with q_nope requiring grad the output carries a node
    whose backward raises by name. Before, the Triton output carried no gradient (q's gradient
    through it silently dropped) while the reference back-propagated a real one."""
    seqs = [torch.randn(n, 80, device=device) for n in (20, 9)]
    cache, table, seq_lens = _paged(seqs, 16, device)
    q_nope = torch.randn(2, 16, 64, device=device, requires_grad=True)
    q_pe = torch.randn(2, 16, 16, device=device)
    kw = dict(scale=0.1, kv_lora_rank=64, rope_dim=16, backend=backend)
    out = ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, **kw)
    with torch.no_grad():
        want = ks.mla_decode(q_nope, q_pe, cache, table, seq_lens, **kw)
    assert torch.equal(out.detach(), want) and out.requires_grad and want.grad_fn is None
    with pytest.raises(RuntimeError, match="mla_decode has no backward"):
        (out.sum() + q_nope.sum()).backward()


@pytest.mark.parametrize("backend", [str(i.backend) for i in impls("merge_attn_states")])
def test_merge_recording_call_gets_a_raising_node(backend, device):
    """merge_attn_states is forward only too: before, a part requiring grad lost its gradient
    through the Triton merge without a word (the reference's output had a real one)."""
    oa = torch.randn(3, 2, 16, device=device, requires_grad=True)
    ob, la, lb = torch.randn(3, 2, 16, device=device), torch.randn(3, 2, device=device), torch.randn(3, 2, device=device)
    out, lse = ks.merge_attn_states(oa, la, ob, lb, backend=backend)
    assert out.requires_grad
    with pytest.raises(RuntimeError, match="merge_attn_states has no backward"):
        (out.sum() + oa.sum()).backward()
