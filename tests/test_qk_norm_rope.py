"""qk_norm_rope (per-head RMSNorm, then RoPE, in place) against an independent formula for each rounding
mode, and against transformers' Qwen3 / Gemma 3 / Qwen3-VL attention code in bf16 (skipped where
transformers is not installed)."""
from __future__ import annotations

import logging

import pytest
import torch
from aot import QK_VECTORS, compile_report

import kernelset as ks
from kernelset.core.registry import impls
from kernelset.core.tolerance import rel_err, tolerance

BACKENDS = [str(i.backend) for i in impls("qk_norm_rope")]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _cache(max_pos, rot, base=1e6, device="cpu"):
    inv = 1.0 / base ** (torch.arange(0, rot, 2, dtype=torch.float32, device=device) / rot)
    f = torch.outer(torch.arange(max_pos, dtype=torch.float32, device=device), inv)
    return torch.cat([f.cos(), f.sin()], dim=-1)


def _want(x, w, pos, cache, eps, offset, cast, gptj):
    """x [T, H, D]: the norm as transformers writes it, then its rotate_half formula (in x.dtype for the
    llama / gemma casts, in fp32 for 'fp32'); tokens whose position is outside the cache unrotated."""
    dt = x.dtype
    rot = cache.shape[1]
    h = rot // 2
    xf = x.float()
    n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if cast == "llama":
        y = (w.float() + offset) * n.to(dt).float()
    elif cast == "gemma":
        y = n * (offset + w.float())
    else:
        y = n * (offset + w.float())
    if cast != "fp32":
        y = y.to(dt)
    ok = (pos >= 0) & (pos < cache.shape[0])
    rows = cache[torch.where(ok, pos, 0)]
    c = torch.where(ok[:, None], rows[:, :h], 1.0)[:, None]
    s = torch.where(ok[:, None], rows[:, h:], 0.0)[:, None]
    if gptj:
        c, s = c.repeat_interleave(2, -1), s.repeat_interleave(2, -1)
        xr = y[..., :rot]
        half_rot = torch.stack([-xr[..., 1::2], xr[..., 0::2]], -1).flatten(-2)
    else:
        c, s = torch.cat([c, c], -1), torch.cat([s, s], -1)
        xr = y[..., :rot]
        half_rot = torch.cat([-xr[..., h:], xr[..., :h]], -1)
    if cast != "fp32":  # transformers' (q * cos) + (rotate_half(q) * sin) with cos/sin in x.dtype
        c, s = c.to(dt), s.to(dt)
    out = xr * c + half_rot * s
    return torch.cat([out.to(dt), y[..., rot:].to(dt)], -1)


