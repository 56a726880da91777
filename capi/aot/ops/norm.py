"""rms_norm, fused_add_rms_norm and layer_norm forward (one kernel pair, one glue)."""
from __future__ import annotations

import itertools

from record import meta

from .base import KernelRef, Op, PolicyRef, align256, mod, pow2s

# ---------------------------------------------------------------------------------------------
# norm: rms_norm and fused_add_rms_norm forward (layer_norm shares the kernels and the glue)

def _norm_cases(which: str) -> list[dict]:
    base = dict(m=7, rms=True, gemma=False, res=False, stats=False, w="same", eps=1e-6, offset=0.0, sms=132)
    if which == "test":
        return [dict(base, n=4096, x="bf16"),  # Llama hidden, aligned: the smoke program's case
                dict(base, n=4096, x="bf16", res=True),  # fused add
                dict(base, n=4096, x="bf16", gemma=True, offset=1.0),  # Gemma
                dict(base, n=1000, x="fp32"),  # fp32, n % 16 != 0 -> the unaligned variant
                dict(base, n=1000, x="fp32", res=True),
                dict(base, n=100, x="bf16", w=None),  # no weight, 16 rows per program
                dict(base, n=40000, x="bf16"),  # looped kernel (row wider than 16384)
                dict(base, n=140000, x="bf16", res=True),  # split kernel (rows of 131072 and wider), 18 per row
                dict(base, n=140000, x="fp32", rms=False, bias=True, stats=True, gemma=True),  # split LayerNorm
                # the fallback (align16) variant, which the smoke program runs: no exact variant has M = 1
                # (fused add: plain RMSNorm's two-pass kernel takes no M, so its exact variant would serve)
                dict(base, m=1, n=4096, x="bf16", res=True, generic=True),
                # GPU checks: x and y 256 MB each
                dict(base, m=32768, n=4096, x="bf16", gpu="rms_norm"),
                dict(base, m=512, n=262144, x="bf16", gpu="rms_norm_wide"),  # the split kernel
                dict(base, m=32768, n=4096, x="bf16", res=True, gpu="fused_add_rms_norm"),
                # (the Python layer_norm backend calls norm_fwd with gemma_cast=True: one rounding)
                dict(base, m=32768, n=4096, x="bf16", rms=False, bias=True, eps=1e-5, gemma=True, gpu="layer_norm")]
    if which == "full":
        out = []
        ns = pow2s(1, 16384) + [32768]  # one n per policy bucket (block = next pow2), then looped
        for x, w, res, gemma, n in itertools.product(("fp32", "fp16", "bf16"), ("same", "fp32", None), (False, True),
                                                     (False, True), ns):
            if (x == "fp32" and w == "fp32") or (w is None and gemma):
                continue
            out.append(dict(base, n=n, x=x, w=w, res=res, gemma=gemma))
        return out
    if which == "release":  # ops/models.py: every norm width of the known models, decode to prefill
        from . import models as mm
        widths = set()
        for f in mm.models():
            gemma, rms = f.norm_offset == 1.0, f.norm == "rms_norm"
            widths.add((f.hidden, rms, gemma, True))  # the decoder norms, alone and with the residual add
            if f.qk_norm == "head":
                widths.add((f.head_dim, rms, gemma, False))
            if f.qk_norm == "full":
                widths |= {(f.heads * f.head_dim, rms, gemma, False), (f.kv_heads * f.head_dim, rms, gemma, False)}
            if f.mla:  # DeepSeek's latent norms
                widths |= {(w, rms, gemma, False) for w in (f.mla["q_lora_rank"], f.mla["kv_lora_rank"]) if w}
        return [dict(base, m=m, n=n, x=dt, res=res, gemma=gemma, offset=float(gemma), rms=rms, bias=not rms,
                     sms=sms)
                for n, rms, gemma, fused in sorted(widths) for dt in mm.DTYPES for res in ((False, True) if fused
                                                                                      else (False,))
                for m in mm.TOKENS for sms in mm.sm_counts()]
    # sweep: every n to 300, around each power of two, odd sizes; batch sizes; strides; SM counts
    ns = sorted(set(range(1, 300)) | {v + d for v in pow2s(256, 262144) for d in (-1, 0, 1)} | {4097, 5120, 7168})
    out = [dict(base, n=n, x="bf16", m=m) for n in ns for m in (1, 3)]
    out += [dict(base, n=n, x=x, m=m, res=res, sms=sms, gemma=res, offset=float(res))
            for n in (128, 4096, 4100, 20000, 65536) for x in ("fp32", "bf16") for m in (0, 1, 17, 4096, 100000)
            for res in (False, True) for sms in (1, 132)]
    out += [dict(base, n=4096, x="bf16", m=5, x_stride=4096 * 3, out_stride=8192),  # strided rows in and out
            dict(base, n=4096, x="bf16", m=5, res=True, inplace=True),  # fused add, out = x
            dict(base, n=4096, x="bf16", m=5, misalign=["X"]),  # a misaligned pointer
            dict(base, n=4096, x="fp16", m=5, stats=True),  # training forward stores rstd
            dict(base, n=4096, x="bf16", m=5, rms=False, stats=True, bias=True, gemma=True),  # layer_norm
            dict(base, n=40000, x="fp32", m=5, rms=False, stats=True, bias=True, w=None, gemma=True)]
    return out


