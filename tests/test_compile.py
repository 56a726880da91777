"""torch.compile(fullgraph=True) over the public functions, and opcheck of the custom ops.

Under torch.compile every norm call goes through a ``torch.ops.kernelset.*`` custom op with a
fake implementation, so the graph has no breaks and the dispatcher runs inside the op at run
time (here: the Triton kernels in the interpreter). fullgraph=True raises on any graph break.

Most tests use backend="aot_eager": it runs Dynamo and AOTAutograd (tracing through the fake
impls, autograd registration and functionalization of the in-place op, which is what the custom
ops must get right) without Inductor's C++ build, which takes ~10 s per graph on 2 CPU cores. One
test runs the full Inductor pipeline, forward and backward.
"""
from __future__ import annotations

import pytest
import torch
import torch._inductor.config
from torch._dynamo.testing import CompileCounter
from torch.library import opcheck

import kernelset as ks
from kernelset.core.tolerance import rel_err, tolerance
from kernelset.ops.norm.reference import fused_add_rms_norm_ref, layer_norm_ref, rms_norm_ref

# These tests pin the CPU path (Triton in the interpreter on CPU tensors), which is what CI runs.
# On the GPU machine TRITON_INTERPRET is unset, so CPU tensors rightly dispatch to the reference;
# GPU dispatch, capture and compile are covered by tests/test_gpu.py there.
_CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="pins the CPU-interpreter path (CI); GPU: test_gpu.py")


