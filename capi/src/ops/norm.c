/* norm.c: rms_norm, fused_add_rms_norm, layer_norm (forward).
 *
 * Semantics of kernelset.ops.norm (reference.py): fp32 statistics over the last dim; RMSNorm
 * rounds where NormCast says (LLAMA: the normalized value to x.dtype, then times (offset + w);
 * GEMMA: times (offset + w) in fp32, rounded once); the fused add rounds h = x + residual to
 * x.dtype before normalizing it; LayerNorm rounds once. CUDA tensors run the package's own
 * Triton kernels (ks_cuda_norm_fwd_launch); the CPU loop honours any strides. */
#include "ks_internal.h"
#include "ks_cuda_ops.h"

typedef struct {
  ks_view x, res, w, b, out;
  int64_t rows, n;
} norm_args;

static ks_status_t check_x(const ks_view *x) {
  KS_TRY(ks_check_dtype(x, KS_FLOATS));
  KS_TRY(ks_check_ndim(x, 1, KS_MAX_DIMS));
  if (x->shape[x->ndim - 1] == 0)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected a hidden size (last dim) >= 1, got 0", x->name);
  return KS_OK;
}

/* weight / bias: [H] of a float dtype, or absent */
static ks_status_t check_param(const ks_view *p, const ks_view *x) {
  if (!p->present) return KS_OK;
  KS_TRY(ks_check_dtype(p, KS_FLOATS));
  KS_TRY(ks_check_ndim(p, 1, 1));
  return ks_check_dim(p, 0, x->shape[x->ndim - 1], "the hidden size, x.shape[-1]");
}

/* out (and residual): x's shape and dtype, writable without overlaps */
static ks_status_t check_like_x(const ks_view *t, const ks_view *x) {
  KS_TRY(ks_check_same_shape(x, t));
  KS_TRY(ks_check_same_dtype(x, t));
  return ks_check_no_overlap(t);
}

/* What the outputs (out, and residual when present) may share with the inputs: out may be x
 * itself (same data, dtype and strides: true in place, each element read before it is written);
 * any other overlap of an output with x, weight or bias would change inputs still to be read. */
static ks_status_t check_out_memory(const norm_args *a) {
  if (!ks_views_same(&a->out, &a->x))
    KS_TRY(ks_check_disjoint(&a->out, &a->x, "out may be x itself, in place, but not another view of its memory"));
  const ks_view *params[2] = {&a->w, &a->b};
  for (int i = 0; i < 2; i++) {
    KS_TRY(ks_check_disjoint(&a->out, params[i], "an output may not share memory with a parameter"));
    if (a->res.present)
      KS_TRY(ks_check_disjoint(&a->res, params[i], "an output may not share memory with a parameter"));
  }
  return KS_OK;
}

static ks_status_t rms_options(ks_op_t op, const ks_rms_norm_options *user, ks_rms_norm_options *o, int has_weight) {
  KS_TRY(ks_read_options(op, user, o, sizeof *o, "options"));
  KS_TRY(ks_check_positive(o->eps, "options.eps"));
  KS_TRY(ks_check_finite(o->offset, "options.offset"));
  KS_TRY(ks_check_range_i32(o->cast, KS_NORM_CAST_LLAMA, KS_NORM_CAST_GEMMA, "options.cast"));
  if (!has_weight && o->offset != 0.0f)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "options.offset: expected 0 when weight is NULL (offset shifts the "
                   "weight), got %g", (double)o->offset);
  return KS_OK;
}

/* CUDA layout: rows of one stride (last dim unit-stride), contiguous parameters */
static ks_status_t cuda_rows(const norm_args *a, int64_t *sx, int64_t *sr, int64_t *sy) {
  int64_t m;
  KS_TRY(ks_view_rows(&a->x, &m, sx));
  *sr = 0;
  if (a->res.present) KS_TRY(ks_view_rows_out(&a->res, &m, sr));
  KS_TRY(ks_view_rows_out(&a->out, &m, sy));
  if (a->w.present) KS_TRY(ks_check_contiguous(&a->w));
  if (a->b.present) KS_TRY(ks_check_contiguous(&a->b));
  return KS_OK;
}

static float param_at(const ks_view *p, int64_t j) { return ks_load(p->data, p->dtype, j * p->strides[0]); }

/* ---- rms_norm and fused_add_rms_norm: one CPU loop (residual optional) */

