"""Every norm implementation against the fp32 reference, forward and every gradient.

Implementations come from the registry, so a new backend is tested without editing this file.
Outputs are NaN-poisoned (KS_POISON_OUTPUTS, see conftest) so an unwritten element fails.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import kernelset as ks
from kernelset.core.registry import impls
from kernelset.core.tolerance import rel_err, tolerance
from kernelset.ops.norm import policy
from kernelset.ops.norm.reference import fused_add_rms_norm_ref, layer_norm_ref, rms_norm_ref

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# (id, x shape, how x is made, why the case exists)
CASES = [
    ("row1-4096", (1, 4096), "plain", "a single row: decode"),
    ("odd-4097", (3, 4097), "plain", "odd hidden size: masked tail"),
    ("5120", (2, 5120), "plain", "non power of two, Llama-13B-like"),
    ("7168", (2, 7168), "plain", "DeepSeek-V3 hidden size"),
    ("hidden1", (7, 1), "plain", "the smallest hidden size"),
    ("hidden3-rows33", (33, 3), "plain", "many tiny rows in one program, ragged last block"),
    ("3d", (2, 3, 96), "plain", "leading shape [B, S]"),
    ("per-head", (5, 4, 128), "plain", "Qwen3 QK-norm: x [T, H, D], weight [D]"),
    ("empty", (0, 64), "plain", "an empty batch returns an empty result"),
    ("strided-rows", (6, 130), "slice", "rows of a wider tensor: row stride 200"),
    ("strided-3d", (2, 3, 64), "slice", "a [B, S, :64] slice of [B, S, 100]"),
    ("looped", (3, 1000), "looped", "long-row kernels, forced on a small row"),
    ("looped-odd", (2, 777), "looped", "long-row kernels with a ragged last chunk"),
    ("split", (3, 1000), "split", "the split kernels (a row over 8 programs), forced on a small row"),
    ("split-odd", (2, 777), "split", "split kernels with a ragged last chunk, 7 programs per row"),
    ("split-strided", (3, 600), "split-slice", "split kernels over rows of a wider tensor"),
]

SMALL_TUNING = dataclasses.replace(policy.DEFAULT_TUNING, max_block_fwd=256, max_block_bwd=256, looped_block=128,
                                   looped_block_fwd=128, dwdb_block_m=2, dwdb_block_n=64, split_chunk_fwd=0,
                                   split_chunk_bwd=0)
# the split forward and backward instead of the looped ones (backward: blocks of 2 rows, two
# blocks per program, so the 3-row cases have a ragged last block and 5 rows a fully masked one)
SPLIT_TUNING = dataclasses.replace(SMALL_TUNING, split_chunk_fwd=128, split_min_fwd=0, split_chunk_bwd=128,
                                   split_rows_bwd=2, split_blocks_bwd=2, split_blocks_bwd_wide=2,
                                   split_min_programs_bwd=0)


def _make_x(shape, how, dtype, device):
    if how.endswith("slice"):
        wide = torch.randn(*shape[:-1], shape[-1] + 70, dtype=dtype, device=device)
        return wide[..., : shape[-1]]
    return torch.randn(*shape, dtype=dtype, device=device)


def _eps(shape):
    # With one element per row, x^2 / (x^2 + eps) ~ 1 and dx cancels down to ~eps: use an eps
    # that keeps the gradient well-conditioned, so relative error measures the kernel.
    return 0.5 if shape[-1] == 1 else 1e-6


def _tuning(how):
    if how.startswith("split"):
        return policy.use(SPLIT_TUNING)
    return policy.use(SMALL_TUNING) if how == "looped" else policy.use(policy.active())


def _backends(op):
    return [str(i.backend) for i in impls(op)]


def _check(out, ref, dtype, what, grad=False, out_dtype=None):
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert out.dtype == (out_dtype or dtype), f"{what}: dtype {out.dtype}, expected {out_dtype or dtype}"
    if out.numel() == 0:
        return
    assert not out.isnan().any(), f"{what}: NaN in output (an element was not written?)"
    err = rel_err(out, ref.float())
    tol = tolerance("norm", dtype, grad=grad)
    assert err <= tol, f"{what}: rel err {err:.3g} > {tol:.3g}"


def _leaf(t):
    return t.detach().float().requires_grad_()


@pytest.mark.parametrize("backend", _backends("rms_norm"))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("cast,offset", [("llama", 0.0), ("gemma", 1.0)], ids=["llama", "gemma-offset1"])
def test_rms_norm(backend, dtype, case, cast, offset, device):
    _, shape, how, _ = case
    x = _make_x(shape, how, dtype, device)
    w = torch.randn(shape[-1], dtype=dtype, device=device)
    x.requires_grad_(True)
    w.requires_grad_(True)
    gemma = cast == "gemma"
    with _tuning(how):
        y = ks.rms_norm(x, w, eps=_eps(shape), offset=offset, cast=cast, backend=backend)
        dy = torch.randn_like(y)
        y.backward(dy)
    xr, wr = _leaf(x), _leaf(w)
    yr = rms_norm_ref(xr, wr, _eps(shape), offset, gemma)[0]
    yr.backward(dy.float())
    _check(y, yr, dtype, "y")
    _check(x.grad, xr.grad, dtype, "dx", grad=True)
    if _dw_conditioned(shape, dtype, gemma):
        _check(w.grad, wr.grad, dtype, "dw", grad=True)


def _dw_conditioned(shape, dtype, gemma):
    # With hidden size 1, dw is one sum of a few terms that may cancel; Llama-style rounding of
    # xhat (2^-9 relative in bf16) then has no bound relative to |dw|. Checked in fp32 there.
    return shape[-1] > 1 or dtype == torch.float32 or gemma


@pytest.mark.parametrize("backend", _backends("rms_norm"))
@pytest.mark.parametrize("case", [CASES[1], CASES[9], CASES[11]], ids=lambda c: c[0])
def test_rms_norm_without_weight(backend, case, device):
    _, shape, how, _ = case
    x = _make_x(shape, how, torch.bfloat16, device).requires_grad_(True)
    with _tuning(how):
        y = ks.rms_norm(x, backend=backend)
        dy = torch.randn_like(y)
        y.backward(dy)
    xr = _leaf(x)
    yr = rms_norm_ref(xr, None, 1e-6, 0.0, False)[0]
    yr.backward(dy.float())
    _check(y, yr, torch.bfloat16, "y")
    _check(x.grad, xr.grad, torch.bfloat16, "dx", grad=True)


@pytest.mark.parametrize("backend", _backends("fused_add_rms_norm"))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_fused_add_rms_norm(backend, dtype, case, device):
    _, shape, how, _ = case
    x = _make_x(shape, how, dtype, device).requires_grad_(True)
    r = _make_x(shape, how, dtype, device).requires_grad_(True)
    w = torch.randn(shape[-1], dtype=dtype, device=device).requires_grad_(True)
    with _tuning(how):
        out, h = ks.fused_add_rms_norm(x, r, w, eps=_eps(shape), backend=backend)
        dy, dh = torch.randn_like(out), torch.randn_like(h)
        torch.autograd.backward([out, h], [dy, dh])
    xr, rr, wr = _leaf(x), _leaf(r), _leaf(w)
    yr, hr, _ = fused_add_rms_norm_ref(xr, rr, wr, _eps(shape), 0.0, False)
    torch.autograd.backward([yr, hr], [dy.float(), dh.float()])
    _check(out, yr, dtype, "out")
    _check(h, hr, dtype, "residual")
    _check(x.grad, xr.grad, dtype, "dx", grad=True)
    _check(r.grad, rr.grad, dtype, "dresidual", grad=True)
    if _dw_conditioned(shape, dtype, False):
        _check(w.grad, wr.grad, dtype, "dw", grad=True)


@pytest.mark.parametrize("backend", _backends("fused_add_rms_norm"))
@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[9], CASES[11]], ids=lambda c: c[0])
def test_fused_add_rms_norm_in_place(backend, case, device):
    _, shape, how, _ = case
    x = _make_x(shape, how, torch.bfloat16, device)
    r = _make_x(shape, how, torch.bfloat16, device)
    w = torch.randn(shape[-1], dtype=torch.bfloat16, device=device)
    want_y, want_h, _ = fused_add_rms_norm_ref(x, r, w, 1e-6, 0.0, False)
    x_ptr, r_ptr = x.data_ptr(), r.data_ptr()
    with _tuning(how):
        out, res = ks.fused_add_rms_norm(x, r, w, in_place=True, backend=backend)
    assert out.data_ptr() == x_ptr and res.data_ptr() == r_ptr, "in_place must return x and residual themselves"
    assert torch.equal(res, want_h), "h = x + residual must be exactly torch's bf16 add"
    _check(out, want_y, torch.bfloat16, "out")
    if how.endswith("slice"):  # the columns beyond the slice must be untouched
        assert not x._base[..., shape[-1]:].isnan().any()


@pytest.mark.parametrize("flag", ["no", "False", 0, 1, None])
def test_fused_add_rms_norm_in_place_must_be_a_bool(flag, device):
    # in_place="no" (a flag read from a config string) was truthy: x and residual were silently
    # overwritten with y and h. Anything but True/False is refused naming the argument, as
    # rms_norm's torch_order is, and nothing is written.
    x = torch.randn(2, 64, device=device)
    r = torch.randn(2, 64, device=device)
    x0, r0 = x.clone(), r.clone()
    with pytest.raises(ValueError, match="argument 'in_place' must be a bool"):
        ks.fused_add_rms_norm(x, r, None, in_place=flag)
    assert torch.equal(x, x0) and torch.equal(r, r0)


@pytest.mark.parametrize("backend", _backends("fused_add_rms_norm"))
@pytest.mark.parametrize("which", ["x", "residual"])
def test_fused_add_rms_norm_in_place_bumps_autograd_version(backend, which, device):
    # a graph saved x (or residual) before the in-place call overwrote it: torch's in-place ops
    # bump the version counter so the backward raises; a kernel writing through pointers must too,
    # or the backward silently uses the new values (the Triton path did before the fix)
    x = torch.randn(4, 64, device=device)
    r = torch.randn(4, 64, device=device)
    w = torch.randn(64, device=device)
    lin = torch.randn(64, 8, device=device, requires_grad=True)
    out = (x if which == "x" else r) @ lin
    ks.fused_add_rms_norm(x, r, w, in_place=True, backend=backend)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


@pytest.mark.parametrize("backend", _backends("layer_norm"))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("affine", ["weight+bias", "weight", "none"])
def test_layer_norm(backend, dtype, case, affine, device):
    _, shape, how, _ = case
    # An offset mean stresses the centred variance (catastrophic cancellation in E[x^2]-E[x]^2).
    x = (_make_x(shape, how, dtype, device) + 3.0).detach().requires_grad_(True)
    n = shape[-1]
    w = torch.randn(n, dtype=dtype, device=device).requires_grad_(True) if affine != "none" else None
    b = torch.randn(n, dtype=dtype, device=device).requires_grad_(True) if affine == "weight+bias" else None
    with _tuning(how):
        y = ks.layer_norm(x, w, b, eps=1e-5, backend=backend)
        dy = torch.randn_like(y)
        y.backward(dy)
    xr = _leaf(x)
    wr = _leaf(w) if w is not None else None
    br = _leaf(b) if b is not None else None
    yr = layer_norm_ref(xr, wr, br, 1e-5)[0]
    yr.backward(dy.float())
    _check(y, yr, dtype, "y")
    _check(x.grad, xr.grad, dtype, "dx", grad=True)
    if w is not None:
        _check(w.grad, wr.grad, dtype, "dw", grad=True)
    if b is not None:
        _check(b.grad, br.grad, dtype, "db", grad=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_layer_norm_looped_statistics_hold_a_drifting_offset_mean(dtype, device):
    """The looped LayerNorm forward's statistics (per-chunk (mean, M2) pairs merged) on rows far
    from zero whose mean drifts from chunk to chunk and differs from lane to lane, with a ragged
    last chunk (1000 = 7 x 128 + 104), against float64 on the same input."""
    n = 1000
    # columns of one lane share a chunk offset: most of the variance lies between lanes
    cols = 50.0 * torch.randn(n, device=device) + torch.linspace(-50.0, 50.0, n, device=device)
    x = (1000.0 + cols + torch.randn(3, n, device=device)).to(dtype)
    w, b = torch.randn(n, device=device), torch.randn(n, device=device)
    with policy.use(SMALL_TUNING):
        assert policy.fwd_policy(3, n, 132, False, policy.active()).looped
        y = ks.layer_norm(x, w.to(dtype), b.to(dtype), eps=1e-5, backend="triton")
    want = torch.nn.functional.layer_norm(x.double(), (n,), w.to(dtype).double(), b.to(dtype).double(), 1e-5)
    assert rel_err(y, want.float()) < (2e-5 if dtype == torch.float32 else tolerance("norm", dtype))


def test_layer_norm_matches_torch(device):
    x = torch.randn(4, 300, device=device)
    w, b = torch.randn(300, device=device), torch.randn(300, device=device)
    y = ks.layer_norm(x, w, b, eps=1e-5)
    assert rel_err(y, torch.nn.functional.layer_norm(x, (300,), w, b, 1e-5)) < 1e-5


@pytest.mark.parametrize("cast", ["llama", "gemma"])
def test_rms_norm_rounds_like_huggingface(cast, device):
    """Llama: weight * normalize(x).to(dtype); Gemma: (normalize(x) * (1 + w.float())).to(dtype)."""
    torch.manual_seed(0)
    x = torch.randn(64, 1024, dtype=torch.bfloat16, device=device)
    w = (torch.randn(1024, device=device) * 0.5).to(torch.bfloat16)
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    hf_llama = w * normed.to(torch.bfloat16)
    hf_gemma = (normed * (1.0 + w.float())).to(torch.bfloat16)
    want, other = (hf_llama, hf_gemma) if cast == "llama" else (hf_gemma, hf_llama)
    offset = 0.0 if cast == "llama" else 1.0
    if cast == "llama":
        other = (normed * w.float()).to(torch.bfloat16)  # the same math rounded Gemma's way
    else:
        other = (normed.to(torch.bfloat16).float() * (1.0 + w.float())).to(torch.bfloat16)
    for backend in _backends("rms_norm"):
        y = ks.rms_norm(x, w, offset=offset, cast=cast, backend=backend)
        mismatch = (y != want).float().mean().item()
        # Only reduction-order differences in rstd may flip a rounding: far below the ~10-40%
        # of elements that the other rounding point changes.
        assert mismatch < 0.01, f"{backend}: {mismatch:.2%} of elements differ from HuggingFace {cast}"
        assert ((y.float() - want.float()).abs() <= want.float().abs() * 2**-7 + 1e-30).all()
        assert (y != other).float().mean().item() > 0.05, "test is not discriminating the rounding point"


# ---- torch_order: transformers' RMSNorm bit for bit -----------------------------------------

# (rows, hidden): torch's reduce gives a row 32 lanes from 16 rows up, more below (512 at one row)
TORCH_ORDER_SHAPES = [(1, 256), (3, 132), (17, 512), (2, 3072), (5, 1000), (16, 4096), (1, 16384), (9, 2052),
                      (1, 8192), (2, 6144), (2, 8192), (17, 16384), (5, 12288)]  # the last 3: rows split across warps


def _spread(m, n, device, dtype=torch.bfloat16):
    """Values over 16 binades: any other summation order rounds differently somewhere."""
    return (torch.randn(m, n, device=device) * torch.exp2(torch.randint(-8, 8, (m, n), device=device).float())).to(dtype)


@pytest.mark.parametrize("cast", ["llama", "gemma"])
@pytest.mark.parametrize("shape", TORCH_ORDER_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_rms_norm_torch_order_kernel_is_its_specification(shape, cast, device):
    """The kernel's sum is bitwise the elementwise emulation of torch's CUDA reduction order
    (reference.torch_cuda_mean_sq), and that order is not what a plain sum gives."""
    from kernelset.ops.norm import launch, reference
    m, n = shape
    x = _spread(m, n, device)
    w = torch.randn(n, device=device).to(torch.bfloat16)
    gemma = cast == "gemma"
    y, rstd = launch.rms_fwd_torch_order(x, w, eps=1e-5, offset=1.0 if gemma else 0.0, gemma_cast=gemma, stats=True)
    want_rstd = torch.rsqrt(reference.torch_cuda_mean_sq(x.float()) + 1e-5)
    xn = x.float() * want_rstd[:, None]
    want = (xn * (1.0 + w.float())).to(x.dtype) if gemma else (xn.to(x.dtype).float() * w.float()).to(x.dtype)
    assert torch.equal(rstd, want_rstd), f"{(rstd != want_rstd).sum().item()} of {m} rows' rstd differ"
    assert torch.equal(y, want)


@pytest.mark.parametrize("rows,unroll,ept", [(1, 1, 4), (2, 8, 8), (8, 2, 2)])
def test_rms_norm_torch_order_launch_shape_keeps_the_order(rows, unroll, ept, device):
    """Rows per program, steps loaded per iteration and warps change nothing in the result: a
    partial last block of rows, steps past the row's end, stats of the masked rows not written."""
    from kernelset.ops.norm import launch, policy, reference
    for m, n in ((37, 1000), (16, 4096), (3, 132)):
        x = _spread(m, n, device)
        w = torch.randn(n, device=device).to(torch.bfloat16)
        with policy.use(policy.NormTuning(torch_order_rows=rows, torch_order_unroll=unroll,
                                          torch_order_elems_per_thread=ept)):
            y, rstd = launch.rms_fwd_torch_order(x, w, eps=1e-5, offset=0.0, gemma_cast=False, stats=True)
        want_rstd = torch.rsqrt(reference.torch_cuda_mean_sq(x.float()) + 1e-5)
        want = ((x.float() * want_rstd[:, None]).to(x.dtype).float() * w.float()).to(x.dtype)
        assert torch.equal(rstd, want_rstd), f"[{m}, {n}]: {(rstd != want_rstd).sum().item()} rows' rstd differ"
        assert torch.equal(y, want), f"[{m}, {n}]"


