/* kernelset.h: the stable C ABI of kernelset (libkernelset.so).
 *
 * Plain C99. Tensors are DLPack DLTensors (no copies from torch, JAX, CuPy ...). Every function
 * returns a ks_status_t; on failure ks_last_error() gives a thread-local message naming the
 * argument and what was expected. The library never aborts, never prints, and never touches
 * memory outside the tensors it was given.
 *
 * Conventions
 * - Inputs are `const DLTensor *`, outputs `DLTensor *`. Optional tensors may be NULL.
 * - Option structs are plain data whose first field `size` must be set to sizeof(struct) by the
 *   caller (ks_options_init does it and fills the defaults); fields are only ever appended
 *   within a major version, and the library reads only the first `size` bytes (the rest take
 *   their defaults). Passing NULL options means all defaults. A field appended in a later minor
 *   starts at or after the struct's previous sizeof, so an old caller's tail padding is never
 *   read as a new field.
 * - Every op takes an explicit stream (CUstream / cudaStream_t; NULL = the legacy default
 *   stream). It is ignored for CPU tensors, which run synchronously on the calling thread.
 * - All tensors of one call live on the same device. Strides are in elements (DLPack); a tensor
 *   whose layout an op cannot honour is refused with KS_ERR_UNSUPPORTED_LAYOUT.
 * - Index data (positions, slots, block ids, seq_lens, cu_seqlens, block_mapping) is checked on CPU
 *   (KS_ERR_INVALID_ARGUMENT naming the offending index); on CUDA it is trusted (checking would
 *   need a host sync), as in the Python package under graph capture.
 * - Storage dtypes: float32, float16, bfloat16 (fp8 e4m3fn for KV caches where noted), with fp32
 *   accumulation. Index tensors are int32 unless noted (positions, ids and targets: int32 or int64).
 * - An output may not share memory with an input or another output (KS_ERR_INVALID_ARGUMENT naming
 *   both; slices of one buffer that never meet are fine), except these exact in-place uses (the
 *   same pointer, dtype, shape and strides): out = x for the norms, gelu and softmax /
 *   log_softmax; out = gate or up for swiglu; out = q for paged / flash / varlen attention and
 *   out = q_nope for mla_decode; merge_attn_states' out = out_a or out_b (lse likewise); the ops
 *   that write their arguments by design (RoPE's q and k, the KV caches, the fused norm's residual).
 */
#ifndef KERNELSET_H_
#define KERNELSET_H_

#include <stddef.h>
#include <stdint.h>

/* ---- DLPack (v1.x layout of DLDevice / DLDataType / DLTensor). If dlpack.h was included
 * first its definitions are used; they are layout-identical. */
#ifndef DLPACK_DLPACK_H_
typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3
} DLDeviceType;

typedef enum {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLOpaqueHandle = 3,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6,
  kDLFloat8_e4m3fn = 10,
  kDLFloat8_e5m2 = 12
} DLDataTypeCode;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides; /* NULL: compact row-major */
  uint64_t byte_offset;
} DLTensor;
#endif

/* BEGIN GENERATED: declarations (capi/abi/generate.py, from capi/abi/ksabi/ops.py; do not edit) */
/* ---- Versioning */
#define KS_ABI_VERSION_MAJOR 1
#define KS_ABI_VERSION_MINOR 1

#if defined(_WIN32)
#define KS_API __declspec(dllexport)
#else
#define KS_API __attribute__((visibility("default")))
#endif

/* ---- Status codes */
typedef int32_t ks_status_t;
enum {
  KS_OK = 0,
  KS_ERR_INVALID_ARGUMENT = 1,   /* null pointer, negative or mismatched dim, bad option value */
  KS_ERR_UNSUPPORTED_DTYPE = 2,
  KS_ERR_UNSUPPORTED_SHAPE = 3,  /* valid, but not a shape this op/build handles (e.g. head dim) */
  KS_ERR_UNSUPPORTED_LAYOUT = 4, /* strides the op cannot honour */
  KS_ERR_UNSUPPORTED_DEVICE = 5, /* device type this build cannot run on, or tensors on different devices */
  KS_ERR_UNSUPPORTED_ARCH = 6,   /* a CUDA GPU with no kernel in this build for its architecture */
  KS_ERR_CUDA = 7,               /* CUDA driver missing or a driver call failed */
  KS_ERR_OUT_OF_MEMORY = 8,
  KS_ERR_NOT_IMPLEMENTED = 9,    /* declared op/variant not available in this build */
  KS_ERR_VERSION = 10,           /* ks_get_api: no compatible table */
  KS_ERR_INTERNAL = 11
};

