"""Declaration of mla_decode and its implementations.

mla_decode: fwd(q_nope, q_pe, kv_cache, block_table, seq_lens, scale, kv_scale, max_seq_len) ->
(out [B, H, R] like q_nope, lse [B, H] fp32).
"""
from __future__ import annotations

import torch

from ...core import gpus
from ...core.arch import ArchRange, device_arch
from ...core.enums import Backend
from ...core.registry import BenchCase, Cost, Impl, OpSpec, Problem, declare_op, register_impl
from ...core.support import triton_device
from . import reference as ref

MAX_RANK = 1024


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _key(q_nope, q_pe, kv_cache, block_table, seq_lens):
    return (q_nope.device, q_nope.dtype, kv_cache.dtype, q_nope.shape[1], q_nope.shape[2], q_pe.shape[2],
            kv_cache.shape[1])


def _problem(q_nope, q_pe, kv_cache, block_table, seq_lens):
    attrs = {"heads": q_nope.shape[1], "kv_lora_rank": q_nope.shape[2], "rope_dim": q_pe.shape[2],
             "block_size": kv_cache.shape[1], "cache_dtype": str(kv_cache.dtype).replace("torch.", "")}
    return Problem("mla_decode", q_nope.device, q_nope.dtype, (seq_lens.shape[0], *q_nope.shape[1:]),
                   device_arch(q_nope.device), attrs)


def _cost(shape, dtype, mode):
    """shape: (batch, context, heads, kv_lora_rank, rope_dim, block_size, cache bits)."""
    b, ctx, h, r, p, bs, bits = shape
    cache = b * ctx * (r + p) * bits // 8
    q_out = b * h * (2 * r + p) * _size(dtype)
    return Cost(cache + q_out + 4 * b * -(-ctx // bs), 2 * b * h * ctx * (2 * r + p),
                "read each sequence's latent cache rows once (all heads share them), q_nope and q_pe; write out")


def _reference(q_nope, q_pe, kv_cache, block_table, seq_lens):
    r = q_nope.shape[-1]
    return ref.mla_decode(q_nope, q_pe, kv_cache, block_table, seq_lens, (r + q_pe.shape[-1]) ** -0.5)


declare_op(OpSpec(
    name="mla_decode", family="mla",
    signature="mla_decode(q_nope, q_pe, kv_cache, block_table, seq_lens, *, scale, kv_lora_rank=512, rope_dim=64, "
              "kv_scale=None, max_seq_len=None, return_lse=False, check_bounds=True, backend='auto')",
    doc="out = softmax(scale (q_nope C^T + q_pe K_pe^T)) C over each sequence's paged latent cache [C | K_pe]",
    reference=_reference, tolerance="attention", key=_key, problem=_problem, cost=_cost,
    # (batch, context, heads, kv_lora_rank, rope_dim, block_size, cache bits): DeepSeek-V3 decode,
    # 128 heads (one GPU) and 16 (a TP-8 slice); replayed from CUDA graphs as serving engines run decode
    bench=(BenchCase((64, 4096, 128, 512, 64, 64, 16), "fwd", bar_pct=70.0, graph=True),
           BenchCase((64, 4096, 128, 512, 64, 64, 8), "fwd", graph=True),
           BenchCase((64, 4096, 16, 512, 64, 64, 16), "fwd", graph=True),
           BenchCase((4, 32768, 128, 512, 64, 64, 16), "fwd", graph=True)),
    c_abi=True,  # ks_mla_decode, since ABI 1.1
    differentiable=False,
))


def _supports(p: Problem) -> str | None:
    reason = triton_device(p, "q_nope")
    if reason:
        return reason
    if p["kv_lora_rank"] > MAX_RANK:
        return f"kv_lora_rank {p['kv_lora_rank']} > {MAX_RANK} (the accumulator would not fit in registers)"
    if p["cache_dtype"] == "float8_e4m3fn" and p.arch is not None and not gpus.has(p.arch, "fp8"):
        return f"an fp8 e4m3 cache needs {gpus.first_arch('fp8')} or newer (device is sm_{p.arch[0]}{p.arch[1]})"
    return None


def _triton(*args):
    from .launch import mla_decode
    return mla_decode(*args)


def _detail(p: Problem) -> str:
    from .launch import TUNING, wgmma_shape_reason
    why = wgmma_shape_reason(p.arch, p.device.type, p.dtype, getattr(torch, p["cache_dtype"]), p["heads"],
                             p["kv_lora_rank"], p["rope_dim"], p["block_size"], TUNING.active())
    if why is None:
        return ("kernel: warp-specialized Gluon wgmma (sm_90) under CUDA-graph capture, or eagerly from "
                f"batch x heads x max_keys >= {TUNING.active().wgmma_eager_min_work} (its launch costs more host "
                "time), if the cache rows form one 16-byte aligned 2-D view (TMA); else the Triton kernel")
    return f"kernel: Triton tl.dot (the sm_90 Gluon kernel {why})"


def _ref(q_nope, q_pe, kv_cache, block_table, seq_lens, scale, kv_scale, max_seq_len):
    out, lse = ref.mla_decode(q_nope, q_pe, kv_cache, block_table, seq_lens, scale, kv_scale, max_seq_len)
    return out.to(q_nope.dtype), lse


register_impl(Impl(op="mla_decode", backend=Backend.TRITON, forward=_triton, backward=None, supports=_supports,
                   priority=100, arch=ArchRange(min=(8, 0)), requires=("triton",), detail=_detail,
                   note="sm_90, bf16/fp16 cache, >= 64 heads: a warp-specialized Gluon kernel (TMA page tiles, "
                        "wgmma); elsewhere a head tile per program (tl.dot); latent rows read once as keys and "
                        "values, split-KV"))
register_impl(Impl(op="mla_decode", backend=Backend.REFERENCE, forward=_ref, backward=None,
                   supports=lambda p: None, priority=0, graph_safe=False,
                   note="fp32 math per sequence on the gathered latent cache (reads seq_lens on the host)"))
