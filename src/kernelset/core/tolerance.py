"""The one tolerance table: bf16/fp16/fp32 error is judged by ||out - ref|| / ||ref||."""
from __future__ import annotations

import math

import torch

# class -> dtype -> (forward tolerance, gradient tolerance). Rounding one bf16 output gives
# ~2e-3 relative error and fp16 ~3e-4; the rest of the budget covers intermediate roundings
# that the op's definition implies (e.g. Llama-style casts) and reduction order.
TOLERANCES: dict[str, dict[torch.dtype, tuple[float, float]]] = {
    "norm": {torch.float32: (1e-5, 1e-4), torch.float16: (2e-3, 4e-3), torch.bfloat16: (1e-2, 1.5e-2)},
    "elementwise": {torch.float32: (1e-6, 1e-5), torch.float16: (1e-3, 2e-3), torch.bfloat16: (8e-3, 1e-2)},
    # softmax(QK^T)V: P is rounded to the storage dtype before the PV product, as every fused
    # attention kernel does; gradients go through two more such products
    "attention": {torch.float32: (1e-5, 1e-4), torch.float16: (2e-3, 5e-3), torch.bfloat16: (1e-2, 2e-2)},
    # chains of products whose intermediates are stored in the model dtype (a gated MLP: g, u, the
    # activation and h rounded, then one more product; its gradients through three more)
    "gemm": {torch.float32: (1e-5, 1e-4), torch.float16: (2e-3, 5e-3), torch.bfloat16: (1e-2, 2e-2)},
    # data movement (cache writes and block copies, an embedding's gather): the forward must be
    # exact (a copy that drops a mantissa bit is 4e-3 off in bf16, inside "elementwise"); an
    # embedding's gradient sums rows in fp32 and rounds once, as an elementwise op does
    "copy": {torch.float32: (0.0, 1e-5), torch.float16: (0.0, 2e-3), torch.bfloat16: (0.0, 1e-2)},
    # indices (argmax, sampled ids): equal to the reference's or wrong; no gradient
    "exact": {torch.float32: (0.0, 0.0), torch.float16: (0.0, 0.0), torch.bfloat16: (0.0, 0.0)},
}


def tolerance(cls: str, dtype: torch.dtype, *, grad: bool = False) -> float:
    try:
        fwd, bwd = TOLERANCES[cls][dtype]
    except KeyError:
        raise ValueError(f"no tolerance for class {cls!r} and dtype {dtype}") from None
    return bwd if grad else fwd


def rel_err(out: torch.Tensor, ref: torch.Tensor, *, chunk: int = 1 << 24) -> float:
    """||out - ref|| / ||ref|| in float64; inf if out has a NaN/inf that ref has not.

    Computed on the tensors' device, in chunks, so a benchmark's billion-element check takes
    milliseconds and no more than a few chunks of memory."""
    if out.shape != ref.shape:
        raise ValueError(f"shape mismatch: {tuple(out.shape)} vs reference {tuple(ref.shape)}")
    o, r = out.detach().reshape(-1), ref.detach().reshape(-1)
    if r.device != o.device:
        r = r.to(o.device)
    num = den = 0.0
    o_bad = r_bad = False
    for i in range(0, o.numel(), chunk):
        oc, rc = o[i:i + chunk].to(torch.float64), r[i:i + chunk].to(torch.float64)
        o_bad = o_bad or not bool(torch.isfinite(oc).all())
        r_bad = r_bad or not bool(torch.isfinite(rc).all())
        num += float((oc - rc).square().sum())
        den += float(rc.square().sum())
    if o_bad and not r_bad:
        return float("inf")
    num, den = math.sqrt(num), math.sqrt(den)
    if den == 0.0:
        return num
    return num / den
