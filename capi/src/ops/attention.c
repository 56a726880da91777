/* attention.c: paged_attention (+ its workspace size) and merge_attn_states, and what flash.c
 * (flash_attention, flash_attention_varlen) shares with them through attention.h: the options,
 * small checks and the CPU row kernel.
 *
 * Semantics: kernelset.ops.attention (api.py, reference.py), FlashAttention's conventions. A query
 * row at absolute position p of a sequence with keys 0..L-1 sees key j iff j <= p + right and
 * j >= p - left (window (left, right), -1 unbounded; causal forces right = 0);
 * s_j = scale * q.k_j (scale 0 = 1/sqrt(D)), softcap > 0: s_j = softcap * tanh(s_j / softcap);
 * Z = sum_j e^(s_j) (+ e^(sink_h)); out = sum_j e^(s_j) v_j / Z, lse = ln Z (float32). A row with
 * no visible key gets out 0 and lse -inf (the sink's logit with sinks). Queries sit at the end of
 * the keys: query i of n new tokens of a sequence of L keys is at p = L - n + i (bottom-right
 * aligned causal; decode: p = L - 1). GQA: query head h reads KV head h / (Hq / Hkv).
 * LSE layouts: paged [T, Hq], dense [B, Hq, S], varlen [Hq, T].
 *
 * CPU path: one pass per query row with the online softmax in fp32 (running max, rescaled sum and
 * accumulator), fp32/fp16/bf16 storage, fp8 e4m3fn caches dequantized as x * scale. Every index
 * read from a tensor (seq_lens, the block ids a sequence uses, cu_seqlens) is checked before any
 * output is written: KS_ERR_INVALID_ARGUMENT names the argument and the offending index.
 * Layouts: q/k/v/out/caches any strides with a unit-stride last dim; lse, block_table, seq_lens,
 * cu_seqlens and sinks any strides. The outputs (out, lse, workspace) may share memory neither with
 * each other nor with the inputs (KS_ERR_INVALID_ARGUMENT naming both), on CPU and CUDA, except true
 * in place (same data, dtype, shape and strides): out = q (paged, flash, varlen; mla_decode's out =
 * q_nope), and merge_attn_states' out = out_a or out_b, lse = lse_a or lse_b.
 *
 * CUDA path: the Python package's Triton kernels compiled ahead of time (capi/generated), called
 * with the launch policy of kernelset.ops.attention.launch; the layouts they address are checked
 * before the dry-run return, so ks_query_support answers what the call does. Index data is not
 * checked there (no host sync): see paged_cuda and flash_cuda.
 */
#include <stdio.h>
#include <stdlib.h>

#include "attention.h"
#include "ks_cuda_ops.h"

/* ---- options */

ks_status_t ks_attn_read_options(ks_op_t op, const ks_attention_options *user, int64_t head_dim, attn_opts *a) {
  ks_attention_options o;
  KS_TRY(ks_read_options(op, user, &o, sizeof o, "options")); /* NULL: the defaults */
  if (o.scale != 0.0f && !(o.scale > 0.0f && isfinite(o.scale)))
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "scale: expected a finite number > 0 (0: 1/sqrt(D)), got %g",
                   (double)o.scale);
  if (o.causal != 0 && o.causal != 1)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "causal: expected 0 or 1, got %d", (int)o.causal);
  if (o.window_left < -1)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "window_left: expected >= -1 (-1: unbounded), got %d", (int)o.window_left);
  if (o.window_right < -1)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "window_right: expected >= -1 (-1: unbounded), got %d",
                   (int)o.window_right);
  if (!(o.softcap >= 0.0f && isfinite(o.softcap)))
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "softcap: expected a finite number >= 0 (0: off), got %g",
                   (double)o.softcap);
  a->scale = o.scale != 0.0f ? (double)o.scale : 1.0 / sqrt((double)(head_dim > 0 ? head_dim : 1));
  a->softcap = o.softcap;
  a->causal = o.causal;
  a->left = o.window_left;
  a->right = o.causal ? 0 : o.window_right;
  return KS_OK;
}

/* ---- small checks */

int64_t ks_attn_capacity(const ks_view *bt, int64_t bs) {
  const int64_t blocks = bt->shape[1];
  if (blocks == 0 || bs == 0) return 0;
  return blocks > INT64_MAX / bs ? INT64_MAX : blocks * bs;
}

ks_status_t ks_attn_check_outputs(const ks_view *const *outs, int n_outs, const ks_view *const *index, int n_index) {
  for (int i = 0; i < n_outs; i++) {
    for (int j = 0; j < n_index; j++) KS_TRY(ks_check_not_index(outs[i], index[j]));
    for (int j = i + 1; j < n_outs; j++)
      KS_TRY(ks_check_disjoint(outs[j], outs[i], "the outputs of a call may not share memory"));
  }
  return KS_OK;
}

