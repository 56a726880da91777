// Typings of the kernelset Node package (index.js). Tensor arguments follow the C signatures of
// capi/include/kernelset.h in order; null passes NULL for an optional tensor or for options.

export declare const ABI_MAJOR: number;
export declare const ABI_MINOR: number;
export declare const STATUS: Readonly<Record<string, number>>;
export declare const OPS: Readonly<Record<string, number>>;
export declare const OPTION_VALUES: Readonly<Record<string, number>>;
/** op name ("rms_norm") -> KS_OP_* id */
export declare const OP_IDS: Readonly<Record<OpName, number>>;

// BEGIN GENERATED: op names (capi/abi/generate.py, from capi/abi/ksabi/ops.py; do not edit)
export type OpName =
  | 'rms_norm' | 'fused_add_rms_norm' | 'layer_norm' | 'silu_and_mul' | 'gelu_and_mul' | 'swiglu' | 'gelu'
  | 'swiglu_oai' | 'softmax' | 'log_softmax' | 'cross_entropy' | 'embedding' | 'rotary_embedding' | 'mrope'
  | 'qk_norm_rope' | 'reshape_and_cache' | 'copy_blocks' | 'paged_attention' | 'merge_attn_states' | 'flash_attention'
  | 'flash_attention_varlen' | 'mla_decode';
// END GENERATED: op names

export type DType = 'float32' | 'float16' | 'bfloat16' | 'float8_e4m3fn' | 'int32' | 'int64' | 'uint8';

/** A CUDA stream (CUstream) as a pointer, or null for the legacy default stream. */
export type Stream = bigint | number | null;

/** A failed call: the library's status, its name and its message (naming the argument). */
export declare class KsError extends Error {
  readonly status: number;
  readonly statusName: string;
  readonly detail: string;
}

export interface TensorOptions {
  /** default from the array: Float32Array float32, Int32Array int32, BigInt64Array int64, Uint8Array uint8 */
  dtype?: DType;
  /** in elements; null: compact row-major */
  strides?: number[] | null;
  device?: 'cpu' | 'cuda';
  deviceId?: number;
}

/** A view over a TypedArray (checked to cover every element; passed without a copy) or a raw pointer. */
export declare class Tensor {
  constructor(data: ArrayBufferView | bigint | number, shape: number[], options?: TensorOptions);
  readonly data: ArrayBufferView | bigint | number;
  readonly dtype: DType;
  readonly shape: number[];
  readonly strides: number[] | null;
  readonly device: 'cpu' | 'cuda';
  readonly deviceId: number;
}

export declare function tensor(data: ArrayBufferView | bigint | number, shape: number[], options?: TensorOptions): Tensor;
export declare function compactStrides(shape: number[]): number[];

// BEGIN GENERATED: options (capi/abi/generate.py, from capi/abi/ksabi/ops.py; do not edit)
/** ks_rms_norm_options: rms_norm, fused_add_rms_norm */
export interface RmsNormOptions { eps?: number; offset?: number; cast?: number }
/** ks_layer_norm_options: layer_norm */
export interface LayerNormOptions { eps?: number }
/** ks_gelu_options: gelu_and_mul, gelu */
export interface GeluOptions { approximate?: number }
/** ks_swiglu_oai_options: swiglu_oai */
export interface SwigluOaiOptions { alpha?: number; limit?: number }
/** ks_softmax_options: softmax, log_softmax */
export interface SoftmaxOptions { temperature?: number }
/** ks_cross_entropy_options: cross_entropy */
export interface CrossEntropyOptions {
  ignore_index?: number | bigint; label_smoothing?: number; z_loss?: number; softcap?: number; reduction?: number;
}
/** ks_rope_options: rotary_embedding */
export interface RopeOptions { interleaved?: number; rotary_dim?: number; head_size?: number }
/** ks_mrope_options: mrope */
export interface MropeOptions {
  interleaved?: number; rotary_dim?: number; head_size?: number; mrope_section?: [number, number, number];
  mrope_interleaved?: number;
}
/** ks_qk_norm_rope_options: qk_norm_rope */
export interface QkNormRopeOptions {
  eps?: number; offset?: number; cast?: number; interleaved?: number; rotary_dim?: number; head_size?: number;
  mrope_section?: [number, number, number]; mrope_interleaved?: number;
}
/** ks_attention_options: paged_attention, flash_attention, flash_attention_varlen */
export interface AttentionOptions {
  scale?: number; causal?: number; window_left?: number; window_right?: number; softcap?: number;
}
/** ks_mla_options: mla_decode */
export interface MlaOptions { scale?: number; kv_lora_rank?: number; rope_dim?: number }
export type AnyOptions = RmsNormOptions | LayerNormOptions | GeluOptions | SwigluOaiOptions | SoftmaxOptions
  | CrossEntropyOptions | RopeOptions | MropeOptions | QkNormRopeOptions | AttentionOptions | MlaOptions;
