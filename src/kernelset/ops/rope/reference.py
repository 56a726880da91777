"""fp32 references of the rope family: the serving-layout rotations (rotary_embedding, mrope,
qk_norm_rope; vLLM semantics, in place) and transformers' apply_rotary_pos_emb.

cos_sin_cache [max_pos, R]: cos in the first R/2 columns, sin in the last R/2. For each head of
q/k (head size D >= R) the first R features rotate: NeoX style pairs (x[i], x[i + R/2]),
GPT-J style (interleaved) pairs (x[2i], x[2i + 1]):  (a, b) -> (a cos - b sin, b cos + a sin).
"""
from __future__ import annotations

import torch

from .cache import section_index


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
    cos, sin = _cos_sin(positions, cache, None, False)  # a position outside [0, max_pos): unrotated
    for x in (q, k):
        if x is None or x.numel() == 0:  # (an empty batch: view's -1 would be ambiguous)
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


def _cos_sin(positions, cache, sections, mrope_interleaved):
    """cos, sin ``[T, 1, R/2]`` fp32 at positions ``[T]`` or ``[3, T]`` (frequency i taken from the
    row section_index(sections)[i]); an out-of-range position gives cos 1, sin 0 (no rotation)."""
    half = cache.shape[1] // 2
    pos = positions.long()
    ok = (pos >= 0) & (pos < cache.shape[0])
    rows = cache[torch.where(ok, pos, 0)].float()
    cos = torch.where(ok[..., None], rows[..., :half], 1.0)
    sin = torch.where(ok[..., None], rows[..., half:], 0.0)
    if positions.dim() == 2:
        idx = section_index(tuple(sections), mrope_interleaved, device=cache.device).expand(pos.shape[1], half)
        cos, sin = torch.gather(cos, 0, idx[None])[0], torch.gather(sin, 0, idx[None])[0]
    return cos[:, None], sin[:, None]


def mrope_fwd(positions, q, k, cache, sections, mrope_interleaved, interleaved, head_size):
    """Multimodal RoPE (Qwen2-VL / Qwen3-VL), in place: frequency i rotates by the position of its
    section (temporal, height, width); positions [T] rotate every frequency by the same one."""
    r = cache.shape[1]
    cos, sin = _cos_sin(positions, cache, sections, mrope_interleaved)
    for x in (q, k):
        if x is None or x.numel() == 0:  # (an empty batch: view's -1 would be ambiguous)
            continue
        xv = x.view(x.shape[0], -1, head_size)
        xv[..., :r] = rotate(xv[..., :r], cos, sin, interleaved).to(x.dtype)


def _rotate_rounded(x, cos, sin, interleaved, dtype):
    """transformers' ``x * cos + rotate_half(x) * sin`` in ``dtype``: cos/sin rounded to dtype, each
    product rounded, then the sum (x holds values of dtype, in fp32)."""
    def rnd(v):
        return v.to(dtype).float()
    c, s = rnd(cos), rnd(sin)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([rnd(rnd(a * c) - rnd(b * s)), rnd(rnd(b * c) + rnd(a * s))], dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([rnd(rnd(a * c) - rnd(b * s)), rnd(rnd(b * c) + rnd(a * s))], dim=-1)


def qk_norm_rope_fwd(q, k, q_weight, k_weight, cache, positions, eps, offset, cast, interleaved, head_size,
                     sections, mrope_interleaved):
    """Per-head RMSNorm over the head size D then RoPE, in place.

    y = x * rsqrt(mean(x^2) + eps) * (offset + w). cast 'fp32': fp32 throughout, one rounding;
    'llama' (Qwen3RMSNorm) rounds x * rstd to x.dtype before the weight, 'gemma' (Gemma3RMSNorm)
    multiplies in fp32; both then round the norm output and rotate as transformers'
    apply_rotary_pos_emb does in x.dtype (see _rotate_rounded).
    """
    r = cache.shape[1]
    cos, sin = _cos_sin(positions, cache, sections, mrope_interleaved)
    for x, w in ((q, q_weight), (k, k_weight)):
        if x is None or x.numel() == 0:
            continue
        dt = x.dtype
        xv = x.view(x.shape[0], -1, head_size)
        xf = xv.float()
        xn = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        wf = offset + w.float()
        if cast == "llama":
            y = (xn.to(dt).float() * wf).to(dt).float()
        elif cast == "gemma":
            y = (xn * wf).to(dt).float()
        else:
            y = xn * wf
        rot = rotate(y[..., :r], cos, sin, interleaved) if cast == "fp32" else \
            _rotate_rounded(y[..., :r], cos, sin, interleaved, dt)
        xv[..., r:] = y[..., r:].to(dt)
        xv[..., :r] = rot.to(dt)
