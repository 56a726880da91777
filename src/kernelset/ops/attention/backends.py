"""Declarations of the attention ops and their implementations.

paged_attention: fwd(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, max_seqlen_q, causal, scale,
window, softcap, sinks, k_scale, v_scale, max_seq_len) -> (out like q, lse [T, Hq] fp32).
merge_attn_states: fwd(out_a, lse_a, out_b, lse_b) -> (out, lse).

flash_attention / flash_attention_varlen: fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
causal, scale, window, softcap, sinks, need_lse) -> (out, lse); bwd(dout, q, k, v, out, lse, cu_seqlens_q,
cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, window, softcap, sinks) -> (dq, dk, dv, dsinks or None).
Candidates: our Triton kernels, SDPA's cuDNN / flash / efficient backends (dense only; inference, or training
through SDPA's own autograd: api._run, sdpa_train),
flash_attn (when importable) and the fp32 reference; AUTO follows the measured table
(dispatch_table.py) where a row matches, the priorities otherwise (see _table_reason).
"""
from __future__ import annotations

import functools

import torch

from ...core import gpus
from ...core.alloc import empty
from ...core.arch import ArchRange, device_arch
from ...core.autograd import needs_grad
from ...core.enums import Backend, KsEnum
from ...core.registry import BenchCase, Cost, Impl, OpSpec, Problem, declare_op, register_impl
from ...core.support import triton_device
from . import reference as ref

MAX_HEAD_DIM = 256


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _unit(*ts: torch.Tensor) -> bool:
    for t in ts:  # a loop, not all(generator): this runs in every attention call's dispatch key
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            return False
    return True


def _aligned16(*ts: torch.Tensor) -> bool:
    """Every data pointer and every stride (in bytes) of a dim longer than 1 a multiple of 16: what
    SDPA's CUDA kernels assume without checking (on an H100 with torch 2.11, misaligned bf16 views
    such as ``buf[1:]`` or ``[..., :64]`` of 65-wide rows gave cuDNN wrong results with no error,
    flash a misaligned-address fault, the efficient kernel "no kernel found")."""
    for t in ts:  # a loop: this runs in every attention call's dispatch key
        if t.data_ptr() % 16:
            return False
        e = t.element_size()
        for st, n in zip(t.stride(), t.shape):
            if n > 1 and st != 1 and (st * e) % 16:
                return False
    return True


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
    # decode steps replay from CUDA graphs in serving engines: timed that way (graph=True), so a
    # 50-us kernel is not measured as host launch overhead
    bench=(BenchCase((64, 4096, 32, 8, 128, 16, 16), "fwd", bar_pct=80.0, graph=True),
           BenchCase((1, 32768, 32, 8, 128, 16, 16), "fwd", bar_pct=60.0, graph=True),
           BenchCase((8, 32768, 32, 8, 128, 16, 16), "fwd", bar_pct=60.0, graph=True),
           BenchCase((64, 4096, 32, 8, 128, 16, 8), "fwd", bar_pct=64.0, graph=True),
           BenchCase((64, 4096, 64, 8, 256, 32, 16), "fwd", graph=True),
           BenchCase((32, 2048, 32, 32, 80, 16, 16), "fwd", graph=True)),
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
    if p["cache_dtype"] == "float8_e4m3fn" and p.arch is not None and not gpus.has(p.arch, "fp8"):
        return f"an fp8 e4m3 cache needs {gpus.first_arch('fp8')} or newer (device is sm_{p.arch[0]}{p.arch[1]})"
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


# ---- dense / varlen prefill ----------------------------------------------------------------------


class AttnBackend(KsEnum):
    """SDPA's fused backends, each its own implementation. core's Backend enum has one TORCH value,
    so these are named here and a request for one is resolved by the family (api._select)."""

    SDPA_CUDNN = "sdpa_cudnn"
    SDPA_FLASH = "sdpa_flash"
    SDPA_EFFICIENT = "sdpa_efficient"


_SDPA_CHECK = {AttnBackend.SDPA_CUDNN: "can_use_cudnn_attention", AttnBackend.SDPA_FLASH: "can_use_flash_attention",
               AttnBackend.SDPA_EFFICIENT: "can_use_efficient_attention"}


