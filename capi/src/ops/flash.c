/* flash.c: flash_attention (dense) and flash_attention_varlen, forward.
 *
 * Semantics, CPU path and layouts: attention.c's header comment (the row kernel and checks are
 * shared through attention.h). CUDA path: the Python package's flash-attention forward kernel
 * compiled ahead of time (capi/generated), called with kernelset.ops.attention.launch's policy;
 * index data (cu_seqlens) is not checked there: see flash_cuda.
 */
#include <stdio.h>
#include <stdlib.h>

#include "attention.h"
#include "ks_cuda_ops.h"

/* ---- flash_attention (dense) and flash_attention_varlen */

typedef struct {
  ks_view q, k, v, cu_q, cu_k, sinks, out, lse;
  int varlen;
  int64_t B, Sq, Sk, hq, hkv, D, Dv, max_q, max_k;
  attn_opts a;
} flash_problem;

/* api._check_qkv: q, k, v of ndim dims with unit-stride head dims, one dtype, GQA heads */
static ks_status_t check_qkv(ks_call *c, flash_problem *p, const DLTensor *q, const DLTensor *k, const DLTensor *v,
                             int32_t ndim, const char *layout) {
  char sb[160], sb2[160];
  const char *names[3] = {"q", "k", "v"};
  const DLTensor *ts[3] = {q, k, v};
  ks_view *vs[3] = {&p->q, &p->k, &p->v};
  for (int i = 0; i < 3; i++) {
    KS_TRY(ks_view_make(c, vs[i], names[i], ts[i], KS_REQUIRED));
    KS_TRY(ks_check_dtype(vs[i], KS_FLOATS));
    if (vs[i]->ndim != ndim)
      return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected %d-D %s, got shape %s", names[i], (int)ndim, layout,
                     ks_ops_shape_str(vs[i], sb, sizeof sb));
    KS_TRY(ks_check_inner_contiguous(vs[i]));
  }
  KS_TRY(ks_check_same_dtype(&p->q, &p->k));
  KS_TRY(ks_check_same_dtype(&p->q, &p->v));
  for (int32_t d = 0; d < ndim - 1; d++)
    if (p->v.shape[d] != p->k.shape[d])
      return ks_fail(KS_ERR_INVALID_ARGUMENT, "v: expected k's shape %s up to the head size, got shape %s",
                     ks_ops_shape_str(&p->k, sb, sizeof sb), ks_ops_shape_str(&p->v, sb2, sizeof sb2));
  if (p->k.shape[ndim - 1] != p->q.shape[ndim - 1])
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "k: expected q's head size %lld, got shape %s",
                   (long long)p->q.shape[ndim - 1], ks_ops_shape_str(&p->k, sb, sizeof sb));
  p->hq = p->q.shape[ndim - 2];
  p->hkv = p->k.shape[ndim - 2];
  p->D = p->q.shape[ndim - 1];
  p->Dv = p->v.shape[ndim - 1];
  if (p->hkv == 0 || p->hq % p->hkv)
    return ks_fail(KS_ERR_INVALID_ARGUMENT,
                   "q: expected a multiple of k's %lld KV heads in query heads, got %lld heads",
                   (long long)p->hkv, (long long)p->hq);
  if (p->D == 0 || p->Dv == 0)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "q: expected head sizes >= 1, got q %s, v %s",
                   ks_ops_shape_str(&p->q, sb, sizeof sb), ks_ops_shape_str(&p->v, sb2, sizeof sb2));
  return KS_OK;
}