def _norm_python(c: dict):
    launch = mod("kernelset.ops.norm.launch")
    m, n = c["m"], c["n"]
    x = meta((m, n), c["x"], (c.get("x_stride", n), 1))
    wdt = c["x"] if c["w"] == "same" else c["w"]
    w = meta((n,), wdt) if c["w"] else None
    b = meta((n,), wdt or c["x"]) if c.get("bias") else None
    r = meta((m, n), c["x"]) if c["res"] else None
    out = x if c.get("inplace") else (meta((m, n), c["x"], (c["out_stride"], 1)) if c.get("out_stride") else None)
    y, h, mean, rstd = launch.norm_fwd(x, w, b, eps=c["eps"], offset=c["offset"], is_rms=c["rms"],
                                       gemma_cast=c["gemma"], stats=c["stats"], residual=r, out=out)
    names = dict(X=x, W=w, B=b, R=r, H=h, MEAN=mean, RSTD=rstd)
    if not c.get("inplace"):
        names["Y"] = y
    return names


def _norm_placed(c: dict, launches: list) -> dict:
    """The split kernel's partials and counters, in the discard buffer in that order."""
    split = [dict((p[0], p[3]) for p in ln["params"]) for ln in launches if ln["kernel"] == "_norm_fwd_split_kernel"]
    if not split:
        return {}
    part_bytes = c["m"] * (1 if c["rms"] else 2) * split[0]["SPLIT_P2"] * 4
    return {"~PART": ("scratch", 0), "~SYNC": ("scratch", align256(part_bytes))}


def _norm_c_args(c: dict) -> list:
    m, n = c["m"], c["n"]
    wdt = c["x"] if c["w"] == "same" else c["w"]
    return [c["x"], wdt or c["x"], "X", "R" if c["res"] else None, "W" if c["w"] else None,
            "B" if c.get("bias") else None, "X" if c.get("inplace") else "Y", "H" if c["res"] else None,
            "MEAN" if c["stats"] and not c["rms"] else None, "RSTD" if c["stats"] else None,
            m, n, c.get("x_stride", n), n if c["res"] else 0, c.get("out_stride", c.get("x_stride", n) if c.get("inplace") else n),
            n if c["res"] else 0, c["eps"], c["offset"], int(c["rms"]), int(c["gemma"])]


