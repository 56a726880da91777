"""linear_cross_entropy: loss and every gradient against an fp32 autograd reference with the [T, V]
logits materialized, with the chunk size forced small so several chunks run (chunked equals
one-shot), every option and reduction, the paths that skip work, bad inputs and torch.compile."""
from __future__ import annotations

import pytest
import torch

import kernelset as ks
from kernelset.core.registry import impls
from kernelset.core.tolerance import rel_err, tolerance
from kernelset.ops.loss import linear as L
from kernelset.ops.loss import reference as R

BACKENDS = [str(i.backend) for i in impls("linear_cross_entropy")]
DT_IDS = lambda d: str(d).replace("torch.", "")  # noqa: E731
T, H, V = 37, 48, 200  # 37 rows in chunks of 8: four full chunks and a ragged one
SEVERAL = L.LCETuning(chunk_rows=8)

# (id, kwargs, bias): the option combinations a trainer uses, with and without an output bias
OPTIONS = [
    ("plain", {}, False),
    ("bias", {}, True),
    ("smooth-zloss", {"label_smoothing": 0.1, "z_loss": 1e-3}, False),
    ("softcap-bias", {"softcap": 15.0}, True),
    ("all", {"label_smoothing": 0.05, "z_loss": 1e-4, "softcap": 30.0}, True),
]


def _inputs(dtype, device, *, t=T, h=H, v=V, bias=True, lead=None):
    lead = lead or (t,)
    hidden = torch.randn(*lead, h, device=device).to(dtype).requires_grad_()
    weight = (torch.randn(v, h, device=device) * (3.0 / h**0.5)).to(dtype).requires_grad_()  # logits ~ N(0, 9)
    b = (torch.randn(v, device=device) * 0.5).to(dtype).requires_grad_() if bias else None
    target = torch.randint(0, v, lead, device=device)
    target.view(-1)[::4] = -100  # a quarter ignored
    return hidden, weight, b, target


def _reference(hidden, weight, bias, target, opts, reduction, grad):
    """fp32 autograd through the materialized logits and the cross-entropy reference's formula."""
    leaves = [x.detach().float().requires_grad_() if x is not None else None for x in (hidden, weight, bias)]
    hr, wr, br = leaves
    logits = hr.reshape(-1, hr.shape[-1]) @ wr.t()
    if br is not None:
        logits = logits + br
    loss, _, _, valid, _ = R.rows(logits, target.reshape(-1), opts.get("ignore_index", -100),
                                  opts.get("label_smoothing", 0.0), opts.get("z_loss", 0.0), opts.get("softcap"))
    if reduction == "none":
        out = loss.reshape(target.shape)
    else:
        out = loss.sum() / valid.sum().clamp(min=1) if reduction == "mean" else loss.sum()
    out.backward(grad)
    return out.detach(), [x.grad if x is not None else None for x in leaves]


def _check(loss, want, params, grads, dtype):
    assert loss.dtype == torch.float32 and loss.shape == want.shape
    assert rel_err(loss, want) <= tolerance("norm", dtype), f"loss rel err {rel_err(loss, want):.3g}"
    for name, p, g in zip(("dhidden", "dweight", "dbias"), params, grads):
        if p is None:
            continue
        assert p.grad is not None and p.grad.dtype == dtype and p.grad.shape == p.shape, name
        err = rel_err(p.grad, g)
        assert err <= tolerance("norm", dtype, grad=True), f"{name} rel err {err:.3g}"


