"""kernelset's C ABI (libkernelset.so, capi/include/kernelset.h) from Python, through ctypes.

    from kernelset import capi
    y = capi.rms_norm(x, w, eps=1e-6)            # the C library's rms_norm on torch tensors
    capi.query_support("rms_norm", [x, w, y])    # Support(status=0, name='KS_OK', message='')

Tensors are handed over as DLPack DLTensors that point at the tensors' own memory (no copies;
strides and storage offsets included). Each wrapper mirrors one function of the header: tensors
positional in the header's order, options as keywords (or a ready struct from ``options()``),
outputs allocated like the Python API's unless passed as ``out=``; ``stream`` defaults to
torch.cuda.current_stream() for CUDA tensors and is ignored on CPU. A failed call raises
``KsError`` with the C status and ks_last_error()'s message.

The library is built by scripts/build_capi.sh into ``library_path()``; ``load()`` says so when it
is missing.
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, NamedTuple, Sequence

import torch

from . import _abi
from ._abi import OPS, OPTIONS, STATUS, ApiTable, DLDataType, DLTensor

__all__ = [
    "ApiTable", "DLTensor", "KsError", "LibraryNotBuilt", "OPS", "Support", "abi_version", "api_table", "available",
    "build_info", "library_path", "load", "options", "query_support", "status_name", "to_dltensor",
    "rms_norm", "fused_add_rms_norm", "layer_norm", "silu_and_mul", "gelu_and_mul", "swiglu", "gelu", "swiglu_oai",
    "softmax", "log_softmax", "cross_entropy", "embedding", "rotary_embedding", "mrope", "qk_norm_rope",
    "reshape_and_cache", "copy_blocks", "paged_attention_workspace_size", "paged_attention", "merge_attn_states",
    "flash_attention", "flash_attention_varlen", "mla_decode",
]

_LIB_NAME = "libkernelset.so"


def library_path() -> str:
    """Where scripts/build_capi.sh installs libkernelset.so (inside this package)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", _LIB_NAME)


class LibraryNotBuilt(RuntimeError):
    """libkernelset.so is not at library_path()."""


class KsError(Exception):
    """A C call returned a status other than KS_OK."""

    def __init__(self, status: int, message: str, function: str = ""):
        self.status = int(status)
        self.message = message
        self.status_name = STATUS.get(self.status, f"status {self.status}")
        self.function = function
        super().__init__(f"{function + ': ' if function else ''}{self.status_name}: {message}")


_lib: ctypes.CDLL | None = None
_lock = threading.Lock()


def load() -> ctypes.CDLL:
    """The loaded library with every function's prototype set (once per process)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = library_path()
            if not os.path.exists(path):
                raise LibraryNotBuilt(f"{path} does not exist: build the C library with scripts/build_capi.sh")
            lib = ctypes.CDLL(path)
            for name, (restype, argtypes) in _abi.FUNCTIONS.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = restype, argtypes
            major, minor = ctypes.c_int32(), ctypes.c_int32()
            lib.ks_abi_version(ctypes.byref(major), ctypes.byref(minor))
            if major.value != _abi.ABI_MAJOR or minor.value < _abi.ABI_MINOR:
                raise LibraryNotBuilt(f"{path} implements ABI {major.value}.{minor.value}; this module needs "
                                      f"{_abi.ABI_MAJOR}.{_abi.ABI_MINOR} or a newer minor: rebuild it")
            _lib = lib
    return _lib


def available() -> bool:
    """Whether the library is built and loads."""
    try:
        load()
    except (LibraryNotBuilt, OSError):
        return False
    return True


# ---- library-level functions


def build_info() -> str:
    return load().ks_build_info().decode()


def abi_version() -> tuple[int, int]:
    major, minor = ctypes.c_int32(), ctypes.c_int32()
    load().ks_abi_version(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def status_name(status: int) -> str:
    return load().ks_status_name(status).decode()


def last_error() -> str:
    """This thread's last message (ks_last_error)."""
    return load().ks_last_error().decode()