NORM_FWD = Op(
    name="norm_fwd",
    launcher="kernelset.ops.norm.launch.norm_fwd",
    doc="rms_norm / fused_add_rms_norm / layer_norm forward: y = norm(x [+ r]) * (offset + w) [+ b]",
    kernels=[KernelRef("kernelset.ops.norm.kernels", "_norm_fwd_kernel",
                       ("N", "stride_x", "stride_r", "stride_y", "stride_h")),
             KernelRef("kernelset.ops.norm.kernels", "_rms_fwd_two_pass_kernel", ("N", "stride_x", "stride_y")),
             KernelRef("kernelset.ops.norm.kernels", "_norm_fwd_looped_kernel",
                       ("N", "stride_x", "stride_r", "stride_y", "stride_h")),
             KernelRef("kernelset.ops.common.row_barrier", "_row_barrier_zero_kernel", ()),
             KernelRef("kernelset.ops.norm.kernels", "_norm_fwd_split_kernel",
                       ("N", "stride_x", "stride_r", "stride_y", "stride_h"))],
    policies=[PolicyRef("kernelset.ops.norm.policy", "fwd_policy", "ks_pol_norm_fwd",
                        lambda mod: {"t": mod.DEFAULT_TUNING}),
              PolicyRef("kernelset.ops.norm.policy", "fwd_split_policy", "ks_pol_norm_fwd_split",
                        lambda mod: {"t": mod.DEFAULT_TUNING})],
    c_params=[("int32_t", "x_dtype"), ("int32_t", "w_dtype"),
              ("const void *", "X"), ("const void *", "R"), ("const void *", "W"), ("const void *", "B"),
              ("void *", "Y"), ("void *", "H"), ("void *", "MEAN"), ("void *", "RSTD"),
              ("int64_t", "M"), ("int64_t", "N"), ("int64_t", "stride_x"), ("int64_t", "stride_r"),
              ("int64_t", "stride_y"), ("int64_t", "stride_h"), ("double", "eps"), ("double", "offset"),
              ("int", "is_rms"), ("int", "gemma_cast")],
    c_body=r"""
  /* kernelset.ops.norm.launch.norm_fwd: x, residual, weight, bias and y share x's dtype except
   * weight/bias (w_dtype); mean/rstd are fp32 and written only for training (stats). */
  if ((R == NULL) != (H == NULL)) return ks_gen_invalid(err, errlen, "norm_fwd: R and H go together (h = x + residual)");
  if (is_rms && MEAN) return ks_gen_invalid(err, errlen, "norm_fwd: RMSNorm stores no mean");
  if (!is_rms && (MEAN == NULL) != (RSTD == NULL)) return ks_gen_invalid(err, errlen, "norm_fwd: LayerNorm stats need MEAN and RSTD");
  if (M == 0) return KS_OK;
  ks_pol_norm_fwd_t p;
  if (ks_pol_norm_fwd(M, N, sms, is_rms && R == NULL, &p)) return ks_gen_policy_failed(err, errlen, "fwd_policy");
  if (p.looped) {
    ks_pol_norm_fwd_split_t sp;
    if (ks_pol_norm_fwd_split(N, sms, &sp)) return ks_gen_policy_failed(err, errlen, "fwd_split_policy");
    if (sp.split) {
      /* the split kernel (kernelset/ops/common/row_barrier.py): partials, then the zeroed counters,
       * in the discard buffer, as the launcher's torch.empty ones */
      void *part = ks_cuda_plan_scratch(plan, M * (is_rms ? 1 : 2) * sp.split_p2 * 4);
      void *sync = ks_cuda_plan_scratch(plan, (M + 1) * 4);
      ks_status_t s = ks_k_row_barrier_zero_kernel(plan, err, errlen,
          (M + KS_ROW_BARRIER_ZERO_BLOCK) / KS_ROW_BARRIER_ZERO_BLOCK, 1, 1, 4, -1, 1, sync, KS_DT_I32, M + 1,
          KS_ROW_BARRIER_ZERO_BLOCK);
      if (s != KS_OK) return s;
      return ks_k_norm_fwd_split_kernel(plan, err, errlen, M * sp.split, 1, 1, sp.num_warps, -1, 0,
          X, x_dtype, R, x_dtype, W, w_dtype, B, w_dtype, Y, x_dtype, H, x_dtype, MEAN, KS_DT_F32, RSTD, KS_DT_F32,
          part, KS_DT_F32, sync, KS_DT_I32, M, N, sp.split, stride_x, stride_r, stride_y, stride_h, eps, offset,
          is_rms, R != NULL, W != NULL, B != NULL, gemma_cast, RSTD != NULL, sp.chunk, sp.split_p2, 0);
    }
  }
  if (p.looped)
    return ks_k_norm_fwd_looped_kernel(plan, err, errlen, p.grid, 1, 1, p.num_warps, -1, 1,
        X, x_dtype, R, x_dtype, W, w_dtype, B, w_dtype, Y, x_dtype, H, x_dtype, MEAN, KS_DT_F32, RSTD, KS_DT_F32,
        M, N, stride_x, stride_r, stride_y, stride_h, eps, offset,
        is_rms, R != NULL, W != NULL, B != NULL, gemma_cast, RSTD != NULL, p.block_n);
  if (p.two_pass)
    return ks_k_rms_fwd_two_pass_kernel(plan, err, errlen, p.grid, 1, 1, p.num_warps, -1, 1,
        X, x_dtype, W, w_dtype, Y, x_dtype, RSTD, KS_DT_F32, N, stride_x, stride_y, eps, offset,
        W != NULL, gemma_cast, RSTD != NULL, p.block_n, N % p.block_n == 0, offset != 0.0);
  return ks_k_norm_fwd_kernel(plan, err, errlen, p.grid, 1, 1, p.num_warps, -1, 1,
      X, x_dtype, R, x_dtype, W, w_dtype, B, w_dtype, Y, x_dtype, H, x_dtype, MEAN, KS_DT_F32, RSTD, KS_DT_F32,
      M, N, stride_x, stride_r, stride_y, stride_h, eps, offset,
      is_rms, R != NULL, W != NULL, B != NULL, gemma_cast, RSTD != NULL, p.rows, p.block_n, N == p.block_n,
      offset != 0.0);
""",
    cases=_norm_cases,
    python=_norm_python,
    c_args=_norm_c_args,
    placed=_norm_placed,
    modules=("kernelset.ops.norm.launch",),
)