ks_status_t ks_attn_check_inputs(const ks_view *const *outs, int n_outs, const ks_view *const *ins, int n_ins) {
  char why[96];
  snprintf(why, sizeof why, "%s may be %s itself, in place, but not another view of its memory", outs[0]->name,
           ins[0]->name);
  KS_TRY(ks_check_same_or_disjoint(outs[0], ins[0], why));
  KS_TRY(ks_check_disjoint_all(outs, 1, ins + 1, n_ins - 1, "an output may not share memory with an input"));
  return ks_check_disjoint_all(outs + 1, n_outs - 1, ins, n_ins, "an output may not share memory with an input");
}

/* v has exactly the given shape ("what" says why) */
ks_status_t ks_attn_check_shape(const ks_view *v, int32_t ndim, const int64_t *shape, const char *what) {
  char sb[160], want[160];
  int ok = v->ndim == ndim;
  for (int32_t d = 0; ok && d < ndim; d++) ok = v->shape[d] == shape[d];
  if (ok) return KS_OK;
  ks_view tmp;
  memset(&tmp, 0, sizeof tmp);
  tmp.ndim = ndim;
  for (int32_t d = 0; d < ndim; d++) tmp.shape[d] = shape[d];
  return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected shape %s (%s), got shape %s", v->name,
                 ks_ops_shape_str(&tmp, want, sizeof want), what, ks_ops_shape_str(v, sb, sizeof sb));
}

ks_status_t ks_attn_check_sinks(ks_call *c, ks_view *s, const DLTensor *t, int64_t hq) {
  KS_TRY(ks_view_make(c, s, "sinks", t, KS_OPTIONAL));
  if (!s->present) return KS_OK;
  KS_TRY(ks_check_dtype(s, KS_BIT(KS_DT_F32)));
  const int64_t shape[1] = {hq};
  return ks_attn_check_shape(s, 1, shape, "one logit per query head");
}

ks_status_t ks_attn_check_lse(ks_call *c, ks_view *l, const DLTensor *t, int32_t ndim, const int64_t *shape,
                              const char *what) {
  KS_TRY(ks_view_make(c, l, "lse", t, KS_OPTIONAL));
  if (!l->present) return KS_OK;
  KS_TRY(ks_check_dtype(l, KS_BIT(KS_DT_F32)));
  KS_TRY(ks_attn_check_shape(l, ndim, shape, what));
  return ks_check_no_overlap(l);
}

/* ---- the CPU row kernel */

static int64_t kv_offset(const kv_src *s, const ks_view *x, int64_t base, int64_t tok, int64_t head, int64_t j,
                         int64_t hk) {
  if (!s->paged) return base + j * tok + hk * head;
  const int64_t blk =
      ks_load_index(s->bt->data, s->bt->dtype, s->bt_row * s->bt->strides[0] + (j / s->bs) * s->bt->strides[1]);
  return blk * x->strides[0] + (j % s->bs) * x->strides[1] + hk * x->strides[2];
}

/* out[0..Dv) = softmax-weighted values of keys [lo, hi) for query row q[0..D) (fp32), online
 * softmax; returns lse. */
static float attend_row(const kv_src *s, const row_params *rp, int64_t hk, const float *q, int64_t lo, int64_t hi,
                        float *out) {
  float m = -INFINITY, l = 0.0f;
  int nan = 0;
  for (int64_t d = 0; d < rp->Dv; d++) out[d] = 0.0f;
  for (int64_t j = lo; j < hi; j++) {
    const int64_t ko = kv_offset(s, s->k, s->k_base, s->k_tok, s->k_head, j, hk);
    float dot = 0.0f;
    for (int64_t d = 0; d < rp->D; d++) dot += q[d] * (ks_load(s->k->data, s->k->dtype, ko + d) * s->k_scale);
    float sc = dot * rp->scale;
    if (rp->softcap > 0.0f) sc = rp->softcap * tanhf(sc / rp->softcap);
    if (isnan(sc)) { /* NaN inputs: the row is NaN, as in the reference */
      nan = 1;
      continue;
    }
    if (sc > m) {
      const float corr = m == -INFINITY ? 0.0f : expf(m - sc);
      l *= corr;
      for (int64_t d = 0; d < rp->Dv; d++) out[d] *= corr;
      m = sc;
    }
    if (m == -INFINITY) continue; /* a -inf score (infinite inputs) weighs nothing */
    const float p = expf(sc - m);
    l += p;
    const int64_t vo = kv_offset(s, s->v, s->v_base, s->v_tok, s->v_head, j, hk);
    for (int64_t d = 0; d < rp->Dv; d++) out[d] += p * (ks_load(s->v->data, s->v->dtype, vo + d) * s->v_scale);
  }
  if (nan || (rp->has_sink && isnan(rp->sink))) {
    for (int64_t d = 0; d < rp->Dv; d++) out[d] = NAN;
    return NAN;
  }
  float mx = m;
  if (rp->has_sink && rp->sink > mx) mx = rp->sink;
  if (mx == -INFINITY) { /* no visible key and no (finite) sink */
    for (int64_t d = 0; d < rp->Dv; d++) out[d] = 0.0f;
    return -INFINITY;
  }
  const float f = m == -INFINITY ? 0.0f : expf(m - mx);
  l = l * f + (rp->has_sink ? expf(rp->sink - mx) : 0.0f);
  const float w = f / l;
  for (int64_t d = 0; d < rp->Dv; d++) out[d] *= w;
  return mx + logf(l);
}

