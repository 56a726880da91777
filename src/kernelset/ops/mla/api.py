"""Public MLA decode op and its custom op.

What is checked where: always on the host without reading device data (types, dtypes, shapes,
devices, strides, scale, kv_lora_rank / rope_dim against the cache width, the fp8 scale);
``check_bounds`` (default on; one host sync; skipped under CUDA-graph capture and torch.compile):
seq_lens within [0, max_seq_len] and every block id a sequence uses within [0, num_blocks);
always on the device: a bad block id or a sequence the launch cannot serve gives that sequence
NaN output, and nothing is read outside the cache or the block table.
"""
from __future__ import annotations

from typing import Optional

import torch

from ...core import checks, dispatch
from ...core.autograd import forward_only
from ...core.enums import AUTO, Backend
from ...core.errors import ArgumentError
from ..attention.api import AttentionOutput, _check_bounds, _hot_path
from ..kvcache.api import check_scale
from ..quant.formats import FP8
from . import backends  # noqa: F401  (declares the op and registers its implementations)

_HALF = (torch.float16, torch.bfloat16)
_CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, FP8)


def _int(op: str, name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ArgumentError(op, name, f"an int >= {low}", repr(value))
    return value


def mla_decode(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
               seq_lens: torch.Tensor, *, scale: float, kv_lora_rank: int = 512, rope_dim: int = 64,
               kv_scale: torch.Tensor | None = None, max_seq_len: int | None = None, return_lse: bool = False,
               check_bounds: bool = True, backend: Backend | str = AUTO) -> torch.Tensor | AttentionOutput:
    """Multi-head latent attention decode (DeepSeek-V2/V3), weight-absorbed, over a paged latent cache.

    s_j = scale (q_nope . c_j + q_pe . k_pe_j), out = softmax(s) C, fp32 accumulation, per sequence
    and head. q_nope ``[B, H, R]`` (the query already multiplied by W_UK; R = kv_lora_rank), q_pe
    ``[B, H, P]`` (P = rope_dim, RoPE applied); kv_cache ``[num_blocks, block_size, R + P]`` holding
    each token's latent c (first R) and rotary key k_pe (last P), bf16/fp16/fp32 or fp8 e4m3 with a
    scalar fp32 ``kv_scale``; block_table ``[B, max_blocks]`` int32, seq_lens ``[B]`` int32. ``scale``
    is DeepSeek's softmax scale (1/sqrt(qk_nope + qk_rope head dims), times mscale^2 under YaRN).
    ``max_seq_len`` (default: the block table's capacity) bounds seq_lens and sizes the split-KV
    scratch, so the call is CUDA-graph capturable. Returns out ``[B, H, R]`` (latent space: apply
    W_UV after), or (out, lse ``[B, H]`` fp32) with ``return_lse``. A sequence of length 0 gets
    out 0 and lse -inf.
    """
    op = "mla_decode"
    checks.tensor(op, "q_nope", q_nope, min_ndim=3)
    if q_nope.dim() != 3:
        raise ArgumentError(op, "q_nope", "3-D [B, H, kv_lora_rank]", f"shape {tuple(q_nope.shape)}")
    b, h, r = q_nope.shape
    checks.tensor(op, "q_pe", q_pe, min_ndim=3)
    checks.same_dtype(op, "q_pe", q_pe, "q_nope", q_nope)
    checks.same_device(op, "q_pe", q_pe, "q_nope", q_nope)
    kv_lora_rank = _int(op, "kv_lora_rank", kv_lora_rank, 1)
    rope_dim = _int(op, "rope_dim", rope_dim, 1)
    if r != kv_lora_rank:
        raise ArgumentError(op, "q_nope", f"[B, H, kv_lora_rank={kv_lora_rank}]", f"shape {tuple(q_nope.shape)}")
    checks.shape(op, "q_pe", q_pe, (b, h, rope_dim), "[B, H, rope_dim] like q_nope")
    for name, x in (("q_nope", q_nope), ("q_pe", q_pe)):
        if x.stride(-1) != 1 and x.shape[-1] > 1:
            raise ArgumentError(op, name, "unit-stride in its last dim", f"strides {x.stride()}")
    checks.tensor(op, "kv_cache", kv_cache, dtypes=_CACHE_DTYPES, min_ndim=3)
    if kv_cache.dim() != 3 or kv_cache.shape[2] != r + rope_dim or kv_cache.shape[1] == 0:
        raise ArgumentError(op, "kv_cache", f"[num_blocks, block_size >= 1, kv_lora_rank + rope_dim = {r + rope_dim}]",
                            f"shape {tuple(kv_cache.shape)}")
    if kv_cache.stride(-1) != 1:
        raise ArgumentError(op, "kv_cache", "unit-stride in its last dim", f"strides {kv_cache.stride()}")
    if kv_cache.dtype == FP8:
        if q_nope.dtype not in _HALF:
            raise ArgumentError(op, "q_nope", "float16 or bfloat16 with an fp8 cache", str(q_nope.dtype))
    else:
        checks.same_dtype(op, "kv_cache", kv_cache, "q_nope", q_nope)
    checks.same_device(op, "kv_cache", kv_cache, "q_nope", q_nope)
    checks.tensor(op, "block_table", block_table, dtypes=(torch.int32,), min_ndim=2)
    checks.tensor(op, "seq_lens", seq_lens, dtypes=(torch.int32,))
    if seq_lens.dim() != 1 or seq_lens.shape[0] != b:
        raise ArgumentError(op, "seq_lens", f"[B={b}] like q_nope", f"shape {tuple(seq_lens.shape)}")
    if block_table.dim() != 2 or block_table.shape[0] != b:
        raise ArgumentError(op, "block_table", f"[B={b}, max_blocks]", f"shape {tuple(block_table.shape)}")
    for name, x in (("block_table", block_table), ("seq_lens", seq_lens)):
        checks.same_device(op, name, x, "q_nope", q_nope)
    if block_table.stride(1) != 1 and block_table.shape[1] > 1:
        block_table = block_table.contiguous()
    seq_lens = seq_lens.contiguous()
    scale = checks.positive(op, "scale", scale)
    kv_scale = check_scale(op, "kv_scale", kv_scale, kv_cache, "kv_cache")
    nb, bs, _ = kv_cache.shape
    capacity = block_table.shape[1] * bs
    if max_seq_len is None:
        max_seq_len = capacity
    else:
        max_seq_len = _int(op, "max_seq_len", max_seq_len, 0)
    max_seq_len = min(max_seq_len, capacity)
    if check_bounds and b and not _hot_path(q_nope):
        _check_bounds(op, block_table, seq_lens, None, 1, b, nb, bs, max_seq_len)
    args = (q_nope, q_pe, kv_cache, block_table, seq_lens, scale, kv_scale, max_seq_len)
    if torch.compiler.is_compiling():
        out, lse = torch.ops.kernelset.mla_decode(*args, str(backend))
    else:
        # forward only: a recording call (q requiring grad) gets a node whose backward raises, not
        # an output whose gradient the Triton backend drops and the reference computes
        out, lse = forward_only(op, "an inference op (decode)", dispatch.select(op, backend, args[:5], {}).forward,
                                *args)
    return AttentionOutput(out, lse) if return_lse else out


@torch.library.custom_op("kernelset::mla_decode", mutates_args=())
def _mla_op(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
            seq_lens: torch.Tensor, scale: float, kv_scale: Optional[torch.Tensor], max_seq_len: int,
            backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    impl = dispatch.select("mla_decode", backend, (q_nope, q_pe, kv_cache, block_table, seq_lens), {})
    return impl.forward(q_nope, q_pe, kv_cache, block_table, seq_lens, scale, kv_scale, max_seq_len)


@_mla_op.register_fake
def _(q_nope, q_pe, kv_cache, block_table, seq_lens, scale, kv_scale, max_seq_len, backend):
    return q_nope.new_empty(q_nope.shape), q_nope.new_empty(q_nope.shape[:2], dtype=torch.float32)
