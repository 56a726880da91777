/* mla.c: mla_decode, DeepSeek-V2/V3 multi-head latent attention decode (weight-absorbed) over a
 * paged latent cache.
 *
 * Semantics: kernelset.ops.mla (api.py, reference.py). Per sequence b and head h over the
 * sequence's cached tokens j (latent c_j = cache[j, :R], rotary key k_j = cache[j, R:]):
 * s_j = scale (q_nope . c_j + q_pe . k_j), out = sum_j softmax(s)_j c_j, lse = ln sum_j e^(s_j)
 * (float32). A sequence of length 0 gets out 0 and lse -inf.
 *
 * CPU path: one pass per sequence with the online softmax in fp32 for every head at once (each
 * cache row is read once, as the kernel does per head tile), fp32/fp16/bf16 storage, fp8 e4m3fn
 * caches dequantized as x * kv_scale. seq_lens and the block ids each sequence uses are checked
 * before any output is written (KS_ERR_INVALID_ARGUMENT naming the argument and the index).
 * Layouts: q_nope/q_pe/kv_cache/out any strides with a unit-stride last dim; lse, block_table and
 * seq_lens any strides. out and lse may share memory neither with each other nor with an input
 * (KS_ERR_INVALID_ARGUMENT naming both), except out = q_nope itself (in place).
 *
 * CUDA path: the Python package's Triton kernel compiled ahead of time (capi/generated), called
 * with kernelset.ops.mla.launch's policy; its split-KV partials live in the library's discard
 * buffer. Index data is not checked there (no host sync): the kernel gives a sequence with a bad
 * block id NaN and reads nothing outside the cache or the block table.
 */
#include <stdlib.h>

#include "attention.h"
#include "ks_cuda_ops.h"

typedef struct {
  ks_view qn, qp, kv, bt, lens, kvs, out, lse;
  int64_t B, H, R, P, nb, bs, max_keys;
  double scale;
} mla_problem;

static ks_status_t read_mla_options(const ks_mla_options *user, mla_problem *p) {
  ks_mla_options o;
  KS_TRY(ks_read_options(KS_OP_MLA_DECODE, user, &o, sizeof o, "options")); /* NULL: the defaults */
  if (!(o.scale > 0.0 && isfinite(o.scale)))
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "scale: expected a finite number > 0 (required: DeepSeek's softmax "
                   "scale), got %g", o.scale);
  if (o.kv_lora_rank < 1)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "kv_lora_rank: expected an int >= 1, got %d", (int)o.kv_lora_rank);
  if (o.rope_dim < 1)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "rope_dim: expected an int >= 1, got %d", (int)o.rope_dim);
  p->scale = o.scale;
  p->R = o.kv_lora_rank;
  p->P = o.rope_dim;
  return KS_OK;
}

/* every index the CPU path reads: seq_lens and the block ids each sequence uses */
static ks_status_t check_mla_data(const mla_problem *p) {
  for (int64_t b = 0; b < p->B; b++) {
    int64_t L;
    KS_TRY(ks_attn_check_sequence(&p->lens, &p->bt, b, p->bs, p->nb, p->max_keys, &L));
  }
  return KS_OK;
}

/* out and lse against the inputs: out may be q_nope itself (in place: the CPU reads a sequence's
 * query rows, every head, before writing its out rows; the kernel reads the heads it writes, or
 * writes split-KV partials that a later launch reduces); nothing else may meet. Checked after the
 * CUDA layout checks, before the dispatch and the dry-run return. */
static ks_status_t check_mla_inputs(const mla_problem *p) {
  const ks_view *outs[2] = {&p->out, &p->lse}, *ins[4] = {&p->qn, &p->qp, &p->kv, &p->kvs};
  return ks_attn_check_inputs(outs, 2, ins, 4);
}

/* kernelset.ops.mla.launch.mla_decode: out and lse contiguous (the kernel writes them row-major),
 * block_table rows and seq_lens unit-stride (the Python API copies them; the C ABI refuses). */
