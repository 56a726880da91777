"""The C ABI of libkernelset, declared once: every exported op (its tensors, scalars and option
struct), the option structs with their defaults, the enumerated option values, the status codes
and the library functions. ``python capi/abi/generate.py`` writes from this the header's
declarations (capi/include/kernelset.h), the C tables of the core (capi/src/core/ops_table.c:
option layouts and defaults, ks_query_support's dispatch, the ks_api_t table) and the bindings'
per-op surface (ctypes, Rust, Go, TypeScript); capi/abi/check_abi.py then holds the header to the
frozen layout of capi/abi/abi-<major>.json.

Within a major version: ops, fields and functions are only appended (fields at the end of their
struct, ops with the next id, functions at the end of the table), each marked with the minor that
added it (``since``), and ABI_MINOR is raised; ``python capi/abi/generate.py`` then freezes the new
layout and refuses any change to what was frozen.

Exporting an op (capi/bindings/README.md): its declaration here, its C glue in
capi/src/ops/<family>.c (``ks_<name>`` and ``ks_query_<name>``), its golden cases in
capi/golden/make_golden.py; then ``python capi/abi/generate.py`` and ``python capi/golden/make_golden.py``.
"""
from __future__ import annotations

from .schema import EnumGroup, Field, Function, In, InOut, OptionStruct, Out, Raw, Scalar, Status, op

ABI_MAJOR, ABI_MINOR = 1, 1

STATUSES = (
    Status("KS_OK", 0),
    Status("KS_ERR_INVALID_ARGUMENT", 1, "null pointer, negative or mismatched dim, bad option value"),
    Status("KS_ERR_UNSUPPORTED_DTYPE", 2),
    Status("KS_ERR_UNSUPPORTED_SHAPE", 3, "valid, but not a shape this op/build handles (e.g. head dim)"),
    Status("KS_ERR_UNSUPPORTED_LAYOUT", 4, "strides the op cannot honour"),
    Status("KS_ERR_UNSUPPORTED_DEVICE", 5, "device type this build cannot run on, or tensors on different devices"),
    Status("KS_ERR_UNSUPPORTED_ARCH", 6, "a CUDA GPU with no kernel in this build for its architecture"),
    Status("KS_ERR_CUDA", 7, "CUDA driver missing or a driver call failed"),
    Status("KS_ERR_OUT_OF_MEMORY", 8),
    Status("KS_ERR_NOT_IMPLEMENTED", 9, "declared op/variant not available in this build"),
    Status("KS_ERR_VERSION", 10, "ks_get_api: no compatible table"),
    Status("KS_ERR_INTERNAL", 11),
)

# ---- enumerated option values

NORM_CAST = EnumGroup("KS_NORM_CAST", (("LLAMA", 0), ("GEMMA", 1)), "NORM_CAST",
                      "where rms_norm rounds (see ks.NormCast)")
GELU = EnumGroup("KS_GELU", (("NONE", 0), ("TANH", 1)), "GELU_APPROX", "gelu approximation")
REDUCTION = EnumGroup("KS_REDUCTION", (("NONE", 0), ("MEAN", 1), ("SUM", 2)), "REDUCTION")
ENUMS = (NORM_CAST, GELU, REDUCTION)

# ---- option structs (a leading `size_t size` is implied)

