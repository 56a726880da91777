/* kv_cache.c: reshape_and_cache and copy_blocks over paged caches [num_blocks, block_size, Hkv, D].
 *
 * Semantics: kernelset.ops.kvcache (api.py, reference.py). A slot is block * block_size + offset;
 * slot -1 skips a token. fp8 e4m3fn caches store x / scale (fp32 IEEE division) saturated to
 * +-448, rounded to nearest even. The CPU path checks every slot and block index before writing
 * anything (KS_ERR_INVALID_ARGUMENT naming the argument and the offending row), as the Python
 * functions do with check_slots / check_blocks (copy_blocks: also pairs that race, a destination
 * that is another pair's source or a repeated destination); the CUDA kernel skips out-of-range rows
 * (it cannot report them), so nothing is ever written outside a cache.
 *
 * Layouts: any strides with a unit-stride last dim for the caches, key and value (token- and
 * head-strided views of a fused qkv work); slot_mapping and block_mapping any strides on the CPU.
 * On CUDA (the Python package's kernels, compiled ahead of time) slot_mapping and block_mapping
 * are contiguous and copy_blocks needs each block [block_size, Hkv, D] contiguous; the values of
 * the mappings are not checked there (no host sync; the kernels skip out-of-range rows).
 *
 * The caches are written in place: each must have distinct elements (KS_ERR_UNSUPPORTED_LAYOUT),
 * and they may share memory neither with slot_mapping / block_mapping nor, in reshape_and_cache,
 * with each other, key, value or the scales (KS_ERR_INVALID_ARGUMENT naming both; the halves of one
 * [num_blocks, 2, ...] buffer do not meet and are fine). copy_blocks' caches may share memory only
 * as the same tensor given twice (k and v, or two layers: the same blocks copied twice).
 */
#include <stdio.h>
#include <stdlib.h>

#include "kv_cache.h"
#include "ks_cuda_ops.h"

const char *ks_ops_shape_str(const ks_view *v, char *buf, size_t n) {
  size_t k = 0;
  int w = snprintf(buf, n, "[");
  k = w > 0 ? (size_t)w : 0;
  for (int32_t d = 0; d < v->ndim && k < n; d++) {
    w = snprintf(buf + k, n - k, d ? ", %lld" : "%lld", (long long)v->shape[d]);
    k += w > 0 ? (size_t)w : 0;
  }
  if (k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

ks_status_t ks_kv_check_cache(ks_call *c, ks_view *v, const char *name, const DLTensor *t) {
  char sb[160];
  KS_TRY(ks_view_make(c, v, name, t, KS_REQUIRED));
  KS_TRY(ks_check_dtype(v, KS_CACHE_DTYPES));
  if (v->ndim != 4)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected 4-D [num_blocks, block_size, Hkv, D], got shape %s", name,
                   ks_ops_shape_str(v, sb, sizeof sb));
  if (v->shape[1] == 0 || v->shape[3] == 0)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected a non-zero block_size and head size, got shape %s", name,
                   ks_ops_shape_str(v, sb, sizeof sb));
  if (v->shape[3] > 1 && v->strides[3] != 1)
    return ks_fail(KS_ERR_UNSUPPORTED_LAYOUT, "%s: expected a unit-stride last dim (D), got stride %lld", name,
                   (long long)v->strides[3]);
  return KS_OK;
}

ks_status_t ks_kv_check_scale(ks_call *c, ks_view *s, const char *name, const DLTensor *t, const ks_view *cache,
                              const char *cache_name) {
  char sb[160];
  if (cache->dtype != KS_DT_F8E4M3) {
    if (t != NULL)
      return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected NULL unless %s is float8_e4m3fn (it is %s)", name,
                     cache_name, ks_dtype_name(cache->dtype));
    memset(s, 0, sizeof *s);
    return KS_OK;
  }
  if (t == NULL)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected a float32 scalar (the scale of the fp8 %s), got NULL", name,
                   cache_name);
  KS_TRY(ks_view_make(c, s, name, t, KS_REQUIRED));
  KS_TRY(ks_check_dtype(s, KS_BIT(KS_DT_F32)));
  if (s->numel != 1)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected one element (a per-tensor scale), got shape %s", name,
                   ks_ops_shape_str(s, sb, sizeof sb));
  return KS_OK;
}

