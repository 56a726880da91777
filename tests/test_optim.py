"""Optimizer family: ks.optim.AdamW against torch.optim.AdamW step for step (fp32 tight; bf16/fp16
against torch run with the same dtype rules), state_dict both ways, GradScaler, and
ks.clip_grad_norm_ against torch.nn.utils.clip_grad_norm_; every backend forced."""
from __future__ import annotations

import io
import math

import pytest
import torch
from aot import compile_report

import kernelset as ks
from kernelset.core.registry import impls
from kernelset.core.tolerance import rel_err, tolerance
from kernelset.ops.optim import launch as L

BACKENDS = [str(i.backend) for i in impls("adamw")]
FP32_TOL = 2e-6  # ||ours - torch|| / ||torch|| after several steps: fp32 rounding-order differences only


def _params(device, dtype=torch.float32):
    """Shapes chosen to hit every path: multi-chunk with a ragged tail (2049 > 1024-element chunks
    at test sizes), a single short tensor, an empty one, a 3-D one, a channels-last (dense,
    permuted) one, and a view 4 bytes past a 16-byte boundary (the kernel's unaligned bucket)."""
    base = torch.randn(1001, device=device, dtype=dtype)
    ps = [torch.randn(2049, device=device, dtype=dtype), torch.randn(37, device=device, dtype=dtype),
          torch.empty(0, device=device, dtype=dtype), torch.randn(3, 5, 70, device=device, dtype=dtype),
          torch.randn(2, 6, 5, 3, device=device, dtype=dtype).to(memory_format=torch.channels_last),
          base[1:] if dtype == torch.float32 else base[8:]]
    return [p.detach() for p in ps]


def _pair(ps):
    """Two independent leaf copies with identical values and strides."""
    def copy(p):
        q = torch.empty_strided(p.shape, p.stride(), dtype=p.dtype, device=p.device) if p.storage_offset() == 0 \
            else torch.empty(p.storage_offset() + p.numel(), dtype=p.dtype, device=p.device)[p.storage_offset():]
        return q.copy_(p).requires_grad_()
    return [copy(p) for p in ps], [copy(p) for p in ps]


def _grads(ps, dtype=None):
    return [torch.randn(p.shape, device=p.device, dtype=dtype or p.dtype).contiguous(
        memory_format=torch.channels_last if p.dim() == 4 else torch.contiguous_format) for p in ps]


def _close(a, b, tol, what):
    assert a.shape == b.shape, what
    if a.numel() == 0:
        return
    assert torch.isfinite(a).all(), f"{what}: non-finite (unwritten element?)"
    err = rel_err(a, b)
    assert err <= tol, f"{what}: rel err {err:.3g} > {tol:.3g}"