def test_torch_order_inputs_discriminate(device):
    """Guard of the test above: on these inputs a different summation order changes some rstd."""
    from kernelset.ops.norm import reference
    differ = 0
    for m, n in TORCH_ORDER_SHAPES:
        xf = _spread(m, n, device).float()
        a = torch.rsqrt(reference.torch_cuda_mean_sq(xf) + 1e-5)
        b = torch.rsqrt(xf.double().pow(2).mean(-1).float() + 1e-5)
        differ += int((a != b).sum())
    assert differ > 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_torch_cuda_mean_order_is_torchs(dtype, device):
    """The emulated order equals torch's own CUDA ``pow(2).mean(-1)`` bit for bit (a new torch
    whose reduce kernel sums differently fails here first)."""
    from kernelset.ops.norm import reference
    for m in (1, 2, 3, 5, 8, 15, 16, 17, 100, 2048):
        for n in (132, 256, 1000, 2048, 3072, 4096, 5120, 8192, 16384):
            if reference.torch_cuda_mean_lanes(m, n) is None:
                continue  # an order torch_order does not claim (the reference runs torch's own ops)
            xf = _spread(m, n, device, dtype).float()
            got = reference.torch_cuda_mean_sq(xf)
            want = xf.pow(2).mean(-1)
            assert torch.equal(got, want), f"[{m}, {n}] {dtype}: {(got != want).sum().item()} rows differ"


