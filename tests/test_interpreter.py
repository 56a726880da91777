"""Triton's CPU interpreter rounds fp32 -> bf16 as a GPU does whenever kernelset runs a kernel in it.

The interpreter truncates those casts (bf16 results off by an ulp in most elements); the fix,
``kernelset.testing.interpreter.patch_bf16_rounding``, is installed by kernelset itself at its first
interpreted kernel, not only by the tests' conftest and ksctl. Checked in a fresh process that never
calls the patch: the conftest of this process has already installed it here.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

_SCRIPT = r"""
import sys
import torch
import kernelset as ks
assert "triton" not in sys.modules, "import kernelset imported Triton"
from triton.runtime import interpreter
assert not getattr(interpreter.InterpreterBuilder, "_ks_bf16_rtne", False), "patched before any kernel ran"
torch.manual_seed(0)
x = torch.randn(8, 300, dtype=torch.bfloat16)
r = torch.randn(8, 300, dtype=torch.bfloat16)
w = torch.randn(300, dtype=torch.bfloat16)
out = ks.fused_add_rms_norm(x, r.clone(), w, backend="triton")
# x + residual is one fp32 add rounded once: torch's bf16 add, bit for bit (truncation misses ~half)
assert torch.equal(out.residual, x + r), (out.residual != x + r).float().mean().item()
g = torch.randn(16, 2 * 257, dtype=torch.bfloat16)
got = ks.silu_and_mul(g, backend="triton")
want = ks.silu_and_mul(g, backend="reference")
exact = (got == want).float().mean().item()
ulp = (got.float() - want.float()).abs() <= want.float().abs() * 2.0**-7 + 1e-30
assert exact >= 0.98 and bool(ulp.all()), (exact, (got.float() - want.float()).abs().max().item())
print("ok", exact)
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs where there is no GPU")
def test_bf16_rounds_to_nearest_even_without_the_tests_patch():
    env = {k: v for k, v in os.environ.items() if not k.startswith("KS_")}
    env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stdout[-2000:] + proc.stderr[-4000:]


def test_patch_is_idempotent():
    from kernelset.testing.interpreter import patch_bf16_rounding
    from triton.runtime import interpreter
    builder = interpreter.InterpreterBuilder
    if not patch_bf16_rounding():
        pytest.skip("this Triton has no interpreter builder")
    cast = builder.cast_impl
    assert patch_bf16_rounding() and builder.cast_impl is cast  # a second call wraps nothing again
