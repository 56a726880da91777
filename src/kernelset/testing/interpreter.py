"""Make Triton's CPU interpreter round fp32 -> bf16 as the GPU does (to nearest even).

The interpreter (Triton 3.6-3.9) truncates on fp32 -> bf16 casts, and its RTNE path neither
carries into the exponent nor breaks ties to even. GPUs round to nearest even, so without this
patch a bit-exact test (x + residual equals torch's bf16 add) would fail on CPU only. Installed
by kernelset when it wraps its first interpreted kernel (``ops/common/fast_launch.py``: Triton is
imported then, never at import of kernelset); calling it again does nothing.
"""
from __future__ import annotations

import numpy as np


def _f32_to_bf16_bits(data: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(data, dtype=np.float32).view(np.uint32)
    rounded = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)
    nan = np.isnan(data.astype(np.float32))
    return np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)


def patch_bf16_rounding() -> bool:
    """Install the fix; returns False (doing nothing) if this Triton has no interpreter builder."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except Exception:
        return False
    builder = getattr(interpreter, "InterpreterBuilder", None)
    if builder is None or getattr(builder, "_ks_bf16_rtne", False):
        return builder is not None
    original = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return interpreter.TensorHandle(_f32_to_bf16_bits(src.data), dst_type.scalar)
        return original(self, src, dst_type)

    builder.cast_impl = cast_impl
    builder.create_fp_trunc = lambda self, src, dst_type: cast_impl(self, src, dst_type)
    original_fp_to_fp = builder.create_fp_to_fp

    def fp_to_fp(self, src, dst_type, rounding_mode):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return cast_impl(self, src, dst_type)
        return original_fp_to_fp(self, src, dst_type, rounding_mode)

    builder.create_fp_to_fp = fp_to_fp
    builder._ks_bf16_rtne = True
    return True
