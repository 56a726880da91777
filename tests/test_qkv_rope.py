"""qkv_rope: attention's projections and rotation as one autograd node, every backend against fp32
math and transformers' LlamaAttention code (forward and every gradient, biases included), partial
gradients, bad input, torch.compile."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernelset as ks
from kernelset.core.tolerance import rel_err, tolerance


def _tables(b, s, d, device, dtype, batched=True):
    ang = torch.randn(b if batched else 1, s, d // 2, device=device) * 3
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(dtype), torch.cat([ang.sin()] * 2, -1).to(dtype)
    return (cos, sin) if batched else (cos[0], sin[0])


def _rot(t):
    h = t.shape[-1] // 2
    return torch.cat((-t[..., h:], t[..., :h]), -1)


def _hf(x, wq, wk, wv, bq, bk, bv, cos, sin, d):  # LlamaAttention.forward up to apply_rotary_pos_emb
    b, s, _ = x.shape
    q, k, v = (F.linear(x, w, bias).view(b, s, -1, d).transpose(1, 2) for w, bias in ((wq, bq), (wk, bk), (wv, bv)))
    c, sn = (cos.unsqueeze(1), sin.unsqueeze(1)) if cos.dim() == 3 else (cos, sin)
    return q * c + _rot(q) * sn, k * c + _rot(k) * sn, v


def _case(b, s, h, hq, hk, d, dtype, device, bias):
    x = torch.randn(b, s, h, device=device).to(dtype).requires_grad_()
    ws = [(torch.randn(n * d, h, device=device) / h ** 0.5).to(dtype).requires_grad_() for n in (hq, hk, hk)]
    bs = [torch.randn(n * d, device=device).to(dtype).requires_grad_() if bias else None for n in (hq, hk, hk)]
    return x, ws, bs


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("shape", [(2, 7, 64, 4, 2, 16), (1, 33, 48, 6, 6, 8), (3, 1, 32, 2, 1, 32)],
                         ids=["gqa", "mha-d8", "one-token"])
def test_forward_and_gradients_against_fp32(shape, bias, dtype, backend, device):
    b, s, h, hq, hk, d = shape
    x, ws, bs = _case(b, s, h, hq, hk, d, dtype, device, bias)
    cos, sin = _tables(b, s, d, device, dtype, batched=hq != hk)
    out = ks.qkv_rope(x, *ws, cos, sin, head_dim=d, b_q=bs[0], b_k=bs[1], b_v=bs[2], backend=backend)
    assert [tuple(t.shape) for t in out] == [(b, hq, s, d), (b, hk, s, d), (b, hk, s, d)]
    for t in out:  # [B, H, S, D] views of [B, S, H, D] memory, one node for all three
        assert t.dtype == dtype and t.transpose(1, 2).is_contiguous() or t.stride(-1) == 1
        assert "EagerAutograd" in type(t.grad_fn).__name__
    leaves = [x, *ws] + [t for t in bs if t is not None]
    ins = [t.detach().double().requires_grad_() for t in leaves]
    xi, wi = ins[0], ins[1:4]
    bi = ins[4:] if bias else [None] * 3
    want = _hf(xi, *wi, *bi, cos.double(), sin.double(), d)
    for name, g, e in zip("qkv", out, want):
        assert rel_err(g, e) <= tolerance("gemm", dtype), (name, rel_err(g, e))
    cots = [torch.randn_like(e) for e in want]
    got = torch.autograd.grad(out, leaves, [c.to(dtype) for c in cots])
    exp = torch.autograd.grad(want, ins, cots)
    for i, (a, e) in enumerate(zip(got, exp)):
        assert not a.isnan().any(), i
        assert rel_err(a, e) <= tolerance("gemm", dtype, grad=True), (i, rel_err(a, e))


def test_partial_gradients_and_no_grad(device):
    x, ws, _ = _case(2, 5, 32, 2, 1, 16, torch.float32, device, False)
    cos, sin = _tables(2, 5, 16, device, torch.float32)
    x.requires_grad_(False)
    ws[0].requires_grad_(False)
    out = ks.qkv_rope(x, *ws, cos, sin, head_dim=16)
    gk, gv = torch.autograd.grad(sum(t.square().sum() for t in out), (ws[1], ws[2]))
    ins = [t.detach().double().requires_grad_(i >= 2) for i, t in enumerate((x, *ws))]
    want = _hf(ins[0], *ins[1:], None, None, None, cos.double(), sin.double(), 16)
    ek, ev = torch.autograd.grad(sum(t.square().sum() for t in want), (ins[2], ins[3]))
    assert rel_err(gk, ek) < 1e-5 and rel_err(gv, ev) < 1e-5
    with torch.no_grad():
        out = ks.qkv_rope(x, *ws, cos, sin, head_dim=16)
    assert all(t.grad_fn is None for t in out)


def _good():
    return dict(x=torch.randn(2, 5, 32), w_q=torch.randn(32, 32), w_k=torch.randn(16, 32), w_v=torch.randn(16, 32),
                cos=torch.randn(5, 16), sin=torch.randn(5, 16))


@pytest.mark.parametrize("change,name", [
    (dict(x=torch.randn(10, 32)), "x"),
    (dict(w_q=torch.randn(30, 32)), "w_q"),
    (dict(w_k=torch.randn(16, 31)), "w_k"),
    (dict(w_v=torch.randn(32, 32)), "w_v"),
    (dict(w_q=torch.randn(48, 32)), "w_q"),  # 3 query heads over 1 KV head: fine; over 2: not a multiple
    (dict(cos=torch.randn(5, 8)), "cos"),
    (dict(sin=torch.randn(4, 16)), "sin"),
    (dict(w_q=torch.randn(32, 32, dtype=torch.float64)), "w_q"),
    (dict(head_dim=15), "head_dim"),
    (dict(b_q=torch.randn(31)), "b_q"),
])
def test_bad_input_names_the_argument(change, name):
    kw = _good()
    kw.update(change)
    if name == "w_q" and kw["w_q"].shape[0] == 48:
        kw["w_k"], kw["w_v"] = torch.randn(32, 32), torch.randn(32, 32)  # 3 query heads, 2 KV heads
    hd = kw.pop("head_dim", 16)
    extra = {k: kw.pop(k) for k in ("b_q",) if k in kw}
    with pytest.raises((ks.ArgumentError, ks.ArgumentTypeError, TypeError), match=name):
        ks.qkv_rope(*kw.values(), head_dim=hd, **extra)


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_empty_sequence_forward_and_gradients(backend, device):
    """S = 0 (an empty micro-batch): the backward's reshape(B * S, -1) of the rotated gradients was
    ambiguous for 0 elements and raised in every backend; the weights' gradients are zeros."""
    x, ws, bs = _case(2, 0, 32, 2, 1, 16, torch.float32, device, True)
    cos, sin = _tables(2, 0, 16, device, torch.float32)
    out = ks.qkv_rope(x, *ws, cos, sin, head_dim=16, b_q=bs[0], b_k=bs[1], b_v=bs[2], backend=backend)
    assert [tuple(t.shape) for t in out] == [(2, 2, 0, 16), (2, 1, 0, 16), (2, 1, 0, 16)]
    sum(t.sum() for t in out).backward()
    assert x.grad.shape == x.shape
    for t in (*ws, *bs):
        assert t.grad is not None and t.grad.shape == t.shape and not t.grad.any()


