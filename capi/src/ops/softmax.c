/* softmax.c: softmax, log_softmax (forward, over the last dim) and cross_entropy (forward loss).
 *
 * Semantics of kernelset.ops.softmax and kernelset.ops.loss (reference.py): fp32 math;
 * softmax(x / temperature) written in out's dtype; the loss per row is
 *   (1 - eps) (lse - z_t) + eps (lse - mean z) + z_loss lse^2, z = softcap tanh(x / softcap) or x,
 * 0 for rows whose target is ignore_index; MEAN divides the sum by the number of rows not ignored
 * (at least 1). Row sums accumulate in double. On CPU every target is checked before anything is
 * written: one outside [0, V) that is not ignore_index gives KS_ERR_INVALID_ARGUMENT naming it (the
 * Python API's check_target). CUDA tensors run the package's kernels (softmax_fwd; ce_fwd: the
 * per-row loss, reduced by the package's reduction kernel for MEAN and SUM), where such a target is
 * never read past its row and its loss is NaN (no host sync to check targets). Outputs may not
 * share memory with inputs (KS_ERR_INVALID_ARGUMENT naming both), except softmax's out = x (same
 * dtype, shape and strides: in place) and the one-element loss of a mean or sum (written once,
 * after every input was read). */
#include "ks_internal.h"
#include "ks_cuda_ops.h"

/* ---- softmax / log_softmax */

/* Each row is read whole before any of it is written (the CPU loop, and every CUDA kernel: the block
 * kernel, the looped one's output pass reading each chunk before writing it, the split one's chunk
 * per program), so out may be x itself; another view of x's memory would overwrite rows or elements
 * still to be read. Checked after the CUDA layout checks, before the dispatch and the dry-run return. */
static ks_status_t check_softmax_memory(const ks_view *vo, const ks_view *vx) {
  return ks_check_same_or_disjoint(vo, vx, "out may be x itself, in place, but not another view of its memory");
}

static ks_status_t run_softmax(ks_call *c, ks_op_t op, const DLTensor *x, DLTensor *out,
                               const ks_softmax_options *user) {
  const int is_log = op == KS_OP_LOG_SOFTMAX;
  ks_view vx, vo;
  KS_TRY(ks_view_make(c, &vx, "x", x, KS_REQUIRED));
  KS_TRY(ks_view_make(c, &vo, "out", out, KS_REQUIRED));
  KS_TRY(ks_check_dtype(&vx, KS_FLOATS));
  KS_TRY(ks_check_ndim(&vx, 1, KS_MAX_DIMS));
  KS_TRY(ks_check_dtype(&vo, KS_FLOATS)); /* out's dtype is the Python API's out_dtype */
  KS_TRY(ks_check_same_shape(&vx, &vo));
  KS_TRY(ks_check_no_overlap(&vo));
  ks_softmax_options o;
  KS_TRY(ks_read_options(op, user, &o, sizeof o, "options"));
  KS_TRY(ks_check_positive(o.temperature, "options.temperature"));
  const int64_t n = vx.shape[vx.ndim - 1];
  const int64_t rows = n ? ks_num_rows(&vx) : 0;
  if (c->device_type == kDLCUDA) {
    int64_t m, sx, sy;
    KS_TRY(ks_view_rows(&vx, &m, &sx));
    KS_TRY(ks_view_rows_out(&vo, &m, &sy));
    KS_TRY(check_softmax_memory(&vo, &vx));
    KS_CUDA_DISPATCH(c, softmax_fwd, vx.dtype, vo.dtype, ks_dev_ptr(c, &vx), ks_dev_ptr(c, &vo), rows, n, sx, sy,
                     1.0 / (double)o.temperature, is_log);
  }
  KS_TRY(check_softmax_memory(&vo, &vx));
  if (c->dry_run) return KS_OK;
  const int64_t sx = vx.strides[vx.ndim - 1], sy = vo.strides[vo.ndim - 1];
  const float t = o.temperature;
  for (int64_t r = 0; r < rows; r++) {
    const int64_t xo = ks_row_offset(&vx, r), yo = ks_row_offset(&vo, r);
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
      const float z = ks_load(vx.data, vx.dtype, xo + j * sx) / t;
      if (z > mx || z != z) mx = z; /* a NaN makes the row NaN, as in torch */
    }
    double s = 0.0;
    for (int64_t j = 0; j < n; j++) s += expf(ks_load(vx.data, vx.dtype, xo + j * sx) / t - mx);
    const float inv = (float)(1.0 / s), lg = (float)log((double)(float)s);
    for (int64_t j = 0; j < n; j++) {
      const float d = ks_load(vx.data, vx.dtype, xo + j * sx) / t - mx;
      ks_store(vo.data, vo.dtype, yo + j * sy, is_log ? d - lg : expf(d) * inv);
    }
  }
  return KS_OK;
}

