"""cross_entropy: every implementation against an fp32 autograd reference (loss and gradient),
torch's own F.cross_entropy where the options overlap, and the edge cases a trainer hits."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from aot import compile_report

import kernelset as ks
from kernelset.core.registry import impls
from kernelset.core.tolerance import rel_err, tolerance
from kernelset.ops.loss import launch
from kernelset.ops.loss import reference as R

DTYPES = [torch.float32, torch.bfloat16]
DT_IDS = lambda d: str(d).replace("torch.", "")  # noqa: E731

# (id, logits shape, how, why)
CASES = [
    ("row1-v1000", (1, 1000), "plain", "one row"),
    ("v-odd-4097", (3, 4097), "plain", "ragged vocabulary tail"),
    ("3d", (2, 3, 500), "plain", "[B, S, V] logits with [B, S] targets"),
    ("strided-rows", (4, 300), "slice", "rows of a wider tensor (row stride 330)"),
    ("looped", (3, 1000), "looped", "several vocabulary chunks (forced 128-wide)"),
    ("looped-exact", (3, 1024), "looped", "whole chunks only: no tail chunk"),
    ("v2", (9, 2), "plain", "tiny vocabulary"),
    ("split", (3, 1000), "split", "the split kernel: a row over 8 programs (forced 128-wide chunks)"),
    ("split-odd", (5, 4097), "split", "split with a 1-wide last chunk (33 programs per row)"),
    ("split-strided", (4, 300), "split-slice", "split over rows of a wider tensor"),
]
SPLIT = launch.CETuning(split_chunk=128)


def _use(how):
    if how.startswith("split"):
        return launch.use(SPLIT)
    return launch.use(launch.CETuning(block=128, block_fwd=128)) if how == "looped" else launch.use(launch.active())
# (id, kwargs): the option combinations a trainer uses
OPTIONS = [
    ("plain", {}),
    ("smooth", {"label_smoothing": 0.1}),
    ("zloss-softcap", {"z_loss": 1e-3, "softcap": 30.0}),
    ("all", {"label_smoothing": 0.05, "z_loss": 1e-4, "softcap": 15.0}),
]


def _logits(shape, how, dtype, device):
    if how.endswith("slice"):
        return (torch.randn(shape[0], shape[1] + 30, device=device) * 4).to(dtype)[:, : shape[1]]
    return (torch.randn(*shape, device=device) * 4).to(dtype)


def _targets(shape, device):
    t = torch.randint(0, shape[-1], shape[:-1], device=device)
    t.view(-1)[::3] = -100  # a third ignored
    return t


def _ref_loss(x, t, opts, reduction):
    loss, _, _, valid, _ = R.rows(x, t, -100, opts.get("label_smoothing", 0.0), opts.get("z_loss", 0.0),
                                 opts.get("softcap"))
    if reduction == "none":
        return loss
    return loss.sum() / valid.sum().clamp(min=1) if reduction == "mean" else loss.sum()


@pytest.mark.parametrize("backend", [str(i.backend) for i in impls("cross_entropy")])
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("opt", OPTIONS, ids=lambda o: o[0])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(backend, dtype, case, opt, reduction, device):
    _, shape, how, _ = case
    x = _logits(shape, how, dtype, device).requires_grad_(True)
    t = _targets(shape, device)
    with _use(how):
        loss = ks.cross_entropy(x, t, reduction=reduction, backend=backend, **opt[1])
        g = torch.rand_like(loss) + 0.5  # not 1.0: the backward's scaling must run
        loss.backward(g)
    xr = x.detach().float().requires_grad_()
    lr = _ref_loss(xr.reshape(-1, shape[-1]), t.reshape(-1), opt[1], reduction)
    lr = lr.reshape(t.shape) if reduction == "none" else lr
    lr.backward(g)
    assert loss.dtype == torch.float32 and loss.shape == lr.shape
    assert rel_err(loss, lr) <= tolerance("norm", torch.float32), f"loss rel err {rel_err(loss, lr):.3g}"
    assert x.grad.dtype == dtype and not x.grad.isnan().any()
    err = rel_err(x.grad, xr.grad)
    assert err <= tolerance("norm", dtype, grad=True), f"dlogits rel err {err:.3g}"


@pytest.mark.parametrize("backend", [str(i.backend) for i in impls("cross_entropy")])
def test_matches_torch(backend, device):
    x = torch.randn(16, 777, device=device, requires_grad=True)
    t = torch.randint(0, 777, (16,), device=device)
    t[3] = -100
    loss = ks.cross_entropy(x, t, label_smoothing=0.2, backend=backend)
    xr = x.detach().clone().requires_grad_()
    want = F.cross_entropy(xr, t, label_smoothing=0.2)
    loss.backward()
    want.backward()
    assert rel_err(loss, want) < 1e-6 and rel_err(x.grad, xr.grad) < 1e-5


@pytest.mark.parametrize("backend", [str(i.backend) for i in impls("cross_entropy")])
def test_strided_target(backend, device):
    """A target that is a strided view (labels[::2]) is read element by element, not as if dense."""
    x = torch.randn(6, 50, device=device)
    labels = torch.randint(0, 50, (12,), device=device)
    got = ks.cross_entropy(x, labels[::2], reduction="none", backend=backend)
    assert rel_err(got, F.cross_entropy(x, labels[::2], reduction="none")) < 1e-6


@pytest.mark.parametrize("backend", [str(i.backend) for i in impls("cross_entropy")])
def test_all_ignored_gives_zero_not_nan(backend, device):
    x = torch.randn(4, 50, device=device, requires_grad=True)
    t = torch.full((4,), -100, device=device)
    loss = ks.cross_entropy(x, t, backend=backend)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.parametrize("backend", [str(i.backend) for i in impls("cross_entropy")])
@pytest.mark.parametrize("tdt", [torch.int64, torch.int32], ids=["i64", "i32"])
def test_out_of_range_target_raises(backend, tdt, device):
    # as torch (and ks.embedding's ids): a target outside [0, V) that is not ignore_index is an
    # error by default, naming the function, the argument, the range and the first bad value; it
    # once gave a NaN loss with finite gradients, so training went on over the bad row
    x = torch.randn(4, 4, device=device, requires_grad=True)
    for t, got in (([1, 2, 3, 10], "target 10 at flat index 3"), ([[-100, -5], [0, 3]], "target -5 at flat index 1")):
        target = torch.tensor(t, device=device, dtype=tdt)
        with pytest.raises(ks.ArgumentError) as e:
            ks.cross_entropy(x.reshape(target.shape + (-1,)) if target.dim() == 2 else x, target, backend=backend)
        assert str(e.value) == (f"cross_entropy: argument 'target' must be in [0, 4) (logits' last dim) or "
                                f"ignore_index (-100), got {got}")
    assert x.grad is None
    # ignore_index is valid wherever it lies, inside [0, V) too; so is every target in range
    ks.cross_entropy(x, torch.tensor([0, 3, -100, 1], device=device, dtype=tdt), backend=backend)
    ks.cross_entropy(x, torch.tensor([0, 3, 7, 7], device=device, dtype=tdt), ignore_index=7, backend=backend)


@pytest.mark.parametrize("backend", [str(i.backend) for i in impls("cross_entropy")])
@pytest.mark.parametrize("bad", [50, -5], ids=["past-V", "negative"])
@pytest.mark.parametrize("how", ["unchecked", "compiled"])
def test_out_of_range_target_poisons_loss_and_gradient(backend, bad, how, device):
    # documented, where the check is skipped (check_target=False, torch.compile, graph capture):
    # the row's loss is NaN and so is its whole gradient row, whatever the incoming gradient (a
    # zero gradient let training go on over garbage), with no host sync and no read outside the
    # row; the other rows are untouched; the reference agrees
    x = torch.randn(3, 50, device=device, requires_grad=True)
    t = torch.tensor([1, bad, 2], device=device)  # outside [0, 50), not ignore_index

    def ce(*a, **kw):
        return ks.cross_entropy(*a, check_target=False, backend=backend, **kw)
    if how == "compiled":
        ce = torch.compile(lambda *a, **kw: ks.cross_entropy(*a, backend=backend, **kw), fullgraph=True,
                           backend="aot_eager")
    loss = ce(x, t, reduction="none")
    assert loss[1].isnan() and torch.isfinite(loss[[0, 2]]).all()
    loss[[0, 2]].sum().backward()  # the bad row's incoming gradient is 0: its gradient is NaN all the same
    assert x.grad[1].isnan().all() and torch.isfinite(x.grad[[0, 2]]).all() and x.grad[[0, 2]].abs().sum() > 0
    xr = x.detach().clone().requires_grad_()
    good = F.cross_entropy(xr[[0, 2]], t[[0, 2]], reduction="none")
    good.sum().backward()
    assert rel_err(x.grad[[0, 2]], xr.grad[[0, 2]]) < 1e-5
    x.grad = None
    mean = ce(x, t)
    mean.backward()
    assert mean.isnan() and x.grad[1].isnan().all() and torch.isfinite(x.grad[[0, 2]]).all()


@pytest.mark.parametrize("backend", [str(i.backend) for i in impls("cross_entropy")])
@pytest.mark.parametrize("ignore_index", [2**31, -2**31 - 5], ids=["2^31", "below-int32"])
def test_ignore_index_outside_int32_targets(backend, ignore_index, device):
    # int32 targets never equal such an ignore_index: every row counts. The gradient's mean scale
    # once counted the count kernel's padding lanes too (their `other=ignore_index` truncated to
    # int32 no longer matched), so dlogits came out ~1000x too small while the loss was right
    x = torch.randn(5, 40, device=device, requires_grad=True)
    t = torch.randint(0, 40, (5,), device=device, dtype=torch.int32)
    loss = ks.cross_entropy(x, t, ignore_index=ignore_index, backend=backend)
    loss.backward()
    xr = x.detach().clone().requires_grad_()
    want = F.cross_entropy(xr, t.long())
    want.backward()
    assert rel_err(loss, want) < 1e-6 and rel_err(x.grad, xr.grad) < 1e-5


@pytest.mark.parametrize("backend", [str(i.backend) for i in impls("cross_entropy")])
def test_logits_not_kept_alive_by_the_graph(backend, device):
    # the forward already wrote dlogits: the graph must not also hold the [M, V] logits until the
    # backward (the autograd context once kept them for the backward's dispatch: twice the memory)
    import gc
    import weakref
    h = torch.randn(4, 8, device=device, requires_grad=True)
    w = torch.randn(50, 8, device=device)
    logits = h @ w.t()  # mm saves h and w, not its output
    alive = weakref.ref(logits)
    loss = ks.cross_entropy(logits, torch.randint(0, 50, (4,), device=device), backend=backend)
    del logits
    gc.collect()
    assert alive() is None, "the graph keeps the logits alive"
    loss.backward()
    assert h.grad is not None and h.grad.abs().sum() > 0


def test_backward_twice_is_refused(device):
    x = torch.randn(2, 10, device=device, requires_grad=True)
    loss = ks.cross_entropy(x, torch.tensor([1, 2], device=device))
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()


@pytest.mark.parametrize("backend", [str(i.backend) for i in impls("cross_entropy")])
def test_double_backward_is_refused_by_name(backend, device):
    # a gradient penalty through the loss: the first gradient is right, the second-order one is
    # refused saying so (it once claimed "backward ran twice (retain_graph=True)")
    x = torch.randn(3, 10, device=device, requires_grad=True)
    t = torch.tensor([1, 2, 3], device=device)
    (g,) = torch.autograd.grad(ks.cross_entropy(x, t, backend=backend), (x,), create_graph=True)
    xr = x.detach().clone().requires_grad_()
    F.cross_entropy(xr, t).backward()
    assert rel_err(g, xr.grad) < 1e-5
    with pytest.raises(RuntimeError, match="double backward"):
        g.pow(2).sum().backward()


@pytest.mark.parametrize("kwargs,match", [
    ({"label_smoothing": 1.0}, "label_smoothing"),
    ({"z_loss": -1.0}, "z_loss"),
    ({"softcap": 0.0}, "softcap"),
    ({"reduction": "avg"}, "reduction"),
    ({"ignore_index": 1.5}, "ignore_index"),
    # past int64 it once reached Triton's launcher: "OverflowError: integer to be specialized too large"
    ({"ignore_index": 2**70}, "ignore_index"),
], ids=["smoothing-1", "negative-zloss", "zero-softcap", "bad-reduction", "float-ignore-index",
        "huge-ignore-index"])
def test_bad_options(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        ks.cross_entropy(torch.randn(2, 5), torch.tensor([0, 1]), **kwargs)


def test_numpy_ignore_index_accepted():
    # a pad id read from a tokenizer config or numpy array is an np.int64, not an int
    np = pytest.importorskip("numpy")
    x, t = torch.randn(3, 5), torch.tensor([0, 4, 1])
    got = ks.cross_entropy(x, t, ignore_index=np.int64(4))
    assert rel_err(got, F.cross_entropy(x, t, ignore_index=4)) < 1e-6


@pytest.mark.parametrize("logits,target,match", [
    (torch.randn(2, 5), torch.tensor([0.0, 1.0]), "target"),
    (torch.randn(2, 5), torch.tensor([0, 1, 2]), "target"),
    (torch.randint(0, 3, (2, 5)), torch.tensor([0, 1]), "logits"),
], ids=["float-target", "target-shape", "int-logits"])
def test_bad_tensors(logits, target, match):
    with pytest.raises((ValueError, TypeError), match=match):
        ks.cross_entropy(logits, target)


def test_compile_fullgraph_with_backward(device):
    x = torch.randn(8, 64, device=device, requires_grad=True)
    t = torch.randint(0, 64, (8,), device=device)

    def f(a):
        return ks.cross_entropy(a * 2, t, label_smoothing=0.1, z_loss=1e-3) * 3

    (ge,) = torch.autograd.grad(f(x), (x,))
    (gc,) = torch.autograd.grad(torch.compile(f, fullgraph=True, backend="aot_eager")(x), (x,))
    assert rel_err(gc, ge) < 1e-6


_AOT = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernelset.ops.loss import kernels as K
out = []
sig = dict(X="*bf16", T="*i64", LOSS="*fp32", LSE="*fp32", DX="*bf16", SCALE="*fp32", M="i32", V="i32",
           stride_x="i32", stride_dx="i32", ignore_index="i32", smoothing="fp32", z_loss="fp32", softcap="fp32")
for softcap, smooth in ((False, False), (True, True)):
    consts = dict(SOFTCAP=softcap, SMOOTH=smooth, HAS_GRAD=True, BLOCK=16384, STREAM_STORE=softcap, EPT=8)
    attrs = {(k,): [["tt.divisibility", 16]] for k, (n, ty) in enumerate(sig.items()) if ty.startswith("*")
             or n in ("V", "stride_x", "stride_dx")}
    src = ASTSource(K._ce_fwd_kernel, signature={**sig, **{k: "constexpr" for k in consts}}, constexprs=consts,
                    attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=32)).asm["ptx"]
    out.append(dict(case=f"fwd-softcap{softcap}", local="ld.local" in ptx or "st.local" in ptx, vec=".v4" in ptx))
ssig = dict(DX="*bf16", GO="*fp32", M="i32", V="i32", stride_dx="i32")
for per_row in (False, True):
    consts = dict(PER_ROW=per_row, BLOCK=4096)
    src = ASTSource(K._ce_scale_kernel, signature={**ssig, **{k: "constexpr" for k in consts}}, constexprs=consts,
                    attrs={(0,): [["tt.divisibility", 16]], (3,): [["tt.divisibility", 16]],
                           (4,): [["tt.divisibility", 16]]})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4)).asm["ptx"]
    out.append(dict(case=f"scale-per_row{per_row}", local="ld.local" in ptx or "st.local" in ptx, vec=".v4" in ptx))
print(json.dumps(out))
"""