CONFIGS = [
    ("default", dict()),
    ("decay-maximize", dict(weight_decay=0.3, maximize=True)),
    ("amsgrad", dict(amsgrad=True, weight_decay=0.05)),
    ("small-beta1", dict(betas=(0.3, 0.95), eps=1e-6)),  # lerp's other branch (weight >= 0.5)
    ("tensor-lr", dict(lr="tensor", weight_decay=0.1)),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,kw", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_adamw_fp32_matches_torch(backend, name, kw, device):
    kw = dict(kw)
    lr = torch.tensor(3e-2, device=device) if kw.pop("lr", None) == "tensor" else 3e-2
    a, b = _pair(_params(device))
    groups = lambda ps: [{"params": ps[:3]}, {"params": ps[3:], "lr": lr * 0.5, "weight_decay": 0.0}]  # noqa: E731
    ours = ks.optim.AdamW(groups(a), lr=lr, backend=backend, **kw)
    ref = torch.optim.AdamW(groups(b), lr=lr, **kw)
    for step in range(4):
        for x, y, g in zip(a, b, _grads(a)):  # fresh grad tensors each step: new addresses, new plans
            x.grad, y.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, FP32_TOL, f"step {step} param {i}")
    for i, (x, y) in enumerate(zip(a, b)):
        so, sr = ours.state[x], ref.state[y]
        assert set(so) == set(sr), f"state keys {set(so)} vs {set(sr)}"
        assert so["step"].dtype == torch.float32 and so["step"].dim() == 0 and float(so["step"]) == 4.0
        for key in set(so) - {"step"}:
            assert so[key].dtype == torch.float32
            _close(so[key], sr[key], FP32_TOL, f"param {i} {key}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("master", [False, True], ids=["no-master", "master"])
def test_adamw_low_precision_dtype_rules(backend, dtype, master, device):
    """Low-precision params, fp32 states. Reference: torch.optim.AdamW on fp32 copies, the params
    rounded to ``dtype`` after every step (no master) or left in fp32 (master: the fp32 copy is
    what torch updates, and our param must be its rounding). Metric: ||ours - ref|| / ||ref||
    per tensor; the few elements whose fp32 results straddle a rounding boundary differ by one
    ulp of ``dtype``, so the bound is far below the bf16 tolerance but above fp32's."""
    ps = _params(device, dtype)
    ours_p = [p.clone().requires_grad_() for p in ps]
    ref_p = [p.float().requires_grad_() for p in ps]
    ours = ks.optim.AdamW(ours_p, lr=1e-2, weight_decay=0.1, master_weights=master, backend=backend)
    ref = torch.optim.AdamW(ref_p, lr=1e-2, weight_decay=0.1)
    tol_p = 1e-6 if master else (2e-4 if dtype == torch.bfloat16 else 3e-5)
    for step in range(3):
        for x, y, g in zip(ours_p, ref_p, _grads(ours_p)):
            x.grad, y.grad = g, g.float()
        ours.step()
        ref.step()
        if not master:
            with torch.no_grad():
                for y in ref_p:
                    y.copy_(y.to(dtype).float())
        for i, (x, y) in enumerate(zip(ours_p, ref_p)):
            st = ours.state[x]
            assert st["exp_avg"].dtype == torch.float32
            _close(st["exp_avg"], ref.state[y]["exp_avg"], 1e-5, f"{step}/{i} exp_avg")
            _close(st["exp_avg_sq"], ref.state[y]["exp_avg_sq"], 1e-5, f"{step}/{i} exp_avg_sq")
            if master:
                _close(st["master_param"], y, tol_p, f"{step}/{i} master")
                assert torch.equal(x.detach(), st["master_param"].to(dtype)), "param is not the master's rounding"
            else:
                assert "master_param" not in st
                _close(x.float(), y, tol_p, f"{step}/{i} param")
                assert rel_err(x, y) <= tolerance("elementwise", dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("amsgrad", [False, True], ids=["adam", "amsgrad"])
def test_adamw_states_in_param_dtype(backend, amsgrad, device):
    """``state_dtype=None``: bf16 params keep bf16 states, as torch.optim.AdamW does. Reference:
    torch.optim.AdamW on fp32 copies with params and states rounded to bf16 after every step (the
    kernel's rounding points: fp32 math, each stored value rounded once). Also within twice the bf16
    tolerance of torch's own bf16 AdamW, which rounds op by op (2-3 roundings per state and step,
    which at lr 1e-2 move a 37-element tensor 0.8% away from the fp32 trajectory in 3 steps)."""
    dtype = torch.bfloat16
    ps = _params(device, dtype)
    ours_p = [p.clone().requires_grad_() for p in ps]
    ref_p = [p.float().requires_grad_() for p in ps]
    torch_p = [p.clone().requires_grad_() for p in ps]
    kw = dict(lr=1e-2, weight_decay=0.1, amsgrad=amsgrad)
    ours = ks.optim.AdamW(ours_p, state_dtype=None, backend=backend, **kw)
    ref = torch.optim.AdamW(ref_p, **kw)
    tor = torch.optim.AdamW(torch_p, **kw)
    keys = ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if amsgrad else ())
    for step in range(3):
        for x, y, z, g in zip(ours_p, ref_p, torch_p, _grads(ours_p)):
            x.grad, y.grad, z.grad = g, g.float(), g.clone()
        ours.step()
        ref.step()
        tor.step()
        with torch.no_grad():
            for y in ref_p:
                y.copy_(y.to(dtype).float())
                for key in keys:
                    ref.state[y][key].copy_(ref.state[y][key].to(dtype).float())
        for i, (x, y, z) in enumerate(zip(ours_p, ref_p, torch_p)):
            st = ours.state[x]
            for key in keys:
                assert st[key].dtype == dtype, f"{key} kept in {st[key].dtype}"
                # bitwise in practice (CPU interpreter, and an H100 over 5 seeds); 1e-3 leaves room for a
                # rare fp32 op-order flip of one rounding, and fails a truncating conversion (3.7e-3)
                _close(st[key].float(), ref.state[y][key], 1e-3, f"{step}/{i} {key}")
            assert st["step"].dtype == torch.float32
            _close(x.float(), y, 2e-4, f"{step}/{i} param")
            if x.numel():
                assert rel_err(x, z) <= 2 * tolerance("elementwise", dtype), f"{step}/{i} against torch's bf16 AdamW"


def test_state_dtype_bad_and_load(device):
    with pytest.raises(TypeError, match="state_dtype"):
        ks.optim.AdamW([torch.randn(4, device=device, requires_grad=True)], state_dtype=torch.int8)
    p = torch.randn(40, device=device, dtype=torch.bfloat16, requires_grad=True)
    q = p.detach().clone().requires_grad_()
    src = ks.optim.AdamW([p], state_dtype=torch.float32)
    p.grad = torch.randn_like(p)
    src.step()
    dst = ks.optim.AdamW([q], state_dtype=None)  # loads fp32 states into bf16 ones
    dst.load_state_dict(src.state_dict())
    assert dst.state[q]["exp_avg"].dtype == torch.bfloat16
    assert torch.equal(dst.state[q]["exp_avg"], src.state[p]["exp_avg"].to(torch.bfloat16))


def test_state_dict_round_trip_both_ways(device):
    """Save ours -> load into torch.optim.AdamW (and back), continue: identical trajectories."""
    a, b = _pair(_params(device))
    ours = ks.optim.AdamW(a, lr=1e-2, amsgrad=True)
    for _ in range(2):
        for x, g in zip(a, _grads(a)):
            x.grad = g
        ours.step()
    buf = io.BytesIO()
    torch.save(ours.state_dict(), buf)
    buf.seek(0)
    with torch.no_grad():
        for x, y in zip(a, b):
            y.copy_(x)
    torch_opt = torch.optim.AdamW(b, lr=1e-2, amsgrad=True)
    torch_opt.load_state_dict(torch.load(buf, weights_only=True))
    sd_o, sd_t = ours.state_dict(), torch_opt.state_dict()
    assert sd_o["param_groups"][0].keys() == torch.optim.AdamW(b).state_dict()["param_groups"][0].keys()
    assert all(sd_o["state"][k].keys() == sd_t["state"][k].keys() for k in sd_o["state"])
    for _ in range(2):
        for x, y, g in zip(a, b, _grads(a)):
            x.grad, y.grad = g.clone(), g.clone()
        ours.step()
        torch_opt.step()
    for i, (x, y) in enumerate(zip(a, b)):
        _close(x, y, FP32_TOL, f"ours->torch param {i}")
    # and back: torch's state (CPU steps) into a fresh kernelset AdamW
    c = [y.detach().clone().requires_grad_() for y in b]
    back = ks.optim.AdamW(c, lr=1e-2, amsgrad=True)
    back.load_state_dict(torch_opt.state_dict())
    for x, y, g in zip(c, b, _grads(c)):
        x.grad, y.grad = g.clone(), g.clone()
    back.step()
    torch_opt.step()
    for i, (x, y) in enumerate(zip(c, b)):
        _close(x, y, FP32_TOL, f"torch->ours param {i}")
        st = back.state[x]
        assert st["step"].device == x.device and st["step"].dtype == torch.float32 and float(st["step"]) == 5.0


def test_load_keeps_fp32_states_for_bf16_params(device):
    p = torch.randn(300, device=device, dtype=torch.bfloat16, requires_grad=True)
    opt = ks.optim.AdamW([p], master_weights=True)
    p.grad = torch.randn_like(p)
    opt.step()
    sd = opt.state_dict()
    fresh = ks.optim.AdamW([p], master_weights=True)
    fresh.load_state_dict(sd)
    st = fresh.state[p]
    for key in ("exp_avg", "exp_avg_sq", "master_param"):
        assert st[key].dtype == torch.float32 and torch.equal(st[key], sd["state"][0][key])
        assert st[key].data_ptr() != sd["state"][0][key].data_ptr(), "loaded state aliases the saved dict"


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_scale_and_found_inf(backend, device):
    a, b = _pair(_params(device))
    ours = ks.optim.AdamW(a, lr=1e-2, backend=backend)
    ref = torch.optim.AdamW(b, lr=1e-2)
    scale = torch.tensor(1024.0, device=device)
    grads = _grads(a)
    for x, y, g in zip(a, b, grads):
        x.grad, y.grad = g * 1024.0, g.clone()
    ours.step(grad_scale=scale, found_inf=torch.zeros((), device=device))
    ref.step()
    for i, (x, y) in enumerate(zip(a, b)):
        _close(x, y, FP32_TOL, f"param {i}")
        _close(x.grad, grads[i], 1e-7, f"grad {i} written back unscaled")
    # found_inf: nothing moves, not even the step counters or the grads
    before = [(x.detach().clone(), x.grad.clone(), ours.state[x]["exp_avg"].clone()) for x in a]
    for x in a:
        x.grad.mul_(1024.0)
    scaled = [x.grad.clone() for x in a]
    ours.step(grad_scale=scale, found_inf=torch.ones((), device=device))
    for (p0, _, m0), x, g0 in zip(before, a, scaled):
        assert torch.equal(x.detach(), p0) and torch.equal(ours.state[x]["exp_avg"], m0) and torch.equal(x.grad, g0)
        assert float(ours.state[x]["step"]) == 1.0


def test_grad_scaler_integration(device):
    """torch.amp.GradScaler drives ks AdamW through _step_supports_amp_scaling (grad_scale and
    found_inf attributes) and torch AdamW through unscale_: same params, skipped step included."""
    torch.manual_seed(0)
    a, b = _pair([torch.randn(64, 32, device=device), torch.randn(32, device=device)])
    ours = ks.optim.AdamW(a, lr=1e-2)
    ref = torch.optim.AdamW(b, lr=1e-2)
    assert ours._step_supports_amp_scaling
    s_o = torch.amp.GradScaler(device.type, init_scale=256.0, growth_interval=1)
    s_r = torch.amp.GradScaler(device.type, init_scale=256.0, growth_interval=1)
    for it in range(4):
        x = torch.randn(8, 64, device=device)
        if it == 2:
            x[0, 0] = float("inf")  # this step must be skipped by both
        for ps, opt, sc in ((a, ours, s_o), (b, ref, s_r)):
            opt.zero_grad()
            loss = ((x @ ps[0]) + ps[1]).square().mean()
            sc.scale(loss).backward()
            sc.step(opt)
            sc.update()
        assert s_o.get_scale() == s_r.get_scale()
        for i, (p, q) in enumerate(zip(a, b)):
            _close(p, q, FP32_TOL, f"iteration {it} param {i}")
    assert float(ours.state[a[0]]["step"]) == 3.0 == float(ref.state[b[0]]["step"])


def test_non_dense_param_forced_triton_refuses_auto_falls_back(device):
    p = torch.randn(8, 10, device=device)[:, :5].detach().requires_grad_()  # rows of a wider tensor
    q = p.detach().clone().requires_grad_()
    g = torch.randn(8, 5, device=device)
    p.grad, q.grad = g.clone(), g.clone()
    with pytest.raises(ks.UnsupportedError, match="not dense"):
        ks.optim.AdamW([p], backend="triton").step()
    exp = ks.explain("adamw", [p], [p.grad], verbose=False)
    assert exp.chosen == ks.Backend.REFERENCE
    opt, ref = ks.optim.AdamW([p]), torch.optim.AdamW([q])
    opt.step()
    ref.step()
    _close(p, q, FP32_TOL, "non-dense param")


def test_plan_is_cached_and_rebuilt_on_new_addresses(device):
    ps = [torch.randn(300, device=device) for _ in range(3)]
    ms, vs = [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps]
    steps = [torch.zeros((), device=device) for _ in ps]
    grads = _grads(ps)

    def plan(gs):
        return L.prepare(ps, gs, ms, vs, [], [], steps, False)

    L.clear_plans()
    first = plan(grads)
    assert plan(grads).buckets is first.buckets, "same addresses must reuse the plan"
    assert len(L._plans) == 1 and len(L._layouts) == 1
    moved = [grads[0], grads[1].clone(), grads[2]]  # a fresh grad elsewhere (zero_grad(set_to_none=True))
    again = plan(moved)
    assert len(L._plans) == 2, "a moved grad needs a table with its address"
    assert len(L._layouts) == 1 and again.lay is first.lay, "only a grad moved: buckets and chunk maps are reused"
    odd = torch.randn(301, device=device)[1:]  # a 4-byte-offset grad: another bucket
    plan([odd, grads[1], grads[2]])
    assert len(L._layouts) == 2, "a grad that changes alignment changes the buckets"
    with pytest.raises(ValueError, match="alignment"):
        first.regrad([odd.data_ptr(), grads[1].data_ptr(), grads[2].data_ptr()])


def test_step_cache_replays_and_follows_every_change(device, monkeypatch):
    """From the second step on, AdamW replays its cached plan (no new plan is prepared), yet
    matches torch.optim.AdamW step for step through every change that must leave the replay:
    moved grads, a grad gone, a param's storage swapped, a state tensor replaced, a reloaded
    state dict, a misaligned grad."""
    a = [torch.randn(n, device=device, requires_grad=True) for n in (300, 1000, 17)]
    b = [p.detach().clone().requires_grad_() for p in a]
    ours = ks.optim.AdamW(a, lr=1e-2, weight_decay=0.1, backend="triton")
    ref = torch.optim.AdamW(b, lr=1e-2, weight_decay=0.1)
    prepared = []
    real = L.prepare
    monkeypatch.setattr(L, "prepare", lambda *args: prepared.append(1) or real(*args))

    def step(change=None, grads=None):
        grads = grads or _grads(a)
        for p, q, g in zip(a, b, grads):
            p.grad = None if g is None else g
            q.grad = None if g is None else g.clone()
        if change:
            change()
        prepared.clear()
        ours.step()
        ref.step()
        for i, (p, q) in enumerate(zip(a, b)):
            _close(p.detach(), q.detach(), FP32_TOL, f"param {i}")
        return len(prepared)

    step()
    grads = _grads(a)
    step(grads=grads)
    assert step(grads=grads) == 0, "same tensors: the step is replayed"
    assert step() == 0, "moved grads: replayed on new tables"
    assert step(grads=[grads[0], None, grads[2]]) > 0, "a grad gone: full path"
    assert step(grads=[grads[0], None, grads[2]]) == 0
    assert step() > 0 and step() == 0, "every grad back: full path once, then replayed"

    kept = []

    def swap():  # (the old storage kept alive: a stale replay would update it instead, not crash)
        kept.append(a[0].data)
        a[0].data = a[0].data.clone()
    assert step(change=swap) > 0, "a param's storage swapped: full path"

    def replace():
        ours.state[a[2]]["exp_avg"] = ours.state[a[2]]["exp_avg"].clone()
    assert step(change=replace) > 0, "a state tensor replaced: full path"
    assert step() == 0
    sd = ours.state_dict()
    assert step(change=lambda: ours.load_state_dict(sd)) > 0, "a reloaded state dict: full path"
    odd = torch.randn(301, device=device)[1:]
    odd.copy_(_grads(a)[0])
    assert step(grads=[odd] + _grads(a)[1:]) > 0, "a misaligned grad: another bucket, full path"


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copied_optimizer_keeps_its_options(how, device):
    """torch's Optimizer.__getstate__ keeps defaults, state and param_groups only: a deepcopy or a
    pickle (torch.save of the optimizer) came back with master_weights off, fp32 states and the
    AUTO backend, and its next step updated the bf16 params directly, ignoring the masters."""
    import copy
    import pickle
    p = torch.randn(300, device=device, dtype=torch.bfloat16, requires_grad=True)
    opt = ks.optim.AdamW([p], lr=1e-2, master_weights=True, state_dtype=None, backend="reference")
    p.grad = torch.randn_like(p)
    opt.step()
    dup = copy.deepcopy(opt) if how == "deepcopy" else pickle.loads(pickle.dumps(opt))
    assert (dup.master_weights, dup.state_dtype, dup.backend) == (True, None, ks.Backend.REFERENCE)
    q = dup.param_groups[0]["params"][0]
    g = torch.randn_like(p)
    p.grad, q.grad = g, g.clone()
    opt.step()
    dup.step()
    st = dup.state[q]
    assert st["exp_avg"].dtype == torch.bfloat16 and torch.equal(q.detach(), st["master_param"].to(torch.bfloat16))
    assert torch.equal(q.detach(), p.detach()) and torch.equal(st["master_param"], opt.state[p]["master_param"])


def test_refused_param_group_is_not_added(device):
    """A group refused by add_param_group (here a float64 param) must leave the optimizer as it
    was: it stayed appended, and every later step() failed on it."""
    p = torch.randn(10, device=device, requires_grad=True)
    opt = ks.optim.AdamW([p], lr=1e-2)
    with pytest.raises(TypeError, match="float64"):
        opt.add_param_group({"params": [torch.randn(4, device=device, dtype=torch.float64, requires_grad=True)]})
    with pytest.raises(ValueError, match="lr"):
        opt.add_param_group({"params": [torch.randn(4, device=device, requires_grad=True)], "lr": -1.0})
    assert len(opt.param_groups) == 1
    p.grad = torch.randn_like(p)
    opt.step()


@pytest.mark.parametrize("backend", BACKENDS)
def test_amsgrad_nan_grad_state_matches_torch(backend, device):
    """A NaN grad makes torch's max_exp_avg_sq NaN there (torch.maximum keeps NaN). The kernel's
    tl.maximum returned the other operand, keeping the old finite maximum: the states and the
    backends disagreed after the first NaN. NaN in a full block and in the masked tail."""
    a, b = _pair([torch.randn(2049, device=device)])
    ours = ks.optim.AdamW(a, lr=1e-2, amsgrad=True, backend=backend)
    ref = torch.optim.AdamW(b, lr=1e-2, amsgrad=True)
    for step in range(2):
        g = torch.randn(2049, device=device)
        if step == 1:
            g[5] = g[2048] = float("nan")
        a[0].grad, b[0].grad = g, g.clone()
        ours.step()
        ref.step()
    for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
        got, want = ours.state[a[0]][key], ref.state[b[0]][key]
        assert torch.equal(got.isnan(), want.isnan()), f"{key}: NaN at {got.isnan().nonzero().flatten().tolist()}"
        _close(got.nan_to_num(0.0), want.nan_to_num(0.0), FP32_TOL, key)
    assert torch.equal(a[0].detach().isnan(), b[0].detach().isnan())


@pytest.mark.parametrize("backend", BACKENDS)
def test_step_bumps_param_versions(backend, device):
    """torch's optimizers update params with in-place ops, which bump their version counters: a
    graph that saved a param before the step then refuses to back-propagate through the new
    values. The Triton kernels write through pointers, so the step bumps them itself; both the
    full step and the cached replay (second step) are checked."""
    p = torch.nn.Parameter(torch.randn(16, 8, device=device))
    opt = ks.optim.AdamW([p], lr=1e-2, backend=backend)
    for _ in range(2):
        x = torch.randn(4, 16, device=device, requires_grad=True)
        out = x @ p  # saves p for x's gradient
        p.grad = torch.randn_like(p)
        before = p._version
        opt.step()
        assert p._version > before
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


@pytest.mark.parametrize("change", ["replace", "reorder"])
def test_step_cache_follows_the_group_params_list(change, device):
    """The step cache must check *which* params the group holds, not only how many: an entry of
    ``group["params"]`` replaced by another tensor of the same shape (re-pointing an optimizer at
    a rebuilt module) or the list reordered. It replayed the old lists: the new param was never
    updated and the old one took its grad; reordered params of different sizes were paired with
    each other's grads and sizes (out-of-bounds reads and writes on a GPU)."""
    a = [torch.randn(n, device=device, requires_grad=True) for n in (40, 50)]
    b = [p.detach().clone().requires_grad_() for p in a]
    ours = ks.optim.AdamW(a, lr=1e-1, backend="triton")
    ref = torch.optim.AdamW(b, lr=1e-1)

    def step():
        for p, q in zip(ours.param_groups[0]["params"], ref.param_groups[0]["params"]):
            g = torch.randn_like(p)
            p.grad, q.grad = g, g.clone()
        ours.step()
        ref.step()

    step()
    step()  # (the cache is built; this one replayed)
    if change == "replace":
        fresh = torch.randn(40, device=device, requires_grad=True)
        ours.param_groups[0]["params"][0] = fresh
        ref.param_groups[0]["params"][0] = fresh.detach().clone().requires_grad_()
        old = a[0].detach().clone()
    else:
        ours.param_groups[0]["params"].reverse()
        ref.param_groups[0]["params"].reverse()
    step()
    step()
    for i, (p, q) in enumerate(zip(ours.param_groups[0]["params"], ref.param_groups[0]["params"])):
        _close(p.detach(), q.detach(), FP32_TOL, f"param {i}")
    if change == "replace":
        assert torch.equal(a[0].detach(), old), "a param no longer in the group was updated"


@pytest.mark.parametrize("fn,match", [
    (lambda p: ks.optim.AdamW([p], lr=-1.0), "lr"),
    (lambda p: ks.optim.AdamW([p], betas=(1.0, 0.9)), r"betas\[0\]"),
    (lambda p: ks.optim.AdamW([p], eps=-1e-8), "eps"),
    (lambda p: ks.optim.AdamW([p], weight_decay=float("nan")), "weight_decay"),
    (lambda p: ks.optim.AdamW([p], differentiable=True), "differentiable"),
    (lambda p: ks.optim.AdamW([p], lr=torch.ones(2)), "1-element"),
    (lambda p: ks.optim.AdamW([p], backend="cuda-magic"), "backend"),
    (lambda p: ks.optim.AdamW([p.detach().double()]), "float64"),
    (lambda p: ks.optim.AdamW([torch.randn(3, dtype=torch.complex64)]), "complex"),
    (lambda p: ks.optim.AdamW([p]).add_param_group({"params": [p.detach().double()]}), "float64"),
    # a group's own hyper-parameters went unchecked (torch checks only the defaults): a negative
    # lr climbed the loss, a beta >= 1 diverged, a string weight decay failed at step() unnamed
    (lambda p: ks.optim.AdamW([{"params": [p], "lr": -1.0}]), r"param_groups\[0\]\['lr'\]"),
    (lambda p: ks.optim.AdamW([{"params": [p]}, {"params": [p.detach().clone()], "betas": (2.0, 0.9)}]),
     r"param_groups\[1\]\['betas'\]\[0\]"),
    (lambda p: ks.optim.AdamW([{"params": [p], "weight_decay": "0.1"}]), r"param_groups\[0\]\['weight_decay'\]"),
    (lambda p: ks.optim.AdamW([p], lr=torch.tensor(-1.0)), "lr"),  # (torch refuses it too)
    (lambda p: ks.optim.AdamW([p], betas=("a", 0.9)), r"betas\[0\]"),
], ids=["lr", "beta1", "eps", "wd-nan", "differentiable", "lr-tensor-shape", "backend", "fp64", "complex",
        "added-group", "group-lr", "group-betas", "group-wd-str", "lr-tensor-negative", "beta-not-a-number"])
def test_bad_input(fn, match):
    with pytest.raises((ValueError, TypeError), match=match):
        fn(torch.randn(4, requires_grad=True))


# clip_grad_norm_

NORMS = [2.0, 1.0, math.inf, 3.0, 0.5]


@pytest.mark.parametrize("backend", [str(i.backend) for i in impls("clip_grad_norm")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("norm_type", NORMS, ids=lambda n: f"p{n}")
@pytest.mark.parametrize("max_norm", [0.5, 1e12], ids=["clips", "no-clip"])
def test_clip_grad_norm_matches_torch(backend, dtype, norm_type, max_norm, device):
    a, b = _pair(_params(device, dtype))
    for x, y, g in zip(a, b, _grads(a)):
        x.grad, y.grad = g.clone(), g.clone()
    total = ks.clip_grad_norm_(a, max_norm, norm_type, backend=backend)
    # torch's foreach inf-norm refuses an empty tensor (no identity); an empty grad adds nothing anyway
    want = torch.nn.utils.clip_grad_norm_([y for y in b if y.numel()], max_norm, norm_type)
    assert total.dtype == want.dtype and total.shape == () and total.device == want.device
    tol = 1e-6 if dtype == torch.float32 else tolerance("elementwise", dtype)
    _close(total.float(), want.float(), tol, "total norm")
    for i, (x, y) in enumerate(zip(a, b)):
        _close(x.grad, y.grad, tol if max_norm < 1e12 else 0.0, f"grad {i}")


def test_clip_grad_norm_edge_cases(device):
    assert torch.equal(ks.clip_grad_norm_([torch.randn(3, device=device)], 1.0), torch.tensor(0.0))  # no grads
    p = torch.randn(100, device=device, requires_grad=True)
    p.grad = torch.randn(100, device=device)
    p.grad[3] = float("inf")
    before = p.grad.clone()
    with pytest.raises(RuntimeError, match="non-finite"):
        ks.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    assert torch.equal(p.grad, before), "grads changed before the non-finite error"
    q = p.detach().clone().requires_grad_()
    q.grad = before.clone()
    assert torch.isinf(ks.clip_grad_norm_([p], 1.0)) and torch.isinf(torch.nn.utils.clip_grad_norm_([q], 1.0))
    assert torch.equal(p.grad.isnan(), q.grad.isnan())
    # norm types the kernels do not take: forced triton refuses, AUTO runs the reference
    r = torch.randn(50, device=device, requires_grad=True)
    r.grad = torch.randn(50, device=device)
    with pytest.raises(ks.UnsupportedError, match="norm_type"):
        ks.clip_grad_norm_([r], 1.0, norm_type=0.0, backend="triton")
    s = r.detach().clone().requires_grad_()
    s.grad = r.grad.clone()
    _close(ks.clip_grad_norm_([r], 1.0, norm_type=-math.inf),
           torch.nn.utils.clip_grad_norm_([s], 1.0, norm_type=-math.inf), 1e-6, "-inf norm")
    _close(r.grad, s.grad, 1e-6, "-inf norm grads")


@pytest.mark.parametrize("backend", [str(i.backend) for i in impls("clip_grad_norm")])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf, 0.5, 3.0])
def test_clip_grad_norm_keeps_nan(backend, norm_type, device):
    # a NaN gradient makes the norm NaN for every p, as in torch (training loops skip the step on a
    # non-finite norm); the p-norm kernel once turned |NaN|^p into 0 and reported a finite norm
    p = torch.randn(300, device=device, requires_grad=True)
    p.grad = torch.randn(300, device=device)
    p.grad[123] = float("nan")
    assert ks.clip_grad_norm_([p], 1.0, norm_type=norm_type, backend=backend).isnan()
    with pytest.raises(RuntimeError, match="non-finite"):
        ks.clip_grad_norm_([p], 1.0, norm_type=norm_type, error_if_nonfinite=True, backend=backend)


def test_clip_grad_norm_compiles_fullgraph(device):
    ps = [torch.randn(40, device=device, requires_grad=True) for _ in range(2)]
    qs = [p.detach().clone().requires_grad_() for p in ps]
    for p, q in zip(ps, qs):
        p.grad = torch.randn_like(p)
        q.grad = p.grad.clone()
    f = torch.compile(lambda params: ks.clip_grad_norm_(params, 0.1), fullgraph=True, backend="aot_eager")
    total = f(ps)
    want = torch.nn.utils.clip_grad_norm_(qs, 0.1)
    _close(total, want, 1e-6, "compiled total")
    for p, q in zip(ps, qs):
        _close(p.grad, q.grad, 1e-6, "compiled grads")


def test_adamw_step_compiles_fullgraph(device):
    """opt.step under torch.compile(fullgraph=True): the update is the kernelset::adamw_ custom op."""
    a, b = _pair([torch.randn(300, device=device), torch.randn(7, 9, device=device)])
    ours, ref = ks.optim.AdamW(a, lr=1e-2), torch.optim.AdamW(b, lr=1e-2)
    step = torch.compile(ours.step, fullgraph=True, backend="aot_eager")
    for _ in range(2):
        for x, y, g in zip(a, b, _grads(a)):
            x.grad, y.grad = g.clone(), g.clone()
        step()
        ref.step()
    for x, y in zip(a, b):
        _close(x, y, FP32_TOL, "compiled step")
        assert float(ours.state[x]["step"]) == 2.0


# GPU-only: no host sync, CUDA-graph capture

@pytest.mark.gpu
def test_step_has_no_host_sync_and_captures_in_a_cuda_graph():
    dev = torch.device("cuda")
    a, b = _pair([torch.randn(n, device=dev, dtype=torch.bfloat16) for n in (5000, 123, 70000)])
    ours = ks.optim.AdamW(a, lr=1e-2, master_weights=True)
    ref = ks.optim.AdamW(b, lr=1e-2, master_weights=True, backend="reference")
    for x, y in zip(a, b):
        x.grad = torch.randn_like(x)
        y.grad = x.grad.clone()
    ours.step()  # warm-up: states, plan, compilation
    ref.step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ours.step(grad_scale=torch.ones((), device=dev), found_inf=torch.zeros((), device=dev))
        ks.clip_grad_norm_(a, 1.0)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ref.step(grad_scale=torch.ones((), device=dev), found_inf=torch.zeros((), device=dev))
    ks.clip_grad_norm_(b, 1.0, backend="reference")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ours.step()
    for _ in range(3):
        graph.replay()
        ref.step()
    torch.cuda.synchronize()
    for x, y in zip(a, b):
        assert float(ours.state[x]["step"]) == 5.0
        _close(ours.state[x]["master_param"], ref.state[y]["master_param"], 1e-6, "graph replay master")


_AOT_SCRIPT = r"""
import json, re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernelset.ops.optim import kernels as K
from kernelset.ops.optim.launch import ROW, opt_policy

pol = opt_policy(1 << 30)
out = []
SIZE = {"bf16": 2, "fp16": 2, "fp32": 4}


def compile_(fn, sig, consts, aligned, warps):
    # as the launcher promises: 16-byte aligned table, chunk map and prototype pointers (ALIGNED)
    attrs = {(k,): [["tt.divisibility", 16]] for k, n in enumerate(sig) if n in aligned}
    src = ASTSource(fn, signature={**sig, **{k: "constexpr" for k in consts}}, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps)).asm["ptx"]


def report(case, ptx, loads, stores):
    # the full-block path must move every tensor in 16-byte vectors: count them
    v4_ld = len(re.findall(r"ld\.global[\w.:]*\.v4", ptx))
    v4_st = len(re.findall(r"st\.global[\w.:]*\.v4", ptx))
    out.append(dict(case=case, local="ld.local" in ptx or "st.local" in ptx, vec=v4_ld >= loads and v4_st >= stores))


vecs = lambda dt: 8 * SIZE[dt] // 16  # 16-byte vectors per thread for 8 elements
ptrs = ("TABLE", "CHUNKS", "P0", "G0", "S0", "LR", "SCALE", "FOUND_INF")
for pdt, ams, master, scale, sdt in (("bf16", 0, 0, 0, "fp32"), ("bf16", 1, 1, 1, "fp32"), ("fp32", 0, 0, 0, "fp32"),
                                     ("fp16", 1, 0, 1, "fp32"), ("bf16", 0, 1, 0, "fp32"), ("bf16", 1, 0, 0, "bf16")):
    sig = dict(TABLE="*i64", CHUNKS="*i32", P0=f"*{pdt}", G0=f"*{pdt}", S0=f"*{sdt}", LR="*fp32", SCALE="*fp32",
               FOUND_INF="*fp32", lr_hi="fp32", lr_lo="fp32", b1_hi="fp32", b1_lo="fp32", b2_hi="fp32", b2_lo="fp32",
               w1="fp32", b2="fp32", w2="fp32", eps="fp32", wd="fp32", decay="fp32")
    consts = dict(ROW=ROW, BLOCK=pol.block, ITERS=pol.iters, AMSGRAD=bool(ams), MAXIMIZE=False, MASTER=bool(master),
                  LR_TENSOR=bool(scale), HAS_SCALE=bool(scale), HAS_INF=bool(scale), ALIGNED=True)
    ptx = compile_(K._adamw_fwd_kernel, sig, consts, ptrs, pol.num_warps)
    states = (2 + ams) * vecs(sdt)  # m, v, vmax
    loads = vecs(pdt) + (2 if master else vecs(pdt)) + states  # g, (master or p), states
    stores = vecs(pdt) + states + 2 * master + vecs(pdt) * scale  # p, states, master, unscaled g
    report(f"adamw-{pdt}-ams{ams}-master{master}-scale{scale}-states{sdt}", ptx, loads, stores)
for gdt in ("bf16", "fp32"):
    for norm in (0, 2, 3):
        ptx = compile_(K._norm_partial_kernel, dict(TABLE="*i64", CHUNKS="*i32", G0=f"*{gdt}", PARTIAL="*fp32",
                       p="fp32"), dict(ROW=ROW, BLOCK=pol.block, ITERS=pol.iters, NORM=norm, ALIGNED=True),
                       ("TABLE", "CHUNKS", "G0", "PARTIAL"), pol.num_warps)
        report(f"norm-{gdt}-{norm}", ptx, vecs(gdt), 0)
    ptx = compile_(K._scale_kernel, dict(TABLE="*i64", CHUNKS="*i32", G0=f"*{gdt}", COEF="*fp32"),
                   dict(ROW=ROW, BLOCK=pol.block, ITERS=pol.iters, ALIGNED=True), ("TABLE", "CHUNKS", "G0", "COEF"),
                   pol.num_warps)
    report(f"scale-{gdt}", ptx, vecs(gdt), vecs(gdt))
# scalar-sized helpers: they must compile; they have no bulk access to vectorize
compile_(K._adamw_steps_kernel, dict(TABLE="*i64", N="i32", FOUND_INF="*fp32"), dict(ROW=ROW, HAS_INF=True, BLOCK=128),
         ("TABLE",), 4)
for norm in (0, 1, 2, 3):
    compile_(K._norm_finalize_kernel, dict(PARTIAL="*fp32", N="i32", TOTAL="*bf16", COEF="*fp32", max_norm="fp32",
             p="fp32"), dict(NORM=norm, BLOCK=1024), ("PARTIAL",), 4)
print(json.dumps(out))
"""


def test_kernels_compile_for_sm90():
    """Compile the AdamW variants (dtypes, amsgrad, master, grad scaling), the norm partials and
    the scale kernel for sm_90: no spills, and the full-block path moves every tensor in 16-byte
    vectors (counted per kernel); the step and finalize kernels must compile."""
    compile_report(_AOT_SCRIPT, 14)
