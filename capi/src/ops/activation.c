/* activation.c: silu_and_mul, gelu_and_mul, swiglu, gelu, swiglu_oai (forward).
 *
 * Semantics of kernelset.ops.activation (reference.py): fp32 math; the gated forms round the
 * activation to the storage dtype before multiplying by up (as transformers and vLLM do);
 * swiglu_oai rounds once. One path serves all five, told apart by the activation (KS_ACT_*) and
 * where gate and up live (KS_ACT_LAYOUT_*), the enums of the package's launcher.
 * out may not share memory with its inputs (KS_ERR_INVALID_ARGUMENT naming both), except true in
 * place for the elementwise ones: out = x (gelu), out = gate or out = up (swiglu), same dtype,
 * shape and strides. */
#include "ks_internal.h"
#include "ks_cuda_ops.h"

typedef struct {
  ks_op_t op;
  int act;    /* KS_ACT_*; gelu's is set from the options */
  int layout; /* KS_ACT_LAYOUT_* */
  float alpha, limit; /* swiglu_oai, from the options */
} act_kind;

static ks_status_t read_options(act_kind *k, const void *user);

static float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

static float act_of(float g, int act) {
  switch (act) {
    case KS_ACT_SILU: return g * sigmoid(g);
    /* Phi(g) = erfc(-g / sqrt 2) / 2, the Python reference's form: no cancellation for g < -4 */
    case KS_ACT_GELU: return 0.5f * g * erfcf(g * -0.707106781186547524f);
    default: { /* KS_ACT_GELU_TANH */
      const float inner = 0.797884560802865406f * (g + 0.044715f * (g * g * g));
      return 0.5f * g * (1.0f + tanhf(inner));
    }
  }
}

/* out against what it reads. gelu and swiglu are elementwise (the CPU loop and the CUDA kernel read
 * each element, then write it): out may be x itself (gelu), or gate or up itself (swiglu), but no
 * other view of their memory. The others map x [..., 2 * I] to out [..., I]: out is never x, and
 * writing any of x's memory would change gate or up values still to be read. Checked after the CUDA
 * layout checks (a layout error comes first, as in norm.c), before the dispatch and the dry-run
 * return. */
static ks_status_t check_memory(const act_kind *k, const ks_view *vo, const ks_view *vx, const ks_view *vu) {
  if (k->layout == KS_ACT_LAYOUT_SINGLE)
    return ks_check_same_or_disjoint(vo, vx, "out may be x itself, in place, but not another view of its memory");
  if (k->layout == KS_ACT_LAYOUT_PAIR) {
    const char *why = "out may be gate or up itself, in place, but not another view of their memory";
    KS_TRY(ks_check_same_or_disjoint(vo, vx, why));
    return ks_check_same_or_disjoint(vo, vu, why);
  }
  return ks_check_disjoint(vo, vx, "an output may not share memory with an input");
}

