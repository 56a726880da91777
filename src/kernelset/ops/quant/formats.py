"""FP8 formats in plain torch (any device, no kernels): what each format is, and a tensor into and
out of it, the fp32 definition that the kernels reading or writing FP8 are tested against.

A tensor is stored as ``x / scale`` computed in fp32 (IEEE division, as torch), saturated to the
format's largest finite value and rounded to nearest even, with one fp32 scale per tensor; it is
read back as ``stored * scale`` in fp32. The paged KV caches (``ops/kvcache``) and their readers
(``ops/attention``, ``ops/mla``) store e4m3.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FP8Format:
    """An 8-bit float format: its torch dtype and its largest finite value (where it saturates)."""

    dtype: torch.dtype
    max: float


E4M3 = FP8Format(torch.float8_e4m3fn, 448.0)  # 4 exponent bits, no infinities: precision (weights, KV)
E5M2 = FP8Format(torch.float8_e5m2, 57344.0)  # 5 exponent bits: range (gradients)
FP8_FORMATS = {f.dtype: f for f in (E4M3, E5M2)}

FP8 = E4M3.dtype  # the fp8 of the KV caches and their readers


def quantize(x: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """x in ``dtype``: for an FP8 dtype, x / scale in fp32 saturated to the format's range (scale
    a one-element tensor, None for 1); a plain cast for any other dtype."""
    fmt = FP8_FORMATS.get(dtype)
    if fmt is None:
        return x.to(dtype)
    s = scale.reshape(()).float() if scale is not None else 1.0
    return (x.float() / s).clamp(-fmt.max, fmt.max).to(dtype)


def dequantize(x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """x's values in fp32: times the scale for an FP8 tensor (None for 1), a plain cast otherwise."""
    if x.dtype not in FP8_FORMATS:
        return x.float()
    return x.float() * (scale.reshape(()).float() if scale is not None else 1.0)
