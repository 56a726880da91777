"""paged_attention (decode, split-KV through a caller's workspace, prefill over the paged cache),
merge_attn_states, and flash_attention / flash_attention_varlen forward."""
from __future__ import annotations

import contextlib
import itertools
import math

from record import meta

from .base import KernelRef, Op, PolicyRef, align256, mod

LAUNCH = "kernelset.ops.attention.launch"
KERNELS = "kernelset.ops.attention.kernels"


# ---------------------------------------------------------------------------------------------
# paged_attention

LLAMA = dict(b=3, hq=32, hkv=8, d=128, bs=16, nb=256, width=64, ctx=None, dtype="bf16", cache="bf16", varlen=False,
             max_q=1, qlens=None, causal=True, window=(-1, -1), softcap=0.0, sinks=False, ws=True, lse=True,
             max_seq_len=None, sms=132)


_RELEASE_DECODE = ((1, 512), (1, 8192), (1, 131072), (4, 4096), (8, 32768), (16, 1024), (64, 4096), (256, 2048))


def _model_attention() -> list[tuple]:
    """(Hq, Hkv, D, windows, softcap, sinks) of the known models (ops/models.py): a model with
    sliding-window layers also runs full-attention ones unless every layer slides."""
    from . import models as mm
    out = set()
    for f in mm.models():
        heads = mm.attention_heads(f)
        if heads is None:
            continue
        windows = [(-1, -1)] if f.sliding_layers < f.layers or not f.sliding_window else []
        if f.sliding_window:
            windows.append((f.sliding_window - 1, 0))
        out.add((*heads, tuple(windows), float(f.attn_softcap or 0.0), f.sinks))
    return sorted(out)


