"""Declarations of the attention ops and their implementations.

paged_attention: fwd(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, max_seqlen_q, causal, scale,
window, softcap, sinks, k_scale, v_scale, max_seq_len) -> (out like q, lse [T, Hq] fp32).
merge_attn_states: fwd(out_a, lse_a, out_b, lse_b) -> (out, lse).

Dense prefill (flash_attention, flash_attention_varlen) and MLA decode belong here too, on the
same reference (reference.attention takes dense [..., S, H, D] inputs).
"""
from __future__ import annotations

import torch

from ...core.arch import ArchRange, device_arch
from ...core.enums import Backend
from ...core.registry import BenchCase, Cost, Impl, OpSpec, Problem, declare_op, register_impl
from ...core.support import triton_device
from . import reference as ref

_FP8_ARCH = (8, 9)  # e4m3 conversions in hardware (Ada, Hopper and newer)
MAX_HEAD_DIM = 256


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _unit(*ts: torch.Tensor) -> bool:
    return all(t.stride(-1) == 1 or t.shape[-1] <= 1 for t in ts)


def _paged_key(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q=None):
    return (q.device, q.dtype, k_cache.dtype, q.shape[-1], q.shape[1], k_cache.shape[2], k_cache.shape[1],
            cu_seqlens_q is None, _unit(q, k_cache, v_cache, block_table))


def _paged_problem(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q=None):
    attrs = {"head_dim": q.shape[-1], "q_heads": q.shape[1], "kv_heads": k_cache.shape[2],
             "block_size": k_cache.shape[1], "cache_dtype": str(k_cache.dtype).replace("torch.", ""),
             "mode": "decode" if cu_seqlens_q is None else "varlen",
             "unit_stride": _unit(q, k_cache, v_cache, block_table)}
    return Problem("paged_attention", q.device, q.dtype, (seq_lens.shape[0], *q.shape), device_arch(q.device), attrs)


