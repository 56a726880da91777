"""The cross-entropy ring kernel (ops/loss/ring_sm90.py: sm_90, Gluon): its policy, its launcher's
binding of every kernel parameter, an sm_90 compile on any machine, and on an sm_90 GPU (turned on
whatever the bandwidth class) the loss, lse and gradient against the fp32 reference."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from aot import compile_report

import kernelset as ks
from kernelset.core.tolerance import rel_err, tolerance
from kernelset.ops.loss import launch
from kernelset.ops.loss import reference as R

# the ring on any sm_90 (the default keeps it to SXM-class bandwidth per SM)
RING = dataclasses.replace(launch.CETuning(), ring_min_gbs_per_sm=0.001)


def test_ring_policy():
    """Vocabularies of 32768-262144, multiples of 256, in portions of 32768 (the last ragged);
    2-byte logits; SXM-class bandwidth per SM (H100 SXM, H200) by default."""
    t = launch.CETuning()
    rp = launch.ring_policy(128256, 2, 25.0, t)  # H100 SXM
    assert (rp.split, rp.split_p2, rp.chunks, rp.box_rows, rp.buffers, rp.num_warps) == (4, 4, 8, 16, 9, 8)
    assert launch.ring_policy(262144, 2, 25.0, t).split == 8
    assert launch.ring_policy(32768, 2, 25.0, t).split == 1
    rp = launch.ring_policy(128256, 2, 36.0, t)  # H200: smaller portions, 6 programs of 4 warps per SM
    assert (rp.split, rp.split_p2, rp.chunks, rp.box_rows, rp.buffers, rp.num_warps, rp.programs_per_sm) == (
        8, 8, 8, 8, 9, 4, 6)
    assert launch.ring_policy(128256, 2, 25.0, t) is not None  # H100 SXM
    assert launch.ring_policy(128256, 2, 17.5, t) is None  # H100 PCIe: not measured, the looped kernel
    assert launch.ring_policy(128256, 2, 17.5, RING) is not None
    for v, size in ((128300, 2), (151936, 2), (128256, 4), (32000, 2), (262400, 2)):
        assert launch.ring_policy(v, size, 36.0, t) is None, (v, size)


def test_ring_choice_needs_a_gradient_no_softcap_and_sm90(device, monkeypatch):
    from kernelset.ops import ring
    if device.type != "cuda":
        assert launch.ring_choice(128256, torch.bfloat16, device, RING) is None
    monkeypatch.setattr(ring, "on_sm90", lambda device, arch=None: True)
    monkeypatch.setattr(ring, "gluon_kernel", lambda mod, name: (object(), None))
    cuda = torch.device("cuda")
    assert launch.ring_choice(128256, torch.bfloat16, cuda, RING, gbs_per_sm=25.0) is not None
    assert launch.ring_choice(128256, torch.bfloat16, cuda, RING, gbs_per_sm=25.0, need_grad=False) is None
    assert launch.ring_choice(128256, torch.bfloat16, cuda, RING, gbs_per_sm=25.0, softcap=30.0) is None
    assert launch.ring_choice(128256, torch.bfloat16, cuda, RING, gbs_per_sm=25.0, smoothing=0.1) is None
    assert launch.ring_choice(128256, torch.float32, cuda, RING, gbs_per_sm=25.0) is None
    assert launch.ring_choice(128256, torch.bfloat16, cuda, launch.CETuning(), gbs_per_sm=36.0) is not None
    assert launch.ring_choice(128256, torch.bfloat16, cuda, launch.CETuning(), gbs_per_sm=25.0) is not None
    assert launch.ring_choice(128256, torch.bfloat16, cuda, launch.CETuning(), gbs_per_sm=17.5) is None


_RING_AOT = r"""
import json, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from kernelset.ops.loss import ring_sm90 as K
from kernelset.ops.loss.launch import CETuning, ring_policy

