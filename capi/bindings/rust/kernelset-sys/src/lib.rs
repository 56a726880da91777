//! Raw declarations of libkernelset's C ABI, one for one with `capi/include/kernelset.h`.
//!
//! Written by hand and checked against the header by `capi/abi/check_abi.py` (every function,
//! every `ks_api_t` field, every struct field and enum constant, with canonical types); the
//! crate's tests compare `size_of`/`offset_of` with the frozen layout `capi/abi/abi-1.json`.
//! Everything here is `unsafe` to call; the `kernelset` crate is the safe layer.
#![no_std]
#![allow(non_camel_case_types, non_upper_case_globals, clippy::type_complexity)]

use core::ffi::{c_char, c_void};

// ---- DLPack (v1.x layout)

pub type DLDeviceType = i32;
pub const kDLCPU: DLDeviceType = 1;
pub const kDLCUDA: DLDeviceType = 2;
pub const kDLCUDAHost: DLDeviceType = 3;

pub type DLDataTypeCode = i32;
pub const kDLInt: DLDataTypeCode = 0;
pub const kDLUInt: DLDataTypeCode = 1;
pub const kDLFloat: DLDataTypeCode = 2;
pub const kDLOpaqueHandle: DLDataTypeCode = 3;
pub const kDLBfloat: DLDataTypeCode = 4;
pub const kDLComplex: DLDataTypeCode = 5;
pub const kDLBool: DLDataTypeCode = 6;
pub const kDLFloat8_e4m3fn: DLDataTypeCode = 10;
pub const kDLFloat8_e5m2: DLDataTypeCode = 12;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDevice {
    pub device_type: DLDeviceType,
    pub device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: i32,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}

// ---- versioning, status codes, op ids

pub const KS_ABI_VERSION_MAJOR: i32 = 1;
pub const KS_ABI_VERSION_MINOR: i32 = 1;

pub type ks_status_t = i32;
pub const KS_OK: ks_status_t = 0;
pub const KS_ERR_INVALID_ARGUMENT: ks_status_t = 1;
pub const KS_ERR_UNSUPPORTED_DTYPE: ks_status_t = 2;
pub const KS_ERR_UNSUPPORTED_SHAPE: ks_status_t = 3;
pub const KS_ERR_UNSUPPORTED_LAYOUT: ks_status_t = 4;
pub const KS_ERR_UNSUPPORTED_DEVICE: ks_status_t = 5;
pub const KS_ERR_UNSUPPORTED_ARCH: ks_status_t = 6;
pub const KS_ERR_CUDA: ks_status_t = 7;
pub const KS_ERR_OUT_OF_MEMORY: ks_status_t = 8;
pub const KS_ERR_NOT_IMPLEMENTED: ks_status_t = 9;
pub const KS_ERR_VERSION: ks_status_t = 10;
pub const KS_ERR_INTERNAL: ks_status_t = 11;

pub type ks_stream_t = *mut c_void;

pub type ks_op_t = i32;
pub const KS_OP_RMS_NORM: ks_op_t = 1;
pub const KS_OP_FUSED_ADD_RMS_NORM: ks_op_t = 2;
pub const KS_OP_LAYER_NORM: ks_op_t = 3;
pub const KS_OP_SILU_AND_MUL: ks_op_t = 4;
pub const KS_OP_GELU_AND_MUL: ks_op_t = 5;
pub const KS_OP_SWIGLU: ks_op_t = 6;
pub const KS_OP_GELU: ks_op_t = 7;
pub const KS_OP_SWIGLU_OAI: ks_op_t = 8;
pub const KS_OP_SOFTMAX: ks_op_t = 9;
pub const KS_OP_LOG_SOFTMAX: ks_op_t = 10;
pub const KS_OP_CROSS_ENTROPY: ks_op_t = 11;
pub const KS_OP_EMBEDDING: ks_op_t = 12;
pub const KS_OP_ROTARY_EMBEDDING: ks_op_t = 13;
pub const KS_OP_MROPE: ks_op_t = 14;
pub const KS_OP_QK_NORM_ROPE: ks_op_t = 15;
pub const KS_OP_RESHAPE_AND_CACHE: ks_op_t = 16;
pub const KS_OP_COPY_BLOCKS: ks_op_t = 17;
pub const KS_OP_PAGED_ATTENTION: ks_op_t = 18;
pub const KS_OP_MERGE_ATTN_STATES: ks_op_t = 19;
pub const KS_OP_FLASH_ATTENTION: ks_op_t = 20;
pub const KS_OP_FLASH_ATTENTION_VARLEN: ks_op_t = 21;
pub const KS_OP_MLA_DECODE: ks_op_t = 22;