def test_compile_fullgraph_with_backward():
    x, ws, bs = _case(2, 5, 32, 2, 1, 16, torch.float32, "cpu", True)
    cos, sin = _tables(2, 5, 16, "cpu", torch.float32)

    def f(x, wq, wk, wv, bq):
        q, k, v = ks.qkv_rope(x, wq, wk, wv, cos, sin, head_dim=16, b_q=bq)
        return (q.square().sum() + k.sum() * 2 + v.square().sum())

    args = (x, *ws, bs[0])
    eager = torch.autograd.grad(f(*args), args)
    comp = torch.autograd.grad(torch.compile(f, fullgraph=True, backend="aot_eager")(*args), args)
    for a, b in zip(eager, comp):
        assert rel_err(b, a) < 1e-6


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_prenorm_forward_and_gradients(dtype, backend, device):
    """norm_weight: LlamaRMSNorm then the projections and rotation in the same node."""
    b, s, h, hq, hk, d = 2, 6, 64, 4, 2, 16
    x, ws, _ = _case(b, s, h, hq, hk, d, dtype, device, False)
    wn = (1 + 0.3 * torch.randn(h, device=device)).to(dtype).requires_grad_()
    cos, sin = _tables(b, s, d, device, dtype)
    out = ks.qkv_rope(x, *ws, cos, sin, head_dim=d, norm_weight=wn, norm_eps=1e-5, backend=backend)
    ins = [t.detach().double().requires_grad_() for t in (x, wn, *ws)]
    xn = ins[0] * torch.rsqrt(ins[0].pow(2).mean(-1, keepdim=True) + 1e-5) * ins[1]
    want = _hf(xn, *ins[2:], None, None, None, cos.double(), sin.double(), d)
    for g, e in zip(out, want):
        assert rel_err(g, e) <= tolerance("gemm", dtype)
    cots = [torch.randn_like(e) for e in want]
    got = torch.autograd.grad(out, (x, wn, *ws), [c.to(dtype) for c in cots])
    exp = torch.autograd.grad(want, ins, cots)
    for i, (a, e) in enumerate(zip(got, exp)):
        assert rel_err(a, e) <= tolerance("gemm", dtype, grad=True), (i, rel_err(a, e))


