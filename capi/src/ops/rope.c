/* rope.c: rotary_embedding, mrope and qk_norm_rope (serving layout, in place on q and k).
 *
 * Semantics: kernelset.ops.rope (api.py, reference.py). cos_sin_cache [max_pos, R] holds cos in
 * its first R/2 columns and sin in the last R/2; the first R features of each head of size D
 * rotate, NeoX pairs (x[i], x[i + R/2]) or GPT-J pairs (x[2i], x[2i + 1]):
 * (a, b) -> (a cos - b sin, b cos + a sin), fp32 math. A position outside [0, max_pos) leaves its
 * token (mrope: the frequencies of its section) unrotated, as the Python package documents and its
 * kernels do: the cache is never read outside its rows, and the CPU and CUDA paths agree.
 *
 * Layouts: q and k are [T, H, D] or [T, H * D] with any token, head and feature strides on the
 * CPU; the CUDA kernels (the Python package's _rope_fwd_kernel and _rope_ext_fwd_kernel, compiled
 * ahead of time) need packed heads with unit-stride features (any token stride), a unit-stride
 * cache row, contiguous weights of one dtype, and (rotary_embedding) contiguous positions.
 */
#include <stdio.h>
#include <stdlib.h>

#include "ks_internal.h"
#include "ks_cuda_ops.h"

/* "[a, b, c]" */
static const char *shape_str(const ks_view *v, char *buf, size_t n) {
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

/* One rotated tensor (q or k): element (t, h, i) at t * ts + h * hs + i * fs. */
typedef struct {
  ks_view v;
  int64_t heads, ts, hs, fs;
} rope_x;

typedef struct {
  const char *op;
  ks_view pos, cache, qw, kw;
  rope_x q, k;
  int64_t T, D, R, half, max_pos;
  int interleaved;
  int mrope;      /* positions [3, T]: frequency i rotates by the position of its section */
  int32_t sec[3];
  int mrope_interleaved;
  int norm;       /* qk_norm_rope */
  float eps, offset;
  int cast;
} rope_problem;

static ks_status_t check_x(ks_call *c, rope_x *x, const char *name, const DLTensor *t, int optional) {
  char sb[160];
  KS_TRY(ks_view_make(c, &x->v, name, t, optional));
  if (!x->v.present) return KS_OK;
  KS_TRY(ks_check_dtype(&x->v, KS_FLOATS));
  if (x->v.ndim != 2 && x->v.ndim != 3)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected [T, H, D] or [T, H * D], got shape %s", name,
                   shape_str(&x->v, sb, sizeof sb));
  return KS_OK;
}

/* heads and strides of x once the head size D is known (D >= 1, and it divides a 2-D x's width) */
static void finish_x(rope_x *x, int64_t D) {
  if (!x->v.present) {
    x->heads = 0;
    return;
  }
  x->ts = x->v.strides[0];
  if (x->v.ndim == 3) {
    x->heads = x->v.shape[1];
    x->hs = x->v.strides[1];
    x->fs = x->v.strides[2];
  } else {
    x->heads = x->v.shape[1] / D;
    x->hs = D * x->v.strides[1];
    x->fs = x->v.strides[1];
  }
}