@pytest.mark.parametrize("module", ["llama", "gemma"])
def test_rms_norm_torch_order_equals_transformers(module, device):
    """ks.rms_norm(torch_order=True) is transformers' RMSNorm bit for bit (on CPU the dispatcher
    runs the reference, torch's own ops; on CUDA our kernel)."""
    mod = pytest.importorskip(f"transformers.models.{module}.modeling_{module}")
    cls = mod.LlamaRMSNorm if module == "llama" else mod.GemmaRMSNorm
    for m, n in ((1, 4096), (7, 2048), (64, 4096), (300, 1024), (3, 8192), (64, 16384)):  # rows split across warps last
        norm = cls(n, eps=1e-5).to(device)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(n) * 0.3 + (1.0 if module == "llama" else 0.0))
        norm = norm.to(torch.bfloat16) if module == "llama" else norm  # Gemma keeps fp32 weights
        x = _spread(m, n, device)
        with torch.no_grad():
            want = norm(x)
        y = ks.rms_norm(x, norm.weight, eps=1e-5, offset=0.0 if module == "llama" else 1.0, cast=module,
                        torch_order=True)
        assert torch.equal(y, want), f"[{m}, {n}]: {(y != want).sum().item()} elements differ from {cls.__name__}"


def test_rms_norm_torch_order_dispatch(device):
    x = torch.randn(4, 96, device=device)
    e = ks.explain("rms_norm", x, None, torch_order=True)
    assert e.chosen is ks.Backend.REFERENCE or str(e.chosen) == "reference", str(e)
    triton = [c for c in e.candidates if str(c.backend) == "triton"]
    assert triton and "torch_order" in (triton[0].reason or ""), str(e)
    with pytest.raises(ValueError, match="torch_order"):
        ks.rms_norm(x, torch_order="yes")


