"""fp32 reference of the serving-layout rotary embedding (vLLM semantics), in place.

cos_sin_cache [max_pos, R]: cos in the first R/2 columns, sin in the last R/2. For each head of
q/k (head size D >= R) the first R features rotate: NeoX style pairs (x[i], x[i + R/2]),
GPT-J style (interleaved) pairs (x[2i], x[2i + 1]):  (a, b) -> (a cos - b sin, b cos + a sin).
"""
from __future__ import annotations

import torch


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x [T, H, R] rotated by cos/sin [T, 1, R/2], fp32 math."""
    xf = x.float()
    if interleaved:
        a, b = xf[..., 0::2], xf[..., 1::2]
        return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    half = xf.shape[-1] // 2
    a, b = xf[..., :half], xf[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def fwd(positions, q, k, cache, interleaved, head_size):
    r = cache.shape[1]
    cs = cache[positions.long()].float()
    cos, sin = cs[:, None, : r // 2], cs[:, None, r // 2:]
    for x in (q, k):
        if x is None:
            continue
        xv = x.view(x.shape[0], -1, head_size)
        xv[..., :r] = rotate(xv[..., :r], cos, sin, interleaved).to(x.dtype)


def apply(x, cos, sin, interleaved, rotary_dim, unsqueeze_dim, sign=1.0):
    """transformers' apply_rotary_pos_emb on one tensor, fp32 math, out of place; ``sign=-1``
    rotates backwards (the gradient)."""
    c = cos.unsqueeze(unsqueeze_dim - 1 if cos.dim() == 2 else unsqueeze_dim).float()
    s = sin.unsqueeze(unsqueeze_dim - 1 if sin.dim() == 2 else unsqueeze_dim).float() * sign
    xr, xp = x[..., :rotary_dim].float(), x[..., rotary_dim:]
    if interleaved:
        rh = torch.stack([-xr[..., 1::2], xr[..., 0::2]], dim=-1).flatten(-2)
    else:
        rh = torch.cat([-xr[..., rotary_dim // 2:], xr[..., : rotary_dim // 2]], -1)
    return torch.cat([(xr * c + rh * s).to(x.dtype), xp], -1)