DECODE_MAX_Q = 16  # a call with at most this many query tokens against a longer KV sequence is "decode"


def shape_class(seq_k: int, seq_q: int | None = None) -> str:
    """The dispatch table's bucket of a problem: "decode" (a few query tokens against a longer KV
    sequence: a decode or speculative-verify step, whose KV length changes at every call), else by
    the longest key sequence: "short" <= 1024 < "medium" <= 4096 < "long"."""
    if seq_q is not None and seq_q <= DECODE_MAX_Q and seq_k > seq_q:
        return "decode"
    return "short" if seq_k <= 1024 else "medium" if seq_k <= 4096 else "long"


def _norm_window(causal: bool, window: tuple[int, int]) -> tuple[int, int]:
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def _sdpa_cpu_verdicts(q, k, v, causal: bool) -> dict[str, str | None]:
    """On CPU torch has one fused kernel (its flash attention for CPU), which it picks when
    ``torch._fused_sdp_choice`` says so; cuDNN and efficient attention have no CPU kernel."""
    from torch.nn.attention import SDPBackend
    none = "torch has no CPU kernel for this SDPA backend"
    out: dict[str, str | None] = {str(AttnBackend.SDPA_CUDNN): none, str(AttnBackend.SDPA_EFFICIENT): none}
    try:
        gqa = q.shape[-2] != k.shape[-2]
        choice = torch._fused_sdp_choice(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, 0.0, causal,
                                         **({"enable_gqa": True} if gqa else {}))
        ok = choice == SDPBackend.FLASH_ATTENTION.value
        out[str(AttnBackend.SDPA_FLASH)] = None if ok else "torch._fused_sdp_choice picks no fused CPU kernel here"
    except Exception as exc:
        out[str(AttnBackend.SDPA_FLASH)] = f"cannot ask torch ({type(exc).__name__}: {exc})"
    return out


def _sdpa_verdicts(q, k, v, causal: bool) -> dict[str, str | None]:
    """torch's own answer, with its reason, to 'can backend X run this?' (its can_use_* checks see
    the shapes, strides, dtype and requires_grad, so a training call gets the backward's limits)."""
    import warnings
    if q.device.type == "cpu":
        return _sdpa_cpu_verdicts(q, k, v, causal)
    out: dict[str, str | None] = {}
    try:
        from torch.backends import cuda as tbc
        gqa = q.shape[-2] != k.shape[-2]
        params = tbc.SDPAParams(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, 0.0, causal, gqa)
    except Exception as exc:
        return {str(b): f"cannot ask torch ({type(exc).__name__}: {exc})" for b in AttnBackend}
    for b, fn in _SDPA_CHECK.items():
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ok = getattr(tbc, fn)(params, True)
            why = "; ".join(str(w.message).splitlines()[0] for w in caught) or "torch says no"
            out[str(b)] = None if ok else f"torch.backends.cuda.{fn}: {why}"
        except Exception as exc:
            out[str(b)] = f"torch.backends.cuda.{fn} raised {type(exc).__name__}: {exc}"
    return out


def _train(q, k, v, sinks, need_lse, return_lse, train) -> tuple[bool, bool]:
    """(need_lse, train). ``train``: the call records autograd and asks no LSE, so a backend with its
    own backward (SDPA) may run the whole step; None: derived from the inputs (ks.explain with
    tensors that require grad explains a training call). ``return_lse`` is need_lse's alias."""
    need_lse = bool(need_lse or return_lse)
    if train is None:
        train = needs_grad(q, k, v, sinks)
    return need_lse, bool(train) and not need_lse