def _paged_cost(shape, dtype, mode):
    """shape: (batch, context, Hq, Hkv, D, block_size, cache bits): decode, one query token each."""
    b, ctx, hq, hkv, d, bs, bits = shape
    kv = 2 * b * ctx * hkv * d * bits // 8
    return Cost(kv + 2 * b * hq * d * _size(dtype) + 4 * b * -(-ctx // bs), 4 * b * hq * ctx * d,
                "read each sequence's K and V blocks once (all query heads of a group share them), q, the block "
                "table; write out")


def _paged_reference(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q=None):
    return ref.paged_attention(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, True, None, (-1, -1), 0.0,
                               None, None, None)


declare_op(OpSpec(
    name="paged_attention", family="attention",
    signature="paged_attention(q, k_cache, v_cache, block_table, seq_lens, *, cu_seqlens_q=None, max_seqlen_q=1, "
              "causal=True, scale=None, window=(-1, -1), softcap=0.0, sinks=None, k_scale=None, v_scale=None, "
              "max_seq_len=None, return_lse=False, check_bounds=True, backend='auto')",
    doc="out = softmax(scale q K^T (+ sink)) V over each sequence's paged cache; GQA, window, softcap, fp8 KV",
    reference=_paged_reference, tolerance="attention", key=_paged_key, problem=_paged_problem, cost=_paged_cost,
    # (batch, context, Hq, Hkv, D, block_size, cache bits): Llama-3-8B decode. The fp8 case's bar is
    # 0.8x the bf16 case's: at equal time per byte it is then 1.6x faster (compare their ms).
    bench=(BenchCase((64, 4096, 32, 8, 128, 16, 16), "fwd", bar_pct=80.0),
           BenchCase((1, 32768, 32, 8, 128, 16, 16), "fwd", bar_pct=60.0),
           BenchCase((8, 32768, 32, 8, 128, 16, 16), "fwd", bar_pct=60.0),
           BenchCase((64, 4096, 32, 8, 128, 16, 8), "fwd", bar_pct=64.0),
           BenchCase((64, 4096, 64, 8, 256, 32, 16), "fwd"),
           BenchCase((32, 2048, 32, 32, 80, 16, 16), "fwd")),
    c_abi=True, differentiable=False,
))


def _paged_supports(p: Problem) -> str | None:
    reason = triton_device(p, "q")
    if reason:
        return reason
    if not p["unit_stride"]:
        return "q, a cache or block_table has a strided last dim (pass .contiguous())"
    if p["head_dim"] > MAX_HEAD_DIM:
        return f"head size {p['head_dim']} > {MAX_HEAD_DIM}"
    if p["cache_dtype"] == "float8_e4m3fn" and p.arch is not None and p.arch < _FP8_ARCH:
        return f"an fp8 e4m3 cache needs sm_89 or newer (device is sm_{p.arch[0]}{p.arch[1]})"
    return None


def _t_paged(*args):
    from .launch import paged_attention
    return paged_attention(*args)


def _r_paged(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, max_seqlen_q, causal, scale, window, softcap,
             sinks, k_scale, v_scale, max_seq_len):
    out, lse = ref.paged_attention(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, causal, scale, window,
                                   softcap, sinks, k_scale, v_scale)
    return out.to(q.dtype), lse


register_impl(Impl(op="paged_attention", backend=Backend.TRITON, forward=_t_paged, backward=None,
                   supports=_paged_supports, priority=100, arch=ArchRange(min=(8, 0)), requires=("triton",),
                   note="GQA group per program (tl.dot), split-KV with an LSE merge; graph-safe"))
register_impl(Impl(op="paged_attention", backend=Backend.REFERENCE, forward=_r_paged, backward=None,
                   supports=lambda p: None, priority=0, graph_safe=False,
                   note="fp32 math per sequence on the gathered cache (reads seq_lens on the host)"))


def _merge_key(out_a, lse_a, out_b, lse_b):
    return (out_a.device, out_a.dtype, out_b.dtype, out_a.shape[-1], _unit(out_a, out_b))


def _merge_problem(out_a, lse_a, out_b, lse_b):
    return Problem("merge_attn_states", out_a.device, out_a.dtype, tuple(out_a.shape), device_arch(out_a.device),
                   {"unit_stride": _unit(out_a, out_b)})


def _merge_cost(shape, dtype, mode):
    t, h, d = shape
    return Cost(3 * t * h * d * _size(dtype) + 3 * t * h * 4, 0, "read both parts' out and lse, write out and lse")


declare_op(OpSpec(
    name="merge_attn_states", family="attention",
    signature="merge_attn_states(out_a, lse_a, out_b, lse_b, *, backend='auto') -> (out, lse)",
    doc="lse = logaddexp(lse_a, lse_b); out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b",
    reference=ref.merge_attn_states, tolerance="elementwise", key=_merge_key, problem=_merge_problem,
    cost=_merge_cost, bench=(BenchCase((16384, 32, 128), "fwd"),), c_abi=True, differentiable=False,
))


def _merge_supports(p: Problem) -> str | None:
    reason = triton_device(p, "out_a")
    if reason is None and not p["unit_stride"]:
        return "out_a or out_b has a strided last dim (pass .contiguous())"
    return reason


def _t_merge(*args):
    from .launch import merge_attn_states
    return merge_attn_states(*args)


def _r_merge(out_a, lse_a, out_b, lse_b):
    out, lse = ref.merge_attn_states(out_a, lse_a, out_b, lse_b)
    return out.to(out_a.dtype), lse


register_impl(Impl(op="merge_attn_states", backend=Backend.TRITON, forward=_t_merge, backward=None,
                   supports=_merge_supports, priority=100, arch=ArchRange(min=(7, 0)), requires=("triton",),
                   note="rows of (token, head), any token/head strides"))
register_impl(Impl(op="merge_attn_states", backend=Backend.REFERENCE, forward=_r_merge, backward=None,
                   supports=lambda p: None, priority=0, note="fp32 math in plain torch ops; any device"))