def test_kernels_compile_for_sm90():
    compile_report(_AOT, 4)


@pytest.mark.parametrize("opt", OPTIONS, ids=lambda o: o[0])
def test_split_runs_and_has_one_launch_form(opt, device, monkeypatch):
    """The split tuning really launches the split kernel (8 programs per row), an out-of-range
    target still poisons only its row (loss and gradient), and on a GPU the one-launch form gives the two-launch
    form's bits."""
    from kernelset.ops.common import row_barrier

    grids = []
    real = launch._fwd_split
    monkeypatch.setattr(launch, "_fwd_split", lambda grid, *a, **kw: (grids.append(grid), real(grid, *a, **kw))[1])
    x = (torch.randn(6, 1000, device=device) * 4).to(torch.bfloat16).requires_grad_()  # the split needs a gradient
    t = torch.randint(0, 1000, (6,), device=device)
    t[1], t[4] = -100, 1000  # ignored; out of range
    with _use("split"):
        g = torch.rand(6, device=device)

        def run():
            loss = ks.cross_entropy(x, t, reduction="none", check_target=False, backend="triton", **opt[1])
            return [loss, *torch.autograd.grad(loss, (x,), g)]

        one = run()
        with row_barrier.two_launches():
            two = run()
    assert grids and set(grids) == {(6 * 8,)}, grids
    for a, b in zip(one, two):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    loss, dx = one
    assert loss[1].item() == 0.0 and loss[4].isnan() and not loss[[0, 2, 3, 5]].isnan().any()
    assert (dx[1] == 0).all() and dx[4].isnan().all() and not dx[[0, 2, 3, 5]].isnan().any()