/* Checks shared by the three ops (api._check_serving): q, k, cos_sin_cache, rotary_dim, head_size. */
static ks_status_t check_serving(ks_call *c, rope_problem *p, DLTensor *q, DLTensor *k, const DLTensor *cache,
                                 int32_t rotary_dim, int32_t head_size, int32_t interleaved) {
  char sb[160];
  KS_TRY(check_x(c, &p->q, "q", q, KS_REQUIRED));
  KS_TRY(ks_view_make(c, &p->cache, "cos_sin_cache", cache, KS_REQUIRED));
  KS_TRY(ks_check_dtype(&p->cache, KS_FLOATS));
  if (p->cache.ndim != 2 || p->cache.shape[1] % 2 || p->cache.shape[0] < 1)
    return ks_fail(KS_ERR_INVALID_ARGUMENT,
                   "cos_sin_cache: expected 2-D [max_pos >= 1, rotary_dim] with an even rotary_dim, got shape %s",
                   shape_str(&p->cache, sb, sizeof sb));
  p->R = p->cache.shape[1];
  p->half = p->R / 2;
  p->max_pos = p->cache.shape[0];
  if (rotary_dim < 0 || (rotary_dim != 0 && rotary_dim != p->R))
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "rotary_dim: expected 0 or cos_sin_cache.shape[1] (%lld), got %d",
                   (long long)p->R, (int)rotary_dim);
  if (interleaved != 0 && interleaved != 1)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "interleaved: expected 0 (NeoX halves) or 1 (GPT-J pairs), got %d",
                   (int)interleaved);
  p->interleaved = interleaved;
  if (head_size < 0)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "head_size: expected >= 0 (0: inferred from q), got %d", (int)head_size);
  if (p->q.v.ndim == 3) {
    p->D = p->q.v.shape[2];
    if (head_size != 0 && head_size != p->D)
      return ks_fail(KS_ERR_INVALID_ARGUMENT, "head_size: expected 0 or q.shape[-1] (%lld) for a 3-D q, got %d",
                     (long long)p->D, (int)head_size);
  } else {
    if (head_size == 0)
      return ks_fail(KS_ERR_INVALID_ARGUMENT, "head_size: expected > 0 when q is 2-D [T, H * D], got 0");
    p->D = head_size;
  }
  if (p->D < (p->R > 1 ? p->R : 1) || p->q.v.shape[p->q.v.ndim - 1] % p->D)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "q: expected heads of size %lld >= rotary_dim %lld, got shape %s",
                   (long long)p->D, (long long)p->R, shape_str(&p->q.v, sb, sizeof sb));
  p->T = p->q.v.shape[0];
  finish_x(&p->q, p->D);
  KS_TRY(check_x(c, &p->k, "k", k, KS_OPTIONAL));
  KS_TRY(ks_check_no_overlap(&p->q.v));
  if (p->k.v.present) {
    KS_TRY(ks_check_same_dtype(&p->q.v, &p->k.v));
    int bad = p->k.v.shape[0] != p->T;
    bad |= p->k.v.ndim == 2 ? (p->k.v.shape[1] % p->D != 0) : (p->k.v.shape[2] != p->D);
    if (bad)
      return ks_fail(KS_ERR_INVALID_ARGUMENT, "k: expected [T=%lld, Hk, %lld] or [T, Hk * %lld], got shape %s",
                     (long long)p->T, (long long)p->D, (long long)p->D, shape_str(&p->k.v, sb, sizeof sb));
  }
  if (p->k.v.present) {
    KS_TRY(ks_check_no_overlap(&p->k.v));
    /* both are rotated in place: a k sharing q's memory would turn twice (slices of one fused qkv
     * buffer that do not meet are fine) */
    KS_TRY(ks_check_disjoint(&p->k.v, &p->q.v, "k must be a different tensor from q: both are rotated in place"));
  }
  finish_x(&p->k, p->D);
  return KS_OK;
}

/* q and k are written in place: they may not share memory with what is read while they are written
 * (positions, cos_sin_cache, the norm weights) */
static ks_status_t check_inputs_disjoint(const rope_problem *p) {
  const rope_x *xs[2] = {&p->q, &p->k};
  for (int i = 0; i < 2; i++) {
    if (!xs[i]->v.present) continue;
    KS_TRY(ks_check_not_index(&xs[i]->v, &p->pos));
    KS_TRY(ks_check_disjoint(&xs[i]->v, &p->cache, "an output may not share memory with an input"));
    KS_TRY(ks_check_disjoint(&xs[i]->v, &p->qw, "an output may not share memory with an input"));
    KS_TRY(ks_check_disjoint(&xs[i]->v, &p->kw, "an output may not share memory with an input"));
  }
  return KS_OK;
}

/* positions [T] int32/int64, or [3, T] when `multimodal` */
static ks_status_t check_positions(ks_call *c, rope_problem *p, const DLTensor *positions, int multimodal) {
  char sb[160];
  KS_TRY(ks_view_make(c, &p->pos, "positions", positions, KS_REQUIRED));
  KS_TRY(ks_check_dtype(&p->pos, KS_INDEX));
  int ok = p->pos.ndim == 1 && p->pos.shape[0] == p->T;
  if (multimodal && p->pos.ndim == 2 && p->pos.shape[0] == 3 && p->pos.shape[1] == p->T) {
    ok = 1;
    p->mrope = 1;
  }
  if (!ok) {
    if (multimodal)
      return ks_fail(KS_ERR_INVALID_ARGUMENT,
                     "positions: expected [T=%lld] (text only) or [3, T] (temporal, height, width), got shape %s",
                     (long long)p->T, shape_str(&p->pos, sb, sizeof sb));
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "positions: expected [T=%lld] (one position per token), got shape %s",
                   (long long)p->T, shape_str(&p->pos, sb, sizeof sb));
  }
  return KS_OK;
}