/* visible keys [lo, hi) of a row at position p among L keys */
static void visible(const attn_opts *a, int64_t p, int64_t L, int64_t *lo, int64_t *hi) {
  int64_t l0 = 0, h1 = L;
  if (a->right >= 0 && p + a->right + 1 < h1) h1 = p + a->right + 1;
  if (a->left >= 0 && p - a->left > l0) l0 = p - a->left;
  if (h1 < l0) h1 = l0;
  *lo = l0;
  *hi = h1;
}

void ks_attn_rows(const rows_io *io, const kv_src *s, const attn_opts *a, row_params rp, int64_t t0, int64_t n,
                  int64_t L) {
  for (int64_t i = 0; i < n; i++) {
    const int64_t t = t0 + i, p = L - n + i;
    int64_t lo, hi;
    visible(a, p, L, &lo, &hi);
    for (int64_t h = 0; h < io->hq; h++) {
      const int64_t qo = t * io->q->strides[0] + h * io->q->strides[1];
      for (int64_t d = 0; d < rp.D; d++) io->qbuf[d] = ks_load(io->q->data, io->q->dtype, qo + d);
      rp.has_sink = io->sinks->present;
      rp.sink = rp.has_sink ? ks_load(io->sinks->data, KS_DT_F32, h * io->sinks->strides[0]) : 0.0f;
      const float lse = attend_row(s, &rp, h / io->g, io->qbuf, lo, hi, io->obuf);
      const int64_t oo = t * io->out->strides[0] + h * io->out->strides[1];
      for (int64_t d = 0; d < rp.Dv; d++) ks_store(io->out->data, io->out->dtype, oo + d, io->obuf[d]);
      if (io->lse->present)
        ((float *)io->lse->data)[io->lse_base + t * io->lse_t + h * io->lse_h] = lse;
    }
  }
}

ks_status_t ks_attn_alloc_rows(rows_io *io, int64_t D, int64_t Dv, const char *op) {
  const size_t n = (size_t)D + (size_t)Dv;
  io->qbuf = malloc(n * sizeof(float));
  if (!io->qbuf) return ks_fail(KS_ERR_OUT_OF_MEMORY, "%s: could not allocate %zu bytes of CPU scratch", op, n * 4);
  io->obuf = io->qbuf + D;
  return KS_OK;
}

/* ---- paged_attention */

/* Split-KV scratch of the CUDA path: ks_cuda_paged_attention_workspace_bytes (generated from
 * kernelset.ops.attention.launch.PagedTuning), fp32 partial outputs [T, Hq, S, D] then partial
 * log-sum-exps [T, Hq, S], S the largest split count the Python policy takes for max_seq_len keys
 * on any GPU (max_seq_len 0: the most it ever takes). */
static ks_status_t workspace_bytes(int64_t T, int64_t hq, int64_t D, int64_t max_seq_len, size_t *bytes) {
  const double rows = (double)T * (double)hq * 64.0;
  if (rows * (double)(D + 1) * 4.0 + 256.0 > 9.0e18)
    return ks_fail(KS_ERR_UNSUPPORTED_SHAPE, "q: a split-KV workspace for [%lld, %lld, %lld] overflows",
                   (long long)T, (long long)hq, (long long)D);
  *bytes = (size_t)ks_cuda_paged_attention_workspace_bytes(T, hq, D, max_seq_len);
  return KS_OK;
}

KS_API ks_status_t ks_paged_attention_workspace_size(const DLTensor *q, const DLTensor *k_cache, int64_t max_seq_len,
                                                     size_t *bytes) {
  ks_call c;
  char sb[160];
  ks_call_begin(&c, NULL, 1); /* metadata only */
  if (bytes == NULL) return ks_fail(KS_ERR_INVALID_ARGUMENT, "bytes: expected a pointer, got NULL");
  *bytes = 0;
  ks_view vq, vk;
  KS_TRY(ks_view_make(&c, &vq, "q", q, KS_REQUIRED));
  KS_TRY(ks_check_dtype(&vq, KS_FLOATS));
  if (vq.ndim != 3)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "q: expected 3-D [B, Hq, D] or [T, Hq, D], got shape %s",
                   ks_ops_shape_str(&vq, sb, sizeof sb));
  KS_TRY(ks_kv_check_cache(&c, &vk, "k_cache", k_cache));
  if (vq.shape[2] != vk.shape[3])
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "q: expected head size D=%lld (the cache's), got shape %s",
                   (long long)vk.shape[3], ks_ops_shape_str(&vq, sb, sizeof sb));
  if (max_seq_len < 0)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "max_seq_len: expected >= 0 (0: the block table's capacity), got %lld",
                   (long long)max_seq_len);
  return workspace_bytes(vq.shape[0], vq.shape[1], vq.shape[2], max_seq_len, bytes);
}