static void rms_cpu(const norm_args *a, const ks_rms_norm_options *o) {
  const int64_t n = a->n;
  const int dt = a->x.dtype;
  const int64_t sx = a->x.strides[a->x.ndim - 1], sy = a->out.strides[a->out.ndim - 1];
  const int64_t sr = a->res.present ? a->res.strides[a->res.ndim - 1] : 0;
  const int gemma = o->cast == KS_NORM_CAST_GEMMA;
  for (int64_t r = 0; r < a->rows; r++) {
    const int64_t xo = ks_row_offset(&a->x, r), yo = ks_row_offset(&a->out, r);
    const int64_t ro = a->res.present ? ks_row_offset(&a->res, r) : 0;
    double ss = 0.0;
    for (int64_t j = 0; j < n; j++) {
      float v = ks_load(a->x.data, dt, xo + j * sx);
      if (a->res.present) {
        /* h = x + residual, rounded to x.dtype (as torch adds), is the new residual */
        v = ks_round_to(dt, v + ks_load(a->res.data, dt, ro + j * sr));
        ks_store(a->res.data, dt, ro + j * sr, v);
      }
      ss += (double)v * (double)v;
    }
    const float rstd = 1.0f / sqrtf((float)(ss / (double)n) + o->eps);
    /* the second pass reads h back from residual: out may alias x, never residual */
    const ks_view *src = a->res.present ? &a->res : &a->x;
    const int64_t so = a->res.present ? ro : xo, s_src = a->res.present ? sr : sx;
    for (int64_t j = 0; j < n; j++) {
      float y = ks_load(src->data, dt, so + j * s_src) * rstd;
      if (a->w.present) {
        const float w = o->offset + param_at(&a->w, j);
        y = gemma ? y * w : ks_round_to(dt, y) * w;
      }
      ks_store(a->out.data, dt, yo + j * sy, y);
    }
  }
}

static ks_status_t run_rms(ks_call *c, ks_op_t op, const DLTensor *x, DLTensor *residual, const DLTensor *weight,
                           DLTensor *out, const ks_rms_norm_options *user) {
  norm_args a;
  memset(&a, 0, sizeof a);
  KS_TRY(ks_view_make(c, &a.x, "x", x, KS_REQUIRED));
  if (op == KS_OP_FUSED_ADD_RMS_NORM) KS_TRY(ks_view_make(c, &a.res, "residual", residual, KS_REQUIRED));
  KS_TRY(ks_view_make(c, &a.w, "weight", weight, KS_OPTIONAL));
  KS_TRY(ks_view_make(c, &a.out, "out", out, KS_REQUIRED));
  KS_TRY(check_x(&a.x));
  if (a.res.present) {
    KS_TRY(check_like_x(&a.res, &a.x));
    if (ks_views_overlap(&a.res, &a.x)) /* sharing a byte, the same pointer included */
      return ks_fail(KS_ERR_INVALID_ARGUMENT, "residual: must not alias x or overlap it (h = x + residual is written "
                     "into it)");
    if (ks_views_overlap(&a.out, &a.res))
      return ks_fail(KS_ERR_INVALID_ARGUMENT, "out: must not alias residual or overlap it (it receives h); out may "
                     "alias x");
  }
  KS_TRY(check_param(&a.w, &a.x));
  KS_TRY(check_like_x(&a.out, &a.x));
  ks_rms_norm_options o;
  KS_TRY(rms_options(op, user, &o, a.w.present));
  a.n = a.x.shape[a.x.ndim - 1];
  a.rows = ks_num_rows(&a.x);
  if (c->device_type == kDLCUDA) {
    int64_t sx, sr, sy;
    KS_TRY(cuda_rows(&a, &sx, &sr, &sy));
    KS_TRY(check_out_memory(&a));
    void *res = ks_dev_ptr(c, &a.res);
    KS_CUDA_DISPATCH(c, norm_fwd, a.x.dtype, a.w.present ? a.w.dtype : a.x.dtype, ks_dev_ptr(c, &a.x), res,
                     ks_dev_ptr(c, &a.w), NULL, ks_dev_ptr(c, &a.out), res, NULL, NULL, a.rows, a.n, sx, sr, sy, sr,
                     (double)o.eps, (double)o.offset, 1, o.cast == KS_NORM_CAST_GEMMA);
  }
  KS_TRY(check_out_memory(&a));
  if (c->dry_run) return KS_OK;
  rms_cpu(&a, &o);
  return KS_OK;
}

KS_API ks_status_t ks_rms_norm(const DLTensor *x, const DLTensor *weight, DLTensor *out,
                               const ks_rms_norm_options *options, ks_stream_t stream) {
  ks_call c;
  ks_call_begin(&c, stream, 0);
  return run_rms(&c, KS_OP_RMS_NORM, x, NULL, weight, out, options);
}

ks_status_t ks_query_rms_norm(const DLTensor *const *t, int32_t n, const void *o) {
  ks_call c;
  ks_call_begin(&c, NULL, 1);
  KS_TRY(ks_query_arity(n, 3, "rms_norm"));
  return run_rms(&c, KS_OP_RMS_NORM, t[0], NULL, t[1], (DLTensor *)t[2], o);
}

KS_API ks_status_t ks_fused_add_rms_norm(const DLTensor *x, DLTensor *residual, const DLTensor *weight, DLTensor *out,
                                         const ks_rms_norm_options *options, ks_stream_t stream) {
  ks_call c;
  ks_call_begin(&c, stream, 0);
  return run_rms(&c, KS_OP_FUSED_ADD_RMS_NORM, x, residual, weight, out, options);
}

