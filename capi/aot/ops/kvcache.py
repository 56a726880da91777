"""reshape_and_cache (fp16/bf16/fp32 and fp8 caches) and copy_blocks."""
from __future__ import annotations

import itertools

from record import meta

from .base import KernelRef, Op, PolicyRef, mod, pow2s

# ---------------------------------------------------------------------------------------------
# reshape_and_cache (paged KV cache write)

def _cache_cases(which: str) -> list[dict]:
    base = dict(kv="bf16", cache="bf16", slot="i64", nb=64)
    if which == "test":
        return [dict(base, t=5, h=8, d=128, bs=16),
                dict(base, t=3, h=2, d=64, bs=32, kv="fp16", cache="fp8e4nv", slot="i32"),
                # GPU checks: a prefill chunk of Llama-8B's KV heads (key + value + caches: 256 MB)
                dict(base, t=16384, h=8, d=128, bs=16, nb=1024, slot="i64", gpu="reshape_and_cache_bf16"),
                dict(base, t=16384, h=8, d=128, bs=16, nb=1024, cache="fp8e4nv", gpu="reshape_and_cache_fp8")]
    if which == "full":
        out = []
        for d in (64, 80, 96, 128, 256):
            block_d = 1 << max(0, (d - 1).bit_length())
            for h in pow2s(1, max(1, 2048 // block_d)):
                for kv, cache, slot, bs in itertools.product(("fp32", "fp16", "bf16"), ("same", "fp8e4nv"), ("i32", "i64"),
                                                             (16, 32)):
                    out.append(dict(base, t=1, h=h, d=d, bs=bs, kv=kv, slot=slot,
                                    cache=kv if cache == "same" else cache))
        return out
    if which == "release":  # ops/models.py: each known (KV heads, head dim); 16/32-bit or fp8 cache
        from . import models as mm
        shapes = sorted({(f.kv_heads, f.head_dim) for f in mm.models() if not f.mla})
        return [dict(base, t=t, h=h, d=d, bs=bs, kv=dt, cache=cache or dt, slot=slot)
                for h, d in shapes for dt in mm.DTYPES for cache in (None, "fp8e4nv") for slot in ("i32", "i64")
                for bs in mm.BLOCK_SIZES for t in mm.TOKENS]
    out = [dict(base, t=t, h=h, d=d, bs=bs) for t in (0, 1, 7, 300) for h in (1, 3, 8, 32, 64) for d in (64, 128, 256)
           for bs in (16, 32)]
    out += [dict(base, t=6, h=4, d=128, bs=16, k_stride=(12 * 128, 128)),  # key/value views of a fused qkv
            dict(base, t=6, h=4, d=128, bs=16, cache="fp8e4nv"),
            dict(base, t=6, h=4, d=128, bs=16, misalign=["V"])]
    return out


def _cache_python(c: dict):
    launch = mod("kernelset.ops.kvcache.launch")
    t, h, d, bs, nb = c["t"], c["h"], c["d"], c["bs"], c["nb"]
    kst = c.get("k_stride")
    key = meta((t, h, d), c["kv"], (kst[0], kst[1], 1) if kst else None)
    value = meta((t, h, d), c["kv"], (kst[0], kst[1], 1) if kst else None)
    kc = meta((nb, bs, h, d), c["cache"])
    vc = meta((nb, bs, h, d), c["cache"])
    slots = meta((t,), c["slot"])
    fp8 = c["cache"] == "fp8e4nv"
    ks = meta((1,), "fp32") if fp8 else None
    vs = meta((1,), "fp32") if fp8 else None
    launch.reshape_and_cache(key, value, kc, vc, slots, ks, vs)
    return dict(K=key, V=value, KC=kc, VC=vc, SLOTS=slots, KSCALE=ks, VSCALE=vs)


def _cache_c_args(c: dict) -> list:
    t, h, d, bs, nb = c["t"], c["h"], c["d"], c["bs"], c["nb"]
    kst = c.get("k_stride") or (h * d, d)
    fp8 = c["cache"] == "fp8e4nv"
    cs = (bs * h * d, h * d, d)
    return [c["kv"], c["cache"], c["slot"], "K", "V", "KC", "VC", "SLOTS", "KSCALE" if fp8 else None,
            "VSCALE" if fp8 else None, t, h, nb, bs, d, kst[0], kst[1], kst[0], kst[1], *cs, *cs]


RESHAPE_AND_CACHE = Op(
    name="reshape_and_cache",
    launcher="kernelset.ops.kvcache.launch.reshape_and_cache",
    doc="write key/value [T, H, D] into caches [num_blocks, block_size, H, D] at slot_mapping (fp8: x / scale)",
    kernels=[KernelRef("kernelset.ops.kvcache.kernels", "_reshape_and_cache_kernel",
                       ("stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_kcb", "stride_kcs", "stride_kch",
                        "stride_vcb", "stride_vcs", "stride_vch"))],
    policies=[PolicyRef("kernelset.ops.kvcache.launch", "cache_policy", "ks_pol_cache")],
    c_params=[("int32_t", "kv_dtype"), ("int32_t", "cache_dtype"), ("int32_t", "slot_dtype"),
              ("const void *", "K"), ("const void *", "V"), ("void *", "KC"), ("void *", "VC"),
              ("const void *", "SLOTS"), ("const void *", "KSCALE"), ("const void *", "VSCALE"),
              ("int64_t", "T"), ("int64_t", "H"), ("int64_t", "num_blocks"), ("int64_t", "block_size"),
              ("int64_t", "head_size"), ("int64_t", "stride_kt"), ("int64_t", "stride_kh"), ("int64_t", "stride_vt"),
              ("int64_t", "stride_vh"), ("int64_t", "stride_kcb"), ("int64_t", "stride_kcs"), ("int64_t", "stride_kch"),
              ("int64_t", "stride_vcb"), ("int64_t", "stride_vcs"), ("int64_t", "stride_vch")],
    c_body=r"""
  /* kernelset.ops.kvcache.launch.reshape_and_cache: scales are read only for an fp8 cache */
  if (T == 0 || H == 0) return KS_OK;
  ks_pol_cache_t p;
  if (ks_pol_cache(H, head_size, &p)) return ks_gen_policy_failed(err, errlen, "cache_policy");
  const int fp8 = cache_dtype == KS_DT_F8E4M3;
  int e = 0;
  return ks_k_reshape_and_cache_kernel(plan, err, errlen, -ks_pol_floordiv(-T, p.block_t, &e),
      -ks_pol_floordiv(-H, p.block_h, &e), 1, p.num_warps, -1, 1,
      K, kv_dtype, V, kv_dtype, KC, cache_dtype, VC, cache_dtype, SLOTS, slot_dtype,
      fp8 ? KSCALE : NULL, KS_DT_F32, fp8 ? VSCALE : NULL, KS_DT_F32, T, H, num_blocks * block_size,
      stride_kt, stride_kh, stride_vt, stride_vh, stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
      block_size, head_size, p.block_t, p.block_h, p.block_d, fp8);
""",
    cases=_cache_cases,
    python=_cache_python,
    c_args=_cache_c_args,
)


# ---------------------------------------------------------------------------------------------
# copy_blocks (one launch per layer; the C op file loops over the layers)

def _copy_cases(which: str) -> list[dict]:
    base = dict(n=3, nb=64, bs=16, h=8, d=128, dtype="bf16")
    if which == "test":
        return [base, dict(base, bs=32, h=2, d=64, dtype="fp8e4nv"),
                dict(base, n=2048, nb=8192, gpu="copy_blocks")]  # GPU checks: 2048 pairs of 32 KB blocks
    if which == "full":
        return [dict(base, bs=bs, h=h, d=d, dtype=dt) for bs in (16, 32, 64) for h in (1, 2, 4, 8, 16, 32)
                for d in (64, 128, 256) for dt in ("fp16", "bf16", "fp8e4nv", "fp32")]
    if which == "release":  # ops/models.py: each known cache block geometry
        from . import models as mm
        shapes = sorted({(f.kv_heads, f.head_dim) for f in mm.models() if not f.mla})
        return [dict(base, bs=bs, h=h, d=d, dtype=dt) for h, d in shapes for bs in mm.BLOCK_SIZES
                for dt in mm.DTYPES + ("fp8e4nv",)]
    return [dict(base, n=n, bs=bs, h=h, d=d) for n in (0, 1, 5, 1000) for bs in (1, 16, 32) for h in (1, 3, 8)
            for d in (64, 80, 128)] + [dict(base, misalign=["VC"]), dict(base, k_stride=2 * 16 * 8 * 128)]


def _copy_python(c: dict):
    launch = mod("kernelset.ops.kvcache.launch")
    shape = (c["nb"], c["bs"], c["h"], c["d"])
    elems = c["bs"] * c["h"] * c["d"]
    st = (c.get("k_stride", elems), c["h"] * c["d"], c["d"], 1)
    kc = meta(shape, c["dtype"], st)
    vc = meta(shape, c["dtype"])
    pairs = meta((c["n"], 2), "i64")
    launch.copy_blocks([kc], [vc], pairs)
    return dict(KC=kc, VC=vc, PAIRS=pairs)


def _copy_c_args(c: dict) -> list:
    elems = c["bs"] * c["h"] * c["d"]
    return [c["dtype"], "KC", "VC", "PAIRS", c["n"], c["nb"], c.get("k_stride", elems), elems, elems]


COPY_BLOCKS = Op(
    name="copy_blocks",
    launcher="kernelset.ops.kvcache.launch.copy_blocks",
    doc="copy_blocks of one layer: for each (src, dst) pair of PAIRS [N, 2] int64, block src of KC and VC "
        "(block_elems contiguous elements at block * stride) to block dst",
    kernels=[KernelRef("kernelset.ops.kvcache.kernels", "_copy_blocks_kernel", ("stride_kb", "stride_vb"))],
    policies=[PolicyRef("kernelset.ops.kvcache.launch", "copy_policy", "ks_pol_copy")],
    c_params=[("int32_t", "dtype"), ("void *", "KC"), ("void *", "VC"), ("const void *", "PAIRS"), ("int64_t", "N"),
              ("int64_t", "num_blocks"), ("int64_t", "stride_kb"), ("int64_t", "stride_vb"),
              ("int64_t", "block_elems")],
    c_body=r"""
  /* kernelset.ops.kvcache.launch.copy_blocks, one layer (PAIRS contiguous int64 [N, 2]) */
  if (N == 0 || block_elems == 0) return KS_OK;
  ks_pol_copy_t p;
  if (ks_pol_copy(N, block_elems, &p)) return ks_gen_policy_failed(err, errlen, "copy_policy");
  return ks_k_copy_blocks_kernel(plan, err, errlen, p.grid[0], p.grid[1], 1, p.num_warps, -1, 1,
      KC, dtype, VC, dtype, PAIRS, KS_DT_I64, num_blocks, stride_kb, stride_vb, block_elems, p.chunk);
""",
    cases=_copy_cases,
    python=_copy_python,
    c_args=_copy_c_args,
    modules=(),
)
