"""cross_entropy forward, per row (reduction none; mean and sum are torch reductions in Python)."""
from __future__ import annotations

from record import meta

from .base import KernelRef, Op, PolicyRef, mod


def _ce_cases(which: str) -> list[dict]:
    base = dict(x="bf16", t="i64", ignore_index=-100, smoothing=0.0, z_loss=0.0, softcap=0.0)
    if which == "test":
        return [dict(base, m=7, v=32000),  # Llama-2 vocabulary
                dict(base, m=3, v=1000, x="fp32", t="i32", smoothing=0.1, z_loss=1e-4, softcap=30.0),
                dict(base, m=4096, v=128256, gpu="cross_entropy")]  # GPU checks: 1 GB of logits
    if which == "full":
        return [dict(base, m=1, v=v, x=x, t=t, smoothing=s, softcap=c) for v in (1000, 2048, 16384, 32000)
                for x in ("fp32", "fp16", "bf16") for t in ("i32", "i64") for s in (0.0, 0.1) for c in (0.0, 30.0)]
    if which == "release":  # ops/models.py: each known vocabulary and final softcap; logits in the model dtype or fp32
        from . import models as mm
        shapes = sorted({(f.vocab, float(f.final_softcap or 0.0)) for f in mm.models()})
        return [dict(base, m=m, v=v, softcap=cap, x=x, t=t, smoothing=s, sms=sms) for v, cap in shapes
                for x in mm.DTYPES + ("fp32",) for t in ("i32", "i64") for s in (0.0, 0.1)
                for m in mm.TOKENS for sms in mm.sm_counts()]
    out = [dict(base, m=m, v=v) for m in (0, 1, 5, 3000) for v in (1, 2, 7, 100, 1000, 16384, 16385, 32000, 128256,
                                                                   151936)]
    out += [dict(base, m=4, v=4096, x_stride=5000), dict(base, m=4, v=4096, misalign=["X"]),
            dict(base, m=4, v=4096, ignore_index=5, sms=1), dict(base, m=4, v=4096, smoothing=0.2, x="fp16")]
    return out


def _ce_python(c: dict):
    launch = mod("kernelset.ops.loss.launch")
    x = meta((c["m"], c["v"]), c["x"], (c.get("x_stride", c["v"]), 1))
    t = meta((c["m"],), c["t"])
    loss, dx = launch.ce_fwd(x, t, c["ignore_index"], c["smoothing"], c["z_loss"], c["softcap"], "none", False)
    assert dx is None
    return dict(X=x, TGT=t, LOSS=loss)


def _ce_c_args(c: dict) -> list:
    return [c["x"], c["t"], "X", "TGT", "LOSS", c["m"], c["v"], c.get("x_stride", c["v"]), c["ignore_index"],
            c["smoothing"], c["z_loss"], c["softcap"]]


def _ce_decls() -> str:
    t = mod("kernelset.ops.loss.launch").CETuning()
    return (f"/* kernelset.ops.loss.launch.CETuning().stream_store (the kernel's STREAM_STORE constexpr) */\n"
            f"#define KS_CE_STREAM_STORE {int(t.stream_store)}")


CE_FWD = Op(
    name="ce_fwd",
    launcher="kernelset.ops.loss.launch.ce_fwd",
    doc="cross_entropy forward without a gradient: LOSS [M] fp32 per row of logits X [M, V] at targets TGT [M] "
        "(0 where ignored); reduction none (mean and sum reduce LOSS afterwards)",
    kernels=[KernelRef("kernelset.ops.loss.kernels", "_ce_fwd_kernel", ("stride_x", "stride_dx", "V"))],
    policies=[PolicyRef("kernelset.ops.loss.launch", "ce_fwd_policy", "ks_pol_ce_fwd",
                        lambda m: {"t": m.CETuning(), "need_grad": False})],
    c_params=[("int32_t", "x_dtype"), ("int32_t", "t_dtype"), ("const void *", "X"), ("const void *", "TGT"),
              ("void *", "LOSS"), ("int64_t", "M"), ("int64_t", "V"), ("int64_t", "stride_x"),
              ("int64_t", "ignore_index"), ("double", "smoothing"), ("double", "z_loss"), ("double", "softcap")],
    c_body=r"""
  /* kernelset.ops.loss.launch.ce_fwd(..., reduction="none", need_grad=False); the kernel's LSE
   * output goes to the discard buffer */
  if (M == 0) return KS_OK;
  ks_pol_ce_fwd_t p;
  if (ks_pol_ce_fwd(M, V, sms, &p)) return ks_gen_policy_failed(err, errlen, "ce_fwd_policy");
  void *lse = ks_cuda_plan_scratch(plan, M * 4);
  return ks_k_ce_fwd_kernel(plan, err, errlen, p.grid, 1, 1, p.num_warps, -1, 1,
      X, x_dtype, TGT, t_dtype, LOSS, KS_DT_F32, lse, KS_DT_F32, NULL, x_dtype, NULL, KS_DT_F32,
      M, V, stride_x, V, ignore_index, smoothing, z_loss, softcap,
      softcap != 0.0, smoothing > 0.0, 0, p.block, KS_CE_STREAM_STORE);
""",
    cases=_ce_cases,
    python=_ce_python,
    c_args=_ce_c_args,
    modules=("kernelset.ops.loss.launch",),
    placed=lambda c, launches: {"~LSE": ("scratch", 0)},
    c_decls=_ce_decls,
)
