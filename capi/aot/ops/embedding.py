"""embedding forward (gather rows of weight; an out-of-range id gives a NaN row)."""
from __future__ import annotations

from record import meta

from .base import KernelRef, Op, PolicyRef, mod, pow2s


def _emb_cases(which: str) -> list[dict]:
    base = dict(ids="i64", w="bf16", v=32000)
    if which == "test":
        return [dict(base, m=7, d=4096),  # Llama-2 hidden
                dict(base, m=3, d=1000, ids="i32", w="fp32"),  # unaligned row
                dict(base, m=16384, d=4096, v=128256, gpu="embedding")]  # GPU checks: a 128 MB gather
    if which == "full":
        return [dict(base, m=m, d=d, ids=i, w=w) for i in ("i32", "i64") for w in ("fp32", "fp16", "bf16")
                for d in pow2s(1, 1024) for m in pow2s(1, max(1, 2048 // d))]
    if which == "release":  # ops/models.py: each known (hidden, vocabulary), int32 or int64 ids
        from . import models as mm
        return [dict(base, m=m, d=d, v=v, ids=ids, w=dt) for d, v in sorted({(f.hidden, f.vocab) for f in mm.models()})
                for ids in ("i32", "i64") for dt in mm.DTYPES for m in mm.TOKENS]
    out = [dict(base, m=m, d=d) for m in (0, 1, 2, 3, 7, 64, 1000, 70000) for d in (0, 1, 3, 16, 100, 1024, 1025, 4096,
                                                                                  7168)]
    out += [dict(base, m=5, d=4096, w_stride=8192), dict(base, m=5, d=4096, misalign=["W"])]
    return out


def _emb_python(c: dict):
    launch = mod("kernelset.ops.embedding.launch")
    ids = meta((c["m"],), c["ids"])
    w = meta((c["v"], c["d"]), c["w"], (c.get("w_stride", c["d"]), 1))
    y = launch.embedding_fwd(ids, w)
    return dict(IDS=ids, W=w, Y=y)


def _emb_c_args(c: dict) -> list:
    return [c["ids"], c["w"], "IDS", "W", "Y", c["m"], c["v"], c["d"], c.get("w_stride", c["d"])]


EMBEDDING_FWD = Op(
    name="embedding_fwd",
    launcher="kernelset.ops.embedding.launch.embedding_fwd",
    doc="embedding: Y [M, D] (contiguous) = W [V, D] rows at IDS [M] (contiguous); a row whose id is outside "
        "[0, V) is NaN",
    kernels=[KernelRef("kernelset.ops.embedding.kernels", "_embedding_fwd_kernel", ("D", "stride_w"))],
    policies=[PolicyRef("kernelset.ops.embedding.launch", "embedding_policy", "ks_pol_embedding")],
    c_params=[("int32_t", "ids_dtype"), ("int32_t", "w_dtype"), ("const void *", "IDS"), ("const void *", "W"),
              ("void *", "Y"), ("int64_t", "M"), ("int64_t", "V"), ("int64_t", "D"), ("int64_t", "stride_w")],
    c_body=r"""
  /* kernelset.ops.embedding.launch.embedding_fwd */
  if (M == 0 || D == 0) return KS_OK;
  ks_pol_embedding_t p;
  if (ks_pol_embedding(M, D, &p)) return ks_gen_policy_failed(err, errlen, "embedding_policy");
  return ks_k_embedding_fwd_kernel(plan, err, errlen, p.grid[0], p.grid[1], 1, p.num_warps, -1, 1,
      IDS, ids_dtype, W, w_dtype, Y, w_dtype, M, V, D, stride_w, p.block_m, p.block_d);
""",
    cases=_emb_cases,
    python=_emb_python,
    c_args=_emb_c_args,
)
