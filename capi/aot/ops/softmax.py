"""softmax and log_softmax forward (temperature folded into inv_t)."""
from __future__ import annotations

from record import TORCH_BY_NAME, meta

from .base import KernelRef, Op, PolicyRef, align256, mod, pow2s

# ---------------------------------------------------------------------------------------------
# softmax / log_softmax forward

def _softmax_cases(which: str) -> list[dict]:
    base = dict(temperature=1.0, log=False, sms=132)
    if which == "test":
        return [dict(base, m=3, n=32000, dtype="bf16"),  # 32000 -> block 32768 > 16384: the split kernel
                dict(base, m=3, n=40000, dtype="bf16", sms=2),  # 5 split programs would not fit 2 SMs: looped
                dict(base, m=3, n=1000, dtype="fp32", log=True, temperature=0.5),
                dict(base, m=64, n=128, dtype="fp16"),
                # GPU checks: x 256 MB, rows kept whole, then looped over a vocabulary
                dict(base, m=32768, n=4096, dtype="bf16", gpu="softmax"),
                dict(base, m=32768, n=4096, dtype="bf16", log=True, temperature=0.7, gpu="log_softmax"),
                dict(base, m=4096, n=32000, dtype="bf16", gpu="softmax_vocab")]
    if which == "full":
        return [dict(base, m=1, n=n, dtype=dt, log=log) for dt in ("fp32", "fp16", "bf16") for log in (False, True)
                for n in pow2s(1, 16384) + [32768]]
    if which == "release":  # ops/models.py: sampling over each known vocabulary (bf16/fp16 or fp32 logits)
        from . import models as mm
        return [dict(base, m=m, n=v, dtype=dt, log=log, sms=sms) for v in sorted({f.vocab for f in mm.models()})
                for dt in mm.DTYPES + ("fp32",) for log in (False, True) for m in mm.TOKENS for sms in mm.sm_counts()]
    out = [dict(base, m=m, n=n, dtype="bf16") for m in (0, 1, 5, 4096) for n in
           sorted(set(range(1, 70)) | {v + d for v in pow2s(128, 262144) for d in (-1, 0, 1)} | {32000, 128256, 151936})]
    out += [dict(base, m=m, n=n, dtype="fp32", sms=sms, log=True, temperature=0.7) for m in (1, 700, 100000)
            for n in (100, 50000) for sms in (1, 108, 132)]
    out += [dict(base, m=4, n=4096, dtype="fp16", x_stride=5000, out_dtype="fp32"),
            dict(base, m=4, n=4096, dtype="bf16", misalign=["X"])]
    return out


def _softmax_python(c: dict):
    launch = mod("kernelset.ops.softmax.launch")
    x = meta((c["m"], c["n"]), c["dtype"], (c.get("x_stride", c["n"]), 1))
    y = launch.softmax_fwd(x, c["temperature"], c["log"], TORCH_BY_NAME[c.get("out_dtype", c["dtype"])])
    return dict(X=x, Y=y)


def _softmax_placed(c: dict, launches: list) -> dict:
    """The split kernel's partials and counters, in the discard buffer in that order."""
    split = [dict((p[0], p[3]) for p in ln["params"]) for ln in launches if ln["kernel"] == "_softmax_fwd_split_kernel"]
    if not split:
        return {}
    part_bytes = c["m"] * 2 * split[0]["SPLIT_P2"] * 4
    return {"~PART": ("scratch", 0), "~SYNC": ("scratch", align256(part_bytes))}


def _row_barrier_decls() -> str:
    return ("/* kernelset.ops.common.row_barrier.ZERO_BLOCK: counters zeroed per program of\n"
            " * _row_barrier_zero_kernel (before every split kernel: softmax_fwd, norm_fwd) */\n"
            f"#define KS_ROW_BARRIER_ZERO_BLOCK {mod('kernelset.ops.common.row_barrier').ZERO_BLOCK}")


def _softmax_c_args(c: dict) -> list:
    return [c["dtype"], c.get("out_dtype", c["dtype"]), "X", "Y", c["m"], c["n"], c.get("x_stride", c["n"]), c["n"],
            1.0 / c["temperature"], int(c["log"])]