static ks_status_t run_act(ks_call *c, act_kind *k, const DLTensor *x, const DLTensor *up, DLTensor *out,
                           const void *options) {
  ks_view vx, vu, vo;
  const int pair = k->layout == KS_ACT_LAYOUT_PAIR;
  const int split = k->layout == KS_ACT_LAYOUT_HALVES || k->layout == KS_ACT_LAYOUT_INTERLEAVED;
  KS_TRY(ks_view_make(c, &vx, pair ? "gate" : "x", x, KS_REQUIRED));
  memset(&vu, 0, sizeof vu);
  if (pair) KS_TRY(ks_view_make(c, &vu, "up", up, KS_REQUIRED));
  KS_TRY(ks_view_make(c, &vo, "out", out, KS_REQUIRED));
  KS_TRY(ks_check_dtype(&vx, KS_FLOATS));
  KS_TRY(ks_check_ndim(&vx, 1, KS_MAX_DIMS));
  const int64_t last = vx.shape[vx.ndim - 1];
  if (split && last % 2)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "x: expected an even last dim [..., 2 * I] (gate and up), got %lld",
                   (long long)last);
  const int64_t i = split ? last / 2 : last;
  if (pair) {
    KS_TRY(ks_check_same_shape(&vx, &vu));
    KS_TRY(ks_check_same_dtype(&vx, &vu));
  }
  KS_TRY(ks_check_same_dtype(&vx, &vo));
  KS_TRY(ks_check_ndim(&vo, vx.ndim, vx.ndim));
  for (int32_t d = 0; d + 1 < vx.ndim; d++) KS_TRY(ks_check_dim(&vo, d, vx.shape[d], "the leading dims of x"));
  KS_TRY(ks_check_dim(&vo, -1, i, split ? "x.shape[-1] / 2" : "the last dim of x"));
  KS_TRY(ks_check_no_overlap(&vo));
  KS_TRY(read_options(k, options));
  const int64_t rows = ks_num_rows(&vx);
  if (c->device_type == kDLCUDA) {
    int64_t m, sx, su = 0, sy;
    KS_TRY(ks_view_rows(&vx, &m, &sx));
    if (pair) KS_TRY(ks_view_rows(&vu, &m, &su));
    KS_TRY(ks_view_rows_out(&vo, &m, &sy));
    KS_TRY(check_memory(k, &vo, &vx, &vu));
    KS_CUDA_DISPATCH(c, act_fwd, vx.dtype, ks_dev_ptr(c, &vx), ks_dev_ptr(c, &vu), ks_dev_ptr(c, &vo),
                     i ? rows : 0, i, sx, su, sy, (double)k->alpha, (double)k->limit, k->act, k->layout);
  }
  KS_TRY(check_memory(k, &vo, &vx, &vu));
  if (c->dry_run) return KS_OK;
  const int dt = vx.dtype;
  const int64_t sx = vx.strides[vx.ndim - 1], sy = vo.strides[vo.ndim - 1];
  const int64_t su = pair ? vu.strides[vu.ndim - 1] : 0;
  for (int64_t r = 0; r < rows; r++) {
    const int64_t xo = ks_row_offset(&vx, r), yo = ks_row_offset(&vo, r);
    const int64_t uo = pair ? ks_row_offset(&vu, r) : 0;
    for (int64_t j = 0; j < i; j++) {
      float y;
      if (k->layout == KS_ACT_LAYOUT_INTERLEAVED) {
        float g = ks_load(vx.data, dt, xo + 2 * j * sx);
        float u = ks_load(vx.data, dt, xo + (2 * j + 1) * sx);
        /* comparisons, not fminf: a NaN stays NaN as in torch.clamp */
        if (g > k->limit) g = k->limit;
        if (u > k->limit) u = k->limit;
        if (u < -k->limit) u = -k->limit;
        y = (u + 1.0f) * g * sigmoid(g * k->alpha);
      } else {
        const float a = act_of(ks_load(vx.data, dt, xo + j * sx), k->act);
        if (k->layout == KS_ACT_LAYOUT_SINGLE) {
          y = a;
        } else {
          const float u = pair ? ks_load(vu.data, dt, uo + j * su) : ks_load(vx.data, dt, xo + (i + j) * sx);
          y = ks_round_to(dt, a) * u;
        }
      }
      ks_store(vo.data, dt, yo + j * sy, y);
    }
  }
  return KS_OK;
}

static ks_status_t read_options(act_kind *k, const void *user) {
  if (k->op == KS_OP_GELU_AND_MUL || k->op == KS_OP_GELU) {
    ks_gelu_options o;
    KS_TRY(ks_read_options(k->op, user, &o, sizeof o, "options"));
    KS_TRY(ks_check_range_i32(o.approximate, KS_GELU_NONE, KS_GELU_TANH, "options.approximate"));
    k->act = o.approximate == KS_GELU_TANH ? KS_ACT_GELU_TANH : KS_ACT_GELU;
  } else if (k->op == KS_OP_SWIGLU_OAI) {
    ks_swiglu_oai_options o;
    KS_TRY(ks_read_options(k->op, user, &o, sizeof o, "options"));
    KS_TRY(ks_check_finite(o.alpha, "options.alpha"));
    KS_TRY(ks_check_positive(o.limit, "options.limit"));
    k->alpha = o.alpha;
    k->limit = o.limit;
  }
  return KS_OK;
}

/* ---- public entry points and their ks_query_support twins */

static ks_status_t silu_and_mul_(ks_call *c, const DLTensor *x, DLTensor *out) {
  act_kind k = {KS_OP_SILU_AND_MUL, KS_ACT_SILU, KS_ACT_LAYOUT_HALVES, 0.0f, 0.0f};
  return run_act(c, &k, x, NULL, out, NULL);
}

KS_API ks_status_t ks_silu_and_mul(const DLTensor *x, DLTensor *out, ks_stream_t stream) {
  ks_call c;
  ks_call_begin(&c, stream, 0);
  return silu_and_mul_(&c, x, out);
}

