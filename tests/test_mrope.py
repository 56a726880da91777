"""mrope (Qwen2-VL / Qwen2.5-VL bands, Qwen3-VL interleaved) against an independent formula and against
transformers' rotary modules + apply_rotary_pos_emb (skipped where transformers is not installed)."""
from __future__ import annotations

import logging

import pytest
import torch
from aot import QK_VECTORS, compile_report

import kernelset as ks
from kernelset.core.registry import impls
from kernelset.core.tolerance import rel_err, tolerance

BACKENDS = [str(i.backend) for i in impls("mrope")]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _cache(max_pos, rot, base=1e6, device="cpu"):
    inv = 1.0 / base ** (torch.arange(0, rot, 2, dtype=torch.float32, device=device) / rot)
    f = torch.outer(torch.arange(max_pos, dtype=torch.float32, device=device), inv)
    return torch.cat([f.cos(), f.sin()], dim=-1)


def _owner(sections, interleaved):
    """Which position row rotates frequency i, spelled out the way the model code builds it."""
    half = sum(sections)
    if interleaved:  # Qwen3-VL: start from temporal, overwrite i = 1, 4, ... (height) and 2, 5, ... (width)
        own = [0] * half
        for row, first in ((1, 1), (2, 2)):
            for i in range(first, min(3 * sections[row], half), 3):  # slices clip at R/2
                own[i] = row
        return own
    return [row for row, n in enumerate(sections) for _ in range(n)]  # Qwen2-VL: contiguous bands


def _want(x, pos3, cache, sections, mrope_interleaved, gptj):
    """x [T, H, D] rotated in fp32: frequency i by row _owner[i] of pos3 [3, T]; NeoX or GPT-J pairs."""
    rot = cache.shape[1]
    half = rot // 2
    own = _owner(sections, mrope_interleaved)
    rows = torch.stack([cache[pos3[own[i]], :] for i in range(half)], 1)  # [T, half, R]
    cos = rows[:, torch.arange(half), torch.arange(half)][:, None].float()
    sin = rows[:, torch.arange(half), half + torch.arange(half)][:, None].float()
    xr = x[..., :rot].float()
    a, b = (xr[..., 0::2], xr[..., 1::2]) if gptj else (xr[..., :half], xr[..., half:])
    oa, ob = a * cos - b * sin, b * cos + a * sin
    out = torch.stack([oa, ob], -1).flatten(-2) if gptj else torch.cat([oa, ob], -1)
    return torch.cat([out.to(x.dtype), x[..., rot:]], -1)


