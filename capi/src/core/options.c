/* options.c: defaults of every op's option struct (ks_options_init) and reading a caller's struct
 * of any older size (ks_read_options). Fields are only ever appended, so a shorter struct is a
 * prefix of ours; the fields it lacks keep their defaults. */
#include <stdio.h>

#include "ks_internal.h"

typedef struct {
  uint16_t offset, size;
} field;

#define F(type, member) {(uint16_t)offsetof(type, member), (uint16_t)sizeof(((type *)0)->member)}

static const field rms_fields[] = {F(ks_rms_norm_options, size), F(ks_rms_norm_options, eps),
                                   F(ks_rms_norm_options, offset), F(ks_rms_norm_options, cast)};
static const field ln_fields[] = {F(ks_layer_norm_options, size), F(ks_layer_norm_options, eps)};
static const field gelu_fields[] = {F(ks_gelu_options, size), F(ks_gelu_options, approximate)};
static const field oai_fields[] = {F(ks_swiglu_oai_options, size), F(ks_swiglu_oai_options, alpha),
                                   F(ks_swiglu_oai_options, limit)};
static const field softmax_fields[] = {F(ks_softmax_options, size), F(ks_softmax_options, temperature)};
static const field ce_fields[] = {F(ks_cross_entropy_options, size), F(ks_cross_entropy_options, ignore_index),
                                  F(ks_cross_entropy_options, label_smoothing), F(ks_cross_entropy_options, z_loss),
                                  F(ks_cross_entropy_options, softcap), F(ks_cross_entropy_options, reduction)};
static const field rope_fields[] = {F(ks_rope_options, size), F(ks_rope_options, interleaved),
                                    F(ks_rope_options, rotary_dim), F(ks_rope_options, head_size)};
static const field mrope_fields[] = {F(ks_mrope_options, size), F(ks_mrope_options, interleaved),
                                     F(ks_mrope_options, rotary_dim), F(ks_mrope_options, head_size),
                                     F(ks_mrope_options, mrope_section), F(ks_mrope_options, mrope_interleaved)};
static const field qk_fields[] = {F(ks_qk_norm_rope_options, size), F(ks_qk_norm_rope_options, eps),
                                  F(ks_qk_norm_rope_options, offset), F(ks_qk_norm_rope_options, cast),
                                  F(ks_qk_norm_rope_options, interleaved), F(ks_qk_norm_rope_options, rotary_dim),
                                  F(ks_qk_norm_rope_options, head_size), F(ks_qk_norm_rope_options, mrope_section),
                                  F(ks_qk_norm_rope_options, mrope_interleaved)};
static const field attn_fields[] = {F(ks_attention_options, size), F(ks_attention_options, scale),
                                    F(ks_attention_options, causal), F(ks_attention_options, window_left),
                                    F(ks_attention_options, window_right), F(ks_attention_options, softcap)};
static const field mla_fields[] = {F(ks_mla_options, size), F(ks_mla_options, scale),
                                   F(ks_mla_options, kv_lora_rank), F(ks_mla_options, rope_dim)};
#undef F

typedef struct {
  const char *op;       /* "rms_norm" */
  const char *type;     /* "ks_rms_norm_options": NULL for ops without options */
  size_t size;
  const field *fields;
  int num_fields;
} options_info;