ks_status_t ks_query_silu_and_mul(const DLTensor *const *t, int32_t n, const void *o) {
  ks_call c;
  ks_call_begin(&c, NULL, 1);
  (void)o;
  KS_TRY(ks_query_arity(n, 2, "silu_and_mul"));
  return silu_and_mul_(&c, t[0], (DLTensor *)t[1]);
}

static ks_status_t gelu_and_mul_(ks_call *c, const DLTensor *x, DLTensor *out, const ks_gelu_options *o) {
  act_kind k = {KS_OP_GELU_AND_MUL, KS_ACT_GELU, KS_ACT_LAYOUT_HALVES, 0.0f, 0.0f};
  return run_act(c, &k, x, NULL, out, o);
}

KS_API ks_status_t ks_gelu_and_mul(const DLTensor *x, DLTensor *out, const ks_gelu_options *options,
                                   ks_stream_t stream) {
  ks_call c;
  ks_call_begin(&c, stream, 0);
  return gelu_and_mul_(&c, x, out, options);
}

ks_status_t ks_query_gelu_and_mul(const DLTensor *const *t, int32_t n, const void *o) {
  ks_call c;
  ks_call_begin(&c, NULL, 1);
  KS_TRY(ks_query_arity(n, 2, "gelu_and_mul"));
  return gelu_and_mul_(&c, t[0], (DLTensor *)t[1], o);
}

static ks_status_t swiglu_(ks_call *c, const DLTensor *gate, const DLTensor *up, DLTensor *out) {
  act_kind k = {KS_OP_SWIGLU, KS_ACT_SILU, KS_ACT_LAYOUT_PAIR, 0.0f, 0.0f};
  return run_act(c, &k, gate, up, out, NULL);
}

KS_API ks_status_t ks_swiglu(const DLTensor *gate, const DLTensor *up, DLTensor *out, ks_stream_t stream) {
  ks_call c;
  ks_call_begin(&c, stream, 0);
  return swiglu_(&c, gate, up, out);
}

ks_status_t ks_query_swiglu(const DLTensor *const *t, int32_t n, const void *o) {
  ks_call c;
  ks_call_begin(&c, NULL, 1);
  (void)o;
  KS_TRY(ks_query_arity(n, 3, "swiglu"));
  return swiglu_(&c, t[0], t[1], (DLTensor *)t[2]);
}

static ks_status_t gelu_(ks_call *c, const DLTensor *x, DLTensor *out, const ks_gelu_options *o) {
  act_kind k = {KS_OP_GELU, KS_ACT_GELU, KS_ACT_LAYOUT_SINGLE, 0.0f, 0.0f};
  return run_act(c, &k, x, NULL, out, o);
}

KS_API ks_status_t ks_gelu(const DLTensor *x, DLTensor *out, const ks_gelu_options *options, ks_stream_t stream) {
  ks_call c;
  ks_call_begin(&c, stream, 0);
  return gelu_(&c, x, out, options);
}

ks_status_t ks_query_gelu(const DLTensor *const *t, int32_t n, const void *o) {
  ks_call c;
  ks_call_begin(&c, NULL, 1);
  KS_TRY(ks_query_arity(n, 2, "gelu"));
  return gelu_(&c, t[0], (DLTensor *)t[1], o);
}

static ks_status_t swiglu_oai_(ks_call *c, const DLTensor *x, DLTensor *out, const ks_swiglu_oai_options *o) {
  act_kind k = {KS_OP_SWIGLU_OAI, KS_ACT_OAI, KS_ACT_LAYOUT_INTERLEAVED, 0.0f, 0.0f};
  return run_act(c, &k, x, NULL, out, o);
}

KS_API ks_status_t ks_swiglu_oai(const DLTensor *x, DLTensor *out, const ks_swiglu_oai_options *options,
                                 ks_stream_t stream) {
  ks_call c;
  ks_call_begin(&c, stream, 0);
  return swiglu_oai_(&c, x, out, options);
}

ks_status_t ks_query_swiglu_oai(const DLTensor *const *t, int32_t n, const void *o) {
  ks_call c;
  ks_call_begin(&c, NULL, 1);
  KS_TRY(ks_query_arity(n, 2, "swiglu_oai"));
  return swiglu_oai_(&c, t[0], (DLTensor *)t[1], o);
}
