"""The main job's CLI path on a CPU-only machine: ksctl started without TRITON_INTERPRET must still
run every Triton kernel in the interpreter (Triton decides at import, so ksctl restarts itself)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter path is for CPU-only machines")
def test_verify_without_interpreter_env_runs_triton_kernels():
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "KS_CLI_REEXEC")}
    proc = subprocess.run([sys.executable, "-m", "kernelset", "verify", "clip_grad_norm", "softmax"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("clip_grad_norm ", "softmax "))]
    assert any(" triton " in ln and ln.rstrip().endswith("ok") for ln in lines), proc.stdout[-2000:]
    assert " 0 failed" in proc.stdout
