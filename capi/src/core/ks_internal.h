/* ks_internal.h: what the C core (capi/src/core) shares with the op files (capi/src/ops).
 * Not installed, not part of the ABI.
 *
 * Shape of an op file (capi/src/ops/<family>.c), one per op family:
 *
 *   static ks_status_t run_rms_norm(ks_call *c, const DLTensor *x, ..., const ks_rms_norm_options *o) {
 *     ks_view vx, vw, vo;
 *     KS_TRY(ks_view_make(c, &vx, "x", x, KS_REQUIRED));
 *     KS_TRY(ks_check_dtype(&vx, KS_FLOATS));               // errors name the argument
 *     ...every check the op needs (shapes, strides, devices via ks_check_devices)...
 *     if (c->dry_run) return KS_OK;                          // ks_query_support stops here
 *     if (c->device_type == kDLCUDA) return <ks_cuda_*_launch or ks_not_on_cuda(c, "rms_norm")>;
 *     ...the CPU loop (fp32 accumulation, ks_load / ks_store)...
 *   }
 *   KS_API ks_status_t ks_rms_norm(...) { ks_call c; ks_call_begin(&c, stream, 0); return run_rms_norm(&c, ...); }
 *   ks_status_t ks_query_rms_norm(const DLTensor *const *t, int32_t n, const void *o) {
 *     ks_call c; ks_call_begin(&c, NULL, 1);
 *     KS_TRY(ks_query_arity(n, 3, "rms_norm"));
 *     return run_rms_norm(&c, t[0], t[1], (DLTensor *)t[2], o);
 *   }
 *
 * so the public call and ks_query_support share one validation path and cannot disagree.
 * Options: ks_read_options copies the caller's first `size` bytes over the defaults (older
 * callers with shorter structs keep working) and refuses size < sizeof(size_t) or size > ours.
 */
#ifndef KS_INTERNAL_H_
#define KS_INTERNAL_H_

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernelset.h"
#include "../cuda/ks_cuda.h" /* KS_DT_* element types, ks_cuda_dtype_from_dl */

#define KS_MAX_DIMS 8
#define KS_ERRLEN 512

/* ---- errors (errors.c) */
/* Sets this thread's message ("<fmt>") and returns s. Messages name the argument first:
 * "x: expected float32, float16 or bfloat16, got int32". */