float ks_kv_scale_value(const ks_view *s) {
  return s->present ? ((const float *)s->data)[0] : 1.0f;
}

/* ---- reshape_and_cache */

typedef struct {
  ks_view key, value, kc, vc, slots, ks, vs;
  int64_t T, nb, bs, H, D;
} cache_problem;

static void write_rows(const ks_view *x, const ks_view *cache, float scale, int64_t t, int64_t blk, int64_t off,
                       int64_t H, int64_t D) {
  const int fp8 = cache->dtype == KS_DT_F8E4M3;
  for (int64_t h = 0; h < H; h++) {
    const int64_t src = t * x->strides[0] + h * x->strides[1];
    const int64_t dst = blk * cache->strides[0] + off * cache->strides[1] + h * cache->strides[2];
    if (!fp8) { /* the cache holds key's dtype: a plain copy of D unit-stride elements */
      memmove(cache->data + dst * cache->elem_size, x->data + src * x->elem_size, (size_t)D * (size_t)x->elem_size);
      continue;
    }
    for (int64_t d = 0; d < D; d++)
      ks_store(cache->data, KS_DT_F8E4M3, dst + d, ks_load(x->data, x->dtype, src + d) / scale);
  }
}

static ks_status_t run_reshape_and_cache(ks_call *c, const DLTensor *key, const DLTensor *value, DLTensor *k_cache,
                                         DLTensor *v_cache, const DLTensor *slot_mapping, const DLTensor *k_scale,
                                         const DLTensor *v_scale) {
  char sb[160];
  cache_problem p;
  memset(&p, 0, sizeof p);
  KS_TRY(ks_kv_check_cache(c, &p.kc, "k_cache", k_cache));
  KS_TRY(ks_kv_check_cache(c, &p.vc, "v_cache", v_cache));
  KS_TRY(ks_check_same_shape(&p.kc, &p.vc));
  KS_TRY(ks_check_same_dtype(&p.kc, &p.vc));
  KS_TRY(ks_check_no_overlap(&p.kc));
  KS_TRY(ks_check_no_overlap(&p.vc));
  p.nb = p.kc.shape[0];
  p.bs = p.kc.shape[1];
  p.H = p.kc.shape[2];
  p.D = p.kc.shape[3];
  const char *names[2] = {"key", "value"};
  const DLTensor *ts[2] = {key, value};
  ks_view *vs[2] = {&p.key, &p.value};
  for (int i = 0; i < 2; i++) {
    KS_TRY(ks_view_make(c, vs[i], names[i], ts[i], KS_REQUIRED));
    KS_TRY(ks_check_dtype(vs[i], KS_FLOATS));
    if (vs[i]->ndim != 3 || vs[i]->shape[1] != p.H || vs[i]->shape[2] != p.D)
      return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected [T, Hkv=%lld, D=%lld] (the cache's heads and head size), "
                     "got shape %s", names[i], (long long)p.H, (long long)p.D, ks_ops_shape_str(vs[i], sb, sizeof sb));
    if (p.D > 1 && vs[i]->strides[2] != 1)
      return ks_fail(KS_ERR_UNSUPPORTED_LAYOUT, "%s: expected a unit-stride last dim, got stride %lld", names[i],
                     (long long)vs[i]->strides[2]);
  }
  KS_TRY(ks_check_same_shape(&p.key, &p.value));
  KS_TRY(ks_check_same_dtype(&p.key, &p.value));
  if (p.kc.dtype != KS_DT_F8E4M3 && p.kc.dtype != p.key.dtype)
    return ks_fail(KS_ERR_UNSUPPORTED_DTYPE, "k_cache: expected key's dtype %s (or float8_e4m3fn), got %s",
                   ks_dtype_name(p.key.dtype), ks_dtype_name(p.kc.dtype));
  p.T = p.key.shape[0];
  KS_TRY(ks_view_make(c, &p.slots, "slot_mapping", slot_mapping, KS_REQUIRED));
  KS_TRY(ks_check_dtype(&p.slots, KS_INDEX));
  if (p.slots.ndim != 1 || p.slots.shape[0] != p.T)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "slot_mapping: expected [T=%lld] (one slot per token), got shape %s",
                   (long long)p.T, ks_ops_shape_str(&p.slots, sb, sizeof sb));
  KS_TRY(ks_kv_check_scale(c, &p.ks, "k_scale", k_scale, &p.kc, "k_cache"));
  KS_TRY(ks_kv_check_scale(c, &p.vs, "v_scale", v_scale, &p.vc, "v_cache"));
  /* both caches are written in place: they may share neither memory with each other nor with
   * slot_mapping (the slots are checked, then read again while the caches are written) */
  KS_TRY(ks_check_disjoint(&p.vc, &p.kc, "v_cache must be a different tensor from k_cache: values would overwrite "
                           "keys"));
  KS_TRY(ks_check_not_index(&p.kc, &p.slots));
  KS_TRY(ks_check_not_index(&p.vc, &p.slots));
  {
    /* ... nor with what is copied into them (key, value, the fp8 scales) */
    const ks_view *outs[2] = {&p.kc, &p.vc}, *ins[4] = {&p.key, &p.value, &p.ks, &p.vs};
    KS_TRY(ks_check_disjoint_all(outs, 2, ins, 4, "a cache may not share memory with what is written into it"));
  }
  if (c->device_type == kDLCUDA && p.T > 1 && p.slots.strides[0] != 1)
    return ks_fail(KS_ERR_UNSUPPORTED_LAYOUT, "slot_mapping: expected contiguous on CUDA, got stride %lld",
                   (long long)p.slots.strides[0]);
  if (c->device_type == kDLCUDA)
    KS_CUDA_DISPATCH(c, reshape_and_cache, p.key.dtype, p.kc.dtype, p.slots.dtype, ks_dev_ptr(c, &p.key),
                     ks_dev_ptr(c, &p.value), ks_dev_ptr(c, &p.kc), ks_dev_ptr(c, &p.vc), ks_dev_ptr(c, &p.slots),
                     ks_dev_ptr(c, &p.ks), ks_dev_ptr(c, &p.vs), p.T, p.H, p.nb, p.bs, p.D, p.key.strides[0],
                     p.key.strides[1], p.value.strides[0], p.value.strides[1], p.kc.strides[0], p.kc.strides[1],
                     p.kc.strides[2], p.vc.strides[0], p.vc.strides[1], p.vc.strides[2]);
  if (c->dry_run) return KS_OK;
  /* nb * bs can overflow only for an empty cache (Hkv = 0), where every slot writes nothing */
  const int64_t slots = p.nb > INT64_MAX / p.bs ? INT64_MAX : p.nb * p.bs;
  for (int64_t t = 0; t < p.T; t++) { /* every slot first: a bad one writes nothing at all */
    const int64_t s = ks_load_index(p.slots.data, p.slots.dtype, t * p.slots.strides[0]);
    if (s < -1 || s >= slots)
      return ks_fail(KS_ERR_INVALID_ARGUMENT,
                     "slot_mapping: expected slots in [-1, %lld) (num_blocks * block_size; -1 skips), got %lld at "
                     "index %lld", (long long)slots, (long long)s, (long long)t);
  }
  const float kscale = ks_kv_scale_value(&p.ks), vscale = ks_kv_scale_value(&p.vs);
  for (int64_t t = 0; t < p.T; t++) {
    const int64_t s = ks_load_index(p.slots.data, p.slots.dtype, t * p.slots.strides[0]);
    if (s < 0) continue;
    write_rows(&p.key, &p.kc, kscale, t, s / p.bs, s % p.bs, p.H, p.D);
    write_rows(&p.value, &p.vc, vscale, t, s / p.bs, s % p.bs, p.H, p.D);
  }
  return KS_OK;
}