def _check(status: int, function: str) -> None:
    if status != _abi.OK:
        raise KsError(status, last_error(), function)


def api_table(major: int = _abi.ABI_MAJOR, min_minor: int = _abi.ABI_MINOR) -> ApiTable:
    """ks_get_api(major, min_minor): the function table (a copy of its fixed fields and pointers)."""
    ptr = ctypes.c_void_p()
    _check(load().ks_get_api(major, min_minor, ctypes.byref(ptr)), "ks_get_api")
    return ApiTable.from_address(ptr.value)


# ---- tensors

_DTYPES = {
    torch.float32: (_abi.KDL_FLOAT, 32), torch.float16: (_abi.KDL_FLOAT, 16), torch.bfloat16: (_abi.KDL_BFLOAT, 16),
    torch.float64: (_abi.KDL_FLOAT, 64), torch.float8_e4m3fn: (_abi.KDL_FLOAT8_E4M3FN, 8),
    torch.float8_e5m2: (_abi.KDL_FLOAT8_E5M2, 8), torch.int8: (_abi.KDL_INT, 8), torch.int16: (_abi.KDL_INT, 16),
    torch.int32: (_abi.KDL_INT, 32), torch.int64: (_abi.KDL_INT, 64), torch.uint8: (_abi.KDL_UINT, 8),
    torch.bool: (_abi.KDL_BOOL, 8),
}


