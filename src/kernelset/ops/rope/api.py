"""Public rotary_embedding (serving layout, in place) and its custom op."""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ...core import checks, dispatch
from ...core.enums import AUTO, Backend
from ...core.errors import ArgumentError
from . import backends  # noqa: F401  (declares the op and registers its implementations)


class RotaryOutput(NamedTuple):
    q: torch.Tensor
    k: Optional[torch.Tensor]


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor | None, cos_sin_cache: torch.Tensor,
                     *, interleaved: bool = False, rotary_dim: int | None = None, head_size: int | None = None,
                     backend: Backend | str = AUTO) -> RotaryOutput:
    """Rotate q ``[T, Hq, D]`` / ``[T, Hq*D]`` and k in place at ``positions [T]`` (vLLM semantics).

    cos_sin_cache ``[max_pos, R]`` holds cos in its first R/2 columns and sin in the last R/2; the
    first R = rotary_dim features of each head rotate (partial rotary when R < D), NeoX style
    (x[i], x[i + R/2]) or, with ``interleaved``, GPT-J style (x[2i], x[2i+1]). fp32 math. A
    position outside [0, max_pos) leaves its token unrotated. Returns ``(q, k)`` themselves.
    """
    op = "rotary_embedding"
    checks.tensor(op, "positions", positions, dtypes=(torch.int64, torch.int32))
    checks.tensor(op, "q", q, min_ndim=2)
    checks.tensor(op, "cos_sin_cache", cos_sin_cache, min_ndim=2)
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] % 2:
        raise ArgumentError(op, "cos_sin_cache", "2-D [max_pos, rotary_dim] with an even rotary_dim",
                            f"shape {tuple(cos_sin_cache.shape)}")
    r = cos_sin_cache.shape[1]
    if rotary_dim is not None and rotary_dim != r:
        raise ArgumentError(op, "rotary_dim", f"cos_sin_cache.shape[1] ({r})", rotary_dim)
    if q.dim() == 3:
        hs = q.shape[2]
        if head_size is not None and head_size != hs:
            raise ArgumentError(op, "head_size", f"q.shape[-1] ({hs}) for a 3-D q", head_size)
    elif q.dim() == 2:
        if head_size is None:
            raise ArgumentError(op, "head_size", "given when q is 2-D [T, H * D]", None)
        hs = head_size
    else:
        raise ArgumentError(op, "q", "[T, H, D] or [T, H * D]", f"shape {tuple(q.shape)}")
    if hs < r or (q.shape[-1] if q.dim() == 2 else hs) % hs:
        raise ArgumentError(op, "q", f"heads of size {hs} >= rotary_dim {r}", f"shape {tuple(q.shape)}")
    checks.shape(op, "positions", positions, (q.shape[0],), "one position per token")
    for name, t in (("positions", positions), ("cos_sin_cache", cos_sin_cache)):
        checks.same_device(op, name, t, "q", q)
    if k is not None:
        checks.tensor(op, "k", k, min_ndim=2)
        checks.same_dtype(op, "k", k, "q", q)
        checks.same_device(op, "k", k, "q", q)
        if k.shape[0] != q.shape[0] or k[0].numel() % hs:
            raise ArgumentError(op, "k", f"[T={q.shape[0]}, Hk, {hs}] or [T, Hk * {hs}]", f"shape {tuple(k.shape)}")
    if torch.compiler.is_compiling():
        torch.ops.kernelset.rotary_embedding_(positions, q, k, cos_sin_cache, interleaved, hs, str(backend))
    else:
        dispatch.select(op, backend, (positions, q, k, cos_sin_cache, hs), {}).forward(
            positions, q, k, cos_sin_cache, interleaved, hs)
    return RotaryOutput(q, k)


@torch.library.custom_op("kernelset::rotary_embedding_", mutates_args=("q", "k"))
def _rope_op(positions: torch.Tensor, q: torch.Tensor, k: Optional[torch.Tensor], cos_sin_cache: torch.Tensor,
             interleaved: bool, head_size: int, backend: str) -> None:
    dispatch.select("rotary_embedding", backend, (positions, q, k, cos_sin_cache, head_size), {}).forward(
        positions, q, k, cos_sin_cache, interleaved, head_size)


@_rope_op.register_fake
def _(positions, q, k, cos_sin_cache, interleaved, head_size, backend):
    return None
