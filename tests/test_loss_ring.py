"""The cross-entropy ring kernel (ops/loss/ring_sm90.py: sm_90, Gluon): its policy, its launcher's
binding of every kernel parameter, an sm_90 compile on any machine, and on an sm_90 GPU (turned on
whatever the bandwidth class) the loss, lse and gradient against the fp32 reference."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from aot import assert_ring_policy_fits, compile_report

import kernelset as ks
from kernelset.core.tolerance import rel_err, tolerance
from kernelset.ops.loss import launch
from kernelset.ops.loss import reference as R

# the ring on any sm_90 (the default keeps it to SXM-class bandwidth per SM)
RING = dataclasses.replace(launch.CETuning(), ring_min_gbs_per_sm=0.001)


def test_ring_policy():
    """Vocabularies of 32768-262144, multiples of 256, in portions of 16384 (the last ragged);
    2-byte logits; SXM-class bandwidth per SM (H100 SXM, H200) by default."""
    t = launch.CETuning()
    for gbs in (25.0, 36.0):  # H100 SXM, H200: one launch, 6 programs of 4 warps per SM
        rp = launch.ring_policy(128256, 2, gbs, t)
        assert (rp.split, rp.split_p2, rp.chunks, rp.box_rows, rp.buffers, rp.num_warps, rp.programs_per_sm) == (
            8, 8, 8, 8, 9, 4, 6)
    assert launch.ring_policy(262144, 2, 25.0, t).split == 16
    assert launch.ring_policy(32768, 2, 25.0, t).split == 2
    assert launch.ring_policy(128256, 2, 25.0, t) is not None  # H100 SXM
    assert launch.ring_policy(128256, 2, 17.5, t) is None  # H100 PCIe: not measured, the looped kernel
    assert launch.ring_policy(128256, 2, 17.5, RING) is not None
    for v, size in ((128300, 2), (151936, 2), (128256, 4), (32000, 2), (262400, 2)):
        assert launch.ring_policy(v, size, 36.0, t) is None, (v, size)


def test_ring_choice_needs_a_gradient_no_softcap_and_sm90(device, monkeypatch):
    from kernelset.ops.common import ring_host
    if device.type != "cuda":
        assert launch.ring_choice(128256, torch.bfloat16, device, RING) is None
    monkeypatch.setattr(ring_host, "on_sm90", lambda device, arch=None: True)
    monkeypatch.setattr(ring_host, "gluon_kernel", lambda mod, name: (object(), None))
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
import json, re, subprocess, tempfile, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from kernelset.ops.loss import ring_sm90 as K
from kernelset.ops.loss.launch import CETuning, ring_policy


def registers(ptx):
    # ptxas -v on the PTX (no GPU needed); None where this Triton's ptxas cannot be found
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        try:
            tool = get_ptxas(90)
        except TypeError:
            tool = get_ptxas()
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
            f.write(ptx)
        res = subprocess.run([getattr(tool, "path", tool), "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"],
                             capture_output=True, text=True, timeout=120)
        found = re.findall(r"Used (\d+) registers", res.stdout + res.stderr)
        return int(found[0]) if found else None
    except Exception:
        return None


out = []
fn = K._ce_ring_kernel
for v, dt, tdt, gbs, rm in ((128256, "bf16", "i64", 25.0, False), (128256, "bf16", "i32", 36.0, False),
                            (32768, "fp16", "i64", 25.0, False), (262144, "bf16", "i64", 36.0, False),
                            (33024, "bf16", "i64", 25.0, False), (33024, "fp16", "i64", 36.0, False),
                            (128256, "bf16", "i64", 25.0, True), (128256, "bf16", "i64", 36.0, True)):
    rp = ring_policy(v, 2, gbs, CETuning())
    lay = gl.NVMMASharedLayout.get_default_for([rp.box_rows, 256], gl.bfloat16 if dt == "bf16" else gl.float16)
    sig = dict(x_desc=f"tensordesc<{dt}[{rp.box_rows}, 256],{lay!r}>", X=f"*{dt}", T=f"*{tdt}", LOSS="*fp32",
               LSE="*fp32", DX=f"*{dt}", SCALE="*fp32", PART="*fp32", SYNC="*i32", R="i32", V="i32",
               ignore_index="i32", z_loss="fp32")
    ragged = v % (rp.chunks * rp.box_rows * 256) != 0
    consts = dict(RAGGED=ragged, ROW_MASKS=rm and ragged, S=rp.split, S_P2=rp.split_p2, NCH=rp.chunks,
                  BOXR=rp.box_rows, NB=rp.buffers, num_warps=rp.num_warps)
    full = {a: sig.get(a) or "constexpr" for a in fn.arg_names}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in ("X", "DX", "PART", "SYNC", "V")}
    c = triton.compile(GluonASTSource(fn, signature=full, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=dict(num_warps=rp.num_warps))
    ptx = c.asm["ptx"]
    out.append(dict(case=f"{v}-{dt}-{tdt}-{gbs}-rowmasks{int(rm)}", local="ld.local" in ptx or "st.local" in ptx,
                    tma="cp.async.bulk.tensor" in ptx, smem=c.metadata.shared, row_masks=rm,
                    acquire=("ld.global.gpu.acquire" in ptx) or rp.split == 1, per_sm=rp.programs_per_sm,
                    warps=rp.num_warps, vec="st.global.v4" in ptx, regs=registers(ptx), triton=triton.__version__))
print(json.dumps(out))
"""


