"""rotary_embedding (_rope_fwd_kernel), mrope and qk_norm_rope (_rope_ext_fwd_kernel): q and k in one launch each."""
from __future__ import annotations

import itertools

from record import meta

from .base import KernelRef, Op, PolicyRef, mod, pow2, pow2s

# ---------------------------------------------------------------------------------------------
# rotary_embedding (serving layout, in place on q and k)

def _rope_cases(which: str) -> list[dict]:
    base = dict(interleaved=False, dtype="bf16", cache="bf16", pos="i64", max_pos=4096)
    if which == "test":
        return [dict(base, t=5, hq=32, hk=8, d=128, rot=128),  # Llama
                dict(base, t=3, hq=6, hk=None, d=64, rot=32, interleaved=True, dtype="fp32", cache="fp32", pos="i32")]
    if which == "full":
        out = []
        for d, rot in ((64, 64), (80, 80), (96, 96), (128, 128), (128, 64), (256, 256), (256, 128)):
            block_r = 1 << max(0, (rot // 2 - 1).bit_length())
            hs = pow2s(1, max(1, 2048 // block_r))  # block_h = min(pow2(h), 2048 // block_r), per tensor
            heads = [(h, hk) for h in hs for hk in [None] + [x for x in hs if x <= h]]  # k no wider than q
            for dt, cache, pos, inter, (h, hk) in itertools.product(("fp32", "fp16", "bf16"), ("same", "fp32"),
                                                                    ("i32", "i64"), (False, True), heads):
                if dt == "fp32" and cache == "fp32":
                    continue
                out.append(dict(base, t=1, hq=h, hk=hk, d=d, rot=rot, dtype=dt, cache=dt if cache == "same" else cache,
                                pos=pos, interleaved=inter))
        return out
    if which == "release":  # ops/models.py: each known model's heads and rotary dims (MLA: q_pe/k_pe, GPT-J pairs)
        from . import models as mm
        shapes = set()
        for f in mm.models():
            if f.mla:
                shapes.add((f.heads, 1, f.rotary_dim, f.rotary_dim, True))
            elif f.rotary_dim:  # (Jamba's attention has no rotary embedding)
                shapes.add((f.heads, f.kv_heads, f.head_dim, f.rotary_dim, False))
        return [dict(base, t=t, hq=hq, hk=hk, d=d, rot=rot, interleaved=inter, dtype=dt, cache=cache or dt, pos=pos)
                for hq, hk, d, rot, inter in sorted(shapes) for dt in mm.DTYPES for cache in (None, "fp32")
                for pos in ("i32", "i64") for t in mm.TOKENS]
    out = []
    for d, rot in ((64, 64), (128, 128), (128, 64), (96, 96), (256, 128), (80, 40)):
        for hq, hk in ((1, 1), (3, None), (32, 8), (40, 40), (64, 4), (128, 128), (200, 16)):
            out.append(dict(base, t=7, hq=hq, hk=hk, d=d, rot=rot, interleaved=hq % 2 == 1))
    out += [dict(base, t=0, hq=8, hk=8, d=128, rot=128),
            dict(base, t=4, hq=8, hk=2, d=128, rot=128, q_stride=128 * 12, k_stride=128 * 12),  # q, k views of qkv
            dict(base, t=4, hq=8, hk=2, d=128, rot=128, misalign=["K"])]
    return out


def _rope_python(c: dict):
    launch = mod("kernelset.ops.rope.launch")
    t, d = c["t"], c["d"]
    pos = meta((t,), c["pos"])
    q = meta((t, c["hq"] * d), c["dtype"], (c.get("q_stride", c["hq"] * d), 1))
    k = meta((t, c["hk"] * d), c["dtype"], (c.get("k_stride", c["hk"] * d), 1)) if c["hk"] else None
    cache = meta((c["max_pos"], c["rot"]), c["cache"])
    launch.rope_fwd(pos, q, k, cache, c["interleaved"], d)
    return dict(POS=pos, Q=q, K=k, CACHE=cache)


def _rope_c_args(c: dict) -> list:
    d = c["d"]
    return [c["pos"], c["dtype"], c["cache"], "POS", "Q", "K" if c["hk"] else None, "CACHE", c["t"], c["hq"],
            c["hk"] or 0, c["max_pos"], c.get("q_stride", c["hq"] * d), c.get("k_stride", (c["hk"] or 0) * d), c["rot"],
            d, c["rot"], int(c["interleaved"])]


ROPE_FWD = Op(
    name="rope_fwd",
    launcher="kernelset.ops.rope.launch.rope_fwd",
    doc="rotary_embedding in place on q [T, Hq*D] (token stride stride_qt) and k (or NULL); cache [max_pos, cache_cols]",
    kernels=[KernelRef("kernelset.ops.rope.kernels", "_rope_fwd_kernel", ("stride_qt", "stride_kt", "stride_c"))],
    policies=[PolicyRef("kernelset.ops.rope.launch", "rope_fwd_policy", "ks_pol_rope_fwd")],
    c_params=[("int32_t", "pos_dtype"), ("int32_t", "x_dtype"), ("int32_t", "cache_dtype"), ("const void *", "POS"),
              ("void *", "Q"), ("void *", "K"), ("const void *", "CACHE"), ("int64_t", "T"), ("int64_t", "q_heads"),
              ("int64_t", "k_heads"), ("int64_t", "max_pos"), ("int64_t", "stride_qt"), ("int64_t", "stride_kt"),
              ("int64_t", "stride_c"), ("int64_t", "head_size"), ("int64_t", "cache_cols"), ("int", "interleaved")],
    c_body=r"""
  /* kernelset.ops.rope.launch.rope_fwd: q and k in one launch (k's blocks, or k's part of a
     qk_one program, empty when K is NULL or has no heads, q standing in for its pointer) */
  int e = 0;
  const int64_t half = ks_pol_floordiv(cache_cols, 2, &e);
  const int64_t hk = K == NULL ? 0 : k_heads;
  if (T == 0 || q_heads + hk == 0) return KS_OK;
  ks_pol_rope_fwd_t p;
  if (ks_pol_rope_fwd(T, q_heads, hk, half, &p)) return ks_gen_policy_failed(err, errlen, "rope_fwd_policy");
  void *kx = hk ? K : Q;
  return ks_k_rope_fwd_kernel(plan, err, errlen, p.grid[0], p.grid[1], 1, p.num_warps, -1, 1,
      POS, pos_dtype, Q, x_dtype, kx, x_dtype, CACHE, cache_dtype, q_heads, hk, p.nb1, max_pos, stride_qt,
      hk ? stride_kt : stride_qt, stride_c, head_size, half, interleaved, p.block_h1, p.block_h2, p.block_r,
      p.qk_one);
""",
    cases=_rope_cases,
    python=_rope_python,
    c_args=_rope_c_args,
)


# ---------------------------------------------------------------------------------------------
# mrope and qk_norm_rope (_rope_ext_fwd_kernel: optional per-head RMSNorm, optional mrope sections)

QWEN3 = dict(t=5, hq=32, hk=8, d=128, rot=128, dtype="bf16", cache="bf16", wdt="bf16", pos="i64", max_pos=4096,
             norm=True, cast="llama", eps=1e-6, offset=0.0, sections=None, pos2d=False, mrope_interleaved=False,
             interleaved=False)
MROPE = dict(QWEN3, norm=False, cast="fp32", sections=(16, 24, 24), pos2d=True)


def _ext_cases(which: str) -> list[dict]:
    if which == "test":
        return [QWEN3,  # qk_norm_rope, transformers' Qwen3 roundings (fp_fusion off)
                dict(QWEN3, cast="gemma", offset=1.0, wdt="fp32"),  # Gemma 3
                dict(QWEN3, cast="fp32", hk=None, d=64, rot=32, interleaved=True, dtype="fp32", cache="fp32",
                     wdt="fp32", pos="i32"),  # partial rotary, GPT-J pairs, fp32 chain, no k
                MROPE,  # Qwen2-VL mrope, positions [3, T]
                dict(MROPE, pos2d=False),  # mrope with text-only positions [T]: one section
                dict(QWEN3, sections=(24, 20, 20), pos2d=True, mrope_interleaved=True),  # Qwen3-VL: norm + mrope
                dict(QWEN3, t=16384, gpu="qk_norm_rope_qwen3"),  # GPU checks (q, k: 160 MB)
                dict(MROPE, t=16384, max_pos=32768, gpu="mrope_qwen2vl")]
    if which == "full":
        out = []
        for d, rot in ((64, 64), (128, 128), (128, 64), (256, 256)):
            hs = pow2s(1, max(1, 2048 // pow2(rot // 2)))  # heads per program, per tensor
            heads = [(h, hk) for h in hs for hk in [None] + [x for x in hs if x <= h]]  # k no wider than q
            for dt, norm, cast, (h, hk) in itertools.product(("fp16", "bf16"), (False, True), ("llama", "gemma", "fp32"),
                                                             heads):
                if not norm and cast != "fp32":
                    continue
                for sec, pos2d, mi in (((rot // 2 - 2 * (rot // 8), rot // 8, rot // 8), True, False),
                                       ((rot // 2 - 2 * (rot // 8), rot // 8, rot // 8), True, True), (None, False, False)):
                    out.append(dict(QWEN3, t=1, hq=h, hk=hk, d=d, rot=rot, dtype=dt, cache=dt, wdt=dt, norm=norm,
                                    cast=cast, sections=sec, pos2d=pos2d, mrope_interleaved=mi))
        return out
    if which == "release":  # ops/models.py: qk_norm_rope of the models with per-head q/k norms
        from . import models as mm
        shapes = sorted({(f.heads, f.kv_heads, f.head_dim, f.rotary_dim, f.norm_offset == 1.0) for f in mm.models()
                         if f.qk_norm == "head" and not f.mla})
        return [dict(QWEN3, t=t, hq=hq, hk=hk, d=d, rot=rot, dtype=dt, cache=dt, wdt=dt,
                     cast="gemma" if gemma else "llama", offset=float(gemma))
                for hq, hk, d, rot, gemma in shapes for dt in mm.DTYPES for t in mm.TOKENS]
    out = []
    for d, rot in ((64, 64), (128, 128), (128, 64), (256, 256), (80, 40)):
        for hq, hk in ((1, 1), (3, None), (32, 8), (40, 40), (64, 4), (200, 16)):
            for norm, cast in ((True, "llama"), (True, "gemma"), (True, "fp32"), (False, "fp32")):
                sec = (rot // 2 - 2 * (rot // 8), rot // 8, rot // 8)
                out.append(dict(QWEN3, t=7, hq=hq, hk=hk, d=d, rot=rot, norm=norm, cast=cast, offset=float(cast == "gemma"),
                                sections=sec if hq % 2 else None, pos2d=hq % 2 == 1, mrope_interleaved=hq == 3,
                                interleaved=hq == 40))
    out += [dict(QWEN3, t=0), dict(QWEN3, t=3, hq=0, hk=4),
            dict(QWEN3, t=4, q_stride=128 * 48, k_stride=128 * 48),  # q, k views of a fused qkv
            dict(MROPE, t=4, misalign=["Q"]), dict(QWEN3, t=4, eps=1e-5, wdt="fp32", dtype="fp16", cache="fp32")]
    return out


def _ext_python(c: dict):
    launch = mod("kernelset.ops.rope.launch")
    t, d, hq, hk = c["t"], c["d"], c["hq"], c["hk"]
    pos = meta((3, t) if c["pos2d"] else (t,), c["pos"])
    q = meta((t, hq * d), c["dtype"], (c.get("q_stride", hq * d), 1))
    k = meta((t, hk * d), c["dtype"], (c.get("k_stride", hk * d), 1)) if hk is not None else None
    cache = meta((c["max_pos"], c["rot"]), c["cache"])
    qw = meta((d,), c["wdt"]) if c["norm"] else None
    kw = meta((d,), c["wdt"]) if c["norm"] and k is not None else None
    eps, offset = (c["eps"], c["offset"]) if c["norm"] else (0.0, 0.0)  # as kernelset.ops.rope.backends' mrope
    launch.rope_ext(pos, q, k, cache, d, c["interleaved"], list(c["sections"]) if c["sections"] else None,
                    c["mrope_interleaved"], qw, kw, eps, offset, c["cast"])
    return dict(POS=pos, Q=q, K=k, CACHE=cache, QW=qw, KW=kw)


def _ext_c_args(c: dict) -> list:  # eps/offset passed whatever the case: the glue ignores them without norm
    launch = mod("kernelset.ops.rope.launch")
    t, d, hq, hk = c["t"], c["d"], c["hq"], c["hk"]
    mrope = c["sections"] is not None and c["pos2d"]
    s0, s1, s2 = c["sections"] or (0, 0, 0)
    return [c["pos"], c["dtype"], c["cache"], c["wdt"] if c["norm"] else c["cache"], "POS", "Q",
            "K" if hk is not None else None, "QW" if c["norm"] else None,
            "KW" if c["norm"] and hk is not None else None, "CACHE", t, hq, hk or 0, c["max_pos"],
            c.get("q_stride", hq * d), c.get("k_stride", (hk or 0) * d), t, 1, c["rot"], d, c["rot"],
            int(c["interleaved"]), int(mrope), s0, s1, s2, int(c["mrope_interleaved"]), c["eps"], c["offset"],
            launch._CASTS[c["cast"]]]


ROPE_EXT = Op(
    name="rope_ext",
    launcher="kernelset.ops.rope.launch.rope_ext",
    doc="mrope and qk_norm_rope, in place on q [T, Hq*D] and k (or NULL): per-head RMSNorm when QW is given "
        "(then KW with K), mrope sections when mrope != 0",
    kernels=[KernelRef("kernelset.ops.rope.kernels", "_rope_ext_fwd_kernel", ("stride_qt", "stride_kt", "stride_c"))],
    policies=[PolicyRef("kernelset.ops.rope.launch", "ext_tiles", "ks_pol_rope_ext",
                        fields=("block_h1", "block_h2", "block_r", "block_t", "num_warps", "nb1", "nb", "qk_one"))],
    c_params=[("int32_t", "pos_dtype"), ("int32_t", "x_dtype"), ("int32_t", "cache_dtype"), ("int32_t", "w_dtype"),
              ("const void *", "POS"), ("void *", "Q"), ("void *", "K"), ("const void *", "QW"), ("const void *", "KW"),
              ("const void *", "CACHE"), ("int64_t", "T"), ("int64_t", "q_heads"), ("int64_t", "k_heads"),
              ("int64_t", "max_pos"), ("int64_t", "stride_qt"), ("int64_t", "stride_kt"), ("int64_t", "stride_ps"),
              ("int64_t", "stride_pt"), ("int64_t", "stride_c"), ("int64_t", "head_size"), ("int64_t", "cache_cols"),
              ("int", "interleaved"), ("int", "mrope"), ("int64_t", "s0"), ("int64_t", "s1"), ("int64_t", "s2"),
              ("int", "mrope_interleaved"), ("double", "eps"), ("double", "offset"), ("int", "cast")],
    c_body=r"""
  /* kernelset.ops.rope.launch.rope_ext: q and k in one launch (k's blocks empty when K is NULL
   * or has no heads, q and QW standing in for its pointers). Norm iff QW (eps, offset, cast used
   * only then: mrope passes 0 as Python's does; without the norm CACHE stands in for the
   * weights); mrope (sections s0..s2, positions [3, T] with section stride stride_ps) iff mrope,
   * else one section of all pairs. fp_fusion off for the bf16 chains. */
  if (T == 0) return KS_OK;
  const int norm = QW != NULL;
  if (norm && K != NULL && KW == NULL) return ks_gen_invalid(err, errlen, "rope_ext: K needs KW when QW is given");
  int e = 0;
  const int64_t half = ks_pol_floordiv(cache_cols, 2, &e);
  const int64_t S0 = mrope ? s0 : half, S1 = mrope ? s1 : 0, S2 = mrope ? s2 : 0;
  const int64_t hk = K == NULL ? 0 : k_heads;
  if (q_heads + hk == 0) return KS_OK;
  ks_pol_rope_ext_t p;
  if (ks_pol_rope_ext(q_heads, hk, head_size, half, norm, &p)) return ks_gen_policy_failed(err, errlen, "ext_tiles");
  const void *wq = norm ? QW : CACHE;
  const void *wk = norm ? (hk ? KW : QW) : CACHE;
  return ks_k_rope_ext_fwd_kernel(plan, err, errlen, T, p.nb, 1, p.num_warps, -1, !(norm && cast != KS_ROPE_CAST_FP32),
      POS, pos_dtype, Q, x_dtype, hk ? K : Q, x_dtype, wq, norm ? w_dtype : cache_dtype, wk, norm ? w_dtype : cache_dtype,
      CACHE, cache_dtype, q_heads, hk, p.nb1, max_pos, stride_qt, hk ? stride_kt : stride_qt, mrope ? stride_ps : 0,
      stride_pt, stride_c, norm ? eps : 0.0, norm ? offset : 0.0, head_size, half, interleaved, norm, norm ? cast : 0,
      mrope, S0, S1, S2, mrope_interleaved, p.block_h1, p.block_h2, p.block_r, p.block_t, p.qk_one);
""",
    cases=_ext_cases,
    python=_ext_python,
    c_args=_ext_c_args,
)
