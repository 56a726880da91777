"""fp32 references of the attention ops: plain torch, any device (CPU included), differentiable.

Conventions (FlashAttention's):
- layout ``[..., S, H, D]``; GQA when Hq is a multiple of Hkv (query head h reads KV head
  h // (Hq / Hkv));
- queries are aligned to the end of the keys: query i of Sq sits at absolute position
  ``Sk - Sq + i`` (decode: the new token is the last cached one; chunked prefill: the chunk's
  tokens are the last Sq of the sequence);
- ``causal``: key j is visible to the query at position p iff j <= p; ``window = (left, right)``
  (-1: unbounded) keeps p - left <= j <= p + right (causal forces right = 0);
- ``softcap > 0``: s = softcap * tanh(s / softcap) on the scaled scores;
- ``sinks [Hq]`` (gpt-oss): a per-head logit joining the softmax denominator, with no value;
- lse: natural log of the softmax denominator (sink included); a row that sees no key and has no
  sink gets out = 0 and lse = -inf.
"""
from __future__ import annotations

import math

import torch

from ..quant.formats import dequantize


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True, scale: float | None = None,
              window: tuple[int, int] = (-1, -1), softcap: float = 0.0, sinks: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense attention: q ``[..., Sq, Hq, D]``, k/v ``[..., Sk, Hkv, D]`` -> (out ``[..., Sq, Hq, D]``,
    lse ``[..., Sq, Hq]``), both fp32 (fp64 stays fp64), queries aligned to the end of the keys."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v = q.to(acc), k.to(acc), v.to(acc)
    sq, hq, d = q.shape[-3:]
    sk, hkv = k.shape[-3], k.shape[-2]
    if hq % max(hkv, 1):
        raise ValueError(f"query heads {hq} are not a multiple of KV heads {hkv}")
    g = hq // hkv if hkv else 1
    k = k.repeat_interleave(g, dim=-2)
    v = v.repeat_interleave(g, dim=-2)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = torch.einsum("...qhd,...khd->...hqk", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    pos = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=q.device)[None, :]
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if right >= 0:
        keep &= j <= pos + right
    if left >= 0:
        keep &= j >= pos - left
    s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        sink = sinks.to(acc).reshape(hq, 1, 1).expand(*s.shape[:-1], 1)
        lse = torch.logsumexp(torch.cat([s, sink], dim=-1), dim=-1)
    else:
        lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    p = torch.where(torch.isneginf(lse).unsqueeze(-1), torch.zeros_like(p), p)
    out = torch.einsum("...hqk,...khd->...qhd", p, v)
    return out, lse.transpose(-1, -2)


def gather_paged(cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int,
                 scale: torch.Tensor | None = None) -> torch.Tensor:
    """The first seq_len tokens of one sequence, ``[seq_len, Hkv, D]`` fp32, from its blocks."""
    bs = cache.shape[1]
    blocks = block_table_row[: -(-seq_len // bs)].long()
    return dequantize(cache[blocks].reshape(-1, *cache.shape[2:])[:seq_len], scale)


def paged_attention(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, causal, scale, window, softcap, sinks,
                    k_scale, v_scale) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of each sequence's query tokens to its cached keys: (out like q in fp32, lse
    ``[T, Hq]``). Decode (cu_seqlens_q None): q ``[B, Hq, D]``, one token per sequence; else
    q ``[T, Hq, D]`` with sequence b's tokens at cu_seqlens_q[b]:cu_seqlens_q[b + 1]."""
    b = seq_lens.shape[0]
    lens = seq_lens.tolist()
    starts = list(range(b + 1)) if cu_seqlens_q is None else cu_seqlens_q.tolist()
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=q.device)
    for i in range(b):
        t0, t1 = starts[i], starts[i + 1]
        if t1 == t0:
            continue
        k = gather_paged(k_cache, block_table[i], lens[i], k_scale)
        v = gather_paged(v_cache, block_table[i], lens[i], v_scale)
        o, l = attention(q[t0:t1], k, v, causal=causal, scale=scale, window=window, softcap=softcap, sinks=sinks)
        out[t0:t1], lse[t0:t1] = o, l
    return out, lse


def merge_attn_states(out_a, lse_a, out_b, lse_b) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the union of two disjoint key sets from the parts: lse = logaddexp(lse_a, lse_b),
    out = (e^(lse_a - lse) out_a + e^(lse_b - lse) out_b); both empty (-inf): out 0, lse -inf.
    out ``[T, H, D]``, lse ``[T, H]``; fp32."""
    la, lb = lse_a.float(), lse_b.float()
    lse = torch.logaddexp(la, lb)
    empty = torch.isneginf(lse)
    safe = torch.where(empty, torch.zeros_like(lse), lse)
    wa = torch.where(empty, 0.0, torch.exp(la - safe)).unsqueeze(-1)
    wb = torch.where(empty, 0.0, torch.exp(lb - safe)).unsqueeze(-1)
    return wa * out_a.float() + wb * out_b.float(), lse


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal: bool = True, scale: float | None = None,
                     window: tuple[int, int] = (-1, -1), softcap: float = 0.0, sinks: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed sequences: q ``[T, Hq, D]``, k/v ``[Tk, Hkv, D(v)]``, sequence b at
    cu_seqlens[b]:cu_seqlens[b + 1] -> (out ``[T, Hq, Dv]``, lse ``[Hq, T]``), fp32; each sequence is
    :func:`attention` on its own (an empty one contributes nothing). Reads the offsets on the host."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=acc, device=q.device)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=acc, device=q.device)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        if cq[b + 1] == cq[b]:
            continue
        # slice assignment is differentiable (autograd records the copies)
        out[cq[b]:cq[b + 1]], lse[cq[b]:cq[b + 1]] = attention(
            q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]], causal=causal, scale=scale, window=window,
            softcap=softcap, sinks=sinks)
    return out, lse.transpose(0, 1)