# every option set in fp32 (tight tolerance), the plain and the full one in bf16 (enough for the
# rounding of the logits and of dweight's per-chunk sums, and keeps the interpreter run short)
DTYPE_OPTIONS = ([(torch.float32, o) for o in OPTIONS]
                 + [(torch.bfloat16, o) for o in OPTIONS if o[0] in ("plain", "all")])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype,opt", DTYPE_OPTIONS, ids=lambda c: DT_IDS(c) if isinstance(c, torch.dtype) else c[0])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_fp32_reference(backend, dtype, opt, reduction, device):
    hidden, weight, bias, target = _inputs(dtype, device, bias=opt[2])
    with L.use(SEVERAL):
        loss = ks.linear_cross_entropy(hidden, weight, target, bias=bias, reduction=reduction, backend=backend,
                                       **opt[1])
        g = torch.rand_like(loss) + 0.5  # not 1.0: the scaling of the stored gradients must run
        loss.backward(g)
    want, grads = _reference(hidden, weight, bias, target, opt[1], reduction, g)
    _check(loss, want, (hidden, weight, bias), grads, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_unit_upstream_gradient(backend, device):
    # loss.backward(): the in-place scaling returns at once on the device; the gradients must be
    # the stored ones, unscaled
    hidden, weight, bias, target = _inputs(torch.float32, device)
    with L.use(SEVERAL):
        loss = ks.linear_cross_entropy(hidden, weight, target, bias=bias, z_loss=1e-3, backend=backend)
        loss.backward()
    want, grads = _reference(hidden, weight, bias, target, {"z_loss": 1e-3}, "mean", None)
    _check(loss, want, (hidden, weight, bias), grads, torch.float32)


@pytest.mark.parametrize("rows", [1, 5, 16, 37, 64], ids=lambda r: f"rows{r}")
def test_chunked_equals_one_shot(rows, device):
    # any chunking gives the same loss and gradients (one chunk of 64 rows is the whole batch)
    hidden, weight, bias, target = _inputs(torch.float32, device)
    outs = []
    for tun in (L.LCETuning(chunk_rows=rows), L.LCETuning(chunk_rows=T)):
        for p in (hidden, weight, bias):
            p.grad = None
        with L.use(tun):
            loss = ks.linear_cross_entropy(hidden, weight, target, bias=bias, label_smoothing=0.1, backend="triton")
            loss.backward()
        outs.append([loss.detach()] + [p.grad.clone() for p in (hidden, weight, bias)])
    for a, b in zip(*outs):
        assert rel_err(a, b) < 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("which", ["hidden", "weight", "bias", "hidden-none", "weight-none"])
def test_partial_requires_grad(backend, which, device):
    # a frozen LM head (only dhidden), a frozen trunk (only dweight), only dbias; 'none' with only
    # dhidden stays single-pass (rows scale independently), with dweight it recomputes in backward
    reduction = "none" if which.endswith("-none") else "mean"
    name = which.split("-")[0]
    hidden, weight, bias, target = _inputs(torch.float32, device)
    params = {"hidden": hidden, "weight": weight, "bias": bias}
    for k, p in params.items():
        p.requires_grad_(k == name)
    with L.use(SEVERAL):
        loss = ks.linear_cross_entropy(hidden, weight, target, bias=bias, reduction=reduction, backend=backend)
        g = torch.rand_like(loss) + 0.5
        loss.backward(g)
    want, grads = _reference(hidden, weight, bias, target, {}, reduction, g)
    for (k, p), ref in zip(params.items(), grads):
        if k == name:
            assert rel_err(p.grad, ref) <= tolerance("norm", torch.float32, grad=True), k
        else:
            assert p.grad is None, k
    assert rel_err(loss, want) <= tolerance("norm", torch.float32)


@pytest.mark.parametrize("case", ["no-requires-grad", "no_grad-mode", "hidden-only", "none-weight-fwd"])
def test_gradient_work_skipped(case, device, monkeypatch):
    # what the cross-entropy kernel is asked for: no gradient unless one is needed, and under
    # 'none' with dweight the forward computes the loss only (the backward recomputes)
    seen = []
    inner = L._ce_in_place

    def spy(*args):
        seen.append(args[-1])
        return inner(*args)

    monkeypatch.setattr(L, "_ce_in_place", spy)
    hidden, weight, bias, target = _inputs(torch.float32, device, bias=False)
    if case == "no-requires-grad":
        hidden.requires_grad_(False), weight.requires_grad_(False)
        ks.linear_cross_entropy(hidden, weight, target, backend="triton")
        assert seen and not any(seen)
    elif case == "no_grad-mode":
        with torch.no_grad():
            loss = ks.linear_cross_entropy(hidden, weight, target, backend="triton")
        assert not loss.requires_grad and seen and not any(seen)
    elif case == "hidden-only":
        weight.requires_grad_(False)
        ks.linear_cross_entropy(hidden, weight, target, backend="triton")
        assert seen and all(seen)
    else:
        loss = ks.linear_cross_entropy(hidden, weight, target, reduction="none", backend="triton")
        assert seen and not any(seen)
        seen.clear()
        loss.sum().backward()
        assert seen and all(seen) and weight.grad is not None


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_ignored_gives_zero_not_nan(backend, device):
    hidden, weight, bias, target = _inputs(torch.float32, device, t=6)
    target.fill_(-100)
    with L.use(SEVERAL):
        loss = ks.linear_cross_entropy(hidden, weight, target, bias=bias, backend=backend)
        loss.backward()
    assert loss.item() == 0.0
    for p in (hidden, weight, bias):
        assert torch.equal(p.grad, torch.zeros_like(p))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_empty_batch(backend, reduction, device):
    hidden, weight, bias, target = _inputs(torch.float32, device, t=0)
    loss = ks.linear_cross_entropy(hidden, weight, target, bias=bias, reduction=reduction, backend=backend)
    assert loss.shape == ((0,) if reduction == "none" else ())
    loss.sum().backward()
    assert hidden.grad.shape == (0, H)
    assert torch.equal(weight.grad, torch.zeros_like(weight)) and torch.equal(bias.grad, torch.zeros_like(bias))


@pytest.mark.parametrize("layout", ["3d", "row-slice", "transposed"])
def test_strided_and_batched_hidden_honoured(layout, device):
    # [B, S, H] with [B, S] targets; rows of a wider tensor; a [S, B, H] tensor viewed as [B, S, H]
    views = {"3d": lambda x: x, "row-slice": lambda x: x[:, 5:5 + H], "transposed": lambda x: x.transpose(0, 1)}
    shapes = {"3d": (3, 11, H), "row-slice": (T, H + 16), "transposed": (11, 3, H)}
    leaf = torch.randn(*shapes[layout], device=device, requires_grad=True)
    hidden = views[layout](leaf)
    _, weight, bias, target = _inputs(torch.float32, device, lead=tuple(hidden.shape[:-1]))
    assert layout == "3d" or not hidden.is_contiguous()
    g = torch.tensor(1.7, device=device)
    with L.use(SEVERAL):
        loss = ks.linear_cross_entropy(hidden, weight, target, bias=bias, label_smoothing=0.1, backend="triton")
        loss.backward(g)
    leaf_ref = leaf.detach().clone().requires_grad_()
    want, grads = _reference(views[layout](leaf_ref), weight, bias, target, {"label_smoothing": 0.1}, "mean", g)
    assert rel_err(loss, want) < 1e-5
    assert rel_err(weight.grad, grads[1]) < 1e-4 and rel_err(bias.grad, grads[2]) < 1e-4
    # _reference detaches its inputs: the hidden gradient of the leaf, through the view, by hand
    assert rel_err(views[layout](leaf.grad), grads[0].reshape(hidden.shape)) < 1e-4


@pytest.mark.parametrize("case", ["strided-target", "transposed-weight"])
def test_strided_target_and_weight_honoured(case, device):
    # every other label of a longer row (a strided 1-D view); an LM head stored [H, V], used as .T
    hidden, weight, bias, target = _inputs(torch.float32, device, bias=False)
    if case == "strided-target":
        wide = torch.randint(0, V, (2 * T,), device=device)
        wide[::8] = -100
        target = wide[::2]
        w_leaf = weight
    else:
        w_leaf = weight.detach().t().contiguous().requires_grad_()
        weight = w_leaf.t()
    assert not (target.is_contiguous() and weight.is_contiguous())
    with L.use(SEVERAL):
        loss = ks.linear_cross_entropy(hidden, weight, target, reduction="none", backend="triton")
        g = torch.rand_like(loss) + 0.5
        loss.backward(g)
    want, grads = _reference(hidden, weight, None, target, {}, "none", g)
    assert rel_err(loss, want) < 1e-5 and rel_err(hidden.grad, grads[0]) < 1e-4
    dw = w_leaf.grad if case == "strided-target" else w_leaf.grad.t()
    assert rel_err(dw, grads[1]) < 1e-4


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_of_range_target_raises(backend, device):
    # as cross_entropy: checked by default (one host sync), named, nothing computed
    hidden, weight, bias, _ = _inputs(torch.float32, device, t=4)
    for bad in (V, -5):
        target = torch.tensor([1, -100, bad, 2], device=device, dtype=torch.int32)
        with pytest.raises(ks.ArgumentError) as e:
            ks.linear_cross_entropy(hidden, weight, target, bias=bias, backend=backend)
        assert str(e.value) == (f"linear_cross_entropy: argument 'target' must be in [0, {V}) (weight's first dim) "
                                f"or ignore_index (-100), got target {bad} at flat index 2")
    assert hidden.grad is None and weight.grad is None and bias.grad is None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [V, -5], ids=["past-V", "negative"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_out_of_range_target_poisons_loss_and_gradients(backend, bad, reduction, device):
    # unchecked (check_target=False; torch.compile, graph capture): the row's loss is NaN, and so
    # is every gradient it reaches, its dhidden row and all of dweight and dbias (sums over rows);
    # the other dhidden rows stay finite. Several chunks, the bad row in the second
    hidden, weight, bias, _ = _inputs(torch.float32, device, t=12)
    target = torch.randint(0, V, (12,), device=device)
    target[9] = bad
    with L.use(SEVERAL):
        loss = ks.linear_cross_entropy(hidden, weight, target, bias=bias, reduction=reduction, check_target=False,
                                       backend=backend)
    if reduction == "none":
        assert loss[9].isnan() and torch.isfinite(loss[torch.arange(12) != 9]).all()
        loss = loss[torch.arange(12, device=device) != 9].sum()  # the bad row's incoming gradient is 0
    assert loss.isnan() == (reduction == "mean")
    loss.backward()
    ok = torch.arange(12, device=device) != 9
    assert hidden.grad[9].isnan().all() and torch.isfinite(hidden.grad[ok]).all()
    assert weight.grad.isnan().all() and bias.grad.isnan().all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_ignore_index_outside_int32_targets(backend, device):
    # int32 targets never equal 2**31: every row counts. The mean's divisor (the gradient scale
    # kernel, which linear_cross_entropy also uses for the loss) once counted the kernel's padding
    # lanes as rows, giving a loss ~200x too small and gradients to match
    hidden, weight, bias, _ = _inputs(torch.float32, device, t=5)
    target = torch.randint(0, V, (5,), device=device, dtype=torch.int32)
    loss = ks.linear_cross_entropy(hidden, weight, target, bias=bias, ignore_index=2**31, backend=backend)
    loss.backward()
    want, grads = _reference(hidden, weight, bias, target.long(), {}, "mean", None)
    _check(loss, want, (hidden, weight, bias), grads, torch.float32)


def test_backward_twice_is_refused(device):
    hidden, weight, bias, target = _inputs(torch.float32, device, t=4)
    loss = ks.linear_cross_entropy(hidden, weight, target, bias=bias)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_create_graph(backend, reduction, device):
    # a gradient penalty on dweight: the stored gradients cannot be differentiated again, so the
    # second backward is refused by name (it once claimed "backward ran twice"); 'none' with
    # dweight recomputes in the backward, which the reference does in differentiable torch ops
    # (second order right) and the Triton path into mm(out=) buffers (once torch's "functions
    # with out=... arguments don't support automatic differentiation", now refused by name)
    hidden, weight, _, target = _inputs(torch.float32, device, t=6, bias=False)
    loss = ks.linear_cross_entropy(hidden, weight, target, reduction=reduction, backend=backend).sum()
    if reduction == "none" and backend != "reference":
        with pytest.raises(RuntimeError, match="create_graph=True is not supported by the triton backend"):
            torch.autograd.grad(loss, (hidden, weight), create_graph=True)
        return
    gh, gw = torch.autograd.grad(loss, (hidden, weight), create_graph=True)
    hr, wr = (x.detach().clone().requires_grad_() for x in (hidden, weight))
    logits = hr @ wr.t()
    lr = torch.nn.functional.cross_entropy(logits, target, reduction=reduction).sum()
    ghr, gwr = torch.autograd.grad(lr, (hr, wr), create_graph=True)
    assert rel_err(gh, ghr) < 1e-5 and rel_err(gw, gwr) < 1e-5
    if reduction == "mean":
        with pytest.raises(RuntimeError, match="double backward"):
            gw.pow(2).sum().backward()
        return
    (d,) = torch.autograd.grad(gw.pow(2).sum(), (hidden,))
    (dr,) = torch.autograd.grad(gwr.pow(2).sum(), (hr,))
    assert rel_err(d, dr) < 1e-4


@pytest.mark.parametrize("kwargs,match", [
    ({"label_smoothing": 1.0}, "label_smoothing"),
    ({"z_loss": -1.0}, "z_loss"),
    ({"softcap": 0.0}, "softcap"),
    ({"reduction": "avg"}, "reduction"),
    ({"ignore_index": 1.5}, "ignore_index"),
    ({"ignore_index": 2**70}, "ignore_index"),  # past int64: once Triton's OverflowError, naming nothing
    ({"bias": torch.randn(7)}, "bias"),
    ({"bias": torch.randn(6, dtype=torch.float64)}, "bias"),
], ids=["smoothing-1", "negative-zloss", "zero-softcap", "bad-reduction", "float-ignore-index", "huge-ignore-index",
        "bias-shape", "bias-dtype"])
def test_bad_options(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        ks.linear_cross_entropy(torch.randn(2, 4), torch.randn(6, 4), torch.tensor([0, 1]), **kwargs)


@pytest.mark.parametrize("hidden,weight,target,match", [
    (torch.randn(2, 4), torch.randn(6, 5), torch.tensor([0, 1]), "weight"),
    (torch.randn(2, 4), torch.randn(6, 4, 1), torch.tensor([0, 1]), "weight"),
    (torch.randn(2, 4), torch.randn(0, 4), torch.tensor([0, 1]), "weight"),
    (torch.randn(2, 4), torch.randn(6, 4).half(), torch.tensor([0, 1]), "weight"),
    (torch.randn(2, 4), torch.randn(6, 4), torch.tensor([0.0, 1.0]), "target"),
    (torch.randn(2, 4), torch.randn(6, 4), torch.tensor([0, 1, 2]), "target"),
    (torch.randint(0, 3, (2, 4)), torch.randn(6, 4), torch.tensor([0, 1]), "hidden"),
    ("not a tensor", torch.randn(6, 4), torch.tensor([0, 1]), "hidden"),
], ids=["h-mismatch", "3d-weight", "empty-vocab", "dtype-mismatch", "float-target", "target-shape", "int-hidden",
        "not-a-tensor"])
def test_bad_tensors(hidden, weight, target, match):
    with pytest.raises((ValueError, TypeError), match=match):
        ks.linear_cross_entropy(hidden, weight, target)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_compile_fullgraph_with_backward(reduction, device):
    # 'none' also compiles the recomputing backward (the custom op called from the backward)
    hidden, weight, bias, target = _inputs(torch.float32, device, t=12)

    def f(h, w, b):
        loss = ks.linear_cross_entropy(h * 2, w, target, bias=b, label_smoothing=0.1, z_loss=1e-3,
                                       reduction=reduction)
        return (loss * 3).sum()

    with L.use(SEVERAL):
        ge = torch.autograd.grad(f(hidden, weight, bias), (hidden, weight, bias))
        gc = torch.autograd.grad(torch.compile(f, fullgraph=True, backend="aot_eager")(hidden, weight, bias),
                                 (hidden, weight, bias))
    for a, b in zip(gc, ge):
        assert rel_err(a, b) < 1e-6


def test_chunk_rows_policy():
    # the documented rule: the largest power of two whose [rows, V] logits fit chunk_bytes
    assert L.chunk_rows(8192, 128256, 2) == 1024  # 250 MiB of bf16 logits under the 256 MiB default
    with L.use(L.LCETuning(chunk_bytes=64 << 20)):
        assert L.chunk_rows(8192, 128256, 2) == 256  # Liger's chunk at this shape
        assert L.chunk_rows(100, 128256, 2) == 100  # never more than the batch
        assert L.chunk_rows(8192, 1 << 24, 4) == 16  # at least 16 rows however large V is
    with L.use(L.LCETuning(chunk_rows=3)):
        assert L.chunk_rows(8192, 128256, 2) == 3


def test_explain_names_the_backends(device):
    hidden, weight, _, target = _inputs(torch.bfloat16, device, bias=False)
    exp = ks.explain("linear_cross_entropy", hidden.detach(), weight.detach(), target, verbose=False)
    assert exp.chosen is not None and {str(c.backend) for c in exp.candidates} == set(BACKENDS)


@pytest.mark.gpu
def test_gpu_memory_stays_within_the_formula():
    # peak extra memory of fwd+bwd: dhidden + dweight + one logits chunk (+ small), never [T, V]
    dev = torch.device("cuda")
    t, h, v = 4096, 1024, 50257
    hidden, weight, _, target = _inputs(torch.bfloat16, dev, t=t, h=h, v=v, bias=False)
    tun = L.LCETuning(chunk_bytes=32 << 20)
    with L.use(tun):  # warm-up: kernels compiled, cuBLAS workspace cached (it counts as allocated)
        ks.linear_cross_entropy(hidden, weight, target).backward()
    hidden.grad = weight.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with L.use(tun):
        loss = ks.linear_cross_entropy(hidden, weight, target)
        loss.backward()
        rows = L.chunk_rows(t, v, 2)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    bound = rows * v * 2 + t * h * 2 + v * h * 2 + (8 << 20)
    assert extra <= bound, f"peak extra {extra / 2**20:.1f} MiB > {bound / 2**20:.1f} MiB"
    assert extra < t * v * 2  # less than the logits alone
    want, grads = _reference(hidden, weight, None, target, {}, "mean", None)
    _check(loss, want, (hidden, weight), grads[:2], torch.bfloat16)


def test_backward_allocates_no_weight_sized_tensor(device):
    # dweight is computed in the forward; the backward only scales it in place and hands it to
    # AccumulateGrad, which steals it. A [V, H] allocation in the backward (e.g. autograd
    # materialising zeros for the unused dweight output) doubles the peak memory of the op.
    from torch.utils._python_dispatch import TorchDispatchMode

    # the chunked implementation on the test device (AUTO could take the reference on CPU
    # tensors where the interpreter is off, and the reference's backward is autograd's)
    hidden, weight, _, target = _inputs(torch.float32, device, t=16, h=24, v=40, bias=False)
    loss = ks.linear_cross_entropy(hidden, weight, target, backend="triton")
    seen = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for o in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(o, torch.Tensor) and tuple(o.shape) in {tuple(weight.shape), tuple(hidden.shape)}:
                    seen.append(str(func))
            return out

    with Watch():
        loss.backward()
    allocating = [f for f in seen if not any(k in f for k in ("_.", "set_", "detach", "view", "alias"))]
    assert not allocating, f"backward allocated gradient-sized tensors: {allocating}"
    assert weight.grad is not None and hidden.grad is not None


@pytest.mark.parametrize("opt", [o for o in OPTIONS if o[0] in ("plain", "all")], ids=lambda o: o[0])
def test_split_cross_entropy_in_place(opt, device):
    """The cross-entropy step through the split kernel (forced: 16-wide chunks, 13 programs per
    row), writing each chunk's gradient over its own logits (DX = X), still matches the reference."""
    from kernelset.ops.loss import launch as ce_launch

    hidden, weight, bias, target = _inputs(torch.float32, device, bias=opt[2])
    with L.use(SEVERAL), ce_launch.use(ce_launch.CETuning(split_chunk=16)):
        loss = ks.linear_cross_entropy(hidden, weight, target, bias=bias, backend="triton", **opt[1])
        loss.backward()
    want, grads = _reference(hidden, weight, bias, target, opt[1], "mean", None)
    _check(loss, want, (hidden, weight, bias), grads, torch.float32)