def to_dltensor(t: torch.Tensor) -> DLTensor:
    """A DLTensor describing ``t`` in place: its storage pointer plus byte_offset, its shape and
    element strides. The result keeps ``t`` (and its shape/stride arrays) alive."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"to_dltensor: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"to_dltensor: dtype {t.dtype} has no DLPack code here")
    if t.device.type == "cpu":
        device = _abi.DLDevice(_abi.KDL_CPU, 0)
    elif t.device.type == "cuda":
        device = _abi.DLDevice(_abi.KDL_CUDA, t.device.index if t.device.index is not None else 0)
    else:
        raise TypeError(f"to_dltensor: device {t.device} is not cpu or cuda")
    nd = t.dim()
    shape = (ctypes.c_int64 * max(nd, 1))(*t.shape)
    strides = (ctypes.c_int64 * max(nd, 1))(*t.stride())
    code, bits = _DTYPES[t.dtype]
    dl = DLTensor()
    dl.data = t.untyped_storage().data_ptr() or None
    dl.byte_offset = t.storage_offset() * t.element_size()
    dl.device = device
    dl.ndim = nd
    dl.dtype = DLDataType(code, bits, 1)
    dl.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    dl.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    dl._keep = (t, shape, strides)  # ctypes only holds raw pointers
    return dl


def _dl(x: Any, keep: list) -> Any:
    """Argument for a DLTensor* parameter: None -> NULL; torch.Tensor or DLTensor -> pointer."""
    if x is None:
        return None
    dl = x if isinstance(x, DLTensor) else to_dltensor(x)
    keep.append(dl)
    return ctypes.pointer(dl)


def _stream(stream: Any, *tensors: Any) -> int | None:
    if stream is not None:
        return getattr(stream, "cuda_stream", stream)
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_cuda:
            return torch.cuda.current_stream(t.device).cuda_stream
    return None


# ---- options

def _field_value(name: str, ctype: Any, value: Any) -> Any:
    enum = _abi.FIELD_ENUMS.get(name)
    if enum is not None and not isinstance(value, int):
        key = str(getattr(value, "value", value)).lower()
        if key not in enum:
            raise ValueError(f"options: {name} must be one of {sorted(enum)} (or its int), got {value!r}")
        return enum[key]
    if name == "softcap" and value is None:
        return 0.0
    if isinstance(value, bool):
        return int(value)
    if issubclass(ctype, ctypes.Array):
        return ctype(*value)
    return value


def options(op: str, size: int | None = None, **fields: Any) -> ctypes.Structure:
    """The option struct of ``op`` with the library's defaults (ks_options_init) and ``fields`` set.

    ``size`` (default: the full struct) makes the struct an older caller's: the library reads
    only its first ``size`` bytes; setting a field beyond them is refused here."""
    if op not in OPTIONS:
        raise ValueError(f"options: {op!r} takes no options (ops with options: {sorted(OPTIONS)})")
    cls = OPTIONS[op]
    o = cls()
    n = ctypes.sizeof(cls) if size is None else size
    _check(load().ks_options_init(OPS[op], ctypes.addressof(o), n), "ks_options_init")
    types = dict(cls._fields_)
    names = list(types)
    for name, value in fields.items():
        if name not in names or name == "size":
            raise TypeError(f"options: {cls.__name__} has no field {name!r} (fields: {names[1:]})")
        f = getattr(cls, name)
        if f.offset + f.size > n:
            raise ValueError(f"options: {name} lies beyond size {n} of this {cls.__name__}")
        setattr(o, name, _field_value(name, types[name], value))
    return o


def _opts(op: str, given: ctypes.Structure | None, **fields: Any) -> ctypes.Structure:
    return given if given is not None else options(op, **fields)


def _addr(o: ctypes.Structure | None) -> int | None:
    return None if o is None else ctypes.addressof(o)


# ---- ks_query_support


class Support(NamedTuple):
    status: int
    name: str  # "KS_OK", "KS_ERR_UNSUPPORTED_DTYPE" ...
    message: str

    @property
    def ok(self) -> bool:
        return self.status == _abi.OK


def query_support(op: str | int, tensors: Sequence[Any], options: ctypes.Structure | None = None) -> Support:
    """ks_query_support: whether ``op`` would run on these tensors (in signature order, None for
    absent ones; only metadata is read) and options, and why not."""
    keep: list = []
    arr = (ctypes.POINTER(DLTensor) * max(len(tensors), 1))(*[_dl(t, keep) for t in tensors])
    st = load().ks_query_support(OPS[op] if isinstance(op, str) else op, arr, len(tensors), _addr(options))
    return Support(st, STATUS.get(st, f"status {st}"), last_error() if st else "")


# ---- ops (one wrapper per function of kernelset.h)


def _call(function: str, *args: Any) -> None:
    _check(getattr(load(), function)(*args), function)


def _like(x: Any, shape: Sequence[int] | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError("pass the output tensor (out=...) when inputs are raw DLTensors")
    return torch.empty(tuple(x.shape) if shape is None else tuple(shape), dtype=dtype or x.dtype, device=x.device)


def rms_norm(x, weight=None, *, eps: float = 1e-6, offset: float = 0.0, cast: str = "llama", out=None, stream=None,
             options=None) -> torch.Tensor:
    """ks_rms_norm: out = x * rsqrt(mean(x^2) + eps) * (offset + weight) over the last dim."""
    out = _like(x) if out is None else out
    o = _opts("rms_norm", options, eps=eps, offset=offset, cast=cast)
    k: list = []
    _call("ks_rms_norm", _dl(x, k), _dl(weight, k), _dl(out, k), _addr(o), _stream(stream, x))
    return out


def fused_add_rms_norm(x, residual, weight=None, *, eps: float = 1e-6, offset: float = 0.0, cast: str = "llama",
                       out=None, stream=None, options=None) -> tuple[torch.Tensor, torch.Tensor]:
    """ks_fused_add_rms_norm: h = x + residual is written into residual; returns (out = rms_norm(h), residual).
    ``out=x`` runs in place (the vLLM convention)."""
    out = _like(x) if out is None else out
    o = _opts("fused_add_rms_norm", options, eps=eps, offset=offset, cast=cast)
    k: list = []
    _call("ks_fused_add_rms_norm", _dl(x, k), _dl(residual, k), _dl(weight, k), _dl(out, k), _addr(o),
          _stream(stream, x))
    return out, residual


def layer_norm(x, weight=None, bias=None, *, eps: float = 1e-5, out=None, stream=None, options=None) -> torch.Tensor:
    """ks_layer_norm: out = (x - mean) * rsqrt(var + eps) * weight + bias over the last dim."""
    out = _like(x) if out is None else out
    o = _opts("layer_norm", options, eps=eps)
    k: list = []
    _call("ks_layer_norm", _dl(x, k), _dl(weight, k), _dl(bias, k), _dl(out, k), _addr(o), _stream(stream, x))
    return out


def _half_last(x) -> tuple[int, ...]:
    return (*x.shape[:-1], x.shape[-1] // 2) if isinstance(x, torch.Tensor) else ()


def silu_and_mul(x, *, out=None, stream=None) -> torch.Tensor:
    """ks_silu_and_mul: x [..., 2I] -> silu(x[..., :I]) * x[..., I:]."""
    out = _like(x, _half_last(x)) if out is None else out
    k: list = []
    _call("ks_silu_and_mul", _dl(x, k), _dl(out, k), _stream(stream, x))
    return out


def gelu_and_mul(x, *, approximate: str = "none", out=None, stream=None, options=None) -> torch.Tensor:
    """ks_gelu_and_mul: x [..., 2I] -> gelu(x[..., :I]) * x[..., I:]."""
    out = _like(x, _half_last(x)) if out is None else out
    o = _opts("gelu_and_mul", options, approximate=approximate)
    k: list = []
    _call("ks_gelu_and_mul", _dl(x, k), _dl(out, k), _addr(o), _stream(stream, x))
    return out


def swiglu(gate, up, *, out=None, stream=None) -> torch.Tensor:
    """ks_swiglu: silu(gate) * up."""
    out = _like(gate) if out is None else out
    k: list = []
    _call("ks_swiglu", _dl(gate, k), _dl(up, k), _dl(out, k), _stream(stream, gate))
    return out


def gelu(x, *, approximate: str = "none", out=None, stream=None, options=None) -> torch.Tensor:
    """ks_gelu: gelu(x) elementwise (erf, or the tanh approximation)."""
    out = _like(x) if out is None else out
    o = _opts("gelu", options, approximate=approximate)
    k: list = []
    _call("ks_gelu", _dl(x, k), _dl(out, k), _addr(o), _stream(stream, x))
    return out


def swiglu_oai(x, *, alpha: float = 1.702, limit: float = 7.0, out=None, stream=None, options=None) -> torch.Tensor:
    """ks_swiglu_oai: gpt-oss clamped SwiGLU of x [..., 2I] with interleaved (gate, up) pairs."""
    out = _like(x, _half_last(x)) if out is None else out
    o = _opts("swiglu_oai", options, alpha=alpha, limit=limit)
    k: list = []
    _call("ks_swiglu_oai", _dl(x, k), _dl(out, k), _addr(o), _stream(stream, x))
    return out


def softmax(x, *, temperature: float = 1.0, out_dtype: torch.dtype | None = None, out=None, stream=None,
            options=None) -> torch.Tensor:
    """ks_softmax: softmax(x / temperature) over the last dim, in out's dtype (default x.dtype)."""
    out = _like(x, dtype=out_dtype) if out is None else out
    o = _opts("softmax", options, temperature=temperature)
    k: list = []
    _call("ks_softmax", _dl(x, k), _dl(out, k), _addr(o), _stream(stream, x))
    return out