typedef void *ks_stream_t;

/* ---- Op identifiers (for ks_options_init and ks_query_support). Values never change. */
typedef int32_t ks_op_t;
enum {
  KS_OP_RMS_NORM = 1,
  KS_OP_FUSED_ADD_RMS_NORM = 2,
  KS_OP_LAYER_NORM = 3,
  KS_OP_SILU_AND_MUL = 4,
  KS_OP_GELU_AND_MUL = 5,
  KS_OP_SWIGLU = 6,
  KS_OP_GELU = 7,
  KS_OP_SWIGLU_OAI = 8,
  KS_OP_SOFTMAX = 9,
  KS_OP_LOG_SOFTMAX = 10,
  KS_OP_CROSS_ENTROPY = 11,
  KS_OP_EMBEDDING = 12,
  KS_OP_ROTARY_EMBEDDING = 13,
  KS_OP_MROPE = 14,
  KS_OP_QK_NORM_ROPE = 15,
  KS_OP_RESHAPE_AND_CACHE = 16,
  KS_OP_COPY_BLOCKS = 17,
  KS_OP_PAGED_ATTENTION = 18,
  KS_OP_MERGE_ATTN_STATES = 19,
  KS_OP_FLASH_ATTENTION = 20,
  KS_OP_FLASH_ATTENTION_VARLEN = 21,
  KS_OP_MLA_DECODE = 22 /* ABI 1.1 */
};

/* ---- Enumerated option values */
enum { KS_NORM_CAST_LLAMA = 0, KS_NORM_CAST_GEMMA = 1 }; /* where rms_norm rounds (see ks.NormCast) */
enum { KS_GELU_NONE = 0, KS_GELU_TANH = 1 };             /* gelu approximation */
enum { KS_REDUCTION_NONE = 0, KS_REDUCTION_MEAN = 1, KS_REDUCTION_SUM = 2 };

/* ---- Option structs (first field: size in bytes) */
typedef struct {
  size_t size;
  float eps;     /* default 1e-6 */
  float offset;  /* default 0; 1 for Gemma's (1 + w) */
  int32_t cast;  /* KS_NORM_CAST_*, default LLAMA */
} ks_rms_norm_options;

typedef struct {
  size_t size;
  float eps;  /* default 1e-5 */
} ks_layer_norm_options;

typedef struct {
  size_t size;
  int32_t approximate;  /* KS_GELU_*, default NONE */
} ks_gelu_options;

typedef struct {
  size_t size;
  float alpha;  /* default 1.702 */
  float limit;  /* default 7.0 */
} ks_swiglu_oai_options;

typedef struct {
  size_t size;
  float temperature;  /* default 1.0; y = softmax(x / temperature) over the last dim */
} ks_softmax_options;

typedef struct {
  size_t size;
  int64_t ignore_index;   /* default -100; int32 range on CUDA (KS_ERR_UNSUPPORTED_SHAPE beyond) */
  float label_smoothing;  /* default 0 */
  float z_loss;           /* default 0 */
  float softcap;          /* default 0 = none */
  int32_t reduction;      /* KS_REDUCTION_*, default MEAN */
} ks_cross_entropy_options;

typedef struct {
  size_t size;
  int32_t interleaved;  /* 0: NeoX halves (default), 1: GPT-J interleaved pairs */
  int32_t rotary_dim;   /* 0 = the cache's width (default) */
  int32_t head_size;    /* 0 = inferred from q (default) */
} ks_rope_options;

typedef struct {
  size_t size;
  int32_t interleaved;
  int32_t rotary_dim;
  int32_t head_size;
  int32_t mrope_section[3];   /* t, h, w sections (pairs); required */
  int32_t mrope_interleaved;  /* 0: sections contiguous (Qwen2-VL), 1: interleaved (Qwen3-VL) */
} ks_mrope_options;