SOFTMAX_FWD = Op(
    name="softmax_fwd",
    launcher="kernelset.ops.softmax.launch.softmax_fwd",
    doc="softmax / log_softmax over the last dim: y = softmax(x * inv_t); inv_t = 1 / temperature in double",
    kernels=[KernelRef("kernelset.ops.softmax.kernels", "_softmax_fwd_kernel", ("N", "stride_x", "stride_y")),
             KernelRef("kernelset.ops.softmax.kernels", "_softmax_fwd_looped_kernel", ("N", "stride_x", "stride_y")),
             KernelRef("kernelset.ops.common.row_barrier", "_row_barrier_zero_kernel", ()),
             KernelRef("kernelset.ops.softmax.kernels", "_softmax_fwd_split_kernel", ("N", "stride_x", "stride_y"))],
    policies=[PolicyRef("kernelset.ops.softmax.launch", "policy", "ks_pol_softmax",
                        lambda mod: {"t": mod.SoftmaxTuning(), "max_block": mod.SoftmaxTuning().max_block_fwd}),
              PolicyRef("kernelset.ops.softmax.launch", "split_policy", "ks_pol_softmax_split",
                        lambda mod: {"t": mod.SoftmaxTuning(), "max_block": mod.SoftmaxTuning().max_block_fwd,
                                     "chunk": mod.SoftmaxTuning().split_chunk_fwd,
                                     "min_block": mod.SoftmaxTuning().split_min_fwd,
                                     "looped_block": mod.SoftmaxTuning().looped_only_fwd})],
    c_params=[("int32_t", "x_dtype"), ("int32_t", "y_dtype"), ("const void *", "X"), ("void *", "Y"),
              ("int64_t", "M"), ("int64_t", "N"), ("int64_t", "stride_x"), ("int64_t", "stride_y"),
              ("double", "inv_t"), ("int", "log")],
    c_body=r"""
  /* kernelset.ops.softmax.launch.softmax_fwd (the policies' max_block etc. are the forward's) */
  if (M == 0) return KS_OK;
  ks_pol_softmax_split_t sp;
  /* esize: x's element size (fp32 4, fp16/bf16 2) */
  if (ks_pol_softmax_split(N, x_dtype == KS_DT_F32 ? 4 : 2, sms, &sp)) return ks_gen_policy_failed(err, errlen, "split_policy");
  if (sp.split) {
    /* the split kernel (kernelset/ops/common/row_barrier.py): partials, then the zeroed counters,
     * in the discard buffer, as the launcher's torch.empty ones */
    void *part = ks_cuda_plan_scratch(plan, M * 2 * sp.split_p2 * 4);
    void *sync = ks_cuda_plan_scratch(plan, (M + 1) * 4);
    ks_status_t s = ks_k_row_barrier_zero_kernel(plan, err, errlen,
        (M + KS_ROW_BARRIER_ZERO_BLOCK) / KS_ROW_BARRIER_ZERO_BLOCK, 1, 1, 4, -1, 1, sync, KS_DT_I32, M + 1,
        KS_ROW_BARRIER_ZERO_BLOCK);
    if (s != KS_OK) return s;
    return ks_k_softmax_fwd_split_kernel(plan, err, errlen, M * sp.split, 1, 1, sp.num_warps, -1, 0,
        X, x_dtype, Y, y_dtype, part, KS_DT_F32, sync, KS_DT_I32, M, N, sp.split, stride_x, stride_y, inv_t, log,
        sp.chunk, sp.split_p2, 0);
  }
  ks_pol_softmax_t p;
  if (ks_pol_softmax(M, N, sms, &p)) return ks_gen_policy_failed(err, errlen, "policy");
  if (p.looped)
    return ks_k_softmax_fwd_looped_kernel(plan, err, errlen, p.grid, 1, 1, p.num_warps, -1, 1,
        X, x_dtype, Y, y_dtype, M, N, stride_x, stride_y, inv_t, log, p.block_n, p.ept);
  return ks_k_softmax_fwd_kernel(plan, err, errlen, p.grid, 1, 1, p.num_warps, -1, 1,
      X, x_dtype, Y, y_dtype, M, N, stride_x, stride_y, inv_t, log, p.rows, p.block_n);
""",
    cases=_softmax_cases,
    python=_softmax_python,
    c_args=_softmax_c_args,
    modules=("kernelset.ops.softmax.launch",),
    placed=_softmax_placed,
    c_decls=_row_barrier_decls,
)