typedef struct {
  ks_view q, kc, vc, bt, lens, cu, sinks, ks, vs, out, lse, ws;
  int64_t T, hq, D, nb, bs, hkv, B, max_seqlen_q, max_keys;
  attn_opts a;
} paged_problem;

/* seq_lens[b] and the block ids of its keys, as the CPU paths read them */
ks_status_t ks_attn_check_sequence(const ks_view *lens, const ks_view *bt, int64_t b, int64_t bs, int64_t nb,
                                   int64_t max_keys, int64_t *len) {
  const int64_t L = ks_load_index(lens->data, KS_DT_I32, b * lens->strides[0]);
  if (L < 0 || L > max_keys)
    return ks_fail(KS_ERR_INVALID_ARGUMENT,
                   "seq_lens: expected lengths in [0, %lld] (max_seq_len and the block table's %lld blocks of "
                   "%lld), got %lld at index %lld",
                   (long long)max_keys, (long long)bt->shape[1], (long long)bs, (long long)L, (long long)b);
  const int64_t nblk = L == 0 ? 0 : (L - 1) / bs + 1; /* (L + bs - 1) / bs overflows for a huge bs */
  for (int64_t j = 0; j < nblk; j++) {
    const int64_t id = ks_load_index(bt->data, KS_DT_I32, b * bt->strides[0] + j * bt->strides[1]);
    if (id < 0 || id >= nb)
      return ks_fail(KS_ERR_INVALID_ARGUMENT,
                     "block_table: expected block ids in [0, %lld) for every block a sequence uses, got %lld at "
                     "[%lld, %lld]",
                     (long long)nb, (long long)id, (long long)b, (long long)j);
  }
  *len = L;
  return KS_OK;
}

/* every index the CPU path reads: seq_lens, the block ids each sequence uses, cu_seqlens_q */
static ks_status_t check_paged_data(const paged_problem *p) {
  int64_t prev = 0;
  for (int64_t b = 0; b < p->B; b++) {
    int64_t L;
    KS_TRY(ks_attn_check_sequence(&p->lens, &p->bt, b, p->bs, p->nb, p->max_keys, &L));
    if (p->cu.present) {
      const int64_t c0 = ks_load_index(p->cu.data, KS_DT_I32, b * p->cu.strides[0]);
      const int64_t c1 = ks_load_index(p->cu.data, KS_DT_I32, (b + 1) * p->cu.strides[0]);
      if (b == 0 && c0 != 0)
        return ks_fail(KS_ERR_INVALID_ARGUMENT, "cu_seqlens_q: expected offsets from 0, got %lld at index 0",
                       (long long)c0);
      if (c1 < c0 || c1 > p->T)
        return ks_fail(KS_ERR_INVALID_ARGUMENT,
                       "cu_seqlens_q: expected non-decreasing offsets from 0 to T=%lld, got %lld after %lld at index "
                       "%lld",
                       (long long)p->T, (long long)c1, (long long)c0, (long long)(b + 1));
      if (c1 - c0 > p->max_seqlen_q)
        return ks_fail(KS_ERR_INVALID_ARGUMENT,
                       "max_seqlen_q: expected >= the most query tokens of a sequence (%lld at sequence %lld), got "
                       "%lld",
                       (long long)(c1 - c0), (long long)b, (long long)p->max_seqlen_q);
      if (c1 - c0 > L)
        return ks_fail(KS_ERR_INVALID_ARGUMENT,
                       "seq_lens: expected at least each sequence's query tokens (they are cached before attention "
                       "runs), got %lld < %lld at index %lld",
                       (long long)L, (long long)(c1 - c0), (long long)b);
      prev = c1;
    }
  }
  if (p->cu.present && prev != p->T)
    return ks_fail(KS_ERR_INVALID_ARGUMENT,
                   "cu_seqlens_q: expected the last offset to be T=%lld, got %lld at index %lld",
                   (long long)p->T, (long long)prev, (long long)p->B);
  return KS_OK;
}

ks_status_t ks_attn_check_unit_stride(const ks_view *v) {
  if (v->present && v->ndim == 1 && v->shape[0] > 1 && v->strides[0] != 1)
    return ks_fail(KS_ERR_UNSUPPORTED_LAYOUT, "%s: expected contiguous on CUDA, got stride %lld", v->name,
                   (long long)v->strides[0]);
  return KS_OK;
}

ks_status_t ks_attn_check_table_rows(const ks_view *bt) {
  if (bt->shape[1] > 1 && bt->strides[1] != 1)
    return ks_fail(KS_ERR_UNSUPPORTED_LAYOUT, "block_table: expected unit-stride rows on CUDA, got stride %lld",
                   (long long)bt->strides[1]);
  return KS_OK;
}

