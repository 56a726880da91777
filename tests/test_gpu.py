"""GPU-only checks (marked gpu; run by scripts/gpu_check.sh on the GPU machine, skipped in CI):
real-size rows through the default launch policy, CUDA-graph capture, and compiled kernels."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import kernelset as ks
from kernelset.core.tolerance import rel_err, tolerance
from kernelset.ops.norm.reference import layer_norm_ref, rms_norm_ref

pytestmark = pytest.mark.gpu

# (rows, hidden): each launch-policy regime at the sizes the benchmarks use, and odd sizes.
SHAPES = [(4096, 4096), (1024, 8192), (512, 16384), (256, 32768), (64, 65536), (16, 262144), (257, 5120),
          (100, 7168), (3, 100003)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_rms_norm_large_rows(shape):
    x = torch.randn(*shape, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    w = torch.randn(shape[1], dtype=torch.bfloat16, device="cuda", requires_grad=True)
    y = ks.rms_norm(x, w)
    dy = torch.randn_like(y)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    xr, wr = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    yr = rms_norm_ref(xr, wr, 1e-6, 0.0, False)[0]
    dxr, dwr = torch.autograd.grad(yr, (xr, wr), dy.float())
    assert rel_err(y, yr) < tolerance("norm", torch.bfloat16)
    assert rel_err(dx, dxr) < tolerance("norm", torch.bfloat16, grad=True)
    assert rel_err(dw, dwr) < tolerance("norm", torch.bfloat16, grad=True)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_layer_norm_large_rows(shape):
    x = (torch.randn(*shape, device="cuda") + 2).to(torch.bfloat16).requires_grad_()
    w = torch.randn(shape[1], dtype=torch.bfloat16, device="cuda", requires_grad=True)
    b = torch.randn(shape[1], dtype=torch.bfloat16, device="cuda", requires_grad=True)
    y = ks.layer_norm(x, w, b)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, w, b), dy)
    leaves = [t.detach().float().requires_grad_() for t in (x, w, b)]
    yr = layer_norm_ref(*leaves, 1e-5)[0]
    refs = torch.autograd.grad(yr, leaves, dy.float())
    assert rel_err(y, yr) < tolerance("norm", torch.bfloat16)
    for g, r in zip(grads, refs):
        assert rel_err(g, r) < tolerance("norm", torch.bfloat16, grad=True)


@pytest.mark.parametrize("shape", [(2048, 32768), (64, 262144), (300, 100003)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_split_forward_barrier(shape):
    """Many rows of several programs each (thousands of programs meeting at per-row barriers,
    forced at every width here): the one-launch split forward agrees with its two-launch form
    to one rounding of the output everywhere (a program that read a partial before it was
    written would be off by percents in its row), bit for bit for RMSNorm; LayerNorm's chunk
    sums may be reduced in another order by the two compiled forms at unaligned widths."""
    from kernelset.ops.common import row_barrier
    from kernelset.ops.norm import policy

    x = torch.randn(*shape, dtype=torch.bfloat16, device="cuda")
    r = torch.randn_like(x)
    w = torch.randn(shape[1], dtype=torch.bfloat16, device="cuda")
    run = lambda: [ks.rms_norm(x, w), ks.layer_norm(x, w, w), *ks.fused_add_rms_norm(x, r, w)]  # noqa: E731
    with policy.use(dataclasses.replace(policy.DEFAULT_TUNING, split_min_fwd=0)):
        one = run()
        with row_barrier.two_launches():
            two = run()
    for name, a, b in zip(("rms_norm", "layer_norm", "fused out", "fused residual"), one, two):
        if name != "layer_norm":
            assert torch.equal(a, b), name
        close = torch.isclose(a.float(), b.float(), rtol=2 ** -7, atol=1e-5)
        assert close.all(), f"{name}: {(~close).sum().item()} elements differ by more than one rounding"
    assert rel_err(one[0], rms_norm_ref(x.float(), w.float(), 1e-6, 0.0, False)[0]) < tolerance("norm", torch.bfloat16)


def test_fused_add_bitexact_residual_and_hf_rounding():
    x = torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda")
    r = torch.randn_like(x)
    w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    out, h = ks.fused_add_rms_norm(x, r, w)
    assert torch.equal(h, x + r)
    hf = w * (h.float() * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
    assert (out != hf).float().mean().item() < 0.01


def test_cuda_graph_capture_and_replay():
    x = torch.randn(8, 4096, dtype=torch.bfloat16, device="cuda")
    r = torch.randn_like(x)
    w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    eager = (ks.rms_norm(x, w), ks.layer_norm(x, w, b), ks.fused_add_rms_norm(x, r, w).out)
    xs, rs = x.clone(), r.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up (compile, dispatch cache) outside the capture
        ks.rms_norm(xs, w)
        ks.layer_norm(xs, w, b)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y1 = ks.rms_norm(xs, w)
        y2 = ks.layer_norm(xs, w, b)
        y3 = ks.fused_add_rms_norm(xs.clone(), rs, w).out
    xs.copy_(torch.randn_like(xs))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y1, ks.rms_norm(xs, w))
    assert torch.equal(y2, ks.layer_norm(xs, w, b))
    xs.copy_(x)
    rs.copy_(r)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y1, eager[0]) and torch.equal(y2, eager[1]) and torch.equal(y3, eager[2])


def test_compile_fullgraph_cuda():
    x = torch.randn(64, 4096, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    w = torch.randn(4096, dtype=torch.bfloat16, device="cuda", requires_grad=True)

    def f(a, b):
        return ks.rms_norm(a * 2, b).float().pow(2).sum()

    cf = torch.compile(f, fullgraph=True)
    ge = torch.autograd.grad(f(x, w), (x, w))
    gc = torch.autograd.grad(cf(x, w), (x, w))
    for a, b in zip(ge, gc):
        assert rel_err(a, b) < 1e-2