def test_ring_kernel_compiles_for_sm90():
    """The cross-entropy ring kernel compiles for sm_90 with this machine's Triton (Gluon): TMA
    loads, 16-byte gradient stores, the row's count polled with acquire loads where a row has
    several portions, and the policy's programs per SM fit an SM's 228 KB of shared memory and,
    by ptxas's register count, its 64K registers: always for the row-masked ragged form, for
    the others with Triton 3.6 (the GPU image's: under 3.9 their ragged forms need 128-144
    registers, and ``ring_host.learn`` shrinks the grid to what fits)."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    for r in compile_report(_RING_AOT, 8):
        assert r["tma"] and r["acquire"] and r["vec"], r
        assert r["per_sm"] * (r["smem"] + 1024) <= 228 * 1024, r
        if r["regs"] is not None and (r["row_masks"] or r["triton"].startswith("3.6")):
            per_warp = -(-r["regs"] * 32 // 256) * 256
            assert r["per_sm"] * r["warps"] * per_warp <= 65536, r


def test_ring_launcher_binds_the_kernel_signature(monkeypatch):
    """ks.cross_entropy's launcher down to the ring kernel's launch on any machine (an sm_90 GPU
    and the kernel stood in for): every kernel parameter gets the right tensor or value; a
    softcap, no gradient or a strided gradient buffer take the other kernels."""
    pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from kernelset.ops.common import ring_host
    from kernelset.ops.loss import ring_sm90 as K
    calls = []
    monkeypatch.setattr(ring_host, "gluon_kernel", lambda mod, name: (lambda grid, *a, **kw: calls.append((grid, a, kw)), None))
    monkeypatch.setattr(ring_host, "on_sm90", lambda device, arch=None: True)
    monkeypatch.setattr(ring_host, "device_gbs_per_sm", lambda device: 36.0)
    sync, part = torch.zeros(6, dtype=torch.int32), torch.empty(5 * 2 * 8)
    asked = []
    monkeypatch.setattr(ring_host, "launches", lambda dev, m, nslot, p2: asked.append((m, nslot, p2)) or ((0, sync, part),))
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
    assert asked == [(5, 2, 8)]  # (max, sum) per portion, 8 portions a row (split_p2 8)
    bound = dict(zip(K._ce_ring_kernel.arg_names, args), **kw)
    assert set(bound) == set(K._ce_ring_kernel.arg_names)
    assert bound["x_desc"].base.data_ptr() == x.data_ptr() and bound["X"] is x and bound["T"] is tgt
    assert bound["LOSS"] is loss and bound["LSE"] is lse and bound["DX"] is dx and bound["SCALE"] is scale
    assert bound["PART"] is part and bound["SYNC"] is sync
    assert (bound["R"], bound["V"], bound["ignore_index"], bound["z_loss"]) == (5, 128256, -100, 1e-4)
    assert (bound["RAGGED"], bound["ROW_MASKS"], bound["S"], bound["S_P2"], bound["NCH"], bound["BOXR"], bound["NB"],
            bound["num_warps"]) == (True, False, 8, 8, 8, 8, 9, 4)
    assert grid == (24,)  # 4 "SMs" off the GPU x 6 programs each = 3 groups of 8 programs (5 rows)


def _ring_gpu(device):
    if device.type != "cuda" or launch.ring_choice(128256, torch.bfloat16, device, RING) is None:
        pytest.skip("the ring kernel needs an sm_90 GPU with Gluon")


# the shipped launch on any sm_90 (portions of 16384), the first one (portions of 32768 in 16-row
# chunks, 8 warps, 3 per SM) and the row-masked ragged form (off by default)
LAUNCHES = {"p32768": dataclasses.replace(RING, ring_portion=32768, ring_box_rows=16, ring_warps=8,
                                          ring_programs_per_sm=3),
            "p16384": RING,
            "p16384-rowmasks": dataclasses.replace(RING, ring_row_masks=True)}


def _count_ring(monkeypatch) -> list:
    launched = []
    real = launch._ring_rows
    monkeypatch.setattr(launch, "_ring_rows", lambda *a: launched.append(real(*a)) or launched[-1])
    return launched


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", list(LAUNCHES))
@pytest.mark.parametrize("z_loss", [0.0, 1e-3], ids=["plain", "zloss"])
@pytest.mark.parametrize("v,dtype", [(128256, torch.bfloat16), (262144, torch.bfloat16), (65536, torch.float16),
                                     (33024, torch.bfloat16)], ids=["128256", "262144", "65536-fp16", "33024"])
def test_ring_matches_reference(v, dtype, z_loss, cfg, device, monkeypatch):
    """The ring kernel (turned on, each launch) against the fp32 reference: per-row loss, lse and
    gradient, all poisoned first. Rows: ignored (loss and gradient 0), the target in the last
    column, a row with -inf logits, an out-of-range target (NaN loss and gradient row), a row of -inf
    only (NaN, lse -inf, as the reference). A row's bits are the same in any batch; strided
    logits take the other kernels and label smoothing is never offered to the ring."""
    _ring_gpu(device)
    launched = _count_ring(monkeypatch)
    m = 150
    x = torch.randn(m, v, dtype=dtype, device=device) * 2
    tgt = torch.randint(0, v, (m,), device=device)
    tgt[3] = -100
    tgt[7] = v - 1  # the last column (in a ragged last portion where v is not a multiple of the portion)
    tgt[8] = 0
    x[11, ::5] = float("-inf")
    tgt[11] = 1
    tgt[12] = v  # out of range
    x[13] = float("-inf")
    tgt[13] = 2

    def run(xs, ts):
        n = xs.shape[0]
        loss = torch.full((n,), float("nan"), device=device)
        lse = torch.full((n,), float("nan"), device=device)
        dx = torch.full((n, v), float("nan"), dtype=dtype, device=device)
        launch.ce_rows(xs, ts, loss, lse, dx, torch.ones((), device=device), -100, 0.0, z_loss, None, True)
        return loss, lse, dx

    with launch.use(LAUNCHES[cfg]):
        loss, lse, dx = run(x, tgt)
        loss1, lse1, dx1 = run(x[8:9].clone(), tgt[8:9].clone())
        wide = torch.randn(4, 2 * v, dtype=dtype, device=device)[:, :v]
        lw, dw = launch.ce_fwd(wide, tgt[:4], -100, 0.0, z_loss, None, "sum", True)
        ls, _ = launch.ce_fwd(x, tgt, -100, 0.1, z_loss, None, "none", True)  # smoothing: never the ring
    assert launched == [True, True, False], launched  # strided logits: the ring declines
    from kernelset.ops.common import ring_host
    assert ring_host.gluon_kernel(*launch._RING)[0].entries() >= 1  # launched directly (FastKernel), not through Triton
    assert_ring_policy_fits(launch._RING)
    want, dwant = R.fwd(x, tgt, -100, 0.0, z_loss, None, "none", True)
    lse_want = R.rows(x, tgt, -100, 0.0, z_loss, None)[1]
    ok = torch.ones(m, dtype=torch.bool, device=device)
    ok[[12, 13]] = False
    assert loss[ok].isfinite().all() and lse.isfinite()[ok].all() and dx[ok].isfinite().all()
    assert rel_err(loss[ok], want[ok]) <= 1e-5
    assert rel_err(lse[ok], lse_want[ok]) <= 1e-5
    assert rel_err(dx[ok], dwant[ok]) <= tolerance("norm", dtype)
    assert loss[3] == 0 and (dx[3] == 0).all()
    assert loss[12].isnan() and want[12].isnan() and dx[12].isnan().all()
    assert loss[13].isnan() and want[13].isnan() and lse[13] == float("-inf") == lse_want[13]
    assert torch.equal(loss1[0], loss[8]) and torch.equal(lse1[0], lse[8]) and torch.equal(dx1[0], dx[8])
    w2, dw2 = R.fwd(wide, tgt[:4], -100, 0.0, z_loss, None, "sum", True)
    assert rel_err(lw, w2) <= 1e-4 and rel_err(dw, dw2) <= tolerance("norm", dtype)
    ws, _ = R.fwd(x, tgt, -100, 0.1, z_loss, None, "none", True)
    fin = ws.isfinite()
    assert torch.equal(ls.isfinite(), fin) and rel_err(ls[fin], ws[fin]) <= 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", list(LAUNCHES))
def test_ring_through_the_api_and_linear_cross_entropy(cfg, device, monkeypatch):
    """ks.cross_entropy takes the ring kernel (explain says so) with correct gradients under a
    mean over rows with ignored ones; ks.linear_cross_entropy, whose gradient overwrites its
    logits chunk, stays correct through the ring with a ragged last portion (V = 33024)."""
    _ring_gpu(device)
    launched = _count_ring(monkeypatch)
    x = torch.randn(256, 128256, dtype=torch.bfloat16, device=device, requires_grad=True)
    tgt = torch.randint(0, 128256, (256,), device=device)
    tgt[::7] = -100
    with launch.use(LAUNCHES[cfg]):
        assert "ring kernel on sm_90" in str(ks.explain("cross_entropy", x, tgt, verbose=False))
        loss = ks.cross_entropy(x, tgt, backend="triton")
        loss.backward()
    assert launched == [True]
    xr = x.detach().float().requires_grad_()
    lr = torch.nn.functional.cross_entropy(xr, tgt)
    lr.backward()
    assert rel_err(loss, lr) <= 1e-4
    assert rel_err(x.grad, xr.grad) <= tolerance("norm", torch.bfloat16, grad=True)

    h = torch.randn(512, 1024, dtype=torch.bfloat16, device=device, requires_grad=True)
    w = (torch.randn(33024, 1024, device=device) * 0.03).to(torch.bfloat16).requires_grad_()
    t2 = torch.randint(0, 33024, (512,), device=device)
    t2[5] = 33023  # in the last portion's one valid tile
    with launch.use(LAUNCHES[cfg]):
        l2 = ks.linear_cross_entropy(h, w, t2)
        l2.backward()
    assert len(launched) > 1 and all(launched)  # the logits chunks went through the ring
    hr, wr = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    lr2 = torch.nn.functional.cross_entropy(hr @ wr.t(), t2)
    lr2.backward()
    assert rel_err(l2, lr2) <= 1e-3
    assert rel_err(h.grad, hr.grad) <= tolerance("norm", torch.bfloat16, grad=True)
    assert rel_err(w.grad, wr.grad) <= tolerance("norm", torch.bfloat16, grad=True)