KS_API ks_status_t ks_reshape_and_cache(const DLTensor *key, const DLTensor *value, DLTensor *k_cache,
                                        DLTensor *v_cache, const DLTensor *slot_mapping, const DLTensor *k_scale,
                                        const DLTensor *v_scale, ks_stream_t stream) {
  ks_call c;
  ks_call_begin(&c, stream, 0);
  return run_reshape_and_cache(&c, key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale);
}

ks_status_t ks_query_reshape_and_cache(const DLTensor *const *t, int32_t n, const void *o) {
  ks_call c;
  ks_call_begin(&c, NULL, 1);
  (void)o;
  KS_TRY(ks_query_arity(n, 7, "reshape_and_cache"));
  return run_reshape_and_cache(&c, t[0], t[1], (DLTensor *)t[2], (DLTensor *)t[3], t[4], t[5], t[6]);
}

/* ---- copy_blocks */

/* the views of layer i ("k_caches[i]", "v_caches[i]"), checked against layer 0 */
static ks_status_t layer_views(ks_call *c, DLTensor *const *k_caches, DLTensor *const *v_caches, int32_t i,
                               const ks_view *first, ks_view *kv, ks_view *vv, char *kname, char *vname) {
  char sb[160], sb2[160];
  snprintf(kname, 32, "k_caches[%d]", (int)i);
  snprintf(vname, 32, "v_caches[%d]", (int)i);
  KS_TRY(ks_kv_check_cache(c, kv, kname, k_caches[i]));
  KS_TRY(ks_kv_check_cache(c, vv, vname, v_caches[i]));
  KS_TRY(ks_check_no_overlap(kv)); /* written in place, as reshape_and_cache's caches */
  KS_TRY(ks_check_no_overlap(vv));
  if (first != NULL) {
    if (kv->dtype != first->dtype)
      return ks_fail(KS_ERR_UNSUPPORTED_DTYPE, "%s: expected k_caches[0]'s dtype %s, got %s", kname,
                     ks_dtype_name(first->dtype), ks_dtype_name(kv->dtype));
    if (kv->shape[0] != first->shape[0])
      return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected %lld blocks like k_caches[0], got shape %s", kname,
                     (long long)first->shape[0], ks_ops_shape_str(kv, sb, sizeof sb));
  }
  if (vv->dtype != kv->dtype)
    return ks_fail(KS_ERR_UNSUPPORTED_DTYPE, "%s: expected %s's dtype %s, got %s", vname, kname,
                   ks_dtype_name(kv->dtype), ks_dtype_name(vv->dtype));
  for (int32_t d = 0; d < 4; d++)
    if (vv->shape[d] != kv->shape[d])
      return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected %s's shape %s, got shape %s", vname, kname,
                     ks_ops_shape_str(kv, sb, sizeof sb), ks_ops_shape_str(vv, sb2, sizeof sb2));
  return KS_OK;
}

