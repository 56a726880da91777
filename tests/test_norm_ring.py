"""The RMSNorm ring forward (``ops/norm/ring_sm90.py``, sm_90, Gluon): its policy, the host side
of its launch on any machine, an sm_90 compile, and on the GPU against the reference."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import kernelset as ks
from kernelset.core.tolerance import rel_err, tolerance
from kernelset.ops.norm import policy
from kernelset.ops.norm.reference import rms_norm_ref


def test_ring_policy_widths_dtypes_and_bandwidth_class():
    """The ring forward runs for 2-byte rows of 32768..98304 columns in 16384-column portions, on
    GPUs of H200-class bandwidth per SM only (36 GB/s per SM there, 25 on the H100), and is off at 0."""
    t = policy.DEFAULT_TUNING
    rp = policy.ring_fwd_policy(65536, 2, 36.4, t)
    assert (rp.split, rp.split_p2, rp.chunks, rp.box_rows, rp.buffers, rp.num_warps) == (4, 4, 8, 8, 9, 4)
    assert policy.ring_fwd_policy(32768, 2, 36.4, t).split == 2
    assert policy.ring_fwd_policy(49152, 2, 36.4, t).split == 3
    assert policy.ring_fwd_policy(98304, 2, 36.4, t).split_p2 == 8
    for n in (16384, 24576, 65536 + 256, 114688, 131072, 262144):
        assert policy.ring_fwd_policy(n, 2, 36.4, t) is None, n
    assert policy.ring_fwd_policy(65536, 4, 36.4, t) is None  # fp32 rows
    assert policy.ring_fwd_policy(65536, 2, 25.4, t) is None  # the H100's class
    assert policy.ring_fwd_policy(65536, 2, 36.4, dataclasses.replace(t, ring_min_gbs_per_sm=0)) is None


def test_ring_choice_needs_sm90_cuda(device):
    """Off the GPU (and on any arch but sm_90) no ring launch is chosen, and explain names the
    forward that runs instead."""
    from kernelset.ops.norm import launch as L
    if device.type != "cuda":
        assert L.ring_fwd_choice(65536, torch.bfloat16, device, policy.DEFAULT_TUNING) is None
        x = torch.randn(2, 65536, dtype=torch.bfloat16, device=device)
        text = str(ks.explain("rms_norm", x, torch.ones(65536, dtype=torch.bfloat16, device=device)))
        assert "ring forward" not in text


_RING_AOT = r"""
import json, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from kernelset.ops.norm import ring_sm90 as K
from kernelset.ops.norm.policy import NormTuning, ring_fwd_policy

