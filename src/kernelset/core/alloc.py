"""Output allocation for kernels: plain torch.empty, or NaN-filled under KS_POISON_OUTPUTS."""
from __future__ import annotations

import torch

from . import config


def empty(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype, device=device)
    if config.get().poison_outputs:
        t.fill_(float("nan") if t.is_floating_point() else -1)
    return t