def _flash_key(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, *, causal=False, window=(-1, -1), softcap=0.0,
               sinks=None, need_lse=False, max_seqlen_q=None, max_seqlen_k=None, request="auto", return_lse=False,
               train=None, **_):
    need_lse, train = _train(q, k, v, sinks, need_lse, return_lse, train)
    varlen = cu_seqlens_q is not None
    sq = (max_seqlen_q if max_seqlen_q is not None else q.shape[0]) if varlen else q.shape[1]
    sk = (max_seqlen_k if max_seqlen_k is not None else k.shape[0]) if varlen else k.shape[1]
    # everything torch's SDPA verdicts (attrs["sdpa"]) and _sdpa_own read: empty and one-long
    # sequences, an empty batch, raw requires_grad (torch's checks read it even under no_grad), the
    # deterministic-algorithms switch (cuDNN's verdict flips with it) and alignment
    return (q.device, q.dtype, k.dtype, v.dtype, q.shape[-2:], k.shape[-2], v.shape[-1], varlen, sq == sk,
            shape_class(sk, sq), min(sq, 2), min(sk, 2), min(q.shape[0], 1), bool(causal),
            _norm_window(bool(causal), tuple(window)), softcap > 0, sinks is not None,
            need_lse, train, _unit(q, k, v), _aligned16(q, k, v), q.requires_grad, k.requires_grad, v.requires_grad,
            torch.are_deterministic_algorithms_enabled(), str(request))


def _flash_problem(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, *, causal=False, window=(-1, -1), softcap=0.0,
                   sinks=None, need_lse=False, max_seqlen_q=None, max_seqlen_k=None, request="auto", return_lse=False,
                   train=None, **_):
    from ...core import config
    need_lse, train = _train(q, k, v, sinks, need_lse, return_lse, train)
    varlen = cu_seqlens_q is not None
    op = "flash_attention_varlen" if varlen else "flash_attention"
    sq = (max_seqlen_q if max_seqlen_q is not None else q.shape[0]) if varlen else q.shape[1]
    sk = (max_seqlen_k if max_seqlen_k is not None else k.shape[0]) if varlen else k.shape[1]
    arch = device_arch(q.device)
    left, right = _norm_window(bool(causal), tuple(window))
    attrs = {"head_dim": q.shape[-1], "v_head_dim": v.shape[-1], "q_heads": q.shape[-2], "kv_heads": k.shape[-2],
             "seq_q": sq, "seq_k": sk, "causal": bool(causal), "window": (left, right), "softcap": softcap > 0,
             "sinks": sinks is not None, "lse": need_lse, "train": train, "varlen": varlen,
             "unit_stride": _unit(q, k, v), "aligned16": _aligned16(q, k, v), "batch": q.shape[0],
             "shape_class": shape_class(sk, sq),
             "auto": str(request) == "auto" and op not in config.get().backend}
    if q.device.type in ("cuda", "cpu") and not varlen:
        attrs["sdpa"] = _sdpa_verdicts(q, k, v, bool(causal))
    p = Problem(op, q.device, q.dtype, (q.shape[0], sq, sk, q.shape[-2], k.shape[-2], q.shape[-1]), arch, attrs)
    row = table_row(p)
    if row is not None:
        attrs["table"] = row["id"]
    return p


def table_mode(p: Problem) -> str:
    """The table mode of a problem: "fwd+lse" (the forward returns the LSE: return_lse=True, or the
    forward of a step whose backward is ours), "train" (autograd without an LSE: the fwd+bwd step,
    where SDPA's backends run their own backward), "fwd" (inference)."""
    return "fwd+lse" if p["lse"] else "train" if p.attrs.get("train") else "fwd"


def table_row(p: Problem) -> dict | None:
    """The measured row covering this problem, None when there is none."""
    from .dispatch_table import TABLE
    if p.arch is None:
        return None
    arch = f"sm_{p.arch[0]}{p.arch[1]}"
    dt = str(p.dtype).replace("torch.", "")
    dims = str(p["head_dim"]) if p["head_dim"] == p["v_head_dim"] else f"{p['head_dim']}/{p['v_head_dim']}"
    mode = table_mode(p)
    for row in TABLE["rows"]:
        if (row["arch"], row["dtype"], str(row["head_dim"]), bool(row["causal"]), row["mode"], row["shape_class"]) \
                == (arch, dt, dims, p["causal"], mode, p["shape_class"]):
            return {**row, "id": f"{arch}/{dt}/d{dims}/{'causal' if p['causal'] else 'full'}/{mode}/"
                                 f"{p['shape_class']}"}
    return None