# (id, tokens, q heads, k heads, head size, rotary dim, sections, interleaved sections, q 2-D, why)
CASES = [
    ("qwen2vl", 7, 4, 2, 128, 128, (16, 24, 24), False, False, "Qwen2-VL / Qwen2.5-VL bands, GQA"),
    ("qwen3vl", 6, 4, 2, 128, 128, (24, 20, 20), True, False, "Qwen3-VL interleaved t/h/w"),
    ("partial", 5, 3, 1, 80, 32, (4, 6, 6), False, True, "rotary_dim < head size, q as [T, H * D]"),
    ("interleaved-odd", 4, 2, 2, 96, 96, (8, 20, 20), True, False,
     "3 s_h > R/2: the interleaving clips as the model's slices do"),
    ("one-token", 1, 8, 1, 64, 64, (8, 12, 12), False, False, "decode"),
    ("gqa-16-4", 3, 16, 4, 128, 128, (16, 24, 24), False, False, "k a quarter of q: one program per token (qk_one)"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_mrope(backend, dtype, case, device):
    _, t, hq, hk, d, rot, sec, inter, flat, _ = case
    cache = _cache(100, rot, device=device)
    pos = torch.randint(0, 100, (3, t), device=device)
    q0 = torch.randn(t, hq, d, device=device).to(dtype)
    k0 = torch.randn(t, hk, d, device=device).to(dtype)
    q, k = q0.clone(), k0.clone()
    args = (q.view(t, -1), k.view(t, -1)) if flat else (q, k)
    out = ks.mrope(pos, *args, cache, list(sec), mrope_interleaved=inter, head_size=d, backend=backend)
    assert out.q.data_ptr() == q.data_ptr() and out.k.data_ptr() == k.data_ptr(), "rotates in place"
    for got, x0 in ((q, q0), (k, k0)):
        assert torch.equal(got[..., rot:], x0[..., rot:]), "features past rotary_dim must not change"
        assert rel_err(got, _want(x0, pos, cache, sec, inter, False)) <= tolerance("elementwise", dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gptj_pairs(backend, device):
    cache = _cache(50, 64, device=device)
    pos = torch.randint(0, 50, (3, 5), device=device)
    q0 = torch.randn(5, 3, 64, device=device)
    q = q0.clone()
    ks.mrope(pos, q, None, cache, (8, 12, 12), interleaved=True, backend=backend)
    assert rel_err(q, _want(q0, pos, cache, (8, 12, 12), False, True)) < 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("inter", [False, True], ids=["bands", "interleaved"])
def test_text_positions_equal_rotary_embedding(backend, inter, device):
    """positions [T], or [3, T] with three equal rows (text tokens), rotate exactly as rotary_embedding."""
    cache = _cache(64, 128, device=device)
    pos = torch.randint(0, 64, (6,), device=device)
    q0, k0 = torch.randn(6, 4, 128, device=device).bfloat16(), torch.randn(6, 2, 128, device=device).bfloat16()
    want_q, want_k = q0.clone(), k0.clone()
    ks.rotary_embedding(pos, want_q, want_k, cache, backend=backend)
    for p in (pos, pos.expand(3, -1)):
        q, k = q0.clone(), k0.clone()
        ks.mrope(p, q, k, cache, [16, 24, 24], mrope_interleaved=inter, backend=backend)
        if device.type == "cpu":
            assert torch.equal(q, want_q) and torch.equal(k, want_k)
        else:  # two compiled kernels: fp32 contraction may differ, flipping a rare bf16 rounding
            assert (q != want_q).float().mean() < 1e-3 and (k != want_k).float().mean() < 1e-3


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_positions_and_fused_qkv(backend, device):
    """positions as a strided [3, T] view; q and k as column slices of one [T, (Hq + 2 Hk) D] buffer."""
    t, hq, hk, d = 5, 4, 2, 64
    sec = (8, 12, 12)
    cache = _cache(40, d, device=device)
    pos_all = torch.randint(0, 40, (3, 2 * t), device=device)
    pos = pos_all[:, ::2]
    qkv = torch.randn(t, (hq + 2 * hk) * d, device=device)
    ref = qkv.clone()
    q, k = qkv[:, : hq * d], qkv[:, hq * d: (hq + hk) * d]
    ks.mrope(pos, q, k, cache, sec, head_size=d, backend=backend)
    want_q = _want(ref[:, : hq * d].view(t, hq, d), pos, cache, sec, False, False).view(t, -1)
    want_k = _want(ref[:, hq * d: (hq + hk) * d].view(t, hk, d), pos, cache, sec, False, False).view(t, -1)
    assert rel_err(qkv[:, : hq * d], want_q) < 1e-6 and rel_err(qkv[:, hq * d: (hq + hk) * d], want_k) < 1e-6
    assert torch.equal(qkv[:, (hq + hk) * d:], ref[:, (hq + hk) * d:]), "v untouched"


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_of_range_position_leaves_its_section_unrotated(backend, device):
    cache = _cache(8, 32, device=device)
    sec = (4, 6, 6)
    pos = torch.tensor([[1], [9], [2]], device=device)  # height position past the cache
    q0 = torch.randn(1, 2, 32, device=device)
    q = q0.clone()
    ks.mrope(pos, q, None, cache, sec, backend=backend)
    h = torch.cat([torch.arange(4, 10), torch.arange(20, 26)])  # the height band's pairs (NeoX halves)
    assert torch.equal(q[..., h], q0[..., h])
    rest = torch.tensor([i for i in range(32) if i not in set(h.tolist())])
    want = _want(q0, torch.tensor([[1], [0], [2]], device=device), cache, sec, False, False)
    assert torch.allclose(q[..., rest], want[..., rest], atol=1e-6)
    assert not torch.equal(q[..., rest], q0[..., rest])


def test_qwen2_vl_config_json_form():
    """Qwen2-VL's config.json says rope_scaling {"type": "mrope", "mrope_section": [...]}: default frequencies."""
    cfg = {"hidden_size": 3584, "num_attention_heads": 28, "max_position_embeddings": 32768, "rope_theta": 1e6,
           "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
    table = ks.rope_cache(cfg, max_positions=8)
    assert table.rope_type == "default" and table.mrope_section == (16, 24, 24) and not table.mrope_interleaved
    plain = ks.rope_cache(head_dim=128, rope_theta=1e6, max_positions=8)
    assert torch.equal(table.cos_sin_cache, plain.cos_sin_cache)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_k", [False, True], ids=["q-only", "with-k"])
def test_empty_batch(backend, with_k, device):
    """T = 0: with a k the checks indexed k[0] (IndexError); the reference's view(0, -1, D) raised."""
    cache = _cache(8, 32, device=device)
    q = torch.randn(0, 2, 32, device=device)
    k = torch.randn(0, 1, 32, device=device) if with_k else None
    out = ks.mrope(torch.zeros(3, 0, dtype=torch.long, device=device), q, k, cache, (4, 6, 6), backend=backend)
    assert out.q.shape == (0, 2, 32) and (out.k is None or out.k.shape == (0, 1, 32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_place_bumps_autograd_version(backend, device):
    """q and k saved by a graph (for w's gradient), then rotated in place: backward must raise as
    after a torch in-place op; the Triton path bumped no version counter (silently wrong w.grad)."""
    cache = _cache(8, 32, device=device)
    q, k = torch.randn(3, 2, 32, device=device), torch.randn(3, 1, 32, device=device)
    w = torch.randn(32, 2, device=device, requires_grad=True)
    out = (q @ w).sum() + (k @ w).sum()
    vq, vk = q._version, k._version
    ks.mrope(torch.randint(0, 8, (3, 3), device=device), q, k, cache, (4, 6, 6), backend=backend)
    assert q._version > vq and k._version > vk
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward()


@pytest.mark.parametrize("kwargs,match", [
    (dict(positions=torch.zeros(2, 3, dtype=torch.long)), "positions"),
    (dict(positions=torch.zeros(3, 4, dtype=torch.long)), "positions"),
    (dict(positions=torch.zeros(3, 3)), "positions"),
    (dict(mrope_section=(4, 6, 5)), "mrope_section"),
    (dict(mrope_section=(8, 8)), "mrope_section"),
    (dict(mrope_section=(-2, 10, 8)), "mrope_section"),
    (dict(q=torch.randn(3, 128)), "head_size"),
    (dict(k=torch.randn(3, 1, 32, dtype=torch.float16)), "k"),
    (dict(q=torch.randn(3, 2, 32, requires_grad=True)), "q"),
], ids=["two-rows", "wrong-length", "float-positions", "sections-sum", "two-sections", "negative-section",
        "2d-q-no-head-size", "k-dtype", "requires-grad"])
def test_bad_input(kwargs, match):
    args = dict(positions=torch.zeros(3, 3, dtype=torch.long), q=torch.randn(3, 2, 32), k=None,
                cos_sin_cache=_cache(8, 32), mrope_section=(4, 6, 6))
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        ks.mrope(args["positions"], args["q"], args["k"], args["cos_sin_cache"], args["mrope_section"])


def test_compile_fullgraph_in_place(device):
    cache = _cache(16, 32, device=device)
    pos = torch.randint(0, 16, (3, 3), device=device)

    def f(q, k):
        ks.mrope(pos, q, k, cache, [4, 6, 6], mrope_interleaved=True)
        return q * 2, k

    q, k = torch.randn(3, 2, 32, device=device), torch.randn(3, 1, 32, device=device)
    qe, ke = q.clone(), k.clone()
    ks.mrope(pos, qe, ke, cache, [4, 6, 6], mrope_interleaved=True)
    got_q, got_k = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k)
    assert torch.equal(q, qe) and torch.equal(got_q, qe * 2) and torch.equal(got_k, ke)


def _hf_case(name):
    tf = pytest.importorskip("transformers", reason="transformers is not installed (e.g. the GPU image)")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    if name == "qwen2-vl":  # Qwen2-VL-7B text config
        from transformers.models.qwen2_vl import modeling_qwen2_vl as m
        cfg = tf.Qwen2VLTextConfig(hidden_size=3584, num_attention_heads=28, num_key_value_heads=4,
                                   max_position_embeddings=32768,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                    "mrope_section": [16, 24, 24]})
        return cfg, m.Qwen2VLRotaryEmbedding(cfg), m.apply_rotary_pos_emb, [16, 24, 24], False
    if name == "qwen2.5-vl":
        from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as m
        cfg = tf.Qwen2_5_VLTextConfig(hidden_size=2048, num_attention_heads=16, num_key_value_heads=2,
                                      max_position_embeddings=128000,
                                      rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                       "mrope_section": [16, 24, 24]})
        return cfg, m.Qwen2_5_VLRotaryEmbedding(cfg), m.apply_rotary_pos_emb, [16, 24, 24], False
    from transformers.models.qwen3_vl import modeling_qwen3_vl as m  # Qwen3-VL-8B text config
    cfg = tf.Qwen3VLTextConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                               max_position_embeddings=262144,
                               rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                                                "mrope_section": [24, 20, 20], "mrope_interleaved": True})
    return cfg, m.Qwen3VLTextRotaryEmbedding(cfg), m.apply_rotary_pos_emb, [24, 20, 20], True


def _serving(x):
    return x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[3]).clone()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["qwen2-vl", "qwen2.5-vl", "qwen3-vl"])