@pytest.mark.parametrize("backend", _backends("rms_norm"))
def test_rms_norm_weight_dtype_differs(backend, device):
    """fp32 weights with bf16 activations (mixed precision): output in x.dtype, dw in fp32."""
    x = torch.randn(8, 256, dtype=torch.bfloat16, device=device, requires_grad=True)
    w = torch.randn(256, dtype=torch.float32, device=device, requires_grad=True)
    y = ks.rms_norm(x, w, backend=backend)
    assert y.dtype == torch.bfloat16
    y.sum().backward()
    assert w.grad.dtype == torch.float32 and x.grad.dtype == torch.bfloat16
    xr, wr = _leaf(x), _leaf(w)
    rms_norm_ref(xr, wr, 1e-6, 0.0, False)[0].sum().backward()
    _check(w.grad, wr.grad, torch.bfloat16, "dw", grad=True, out_dtype=torch.float32)


def test_expanded_grad_is_accepted(device):
    # y.sum().backward() hands the backward an expanded (stride-0) gradient.
    x = torch.randn(4, 64, device=device, requires_grad=True)
    w = torch.randn(64, device=device, requires_grad=True)
    ks.rms_norm(x, w, backend="triton").sum().backward()
    xr, wr = _leaf(x), _leaf(w)
    rms_norm_ref(xr, wr, 1e-6, 0.0, False)[0].sum().backward()
    _check(x.grad, xr.grad, torch.float32, "dx", grad=True)