def _own_reason(backend, p: Problem) -> str | None:
    impl = next((i for i in _impls_of(p.op) if str(i.backend) == str(backend)), None)
    if impl is None:
        return "not registered for this op"
    from ...core import config
    disabled = config.get().disabled_reason(impl.backend)
    if disabled:
        return disabled
    return impl.availability() or impl.arch.check(p.arch) or _OWN[str(backend)](p)


def _impls_of(op: str):
    from ...core.registry import impls
    return impls(op)


def _table_reason(backend, p: Problem) -> str | None:
    """Under AUTO, a backend the table ranks below a supported one is rejected with the row that
    decided (so ks.explain names it); a named backend is never rejected by the table."""
    if not p.attrs.get("auto") or "table" not in p.attrs:
        return None
    row = table_row(p)
    order = list(row["order"])
    mine = str(backend)
    ahead = order[: order.index(mine)] if mine in order else order
    for other in ahead:
        if _own_reason(other, p) is None:
            where = ", ".join(f"{m.get('device')} {m.get('date')}" for m in _measured_on())
            return f"table row {row['id']} ranks {other} first ({' < '.join(order)}; measured on {where})"
    return None


def _measured_on():
    from .dispatch_table import TABLE
    return TABLE.get("measured_on", [])


def _flash_supports(backend: str, p: Problem) -> str | None:
    return _OWN[backend](p) or _table_reason(backend, p)


def _triton_flash(p: Problem) -> str | None:
    reason = triton_device(p, "q")
    if reason:
        return reason
    if not p["unit_stride"]:
        return "q, k or v has a strided last dim"
    if max(p["head_dim"], p["v_head_dim"]) > MAX_HEAD_DIM:
        return f"head size {max(p['head_dim'], p['v_head_dim'])} > {MAX_HEAD_DIM}"
    return None


def _sdpa_common(p: Problem) -> str | None:
    if p.device.type not in ("cuda", "cpu"):
        return f"SDPA's fused backends run CUDA (and, flash only, CPU) tensors (q is on {p.device})"
    if p["varlen"]:
        return "SDPA has no varlen (packed sequences) entry point"
    if p["lse"]:
        return ("SDPA's public API returns no LSE (return_lse=True; a training call without return_lse runs "
                "SDPA's own backward instead)")
    if p["sinks"]:
        return "SDPA has no attention sinks"
    if p["softcap"]:
        return "SDPA has no logit softcap"
    left, right = p["window"]
    if left >= 0 or (right >= 0 and not (p["causal"] and right == 0)):
        return f"SDPA has no sliding window (window {p['window']}; only full or causal masks)"
    if p["causal"] and p["seq_q"] != p["seq_k"]:
        return (f"SDPA's is_causal aligns the mask top-left; FlashAttention's bottom-right alignment differs when "
                f"Sq != Sk ({p['seq_q']} vs {p['seq_k']})")
    if p.device.type == "cuda" and not p.attrs.get("aligned16", True):
        return ("q, k or v has a data pointer or a stride that is not a multiple of 16 bytes: SDPA's CUDA kernels "
                "assume it unchecked (cuDNN returned wrong results on such views, flash faulted)")
    return None


def _sdpa_own(backend: AttnBackend):
    def supports(p: Problem) -> str | None:
        reason = _sdpa_common(p)
        if reason:
            return reason
        if backend is AttnBackend.SDPA_CUDNN and p.attrs.get("batch", 1) == 0:
            return "torch's cuDNN attention returns no output for an empty batch"
        if backend is AttnBackend.SDPA_CUDNN and p["shape_class"] == "decode" and p.attrs.get("auto"):
            # a named sdpa_cudnn still runs such a call
            return ("AUTO skips cuDNN for decode-shaped calls: it builds an execution plan for every new KV "
                    "length, i.e. at every decode step (63-69 ms per call on an H100, 2026-11-25)")
        return p.attrs.get("sdpa", {}).get(str(backend), "torch's verdict is unknown")
    return supports