# (id, tokens, q heads, k heads, head size, rotary dim, q 2-D, why)
CASES = [
    ("qwen3-128", 6, 4, 2, 128, 128, False, "Qwen3: head 128, full rotary, GQA"),
    ("gemma-256", 3, 2, 1, 256, 256, True, "Gemma 3 head 256, q as [T, H * D]"),
    ("partial-80", 5, 3, 3, 80, 32, False, "rotary_dim < D: the tail is normalized but not rotated"),
    ("head-96", 1, 5, 1, 96, 96, False, "one token, a non power-of-two head"),
    ("gqa-16-4", 3, 16, 4, 128, 128, False, "k a quarter of q: one program per token for both (qk_one)"),
    ("gqa-partial", 2, 32, 8, 128, 64, False, "32/8, rotary 64 of 128: one program per token, a normalized tail"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("cast,offset", [("llama", 0.0), ("gemma", 1.0), ("fp32", 0.0)], ids=["llama", "gemma", "fp32"])
def test_qk_norm_rope(backend, dtype, case, cast, offset, device):
    _, t, hq, hk, d, rot, flat, _ = case
    cache = _cache(64, rot, device=device)
    pos = torch.randint(0, 64, (t,), device=device)
    q0 = (2 * torch.randn(t, hq, d, device=device)).to(dtype)
    k0 = (2 * torch.randn(t, hk, d, device=device)).to(dtype)
    qw = (0.5 + torch.rand(d, device=device)).to(dtype)
    kw = (0.5 + torch.rand(d, device=device)).to(dtype)
    q, k = q0.clone(), k0.clone()
    args = (q.view(t, -1), k.view(t, -1)) if flat else (q, k)
    out = ks.qk_norm_rope(*args, qw, kw, cache, pos, offset=offset, cast=cast, head_size=d, backend=backend)
    assert out.q.data_ptr() == q.data_ptr() and out.k.data_ptr() == k.data_ptr(), "in place"
    for got, x0, w in ((q, q0, qw), (k, k0, kw)):
        want = _want(x0, w, pos, cache, 1e-6, offset, cast, False)
        assert rel_err(got, want) <= tolerance("norm", dtype)
        if cast != "fp32" and dtype != torch.float32:  # the casts reproduce transformers' roundings
            assert (got != want).float().mean() <= 0.01, "llama/gemma rounding differs from transformers' order"


@pytest.mark.parametrize("backend", BACKENDS)
def test_rounding_modes_differ(backend, device):
    """The casts are not the same computation: a kernel ignoring `cast` fails here."""
    cache = _cache(32, 128, device=device)
    pos = torch.randint(0, 32, (8,), device=device)
    q0 = (3 * torch.randn(8, 4, 128, device=device)).bfloat16()
    w = (1 + 0.3 * torch.randn(128, device=device)).bfloat16()
    outs = {}
    for cast in ("llama", "gemma", "fp32"):
        q = q0.clone()
        ks.qk_norm_rope(q, None, w, None, cache, pos, cast=cast, backend=backend)
        want = _want(q0, w, pos, cache, 1e-6, 0.0, cast, False)
        assert (q != want).float().mean() <= 0.01, cast
        outs[cast] = q
    assert (outs["llama"] != outs["fp32"]).float().mean() > 0.1
    assert (outs["gemma"] != outs["fp32"]).float().mean() > 0.1


@pytest.mark.parametrize("backend", BACKENDS)
def test_gptj_pairs_and_eps(backend, device):
    cache = _cache(16, 64, device=device)
    pos = torch.randint(0, 16, (4,), device=device)
    q0 = 1e-3 * torch.randn(4, 2, 64, device=device)  # small rows: eps matters
    w = torch.randn(64, device=device)
    q = q0.clone()
    ks.qk_norm_rope(q, None, w, None, cache, pos, eps=1e-5, cast="fp32", interleaved=True, backend=backend)
    assert rel_err(q, _want(q0, w, pos, cache, 1e-5, 0.0, "fp32", True)) < 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_qkv_views_and_bad_position(backend, device):
    """q and k as column slices of one [T, (Hq + 2 Hk) D] projection; v and the other rows untouched;
    a position outside the cache normalizes but does not rotate its token."""
    t, hq, hk, d = 4, 4, 2, 64
    cache = _cache(32, d, device=device)
    pos = torch.tensor([3, 40, 0, 31], device=device)
    qkv = torch.randn(t, (hq + 2 * hk) * d, device=device).bfloat16()
    ref = qkv.clone()
    qw, kw = torch.randn(d, device=device).bfloat16(), torch.randn(d, device=device).bfloat16()
    q, k = qkv[:, : hq * d], qkv[:, hq * d: (hq + hk) * d]
    ks.qk_norm_rope(q, k, qw, kw, cache, pos, head_size=d, backend=backend)
    wq = _want(ref[:, : hq * d].view(t, hq, d), qw, pos, cache, 1e-6, 0.0, "llama", False).view(t, -1)
    wk = _want(ref[:, hq * d: (hq + hk) * d].view(t, hk, d), kw, pos, cache, 1e-6, 0.0, "llama", False).view(t, -1)
    assert (qkv[:, : hq * d] != wq).float().mean() <= 0.01 and rel_err(qkv[:, : hq * d], wq) < 1e-2
    assert (qkv[:, hq * d: (hq + hk) * d] != wk).float().mean() <= 0.01
    assert torch.equal(qkv[:, (hq + hk) * d:], ref[:, (hq + hk) * d:]), "v untouched"


@pytest.mark.parametrize("backend", BACKENDS)
def test_mrope_positions(backend, device):
    """With mrope_section, positions [3, T]: the norm then exactly mrope's rotation (fp32 cast)."""
    cache = _cache(50, 128, device=device)
    pos = torch.randint(0, 50, (3, 5), device=device)
    q0, w = torch.randn(5, 4, 128, device=device), torch.randn(128, device=device)
    q = q0.clone()
    ks.qk_norm_rope(q, None, w, None, cache, pos, cast="fp32", mrope_section=(24, 20, 20), mrope_interleaved=True,
                    backend=backend)
    n = q0.clone()
    n = n * torch.rsqrt(n.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    ks.mrope(pos, n, None, cache, (24, 20, 20), mrope_interleaved=True, backend="reference")
    assert rel_err(q, n) < 2e-6


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_k", [False, True], ids=["no-k", "with-k"])
def test_empty_and_no_k(backend, with_k, device):
    """T = 0: with a k the checks indexed k[0] (IndexError); the reference's view(0, -1, D) raised."""
    cache = _cache(8, 32, device=device)
    w = torch.randn(32, device=device)
    k = torch.randn(0, 1, 32, device=device) if with_k else None
    out = ks.qk_norm_rope(torch.randn(0, 2, 32, device=device), k, w, w if with_k else None, cache,
                          torch.zeros(0, dtype=torch.long, device=device), backend=backend)
    assert out.q.shape == (0, 2, 32) and (out.k is None if not with_k else out.k.shape == (0, 1, 32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_place_bumps_autograd_version(backend, device):
    """q and k saved by a graph (for w's gradient), then normalized and rotated in place: backward must
    raise as after a torch in-place op; the Triton path bumped no version counter (silently wrong w.grad)."""
    cache = _cache(8, 32, device=device)
    q, k = torch.randn(3, 2, 32, device=device), torch.randn(3, 1, 32, device=device)
    w = torch.randn(32, 2, device=device, requires_grad=True)
    out = (q @ w).sum() + (k @ w).sum()
    vq, vk = q._version, k._version
    nw = torch.ones(32, device=device)
    ks.qk_norm_rope(q, k, nw, nw, cache, torch.tensor([0, 3, 7], device=device), backend=backend)
    assert q._version > vq and k._version > vk
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward()


@pytest.mark.parametrize("kwargs,match", [
    (dict(q_weight=torch.randn(31)), "q_weight"),
    (dict(k_weight=None), "k_weight"),
    (dict(k=None), "k_weight"),
    (dict(q_weight=torch.randn(32, dtype=torch.float64)), "q_weight"),
    (dict(eps=0.0), "eps"),
    (dict(cast="bf16"), "cast"),
    (dict(positions=torch.zeros(3, 3, dtype=torch.long)), "positions"),
    (dict(mrope_section=(4, 6, 5), positions=torch.zeros(3, 3, dtype=torch.long)), "mrope_section"),
    (dict(q=torch.randn(3, 2, 32, requires_grad=True)), "q"),
    (dict(offset=float("nan")), "offset"),
], ids=["weight-size", "k-without-weight", "weight-without-k", "weight-dtype", "eps-zero", "bad-cast",
        "3-row-positions-without-sections", "sections-sum", "requires-grad", "nan-offset"])
def test_bad_input(kwargs, match):
    args = dict(q=torch.randn(3, 2, 32), k=torch.randn(3, 1, 32), q_weight=torch.randn(32), k_weight=torch.randn(32),
                cos_sin_cache=_cache(8, 32), positions=torch.zeros(3, dtype=torch.long))
    args.update({k: v for k, v in kwargs.items() if k in args})
    rest = {k: v for k, v in kwargs.items() if k not in args}
    with pytest.raises((ValueError, TypeError), match=match):
        ks.qk_norm_rope(args["q"], args["k"], args["q_weight"], args["k_weight"], args["cos_sin_cache"],
                        args["positions"], **rest)


def test_compile_fullgraph_in_place(device):
    cache = _cache(16, 32, device=device)
    pos = torch.randint(0, 16, (3,), device=device)
    qw, kw = torch.randn(32, device=device), torch.randn(32, device=device)

    def f(q, k):
        ks.qk_norm_rope(q, k, qw, kw, cache, pos, offset=1.0, cast="gemma")
        return q * 2, k

    q, k = torch.randn(3, 2, 32, device=device), torch.randn(3, 1, 32, device=device)
    qe, ke = q.clone(), k.clone()
    ks.qk_norm_rope(qe, ke, qw, kw, cache, pos, offset=1.0, cast="gemma")
    got_q, got_k = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k)
    assert torch.equal(q, qe) and torch.equal(got_q, qe * 2) and torch.equal(got_k, ke)


def _tf():
    tf = pytest.importorskip("transformers", reason="transformers is not installed (e.g. the GPU image)")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    return tf


def _hf_path(norm_cls, rotary, apply_fn, q, k, pos, qw, kw, eps, *rotary_args):
    """transformers' attention: q_norm(q_proj(h).view(B, S, H, D)).transpose(1, 2), then apply_rotary_pos_emb."""
    qn, kn = norm_cls(q.shape[-1], eps=eps).to(q.dtype), norm_cls(q.shape[-1], eps=eps).to(q.dtype)
    with torch.no_grad():
        qn.weight.copy_(qw)
        kn.weight.copy_(kw)
        cos, sin = rotary(q, pos, *rotary_args)
        return apply_fn(qn(q).transpose(1, 2), kn(k).transpose(1, 2), cos, sin)


def _flat(x):
    """[B, S, H, D] -> [B * S, H, D] copy."""
    return x.reshape(-1, x.shape[2], x.shape[3]).clone()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("model", ["qwen3", "gemma3", "qwen3-vl"])
def test_equals_transformers_bf16(model, backend, device):
    """The default cast reproduces Qwen3 (and cast='gemma', offset=1 Gemma 3) bit for bit up to the
    norm's reduction order: at most 0.1% of the elements may differ, by one rounding."""
    tf = _tf()
    b, s, hq, hk = 2, 5, 4, 2
    if model == "qwen3":
        from transformers.models.qwen3 import modeling_qwen3 as m
        cfg = tf.Qwen3Config(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                             max_position_embeddings=40960, rope_theta=1e6, rms_norm_eps=1e-6)
        norm, rotary, extra, opts = m.Qwen3RMSNorm, m.Qwen3RotaryEmbedding(cfg), (), dict(cast="llama")
        table, pos = ks.rope_cache(cfg, max_positions=4096), torch.randint(0, 4096, (b, s))
    elif model == "gemma3":
        from transformers.models.gemma3 import modeling_gemma3 as m
        cfg = tf.Gemma3TextConfig(hidden_size=2560, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                                  rms_norm_eps=1e-6, max_position_embeddings=131072,
                                  rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                                   "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                      "rope_theta": 1e6}})
        norm, rotary, extra = m.Gemma3RMSNorm, m.Gemma3RotaryEmbedding(cfg), ("full_attention",)
        opts = dict(cast="gemma", offset=1.0)
        table, pos = ks.rope_cache(cfg, layer_type="full_attention", max_positions=4096), torch.randint(0, 4096, (b, s))
    else:
        from transformers.models.qwen3_vl import modeling_qwen3_vl as m
        cfg = tf.Qwen3VLTextConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                   max_position_embeddings=262144, rms_norm_eps=1e-6,
                                   rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                                                    "mrope_section": [24, 20, 20], "mrope_interleaved": True})
        norm, rotary, extra = m.Qwen3VLTextRMSNorm, m.Qwen3VLTextRotaryEmbedding(cfg), ()
        opts = dict(cast="llama", mrope_section=[24, 20, 20], mrope_interleaved=True)
        table, pos = ks.rope_cache(cfg, max_positions=2048), torch.randint(0, 2048, (3, b, s))
    d = table.head_dim
    q = (3 * torch.randn(b, s, hq, d)).bfloat16()
    k = (3 * torch.randn(b, s, hk, d)).bfloat16()
    qw = (0.3 * torch.randn(d) + (0.0 if model == "gemma3" else 1.0)).bfloat16()
    kw = (0.3 * torch.randn(d) + (0.0 if model == "gemma3" else 1.0)).bfloat16()
    want_q, want_k = _hf_path(norm, rotary, m.apply_rotary_pos_emb, q, k, pos, qw, kw, 1e-6, *extra)
    sq, sk = _flat(q).to(device), _flat(k).to(device)
    flat_pos = pos.reshape(3, -1) if pos.dim() == 3 else pos.reshape(-1)
    ks.qk_norm_rope(sq, sk, qw.to(device), kw.to(device), table.cos_sin_cache.to(device), flat_pos.to(device), eps=1e-6,
                    backend=backend, **opts)
    for got, want in ((sq, want_q), (sk, want_k)):
        want = _flat(want.transpose(1, 2)).to(device)
        assert (got != want).float().mean() <= 1e-3
        assert rel_err(got, want) < 2e-3


@pytest.mark.gpu
def test_gpu_large_and_graph_capture():
    dev = torch.device("cuda")
    t, hq, hk, d = 16384, 32, 8, 128
    cache = _cache(32768, d, device=dev)
    pos = torch.randint(0, 32768, (t,), device=dev)
    qkv0 = torch.randn(t, (hq + 2 * hk) * d, device=dev, dtype=torch.bfloat16)
    qw = (1 + 0.3 * torch.randn(d, device=dev)).bfloat16()
    kw = (1 + 0.3 * torch.randn(d, device=dev)).bfloat16()

    def run(buf, backend, cast="llama"):
        ks.qk_norm_rope(buf[:, : hq * d], buf[:, hq * d: (hq + hk) * d], qw, kw, cache, pos, cast=cast,
                        head_size=d, backend=backend)

    for cast in ("llama", "gemma", "fp32"):
        a, r = qkv0.clone(), qkv0.clone()
        run(a, "triton", cast)
        run(r, "reference", cast)
        assert (a != r).float().mean() < 1e-3 and rel_err(a, r) < 2e-3, cast
    buf = qkv0.clone()
    run(buf, "triton")
    g = torch.cuda.CUDAGraph()
    buf.copy_(qkv0)
    with torch.cuda.graph(g):
        run(buf, "triton")
    pos.copy_(torch.randint(0, 32768, (t,), device=dev))
    buf.copy_(qkv0)
    g.replay()
    r = qkv0.clone()
    run(r, "reference")
    torch.cuda.synchronize()
    assert (buf != r).float().mean() < 1e-3


_AOT = QK_VECTORS + r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernelset.ops.rope import kernels as K
from kernelset.ops.rope.launch import ext_tiles
sig = dict(POS="*i64", Q="*bf16", K="*bf16", WQ="*bf16", WK="*bf16", CACHE="*fp32", HQ="i32", HK="i32", NB1="i32",
           max_pos="i32", stride_qt="i32", stride_kt="i32", stride_ps="i32", stride_pt="i32", stride_c="i32",
           eps="fp32", offset="fp32")
out = []
# (head size, rotary dim, cast, mrope): Qwen3 in each rounding, Gemma 3's 256, a partial head with a tail,
# Qwen3-VL (norm + interleaved mrope); 32 q / 8 k heads per token as in the bench
for d, rot, cast, mrope, gptj in ((128, 128, 1, False, False), (128, 128, 2, False, False), (128, 128, 0, False, False),
                                  (256, 256, 2, False, False), (80, 32, 1, False, False), (128, 128, 1, True, False),
                                  (128, 128, 1, False, True)):
    bh, bh2, br, bt, warps, _, _, qk_one = ext_tiles(32, 8, d, rot // 2, True)
    s0, s1, s2 = (24, 20, 20) if mrope else (rot // 2, 0, 0)
    consts = dict(D=d, HALF=rot // 2, INTERLEAVED=gptj, NORM=True, CAST=cast, MROPE=mrope, S0=s0, S1=s1, S2=s2,
                  MROPE_INTERLEAVED=mrope, BLOCK_H1=bh, BLOCK_H2=bh2, BLOCK_R=br, BLOCK_T=bt,
                  QK_ONE=bool(qk_one))
    attrs = {(k,): [["tt.divisibility", 16]] for k, (n, ty) in enumerate(sig.items())
             if ty.startswith("*") or n in ("stride_qt", "stride_kt", "stride_c", "stride_ps")}
    src = ASTSource(K._rope_ext_fwd_kernel, signature={**sig, **{k: "constexpr" for k in consts}}, constexprs=consts,
                    attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps)).asm["ptx"]
    out.append(dict(case=f"d{d}-r{rot}-cast{cast}-mrope{mrope}-gptj{gptj}", local="ld.local" in ptx or "st.local" in ptx,
                    vec=qk_vectors(ptx)))
print(json.dumps(out))
"""


def test_kernels_compile_for_sm90():
    compile_report(_AOT, 7)


@pytest.mark.parametrize("cast", ["llama", "gemma"])
def test_qk_one_and_grid_forms_give_the_same_bits(cast, device, monkeypatch):
    """One program per token for q and k (16 q / 4 k heads) against the (token, head block) grid:
    the same roundings (FMA contraction is off for the bf16 chains), so the same bits."""
    from kernelset.ops.rope import launch
    t, hq, hk, d = 5, 16, 4, 128
    assert launch.ext_tiles(hq, hk, d, d // 2, True)[-1] == 1
    cache = _cache(64, d, device=device)
    pos = torch.randint(0, 64, (t,), device=device)
    q0 = (2 * torch.randn(t, hq, d, device=device)).to(torch.bfloat16)
    k0 = (2 * torch.randn(t, hk, d, device=device)).to(torch.bfloat16)
    qw = (0.5 + torch.rand(d, device=device)).to(torch.bfloat16)
    kw = (0.5 + torch.rand(d, device=device)).to(torch.bfloat16)
    offset = 1.0 if cast == "gemma" else 0.0
    outs = []
    shipped = launch.ext_tiles.__wrapped__
    for qk_one in (1, 0):

        def tiles(*a, _one=qk_one):
            b1, b2, br, bt, w, nb1, nb, one = shipped(*a)
            if _one:
                return b1, b2, br, bt, w, nb1, nb, one
            return b1, b2, br, bt, 4, 1, 2, 0  # q's 16 heads in one block, k's 4 in the other

        monkeypatch.setattr(launch, "ext_tiles", tiles)
        q, k = q0.clone(), k0.clone()
        ks.qk_norm_rope(q, k, qw, kw, cache, pos, eps=1e-6, offset=offset, cast=cast, backend="triton")
        outs.append((q, k))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    want_q = _want(q0, qw, pos, cache, 1e-6, offset, cast, False)
    assert rel_err(outs[0][0], want_q) <= tolerance("elementwise", torch.bfloat16)