def log_softmax(x, *, temperature: float = 1.0, out_dtype: torch.dtype | None = None, out=None, stream=None,
                options=None) -> torch.Tensor:
    """ks_log_softmax: log_softmax(x / temperature) over the last dim."""
    out = _like(x, dtype=out_dtype) if out is None else out
    o = _opts("log_softmax", options, temperature=temperature)
    k: list = []
    _call("ks_log_softmax", _dl(x, k), _dl(out, k), _addr(o), _stream(stream, x))
    return out


def cross_entropy(logits, target, *, ignore_index: int = -100, label_smoothing: float = 0.0, z_loss: float = 0.0,
                  softcap: float | None = None, reduction: str = "mean", out=None, stream=None,
                  options=None) -> torch.Tensor:
    """ks_cross_entropy: float32 loss, target's shape for reduction "none", else 0-d."""
    o = _opts("cross_entropy", options, ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss,
              softcap=softcap, reduction=reduction)
    if out is None:
        # an older struct without the reduction field gets the library's default (mean)
        f = type(o).reduction
        red = o.reduction if o.size >= f.offset + f.size else _abi.REDUCTION["mean"]
        shape = tuple(target.shape) if red == _abi.REDUCTION["none"] else ()
        out = _like(logits, shape, torch.float32)
    k: list = []
    _call("ks_cross_entropy", _dl(logits, k), _dl(target, k), _dl(out, k), _addr(o), _stream(stream, logits))
    return out


