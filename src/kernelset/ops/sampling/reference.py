"""fp32 references of the sampling family."""
from __future__ import annotations

import torch


def argmax(x: torch.Tensor) -> torch.Tensor:
    """ids[...] = argmax over x's last dim, in fp32: the first maximal index; a NaN counts as the maximum
    (the first NaN wins), as torch.argmax."""
    return torch.argmax(x.float(), dim=-1)
