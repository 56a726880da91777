"""transformers' LlamaRMSNorm and apply_rotary_pos_emb as the torch ops their modules run: the
peer that the host-time scripts (train_host_ops.py, host_autograd.py) set kernelset's ops against."""
from __future__ import annotations

import torch


def hf_rms(x, w, eps=1e-5):
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return w * h.to(x.dtype)


def rotate_half(t):
    a, b = t[..., : t.shape[-1] // 2], t[..., t.shape[-1] // 2:]
    return torch.cat((-b, a), dim=-1)


def hf_rope(q, k, cos, sin):
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s
