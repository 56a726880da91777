"""fp32 reference of the fused linear cross-entropy: the logits in fp32, cross_entropy's formulas.

logits = hidden @ weight.T (+ bias), in fp32 from the inputs as given; loss and dlogits from the
cross-entropy reference (``reference.fwd``); dhidden = dlogits @ weight, dweight = dlogits.T @
hidden, dbias = sum over rows of dlogits, all in fp32, rounded once to the parameters' dtypes.
Rows are processed in blocks of about 256 MiB of fp32 logits so the reference also runs at
benchmark sizes; the blocks change nothing in the math (every sum is in fp32).
"""
from __future__ import annotations

import torch

from . import reference as ce_ref

BLOCK_BYTES = 256 << 20


def fwd(hidden, weight, bias, target, ignore_index, label_smoothing, z_loss, softcap, reduction,
        need_h, need_w, need_b, row_grad=None):
    """(loss reduced as asked, fp32; dhidden, dweight, dbias for the flags (None otherwise)).

    hidden ``[T, H]``, weight ``[V, H]``, bias ``[V]`` or None, target ``[T]``. The gradients are
    those of the reduced loss (sum/mean), or of ``sum(loss * row_grad)`` when ``row_grad`` (fp32
    ``[T]``, the upstream gradient of ``reduction='none'``) is given.
    """
    t, h = hidden.shape
    v = weight.shape[0]
    w32 = weight.float()
    b32 = bias.float() if bias is not None else None
    valid = target != ignore_index
    scale = 1.0 / valid.sum().clamp(min=1).float() if reduction == "mean" else None
    need = need_h or need_w or need_b
    loss = torch.empty(t, dtype=torch.float32, device=hidden.device)
    gh = torch.empty(t, h, dtype=torch.float32, device=hidden.device) if need_h else None
    gw = torch.zeros(v, h, dtype=torch.float32, device=hidden.device) if need_w else None
    gb = torch.zeros(v, dtype=torch.float32, device=hidden.device) if need_b else None
    rows = max(1, BLOCK_BYTES // (4 * v))
    for s in range(0, t, rows):
        e = min(t, s + rows)
        h32 = hidden[s:e].float()
        logits = h32 @ w32.t()
        if b32 is not None:
            logits = logits + b32
        loss[s:e], dz = ce_ref.fwd(logits, target[s:e], ignore_index, label_smoothing, z_loss, softcap or None,
                                   "none", need)
        if not need:
            continue
        if scale is not None:
            dz = dz * scale
        if row_grad is not None:
            dz = dz * row_grad[s:e].float().unsqueeze(-1)
        if need_h:
            gh[s:e] = dz @ w32
        if need_w:
            gw += dz.t() @ h32
        if need_b:
            gb += dz.sum(0)
    if reduction == "none":
        out = loss
    else:
        out = loss.sum() * scale if reduction == "mean" else loss.sum()
    return (out, None if gh is None else gh.to(hidden.dtype), None if gw is None else gw.to(weight.dtype),
            None if gb is None else gb.to(bias.dtype))


def bwd(grad_out, grads, reduction):
    """The stored gradients (of the reduced loss) times the incoming gradient, new tensors.

    ``reduction='none'`` reaches here only for dhidden alone (rows scale independently)."""
    out = []
    for i, g in enumerate(grads):
        if g is None:
            out.append(None)
            continue
        s = grad_out.float()
        if reduction == "none":  # per-row gradient, dhidden only
            s = s.unsqueeze(-1)
        out.append((g.float() * s).to(g.dtype))
    return tuple(out)
