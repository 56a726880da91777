'use strict';
// kernelset for Node: libkernelset's C ABI (capi/include/kernelset.h) through koffi.
//
// The library is opened once and its function table taken from ks_get_api(1, 0), the one entry
// point a dynamic loader needs; ops are called through the table. Tensors are views over
// TypedArrays (passed to C without copies) or raw device pointers. Every op throws a KsError
// (status, statusName, message naming the argument) on failure.
//
// The constants, koffi structs, C prototypes and op functions between "BEGIN GENERATED" and "END
// GENERATED" are generated from the ABI's declaration (capi/abi/ksabi/ops.py) by
// capi/abi/generate.py; capi/abi/check_abi.py parses them and fails CI if any differs from the header.

const path = require('node:path');
const koffi = require('koffi');

// BEGIN GENERATED: constants (capi/abi/generate.py, from capi/abi/ksabi/ops.py; do not edit)
const ABI_MAJOR = 1;
const ABI_MINOR = 1;

// ---- constants (kernelset.h)
const STATUS = {
  KS_OK: 0,
  KS_ERR_INVALID_ARGUMENT: 1,
  KS_ERR_UNSUPPORTED_DTYPE: 2,
  KS_ERR_UNSUPPORTED_SHAPE: 3,
  KS_ERR_UNSUPPORTED_LAYOUT: 4,
  KS_ERR_UNSUPPORTED_DEVICE: 5,
  KS_ERR_UNSUPPORTED_ARCH: 6,
  KS_ERR_CUDA: 7,
  KS_ERR_OUT_OF_MEMORY: 8,
  KS_ERR_NOT_IMPLEMENTED: 9,
  KS_ERR_VERSION: 10,
  KS_ERR_INTERNAL: 11,
};

const OPS = {
  KS_OP_RMS_NORM: 1,
  KS_OP_FUSED_ADD_RMS_NORM: 2,
  KS_OP_LAYER_NORM: 3,
  KS_OP_SILU_AND_MUL: 4,
  KS_OP_GELU_AND_MUL: 5,
  KS_OP_SWIGLU: 6,
  KS_OP_GELU: 7,
  KS_OP_SWIGLU_OAI: 8,
  KS_OP_SOFTMAX: 9,
  KS_OP_LOG_SOFTMAX: 10,
  KS_OP_CROSS_ENTROPY: 11,
  KS_OP_EMBEDDING: 12,
  KS_OP_ROTARY_EMBEDDING: 13,
  KS_OP_MROPE: 14,
  KS_OP_QK_NORM_ROPE: 15,
  KS_OP_RESHAPE_AND_CACHE: 16,
  KS_OP_COPY_BLOCKS: 17,
  KS_OP_PAGED_ATTENTION: 18,
  KS_OP_MERGE_ATTN_STATES: 19,
  KS_OP_FLASH_ATTENTION: 20,
  KS_OP_FLASH_ATTENTION_VARLEN: 21,
  KS_OP_MLA_DECODE: 22,
};

const OPTION_VALUES = {
  KS_NORM_CAST_LLAMA: 0,
  KS_NORM_CAST_GEMMA: 1,
  KS_GELU_NONE: 0,
  KS_GELU_TANH: 1,
  KS_REDUCTION_NONE: 0,
  KS_REDUCTION_MEAN: 1,
  KS_REDUCTION_SUM: 2,
};
// END GENERATED: constants

const DL = {
  kDLCPU: 1,
  kDLCUDA: 2,
  kDLCUDAHost: 3,
  kDLInt: 0,
  kDLUInt: 1,
  kDLFloat: 2,
  kDLOpaqueHandle: 3,
  kDLBfloat: 4,
  kDLComplex: 5,
  kDLBool: 6,
  kDLFloat8_e4m3fn: 10,
  kDLFloat8_e5m2: 12,
};

// ---- types
koffi.alias('ks_status_t', 'int32_t');
koffi.alias('ks_op_t', 'int32_t');
koffi.alias('ks_stream_t', 'void *');

const DLDevice = koffi.struct('DLDevice', { device_type: 'int32_t', device_id: 'int32_t' });
const DLDataType = koffi.struct('DLDataType', { code: 'uint8_t', bits: 'uint8_t', lanes: 'uint16_t' });
const DLTensor = koffi.struct('DLTensor', {
  data: 'void *',
  device: DLDevice,
  ndim: 'int32_t',
  dtype: DLDataType,
  shape: 'int64_t *',
  strides: 'int64_t *',
  byte_offset: 'uint64_t',
});