def test_prenorm_compile():
    x, ws, _ = _case(2, 5, 32, 2, 1, 16, torch.float32, "cpu", False)
    wn = torch.randn(32, requires_grad=True)
    cos, sin = _tables(2, 5, 16, "cpu", torch.float32)

    mlp = [torch.randn(24, 16, requires_grad=True), torch.randn(24, 16, requires_grad=True),
           torch.randn(16, 24, requires_grad=True), torch.randn(16, requires_grad=True)]

    def f(x, wn, wq, wk, wv, wg, wu, wd, wn2):
        q, k, v = ks.qkv_rope(x, wq, wk, wv, cos, sin, head_dim=16, norm_weight=wn)
        y = ks.gated_mlp(v.transpose(1, 2).reshape(2, 5, 16), wg, wu, wd, norm_weight=wn2)
        return q.square().sum() + k.sum() + y.square().sum()

    args = (x, wn, *ws, *mlp)
    eager = torch.autograd.grad(f(*args), args)
    comp = torch.autograd.grad(torch.compile(f, fullgraph=True, backend="aot_eager")(*args), args)
    for a, b in zip(eager, comp):
        assert rel_err(b, a) < 1e-5


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_tables_strided_in_their_last_dim(backend, device):
    """cos/sin slices of a wider table (stride 2 in D): the rotation kernel read a table row at
    unit stride, so the Triton backend rotated q and k (and their gradients) by the wrong angles;
    the forward and every gradient must equal those with contiguous tables."""
    b, s, h, hq, hk, d = 2, 3, 32, 2, 1, 8
    x, ws, _ = _case(b, s, h, hq, hk, d, torch.float32, device, False)
    cos, sin = _tables(b, s, d, device, torch.float32)
    wide_c, wide_s = (torch.stack([t, torch.full_like(t, 7.0)], -1).flatten(-2) for t in (cos, sin))
    out = ks.qkv_rope(x, *ws, wide_c[..., ::2], wide_s[..., ::2], head_dim=d, backend=backend)
    ins = [t.detach().double().requires_grad_() for t in (x, *ws)]
    want = _hf(*ins, None, None, None, cos.double(), sin.double(), d)
    for name, g, e in zip("qkv", out, want):
        assert rel_err(g, e) <= tolerance("gemm", torch.float32), (name, rel_err(g, e))
    cots = [torch.randn_like(e) for e in want]
    got = torch.autograd.grad(out, (x, *ws), [c.float() for c in cots])
    for i, (a, e) in enumerate(zip(got, torch.autograd.grad(want, ins, cots))):
        assert rel_err(a, e) <= tolerance("gemm", torch.float32, grad=True), (i, rel_err(a, e))
