/* tensor.c: DLTensor -> ks_view (every check that does not depend on the op) and the shared
 * shape, dtype and layout checks. Messages name the argument first. */
#include <stdio.h>

#include "ks_internal.h"

const char *ks_dtype_name(int dt) {
  switch (dt) {
    case KS_DT_F32: return "float32";
    case KS_DT_F16: return "float16";
    case KS_DT_BF16: return "bfloat16";
    case KS_DT_F8E4M3: return "float8_e4m3fn";
    case KS_DT_F8E5M2: return "float8_e5m2";
    case KS_DT_I8: return "int8";
    case KS_DT_U8: return "uint8";
    case KS_DT_I16: return "int16";
    case KS_DT_I32: return "int32";
    case KS_DT_I64: return "int64";
    default: return "unknown";
  }
}

static int elem_size_of(int dt) {
  switch (dt) {
    case KS_DT_F32: case KS_DT_I32: return 4;
    case KS_DT_F16: case KS_DT_BF16: case KS_DT_I16: return 2;
    case KS_DT_I64: return 8;
    default: return 1;
  }
}

/* A DLPack dtype kernelset does not take, in words: "float64", "bool", "complex64" ... */
static void dl_dtype_text(DLDataType t, char *buf, size_t len) {
  const char *kind = NULL;
  switch (t.code) {
    case kDLInt: kind = "int"; break;
    case kDLUInt: kind = "uint"; break;
    case kDLFloat: kind = "float"; break;
    case kDLBfloat: kind = "bfloat"; break;
    case kDLComplex: kind = "complex"; break;
    case kDLBool: kind = "bool"; break;
    default: break;
  }
  if (kind == NULL) {
    snprintf(buf, len, "(DLPack code %u, %u bits)", (unsigned)t.code, (unsigned)t.bits);
  } else if (t.code == kDLBool) {
    snprintf(buf, len, "bool");
  } else {
    snprintf(buf, len, "%s%u", kind, (unsigned)t.bits);
  }
}

static const char *device_name(int type) { return type == kDLCUDA ? "cuda" : "cpu"; }

int ks_is_cpu(const ks_call *c) { return c->device_type == kDLCPU; }

/* "[2, 3, 4]" */
static void shape_text(const ks_view *v, char *buf, size_t len) {
  size_t n = 0;
  n += (size_t)snprintf(buf, len, "[");
  for (int32_t d = 0; d < v->ndim && n < len; d++)
    n += (size_t)snprintf(buf + n, len - n, d ? ", %lld" : "%lld", (long long)v->shape[d]);
  if (n < len) snprintf(buf + n, len - n, "]");
}