// BEGIN GENERATED: option types (capi/abi/generate.py, from capi/abi/ksabi/ops.py; do not edit)
const OPTION_TYPES = {
  ks_rms_norm_options: koffi.struct('ks_rms_norm_options', {
    size: 'size_t', eps: 'float', offset: 'float', cast: 'int32_t',
  }),
  ks_layer_norm_options: koffi.struct('ks_layer_norm_options', { size: 'size_t', eps: 'float' }),
  ks_gelu_options: koffi.struct('ks_gelu_options', { size: 'size_t', approximate: 'int32_t' }),
  ks_swiglu_oai_options: koffi.struct('ks_swiglu_oai_options', { size: 'size_t', alpha: 'float', limit: 'float' }),
  ks_softmax_options: koffi.struct('ks_softmax_options', { size: 'size_t', temperature: 'float' }),
  ks_cross_entropy_options: koffi.struct('ks_cross_entropy_options', {
    size: 'size_t', ignore_index: 'int64_t', label_smoothing: 'float', z_loss: 'float', softcap: 'float',
    reduction: 'int32_t',
  }),
  ks_rope_options: koffi.struct('ks_rope_options', {
    size: 'size_t', interleaved: 'int32_t', rotary_dim: 'int32_t', head_size: 'int32_t',
  }),
  ks_mrope_options: koffi.struct('ks_mrope_options', {
    size: 'size_t', interleaved: 'int32_t', rotary_dim: 'int32_t', head_size: 'int32_t',
    mrope_section: koffi.array('int32_t', 3, 'Array'), mrope_interleaved: 'int32_t',
  }),
  ks_qk_norm_rope_options: koffi.struct('ks_qk_norm_rope_options', {
    size: 'size_t', eps: 'float', offset: 'float', cast: 'int32_t', interleaved: 'int32_t', rotary_dim: 'int32_t',
    head_size: 'int32_t', mrope_section: koffi.array('int32_t', 3, 'Array'), mrope_interleaved: 'int32_t',
  }),
  ks_attention_options: koffi.struct('ks_attention_options', {
    size: 'size_t', scale: 'float', causal: 'int32_t', window_left: 'int32_t', window_right: 'int32_t',
    softcap: 'float',
  }),
  ks_mla_options: koffi.struct('ks_mla_options', {
    size: 'size_t', scale: 'double', kv_lora_rank: 'int32_t', rope_dim: 'int32_t',
  }),
};
// END GENERATED: option types

// BEGIN GENERATED: functions (capi/abi/generate.py, from capi/abi/ksabi/ops.py; do not edit)
// Functions called as symbols: the table's entry point and what the table does not hold.
const DIRECT_FUNCTIONS = [
  'void ks_abi_version(_Out_ int32_t *major, _Out_ int32_t *minor)',
  'ks_status_t ks_get_api(int32_t major, int32_t min_minor, _Out_ const ks_api_t **table)',
];