static void copy_block(const ks_view *v, int64_t src, int64_t dst) {
  const int64_t bs = v->shape[1], H = v->shape[2], D = v->shape[3];
  for (int64_t s = 0; s < bs; s++)
    for (int64_t h = 0; h < H; h++) {
      const int64_t o = s * v->strides[1] + h * v->strides[2];
      memmove(v->data + (dst * v->strides[0] + o) * v->elem_size, v->data + (src * v->strides[0] + o) * v->elem_size,
              (size_t)D * (size_t)v->elem_size);
    }
}

/* Caches that share memory without being the same view: copying the blocks of one would move
 * blocks of the other, in an order the CPU loop and the GPU (pairs, k and v in parallel) do not
 * share. A cache given twice (as k and v, or for two layers) only copies the same blocks twice and
 * stays allowed, as in Python. The byte ranges first (distinct allocations never meet), the exact
 * test only for ranges that intersect. */
static ks_status_t check_caches_apart(ks_call *c, DLTensor *const *k_caches, DLTensor *const *v_caches,
                                      int32_t num_layers) {
  char names[4][32];
  ks_view v[4];
  const size_t n = 2 * (size_t)num_layers;
  uint64_t *r = malloc(2 * n * sizeof *r);
  if (r == NULL)
    return ks_fail(KS_ERR_OUT_OF_MEMORY, "copy_blocks: could not allocate %zu bytes of CPU scratch", 2 * n * sizeof *r);
  ks_status_t s = KS_OK;
  for (int32_t i = 0; i < num_layers && s == KS_OK; i++) {
    s = layer_views(c, k_caches, v_caches, i, NULL, &v[0], &v[1], names[0], names[1]);
    if (s == KS_OK) {
      ks_view_byte_range(&v[0], &r[4 * (size_t)i], &r[4 * (size_t)i + 1]);
      ks_view_byte_range(&v[1], &r[4 * (size_t)i + 2], &r[4 * (size_t)i + 3]);
    }
  }
  /* cache a: layer a / 2, k (even a) or v (odd a) */
  for (size_t a = 0; a < n && s == KS_OK; a++) {
    for (size_t b = a + 1; b < n && s == KS_OK; b++) {
      if (r[2 * a] >= r[2 * a + 1] || r[2 * b] >= r[2 * b + 1]) continue; /* touches no memory */
      if (r[2 * a + 1] <= r[2 * b] || r[2 * b + 1] <= r[2 * a]) continue;
      s = layer_views(c, k_caches, v_caches, (int32_t)(a / 2), NULL, &v[0], &v[1], names[0], names[1]);
      if (s == KS_OK) s = layer_views(c, k_caches, v_caches, (int32_t)(b / 2), NULL, &v[2], &v[3], names[2], names[3]);
      if (s != KS_OK) break;
      const ks_view *va = &v[a % 2], *vb = &v[2 + b % 2];
      s = ks_check_same_or_disjoint(vb, va, "caches may share memory only as the same tensor (same data, dtype, "
                                    "shape and strides)");
    }
  }
  free(r);
  return s;
}