static ks_status_t check_sections(rope_problem *p, const int32_t sec[3], int32_t mrope_interleaved) {
  int64_t sum = (int64_t)sec[0] + sec[1] + sec[2];
  if (sec[0] < 0 || sec[1] < 0 || sec[2] < 0 || sum != p->half)
    return ks_fail(KS_ERR_INVALID_ARGUMENT,
                   "mrope_section: expected 3 non-negative ints (temporal, height, width) summing to "
                   "rotary_dim / 2 = %lld, got {%d, %d, %d}",
                   (long long)p->half, (int)sec[0], (int)sec[1], (int)sec[2]);
  if (mrope_interleaved != 0 && mrope_interleaved != 1)
    return ks_fail(KS_ERR_INVALID_ARGUMENT,
                   "mrope_interleaved: expected 0 (contiguous sections) or 1 (interleaved), got %d",
                   (int)mrope_interleaved);
  memcpy(p->sec, sec, sizeof p->sec);
  p->mrope_interleaved = mrope_interleaved;
  return KS_OK;
}

/* which position row (0 temporal, 1 height, 2 width) rotates frequency i (cache.section_index) */
static int section_of(const rope_problem *p, int64_t i) {
  if (!p->mrope) return 0;
  if (p->mrope_interleaved) {
    if (i % 3 == 1 && i < 3 * (int64_t)p->sec[1]) return 1;
    if (i % 3 == 2 && i < 3 * (int64_t)p->sec[2]) return 2;
    return 0;
  }
  return (i >= p->sec[0]) + (i >= (int64_t)p->sec[0] + p->sec[1]);
}

/* The CPU path: cos/sin of each frequency of token t (cs[0..half) cos, cs[half..R) sin), then every
 * head of q and k. buf: D floats (norm) and R floats (cos/sin). */
static void rope_cpu(const rope_problem *p, float *cs, float *y) {
  const int64_t half = p->half;
  for (int64_t t = 0; t < p->T; t++) {
    for (int64_t i = 0; i < half; i++) {
      int s = section_of(p, i);
      int64_t po = p->mrope ? s * p->pos.strides[0] + t * p->pos.strides[1] : t * p->pos.strides[0];
      int64_t row = ks_load_index(p->pos.data, p->pos.dtype, po);
      if (row >= 0 && row < p->max_pos) {
        cs[i] = ks_load(p->cache.data, p->cache.dtype, row * p->cache.strides[0] + i * p->cache.strides[1]);
        cs[half + i] =
            ks_load(p->cache.data, p->cache.dtype, row * p->cache.strides[0] + (half + i) * p->cache.strides[1]);
      } else {
        cs[i] = 1.0f;
        cs[half + i] = 0.0f;
      }
    }
    for (int which = 0; which < 2; which++) {
      const rope_x *x = which ? &p->k : &p->q;
      const ks_view *w = which ? &p->kw : &p->qw;
      if (!x->v.present) continue;
      const int dt = x->v.dtype;
      for (int64_t h = 0; h < x->heads; h++) {
        char *base = x->v.data;
        const int64_t o = t * x->ts + h * x->hs;
        if (p->norm) {
          float ss = 0.0f;
          for (int64_t i = 0; i < p->D; i++) {
            y[i] = ks_load(base, dt, o + i * x->fs);
            ss += y[i] * y[i];
          }
          const float rstd = 1.0f / sqrtf(ss / (float)p->D + p->eps);
          for (int64_t i = 0; i < p->D; i++) {
            const float wf = p->offset + ks_load(w->data, w->dtype, i * w->strides[0]);
            const float xn = y[i] * rstd;
            /* llama (Qwen3RMSNorm) rounds x * rstd before the weight, gemma after */
            y[i] = p->cast == KS_NORM_CAST_LLAMA ? ks_round_to(dt, ks_round_to(dt, xn) * wf)
                                                 : ks_round_to(dt, xn * wf);
          }
          for (int64_t i = p->R; i < p->D; i++) ks_store(base, dt, o + i * x->fs, y[i]);
        }
        for (int64_t i = 0; i < half; i++) {
          const int64_t ia = p->interleaved ? 2 * i : i;
          const int64_t ib = p->interleaved ? 2 * i + 1 : i + half;
          float a, b;
          if (p->norm) {
            a = y[ia];
            b = y[ib];
          } else {
            a = ks_load(base, dt, o + ia * x->fs);
            b = ks_load(base, dt, o + ib * x->fs);
          }
          float oa, ob;
          if (p->norm) {
            /* transformers' x * cos + rotate_half(x) * sin in x.dtype: cos/sin rounded, each
             * product rounded, then the sum (reference._rotate_rounded) */
            const float cr = ks_round_to(dt, cs[i]), sr = ks_round_to(dt, cs[half + i]);
            oa = ks_round_to(dt, a * cr) - ks_round_to(dt, b * sr);
            ob = ks_round_to(dt, b * cr) + ks_round_to(dt, a * sr);
          } else {
            oa = a * cs[i] - b * cs[half + i];
            ob = b * cs[i] + a * cs[half + i];
          }
          ks_store(base, dt, o + ia * x->fs, oa);
          ks_store(base, dt, o + ib * x->fs, ob);
        }
      }
    }
  }
}