def embedding(ids, weight, *, out=None, stream=None) -> torch.Tensor:
    """ks_embedding: out[..., :] = weight[ids[...], :]."""
    if out is None:
        out = _like(weight, (*ids.shape, weight.shape[1]))
    k: list = []
    _call("ks_embedding", _dl(ids, k), _dl(weight, k), _dl(out, k), _stream(stream, weight))
    return out


def rotary_embedding(positions, q, k, cos_sin_cache, *, interleaved: bool = False, rotary_dim: int = 0,
                     head_size: int = 0, stream=None, options=None):
    """ks_rotary_embedding, in place on q and k; returns (q, k)."""
    o = _opts("rotary_embedding", options, interleaved=interleaved, rotary_dim=rotary_dim, head_size=head_size)
    keep: list = []
    _call("ks_rotary_embedding", _dl(positions, keep), _dl(q, keep), _dl(k, keep), _dl(cos_sin_cache, keep), _addr(o),
          _stream(stream, q))
    return q, k


def mrope(positions, q, k, cos_sin_cache, *, mrope_section: Sequence[int] = (0, 0, 0),
          interleaved: bool = False, rotary_dim: int = 0, head_size: int = 0, mrope_interleaved: bool = False,
          stream=None, options=None):
    """ks_mrope (positions [3, T]), in place on q and k; returns (q, k)."""
    o = _opts("mrope", options, mrope_section=mrope_section, interleaved=interleaved, rotary_dim=rotary_dim,
              head_size=head_size, mrope_interleaved=mrope_interleaved)
    keep: list = []
    _call("ks_mrope", _dl(positions, keep), _dl(q, keep), _dl(k, keep), _dl(cos_sin_cache, keep), _addr(o),
          _stream(stream, q))
    return q, k


def qk_norm_rope(q, k, q_weight, k_weight, cos_sin_cache, positions, *, eps: float = 1e-6, offset: float = 0.0,
                 cast: str = "llama", interleaved: bool = False, rotary_dim: int = 0, head_size: int = 0,
                 mrope_section: Sequence[int] = (0, 0, 0), mrope_interleaved: bool = False, stream=None,
                 options=None):
    """ks_qk_norm_rope: per-head RMSNorm of q and k then RoPE, in place; returns (q, k)."""
    o = _opts("qk_norm_rope", options, eps=eps, offset=offset, cast=cast, interleaved=interleaved,
              rotary_dim=rotary_dim, head_size=head_size, mrope_section=mrope_section,
              mrope_interleaved=mrope_interleaved)
    keep: list = []
    _call("ks_qk_norm_rope", _dl(q, keep), _dl(k, keep), _dl(q_weight, keep), _dl(k_weight, keep),
          _dl(cos_sin_cache, keep), _dl(positions, keep), _addr(o), _stream(stream, q))
    return q, k