def _paged_cases(which: str) -> list[dict]:
    if which == "test":
        return [LLAMA,  # decode, split-KV in the workspace (4 splits) + the reduce kernel
                dict(LLAMA, ws=False, lse=False),  # no workspace: one pass; LSE to the discard buffer
                dict(LLAMA, hq=8, hkv=2, d=64, bs=32, dtype="fp16", cache="fp16", varlen=True, max_q=9,
                     qlens=(9, 1, 4), window=(100, 0), softcap=30.0, sinks=True, ws=False),  # chunked prefill
                dict(LLAMA, cache="fp8e4nv", ws=False),  # fp8 cache (sm_89+)
                # GPU checks: decode over 1 GB of cache (no split at 64 x 8 programs; bf16 and fp8), a long
                # context split 17 ways, a prefill chunk of 4 x 512 tokens over 4096 cached ones
                dict(LLAMA, b=64, nb=64 * 256, width=256, gpu="paged_decode"),
                dict(LLAMA, b=64, nb=64 * 256, width=256, cache="fp8e4nv", ws=False, gpu="paged_decode_fp8"),
                dict(LLAMA, b=4, nb=4 * 2048, width=2048, gpu="paged_decode_split"),
                dict(LLAMA, b=4, nb=4 * 256, width=256, varlen=True, max_q=512, qlens=(512,) * 4, ws=False,
                     gpu="paged_prefill")]
    if which == "full":
        out = []
        for d, hq, hkv in ((64, 8, 8), (128, 32, 8), (128, 32, 4), (128, 64, 8), (256, 16, 8)):
            for dtype, cache in (("bf16", "bf16"), ("fp16", "fp16"), ("bf16", "fp8e4nv")):
                for ws in (False, True):
                    out.append(dict(LLAMA, b=1, hq=hq, hkv=hkv, d=d, dtype=dtype, cache=cache, ws=ws))
        return out
    if which == "release":  # ops/models.py: each known model's attention on every known GPU
        from . import models as mm
        out = []
        for hq, hkv, d, windows, cap, sinks in _model_attention():
            for dt, cache, ws, bs, window in itertools.product(mm.DTYPES, ("same", "fp8e4nv"), (True, False),
                                                               mm.BLOCK_SIZES, windows):
                base = dict(LLAMA, hq=hq, hkv=hkv, d=d, dtype=dt, cache=dt if cache == "same" else cache, ws=ws,
                            bs=bs, window=window, softcap=cap, sinks=sinks, lse=ws)
                # decode: batches and contexts that span the split counts (the reduce kernel's buckets)
                for (b, ctx), sms in itertools.product(_RELEASE_DECODE, mm.sm_counts() if ws else (132,)):
                    width = -(-ctx // bs)
                    out.append(dict(base, b=b, width=width, nb=b * width, sms=sms))
                # chunked prefill / speculative verify: several query tokens per sequence over the cache
                for q in (2, 4, 8, 16, 64, 512):
                    out.append(dict(base, varlen=True, b=2, max_q=q, qlens=(q, 1), width=-(-4096 // bs),
                                    nb=2 * -(-4096 // bs)))
        return out
    out = []
    for b, width, ctx, sms in ((1, 1, None, 132), (2, 8, None, 4), (5, 64, 1000, 132), (64, 256, None, 132),
                               (7, 2048, 20000, 108), (1, 4096, None, 1)):
        for hq, hkv, d in ((32, 8, 128), (8, 8, 64), (28, 4, 128), (16, 2, 256), (5, 1, 80)):
            for ws in (True, False):
                out.append(dict(LLAMA, b=b, width=width, nb=b * width, max_seq_len=ctx, sms=sms, hq=hq, hkv=hkv, d=d,
                                ws=ws, lse=ws or b % 2 == 0))
    out += [dict(LLAMA, varlen=True, max_q=q, qlens=(q, 1, 0), b=3, ws=ws, causal=causal, window=w)
            for q in (1, 2, 16, 65) for ws in (True, False) for causal in (True, False)
            for w in ((-1, -1), (64, 0), (5, 3))]
    out += [dict(LLAMA, b=0), dict(LLAMA, varlen=True, max_q=4, qlens=(0, 0, 0)),
            dict(LLAMA, cache="fp8e4nv", dtype="fp16"), dict(LLAMA, sinks=True, softcap=50.0, dtype="fp32",
                                                              cache="fp32"),
            dict(LLAMA, q_strides=(3 * 32 * 128, 128)), dict(LLAMA, misalign=["Q"]), dict(LLAMA, bs=1, width=1024)]
    return out


def _paged_geom(c: dict):
    t = sum(c["qlens"]) if c["varlen"] else c["b"]
    cap = c["width"] * c["bs"]
    max_seq_len = cap if c["max_seq_len"] is None else min(c["max_seq_len"], cap)
    return t, max_seq_len


def _paged_python(c: dict):
    launch = mod(LAUNCH)
    t, max_seq_len = _paged_geom(c)
    hq, hkv, d, b = c["hq"], c["hkv"], c["d"], c["b"]
    qs = c.get("q_strides", (hq * d, d))
    q = meta((t, hq, d), c["dtype"], (qs[0], qs[1], 1))
    kc = meta((c["nb"], c["bs"], hkv, d), c["cache"])
    vc = meta((c["nb"], c["bs"], hkv, d), c["cache"])
    bt = meta((b, c["width"]), "i32")
    seq = meta((b,), "i32")
    cu = meta((b + 1,), "i32") if c["varlen"] else None
    sinks = meta((hq,), "fp32") if c["sinks"] else None
    fp8 = c["cache"] == "fp8e4nv"
    ks = meta((), "fp32") if fp8 else None
    vs = meta((), "fp32") if fp8 else None
    tuning = contextlib.nullcontext() if c["ws"] else launch.TUNING.use(launch.PagedTuning(splits=1))
    with tuning:
        out, lse = launch.paged_attention(q, kc, vc, bt, seq, cu, c["max_q"] if c["varlen"] else 1, c["causal"],
                                          1.0 / math.sqrt(d), c["window"], c["softcap"], sinks, ks, vs, max_seq_len)
    return dict(Q=q, KC=kc, VC=vc, BT=bt, SEQ=seq, CUQ=cu, SINKS=sinks, KSCALE=ks, VSCALE=vs, OUT=out, LSE=lse)


def paged_workspace_bytes(t: int, hq: int, d: int, max_keys: int) -> int:
    """What ks_cuda_paged_attention_workspace_bytes returns (tests compare the two)."""
    tun = mod(LAUNCH).PagedTuning()
    splits = max(1, min(tun.max_splits, -(-max(1, max_keys) // tun.min_partition))) if max_keys > 0 else tun.max_splits
    return align256(t * hq * splits * d * 4) + t * hq * splits * 4


def _paged_c_args(c: dict) -> list:
    t, max_seq_len = _paged_geom(c)
    hq, hkv, d, b, bs = c["hq"], c["hkv"], c["d"], c["b"], c["bs"]
    qs = c.get("q_strides", (hq * d, d))
    fp8 = c["cache"] == "fp8e4nv"
    cstr = [bs * hkv * d, hkv * d, d]
    return [c["dtype"], c["cache"], "Q", "KC", "VC", "BT", "SEQ", "CUQ" if c["varlen"] else None,
            "SINKS" if c["sinks"] else None, "KSCALE" if fp8 else None, "VSCALE" if fp8 else None, "OUT",
            "LSE" if c["lse"] else None, "WS" if c["ws"] else None,
            paged_workspace_bytes(t, hq, d, max_seq_len) if c["ws"] else 0, t, b, hq, hkv, d, c["nb"], bs, c["width"],
            c["max_q"] if c["varlen"] else 1, max_seq_len, qs[0], qs[1], *cstr, *cstr, c["width"],
            1.0 / math.sqrt(d), c["softcap"], c["window"][0], c["window"][1], int(c["causal"])]


def _paged_placed(c: dict, launches: list) -> dict:
    t, _ = _paged_geom(c)
    out = {} if c["lse"] else {"LSE": ("scratch", 0)}
    splits = [dict((p[0], p[3]) for p in ln["params"])["num_splits"] for ln in launches
              if ln["kernel"] == "_paged_attn_fwd_kernel"]
    if splits and splits[0] > 1:
        out["~PO"] = ("WS", 0)
        out["~PLSE"] = ("WS", align256(t * c["hq"] * splits[0] * c["d"] * 4))
    return out


def _paged_decls() -> str:
    return """/* Workspace bytes that make split-KV possible for q [T, Hq, D] over at most max_keys cached
 * tokens per sequence (max_keys <= 0: unknown, the most splits the policy ever takes): fp32
 * partial outputs [T, Hq, S, D] then partial LSEs [T, Hq, S], S the policy's largest split count
 * (PagedTuning.max_splits, min_partition). A workspace of at least this size never fails. */
int64_t ks_cuda_paged_attention_workspace_bytes(int64_t T, int64_t Hq, int64_t D, int64_t max_keys);"""


def _paged_defs() -> str:
    tun = mod(LAUNCH).PagedTuning()
    return f"""int64_t ks_cuda_paged_attention_workspace_bytes(int64_t T, int64_t Hq, int64_t D, int64_t max_keys) {{
  /* splits <= min(max_splits, ceil(keys / min_partition)) for any SM count: the policy clamps to
   * both, and rounding the partition up to whole key blocks only lowers the count */
  const int64_t max_splits = {tun.max_splits}, min_partition = {tun.min_partition}; /* PagedTuning() */
  int64_t s = max_splits;
  if (max_keys > 0) {{
    s = ks_gen_cdiv(max_keys, min_partition);
    if (s > max_splits) s = max_splits;
    if (s < 1) s = 1;
  }}
  if (T < 0 || Hq < 0 || D < 0) return 0;
  return ks_gen_align256(T * Hq * s * D * 4) + T * Hq * s * 4;
}}"""


PAGED_ATTENTION = Op(
    name="paged_attention",
    launcher="kernelset.ops.attention.launch.paged_attention",
    doc="paged_attention: OUT [T, Hq, D] (contiguous) and LSE [T, Hq] fp32 (contiguous; NULL: discarded) of q over "
        "the paged caches; WS (NULL: one pass per sequence) holds the split-KV partials",
    kernels=[KernelRef(KERNELS, "_paged_attn_fwd_kernel",
                       ("stride_qt", "stride_qh", "stride_kb", "stride_ks", "stride_kh", "stride_vb", "stride_vs",
                        "stride_vh")),
             KernelRef(KERNELS, "_paged_attn_reduce_kernel", ())],
    policies=[PolicyRef(LAUNCH, "paged_policy", "ks_pol_paged", lambda m: {"tuning": m.PagedTuning()}, keep=("fp8",)),
              PolicyRef(LAUNCH, "paged_policy", "ks_pol_paged_nosplit", lambda m: {"tuning": m.PagedTuning(splits=1)},
                        keep=("fp8",)),
              PolicyRef(LAUNCH, "paged_reduce_policy", "ks_pol_paged_reduce")],
    c_params=[("int32_t", "q_dtype"), ("int32_t", "cache_dtype"), ("const void *", "Q"), ("const void *", "KC"),
              ("const void *", "VC"), ("const void *", "BT"), ("const void *", "SEQ"), ("const void *", "CUQ"),
              ("const void *", "SINKS"), ("const void *", "KSCALE"), ("const void *", "VSCALE"), ("void *", "OUT"),
              ("void *", "LSE"), ("void *", "WS"), ("int64_t", "ws_bytes"), ("int64_t", "T"), ("int64_t", "B"),
              ("int64_t", "Hq"), ("int64_t", "Hkv"), ("int64_t", "D"), ("int64_t", "num_blocks"),
              ("int64_t", "block_size"), ("int64_t", "max_table"), ("int64_t", "max_seqlen_q"),
              ("int64_t", "max_seq_len"), ("int64_t", "stride_qt"), ("int64_t", "stride_qh"), ("int64_t", "stride_kb"),
              ("int64_t", "stride_ks"), ("int64_t", "stride_kh"), ("int64_t", "stride_vb"), ("int64_t", "stride_vs"),
              ("int64_t", "stride_vh"), ("int64_t", "stride_bt"), ("double", "scale"), ("double", "softcap"),
              ("int64_t", "window_left"), ("int64_t", "window_right"), ("int", "causal")],
    c_body=r"""
  /* kernelset.ops.attention.launch.paged_attention; the workspace replaces its torch.empty
   * partials (none: the policy with PagedTuning(splits=1)) */
  if (T == 0 || B == 0) return KS_OK;
  if (Hkv <= 0 || Hq % Hkv) return ks_gen_invalid(err, errlen, "paged_attention: Hq must be a multiple of Hkv");
  const int varlen = CUQ != NULL;
  const int fp8 = cache_dtype == KS_DT_F8E4M3;
  const int64_t max_keys = ks_pol_min(max_seq_len, max_table * block_size);
  const int64_t G = Hq / Hkv;
  ks_pol_paged_t p;
  if ((WS ? ks_pol_paged : ks_pol_paged_nosplit)(B, Hkv, G, D, varlen ? max_seqlen_q : 1, max_keys, sms, fp8, &p))
    return ks_gen_policy_failed(err, errlen, "paged_policy");
  int64_t left = window_left, right = window_right;
  if (causal) right = right < 0 ? 0 : ks_pol_min(right, 0);
  const int mask_right = right >= 0 && (varlen || right > 0 || !causal);
  const int mask_left = left >= 0;
  const double log2e = 1.4426950408889634;
  const double qk_mul = softcap > 0 ? scale / softcap : scale * log2e;
  const double cap_mul = softcap * log2e;
  void *po = NULL, *plse = NULL;
  if (p.splits > 1) {
    const int64_t po_bytes = ks_gen_align256(T * Hq * p.splits * D * 4), need = po_bytes + T * Hq * p.splits * 4;
    if (ws_bytes < need) {
      ks_cuda_errorf(err, errlen, "workspace: %lld bytes, this call needs %lld (ks_paged_attention_workspace_size)",
                     (long long)ws_bytes, (long long)need);
      return KS_ERR_INVALID_ARGUMENT;
    }
    po = WS;
    plse = (char *)WS + po_bytes;
  }
  void *lse = LSE ? LSE : ks_cuda_plan_scratch(plan, T * Hq * 4);
  ks_status_t s = ks_k_paged_attn_fwd_kernel(plan, err, errlen, B * Hkv * p.tiles, p.splits, 1, p.num_warps,
      p.num_stages, 1, Q, q_dtype, KC, cache_dtype, VC, cache_dtype, BT, KS_DT_I32, SEQ, KS_DT_I32, CUQ, KS_DT_I32,
      SINKS, KS_DT_F32, fp8 ? KSCALE : NULL, KS_DT_F32, fp8 ? VSCALE : NULL, KS_DT_F32, OUT, q_dtype, lse, KS_DT_F32,
      po, KS_DT_F32, plse, KS_DT_F32, qk_mul, cap_mul, left, right, Hkv, p.tiles, p.partition, num_blocks, max_table,
      max_keys, stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt, Hq,
      p.splits, G, D, block_size, p.block_m, p.block_n, p.block_d, p.splits > 1, varlen, mask_right, mask_left, softcap > 0,
      SINKS != NULL, fp8, q_dtype == KS_DT_F32);
  if (s != KS_OK || p.splits == 1) return s;
  ks_pol_paged_reduce_t r;
  if (ks_pol_paged_reduce(p.splits, p.block_d, &r)) return ks_gen_policy_failed(err, errlen, "paged_reduce_policy");
  return ks_k_paged_attn_reduce_kernel(plan, err, errlen, T * Hq, 1, 1, r.num_warps, -1, 1,
      po, KS_DT_F32, plse, KS_DT_F32, SINKS, KS_DT_F32, OUT, q_dtype, lse, KS_DT_F32,
      p.splits, D, r.block_s, p.block_d, SINKS != NULL, Hq);
""",
    cases=_paged_cases,
    python=_paged_python,
    c_args=_paged_c_args,
    modules=(LAUNCH,),
    placed=_paged_placed,
    both_aligns=False,
    c_decls=_paged_decls,
    c_defs=_paged_defs,
)


# ---------------------------------------------------------------------------------------------
# merge_attn_states

def _merge_cases(which: str) -> list[dict]:
    base = dict(t=5, h=32, d=128, a="bf16", b="bf16", lse=True)
    if which == "test":
        return [base, dict(base, d=80, a="fp32", b="fp32", lse=False),
                dict(base, t=16384, gpu="merge_attn_states")]  # GPU checks: 3 x 128 MB
    if which == "full":
        return [dict(base, t=1, d=d, a=a, b=a) for d in (64, 80, 96, 128, 192, 256) for a in ("fp32", "fp16", "bf16")]
    if which == "release":  # ops/models.py: each known model's (heads, head dim)
        from . import models as mm
        shapes = sorted({(hq, d) for hq, _, d, _, _, _ in _model_attention()})
        return [dict(base, t=t, h=h, d=d, a=dt, b=dt, lse=lse) for h, d in shapes for dt in mm.DTYPES
                for lse in (True, False) for t in mm.TOKENS]
    return ([dict(base, t=t, h=h, d=d, lse=t % 2 == 0) for t in (0, 1, 7, 1000) for h in (1, 3, 32)
             for d in (0, 1, 64, 80, 128, 256)]
            + [dict(base, a_strides=(3 * 32 * 128, 128)), dict(base, misalign=["OB"]), dict(base, b="fp16")])


def _merge_python(c: dict):
    launch = mod(LAUNCH)
    t, h, d = c["t"], c["h"], c["d"]
    ast = c.get("a_strides", (h * d, d))
    oa = meta((t, h, d), c["a"], (ast[0], ast[1], 1))
    ob = meta((t, h, d), c["b"])
    la = meta((t, h), "fp32")
    lb = meta((t, h), "fp32")
    out, lse = launch.merge_attn_states(oa, la, ob, lb)
    return dict(OA=oa, LA=la, OB=ob, LB=lb, O=out, LSE=lse)


def _merge_c_args(c: dict) -> list:
    t, h, d = c["t"], c["h"], c["d"]
    ast = c.get("a_strides", (h * d, d))
    return [c["a"], c["b"], "OA", "LA", "OB", "LB", "O", "LSE" if c["lse"] else None, t, h, d, ast[0], ast[1], h * d, d,
            h, 1, h, 1]


MERGE_ATTN_STATES = Op(
    name="merge_attn_states",
    launcher="kernelset.ops.attention.launch.merge_attn_states",
    doc="merge_attn_states: O [T, H, D] (contiguous, OA's dtype) and LSE [T, H] fp32 (contiguous; NULL: discarded) "
        "from OA/OB [T, H, D] and LA/LB [T, H] fp32",
    kernels=[KernelRef(KERNELS, "_merge_attn_states_kernel", ("stride_oat", "stride_oah", "stride_obt", "stride_obh"))],
    policies=[PolicyRef(LAUNCH, "merge_policy", "ks_pol_merge")],
    c_params=[("int32_t", "a_dtype"), ("int32_t", "b_dtype"), ("const void *", "OA"), ("const void *", "LA"),
              ("const void *", "OB"), ("const void *", "LB"), ("void *", "O"), ("void *", "LSE"), ("int64_t", "T"),
              ("int64_t", "H"), ("int64_t", "D"), ("int64_t", "stride_oat"), ("int64_t", "stride_oah"),
              ("int64_t", "stride_obt"), ("int64_t", "stride_obh"), ("int64_t", "stride_lat"), ("int64_t", "stride_lah"),
              ("int64_t", "stride_lbt"), ("int64_t", "stride_lbh")],
    c_body=r"""
  /* kernelset.ops.attention.launch.merge_attn_states */
  const int64_t rows = T * H;
  if (rows == 0 || D == 0) return KS_OK;
  ks_pol_merge_t p;
  if (ks_pol_merge(rows, D, &p)) return ks_gen_policy_failed(err, errlen, "merge_policy");
  void *lse = LSE ? LSE : ks_cuda_plan_scratch(plan, rows * 4);
  return ks_k_merge_attn_states_kernel(plan, err, errlen, p.grid, 1, 1, p.num_warps, -1, 1,
      OA, a_dtype, LA, KS_DT_F32, OB, b_dtype, LB, KS_DT_F32, O, a_dtype, lse, KS_DT_F32, rows, H,
      stride_oat, stride_oah, stride_obt, stride_obh, stride_lat, stride_lah, stride_lbt, stride_lbh,
      D, p.block_r, p.block_d);
""",
    cases=_merge_cases,
    python=_merge_python,
    c_args=_merge_c_args,
    placed=lambda c, launches: {} if c["lse"] else {"LSE": ("scratch", 0)},
    both_aligns=False,
)


# ---------------------------------------------------------------------------------------------
# flash_attention (dense) and flash_attention_varlen, forward

DENSE = dict(b=2, sq=100, sk=100, hq=32, hkv=8, d=128, dv=128, dtype="bf16", varlen=False, qlens=None, klens=None,
             causal=True, window=(-1, -1), softcap=0.0, sinks=False, lse=True, cc=90)


def _flash_cases(which: str) -> list[dict]:
    if which == "test":
        return [DENSE,  # causal, Llama GQA, sm_90 tiles
                dict(DENSE, dtype="fp16", varlen=True, qlens=(37, 1, 64), klens=(37, 100, 64), hq=8, hkv=2, d=64, dv=64,
                     window=(16, 0), softcap=20.0, sinks=True, lse=False),  # varlen, gpt-oss / Gemma features
                dict(DENSE, b=1, sq=30, sk=50, dtype="fp32", causal=False, hq=4, hkv=4, d=80, dv=80),  # fp32, D 80
                # GPU checks: causal prefill of 2 x 4096 tokens, and the same as varlen (4 sequences)
                dict(DENSE, sq=4096, sk=4096, gpu="flash_attention"),
                dict(DENSE, b=4, varlen=True, qlens=(4096, 1000, 3000, 100), klens=(4096, 1000, 3000, 100),
                     gpu="flash_attention_varlen")]
    if which == "full":
        return [dict(DENSE, b=1, sq=1, sk=1, hq=hq, hkv=hkv, d=d, dv=d, dtype=dt, varlen=v, qlens=(1,) if v else None,
                     klens=(1,) if v else None, causal=causal, cc=cc)
                for d, hq, hkv in ((64, 8, 8), (128, 32, 8), (128, 32, 4), (128, 64, 8), (256, 16, 8))
                for dt in ("fp16", "bf16") for v in (False, True) for causal in (False, True) for cc in (80, 90)]
    if which == "release":  # ops/models.py: each known model's prefill on every known arch
        from . import models as mm
        out = []
        for hq, hkv, d, windows, cap, sinks in _model_attention():
            for dt, window, v, lse, cc, s in itertools.product(mm.DTYPES, windows, (False, True), (True, False),
                                                             mm.archs(), (1, 100, 4096)):
                out.append(dict(DENSE, b=1, sq=s, sk=s, hq=hq, hkv=hkv, d=d, dv=d, dtype=dt, varlen=v,
                                qlens=(s,) if v else None, klens=(s,) if v else None, window=window, softcap=cap,
                                sinks=sinks, lse=lse, cc=cc))
        return out
    out = []
    for sq, sk in ((1, 1), (1, 300), (100, 100), (129, 1000), (4096, 4096)):
        for hq, hkv, d, dv in ((32, 8, 128, 128), (8, 8, 64, 64), (16, 2, 256, 256), (4, 1, 80, 80), (8, 8, 192, 128)):
            for cc in (80, 90):
                out.append(dict(DENSE, sq=sq, sk=sk, hq=hq, hkv=hkv, d=d, dv=dv, cc=cc, causal=sq != 129))
    out += [dict(DENSE, varlen=True, b=3, qlens=q, klens=k, window=w, lse=lse)
            for q, k in (((5, 0, 7), (5, 3, 7)), ((1, 1, 1), (100, 1, 1000)), ((64, 64, 64), (64, 64, 64)))
            for w in ((-1, -1), (32, 0), (3, 5)) for lse in (True, False)]
    out += [dict(DENSE, b=0), dict(DENSE, sq=0), dict(DENSE, softcap=50.0, sinks=True, window=(10, 10), causal=False),
            dict(DENSE, q_layout="bhsd"), dict(DENSE, misalign=["K"])]
    return out


def _flash_geom(c: dict):
    if c["varlen"]:
        return len(c["qlens"]), max(c["qlens"]), max(c["klens"]), sum(c["qlens"]), sum(c["klens"])
    return c["b"], c["sq"], c["sk"], None, None


def _flash_tensors(c: dict):
    """(q, k, v) shapes and strides; q_layout bhsd: q a [B, S, H, D] view of a [B, H, S, D] tensor."""
    b, sq, sk, tq, tk = _flash_geom(c)
    hq, hkv, d, dv = c["hq"], c["hkv"], c["d"], c["dv"]
    if c["varlen"]:
        return [((tq, hq, d), (hq * d, d, 1)), ((tk, hkv, d), (hkv * d, d, 1)), ((tk, hkv, dv), (hkv * dv, dv, 1))]
    qst = (hq * sq * d, d, sq * d, 1) if c.get("q_layout") == "bhsd" else (sq * hq * d, hq * d, d, 1)
    return [((b, sq, hq, d), qst), ((b, sk, hkv, d), (sk * hkv * d, hkv * d, d, 1)),
            ((b, sk, hkv, dv), (sk * hkv * dv, hkv * dv, dv, 1))]


def _flash_python(c: dict):
    launch = mod(LAUNCH)
    b, sq, sk, tq, tk = _flash_geom(c)
    (qs, qst), (ks, kst), (vs, vst) = _flash_tensors(c)
    q, k, v = meta(qs, c["dtype"], qst), meta(ks, c["dtype"], kst), meta(vs, c["dtype"], vst)
    cuq = meta((b + 1,), "i32") if c["varlen"] else None
    cuk = meta((b + 1,), "i32") if c["varlen"] else None
    sinks = meta((c["hq"],), "fp32") if c["sinks"] else None
    out, lse = launch.flash_attention_fwd(q, k, v, cuq, cuk, sq, sk, c["causal"], 1.0 / math.sqrt(c["d"]), c["window"],
                                          c["softcap"], sinks, c["lse"])
    return dict(Q=q, K=k, V=v, CUQ=cuq, CUK=cuk, SINKS=sinks, OUT=out, LSE=lse)


def _flash_c_args(c: dict) -> list:
    b, sq, sk, tq, tk = _flash_geom(c)
    hq, hkv, d, dv = c["hq"], c["hkv"], c["d"], c["dv"]
    (_, qst), (_, kst), (_, vst) = _flash_tensors(c)
    if c["varlen"]:
        qst, kst, vst = (0, *qst[:2]), (0, *kst[:2]), (0, *vst[:2])
        ost, lst = (0, hq * dv, dv), (0, tq)
    else:
        qst, kst, vst = qst[:3], kst[:3], vst[:3]
        ost, lst = (sq * hq * dv, hq * dv, dv), (hq * sq, sq)
    return [c["dtype"], "Q", "K", "V", "OUT", "LSE" if c["lse"] else None, "SINKS" if c["sinks"] else None,
            "CUQ" if c["varlen"] else None, "CUK" if c["varlen"] else None, b, sq, sk, tq or 0, hq, hkv, d, dv,
            *qst, *kst, *vst, *ost, *lst, 1.0 / math.sqrt(d), c["softcap"], c["window"][0], c["window"][1],
            int(c["causal"])]


FLASH_FWD = Op(
    name="flash_fwd",
    launcher="kernelset.ops.attention.launch.flash_attention_fwd",
    doc="flash_attention / flash_attention_varlen forward: OUT [B, Sq, Hq, Dv] / [T, Hq, Dv] and LSE [B, Hq, Sq] / "
        "[Hq, T] fp32 (token stride 1; NULL: discarded); varlen iff CUQ (then CUK, batch strides 0)",
    kernels=[KernelRef(KERNELS, "_flash_attn_fwd_kernel",
                       ("stride_qb", "stride_qs", "stride_qh", "stride_kb", "stride_ks", "stride_kh", "stride_vb",
                        "stride_vs", "stride_vh", "stride_ob", "stride_os", "stride_oh"))],
    policies=[PolicyRef(LAUNCH, "flash_policy", "ks_pol_flash", tuples={"arch": 2})],
    c_params=[("int32_t", "dtype"), ("const void *", "Q"), ("const void *", "K"), ("const void *", "V"),
              ("void *", "OUT"), ("void *", "LSE"), ("const void *", "SINKS"), ("const void *", "CUQ"),
              ("const void *", "CUK"), ("int64_t", "B"), ("int64_t", "Sq"), ("int64_t", "Sk"), ("int64_t", "Tq"),
              ("int64_t", "Hq"), ("int64_t", "Hkv"), ("int64_t", "D"), ("int64_t", "DV"),
              ("int64_t", "stride_qb"), ("int64_t", "stride_qs"), ("int64_t", "stride_qh"),
              ("int64_t", "stride_kb"), ("int64_t", "stride_ks"), ("int64_t", "stride_kh"),
              ("int64_t", "stride_vb"), ("int64_t", "stride_vs"), ("int64_t", "stride_vh"),
              ("int64_t", "stride_ob"), ("int64_t", "stride_os"), ("int64_t", "stride_oh"),
              ("int64_t", "stride_lb"), ("int64_t", "stride_lh"), ("double", "scale"), ("double", "softcap"),
              ("int64_t", "window_left"), ("int64_t", "window_right"), ("int", "causal")],
    c_body=r"""
  /* kernelset.ops.attention.launch.flash_attention_fwd. Dense: B, Sq, Sk are the shapes; varlen
   * (CUQ, CUK [B+1]): Sq, Sk are max_seqlen_q/k and Tq = q's rows. Dense with Sk = 0: Python
   * fills out/lse with torch ops; here the kernel runs with K = V = Q (never read: no key) and
   * writes the same out 0 and lse -inf (or the sink). */
  const int varlen = CUQ != NULL;
  if ((CUK != NULL) != varlen) return ks_gen_invalid(err, errlen, "flash_attention: CUQ and CUK go together");
  if (Hkv <= 0 || Hq % Hkv) return ks_gen_invalid(err, errlen, "flash_attention: Hq must be a multiple of Hkv");
  if ((varlen ? Tq : B * Sq) * Hq * D == 0 || B == 0 || Sq == 0) return KS_OK;
  if (!varlen && Sk == 0) {
    K = Q;
    V = Q;
  }
  ks_pol_flash_t p;
  if (ks_pol_flash(D, DV, cc / 10, cc % 10, &p)) return ks_gen_policy_failed(err, errlen, "flash_policy");
  int64_t left = window_left, right = window_right;
  if (causal) right = right < 0 ? 0 : ks_pol_min(right, 0);
  const double log2e = 1.4426950408889634;
  const double qk_mul = softcap > 0 ? scale / softcap : scale * log2e;
  const double cap_mul = softcap > 0 ? softcap * log2e : 1.0;
  void *lse = LSE;
  if (!lse) {
    lse = ks_cuda_plan_scratch(plan, (varlen ? Hq * Tq : B * Hq * Sq) * 4);
    stride_lb = varlen ? 0 : Hq * Sq;
    stride_lh = varlen ? Tq : Sq;
  }
  return ks_k_flash_attn_fwd_kernel(plan, err, errlen, ks_gen_cdiv(Sq, p.block_m), B * Hq, 1, p.num_warps,
      p.num_stages, 1, Q, dtype, K, dtype, V, dtype, OUT, dtype, lse, KS_DT_F32, SINKS, KS_DT_F32, CUQ, KS_DT_I32,
      CUK, KS_DT_I32, qk_mul, cap_mul, left, right, Sq, Sk, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks,
      stride_kh, stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, Hq,
      Hq / Hkv, D, DV, p.block_m, p.block_n, ks_pol_max(ks_gen_pow2(D), 16), ks_pol_max(ks_gen_pow2(DV), 16), varlen,
      right >= 0, left >= 0, softcap > 0, SINKS != NULL, dtype == KS_DT_F32);
""",
    cases=_flash_cases,
    python=_flash_python,
    c_args=_flash_c_args,
    modules=(LAUNCH,),
    placed=lambda c, launches: {} if c["lse"] else {"LSE": ("scratch", 0)},
    both_aligns=False,
)