pub const KS_NORM_CAST_LLAMA: i32 = 0;
pub const KS_NORM_CAST_GEMMA: i32 = 1;
pub const KS_GELU_NONE: i32 = 0;
pub const KS_GELU_TANH: i32 = 1;
pub const KS_REDUCTION_NONE: i32 = 0;
pub const KS_REDUCTION_MEAN: i32 = 1;
pub const KS_REDUCTION_SUM: i32 = 2;

// ---- option structs (first field: size in bytes; fields are only appended)

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ks_rms_norm_options {
    pub size: usize,
    pub eps: f32,
    pub offset: f32,
    pub cast: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ks_layer_norm_options {
    pub size: usize,
    pub eps: f32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ks_gelu_options {
    pub size: usize,
    pub approximate: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ks_swiglu_oai_options {
    pub size: usize,
    pub alpha: f32,
    pub limit: f32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ks_softmax_options {
    pub size: usize,
    pub temperature: f32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ks_cross_entropy_options {
    pub size: usize,
    pub ignore_index: i64,
    pub label_smoothing: f32,
    pub z_loss: f32,
    pub softcap: f32,
    pub reduction: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ks_rope_options {
    pub size: usize,
    pub interleaved: i32,
    pub rotary_dim: i32,
    pub head_size: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ks_mrope_options {
    pub size: usize,
    pub interleaved: i32,
    pub rotary_dim: i32,
    pub head_size: i32,
    pub mrope_section: [i32; 3],
    pub mrope_interleaved: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ks_qk_norm_rope_options {
    pub size: usize,
    pub eps: f32,
    pub offset: f32,
    pub cast: i32,
    pub interleaved: i32,
    pub rotary_dim: i32,
    pub head_size: i32,
    pub mrope_section: [i32; 3],
    pub mrope_interleaved: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ks_attention_options {
    pub size: usize,
    pub scale: f32,
    pub causal: i32,
    pub window_left: i32,
    pub window_right: i32,
    pub softcap: f32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ks_mla_options {
    pub size: usize,
    pub scale: f64,
    pub kv_lora_rank: i32,
    pub rope_dim: i32,
}

// ---- the function table (fields appended within a major version; check `size`)

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ks_api_t {
    pub size: usize,
    pub abi_major: i32,
    pub abi_minor: i32,
    pub last_error: Option<unsafe extern "C" fn() -> *const c_char>,
    pub status_name: Option<unsafe extern "C" fn(ks_status_t) -> *const c_char>,
    pub build_info: Option<unsafe extern "C" fn() -> *const c_char>,
    pub options_init: Option<unsafe extern "C" fn(ks_op_t, *mut c_void, usize) -> ks_status_t>,
    pub query_support: Option<unsafe extern "C" fn(ks_op_t, *const *const DLTensor, i32, *const c_void) -> ks_status_t>,
    pub rms_norm: Option<
        unsafe extern "C" fn(
            *const DLTensor,
            *const DLTensor,
            *mut DLTensor,
            *const ks_rms_norm_options,
            ks_stream_t,
        ) -> ks_status_t,
    >,
    pub fused_add_rms_norm: Option<
        unsafe extern "C" fn(
            *const DLTensor,
            *mut DLTensor,
            *const DLTensor,
            *mut DLTensor,
            *const ks_rms_norm_options,
            ks_stream_t,
        ) -> ks_status_t,
    >,
    pub layer_norm: Option<
        unsafe extern "C" fn(
            *const DLTensor,
            *const DLTensor,
            *const DLTensor,
            *mut DLTensor,
            *const ks_layer_norm_options,
            ks_stream_t,
        ) -> ks_status_t,
    >,
    pub silu_and_mul: Option<unsafe extern "C" fn(*const DLTensor, *mut DLTensor, ks_stream_t) -> ks_status_t>,
    pub gelu_and_mul: Option<
        unsafe extern "C" fn(*const DLTensor, *mut DLTensor, *const ks_gelu_options, ks_stream_t) -> ks_status_t,
    >,
    pub swiglu:
        Option<unsafe extern "C" fn(*const DLTensor, *const DLTensor, *mut DLTensor, ks_stream_t) -> ks_status_t>,
    pub gelu: Option<
        unsafe extern "C" fn(*const DLTensor, *mut DLTensor, *const ks_gelu_options, ks_stream_t) -> ks_status_t,
    >,
    pub swiglu_oai: Option<
        unsafe extern "C" fn(*const DLTensor, *mut DLTensor, *const ks_swiglu_oai_options, ks_stream_t) -> ks_status_t,
    >,
    pub softmax: Option<
        unsafe extern "C" fn(*const DLTensor, *mut DLTensor, *const ks_softmax_options, ks_stream_t) -> ks_status_t,
    >,
    pub log_softmax: Option<
        unsafe extern "C" fn(*const DLTensor, *mut DLTensor, *const ks_softmax_options, ks_stream_t) -> ks_status_t,
    >,
    pub cross_entropy: Option<
        unsafe extern "C" fn(
            *const DLTensor,
            *const DLTensor,
            *mut DLTensor,
            *const ks_cross_entropy_options,
            ks_stream_t,
        ) -> ks_status_t,
    >,
    pub embedding:
        Option<unsafe extern "C" fn(*const DLTensor, *const DLTensor, *mut DLTensor, ks_stream_t) -> ks_status_t>,
    pub rotary_embedding: Option<
        unsafe extern "C" fn(
            *const DLTensor,
            *mut DLTensor,
            *mut DLTensor,
            *const DLTensor,
            *const ks_rope_options,
            ks_stream_t,
        ) -> ks_status_t,
    >,
    pub mrope: Option<
        unsafe extern "C" fn(
            *const DLTensor,
            *mut DLTensor,
            *mut DLTensor,
            *const DLTensor,
            *const ks_mrope_options,
            ks_stream_t,
        ) -> ks_status_t,
    >,
    pub qk_norm_rope: Option<
        unsafe extern "C" fn(
            *mut DLTensor,
            *mut DLTensor,
            *const DLTensor,
            *const DLTensor,
            *const DLTensor,
            *const DLTensor,
            *const ks_qk_norm_rope_options,
            ks_stream_t,
        ) -> ks_status_t,
    >,
    pub reshape_and_cache: Option<
        unsafe extern "C" fn(
            *const DLTensor,
            *const DLTensor,
            *mut DLTensor,
            *mut DLTensor,
            *const DLTensor,
            *const DLTensor,
            *const DLTensor,
            ks_stream_t,
        ) -> ks_status_t,
    >,
    pub copy_blocks: Option<
        unsafe extern "C" fn(
            *const *mut DLTensor,
            *const *mut DLTensor,
            i32,
            *const DLTensor,
            ks_stream_t,
        ) -> ks_status_t,
    >,
    pub paged_attention_workspace_size:
        Option<unsafe extern "C" fn(*const DLTensor, *const DLTensor, i64, *mut usize) -> ks_status_t>,
    pub paged_attention: Option<
        unsafe extern "C" fn(
            *const DLTensor,
            *const DLTensor,
            *const DLTensor,
            *const DLTensor,
            *const DLTensor,
            *const DLTensor,
            i64,
            i64,
            *const DLTensor,
            *const DLTensor,
            *const DLTensor,
            *mut DLTensor,
            *mut DLTensor,
            *mut DLTensor,
            *const ks_attention_options,
            ks_stream_t,
        ) -> ks_status_t,
    >,
    pub merge_attn_states: Option<
        unsafe extern "C" fn(
            *const DLTensor,
            *const DLTensor,
            *const DLTensor,
            *const DLTensor,
            *mut DLTensor,
            *mut DLTensor,
            ks_stream_t,
        ) -> ks_status_t,
    >,
    pub flash_attention: Option<
        unsafe extern "C" fn(
            *const DLTensor,
            *const DLTensor,
            *const DLTensor,
            *const DLTensor,
            *mut DLTensor,
            *mut DLTensor,
            *const ks_attention_options,
            ks_stream_t,
        ) -> ks_status_t,
    >,
    pub flash_attention_varlen: Option<
        unsafe extern "C" fn(
            *const DLTensor,
            *const DLTensor,
            *const DLTensor,
            *const DLTensor,
            *const DLTensor,
            i64,
            i64,
            *const DLTensor,
            *mut DLTensor,
            *mut DLTensor,
            *const ks_attention_options,
            ks_stream_t,
        ) -> ks_status_t,
    >,
    pub mla_decode: Option<
        unsafe extern "C" fn(
            *const DLTensor,
            *const DLTensor,
            *const DLTensor,
            *const DLTensor,
            *const DLTensor,
            i64,
            *const DLTensor,
            *mut DLTensor,
            *mut DLTensor,
            *const ks_mla_options,
            ks_stream_t,
        ) -> ks_status_t,
    >,
}

// ---- functions

extern "C" {
    pub fn ks_last_error() -> *const c_char;
    pub fn ks_status_name(s: ks_status_t) -> *const c_char;
    pub fn ks_build_info() -> *const c_char;
    pub fn ks_abi_version(major: *mut i32, minor: *mut i32);
    pub fn ks_options_init(op: ks_op_t, options: *mut c_void, size: usize) -> ks_status_t;
    pub fn ks_query_support(
        op: ks_op_t,
        tensors: *const *const DLTensor,
        num_tensors: i32,
        options: *const c_void,
    ) -> ks_status_t;

    pub fn ks_rms_norm(
        x: *const DLTensor,
        weight: *const DLTensor,
        out: *mut DLTensor,
        options: *const ks_rms_norm_options,
        stream: ks_stream_t,
    ) -> ks_status_t;
    pub fn ks_fused_add_rms_norm(
        x: *const DLTensor,
        residual: *mut DLTensor,
        weight: *const DLTensor,
        out: *mut DLTensor,
        options: *const ks_rms_norm_options,
        stream: ks_stream_t,
    ) -> ks_status_t;
    pub fn ks_layer_norm(
        x: *const DLTensor,
        weight: *const DLTensor,
        bias: *const DLTensor,
        out: *mut DLTensor,
        options: *const ks_layer_norm_options,
        stream: ks_stream_t,
    ) -> ks_status_t;

    pub fn ks_silu_and_mul(x: *const DLTensor, out: *mut DLTensor, stream: ks_stream_t) -> ks_status_t;
    pub fn ks_gelu_and_mul(
        x: *const DLTensor,
        out: *mut DLTensor,
        options: *const ks_gelu_options,
        stream: ks_stream_t,
    ) -> ks_status_t;
    pub fn ks_swiglu(
        gate: *const DLTensor,
        up: *const DLTensor,
        out: *mut DLTensor,
        stream: ks_stream_t,
    ) -> ks_status_t;
    pub fn ks_gelu(
        x: *const DLTensor,
        out: *mut DLTensor,
        options: *const ks_gelu_options,
        stream: ks_stream_t,
    ) -> ks_status_t;
    pub fn ks_swiglu_oai(
        x: *const DLTensor,
        out: *mut DLTensor,
        options: *const ks_swiglu_oai_options,
        stream: ks_stream_t,
    ) -> ks_status_t;

    pub fn ks_softmax(
        x: *const DLTensor,
        out: *mut DLTensor,
        options: *const ks_softmax_options,
        stream: ks_stream_t,
    ) -> ks_status_t;
    pub fn ks_log_softmax(
        x: *const DLTensor,
        out: *mut DLTensor,
        options: *const ks_softmax_options,
        stream: ks_stream_t,
    ) -> ks_status_t;

    pub fn ks_cross_entropy(
        logits: *const DLTensor,
        target: *const DLTensor,
        loss: *mut DLTensor,
        options: *const ks_cross_entropy_options,
        stream: ks_stream_t,
    ) -> ks_status_t;

    pub fn ks_embedding(
        ids: *const DLTensor,
        weight: *const DLTensor,
        out: *mut DLTensor,
        stream: ks_stream_t,
    ) -> ks_status_t;

    pub fn ks_rotary_embedding(
        positions: *const DLTensor,
        q: *mut DLTensor,
        k: *mut DLTensor,
        cos_sin_cache: *const DLTensor,
        options: *const ks_rope_options,
        stream: ks_stream_t,
    ) -> ks_status_t;
    pub fn ks_mrope(
        positions: *const DLTensor,
        q: *mut DLTensor,
        k: *mut DLTensor,
        cos_sin_cache: *const DLTensor,
        options: *const ks_mrope_options,
        stream: ks_stream_t,
    ) -> ks_status_t;
    pub fn ks_qk_norm_rope(
        q: *mut DLTensor,
        k: *mut DLTensor,
        q_weight: *const DLTensor,
        k_weight: *const DLTensor,
        cos_sin_cache: *const DLTensor,
        positions: *const DLTensor,
        options: *const ks_qk_norm_rope_options,
        stream: ks_stream_t,
    ) -> ks_status_t;

    pub fn ks_reshape_and_cache(
        key: *const DLTensor,
        value: *const DLTensor,
        k_cache: *mut DLTensor,
        v_cache: *mut DLTensor,
        slot_mapping: *const DLTensor,
        k_scale: *const DLTensor,
        v_scale: *const DLTensor,
        stream: ks_stream_t,
    ) -> ks_status_t;
    pub fn ks_copy_blocks(
        k_caches: *const *mut DLTensor,
        v_caches: *const *mut DLTensor,
        num_layers: i32,
        block_mapping: *const DLTensor,
        stream: ks_stream_t,
    ) -> ks_status_t;

    pub fn ks_paged_attention_workspace_size(
        q: *const DLTensor,
        k_cache: *const DLTensor,
        max_seq_len: i64,
        bytes: *mut usize,
    ) -> ks_status_t;
    pub fn ks_paged_attention(
        q: *const DLTensor,
        k_cache: *const DLTensor,
        v_cache: *const DLTensor,
        block_table: *const DLTensor,
        seq_lens: *const DLTensor,
        cu_seqlens_q: *const DLTensor,
        max_seqlen_q: i64,
        max_seq_len: i64,
        sinks: *const DLTensor,
        k_scale: *const DLTensor,
        v_scale: *const DLTensor,
        out: *mut DLTensor,
        lse: *mut DLTensor,
        workspace: *mut DLTensor,
        options: *const ks_attention_options,
        stream: ks_stream_t,
    ) -> ks_status_t;
    pub fn ks_merge_attn_states(
        out_a: *const DLTensor,
        lse_a: *const DLTensor,
        out_b: *const DLTensor,
        lse_b: *const DLTensor,
        out: *mut DLTensor,
        lse: *mut DLTensor,
        stream: ks_stream_t,
    ) -> ks_status_t;
    pub fn ks_flash_attention(
        q: *const DLTensor,
        k: *const DLTensor,
        v: *const DLTensor,
        sinks: *const DLTensor,
        out: *mut DLTensor,
        lse: *mut DLTensor,
        options: *const ks_attention_options,
        stream: ks_stream_t,
    ) -> ks_status_t;
    pub fn ks_flash_attention_varlen(
        q: *const DLTensor,
        k: *const DLTensor,
        v: *const DLTensor,
        cu_seqlens_q: *const DLTensor,
        cu_seqlens_k: *const DLTensor,
        max_seqlen_q: i64,
        max_seqlen_k: i64,
        sinks: *const DLTensor,
        out: *mut DLTensor,
        lse: *mut DLTensor,
        options: *const ks_attention_options,
        stream: ks_stream_t,
    ) -> ks_status_t;
    pub fn ks_mla_decode(
        q_nope: *const DLTensor,
        q_pe: *const DLTensor,
        kv_cache: *const DLTensor,
        block_table: *const DLTensor,
        seq_lens: *const DLTensor,
        max_seq_len: i64,
        kv_scale: *const DLTensor,
        out: *mut DLTensor,
        lse: *mut DLTensor,
        options: *const ks_mla_options,
        stream: ks_stream_t,
    ) -> ks_status_t;

    pub fn ks_get_api(major: i32, min_minor: i32, table: *mut *const ks_api_t) -> ks_status_t;
}
