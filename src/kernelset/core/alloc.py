"""Output allocation for kernels: plain torch.empty, or NaN-filled under KS_POISON_OUTPUTS."""
from __future__ import annotations

import torch

from . import config


def empty(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return _poisoned(torch.empty(shape, dtype=dtype, device=device))


def empty_like(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor of t's shape, dtype and device, as :func:`empty`. torch.empty_like takes
    the options from t instead of parsing them: about 1.7 us less host time per call on the CI
    CPU, which counts on the decode path (one row of RMSNorm)."""
    return _poisoned(torch.empty_like(t, memory_format=torch.contiguous_format))


def _poisoned(t: torch.Tensor) -> torch.Tensor:
    if config.get().poison_outputs:
        t.fill_(float("nan") if t.is_floating_point() else -1)
    return t