ks_status_t ks_view_make(ks_call *c, ks_view *v, const char *name, const DLTensor *t, int optional) {
  memset(v, 0, sizeof *v);
  v->name = name;
  v->t = t;
  if (t == NULL) {
    if (optional == KS_OPTIONAL) return KS_OK;
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: required tensor is NULL", name);
  }
  v->present = 1;
  if (t->ndim < 0 || t->ndim > KS_MAX_DIMS)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: ndim %d is outside [0, %d]", name, (int)t->ndim, KS_MAX_DIMS);
  if (t->ndim > 0 && t->shape == NULL) return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: shape is NULL", name);
  if (t->dtype.lanes != 1)
    return ks_fail(KS_ERR_UNSUPPORTED_DTYPE, "%s: expected lanes 1, got %u (vector dtypes are not supported)", name,
                   (unsigned)t->dtype.lanes);
  v->dtype = ks_cuda_dtype_from_dl(t->dtype);
  if (v->dtype == 0) {
    char dt[48];
    dl_dtype_text(t->dtype, dt, sizeof dt);
    return ks_fail(KS_ERR_UNSUPPORTED_DTYPE, "%s: dtype %s is not supported", name, dt);
  }
  v->elem_size = elem_size_of(v->dtype);
  v->ndim = t->ndim;
  v->numel = 1;
  int64_t span = 0; /* largest |element offset|, checked against overflow */
  for (int32_t d = 0; d < v->ndim; d++) {
    const int64_t n = t->shape[d];
    if (n < 0) return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: dim %d is negative (%lld)", name, (int)d, (long long)n);
    v->shape[d] = n;
  }
  for (int32_t d = v->ndim - 1; d >= 0; d--) {
    if (t->strides == NULL) {
      v->strides[d] = v->numel; /* compact row-major */
    } else {
      v->strides[d] = t->strides[d];
    }
    const int64_t n = v->shape[d];
    if (n == 0) {
      v->numel = 0;
    } else if (v->numel > 0) {
      if (v->numel > INT64_MAX / n)
        return ks_fail(KS_ERR_UNSUPPORTED_SHAPE, "%s: number of elements overflows int64", name);
      v->numel *= n;
    }
  }
  if (v->numel > 0) {
    for (int32_t d = 0; d < v->ndim; d++) {
      const int64_t st = v->strides[d] < 0 ? -v->strides[d] : v->strides[d];
      if (v->strides[d] == INT64_MIN || (v->shape[d] > 1 && st > (INT64_MAX / 16 - span) / (v->shape[d] - 1)))
        return ks_fail(KS_ERR_UNSUPPORTED_LAYOUT, "%s: strides reach beyond int64 offsets", name);
      span += st * (v->shape[d] - 1);
    }
  }
  /* device: CUDA host memory is CPU-addressable */
  int type = (int)t->device.device_type;
  if (type == kDLCUDAHost) type = kDLCPU;
  if (type != kDLCPU && type != kDLCUDA)
    return ks_fail(KS_ERR_UNSUPPORTED_DEVICE, "%s: device type %d is not supported (cpu or cuda)", name,
                   (int)t->device.device_type);
  const int32_t id = type == kDLCUDA ? t->device.device_id : 0;
  if (c->device_type == 0) {
    c->device_type = type;
    c->device_id = id;
    c->first = name;
  } else if (c->device_type != type || c->device_id != id) {
    return ks_fail(KS_ERR_UNSUPPORTED_DEVICE, "%s: on %s:%d but %s is on %s:%d (all tensors of a call share one device)",
                   name, device_name(type), (int)id, c->first, device_name(c->device_type), (int)c->device_id);
  }
  if (t->byte_offset % (uint64_t)v->elem_size)
    return ks_fail(KS_ERR_UNSUPPORTED_LAYOUT, "%s: byte_offset %llu is not a multiple of the element size %d", name,
                   (unsigned long long)t->byte_offset, v->elem_size);
  if (t->data == NULL) {
    if (v->numel > 0 && !c->dry_run) return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: data is NULL", name);
    v->data = NULL;
  } else {
    v->data = (char *)t->data + t->byte_offset;
    if ((uintptr_t)v->data % (uintptr_t)v->elem_size)
      return ks_fail(KS_ERR_UNSUPPORTED_LAYOUT, "%s: data + byte_offset is not aligned to its %d-byte elements", name,
                     v->elem_size);
  }
  return KS_OK;
}

ks_status_t ks_check_dtype(const ks_view *v, uint32_t mask) {
  if (mask & KS_BIT(v->dtype)) return KS_OK;
  char list[160];
  size_t n = 0;
  int count = 0, total = 0;
  for (int dt = 1; dt <= KS_DT_I64; dt++) total += (mask & KS_BIT(dt)) != 0;
  list[0] = '\0';
  for (int dt = 1; dt <= KS_DT_I64 && n < sizeof list; dt++) {
    if (!(mask & KS_BIT(dt))) continue;
    count++;
    const char *sep = count == 1 ? "" : count == total ? " or " : ", ";
    n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", sep, ks_dtype_name(dt));
  }
  return ks_fail(KS_ERR_UNSUPPORTED_DTYPE, "%s: expected %s, got %s", v->name, list, ks_dtype_name(v->dtype));
}

ks_status_t ks_check_same_dtype(const ks_view *a, const ks_view *b) {
  if (!a->present || !b->present || a->dtype == b->dtype) return KS_OK;
  return ks_fail(KS_ERR_UNSUPPORTED_DTYPE, "%s: expected %s (the dtype of %s), got %s", b->name,
                 ks_dtype_name(a->dtype), a->name, ks_dtype_name(b->dtype));
}