def _flash_attn_own(p: Problem) -> str | None:
    if p.device.type != "cuda":
        return f"flash_attn runs CUDA tensors (q is on {p.device})"
    if p.dtype not in (torch.float16, torch.bfloat16):
        return f"flash_attn needs float16 or bfloat16 (got {str(p.dtype).replace('torch.', '')})"
    if p["sinks"]:
        return "flash_attn 2 has no attention sinks"
    if p["head_dim"] != p["v_head_dim"]:
        return f"flash_attn 2 needs equal q/k and v head sizes (got {p['head_dim']} and {p['v_head_dim']})"
    if p["head_dim"] > 256 or p["head_dim"] % 8:
        return f"flash_attn needs a head size <= 256 and a multiple of 8 (got {p['head_dim']})"
    if not p["unit_stride"]:
        return "q, k or v has a strided last dim"
    return None


_OWN = {"triton": _triton_flash, "flash_attn": _flash_attn_own, "reference": lambda p: None,
        **{str(b): _sdpa_own(b) for b in AttnBackend}}


def _flash_cost(shape, dtype, mode):
    """shape: (batch, seq, Hq, Hkv, D, causal 0/1), Sq = Sk. FLOPs: 4 B Hq D per visible (query, key)
    pair forward (QK^T and PV), 2.5x that backward (5 products), FlashAttention's count."""
    b, s, hq, hkv, d, causal = shape
    pairs = s * (s + 1) // 2 if causal else s * s
    fwd = 4 * b * hq * pairs * d
    e = _size(dtype)
    io = b * s * (2 * hq + 2 * hkv) * d * e
    if mode == "fwd":
        return Cost(io + b * hq * s * 4, fwd, "read q, k, v; write out and lse")
    return Cost(io * 2 + b * s * (2 * hq) * d * e + b * hq * s * 8, int(3.5 * fwd),
                "forward, then read q, k, v, out, dout, lse; write dq, dk, dv")


def _flash_ref(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, **kw):
    if cu_seqlens_q is None:
        return ref.attention(q, k, v, causal=kw.get("causal", False))
    return ref.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=kw.get("causal", False))


# (batch, seq, Hq, Hkv, D, causal): Llama-style prefill. The bars (AUTO >= 1.0x the best SDPA backend,
# our forward >= 70% of cuDNN in TFLOP/s, our backward >= 1.0x SDPA flash's) are ratios and TFLOP/s,
# which the harness does not judge yet (it judges % of copy bandwidth): read them from the table.
_FLASH_CASES = (BenchCase((8, 4096, 32, 32, 128, 1), "fwd"), BenchCase((1, 16384, 32, 32, 128, 1), "fwd"),
                BenchCase((8, 4096, 32, 32, 128, 1), "fwd+bwd"), BenchCase((1, 16384, 32, 32, 128, 1), "fwd+bwd"),
                BenchCase((8, 4096, 32, 8, 128, 1), "fwd"), BenchCase((16, 2048, 16, 16, 64, 1), "fwd"),
                BenchCase((4, 4096, 32, 32, 128, 0), "fwd"))

declare_op(OpSpec(
    name="flash_attention", family="attention",
    signature="flash_attention(q, k, v, *, causal=False, scale=None, window=(-1, -1), softcap=0.0, sinks=None, "
              "return_lse=False, layout='bshd', backend='auto')",
    doc="out = softmax(scale q K^T (+ sink)) V; q [B, S, Hq, D], k/v [B, Sk, Hkv, D]; GQA, causal, window, softcap",
    reference=_flash_ref, tolerance="attention", key=_flash_key, problem=_flash_problem, cost=_flash_cost,
    bench=_FLASH_CASES, c_abi=True, differentiable=True,
))
declare_op(OpSpec(
    name="flash_attention_varlen", family="attention",
    signature="flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, "
              "scale=None, window=(-1, -1), softcap=0.0, sinks=None, return_lse=False, check_bounds=True, "
              "backend='auto')",
    doc="flash_attention over packed sequences: q [T, Hq, D], k/v [Tk, Hkv, D], cu_seqlens [B + 1] int32",
    reference=_flash_ref, tolerance="attention", key=_flash_key, problem=_flash_problem, cost=_flash_cost,
    bench=(BenchCase((8, 4096, 32, 8, 128, 1), "fwd"),), c_abi=True, differentiable=True,
))