#define N(a) (int)(sizeof(a) / sizeof((a)[0]))
static options_info info_of(ks_op_t op) {
  options_info i = {NULL, NULL, 0, NULL, 0};
  switch (op) {
#define CASE(id, name, T, fl) case id: i.op = name; i.type = #T; i.size = sizeof(T); i.fields = fl; i.num_fields = N(fl); break;
#define NONE(id, name) case id: i.op = name; break;
    CASE(KS_OP_RMS_NORM, "rms_norm", ks_rms_norm_options, rms_fields)
    CASE(KS_OP_FUSED_ADD_RMS_NORM, "fused_add_rms_norm", ks_rms_norm_options, rms_fields)
    CASE(KS_OP_LAYER_NORM, "layer_norm", ks_layer_norm_options, ln_fields)
    NONE(KS_OP_SILU_AND_MUL, "silu_and_mul")
    CASE(KS_OP_GELU_AND_MUL, "gelu_and_mul", ks_gelu_options, gelu_fields)
    NONE(KS_OP_SWIGLU, "swiglu")
    CASE(KS_OP_GELU, "gelu", ks_gelu_options, gelu_fields)
    CASE(KS_OP_SWIGLU_OAI, "swiglu_oai", ks_swiglu_oai_options, oai_fields)
    CASE(KS_OP_SOFTMAX, "softmax", ks_softmax_options, softmax_fields)
    CASE(KS_OP_LOG_SOFTMAX, "log_softmax", ks_softmax_options, softmax_fields)
    CASE(KS_OP_CROSS_ENTROPY, "cross_entropy", ks_cross_entropy_options, ce_fields)
    NONE(KS_OP_EMBEDDING, "embedding")
    CASE(KS_OP_ROTARY_EMBEDDING, "rotary_embedding", ks_rope_options, rope_fields)
    CASE(KS_OP_MROPE, "mrope", ks_mrope_options, mrope_fields)
    CASE(KS_OP_QK_NORM_ROPE, "qk_norm_rope", ks_qk_norm_rope_options, qk_fields)
    NONE(KS_OP_RESHAPE_AND_CACHE, "reshape_and_cache")
    NONE(KS_OP_COPY_BLOCKS, "copy_blocks")
    CASE(KS_OP_PAGED_ATTENTION, "paged_attention", ks_attention_options, attn_fields)
    NONE(KS_OP_MERGE_ATTN_STATES, "merge_attn_states")
    CASE(KS_OP_FLASH_ATTENTION, "flash_attention", ks_attention_options, attn_fields)
    CASE(KS_OP_FLASH_ATTENTION_VARLEN, "flash_attention_varlen", ks_attention_options, attn_fields)
    CASE(KS_OP_MLA_DECODE, "mla_decode", ks_mla_options, mla_fields)
#undef CASE
#undef NONE
    default: break;
  }
  return i;
}
#undef N

/* Writes op's defaults (a full struct of ours) into `d`, which has room for info.size bytes. */
static void defaults(ks_op_t op, void *d) {
  switch (op) {
    case KS_OP_RMS_NORM:
    case KS_OP_FUSED_ADD_RMS_NORM: {
      ks_rms_norm_options o = {sizeof o, 1e-6f, 0.0f, KS_NORM_CAST_LLAMA};
      memcpy(d, &o, sizeof o);
      break;
    }
    case KS_OP_LAYER_NORM: {
      ks_layer_norm_options o = {sizeof o, 1e-5f};
      memcpy(d, &o, sizeof o);
      break;
    }
    case KS_OP_GELU_AND_MUL:
    case KS_OP_GELU: {
      ks_gelu_options o = {sizeof o, KS_GELU_NONE};
      memcpy(d, &o, sizeof o);
      break;
    }
    case KS_OP_SWIGLU_OAI: {
      ks_swiglu_oai_options o = {sizeof o, 1.702f, 7.0f};
      memcpy(d, &o, sizeof o);
      break;
    }
    case KS_OP_SOFTMAX:
    case KS_OP_LOG_SOFTMAX: {
      ks_softmax_options o = {sizeof o, 1.0f};
      memcpy(d, &o, sizeof o);
      break;
    }
    case KS_OP_CROSS_ENTROPY: {
      ks_cross_entropy_options o = {sizeof o, -100, 0.0f, 0.0f, 0.0f, KS_REDUCTION_MEAN};
      memcpy(d, &o, sizeof o);
      break;
    }
    case KS_OP_ROTARY_EMBEDDING: {
      ks_rope_options o = {sizeof o, 0, 0, 0};
      memcpy(d, &o, sizeof o);
      break;
    }
    case KS_OP_MROPE: {
      ks_mrope_options o = {sizeof o, 0, 0, 0, {0, 0, 0}, 0};
      memcpy(d, &o, sizeof o);
      break;
    }
    case KS_OP_QK_NORM_ROPE: {
      ks_qk_norm_rope_options o = {sizeof o, 1e-6f, 0.0f, KS_NORM_CAST_LLAMA, 0, 0, 0, {0, 0, 0}, 0};
      memcpy(d, &o, sizeof o);
      break;
    }
    case KS_OP_PAGED_ATTENTION:
    case KS_OP_FLASH_ATTENTION:
    case KS_OP_FLASH_ATTENTION_VARLEN: {
      ks_attention_options o = {sizeof o, 0.0f, op == KS_OP_PAGED_ATTENTION, -1, -1, 0.0f};
      memcpy(d, &o, sizeof o);
      break;
    }
    case KS_OP_MLA_DECODE: { /* kernelset.ops.mla.api.mla_decode's defaults; scale has none */
      ks_mla_options o = {sizeof o, 0.0, 512, 64};
      memcpy(d, &o, sizeof o);
      break;
    }
    default: break;
  }
}

