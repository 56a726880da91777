"""The one tolerance table: bf16/fp16/fp32 error is judged by ||out - ref|| / ||ref||."""
from __future__ import annotations

import torch

# class -> dtype -> (forward tolerance, gradient tolerance). Rounding one bf16 output gives
# ~2e-3 relative error and fp16 ~3e-4; the rest of the budget covers intermediate roundings
# that the op's definition implies (e.g. Llama-style casts) and reduction order.
TOLERANCES: dict[str, dict[torch.dtype, tuple[float, float]]] = {
    "norm": {torch.float32: (1e-5, 1e-4), torch.float16: (2e-3, 4e-3), torch.bfloat16: (1e-2, 1.5e-2)},
    "elementwise": {torch.float32: (1e-6, 1e-5), torch.float16: (1e-3, 2e-3), torch.bfloat16: (8e-3, 1e-2)},
}


def tolerance(cls: str, dtype: torch.dtype, *, grad: bool = False) -> float:
    try:
        fwd, bwd = TOLERANCES[cls][dtype]
    except KeyError:
        raise ValueError(f"no tolerance for class {cls!r} and dtype {dtype}") from None
    return bwd if grad else fwd


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; inf if out has a NaN/inf that ref has not."""
    out64, ref64 = out.detach().to(torch.float64).cpu(), ref.detach().to(torch.float64).cpu()
    if out64.shape != ref64.shape:
        raise ValueError(f"shape mismatch: {tuple(out64.shape)} vs reference {tuple(ref64.shape)}")
    if not torch.isfinite(out64).all() and torch.isfinite(ref64).all():
        return float("inf")
    den = ref64.norm().item()
    num = (out64 - ref64).norm().item()
    if den == 0.0:
        return num
    return num / den