ks_status_t ks_fail(ks_status_t s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ks_clear_error(void);
/* This thread's message buffer (KS_ERRLEN bytes), for layers that write into (err, errlen). */
char *ks_error_buffer(void);
#define KS_TRY(expr)                    \
  do {                                  \
    ks_status_t ks_try_s_ = (expr);     \
    if (ks_try_s_ != KS_OK) return ks_try_s_; \
  } while (0)

/* ---- one call (core.c) */
typedef struct {
  int dry_run;          /* ks_query_support: validate only, data pointers may be NULL */
  ks_stream_t stream;
  int device_type;      /* kDLCPU or kDLCUDA once the first tensor was seen (0 before) */
  int32_t device_id;
  const char *first;    /* name of the first tensor seen (for device-mismatch messages) */
} ks_call;
void ks_call_begin(ks_call *c, ks_stream_t stream, int dry_run); /* also clears the error */

/* ---- tensor views (tensor.c) */
typedef struct {
  const char *name;
  const DLTensor *t;    /* NULL for an absent optional tensor (then present == 0) */
  int present;
  char *data;           /* t->data + byte_offset (NULL in a dry run without data) */
  int dtype;            /* KS_DT_* */
  int32_t ndim;
  int64_t shape[KS_MAX_DIMS];
  int64_t strides[KS_MAX_DIMS]; /* in elements; compact row-major filled in when t->strides is NULL */
  int64_t numel;
  int elem_size;        /* bytes */
} ks_view;
enum { KS_REQUIRED = 0, KS_OPTIONAL = 1 };
/* NULL (unless optional), ndim in [0, KS_MAX_DIMS], negative dims, lanes != 1, unknown dtype,
 * NULL data with numel > 0 (outside a dry run), byte_offset not a multiple of the element size,
 * device type other than CPU/CUDA(/CUDAHost as CPU), and a device different from the call's
 * first tensor (KS_ERR_UNSUPPORTED_DEVICE) are refused here. */
ks_status_t ks_view_make(ks_call *c, ks_view *v, const char *name, const DLTensor *t, int optional);

/* dtype masks: bit (1 << KS_DT_*) */
#define KS_BIT(dt) (1u << (dt))
#define KS_FLOATS (KS_BIT(KS_DT_F32) | KS_BIT(KS_DT_F16) | KS_BIT(KS_DT_BF16))
#define KS_INDEX (KS_BIT(KS_DT_I32) | KS_BIT(KS_DT_I64))
#define KS_FP8 (KS_BIT(KS_DT_F8E4M3))
/* KS_ERR_UNSUPPORTED_DTYPE "x: expected <list>, got <dtype>" */
ks_status_t ks_check_dtype(const ks_view *v, uint32_t mask);
ks_status_t ks_check_same_dtype(const ks_view *a, const ks_view *b);    /* b must have a's dtype */
ks_status_t ks_check_ndim(const ks_view *v, int32_t lo, int32_t hi);    /* INVALID_ARGUMENT */
ks_status_t ks_check_dim(const ks_view *v, int32_t d, int64_t size, const char *what); /* shape[d] == size */
ks_status_t ks_check_same_shape(const ks_view *a, const ks_view *b);
/* strides the op cannot honour -> KS_ERR_UNSUPPORTED_LAYOUT naming the argument */
ks_status_t ks_check_contiguous(const ks_view *v);          /* compact row-major (size-1 dims free) */
ks_status_t ks_check_inner_contiguous(const ks_view *v);    /* last dim stride 1 */
/* [.., H] viewed as rows x H with one row stride (leading dims collapsible); else LAYOUT error */
ks_status_t ks_view_rows(const ks_view *v, int64_t *rows, int64_t *row_stride);
const char *ks_dtype_name(int dt);  /* "float32", "bfloat16", "float8_e4m3fn", "int64" ... */
int ks_is_cpu(const ks_call *c);

/* ---- element access for the CPU path (fp32 compute, round-to-nearest-even on store) */
static inline float ks_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline uint16_t ks_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
float ks_f16_to_f32(uint16_t h);
uint16_t ks_f32_to_f16(float f);
float ks_f8e4m3_to_f32(uint8_t b);
uint8_t ks_f32_to_f8e4m3(float f);   /* saturating to +-448, NaN stays NaN */

static inline float ks_load(const void *base, int dt, int64_t i) {
  switch (dt) {
    case KS_DT_F32: return ((const float *)base)[i];
    case KS_DT_BF16: return ks_bf16_to_f32(((const uint16_t *)base)[i]);
    case KS_DT_F16: return ks_f16_to_f32(((const uint16_t *)base)[i]);
    case KS_DT_F8E4M3: return ks_f8e4m3_to_f32(((const uint8_t *)base)[i]);
    default: return NAN;
  }
}
static inline void ks_store(void *base, int dt, int64_t i, float v) {
  switch (dt) {
    case KS_DT_F32: ((float *)base)[i] = v; break;
    case KS_DT_BF16: ((uint16_t *)base)[i] = ks_f32_to_bf16(v); break;
    case KS_DT_F16: ((uint16_t *)base)[i] = ks_f32_to_f16(v); break;
    case KS_DT_F8E4M3: ((uint8_t *)base)[i] = ks_f32_to_f8e4m3(v); break;
    default: break;
  }
}
static inline int64_t ks_load_index(const void *base, int dt, int64_t i) {
  return dt == KS_DT_I64 ? ((const int64_t *)base)[i] : (int64_t)((const int32_t *)base)[i];
}
/* element offset of a multi-index */
static inline int64_t ks_offset(const ks_view *v, const int64_t *idx) {
  int64_t o = 0;
  for (int32_t d = 0; d < v->ndim; d++) o += idx[d] * v->strides[d];
  return o;
}

/* ---- options (options.c) */
/* Copies min(user->size, ours) bytes over *defaults (already filled by ks_options_init for op). */
ks_status_t ks_read_options(ks_op_t op, const void *user, void *out, size_t ours, const char *name);

/* ---- CUDA dispatch helpers (core.c) */
/* "<op>: no CUDA kernel for this op in this build" -> KS_ERR_NOT_IMPLEMENTED */
ks_status_t ks_not_on_cuda(const ks_call *c, const char *op);
/* wraps a ks_cuda_* call: its (err, errlen) message becomes the thread's message */
#define KS_CUDA_ERR ks_error_buffer(), KS_ERRLEN

/* ---- per op (generated by capi/abi/generate.py from the ABI's declaration, capi/abi/ksabi/ops.py) */
/* ks_query_<op>, one per op (defined in the op files; ks_query_support dispatches through ks_query_op).
 * copy_blocks: t = k_caches..., v_caches..., block_mapping; n = 2 * layers + 1. */
#include "ops_table.h"
typedef struct {
  uint16_t offset, size;
} ks_option_field;
typedef struct {
  const char *op;                 /* "rms_norm"; NULL: no such op */
  const char *type;               /* "ks_rms_norm_options"; NULL for ops without options */
  size_t size;                    /* sizeof the struct */
  const ks_option_field *fields;  /* size first, in order */
  int num_fields;
  void (*defaults)(void *);       /* writes the op's defaults (a full struct, size set) */
} ks_op_info;
ks_op_info ks_op_info_of(ks_op_t op);  /* ops_table.c */
/* ks_query_<op> of op, or KS_ERR_INVALID_ARGUMENT "op: unknown op id" (ops_table.c) */
ks_status_t ks_query_op(ks_op_t op, const DLTensor *const *tensors, int32_t num_tensors, const void *options);
extern const ks_api_t ks_api_table_v1; /* ops_table.c: what ks_get_api hands out */
/* "<op>: expected <want> tensors, got <n>" */
ks_status_t ks_query_arity(int32_t n, int32_t want, const char *op);

/* ---- additions by the core (everything above is the original contract) */

/* v rounded to storage dtype dt and back (what a store then a load gives) */
static inline float ks_round_to(int dt, float v) {
  switch (dt) {
    case KS_DT_BF16: return ks_bf16_to_f32(ks_f32_to_bf16(v));
    case KS_DT_F16: return ks_f16_to_f32(ks_f32_to_f16(v));
    case KS_DT_F8E4M3: return ks_f8e4m3_to_f32(ks_f32_to_f8e4m3(v));
    default: return v;
  }
}

/* tensor.c */
int64_t ks_num_rows(const ks_view *v);                 /* product of all dims but the last (1 for 0/1-D) */
/* Element offsets for any strides (negative included): of row r of v viewed as [rows, shape[-1]]
 * (leading dims need not collapse), and of flat row-major index i. The CPU loops use these. */
int64_t ks_row_offset(const ks_view *v, int64_t r);
int64_t ks_flat_offset(const ks_view *v, int64_t i);
/* ks_view_rows, and refuses rows that overlap (row stride < row length): for outputs */
ks_status_t ks_view_rows_out(const ks_view *v, int64_t *rows, int64_t *row_stride);
/* refuses a tensor whose distinct indices can share memory (stride 0, overlapping dims): for
 * outputs the CPU path writes through arbitrary strides */
ks_status_t ks_check_no_overlap(const ks_view *v);
/* pointer for a CUDA plan/launch: NULL when absent; in a dry run without data, a dummy 16-byte
 * aligned non-NULL address (plans only look at alignment and NULL-ness, never dereference) */
void *ks_dev_ptr(const ks_call *c, const ks_view *v);
/* Whether two views may share a byte: 0 when their byte ranges ([data + lowest offset, data +
 * highest offset + elem_size)) are disjoint, or when they interleave without meeting (slices of one
 * buffer: for a period some dim steps by, each view stays in its own residue interval modulo it);
 * else 1. An absent or empty view, or one without data (a dry run), shares nothing. */
int ks_views_overlap(const ks_view *a, const ks_view *b);
/* true in-place aliasing: both touch memory, same data pointer, dtype and shape, and the same
 * strides on every dim of more than one element */
int ks_views_same(const ks_view *a, const ks_view *b);
/* the bytes v can touch, [*lo, *hi) as addresses (a range that would wrap around: all of them); 0
 * (and an empty range) when it touches no memory (absent, empty, or without data) */
int ks_view_byte_range(const ks_view *v, uint64_t *lo, uint64_t *hi);
/* KS_ERR_INVALID_ARGUMENT "<out>: overlaps <in> (<why>)" when ks_views_overlap(out, in) */
ks_status_t ks_check_disjoint(const ks_view *out, const ks_view *in, const char *why);
/* ks_check_disjoint for an output against an index input (ids, slot_mapping, block_table, ...):
 * the CPU paths check index data, then read it again while writing outputs */
ks_status_t ks_check_not_index(const ks_view *out, const ks_view *index);
/* An output against an input it may replace in place: KS_OK when out and in are one view
 * (ks_views_same: true in place, for ops whose CPU and CUDA paths read each element or row before
 * writing it), else ks_check_disjoint (a partial overlap, another view of in's memory, is refused) */
ks_status_t ks_check_same_or_disjoint(const ks_view *out, const ks_view *in, const char *why);
/* ks_check_disjoint for every output against every input (NULL entries and absent views are
 * skipped): for inputs no output may replace in place */
ks_status_t ks_check_disjoint_all(const ks_view *const *outs, int n_outs, const ks_view *const *ins, int n_ins,
                                  const char *why);

/* options.c. ks_read_options fills op's defaults into *out itself (no ks_options_init needed
 * first) and takes whole fields only: a size ending inside a field is refused. */
/* value checks, INVALID_ARGUMENT "<name>: expected ..., got <v>" */
ks_status_t ks_check_positive(float v, const char *name);     /* finite and > 0 */
ks_status_t ks_check_finite(float v, const char *name);
ks_status_t ks_check_range_i32(int32_t v, int32_t lo, int32_t hi, const char *name); /* lo <= v <= hi */

/* core.c: CUDA dispatch for ops with a generated launcher (capi/generated/ks_cuda_ops.h).
 * KS_CUDA_DISPATCH(c, norm_fwd, <the launcher's parameters after errlen>) returns from the op:
 * a real call runs ks_cuda_norm_fwd_launch on (c->device_id, c->stream); a dry run
 * (ks_query_support) runs ks_cuda_norm_fwd_query on c->device_id (plan for the device, compiled
 * variant, image for its arch; nothing launched). Pointers come from ks_dev_ptr, so a dry run
 * without data plans like the real call. The generated message becomes the thread's message. */
ks_status_t ks_cuda_result(ks_status_t s, const char *op); /* fills an empty message on failure */
#define KS_CUDA_DISPATCH(c, op, ...)                                                                          \
  do {                                                                                                      \
    if ((c)->dry_run) return ks_cuda_result(ks_cuda_##op##_query((c)->device_id, KS_CUDA_ERR, __VA_ARGS__), #op); \
    return ks_cuda_result(ks_cuda_##op##_launch((c)->device_id, (c)->stream, KS_CUDA_ERR, __VA_ARGS__), #op); \
  } while (0)

#endif /* KS_INTERNAL_H_ */