// END GENERATED: options

type T = Tensor;
type OptT = Tensor | null;
type Int = number | bigint;

/** $KS_LIB_PATH, $KS_LIB_DIR/libkernelset.so, or this checkout's src/kernelset/capi/lib/libkernelset.so */
export declare function libraryPath(): string;
export declare function statusName(code: number): string;
export declare function lastError(): string;
export declare function buildInfo(): string;
export declare function abiVersion(): { major: number; minor: number };
export declare function getApi(major: number, minMinor: number): { size: number; abiMajor: number; abiMinor: number };
/** The library's defaults (ks_options_init) for op, with every field of its option struct. */
export declare function defaultOptions(op: OpName): Record<string, number | number[] | bigint>;
export declare function querySupport(op: OpName, tensors: OptT[], options?: AnyOptions | null): void;

export declare function copyBlocks(kCaches: T[], vCaches: T[], blockMapping: T, stream?: Stream): void;
export declare function pagedAttentionWorkspaceSize(q: T, kCache: T, maxSeqLen: Int): number;
// BEGIN GENERATED: ops (capi/abi/generate.py, from capi/abi/ksabi/ops.py; do not edit)
/** y = x * rsqrt(mean(x^2) + eps) * (offset + weight) over the last dim; x [..., H], out like x. */
export declare function rmsNorm(x: T, weight: OptT, out: T, options?: RmsNormOptions | null, stream?: Stream): void;
/** h = x + residual (written into residual), out = rms_norm(h); out may be x (in place). */
export declare function fusedAddRmsNorm(x: T, residual: T, weight: OptT, out: T, options?: RmsNormOptions | null,
  stream?: Stream): void;
/** y = (x - mean) * rsqrt(var + eps) * weight + bias over the last dim. */
export declare function layerNorm(x: T, weight: OptT, bias: OptT, out: T, options?: LayerNormOptions | null,
  stream?: Stream): void;
/** x [..., 2I] -> out [..., I] = silu(gate) * up. */
export declare function siluAndMul(x: T, out: T, stream?: Stream): void;
/** x [..., 2I] -> out [..., I] = gelu(gate) * up. */
export declare function geluAndMul(x: T, out: T, options?: GeluOptions | null, stream?: Stream): void;
/** out = silu(gate) * up. */
export declare function swiglu(gate: T, up: T, out: T, stream?: Stream): void;
/** out = gelu(x) elementwise (erf, or tanh). */
export declare function gelu(x: T, out: T, options?: GeluOptions | null, stream?: Stream): void;
/** gpt-oss: x [..., 2I] interleaved (gate, up) pairs -> out [..., I]. */
export declare function swigluOai(x: T, out: T, options?: SwigluOaiOptions | null, stream?: Stream): void;
/** out = softmax(x / temperature) over the last dim. */
export declare function softmax(x: T, out: T, options?: SoftmaxOptions | null, stream?: Stream): void;
/** out = log_softmax(x / temperature) over the last dim. */
export declare function logSoftmax(x: T, out: T, options?: SoftmaxOptions | null, stream?: Stream): void;
/** logits [T, V], target [T] int32/int64 -> loss float32 ([T], or 0-d when reduced). */
export declare function crossEntropy(logits: T, target: T, loss: T, options?: CrossEntropyOptions | null,
  stream?: Stream): void;