// ks_api_t, field by field.
const API_FIELDS = [
  'size_t size',
  'int32_t abi_major',
  'int32_t abi_minor',
  'const char *last_error(void)',
  'const char *status_name(ks_status_t s)',
  'const char *build_info(void)',
  'ks_status_t options_init(ks_op_t op, void *options, size_t size)',
  'ks_status_t query_support(ks_op_t op, const DLTensor *const *tensors, int32_t num_tensors, const void *options)',
  'ks_status_t rms_norm(const DLTensor *x, const DLTensor *weight, DLTensor *out, const ks_rms_norm_options *options, ks_stream_t stream)',
  'ks_status_t fused_add_rms_norm(const DLTensor *x, DLTensor *residual, const DLTensor *weight, DLTensor *out, const ks_rms_norm_options *options, ks_stream_t stream)',
  'ks_status_t layer_norm(const DLTensor *x, const DLTensor *weight, const DLTensor *bias, DLTensor *out, const ks_layer_norm_options *options, ks_stream_t stream)',
  'ks_status_t silu_and_mul(const DLTensor *x, DLTensor *out, ks_stream_t stream)',
  'ks_status_t gelu_and_mul(const DLTensor *x, DLTensor *out, const ks_gelu_options *options, ks_stream_t stream)',
  'ks_status_t swiglu(const DLTensor *gate, const DLTensor *up, DLTensor *out, ks_stream_t stream)',
  'ks_status_t gelu(const DLTensor *x, DLTensor *out, const ks_gelu_options *options, ks_stream_t stream)',
  'ks_status_t swiglu_oai(const DLTensor *x, DLTensor *out, const ks_swiglu_oai_options *options, ks_stream_t stream)',
  'ks_status_t softmax(const DLTensor *x, DLTensor *out, const ks_softmax_options *options, ks_stream_t stream)',
  'ks_status_t log_softmax(const DLTensor *x, DLTensor *out, const ks_softmax_options *options, ks_stream_t stream)',
  'ks_status_t cross_entropy(const DLTensor *logits, const DLTensor *target, DLTensor *loss, const ks_cross_entropy_options *options, ks_stream_t stream)',
  'ks_status_t embedding(const DLTensor *ids, const DLTensor *weight, DLTensor *out, ks_stream_t stream)',
  'ks_status_t rotary_embedding(const DLTensor *positions, DLTensor *q, DLTensor *k, const DLTensor *cos_sin_cache, const ks_rope_options *options, ks_stream_t stream)',
  'ks_status_t mrope(const DLTensor *positions, DLTensor *q, DLTensor *k, const DLTensor *cos_sin_cache, const ks_mrope_options *options, ks_stream_t stream)',
  'ks_status_t qk_norm_rope(DLTensor *q, DLTensor *k, const DLTensor *q_weight, const DLTensor *k_weight, const DLTensor *cos_sin_cache, const DLTensor *positions, const ks_qk_norm_rope_options *options, ks_stream_t stream)',
  'ks_status_t reshape_and_cache(const DLTensor *key, const DLTensor *value, DLTensor *k_cache, DLTensor *v_cache, const DLTensor *slot_mapping, const DLTensor *k_scale, const DLTensor *v_scale, ks_stream_t stream)',
  'ks_status_t copy_blocks(DLTensor *const *k_caches, DLTensor *const *v_caches, int32_t num_layers, const DLTensor *block_mapping, ks_stream_t stream)',
  'ks_status_t paged_attention_workspace_size(const DLTensor *q, const DLTensor *k_cache, int64_t max_seq_len, _Out_ size_t *bytes)',
  'ks_status_t paged_attention(const DLTensor *q, const DLTensor *k_cache, const DLTensor *v_cache, const DLTensor *block_table, const DLTensor *seq_lens, const DLTensor *cu_seqlens_q, int64_t max_seqlen_q, int64_t max_seq_len, const DLTensor *sinks, const DLTensor *k_scale, const DLTensor *v_scale, DLTensor *out, DLTensor *lse, DLTensor *workspace, const ks_attention_options *options, ks_stream_t stream)',
  'ks_status_t merge_attn_states(const DLTensor *out_a, const DLTensor *lse_a, const DLTensor *out_b, const DLTensor *lse_b, DLTensor *out, DLTensor *lse, ks_stream_t stream)',
  'ks_status_t flash_attention(const DLTensor *q, const DLTensor *k, const DLTensor *v, const DLTensor *sinks, DLTensor *out, DLTensor *lse, const ks_attention_options *options, ks_stream_t stream)',
  'ks_status_t flash_attention_varlen(const DLTensor *q, const DLTensor *k, const DLTensor *v, const DLTensor *cu_seqlens_q, const DLTensor *cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k, const DLTensor *sinks, DLTensor *out, DLTensor *lse, const ks_attention_options *options, ks_stream_t stream)',
  'ks_status_t mla_decode(const DLTensor *q_nope, const DLTensor *q_pe, const DLTensor *kv_cache, const DLTensor *block_table, const DLTensor *seq_lens, int64_t max_seq_len, const DLTensor *kv_scale, DLTensor *out, DLTensor *lse, const ks_mla_options *options, ks_stream_t stream)',
];
// END GENERATED: functions