static ks_status_t run_cpu(const rope_problem *p) {
  if (p->T == 0 || (p->q.heads == 0 && p->k.heads == 0)) return KS_OK;
  const size_t n = (size_t)p->R + (p->norm ? (size_t)p->D : 0) + 1;
  float *buf = malloc(n * sizeof(float));
  if (!buf) return ks_fail(KS_ERR_OUT_OF_MEMORY, "%s: could not allocate %zu bytes of CPU scratch", p->op, n * 4);
  rope_cpu(p, buf, buf + p->R);
  free(buf);
  return KS_OK;
}

/* What the CUDA kernels address: X + t * stride_t + head * D + i (packed heads, unit-stride
 * features, any token stride), CACHE + row * stride_c + i, weights W + i. */
static ks_status_t check_cuda_layout(const rope_problem *p) {
  for (int which = 0; which < 2; which++) {
    const rope_x *x = which ? &p->k : &p->q;
    if (!x->v.present) continue;
    if ((p->D > 1 && x->fs != 1) || (x->heads > 1 && x->hs != p->D))
      return ks_fail(KS_ERR_UNSUPPORTED_LAYOUT,
                     "%s: expected packed heads with unit-stride features on CUDA (any token stride)",
                     which ? "k" : "q");
  }
  if (p->R > 1 && p->cache.strides[1] != 1)
    return ks_fail(KS_ERR_UNSUPPORTED_LAYOUT, "cos_sin_cache: expected unit-stride columns on CUDA, got stride %lld",
                   (long long)p->cache.strides[1]);
  for (int which = 0; which < 2; which++) {
    const ks_view *w = which ? &p->kw : &p->qw;
    if (w->present && w->shape[0] > 1 && w->strides[0] != 1)
      return ks_fail(KS_ERR_UNSUPPORTED_LAYOUT, "%s: expected contiguous on CUDA, got stride %lld", w->name,
                     (long long)w->strides[0]);
  }
  if (p->qw.present && p->kw.present && p->qw.dtype != p->kw.dtype)
    return ks_fail(KS_ERR_UNSUPPORTED_DTYPE, "k_weight: expected q_weight's dtype %s on CUDA (one kernel variant "
                   "serves both), got %s", ks_dtype_name(p->qw.dtype), ks_dtype_name(p->kw.dtype));
  return KS_OK;
}

/* mrope and qk_norm_rope on CUDA: kernelset.ops.rope.launch.rope_ext (_rope_ext_fwd_kernel) */
static ks_status_t dispatch_ext(ks_call *c, const rope_problem *p) {
  KS_TRY(check_cuda_layout(p));
  const int64_t stride_ps = p->mrope ? p->pos.strides[0] : 0;
  const int64_t stride_pt = p->pos.strides[p->pos.ndim - 1];
  const int cast = !p->norm ? KS_ROPE_CAST_FP32 : p->cast == KS_NORM_CAST_GEMMA ? KS_ROPE_CAST_GEMMA
                                                                                 : KS_ROPE_CAST_LLAMA;
  KS_CUDA_DISPATCH(c, rope_ext, p->pos.dtype, p->q.v.dtype, p->cache.dtype, p->norm ? p->qw.dtype : p->cache.dtype,
                   ks_dev_ptr(c, &p->pos), ks_dev_ptr(c, &p->q.v), ks_dev_ptr(c, &p->k.v), ks_dev_ptr(c, &p->qw),
                   ks_dev_ptr(c, &p->kw), ks_dev_ptr(c, &p->cache), p->T, p->q.heads, p->k.heads, p->max_pos, p->q.ts,
                   p->k.v.present ? p->k.ts : 0, stride_ps, stride_pt, p->cache.strides[0], p->D, p->R,
                   p->interleaved, p->mrope, (int64_t)p->sec[0], (int64_t)p->sec[1], (int64_t)p->sec[2],
                   p->mrope_interleaved, (double)p->eps, (double)p->offset, cast);
}