static ks_status_t check_flash_out(ks_call *c, flash_problem *p, DLTensor *out, DLTensor *lse) {
  int64_t shape[4];
  const int32_t nd = p->q.ndim;
  for (int32_t d = 0; d < nd; d++) shape[d] = p->q.shape[d];
  shape[nd - 1] = p->Dv;
  KS_TRY(ks_view_make(c, &p->out, "out", out, KS_REQUIRED));
  KS_TRY(ks_check_same_dtype(&p->q, &p->out));
  KS_TRY(ks_attn_check_shape(&p->out, nd, shape, p->varlen ? "[T, Hq, Dv]" : "[B, S, Hq, Dv]"));
  KS_TRY(ks_check_inner_contiguous(&p->out));
  KS_TRY(ks_check_no_overlap(&p->out));
  if (p->varlen) {
    const int64_t ls[2] = {p->hq, p->q.shape[0]};
    return ks_attn_check_lse(c, &p->lse, lse, 2, ls, "[Hq, T]");
  }
  const int64_t ls[3] = {p->B, p->hq, p->Sq};
  return ks_attn_check_lse(c, &p->lse, lse, 3, ls, "[B, Hq, S]");
}

static ks_status_t run_flash_cpu(flash_problem *p, const char *op) {
  if (p->q.numel == 0) return KS_OK;
  rows_io io;
  memset(&io, 0, sizeof io);
  io.q = &p->q;
  io.out = &p->out;
  io.lse = &p->lse;
  io.sinks = &p->sinks;
  io.hq = p->hq;
  io.g = p->hq / p->hkv;
  KS_TRY(ks_attn_alloc_rows(&io, p->D, p->Dv, op));
  const row_params rp = {p->D, p->Dv, (float)p->a.scale, (float)p->a.softcap, 0, 0.0f};
  kv_src s;
  memset(&s, 0, sizeof s);
  s.k = &p->k;
  s.v = &p->v;
  s.k_scale = s.v_scale = 1.0f;
  const int32_t nd = p->q.ndim;
  s.k_tok = p->k.strides[nd - 3];
  s.k_head = p->k.strides[nd - 2];
  s.v_tok = p->v.strides[nd - 3];
  s.v_head = p->v.strides[nd - 2];
  if (!p->varlen) {
    /* one sequence per batch entry: view q/out [S, Hq, D] at batch b through the row loop's
     * (token, head) strides, the lse [B, Hq, S] through (t, h) = (s, h) at base b */
    ks_view qb = p->q, ob = p->out;
    qb.strides[0] = p->q.strides[1];
    qb.strides[1] = p->q.strides[2];
    ob.strides[0] = p->out.strides[1];
    ob.strides[1] = p->out.strides[2];
    io.q = &qb;
    io.out = &ob;
    io.lse_t = p->lse.strides[2];
    io.lse_h = p->lse.strides[1];
    for (int64_t b = 0; b < p->B; b++) {
      qb.data = p->q.data + b * p->q.strides[0] * p->q.elem_size;
      ob.data = p->out.data + b * p->out.strides[0] * p->out.elem_size;
      io.lse_base = b * p->lse.strides[0];
      s.k_base = b * p->k.strides[0];
      s.v_base = b * p->v.strides[0];
      ks_attn_rows(&io, &s, &p->a, rp, 0, p->Sq, p->Sk);
    }
  } else {
    io.lse_t = p->lse.strides[1];
    io.lse_h = p->lse.strides[0];
    const int64_t T = p->q.shape[0];
    int64_t covered = 0;
    for (int64_t b = 0; b < p->B; b++) {
      const int64_t q0 = ks_load_index(p->cu_q.data, KS_DT_I32, b * p->cu_q.strides[0]);
      const int64_t q1 = ks_load_index(p->cu_q.data, KS_DT_I32, (b + 1) * p->cu_q.strides[0]);
      const int64_t k0 = ks_load_index(p->cu_k.data, KS_DT_I32, b * p->cu_k.strides[0]);
      const int64_t k1 = ks_load_index(p->cu_k.data, KS_DT_I32, (b + 1) * p->cu_k.strides[0]);
      s.k_base = k0 * s.k_tok;
      s.v_base = k0 * s.v_tok;
      ks_attn_rows(&io, &s, &p->a, rp, q0, q1 - q0, k1 - k0);
      covered = q1;
    }
    /* rows past the last sequence belong to none: out 0, lse -inf (the reference's fill) */
    for (int64_t t = covered; t < T; t++)
      for (int64_t h = 0; h < p->hq; h++) {
        const int64_t oo = t * p->out.strides[0] + h * p->out.strides[1];
        for (int64_t d = 0; d < p->Dv; d++) ks_store(p->out.data, p->out.dtype, oo + d, 0.0f);
        if (p->lse.present) ((float *)p->lse.data)[t * io.lse_t + h * io.lse_h] = -INFINITY;
      }
  }
  free(io.qbuf);
  return KS_OK;
}

