"""The C ABI on a GPU (marker ``gpu``; skipped without CUDA): every exported op called through
ks.capi on CUDA tensors gives the Python path's outputs bit for bit and runs within 5% of its
kernel time, and the CUDA launcher alone (capi/aot/smoke_gpu.c, no torch) matches a CPU
computation. The cases are the generator's GPU cases (capi/aot/ops, ``gpu`` ids); the logic
lives in scripts/capi_gpu_check.py, which prints the same comparison as a table.

Needs libkernelset.so built with CUDA kernels (scripts/build_capi.sh, or the script itself).
"""
from __future__ import annotations

import importlib.util
import os
import sys
import tempfile

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("capi_gpu_check", os.path.join(ROOT, "scripts", "capi_gpu_check.py"))
check = sys.modules.setdefault("capi_gpu_check", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(check)

pytestmark = pytest.mark.gpu

CASES = check.gpu_cases()


@pytest.fixture(scope="module")
def library():
    from kernelset import capi
    if not capi.available():
        pytest.skip(f"{capi.library_path()} is not built: run scripts/build_capi.sh (or scripts/capi_gpu_check.py)")
    info = capi.build_info()
    if "cuda: none" in info:
        pytest.skip(f"libkernelset.so has no CUDA kernels ({info}): build it where Triton's NVIDIA backend works")
    return info


@pytest.mark.parametrize("op,case", CASES, ids=[c["gpu"] for _, c in CASES])
def test_op_matches_python_bitwise_and_in_time(library, op, case):
    device = torch.device("cuda", torch.cuda.current_device())
    r = check.run_case(op, case, reps=10, device=device)
    if r.status == "skipped":
        pytest.skip(r.detail)
    assert r.status != "error", f"{r.c_op}: {r.detail}"
    assert r.status != "mismatch", f"{r.c_op} differs from the Python path: {r.detail}"
    assert r.ratio <= check.TIME_BAR, (f"{r.c_op}: {r.capi_us:.1f} us through the C ABI against {r.python_us:.1f} us "
                                       f"in Python ({r.timing})")


def test_smoke_program_matches_the_cpu(library):
    with tempfile.TemporaryDirectory() as tmp:
        rc, out = check.run_smoke(check.build_smoke(tmp), torch.cuda.current_device())
    assert rc == 0, out
    assert "all cases match" in out, out