typedef struct {
  size_t size;
  float eps;                 /* default 1e-6 */
  float offset;              /* default 0 */
  int32_t cast;              /* KS_NORM_CAST_*, default LLAMA */
  int32_t interleaved;
  int32_t rotary_dim;
  int32_t head_size;
  int32_t mrope_section[3];  /* all 0 (default): plain RoPE with positions [T] */
  int32_t mrope_interleaved;
} ks_qk_norm_rope_options;

typedef struct {
  size_t size;
  float scale;           /* 0 = 1/sqrt(D) (default) */
  int32_t causal;        /* default 1 for paged, 0 for flash */
  int32_t window_left;   /* -1 = unbounded (default) */
  int32_t window_right;  /* -1 = unbounded (default) */
  float softcap;         /* 0 = none (default) */
} ks_attention_options;

typedef struct { /* ABI 1.1 */
  size_t size;
  double scale;          /* required, > 0 (0, the default, is refused): DeepSeek's softmax scale */
  int32_t kv_lora_rank;  /* default 512; must equal q_nope's last dim */
  int32_t rope_dim;      /* default 64; must equal q_pe's last dim */
} ks_mla_options;

/* ---- Library */
KS_API const char *ks_last_error(void);           /* this thread's last error message; "" if none */
KS_API const char *ks_status_name(ks_status_t s); /* "KS_ERR_INVALID_ARGUMENT" ... */
KS_API const char *ks_build_info(void);           /* "kernelset 0.1.0; abi 1.1; cuda: sm_80 sm_89 sm_90 +ptx" */
KS_API void ks_abi_version(int32_t *major, int32_t *minor);
KS_API ks_status_t ks_options_init(ks_op_t op, void *options, size_t size); /* sets size and defaults */

/* Whether `op` can run on these tensors and options, without running it. tensors[] holds the
 * op's tensor arguments in signature order (NULL where an optional one is absent); only their
 * metadata is read (data may be NULL). Returns KS_OK or the status the call would return, with
 * the reason in ks_last_error(). */
KS_API ks_status_t ks_query_support(ks_op_t op, const DLTensor *const *tensors, int32_t num_tensors,
                                    const void *options);

/* ---- Norms. x [..., H]; weight [H] or NULL; out like x. */
KS_API ks_status_t ks_rms_norm(const DLTensor *x, const DLTensor *weight, DLTensor *out,
                               const ks_rms_norm_options *options, ks_stream_t stream);
/* h = x + residual is written into residual, out = rms_norm(h). out may alias x (in place). */
KS_API ks_status_t ks_fused_add_rms_norm(const DLTensor *x, DLTensor *residual, const DLTensor *weight, DLTensor *out,
                                         const ks_rms_norm_options *options, ks_stream_t stream);
KS_API ks_status_t ks_layer_norm(const DLTensor *x, const DLTensor *weight, const DLTensor *bias, DLTensor *out,
                                 const ks_layer_norm_options *options, ks_stream_t stream);

/* ---- Activations. x [..., 2I] -> out [..., I] (gate first half, up second half). */
KS_API ks_status_t ks_silu_and_mul(const DLTensor *x, DLTensor *out, ks_stream_t stream);
KS_API ks_status_t ks_gelu_and_mul(const DLTensor *x, DLTensor *out, const ks_gelu_options *options,
                                   ks_stream_t stream);
KS_API ks_status_t ks_swiglu(const DLTensor *gate, const DLTensor *up, DLTensor *out, ks_stream_t stream);
KS_API ks_status_t ks_gelu(const DLTensor *x, DLTensor *out, const ks_gelu_options *options, ks_stream_t stream);
/* gpt-oss: x [..., 2I] interleaved (gate, up) pairs -> out [..., I]. */
KS_API ks_status_t ks_swiglu_oai(const DLTensor *x, DLTensor *out, const ks_swiglu_oai_options *options,
                                 ks_stream_t stream);

/* ---- Softmax over the last dim. out like x (float32, float16 or bfloat16). */
KS_API ks_status_t ks_softmax(const DLTensor *x, DLTensor *out, const ks_softmax_options *options, ks_stream_t stream);
KS_API ks_status_t ks_log_softmax(const DLTensor *x, DLTensor *out, const ks_softmax_options *options,
                                  ks_stream_t stream);

