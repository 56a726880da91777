"""The benchmark harness's honesty on CPU: what it checks before it times, what it times, and how a
bar is judged. The GPU calls (events, graphs, synchronize) are replaced by stand-ins; the checks,
the runners and the report are the real ones."""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

import kernelset  # noqa: F401  (declares the ops)
from kernelset.bench import harness, report, timing
from kernelset.bench.adapter import BenchAdapter, ShapeGrammar
from kernelset.core import registry
from kernelset.core.registry import BenchCase, Cost
from kernelset.core.tolerance import rel_err, tolerance


@pytest.fixture
def no_cuda(monkeypatch):
    """run_case on CPU: no synchronize / empty_cache, each call 'timed' at 1 ms."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *a, **k: None)
    monkeypatch.setattr(timing, "cuda_time_ms", lambda fn, **k: (fn(), 1.0)[1])


def _fake_case(monkeypatch, cost: Cost, run, *, bar=None, graph=False, ref=None, names=("y",)):
    ref = ref if ref is not None else torch.ones(4)
    adapter = BenchAdapter(inputs=lambda *a: {"names": names}, ours=lambda inp, mode, backend: run,
                           peers=lambda inp, mode: {}, reference=lambda inp, mode: (ref,))
    monkeypatch.setattr(harness, "adapter_for", lambda spec: adapter)
    spec = dataclasses.replace(registry.op("rms_norm"), cost=lambda shape, dtype, mode: cost)
    return spec, BenchCase((4,), "fwd", torch.float32, bar_pct=bar, graph=graph)


# ---- the correctness check ---------------------------------------------------------------------


def test_check_catches_one_wrong_row_the_norm_wise_error_averages_away():
    torch.manual_seed(0)
    ref = torch.randn(20000, 256)
    out = ref.to(torch.bfloat16)
    ok, _, note = harness._check((out,), (ref,), ("y",), "norm", torch.bfloat16, "fwd")
    assert ok, note  # bf16 rounding everywhere is not a local fault
    out[12345] = 0  # one row never written (a tail block skipped)
    tol = tolerance("norm", torch.bfloat16)
    assert rel_err(out, ref) < tol  # the whole-output error alone would pass it
    ok, _, note = harness._check((out,), (ref,), ("y",), "norm", torch.bfloat16, "fwd")
    assert not ok and "piece" in note


def test_check_pieces_of_very_different_scale_and_all_zero_pieces():
    # cross-entropy's dlogits: ignored rows exactly zero, most logits' gradients ~1/V, the target's ~1
    torch.manual_seed(0)
    ref = torch.rand(64, 8192) / 8192
    ref[:, 7] -= 1.0
    ref[1::10] = 0.0
    out = ref.to(torch.bfloat16)
    ok, _, note = harness._check((out,), (ref,), ("dlogits",), "norm", torch.bfloat16, "fwd+bwd")
    assert ok, note
    out[11] = 1e-3  # an ignored row given a gradient
    ok, _, _ = harness._check((out,), (ref,), ("dlogits",), "norm", torch.bfloat16, "fwd+bwd")
    assert not ok


def test_check_fails_on_missing_outputs():
    # zip() would check the forward alone and let an implementation without gradients through
    y = torch.ones(8)
    ok, _, note = harness._check((y,), (y, y), ("y", "dx"), "norm", torch.float32, "fwd+bwd")
    assert not ok and "outputs" in note


# ---- bars ----------------------------------------------------------------------------------------


def test_bar_is_judged_on_copy_share_even_when_compute_bound(monkeypatch, no_cuda):
    # 200 FLOPs per byte against a machine balance of 100: %ceil is of the matmul rate (100%),
    # but the bar ("70% of copy") is judged on the copy share (50%)
    spec, case = _fake_case(monkeypatch, Cost(500_000_000, 100_000_000_000), lambda: (torch.ones(4),), bar=70.0)
    res = harness.run_case(spec, case, torch.device("cpu"), 1000.0, matmul_tflops=100.0)
    ours = res.ours()
    assert res.ceiling == "matmul" and ours.pct == pytest.approx(100.0) and ours.copy_pct == pytest.approx(50.0)
    assert res.bar_met() is False
    assert "NOT met" in report.case_rows(res)[0]


def test_bar_just_short_is_not_met_and_not_shown_as_met(monkeypatch, no_cuda):
    spec, case = _fake_case(monkeypatch, Cost(899_600_000), lambda: (torch.ones(4),), bar=90.0)
    res = harness.run_case(spec, case, torch.device("cpu"), 1000.0, matmul_tflops=100.0)
    assert res.ours().copy_pct == pytest.approx(89.96)
    assert res.bar_met() is False
    row = report.case_rows(res)[0]
    assert "NOT met (89.96%)" in row


# ---- CUDA-graph cases: the replay is checked, not only the eager call -------------------------------


class _Graph:
    def __init__(self, fn, calls, wrong):
        self.fn, self.calls, self.wrong = fn, calls, wrong

    def replay(self):
        for _ in range(self.calls):
            outs = self.fn()
        if self.wrong:
            outs[0].add_(1.0)


def _fake_capture(monkeypatch, wrong):
    def capture_outputs(fn, calls=1):
        for _ in range(3):  # the warm-up calls the real capture makes
            fn()
        return _Graph(fn, calls, wrong), fn()
    monkeypatch.setattr(timing, "capture_outputs", capture_outputs)


@pytest.mark.parametrize("wrong", [False, True])
def test_graph_replay_is_checked_against_eager_calls(monkeypatch, no_cuda, wrong):
    # an in-place runner (state += 1 per call, as rotary_embedding rotates its q and k again):
    # replays and eager calls must start from the same state to be compared
    state = torch.zeros(4)

    def run():
        state.add_(1.0)
        return (state,)
    _fake_capture(monkeypatch, wrong)
    spec, case = _fake_case(monkeypatch, Cost(4_000_000), run, graph=True)
    res = harness.run_case(spec, case, torch.device("cpu"), 1000.0)
    ours = res.ours()
    assert ours.correct is (not wrong)
    assert (ours.ms is None) is wrong
    assert ("replay differs" in ours.note) is wrong


# ---- what the family adapters time ---------------------------------------------------------------


def test_rope_bench_positions_are_distinct_rows_of_the_cache():
    # the byte models count one cache row read per token; repeated positions read fewer bytes
    from kernelset.ops.rope import bench
    for op in ("rotary_embedding", "qk_norm_rope", "mrope"):
        inp = bench.ADAPTERS[op].inputs((5000, 2, 1, 8), torch.bfloat16, torch.device("cpu"), "fwd")
        pos = inp["pos"].reshape(-1, 5000)
        for row in pos:
            assert row.unique().numel() == 5000, op
        assert int(pos.max()) < inp["cache"].shape[0]


def test_copy_blocks_runner_returns_the_caches_without_copying_them():
    from kernelset.ops.kvcache import bench
    adapter = bench.ADAPTERS["copy_blocks"]
    inp = adapter.inputs((3, 4, 4, 2, 8), torch.bfloat16, torch.device("cpu"), "fwd")
    refs = adapter.reference(inp, "fwd")
    run = adapter.ours(inp, "fwd", "reference")
    first = run()
    ok, _, note = harness._check(first, refs, inp["names"], "elementwise", torch.bfloat16, "fwd")
    assert ok, note
    second = run()
    assert len(first) == 6 and all(a.data_ptr() == b.data_ptr() for a, b in zip(first, second))


def test_adamw_bench_checks_every_tensor():
    from kernelset.ops.optim import bench
    adapter = bench.ADAPTERS["adamw"]
    inp = adapter.inputs((6, 100), torch.bfloat16, torch.device("cpu"), "step")
    assert inp["sample"] == list(range(6)) and len(inp["names"]) == 18
    refs = adapter.reference(inp, "step")
    run = adapter.ours(inp, "step", "reference")
    outs = run()
    ok, _, note = harness._check(outs, refs, inp["names"], "elementwise", torch.bfloat16, "step")
    assert ok, note
    outs[3 * 1 + 1].add_(1.0)  # tensor 1's exp_avg: not in the old sample of (0, 2, 4, 5)
    ok, _, note = harness._check(outs, refs, inp["names"], "elementwise", torch.bfloat16, "step")
    assert not ok and "m1" in note


# ---- shape grammars: what a shape means to each op (ksctl explain --shape) ------------------------


def test_every_op_declares_the_shape_grammar_its_benchmark_cases_follow():
    # ksctl explain read a shape of any length through the adapter's own fallbacks: flash_attention
    # explained a built-in [2x77x77x4x2x64] for --shape 4096x128, embedding 64x256 as 64x97x256
    for entry in kernelset.catalog():
        grammar = harness.adapter_for(entry.spec).shape
        for case in entry.spec.bench:
            full = grammar.parse(case.shape)
            assert len(full) == len(grammar.full.split("x")), (entry.name, case.shape)


FLASH_LIKE = ShapeGrammar("BxSxHqxHkvxDxCAUSAL", "the legend", short=("BxSxHqxD", "BxSxHqxHkvxD"),
                          defaults={"Hkv": "Hq", "CAUSAL": 1}, choices={"CAUSAL": (0, 1)})


@pytest.mark.parametrize("shape,full", [
    ((2, 16, 8, 64), (2, 16, 8, 8, 64, 1)),  # Hkv copies Hq, CAUSAL its default
    ((2, 16, 8, 2, 64), (2, 16, 8, 2, 64, 1)),
    ((2, 16, 8, 2, 64, 0), (2, 16, 8, 2, 64, 0)),  # the full form, read as given
], ids=["short", "gqa", "full"])
def test_shape_grammar_reads_each_form(shape, full):
    assert FLASH_LIKE.parse(shape) == full


@pytest.mark.parametrize("shape,message", [
    ((4096, 128), "2 dims, where the op takes BxSxHqxD, BxSxHqxHkvxD or BxSxHqxHkvxDxCAUSAL: the legend; "
                  "left out: Hkv=Hq, CAUSAL=1"),
    ((2, 16, 8, 2, 64, 2), "CAUSAL must be one of 0, 1, got 2; the op takes BxSxHqxD"),
], ids=["other-length", "not-a-choice"])
def test_shape_grammar_refuses_with_every_form(shape, message):
    with pytest.raises(ValueError) as exc:
        FLASH_LIKE.parse(shape)
    assert message in str(exc.value)


@pytest.mark.parametrize("kwargs,message", [
    ({"short": ("BxA",)}, "is not its names in order"),
    ({"short": ("AxB",)}, "leaves out ['C'] without a default"),
    ({"short": ("AxB",), "defaults": {"C": "D"}}, "default C='D' names no dim"),
    ({"short": ("AxB", "BxC"), "defaults": {"A": 1, "C": 1}}, "has the length of another form"),
], ids=["out-of-order", "no-default", "default-names-nothing", "two-forms-one-length"])
def test_shape_grammar_declaration_errors(kwargs, message):
    # a grammar that could read a shape two ways, or not at all, is refused where it is declared
    with pytest.raises(ValueError, match=re.escape(message)):
        ShapeGrammar("AxBxC", "legend", **kwargs)
