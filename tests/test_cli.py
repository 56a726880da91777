"""ksctl: the main job's path on a CPU-only machine (verify started without TRITON_INTERPRET still runs
every Triton kernel in the interpreter: Triton decides at import, so ksctl restarts itself, and says
so), while explain / plan answer for the user's own call; argument errors; each op's shape grammar;
eval's training step, progress and CPU guard; output hygiene (pipes, columns, JSON)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

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
    # said, not done behind the user's back: their own code on a CPU runs no Triton kernel without it
    assert "ksctl set TRITON_INTERPRET=1 for this run" in proc.stdout.splitlines()[0], proc.stdout[:500]


def _without_interpreter_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "KS_CLI_REEXEC")}


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a CPU-only machine's user gets")
def test_explain_answers_for_the_users_own_call_on_cpu():
    # ksctl explain restarted itself with TRITON_INTERPRET=1 and answered "chosen: triton", while
    # ksctl env said AUTO skips Triton and the user's own call ran the reference
    proc = subprocess.run([sys.executable, "-m", "kernelset", "explain", "rms_norm", "--shape", "4x64"],
                          capture_output=True, text=True, env=_without_interpreter_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "chosen: reference" in proc.stdout, proc.stdout
    assert ("note: Triton not run: no GPU; set TRITON_INTERPRET=1 to run Triton kernels in its interpreter"
            in proc.stdout), proc.stdout


@pytest.mark.parametrize("argv,message", [
    (["explain", "rms_norm", "--shape", "4xx"], "shape must look like 4096x8192, got '4xx'"),
    (["explain", "rms_norm", "--shape", "4"], "rms_norm: --shape 4: 1 dim, where the op takes ROWSxHIDDEN: "),
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


# ---- ksctl explain --shape: each op's grammar, honoured exactly or refused ---------------------------


def _explain_json(capsys, op: str, shape: str) -> dict:
    from kernelset import cli
    rc = cli.main(["explain", op, "--shape", shape, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    return out


@pytest.mark.parametrize("op,shape,problem", [
    ("flash_attention", "2x16x4x2x32", ["flash_attention [2x16x16x4x2x32] ", "causal=True"]),
    ("flash_attention", "1x8x4x16", ["flash_attention [1x8x8x4x4x16] "]),  # Hkv = Hq
    ("flash_attention", "2x16x4x2x32x0", ["causal=False"]),
    ("paged_attention", "3x40x4x2x32", ["q_heads=4 kv_heads=2 block_size=16 cache_dtype=bfloat16"]),
    ("paged_attention", "3x40x4x2x32x32x8", ["head_dim=32", "block_size=32 cache_dtype=float8_e4m3fn"]),
    ("mla_decode", "2x40x4x32x16", ["mla_decode [2x4x32] ", "kv_lora_rank=32 rope_dim=16 block_size=64"]),
    ("embedding", "5x50x32", ["embedding [5x50x32] "]),
    ("rotary_embedding", "7x4x2x32", ["rotary_embedding [7x128] ", "head_size=32"]),
], ids=["flash-gqa", "flash-mha", "flash-not-causal", "paged", "paged-fp8", "mla", "embedding", "rope"])
def test_explain_honours_the_shape(capsys, op, shape, problem):
    # these ops explained a built-in problem (flash_attention [2x77x77x4x2x64]) whatever the shape
    out = _explain_json(capsys, op, shape)
    assert all(p in out["problem"] for p in problem), out["problem"]


@pytest.mark.parametrize("op,shape,grammar", [
    ("flash_attention", "4096x128", "BxSxHqxD, BxSxHqxHkvxD or BxSxHqxHkvxDxCAUSAL: B sequences of S tokens"),
    ("paged_attention", "4096x128", "BxCTXxHqxD, BxCTXxHqxHkvxD or BxCTXxHqxHkvxDxBLOCKxBITS: "),
    ("mla_decode", "4096x128", "BxCTXxHxRxP or BxCTXxHxRxPxBLOCKxBITS: "),
    ("embedding", "64x256", "TxVxD: T token ids, a table of V rows"),  # was read as 64x97x256
    ("flash_attention", "1x8x4x2x16x2", "CAUSAL must be one of 0, 1, got 2"),
], ids=["flash", "paged", "mla", "embedding", "flash-causal-2"])
def test_explain_refuses_a_shape_the_op_does_not_take(capsys, op, shape, grammar):
    from kernelset import cli
    rc = cli.main(["explain", op, "--shape", shape])
    err = capsys.readouterr().err
    assert rc == 2 and f"ksctl: {op}: --shape {shape}: " in err and grammar in err, err


def test_explain_help_lists_every_ops_shape_grammar(capsys):
    import kernelset as ks
    from kernelset import cli
    with pytest.raises(SystemExit) as exc:
        cli.main(["explain", "--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0
    assert "  flash_attention         BxSxHqxD, BxSxHqxHkvxD or BxSxHqxHkvxDxCAUSAL: " in out, out
    assert all(f"\n  {e.name} " in out for e in ks.catalog()), out


# ---- ksctl eval: a real training step, progress, and no full-size model on a CPU by accident ---------


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU guard")
def test_eval_refuses_a_full_size_model_on_cpu(capsys, monkeypatch):
    # qwen3-0.6b without --tiny built 596M parameters and ran for 12 minutes printing nothing
    from kernelset import cli
    from kernelset.hf import evaluate

    def load_model(*a, **k):
        raise AssertionError("a full-size model was built")
    monkeypatch.setattr(evaluate, "load_model", load_model)
    rc = cli.main(["eval", "--model", "qwen3-0.6b", "--dtype", "fp32"])
    err = capsys.readouterr().err
    assert rc == 2 and "ksctl eval: qwen3-0.6b has ~" in err and "M parameters, ~" in err, err
    assert "Use --tiny" in err and "--allow-full-on-cpu" in err, err
    # the flag lets it through (to the loader, stubbed here)
    with pytest.raises(AssertionError, match="a full-size model was built"):
        cli.main(["eval", "--model", "qwen3-0.6b", "--dtype", "fp32", "--allow-full-on-cpu"])
    assert "building qwen3-0.6b on cpu (~" in capsys.readouterr().err


def test_eval_training_mode_runs_a_training_step(capsys):
    # --mode training ran the forward proof under no_grad: the training ops never ran, and it said PASS
    from kernelset import cli
    rc = cli.main(["eval", "--model", "llama-3.1-8b", "--tiny", "--dtype", "fp32", "--mode", "training",
                   "--prompt-tokens", "6", "--init-std", "0.2", "--json"])
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert rc == 0 and out["passed"] and out["mode"] == "training", out["failures"]
    assert out["loss_rel_err"] < 1e-5 and out["grad_rel_err"] < 1e-4 and out["worst_grad"], out
    # one training step: the decoder layers' training nodes and the fused LM head + loss
    counts = out["counts"]
    assert counts["qkv_rope"] == 2 and counts["gated_mlp"] == 2 and counts["linear_cross_entropy"] == 1, counts
    assert out["greedy_identical"] is None and out["restored_exact"]
    # each phase announced as it starts (stderr), so a long run is not silent
    phases = ["building llama-3.1-8b (tiny)", "unpatched forward", "unpatched training step",
              "kernelize (mode=training)", "patched training step", "patched forward", "restore() check", "done"]
    at = [captured.err.find(f"s] {p}") for p in phases]  # ("[  1.2s] phase")
    assert -1 not in at and at == sorted(at), captured.err


def test_eval_training_step_fails_a_wrong_gradient(monkeypatch):
    # the comparison can fail: one parameter's gradient of the kernelized model scaled by 1.01
    from kernelset.hf import evaluate
    model = evaluate.build_model(evaluate.config_for("llama-3.1-8b", tiny_model=True, init_std=0.2))
    step = evaluate._train_step

    def wrong(m, ids, seed):
        loss, grads = step(m, ids, seed)
        if getattr(m, "_ks_kernelized", None) is not None:
            grads["model.norm.weight"] = grads["model.norm.weight"] * 1.01
        return loss, grads
    monkeypatch.setattr(evaluate, "_train_step", wrong)
    import kernelset as ks
    with ks.config.override(disable={"triton"}):  # (the comparison is under test: the fast reference path)
        res = evaluate.evaluate(model, torch.randint(0, 128, (1, 6)), mode="training")
    assert not res.passed and res.worst_grad == "model.norm.weight", res.failures
    assert any(f.startswith("gradient of model.norm.weight rel err ") for f in res.failures), res.failures
    assert "FAIL: " in res.text()


def test_eval_text_names_no_backend_it_does_not_know():
    # merged_projections (a torch GEMM) and ops run inside a fused layer node printed as "[?]"
    from kernelset.hf.evaluate import CRITERIA, EvalResult
    res = EvalResult(device="cuda", dtype="float32", prompt_tokens=4, new_tokens=2, logits_rel_err=0.0,
                     top1_agreement=1.0, greedy_identical=True, first_divergence=None, restored_exact=True,
                     counts={"rms_norm": 9, "merged_projections": 264, "qkv_rope": 2},
                     backends={"rms_norm": ["triton"]}, prefill_ms={"unpatched": 1.0, "patched": 1.0},
                     decode_ms={"unpatched": 1.0, "patched": 1.0}, report="", criteria=CRITERIA[torch.float32],
                     failures=[])
    text = res.text()
    assert "[?]" not in text, text
    assert "kernelset op calls        qkv_rope 2, rms_norm 9 [triton]\n" in text, text
    assert "torch calls (patched)     merged_projections 264\n" in text, text


def test_greedy_uses_no_deprecated_cache_argument():
    # transformers 5.24 warns that past_key_values "will be removed in version 5.40" (28 warnings)
    from kernelset.hf.evaluate import build_model, cached_decode_logits, config_for, greedy
    model = build_model(config_for("qwen3-0.6b", tiny_model=True))
    ids = torch.randint(0, 128, (1, 5))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # (-W error for the deprecations: 5.24 warns with these)
        warnings.simplefilter("error", DeprecationWarning)
        toks, _, _ = greedy(model, ids, 3)
        logits = cached_decode_logits(model, torch.cat([ids, toks], 1), 5)
    assert toks.shape == (1, 3) and logits.shape[:2] == (1, 8)


# ---- output hygiene ---------------------------------------------------------------------------------


def test_output_into_a_closed_pipe_ends_quietly():
    # ksctl list | head ended in a BrokenPipeError traceback ("Exception ignored ... BrokenPipeError")
    proc = subprocess.Popen([sys.executable, "-m", "kernelset", "list"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_without_interpreter_env())
    proc.stdout.close()  # the reader is gone before ksctl writes
    rc = proc.wait(timeout=600)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert rc == 141 and "BrokenPipeError" not in err and "Traceback" not in err, (rc, err)


def test_list_columns_line_up(capsys):
    # widths were fixed: flash_attention_varlen (22 characters) pushed its row's columns right
    from kernelset import cli
    assert cli.main(["list"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    starts = [header.index(h) for h in ("op ", "backends", "C ABI", "formula")]
    for row in rows:
        assert all(row[i - 1] == " " and row[i] != " " for i in starts), (starts, row)


def test_plan_without_a_model(capsys):
    # --json printed text; the rows were aligned by fixed widths (flash_attention_varlen broke them)
    import kernelset as ks
    from kernelset import cli
    assert cli.main(["plan", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [e["op"] for e in out["ops"]] == [e.name for e in ks.catalog()] and out["device"], out
    assert all(e["chosen"] for e in out["ops"]), out
    assert cli.main(["plan"]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("  ")]
    assert len(rows) == len(out["ops"]) and len({r.index(" -> ") for r in rows}) == 1, rows


def test_list_markdown_is_the_readme_catalog(capsys):
    from kernelset import cli
    from kernelset.core import registry
    assert cli.main(["list", "--markdown"]) == 0
    assert capsys.readouterr().out == registry.catalog_markdown()


def test_results_render_check_passes_on_the_committed_history():
    # docs/benchmarks/README.md's tables are rendered from results.jsonl: a stale block fails
    import os

    from kernelset import cli
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert cli.main(["results", "render", "--results", os.path.join(root, "docs/benchmarks/results.jsonl"),
                     "--readme", os.path.join(root, "docs/benchmarks/README.md"), "--check"]) == 0