/* ---- Loss (forward). logits [T, V], target [T] int32/int64; loss float32: [T] with
 * KS_REDUCTION_NONE, else a 0-d (or [1]) tensor. A target outside [0, V) that is not ignore_index
 * gives KS_ERR_INVALID_ARGUMENT on CPU (nothing written); on CUDA its row's loss is NaN (no read
 * outside logits). */
KS_API ks_status_t ks_cross_entropy(const DLTensor *logits, const DLTensor *target, DLTensor *loss,
                                    const ks_cross_entropy_options *options, ks_stream_t stream);

/* ---- Embedding (forward). ids [...] int32/int64, weight [V, H], out [..., H]. Out-of-range ids
 * give KS_ERR_INVALID_ARGUMENT on CPU; on CUDA their rows are NaN (no read outside weight). */
KS_API ks_status_t ks_embedding(const DLTensor *ids, const DLTensor *weight, DLTensor *out, ks_stream_t stream);

/* ---- RoPE, in place on q [T, Hq*D] or [T, Hq, D] and k (same, or NULL). positions [T]
 * int32/int64 (mrope: [3, T]); cos_sin_cache [max_pos, rotary_dim] (cos half, then sin half).
 * A position outside [0, max_pos) leaves its token unrotated (as the Python package does). */
KS_API ks_status_t ks_rotary_embedding(const DLTensor *positions, DLTensor *q, DLTensor *k,
                                       const DLTensor *cos_sin_cache, const ks_rope_options *options,
                                       ks_stream_t stream);
KS_API ks_status_t ks_mrope(const DLTensor *positions, DLTensor *q, DLTensor *k, const DLTensor *cos_sin_cache,
                            const ks_mrope_options *options, ks_stream_t stream);
/* Per-head RMSNorm of q and k (weights [D]) then RoPE, in place. */
KS_API ks_status_t ks_qk_norm_rope(DLTensor *q, DLTensor *k, const DLTensor *q_weight, const DLTensor *k_weight,
                                   const DLTensor *cos_sin_cache, const DLTensor *positions,
                                   const ks_qk_norm_rope_options *options, ks_stream_t stream);

/* ---- Paged KV cache: caches [num_blocks, block_size, Hkv, D], fp16/bf16 or fp8 e4m3fn.
 * key/value [T, Hkv, D]; slot_mapping [T] int32/int64, -1 skips a token. k_scale/v_scale:
 * float32 scalars (0-d or [1]) for fp8 caches, else NULL. */
KS_API ks_status_t ks_reshape_and_cache(const DLTensor *key, const DLTensor *value, DLTensor *k_cache,
                                        DLTensor *v_cache, const DLTensor *slot_mapping, const DLTensor *k_scale,
                                        const DLTensor *v_scale, ks_stream_t stream);
/* block_mapping [N, 2] int64 (src, dst) pairs; copies both caches of each of num_layers layers. The pairs
 * run in parallel: a destination may be neither another pair's source nor repeated (a block copied
 * onto itself is fine). */
KS_API ks_status_t ks_copy_blocks(DLTensor *const *k_caches, DLTensor *const *v_caches, int32_t num_layers,
                                  const DLTensor *block_mapping, ks_stream_t stream);

/* ---- Attention. LSE outputs are float32 natural-log softmax denominators; sinks are [Hq] float32.
 * paged: q [B, Hq, D] (decode; cu_seqlens_q NULL) or [T, Hq, D] with cu_seqlens_q [B+1] int32;
 * block_table [B, max_blocks] int32; seq_lens [B] int32; out like q; lse [T, Hq] or NULL;
 * sinks [Hq] float32 or NULL. max_seq_len bounds seq_lens (0 = the block table's capacity).
 * workspace: a uint8 CUDA tensor of ks_paged_attention_workspace_size() bytes enables split-KV
 * (flash-decoding) for long sequences; NULL runs one pass per sequence. Graph-capturable. */
KS_API ks_status_t ks_paged_attention_workspace_size(const DLTensor *q, const DLTensor *k_cache, int64_t max_seq_len,
                                                     size_t *bytes);