static ks_status_t mla_cuda(ks_call *c, const mla_problem *p) {
  KS_TRY(ks_check_contiguous(&p->out));
  if (p->lse.present) KS_TRY(ks_check_contiguous(&p->lse));
  KS_TRY(ks_attn_check_table_rows(&p->bt));
  KS_TRY(ks_attn_check_unit_stride(&p->lens));
  KS_TRY(check_mla_inputs(p));
  KS_CUDA_DISPATCH(c, mla_decode, p->qn.dtype, p->kv.dtype, ks_dev_ptr(c, &p->qn), ks_dev_ptr(c, &p->qp),
                   ks_dev_ptr(c, &p->kv), ks_dev_ptr(c, &p->bt), ks_dev_ptr(c, &p->lens), ks_dev_ptr(c, &p->kvs),
                   ks_dev_ptr(c, &p->out), ks_dev_ptr(c, &p->lse), p->B, p->H, p->R, p->P, p->nb, p->bs,
                   p->bt.shape[1], p->max_keys, p->qn.strides[0], p->qn.strides[1], p->qp.strides[0],
                   p->qp.strides[1], p->kv.strides[0], p->kv.strides[1], p->bt.strides[0], p->scale);
}

/* One sequence, every head: online softmax over its L cached tokens, fp32 throughout. */
static void mla_sequence(const mla_problem *p, int64_t b, int64_t L, float kv_scale, float *buf) {
  const int64_t H = p->H, R = p->R, P = p->P, W = R + P;
  float *q = buf, *row = q + H * W, *acc = row + W, *m = acc + H * R, *l = m + H;
  const float scale = (float)p->scale;
  for (int64_t h = 0; h < H; h++) {
    const int64_t on = b * p->qn.strides[0] + h * p->qn.strides[1], op = b * p->qp.strides[0] + h * p->qp.strides[1];
    for (int64_t d = 0; d < R; d++) q[h * W + d] = ks_load(p->qn.data, p->qn.dtype, on + d);
    for (int64_t d = 0; d < P; d++) q[h * W + R + d] = ks_load(p->qp.data, p->qp.dtype, op + d);
    for (int64_t d = 0; d < R; d++) acc[h * R + d] = 0.0f;
    m[h] = -INFINITY;
    l[h] = 0.0f;
  }
  for (int64_t j = 0; j < L; j++) {
    const int64_t blk = ks_load_index(p->bt.data, KS_DT_I32, b * p->bt.strides[0] + (j / p->bs) * p->bt.strides[1]);
    const int64_t ro = blk * p->kv.strides[0] + (j % p->bs) * p->kv.strides[1];
    for (int64_t d = 0; d < W; d++) row[d] = ks_load(p->kv.data, p->kv.dtype, ro + d) * kv_scale;
    for (int64_t h = 0; h < H; h++) {
      float dot = 0.0f;
      for (int64_t d = 0; d < W; d++) dot += q[h * W + d] * row[d];
      const float s = dot * scale;
      float *a = acc + h * R;
      if (isnan(s) || isnan(m[h])) { /* NaN inputs: the head's output is NaN, as in the reference */
        m[h] = NAN;
        continue;
      }
      if (s > m[h]) {
        const float corr = m[h] == -INFINITY ? 0.0f : expf(m[h] - s);
        l[h] *= corr;
        for (int64_t d = 0; d < R; d++) a[d] *= corr;
        m[h] = s;
      }
      if (m[h] == -INFINITY) continue; /* a -inf score weighs nothing */
      const float e = expf(s - m[h]);
      l[h] += e;
      for (int64_t d = 0; d < R; d++) a[d] += e * row[d];
    }
  }
  for (int64_t h = 0; h < H; h++) {
    const int64_t oo = b * p->out.strides[0] + h * p->out.strides[1];
    const int empty = l[h] == 0.0f && !isnan(m[h]);
    float lse = empty ? -INFINITY : m[h] + logf(l[h]);
    for (int64_t d = 0; d < R; d++) {
      const float v = isnan(m[h]) ? NAN : empty ? 0.0f : acc[h * R + d] / l[h];
      ks_store(p->out.data, p->out.dtype, oo + d, v);
    }
    if (isnan(m[h])) lse = NAN;
    if (p->lse.present) ((float *)p->lse.data)[b * p->lse.strides[0] + h * p->lse.strides[1]] = lse;
  }
}