/** ids [...] int32/int64, weight [V, H] -> out [..., H]. */
export declare function embedding(ids: T, weight: T, out: T, stream?: Stream): void;
/** RoPE in place on q and k (optional) at positions [T]. */
export declare function rotaryEmbedding(positions: T, q: T, k: OptT, cosSinCache: T, options?: RopeOptions | null,
  stream?: Stream): void;
/** Multimodal RoPE (positions [3, T]) in place on q and k (optional). */
export declare function mrope(positions: T, q: T, k: OptT, cosSinCache: T, options?: MropeOptions | null,
  stream?: Stream): void;
/** Per-head RMSNorm of q and k (weights [D]) then RoPE, in place. */
export declare function qkNormRope(q: T, k: OptT, qWeight: T, kWeight: OptT, cosSinCache: T, positions: T,
  options?: QkNormRopeOptions | null, stream?: Stream): void;
/** Writes key/value [T, Hkv, D] into the paged caches at slot_mapping [T] (-1 skips). */
export declare function reshapeAndCache(key: T, value: T, kCache: T, vCache: T, slotMapping: T, kScale?: OptT,
  vScale?: OptT, stream?: Stream): void;
/** Attention of q [B or T, Hq, D] to the paged caches; out like q, lse [T, Hq] (optional). */
export declare function pagedAttention(q: T, kCache: T, vCache: T, blockTable: T, seqLens: T, cuSeqlensQ: OptT,
  maxSeqlenQ: Int, maxSeqLen: Int, sinks: OptT, kScale: OptT, vScale: OptT, out: T, lse?: OptT, workspace?: OptT,
  options?: AttentionOptions | null, stream?: Stream): void;
/** Attention over the union of two key sets from its parts: out [T, H, D], lse [T, H] (optional). */
export declare function mergeAttnStates(outA: T, lseA: T, outB: T, lseB: T, out: T, lse?: OptT, stream?: Stream): void;
/** Dense attention: q [B, S, Hq, D], k/v [B, Sk, Hkv, D(v)] -> out [B, S, Hq, Dv], lse [B, Hq, S]. */
export declare function flashAttention(q: T, k: T, v: T, sinks: OptT, out: T, lse?: OptT,
  options?: AttentionOptions | null, stream?: Stream): void;
/** Packed sequences: q [T, Hq, D], k/v [Tk, Hkv, D(v)], cu_seqlens [B+1] int32 -> out, lse [Hq, T]. */
export declare function flashAttentionVarlen(q: T, k: T, v: T, cuSeqlensQ: T, cuSeqlensK: T, maxSeqlenQ: Int,
  maxSeqlenK: Int, sinks: OptT, out: T, lse?: OptT, options?: AttentionOptions | null, stream?: Stream): void;
/** MLA decode (DeepSeek-V2/V3, weight-absorbed) over a paged latent cache: q_nope [B, H, R], q_pe [B, H, P], kv_cache
 * [num_blocks, block_size, R + P] (fp8 e4m3fn with kv_scale) -> out [B, H, R], lse [B, H] (optional); the options must
 * carry the scale (the defaults have none). */
export declare function mlaDecode(qNope: T, qPe: T, kvCache: T, blockTable: T, seqLens: T, maxSeqLen: Int,
  kvScale: OptT, out: T, lse?: OptT, options?: MlaOptions | null, stream?: Stream): void;
// END GENERATED: ops