/* out and lse against q, k, v and sinks: out may be q itself (in place), nothing else may meet.
 * Checked after the CUDA layout checks, before the dispatch and the dry-run return. */
static ks_status_t check_flash_inputs(const flash_problem *p) {
  const ks_view *outs[2] = {&p->out, &p->lse}, *ins[4] = {&p->q, &p->k, &p->v, &p->sinks};
  return ks_attn_check_inputs(outs, 2, ins, 4);
}

/* kernelset.ops.attention.launch.flash_attention_fwd (dense, or varlen with batch strides 0).
 * The LSE needs a unit token stride. Varlen on CUDA trusts cu_seqlens and max_seqlen_q/k (no host
 * sync), as the Python path does under graph capture; rows past cu_seqlens_q[-1] are not written. */
static ks_status_t flash_cuda(ks_call *c, const flash_problem *p) {
  const int v = p->varlen;
  if (p->lse.present) {
    const int32_t tok = v ? 1 : 2;
    if (p->lse.shape[tok] > 1 && p->lse.strides[tok] != 1)
      return ks_fail(KS_ERR_UNSUPPORTED_LAYOUT, "lse: expected a unit token stride on CUDA, got %lld",
                     (long long)p->lse.strides[tok]);
  }
  KS_TRY(ks_attn_check_unit_stride(&p->sinks));
  KS_TRY(ks_attn_check_unit_stride(&p->cu_q));
  KS_TRY(ks_attn_check_unit_stride(&p->cu_k));
  KS_TRY(check_flash_inputs(p));
  const ks_view *q = &p->q, *k = &p->k, *vv = &p->v, *o = &p->out;
  const int32_t d = v ? 0 : 1; /* dims of (token, head) follow the batch dim when dense */
  KS_CUDA_DISPATCH(c, flash_fwd, q->dtype, ks_dev_ptr(c, q), ks_dev_ptr(c, k), ks_dev_ptr(c, vv), ks_dev_ptr(c, o),
                   ks_dev_ptr(c, &p->lse), ks_dev_ptr(c, &p->sinks), ks_dev_ptr(c, &p->cu_q), ks_dev_ptr(c, &p->cu_k),
                   p->B, v ? p->max_q : p->Sq, v ? p->max_k : p->Sk, v ? q->shape[0] : 0, p->hq, p->hkv, p->D, p->Dv,
                   v ? 0 : q->strides[0], q->strides[d], q->strides[d + 1], v ? 0 : k->strides[0], k->strides[d],
                   k->strides[d + 1], v ? 0 : vv->strides[0], vv->strides[d], vv->strides[d + 1],
                   v ? 0 : o->strides[0], o->strides[d], o->strides[d + 1],
                   p->lse.present ? (v ? 0 : p->lse.strides[0]) : 0, p->lse.present ? p->lse.strides[v ? 0 : 1] : 0,
                   p->a.scale, p->a.softcap, p->a.left, p->a.right, p->a.causal);
}