KS_API ks_status_t ks_softmax(const DLTensor *x, DLTensor *out, const ks_softmax_options *options,
                              ks_stream_t stream) {
  ks_call c;
  ks_call_begin(&c, stream, 0);
  return run_softmax(&c, KS_OP_SOFTMAX, x, out, options);
}

ks_status_t ks_query_softmax(const DLTensor *const *t, int32_t n, const void *o) {
  ks_call c;
  ks_call_begin(&c, NULL, 1);
  KS_TRY(ks_query_arity(n, 2, "softmax"));
  return run_softmax(&c, KS_OP_SOFTMAX, t[0], (DLTensor *)t[1], o);
}

KS_API ks_status_t ks_log_softmax(const DLTensor *x, DLTensor *out, const ks_softmax_options *options,
                                  ks_stream_t stream) {
  ks_call c;
  ks_call_begin(&c, stream, 0);
  return run_softmax(&c, KS_OP_LOG_SOFTMAX, x, out, options);
}

ks_status_t ks_query_log_softmax(const DLTensor *const *t, int32_t n, const void *o) {
  ks_call c;
  ks_call_begin(&c, NULL, 1);
  KS_TRY(ks_query_arity(n, 2, "log_softmax"));
  return run_softmax(&c, KS_OP_LOG_SOFTMAX, t[0], (DLTensor *)t[1], o);
}

/* ---- cross_entropy */

static ks_status_t ce_options(const ks_cross_entropy_options *user, ks_cross_entropy_options *o) {
  KS_TRY(ks_read_options(KS_OP_CROSS_ENTROPY, user, o, sizeof *o, "options"));
  if (!(o->label_smoothing >= 0.0f && o->label_smoothing < 1.0f))
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "options.label_smoothing: expected a number in [0, 1), got %g",
                   (double)o->label_smoothing);
  if (!(o->z_loss >= 0.0f && o->z_loss < INFINITY))
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "options.z_loss: expected a finite number >= 0, got %g", (double)o->z_loss);
  if (!(o->softcap >= 0.0f && o->softcap < INFINITY))
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "options.softcap: expected 0 (none) or a finite number > 0, got %g",
                   (double)o->softcap);
  return ks_check_range_i32(o->reduction, KS_REDUCTION_NONE, KS_REDUCTION_SUM, "options.reduction");
}

static float capped(float x, float softcap) { return softcap > 0.0f ? softcap * tanhf(x / softcap) : x; }

/* Reduction NONE writes loss row by row while later rows of logits and target are still to be read:
 * loss may share memory with neither. A mean or sum writes its one element once, after every input
 * was read (the CPU loop; on CUDA the per-row losses go to library scratch and the one-program
 * reduction writes loss last), so there sharing is harmless and stays allowed. Checked after the
 * CUDA layout checks, before the dispatch and the dry-run return. */
static ks_status_t check_ce_memory(const ks_cross_entropy_options *o, const ks_view *vl, const ks_view *vx,
                                   const ks_view *vt) {
  if (o->reduction != KS_REDUCTION_NONE) return KS_OK;
  KS_TRY(ks_check_disjoint(vl, vx, "an output may not share memory with an input"));
  return ks_check_not_index(vl, vt);
}