# Raised inside torch (opcheck/inductor internals), not by kernelset.
pytestmark = [_CPU_ONLY,
              pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _inputs(dtype=torch.float32, rows=4, n=64, grad=False):
    x, r = torch.randn(rows, n, dtype=dtype), torch.randn(rows, n, dtype=dtype)
    w, b = torch.randn(n, dtype=dtype), torch.randn(n, dtype=dtype)
    return [t.requires_grad_(grad) for t in (x, r, w, b)]


def _clone(ts, grad):
    return [t.detach().clone().requires_grad_(grad) for t in ts]


# Functions compiled below; each returns a tuple of tensors. (id, fn, why the case exists)
def _rms(x, r, w, b):
    return (ks.rms_norm(x, w), ks.rms_norm(x, w, offset=1.0, cast="gemma"), ks.rms_norm(x))


def _add(x, r, w, b):
    out, h = ks.fused_add_rms_norm(x, r, w)
    return out, h * 2  # the residual output feeds more work, as in a decoder layer


def _ln(x, r, w, b):
    return ks.layer_norm(x, w, b), ks.layer_norm(x)


def _chain(x, r, w, b):
    # A decoder-layer-like chain: norm -> add+norm -> layernorm, with plain torch ops between.
    y = ks.rms_norm(x, w).relu()
    out, h = ks.fused_add_rms_norm(y, r, w)
    return (ks.layer_norm(out + h, w, b),)


FNS = [("rms_norm", _rms, "weight, gemma offset and no weight: three custom-op calls in one graph"),
       ("fused_add", _add, "two outputs, both differentiable"),
       ("layer_norm", _ln, "affine and non-affine"),
       ("chain", _chain, "all three ops and torch ops in one graph")]


def _reference(name, x, r, w, b):
    """fp32 reference outputs; differentiable when the inputs are fp32 leaves."""
    if name == "rms_norm":
        return (rms_norm_ref(x, w, 1e-6, 0.0, False)[0], rms_norm_ref(x, w, 1e-6, 1.0, True)[0],
                rms_norm_ref(x, None, 1e-6, 0.0, False)[0])
    if name == "fused_add":
        y, h, _ = fused_add_rms_norm_ref(x, r, w, 1e-6, 0.0, False)
        return y, h * 2
    if name == "layer_norm":
        return layer_norm_ref(x, w, b, 1e-5)[0], layer_norm_ref(x, None, None, 1e-5)[0]
    y = rms_norm_ref(x, w, 1e-6, 0.0, False)[0].relu()
    out, h, _ = fused_add_rms_norm_ref(y, r, w, 1e-6, 0.0, False)
    return (layer_norm_ref(out + h, w, b, 1e-5)[0],)


def _kernelset_ops(gm):
    return {str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "kernelset" in str(n.target)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", FNS, ids=[c[0] for c in FNS])
def test_compiled_forward_matches_eager(case, dtype):
    name, fn, _ = case
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    args = _inputs(dtype)
    got = torch.compile(fn, fullgraph=True, backend=capture)(*args)
    assert len(graphs) == 1 and _kernelset_ops(graphs[0]), "the custom ops must be in the one graph"
    for g, e, ref in zip(got, fn(*args), _reference(name, *(t.float() for t in args))):
        assert g.dtype == dtype and torch.equal(g, e), "compiled and eager run the same kernels"
        assert rel_err(g, ref) <= tolerance("norm", dtype)


def _check_grads(fn_name, args, dys, others=(), tol=1e-6):
    """Grads of ``args`` against the fp32 reference's, and against each run in ``others``."""
    ref_args = _clone(args, True)
    torch.autograd.backward(_reference(fn_name, *ref_args), dys)
    for i, (a, r) in enumerate(zip(args, ref_args)):
        if r.grad is None:  # r and b are unused by some functions
            assert a.grad is None, f"input {i}"
            continue
        assert a.grad is not None and rel_err(a.grad, r.grad) <= tolerance("norm", torch.float32, grad=True), \
            f"grad of input {i} vs the reference"
        for o in others:
            assert rel_err(a.grad, o[i].grad) <= tol, f"grad of input {i}: compiled != eager"


@pytest.mark.parametrize("case", FNS, ids=[c[0] for c in FNS])
def test_compiled_backward_matches_eager(case):
    name, fn, _ = case
    args = _inputs(grad=True)
    eager_args = _clone(args, True)
    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(*args)
    want = fn(*eager_args)
    dys = [torch.randn_like(t) for t in got]
    torch.autograd.backward(got, dys)
    torch.autograd.backward(want, dys)
    _check_grads(name, args, dys, [eager_args])


@pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled")
def test_inductor_forward_and_backward():
    # The one full Inductor run (C++ codegen on CPU): forward and backward of the chain.
    # Caches off: their keys hold the graph, which names the custom op but not its Python
    # autograd formula, so a warm cache would keep testing an old backward after an edit.
    args = _inputs(grad=True)
    eager_args = _clone(args, True)
    with torch._inductor.config.patch(force_disable_caches=True):
        (got,) = torch.compile(_chain, fullgraph=True)(*args)
    (want,) = _chain(*eager_args)
    assert rel_err(got, want) <= 1e-6
    assert rel_err(got, _reference("chain", *(t.detach() for t in args))[0]) <= tolerance("norm", torch.float32)
    dy = torch.randn_like(got)
    got.backward(dy)
    want.backward(dy)
    _check_grads("chain", args, [dy], [eager_args], tol=1e-5)


# fused_add_rms_norm(in_place=True) once compared data_ptr() under compile: a graph break.
def test_compiled_in_place():
    def fn(x, r, w):
        out, res = ks.fused_add_rms_norm(x, r, w, in_place=True)
        return out * 2, res

    x, r, w, _ = _inputs()
    x0, r0 = x.clone(), r.clone()
    want_y, want_h, _ = fused_add_rms_norm_ref(x0, r0, w, 1e-6, 0.0, False)
    got_out, got_res = torch.compile(fn, fullgraph=True, backend="aot_eager")(x, r, w)
    # The mutation of the inputs must survive functionalization.
    assert torch.equal(r, want_h) and rel_err(x, want_y) <= 1e-5
    assert torch.equal(got_res, r) and torch.equal(got_out, x * 2)


def test_dynamic_rows_compile_once():
    # vLLM-style: the token dim marked dynamic, one graph serves every batch size.
    cnt = CompileCounter()
    fn = torch.compile(_chain, fullgraph=True, backend=cnt)
    for rows in (3, 5, 17):
        args = _inputs(rows=rows)
        torch._dynamo.mark_dynamic(args[0], 0)
        torch._dynamo.mark_dynamic(args[1], 0)
        (got,) = fn(*args)
        assert got.shape == (rows, 64) and torch.equal(got, _chain(*args)[0])
    assert cnt.frame_count == 1, "the fake impls must work with symbolic row counts"


# dynamic=True makes Python floats symbolic (the default eps included): the eps/offset checks
# must be comparisons (guards), not math.isfinite (a graph break).
def test_dynamic_true():
    cnt = CompileCounter()
    fn = torch.compile(_chain, fullgraph=True, dynamic=True, backend=cnt)
    for rows in (3, 5):
        args = _inputs(rows=rows)
        (got,) = fn(*args)
        assert torch.equal(got, _chain(*args)[0])
    assert cnt.frame_count == 1


# ---- opcheck ---------------------------------------------------------------------------------

# The backend string argument selects the implementation inside the op; "reference" keeps the
# checks fast (opcheck runs the op several times); one case per op uses the Triton kernels.
def _fwd_cases():
    x, r, w, b = _inputs(grad=True)
    return [
        ("rms_norm", (x, w, 1e-6, 0.0, False, "reference")),
        ("rms_norm", (x, None, 1e-6, 0.0, False, "reference")),  # optional weight absent
        ("rms_norm", (x, w, 1e-6, 1.0, True, "triton")),
        ("fused_add_rms_norm", (x, r, w, 1e-6, 0.0, False, "reference")),
        ("fused_add_rms_norm", (x, r, w, 1e-6, 0.0, False, "triton")),
        ("layer_norm", (x, w, b, 1e-5, "reference")),
        ("layer_norm", (x, None, None, 1e-5, "triton")),
    ]


@pytest.mark.parametrize("i", range(len(_fwd_cases())),
                         ids=[f"{n}-{a[-1]}-{j}" for j, (n, a) in enumerate(_fwd_cases())])
def test_opcheck_forward_ops(i):
    name, args = _fwd_cases()[i]
    result = opcheck(getattr(torch.ops.kernelset, name), args)
    assert set(result.values()) == {"SUCCESS"}, result


def test_opcheck_in_place_op():
    x, r, w, _ = _inputs()
    result = opcheck(torch.ops.kernelset.fused_add_rms_norm_, (x, r, w, 1e-6, 0.0, False, "reference"))
    assert set(result.values()) == {"SUCCESS"}, result


# The backward ops get inputs without requires_grad: they have no autograd formula of their own
# (double backward is not supported), so test_aot_dispatch_dynamic would fail by design if
# asked to differentiate through them. Every opcheck sub-test still runs.
def test_opcheck_backward_ops():
    x, r, w, b = _inputs()
    dy, rstd, mean = torch.randn_like(x), torch.rand(4) + 0.5, torch.randn(4)
    cases = [
        ("rms_norm_backward", (dy, x, w, rstd, 1e-6, 0.0, False, None, "rms_norm", "reference")),
        ("rms_norm_backward", (dy, x, None, rstd, 1e-6, 0.0, False, r, "fused_add_rms_norm", "reference")),
        ("layer_norm_backward", (dy, x, w, b, mean, rstd, 1e-5, "reference")),
        ("layer_norm_backward", (dy, x, None, None, mean, rstd, 1e-5, "triton")),
    ]
    for name, args in cases:
        result = opcheck(getattr(torch.ops.kernelset, name), args)
        assert set(result.values()) == {"SUCCESS"}, (name, args[-1], result)


def test_import_does_not_load_dynamo():
    """``import kernelset`` leaves ``torch._dynamo`` unimported (it cost 2.9 s of a 6.4 s import):
    compile-only helpers load it when a model is compiled."""
    import subprocess
    import sys
    code = "import sys, kernelset; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_trace_constant_marker_is_torchs():
    """core.op.trace_constant sets what torch.compiler.assume_constant_result sets, so dynamo still folds
    the marked host work (attention's traced backend choice, kernelize's probes) into constants."""
    from kernelset.core.op import trace_constant
    from kernelset.ops.attention import api

    def probe():
        return ""
    marked = torch.compiler.assume_constant_result(probe)
    ours = trace_constant(lambda: "")
    assert vars(marked) and vars(marked) == vars(ours)
    assert getattr(api._traced_train_backend, "_dynamo_marked_constant", False) is True
