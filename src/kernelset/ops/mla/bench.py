"""Benchmark adapter of mla_decode.

Shape: (batch, context, heads, kv_lora_rank, rope_dim, block_size, cache bits), decode, every
sequence ``context`` long, its blocks handed out in a random permutation (a serving engine's
scattered cache). Peers: torch eager matmuls on the contiguous latent cache gathered beforehand
(untimed; the ceiling a non-paged implementation starts from), SDPA on the same contiguous cache
(one KV head shared by every query head, Dv = R), FlashMLA and FlashInfer's MLA wrapper when
importable. fp8 caches: the peers get the dequantized bf16 cache.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...bench.adapter import BenchAdapter, ShapeGrammar
from ..quant.formats import FP8, dequantize, quantize
from . import api
from . import reference as R


def _inputs(shape, dtype, device, mode):
    if len(shape) == 2:  # (batch, anything) from ksctl verify / plan: a small decode
        shape = (min(shape[0], 4), 77, 16, 64, 16, 16, 16)
    b, ctx, h, r, p, bs, bits = shape
    per_seq = -(-ctx // bs)
    nb = b * per_seq + 1
    fp8 = bits == 8
    kv_scale = torch.tensor(0.02, device=device) if fp8 else None
    cache = quantize(torch.randn(nb, bs, r + p, device=device, dtype=dtype), kv_scale, FP8 if fp8 else dtype)
    table = torch.randperm(nb, device=device)[: b * per_seq].view(b, per_seq).int().contiguous()
    return {"q_nope": torch.randn(b, h, r, device=device, dtype=dtype),
            "q_pe": torch.randn(b, h, p, device=device, dtype=dtype), "cache": cache, "table": table,
            "seq_lens": torch.full((b,), ctx, dtype=torch.int32, device=device), "kv_scale": kv_scale, "ctx": ctx,
            "scale": (192 ** -0.5), "names": ("out",)}


def _contiguous(inp):
    """[B, ctx, R + P] in the query dtype."""
    cache, table = inp["cache"], inp["table"]
    b = table.shape[0]
    x = cache[table.long()].reshape(b, -1, cache.shape[-1])[:, : inp["ctx"]]
    return dequantize(x, inp["kv_scale"]).to(inp["q_nope"].dtype) if cache.dtype == FP8 else x.contiguous()


def _peers(inp, mode):
    qn, qp, scale = inp["q_nope"], inp["q_pe"], inp["scale"]
    r = qn.shape[-1]
    kv = _contiguous(inp)
    q = torch.cat([qn, qp], dim=-1)

    def eager():
        s = torch.matmul(q, kv.transpose(1, 2)).float() * scale
        return (torch.matmul(torch.softmax(s, -1).to(q.dtype), kv[..., :r]),)

    def sdpa():
        return (F.scaled_dot_product_attention(q.unsqueeze(2), kv.unsqueeze(1), kv[..., :r].unsqueeze(1),
                                               scale=scale).squeeze(2),)
    peers = {"torch-eager": eager, "sdpa-contiguous": sdpa}
    try:
        peers["flash_mla"] = _flash_mla(inp)
    except Exception as exc:
        peers["flash_mla"] = f"flash_mla unavailable ({type(exc).__name__})"
    return peers


def _flash_mla(inp):
    from flash_mla import flash_mla_with_kvcache, get_mla_metadata
    qn, qp = inp["q_nope"], inp["q_pe"]
    if inp["cache"].dtype == FP8:
        return "flash_mla: no e4m3 latent cache in this comparison"
    h, r = qn.shape[1], qn.shape[2]
    meta, splits = get_mla_metadata(inp["seq_lens"], h, 1)
    q = torch.cat([qn, qp], dim=-1).unsqueeze(1)
    cache = inp["cache"].unsqueeze(2)
    return lambda: (flash_mla_with_kvcache(q, cache, inp["table"], inp["seq_lens"], r, meta, splits,
                                           softmax_scale=inp["scale"], causal=False)[0].squeeze(1),)


def _reference(inp, mode):
    out, _ = R.mla_decode(inp["q_nope"], inp["q_pe"], inp["cache"], inp["table"], inp["seq_lens"], inp["scale"],
                          inp["kv_scale"])
    return (out,)


def _ours(inp, mode, backend):
    qn, qp, r, p = inp["q_nope"], inp["q_pe"], inp["q_nope"].shape[-1], inp["q_pe"].shape[-1]
    return lambda: (api.mla_decode(qn, qp, inp["cache"], inp["table"], inp["seq_lens"], scale=inp["scale"],
                                   kv_lora_rank=r, rope_dim=p, kv_scale=inp["kv_scale"], max_seq_len=inp["ctx"],
                                   check_bounds=False, backend=backend),)


ADAPTERS = {
    "mla_decode": BenchAdapter(
        inputs=_inputs, ours=_ours, peers=_peers, reference=_reference,
        args=lambda inp: (inp["q_nope"], inp["q_pe"], inp["cache"], inp["table"], inp["seq_lens"]),
        shape=ShapeGrammar("BxCTXxHxRxPxBLOCKxBITS", "B decoding sequences of CTX cached tokens, H query heads, R "
                           "kv_lora_rank, P rope dim, BLOCK tokens per cache block, BITS 16 (the dtype's cache) "
                           "or 8 (fp8 e4m3)", short=("BxCTXxHxRxP",), defaults={"BLOCK": 64, "BITS": 16},
                           choices={"BITS": (8, 16)}),
    ),
}
