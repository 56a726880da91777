"""gated_mlp: the gated MLP as one autograd node, every backend against fp32 math (forward and all
four gradients), transformers' module (LlamaMLP's code) as the peer it replaces, partial
gradients, bad input, torch.compile."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernelset as ks
from kernelset.core.tolerance import rel_err, tolerance

ACTS = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}


def _weights(h, i, h_out, dtype, device, grad=True):
    return [(torch.randn(o, n, device=device) / n ** 0.5).to(dtype).requires_grad_(grad)
            for o, n in ((i, h), (i, h), (h_out, i))]


def _hf(x, wg, wu, wd, act):  # LlamaMLP.forward: down_proj(act_fn(gate_proj(x)) * up_proj(x))
    return F.linear(ACTS[act](F.linear(x, wg)) * F.linear(x, wu), wd)


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("shape", [(2, 5, 48, 80, 48), (7, 32, 40, 24), (1, 1, 64, 96, 64)],
                         ids=["3d", "2d-narrow-out", "one-token"])
def test_forward_and_gradients_against_fp32(shape, act, dtype, backend, device):
    *lead, h, i, h_out = shape
    x = torch.randn(*lead, h, device=device).to(dtype).requires_grad_()
    ws = _weights(h, i, h_out, dtype, device)
    y = ks.gated_mlp(x, *ws, activation=act, backend=backend)
    assert y.shape == (*lead, h_out) and y.dtype == dtype
    assert "EagerAutograd" in type(y.grad_fn).__name__  # one node ...
    nxt = [type(f).__name__ for f, _ in y.grad_fn.next_functions if f is not None]
    assert nxt.count("AccumulateGrad") == 4, nxt  # ... straight onto the leaves: no view or transpose nodes
    ins = [t.detach().double().requires_grad_() for t in (x, *ws)]
    want = _hf(*ins, act)
    assert rel_err(y, want) <= tolerance("gemm", dtype), rel_err(y, want)
    cot = torch.randn_like(want)
    got = torch.autograd.grad(y, (x, *ws), cot.to(dtype))
    exp = torch.autograd.grad(want, ins, cot)
    for name, a, e in zip(("dx", "dw_gate", "dw_up", "dw_down"), got, exp):
        assert not a.isnan().any(), name
        assert rel_err(a, e) <= tolerance("gemm", dtype, grad=True), (name, rel_err(a, e))


def test_bf16_forward_is_the_module_s_rounding(device):
    """Against transformers' bf16 module code, the forward differs only by the GEMMs' own
    summation (the same cuBLAS products on a GPU: equal there, see the GPU test)."""
    x = torch.randn(3, 9, 64, device=device, dtype=torch.bfloat16)
    ws = _weights(64, 128, 64, torch.bfloat16, device, grad=False)
    if str(ks.explain("gated_mlp", x.view(-1, 64), *ws, verbose=False).chosen) == "reference":
        pytest.skip("the fp32 reference rounds once, not as the module does")
    y = ks.gated_mlp(x, *ws)
    assert rel_err(y, _hf(x, *ws, "silu")) < 4e-3


@pytest.mark.parametrize("which", ["x", "w_gate", "w_up", "w_down"])
def test_only_the_gradients_asked_for(which, device):
    x = torch.randn(4, 32, device=device)
    ws = _weights(32, 48, 32, torch.float32, device, grad=False)
    leaves = dict(zip(("x", "w_gate", "w_up", "w_down"), (x, *ws)))
    leaves[which].requires_grad_()
    y = ks.gated_mlp(*leaves.values())
    (g,) = torch.autograd.grad(y.square().sum(), (leaves[which],))
    ins = {k: v.detach().double().requires_grad_(k == which) for k, v in leaves.items()}
    (e,) = torch.autograd.grad(_hf(*ins.values(), "silu").square().sum(), (ins[which],))
    assert rel_err(g, e) < 1e-5


def test_no_grad_call_records_nothing(device):
    x = torch.randn(4, 32, device=device, requires_grad=True)
    ws = _weights(32, 48, 32, torch.float32, device)
    with torch.no_grad():
        y = ks.gated_mlp(x, *ws)
    assert y.grad_fn is None and rel_err(y, _hf(x, *ws, "silu").detach()) < 1e-5


@pytest.mark.parametrize("args,name", [
    (dict(w_gate=torch.randn(48, 31)), "w_gate"),
    (dict(w_up=torch.randn(47, 32)), "w_up"),
    (dict(w_down=torch.randn(32, 47)), "w_down"),
    (dict(w_down=torch.randn(32)), "w_down"),
    (dict(w_up=torch.randn(48, 32, dtype=torch.float64)), "w_up"),
    (dict(x="not a tensor"), "x"),
    (dict(activation="relu"), "activation"),
])
def test_bad_input_names_the_argument(args, name):
    kw = dict(x=torch.randn(4, 32), w_gate=torch.randn(48, 32), w_up=torch.randn(48, 32),
              w_down=torch.randn(32, 48), activation="silu")
    kw.update(args)
    act = kw.pop("activation")
    with pytest.raises((ks.ArgumentError, ks.ArgumentTypeError, TypeError), match=name):
        ks.gated_mlp(*kw.values(), activation=act)


def test_compile_fullgraph_with_backward():
    x = torch.randn(2, 3, 32, requires_grad=True)
    ws = _weights(32, 40, 32, torch.float32, "cpu")

    def f(x, *ws):
        return (ks.gated_mlp(x, *ws) * 2).sum()

    eager = torch.autograd.grad(f(x, *ws), (x, *ws))
    comp = torch.autograd.grad(torch.compile(f, fullgraph=True, backend="aot_eager")(x, *ws), (x, *ws))
    for a, b in zip(eager, comp):
        assert rel_err(b, a) < 1e-6


@pytest.mark.gpu
def test_gpu_bf16_forward_equals_the_module_and_gradients():
    """On the GPU the products are the module's own cuBLAS calls: the forward equals LlamaMLP's
    bit for bit; the gradients agree with its autograd within the bf16 tolerance."""
    x = torch.randn(2, 512, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    ws = _weights(1024, 2816, 1024, torch.bfloat16, "cuda")
    y = ks.gated_mlp(x, *ws)
    want = _hf(x, *ws, "silu")
    assert torch.equal(y, want)
    cot = torch.randn_like(y)
    for a, e in zip(torch.autograd.grad(y, (x, *ws), cot), torch.autograd.grad(want, (x, *ws), cot)):
        assert rel_err(a, e) < 5e-3


def _rms(x, w, eps):  # LlamaRMSNorm in the input's precision
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_prenorm_forward_and_gradients(dtype, backend, device):
    """norm_weight: LlamaRMSNorm then the MLP in the same node; gradients for x, the norm weight and
    the three projections."""
    x = torch.randn(2, 7, 48, device=device).to(dtype).requires_grad_()
    wn = (1 + 0.3 * torch.randn(48, device=device)).to(dtype).requires_grad_()
    ws = _weights(48, 80, 48, dtype, device)
    y = ks.gated_mlp(x, *ws, norm_weight=wn, norm_eps=1e-5, backend=backend)
    nxt = [type(f).__name__ for f, _ in y.grad_fn.next_functions if f is not None]
    assert nxt.count("AccumulateGrad") == 5, nxt
    ins = [t.detach().double().requires_grad_() for t in (x, wn, *ws)]
    want = _hf(_rms(ins[0], ins[1], 1e-5), *ins[2:], "silu")
    assert rel_err(y, want) <= tolerance("gemm", dtype), rel_err(y, want)
    cot = torch.randn_like(want)
    got = torch.autograd.grad(y, (x, wn, *ws), cot.to(dtype))
    exp = torch.autograd.grad(want, ins, cot)
    for name, a, e in zip(("dx", "dnorm", "dw_gate", "dw_up", "dw_down"), got, exp):
        assert rel_err(a, e) <= tolerance("gemm", dtype, grad=True), (name, rel_err(a, e))


def test_prenorm_bad_weight():
    with pytest.raises(ks.ArgumentError, match="norm_weight"):
        ks.gated_mlp(torch.randn(3, 32), *_weights(32, 40, 32, torch.float32, "cpu"), norm_weight=torch.randn(31))
    with pytest.raises(ks.ArgumentError, match="norm_eps"):
        ks.gated_mlp(torch.randn(3, 32), *_weights(32, 40, 32, torch.float32, "cpu"), norm_weight=torch.randn(32),
                     norm_eps=-1.0)