RMS_NORM_OPTIONS = OptionStruct("ks_rms_norm_options", (
    Field("eps", "float", 1e-6, "default 1e-6"),
    Field("offset", "float", 0.0, "default 0; 1 for Gemma's (1 + w)"),
    Field("cast", "int32_t", 0, "KS_NORM_CAST_*, default LLAMA", enum=NORM_CAST),
))
LAYER_NORM_OPTIONS = OptionStruct("ks_layer_norm_options", (
    Field("eps", "float", 1e-5, "default 1e-5"),
))
GELU_OPTIONS = OptionStruct("ks_gelu_options", (
    Field("approximate", "int32_t", 0, "KS_GELU_*, default NONE", enum=GELU),
))
SWIGLU_OAI_OPTIONS = OptionStruct("ks_swiglu_oai_options", (
    Field("alpha", "float", 1.702, "default 1.702"),
    Field("limit", "float", 7.0, "default 7.0"),
))
SOFTMAX_OPTIONS = OptionStruct("ks_softmax_options", (
    Field("temperature", "float", 1.0, "default 1.0; y = softmax(x / temperature) over the last dim"),
))
CROSS_ENTROPY_OPTIONS = OptionStruct("ks_cross_entropy_options", (
    Field("ignore_index", "int64_t", -100,
          "default -100; int32 range on CUDA (KS_ERR_UNSUPPORTED_SHAPE beyond)"),
    Field("label_smoothing", "float", 0.0, "default 0"),
    Field("z_loss", "float", 0.0, "default 0"),
    Field("softcap", "float", 0.0, "default 0 = none"),
    Field("reduction", "int32_t", 1, "KS_REDUCTION_*, default MEAN", enum=REDUCTION),
))
ROPE_OPTIONS = OptionStruct("ks_rope_options", (
    Field("interleaved", "int32_t", 0, "0: NeoX halves (default), 1: GPT-J interleaved pairs"),
    Field("rotary_dim", "int32_t", 0, "0 = the cache's width (default)"),
    Field("head_size", "int32_t", 0, "0 = inferred from q (default)"),
))
MROPE_OPTIONS = OptionStruct("ks_mrope_options", (
    Field("interleaved", "int32_t", 0),
    Field("rotary_dim", "int32_t", 0),
    Field("head_size", "int32_t", 0),
    Field("mrope_section", "int32_t[3]", (0, 0, 0), "t, h, w sections (pairs); required"),
    Field("mrope_interleaved", "int32_t", 0, "0: sections contiguous (Qwen2-VL), 1: interleaved (Qwen3-VL)"),
))
QK_NORM_ROPE_OPTIONS = OptionStruct("ks_qk_norm_rope_options", (
    Field("eps", "float", 1e-6, "default 1e-6"),
    Field("offset", "float", 0.0, "default 0"),
    Field("cast", "int32_t", 0, "KS_NORM_CAST_*, default LLAMA", enum=NORM_CAST),
    Field("interleaved", "int32_t", 0),
    Field("rotary_dim", "int32_t", 0),
    Field("head_size", "int32_t", 0),
    Field("mrope_section", "int32_t[3]", (0, 0, 0), "all 0 (default): plain RoPE with positions [T]"),
    Field("mrope_interleaved", "int32_t", 0),
))
ATTENTION_OPTIONS = OptionStruct("ks_attention_options", (
    Field("scale", "float", 0.0, "0 = 1/sqrt(D) (default)"),
    Field("causal", "int32_t", 0, "default 1 for paged, 0 for flash"),
    Field("window_left", "int32_t", -1, "-1 = unbounded (default)"),
    Field("window_right", "int32_t", -1, "-1 = unbounded (default)"),
    Field("softcap", "float", 0.0, "0 = none (default)"),
))
MLA_OPTIONS = OptionStruct("ks_mla_options", (  # defaults: kernelset.ops.mla.api.mla_decode's; scale has none
    Field("scale", "double", 0.0, "required, > 0 (0, the default, is refused): DeepSeek's softmax scale"),
    Field("kv_lora_rank", "int32_t", 512, "default 512; must equal q_nope's last dim"),
    Field("rope_dim", "int32_t", 64, "default 64; must equal q_pe's last dim"),
), since=(1, 1))
OPTION_STRUCTS = (RMS_NORM_OPTIONS, LAYER_NORM_OPTIONS, GELU_OPTIONS, SWIGLU_OAI_OPTIONS, SOFTMAX_OPTIONS,
                  CROSS_ENTROPY_OPTIONS, ROPE_OPTIONS, MROPE_OPTIONS, QK_NORM_ROPE_OPTIONS, ATTENTION_OPTIONS,
                  MLA_OPTIONS)

# ---- library functions (before the ops in ks_api_t; ks_abi_version and ks_get_api are not in it)

