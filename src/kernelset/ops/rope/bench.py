"""Benchmark adapters of the rope family. Peers: native torch compositions (vLLM-style gather of
cos/sin and rotation of halves; mrope's section split; Qwen3RMSNorm per head then the rotation)
and torch.compile of them. Each runner rotates its own copies, so every first call (the
correctness check) starts from the same q and k."""
from __future__ import annotations

import torch

from ...bench.adapter import BenchAdapter, ShapeGrammar, compiled, runner
from . import api
from . import qkv as api_qkv
from . import reference as ref


def _native(positions, q, k, cache):
    rot = cache.shape[1]
    cs = cache[positions]
    cos, sin = cs[:, None, : rot // 2], cs[:, None, rot // 2:]
    for x in (q, k):
        half = x[..., : rot // 2].float(), x[..., rot // 2: rot].float()
        x[..., :rot] = torch.cat([half[0] * cos - half[1] * sin, half[1] * cos + half[0] * sin], -1).to(x.dtype)
    return q, k


def _positions(t: int, rows: int, device) -> torch.Tensor:
    """t distinct positions in [0, rows), in random order. The byte models count one cache row
    read per token (t x rotary_dim fp32); repeated positions would make the op read fewer (at T =
    16384 over a 4096-row table, 2 MiB hot in L2 against the 8 MiB counted: 1.9 points of copy)."""
    return torch.randperm(rows, device=device)[:t]


def _inputs(shape, dtype, device, mode):
    if len(shape) == 2:  # (tokens, anything) from ksctl verify / plan: a small GQA layer
        shape = (shape[0], 4, 2, 64)
    t, hq, hk, d = shape
    rows = max(4096, t)  # a table as long as the batch's positions, each position once (a prefill's)
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
    f = torch.outer(torch.arange(rows, device=device, dtype=torch.float32), inv)
    return {"pos": _positions(t, rows, device), "q": torch.randn(t, hq, d, dtype=dtype, device=device),
            "k": torch.randn(t, hk, d, dtype=dtype, device=device), "cache": torch.cat([f.cos(), f.sin()], -1),
            "names": ("q", "k")}


def _own(fn, inp):
    q, k = inp["q"].clone(), inp["k"].clone()
    return lambda: tuple(fn(inp["pos"], q, k, inp["cache"]))


def _reference(inp, mode):
    q, k = inp["q"].to(torch.float32, copy=True), inp["k"].to(torch.float32, copy=True)
    ref.fwd(inp["pos"], q, k, inp["cache"], False, q.shape[-1])
    return q, k


_TOKENS = ShapeGrammar("TxHqxHkvxD", "T tokens at distinct positions, Hq query and Hkv key heads of D")

ADAPTERS = {"rotary_embedding": BenchAdapter(
    inputs=_inputs,
    ours=lambda inp, mode, backend: _own(lambda p, q, k, c: api.rotary_embedding(p, q, k, c, backend=backend), inp),
    peers=lambda inp, mode: {"torch-eager": _own(_native, inp), "torch.compile": _own(compiled(_native), inp)},
    reference=_reference,
    args=lambda inp: (inp["pos"], inp["q"], inp["k"], inp["cache"], inp["q"].shape[-1]),
    shape=_TOKENS,
)}


def _hf_apply(q, k, cos, sin):
    def rot(x):
        half = x.shape[-1] // 2
        return torch.cat([-x[..., half:], x[..., :half]], -1)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * c + rot(q) * s, k * c + rot(k) * s


def _apply_inputs(shape, dtype, device, mode):
    if len(shape) == 2:  # (tokens, anything) from ksctl verify / plan: one short sequence
        shape = (1, 4, 2, shape[0], 64)
    b, hq, hk, s, d = shape
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
    f = torch.outer(torch.arange(s, device=device, dtype=torch.float32), inv)
    emb = torch.cat([f, f], -1)
    grad = mode != "fwd"
    q = torch.randn(b, hq, s, d, dtype=dtype, device=device, requires_grad=grad)
    k = torch.randn(b, hk, s, d, dtype=dtype, device=device, requires_grad=grad)
    cos, sin = emb.cos()[None].expand(b, s, d).to(dtype), emb.sin()[None].expand(b, s, d).to(dtype)
    cot = (torch.randn_like(q), torch.randn_like(k)) if grad else ()
    return {"q": q, "k": k, "cos": cos, "sin": sin, "wrt": (q, k), "cot": cot,
            "names": ("q", "k") if not grad else ("q", "k", "dq", "dk")}


def _apply_reference(inp, mode):
    leaves = [t.detach().float().requires_grad_(mode != "fwd") for t in (inp["q"], inp["k"])]
    outs = _hf_apply(*leaves, inp["cos"].float(), inp["sin"].float())
    if mode == "fwd":
        return tuple(o.detach() for o in outs)
    return tuple(o.detach() for o in outs) + torch.autograd.grad(outs, leaves, [c.float() for c in inp["cot"]])


ADAPTERS["apply_rotary"] = BenchAdapter(
    inputs=_apply_inputs,
    ours=lambda inp, mode, backend: runner(lambda: tuple(api.apply_rotary(inp["q"], inp["k"], inp["cos"], inp["sin"],
                                                                          backend=backend)), inp, mode),
    peers=lambda inp, mode: {
        "torch-eager": runner(lambda: _hf_apply(inp["q"], inp["k"], inp["cos"], inp["sin"]), inp, mode),
        "torch.compile": runner(lambda: compiled(_hf_apply)(inp["q"], inp["k"], inp["cos"], inp["sin"]), inp, mode)},
    reference=_apply_reference,
    args=lambda inp: (inp["q"], inp["k"], inp["cos"], inp["sin"]),
    shape=ShapeGrammar("BxHqxHkvxSxD", "B sequences, Hq query and Hkv key heads, S positions, head dim D"),
)


def _sections(d: int) -> list[int]:
    """Qwen2-VL's split scaled to head size d: (16, 24, 24) at d = 128."""
    half = d // 2
    hw = (half - half // 4) // 2
    return [half - 2 * hw, hw, hw]


def _native_mrope(pos3, q, k, cache, sections):
    rot = cache.shape[1]
    cs = cache[pos3]  # [3, T, R]
    cos = torch.cat([m[i] for i, m in enumerate(cs[..., : rot // 2].split(sections, -1))], -1)[:, None]
    sin = torch.cat([m[i] for i, m in enumerate(cs[..., rot // 2:].split(sections, -1))], -1)[:, None]
    for x in (q, k):
        a, b = x[..., : rot // 2].float(), x[..., rot // 2: rot].float()
        x[..., :rot] = torch.cat([a * cos - b * sin, b * cos + a * sin], -1).to(x.dtype)
    return q, k


def _mrope_inputs(shape, dtype, device, mode):
    inp = _inputs(shape, dtype, device, mode)
    t, rows = inp["q"].shape[0], inp["cache"].shape[0]
    inp["pos"] = torch.stack([_positions(t, rows, device) for _ in range(3)])
    inp["sections"] = _sections(inp["q"].shape[-1])
    return inp


def _mrope_own(fn, inp):
    q, k = inp["q"].clone(), inp["k"].clone()
    return lambda: tuple(fn(inp["pos"], q, k, inp["cache"], inp["sections"]))


def _mrope_reference(inp, mode):
    q, k = inp["q"].to(torch.float32, copy=True), inp["k"].to(torch.float32, copy=True)
    ref.mrope_fwd(inp["pos"], q, k, inp["cache"], inp["sections"], False, False, q.shape[-1])
    return q, k


ADAPTERS["mrope"] = BenchAdapter(
    inputs=_mrope_inputs,
    ours=lambda inp, mode, backend: _mrope_own(
        lambda p, q, k, c, s: api.mrope(p, q, k, c, s, backend=backend), inp),
    peers=lambda inp, mode: {"torch-eager": _mrope_own(_native_mrope, inp),
                             "torch.compile": _mrope_own(compiled(_native_mrope), inp)},
    reference=_mrope_reference,
    args=lambda inp: (inp["pos"], inp["q"], inp["k"], inp["cache"], inp["q"].shape[-1]),
    shape=_TOKENS,
)


def _native_qk(q, k, qw, kw, pos, cache):
    """transformers' Qwen3 attention prologue in torch ops: Qwen3RMSNorm per head, then the rotation."""
    rot = cache.shape[1]
    cs = cache[pos]
    cos, sin = cs[:, None, : rot // 2], cs[:, None, rot // 2:]
    for x, w in ((q, qw), (k, kw)):
        xf = x.float()
        xn = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w
        a, b = xn[..., : rot // 2].float(), xn[..., rot // 2: rot].float()
        x.copy_(torch.cat([a * cos - b * sin, b * cos + a * sin, xn[..., rot:].float()], -1).to(x.dtype))
    return q, k


def _qk_inputs(shape, dtype, device, mode):
    inp = _inputs(shape, dtype, device, mode)
    d = inp["q"].shape[-1]
    inp["qw"] = (1 + 0.2 * torch.randn(d, device=device)).to(dtype)
    inp["kw"] = (1 + 0.2 * torch.randn(d, device=device)).to(dtype)
    return inp


def _qk_own(fn, inp):
    q, k = inp["q"].clone(), inp["k"].clone()
    return lambda: tuple(fn(q, k, inp["qw"], inp["kw"], inp["pos"], inp["cache"]))


def _qk_reference(inp, mode):
    q, k = inp["q"].clone(), inp["k"].clone()  # the reference computes in fp32 and rounds where the op does
    ref.qk_norm_rope_fwd(q, k, inp["qw"], inp["kw"], inp["cache"], inp["pos"], 1e-6, 0.0, "llama", False,
                         q.shape[-1], None, False)
    return q, k


ADAPTERS["qk_norm_rope"] = BenchAdapter(
    inputs=_qk_inputs,
    ours=lambda inp, mode, backend: _qk_own(
        lambda q, k, qw, kw, p, c: api.qk_norm_rope(q, k, qw, kw, c, p, backend=backend), inp),
    peers=lambda inp, mode: {"torch-eager": _qk_own(_native_qk, inp),
                             "torch.compile": _qk_own(compiled(_native_qk), inp)},
    reference=_qk_reference,
    args=lambda inp: (inp["q"], inp["k"], inp["qw"], inp["kw"], inp["cache"], inp["pos"], inp["q"].shape[-1]),
    shape=_TOKENS,
)


def _qkv_inputs(shape, dtype, device, mode):
    """(B, S, H_model, Hq, Hk, D); a 2-D shape (tokens, hidden) from ksctl verify / plan: one
    sequence, 4 / 2 heads of 16. Weights scaled by 1/sqrt(fan-in)."""
    if len(shape) == 2:
        shape = (1, shape[0], shape[1], 4, 2, 16)
    b, s, h, hq, hk, d = shape
    grad = mode != "fwd"
    x = torch.randn(b, s, h, dtype=dtype, device=device, requires_grad=grad)
    ws = [(torch.randn(n * d, h, device=device) / h ** 0.5).to(dtype).requires_grad_(grad) for n in (hq, hk, hk)]
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
    emb = torch.outer(torch.arange(s, device=device, dtype=torch.float32), inv)
    emb = torch.cat([emb, emb], -1)
    cos, sin = emb.cos()[None].to(dtype), emb.sin()[None].to(dtype)
    cot = tuple(torch.randn(b, n, s, d, dtype=dtype, device=device) for n in (hq, hk, hk)) if grad else ()
    names = ("q", "k", "v") if not grad else ("q", "k", "v", "dx", "dw_q", "dw_k", "dw_v")
    return {"x": x, "ws": ws, "cos": cos, "sin": sin, "d": d, "wrt": (x, *ws), "cot": cot, "names": names}


def _hf_qkv(x, wq, wk, wv, cos, sin, d):  # LlamaAttention's projections, views and apply_rotary_pos_emb
    b, s, _ = x.shape
    q, k, v = (torch.nn.functional.linear(x, w).view(b, s, -1, d).transpose(1, 2) for w in (wq, wk, wv))
    return (*_hf_apply(q, k, cos, sin), v)


def _qkv_reference(inp, mode):
    leaves = [t.detach().float().requires_grad_(mode != "fwd") for t in inp["wrt"]]
    outs = _hf_qkv(*leaves, inp["cos"].float(), inp["sin"].float(), inp["d"])
    if mode == "fwd":
        return tuple(o.detach() for o in outs)
    return tuple(o.detach() for o in outs) + torch.autograd.grad(outs, leaves, [c.float() for c in inp["cot"]])


ADAPTERS["qkv_rope"] = BenchAdapter(
    inputs=_qkv_inputs,
    ours=lambda inp, mode, backend: runner(lambda: tuple(api_qkv.qkv_rope(
        inp["x"], *inp["ws"], inp["cos"], inp["sin"], head_dim=inp["d"], backend=backend)), inp, mode),
    peers=lambda inp, mode: {
        "torch-eager": runner(lambda: _hf_qkv(*inp["wrt"], inp["cos"], inp["sin"], inp["d"]), inp, mode),
        "torch.compile": runner(lambda: compiled(_hf_qkv)(*inp["wrt"], inp["cos"], inp["sin"], inp["d"]), inp, mode)},
    reference=_qkv_reference,
    args=lambda inp: (inp["x"], torch.cat([w.detach() for w in inp["ws"]]), inp["cos"],
                      (inp["ws"][0].shape[0] // inp["d"], inp["ws"][1].shape[0] // inp["d"], inp["d"])),
    shape=ShapeGrammar("BxSxHIDDENxHqxHkvxD", "B sequences of S tokens of HIDDEN, projected to Hq query and Hkv "
                       "key/value heads of D"),
)