ks_status_t ks_query_fused_add_rms_norm(const DLTensor *const *t, int32_t n, const void *o) {
  ks_call c;
  ks_call_begin(&c, NULL, 1);
  KS_TRY(ks_query_arity(n, 4, "fused_add_rms_norm"));
  return run_rms(&c, KS_OP_FUSED_ADD_RMS_NORM, t[0], (DLTensor *)t[1], t[2], (DLTensor *)t[3], o);
}

/* ---- layer_norm */

static void ln_cpu(const norm_args *a, float eps) {
  const int64_t n = a->n;
  const int dt = a->x.dtype;
  const int64_t sx = a->x.strides[a->x.ndim - 1], sy = a->out.strides[a->out.ndim - 1];
  for (int64_t r = 0; r < a->rows; r++) {
    const int64_t xo = ks_row_offset(&a->x, r), yo = ks_row_offset(&a->out, r);
    double s = 0.0;
    for (int64_t j = 0; j < n; j++) s += ks_load(a->x.data, dt, xo + j * sx);
    const float mean = (float)(s / (double)n);
    double ss = 0.0;
    for (int64_t j = 0; j < n; j++) {
      const float d = ks_load(a->x.data, dt, xo + j * sx) - mean;
      ss += (double)d * (double)d;
    }
    const float rstd = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    for (int64_t j = 0; j < n; j++) {
      float y = (ks_load(a->x.data, dt, xo + j * sx) - mean) * rstd;
      if (a->w.present) y *= param_at(&a->w, j);
      if (a->b.present) y += param_at(&a->b, j);
      ks_store(a->out.data, dt, yo + j * sy, y);
    }
  }
}

static ks_status_t run_ln(ks_call *c, const DLTensor *x, const DLTensor *weight, const DLTensor *bias, DLTensor *out,
                          const ks_layer_norm_options *user) {
  norm_args a;
  memset(&a, 0, sizeof a);
  KS_TRY(ks_view_make(c, &a.x, "x", x, KS_REQUIRED));
  KS_TRY(ks_view_make(c, &a.w, "weight", weight, KS_OPTIONAL));
  KS_TRY(ks_view_make(c, &a.b, "bias", bias, KS_OPTIONAL));
  KS_TRY(ks_view_make(c, &a.out, "out", out, KS_REQUIRED));
  KS_TRY(check_x(&a.x));
  KS_TRY(check_param(&a.w, &a.x));
  KS_TRY(check_param(&a.b, &a.x));
  KS_TRY(check_like_x(&a.out, &a.x));
  ks_layer_norm_options o;
  KS_TRY(ks_read_options(KS_OP_LAYER_NORM, user, &o, sizeof o, "options"));
  KS_TRY(ks_check_positive(o.eps, "options.eps"));
  a.n = a.x.shape[a.x.ndim - 1];
  a.rows = ks_num_rows(&a.x);
  if (c->device_type == kDLCUDA) {
    int64_t sx, sr, sy;
    KS_TRY(cuda_rows(&a, &sx, &sr, &sy));
    KS_TRY(check_out_memory(&a));
    /* the kernel takes one parameter dtype for weight and bias */
    if (a.w.present && a.b.present && a.w.dtype != a.b.dtype)
      return ks_fail(KS_ERR_UNSUPPORTED_DTYPE, "bias: expected %s (the dtype of weight) on CUDA, got %s",
                     ks_dtype_name(a.w.dtype), ks_dtype_name(a.b.dtype));
    const int wdt = a.w.present ? a.w.dtype : a.b.present ? a.b.dtype : a.x.dtype;
    KS_CUDA_DISPATCH(c, norm_fwd, a.x.dtype, wdt, ks_dev_ptr(c, &a.x), NULL, ks_dev_ptr(c, &a.w), ks_dev_ptr(c, &a.b),
                     ks_dev_ptr(c, &a.out), NULL, NULL, NULL, a.rows, a.n, sx, 0, sy, 0, (double)o.eps, 0.0, 0, 1);
  }
  KS_TRY(check_out_memory(&a));
  if (c->dry_run) return KS_OK;
  ln_cpu(&a, o.eps);
  return KS_OK;
}

KS_API ks_status_t ks_layer_norm(const DLTensor *x, const DLTensor *weight, const DLTensor *bias, DLTensor *out,
                                 const ks_layer_norm_options *options, ks_stream_t stream) {
  ks_call c;
  ks_call_begin(&c, stream, 0);
  return run_ln(&c, x, weight, bias, out, options);
}

ks_status_t ks_query_layer_norm(const DLTensor *const *t, int32_t n, const void *o) {
  ks_call c;
  ks_call_begin(&c, NULL, 1);
  KS_TRY(ks_query_arity(n, 4, "layer_norm"));
  return run_ln(&c, t[0], t[1], t[2], (DLTensor *)t[3], o);
}
