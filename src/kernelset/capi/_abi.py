"""ctypes mirror of capi/include/kernelset.h: DLPack structs, status codes, op ids, option structs
and the prototype of every exported function. tests/test_capi.py checks the struct layouts
against the header compiled by a C compiler."""
from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_double, c_float, c_int32, c_int64, c_size_t, c_uint8, c_uint16, c_uint64, c_void_p

ABI_MAJOR, ABI_MINOR = 1, 1

# ---- DLPack


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32), ("dtype", DLDataType),
                ("shape", POINTER(c_int64)), ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


KDL_CPU, KDL_CUDA, KDL_CUDA_HOST = 1, 2, 3
KDL_INT, KDL_UINT, KDL_FLOAT, KDL_BFLOAT, KDL_BOOL, KDL_FLOAT8_E4M3FN, KDL_FLOAT8_E5M2 = 0, 1, 2, 4, 6, 10, 12

# ---- status codes and op ids (values never change within a major version)

STATUS = {
    0: "KS_OK", 1: "KS_ERR_INVALID_ARGUMENT", 2: "KS_ERR_UNSUPPORTED_DTYPE", 3: "KS_ERR_UNSUPPORTED_SHAPE",
    4: "KS_ERR_UNSUPPORTED_LAYOUT", 5: "KS_ERR_UNSUPPORTED_DEVICE", 6: "KS_ERR_UNSUPPORTED_ARCH", 7: "KS_ERR_CUDA",
    8: "KS_ERR_OUT_OF_MEMORY", 9: "KS_ERR_NOT_IMPLEMENTED", 10: "KS_ERR_VERSION", 11: "KS_ERR_INTERNAL",
}
OK, INVALID_ARGUMENT, UNSUPPORTED_DTYPE, UNSUPPORTED_SHAPE, UNSUPPORTED_LAYOUT, UNSUPPORTED_DEVICE = 0, 1, 2, 3, 4, 5
UNSUPPORTED_ARCH, CUDA, OUT_OF_MEMORY, NOT_IMPLEMENTED, VERSION, INTERNAL = 6, 7, 8, 9, 10, 11

OPS = {
    "rms_norm": 1, "fused_add_rms_norm": 2, "layer_norm": 3, "silu_and_mul": 4, "gelu_and_mul": 5, "swiglu": 6,
    "gelu": 7, "swiglu_oai": 8, "softmax": 9, "log_softmax": 10, "cross_entropy": 11, "embedding": 12,
    "rotary_embedding": 13, "mrope": 14, "qk_norm_rope": 15, "reshape_and_cache": 16, "copy_blocks": 17,
    "paged_attention": 18, "merge_attn_states": 19, "flash_attention": 20, "flash_attention_varlen": 21,
    "mla_decode": 22,
}

NORM_CAST = {"llama": 0, "gemma": 1}
GELU_APPROX = {"none": 0, "tanh": 1}
REDUCTION = {"none": 0, "mean": 1, "sum": 2}

# ---- option structs


class RmsNormOptions(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("eps", c_float), ("offset", c_float), ("cast", c_int32)]


class LayerNormOptions(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("eps", c_float)]


class GeluOptions(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("approximate", c_int32)]


class SwigluOaiOptions(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("alpha", c_float), ("limit", c_float)]


class SoftmaxOptions(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("temperature", c_float)]


class CrossEntropyOptions(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("ignore_index", c_int64), ("label_smoothing", c_float), ("z_loss", c_float),
                ("softcap", c_float), ("reduction", c_int32)]


class RopeOptions(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("interleaved", c_int32), ("rotary_dim", c_int32), ("head_size", c_int32)]


class MropeOptions(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("interleaved", c_int32), ("rotary_dim", c_int32), ("head_size", c_int32),
                ("mrope_section", c_int32 * 3), ("mrope_interleaved", c_int32)]


class QkNormRopeOptions(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("eps", c_float), ("offset", c_float), ("cast", c_int32),
                ("interleaved", c_int32), ("rotary_dim", c_int32), ("head_size", c_int32),
                ("mrope_section", c_int32 * 3), ("mrope_interleaved", c_int32)]


class AttentionOptions(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("scale", c_float), ("causal", c_int32), ("window_left", c_int32),
                ("window_right", c_int32), ("softcap", c_float)]


class MlaOptions(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("scale", c_double), ("kv_lora_rank", c_int32), ("rope_dim", c_int32)]