static ks_status_t run_mla_decode(ks_call *c, const DLTensor *q_nope, const DLTensor *q_pe, const DLTensor *kv_cache,
                                  const DLTensor *block_table, const DLTensor *seq_lens, int64_t max_seq_len,
                                  const DLTensor *kv_scale, DLTensor *out, DLTensor *lse,
                                  const ks_mla_options *options) {
  char sb[160];
  mla_problem p;
  memset(&p, 0, sizeof p);
  KS_TRY(ks_view_make(c, &p.qn, "q_nope", q_nope, KS_REQUIRED));
  KS_TRY(ks_check_dtype(&p.qn, KS_FLOATS));
  if (p.qn.ndim != 3)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "q_nope: expected 3-D [B, H, kv_lora_rank], got shape %s",
                   ks_ops_shape_str(&p.qn, sb, sizeof sb));
  p.B = p.qn.shape[0];
  p.H = p.qn.shape[1];
  KS_TRY(ks_view_make(c, &p.qp, "q_pe", q_pe, KS_REQUIRED));
  KS_TRY(ks_check_same_dtype(&p.qn, &p.qp));
  KS_TRY(read_mla_options(options, &p));
  if (p.qn.shape[2] != p.R)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "q_nope: expected [B, H, kv_lora_rank=%lld], got shape %s",
                   (long long)p.R, ks_ops_shape_str(&p.qn, sb, sizeof sb));
  const int64_t qp_shape[3] = {p.B, p.H, p.P};
  KS_TRY(ks_attn_check_shape(&p.qp, 3, qp_shape, "[B, H, rope_dim] like q_nope"));
  KS_TRY(ks_check_inner_contiguous(&p.qn));
  KS_TRY(ks_check_inner_contiguous(&p.qp));
  KS_TRY(ks_view_make(c, &p.kv, "kv_cache", kv_cache, KS_REQUIRED));
  KS_TRY(ks_check_dtype(&p.kv, KS_CACHE_DTYPES));
  if (p.kv.ndim != 3 || p.kv.shape[1] == 0 || p.kv.shape[2] != p.R + p.P)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "kv_cache: expected [num_blocks, block_size >= 1, kv_lora_rank + rope_dim "
                   "= %lld], got shape %s", (long long)(p.R + p.P), ks_ops_shape_str(&p.kv, sb, sizeof sb));
  KS_TRY(ks_check_inner_contiguous(&p.kv));
  if (p.kv.dtype == KS_DT_F8E4M3) {
    if (p.qn.dtype != KS_DT_F16 && p.qn.dtype != KS_DT_BF16)
      return ks_fail(KS_ERR_UNSUPPORTED_DTYPE, "q_nope: expected float16 or bfloat16 with an fp8 cache, got %s",
                     ks_dtype_name(p.qn.dtype));
  } else if (p.kv.dtype != p.qn.dtype) {
    return ks_fail(KS_ERR_UNSUPPORTED_DTYPE, "kv_cache: expected q_nope's dtype %s (or float8_e4m3fn), got %s",
                   ks_dtype_name(p.qn.dtype), ks_dtype_name(p.kv.dtype));
  }
  p.nb = p.kv.shape[0];
  p.bs = p.kv.shape[1];
  KS_TRY(ks_view_make(c, &p.bt, "block_table", block_table, KS_REQUIRED));
  KS_TRY(ks_check_dtype(&p.bt, KS_BIT(KS_DT_I32)));
  if (p.bt.ndim != 2 || p.bt.shape[0] != p.B)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "block_table: expected [B=%lld, max_blocks], got shape %s", (long long)p.B,
                   ks_ops_shape_str(&p.bt, sb, sizeof sb));
  KS_TRY(ks_view_make(c, &p.lens, "seq_lens", seq_lens, KS_REQUIRED));
  KS_TRY(ks_check_dtype(&p.lens, KS_BIT(KS_DT_I32)));
  if (p.lens.ndim != 1 || p.lens.shape[0] != p.B)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "seq_lens: expected [B=%lld] like q_nope, got shape %s", (long long)p.B,
                   ks_ops_shape_str(&p.lens, sb, sizeof sb));
  if (max_seq_len < 0)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "max_seq_len: expected >= 0 (0: the block table's capacity), got %lld",
                   (long long)max_seq_len);
  const int64_t capacity = ks_attn_capacity(&p.bt, p.bs);
  p.max_keys = max_seq_len == 0 || max_seq_len > capacity ? capacity : max_seq_len;
  KS_TRY(ks_kv_check_scale(c, &p.kvs, "kv_scale", kv_scale, &p.kv, "kv_cache"));
  KS_TRY(ks_view_make(c, &p.out, "out", out, KS_REQUIRED));
  KS_TRY(ks_check_same_dtype(&p.qn, &p.out));
  const int64_t out_shape[3] = {p.B, p.H, p.R};
  KS_TRY(ks_attn_check_shape(&p.out, 3, out_shape, "like q_nope"));
  KS_TRY(ks_check_inner_contiguous(&p.out));
  KS_TRY(ks_check_no_overlap(&p.out));
  const int64_t lse_shape[2] = {p.B, p.H};
  KS_TRY(ks_attn_check_lse(c, &p.lse, lse, 2, lse_shape, "[B, H]"));
  {
    const ks_view *outs[2] = {&p.out, &p.lse}, *index[2] = {&p.bt, &p.lens};
    KS_TRY(ks_attn_check_outputs(outs, 2, index, 2));
  }
  if (c->device_type == kDLCUDA) return mla_cuda(c, &p);
  KS_TRY(check_mla_inputs(&p));
  if (c->dry_run) return KS_OK;
  KS_TRY(check_mla_data(&p));
  if (p.B == 0 || p.H == 0) return KS_OK;
  const size_t n = (size_t)p.H * (size_t)(p.R + p.P) + (size_t)(p.R + p.P) + (size_t)p.H * (size_t)p.R + 2u * (size_t)p.H;
  float *buf = malloc(n * sizeof(float));
  if (!buf) return ks_fail(KS_ERR_OUT_OF_MEMORY, "mla_decode: could not allocate %zu bytes of CPU scratch", n * 4);
  const float kv_scale_v = ks_kv_scale_value(&p.kvs);
  for (int64_t b = 0; b < p.B; b++)
    mla_sequence(&p, b, ks_load_index(p.lens.data, KS_DT_I32, b * p.lens.strides[0]), kv_scale_v, buf);
  free(buf);
  return KS_OK;
}

KS_API ks_status_t ks_mla_decode(const DLTensor *q_nope, const DLTensor *q_pe, const DLTensor *kv_cache,
                                 const DLTensor *block_table, const DLTensor *seq_lens, int64_t max_seq_len,
                                 const DLTensor *kv_scale, DLTensor *out, DLTensor *lse,
                                 const ks_mla_options *options, ks_stream_t stream) {
  ks_call c;
  ks_call_begin(&c, stream, 0);
  return run_mla_decode(&c, q_nope, q_pe, kv_cache, block_table, seq_lens, max_seq_len, kv_scale, out, lse, options);
}

/* t: q_nope, q_pe, kv_cache, block_table, seq_lens, kv_scale, out, lse. max_seq_len is not in the
 * query: it is taken as 0 (the block table's capacity). */
ks_status_t ks_query_mla_decode(const DLTensor *const *t, int32_t n, const void *o) {
  ks_call c;
  ks_call_begin(&c, NULL, 1);
  KS_TRY(ks_query_arity(n, 8, "mla_decode"));
  return run_mla_decode(&c, t[0], t[1], t[2], t[3], t[4], 0, t[5], (DLTensor *)t[6], (DLTensor *)t[7], o);
}
