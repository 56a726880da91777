"""Benchmark adapters of the attention ops.

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

from ...bench.adapter import BenchAdapter, compiled
from ..kvcache.reference import FP8, dequantize, quantize
from . import api
from . import reference as R


def _inputs(shape, dtype, device, mode):
    if len(shape) == 2:  # (batch, anything) from ksctl verify/explain: a small GQA decode
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


ADAPTERS = {
    "paged_attention": BenchAdapter(
        inputs=_inputs, ours=_ours, peers=_peers, reference=_reference,
        args=lambda inp: (inp["q"], inp["k_cache"], inp["v_cache"], inp["table"], inp["seq_lens"]),
    ),
    "merge_attn_states": BenchAdapter(
        inputs=_merge_inputs,
        ours=lambda inp, mode, backend: lambda: tuple(api.merge_attn_states(*_margs(inp), backend=backend)),
        peers=lambda inp, mode: {"torch-eager": lambda: _merge_eager(*_margs(inp)),
                                 "torch.compile": lambda: compiled(_merge_eager)(*_margs(inp))},
        reference=lambda inp, mode: R.merge_attn_states(*_margs(inp)),
        args=_margs,
    ),
}