KS_API ks_status_t ks_paged_attention(const DLTensor *q, const DLTensor *k_cache, const DLTensor *v_cache,
                                      const DLTensor *block_table, const DLTensor *seq_lens,
                                      const DLTensor *cu_seqlens_q, int64_t max_seqlen_q, int64_t max_seq_len,
                                      const DLTensor *sinks, const DLTensor *k_scale, const DLTensor *v_scale,
                                      DLTensor *out, DLTensor *lse, DLTensor *workspace,
                                      const ks_attention_options *options, ks_stream_t stream);
/* out_a/out_b [T, H, D], lse_a/lse_b [T, H] float32 -> out, lse (lse may be NULL). */
KS_API ks_status_t ks_merge_attn_states(const DLTensor *out_a, const DLTensor *lse_a, const DLTensor *out_b,
                                        const DLTensor *lse_b, DLTensor *out, DLTensor *lse, ks_stream_t stream);
/* dense: q [B, S, Hq, D], k/v [B, Sk, Hkv, D(v)]; out [B, S, Hq, Dv]; lse [B, Hq, S] or NULL. */
KS_API ks_status_t ks_flash_attention(const DLTensor *q, const DLTensor *k, const DLTensor *v, const DLTensor *sinks,
                                      DLTensor *out, DLTensor *lse, const ks_attention_options *options,
                                      ks_stream_t stream);
/* varlen: q [T, Hq, D], k/v [Tk, Hkv, D(v)], cu_seqlens_q/k [B+1] int32; lse [Hq, T] or NULL. */
KS_API ks_status_t ks_flash_attention_varlen(const DLTensor *q, const DLTensor *k, const DLTensor *v,
                                             const DLTensor *cu_seqlens_q, const DLTensor *cu_seqlens_k,
                                             int64_t max_seqlen_q, int64_t max_seqlen_k, const DLTensor *sinks,
                                             DLTensor *out, DLTensor *lse, const ks_attention_options *options,
                                             ks_stream_t stream);

/* ---- MLA decode (DeepSeek-V2/V3 multi-head latent attention, weight-absorbed; ABI 1.1).
 * s_j = scale (q_nope . c_j + q_pe . k_pe_j), out = softmax(s) C per sequence and head, fp32
 * accumulation. q_nope [B, H, R] (R = kv_lora_rank), q_pe [B, H, P] (P = rope_dim), float32/16 or
 * bfloat16, unit-stride last dims; kv_cache [num_blocks, block_size, R + P] (each token's latent c,
 * then its rotary key) in q's dtype, or float8_e4m3fn with kv_scale (a float32 scalar; NULL for
 * other caches); block_table [B, max_blocks] int32; seq_lens [B] int32; max_seq_len bounds
 * seq_lens (0 = the block table's capacity). out [B, H, R] like q_nope (latent space: apply W_UV
 * after); lse [B, H] float32 or NULL. A sequence of length 0 gets out 0 and lse -inf. On CUDA
 * the split-KV partials live in library scratch (capi/aot/README.md): the buffer of the call's
 * (context, stream) when eager; under CUDA-graph capture, memory the graph allocates and frees
 * itself (stream-ordered), so a captured call needs no warm-up and replays on any stream. */
KS_API ks_status_t ks_mla_decode(const DLTensor *q_nope, const DLTensor *q_pe, const DLTensor *kv_cache,
                                 const DLTensor *block_table, const DLTensor *seq_lens, int64_t max_seq_len,
                                 const DLTensor *kv_scale, DLTensor *out, DLTensor *lse, const ks_mla_options *options,
                                 ks_stream_t stream);

/* ---- The function table: the one entry point a dynamic loader needs. Fields are appended
 * within a major version; check `size` before using a field added in a later minor. */