out = []
fn = K._rms_ring_fwd_kernel
for n, dt, w, gemma, stats in ((65536, "bf16", True, False, True), (65536, "fp16", False, False, False),
                               (49152, "bf16", True, True, False)):
    rp = ring_fwd_policy(n, 2, 36.0, NormTuning())
    lay = gl.NVMMASharedLayout.get_default_for([rp.box_rows, 256], gl.bfloat16 if dt == "bf16" else gl.float16)
    sig = dict(x_desc=f"tensordesc<{dt}[{rp.box_rows}, 256],{lay!r}>", W=f"*{dt}" if w else None, Y=f"*{dt}",
               RSTD="*fp32" if stats else None, PART="*fp32", SYNC="*i32", R="i32", N="i32", eps="fp32",
               offset="fp32")
    consts = dict(HAS_WEIGHT=w, GEMMA_CAST=gemma, STORE_STATS=stats, S=rp.split, S_P2=rp.split_p2, NCH=rp.chunks,
                  BOXR=rp.box_rows, NB=rp.buffers, num_warps=rp.num_warps)
    consts.update({a: None for a, t in sig.items() if t is None})
    full = {a: sig.get(a) or "constexpr" for a in fn.arg_names}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a, t in sig.items()
             if t is not None and (t.startswith("*") or a == "N")}
    c = triton.compile(GluonASTSource(fn, signature=full, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=dict(num_warps=rp.num_warps))
    ptx = c.asm["ptx"]
    out.append(dict(case=f"{n}-{dt}-w{int(w)}-g{int(gemma)}-s{int(stats)}", local="ld.local" in ptx or "st.local" in ptx,
                    vec="st.global.v4" in ptx, tma="cp.async.bulk.tensor" in ptx, smem=c.metadata.shared,
                    acquire="ld.global.gpu.acquire" in ptx, per_sm=rp.programs_per_sm))
print(json.dumps(out))
"""


def test_ring_kernel_compiles_for_sm90():
    """The ring forward compiles for sm_90 with this machine's Triton (Gluon): TMA loads, 16-byte
    stores of y, the row's count polled with acquire loads, no spills, and the shared memory of
    the policy's programs per SM fits an SM's 228 KB (1 KB reserved per program)."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from aot import compile_report

    for r in compile_report(_RING_AOT, 3):
        assert r["tma"] and r["acquire"], r
        assert r["per_sm"] * (r["smem"] + 1024) <= 228 * 1024, r


def _ring_on(dev) -> bool:
    from kernelset.ops.norm import launch as L
    return dev.type == "cuda" and L.ring_fwd_choice(65536, torch.bfloat16, dev, _RING_ANY_GPU) is not None


# the ring wherever it compiles (an H100 too): the bandwidth class only decides where it is faster
_RING_ANY_GPU = dataclasses.replace(policy.DEFAULT_TUNING, ring_min_gbs_per_sm=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("form", ["llama", "gemma_offset", "no_weight"])
def test_ring_forward_matches_reference(dtype, form, device):
    """The ring forward (forced on any sm_90 GPU) against the fp32 reference, y and rstd, outputs
    poisoned first; a row's result is the same bits whatever the batch it is in; strided rows
    take the other forward."""
    from kernelset.ops.norm import launch as L
    if not _ring_on(device):
        pytest.skip("the ring forward needs an sm_90 GPU with Gluon")
    m, n = 300, 65536
    x = torch.randn(m, n, dtype=dtype, device=device)
    w = None if form == "no_weight" else torch.randn(n, dtype=dtype, device=device)
    offset = 1.0 if form == "gemma_offset" else 0.0
    gemma = form == "gemma_offset"
    launched = []
    real = L._ring_fwd

    def spy(*a, **k):
        ok = real(*a, **k)
        launched.append(ok)
        return ok

    L._ring_fwd = spy
    kw = dict(eps=1e-6, offset=offset, is_rms=True, gemma_cast=gemma)
    try:
        with policy.use(_RING_ANY_GPU):
            y = torch.full_like(x, float("nan"))
            _, _, _, rstd = L.norm_fwd(x, w, None, out=y, stats=True, **kw)
            one = L.norm_fwd(x[7:8].clone(), w, None, stats=False, **kw)[0]
            wide = torch.randn(4, 2 * n, dtype=dtype, device=device)[:, :n]  # strided rows
            ys = L.norm_fwd(wide, w, None, stats=False, **kw)[0]
    finally:
        L._ring_fwd = real
    assert launched == [True, True, False], launched
    from aot import assert_ring_policy_fits
    assert_ring_policy_fits(L._RING)
    want, want_rstd = rms_norm_ref(x, w, 1e-6, offset, gemma)
    assert not y.isnan().any() and not rstd.isnan().any()
    assert rel_err(y, want) <= tolerance("norm", dtype), rel_err(y, want)
    assert torch.allclose(rstd, want_rstd.reshape(rstd.shape), rtol=1e-5, atol=0)
    assert torch.equal(one[0], y[7])
    assert rel_err(ys, rms_norm_ref(wide, w, 1e-6, offset, gemma)[0]) <= tolerance("norm", dtype)


@pytest.mark.gpu
def test_ring_forward_through_the_api_and_autograd(device):
    """``ks.rms_norm`` takes the ring forward where the policy says so, and its saved rstd feeds
    the backward: gradients match the reference."""
    if not _ring_on(device):
        pytest.skip("the ring forward needs an sm_90 GPU with Gluon")
    m, n = 64, 49152
    x = torch.randn(m, n, dtype=torch.bfloat16, device=device, requires_grad=True)
    w = torch.randn(n, dtype=torch.bfloat16, device=device, requires_grad=True)
    dy = torch.randn(m, n, dtype=torch.bfloat16, device=device)
    with policy.use(_RING_ANY_GPU):
        assert "ring forward" in str(ks.explain("rms_norm", x, w))
        y = ks.rms_norm(x, w, backend="triton")
        y.backward(dy)
    xr, wr = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    yr = rms_norm_ref(xr, wr, 1e-6, 0.0, False)[0]
    yr.backward(dy.float())
    assert rel_err(y, yr) <= tolerance("norm", torch.bfloat16)
    assert rel_err(x.grad, xr.grad) <= tolerance("norm", torch.bfloat16, grad=True)
    assert rel_err(w.grad, wr.grad) <= tolerance("norm", torch.bfloat16, grad=True)


def test_ring_launch_args(monkeypatch):
    """The ring launch's host side on any machine: x seen as [rows * n / 256, 256] in chunks of
    [8, 256], one group of S programs per row up to the programs that fit at once; strided or
    misaligned rows, and the two-launch form, get no ring launch."""
    pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from kernelset.core.tuning import ring_launch
    from kernelset.ops.common import ring_host
    monkeypatch.setattr(ring_host, "launches", lambda dev, m, nslot, p2: ((0, ("sync", m), ("part", m * nslot * p2)),))
    rp = ring_launch(65536, 16384, 8, 9, 4, 6)
    x = torch.randn(10, 65536, dtype=torch.bfloat16)
    grid, desc, sync, part = ring_host.launch_args(x, 10, 65536, 1, rp, 132)
    assert grid == (40,) and sync == ("sync", 10) and part == ("part", 40)
    assert list(desc.shape) == [2560, 256] and list(desc.block_shape) == [8, 256]
    big = torch.empty(1000, 65536, dtype=torch.bfloat16)
    assert ring_host.launch_args(big, 1000, 65536, 1, rp, 132)[0] == ((6 * 132 // 4) * 4,)
    assert ring_host.launch_args(torch.randn(10, 2 * 65536, dtype=torch.bfloat16)[:, :65536], 10, 65536, 1, rp, 132) is None
    flat = torch.randn(10 * 65536 + 1, dtype=torch.bfloat16)[1:].view(10, 65536)  # 2 bytes off alignment
    assert ring_host.launch_args(flat, 10, 65536, 1, rp, 132) is None
    monkeypatch.setattr(ring_host, "launches", lambda dev, m, nslot, p2: ((1, None, None), (2, None, None)))
    assert ring_host.launch_args(x, 10, 65536, 1, rp, 132) is None


def test_ring_grid_follows_what_the_compiled_kernel_fits(monkeypatch):
    """Programs per SM from a compiled kernel's registers and shared memory (sm_90: 64K registers
    allocated per warp in units of 256, 228 KB), never above the policy's; after a launch the
    grid of that kernel, launch, dtype and specialization keeps every group resident."""
    pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from types import SimpleNamespace as NS
    from kernelset.core.tuning import ring_launch
    from kernelset.ops.common import ring_host

    def compiled(regs, shared):
        return NS(n_regs=regs, metadata=NS(shared=shared))

    assert ring_host.resident(compiled(80, 73888), 8, 3) == 3  # the H100 cross-entropy launch, Triton 3.6
    assert ring_host.resident(compiled(128, 73888), 8, 3) == 2  # the same under Triton 3.9
    assert ring_host.resident(compiled(80, 37008), 4, 6) == 6  # the H200 launch, Triton 3.6
    assert ring_host.resident(compiled(144, 37008), 4, 6) == 3  # ... under Triton 3.9
    assert ring_host.resident(compiled(81, 37008), 4, 6) == 5  # 81 registers are allocated as 88
    assert ring_host.resident(compiled(40, 80000), 4, 6) == 2  # shared memory bounds it
    assert ring_host.resident(compiled(40, 1000), 4, 6) == 6  # never above the policy
    assert ring_host.resident(None, 4, 6) == 6 and ring_host.resident(NS(n_regs=None), 4, 6) == 6  # unknown: the policy

    class Lazy:  # a compiled kernel whose attributes fail to load
        @property
        def n_regs(self):
            raise RuntimeError("no driver")

    assert ring_host.resident(Lazy(), 4, 6) == 6

    monkeypatch.setattr(ring_host, "launches", lambda dev, m, nslot, p2: ((0, ("sync", m), ("part", m * nslot * p2)),))
    monkeypatch.setattr(ring_host, "_RESIDENT", {})
    ref = ("some.module", "kernel")
    fake = NS(last=compiled(144, 37008))
    monkeypatch.setattr(ring_host, "gluon_kernel", lambda mod, name: (fake, None))
    rp = ring_launch(65536, 16384, 8, 9, 4, 6)
    big = torch.empty(1000, 65536, dtype=torch.bfloat16)
    assert ring_host.launch_args(big, 1000, 65536, 1, rp, 132, ref, (True,))[0] == (6 * 132 // 4 * 4,)
    ring_host.learn(ref, rp, torch.bfloat16, (True,))
    assert ring_host.launch_args(big, 1000, 65536, 1, rp, 132, ref, (True,))[0] == (3 * 132 // 4 * 4,)
    assert ring_host.launch_args(big, 1000, 65536, 1, rp, 132, ref, (False,))[0] == (6 * 132 // 4 * 4,)  # another specialization
    fake.last = compiled(40, 1000)
    ring_host.learn(ref, rp, torch.bfloat16, (True,))  # learned once per key
    assert ring_host.launch_args(big, 1000, 65536, 1, rp, 132, ref, (True,))[0] == (3 * 132 // 4 * 4,)


def test_ring_launcher_binds_the_kernel_signature(monkeypatch):
    """norm_fwd down to the ring kernel's launch on any machine (an sm_90 H200 and the kernel
    stood in for): every kernel parameter gets the right tensor or value, by name."""
    pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from kernelset.ops.common import ring_host
    from kernelset.ops.norm import launch as L
    from kernelset.ops.norm import ring_sm90 as K
    calls = []
    monkeypatch.setattr(ring_host, "gluon_kernel", lambda mod, name: (lambda grid, *a, **kw: calls.append((grid, a, kw)), None))
    monkeypatch.setattr(ring_host, "on_sm90", lambda device, arch=None: True)
    monkeypatch.setattr(L, "device_gbs_per_sm", lambda device: 36.0)
    sync, part = torch.zeros(4, dtype=torch.int32), torch.empty(12)
    monkeypatch.setattr(ring_host, "launches", lambda dev, m, nslot, p2: ((0, sync, part),))
    x = torch.randn(3, 49152, dtype=torch.bfloat16)
    w = torch.randn(49152, dtype=torch.bfloat16)
    y, _, _, rstd = L.norm_fwd(x, w, None, eps=1e-5, offset=1.0, is_rms=True, gemma_cast=True, stats=True)
    (grid, args, kw), = calls
    bound = dict(zip(K._rms_ring_fwd_kernel.arg_names, args), **kw)
    assert set(bound) == set(K._rms_ring_fwd_kernel.arg_names)
    assert bound["x_desc"].base.data_ptr() == x.data_ptr() and bound["W"] is w and bound["Y"] is y
    assert bound["RSTD"] is rstd and bound["PART"] is part and bound["SYNC"] is sync
    assert (bound["R"], bound["N"], bound["eps"], bound["offset"]) == (3, 49152, 1e-5, 1.0)
    assert (bound["HAS_WEIGHT"], bound["GEMMA_CAST"], bound["STORE_STATS"]) == (True, True, True)
    assert (bound["S"], bound["S_P2"], bound["NCH"], bound["BOXR"], bound["NB"], bound["num_warps"]) == (3, 4, 8, 8, 9, 4)
    assert grid == (9,)  # 3 rows, a group of 3 programs each (4 "SMs" off the GPU x 6 would allow 8 groups)