OPTIONS = {  # op -> its option struct (ops absent here take none)
    "rms_norm": RmsNormOptions, "fused_add_rms_norm": RmsNormOptions, "layer_norm": LayerNormOptions,
    "gelu_and_mul": GeluOptions, "gelu": GeluOptions, "swiglu_oai": SwigluOaiOptions, "softmax": SoftmaxOptions,
    "log_softmax": SoftmaxOptions, "cross_entropy": CrossEntropyOptions, "rotary_embedding": RopeOptions,
    "mrope": MropeOptions, "qk_norm_rope": QkNormRopeOptions, "paged_attention": AttentionOptions,
    "flash_attention": AttentionOptions, "flash_attention_varlen": AttentionOptions, "mla_decode": MlaOptions,
}

# ---- prototypes: name -> (restype, argtypes). Tensors are POINTER(DLTensor) (None = NULL),
# options and streams void pointers.

_T = POINTER(DLTensor)
_S = c_int32  # ks_status_t
_V = c_void_p
_I64 = c_int64

FUNCTIONS = {
    "ks_last_error": (c_char_p, []),
    "ks_status_name": (c_char_p, [_S]),
    "ks_build_info": (c_char_p, []),
    "ks_abi_version": (None, [POINTER(c_int32), POINTER(c_int32)]),
    "ks_options_init": (_S, [c_int32, _V, c_size_t]),
    "ks_query_support": (_S, [c_int32, POINTER(_T), c_int32, _V]),
    "ks_get_api": (_S, [c_int32, c_int32, POINTER(c_void_p)]),
    "ks_rms_norm": (_S, [_T, _T, _T, _V, _V]),
    "ks_fused_add_rms_norm": (_S, [_T, _T, _T, _T, _V, _V]),
    "ks_layer_norm": (_S, [_T, _T, _T, _T, _V, _V]),
    "ks_silu_and_mul": (_S, [_T, _T, _V]),
    "ks_gelu_and_mul": (_S, [_T, _T, _V, _V]),
    "ks_swiglu": (_S, [_T, _T, _T, _V]),
    "ks_gelu": (_S, [_T, _T, _V, _V]),
    "ks_swiglu_oai": (_S, [_T, _T, _V, _V]),
    "ks_softmax": (_S, [_T, _T, _V, _V]),
    "ks_log_softmax": (_S, [_T, _T, _V, _V]),
    "ks_cross_entropy": (_S, [_T, _T, _T, _V, _V]),
    "ks_embedding": (_S, [_T, _T, _T, _V]),
    "ks_rotary_embedding": (_S, [_T, _T, _T, _T, _V, _V]),
    "ks_mrope": (_S, [_T, _T, _T, _T, _V, _V]),
    "ks_qk_norm_rope": (_S, [_T, _T, _T, _T, _T, _T, _V, _V]),
    "ks_reshape_and_cache": (_S, [_T, _T, _T, _T, _T, _T, _T, _V]),
    "ks_copy_blocks": (_S, [POINTER(_T), POINTER(_T), c_int32, _T, _V]),
    "ks_paged_attention_workspace_size": (_S, [_T, _T, _I64, POINTER(c_size_t)]),
    "ks_paged_attention": (_S, [_T, _T, _T, _T, _T, _T, _I64, _I64, _T, _T, _T, _T, _T, _T, _V, _V]),
    "ks_merge_attn_states": (_S, [_T, _T, _T, _T, _T, _T, _V]),
    "ks_flash_attention": (_S, [_T, _T, _T, _T, _T, _T, _V, _V]),
    "ks_flash_attention_varlen": (_S, [_T, _T, _T, _T, _T, _I64, _I64, _T, _T, _T, _V, _V]),
    "ks_mla_decode": (_S, [_T, _T, _T, _T, _T, _I64, _T, _T, _T, _V, _V]),
}

# ks_api_t: the fields after (size, abi_major, abi_minor), in order
API_TABLE = ["last_error", "status_name", "build_info", "options_init", "query_support", "rms_norm",
             "fused_add_rms_norm", "layer_norm", "silu_and_mul", "gelu_and_mul", "swiglu", "gelu", "swiglu_oai",
             "softmax", "log_softmax", "cross_entropy", "embedding", "rotary_embedding", "mrope", "qk_norm_rope",
             "reshape_and_cache", "copy_blocks", "paged_attention_workspace_size", "paged_attention",
             "merge_attn_states", "flash_attention", "flash_attention_varlen", "mla_decode"]


class ApiTable(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("abi_major", c_int32), ("abi_minor", c_int32)] + [(n, c_void_p) for n in API_TABLE]