/* a block [block_size, Hkv, D] as one contiguous run (what _copy_blocks_kernel copies) */
static ks_status_t check_block_contiguous(const ks_view *v) {
  const int64_t bs = v->shape[1], H = v->shape[2], D = v->shape[3];
  if ((H > 1 && v->strides[2] != D) || (bs > 1 && v->strides[1] != H * D))
    return ks_fail(KS_ERR_UNSUPPORTED_LAYOUT, "%s: expected each block [block_size, Hkv, D] contiguous on CUDA, got "
                   "strides [%lld, %lld, %lld, %lld]", v->name, (long long)v->strides[0], (long long)v->strides[1],
                   (long long)v->strides[2], (long long)v->strides[3]);
  return KS_OK;
}

/* kernelset.ops.kvcache.launch.copy_blocks: one launch per layer, k and v together. Pairs out of
 * range are skipped by the kernel (their values are not checked on CUDA). */
static ks_status_t copy_blocks_cuda(ks_call *c, DLTensor *const *k_caches, DLTensor *const *v_caches,
                                    int32_t num_layers, const ks_view *map) {
  char kname[32], vname[32];
  ks_view kv, vv;
  if (map->shape[0] > 1 && (map->strides[0] != 2 || map->strides[1] != 1))
    return ks_fail(KS_ERR_UNSUPPORTED_LAYOUT, "block_mapping: expected contiguous [N, 2] on CUDA");
  for (int32_t i = 0; i < num_layers; i++) {
    KS_TRY(layer_views(c, k_caches, v_caches, i, NULL, &kv, &vv, kname, vname));
    KS_TRY(check_block_contiguous(&kv));
    KS_TRY(check_block_contiguous(&vv));
  }
  for (int32_t i = 0; i < num_layers; i++) {
    KS_TRY(layer_views(c, k_caches, v_caches, i, NULL, &kv, &vv, kname, vname));
    const int64_t elems = kv.shape[1] * kv.shape[2] * kv.shape[3];
    ks_status_t s;
    if (c->dry_run)
      s = ks_cuda_copy_blocks_query(c->device_id, KS_CUDA_ERR, kv.dtype, ks_dev_ptr(c, &kv), ks_dev_ptr(c, &vv),
                                    ks_dev_ptr(c, map), map->shape[0], kv.shape[0], kv.strides[0], vv.strides[0],
                                    elems);
    else
      s = ks_cuda_copy_blocks_launch(c->device_id, c->stream, KS_CUDA_ERR, kv.dtype, ks_dev_ptr(c, &kv),
                                     ks_dev_ptr(c, &vv), ks_dev_ptr(c, map), map->shape[0], kv.shape[0],
                                     kv.strides[0], vv.strides[0], elems);
    KS_TRY(ks_cuda_result(s, "copy_blocks"));
  }
  return KS_OK;
}