/* the outputs (out, lse, workspace) against the inputs: out may be q itself (in place), nothing
 * else may meet. Checked after the CUDA layout checks, before the dispatch and the dry-run return. */
static ks_status_t check_paged_inputs(const paged_problem *p) {
  const ks_view *outs[3] = {&p->out, &p->lse, &p->ws}, *ins[6] = {&p->q, &p->kc, &p->vc, &p->sinks, &p->ks, &p->vs};
  return ks_attn_check_inputs(outs, 3, ins, 6);
}

/* kernelset.ops.attention.launch.paged_attention: split-KV when a workspace is given (its size
 * is checked against the split count the policy picks for this GPU), one pass otherwise. The
 * data (seq_lens, block ids, cu_seqlens_q) is not checked on CUDA (no host sync): the kernel
 * turns a sequence with a bad block id into NaN and reads nothing outside the cache. */
static ks_status_t paged_cuda(ks_call *c, const paged_problem *p) {
  KS_TRY(ks_check_contiguous(&p->out));
  if (p->lse.present) KS_TRY(ks_check_contiguous(&p->lse));
  KS_TRY(ks_attn_check_table_rows(&p->bt));
  KS_TRY(ks_attn_check_unit_stride(&p->lens));
  KS_TRY(ks_attn_check_unit_stride(&p->cu));
  KS_TRY(ks_attn_check_unit_stride(&p->sinks));
  KS_TRY(check_paged_inputs(p));
  const int64_t ws_bytes = p->ws.present ? p->ws.numel : 0;
  KS_CUDA_DISPATCH(c, paged_attention, p->q.dtype, p->kc.dtype, ks_dev_ptr(c, &p->q), ks_dev_ptr(c, &p->kc),
                   ks_dev_ptr(c, &p->vc), ks_dev_ptr(c, &p->bt), ks_dev_ptr(c, &p->lens), ks_dev_ptr(c, &p->cu),
                   ks_dev_ptr(c, &p->sinks), ks_dev_ptr(c, &p->ks), ks_dev_ptr(c, &p->vs), ks_dev_ptr(c, &p->out),
                   ks_dev_ptr(c, &p->lse), ks_dev_ptr(c, &p->ws), ws_bytes, p->T, p->B, p->hq, p->hkv, p->D, p->nb,
                   p->bs, p->bt.shape[1], p->max_seqlen_q, p->max_keys, p->q.strides[0], p->q.strides[1],
                   p->kc.strides[0], p->kc.strides[1], p->kc.strides[2], p->vc.strides[0], p->vc.strides[1],
                   p->vc.strides[2], p->bt.strides[0], p->a.scale, p->a.softcap, p->a.left, p->a.right, p->a.causal);
}

