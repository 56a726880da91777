"""cross_entropy forward: the per-row loss, and its mean or sum by the package's reduction kernel."""
from __future__ import annotations

from record import meta

from .base import KernelRef, Op, PolicyRef, align256, mod

REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}  # KS_REDUCTION_* of kernelset.h


def _ce_cases(which: str) -> list[dict]:
    base = dict(x="bf16", t="i64", ignore_index=-100, smoothing=0.0, z_loss=0.0, softcap=0.0, reduction="none")
    if which == "test":
        return [dict(base, m=7, v=32000),  # Llama-2 vocabulary
                dict(base, m=3, v=1000, x="fp32", t="i32", smoothing=0.1, z_loss=1e-4, softcap=30.0),
                dict(base, m=5, v=32000, reduction="mean"),
                dict(base, m=3, v=1000, x="fp32", t="i32", reduction="sum"),
                dict(base, m=4096, v=128256, gpu="cross_entropy"),  # GPU checks: 1 GB of logits
                dict(base, m=4096, v=128256, reduction="mean", gpu="cross_entropy")]
    if which == "full":
        out = [dict(base, m=1, v=v, x=x, t=t, smoothing=s, softcap=c) for v in (1000, 2048, 16384, 32000)
               for x in ("fp32", "fp16", "bf16") for t in ("i32", "i64") for s in (0.0, 0.1) for c in (0.0, 30.0)]
        return out + [dict(base, m=1, v=1000, t=t, reduction=r) for t in ("i32", "i64") for r in ("mean", "sum")]
    if which == "release":  # ops/models.py: each known vocabulary and final softcap; logits in the model dtype or fp32
        from . import models as mm
        shapes = sorted({(f.vocab, float(f.final_softcap or 0.0)) for f in mm.models()})
        out = [dict(base, m=m, v=v, softcap=cap, x=x, t=t, smoothing=s, sms=sms) for v, cap in shapes
               for x in mm.DTYPES + ("fp32",) for t in ("i32", "i64") for s in (0.0, 0.1)
               for m in mm.TOKENS for sms in mm.sm_counts()]
        v, cap = shapes[0]  # the reduction kernel depends only on the target dtype and the reduction
        return out + [dict(base, m=mm.TOKENS[-1], v=v, softcap=cap, t=t, reduction=r) for t in ("i32", "i64")
                      for r in ("mean", "sum")]
    out = [dict(base, m=m, v=v) for m in (0, 1, 5, 3000) for v in (1, 2, 7, 100, 1000, 16384, 16385, 32000, 128256,
                                                                   151936)]
    out += [dict(base, m=4, v=4096, x_stride=5000), dict(base, m=4, v=4096, misalign=["X"]),
            dict(base, m=4, v=4096, ignore_index=5, sms=1), dict(base, m=4, v=4096, smoothing=0.2, x="fp16"),
            dict(base, m=0, v=100, reduction="mean"), dict(base, m=3000, v=100, reduction="sum", t="i32")]
    return out


def _ce_python(c: dict):
    launch = mod("kernelset.ops.loss.launch")
    x = meta((c["m"], c["v"]), c["x"], (c.get("x_stride", c["v"]), 1))
    t = meta((c["m"],), c["t"])
    loss, dx = launch.ce_fwd(x, t, c["ignore_index"], c["smoothing"], c["z_loss"], c["softcap"], c["reduction"],
                             False)
    assert dx is None
    return dict(X=x, TGT=t, LOSS=loss)


def _ce_c_args(c: dict) -> list:
    return [c["x"], c["t"], "X", "TGT", "LOSS", c["m"], c["v"], c.get("x_stride", c["v"]), c["ignore_index"],
            c["smoothing"], c["z_loss"], c["softcap"], REDUCTIONS[c["reduction"]]]


def _ce_decls() -> str:
    t = mod("kernelset.ops.loss.launch").CETuning()
    return (f"/* kernelset.ops.loss.launch.CETuning().stream_store (the kernel's STREAM_STORE constexpr) */\n"
            f"#define KS_CE_STREAM_STORE {int(t.stream_store)}\n"
            f"/* CETuning().reduce_block and .reduce_warps: _ce_reduce_kernel's launch (one program) */\n"
            f"#define KS_CE_REDUCE_BLOCK {t.reduce_block}\n#define KS_CE_REDUCE_WARPS {t.reduce_warps}")


CE_FWD = Op(
    name="ce_fwd",
    launcher="kernelset.ops.loss.launch.ce_fwd",
    doc="cross_entropy forward without a gradient of logits X [M, V] at targets TGT [M]: LOSS [M] fp32 per row "
        "(0 where ignored) for reduction 0 (none), or a 0-d LOSS with the mean (1) or sum (2) of the rows",
    kernels=[KernelRef("kernelset.ops.loss.kernels", "_ce_fwd_kernel", ("stride_x", "stride_dx", "V")),
             KernelRef("kernelset.ops.loss.kernels", "_ce_reduce_kernel", ())],
    policies=[PolicyRef("kernelset.ops.loss.launch", "ce_fwd_policy", "ks_pol_ce_fwd",
                        lambda m: {"t": m.CETuning(), "need_grad": False})],
    c_params=[("int32_t", "x_dtype"), ("int32_t", "t_dtype"), ("const void *", "X"), ("const void *", "TGT"),
              ("void *", "LOSS"), ("int64_t", "M"), ("int64_t", "V"), ("int64_t", "stride_x"),
              ("int64_t", "ignore_index"), ("double", "smoothing"), ("double", "z_loss"), ("double", "softcap"),
              ("int32_t", "reduction")],
    c_body=r"""
  /* kernelset.ops.loss.launch.ce_fwd(..., reduction, need_grad=False); the kernel's LSE output goes
   * to scratch, and so do the per-row losses of a mean or sum, which ce_reduce then reduces */
  ks_status_t s = KS_OK;
  ks_pol_ce_fwd_t p;
  if (M > 0 && ks_pol_ce_fwd(M, V, sms, &p)) return ks_gen_policy_failed(err, errlen, "ce_fwd_policy");
  void *lse = M > 0 ? ks_cuda_plan_scratch(plan, M * 4) : NULL;
  void *rows = reduction ? ks_cuda_plan_scratch(plan, (M > 0 ? M : 1) * 4) : LOSS; /* M = 0: never read */
  if (M > 0)
    s = ks_k_ce_fwd_kernel(plan, err, errlen, p.grid, 1, 1, p.num_warps, -1, 1,
        X, x_dtype, TGT, t_dtype, rows, KS_DT_F32, lse, KS_DT_F32, NULL, x_dtype, NULL, KS_DT_F32,
        M, V, stride_x, V, ignore_index, smoothing, z_loss, softcap,
        softcap != 0.0, smoothing > 0.0, 0, p.block, KS_CE_STREAM_STORE, p.ept);
  if (s != KS_OK || !reduction) return s;
  return ks_k_ce_reduce_kernel(plan, err, errlen, 1, 1, 1, KS_CE_REDUCE_WARPS, -1, 1,
      rows, KS_DT_F32, TGT, t_dtype, LOSS, KS_DT_F32, M, ignore_index, reduction == 1, KS_CE_REDUCE_BLOCK);
""",
    cases=_ce_cases,
    python=_ce_python,
    c_args=_ce_c_args,
    modules=("kernelset.ops.loss.launch",),
    placed=lambda c, launches: ({"~LSE": ("scratch", 0)} if c["m"] else {}) | (
        {"~LOSS": ("scratch", align256(c["m"] * 4) if c["m"] else 0)} if c["reduction"] != "none" else {}),
    c_decls=_ce_decls,
)
