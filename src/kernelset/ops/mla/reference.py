"""fp32 reference of MLA decode (DeepSeek-V2/V3 multi-head latent attention, weight-absorbed).

Per sequence b and head h, over the sequence's cached tokens j (latent c_j = cache[j, :R], rotary
key k_j = cache[j, R:]):  s_j = scale (q_nope . c_j + q_pe . k_j),  out = sum_j softmax(s)_j c_j.
The output stays in the latent space ([B, H, R]); the caller applies W_UV.
"""
from __future__ import annotations

import torch

from ..attention.reference import gather_paged


def mla_decode(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
               seq_lens: torch.Tensor, scale: float, kv_scale: torch.Tensor | None = None,
               max_seq_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out ``[B, H, R]`` fp32, lse ``[B, H]`` fp32 natural log). A sequence of length 0 gets out 0,
    lse -inf. ``kv_scale``: the per-tensor scale of an fp8 cache (values = stored * scale).
    As the kernel (unchecked input, check_bounds=False): a sequence longer than ``max_seq_len`` or
    the block table's capacity, or one of whose used block ids is outside [0, num_blocks), gets
    NaN out and lse; nothing is read for it (a negative id would index from the end)."""
    b, h, r = q_nope.shape
    nb, bs = kv_cache.shape[0], kv_cache.shape[1]
    max_keys = block_table.shape[1] * bs
    if max_seq_len is not None:
        max_keys = min(max_keys, max_seq_len)
    out = torch.zeros(b, h, r, dtype=torch.float32, device=q_nope.device)
    lse = torch.full((b, h), float("-inf"), dtype=torch.float32, device=q_nope.device)
    for i, n in enumerate(seq_lens.tolist()):
        if n <= 0:
            continue
        blocks = block_table[i, : -(-n // bs)]
        if n > max_keys or bool(((blocks < 0) | (blocks >= nb)).any()):
            out[i], lse[i] = float("nan"), float("nan")
            continue
        kv = gather_paged(kv_cache, block_table[i], n, kv_scale)  # [n, R + P] fp32
        c, k_pe = kv[:, :r], kv[:, r:]
        s = (q_nope[i].float() @ c.T + q_pe[i].float() @ k_pe.T) * scale  # [H, n]
        lse[i] = torch.logsumexp(s, dim=-1)
        out[i] = torch.exp(s - lse[i, :, None]) @ c
    return out, lse
