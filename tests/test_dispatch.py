"""The dispatcher: what AUTO picks, what a named backend does, flags, the cache, the catalog.

On this CPU machine Triton runs in the interpreter (conftest sets TRITON_INTERPRET=1), so the
Triton implementation is eligible on CPU tensors and AUTO should prefer it.
"""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import threading

import pytest
import torch

import kernelset as ks
from kernelset.core import dispatch, registry
from kernelset.core.enums import Backend
from kernelset.core.tolerance import TOLERANCES
from kernelset.ops.norm import launch

# These tests pin the CPU path (Triton in the interpreter on CPU tensors), which is what CI runs.
# On the GPU machine TRITON_INTERPRET is unset, so CPU tensors rightly dispatch to the reference;
# GPU dispatch, capture and compile are covered by tests/test_gpu.py there.
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="pins the CPU-interpreter path (CI); GPU: test_gpu.py")

OPS = ["rms_norm", "fused_add_rms_norm", "layer_norm"]


def _args(op, x):
    """Dispatcher arguments (the ones its key/problem take) for ``op`` on input ``x``."""
    w = torch.randn(x.shape[-1])
    if op == "fused_add_rms_norm":
        return (x, torch.randn(x.shape), w)
    return (x, w) if op == "rms_norm" else (x, w, None)


def _call(op, args, **kw):
    """The public function for ``op``, returning its main output."""
    if op == "fused_add_rms_norm":
        return ks.fused_add_rms_norm(*args, **kw).out
    return getattr(ks, op)(*args, **kw)


def _reference(op, args):
    """The catalog's fp32 reference at the default options (main output)."""
    out = registry.op(op).reference(*args)
    return out[0] if isinstance(out, tuple) else out


def _permuted():
    # [8, 4, 16] with strides (16, 128, 1): the rows do not share one stride, Triton rejects it.
    return torch.randn(4, 8, 16).transpose(0, 1)