// field name -> koffi prototype (function fields) ; the ks_api_t struct built from API_FIELDS
const PROTOS = {};
const tableMembers = {};
for (const decl of API_FIELDS) {
  const m = /^(.+?)\b(\w+)\((.*)\)$/.exec(decl);
  if (m) {
    PROTOS[m[2]] = koffi.proto(`${m[1]}ks_api_${m[2]}_fn(${m[3]})`);
    tableMembers[m[2]] = koffi.pointer(PROTOS[m[2]]);
  } else {
    const f = /^(.+?)\s*(\w+)$/.exec(decl);
    tableMembers[f[2]] = f[1];
  }
}
const ks_api_t = koffi.struct('ks_api_t', tableMembers);

// ---- loading

class KsError extends Error {
  constructor(status, message, statusName) {
    super(`${statusName}: ${message}`);
    this.name = 'KsError';
    this.status = status;
    this.statusName = statusName;
    this.detail = message;
  }
}

/** Where libkernelset.so is: $KS_LIB_PATH, $KS_LIB_DIR, or this checkout's Python package. */
function libraryPath() {
  if (process.env.KS_LIB_PATH) return process.env.KS_LIB_PATH;
  const dir = process.env.KS_LIB_DIR || path.join(__dirname, '..', '..', '..', 'src', 'kernelset', 'capi', 'lib');
  return path.join(dir, 'libkernelset.so');
}

let state = null;