def reshape_and_cache(key, value, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None, *, stream=None) -> None:
    """ks_reshape_and_cache: key/value [T, Hkv, D] into the paged caches at slot_mapping (-1 skips)."""
    keep: list = []
    _call("ks_reshape_and_cache", _dl(key, keep), _dl(value, keep), _dl(k_cache, keep), _dl(v_cache, keep),
          _dl(slot_mapping, keep), _dl(k_scale, keep), _dl(v_scale, keep), _stream(stream, key))


def copy_blocks(k_caches: Sequence[Any], v_caches: Sequence[Any], block_mapping, *, num_layers: int | None = None,
                stream=None) -> None:
    """ks_copy_blocks: block_mapping [N, 2] (src, dst) pairs, for each layer's k and v cache."""
    keep: list = []
    n = len(k_caches) if num_layers is None else num_layers
    kp = (ctypes.POINTER(DLTensor) * max(len(k_caches), 1))(*[_dl(t, keep) for t in k_caches])
    vp = (ctypes.POINTER(DLTensor) * max(len(v_caches), 1))(*[_dl(t, keep) for t in v_caches])
    first = next((t for t in list(k_caches) + list(v_caches) if isinstance(t, torch.Tensor)), None)
    _call("ks_copy_blocks", kp, vp, n, _dl(block_mapping, keep), _stream(stream, first))


def paged_attention_workspace_size(q, k_cache, max_seq_len: int = 0) -> int:
    """ks_paged_attention_workspace_size: bytes of the split-KV workspace (sized for the most KV splits any GPU takes; 0 when q is empty)."""
    keep: list = []
    n = ctypes.c_size_t()
    _call("ks_paged_attention_workspace_size", _dl(q, keep), _dl(k_cache, keep), max_seq_len, ctypes.byref(n))
    return n.value


def _attn_out(q, v_dim_of, lse_shape, out, lse, return_lse):
    if out is None:
        out = _like(q, (*q.shape[:-1], v_dim_of.shape[-1]))
    if lse is None and return_lse:
        lse = _like(q, lse_shape, torch.float32)
    return out, lse


def paged_attention(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q=None, max_seqlen_q: int = 0,
                    max_seq_len: int = 0, sinks=None, k_scale=None, v_scale=None, *, out=None, lse=None,
                    return_lse: bool = False, workspace=None, scale: float = 0.0, causal: bool = True,
                    window_left: int = -1, window_right: int = -1, softcap: float = 0.0, stream=None, options=None):
    """ks_paged_attention; returns out, or (out, lse) when lse is given or return_lse.

    With cu_seqlens_q and max_seqlen_q 0, the longest query is read from cu_seqlens_q (a host sync;
    pass it to stay graph-capturable)."""
    if cu_seqlens_q is not None and not max_seqlen_q and isinstance(cu_seqlens_q, torch.Tensor) \
            and cu_seqlens_q.numel() > 1:
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    lse_shape = tuple(q.shape[:2]) if isinstance(q, torch.Tensor) else ()
    out, lse = _attn_out(q, v_cache, lse_shape, out, lse, return_lse)
    o = _opts("paged_attention", options, scale=scale, causal=causal, window_left=window_left,
              window_right=window_right, softcap=softcap)
    keep: list = []
    _call("ks_paged_attention", _dl(q, keep), _dl(k_cache, keep), _dl(v_cache, keep), _dl(block_table, keep),
          _dl(seq_lens, keep), _dl(cu_seqlens_q, keep), max_seqlen_q, max_seq_len, _dl(sinks, keep),
          _dl(k_scale, keep), _dl(v_scale, keep), _dl(out, keep), _dl(lse, keep), _dl(workspace, keep), _addr(o),
          _stream(stream, q))
    return (out, lse) if lse is not None else out