/* ---- rotary_embedding */

static ks_status_t run_rotary_embedding(ks_call *c, const DLTensor *positions, DLTensor *q, DLTensor *k,
                                        const DLTensor *cos_sin_cache, const ks_rope_options *user) {
  ks_rope_options o;
  rope_problem p;
  memset(&p, 0, sizeof p);
  p.op = "rotary_embedding";
  KS_TRY(ks_read_options(KS_OP_ROTARY_EMBEDDING, user, &o, sizeof o, "options")); /* NULL: the defaults */
  KS_TRY(check_serving(c, &p, q, k, cos_sin_cache, o.rotary_dim, o.head_size, o.interleaved));
  KS_TRY(check_positions(c, &p, positions, 0));
  KS_TRY(check_inputs_disjoint(&p));
  if (c->device_type == kDLCUDA) {
    /* _rope_fwd_kernel reads POS + t */
    if (p.T > 1 && p.pos.strides[0] != 1)
      return ks_fail(KS_ERR_UNSUPPORTED_LAYOUT, "positions: expected contiguous on CUDA, got stride %lld",
                     (long long)p.pos.strides[0]);
    KS_TRY(check_cuda_layout(&p));
    KS_CUDA_DISPATCH(c, rope_fwd, p.pos.dtype, p.q.v.dtype, p.cache.dtype, ks_dev_ptr(c, &p.pos),
                     ks_dev_ptr(c, &p.q.v), ks_dev_ptr(c, &p.k.v), ks_dev_ptr(c, &p.cache), p.T, p.q.heads, p.k.heads,
                     p.max_pos, p.q.ts, p.k.v.present ? p.k.ts : 0, p.cache.strides[0], p.D, p.R, p.interleaved);
  }
  if (c->dry_run) return KS_OK;
  return run_cpu(&p);
}

KS_API ks_status_t ks_rotary_embedding(const DLTensor *positions, DLTensor *q, DLTensor *k,
                                       const DLTensor *cos_sin_cache, const ks_rope_options *options,
                                       ks_stream_t stream) {
  ks_call c;
  ks_call_begin(&c, stream, 0);
  return run_rotary_embedding(&c, positions, q, k, cos_sin_cache, options);
}

ks_status_t ks_query_rotary_embedding(const DLTensor *const *t, int32_t n, const void *o) {
  ks_call c;
  ks_call_begin(&c, NULL, 1);
  KS_TRY(ks_query_arity(n, 4, "rotary_embedding"));
  return run_rotary_embedding(&c, t[0], (DLTensor *)t[1], (DLTensor *)t[2], t[3], o);
}

/* ---- mrope */

static ks_status_t run_mrope(ks_call *c, const DLTensor *positions, DLTensor *q, DLTensor *k,
                             const DLTensor *cos_sin_cache, const ks_mrope_options *user) {
  ks_mrope_options o;
  rope_problem p;
  memset(&p, 0, sizeof p);
  p.op = "mrope";
  KS_TRY(ks_read_options(KS_OP_MROPE, user, &o, sizeof o, "options")); /* NULL: the defaults */
  KS_TRY(check_serving(c, &p, q, k, cos_sin_cache, o.rotary_dim, o.head_size, o.interleaved));
  KS_TRY(check_positions(c, &p, positions, 1));
  KS_TRY(check_sections(&p, o.mrope_section, o.mrope_interleaved));
  KS_TRY(check_inputs_disjoint(&p));
  if (c->device_type == kDLCUDA) return dispatch_ext(c, &p);
  if (c->dry_run) return KS_OK;
  return run_cpu(&p);
}