@pytest.fixture
def launch_spy(monkeypatch):
    """Counts calls into the Triton forward launcher (the backends import it at call time)."""
    calls, real = [], launch.norm_fwd
    monkeypatch.setattr(launch, "norm_fwd", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


# ---- AUTO and explain ----------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_auto_picks_triton_in_interpreter(op, launch_spy):
    args = _args(op, torch.randn(4, 64))
    assert dispatch.select(op, ks.AUTO, args, {}).backend is Backend.TRITON
    _call(op, args)
    assert launch_spy, "AUTO did not run the Triton launcher"


@pytest.mark.parametrize("op", OPS)
def test_explain_lists_candidates_in_priority_order(op, capsys):
    exp = ks.explain(op, *_args(op, torch.randn(4, 64)), verbose=False)
    assert capsys.readouterr().out == "", "verbose=False must print nothing"
    assert isinstance(exp, ks.Explanation) and exp.op == op and exp.error is None
    assert exp.chosen is Backend.TRITON and exp.requested is None
    backends = [c.backend for c in exp.candidates]
    assert backends == [Backend.TRITON, Backend.REFERENCE], "priority order, the reference last"
    prios = [c.priority for c in exp.candidates[:-1]]
    assert prios == sorted(prios, reverse=True)
    assert [c.status for c in exp.candidates] == ["chosen", "supported"]
    # the chosen impl may say which kernels it runs (its detail hook), nothing else
    assert exp.candidates[0].reason is None or exp.candidates[0].reason.startswith("kernel"), exp.candidates[0]
    assert "lower priority than triton" in exp.candidates[1].reason
    text = str(exp)
    assert all(str(b) in text for b in backends) and "chosen: triton" in text
    assert exp.to_dict()["chosen"] == "triton"
    exp = ks.explain(op, *_args(op, torch.randn(4, 64)))  # verbose by default: prints str(exp)
    assert capsys.readouterr().out.strip() == str(exp).strip()


# ---- named backends ------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_explicit_reference_runs_reference(op, launch_spy):
    # Also checks the catalog's reference: it is what backend="reference" computes.
    args = _args(op, torch.randn(4, 64))
    assert dispatch.select(op, "reference", args, {}).backend is Backend.REFERENCE
    y = _call(op, args, backend="reference")
    assert not launch_spy, "backend='reference' reached the Triton launcher"
    assert torch.equal(y, _reference(op, args))


@pytest.mark.parametrize("op", OPS)
def test_explicit_triton_on_permuted_rows_raises(op, launch_spy):
    args = _args(op, _permuted())
    with pytest.raises(ks.UnsupportedError, match="backend 'triton' cannot run") as info:
        _call(op, args, backend="triton")
    assert info.value.op == op and info.value.backend == "triton"
    assert "stride" in info.value.reason and ".contiguous()" in info.value.reason
    # AUTO on the same problem falls back to the reference, and explain says why.
    y = _call(op, args)
    assert not launch_spy
    assert torch.equal(y, _reference(op, args))
    exp = ks.explain(op, *args, verbose=False)
    assert exp.chosen is Backend.REFERENCE
    assert exp.candidates[0].status == "rejected" and exp.candidates[0].reason == info.value.reason


def test_triton_without_interpreter_on_cpu_raises():
    args = _args("layer_norm", torch.randn(4, 64))
    with ks.config.override(triton_interpret=False):
        with pytest.raises(ks.UnsupportedError, match="TRITON_INTERPRET=1") as info:
            ks.layer_norm(*args, backend="triton")
        assert "CUDA tensor" in info.value.reason
        exp = ks.explain("layer_norm", *args, verbose=False)
        assert exp.chosen is Backend.REFERENCE and "TRITON_INTERPRET" in exp.candidates[0].reason
        assert torch.equal(ks.layer_norm(*args), _reference("layer_norm", args))


def test_explain_of_a_failing_request_reports_the_error():
    # A named backend that cannot run: explain does not raise, it records the error.
    exp = ks.explain("rms_norm", *_args("rms_norm", _permuted()), backend="triton", verbose=False)
    assert exp.chosen is None and exp.requested is Backend.TRITON
    assert "cannot run" in exp.error and "chosen: none" in str(exp)


# (A valid Backend with no implementation, e.g. 'flashinfer', is in test_errors.py.)
@pytest.mark.parametrize("bad", ["cuda", "Triton2", ""])
def test_unknown_backend_name_lists_valid_values(bad):
    with pytest.raises(ValueError, match=r"argument 'backend' must be one of auto, triton, .*reference"):
        ks.rms_norm(torch.randn(2, 8), backend=bad)


def test_backend_is_case_insensitive_and_accepts_enum():
    x = torch.randn(2, 8)
    assert torch.equal(ks.rms_norm(x, backend="REFERENCE"), ks.rms_norm(x, backend=Backend.REFERENCE))
    assert dispatch.select("rms_norm", " Auto ", (x, None), {}).backend is Backend.TRITON


# ---- config overrides ----------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_disable_triton(op, launch_spy):
    args = _args(op, torch.randn(4, 64))
    with ks.config.override(disable={"triton"}):
        assert dispatch.select(op, ks.AUTO, args, {}).backend is Backend.REFERENCE
        _call(op, args)
        # the reason names where the disable came from: an override was reported as KS_DISABLE's
        with pytest.raises(ks.UnsupportedError, match=re.escape("disabled by config.override(disable=...)")):
            _call(op, args, backend="triton")
        assert ks.explain(op, *args, verbose=False).candidates[0].reason == "disabled by config.override(disable=...)"
    assert not launch_spy
    assert dispatch.select(op, ks.AUTO, args, {}).backend is Backend.TRITON, "override must end with the block"


def test_disable_from_the_environment_is_named_as_such(monkeypatch):
    x = torch.randn(4, 64)
    monkeypatch.setenv("KS_DISABLE", "triton")
    try:
        ks.config.reload()
        with pytest.raises(ks.UnsupportedError, match=re.escape("disabled (KS_DISABLE)")):
            ks.rms_norm(x, backend="triton")
        assert ks.explain("rms_norm", x, None, verbose=False).candidates[0].reason == "disabled (KS_DISABLE)"
        with ks.config.override(log_dispatch=False):  # an override of another flag keeps the source
            assert ks.explain("rms_norm", x, None, verbose=False).candidates[0].reason == "disabled (KS_DISABLE)"
        with ks.config.override(disable={"triton"}):
            assert ks.explain("rms_norm", x, None, verbose=False).candidates[0].reason == \
                "disabled by config.override(disable=...)"
        from kernelset import cli
        assert ("triton" in dict(cli._backend_status())
                and dict(cli._backend_status())["triton"].endswith("; disabled (KS_DISABLE)"))
    finally:
        monkeypatch.delenv("KS_DISABLE")
        ks.config.reload()


def test_force_backend_per_op():
    x = torch.randn(4, 64)
    with ks.config.override(backend={"rms_norm": "reference"}):
        assert dispatch.select("rms_norm", ks.AUTO, _args("rms_norm", x), {}).backend is Backend.REFERENCE
        assert ks.explain("rms_norm", *_args("rms_norm", x), verbose=False).requested is Backend.REFERENCE
        for other in ("fused_add_rms_norm", "layer_norm"):
            assert dispatch.select(other, ks.AUTO, _args(other, x), {}).backend is Backend.TRITON
        # An explicit argument beats the flag.
        assert dispatch.select("rms_norm", "triton", _args("rms_norm", x), {}).backend is Backend.TRITON


def test_forced_backend_never_falls_back():
    with ks.config.override(backend={"rms_norm": "triton"}):
        with pytest.raises(ks.UnsupportedError, match="stride"):
            ks.rms_norm(_permuted())


@pytest.mark.parametrize("value", [{"reference"}, "triton,reference"])
def test_disabling_reference_is_refused(value):
    with pytest.raises(ValueError, match="cannot disable the reference"):
        with ks.config.override(disable=value):
            pass
    assert ks.config.get().disable == frozenset()


# ---- environment flags (read at import, so each case is a fresh interpreter) ----------------

_SNIPPET = """
import torch, kernelset as ks
from kernelset.core import dispatch
x = torch.randn(4, 64)
for op, args in [("rms_norm", (x, None)), ("layer_norm", (x, None, None))]:
    print(op, dispatch.select(op, "auto", args, {}).backend)
ks.rms_norm(x)
"""


def _run_with_env(**env):
    base = {k: v for k, v in os.environ.items() if not k.startswith("KS_")}
    return subprocess.run([sys.executable, "-c", _SNIPPET], env={**base, "TRITON_INTERPRET": "1", **env},
                          capture_output=True, text=True, timeout=120)


# (env, expected stdout lines or None for a failure, text stderr must contain): why it exists
ENV_CASES = {
    "no-flags": ({}, ["rms_norm triton", "layer_norm triton"], ""),  # baseline for the others
    "backend-map": ({"KS_BACKEND": "rms_norm:reference"}, ["rms_norm reference", "layer_norm triton"], ""),
    "disable": ({"KS_DISABLE": "triton"}, ["rms_norm reference", "layer_norm reference"], ""),
    "malformed-backend": ({"KS_BACKEND": "rms_norm"}, None,
                          "KS_BACKEND='rms_norm': KS_BACKEND entries are OP:BACKEND"),
    "unknown-backend": ({"KS_BACKEND": "rms_norm:cuda"}, None, "must be one of 'triton'"),
    # a family backend name (attention's SDPA backends) is accepted where its op has it, and a typo
    # of one still stops the import, once every op is registered
    "family-backend": ({"KS_BACKEND": "flash_attention:sdpa_flash"}, ["rms_norm triton", "layer_norm triton"], ""),
    "unknown-family-backend": ({"KS_BACKEND": "flash_attention:sdpa_flsh"}, None,
                               "backend for flash_attention must be one of 'triton'"),
    "log-dispatch": ({"KS_LOG_DISPATCH": "1"}, ["rms_norm triton", "layer_norm triton"],
                     "[kernelset] rms_norm [4x64] float32 on cpu (hidden=64 weight=none rows_ok=True) -> triton"),
}


def test_backend_map_with_unknown_op_is_an_error():
    # a typo in the op name would otherwise force nothing, silently
    proc = _run_with_env(KS_BACKEND="rmsnorm:reference")
    assert proc.returncode != 0
    assert "KS_BACKEND names unknown op(s) rmsnorm; declared ops:" in proc.stderr


def test_log_dispatch_reports_requested_backends():
    snippet = "import torch, kernelset as ks; ks.rms_norm(torch.randn(2, 8), backend='reference')"
    base = {k: v for k, v in os.environ.items() if not k.startswith("KS_")}
    proc = subprocess.run([sys.executable, "-c", snippet], env={**base, "TRITON_INTERPRET": "1", "KS_LOG_DISPATCH": "1"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "-> reference (requested)" in proc.stderr


@pytest.mark.parametrize("case", ENV_CASES, ids=list(ENV_CASES))
def test_environment_flags(case):
    env, want, err = ENV_CASES[case]
    proc = _run_with_env(**env)
    if want is None:
        assert proc.returncode != 0, "a malformed flag must stop the import"
        assert "ValueError: environment variable" in proc.stderr and err in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == want
    assert err in proc.stderr
    if case != "log-dispatch":
        assert "[kernelset]" not in proc.stderr, "decisions are logged only under KS_LOG_DISPATCH"


# ---- the decision cache --------------------------------------------------------------------


@pytest.fixture
def supports_calls(monkeypatch):
    """Counts calls to each rms_norm implementation's supports() (registry restored after)."""
    calls = []

    def counting(impl):
        def supports(problem):
            calls.append((impl.backend, problem.shape))
            return impl.supports(problem)
        return dataclasses.replace(impl, supports=supports)

    monkeypatch.setitem(registry._IMPLS, "rms_norm", [counting(i) for i in registry._IMPLS["rms_norm"]])
    dispatch.clear_cache()
    return calls


def test_decision_is_cached(supports_calls):
    w = torch.randn(64)
    ks.rms_norm(torch.randn(4, 64), w)
    assert supports_calls == [(Backend.TRITON, (4, 64))]
    ks.rms_norm(torch.randn(4, 64), w)
    ks.rms_norm(torch.randn(9, 64), w)  # the row count is not part of the key
    assert len(supports_calls) == 1, "a repeated problem key must not call supports() again"
    ks.rms_norm(torch.randn(4, 32), torch.randn(32))  # another hidden size is another key
    assert len(supports_calls) == 2


def test_cache_cleared_on_config_change(supports_calls):
    x, w = torch.randn(4, 64), torch.randn(64)
    ks.rms_norm(x, w)
    with ks.config.override(log_dispatch=False):  # same values, still a change: cache cleared
        ks.rms_norm(x, w)
        assert len(supports_calls) == 2
        ks.rms_norm(x, w)
        assert len(supports_calls) == 2
    ks.rms_norm(x, w)  # leaving the block restores the old config: cleared again
    assert len(supports_calls) == 3


def test_cache_does_not_hide_a_rejection(supports_calls):
    # Whether the rows share one stride is part of the key: a contiguous call cached as triton
    # must not let a permuted call of the same hidden size skip the check.
    ks.rms_norm(torch.randn(8, 16))
    x = _permuted()
    assert torch.equal(ks.rms_norm(x), _reference("rms_norm", (x, None)))
    assert dispatch.select("rms_norm", ks.AUTO, (x, None), {}).backend is Backend.REFERENCE
    assert len(supports_calls) == 3  # triton (contiguous), then triton and reference (permuted)


def test_decision_made_before_a_config_change_is_not_reused(monkeypatch):
    # One thread decides (triton) while another enters an override disabling triton; the first
    # stores its decision after the override cleared the cache. Under the override the next call
    # must not find it: KS_DISABLE would be ignored without a word.
    deciding, changed = threading.Event(), threading.Event()

    def slow(impl):
        def supports(problem):
            if threading.current_thread() is not threading.main_thread():
                deciding.set()
                assert changed.wait(10)
            return impl.supports(problem)
        return dataclasses.replace(impl, supports=supports)

    monkeypatch.setitem(registry._IMPLS, "rms_norm", [slow(i) for i in registry._IMPLS["rms_norm"]])
    dispatch.clear_cache()
    args = _args("rms_norm", torch.randn(4, 64))
    got = []
    worker = threading.Thread(target=lambda: got.append(dispatch.select("rms_norm", ks.AUTO, args, {}).backend))
    worker.start()
    assert deciding.wait(10)
    with ks.config.override(disable={"triton"}):
        changed.set()
        worker.join(10)
        assert got == [Backend.TRITON], "the worker decided under the old configuration"
        assert dispatch.select("rms_norm", ks.AUTO, args, {}).backend is Backend.REFERENCE


def test_unhashable_backend_lists_valid_values():
    with pytest.raises(ValueError, match=r"argument 'backend' must be one of auto, triton, .*got \['triton'\]"):
        ks.rms_norm(torch.randn(2, 8), backend=["triton"])


def test_triton_interpret_override_needs_the_environment(monkeypatch):
    # Triton reads TRITON_INTERPRET itself: the override alone made AUTO pick Triton for CPU
    # tensors that Triton then could not launch. Turning it off is always allowed.
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs TRITON_INTERPRET=1 in the environment"):
        with ks.config.override(triton_interpret=True):
            pass
    with ks.config.override(triton_interpret=False):
        assert ks.config.get().triton_interpret is False
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with ks.config.override(triton_interpret="1"):
        assert ks.config.get().triton_interpret is True


# ---- a family's own backend names (attention: SDPA's backends) -------------------------------


def _decode_qkv():
    # 1 query token against 32 keys: a "decode" shape, where AUTO's rules differ from a named request's
    return torch.randn(1, 1, 2, 16), torch.randn(1, 32, 2, 16), torch.randn(1, 32, 2, 16)


def test_explain_accepts_the_backends_the_op_runs():
    q, k, v = _decode_qkv()
    with ks.config.override(triton_interpret=False):
        out = ks.flash_attention(q, k, v, backend="sdpa_flash")
        exp = ks.explain("flash_attention", q, k, v, backend="sdpa_flash", verbose=False)
        assert str(exp.chosen) == "sdpa_flash" and exp.error is None
        assert torch.equal(out, ks.flash_attention(q, k, v, backend="sdpa_flash"))
        with pytest.raises(ValueError, match="must be one of auto, .*sdpa_cudnn, sdpa_flash, sdpa_efficient, got 'sdpa'"):
            ks.explain("flash_attention", q, k, v, backend="sdpa", verbose=False)


def test_explain_of_a_named_family_backend_reports_the_run_error():
    # explain judged a named sdpa_cudnn by AUTO's decode rule; the call itself raises torch's reason
    q, k, v = _decode_qkv()
    with pytest.raises(ks.UnsupportedError) as info:
        ks.flash_attention(q, k, v, backend="sdpa_cudnn")
    exp = ks.explain("flash_attention", q, k, v, backend="sdpa_cudnn", verbose=False)
    assert exp.chosen is None and exp.error == str(info.value)


def test_flash_attention_key_separates_empty_sequences():
    # Same key for Sq = Sk = 4 and Sq = Sk = 0, but torch's fused kernels refuse empty sequences:
    # after a cached sdpa choice an empty call runs SDPA (on CUDA: "No available kernel").
    def qkv(s):
        return [torch.randn(1, s, 2, 8) for _ in range(3)]
    with ks.config.override(triton_interpret=False):
        ks.flash_attention(*qkv(4))
        empty = qkv(0)
        assert ks.explain("flash_attention", *empty, verbose=False).chosen is Backend.REFERENCE
        assert dispatch.select("flash_attention", ks.AUTO, tuple(empty) + (None, None),
                               {"request": "auto"}).backend is Backend.REFERENCE


# ---- the catalog ---------------------------------------------------------------------------


def test_catalog_lists_the_norm_ops():
    entries = {e.name: e for e in ks.catalog()}
    assert set(OPS) <= set(entries)
    names = [e.name for e in ks.catalog()]
    assert names == sorted(names)
    for op in OPS:
        entry = entries[op]
        assert entry.backends == ("triton", "reference")
        assert entry.spec.family == "norm" and entry.spec.tolerance in TOLERANCES
        assert entry.spec.c_abi is True and entry.spec.differentiable is True
        assert op in entry.spec.signature and entry.spec.doc


@pytest.mark.parametrize("op", OPS)
def test_cost_model_covers_bench_shapes(op):
    spec = registry.op(op)
    assert spec.bench, f"{op} has no benchmark shapes"
    for case in spec.bench:
        m, n = case.shape
        cost = spec.cost(case.shape, case.dtype, case.mode)
        # At least one read of x and one write of y, in the storage dtype.
        floor = 2 * m * n * torch.empty((), dtype=case.dtype).element_size()
        assert isinstance(cost.bytes, int) and cost.bytes >= floor, (case, cost)
        if case.mode == "fwd+bwd":
            assert cost.bytes > spec.cost(case.shape, case.dtype, "fwd").bytes
        assert case.bar_pct is None or 0 < case.bar_pct <= 100


def test_forced_family_backend_runs_and_explains():
    # KS_BACKEND / config.override can force a backend only an op family registers (SDPA's, in the
    # attention family), as the backend= argument can: it used to be refused as not a core Backend
    q = torch.randn(1, 4, 2, 8)
    with ks.config.override(backend={"flash_attention": "sdpa_flash"}, triton_interpret=False):
        assert ks.explain("flash_attention", q, q, q, verbose=False).chosen is ks.AttnBackend.SDPA_FLASH
        out = ks.flash_attention(q, q, q)
    torch.testing.assert_close(out, ks.flash_attention(q, q, q, backend="reference"), rtol=1e-5, atol=1e-5)
    with ks.config.override(backend={"flash_attention": "sdpa_flsh"}):
        with pytest.raises(ValueError, match="backend for flash_attention must be one of"):
            ks.flash_attention(q, q, q)