LIBRARY = (
    Function("last_error", (), ret="const char *", trailing="this thread's last error message; \"\" if none"),
    Function("status_name", (Raw("s", "ks_status_t"),), ret="const char *",
             trailing="\"KS_ERR_INVALID_ARGUMENT\" ..."),
    Function("build_info", (), ret="const char *",
             trailing="\"kernelset 0.1.0; abi 1.1; cuda: sm_80 sm_89 sm_90 +ptx\""),
    Function("abi_version", (Raw("major", "int32_t *", out_value=True), Raw("minor", "int32_t *", out_value=True)),
             ret="void", table=False),
    Function("options_init", (Raw("op", "ks_op_t"), Raw("options", "void *"), Raw("size", "size_t")),
             trailing="sets size and defaults"),
    Function("query_support", (Raw("op", "ks_op_t"), Raw("tensors", "const DLTensor *const *"),
                               Raw("num_tensors", "int32_t"), Raw("options", "const void *")),
             comment="Whether `op` can run on these tensors and options, without running it. tensors[] holds the\n"
                     "op's tensor arguments in signature order (NULL where an optional one is absent); only their\n"
                     "metadata is read (data may be NULL). Returns KS_OK or the status the call would return, with\n"
                     "the reason in ks_last_error()."),
)
GET_API = Function("get_api", (Raw("major", "int32_t"), Raw("min_minor", "int32_t"),
                               Raw("table", "const ks_api_t **", out_value=True)),
                   table=False, comment="Fills *table with the newest table of ABI `major` whose minor >= min_minor.")

# ---- the ops, in ks_api_t order (ids never change; new ones take the next id)

_PAGED_CACHE = ("Paged KV cache: caches [num_blocks, block_size, Hkv, D], fp16/bf16 or fp8 e4m3fn.\n"
                "key/value [T, Hkv, D]; slot_mapping [T] int32/int64, -1 skips a token. k_scale/v_scale:\n"
                "float32 scalars (0-d or [1]) for fp8 caches, else NULL.")
_ATTENTION = ("Attention. LSE outputs are float32 natural-log softmax denominators; sinks are [Hq] float32.\n"
              "paged: q [B, Hq, D] (decode; cu_seqlens_q NULL) or [T, Hq, D] with cu_seqlens_q [B+1] int32;\n"
              "block_table [B, max_blocks] int32; seq_lens [B] int32; out like q; lse [T, Hq] or NULL;\n"
              "sinks [Hq] float32 or NULL. max_seq_len bounds seq_lens (0 = the block table's capacity).\n"
              "workspace: a uint8 CUDA tensor of ks_paged_attention_workspace_size() bytes enables split-KV\n"
              "(flash-decoding) for long sequences; NULL runs one pass per sequence. Graph-capturable.")
_MLA = ("MLA decode (DeepSeek-V2/V3 multi-head latent attention, weight-absorbed; ABI 1.1).\n"
        "s_j = scale (q_nope . c_j + q_pe . k_pe_j), out = softmax(s) C per sequence and head, fp32\n"
        "accumulation. q_nope [B, H, R] (R = kv_lora_rank), q_pe [B, H, P] (P = rope_dim), float32/16 or\n"
        "bfloat16, unit-stride last dims; kv_cache [num_blocks, block_size, R + P] (each token's latent c,\n"
        "then its rotary key) in q's dtype, or float8_e4m3fn with kv_scale (a float32 scalar; NULL for\n"
        "other caches); block_table [B, max_blocks] int32; seq_lens [B] int32; max_seq_len bounds\n"
        "seq_lens (0 = the block table's capacity). out [B, H, R] like q_nope (latent space: apply W_UV\n"
        "after); lse [B, H] float32 or NULL. A sequence of length 0 gets out 0 and lse -inf. On CUDA\n"
        "the split-KV partials live in library scratch (capi/aot/README.md): the buffer of the call's\n"
        "(context, stream) when eager; under CUDA-graph capture, memory the graph allocates and frees\n"
        "itself (stream-ordered), so a captured call needs no warm-up and replays on any stream.")