def merge_attn_states(out_a, lse_a, out_b, lse_b, *, out=None, lse=None, return_lse: bool = False, stream=None):
    """ks_merge_attn_states; returns out, or (out, lse) when lse is given or return_lse."""
    out = _like(out_a) if out is None else out
    if lse is None and return_lse:
        lse = _like(lse_a)
    keep: list = []
    _call("ks_merge_attn_states", _dl(out_a, keep), _dl(lse_a, keep), _dl(out_b, keep), _dl(lse_b, keep),
          _dl(out, keep), _dl(lse, keep), _stream(stream, out_a))
    return (out, lse) if lse is not None else out


def flash_attention(q, k, v, sinks=None, *, out=None, lse=None, return_lse: bool = False, scale: float = 0.0,
                    causal: bool = False, window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                    stream=None, options=None):
    """ks_flash_attention: q [B, S, Hq, D]; out [B, S, Hq, Dv]; lse [B, Hq, S]."""
    lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if isinstance(q, torch.Tensor) else ()
    out, lse = _attn_out(q, v, lse_shape, out, lse, return_lse)
    o = _opts("flash_attention", options, scale=scale, causal=causal, window_left=window_left,
              window_right=window_right, softcap=softcap)
    keep: list = []
    _call("ks_flash_attention", _dl(q, keep), _dl(k, keep), _dl(v, keep), _dl(sinks, keep), _dl(out, keep),
          _dl(lse, keep), _addr(o), _stream(stream, q))
    return (out, lse) if lse is not None else out


def flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, sinks=None, *,
                           out=None, lse=None, return_lse: bool = False, scale: float = 0.0, causal: bool = False,
                           window_left: int = -1, window_right: int = -1, softcap: float = 0.0, stream=None,
                           options=None):
    """ks_flash_attention_varlen: q [T, Hq, D]; out [T, Hq, Dv]; lse [Hq, T]."""
    lse_shape = (q.shape[1], q.shape[0]) if isinstance(q, torch.Tensor) else ()
    out, lse = _attn_out(q, v, lse_shape, out, lse, return_lse)
    o = _opts("flash_attention_varlen", options, scale=scale, causal=causal, window_left=window_left,
              window_right=window_right, softcap=softcap)
    keep: list = []
    _call("ks_flash_attention_varlen", _dl(q, keep), _dl(k, keep), _dl(v, keep), _dl(cu_seqlens_q, keep),
          _dl(cu_seqlens_k, keep), max_seqlen_q, max_seqlen_k, _dl(sinks, keep), _dl(out, keep), _dl(lse, keep),
          _addr(o), _stream(stream, q))
    return (out, lse) if lse is not None else out


def mla_decode(q_nope, q_pe, kv_cache, block_table, seq_lens, max_seq_len: int = 0, kv_scale=None, *, out=None,
               lse=None, return_lse: bool = False, scale: float = 0.0, kv_lora_rank: int = 512, rope_dim: int = 64,
               stream=None, options=None):
    """ks_mla_decode: q_nope [B, H, R], q_pe [B, H, P]; out [B, H, R]; lse [B, H]. ``scale`` is
    required (the library refuses its default 0); returns out, or (out, lse) when lse is given or
    return_lse."""
    lse_shape = tuple(q_nope.shape[:2]) if isinstance(q_nope, torch.Tensor) else ()
    out, lse = _attn_out(q_nope, q_nope, lse_shape, out, lse, return_lse)
    o = _opts("mla_decode", options, scale=scale, kv_lora_rank=kv_lora_rank, rope_dim=rope_dim)
    keep: list = []
    _call("ks_mla_decode", _dl(q_nope, keep), _dl(q_pe, keep), _dl(kv_cache, keep), _dl(block_table, keep),
          _dl(seq_lens, keep), max_seq_len, _dl(kv_scale, keep), _dl(out, keep), _dl(lse, keep), _addr(o),
          _stream(stream, q_nope))
    return (out, lse) if lse is not None else out