static int cmp_i64(const void *a, const void *b) {
  const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* kvcache.api._check_mapping for copy_blocks: the pairs run in parallel on the GPU (and in row order
 * on the CPU), so a destination that is another pair's source (unless the pair copies a block onto
 * itself) or a repeated destination would make the result depend on the order; both are refused,
 * as in Python. O(N log N): the sources and the destinations sorted. */
static ks_status_t check_pairs_apart(const ks_view *map) {
  const int64_t n = map->shape[0];
  if (n < 2) return KS_OK;
  int64_t *srcs = malloc(2 * (size_t)n * sizeof *srcs);
  if (srcs == NULL)
    return ks_fail(KS_ERR_OUT_OF_MEMORY, "copy_blocks: could not allocate %zu bytes of CPU scratch",
                   2 * (size_t)n * sizeof *srcs);
  int64_t *dsts = srcs + n;
  for (int64_t r = 0; r < n; r++) {
    srcs[r] = ks_load_index(map->data, KS_DT_I64, r * map->strides[0]);
    dsts[r] = ks_load_index(map->data, KS_DT_I64, r * map->strides[0] + map->strides[1]);
  }
  qsort(srcs, (size_t)n, sizeof *srcs, cmp_i64);
  ks_status_t s = KS_OK;
  for (int64_t r = 0; r < n && s == KS_OK; r++) {
    const int64_t src = ks_load_index(map->data, KS_DT_I64, r * map->strides[0]);
    const int64_t dst = dsts[r];
    if (dst != src && bsearch(&dst, srcs, (size_t)n, sizeof *srcs, cmp_i64) != NULL)
      s = ks_fail(KS_ERR_INVALID_ARGUMENT,
                  "block_mapping: expected destinations that are no other pair's source (the pairs are copied in "
                  "parallel), got destination %lld at row %lld, also a source", (long long)dst, (long long)r);
  }
  if (s == KS_OK) {
    qsort(dsts, (size_t)n, sizeof *dsts, cmp_i64);
    for (int64_t r = 1; r < n && s == KS_OK; r++)
      if (dsts[r] == dsts[r - 1])
        s = ks_fail(KS_ERR_INVALID_ARGUMENT,
                    "block_mapping: expected distinct destinations (the pairs are copied in parallel), got "
                    "destination %lld more than once", (long long)dsts[r]);
  }
  free(srcs);
  return s;
}