function api() {
  if (state !== null) return state;
  const lib = koffi.load(libraryPath());
  const direct = {};
  for (const decl of DIRECT_FUNCTIONS) {
    const name = /(\w+)\(/.exec(decl)[1];
    direct[name] = lib.func(decl);
  }
  const out = [null];
  const s = direct.ks_get_api(ABI_MAJOR, ABI_MINOR, out);
  if (s !== 0) {
    throw new KsError(s, `ks_get_api(${ABI_MAJOR}, ${ABI_MINOR}) failed: this binding needs ABI ${ABI_MAJOR}.${ABI_MINOR}`,
      'KS_ERR_VERSION');
  }
  const table = koffi.decode(out[0], ks_api_t);
  if (Number(table.size) < koffi.sizeof(ks_api_t)) {
    throw new KsError(STATUS.KS_ERR_VERSION, `ks_api_t of ${table.size} bytes, expected ${koffi.sizeof(ks_api_t)}`,
      'KS_ERR_VERSION');
  }
  const fns = {};
  for (const [name, proto] of Object.entries(PROTOS)) fns[name] = koffi.decode(table[name], proto);
  state = { lib, direct, table, fns };
  return state;
}

function statusName(code) {
  return api().fns.status_name(code);
}

function check(code) {
  if (code === 0) return;
  const { fns } = api();
  throw new KsError(code, fns.last_error(), fns.status_name(code));
}

// ---- tensors

const DTYPES = {
  float32: { code: DL.kDLFloat, bits: 32 },
  float16: { code: DL.kDLFloat, bits: 16 },
  bfloat16: { code: DL.kDLBfloat, bits: 16 },
  float8_e4m3fn: { code: DL.kDLFloat8_e4m3fn, bits: 8 },
  int32: { code: DL.kDLInt, bits: 32 },
  int64: { code: DL.kDLInt, bits: 64 },
  uint8: { code: DL.kDLUInt, bits: 8 },
};

function defaultDtype(data) {
  if (data instanceof Float32Array) return 'float32';
  if (data instanceof Int32Array) return 'int32';
  if (data instanceof BigInt64Array) return 'int64';
  if (data instanceof Uint8Array) return 'uint8';
  return null;
}

function invalid(message) {
  return new KsError(STATUS.KS_ERR_INVALID_ARGUMENT, message, 'KS_ERR_INVALID_ARGUMENT');
}

function compactStrides(shape) {
  const s = new Array(shape.length).fill(1);
  for (let i = shape.length - 2; i >= 0; i--) s[i] = s[i + 1] * Math.max(shape[i + 1], 1);
  return s;
}

/** A tensor view: a TypedArray (CPU, no copy) or a raw pointer (bigint/number, any device). */
class Tensor {
  constructor(data, shape, { dtype, strides = null, device = 'cpu', deviceId = 0 } = {}) {
    if (!Array.isArray(shape) || shape.some((d) => !Number.isInteger(d) || d < 0)) {
      throw invalid(`shape ${JSON.stringify(shape)}: expected non-negative integers`);
    }
    const raw = typeof data === 'bigint' || typeof data === 'number';
    dtype = dtype || (raw ? null : defaultDtype(data));
    if (!DTYPES[dtype]) {
      throw invalid(`dtype ${dtype}: expected one of ${Object.keys(DTYPES).join(', ')} (Uint16Array storage needs ` +
        'float16 or bfloat16)');
    }
    if (strides !== null && (!Array.isArray(strides) || strides.length !== shape.length ||
        strides.some((s) => !Number.isInteger(s)))) {
      throw invalid(`strides ${JSON.stringify(strides)} for shape ${JSON.stringify(shape)}`);
    }
    if (device !== 'cpu' && device !== 'cuda') throw invalid(`device ${device}: expected 'cpu' or 'cuda'`);
    const size = DTYPES[dtype].bits / 8;
    if (!raw) {
      if (!ArrayBuffer.isView(data)) throw invalid('data: expected a TypedArray, Buffer or a pointer');
      if (data.byteOffset % size) throw invalid(`data: byte offset ${data.byteOffset} is not a multiple of ${size}`);
      const st = strides || compactStrides(shape);
      let last = 0;
      if (shape.every((d) => d > 0)) {
        for (let i = 0; i < shape.length; i++) {
          if (st[i] < 0) throw invalid(`strides ${JSON.stringify(strides)}: negative strides need a raw pointer`);
          last += (shape[i] - 1) * st[i];
        }
        if ((last + 1) * size > data.byteLength) {
          throw invalid(`a ${dtype} tensor of shape ${JSON.stringify(shape)}` +
            `${strides ? ` strides ${JSON.stringify(strides)}` : ''} needs ${(last + 1) * size} bytes, ` +
            `the array has ${data.byteLength}`);
        }
      }
    }
    this.data = data;
    this.dtype = dtype;
    this.shape = shape.slice();
    this.strides = strides ? strides.slice() : null;
    this.device = device;
    this.deviceId = deviceId;
    this._dl = {
      data,
      device: { device_type: device === 'cuda' ? DL.kDLCUDA : DL.kDLCPU, device_id: deviceId },
      ndim: shape.length,
      dtype: { code: DTYPES[dtype].code, bits: DTYPES[dtype].bits, lanes: 1 },
      shape: BigInt64Array.from(shape, BigInt),
      strides: strides ? BigInt64Array.from(strides, BigInt) : null,
      byte_offset: 0,
    };
  }
}

function tensor(data, shape, opts) {
  return new Tensor(data, shape, opts);
}

function dl(t, name) {
  if (t === null || t === undefined) return null;
  if (!(t instanceof Tensor)) throw invalid(`${name}: expected a kernelset Tensor or null`);
  return t._dl;
}

// ---- options

// BEGIN GENERATED: options of (capi/abi/generate.py, from capi/abi/ksabi/ops.py; do not edit)
const OPTIONS_OF = {
  rms_norm: 'ks_rms_norm_options',
  fused_add_rms_norm: 'ks_rms_norm_options',
  layer_norm: 'ks_layer_norm_options',
  gelu_and_mul: 'ks_gelu_options',
  gelu: 'ks_gelu_options',
  swiglu_oai: 'ks_swiglu_oai_options',
  softmax: 'ks_softmax_options',
  log_softmax: 'ks_softmax_options',
  cross_entropy: 'ks_cross_entropy_options',
  rotary_embedding: 'ks_rope_options',
  mrope: 'ks_mrope_options',
  qk_norm_rope: 'ks_qk_norm_rope_options',
  paged_attention: 'ks_attention_options',
  flash_attention: 'ks_attention_options',
  flash_attention_varlen: 'ks_attention_options',
  mla_decode: 'ks_mla_options',
};
// END GENERATED: options of

const OP_IDS = {};
for (const [k, v] of Object.entries(OPS)) OP_IDS[k.slice('KS_OP_'.length).toLowerCase()] = v;

/** The library's defaults for op ("rms_norm"), as an object of the option struct's fields. */
function defaultOptions(op) {
  const type = OPTION_TYPES[OPTIONS_OF[op]];
  if (!type) throw invalid(`op: ${op} takes no options`);
  const buf = Buffer.alloc(koffi.sizeof(type));
  check(api().fns.options_init(OP_IDS[op], buf, buf.length));
  return koffi.decode(buf, type);
}

/** null/undefined -> NULL (defaults); else the defaults with the given fields set. */
function options(op, given) {
  if (given === null || given === undefined) return null;
  const o = defaultOptions(op);
  for (const [k, v] of Object.entries(given)) {
    if (k === 'size' || !(k in o)) {
      throw invalid(`options.${k}: ${op} takes ${Object.keys(o).filter((f) => f !== 'size').join(', ')}`);
    }
    o[k] = v;
  }
  return o;
}

function optionsBuffer(op, given) {
  const o = options(op, given);
  if (o === null) return null;
  const type = OPTION_TYPES[OPTIONS_OF[op]];
  const buf = Buffer.alloc(koffi.sizeof(type));
  koffi.encode(buf, type, o);
  return buf;
}

// ---- library

function lastError() {
  return api().fns.last_error();
}

function buildInfo() {
  return api().fns.build_info();
}

function abiVersion() {
  const major = [0];
  const minor = [0];
  api().direct.ks_abi_version(major, minor);
  return { major: major[0], minor: minor[0] };
}

/** ks_get_api(major, minMinor): the table's size and version (throws KsError KS_ERR_VERSION). */
function getApi(major, minMinor) {
  const out = [null];
  check(api().direct.ks_get_api(major, minMinor, out));
  const t = koffi.decode(out[0], ks_api_t);
  return { size: Number(t.size), abiMajor: t.abi_major, abiMinor: t.abi_minor };
}

/** Whether op can run on these tensors (signature order, null for absent) and options. */
function querySupport(op, tensors, opts) {
  if (!(op in OP_IDS)) throw invalid(`op: unknown op ${op}`);
  const list = tensors.map((t, i) => dl(t, `tensors[${i}]`));
  const o = op in OPTIONS_OF ? optionsBuffer(op, opts) : null;
  check(api().fns.query_support(OP_IDS[op], list, list.length, o));
}

// ---- ops (tensor arguments in the C signature's order; null for an absent optional one)

const f = () => api().fns;

// BEGIN GENERATED: ops (capi/abi/generate.py, from capi/abi/ksabi/ops.py; do not edit)
/** y = x * rsqrt(mean(x^2) + eps) * (offset + weight) over the last dim; x [..., H], out like x. */
function rmsNorm(x, weight, out, opts = null, stream = null) {
  check(f().rms_norm(dl(x, 'x'), dl(weight, 'weight'), dl(out, 'out'), options('rms_norm', opts), stream));
}

/** h = x + residual (written into residual), out = rms_norm(h); out may be x (in place). */
function fusedAddRmsNorm(x, residual, weight, out, opts = null, stream = null) {
  check(f().fused_add_rms_norm(dl(x, 'x'), dl(residual, 'residual'), dl(weight, 'weight'), dl(out, 'out'),
    options('fused_add_rms_norm', opts), stream));
}

/** y = (x - mean) * rsqrt(var + eps) * weight + bias over the last dim. */
function layerNorm(x, weight, bias, out, opts = null, stream = null) {
  check(f().layer_norm(dl(x, 'x'), dl(weight, 'weight'), dl(bias, 'bias'), dl(out, 'out'), options('layer_norm', opts),
    stream));
}

/** x [..., 2I] -> out [..., I] = silu(gate) * up. */
function siluAndMul(x, out, stream = null) {
  check(f().silu_and_mul(dl(x, 'x'), dl(out, 'out'), stream));
}

/** x [..., 2I] -> out [..., I] = gelu(gate) * up. */
function geluAndMul(x, out, opts = null, stream = null) {
  check(f().gelu_and_mul(dl(x, 'x'), dl(out, 'out'), options('gelu_and_mul', opts), stream));
}

/** out = silu(gate) * up. */
function swiglu(gate, up, out, stream = null) {
  check(f().swiglu(dl(gate, 'gate'), dl(up, 'up'), dl(out, 'out'), stream));
}

/** out = gelu(x) elementwise (erf, or tanh). */
function gelu(x, out, opts = null, stream = null) {
  check(f().gelu(dl(x, 'x'), dl(out, 'out'), options('gelu', opts), stream));
}

/** gpt-oss: x [..., 2I] interleaved (gate, up) pairs -> out [..., I]. */
function swigluOai(x, out, opts = null, stream = null) {
  check(f().swiglu_oai(dl(x, 'x'), dl(out, 'out'), options('swiglu_oai', opts), stream));
}

/** out = softmax(x / temperature) over the last dim. */
function softmax(x, out, opts = null, stream = null) {
  check(f().softmax(dl(x, 'x'), dl(out, 'out'), options('softmax', opts), stream));
}

/** out = log_softmax(x / temperature) over the last dim. */
function logSoftmax(x, out, opts = null, stream = null) {
  check(f().log_softmax(dl(x, 'x'), dl(out, 'out'), options('log_softmax', opts), stream));
}

/** logits [T, V], target [T] int32/int64 -> loss float32 ([T], or 0-d when reduced). */
function crossEntropy(logits, target, loss, opts = null, stream = null) {
  check(f().cross_entropy(dl(logits, 'logits'), dl(target, 'target'), dl(loss, 'loss'), options('cross_entropy', opts),
    stream));
}

/** ids [...] int32/int64, weight [V, H] -> out [..., H]. */
function embedding(ids, weight, out, stream = null) {
  check(f().embedding(dl(ids, 'ids'), dl(weight, 'weight'), dl(out, 'out'), stream));
}

/** RoPE in place on q and k (optional) at positions [T]. */
function rotaryEmbedding(positions, q, k, cosSinCache, opts = null, stream = null) {
  check(f().rotary_embedding(dl(positions, 'positions'), dl(q, 'q'), dl(k, 'k'), dl(cosSinCache, 'cos_sin_cache'),
    options('rotary_embedding', opts), stream));
}

/** Multimodal RoPE (positions [3, T]) in place on q and k (optional). */
function mrope(positions, q, k, cosSinCache, opts = null, stream = null) {
  check(f().mrope(dl(positions, 'positions'), dl(q, 'q'), dl(k, 'k'), dl(cosSinCache, 'cos_sin_cache'),
    options('mrope', opts), stream));
}

/** Per-head RMSNorm of q and k (weights [D]) then RoPE, in place. */
function qkNormRope(q, k, qWeight, kWeight, cosSinCache, positions, opts = null, stream = null) {
  check(f().qk_norm_rope(dl(q, 'q'), dl(k, 'k'), dl(qWeight, 'q_weight'), dl(kWeight, 'k_weight'),
    dl(cosSinCache, 'cos_sin_cache'), dl(positions, 'positions'), options('qk_norm_rope', opts), stream));
}

/** Writes key/value [T, Hkv, D] into the paged caches at slot_mapping [T] (-1 skips). */
function reshapeAndCache(key, value, kCache, vCache, slotMapping, kScale = null, vScale = null, stream = null) {
  check(f().reshape_and_cache(dl(key, 'key'), dl(value, 'value'), dl(kCache, 'k_cache'), dl(vCache, 'v_cache'),
    dl(slotMapping, 'slot_mapping'), dl(kScale, 'k_scale'), dl(vScale, 'v_scale'), stream));
}

/** Attention of q [B or T, Hq, D] to the paged caches; out like q, lse [T, Hq] (optional). */
function pagedAttention(q, kCache, vCache, blockTable, seqLens, cuSeqlensQ, maxSeqlenQ, maxSeqLen, sinks, kScale,
  vScale, out, lse = null, workspace = null, opts = null, stream = null) {
  check(f().paged_attention(dl(q, 'q'), dl(kCache, 'k_cache'), dl(vCache, 'v_cache'), dl(blockTable, 'block_table'),
    dl(seqLens, 'seq_lens'), dl(cuSeqlensQ, 'cu_seqlens_q'), maxSeqlenQ, maxSeqLen, dl(sinks, 'sinks'),
    dl(kScale, 'k_scale'), dl(vScale, 'v_scale'), dl(out, 'out'), dl(lse, 'lse'), dl(workspace, 'workspace'),
    options('paged_attention', opts), stream));
}

/** Attention over the union of two key sets from its parts: out [T, H, D], lse [T, H] (optional). */
function mergeAttnStates(outA, lseA, outB, lseB, out, lse = null, stream = null) {
  check(f().merge_attn_states(dl(outA, 'out_a'), dl(lseA, 'lse_a'), dl(outB, 'out_b'), dl(lseB, 'lse_b'),
    dl(out, 'out'), dl(lse, 'lse'), stream));
}

/** Dense attention: q [B, S, Hq, D], k/v [B, Sk, Hkv, D(v)] -> out [B, S, Hq, Dv], lse [B, Hq, S]. */
function flashAttention(q, k, v, sinks, out, lse = null, opts = null, stream = null) {
  check(f().flash_attention(dl(q, 'q'), dl(k, 'k'), dl(v, 'v'), dl(sinks, 'sinks'), dl(out, 'out'), dl(lse, 'lse'),
    options('flash_attention', opts), stream));
}

/** Packed sequences: q [T, Hq, D], k/v [Tk, Hkv, D(v)], cu_seqlens [B+1] int32 -> out, lse [Hq, T]. */
function flashAttentionVarlen(q, k, v, cuSeqlensQ, cuSeqlensK, maxSeqlenQ, maxSeqlenK, sinks, out, lse = null,
  opts = null, stream = null) {
  check(f().flash_attention_varlen(dl(q, 'q'), dl(k, 'k'), dl(v, 'v'), dl(cuSeqlensQ, 'cu_seqlens_q'),
    dl(cuSeqlensK, 'cu_seqlens_k'), maxSeqlenQ, maxSeqlenK, dl(sinks, 'sinks'), dl(out, 'out'), dl(lse, 'lse'),
    options('flash_attention_varlen', opts), stream));
}

/** MLA decode (DeepSeek-V2/V3, weight-absorbed) over a paged latent cache: q_nope [B, H, R], q_pe [B, H, P], kv_cache
 * [num_blocks, block_size, R + P] (fp8 e4m3fn with kv_scale) -> out [B, H, R], lse [B, H] (optional); the options must
 * carry the scale (the defaults have none). */
function mlaDecode(qNope, qPe, kvCache, blockTable, seqLens, maxSeqLen, kvScale, out, lse = null, opts = null,
  stream = null) {
  check(f().mla_decode(dl(qNope, 'q_nope'), dl(qPe, 'q_pe'), dl(kvCache, 'kv_cache'), dl(blockTable, 'block_table'),
    dl(seqLens, 'seq_lens'), maxSeqLen, dl(kvScale, 'kv_scale'), dl(out, 'out'), dl(lse, 'lse'),
    options('mla_decode', opts), stream));
}
// END GENERATED: ops

// ---- the ops whose arguments are not one tensor, integer or option struct each (written by hand)

function copyBlocks(kCaches, vCaches, blockMapping, stream = null) {
  if (kCaches.length !== vCaches.length) {
    throw invalid(`v_caches: expected ${kCaches.length} layers like k_caches, got ${vCaches.length}`);
  }
  check(f().copy_blocks(kCaches.map((t, i) => dl(t, `k_caches[${i}]`)), vCaches.map((t, i) => dl(t, `v_caches[${i}]`)),
    kCaches.length, dl(blockMapping, 'block_mapping'), stream));
}

function pagedAttentionWorkspaceSize(q, kCache, maxSeqLen) {
  const bytes = [0];
  check(f().paged_attention_workspace_size(dl(q, 'q'), dl(kCache, 'k_cache'), maxSeqLen, bytes));
  return Number(bytes[0]);
}

module.exports = {
  ABI_MAJOR,
  ABI_MINOR,
  STATUS,
  OPS,
  OPTION_VALUES,
  OP_IDS,
  KsError,
  Tensor,
  tensor,
  compactStrides,
  libraryPath,
  statusName,
  lastError,
  buildInfo,
  abiVersion,
  getApi,
  defaultOptions,
  querySupport,
  copyBlocks,
  pagedAttentionWorkspaceSize,
  // BEGIN GENERATED: exports (capi/abi/generate.py; do not edit)
  rmsNorm,
  fusedAddRmsNorm,
  layerNorm,
  siluAndMul,
  geluAndMul,
  swiglu,
  gelu,
  swigluOai,
  softmax,
  logSoftmax,
  crossEntropy,
  embedding,
  rotaryEmbedding,
  mrope,
  qkNormRope,
  reshapeAndCache,
  pagedAttention,
  mergeAttnStates,
  flashAttention,
  flashAttentionVarlen,
  mlaDecode,
  // END GENERATED: exports
};
