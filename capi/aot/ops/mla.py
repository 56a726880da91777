"""mla_decode: DeepSeek-V2/V3 multi-head latent attention decode over a paged latent cache."""
from __future__ import annotations

import itertools

from record import meta

from .base import KernelRef, Op, PolicyRef, align256, mod

LAUNCH = "kernelset.ops.mla.launch"
SCALE = 192 ** -0.5  # DeepSeek-V3's softmax scale (qk_nope 128 + qk_rope 64), as ops/mla/bench.py takes it

# DeepSeek-V3 at a small batch: 3 sequences x 1 head tile, so 132 SMs split each context 4 ways
DSV3 = dict(b=3, h=16, r=512, p=64, bs=64, nb=64, width=16, ctx=None, dtype="bf16", cache="bf16", lse=True,
            sms=132)

_RELEASE_DECODE = ((1, 512), (1, 8192), (4, 4096), (8, 32768), (16, 1024), (64, 4096), (256, 2048))


def _mla_cases(which: str) -> list[dict]:
    if which == "test":
        gpu = dict(DSV3, b=64, h=128, nb=64 * 64, width=64)  # B64 ctx4096, 128 heads: 300 MB of bf16 cache
        return [DSV3,  # split-KV (4 splits) + the reduce kernel
                dict(DSV3, cache="fp8e4nv", lse=False),  # fp8 cache (sm_89+), LSE to the discard buffer
                dict(gpu, gpu="mla_decode"),  # GPU checks: 2 head tiles x 64 sequences, 2 splits
                dict(gpu, cache="fp8e4nv", gpu="mla_decode_fp8")]
    if which == "full":
        return [dict(DSV3, b=b, h=h, dtype=dt, cache=cache, nb=b * 16)
                for h in (16, 32, 64, 128) for b in (1, 64)
                for dt, cache in (("bf16", "bf16"), ("fp16", "fp16"), ("bf16", "fp8e4nv"))]
    if which == "release":  # ops/models.py: each known MLA model's heads and latent ranks
        from . import models as mm
        shapes = sorted({(f.heads, f.mla["kv_lora_rank"], f.mla["qk_rope_head_dim"]) for f in mm.models() if f.mla})
        out = []
        # block size 64 only: what FlashMLA requires and vLLM / SGLang use for MLA caches (each split
        # count is a variant of this kernel: every extra block size multiplies them)
        for (h, r, p), dt, cache, bs in itertools.product(shapes, mm.DTYPES, ("same", "fp8e4nv"), (64,)):
            for (b, ctx), sms in itertools.product(_RELEASE_DECODE, mm.sm_counts()):
                width = -(-ctx // bs)
                out.append(dict(DSV3, b=b, h=h, r=r, p=p, bs=bs, width=width, nb=b * width, sms=sms, dtype=dt,
                                cache=dt if cache == "same" else cache))
        return out
    out = []
    for b, width, ctx, sms in ((1, 1, None, 132), (2, 8, None, 4), (5, 64, 1000, 132), (64, 64, None, 132),
                               (7, 512, 20000, 108), (1, 4096, None, 1), (300, 4, None, 132)):
        for h, r, p in ((128, 512, 64), (16, 512, 64), (20, 64, 16), (1, 80, 8)):
            for lse in (True, False):
                out.append(dict(DSV3, b=b, width=width, nb=b * width, ctx=ctx, sms=sms, h=h, r=r, p=p, lse=lse))
    out += [dict(DSV3, b=0), dict(DSV3, h=0), dict(DSV3, dtype="fp16", cache="fp8e4nv"),
            dict(DSV3, dtype="fp32", cache="fp32"), dict(DSV3, dtype="fp16", cache="fp16", bs=1, width=1024),
            dict(DSV3, q_strides=(3 * 16 * 512, 512)), dict(DSV3, misalign=["QN"]), dict(DSV3, ctx=0),
            dict(DSV3, cache="fp8e4nv", h=128, b=64, nb=64 * 16)]
    return out


def _geom(c: dict):
    cap = c["width"] * c["bs"]
    return cap if c["ctx"] is None else min(c["ctx"], cap)


def _mla_python(c: dict):
    launch = mod(LAUNCH)
    b, h, r, p = c["b"], c["h"], c["r"], c["p"]
    qs = c.get("q_strides", (h * r, r))
    qn = meta((b, h, r), c["dtype"], (qs[0], qs[1], 1))
    qp = meta((b, h, p), c["dtype"])
    kv = meta((c["nb"], c["bs"], r + p), c["cache"])
    bt = meta((b, c["width"]), "i32")
    seq = meta((b,), "i32")
    kvs = meta((), "fp32") if c["cache"] == "fp8e4nv" else None
    out, lse = launch.mla_decode(qn, qp, kv, bt, seq, SCALE, kvs, _geom(c))
    return dict(QN=qn, QP=qp, KV=kv, BT=bt, SEQ=seq, KVSCALE=kvs, OUT=out, LSE=lse)


def _mla_c_args(c: dict) -> list:
    b, h, r, p = c["b"], c["h"], c["r"], c["p"]
    qs = c.get("q_strides", (h * r, r))
    fp8 = c["cache"] == "fp8e4nv"
    return [c["dtype"], c["cache"], "QN", "QP", "KV", "BT", "SEQ", "KVSCALE" if fp8 else None, "OUT",
            "LSE" if c["lse"] else None, b, h, r, p, c["nb"], c["bs"], c["width"], _geom(c), qs[0], qs[1], h * p, p,
            c["bs"] * (r + p), r + p, c["width"], SCALE]


def _mla_placed(c: dict, launches: list) -> dict:
    b, h = c["b"], c["h"]
    out = {} if c["lse"] else {"LSE": ("scratch", 0)}
    splits = [dict((p[0], p[3]) for p in ln["params"])["SPLITS"] for ln in launches
              if ln["kernel"] == "_mla_decode_fwd_kernel"]
    if splits and splits[0] > 1:
        at = 0 if c["lse"] else align256(b * h * 4)
        out["~PO"] = ("scratch", at)
        out["~PLSE"] = ("scratch", at + align256(b * h * splits[0] * c["r"] * 4))
    return out


MLA_DECODE = Op(
    name="mla_decode",
    launcher="kernelset.ops.mla.launch.mla_decode",
    doc="mla_decode: OUT [B, H, R] (contiguous, QN's dtype) and LSE [B, H] fp32 (contiguous; NULL: discarded) of "
        "q_nope QN [B, H, R] and q_pe QP [B, H, P] over the paged latent cache KV [num_blocks, block_size, R + P]; "
        "the split-KV partials live in the discard buffer",
    kernels=[KernelRef("kernelset.ops.mla.kernels", "_mla_decode_fwd_kernel",
                       ("stride_qnb", "stride_qnh", "stride_qpb", "stride_qph", "stride_kvb", "stride_kvs")),
             KernelRef("kernelset.ops.attention.kernels", "_paged_attn_reduce_kernel", ())],
    policies=[PolicyRef(LAUNCH, "mla_policy", "ks_pol_mla", lambda m: {"tuning": m.MlaTuning()}, keep=("fp8",)),
              PolicyRef(LAUNCH, "mla_reduce_policy", "ks_pol_mla_reduce")],
    c_params=[("int32_t", "q_dtype"), ("int32_t", "cache_dtype"), ("const void *", "QN"), ("const void *", "QP"),
              ("const void *", "KV"), ("const void *", "BT"), ("const void *", "SEQ"), ("const void *", "KVSCALE"),
              ("void *", "OUT"), ("void *", "LSE"), ("int64_t", "B"), ("int64_t", "H"), ("int64_t", "R"),
              ("int64_t", "P"), ("int64_t", "num_blocks"), ("int64_t", "block_size"), ("int64_t", "max_table"),
              ("int64_t", "max_seq_len"), ("int64_t", "stride_qnb"), ("int64_t", "stride_qnh"),
              ("int64_t", "stride_qpb"), ("int64_t", "stride_qph"), ("int64_t", "stride_kvb"),
              ("int64_t", "stride_kvs"), ("int64_t", "stride_bt"), ("double", "scale")],
    c_body=r"""
  /* kernelset.ops.mla.launch.mla_decode; its torch.empty split-KV partials (and an LSE not asked
   * for) live in the discard buffer, in that order */
  if (B == 0 || H == 0) return KS_OK;
  const int fp8 = cache_dtype == KS_DT_F8E4M3;
  const int64_t max_keys = ks_pol_min(max_seq_len, max_table * block_size);
  ks_pol_mla_t p;
  if (ks_pol_mla(B, H, R, P, max_keys, sms, fp8, &p)) return ks_gen_policy_failed(err, errlen, "mla_policy");
  void *lse = LSE ? LSE : ks_cuda_plan_scratch(plan, B * H * 4);
  void *po = NULL, *plse = NULL;
  if (p.splits > 1) {
    po = ks_cuda_plan_scratch(plan, B * H * p.splits * R * 4);
    plse = ks_cuda_plan_scratch(plan, B * H * p.splits * 4);
  }
  ks_status_t s = ks_k_mla_decode_fwd_kernel(plan, err, errlen, B * p.head_tiles, p.splits, 1, p.num_warps,
      p.num_stages, 1, QN, q_dtype, QP, q_dtype, KV, cache_dtype, BT, KS_DT_I32, SEQ, KS_DT_I32,
      fp8 ? KVSCALE : NULL, KS_DT_F32, OUT, q_dtype, lse, KS_DT_F32, po, KS_DT_F32, plse, KS_DT_F32,
      scale * 1.4426950408889634, H, p.head_tiles, p.partition, num_blocks, max_table, max_keys, stride_qnb,
      stride_qnh, stride_qpb, stride_qph, stride_kvb, stride_kvs, stride_bt, R, P, block_size, p.block_h, p.block_n,
      p.block_r, p.block_p, p.splits, p.lazy, fp8, q_dtype == KS_DT_F32, p.prefetch_pages);
  if (s != KS_OK || p.splits == 1) return s;
  ks_pol_mla_reduce_t r;
  if (ks_pol_mla_reduce(p.splits, &r)) return ks_gen_policy_failed(err, errlen, "mla_reduce_policy");
  return ks_k_paged_attn_reduce_kernel(plan, err, errlen, B * H, 1, 1, r.num_warps, -1, 1,
      po, KS_DT_F32, plse, KS_DT_F32, NULL, KS_DT_F32, OUT, q_dtype, lse, KS_DT_F32,
      p.splits, R, r.block_s, p.block_r, 0, H);
""",
    cases=_mla_cases,
    python=_mla_python,
    c_args=_mla_c_args,
    modules=(LAUNCH,),
    placed=_mla_placed,
    both_aligns=False,
)
