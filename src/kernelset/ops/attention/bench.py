"""Benchmark adapters of the attention ops.

flash_attention shape: (batch, seq, Hq, Hkv, D, causal 0/1), Sq = Sk; peers: SDPA pinned to each of its
cuDNN / flash / efficient backends (``sdpa_kernel``) and flash_attn's ``flash_attn_func``, forward or
forward + backward through autograd; the fp32 reference runs one (batch, KV head) at a time.
flash_attention_varlen: B packed sequences of lengths in [S/4, S]; peer flash_attn_varlen_func.

paged_attention shape: (batch, context, Hq, Hkv, D, block_size, cache bits), decode (one query
token per sequence, every sequence ``context`` long). The caches hold exactly the batch's blocks
(plus one), handed out in a random permutation: the scattered layout of a serving engine after a
while. Peers: SDPA on the contiguous cache ``[B, Hkv, ctx, D]`` gathered beforehand (untimed; the
ceiling of a non-paged decode), flash_attn's ``flash_attn_with_kvcache`` and FlashInfer's batch
decode on the same paged cache, when importable. fp8 caches: the peers get the dequantized
bf16 cache (they have no e4m3 path here); the reference is fp32 on the dequantized values.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...bench.adapter import BenchAdapter, ShapeGrammar, compiled, runner
from ..quant.formats import FP8, dequantize, quantize
from . import api
from . import reference as R


def _inputs(shape, dtype, device, mode):
    if len(shape) == 2:  # (batch, anything) from ksctl verify / plan: a small GQA decode
        shape = (min(shape[0], 4), 77, 4, 2, 64, 16, 16)
    b, ctx, hq, hkv, d, bs, bits = shape
    per_seq = -(-ctx // bs)
    nb = b * per_seq + 1
    fp8 = bits == 8
    scales = (torch.tensor(0.02, device=device), torch.tensor(0.02, device=device)) if fp8 else (None, None)
    cdt = FP8 if fp8 else dtype
    k_cache = quantize(torch.randn(nb, bs, hkv, d, device=device, dtype=dtype), scales[0], cdt)
    v_cache = quantize(torch.randn(nb, bs, hkv, d, device=device, dtype=dtype), scales[1], cdt)
    table = torch.randperm(nb, device=device)[: b * per_seq].view(b, per_seq).int().contiguous()
    seq_lens = torch.full((b,), ctx, dtype=torch.int32, device=device)
    q = torch.randn(b, hq, d, device=device, dtype=dtype)
    return {"q": q, "k_cache": k_cache, "v_cache": v_cache, "table": table, "seq_lens": seq_lens, "scales": scales,
            "ctx": ctx, "names": ("out",)}


def _contiguous(cache, table, ctx, scale, dtype):
    """[B, Hkv, ctx, D] in the query dtype: what a non-paged decode would read."""
    b = table.shape[0]
    x = cache[table.long()].reshape(b, -1, *cache.shape[2:])[:, :ctx]
    return dequantize(x, scale).to(dtype).transpose(1, 2).contiguous() if cache.dtype == FP8 else \
        x.transpose(1, 2).contiguous()


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True).squeeze(2)


def _peers(inp, mode):
    q, dtype = inp["q"], inp["q"].dtype
    peers: dict = {}
    k = _contiguous(inp["k_cache"], inp["table"], inp["ctx"], inp["scales"][0], dtype)
    v = _contiguous(inp["v_cache"], inp["table"], inp["ctx"], inp["scales"][1], dtype)
    peers["sdpa-contiguous"] = lambda: (_sdpa(q, k, v),)
    kc, vc = inp["k_cache"], inp["v_cache"]
    if kc.dtype == FP8:
        kc, vc = dequantize(kc, inp["scales"][0]).to(dtype), dequantize(vc, inp["scales"][1]).to(dtype)
    try:
        from flash_attn import flash_attn_with_kvcache
        if kc.shape[1] % 256:
            peers["flash_attn"] = f"flash_attn's paged KV needs block_size % 256 == 0 (have {kc.shape[1]})"
        else:
            peers["flash_attn"] = lambda: (flash_attn_with_kvcache(
                q.unsqueeze(1), kc, vc, cache_seqlens=inp["seq_lens"], block_table=inp["table"],
                causal=True).squeeze(1),)
    except Exception as exc:
        peers["flash_attn"] = f"flash_attn not importable ({type(exc).__name__})"
    try:
        peers["flashinfer"] = _flashinfer(q, kc, vc, inp)
    except Exception as exc:
        peers["flashinfer"] = f"flashinfer unavailable ({type(exc).__name__}: {str(exc)[:80]})"
    return peers


def _flashinfer(q, kc, vc, inp):
    import flashinfer
    b, per_seq = inp["table"].shape
    bs = kc.shape[1]
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device=q.device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    indptr = torch.arange(b + 1, dtype=torch.int32, device=q.device) * per_seq
    last = (inp["seq_lens"] - 1) % bs + 1
    wrapper.plan(indptr, inp["table"].reshape(-1), last.int(), q.shape[1], kc.shape[2], q.shape[2], bs,
                 q_data_type=q.dtype, kv_data_type=kc.dtype)
    return lambda: (wrapper.run(q, (kc, vc)),)


def _reference(inp, mode):
    out, _ = R.paged_attention(inp["q"], inp["k_cache"], inp["v_cache"], inp["table"], inp["seq_lens"], None, True,
                               None, (-1, -1), 0.0, None, *inp["scales"])
    return (out,)


def _ours(inp, mode, backend):
    max_len = inp["ctx"]
    args = (inp["q"], inp["k_cache"], inp["v_cache"], inp["table"], inp["seq_lens"])
    ks_, vs_ = inp["scales"]
    return lambda: (api.paged_attention(*args, k_scale=ks_, v_scale=vs_, max_seq_len=max_len, check_bounds=False,
                                        backend=backend),)


def _merge_inputs(shape, dtype, device, mode):
    t, h, d = (shape[0], 2, 64) if len(shape) == 2 else shape
    lse_a, lse_b = torch.randn(t, h, device=device) * 4, torch.randn(t, h, device=device) * 4
    return {"oa": torch.randn(t, h, d, device=device, dtype=dtype), "la": lse_a,
            "ob": torch.randn(t, h, d, device=device, dtype=dtype), "lb": lse_b, "names": ("out", "lse")}


def _merge_eager(oa, la, ob, lb):
    lse = torch.logaddexp(la, lb)
    wa, wb = torch.exp(la - lse).unsqueeze(-1), torch.exp(lb - lse).unsqueeze(-1)
    return (wa * oa.float() + wb * ob.float()).to(oa.dtype), lse


def _margs(inp):
    return inp["oa"], inp["la"], inp["ob"], inp["lb"]


# ---- flash_attention: shape (batch, seq, Hq, Hkv, D, causal 0/1), Sq = Sk -------------------------


def _flash_inputs(shape, dtype, device, mode):
    if len(shape) == 2:  # (batch, anything) from ksctl verify / plan: a small causal GQA prefill
        shape = (min(shape[0], 2), 77, 4, 2, 64, 1)
    b, s, hq, hkv, d, causal = shape
    grad = mode != "fwd"
    q = torch.randn(b, s, hq, d, device=device, dtype=dtype, requires_grad=grad)
    k = torch.randn(b, s, hkv, d, device=device, dtype=dtype, requires_grad=grad)
    v = torch.randn(b, s, hkv, d, device=device, dtype=dtype, requires_grad=grad)
    inp = {"q": q, "k": k, "v": v, "causal": bool(causal), "names": ("out",) if not grad else ("out", "dq", "dk", "dv")}
    if grad:
        inp["wrt"] = (q, k, v)
        inp["cot"] = (torch.randn(b, s, hq, d, device=device, dtype=dtype),)
    return inp


def _sdpa_peer(inp, mode, which):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v, causal = inp["q"], inp["k"], inp["v"], inp["causal"]
    gqa = {"enable_gqa": True} if q.shape[2] != k.shape[2] else {}
    backend = getattr(SDPBackend, which)

    def fn():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=causal, **gqa).transpose(1, 2)
    return runner(fn, inp, mode)


def _flash_peers(inp, mode):
    peers: dict = {}
    for name, which in (("sdpa-cudnn", "CUDNN_ATTENTION"), ("sdpa-flash", "FLASH_ATTENTION"),
                        ("sdpa-efficient", "EFFICIENT_ATTENTION")):
        peers[name] = _sdpa_peer(inp, mode, which)
    try:
        from flash_attn import flash_attn_func
        peers["flash_attn"] = runner(lambda: flash_attn_func(inp["q"], inp["k"], inp["v"], causal=inp["causal"]),
                                     inp, mode)
    except Exception as exc:
        peers["flash_attn"] = f"flash_attn not importable ({type(exc).__name__})"
    return peers


def _flash_reference(inp, mode):
    """fp32 reference one (batch, KV head) group at a time: S x S fp32 scores of every head at once
    would not fit at S = 16384."""
    q, k, v, causal = inp["q"], inp["k"], inp["v"], inp["causal"]
    b, s, hq, d = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    out = torch.empty(b, s, hq, d, device=q.device)
    grads = [torch.empty(t.shape, device=q.device) for t in (q, k, v)] if mode != "fwd" else None
    for i in range(b):
        for h in range(hkv):
            hs = slice(h * g, (h + 1) * g)
            with torch.enable_grad():
                qi = q[i:i + 1, :, hs].detach().float().requires_grad_(mode != "fwd")
                ki = k[i:i + 1, :, h:h + 1].detach().float().requires_grad_(mode != "fwd")
                vi = v[i:i + 1, :, h:h + 1].detach().float().requires_grad_(mode != "fwd")
                o, _ = R.attention(qi, ki, vi, causal=causal)
                out[i:i + 1, :, hs] = o.detach()
                if grads is not None:
                    dq, dk, dv = torch.autograd.grad(o, (qi, ki, vi), inp["cot"][0][i:i + 1, :, hs].float())
                    grads[0][i:i + 1, :, hs], grads[1][i:i + 1, :, h:h + 1] = dq, dk
                    grads[2][i:i + 1, :, h:h + 1] = dv
    return (out,) if grads is None else (out, *grads)


def _flash_ours(inp, mode, backend):
    q, k, v, causal = inp["q"], inp["k"], inp["v"], inp["causal"]
    return runner(lambda: api.flash_attention(q, k, v, causal=causal, backend=backend), inp, mode)


def _varlen_inputs(shape, dtype, device, mode):
    """Packed: B sequences of lengths spread over [S/4, S] (fixed seed), k/v packed alike."""
    if len(shape) == 2:
        shape = (min(shape[0], 3), 77, 4, 2, 64, 1)
    b, s, hq, hkv, d, causal = shape
    gen = torch.Generator().manual_seed(0)
    lens = torch.randint(max(1, s // 4), s + 1, (b,), generator=gen)
    cu = torch.zeros(b + 1, dtype=torch.int32)
    cu[1:] = lens.cumsum(0)
    t = int(cu[-1])
    q = torch.randn(t, hq, d, device=device, dtype=dtype)
    k = torch.randn(t, hkv, d, device=device, dtype=dtype)
    v = torch.randn(t, hkv, d, device=device, dtype=dtype)
    return {"q": q, "k": k, "v": v, "cu": cu.to(device), "max": int(lens.max()), "causal": bool(causal),
            "names": ("out",)}


def _varlen_peers(inp, mode):
    q, k, v, cu, m, causal = inp["q"], inp["k"], inp["v"], inp["cu"], inp["max"], inp["causal"]
    try:
        from flash_attn import flash_attn_varlen_func
        return {"flash_attn": lambda: (flash_attn_varlen_func(q, k, v, cu, cu, m, m, causal=causal),)}
    except Exception as exc:
        return {"flash_attn": f"flash_attn not importable ({type(exc).__name__})"}


def _varlen_reference(inp, mode):
    """Per sequence and KV head, fp32 (bounded memory)."""
    q, k, v, cu = inp["q"], inp["k"], inp["v"], inp["cu"].tolist()
    out = torch.empty(q.shape, device=q.device)
    for i in range(len(cu) - 1):
        rows = slice(cu[i], cu[i + 1])
        out[rows] = R.attention(q[rows], k[rows], v[rows], causal=inp["causal"])[0]
    return (out,)


_HEADS = "Hq query heads, Hkv KV heads (Hq a multiple of Hkv), D head dim"
_PAGED = ShapeGrammar("BxCTXxHqxHkvxDxBLOCKxBITS", f"B decoding sequences of CTX cached tokens, {_HEADS}, BLOCK tokens "
                      "per cache block, BITS 16 (the dtype's cache) or 8 (fp8 e4m3)",
                      short=("BxCTXxHqxD", "BxCTXxHqxHkvxD"), defaults={"Hkv": "Hq", "BLOCK": 16, "BITS": 16},
                      choices={"BITS": (8, 16)})
_FLASH = ShapeGrammar("BxSxHqxHkvxDxCAUSAL", f"B sequences of S tokens (Sq = Sk), {_HEADS}, CAUSAL 1 or 0",
                      short=("BxSxHqxD", "BxSxHqxHkvxD"), defaults={"Hkv": "Hq", "CAUSAL": 1},
                      choices={"CAUSAL": (0, 1)})
_VARLEN = ShapeGrammar("BxSxHqxHkvxDxCAUSAL", f"B packed sequences of lengths in [S/4, S] (seeded), {_HEADS}, "
                       "CAUSAL 1 or 0", short=("BxSxHqxD", "BxSxHqxHkvxD"), defaults={"Hkv": "Hq", "CAUSAL": 1},
                       choices={"CAUSAL": (0, 1)})

ADAPTERS = {
    "paged_attention": BenchAdapter(
        inputs=_inputs, ours=_ours, peers=_peers, reference=_reference,
        args=lambda inp: (inp["q"], inp["k_cache"], inp["v_cache"], inp["table"], inp["seq_lens"]),
        shape=_PAGED,
    ),
    "merge_attn_states": BenchAdapter(
        inputs=_merge_inputs,
        ours=lambda inp, mode, backend: lambda: tuple(api.merge_attn_states(*_margs(inp), backend=backend)),
        peers=lambda inp, mode: {"torch-eager": lambda: _merge_eager(*_margs(inp)),
                                 "torch.compile": lambda: compiled(_merge_eager)(*_margs(inp))},
        reference=lambda inp, mode: R.merge_attn_states(*_margs(inp)),
        args=_margs,
        shape=ShapeGrammar("TxHxD", "T tokens, H heads, D head dim: two partial attention outputs and their LSEs"),
    ),
    "flash_attention": BenchAdapter(
        inputs=_flash_inputs, ours=_flash_ours, peers=_flash_peers, reference=_flash_reference,
        args=lambda inp: (inp["q"], inp["k"], inp["v"]),
        kwargs=lambda inp: {"causal": inp["causal"]},
        shape=_FLASH,
    ),
    "flash_attention_varlen": BenchAdapter(
        inputs=_varlen_inputs,
        ours=lambda inp, mode, backend: lambda: (api.flash_attention_varlen(
            inp["q"], inp["k"], inp["v"], inp["cu"], inp["cu"], inp["max"], inp["max"], causal=inp["causal"],
            check_bounds=False, backend=backend),),
        peers=_varlen_peers, reference=_varlen_reference,
        args=lambda inp: (inp["q"], inp["k"], inp["v"], inp["cu"], inp["cu"]),
        kwargs=lambda inp: {"causal": inp["causal"], "max_seqlen_q": inp["max"], "max_seqlen_k": inp["max"]},
        shape=_VARLEN,
    ),
}