def test_grad_of_weight_only(device):
    x = torch.randn(4, 64, device=device)
    w = torch.randn(64, device=device, requires_grad=True)
    ks.rms_norm(x, w).pow(2).sum().backward()
    wr = _leaf(w)
    rms_norm_ref(x, wr, 1e-6, 0.0, False)[0].pow(2).sum().backward()
    _check(w.grad, wr.grad, torch.float32, "dw", grad=True)


def test_gradcheck_reference_math(device):
    """The backward formulas (checked above against autograd of the reference) are themselves
    checked here against finite differences, in float64 through the reference backend."""
    x = torch.randn(3, 17, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(17, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: rms_norm_ref(a, b, 1e-6, 0.5, True)[0], (x, w))
    assert torch.autograd.gradcheck(lambda a, b: layer_norm_ref(a, b, None, 1e-5)[0], (x, w))


@pytest.mark.parametrize("backend", _backends("rms_norm"))
@pytest.mark.parametrize("op", ["rms_norm", "fused_add_rms_norm", "layer_norm"])
def test_double_backward_is_refused_by_name(op, backend, device):
    # A gradient penalty through the norm (create_graph=True, then a gradient of the gradient)
    # once came out silently wrong: the Triton gradients carry no graph, so the norm's
    # second-order term vanished from a sum with other terms (1.4e-2 relative error with an x^3
    # term beside it), and the reference's graph ignored the saved rstd's dependence on x
    # (0.55 relative error alone). Refused by name now; retain_graph stays exact.
    x = torch.randn(3, 16, device=device, requires_grad=True)
    w = torch.randn(16, device=device)
    res = torch.randn(3, 16, device=device)

    def f():
        if op == "rms_norm":
            return ks.rms_norm(x, w, backend=backend)
        if op == "layer_norm":
            return ks.layer_norm(x, w, backend=backend)
        return ks.fused_add_rms_norm(x, res, w, backend=backend).out

    y = f() + x.pow(3)
    with pytest.raises(RuntimeError, match=f"kernelset.{op}: backward with create_graph=True"):
        torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)
    y = f()
    y.sum().backward(retain_graph=True)
    first = x.grad.clone()
    y.sum().backward()
    assert torch.allclose(x.grad, 2 * first)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("how", ["plain", "looped", "split"])
def test_batch_invariance(op, how, device):
    """A row's result does not depend on the rows batched with it (serving needs this)."""
    x = torch.randn(37, 1000, dtype=torch.bfloat16, device=device)
    w = torch.randn(1000, dtype=torch.bfloat16, device=device)
    fn = (lambda t: ks.rms_norm(t, w)) if op == "rms_norm" else (lambda t: ks.layer_norm(t, w))
    with _tuning(how):
        full = fn(x)
        for i in (0, 5, 36):
            assert torch.equal(fn(x[i:i + 1]), full[i:i + 1]), f"row {i} differs alone vs in the batch"
        assert torch.equal(fn(x[3:20]), full[3:20])


def test_split_forward_runs_and_has_one_launch_form(device, monkeypatch):
    """The split tuning really launches the split kernel (several programs per row), and on a GPU
    its one-launch form (programs meet at a barrier) gives the two-launch form's bits."""
    from kernelset.ops.common import row_barrier
    from kernelset.ops.norm import launch as L

    grids = []
    real = L._fwd_split
    monkeypatch.setattr(L, "_fwd_split", lambda grid, *a, **kw: (grids.append((grid, kw["PHASE"])), real(grid, *a, **kw))[1])
    x = torch.randn(5, 1000, dtype=torch.bfloat16, device=device)
    r = torch.randn_like(x)
    w = torch.randn(1000, dtype=torch.bfloat16, device=device)
    with policy.use(SPLIT_TUNING):
        run = lambda: [ks.rms_norm(x, w, backend="triton"), ks.layer_norm(x, w, w, backend="triton"),
                       *ks.fused_add_rms_norm(x, r, w, backend="triton")]
        one = run()
        with row_barrier.two_launches():
            two = run()
    assert grids and all(g == (5 * 8,) for g, _ in grids), grids
    if device.type == "cuda":
        assert {p for _, p in grids} == {0, 1, 2}
    for a, b in zip(one, two):
        assert torch.equal(a, b)


