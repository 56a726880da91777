"""Gated activations: every implementation against the fp32 reference, forward and gradients,
through the public API with the backend forced; rounding equal to transformers' module code."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from aot import compile_report

import kernelset as ks
from kernelset.core.registry import impls
from kernelset.core.tolerance import rel_err, tolerance
from kernelset.ops.activation import reference as R

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DT_IDS = lambda d: str(d).replace("torch.", "")  # noqa: E731

# (id, shape of x or gate, how it is made, why)
CASES = [
    ("row1-4096", (1, 4096), "plain", "decode: a single row"),
    ("odd-I-1001", (3, 1001), "plain", "ragged column tile"),
    ("rows-33-I-40", (33, 40), "plain", "many short rows stacked in one tile"),
    ("3d", (2, 3, 96), "plain", "leading shape [B, S]"),
    ("wide-I-5000", (2, 5000), "plain", "several column tiles per row"),
    ("strided", (5, 130), "slice", "rows of a wider tensor"),
    ("empty", (0, 64), "plain", "no rows"),
]

# op -> (kind, layout, x shape from the case's (rows..., I))
GLU_OPS = {"silu_and_mul": "silu", "gelu_and_mul": "gelu"}


def _x(shape, how, dtype, device, width_mult=1):
    *lead, i = shape
    if how == "slice":
        return torch.randn(*lead, i * width_mult + 30, dtype=dtype, device=device)[..., : i * width_mult]
    return torch.randn(*lead, i * width_mult, dtype=dtype, device=device)


def _check(out, ref, dtype, what, grad=False):
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} vs {tuple(ref.shape)}"
    assert out.dtype == dtype, f"{what}: dtype {out.dtype}"
    if out.numel() == 0:
        return
    assert not out.isnan().any(), f"{what}: NaN (unwritten element?)"
    err, tol = rel_err(out, ref), tolerance("elementwise", dtype, grad=grad)
    assert err <= tol, f"{what}: rel err {err:.3g} > {tol:.3g}"


def _backends(op):
    return [str(i.backend) for i in impls(op)]


@pytest.mark.parametrize("op,approximate", [("silu_and_mul", "none"), ("gelu_and_mul", "none"),
                                            ("gelu_and_mul", "tanh")], ids=["silu", "gelu", "gelu-tanh"])
@pytest.mark.parametrize("backend", _backends("silu_and_mul"))
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_glu_halves(op, approximate, backend, dtype, case, device):
    _, shape, how, _ = case
    x = _x(shape, how, dtype, device, width_mult=2).requires_grad_(True)
    fn = getattr(ks, op)
    y = fn(x, backend=backend) if op == "silu_and_mul" else fn(x, approximate=approximate, backend=backend)
    dy = torch.randn_like(y)
    y.backward(dy)
    kind = GLU_OPS[op] if approximate == "none" else "gelu_tanh"
    xr = x.detach().float().requires_grad_()
    yr = R.autograd_ref(kind, "halves")(xr)
    yr.backward(dy.float())
    _check(y, yr, dtype, "y")
    _check(x.grad, xr.grad, dtype, "dx", grad=True)


@pytest.mark.parametrize("backend", _backends("swiglu"))
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_swiglu(backend, dtype, case, device):
    _, shape, how, _ = case
    g = _x(shape, how, dtype, device).requires_grad_(True)
    u = _x(shape, how, dtype, device).requires_grad_(True)
    y = ks.swiglu(g, u, backend=backend)
    dy = torch.randn_like(y)
    y.backward(dy)
    gr, ur = g.detach().float().requires_grad_(), u.detach().float().requires_grad_()
    yr = R.autograd_ref("silu", "pair")(gr, ur)
    yr.backward(dy.float())
    _check(y, yr, dtype, "y")
    _check(g.grad, gr.grad, dtype, "dgate", grad=True)
    _check(u.grad, ur.grad, dtype, "dup", grad=True)


@pytest.mark.parametrize("backend", _backends("gelu"))
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(backend, dtype, case, approximate, device):
    _, shape, how, _ = case
    x = _x(shape, how, dtype, device).requires_grad_(True)
    y = ks.gelu(x, approximate=approximate, backend=backend)
    dy = torch.randn_like(y)
    y.backward(dy)
    xr = x.detach().float().requires_grad_()
    yr = F.gelu(xr, approximate=approximate)
    yr.backward(dy.float())
    _check(y, yr, dtype, "y")
    _check(x.grad, xr.grad, dtype, "dx", grad=True)


@pytest.mark.parametrize("backend", _backends("swiglu_oai"))
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_swiglu_oai(backend, dtype, case, device):
    _, shape, how, _ = case
    x = (_x(shape, how, dtype, device, width_mult=2) * 4).detach()  # reach past the clamp at 7
    y = ks.swiglu_oai(x, backend=backend)
    # transformers' GptOssExperts: gate/up interleaved, clamped, (up + 1) * gate * sigmoid(alpha * gate)
    xf = x.float()
    gate, up = xf[..., ::2].clamp(max=7.0), xf[..., 1::2].clamp(min=-7.0, max=7.0)
    _check(y, (up + 1) * gate * torch.sigmoid(gate * 1.702), dtype, "y")


def test_swiglu_oai_is_forward_only(device):
    """As the other out-of-place inference ops: with x requiring grad the call runs (an eval loop
    without no_grad works), and a backward through the output raises instead of giving no gradient."""
    x = torch.randn(2, 8, device=device, requires_grad=True)
    y = ks.swiglu_oai(x)
    assert y.requires_grad
    torch.testing.assert_close(y.detach(), ks.swiglu_oai(x.detach()), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="swiglu_oai has no backward"):
        y.sum().backward()
    assert x.grad is None


@pytest.mark.parametrize("backend", _backends("swiglu_oai"))
def test_swiglu_oai_keeps_nan(backend, device):
    """A NaN gate or up gives NaN, as transformers' clamp-based code does. The Triton kernel's
    clamps (tl.minimum / tl.maximum, which by default return the non-NaN operand) turned it into
    the finite limit: a diverging gpt-oss MoE layer produced plausible numbers instead of NaN."""
    nan = float("nan")
    # (gate, up) pairs: NaN gate, NaN up, NaN in both, then finite values around the clamp
    x = torch.tensor([[nan, 1.0, 2.0, nan, nan, nan, 9.0, -9.0]], device=device)
    y = ks.swiglu_oai(x, backend=backend)
    gate, up = x[..., ::2].clamp(max=7.0), x[..., 1::2].clamp(min=-7.0, max=7.0)
    want = (up + 1) * gate * torch.sigmoid(gate * 1.702)
    assert torch.equal(y.isnan(), want.isnan()), f"{y} vs {want}"
    torch.testing.assert_close(y[..., 3:], want[..., 3:])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_rounding_matches_transformers_module_code(approximate, device):
    """``act_fn(gate) * up`` in bf16, as LlamaMLP/GemmaMLP run it, element for element."""
    x = torch.randn(64, 2 * 512, dtype=torch.bfloat16, device=device)
    g, u = x[..., :512], x[..., 512:]
    gelu_kind = "gelu" if approximate == "none" else "gelu_tanh"
    cases = [(ks.silu_and_mul(x), F.silu(g) * u, "silu"),
             (ks.gelu_and_mul(x, approximate=approximate), F.gelu(g, approximate=approximate) * u, gelu_kind)]
    for got, want, kind in cases:
        once = (R.act(g.float(), kind) * u.float()).to(torch.bfloat16)  # the same math rounded once
        mismatch = (got != want).float().mean().item()
        assert mismatch < 0.01, f"{mismatch:.2%} of elements differ from act_fn(gate) * up"
        assert (once != want).float().mean().item() > 0.02, "test does not discriminate the rounding point"


@pytest.mark.parametrize("fn,args,match", [
    (lambda x: ks.silu_and_mul(x), (torch.randn(2, 7),), "even last dim"),
    (lambda x: ks.gelu_and_mul(x, approximate="fast"), (torch.randn(2, 8),), "gelu_and_mul: argument 'approximate' must be one of"),
    (lambda x: ks.silu_and_mul(x), (torch.randint(0, 3, (2, 8)),), "dtype"),
    (lambda g: ks.swiglu(g, torch.randn(2, 5)), (torch.randn(2, 4),), "up"),
    (lambda g: ks.swiglu(g, torch.randn(2, 4, dtype=torch.float16)), (torch.randn(2, 4),), "dtype"),
    (lambda x: ks.swiglu_oai(x, limit=-1.0), (torch.randn(2, 8),), "limit"),
    (lambda x: ks.silu_and_mul(x, backend="cuda-magic"), (torch.randn(2, 8),), "backend"),
], ids=["odd-width", "bad-approximate", "int-dtype", "up-shape", "up-dtype", "negative-limit", "unknown-backend"])
def test_bad_input(fn, args, match):
    with pytest.raises((ValueError, TypeError), match=match):
        fn(*args)


def test_explain_and_catalog(device):
    x = torch.randn(4, 64, device=device)
    exp = ks.explain("silu_and_mul", x, verbose=False)
    assert exp.chosen is not None and [str(c.backend) for c in exp.candidates][-1] == "reference"
    names = {e.name for e in ks.catalog() if e.spec.family == "activation"}
    assert names == {"silu_and_mul", "gelu_and_mul", "swiglu", "gelu", "swiglu_oai", "gated_mlp"}


def test_compile_fullgraph_with_backward(device):
    x = torch.randn(6, 2 * 48, device=device, requires_grad=True)

    def f(t):
        return ks.gelu(ks.silu_and_mul(t), approximate="tanh").sum()

    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    (ge,) = torch.autograd.grad(f(x), (x,))
    (gc,) = torch.autograd.grad(cf(x), (x,))
    assert rel_err(gc, ge) < 1e-6


_AOT_SCRIPT = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernelset.ops.activation import kernels as K
from kernelset.ops.activation.launch import act_policy

out = []
for i in (14336, 128):  # Llama-3-8B intermediate (2048-column tiles), a narrow expert (32-row tiles)
    for act, layout in ((0, 0), (1, 0), (2, 0), (0, 1), (1, 2), (3, 3)):
        p = act_policy(16384, i, act)
        kinds = [("fwd", K._act_fwd_kernel, dict(X="*bf16", U="*bf16", Y="*bf16", M="i32", I="i32", stride_x="i32",
                  stride_u="i32", stride_y="i32", alpha="fp32", limit="fp32"))]
        if act != 3:
            kinds.append(("bwd", K._act_bwd_kernel, dict(DY="*bf16", X="*bf16", U="*bf16", DX="*bf16", DU="*bf16",
                          M="i32", I="i32", stride_dy="i32", stride_x="i32", stride_u="i32", stride_dx="i32",
                          stride_du="i32")))
        for name, fn, sig in kinds:
            consts = dict(ACT=act, LAYOUT=layout, BLOCK_M=p.block_m, BLOCK_N=p.block_n)
            # as @triton.jit specializes real calls: 16-byte aligned pointers, widths/strides % 16 == 0
            attrs = {(k,): [["tt.divisibility", 16]] for k, (n, t) in enumerate(sig.items())
                     if t.startswith("*") or n == "I" or n.startswith("stride")}
            src = ASTSource(fn, signature={**sig, **{k: "constexpr" for k in consts}}, constexprs=consts, attrs=attrs)
            c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=p.num_warps))
            ptx = c.asm["ptx"]
            out.append(dict(case=f"{name}-act{act}-layout{layout}-I{i}", local="ld.local" in ptx or "st.local" in ptx,
                            vec=".v4" in ptx or ".v2" in ptx))
print(json.dumps(out))
"""


