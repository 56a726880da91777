"""fp32 reference of the embedding lookup and its backward (a deterministic scatter-add).

An id outside [0, V) (possible only when the public check was skipped: ``check_ids=False``,
torch.compile, CUDA-graph capture) behaves as in the kernels: never read, its output row NaN, and
no gradient row. Plain indexing would wrap a negative id to row V + id, or fault.
"""
from __future__ import annotations

import torch


def fwd(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """out[..., :] = weight[ids[...], :] (NaN rows for ids outside [0, V))."""
    v = weight.shape[0]
    ids = ids.long()
    ok = (ids >= 0) & (ids < v)
    if v == 0:
        return weight.new_full((*ids.shape, weight.shape[1]), float("nan"))
    out = weight[torch.where(ok, ids, torch.zeros_like(ids))]
    return torch.where(ok.unsqueeze(-1), out, torch.full_like(out, float("nan")))


def bwd(dy: torch.Tensor, ids: torch.Tensor, num_embeddings: int, weight_dtype: torch.dtype) -> torch.Tensor:
    """dweight[v] = sum of dy rows whose id is v, accumulated in fp32 (order fixed: sorted ids);
    ids outside [0, V) add nothing."""
    d = dy.shape[-1]
    acc = torch.zeros(num_embeddings, d, dtype=torch.float32, device=dy.device)
    if num_embeddings == 0:
        return acc.to(weight_dtype)
    flat_ids = ids.reshape(-1).long()
    ok = (flat_ids >= 0) & (flat_ids < num_embeddings)
    rows = torch.where(ok.unsqueeze(-1), dy.reshape(-1, d).float(), 0.0)  # (no boolean mask: no host sync)
    flat_ids = torch.where(ok, flat_ids, torch.zeros_like(flat_ids))
    order = torch.argsort(flat_ids, stable=True)
    acc.index_add_(0, flat_ids[order], rows[order])
    return acc.to(weight_dtype)