typedef struct {
  size_t size;
  int32_t abi_major;
  int32_t abi_minor;
  const char *(*last_error)(void);
  const char *(*status_name)(ks_status_t);
  const char *(*build_info)(void);
  ks_status_t (*options_init)(ks_op_t, void *, size_t);
  ks_status_t (*query_support)(ks_op_t, const DLTensor *const *, int32_t, const void *);
  ks_status_t (*rms_norm)(const DLTensor *, const DLTensor *, DLTensor *, const ks_rms_norm_options *, ks_stream_t);
  ks_status_t (*fused_add_rms_norm)(const DLTensor *, DLTensor *, const DLTensor *, DLTensor *,
                                    const ks_rms_norm_options *, ks_stream_t);
  ks_status_t (*layer_norm)(const DLTensor *, const DLTensor *, const DLTensor *, DLTensor *,
                            const ks_layer_norm_options *, ks_stream_t);
  ks_status_t (*silu_and_mul)(const DLTensor *, DLTensor *, ks_stream_t);
  ks_status_t (*gelu_and_mul)(const DLTensor *, DLTensor *, const ks_gelu_options *, ks_stream_t);
  ks_status_t (*swiglu)(const DLTensor *, const DLTensor *, DLTensor *, ks_stream_t);
  ks_status_t (*gelu)(const DLTensor *, DLTensor *, const ks_gelu_options *, ks_stream_t);
  ks_status_t (*swiglu_oai)(const DLTensor *, DLTensor *, const ks_swiglu_oai_options *, ks_stream_t);
  ks_status_t (*softmax)(const DLTensor *, DLTensor *, const ks_softmax_options *, ks_stream_t);
  ks_status_t (*log_softmax)(const DLTensor *, DLTensor *, const ks_softmax_options *, ks_stream_t);
  ks_status_t (*cross_entropy)(const DLTensor *, const DLTensor *, DLTensor *, const ks_cross_entropy_options *,
                               ks_stream_t);
  ks_status_t (*embedding)(const DLTensor *, const DLTensor *, DLTensor *, ks_stream_t);
  ks_status_t (*rotary_embedding)(const DLTensor *, DLTensor *, DLTensor *, const DLTensor *, const ks_rope_options *,
                                  ks_stream_t);
  ks_status_t (*mrope)(const DLTensor *, DLTensor *, DLTensor *, const DLTensor *, const ks_mrope_options *,
                       ks_stream_t);
  ks_status_t (*qk_norm_rope)(DLTensor *, DLTensor *, const DLTensor *, const DLTensor *, const DLTensor *,
                              const DLTensor *, const ks_qk_norm_rope_options *, ks_stream_t);
  ks_status_t (*reshape_and_cache)(const DLTensor *, const DLTensor *, DLTensor *, DLTensor *, const DLTensor *,
                                   const DLTensor *, const DLTensor *, ks_stream_t);
  ks_status_t (*copy_blocks)(DLTensor *const *, DLTensor *const *, int32_t, const DLTensor *, ks_stream_t);
  ks_status_t (*paged_attention_workspace_size)(const DLTensor *, const DLTensor *, int64_t, size_t *);
  ks_status_t (*paged_attention)(const DLTensor *, const DLTensor *, const DLTensor *, const DLTensor *,
                                 const DLTensor *, const DLTensor *, int64_t, int64_t, const DLTensor *,
                                 const DLTensor *, const DLTensor *, DLTensor *, DLTensor *, DLTensor *,
                                 const ks_attention_options *, ks_stream_t);
  ks_status_t (*merge_attn_states)(const DLTensor *, const DLTensor *, const DLTensor *, const DLTensor *, DLTensor *,
                                   DLTensor *, ks_stream_t);
  ks_status_t (*flash_attention)(const DLTensor *, const DLTensor *, const DLTensor *, const DLTensor *, DLTensor *,
                                 DLTensor *, const ks_attention_options *, ks_stream_t);
  ks_status_t (*flash_attention_varlen)(const DLTensor *, const DLTensor *, const DLTensor *, const DLTensor *,
                                        const DLTensor *, int64_t, int64_t, const DLTensor *, DLTensor *, DLTensor *,
                                        const ks_attention_options *, ks_stream_t);
  ks_status_t (*mla_decode)(const DLTensor *, const DLTensor *, const DLTensor *, const DLTensor *, const DLTensor *,
                            int64_t, const DLTensor *, DLTensor *, DLTensor *, const ks_mla_options *,
                            ks_stream_t); /* ABI 1.1 */
} ks_api_t;

/* Fills *table with the newest table of ABI `major` whose minor >= min_minor. */
KS_API ks_status_t ks_get_api(int32_t major, int32_t min_minor, const ks_api_t **table);
/* END GENERATED: declarations */

#endif /* KERNELSET_H_ */