static ks_status_t run_paged_attention(ks_call *c, const DLTensor *q, const DLTensor *k_cache, const DLTensor *v_cache,
                                       const DLTensor *block_table, const DLTensor *seq_lens,
                                       const DLTensor *cu_seqlens_q, int64_t max_seqlen_q, int64_t max_seq_len,
                                       const DLTensor *sinks, const DLTensor *k_scale, const DLTensor *v_scale,
                                       DLTensor *out, DLTensor *lse, DLTensor *workspace,
                                       const ks_attention_options *options) {
  char sb[160];
  paged_problem p;
  memset(&p, 0, sizeof p);
  KS_TRY(ks_view_make(c, &p.q, "q", q, KS_REQUIRED));
  KS_TRY(ks_check_dtype(&p.q, KS_FLOATS));
  if (p.q.ndim != 3)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "q: expected 3-D [B, Hq, D] (decode) or [T, Hq, D] (with cu_seqlens_q), "
                   "got shape %s", ks_ops_shape_str(&p.q, sb, sizeof sb));
  KS_TRY(ks_check_inner_contiguous(&p.q));
  KS_TRY(ks_kv_check_cache(c, &p.kc, "k_cache", k_cache));
  KS_TRY(ks_kv_check_cache(c, &p.vc, "v_cache", v_cache));
  KS_TRY(ks_check_same_shape(&p.kc, &p.vc));
  KS_TRY(ks_check_same_dtype(&p.kc, &p.vc));
  p.nb = p.kc.shape[0];
  p.bs = p.kc.shape[1];
  p.hkv = p.kc.shape[2];
  p.D = p.kc.shape[3];
  p.T = p.q.shape[0];
  p.hq = p.q.shape[1];
  if (p.q.shape[2] != p.D)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "q: expected head size D=%lld (the cache's), got shape %s",
                   (long long)p.D, ks_ops_shape_str(&p.q, sb, sizeof sb));
  if (p.hkv == 0 || p.hq % p.hkv)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "q: expected a multiple of the cache's %lld KV heads in query heads, got "
                   "%lld heads", (long long)p.hkv, (long long)p.hq);
  if (p.kc.dtype == KS_DT_F8E4M3) {
    if (p.q.dtype != KS_DT_F16 && p.q.dtype != KS_DT_BF16)
      return ks_fail(KS_ERR_UNSUPPORTED_DTYPE, "q: expected float16 or bfloat16 with an fp8 cache, got %s",
                     ks_dtype_name(p.q.dtype));
  } else if (p.kc.dtype != p.q.dtype) {
    return ks_fail(KS_ERR_UNSUPPORTED_DTYPE, "k_cache: expected q's dtype %s (or float8_e4m3fn), got %s",
                   ks_dtype_name(p.q.dtype), ks_dtype_name(p.kc.dtype));
  }
  KS_TRY(ks_view_make(c, &p.bt, "block_table", block_table, KS_REQUIRED));
  KS_TRY(ks_check_dtype(&p.bt, KS_BIT(KS_DT_I32)));
  KS_TRY(ks_view_make(c, &p.lens, "seq_lens", seq_lens, KS_REQUIRED));
  KS_TRY(ks_check_dtype(&p.lens, KS_BIT(KS_DT_I32)));
  if (p.lens.ndim != 1)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "seq_lens: expected 1-D [B], got shape %s",
                   ks_ops_shape_str(&p.lens, sb, sizeof sb));
  p.B = p.lens.shape[0];
  if (p.bt.ndim != 2 || p.bt.shape[0] != p.B)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "block_table: expected [B, max_blocks] with B = len(seq_lens) (%lld), got "
                   "shape %s", (long long)p.B, ks_ops_shape_str(&p.bt, sb, sizeof sb));
  KS_TRY(ks_view_make(c, &p.cu, "cu_seqlens_q", cu_seqlens_q, KS_OPTIONAL));
  if (!p.cu.present) {
    if (p.T != p.B)
      return ks_fail(KS_ERR_INVALID_ARGUMENT, "q: expected one token per sequence [B=%lld, Hq, D] without "
                     "cu_seqlens_q, got shape %s", (long long)p.B, ks_ops_shape_str(&p.q, sb, sizeof sb));
    p.max_seqlen_q = 1;
  } else {
    KS_TRY(ks_check_dtype(&p.cu, KS_BIT(KS_DT_I32)));
    const int64_t shape[1] = {p.B + 1};
    KS_TRY(ks_attn_check_shape(&p.cu, 1, shape, "B + 1 offsets"));
    if (max_seqlen_q < 1)
      return ks_fail(KS_ERR_INVALID_ARGUMENT, "max_seqlen_q: expected >= 1 with cu_seqlens_q, got %lld",
                     (long long)max_seqlen_q);
    p.max_seqlen_q = max_seqlen_q;
  }
  if (max_seq_len < 0)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "max_seq_len: expected >= 0 (0: the block table's capacity), got %lld",
                   (long long)max_seq_len);
  const int64_t capacity = ks_attn_capacity(&p.bt, p.bs);
  p.max_keys = max_seq_len == 0 || max_seq_len > capacity ? capacity : max_seq_len;
  KS_TRY(ks_attn_read_options(KS_OP_PAGED_ATTENTION, options, p.D, &p.a));
  KS_TRY(ks_attn_check_sinks(c, &p.sinks, sinks, p.hq));
  KS_TRY(ks_kv_check_scale(c, &p.ks, "k_scale", k_scale, &p.kc, "k_cache"));
  KS_TRY(ks_kv_check_scale(c, &p.vs, "v_scale", v_scale, &p.vc, "v_cache"));
  KS_TRY(ks_view_make(c, &p.out, "out", out, KS_REQUIRED));
  KS_TRY(ks_check_same_dtype(&p.q, &p.out));
  KS_TRY(ks_attn_check_shape(&p.out, 3, p.q.shape, "like q"));
  KS_TRY(ks_check_inner_contiguous(&p.out));
  KS_TRY(ks_check_no_overlap(&p.out));
  const int64_t lse_shape[2] = {p.T, p.hq};
  KS_TRY(ks_attn_check_lse(c, &p.lse, lse, 2, lse_shape, "[T, Hq]"));
  KS_TRY(ks_view_make(c, &p.ws, "workspace", workspace, KS_OPTIONAL));
  if (p.ws.present) {
    KS_TRY(ks_check_dtype(&p.ws, KS_BIT(KS_DT_U8)));
    KS_TRY(ks_check_contiguous(&p.ws));
  }
  {
    const ks_view *outs[3] = {&p.out, &p.lse, &p.ws}, *index[3] = {&p.bt, &p.lens, &p.cu};
    KS_TRY(ks_attn_check_outputs(outs, 3, index, 3));
  }
  if (c->device_type == kDLCUDA) return paged_cuda(c, &p);
  KS_TRY(check_paged_inputs(&p));
  if (c->dry_run) return KS_OK; /* on the CPU the workspace is not used */
  KS_TRY(check_paged_data(&p));
  if (p.T == 0 || p.hq == 0) return KS_OK;
  rows_io io = {&p.q, &p.out, &p.lse, &p.sinks, p.hq, p.hq / p.hkv, 0, p.lse.strides[0], p.lse.strides[1], NULL, NULL};
  KS_TRY(ks_attn_alloc_rows(&io, p.D, p.D, "paged_attention"));
  const row_params rp = {p.D, p.D, (float)p.a.scale, (float)p.a.softcap, 0, 0.0f};
  kv_src s;
  memset(&s, 0, sizeof s);
  s.k = &p.kc;
  s.v = &p.vc;
  s.k_scale = ks_kv_scale_value(&p.ks);
  s.v_scale = ks_kv_scale_value(&p.vs);
  s.paged = 1;
  s.bt = &p.bt;
  s.bs = p.bs;
  for (int64_t b = 0; b < p.B; b++) {
    const int64_t L = ks_load_index(p.lens.data, KS_DT_I32, b * p.lens.strides[0]);
    int64_t t0 = b, n = 1;
    if (p.cu.present) {
      t0 = ks_load_index(p.cu.data, KS_DT_I32, b * p.cu.strides[0]);
      n = ks_load_index(p.cu.data, KS_DT_I32, (b + 1) * p.cu.strides[0]) - t0;
    }
    s.bt_row = b;
    ks_attn_rows(&io, &s, &p.a, rp, t0, n, L);
  }
  free(io.qbuf);
  return KS_OK;
}

