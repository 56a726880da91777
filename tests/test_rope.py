"""rotary_embedding (serving layout, in place) against an independent HuggingFace-style formula."""
from __future__ import annotations

import pytest
import torch
from aot import QK_VECTORS, compile_report

import kernelset as ks
from kernelset.core.registry import impls
from kernelset.core.tolerance import rel_err, tolerance

BACKENDS = [str(i.backend) for i in impls("rotary_embedding")]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _cache(max_pos, rot, base=10000.0, device="cpu"):
    inv = 1.0 / base ** (torch.arange(0, rot, 2, dtype=torch.float32, device=device) / rot)
    f = torch.outer(torch.arange(max_pos, dtype=torch.float32, device=device), inv)
    return torch.cat([f.cos(), f.sin()], dim=-1)


def _hf_rotate(x, pos, cache, interleaved):
    """transformers' apply_rotary_pos_emb (rotate_half with duplicated cos/sin), or GPT-J's pairs."""
    rot = cache.shape[1]
    cos, sin = cache[pos, : rot // 2].float()[:, None], cache[pos, rot // 2:].float()[:, None]
    xr, xp = x[..., :rot].float(), x[..., rot:]
    if interleaved:
        c, s = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
        rh = torch.stack([-xr[..., 1::2], xr[..., 0::2]], dim=-1).flatten(-2)
    else:
        c, s = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
        rh = torch.cat([-xr[..., rot // 2:], xr[..., : rot // 2]], -1)
    return torch.cat([(xr * c + rh * s).to(x.dtype), xp], -1)


# (id, tokens, q heads, k heads, head size, rotary dim, q as 2-D, why)
CASES = [
    ("llama-128", 7, 8, 2, 128, 128, False, "full rotary, GQA 8/2"),
    ("partial-phi", 5, 4, 4, 80, 32, False, "rotary_dim < head size: the tail must not move"),
    ("flat-2d", 6, 4, 1, 64, 64, True, "q/k given as [T, H * D]"),
    ("head96", 3, 3, 1, 96, 96, False, "a non power-of-two head size"),
    ("one-token", 1, 32, 8, 128, 128, False, "decode"),
    ("head256", 3, 4, 2, 256, 256, False, "the widest head size of the issue (Gemma)"),
    ("head80-full", 4, 3, 1, 80, 80, False, "a full rotation of an odd head size"),
    ("gqa-partial", 2, 32, 8, 128, 64, False, "32/8 heads, rotary 64 of 128: one program per token for q and k"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
def test_rotary_embedding(backend, dtype, case, interleaved, device):
    _, t, hq, hk, d, rot, flat, _ = case
    cache = _cache(64, rot, device=device)
    pos = torch.randint(0, 64, (t,), device=device)
    q0 = torch.randn(t, hq, d, device=device).to(dtype)
    k0 = torch.randn(t, hk, d, device=device).to(dtype)
    q, k = q0.clone(), k0.clone()
    args = (q.view(t, -1), k.view(t, -1)) if flat else (q, k)
    out = ks.rotary_embedding(pos, *args, cache, interleaved=interleaved, head_size=d, backend=backend)
    assert out.q.data_ptr() == q.data_ptr() and out.k.data_ptr() == k.data_ptr(), "rotates in place"
    for got, x0 in ((q, q0), (k, k0)):
        want = _hf_rotate(x0, pos, cache, interleaved)
        assert torch.equal(got[..., rot:], x0[..., rot:]), "features past rotary_dim must not change"
        assert rel_err(got, want) <= tolerance("elementwise", dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_q_slice_of_fused_qkv_and_no_k(backend, device):
    """vLLM rotates views into one [T, (Hq + 2 Hk) D] projection: rows with a token stride."""
    t, hq, hk, d = 5, 4, 2, 64
    qkv = torch.randn(t, (hq + 2 * hk) * d, device=device)
    ref = qkv.clone()
    cache = _cache(32, d, device=device)
    pos = torch.randint(0, 32, (t,), device=device)
    q = qkv[:, : hq * d]
    ks.rotary_embedding(pos, q, None, cache, head_size=d, backend=backend)
    want = _hf_rotate(ref[:, : hq * d].view(t, hq, d), pos, cache, False).view(t, -1)
    assert rel_err(qkv[:, : hq * d], want) < 1e-6
    assert torch.equal(qkv[:, hq * d:], ref[:, hq * d:]), "k and v untouched"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hq,hk,d", [(40, 5, 64), (3, 3, 128), (72, 8, 32)], ids=["40-5", "3-3", "72-8"])
def test_q_and_k_slices_of_fused_qkv(backend, hq, hk, d, device):
    """q and k rotate in one launch with tiles sized to each: odd head counts (masked blocks),
    more than one q block per token, both with the qkv buffer's token stride, v untouched."""
    t = 6
    qkv = torch.randn(t, (hq + 2 * hk) * d, device=device, dtype=torch.bfloat16)
    ref = qkv.clone()
    cache = _cache(32, d, device=device)
    pos = torch.randint(0, 32, (t,), device=device)
    q, k = qkv[:, : hq * d], qkv[:, hq * d: (hq + hk) * d]
    ks.rotary_embedding(pos, q, k, cache, head_size=d, backend=backend)
    for lo, h in ((0, hq), (hq * d, hk)):
        want = _hf_rotate(ref[:, lo: lo + h * d].view(t, h, d), pos, cache, False).view(t, -1)
        assert rel_err(qkv[:, lo: lo + h * d], want) <= tolerance("elementwise", torch.bfloat16)
    assert torch.equal(qkv[:, (hq + hk) * d:], ref[:, (hq + hk) * d:]), "v untouched"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["strided", "expanded"])
def test_strided_positions(backend, layout, device):
    # positions that are a view (every other element of a buffer, or one position broadcast) are
    # honoured: the Triton launch once read them as if contiguous
    cache = _cache(16, 32, device=device)
    pos = torch.tensor([3, 9, 1, 14, 6], device=device)
    view = torch.stack([pos, pos + 1], 1)[:, 0] if layout == "strided" else pos[:1].expand(5)
    q = torch.randn(5, 4, 32, device=device)
    want = q.clone()
    ks.rotary_embedding(view.contiguous(), want, None, cache, backend="reference")
    ks.rotary_embedding(view, q, None, cache, backend=backend)
    assert view.stride(0) != 1 and torch.allclose(q, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [8, 10**6, -1], ids=["max_pos", "huge", "negative"])
def test_position_out_of_range_leaves_token_unrotated(backend, bad, device):
    # documented for every backend (the reference once raised torch's IndexError instead)
    cache = _cache(8, 16, device=device)
    q = torch.randn(2, 2, 16, device=device)
    q0 = q.clone()
    ks.rotary_embedding(torch.tensor([3, bad], device=device), q, None, cache, backend=backend)
    assert torch.equal(q[1], q0[1]) and not torch.equal(q[0], q0[0])


@pytest.mark.parametrize("kwargs,match", [
    (dict(q=torch.randn(2, 128)), "head_size"),
    (dict(rotary_dim=16), "rotary_dim"),
    (dict(cos_sin_cache=torch.randn(8, 31)), "cos_sin_cache"),
    (dict(positions=torch.tensor([0.0, 1.0])), "positions"),
    (dict(positions=torch.tensor([0, 1, 2])), "positions"),
    (dict(k=torch.randn(2, 2, 32, dtype=torch.float16)), "k"),
    (dict(cos_sin_cache=torch.randn(0, 32)), "cos_sin_cache"),
    # written in place: an expanded view would have several tokens write one element
    (dict(q=torch.randn(1, 4, 32).expand(2, 4, 32)), "'q' must be a tensor of distinct elements"),
    (dict(k=torch.randn(2, 1, 32).expand(2, 2, 32)), "'k' must be a tensor of distinct elements"),
    (dict(k="q"), "'k' must be a different tensor from q"),
    # in place and forward-only: a tensor autograd tracks would get gradients of the unrotated values
    (dict(q=torch.randn(2, 4, 32, requires_grad=True)), "in place and forward-only"),
    (dict(q=torch.randn(2, 4, 32, requires_grad=True) * 1.0), "in place and forward-only"),
    (dict(k=torch.randn(2, 1, 32, requires_grad=True)), "'k' .*in place and forward-only"),
    (dict(cos_sin_cache=_cache(8, 32).requires_grad_()), "'cos_sin_cache' .*in place and forward-only"),
    # k of 4 dims, permuted: the kernel rotated its memory order (not k's element order) and the
    # reference crashed in view; k takes q's two forms only
    (dict(k=torch.randn(2, 2, 2, 16).permute(0, 2, 3, 1)), "'k' must be \\[T=2, Hk, 32\\]"),
    # a 3-D k states its head size: one other than q's was read as heads of q's size
    (dict(k=torch.randn(2, 1, 64)), "'k' must be \\[T=2, Hk, 32\\]"),
], ids=["2d-q-no-head-size", "rotary-dim-mismatch", "odd-cache", "float-positions", "positions-length", "k-dtype",
        "empty-cache", "expanded-q", "expanded-k", "k-is-q", "q-leaf-grad", "q-non-leaf-grad", "k-grad",
        "cache-grad", "4d-k", "3d-k-other-head-size"])
def test_bad_input(kwargs, match):
    args = dict(positions=torch.tensor([0, 1]), q=torch.randn(2, 4, 32), k=None, cos_sin_cache=_cache(8, 32))
    args.update(kwargs)
    if isinstance(args["k"], str):
        args["k"] = args[args["k"]]
    rest = {k: args.pop(k) for k in list(args) if k not in ("positions", "q", "k", "cos_sin_cache")}
    with pytest.raises((ValueError, TypeError), match=match):
        ks.rotary_embedding(args["positions"], args["q"], args["k"], args["cos_sin_cache"], **rest)


def test_no_grad_mode_allows_tensors_that_require_grad(device):
    """Under torch.no_grad nothing is recorded, so the in-place rotation is allowed (HF's cache-free
    inference on a model whose parameters require grad)."""
    cache = _cache(8, 32, device=device)
    q = torch.randn(2, 4, 32, device=device, requires_grad=True)
    want = _hf_rotate(q.detach(), torch.tensor([1, 5], device=device), cache, False)
    with torch.no_grad():
        ks.rotary_embedding(torch.tensor([1, 5], device=device), q, None, cache)
    assert rel_err(q.detach(), want) < 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("flat", [False, True], ids=["3d", "2d"])
def test_empty_batch_with_k(backend, flat, device):
    """T = 0 with a k: the checks indexed k[0] (IndexError) and the reference's view(0, -1, D) raised."""
    cache = _cache(8, 32, device=device)
    q, k = torch.randn(0, 4, 32, device=device), torch.randn(0, 2, 32, device=device)
    args = (q.view(0, 4 * 32), k.view(0, 2 * 32)) if flat else (q, k)
    out = ks.rotary_embedding(torch.zeros(0, dtype=torch.long, device=device), *args, cache, head_size=32,
                              backend=backend)
    assert out.q.shape == args[0].shape and out.k.shape == args[1].shape


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_place_bumps_autograd_version(backend, device):
    """q saved by an autograd graph (here for w's gradient) and then rotated in place: backward must
    raise as after any torch in-place op. The Triton path wrote through data pointers without
    bumping q's version counter, and w.grad came out of the rotated q without a word."""
    cache = _cache(8, 32, device=device)
    pos = torch.tensor([1, 5], device=device)
    q, k = torch.randn(2, 4, 32, device=device), torch.randn(2, 1, 32, device=device)
    w = torch.randn(32, 3, device=device, requires_grad=True)
    out = (q @ w).sum() + (k @ w).sum()
    vq, vk = q._version, k._version
    ks.rotary_embedding(pos, q, k, cache, backend=backend)
    assert q._version > vq and k._version > vk
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward()
    # and q requiring grad, rotated under no_grad (allowed), then back-propagated through
    x = torch.randn(2, 4, 32, device=device, requires_grad=True)
    q = x.exp()
    with torch.no_grad():
        ks.rotary_embedding(pos, q, None, cache, backend=backend)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        q.sum().backward()


def test_compile_fullgraph_in_place(device):
    cache = _cache(16, 32, device=device)
    pos = torch.randint(0, 16, (3,), device=device)

    def f(q, k):
        ks.rotary_embedding(pos, q, k, cache)
        return q * 2, k

    q, k = torch.randn(3, 2, 32, device=device), torch.randn(3, 1, 32, device=device)
    qe, ke = q.clone(), k.clone()
    ks.rotary_embedding(pos, qe, ke, cache)
    got_q, got_k = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k)
    assert torch.equal(q, qe) and torch.equal(got_q, qe * 2) and torch.equal(got_k, ke)


def _hf_tables(b, s, rot, interleaved, batched, device):
    inv = 1.0 / 10000 ** (torch.arange(0, rot, 2, dtype=torch.float32, device=device) / rot)
    f = torch.outer(torch.arange(s, dtype=torch.float32, device=device) + 3, inv)
    emb = f.repeat_interleave(2, -1) if interleaved else torch.cat([f, f], -1)
    cos, sin = emb.cos(), emb.sin()
    return (cos[None].expand(b, s, rot), sin[None].expand(b, s, rot)) if batched else (cos, sin)


def _hf_apply(x, cos, sin, unsqueeze_dim, interleaved):
    """transformers' apply_rotary_pos_emb on the first rot features, written out independently."""
    rot = cos.shape[-1]
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    c, s = cos.unsqueeze(unsqueeze_dim).float(), sin.unsqueeze(unsqueeze_dim).float()
    xr = x[..., :rot].float()
    if interleaved:
        rh = torch.stack([-xr[..., 1::2], xr[..., 0::2]], -1).flatten(-2)
    else:
        rh = torch.cat([-xr[..., rot // 2:], xr[..., : rot // 2]], -1)
    return torch.cat([xr * c + rh * s, x[..., rot:].float()], -1)


# (id, B, Hq, Hk, S, D, rotary dim, unsqueeze_dim, cos batched, why)
APPLY_CASES = [
    ("bhsd", 2, 4, 2, 7, 64, 64, 1, True, "transformers' default layout, per-batch cos/sin"),
    ("bshd", 2, 4, 2, 7, 64, 64, 2, True, "[B, S, H, D] (unsqueeze_dim=2)"),
    ("shared-cos", 3, 2, 1, 5, 128, 128, 1, False, "cos/sin [S, R] shared by the batch"),
    ("partial", 1, 3, 3, 4, 80, 32, 1, True, "rotary_dim < head size: the tail passes through"),
    ("many-heads", 1, 80, 8, 3, 64, 64, 1, False, "q spans 2 head blocks of the one q+k launch, k 1"),
    ("head256", 1, 2, 1, 3, 256, 256, 1, True, "the widest head size of the issue (Gemma)"),
    ("head80-full", 2, 3, 1, 4, 80, 80, 1, True, "a full rotation of an odd head size"),
]


@pytest.mark.parametrize("backend", [str(i.backend) for i in impls("apply_rotary")])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("case", APPLY_CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
def test_apply_rotary(backend, dtype, case, interleaved, device):
    _, b, hq, hk, s, d, rot, ud, batched, _ = case
    cos, sin = _hf_tables(b, s, rot, interleaved, batched, device)
    shape = (lambda h: (b, h, s, d)) if ud == 1 else (lambda h: (b, s, h, d))
    q = torch.randn(*shape(hq), device=device).to(dtype).requires_grad_(True)
    k = torch.randn(*shape(hk), device=device).to(dtype).requires_grad_(True)
    qo, ko = ks.apply_rotary(q, k, cos, sin, interleaved=interleaved, unsqueeze_dim=ud, backend=backend)
    gq, gk = torch.randn_like(qo), torch.randn_like(ko)
    torch.autograd.backward([qo, ko], [gq, gk])
    qr, kr = q.detach().float().requires_grad_(), k.detach().float().requires_grad_()
    wq, wk = _hf_apply(qr, cos, sin, ud, interleaved), _hf_apply(kr, cos, sin, ud, interleaved)
    torch.autograd.backward([wq, wk], [gq.float(), gk.float()])
    for got, want, what in ((qo, wq, "q"), (ko, wk, "k")):
        assert got.shape == want.shape and got.dtype == dtype
        assert rel_err(got, want) <= tolerance("elementwise", dtype), what
    for got, want, what in ((q.grad, qr.grad, "dq"), (k.grad, kr.grad, "dk")):
        assert rel_err(got, want) <= tolerance("elementwise", dtype, grad=True), what
    assert torch.equal(qo[..., rot:], q.detach()[..., rot:])


def test_apply_rotary_int64_offsets_same_bits(monkeypatch, device):
    """The int64 head-offset form (taken past 2^31 elements) gives the int32 form's bits."""
    from kernelset.ops.rope import launch
    if "triton" not in [str(i.backend) for i in impls("apply_rotary")]:
        pytest.skip("no Triton implementation here")
    b, hq, hk, s, d = 2, 6, 2, 5, 64
    cos, sin = _hf_tables(b, s, d, False, True, device)
    q = torch.randn(b, hq, s, d, device=device, dtype=torch.bfloat16)
    k = torch.randn(b, hk, s, d, device=device, dtype=torch.bfloat16)
    want = ks.apply_rotary(q, k, cos, sin, backend="triton")
    monkeypatch.setattr(launch, "_INT32_SPAN", 0)
    got = ks.apply_rotary(q, k, cos, sin, backend="triton")
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("backend", [str(i.backend) for i in impls("apply_rotary")])
@pytest.mark.parametrize("shape", [(0, 2, 3, 32), (1, 2, 0, 32)], ids=["batch-0", "seq-0"])
def test_apply_rotary_empty_with_backward(backend, shape, device):
    """An empty batch through forward and backward: sum()'s gradient is an expanded zero-stride
    tensor that .contiguous() leaves as it is, and the Triton backward refused it as 'strided'."""
    q = torch.randn(shape, device=device, requires_grad=True)
    k = torch.randn(shape, device=device, requires_grad=True)
    cos, sin = _hf_tables(1, shape[2], 32, False, False, device)
    out = ks.apply_rotary(q, k, cos, sin, backend=backend)
    (out.q.sum() + out.k.sum()).backward()
    assert q.grad.shape == shape and k.grad.shape == shape


def test_apply_rotary_tiles_fit_each_tensor():
    from kernelset.ops.rope.launch import rope_apply_policy
    p = rope_apply_policy(32, 8, 64)  # Llama-3-8B: q 16 heads per program, k 8 (none masked)
    assert (p.block_h1, p.block_h2, p.nb1, p.nb2, p.num_warps) == (16, 8, 2, 1, 4)
    p = rope_apply_policy(80, 8, 32)
    assert (p.block_h1, p.block_h2, p.nb1, p.nb2) == (32, 8, 3, 1)
    p = rope_apply_policy(8, 1, 128)  # D 256: 8 heads make the 1024 pairs
    assert (p.block_h1, p.block_h2, p.nb1, p.nb2) == (8, 1, 1, 1)


@pytest.mark.parametrize("kwargs,match", [
    (dict(unsqueeze_dim=3), "unsqueeze_dim"),
    (dict(rotary_dim=32), "rotary_dim"),
    (dict(cos=torch.randn(6, 63), sin=torch.randn(6, 63)), "rotary_dim"),
    (dict(cos=torch.randn(5, 64)), "cos"),
    (dict(k=torch.randn(2, 2, 6, 32)), "k"),
    (dict(k=torch.empty(2, 2, 6, 64, device="meta")), "'k' must be on the same device"),
], ids=["bad-unsqueeze", "rotary-dim-not-cos-width", "odd-rotary-dim", "cos-seq-len", "k-head-size", "k-device"])
def test_apply_rotary_bad_input(kwargs, match):
    args = dict(q=torch.randn(2, 4, 6, 64), k=torch.randn(2, 2, 6, 64), cos=torch.randn(6, 64),
                sin=torch.randn(6, 64))
    args.update({k: v for k, v in kwargs.items() if k in args})
    rest = {k: v for k, v in kwargs.items() if k not in args}
    with pytest.raises((ValueError, TypeError), match=match):
        ks.apply_rotary(args["q"], args["k"], args["cos"], args["sin"], **rest)


@pytest.mark.parametrize("backend", [str(i.backend) for i in impls("apply_rotary") if str(i.backend) != "reference"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_apply_rotary_forward_is_bitwise_transformers(backend, dtype, device):
    """The forward rounds as transformers' own ``q * cos + rotate_half(q) * sin`` does in q's dtype
    (each product, then the sum; no FMA), so a kernelized model's rotary output is unchanged bit for
    bit: one rounding instead of three flipped top-1 tokens of a random-init Llama on the GPU."""
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    b, hq, hk, s, d = 2, 4, 2, 9, 128
    cos, sin = _hf_tables(b, s, d, False, True, device)
    cos, sin = cos.to(dtype), sin.to(dtype)  # transformers' rotary module returns them in x's dtype
    q = (torch.randn(b, hq, s, d, device=device) * 3).to(dtype)
    k = (torch.randn(b, hk, s, d, device=device) * 3).to(dtype)
    wq, wk = llama.apply_rotary_pos_emb(q, k, cos, sin)
    gq, gk = ks.apply_rotary(q, k, cos, sin, backend=backend)
    assert torch.equal(gq, wq) and torch.equal(gk, wk), (
        f"{(gq != wq).sum().item()} of {wq.numel()} q elements differ from transformers")


def test_apply_rotary_compiles_with_backward(device):
    cos, sin = _hf_tables(1, 5, 32, False, False, device)
    q = torch.randn(1, 2, 5, 32, device=device, requires_grad=True)
    k = torch.randn(1, 1, 5, 32, device=device, requires_grad=True)

    def f(a, b):
        qo, ko = ks.apply_rotary(a, b, cos, sin)
        return (qo * 2).sum() + ko.pow(2).sum()

    ge = torch.autograd.grad(f(q, k), (q, k))
    gc = torch.autograd.grad(torch.compile(f, fullgraph=True, backend="aot_eager")(q, k), (q, k))
    assert all(rel_err(a, b) < 1e-6 for a, b in zip(gc, ge))


_AOT = QK_VECTORS + r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernelset.ops.rope import kernels as K
sig = dict(POS="*i64", Q="*bf16", K="*bf16", CACHE="*fp32", HQ="i32", HK="i32", NB1="i32", max_pos="i32",
           stride_qt="i32", stride_kt="i32", stride_c="i32")
out = []
from kernelset.ops.rope.launch import rope_fwd_policy
# the launcher's tiles: (head size, rotary dim / 2, GPT-J pairs, q heads, k heads); 32/8 heads of 128
# take one program per token (qk_one); 32/8 with rotary 32 of 80 (k's tile too small for it) and 64/8
# heads of 256 a (token, head block) grid
for d, half, inter, hq, hk in ((128, 64, False, 32, 8), (128, 64, True, 32, 8), (80, 16, False, 32, 8),
                               (256, 128, False, 64, 8)):
    p = rope_fwd_policy(16384, hq, hk, half)
    consts = dict(D=d, HALF=half, INTERLEAVED=inter, BLOCK_H1=p.block_h1, BLOCK_H2=p.block_h2, BLOCK_R=p.block_r,
                  QK_ONE=bool(p.qk_one))
    attrs = {(k,): [["tt.divisibility", 16]] for k, (n, ty) in enumerate(sig.items())
             if ty.startswith("*") or n in ("stride_qt", "stride_kt", "stride_c")}
    src = ASTSource(K._rope_fwd_kernel, signature={**sig, **{k: "constexpr" for k in consts}}, constexprs=consts,
                    attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=p.num_warps)).asm["ptx"]
    # q/k must move in vectors, NeoX halves and GPT-J rows alike
    out.append(dict(case=f"d{d}-r{2 * half}-inter{inter}-qk_one{p.qk_one}", local="ld.local" in ptx or "st.local" in ptx,
                    vec=qk_vectors(ptx)))
asig = dict(X1="*bf16", Y1="*bf16", X2="*bf16", Y2="*bf16", COS="*fp32", SIN="*fp32", S="i32", H1="i32", H2="i32",
            NB1="i32", sxb1="i32", sxs1="i32", sxh1="i32", syb1="i32", sys1="i32", syh1="i32", sxb2="i32",
            sxs2="i32", sxh2="i32", syb2="i32", sys2="i32", syh2="i32", scb="i32", scs="i32", ssb="i32",
            sss="i32", sign="fp32")
for inter in (False, True):
    consts = dict(HALF=64, INTERLEAVED=inter, BLOCK_H1=16, BLOCK_H2=8, BLOCK_R=64, WIDE=False)
    attrs = {(k,): [["tt.divisibility", 16]] for k, (n, ty) in enumerate(asig.items())
             if ty.startswith("*") or n.startswith("s") and n not in ("S", "sign")}
    src = ASTSource(K._rope_apply_kernel, signature={**asig, **{k: "constexpr" for k in consts}}, constexprs=consts,
                    attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4)).asm["ptx"]
    out.append(dict(case=f"apply-inter{inter}", local="ld.local" in ptx or "st.local" in ptx,
                    vec=qk_vectors(ptx)))
print(json.dumps(out))
"""


def test_kernels_compile_for_sm90():
    compile_report(_AOT, 6)


# ---- apply_rotary's eager replay table (api._APPLY_EAGER) -----------------------------------


def test_apply_rotary_replay_key_and_cpu(device):
    """Only plain tensors and plain option types are keyed; the CPU's reference is never kept; a
    configuration change empties the table."""
    from kernelset.ops.rope import api
    q = torch.randn(1, 4, 3, 16, device=device)
    k = torch.randn(1, 2, 3, 16, device=device)
    cos, sin = torch.randn(3, 16, device=device), torch.randn(3, 16, device=device)
    key = api._apply_eager_key
    assert key(q, k, cos, sin, False, None, 1, "auto") is not None
    assert key(q, k, cos, sin, 0, None, 1, "auto") is None  # a non-bool flag goes through the checks
    assert key(q, k, cos, sin, False, None, 1.0, "auto") is None
    assert key(q, k, cos, sin, False, None, 1, "auto") != key(q, k[:, :1], cos, sin, False, None, 1, "auto")
    if device.type == "cpu":
        api._APPLY_EAGER.clear()
        ks.apply_rotary(q, k, cos, sin)
        ks.apply_rotary(q, k, cos, sin)
        assert not api._APPLY_EAGER
    api._APPLY_EAGER["sentinel"] = None
    with ks.config.override(direct_launch=False):
        assert "sentinel" not in api._APPLY_EAGER


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["bhsd", "bshd", "cos-3d", "interleaved", "strided-q", "misaligned"])
def test_apply_rotary_replay_matches_the_full_path(case):
    from kernelset.ops.rope import api
    dev = torch.device("cuda")
    b, hq, hk, s, d = 2, 8, 2, 3, 64
    ud = 2 if case == "bshd" else 1
    if case == "strided-q":  # q a slice of a wider projection output, [B, S, H, D] viewed as [B, H, S, D]
        qkv = torch.randn(b, s, hq + 2 * hk, d, device=dev, dtype=torch.bfloat16)
        q, k = qkv[:, :, :hq].transpose(1, 2), qkv[:, :, hq:hq + hk].transpose(1, 2)
    elif ud == 2:
        q = torch.randn(b, s, hq, d, device=dev, dtype=torch.bfloat16)
        k = torch.randn(b, s, hk, d, device=dev, dtype=torch.bfloat16)
    else:
        q = torch.randn(b, hq, s, d, device=dev, dtype=torch.bfloat16)
        k = torch.randn(b, hk, s, d, device=dev, dtype=torch.bfloat16)
    il = case == "interleaved"
    # transformers' tables: halves duplicated (pairs for interleaved), as the op documents
    shape = (b, s, d // 2) if case == "cos-3d" else (s, d // 2)
    cos, sin = (torch.randn(shape, device=dev, dtype=torch.bfloat16) for _ in range(2))
    cos, sin = ((t.repeat_interleave(2, -1) if il else torch.cat([t, t], -1)) for t in (cos, sin))
    api._APPLY_EAGER.clear()
    first = ks.apply_rotary(q, k, cos, sin, interleaved=il, unsqueeze_dim=ud)
    assert len(api._APPLY_EAGER) == 1
    (replay,) = api._APPLY_EAGER.values()
    out = replay(q, k, cos, sin)
    assert out is not None, "the replay did not launch"
    for got, want in zip(out, first):
        assert got.stride() == want.stride() and torch.equal(got, want)
    again = ks.apply_rotary(q, k, cos, sin, interleaved=il, unsqueeze_dim=ud)
    assert all(torch.equal(a, w) for a, w in zip(again, first))
    want_ref = ks.apply_rotary(q, k, cos, sin, interleaved=il, unsqueeze_dim=ud, backend="reference")
    for got, ref in zip(first, want_ref):
        assert rel_err(got, ref) <= tolerance("elementwise", torch.bfloat16)
    if case == "misaligned":  # same shapes and strides, q one element off its aligned base
        base = torch.randn(q.numel() + 8, device=dev, dtype=torch.bfloat16)
        q2 = base[1:1 + q.numel()].view(q.shape)
        assert replay(q2, k, cos, sin) is None
        got = ks.apply_rotary(q2, k, cos, sin, interleaved=il, unsqueeze_dim=ud)
        ref = ks.apply_rotary(q2, k, cos, sin, interleaved=il, unsqueeze_dim=ud, backend="reference")
        assert rel_err(got.q, ref.q) <= tolerance("elementwise", torch.bfloat16)


# ---- rotary_embedding's eager replay table (api._ROT_EAGER) -----------------------------------


def test_rotary_embedding_replay_key(device):
    """The key holds shapes, strides, dtypes, devices, options and where k lies relative to q in
    a shared storage, not the addresses of separate tensors; the CPU is never kept; a configuration
    change empties the table."""
    from kernelset.ops.rope import api
    key = api._rot_eager_key
    pos, cache = torch.arange(3, device=device), _cache(8, 32, device=device)
    q, k = torch.randn(3, 4, 32, device=device), torch.randn(3, 2, 32, device=device)
    q2, k2 = torch.randn_like(q), torch.randn_like(k)
    assert key(pos, q, k, cache, False, None, None, "auto") == key(pos, q2, k2, cache, False, None, None, "auto")
    assert key(pos, q, k, cache, 0, None, None, "auto") is None  # a non-bool flag goes through the checks
    assert key(pos, q, k, cache, False, 32.0, None, "auto") is None
    qkv = torch.randn(3, 8, 32, device=device)
    a = key(pos, qkv[:, :4], qkv[:, 4:6], cache, False, None, None, "auto")
    b = key(pos, qkv[:, :4], qkv[:, 5:7], cache, False, None, None, "auto")  # same shapes, another offset
    assert a is not None and a != b and a != key(pos, q, k[:, :2], cache, False, None, None, "auto")
    if device.type == "cpu":
        api._ROT_EAGER.clear()
        ks.rotary_embedding(pos, q, k, cache)
        ks.rotary_embedding(pos, q, k, cache)
        assert not api._ROT_EAGER
    api._ROT_EAGER["sentinel"] = None
    with ks.config.override(direct_launch=False):
        assert "sentinel" not in api._ROT_EAGER


def test_rotary_embedding_replay_never_skips_the_overlap_check(device):
    """A replay validated for a fused buffer's disjoint q/k slices is not reused for slices of the
    same shapes and strides that overlap: their key differs, so the checks run and refuse them."""
    from kernelset.ops.rope import api
    pos, cache = torch.arange(3, device=device), _cache(8, 32, device=device)
    qkv = torch.randn(3, 8, 32, device=device)
    ran = []
    api._ROT_EAGER.clear()
    api._ROT_EAGER[api._rot_eager_key(pos, qkv[:, :4], qkv[:, 4:6], cache, False, None, None, "auto")] = \
        lambda *a: ran.append(a) or True
    ks.rotary_embedding(pos, qkv[:, :4], qkv[:, 4:6], cache)
    assert len(ran) == 1
    with pytest.raises(ValueError, match="'k' must be a different tensor from q sharing no memory"):
        ks.rotary_embedding(pos, qkv[:, :4], qkv[:, 2:4], cache)
    assert len(ran) == 1
    api._ROT_EAGER.clear()


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["separate", "fused-qkv", "no-k", "flat-2d", "interleaved", "int32-pos",
                                  "misaligned"])
def test_rotary_embedding_replay_matches_the_full_path(case):
    from kernelset.ops.rope import api
    dev = torch.device("cuda")
    t, hq, hk, d = 5, 8, 2, 64
    cache = _cache(16, d, device=dev)
    pos = torch.tensor([3, 0, 15, 7, 7], device=dev, dtype=torch.int32 if case == "int32-pos" else torch.int64)
    il, hs = case == "interleaved", None

    def inputs():
        if case == "fused-qkv":
            qkv = torch.randn(t, hq + 2 * hk, d, device=dev, dtype=torch.bfloat16)
            return qkv[:, :hq], qkv[:, hq:hq + hk]
        q = torch.randn(t, hq, d, device=dev, dtype=torch.bfloat16)
        k = None if case == "no-k" else torch.randn(t, hk, d, device=dev, dtype=torch.bfloat16)
        if case == "flat-2d":
            return q.view(t, hq * d), k.view(t, hk * d)
        return q, k

    if case == "flat-2d":
        hs = d
    api._ROT_EAGER.clear()
    ks.rotary_embedding(pos, *inputs(), cache, interleaved=il, head_size=hs)  # validated, then kept
    assert len(api._ROT_EAGER) == 1
    (replay,) = api._ROT_EAGER.values()
    q, k = inputs()
    want_q, want_k = (None if x is None else x.clone() for x in (q, k))
    ks.rotary_embedding(pos, want_q, want_k, cache, interleaved=il, head_size=hs, backend="reference")
    assert replay(pos, q, k, cache), "the replay did not launch"
    assert rel_err(q, want_q) <= tolerance("elementwise", torch.bfloat16)
    if k is not None:
        assert rel_err(k, want_k) <= tolerance("elementwise", torch.bfloat16)
    q2, k2 = inputs()
    full_q, full_k = (None if x is None else x.clone() for x in (q2, k2))
    with ks.config.override(direct_launch=False):  # (empties the table: the full path)
        ks.rotary_embedding(pos, full_q, full_k, cache, interleaved=il, head_size=hs)
    ks.rotary_embedding(pos, *inputs(), cache, interleaved=il, head_size=hs)  # kept again
    ks.rotary_embedding(pos, q2, k2, cache, interleaved=il, head_size=hs)  # through the replay
    assert len(api._ROT_EAGER) == 1
    assert torch.equal(q2, full_q) and (k2 is None or torch.equal(k2, full_k))
    if case == "misaligned":  # same shapes and strides, q one element off its aligned base
        base = torch.randn(q.numel() + 8, device=dev, dtype=torch.bfloat16)
        q3 = base[1:1 + q.numel()].view(q.shape)
        assert not replay(pos, q3, k, cache)