def test_kernels_compile_for_sm90():
    """The interpreter misses what only the real compiler rejects: compile every activation x
    layout for sm_90 (in a child process without TRITON_INTERPRET), no spills, vector loads."""
    compile_report(_AOT_SCRIPT, 22)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_gelu_negative_tail_keeps_its_digits(backend, device):
    """gelu(x) = x Phi(x) down to x = -12 within fp32 accuracy, forward and gradient: Phi as
    erfc(-x / sqrt 2) / 2, where (1 + erf(x / sqrt 2)) / 2 cancels to 0 below x ~ -5.5."""
    x = torch.linspace(-12.0, -3.0, 1001, dtype=torch.float32, device=device).requires_grad_()
    y = ks.gelu(x, backend=backend)
    (dx,) = torch.autograd.grad(y.sum(), (x,))
    xd = x.detach().double()
    cdf = 0.5 * torch.special.erfc(-xd / math.sqrt(2.0))
    want_y = xd * cdf
    want_dx = cdf + xd * torch.exp(-0.5 * xd * xd) / math.sqrt(2.0 * math.pi)
    assert (want_y != 0).all()
    for got, want in ((y, want_y), (dx, want_dx)):
        rel = ((got.detach().double() - want).abs() / want.abs()).max().item()
        assert rel < 1e-3, rel