KS_API ks_status_t ks_paged_attention(const DLTensor *q, const DLTensor *k_cache, const DLTensor *v_cache,
                                      const DLTensor *block_table, const DLTensor *seq_lens,
                                      const DLTensor *cu_seqlens_q, int64_t max_seqlen_q, int64_t max_seq_len,
                                      const DLTensor *sinks, const DLTensor *k_scale, const DLTensor *v_scale,
                                      DLTensor *out, DLTensor *lse, DLTensor *workspace,
                                      const ks_attention_options *options, ks_stream_t stream) {
  ks_call c;
  ks_call_begin(&c, stream, 0);
  return run_paged_attention(&c, q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, max_seqlen_q, max_seq_len,
                             sinks, k_scale, v_scale, out, lse, workspace, options);
}

/* t: q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, sinks, k_scale, v_scale, out, lse,
 * workspace. The integer arguments are not in the query: max_seqlen_q is taken as T (the most
 * any sequence can have) and max_seq_len as 0 (the block table's capacity). */
ks_status_t ks_query_paged_attention(const DLTensor *const *t, int32_t n, const void *o) {
  ks_call c;
  ks_call_begin(&c, NULL, 1);
  KS_TRY(ks_query_arity(n, 12, "paged_attention"));
  int64_t max_q = 1;
  if (t[0] != NULL && t[0]->ndim >= 1 && t[0]->shape != NULL && t[0]->shape[0] > 1) max_q = t[0]->shape[0];
  return run_paged_attention(&c, t[0], t[1], t[2], t[3], t[4], t[5], max_q, 0, t[6], t[7], t[8], (DLTensor *)t[9],
                             (DLTensor *)t[10], (DLTensor *)t[11], o);
}

/* ---- merge_attn_states */

static float logaddexpf(float a, float b) {
  if (a == b) return a + 0.69314718055994531f; /* also +-inf: -inf stays -inf */
  const float m = a > b ? a : b;
  return m + log1pf(expf(-fabsf(a - b)));
}

/* Each (t, h) row of out and lse is written after the rows it merges were read (the CPU loop and
 * the CUDA kernel alike): out may be out_a or out_b itself, lse may be lse_a or lse_b itself (in
 * place); no other sharing. Checked after the CUDA layout checks, before the dispatch and the
 * dry-run return. */
static ks_status_t check_merge_inputs(const ks_view *vo, const ks_view *vl, const ks_view *oa, const ks_view *ob,
                                      const ks_view *la, const ks_view *lb) {
  const char *why_o = "out may be out_a or out_b itself, in place, but not another view of their memory";
  const char *why_l = "lse may be lse_a or lse_b itself, in place, but not another view of their memory";
  const char *why = "an output may not share memory with an input";
  KS_TRY(ks_check_same_or_disjoint(vo, oa, why_o));
  KS_TRY(ks_check_same_or_disjoint(vo, ob, why_o));
  KS_TRY(ks_check_disjoint(vo, la, why));
  KS_TRY(ks_check_disjoint(vo, lb, why));
  KS_TRY(ks_check_same_or_disjoint(vl, la, why_l));
  KS_TRY(ks_check_same_or_disjoint(vl, lb, why_l));
  KS_TRY(ks_check_disjoint(vl, oa, why));
  return ks_check_disjoint(vl, ob, why);
}

