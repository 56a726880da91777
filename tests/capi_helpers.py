"""Shared by tests/test_capi_ops2.py and tests/test_capi_dispatch.py: descriptors for the C ABI."""
from __future__ import annotations

import torch

from kernelset import capi


def on_cuda(t: torch.Tensor) -> capi.DLTensor:
    """t's descriptor claiming CUDA memory: only for calls that are refused before any data is
    touched (mixed devices) and for queries (which read no data)."""
    dl = capi.to_dltensor(t)
    dl.device = capi._abi.DLDevice(capi._abi.KDL_CUDA, 0)
    return dl
