"""The gated activations and gelu: one kernel, ACT x LAYOUT (silu_and_mul, gelu_and_mul, swiglu,
gelu, swiglu_oai)."""
from __future__ import annotations

from record import meta

from .base import KernelRef, Op, PolicyRef, mod, pow2s

KINDS = {  # C op -> (act, layout, alpha, limit) as kernelset.ops.activation.api passes them
    "silu_and_mul": ("silu", "halves", 0.0, 0.0),
    "gelu_and_mul": ("gelu", "halves", 0.0, 0.0),
    "gelu_tanh_and_mul": ("gelu_tanh", "halves", 0.0, 0.0),
    "swiglu": ("silu", "pair", 0.0, 0.0),
    "gelu": ("gelu", "single", 0.0, 0.0),
    "gelu_tanh": ("gelu_tanh", "single", 0.0, 0.0),
    "swiglu_oai": ("oai", "interleaved", 1.702, 7.0),
}


def _act_cases(which: str) -> list[dict]:
    base = dict(op="silu_and_mul")
    if which == "test":
        out = [dict(base, m=37, i=1024, dtype="bf16"),  # the smoke program's case
               dict(base, m=5, i=1000, dtype="fp32"),  # unaligned
               dict(base, m=1, i=14336, dtype="bf16")]  # decode, Llama-8B MLP width
        out += [dict(op="swiglu_oai", m=5, i=1000, dtype="fp32"), dict(op="gelu_and_mul", m=5, i=1000, dtype="fp16")]
        # GPU checks, every kind: an MLP of Llama-8B over 4096 tokens (x 470 MB)
        out += [dict(op=op, m=4096, i=14336, dtype="bf16", gpu=op) for op in KINDS]
        return out
    if which == "full":
        # block_n follows pow2(i) up to 2048, block_m pow2(m) up to 4096 // block_n
        return [dict(op=op, m=m, i=i, dtype=dt) for op in KINDS for dt in ("fp32", "fp16", "bf16")
                for i in pow2s(1, 2048) for m in pow2s(1, max(1, 4096 // i))]
    if which == "release":  # ops/models.py: every MLP width of the known models, decode to prefill
        from . import models as mm
        shapes = sorted({(op, i) for f in mm.models() for op in mm.act_kinds(f) for i in mm.mlp_widths(f)})
        return [dict(op=op, m=m, i=i, dtype=dt) for op, i in shapes for dt in mm.DTYPES for m in mm.TOKENS]
    ms = (0, 1, 2, 3, 5, 8, 9, 17, 100, 4097, 70000)
    iis = (0, 1, 2, 3, 7, 16, 100, 1000, 1024, 1025, 2048, 2049, 11008, 14336, 28672)
    out = [dict(base, m=m, i=i, dtype="bf16") for m in ms for i in iis]
    out += [dict(op=op, m=m, i=i, dtype="fp16") for op in KINDS for m in (1, 9, 4097) for i in (7, 1024, 14336)]
    out += [dict(base, m=9, i=1024, dtype="fp16", x_stride=4096), dict(base, m=9, i=1024, dtype="bf16", misalign=["Y"]),
            dict(op="swiglu", m=9, i=1024, dtype="bf16", x_stride=3072, u_stride=4096),
            dict(op="swiglu", m=9, i=1024, dtype="bf16", misalign=["U"])]
    return out


def _x_cols(c: dict) -> int:
    return 2 * c["i"] if KINDS[c["op"]][1] in ("halves", "interleaved") else c["i"]


def _act_python(c: dict):
    launch = mod("kernelset.ops.activation.launch")
    act, layout, alpha, limit = KINDS[c["op"]]
    m, n = c["m"], _x_cols(c)
    x = meta((m, n), c["dtype"], (c.get("x_stride", n), 1))
    up = meta((m, c["i"]), c["dtype"], (c.get("u_stride", c["i"]), 1)) if layout == "pair" else None
    y = launch.act_fwd(x, up, act, layout, alpha, limit)
    return dict(X=x, U=up, Y=y)


def _act_c_args(c: dict) -> list:
    launch = mod("kernelset.ops.activation.launch")
    act, layout, alpha, limit = KINDS[c["op"]]
    pair = layout == "pair"
    return [c["dtype"], "X", "U" if pair else None, "Y", c["m"], c["i"], c.get("x_stride", _x_cols(c)),
            c.get("u_stride", c["i"]) if pair else 0, c["i"], alpha, limit, launch.ACTS[act], launch.LAYOUTS[layout]]


ACT_FWD = Op(
    name="act_fwd",
    launcher="kernelset.ops.activation.launch.act_fwd",
    doc="activations forward, Y [M, I] (row stride stride_y): silu_and_mul = (KS_ACT_SILU, KS_ACT_LAYOUT_HALVES), "
        "gelu_and_mul = (KS_ACT_GELU or KS_ACT_GELU_TANH, HALVES), swiglu = (SILU, PAIR, U the up), gelu = (GELU*, "
        "SINGLE), swiglu_oai = (KS_ACT_OAI, INTERLEAVED, alpha, limit); U NULL except PAIR",
    kernels=[KernelRef("kernelset.ops.activation.kernels", "_act_fwd_kernel", ("I", "stride_x", "stride_u", "stride_y"))],
    policies=[PolicyRef("kernelset.ops.activation.launch", "act_policy", "ks_pol_act")],
    c_params=[("int32_t", "dtype"), ("const void *", "X"), ("const void *", "U"), ("void *", "Y"),
              ("int64_t", "M"), ("int64_t", "I"), ("int64_t", "stride_x"), ("int64_t", "stride_u"),
              ("int64_t", "stride_y"), ("double", "alpha"), ("double", "limit"), ("int", "act"), ("int", "layout")],
    c_body=r"""
  /* kernelset.ops.activation.launch.act_fwd: x, up and y share one dtype */
  if (M == 0 || I == 0) return KS_OK;
  ks_pol_act_t p;
  if (ks_pol_act(M, I, act, &p)) return ks_gen_policy_failed(err, errlen, "act_policy");
  return ks_k_act_fwd_kernel(plan, err, errlen, p.grid[0], p.grid[1], 1, p.num_warps, -1, 1,
      X, dtype, U, dtype, Y, dtype, M, I, stride_x, stride_u, stride_y, alpha, limit, act, layout, p.block_m, p.block_n);
""",
    cases=_act_cases,
    python=_act_python,
    c_args=_act_c_args,
)