static ks_status_t run_merge_attn_states(ks_call *c, const DLTensor *out_a, const DLTensor *lse_a,
                                         const DLTensor *out_b, const DLTensor *lse_b, DLTensor *out, DLTensor *lse) {
  char sb[160];
  ks_view oa, ob, la, lb, vo, vl;
  KS_TRY(ks_view_make(c, &oa, "out_a", out_a, KS_REQUIRED));
  KS_TRY(ks_check_dtype(&oa, KS_FLOATS));
  if (oa.ndim != 3)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "out_a: expected 3-D [T, H, D], got shape %s",
                   ks_ops_shape_str(&oa, sb, sizeof sb));
  KS_TRY(ks_view_make(c, &ob, "out_b", out_b, KS_REQUIRED));
  KS_TRY(ks_attn_check_shape(&ob, 3, oa.shape, "out_a's shape"));
  KS_TRY(ks_check_same_dtype(&oa, &ob));
  const int64_t th[2] = {oa.shape[0], oa.shape[1]};
  KS_TRY(ks_view_make(c, &la, "lse_a", lse_a, KS_REQUIRED));
  KS_TRY(ks_check_dtype(&la, KS_BIT(KS_DT_F32)));
  KS_TRY(ks_attn_check_shape(&la, 2, th, "[T, H] like out_a"));
  KS_TRY(ks_view_make(c, &lb, "lse_b", lse_b, KS_REQUIRED));
  KS_TRY(ks_check_dtype(&lb, KS_BIT(KS_DT_F32)));
  KS_TRY(ks_attn_check_shape(&lb, 2, th, "[T, H] like out_a"));
  KS_TRY(ks_check_inner_contiguous(&oa));
  KS_TRY(ks_check_inner_contiguous(&ob));
  KS_TRY(ks_view_make(c, &vo, "out", out, KS_REQUIRED));
  KS_TRY(ks_check_same_dtype(&oa, &vo));
  KS_TRY(ks_attn_check_shape(&vo, 3, oa.shape, "like out_a"));
  KS_TRY(ks_check_inner_contiguous(&vo));
  KS_TRY(ks_check_no_overlap(&vo));
  KS_TRY(ks_attn_check_lse(c, &vl, lse, 2, th, "[T, H] like out_a"));
  {
    const ks_view *outs[2] = {&vo, &vl};
    KS_TRY(ks_attn_check_outputs(outs, 2, NULL, 0));
  }
  if (c->device_type == kDLCUDA) {
    KS_TRY(ks_check_contiguous(&vo));
    if (vl.present) KS_TRY(ks_check_contiguous(&vl));
    KS_TRY(check_merge_inputs(&vo, &vl, &oa, &ob, &la, &lb));
    KS_CUDA_DISPATCH(c, merge_attn_states, oa.dtype, ob.dtype, ks_dev_ptr(c, &oa), ks_dev_ptr(c, &la),
                     ks_dev_ptr(c, &ob), ks_dev_ptr(c, &lb), ks_dev_ptr(c, &vo), ks_dev_ptr(c, &vl), oa.shape[0],
                     oa.shape[1], oa.shape[2], oa.strides[0], oa.strides[1], ob.strides[0], ob.strides[1],
                     la.strides[0], la.strides[1], lb.strides[0], lb.strides[1]);
  }
  KS_TRY(check_merge_inputs(&vo, &vl, &oa, &ob, &la, &lb));
  if (c->dry_run) return KS_OK;
  const int64_t T = oa.shape[0], H = oa.shape[1], D = oa.shape[2];
  for (int64_t t = 0; t < T; t++)
    for (int64_t h = 0; h < H; h++) {
      const float a = ((const float *)la.data)[t * la.strides[0] + h * la.strides[1]];
      const float b = ((const float *)lb.data)[t * lb.strides[0] + h * lb.strides[1]];
      const float l = logaddexpf(a, b);
      const int empty = l == -INFINITY;
      const float wa = empty ? 0.0f : expf(a - l), wb = empty ? 0.0f : expf(b - l);
      const int64_t pa = t * oa.strides[0] + h * oa.strides[1], pb = t * ob.strides[0] + h * ob.strides[1];
      const int64_t po = t * vo.strides[0] + h * vo.strides[1];
      for (int64_t d = 0; d < D; d++) {
        const float x = ks_load(oa.data, oa.dtype, pa + d), y = ks_load(ob.data, ob.dtype, pb + d);
        ks_store(vo.data, vo.dtype, po + d, wa * x + wb * y);
      }
      if (vl.present) ((float *)vl.data)[t * vl.strides[0] + h * vl.strides[1]] = l;
    }
  return KS_OK;
}

KS_API ks_status_t ks_merge_attn_states(const DLTensor *out_a, const DLTensor *lse_a, const DLTensor *out_b,
                                        const DLTensor *lse_b, DLTensor *out, DLTensor *lse, ks_stream_t stream) {
  ks_call c;
  ks_call_begin(&c, stream, 0);
  return run_merge_attn_states(&c, out_a, lse_a, out_b, lse_b, out, lse);
}

ks_status_t ks_query_merge_attn_states(const DLTensor *const *t, int32_t n, const void *o) {
  ks_call c;
  ks_call_begin(&c, NULL, 1);
  (void)o;
  KS_TRY(ks_query_arity(n, 6, "merge_attn_states"));
  return run_merge_attn_states(&c, t[0], t[1], t[2], t[3], (DLTensor *)t[4], (DLTensor *)t[5]);
}