OPS = (
    op("rms_norm", 1, In("x"), In("weight", optional=True), Out("out"), options=RMS_NORM_OPTIONS,
       section="Norms. x [..., H]; weight [H] or NULL; out like x.",
       doc="y = x * rsqrt(mean(x^2) + eps) * (offset + weight) over the last dim; x [..., H], out like x."),
    op("fused_add_rms_norm", 2, In("x"), InOut("residual"), In("weight", optional=True), Out("out"),
       options=RMS_NORM_OPTIONS,
       comment="h = x + residual is written into residual, out = rms_norm(h). out may alias x (in place).",
       doc="h = x + residual (written into residual), out = rms_norm(h); out may be x (in place)."),
    op("layer_norm", 3, In("x"), In("weight", optional=True), In("bias", optional=True), Out("out"),
       options=LAYER_NORM_OPTIONS, doc="y = (x - mean) * rsqrt(var + eps) * weight + bias over the last dim."),
    op("silu_and_mul", 4, In("x"), Out("out"),
       section="Activations. x [..., 2I] -> out [..., I] (gate first half, up second half).",
       doc="x [..., 2I] -> out [..., I] = silu(gate) * up."),
    op("gelu_and_mul", 5, In("x"), Out("out"), options=GELU_OPTIONS,
       doc="x [..., 2I] -> out [..., I] = gelu(gate) * up."),
    op("swiglu", 6, In("gate"), In("up"), Out("out"), doc="out = silu(gate) * up."),
    op("gelu", 7, In("x"), Out("out"), options=GELU_OPTIONS, doc="out = gelu(x) elementwise (erf, or tanh)."),
    op("swiglu_oai", 8, In("x"), Out("out"), options=SWIGLU_OAI_OPTIONS,
       comment="gpt-oss: x [..., 2I] interleaved (gate, up) pairs -> out [..., I].",
       doc="gpt-oss: x [..., 2I] interleaved (gate, up) pairs -> out [..., I]."),
    op("softmax", 9, In("x"), Out("out"), options=SOFTMAX_OPTIONS,
       section="Softmax over the last dim. out like x (float32, float16 or bfloat16).",
       doc="out = softmax(x / temperature) over the last dim."),
    op("log_softmax", 10, In("x"), Out("out"), options=SOFTMAX_OPTIONS,
       doc="out = log_softmax(x / temperature) over the last dim."),
    op("cross_entropy", 11, In("logits"), In("target"), Out("loss"), options=CROSS_ENTROPY_OPTIONS,
       section="Loss (forward). logits [T, V], target [T] int32/int64; loss float32: [T] with\n"
               "KS_REDUCTION_NONE, else a 0-d (or [1]) tensor. A target outside [0, V) that is not ignore_index\n"
               "gives KS_ERR_INVALID_ARGUMENT on CPU (nothing written); on CUDA its row's loss is NaN (no read\n"
               "outside logits).",
       doc="logits [T, V], target [T] int32/int64 -> loss float32 ([T], or 0-d when reduced)."),
    op("embedding", 12, In("ids"), In("weight"), Out("out"),
       section="Embedding (forward). ids [...] int32/int64, weight [V, H], out [..., H]. Out-of-range ids\n"
               "give KS_ERR_INVALID_ARGUMENT on CPU; on CUDA their rows are NaN (no read outside weight).",
       doc="ids [...] int32/int64, weight [V, H] -> out [..., H]."),
    op("rotary_embedding", 13, In("positions"), InOut("q"), InOut("k", optional=True), In("cos_sin_cache"),
       options=ROPE_OPTIONS,
       section="RoPE, in place on q [T, Hq*D] or [T, Hq, D] and k (same, or NULL). positions [T]\n"
               "int32/int64 (mrope: [3, T]); cos_sin_cache [max_pos, rotary_dim] (cos half, then sin half).\n"
               "A position outside [0, max_pos) leaves its token unrotated (as the Python package does).",
       doc="RoPE in place on q and k (optional) at positions [T]."),
    op("mrope", 14, In("positions"), InOut("q"), InOut("k", optional=True), In("cos_sin_cache"),
       options=MROPE_OPTIONS, doc="Multimodal RoPE (positions [3, T]) in place on q and k (optional)."),
    op("qk_norm_rope", 15, InOut("q"), InOut("k", optional=True), In("q_weight"), In("k_weight", optional=True),
       In("cos_sin_cache"), In("positions"), options=QK_NORM_ROPE_OPTIONS,
       comment="Per-head RMSNorm of q and k (weights [D]) then RoPE, in place.",
       doc="Per-head RMSNorm of q and k (weights [D]) then RoPE, in place."),
    op("reshape_and_cache", 16, In("key"), In("value"), InOut("k_cache"), InOut("v_cache"), In("slot_mapping"),
       In("k_scale", optional=True), In("v_scale", optional=True), section=_PAGED_CACHE,
       doc="Writes key/value [T, Hkv, D] into the paged caches at slot_mapping [T] (-1 skips)."),
    op("copy_blocks", 17, Raw("k_caches", "DLTensor *const *"), Raw("v_caches", "DLTensor *const *"),
       Raw("num_layers", "int32_t"), In("block_mapping"),
       comment="block_mapping [N, 2] int64 (src, dst) pairs; copies both caches of each of num_layers layers. "
               "The pairs\n"
               "run in parallel: a destination may be neither another pair's source nor repeated (a block copied\n"
               "onto itself is fine).",
       doc="cache[dst] = cache[src] for each (src, dst) row of block_mapping [N, 2] int64, in every layer.",
       bind=frozenset()),
    Function("paged_attention_workspace_size",
             (In("q"), In("k_cache"), Scalar("max_seq_len"), Raw("bytes", "size_t *", out_value=True)),
             section=_ATTENTION, doc="Bytes of the split-KV workspace paged_attention can use for these shapes.",
             bind=frozenset()),
    op("paged_attention", 18, In("q"), In("k_cache"), In("v_cache"), In("block_table"), In("seq_lens"),
       In("cu_seqlens_q", optional=True), Scalar("max_seqlen_q"), Scalar("max_seq_len"), In("sinks", optional=True),
       In("k_scale", optional=True), In("v_scale", optional=True), Out("out"), Out("lse", optional=True),
       Out("workspace", optional=True), options=ATTENTION_OPTIONS, defaults={"causal": 1},
       doc="Attention of q [B or T, Hq, D] to the paged caches; out like q, lse [T, Hq] (optional).",
       bind=frozenset({"node"})),
    op("merge_attn_states", 19, In("out_a"), In("lse_a"), In("out_b"), In("lse_b"), Out("out"),
       Out("lse", optional=True),
       comment="out_a/out_b [T, H, D], lse_a/lse_b [T, H] float32 -> out, lse (lse may be NULL).",
       doc="Attention over the union of two key sets from its parts: out [T, H, D], lse [T, H] (optional)."),
    op("flash_attention", 20, In("q"), In("k"), In("v"), In("sinks", optional=True), Out("out"),
       Out("lse", optional=True), options=ATTENTION_OPTIONS,
       comment="dense: q [B, S, Hq, D], k/v [B, Sk, Hkv, D(v)]; out [B, S, Hq, Dv]; lse [B, Hq, S] or NULL.",
       doc="Dense attention: q [B, S, Hq, D], k/v [B, Sk, Hkv, D(v)] -> out [B, S, Hq, Dv], lse [B, Hq, S]."),
    op("flash_attention_varlen", 21, In("q"), In("k"), In("v"), In("cu_seqlens_q"), In("cu_seqlens_k"),
       Scalar("max_seqlen_q"), Scalar("max_seqlen_k"), In("sinks", optional=True), Out("out"),
       Out("lse", optional=True), options=ATTENTION_OPTIONS,
       comment="varlen: q [T, Hq, D], k/v [Tk, Hkv, D(v)], cu_seqlens_q/k [B+1] int32; lse [Hq, T] or NULL.",
       doc="Packed sequences: q [T, Hq, D], k/v [Tk, Hkv, D(v)], cu_seqlens [B+1] int32 -> out, lse [Hq, T]."),
    op("mla_decode", 22, In("q_nope"), In("q_pe"), In("kv_cache"), In("block_table"), In("seq_lens"),
       Scalar("max_seq_len"), In("kv_scale", optional=True), Out("out"), Out("lse", optional=True),
       options=MLA_OPTIONS, section=_MLA, since=(1, 1),
       doc="MLA decode (DeepSeek-V2/V3, weight-absorbed) over a paged latent cache: q_nope [B, H, R], "
           "q_pe [B, H, P], kv_cache [num_blocks, block_size, R + P] (fp8 e4m3fn with kv_scale) -> out [B, H, R], "
           "lse [B, H] (optional); the options must carry the scale (the defaults have none)."),
)