def test_equals_transformers(name, backend, device):
    """transformers' rotary module (3-row position ids) + apply_rotary_pos_emb vs rope_cache + mrope."""
    cfg, rotary, apply_fn, sec, inter = _hf_case(name)
    table = ks.rope_cache(cfg, max_positions=300, device=device)
    assert table.mrope_section == tuple(sec) and table.mrope_interleaved == inter, "read from the config"
    b, s, hq, hk = 2, 6, 2, 1
    pos = torch.randint(0, 300, (3, b, s))
    q, k = torch.randn(b, hq, s, 128), torch.randn(b, hk, s, 128)
    cos, sin = rotary(q, pos)
    got_cos, got_sin = table.cos_sin(pos.to(device), mrope_section=sec, mrope_interleaved=inter)
    assert torch.equal(got_cos.cpu(), cos) and torch.equal(got_sin.cpu(), sin) or device.type == "cuda"
    want_q, want_k = apply_fn(q, k, cos, sin)
    sq, sk = _serving(q).to(device), _serving(k).to(device)
    ks.mrope(pos.reshape(3, -1).to(device), sq, sk, table.cos_sin_cache, sec, mrope_interleaved=inter,
             backend=backend)
    assert rel_err(sq, _serving(want_q)) < 2e-6 and rel_err(sk, _serving(want_k)) < 2e-6
    # bf16: within the elementwise bar of the fp32 result (transformers' own bf16 path rounds more often)
    bq = _serving(q).to(device).bfloat16()
    ks.mrope(pos.reshape(3, -1).to(device), bq, None, table.cos_sin_cache, sec, mrope_interleaved=inter,
             backend=backend)
    assert rel_err(bq, _serving(want_q)) <= tolerance("elementwise", torch.bfloat16)