def test_explain_names_the_kernels_of_the_row_width(device):
    """ks.explain says which forward and backward kernels a width takes (block, split, looped)."""
    from kernelset.core.arch import sm_count

    def explain(op, n, *params):
        return str(ks.explain(op, torch.randn(2, n, dtype=torch.bfloat16, device=device), *params, backend="triton"))
    exp = explain("rms_norm", 8, torch.randn(8, dtype=torch.bfloat16, device=device))
    assert "kernels: block forward; block backward" in exp, exp
    exp = explain("rms_norm", 4096, torch.randn(4096, dtype=torch.bfloat16, device=device))
    assert "kernels: two-pass forward (2048-column chunks); block backward" in exp, exp
    assert "kernels: block forward;" in explain("layer_norm", 4096, None, None)
    wide = 65536
    exp = explain("rms_norm", wide, torch.randn(wide, dtype=torch.bfloat16, device=device))
    from kernelset.ops.norm.launch import ring_fwd_choice
    if ring_fwd_choice(wide, torch.bfloat16, device, policy.active()) is not None:  # an H200-class sm_90 GPU
        assert "ring forward on sm_90 (Gluon: 4 programs of 16384 columns per row" in exp, exp
        assert "else looped forward); split backward (tiles of" in exp, exp
    else:
        assert "looped forward; split backward (tiles of" in exp, exp
    with policy.use(dataclasses.replace(policy.active(), split_chunk_bwd=0)):
        exp = explain("layer_norm", wide, None, None)
    assert "looped backward + dw/db pass" in exp, exp
    exp = explain("layer_norm", 262144, None, None)
    t = policy.active()
    sp, rows = policy.bwd_split_policy(262144, sm_count(device), t)
    assert rows < t.split_rows_bwd  # the rows halved: several blocks per program
    want = (f"split backward (tiles of {rows} rows x {sp.chunk} columns, {sp.split} per row, "
            f"up to {t.split_blocks_bwd_wide} row blocks per program)")
    assert want in exp, exp