def _t_flash_fwd(*args):
    from .launch import flash_attention_fwd
    return flash_attention_fwd(*args)


def _t_flash_bwd(*args):
    from .launch import flash_attention_bwd
    return flash_attention_bwd(*args)


def _ref_args(q, k, v, cu_q, cu_k, causal, scale, window, softcap, sinks):
    kw = dict(causal=causal, scale=scale, window=tuple(window), softcap=softcap, sinks=sinks)
    if cu_q is None:
        out, lse = ref.attention(q, k, v, **kw)
        return out, lse.transpose(-1, -2)
    return ref.attention_varlen(q, k, v, cu_q, cu_k, **kw)


def _r_flash_fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window, softcap, sinks, need_lse):
    out, lse = _ref_args(q, k, v, cu_q, cu_k, causal, scale, window, softcap, sinks)
    return out.to(q.dtype), lse.float().contiguous()


def _autograd_dispatch():
    """Autograd's dispatch keys back on for the calls inside (the TLS sets restored on exit). A
    custom op's implementation runs with them excluded, so under torch.compile (where the backward
    is the kernelset::flash_attention_backward op) enable_grad alone recorded no graph: the
    reference backward raised "does not require grad". Autocast stays excluded: fp32 math."""
    exclude = torch._C._dispatch_tls_local_exclude_set()
    dk = torch._C.DispatchKey
    for key in (dk.AutogradFunctionality, dk.AutogradOther, dk.AutogradNestedTensor, dk.ADInplaceOrView):
        exclude = exclude.remove(key)
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)


def _r_flash_bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, window, softcap, sinks,
                 dlse=None):
    """Gradients of the fp32 reference (recomputed with torch autograd); ``dlse``: the gradient
    reaching the returned LSE, or None."""
    with _autograd_dispatch(), torch.enable_grad():
        ins = [t.detach().float().requires_grad_() for t in (q, k, v)]
        s = sinks.detach().float().requires_grad_() if sinks is not None else None
        o, l = _ref_args(*ins, cu_q, cu_k, causal, scale, window, softcap, s)
        wrt = ins + ([s] if s is not None else [])
        pairs = [(o, dout.float())] + ([(l, dlse.float())] if dlse is not None else [])
        pairs = [(x, g) for x, g in pairs if x.requires_grad]  # varlen: no sequence with a query row
        grads = torch.autograd.grad([x for x, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True) \
            if pairs else [None] * len(wrt)
        grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, wrt)]
    dq, dk, dv = (g.to(t.dtype) for g, t in zip(grads[:3], (q, k, v)))
    return dq, dk, dv, (grads[3] if s is not None else None)


def _sdpa_direct(backend: AttnBackend, q, k, v, causal: bool, scale: float) -> tuple | None:
    """SDPA's own kernel for ``backend``, called as F.scaled_dot_product_attention calls it once it
    has picked that backend (q, k, v [B, H, S, D]; GQA passed through, which torch's flash and cuDNN
    kernels take as is; the efficient kernel is only picked without GQA), skipping the
    ``sdpa_kernel`` context (~15-40 us of host time per call) and the backend selection. Returns
    (out, the kernel's LSE [B, H, Sq] or None where it computes none), or None where that call
    would differ (CPU, or a head size F.sdpa pads to a multiple of 8 for flash)."""
    if q.device.type != "cuda":
        return None
    aten = torch.ops.aten
    if backend is AttnBackend.SDPA_FLASH:
        if q.shape[-1] % 8 or v.shape[-1] % 8:
            return None
        res = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
        return res[0], res[1]  # flash computes its LSE anyway: no buffer to allocate for it
    if backend is AttnBackend.SDPA_CUDNN:
        return aten._scaled_dot_product_cudnn_attention(q, k, v, None, False, 0.0, causal, False, scale=scale)[0], None
    if q.shape[1] != k.shape[1]:
        return None
    return aten._scaled_dot_product_efficient_attention(q, k, v, None, False, 0.0, causal, scale=scale)[0], None