static ks_status_t run_copy_blocks(ks_call *c, DLTensor *const *k_caches, DLTensor *const *v_caches,
                                   int32_t num_layers, const DLTensor *block_mapping) {
  char sb[160], kname[32], vname[32];
  if (num_layers < 1)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "num_layers: expected >= 1 (one k and v cache per layer), got %d",
                   (int)num_layers);
  if (k_caches == NULL) return ks_fail(KS_ERR_INVALID_ARGUMENT, "k_caches: expected an array of %d caches, got NULL",
                                       (int)num_layers);
  if (v_caches == NULL) return ks_fail(KS_ERR_INVALID_ARGUMENT, "v_caches: expected an array of %d caches, got NULL",
                                       (int)num_layers);
  ks_view first, kv, vv, map;
  KS_TRY(layer_views(c, k_caches, v_caches, 0, NULL, &first, &vv, kname, vname));
  for (int32_t i = 1; i < num_layers; i++)
    KS_TRY(layer_views(c, k_caches, v_caches, i, &first, &kv, &vv, kname, vname));
  KS_TRY(ks_view_make(c, &map, "block_mapping", block_mapping, KS_REQUIRED));
  KS_TRY(ks_check_dtype(&map, KS_BIT(KS_DT_I64)));
  if (map.ndim != 2 || map.shape[1] != 2)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "block_mapping: expected [N, 2] int64 (src, dst) pairs, got shape %s",
                   ks_ops_shape_str(&map, sb, sizeof sb));
  /* the pairs are checked, then read again while the caches are written */
  for (int32_t i = 0; i < num_layers; i++) {
    KS_TRY(layer_views(c, k_caches, v_caches, i, NULL, &kv, &vv, kname, vname));
    KS_TRY(ks_check_not_index(&kv, &map));
    KS_TRY(ks_check_not_index(&vv, &map));
  }
  KS_TRY(check_caches_apart(c, k_caches, v_caches, num_layers));
  if (c->device_type == kDLCUDA) return copy_blocks_cuda(c, k_caches, v_caches, num_layers, &map);
  if (c->dry_run) return KS_OK;
  const int64_t nb = first.shape[0], n = map.shape[0];
  for (int64_t r = 0; r < n; r++) {
    for (int j = 0; j < 2; j++) {
      const int64_t b = ks_load_index(map.data, KS_DT_I64, r * map.strides[0] + j * map.strides[1]);
      if (b < 0 || b >= nb)
        return ks_fail(KS_ERR_INVALID_ARGUMENT, "block_mapping: expected %s blocks in [0, %lld), got %lld at row %lld",
                       j ? "destination" : "source", (long long)nb, (long long)b, (long long)r);
    }
  }
  KS_TRY(check_pairs_apart(&map));
  /* in row order (the pairs are independent once check_pairs_apart passed) */
  for (int32_t i = 0; i < num_layers; i++) {
    KS_TRY(layer_views(c, k_caches, v_caches, i, NULL, &kv, &vv, kname, vname));
    for (int64_t r = 0; r < n; r++) {
      const int64_t src = ks_load_index(map.data, KS_DT_I64, r * map.strides[0]);
      const int64_t dst = ks_load_index(map.data, KS_DT_I64, r * map.strides[0] + map.strides[1]);
      copy_block(&kv, src, dst);
      copy_block(&vv, src, dst);
    }
  }
  return KS_OK;
}

KS_API ks_status_t ks_copy_blocks(DLTensor *const *k_caches, DLTensor *const *v_caches, int32_t num_layers,
                                  const DLTensor *block_mapping, ks_stream_t stream) {
  ks_call c;
  ks_call_begin(&c, stream, 0);
  return run_copy_blocks(&c, k_caches, v_caches, num_layers, block_mapping);
}

ks_status_t ks_query_copy_blocks(const DLTensor *const *t, int32_t n, const void *o) {
  ks_call c;
  ks_call_begin(&c, NULL, 1);
  (void)o;
  if (n < 3 || n % 2 == 0)
    return ks_fail(KS_ERR_INVALID_ARGUMENT,
                   "copy_blocks: expected 2 * num_layers + 1 tensors (k_caches..., v_caches..., block_mapping), got %d",
                   (int)n);
  const int32_t layers = (n - 1) / 2;
  return run_copy_blocks(&c, (DLTensor *const *)t, (DLTensor *const *)(t + layers), layers, t[n - 1]);
}