KS_API ks_status_t ks_mrope(const DLTensor *positions, DLTensor *q, DLTensor *k, const DLTensor *cos_sin_cache,
                            const ks_mrope_options *options, ks_stream_t stream) {
  ks_call c;
  ks_call_begin(&c, stream, 0);
  return run_mrope(&c, positions, q, k, cos_sin_cache, options);
}

ks_status_t ks_query_mrope(const DLTensor *const *t, int32_t n, const void *o) {
  ks_call c;
  ks_call_begin(&c, NULL, 1);
  KS_TRY(ks_query_arity(n, 4, "mrope"));
  return run_mrope(&c, t[0], (DLTensor *)t[1], (DLTensor *)t[2], t[3], o);
}

/* ---- qk_norm_rope */

static ks_status_t check_weight(ks_call *c, rope_problem *p, ks_view *w, const char *name, const DLTensor *t,
                                int has_x) {
  char sb[160];
  if (!has_x) {
    if (t != NULL) return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected NULL when k is NULL", name);
    memset(w, 0, sizeof *w);
    return KS_OK;
  }
  KS_TRY(ks_view_make(c, w, name, t, KS_REQUIRED));
  KS_TRY(ks_check_dtype(w, KS_FLOATS));
  if (w->ndim != 1 || w->shape[0] != p->D)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected [%lld] (the head size), got shape %s", name,
                   (long long)p->D, shape_str(w, sb, sizeof sb));
  return KS_OK;
}

static ks_status_t run_qk_norm_rope(ks_call *c, DLTensor *q, DLTensor *k, const DLTensor *q_weight,
                                    const DLTensor *k_weight, const DLTensor *cos_sin_cache, const DLTensor *positions,
                                    const ks_qk_norm_rope_options *user) {
  ks_qk_norm_rope_options o;
  rope_problem p;
  memset(&p, 0, sizeof p);
  p.op = "qk_norm_rope";
  KS_TRY(ks_read_options(KS_OP_QK_NORM_ROPE, user, &o, sizeof o, "options")); /* NULL: the defaults */
  KS_TRY(check_serving(c, &p, q, k, cos_sin_cache, o.rotary_dim, o.head_size, o.interleaved));
  const int sections = o.mrope_section[0] != 0 || o.mrope_section[1] != 0 || o.mrope_section[2] != 0;
  KS_TRY(check_positions(c, &p, positions, sections));
  if (sections) KS_TRY(check_sections(&p, o.mrope_section, o.mrope_interleaved));
  KS_TRY(check_weight(c, &p, &p.qw, "q_weight", q_weight, 1));
  KS_TRY(check_weight(c, &p, &p.kw, "k_weight", k_weight, p.k.v.present));
  KS_TRY(ks_check_positive(o.eps, "eps"));
  KS_TRY(ks_check_finite(o.offset, "offset"));
  if (o.cast != KS_NORM_CAST_LLAMA && o.cast != KS_NORM_CAST_GEMMA)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "cast: expected KS_NORM_CAST_LLAMA (0) or KS_NORM_CAST_GEMMA (1), got %d",
                   (int)o.cast);
  p.norm = 1;
  p.eps = o.eps;
  p.offset = o.offset;
  p.cast = o.cast;
  KS_TRY(check_inputs_disjoint(&p));
  if (c->device_type == kDLCUDA) return dispatch_ext(c, &p);
  if (c->dry_run) return KS_OK;
  return run_cpu(&p);
}

KS_API ks_status_t ks_qk_norm_rope(DLTensor *q, DLTensor *k, const DLTensor *q_weight, const DLTensor *k_weight,
                                   const DLTensor *cos_sin_cache, const DLTensor *positions,
                                   const ks_qk_norm_rope_options *options, ks_stream_t stream) {
  ks_call c;
  ks_call_begin(&c, stream, 0);
  return run_qk_norm_rope(&c, q, k, q_weight, k_weight, cos_sin_cache, positions, options);
}

ks_status_t ks_query_qk_norm_rope(const DLTensor *const *t, int32_t n, const void *o) {
  ks_call c;
  ks_call_begin(&c, NULL, 1);
  KS_TRY(ks_query_arity(n, 6, "qk_norm_rope"));
  return run_qk_norm_rope(&c, (DLTensor *)t[0], (DLTensor *)t[1], t[2], t[3], t[4], t[5], o);
}