out = []
fn = K._ce_ring_kernel
for v, dt, tdt, gbs in ((128256, "bf16", "i64", 25.0), (128256, "bf16", "i32", 36.0), (32768, "fp16", "i64", 25.0),
                        (262144, "bf16", "i64", 36.0), (33024, "bf16", "i64", 25.0), (33024, "fp16", "i64", 36.0)):
    rp = ring_policy(v, 2, gbs, CETuning())
    lay = gl.NVMMASharedLayout.get_default_for([rp.box_rows, 256], gl.bfloat16 if dt == "bf16" else gl.float16)
    sig = dict(x_desc=f"tensordesc<{dt}[{rp.box_rows}, 256],{lay!r}>", X=f"*{dt}", T=f"*{tdt}", LOSS="*fp32",
               LSE="*fp32", DX=f"*{dt}", SCALE="*fp32", PART="*fp32", SYNC="*i32", R="i32", V="i32",
               ignore_index="i32", z_loss="fp32")
    consts = dict(RAGGED=v % (rp.chunks * rp.box_rows * 256) != 0, S=rp.split, S_P2=rp.split_p2, NCH=rp.chunks, BOXR=rp.box_rows, NB=rp.buffers,
                  num_warps=rp.num_warps)
    full = {a: sig.get(a) or "constexpr" for a in fn.arg_names}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in ("X", "DX", "PART", "SYNC", "V")}
    c = triton.compile(GluonASTSource(fn, signature=full, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=dict(num_warps=rp.num_warps))
    ptx = c.asm["ptx"]
    out.append(dict(case=f"{v}-{dt}-{tdt}-{gbs}", local="ld.local" in ptx or "st.local" in ptx, tma="cp.async.bulk.tensor" in ptx, smem=c.metadata.shared,
                    acquire=("ld.global.gpu.acquire" in ptx) or rp.split == 1, per_sm=rp.programs_per_sm,
                    vec="st.global.v4" in ptx))
print(json.dumps(out))
"""


def test_ring_kernel_compiles_for_sm90():
    """The cross-entropy ring kernel compiles for sm_90 with this machine's Triton (Gluon): TMA
    loads, 16-byte gradient stores, the row's count polled with acquire loads where a row has
    several portions, and the policy's programs per SM fit an SM's 228 KB of shared memory."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    for r in compile_report(_RING_AOT, 6):
        assert r["tma"] and r["acquire"] and r["vec"], r
        assert r["per_sm"] * (r["smem"] + 1024) <= 228 * 1024, r


def test_ring_launcher_binds_the_kernel_signature(monkeypatch):
    """ks.cross_entropy's launcher down to the ring kernel's launch on any machine (an sm_90 GPU
    and the kernel stood in for): every kernel parameter gets the right tensor or value; a
    softcap, no gradient or a strided gradient buffer take the other kernels."""
    pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from kernelset.ops import ring
    from kernelset.ops.loss import ring_sm90 as K
    calls = []
    monkeypatch.setattr(ring, "gluon_kernel", lambda mod, name: (lambda grid, *a, **kw: calls.append((grid, a, kw)), None))
    monkeypatch.setattr(ring, "on_sm90", lambda device, arch=None: True)
    monkeypatch.setattr(ring, "device_gbs_per_sm", lambda device: 36.0)
    sync, part = torch.zeros(6, dtype=torch.int32), torch.empty(60)
    monkeypatch.setattr(ring, "launches", lambda dev, m, nslot, p2: ((0, sync, part),))
    other = []
    monkeypatch.setattr(launch, "_fwd", lambda grid, *a, **kw: other.append(grid))
    x = torch.randn(5, 128256, dtype=torch.bfloat16)
    tgt = torch.randint(0, 128256, (5,))
    loss, lse, dx, scale = torch.empty(5), torch.empty(5), torch.empty_like(x), torch.ones(())
    with launch.use(launch.CETuning()):
        launch.ce_rows(x, tgt, loss, lse, dx, scale, -100, 0.0, 1e-4, None, True)
        (grid, args, kw), = calls
        launch.ce_rows(x, tgt, loss, lse, dx, scale, -100, 0.0, 1e-4, 30.0, True)  # softcap
        launch.ce_rows(x, tgt, loss, lse, dx, scale, -100, 0.1, 1e-4, None, True)  # label smoothing
        launch.ce_rows(x, tgt, loss, lse, None, None, -100, 0.0, 1e-4, None, False)  # no gradient
        launch.ce_rows(x, tgt, loss, lse, torch.empty(5, 2 * 128256, dtype=x.dtype)[:, ::2], scale, -100, 0.0, 0.0,
                       None, True)
    assert len(calls) == 1 and len(other) == 4
    bound = dict(zip(K._ce_ring_kernel.arg_names, args), **kw)
    assert set(bound) == set(K._ce_ring_kernel.arg_names)
    assert bound["x_desc"].base.data_ptr() == x.data_ptr() and bound["X"] is x and bound["T"] is tgt
    assert bound["LOSS"] is loss and bound["LSE"] is lse and bound["DX"] is dx and bound["SCALE"] is scale
    assert bound["PART"] is part and bound["SYNC"] is sync
    assert (bound["R"], bound["V"], bound["ignore_index"], bound["z_loss"]) == (5, 128256, -100, 1e-4)
    assert (bound["RAGGED"], bound["S"], bound["S_P2"], bound["NCH"], bound["BOXR"], bound["NB"],
            bound["num_warps"]) == (True, 8, 8, 8, 8, 9, 4)
    assert grid == (24,)  # 4 "SMs" off the GPU x 6 programs each = 3 groups of 8 programs (5 rows)


def _ring_gpu(device):
    if device.type != "cuda" or launch.ring_choice(128256, torch.bfloat16, device, RING) is None:
        pytest.skip("the ring kernel needs an sm_90 GPU with Gluon")


OPTS = {"plain": {}, "zloss": dict(z_loss=1e-3)}


@pytest.mark.gpu
@pytest.mark.parametrize("opt", list(OPTS))
@pytest.mark.parametrize("v,dtype", [(128256, torch.bfloat16), (262144, torch.bfloat16), (65536, torch.float16),
                                     (33024, torch.bfloat16)], ids=["128256", "262144", "65536-fp16", "33024"])
def test_ring_matches_reference(v, dtype, opt, device, monkeypatch):
    """The ring kernel (turned on) against the fp32 reference, plain and with z-loss: per-row loss
    and the gradient, poisoned first; ignored rows, a target in the ragged last portion, a row
    with -inf logits; a row's bits are the same in any batch; strided logits take the other
    kernels, and label smoothing is never offered to the ring."""
    _ring_gpu(device)
    launched = []
    real = launch._ring_rows
    monkeypatch.setattr(launch, "_ring_rows", lambda *a: launched.append(real(*a)) or launched[-1])
    m = 150
    x = torch.randn(m, v, dtype=dtype, device=device) * 2
    tgt = torch.randint(0, v, (m,), device=device)
    tgt[3] = -100
    tgt[7] = v - 1  # the last column: in the ragged portion
    tgt[8] = 0
    kw = OPTS[opt]
    sm, zl = kw.get("label_smoothing", 0.0), kw.get("z_loss", 0.0)
    x[11, ::5] = float("-inf")
    tgt[11] = 1
    with launch.use(RING):
        torch.full((m, v), float("nan"), dtype=dtype, device=device)  # freed: dx gets NaN-filled memory
        loss, dx = launch.ce_fwd(x, tgt, -100, sm, zl, None, "none", True)
        loss1, dx1 = launch.ce_fwd(x[8:9].clone(), tgt[8:9].clone(), -100, sm, zl, None, "none", True)
        wide = torch.randn(4, 2 * v, dtype=dtype, device=device)[:, :v]
        lw, dw = launch.ce_fwd(wide, tgt[:4], -100, sm, zl, None, "sum", True)
    assert launched == [True, True, False], launched  # strided logits: the ring declines
    from kernelset.ops import ring
    assert ring.gluon_kernel(*launch._RING)[0].entries() >= 1  # launched directly (FastKernel), not through Triton
    want, dwant = R.fwd(x, tgt, -100, sm, zl, None, "none", True)
    assert loss.isfinite().all() and dx.isfinite().all()
    assert rel_err(loss, want) <= tolerance("norm", torch.float32) * 10
    assert rel_err(dx, dwant) <= tolerance("norm", dtype)
    assert loss[3] == 0 and (dx[3] == 0).all()
    assert torch.equal(loss1[0], loss[8]) and torch.equal(dx1[0], dx[8])
    w2, dw2 = R.fwd(wide, tgt[:4], -100, sm, zl, None, "sum", True)
    assert rel_err(lw, w2) <= 1e-4 and rel_err(dw, dw2) <= tolerance("norm", dtype)
    with launch.use(RING):
        ls, ds = launch.ce_fwd(x, tgt, -100, 0.1, zl, None, "none", True)
    assert len(launched) == 3
    ws, dws = R.fwd(x, tgt, -100, 0.1, zl, None, "none", True)
    fin = ws.isfinite()
    assert torch.equal(ls.isfinite(), fin) and rel_err(ls[fin], ws[fin]) <= 1e-4


@pytest.mark.gpu
def test_ring_through_the_api_and_linear_cross_entropy(device):
    """ks.cross_entropy takes the ring kernel (explain says so) with correct gradients under a
    mean over rows with ignored ones; ks.linear_cross_entropy, whose gradient overwrites its
    logits chunk, stays correct with the ring on."""
    _ring_gpu(device)
    x = torch.randn(256, 128256, dtype=torch.bfloat16, device=device, requires_grad=True)
    tgt = torch.randint(0, 128256, (256,), device=device)
    tgt[::7] = -100
    with launch.use(RING):
        assert "ring kernel on sm_90" in str(ks.explain("cross_entropy", x, tgt, verbose=False))
        loss = ks.cross_entropy(x, tgt, backend="triton")
        loss.backward()
    xr = x.detach().float().requires_grad_()
    lr = torch.nn.functional.cross_entropy(xr, tgt)
    lr.backward()
    assert rel_err(loss, lr) <= 1e-4
    assert rel_err(x.grad, xr.grad) <= tolerance("norm", torch.bfloat16, grad=True)

    h = torch.randn(512, 1024, dtype=torch.bfloat16, device=device, requires_grad=True)
    w = (torch.randn(65536, 1024, device=device) * 0.03).to(torch.bfloat16).requires_grad_()
    t2 = torch.randint(0, 65536, (512,), device=device)
    with launch.use(RING):
        l2 = ks.linear_cross_entropy(h, w, t2)
        l2.backward()
    hr, wr = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    lr2 = torch.nn.functional.cross_entropy(hr @ wr.t(), t2)
    lr2.backward()
    assert rel_err(l2, lr2) <= 1e-3
    assert rel_err(h.grad, hr.grad) <= tolerance("norm", torch.bfloat16, grad=True)
    assert rel_err(w.grad, wr.grad) <= tolerance("norm", torch.bfloat16, grad=True)