static ks_status_t run_flash_attention(ks_call *c, const DLTensor *q, const DLTensor *k, const DLTensor *v,
                                       const DLTensor *sinks, DLTensor *out, DLTensor *lse,
                                       const ks_attention_options *options) {
  char sb[160];
  flash_problem p;
  memset(&p, 0, sizeof p);
  KS_TRY(check_qkv(c, &p, q, k, v, 4, "[B, S, H, D]"));
  if (p.k.shape[0] != p.q.shape[0])
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "k: expected q's batch size %lld, got shape %s", (long long)p.q.shape[0],
                   ks_ops_shape_str(&p.k, sb, sizeof sb));
  p.B = p.q.shape[0];
  p.Sq = p.q.shape[1];
  p.Sk = p.k.shape[1];
  KS_TRY(ks_attn_read_options(KS_OP_FLASH_ATTENTION, options, p.D, &p.a));
  KS_TRY(ks_attn_check_sinks(c, &p.sinks, sinks, p.hq));
  KS_TRY(check_flash_out(c, &p, out, lse));
  {
    const ks_view *outs[2] = {&p.out, &p.lse};
    KS_TRY(ks_attn_check_outputs(outs, 2, NULL, 0));
  }
  if (c->device_type == kDLCUDA) return flash_cuda(c, &p);
  KS_TRY(check_flash_inputs(&p));
  if (c->dry_run) return KS_OK;
  return run_flash_cpu(&p, "flash_attention");
}

KS_API ks_status_t ks_flash_attention(const DLTensor *q, const DLTensor *k, const DLTensor *v, const DLTensor *sinks,
                                      DLTensor *out, DLTensor *lse, const ks_attention_options *options,
                                      ks_stream_t stream) {
  ks_call c;
  ks_call_begin(&c, stream, 0);
  return run_flash_attention(&c, q, k, v, sinks, out, lse, options);
}

ks_status_t ks_query_flash_attention(const DLTensor *const *t, int32_t n, const void *o) {
  ks_call c;
  ks_call_begin(&c, NULL, 1);
  KS_TRY(ks_query_arity(n, 6, "flash_attention"));
  return run_flash_attention(&c, t[0], t[1], t[2], t[3], (DLTensor *)t[4], (DLTensor *)t[5], o);
}

/* cu_seqlens: non-decreasing from 0 to at most `total`, steps at most `max_len` */
static ks_status_t check_cu_data(const ks_view *cu, int64_t total, int64_t max_len, const char *max_name) {
  const int64_t n = cu->shape[0];
  int64_t prev = 0;
  for (int64_t i = 0; i < n; i++) {
    const int64_t x = ks_load_index(cu->data, KS_DT_I32, i * cu->strides[0]);
    if ((i == 0 && x != 0) || x < prev || x > total)
      return ks_fail(KS_ERR_INVALID_ARGUMENT,
                     "%s: expected non-decreasing offsets from 0 to at most %lld (the packed tokens), got %lld at "
                     "index %lld",
                     cu->name, (long long)total, (long long)x, (long long)i);
    if (i > 0 && x - prev > max_len)
      return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected >= the longest sequence (%lld at sequence %lld), got %lld",
                     max_name, (long long)(x - prev), (long long)(i - 1), (long long)max_len);
    prev = x;
  }
  return KS_OK;
}