static ks_status_t run_ce(ks_call *c, const DLTensor *logits, const DLTensor *target, DLTensor *loss,
                          const ks_cross_entropy_options *user) {
  ks_view vx, vt, vl;
  KS_TRY(ks_view_make(c, &vx, "logits", logits, KS_REQUIRED));
  KS_TRY(ks_view_make(c, &vt, "target", target, KS_REQUIRED));
  KS_TRY(ks_view_make(c, &vl, "loss", loss, KS_REQUIRED));
  KS_TRY(ks_check_dtype(&vx, KS_FLOATS));
  KS_TRY(ks_check_ndim(&vx, 1, KS_MAX_DIMS));
  const int64_t v = vx.shape[vx.ndim - 1];
  if (v == 0) return ks_fail(KS_ERR_INVALID_ARGUMENT, "logits: expected a vocabulary size (last dim) >= 1, got 0");
  KS_TRY(ks_check_dtype(&vt, KS_INDEX));
  KS_TRY(ks_check_ndim(&vt, vx.ndim - 1, vx.ndim - 1));
  for (int32_t d = 0; d < vt.ndim; d++) KS_TRY(ks_check_dim(&vt, d, vx.shape[d], "the leading dims of logits"));
  KS_TRY(ks_check_dtype(&vl, KS_BIT(KS_DT_F32)));
  ks_cross_entropy_options o;
  KS_TRY(ce_options(user, &o));
  if (o.reduction == KS_REDUCTION_NONE) {
    KS_TRY(ks_check_same_shape(&vt, &vl));
    KS_TRY(ks_check_no_overlap(&vl));
  } else if (vl.numel != 1 || vl.ndim > 1) {
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "loss: expected a 0-d or [1] tensor for a mean or sum reduction, got %d "
                   "dims and %lld elements", (int)vl.ndim, (long long)vl.numel);
  }
  const int64_t rows = vt.numel;
  if (c->device_type == kDLCUDA) {
    int64_t m, sx;
    KS_TRY(ks_view_rows(&vx, &m, &sx));
    KS_TRY(ks_check_contiguous(&vt));
    KS_TRY(ks_check_contiguous(&vl));
    KS_TRY(check_ce_memory(&o, &vl, &vx, &vt));
    /* the AOT kernels take ignore_index as an int32 (launch.c refuses wider values by the kernel's
     * parameter name): say so by the option's name, before any plan */
    if (o.ignore_index < INT32_MIN || o.ignore_index > INT32_MAX)
      return ks_fail(KS_ERR_UNSUPPORTED_SHAPE, "options.ignore_index: expected a value in the int32 range on CUDA "
                     "(this build's kernels take an int32), got %lld; the CPU path takes any int64",
                     (long long)o.ignore_index);
    KS_CUDA_DISPATCH(c, ce_fwd, vx.dtype, vt.dtype, ks_dev_ptr(c, &vx), ks_dev_ptr(c, &vt), ks_dev_ptr(c, &vl), rows,
                     v, sx, o.ignore_index, (double)o.label_smoothing, (double)o.z_loss, (double)o.softcap,
                     o.reduction);
  }
  KS_TRY(check_ce_memory(&o, &vl, &vx, &vt));
  if (c->dry_run) return KS_OK;
  for (int64_t r = 0; r < rows; r++) {
    const int64_t t = ks_load_index(vt.data, vt.dtype, ks_flat_offset(&vt, r));
    if (t != o.ignore_index && (t < 0 || t >= v))
      return ks_fail(KS_ERR_INVALID_ARGUMENT, "target: target %lld (flat index %lld) is outside [0, %lld) (logits' "
                     "last dim) and is not options.ignore_index (%lld)", (long long)t, (long long)r, (long long)v,
                     (long long)o.ignore_index);
  }
  const int64_t sx = vx.strides[vx.ndim - 1];
  const float eps = o.label_smoothing;
  double total = 0.0;
  int64_t valid = 0;
  for (int64_t r = 0; r < rows; r++) {
    const int64_t xo = ks_row_offset(&vx, r);
    const int64_t t = ks_load_index(vt.data, vt.dtype, ks_flat_offset(&vt, r));
    float row = 0.0f;
    if (t != o.ignore_index) {
      valid++;
      float mx = -INFINITY;
      double sz = 0.0;
      for (int64_t j = 0; j < v; j++) {
        const float z = capped(ks_load(vx.data, vx.dtype, xo + j * sx), o.softcap);
        if (z > mx || z != z) mx = z;
        sz += z;
      }
      double s = 0.0;
      for (int64_t j = 0; j < v; j++) s += expf(capped(ks_load(vx.data, vx.dtype, xo + j * sx), o.softcap) - mx);
      const float lse = mx + (float)log(s);
      const float zt = capped(ks_load(vx.data, vx.dtype, xo + t * sx), o.softcap); /* t in [0, v): checked */
      const float mean = (float)(sz / (double)v);
      row = (1.0f - eps) * (lse - zt) + eps * (lse - mean) + o.z_loss * lse * lse;
    }
    if (o.reduction == KS_REDUCTION_NONE) {
      ((float *)vl.data)[ks_flat_offset(&vl, r)] = row;
    } else {
      total += row;
    }
  }
  if (o.reduction == KS_REDUCTION_SUM) {
    ((float *)vl.data)[0] = (float)total;
  } else if (o.reduction == KS_REDUCTION_MEAN) {
    const float scale = 1.0f / (float)(valid > 0 ? valid : 1);
    ((float *)vl.data)[0] = (float)total * scale;
  }
  return KS_OK;
}

KS_API ks_status_t ks_cross_entropy(const DLTensor *logits, const DLTensor *target, DLTensor *loss,
                                    const ks_cross_entropy_options *options, ks_stream_t stream) {
  ks_call c;
  ks_call_begin(&c, stream, 0);
  return run_ce(&c, logits, target, loss, options);
}

ks_status_t ks_query_cross_entropy(const DLTensor *const *t, int32_t n, const void *o) {
  ks_call c;
  ks_call_begin(&c, NULL, 1);
  KS_TRY(ks_query_arity(n, 3, "cross_entropy"));
  return run_ce(&c, t[0], t[1], (DLTensor *)t[2], o);
}
