/* attention.h: what attention.c (paged_attention, merge_attn_states) shares with flash.c
 * (flash_attention, flash_attention_varlen) and mla.c: the attention options, small checks (shapes,
 * paged-cache indices and layouts) and the CPU row kernel. Semantics and conventions: attention.c's header comment. Internal, not installed. */
#ifndef KS_OPS_ATTENTION_H_
#define KS_OPS_ATTENTION_H_

#include "kv_cache.h"

typedef struct {
  double scale, softcap; /* the default scale 1/sqrt(D) in double, as Python computes it */
  int causal;
  int64_t left, right; /* effective: right = 0 under causal; -1 unbounded */
} attn_opts;

/* Where the keys and values of one sequence live: dense (key j at base + j * tok + hk * head) or
 * paged (key j in block block_table[row, j / bs] at offset j % bs). */
typedef struct {
  const ks_view *k, *v;
  float k_scale, v_scale; /* fp8 dequantization (1 otherwise) */
  int paged;
  int64_t k_base, v_base, k_tok, v_tok, k_head, v_head;
  const ks_view *bt;
  int64_t bt_row, bs;
} kv_src;

typedef struct {
  int64_t D, Dv;
  float scale, softcap;
  int has_sink;
  float sink;
} row_params;

/* Query rows [t0, t0 + n) of q (token stride, head stride) against the keys of s (L of them):
 * writes out rows (same strides convention) and lse (element offset of (t, h) given by lse_t,
 * lse_h, or no lse). */
typedef struct {
  const ks_view *q, *out, *lse, *sinks;
  int64_t hq, g, lse_base, lse_t, lse_h;
  float *qbuf, *obuf;
} rows_io;

/* ks_attention_options read and checked for a head size (scale 0: 1/sqrt(head_dim), in double) */
ks_status_t ks_attn_read_options(ks_op_t op, const ks_attention_options *user, int64_t head_dim, attn_opts *a);

/* v has exactly the given shape ("what" says why) */
ks_status_t ks_attn_check_shape(const ks_view *v, int32_t ndim, const int64_t *shape, const char *what);

/* optional sinks: float32 [hq] */
ks_status_t ks_attn_check_sinks(ks_call *c, ks_view *s, const DLTensor *t, int64_t hq);

/* optional lse: float32 of the given shape, no overlapping elements */
ks_status_t ks_attn_check_lse(ks_call *c, ks_view *l, const DLTensor *t, int32_t ndim, const int64_t *shape,
                              const char *what);

/* bt.shape[1] * bs keys, saturated at INT64_MAX */
int64_t ks_attn_capacity(const ks_view *bt, int64_t bs);

/* Outputs (out, lse, workspace) may share memory neither with an index input (block_table,
 * seq_lens, cu_seqlens: checked on the CPU, then read again while outputs are written) nor with
 * each other: KS_ERR_INVALID_ARGUMENT naming both. Absent views are skipped. */
ks_status_t ks_attn_check_outputs(const ks_view *const *outs, int n_outs, const ks_view *const *index, int n_index);

/* Outputs against the float inputs they are computed from: outs[0] (out) may be ins[0] (q, q_nope)
 * itself, true in place (the CPU row loops and the CUDA kernels read each query row before they
 * write its output row, and read no query row another program writes); every other pair must be
 * disjoint (KS_ERR_INVALID_ARGUMENT naming both). Absent views are skipped. */
ks_status_t ks_attn_check_inputs(const ks_view *const *outs, int n_outs, const ks_view *const *ins, int n_ins);

/* a 1-D index tensor must be contiguous on CUDA */
ks_status_t ks_attn_check_unit_stride(const ks_view *v);

/* a block table [B, max_blocks] must have unit-stride rows on CUDA */
ks_status_t ks_attn_check_table_rows(const ks_view *bt);

/* seq_lens[b] in [0, max_keys] and the block ids of its keys in [0, nb) (CPU paths: every index
 * they read, checked before any output is written); *len = seq_lens[b] */
ks_status_t ks_attn_check_sequence(const ks_view *lens, const ks_view *bt, int64_t b, int64_t bs, int64_t nb,
                                   int64_t max_keys, int64_t *len);

/* the CPU row kernel over query rows [t0, t0 + n) against L keys of s */
void ks_attn_rows(const rows_io *io, const kv_src *s, const attn_opts *a, row_params rp, int64_t t0, int64_t n,
                  int64_t L);

/* io's fp32 query/output row buffers (free io->qbuf) */
ks_status_t ks_attn_alloc_rows(rows_io *io, int64_t D, int64_t Dv, const char *op);

#endif /* KS_OPS_ATTENTION_H_ */
