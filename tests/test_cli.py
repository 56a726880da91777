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


@pytest.mark.parametrize("argv,message", [
    (["explain", "rms_norm", "--shape", "4xx"], "shape must look like 4096x8192, got '4xx'"),
    (["explain", "rms_norm", "--shape", "4"], "rms_norm: cannot build example inputs from --shape 4"),
    (["plan", "--model", __file__], "is not a readable JSON config"),
    # a negative --tokens used to end in torch.empty's RuntimeError traceback
    (["plan", "--model", "llama-3-8b", "--tokens", "-5"], "tokens must be a positive integer, got -5"),
], ids=["empty-dim", "too-few-dims", "not-json", "negative-tokens"])
def test_bad_arguments_get_a_clear_message(argv, message, capsys):
    # one line naming what is wrong, exit code 2: not a traceback, not "not enough values to unpack"
    from kernelset import cli
    try:
        rc = cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err, err