ks_status_t ks_check_ndim(const ks_view *v, int32_t lo, int32_t hi) {
  if (v->ndim >= lo && v->ndim <= hi) return KS_OK;
  if (lo == hi)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected %d dims, got %d", v->name, (int)lo, (int)v->ndim);
  return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected %d to %d dims, got %d", v->name, (int)lo, (int)hi,
                 (int)v->ndim);
}

ks_status_t ks_check_dim(const ks_view *v, int32_t d, int64_t size, const char *what) {
  const int32_t k = d < 0 ? d + v->ndim : d;
  if (k < 0 || k >= v->ndim)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: has %d dims, no dim %d", v->name, (int)v->ndim, (int)d);
  if (v->shape[k] == size) return KS_OK;
  char sh[128];
  shape_text(v, sh, sizeof sh);
  return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: dim %d must be %lld (%s), got shape %s", v->name, (int)k,
                 (long long)size, what, sh);
}

ks_status_t ks_check_same_shape(const ks_view *a, const ks_view *b) {
  int same = a->ndim == b->ndim;
  for (int32_t d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
  if (same) return KS_OK;
  char sa[128], sb[128];
  shape_text(a, sa, sizeof sa);
  shape_text(b, sb, sizeof sb);
  return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected shape %s (the shape of %s), got %s", b->name, sa, a->name, sb);
}

ks_status_t ks_check_contiguous(const ks_view *v) {
  int64_t expect = 1;
  for (int32_t d = v->ndim - 1; d >= 0; d--) {
    if (v->shape[d] != 1 && v->strides[d] != expect)
      return ks_fail(KS_ERR_UNSUPPORTED_LAYOUT, "%s: expected a contiguous (row-major) tensor; dim %d has stride %lld",
                     v->name, (int)d, (long long)v->strides[d]);
    expect *= v->shape[d];
  }
  return KS_OK;
}

ks_status_t ks_check_inner_contiguous(const ks_view *v) {
  if (v->ndim == 0 || v->shape[v->ndim - 1] <= 1 || v->strides[v->ndim - 1] == 1) return KS_OK;
  return ks_fail(KS_ERR_UNSUPPORTED_LAYOUT, "%s: the last dim must have stride 1, got %lld", v->name,
                 (long long)v->strides[v->ndim - 1]);
}

ks_status_t ks_view_rows(const ks_view *v, int64_t *rows, int64_t *row_stride) {
  if (v->ndim < 1) return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected at least 1 dim, got 0", v->name);
  const int64_t n = v->shape[v->ndim - 1];
  *rows = ks_num_rows(v);
  *row_stride = n;
  if (v->numel == 0) return KS_OK; /* nothing is read or written */
  KS_TRY(ks_check_inner_contiguous(v));
  int found = 0;
  int64_t stride = n, expect = 0;
  for (int32_t d = v->ndim - 2; d >= 0; d--) {
    if (v->shape[d] == 1) continue;
    if (!found) {
      found = 1;
      stride = v->strides[d];
    } else if (v->strides[d] != expect) {
      return ks_fail(KS_ERR_UNSUPPORTED_LAYOUT,
                     "%s: its leading dims do not collapse into rows of one stride (dim %d has stride %lld, "
                     "expected %lld)", v->name, (int)d, (long long)v->strides[d], (long long)expect);
    }
    expect = v->strides[d] * v->shape[d];
  }
  if (stride < 0)
    return ks_fail(KS_ERR_UNSUPPORTED_LAYOUT, "%s: negative row stride %lld", v->name, (long long)stride);
  *row_stride = stride;
  return KS_OK;
}

/* ---- additions (see ks_internal.h) */

ks_status_t ks_view_rows_out(const ks_view *v, int64_t *rows, int64_t *row_stride) {
  KS_TRY(ks_view_rows(v, rows, row_stride));
  const int64_t n = v->shape[v->ndim - 1];
  if (*rows > 1 && n > 0 && *row_stride < n)
    return ks_fail(KS_ERR_UNSUPPORTED_LAYOUT, "%s: rows overlap (row stride %lld < row length %lld); outputs need "
                   "distinct elements", v->name, (long long)*row_stride, (long long)n);
  return KS_OK;
}

int64_t ks_num_rows(const ks_view *v) {
  int64_t r = 1;
  for (int32_t d = 0; d + 1 < v->ndim; d++) r *= v->shape[d];
  return r;
}

int64_t ks_row_offset(const ks_view *v, int64_t r) {
  int64_t o = 0;
  for (int32_t d = v->ndim - 2; d >= 0; d--) {
    const int64_t n = v->shape[d];
    o += (r % n) * v->strides[d];
    r /= n;
  }
  return o;
}

int64_t ks_flat_offset(const ks_view *v, int64_t i) {
  int64_t o = 0;
  for (int32_t d = v->ndim - 1; d >= 0; d--) {
    const int64_t n = v->shape[d];
    o += (i % n) * v->strides[d];
    i /= n;
  }
  return o;
}

ks_status_t ks_check_no_overlap(const ks_view *v) {
  /* sufficient test: sorted by stride, each dim's stride exceeds the extent of the smaller ones */
  int64_t st[KS_MAX_DIMS], sh[KS_MAX_DIMS];
  int32_t k = 0;
  if (v->numel <= 1) return KS_OK;
  for (int32_t d = 0; d < v->ndim; d++) {
    if (v->shape[d] == 1) continue;
    st[k] = v->strides[d] < 0 ? -v->strides[d] : v->strides[d];
    sh[k++] = v->shape[d];
  }
  for (int32_t i = 1; i < k; i++) { /* insertion sort by stride */
    for (int32_t j = i; j > 0 && st[j] < st[j - 1]; j--) {
      int64_t a = st[j]; st[j] = st[j - 1]; st[j - 1] = a;
      a = sh[j]; sh[j] = sh[j - 1]; sh[j - 1] = a;
    }
  }
  int64_t extent = 1;
  for (int32_t i = 0; i < k; i++) {
    if (st[i] < extent)
      return ks_fail(KS_ERR_UNSUPPORTED_LAYOUT, "%s: elements overlap (a stride of %lld inside an extent of %lld); "
                     "outputs need distinct elements", v->name, (long long)st[i], (long long)extent);
    extent = st[i] * (sh[i] - 1) + extent;
  }
  return KS_OK;
}

void *ks_dev_ptr(const ks_call *c, const ks_view *v) {
  if (!v->present) return NULL;
  if (v->data == NULL && c->dry_run) return (void *)(uintptr_t)256; /* a plan reads only its alignment */
  return v->data;
}

/* ---- overlap between two views (outputs against the inputs they must not share memory with) */

/* bytes a non-empty view can touch, relative to its data pointer: [*lo, *hi). Only dims of more
 * than one element count; "inner" restricts the sum to dims whose byte stride is not a multiple of
 * period (period 0: every dim). ks_view_make bounds every offset, so nothing here overflows. */
static void byte_extent(const ks_view *v, int64_t period, int64_t *lo, int64_t *hi) {
  int64_t mn = 0, mx = 0;
  for (int32_t d = 0; d < v->ndim; d++) {
    if (v->shape[d] <= 1) continue;
    const int64_t sb = v->strides[d] * v->elem_size;
    if (period > 0 && sb % period == 0) continue;
    const int64_t e = sb * (v->shape[d] - 1);
    if (e < 0) mn += e; else mx += e;
  }
  *lo = mn;
  *hi = mx + v->elem_size;
}

/* The residues modulo period of the bytes v touches lie in the cyclic interval [*start, *start +
 * *len) when every dim whose byte stride is not a multiple of period spans less than period; else
 * returns 0 (no answer for this period). */
static int residue_interval(const ks_view *v, int64_t period, int64_t *start, int64_t *len) {
  int64_t lo, hi;
  byte_extent(v, period, &lo, &hi);
  if (hi - lo > period) return 0;
  const int64_t base = (int64_t)((uint64_t)(uintptr_t)v->data % (uint64_t)period);
  int64_t off = lo % period;
  if (off < 0) off += period;
  *start = (base + off) % period;
  *len = hi - lo;
  return 1;
}

static int touches_memory(const ks_view *v) { return v->present && v->data != NULL && v->numel > 0; }

int ks_views_overlap(const ks_view *a, const ks_view *b) {
  if (!touches_memory(a) || !touches_memory(b)) return 0; /* dry runs without data: nothing to compare */
  int64_t alo, ahi, blo, bhi;
  byte_extent(a, 0, &alo, &ahi);
  byte_extent(b, 0, &blo, &bhi);
  /* whole byte ranges first (unsigned: offsets may be negative) */
  const uint64_t a0 = (uint64_t)(uintptr_t)a->data + (uint64_t)alo, a1 = (uint64_t)(uintptr_t)a->data + (uint64_t)ahi;
  const uint64_t b0 = (uint64_t)(uintptr_t)b->data + (uint64_t)blo, b1 = (uint64_t)(uintptr_t)b->data + (uint64_t)bhi;
  if (a1 <= b0 || b1 <= a0) return 0;
  /* interleaved views (slices of one fused buffer: q and k of a qkv projection, the k and v halves
   * of a [num_blocks, 2, ...] cache): disjoint if, for a period that some dim steps by, both views
   * stay inside disjoint residue intervals modulo it */
  const ks_view *vs[2] = {a, b};
  for (int i = 0; i < 2; i++) {
    for (int32_t d = 0; d < vs[i]->ndim; d++) {
      if (vs[i]->shape[d] <= 1) continue;
      int64_t p = vs[i]->strides[d] * vs[i]->elem_size;
      if (p < 0) p = -p;
      if (p == 0) continue;
      int64_t sa, la, sb, lb;
      if (!residue_interval(a, p, &sa, &la) || !residue_interval(b, p, &sb, &lb)) continue;
      int64_t ab = sb - sa, ba = sa - sb;
      if (ab < 0) ab += p;
      if (ba < 0) ba += p;
      if (ab >= la && ba >= lb) return 0;
    }
  }
  return 1;
}

int ks_view_byte_range(const ks_view *v, uint64_t *lo, uint64_t *hi) {
  *lo = *hi = 0;
  if (!touches_memory(v)) return 0;
  int64_t l, h;
  byte_extent(v, 0, &l, &h);
  *lo = (uint64_t)(uintptr_t)v->data + (uint64_t)l;
  *hi = (uint64_t)(uintptr_t)v->data + (uint64_t)h;
  if (*hi <= *lo) { /* wraps around the address space: all of it, conservatively */
    *lo = 0;
    *hi = UINT64_MAX;
  }
  return 1;
}

int ks_views_same(const ks_view *a, const ks_view *b) {
  if (!touches_memory(a) || !touches_memory(b)) return 0;
  if (a->data != b->data || a->dtype != b->dtype || a->ndim != b->ndim) return 0;
  for (int32_t d = 0; d < a->ndim; d++) {
    if (a->shape[d] != b->shape[d]) return 0;
    if (a->shape[d] > 1 && a->strides[d] != b->strides[d]) return 0;
  }
  return 1;
}

ks_status_t ks_check_disjoint(const ks_view *out, const ks_view *in, const char *why) {
  if (!ks_views_overlap(out, in)) return KS_OK;
  return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: overlaps %s (%s)", out->name, in->name, why);
}

ks_status_t ks_check_not_index(const ks_view *out, const ks_view *index) {
  return ks_check_disjoint(out, index, "an output may not share memory with index data");
}

ks_status_t ks_check_same_or_disjoint(const ks_view *out, const ks_view *in, const char *why) {
  if (ks_views_same(out, in)) return KS_OK;
  return ks_check_disjoint(out, in, why);
}

ks_status_t ks_check_disjoint_all(const ks_view *const *outs, int n_outs, const ks_view *const *ins, int n_ins,
                                  const char *why) {
  for (int i = 0; i < n_outs; i++) {
    if (outs[i] == NULL) continue;
    for (int j = 0; j < n_ins; j++)
      if (ins[j] != NULL) KS_TRY(ks_check_disjoint(outs[i], ins[j], why));
  }
  return KS_OK;
}
