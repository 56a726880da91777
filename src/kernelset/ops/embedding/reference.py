"""fp32 reference of the embedding lookup and its backward (a deterministic scatter-add)."""
from __future__ import annotations

import torch


def fwd(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """out[..., :] = weight[ids[...], :]."""
    return weight[ids.long()]


def bwd(dy: torch.Tensor, ids: torch.Tensor, num_embeddings: int, weight_dtype: torch.dtype) -> torch.Tensor:
    """dweight[v] = sum of dy rows whose id is v, accumulated in fp32 (order fixed: sorted ids)."""
    d = dy.shape[-1]
    flat_ids = ids.reshape(-1).long()
    order = torch.argsort(flat_ids, stable=True)
    acc = torch.zeros(num_embeddings, d, dtype=torch.float32, device=dy.device)
    acc.index_add_(0, flat_ids[order], dy.reshape(-1, d).float()[order])
    return acc.to(weight_dtype)
