//! The -sys structs have the frozen C layout (capi/abi/abi-1.json, measured from gcc).
mod common;

use std::mem::{align_of, offset_of, size_of};

use kernelset::sys::*;

fn check(doc: &common::Json, name: &str, size: usize, align: usize, fields: &[(&str, usize)]) {
    let s = &doc["structs"][name];
    assert!(!s.is_null(), "{name} is not in abi-1.json");
    assert_eq!(size, s["size"].as_i64() as usize, "sizeof({name})");
    assert_eq!(align, s["align"].as_i64() as usize, "alignof({name})");
    let frozen = s["fields"].as_array();
    assert_eq!(fields.len(), frozen.len(), "{name}: field count");
    for ((f, off), row) in fields.iter().zip(frozen) {
        assert_eq!(*f, row[0].as_str(), "{name}: field order");
        assert_eq!(*off, row[1].as_i64() as usize, "offsetof({name}, {f})");
    }
}

macro_rules! layout {
    ($doc:expr, $t:ident { $($f:ident),* $(,)? }) => {
        check(&$doc, stringify!($t), size_of::<$t>(), align_of::<$t>(), &[$((stringify!($f), offset_of!($t, $f))),*])
    };
}

#[test]
fn structs_match_the_frozen_layout() {
    let doc = common::load_json("capi/abi/abi-1.json");
    assert_eq!(doc["major"].as_i64() as i32, KS_ABI_VERSION_MAJOR);
    layout!(doc, DLDevice { device_type, device_id });
    layout!(doc, DLDataType { code, bits, lanes });
    layout!(doc, DLTensor { data, device, ndim, dtype, shape, strides, byte_offset });
    layout!(doc, ks_rms_norm_options { size, eps, offset, cast });
    layout!(doc, ks_layer_norm_options { size, eps });
    layout!(doc, ks_gelu_options { size, approximate });
    layout!(doc, ks_swiglu_oai_options { size, alpha, limit });
    layout!(doc, ks_softmax_options { size, temperature });
    layout!(doc, ks_cross_entropy_options { size, ignore_index, label_smoothing, z_loss, softcap, reduction });
    layout!(doc, ks_rope_options { size, interleaved, rotary_dim, head_size });
    layout!(doc, ks_mrope_options { size, interleaved, rotary_dim, head_size, mrope_section, mrope_interleaved });
    layout!(
        doc,
        ks_qk_norm_rope_options {
            size,
            eps,
            offset,
            cast,
            interleaved,
            rotary_dim,
            head_size,
            mrope_section,
            mrope_interleaved
        }
    );
    layout!(doc, ks_attention_options { size, scale, causal, window_left, window_right, softcap });
    layout!(doc, ks_mla_options { size, scale, kv_lora_rank, rope_dim });
    layout!(
        doc,
        ks_api_t {
            size,
            abi_major,
            abi_minor,
            last_error,
            status_name,
            build_info,
            options_init,
            query_support,
            rms_norm,
            fused_add_rms_norm,
            layer_norm,
            silu_and_mul,
            gelu_and_mul,
            swiglu,
            gelu,
            swiglu_oai,
            softmax,
            log_softmax,
            cross_entropy,
            embedding,
            rotary_embedding,
            mrope,
            qk_norm_rope,
            reshape_and_cache,
            copy_blocks,
            paged_attention_workspace_size,
            paged_attention,
            merge_attn_states,
            flash_attention,
            flash_attention_varlen,
            mla_decode
        }
    );
    for (name, v) in doc["enums"].as_object() {
        let ours = match name.as_str() {
            "kDLCPU" => kDLCPU,
            "kDLCUDA" => kDLCUDA,
            "kDLCUDAHost" => kDLCUDAHost,
            "kDLInt" => kDLInt,
            "kDLUInt" => kDLUInt,
            "kDLFloat" => kDLFloat,
            "kDLOpaqueHandle" => kDLOpaqueHandle,
            "kDLBfloat" => kDLBfloat,
            "kDLComplex" => kDLComplex,
            "kDLBool" => kDLBool,
            "kDLFloat8_e4m3fn" => kDLFloat8_e4m3fn,
            "kDLFloat8_e5m2" => kDLFloat8_e5m2,
            _ => continue, // KS_* constants: checked by capi/abi/check_abi.py against the source
        };
        assert_eq!(ours as i64, v.as_i64(), "{name}");
    }
}