@pytest.mark.gpu
def test_gpu_large_and_graph_capture():
    """The bench shape against the reference, then replayed from a CUDA graph with new positions."""
    dev = torch.device("cuda")
    t, hq, hk, d = 16384, 32, 8, 128
    cache = _cache(32768, d, device=dev)
    pos = torch.randint(0, 32768, (3, t), device=dev)
    q0 = torch.randn(t, hq, d, device=dev, dtype=torch.bfloat16)
    k0 = torch.randn(t, hk, d, device=dev, dtype=torch.bfloat16)
    for inter, sec in ((False, (16, 24, 24)), (True, (24, 20, 20))):
        q, k, rq, rk = q0.clone(), k0.clone(), q0.clone(), k0.clone()
        ks.mrope(pos, q, k, cache, sec, mrope_interleaved=inter, backend="triton")
        ks.mrope(pos, rq, rk, cache, sec, mrope_interleaved=inter, backend="reference")
        assert rel_err(q, rq) < 4e-3 and rel_err(k, rk) < 4e-3
    q, k = q0.clone(), k0.clone()
    ks.mrope(pos, q, k, cache, (16, 24, 24), backend="triton")  # compile outside the capture
    g = torch.cuda.CUDAGraph()
    q.copy_(q0)
    k.copy_(k0)
    with torch.cuda.graph(g):
        ks.mrope(pos, q, k, cache, (16, 24, 24), backend="triton")
    pos.copy_(torch.randint(0, 32768, (3, t), device=dev))
    q.copy_(q0)
    k.copy_(k0)
    g.replay()
    rq, rk = q0.clone(), k0.clone()
    ks.mrope(pos, rq, rk, cache, (16, 24, 24), backend="reference")
    torch.cuda.synchronize()
    assert rel_err(q, rq) < 4e-3 and rel_err(k, rk) < 4e-3


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
# Qwen2-VL bands, Qwen3-VL interleaved, and GPT-J pairs, for the bench's 32 q / 8 k heads of 128
for inter_sec, sec, gptj in ((False, (16, 24, 24), False), (True, (24, 20, 20), False), (False, (16, 24, 24), True)):
    bh, bh2, br, bt, warps, _, _, qk_one = ext_tiles(32, 8, 128, 64, False)
    consts = dict(D=128, HALF=64, INTERLEAVED=gptj, NORM=False, CAST=0, MROPE=True, S0=sec[0], S1=sec[1], S2=sec[2],
                  MROPE_INTERLEAVED=inter_sec, BLOCK_H1=bh, BLOCK_H2=bh2, BLOCK_R=br, BLOCK_T=bt,
                  QK_ONE=bool(qk_one))
    attrs = {(k,): [["tt.divisibility", 16]] for k, (n, ty) in enumerate(sig.items())
             if ty.startswith("*") or n in ("stride_qt", "stride_kt", "stride_c", "stride_ps")}
    src = ASTSource(K._rope_ext_fwd_kernel, signature={**sig, **{k: "constexpr" for k in consts}}, constexprs=consts,
                    attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps)).asm["ptx"]
    # q/k must load and store as vectors, GPT-J rows too
    out.append(dict(case=f"mrope-inter{inter_sec}-gptj{gptj}", local="ld.local" in ptx or "st.local" in ptx,
                    vec=qk_vectors(ptx)))
print(json.dumps(out))
"""


def test_kernels_compile_for_sm90():
    compile_report(_AOT, 3)