static ks_status_t run_flash_attention_varlen(ks_call *c, const DLTensor *q, const DLTensor *k, const DLTensor *v,
                                              const DLTensor *cu_seqlens_q, const DLTensor *cu_seqlens_k,
                                              int64_t max_seqlen_q, int64_t max_seqlen_k, const DLTensor *sinks,
                                              DLTensor *out, DLTensor *lse, const ks_attention_options *options) {
  char sb[160];
  flash_problem p;
  memset(&p, 0, sizeof p);
  p.varlen = 1;
  KS_TRY(check_qkv(c, &p, q, k, v, 3, "[T, H, D]"));
  const char *names[2] = {"cu_seqlens_q", "cu_seqlens_k"};
  const DLTensor *ts[2] = {cu_seqlens_q, cu_seqlens_k};
  ks_view *cus[2] = {&p.cu_q, &p.cu_k};
  for (int i = 0; i < 2; i++) {
    KS_TRY(ks_view_make(c, cus[i], names[i], ts[i], KS_REQUIRED));
    KS_TRY(ks_check_dtype(cus[i], KS_BIT(KS_DT_I32)));
    if (cus[i]->ndim != 1 || cus[i]->shape[0] < 1)
      return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected 1-D [B + 1] int32 offsets, got shape %s", names[i],
                     ks_ops_shape_str(cus[i], sb, sizeof sb));
  }
  KS_TRY(ks_attn_check_shape(&p.cu_k, 1, p.cu_q.shape, "as many offsets as cu_seqlens_q"));
  if (max_seqlen_q < 0)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "max_seqlen_q: expected >= 0, got %lld", (long long)max_seqlen_q);
  if (max_seqlen_k < 0)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "max_seqlen_k: expected >= 0, got %lld", (long long)max_seqlen_k);
  p.B = p.cu_q.shape[0] - 1;
  p.max_q = max_seqlen_q;
  p.max_k = max_seqlen_k;
  KS_TRY(ks_attn_read_options(KS_OP_FLASH_ATTENTION_VARLEN, options, p.D, &p.a));
  KS_TRY(ks_attn_check_sinks(c, &p.sinks, sinks, p.hq));
  KS_TRY(check_flash_out(c, &p, out, lse));
  {
    const ks_view *outs[2] = {&p.out, &p.lse}, *index[2] = {&p.cu_q, &p.cu_k};
    KS_TRY(ks_attn_check_outputs(outs, 2, index, 2));
  }
  if (c->device_type == kDLCUDA) return flash_cuda(c, &p);
  KS_TRY(check_flash_inputs(&p));
  if (c->dry_run) return KS_OK;
  KS_TRY(check_cu_data(&p.cu_q, p.q.shape[0], p.max_q, "max_seqlen_q"));
  KS_TRY(check_cu_data(&p.cu_k, p.k.shape[0], p.max_k, "max_seqlen_k"));
  return run_flash_cpu(&p, "flash_attention_varlen");
}

KS_API ks_status_t ks_flash_attention_varlen(const DLTensor *q, const DLTensor *k, const DLTensor *v,
                                             const DLTensor *cu_seqlens_q, const DLTensor *cu_seqlens_k,
                                             int64_t max_seqlen_q, int64_t max_seqlen_k, const DLTensor *sinks,
                                             DLTensor *out, DLTensor *lse, const ks_attention_options *options,
                                             ks_stream_t stream) {
  ks_call c;
  ks_call_begin(&c, stream, 0);
  return run_flash_attention_varlen(&c, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sinks, out,
                                    lse, options);
}

/* t: q, k, v, cu_seqlens_q, cu_seqlens_k, sinks, out, lse. max_seqlen_q / max_seqlen_k are not in
 * the query: taken as T and Tk (the most a sequence can have). */
ks_status_t ks_query_flash_attention_varlen(const DLTensor *const *t, int32_t n, const void *o) {
  ks_call c;
  ks_call_begin(&c, NULL, 1);
  KS_TRY(ks_query_arity(n, 8, "flash_attention_varlen"));
  int64_t mq = 0, mk = 0;
  if (t[0] != NULL && t[0]->ndim >= 1 && t[0]->shape != NULL && t[0]->shape[0] > 0) mq = t[0]->shape[0];
  if (t[1] != NULL && t[1]->ndim >= 1 && t[1]->shape != NULL && t[1]->shape[0] > 0) mk = t[1]->shape[0];
  return run_flash_attention_varlen(&c, t[0], t[1], t[2], t[3], t[4], mq, mk, t[5], (DLTensor *)t[6],
                                    (DLTensor *)t[7], o);
}
