/* embedding.c: out[..., :] = weight[ids[...], :] (forward).
 *
 * Semantics of kernelset.ops.embedding (reference.py). On CPU every id is checked before anything
 * is written: an id outside [0, V) gives KS_ERR_INVALID_ARGUMENT naming it (the Python API's
 * check_ids). CUDA tensors run the package's kernel (ks_cuda_embedding_fwd_launch), where an
 * out-of-range id is never read and its output row is NaN (no host sync to check ids). out may not
 * share memory with ids or weight (KS_ERR_INVALID_ARGUMENT naming both). */
#include "ks_internal.h"
#include "ks_cuda_ops.h"

/* Rows of weight are gathered while out is written: out may not be (a view of) weight, not even
 * weight itself (out[k] = weight[ids[k]] is no in-place operation). Checked after the CUDA layout
 * checks, before the dispatch and the dry-run return. */
static ks_status_t check_weight_apart(const ks_view *vo, const ks_view *vw) {
  return ks_check_disjoint(vo, vw, "an output may not share memory with an input");
}

static ks_status_t run_embedding(ks_call *c, const DLTensor *ids, const DLTensor *weight, DLTensor *out) {
  ks_view vi, vw, vo;
  KS_TRY(ks_view_make(c, &vi, "ids", ids, KS_REQUIRED));
  KS_TRY(ks_view_make(c, &vw, "weight", weight, KS_REQUIRED));
  KS_TRY(ks_view_make(c, &vo, "out", out, KS_REQUIRED));
  KS_TRY(ks_check_dtype(&vi, KS_INDEX));
  KS_TRY(ks_check_ndim(&vi, 0, KS_MAX_DIMS - 1));
  KS_TRY(ks_check_dtype(&vw, KS_FLOATS));
  KS_TRY(ks_check_ndim(&vw, 2, 2));
  KS_TRY(ks_check_same_dtype(&vw, &vo));
  KS_TRY(ks_check_ndim(&vo, vi.ndim + 1, vi.ndim + 1));
  for (int32_t d = 0; d < vi.ndim; d++) KS_TRY(ks_check_dim(&vo, d, vi.shape[d], "the shape of ids"));
  KS_TRY(ks_check_dim(&vo, -1, vw.shape[1], "the embedding dim, weight.shape[1]"));
  KS_TRY(ks_check_no_overlap(&vo));
  KS_TRY(ks_check_not_index(&vo, &vi)); /* the ids are checked, then read again while out is written */
  const int64_t v = vw.shape[0], h = vw.shape[1], n = vi.numel;
  if (c->device_type == kDLCUDA) {
    /* the kernel reads ids[m] and writes out[m, :] densely; weight rows have one stride */
    int64_t rows, sw;
    KS_TRY(ks_check_contiguous(&vi));
    KS_TRY(ks_check_contiguous(&vo));
    KS_TRY(ks_view_rows(&vw, &rows, &sw));
    KS_TRY(check_weight_apart(&vo, &vw));
    KS_CUDA_DISPATCH(c, embedding_fwd, vi.dtype, vw.dtype, ks_dev_ptr(c, &vi), ks_dev_ptr(c, &vw), ks_dev_ptr(c, &vo),
                     h ? n : 0, v, h, sw);
  }
  KS_TRY(check_weight_apart(&vo, &vw));
  if (c->dry_run) return KS_OK;
  for (int64_t k = 0; k < n; k++) {
    const int64_t id = ks_load_index(vi.data, vi.dtype, ks_flat_offset(&vi, k));
    if (id < 0 || id >= v)
      return ks_fail(KS_ERR_INVALID_ARGUMENT, "ids: id %lld (flat index %lld) is outside [0, %lld) (num_embeddings)",
                     (long long)id, (long long)k, (long long)v);
  }
  const int64_t sw = vw.strides[1], so = vo.strides[vo.ndim - 1];
  const int64_t es = vw.elem_size;
  for (int64_t k = 0; k < n; k++) {
    const int64_t id = ks_load_index(vi.data, vi.dtype, ks_flat_offset(&vi, k));
    const char *src = vw.data + id * vw.strides[0] * es; /* byte offsets: strides may be negative */
    char *dst = vo.data + ks_row_offset(&vo, k) * es;
    if (sw == 1 && so == 1) {
      memcpy(dst, src, (size_t)(h * es));
    } else {
      for (int64_t j = 0; j < h; j++) memcpy(dst + j * so * es, src + j * sw * es, (size_t)es);
    }
  }
  return KS_OK;
}

KS_API ks_status_t ks_embedding(const DLTensor *ids, const DLTensor *weight, DLTensor *out, ks_stream_t stream) {
  ks_call c;
  ks_call_begin(&c, stream, 0);
  return run_embedding(&c, ids, weight, out);
}

ks_status_t ks_query_embedding(const DLTensor *const *t, int32_t n, const void *o) {
  ks_call c;
  ks_call_begin(&c, NULL, 1);
  (void)o;
  KS_TRY(ks_query_arity(n, 3, "embedding"));
  return run_embedding(&c, t[0], t[1], (DLTensor *)t[2]);
}