/* The bytes of a caller's struct of `size` bytes to take: whole fields only; a size that ends
 * inside a field is refused (0). Padding between or after fields is fine. */
static size_t prefix_bytes(const options_info *i, size_t size) {
  size_t take = 0;
  for (int f = 0; f < i->num_fields; f++) {
    const size_t start = i->fields[f].offset, end = start + i->fields[f].size;
    if (size >= end) {
      take = end;
    } else if (size > start) {
      return 0;
    }
  }
  return take;
}

static ks_status_t check_size(const options_info *i, size_t size, const char *name) {
  if (size < sizeof(size_t))
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: size %zu is smaller than its size field (%zu bytes); set size to "
                   "sizeof(%s) or use ks_options_init", name, size, sizeof(size_t), i->type);
  if (size > i->size)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: size %zu is larger than this library's %s (%zu bytes); the caller "
                   "was built against a newer kernelset.h", name, size, i->type, i->size);
  if (prefix_bytes(i, size) == 0)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: size %zu ends inside a field of %s", name, size, i->type);
  return KS_OK;
}

KS_API ks_status_t ks_options_init(ks_op_t op, void *options, size_t size) {
  ks_clear_error();
  const options_info i = info_of(op);
  if (i.op == NULL) return ks_fail(KS_ERR_INVALID_ARGUMENT, "op: unknown op id %d", (int)op);
  if (i.type == NULL) return ks_fail(KS_ERR_INVALID_ARGUMENT, "op: %s takes no options", i.op);
  if (options == NULL) return ks_fail(KS_ERR_INVALID_ARGUMENT, "options: NULL");
  KS_TRY(check_size(&i, size, "options"));
  unsigned char full[256];
  memset(full, 0, sizeof full);
  defaults(op, full);
  memcpy(options, full, size); /* an older caller's struct gets the defaults of the fields it has */
  memcpy(options, &size, sizeof size);
  return KS_OK;
}

ks_status_t ks_read_options(ks_op_t op, const void *user, void *out, size_t ours, const char *name) {
  const options_info i = info_of(op);
  if (i.type == NULL || ours != i.size)
    return ks_fail(KS_ERR_INTERNAL, "%s: internal: op %d read with a struct of %zu bytes", name, (int)op, ours);
  memset(out, 0, ours);
  defaults(op, out);
  if (user == NULL) return KS_OK;
  size_t size;
  memcpy(&size, user, sizeof size);
  KS_TRY(check_size(&i, size, name));
  memcpy((char *)out + sizeof(size_t), (const char *)user + sizeof(size_t), prefix_bytes(&i, size) - sizeof(size_t));
  return KS_OK;
}

ks_status_t ks_check_positive(float v, const char *name) {
  if (v > 0.0f && v < INFINITY) return KS_OK;
  return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected a finite number > 0, got %g", name, (double)v);
}

ks_status_t ks_check_finite(float v, const char *name) {
  if (v > -INFINITY && v < INFINITY) return KS_OK;
  return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected a finite number, got %g", name, (double)v);
}

ks_status_t ks_check_range_i32(int32_t v, int32_t lo, int32_t hi, const char *name) {
  if (v >= lo && v <= hi) return KS_OK;
  return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected %d to %d, got %d", name, (int)lo, (int)hi, (int)v);
}