def test_split_backward_runs_and_has_one_launch_form(device, monkeypatch):
    """The split tuning launches the split backward (on a GPU blocks of 2 rows, 8 programs per row, a
    ragged last block), its gradients through autograd match the looped backward's (fp32 x: the
    two sum in different orders), and on a GPU its one-launch form gives the two-launch form's
    bits (called directly: autograd runs a CUDA backward on its own thread, outside the
    two_launches context)."""
    from kernelset.core.arch import sm_count
    from kernelset.ops.common import row_barrier
    from kernelset.ops.norm import launch as L

    grids = []
    real = L._bwd_split
    monkeypatch.setattr(L, "_bwd_split", lambda grid, *a, **kw: (grids.append((grid, kw["PHASE"])), real(grid, *a, **kw))[1])
    x = torch.randn(5, 1000, device=device)
    r = torch.randn_like(x)
    w = torch.randn(1000, device=device)
    b = torch.randn(1000, device=device)
    dy = torch.randn_like(x)

    def grads():
        out = []
        for op in ("rms", "ln", "add"):
            xs, ws, bs, rs = (t.clone().requires_grad_() for t in (x, w, b, r))
            if op == "rms":
                y = ks.rms_norm(xs, ws, backend="triton")
            elif op == "ln":
                y = ks.layer_norm(xs, ws, bs, backend="triton")
            else:
                y = ks.fused_add_rms_norm(xs, rs, ws, backend="triton").out
            y.backward(dy)
            out += [xs.grad, ws.grad] + ([bs.grad] if op == "ln" else []) + ([rs.grad] if op == "add" else [])
        return out

    with policy.use(SMALL_TUNING):
        looped = grads()
    assert not grids
    with policy.use(SPLIT_TUNING):
        split = grads()
    sp, rows = policy.bwd_split_policy(1000, sm_count(device), SPLIT_TUNING)
    assert sp.split > 1 and rows >= 1  # several programs per row (8 x 2 rows on a GPU, 4 x 1 here)
    blocks = -(-5 // rows)
    per = policy.bwd_split_per_prog(blocks, rows, sp.split, sm_count(device), SPLIT_TUNING)
    assert per == 2  # two blocks per program; the last program's second block is past the rows
    assert grids and all(g == (-(-blocks // per) * sp.split,) for g, _ in grids), grids
    for i, (a, c) in enumerate(zip(split, looped)):
        assert rel_err(a, c) < 1e-5, f"gradient {i}: split vs looped rel err {rel_err(a, c):.2e}"

    xb, dyb, wb = (t.to(torch.bfloat16) for t in (x, dy, w))
    xf = xb.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1) + 1e-6)
    mean = xf.mean(-1)
    lrstd = torch.rsqrt(xf.var(-1, unbiased=False) + 1e-5)

    def direct():
        return [*L.norm_bwd(dyb, xb, wb, None, rstd, is_rms=True, gemma_cast=False, has_bias=False)[:2],
                *L.norm_bwd(dyb, xb, wb, mean, lrstd, is_rms=False, gemma_cast=False, has_bias=True)]

    grids.clear()
    with policy.use(SPLIT_TUNING):
        one = direct()
        with row_barrier.two_launches():
            two = direct()
    if device.type == "cuda":
        assert {p for _, p in grids} == {0, 1, 2}
    for i, (a, b_) in enumerate(zip(one, two)):
        assert torch.equal(a, b_), f"output {i}: one launch != two launches"


_SPLIT_AOT = r"""
import json, re, subprocess, tempfile, os
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource
from kernelset.ops.norm import kernels as K
from kernelset.ops.norm.policy import DEFAULT_TUNING, fwd_split_policy

sp = fwd_split_policy(262144, 132, DEFAULT_TUNING)
P = "*bf16"
sig = dict(X=P, R=P, W=P, B=P, Y=P, H=P, MEAN="*fp32", RSTD="*fp32", PART="*fp32", SYNC="*i32", M="i32", N="i32",
           split="i32", stride_x="i32", stride_r="i32", stride_y="i32", stride_h="i32", eps="fp32", offset="fp32")
out = []
for rms in (True, False):
    consts = dict(IS_RMS=rms, HAS_RESIDUAL=False, HAS_WEIGHT=True, HAS_BIAS=not rms, GEMMA_CAST=False,
                  STORE_STATS=False, CHUNK=sp.chunk, SPLIT_P2=sp.split_p2, PHASE=0)
    attrs = {(k,): [["tt.divisibility", 16]] for k, (name, ty) in enumerate(sig.items())
             if ty.startswith("*") or name == "N" or name.startswith("stride")}
    src = ASTSource(K._norm_fwd_split_kernel, signature={**sig, **{k: "constexpr" for k in consts}},
                    constexprs=consts, attrs=attrs)
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=sp.num_warps, enable_fp_fusion=False))
    ptx = c.asm["ptx"]
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, "k.ptx"), "w").write(ptx)
        rep = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", os.path.join(d, "k.ptx"), "-o",
                              os.path.join(d, "k.o")], capture_output=True, text=True).stderr
    out.append(dict(case=f"split-rms{rms}", local="ld.local" in ptx or "st.local" in ptx, vec=".v4" in ptx,
                    regs=int(re.search(r"Used (\d+) registers", rep).group(1)), chunk=sp.chunk, warps=sp.num_warps,
                    evict_first="evict_first" in ptx, streaming="st.global.cs" in ptx))
print(json.dumps(out))
"""


_SPLIT_BWD_AOT = r"""
import json, re, subprocess, tempfile, os
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource
from kernelset.ops.norm import kernels as K
from kernelset.ops.norm.policy import DEFAULT_TUNING, bwd_split_per_prog, bwd_split_policy

P = "*bf16"
sig = dict(DY=P, X=P, W=P, MEAN="*fp32", RSTD="*fp32", DRES=P, DX=P, DW_PART="*fp32", DB_PART="*fp32", PART="*fp32",
           SYNC="*i32", M="i32", N="i32", split="i32", stride_dy="i32", stride_x="i32", stride_dres="i32",
           stride_dx="i32", offset="fp32")
out = []
for n in (16384, 65536, 262144):
    sp, rows = bwd_split_policy(n, 132, DEFAULT_TUNING)
    per = bwd_split_per_prog(4096, rows, sp.split, 132, DEFAULT_TUNING)
    for rms in (True, False):
        consts = dict(IS_RMS=rms, HAS_WEIGHT=True, HAS_BIAS=not rms, HAS_DRES=False, GEMMA_CAST=False, ROWS=rows,
                      CHUNK=sp.chunk, SPLIT_P2=sp.split_p2, PER=per, PHASE=0)
        attrs = {(k,): [["tt.divisibility", 16]] for k, (name, ty) in enumerate(sig.items())
                 if ty.startswith("*") or name == "N" or name.startswith("stride")}
        src = ASTSource(K._norm_bwd_split_kernel, signature={**sig, **{k: "constexpr" for k in consts}},
                        constexprs=consts, attrs=attrs)
        c = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                           options=dict(num_warps=sp.num_warps, enable_fp_fusion=False))
        with tempfile.TemporaryDirectory() as d:
            open(os.path.join(d, "k.ptx"), "w").write(c.asm["ptx"])
            rep = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", os.path.join(d, "k.ptx"), "-o",
                                  os.path.join(d, "k.o")], capture_output=True, text=True).stderr
        spill = re.search(r"(\d+) bytes spill stores", rep)
        ptx = c.asm["ptx"]
        out.append(dict(case=f"n{n}-rms{rms}-per{per}", per=per, split=sp.split, rows=rows, chunk=sp.chunk,
                        local="ld.local" in ptx or "st.local" in ptx, vec=".v4" in ptx,
                        regs=int(re.search(r"Used (\d+) registers", rep).group(1)),
                        spill=int(spill.group(1)) if spill else -1))
print(json.dumps(out))
"""


def test_split_backward_compiles_without_spills():
    """The split backward at the default tuning, compiled for sm_90 with this machine's Triton and
    ptxas: 8 rows x 1024 columns, one block per program, at 16384 and 65536; 4 rows x 2048
    columns, a loop over 8 blocks, at 262144 (Triton 3.6: 163-165 registers with one block, 165 /
    213 RMSNorm / LayerNorm with the loop; Triton 3.9: 166-195 / 168 / 180). No spills, and a block of at most one program per
    SM. LayerNorm's two slots reduced by two separate trees made ptxas fall to 32 registers and
    18 KB of stack; the row-block loop unrolled (static_range) spilled 1.7-2.9 KB."""
    from aot import compile_report

    results = compile_report(_SPLIT_BWD_AOT, 6)
    for r in results:
        wide = r["case"].startswith("n262144")
        assert (r["rows"], r["chunk"], r["per"]) == ((4, 2048, 8) if wide else (8, 1024, 1)), r
        assert r["split"] <= 132 and r["spill"] == 0, r


def test_split_forward_keeps_its_chunk_16_bit():
    """The split forward at the 262144-wide bar shape, compiled for sm_90 with this machine's Triton:
    the bf16 chunk stays bf16 across the row barrier (``row_barrier.rewiden``), so RMSNorm fits in at
    most 80 registers per thread at 8192 columns / 4 warps (103 with an fp32 copy held: 4 programs
    per SM instead of 7); the chunk is loaded evict-first and y stored streaming."""
    from aot import compile_report

    results = compile_report(_SPLIT_AOT, 2)
    for r in results:
        assert (r["chunk"], r["warps"]) == (8192, 4), r
        assert r["evict_first"] and r["streaming"], r
    rms = next(r for r in results if r["case"] == "split-rmsTrue")
    assert rms["regs"] <= 80, rms


# ---- the eager replay table (api._EAGER): repeated no-grad calls skip checks and dispatch ------


def test_eager_replay_keys_only_plain_hashable_calls(device):
    from kernelset.ops.norm import api
    x = torch.randn(2, 64, device=device)
    w = torch.randn(64, device=device)
    key = api._eager_key
    assert key(x, w, 1e-6, 0.0, api.NormCast.LLAMA, False, "auto") is not None
    assert key(x, None, 1e-6, 0.0, api.NormCast.GEMMA, True, "triton") is not None
    for bad in ((x, w, 1, 0.0, api.NormCast.LLAMA, False, "auto"),  # int eps: the full path converts it
                (x, w, 1e-6, 0, api.NormCast.LLAMA, False, "auto"),
                (x, w, 1e-6, 0.0, "llama", False, "auto"),  # a string cast is parsed by the full path
                (x, w, 1e-6, 0.0, api.NormCast.LLAMA, 1, "auto"),
                (x, [1.0], 1e-6, 0.0, api.NormCast.LLAMA, False, "auto"),
                (torch.nn.Parameter(x), w, 1e-6, 0.0, api.NormCast.LLAMA, False, "auto")):
        assert key(*bad) is None
    # every property the checks and the launch depend on is in the key
    base = key(x, w, 1e-6, 0.0, api.NormCast.LLAMA, False, "auto")
    assert key(x.t().contiguous().t(), w, 1e-6, 0.0, api.NormCast.LLAMA, False, "auto") != base  # strides
    assert key(x.half(), w, 1e-6, 0.0, api.NormCast.LLAMA, False, "auto") != base
    assert key(x, w[:32], 1e-6, 0.0, api.NormCast.LLAMA, False, "auto") != base
    assert key(x, w, 1e-5, 0.0, api.NormCast.LLAMA, False, "auto") != base
    with policy.use(dataclasses.replace(policy.DEFAULT_TUNING, fwd_tile=4096)):
        assert key(x, w, 1e-6, 0.0, api.NormCast.LLAMA, False, "auto") != base
    api._EAGER["sentinel"] = None
    with ks.config.override(direct_launch=False):
        assert "sentinel" not in api._EAGER  # any configuration change empties the table


def test_eager_replay_is_never_taken_for_bad_input_or_on_the_cpu(device):
    """Bad input reaches the checks even after a good call of the same shape (the key holds the
    argument's properties, so a call that differs is a miss); the CPU's reference is never kept."""
    from kernelset.ops.norm import api
    x = torch.randn(3, 256, device=device, dtype=torch.bfloat16)
    w = torch.randn(256, device=device, dtype=torch.bfloat16)
    for _ in range(2):
        ks.rms_norm(x, w)
    if device.type == "cpu":
        # (the key starts with the config generation: x's shape and device follow it)
        assert not any(k[1] == x.shape and k[4] == x.device for k in api._EAGER if isinstance(k, tuple))
    with pytest.raises(ValueError, match="eps"):
        ks.rms_norm(x, w, eps=-1.0)
    with pytest.raises(ValueError, match="weight"):
        ks.rms_norm(x, w[:128])


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["two-pass", "block", "torch-order", "gemma-offset", "no-weight", "strided"])
def test_eager_replay_matches_the_full_path(case):
    """The second and later no-grad calls of a signature take the replay (one kernel launch
    through its bound site); their output equals the first call's bit for bit and the reference
    within tolerance, and a call whose tensors differ in alignment falls back to the full path."""
    from kernelset.ops.norm import api
    dev = torch.device("cuda")
    n = {"block": 1024, "strided": 2048}.get(case, 4096)
    wide = torch.randn(4, n + 8, device=dev, dtype=torch.bfloat16)
    x = wide[:, :n] if case == "strided" else torch.randn(4, n, device=dev, dtype=torch.bfloat16)
    w = None if case == "no-weight" else torch.randn(n, device=dev, dtype=torch.bfloat16)
    kw = {"torch_order": True} if case == "torch-order" else {}
    if case == "gemma-offset":
        kw = {"offset": 1.0, "cast": ks.NormCast.GEMMA}
    api._EAGER.clear()
    first = ks.rms_norm(x, w, **kw)
    assert len(api._EAGER) == 1
    (replay,) = api._EAGER.values()
    y = torch.full_like(first, float("nan"))
    assert replay(x, w, y, 1e-6, kw.get("offset", 0.0)), "the replay did not launch"
    assert torch.equal(y, first)
    assert torch.equal(ks.rms_norm(x, w, **kw), first)
    want = rms_norm_ref(x, w, 1e-6, kw.get("offset", 0.0), case == "gemma-offset")[0]
    assert rel_err(first, want) <= tolerance("norm", torch.bfloat16)
    # a view one element off the aligned rows: same shape and strides (same key), other alignment
    if case == "strided":
        off = wide[:, 1:n + 1]
        y2 = torch.full_like(first, float("nan"))
        assert not replay(off, w, y2, 1e-6, 0.0)
        assert torch.isnan(y2).all()
        got = ks.rms_norm(off, w)
        assert rel_err(got, rms_norm_ref(off, w, 1e-6, 0.0, False)[0]) <= tolerance("norm", torch.bfloat16)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
def test_sparse_csr_x_is_refused_by_name():
    # the eager replay table's key reads x.stride(), which a sparse CSR tensor does not have: the
    # call failed with torch's own message before the checks could name the argument
    x = torch.randn(4, 8).to_sparse_csr()
    with pytest.raises(ks.ArgumentTypeError, match="argument 'x' must be a dense"):
        ks.rms_norm(x)