def _sdpa_forward(backend: AttnBackend):
    def forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window, softcap, sinks, need_lse):
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        res = _sdpa_direct(backend, qt, kt, vt, causal, scale) if _DIRECT_SDPA else None
        out, lse = res if res is not None else (None, None)
        if out is None:
            import torch.nn.functional as F
            from torch.nn.attention import SDPBackend, sdpa_kernel
            which = {AttnBackend.SDPA_CUDNN: SDPBackend.CUDNN_ATTENTION,
                     AttnBackend.SDPA_FLASH: SDPBackend.FLASH_ATTENTION,
                     AttnBackend.SDPA_EFFICIENT: SDPBackend.EFFICIENT_ATTENTION}[backend]
            gqa = q.shape[2] != k.shape[2]
            with sdpa_kernel([which]):
                out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale,
                                                     **({"enable_gqa": True} if gqa else {}))
        if lse is None:
            # the LSE is not asked for (supports() rejects calls that need it); a buffer of its shape
            lse = empty((q.shape[0], q.shape[2], q.shape[1]), torch.float32, q.device)
        return out.transpose(1, 2).contiguous(), lse
    return forward


_DIRECT_SDPA = True  # tests compare both paths


def sdpa_train(backend: str, q, k, v, causal: bool, scale: float, heads: tuple | None = None) -> torch.Tensor:
    """A training call run by SDPA pinned to one backend, through torch's autograd (SDPA records its
    own backward, which needs no LSE of ours); compile-friendly. out [B, Sq, Hq, Dv] contiguous; with
    ``heads`` (the same q, k, v as the caller's [B, H, S, D] tensors) out [B, Hq, Sq, Dv] as SDPA
    returns it, and no transpose of ours enters the autograd graph."""
    qt, kt, vt = heads if heads is not None else (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    out = _sdpa_train_direct(str(backend), qt, kt, vt, causal, scale) if _DIRECT_SDPA else None
    if out is None:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        which = {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_flash": SDPBackend.FLASH_ATTENTION,
                 "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}[str(backend)]
        gqa = qt.shape[1] != kt.shape[1]
        with sdpa_kernel([which]):
            out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale,
                                                 **({"enable_gqa": True} if gqa else {}))
    return out if heads is not None else out.transpose(1, 2).contiguous()


def _sdpa_train_direct(backend: str, q, k, v, causal: bool, scale: float) -> torch.Tensor | None:
    """SDPA's differentiable kernel op for a training call (q, k, v [B, H, S, D]), called as
    F.scaled_dot_product_attention calls it once ``sdpa_kernel`` has pinned that backend (the
    log-sum-exp computed: gradients are recorded), without the context manager and the selection:
    40-70 us less host time per call on the lent hosts. cuDNN takes GQA as is (F.sdpa passes k, v
    through to it); flash only without GQA and with head sizes F.sdpa does not pad; otherwise None
    (and F.sdpa runs)."""
    if q.device.type != "cuda" or torch.compiler.is_compiling():
        return None
    aten = torch.ops.aten
    if backend == "sdpa_cudnn":
        return aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)[0]
    if backend == "sdpa_flash" and q.shape[1] == k.shape[1] and not q.shape[-1] % 8 and not v.shape[-1] % 8:
        return aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[0]
    return None


def sdpa_fwd_saved(backend: str, q, k, v, causal: bool, scale: float) -> tuple | None:
    """SDPA's kernel for ``backend`` as a plain function (no autograd): q, k, v [B, H, S, D] ->
    (out [B, H, S, D], what ``sdpa_bwd_saved`` needs), for a caller that records its own backward
    (hf.layers._LayerNode). cuDNN (GQA as is) and flash on CUDA (no GQA, head sizes F.sdpa does not
    pad), torch's flash kernel on CPU; None otherwise (the caller runs kernelset's op)."""
    aten = torch.ops.aten
    if q.device.type == "cpu" and backend == "sdpa_flash":
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
        return out, (lse,)
    if q.device.type != "cuda":
        return None
    if backend == "sdpa_cudnn":
        r = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)
        return r[0], (r[1], r[6], r[7], r[2], r[3], r[4], r[5])
    if backend == "sdpa_flash" and q.shape[1] == k.shape[1] and not q.shape[-1] % 8 and not v.shape[-1] % 8:
        r = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
        return r[0], (r[1], r[2], r[3], r[4], r[5], r[6], r[7])
    return None


