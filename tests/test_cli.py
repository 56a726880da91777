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
    # a misspelt op used to select nothing and report "0 passed, 0 failed" with exit code 0
    (["verify", "rmsnorm"], "unknown op 'rmsnorm'; declared ops:"),
    # an unknown device used to end in torch.device's RuntimeError traceback
    (["explain", "rms_norm", "--shape", "4x64", "--device", "gpu0"], "device must look like cpu, cuda or cuda:1, "
                                                                     "got 'gpu0'"),
    # an allocation failure used to end in the allocator's RuntimeError traceback
    (["explain", "rms_norm", "--shape", "100000000x1000000", "--device", "cpu"],
     "rms_norm: cannot allocate example inputs of shape 100000000x1000000 on cpu: "),
], ids=["empty-dim", "too-few-dims", "not-json", "negative-tokens", "unknown-op", "unknown-device", "too-large"])
def test_bad_arguments_get_a_clear_message(argv, message, capsys):
    # one line naming what is wrong, exit code 2: not a traceback, not "not enough values to unpack"
    from kernelset import cli
    try:
        rc = cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch that cannot use CUDA")
def test_explain_on_an_unusable_device(capsys):
    # torch without CUDA raised AssertionError("Torch not compiled with CUDA enabled"): a traceback
    from kernelset import cli
    rc = cli.main(["explain", "rms_norm", "--shape", "4x64", "--device", "cuda"])
    err = capsys.readouterr().err
    assert rc == 2 and "rms_norm: cannot allocate example inputs of shape 4x64 on cuda: " in err, err


def _verify_with_runner(monkeypatch, capsys, runner):
    """ksctl verify softmax at one small shape, its runners replaced by ``runner(outs)``."""
    import dataclasses

    from kernelset import cli
    from kernelset.ops.softmax import bench
    adapter = bench.ADAPTERS["softmax"]

    def ours(inp, mode, backend):
        run = adapter.ours(inp, mode, backend)
        return lambda: runner(run())

    monkeypatch.setitem(bench.ADAPTERS, "softmax", dataclasses.replace(adapter, ours=ours))
    monkeypatch.setattr(cli, "VERIFY_SHAPES", ((1, 64),))
    rc = cli.main(["verify", "softmax"])
    return rc, capsys.readouterr().out


@pytest.mark.parametrize("runner", [lambda outs: (), lambda outs: outs[:1]], ids=["no-outputs", "no-gradient"])
def test_verify_fails_a_runner_that_returns_fewer_outputs(monkeypatch, capsys, runner):
    # outputs were paired with references through zip(): a runner returning fewer passed
    rc, out = _verify_with_runner(monkeypatch, capsys, runner)
    rows = [ln for ln in out.splitlines() if ln.startswith("softmax ") and " fwd+bwd " in ln]
    assert rc == 1 and len(rows) == 4, out[-2000:]  # (two backends, two dtypes)
    assert all("FAIL: " in ln and "outputs for 2 references and 2 names" in ln for ln in rows), out[-2000:]


def test_verify_counts_a_crashing_runner_as_a_failure(monkeypatch, capsys):
    # a ValueError from a kernel used to abort verify as a bad-argument error (exit code 2)
    def runner(outs):
        raise ValueError("kernel exploded")

    rc, out = _verify_with_runner(monkeypatch, capsys, runner)
    assert rc == 1 and "FAIL: ValueError: kernel exploded" in out and "\n0 passed, 8 failed" in out, out[-2000:]


def test_verify_passes_correct_runners(monkeypatch, capsys):
    rc, out = _verify_with_runner(monkeypatch, capsys, lambda outs: outs)
    assert rc == 0 and " 0 failed" in out and "FAIL" not in out, out[-2000:]