def sdpa_bwd_saved(backend: str, dout, q, k, v, out, saved: tuple, causal: bool, scale: float) -> tuple:
    """dq, dk, dv of ``sdpa_fwd_saved``'s call (dout [B, H, S, D], laid out as out is)."""
    aten = torch.ops.aten
    if q.device.type == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, saved[0], 0.0, causal,
                                                                         scale=scale)
    if backend == "sdpa_cudnn":
        lse, seed, offset, cq, ck, mq, mk = saved
        return aten._scaled_dot_product_cudnn_attention_backward(dout, q, k, v, out, lse, seed, offset, None, cq, ck,
                                                                 mq, mk, 0.0, causal, scale=scale)
    lse, cq, ck, mq, mk, seed, offset = saved
    return aten._scaled_dot_product_flash_attention_backward(dout, q, k, v, out, lse, cq, ck, mq, mk, 0.0, causal,
                                                             seed, offset, scale=scale)


def _fa_forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window, softcap, sinks, need_lse):
    import flash_attn
    left, right = _norm_window(causal, window)
    kw = dict(dropout_p=0.0, softmax_scale=scale, causal=causal, window_size=(left, right), softcap=softcap,
              return_attn_probs=need_lse)
    if cu_q is None:
        res = flash_attn.flash_attn_func(q, k, v, **kw)
    else:
        res = flash_attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **kw)
    if not need_lse:  # not computed (not asked for); an unwritten buffer of the LSE's shape
        shape = (q.shape[0], q.shape[2], q.shape[1]) if cu_q is None else (q.shape[1], q.shape[0])
        return res, empty(shape, torch.float32, q.device)
    out, lse = res[0], res[1]
    # flash_attn marks a row with no visible key +inf; ours (and the math) is -inf
    return out, lse.masked_fill(lse == float("inf"), float("-inf"))


for _op in ("flash_attention", "flash_attention_varlen"):
    register_impl(Impl(op=_op, backend=Backend.TRITON, forward=_t_flash_fwd, backward=_t_flash_bwd,
                       supports=functools.partial(_flash_supports, "triton"), priority=100,
                       arch=ArchRange(min=(8, 0)), requires=("triton",),
                       note="FlashAttention-2 forward; dK/dV and dQ kernels without atomics; GQA, window, "
                            "softcap, sinks, MLA head dims"))
    register_impl(Impl(op=_op, backend=Backend.FLASH_ATTN, forward=_fa_forward, backward=None,
                       supports=functools.partial(_flash_supports, "flash_attn"), priority=90,
                       arch=ArchRange(min=(8, 0)), requires=("flash_attn",),
                       note="flash_attn_func / flash_attn_varlen_func; forward only here"))
    register_impl(Impl(op=_op, backend=Backend.REFERENCE, forward=_r_flash_fwd, backward=_r_flash_bwd,
                       supports=lambda p: None, priority=0, graph_safe=False,
                       note="fp32 math in plain torch ops (varlen reads the offsets on the host)"))
for _prio, _b in ((80, AttnBackend.SDPA_CUDNN), (70, AttnBackend.SDPA_FLASH), (60, AttnBackend.SDPA_EFFICIENT)):
    register_impl(Impl(op="flash_attention", backend=_b, forward=_sdpa_forward(_b), backward=None,
                       supports=functools.partial(_flash_supports, str(_b)), priority=_prio,
                       arch=ArchRange(min=(8, 0)),
                       note="torch SDPA pinned to one backend (sdpa_kernel); inference, or a training call "
                            "without return_lse through SDPA's own autograd (api._run)"))
