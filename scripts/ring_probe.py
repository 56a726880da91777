"""Rows held in shared memory: a Gluon (sm_90) form of the wide-row RMSNorm / softmax forwards,
probed against the shipped kernels on the shapes that miss their bars on the H200 (RMSNorm
4096x65536 and 1024x262144: 78%; softmax 4096x131072: 77%).

Why: on the H200 the HBM delivers about what the L2 does (copy 4.23 TB/s against ~5-6 TB/s of
L2 reads), so every byte that crosses L2 twice costs. The shipped forms either re-read the row
from L2 (looped: x twice, w once, y once = 4 units for 2 useful) or hold a chunk in registers
and wait at a cross-program barrier with nothing in flight (split: 70-78%); a register-held
prefetch of the next row (``split_pipeline_probe.py``, session 21) measured 63-75%.

Here the row never leaves the SM and loads never stop:
- ``S`` programs share a row (a portion of ``P = N / S`` elements each) and walk rows
  g, g + G, ... together (group g from a ticket taken in start order, as ``rowsync.claim``);
- the portion arrives by TMA in chunks of ``[BOXR, 256]`` into a ring of ``NB`` shared-memory
  buffers, issued ``NB`` chunks ahead; the weight portion (RMSNorm) is loaded once per program
  into shared memory, so L2 sees x once, y once and nothing else per row;
- statistics pass over the ring (sum of squares, or max and sum of exponentials), partials
  exchanged through global memory as rowsync does (S > 1), output pass over the ring, each chunk
  freed to the TMA for the chunk ``NB`` ahead as soon as the CTA is done reading it. While a
  program waits at a row's barrier, ``NB - P / CH`` chunks of its next row are in flight.

Shipped for RMSNorm rows of 32768-98304 columns on H200-class GPUs (``ops/norm/ring_sm90.py``,
session 21); the probe keeps the other forms. Compiled for sm_90 with Triton 3.6 on the CPU machine (``--compile``);
run on a GPU it checks each form against torch in fp32 first, then times it.

Session 21 (docs/benchmarks/2026-11-27-s21), every form correct (rel err 1.7e-3, as shipped).
The first form (runs 2-3, H200: weight on chip, one program per SM) was no better:
- RMSNorm 4096x65536: best ring 75.3% (S=2, 6 buffers, 8 warps) against the shipped 78.6%;
  1024x262144: 72.0% (S=8) against 76.7%; softmax 4096x131072: 75.7% (S=4, two per SM) against
  75.8%. More portions per row (S=4, 16) costs 15-20 points: each row's exchange is paid per
  portion, and the lookahead does not hide it (10-12 buffers measured no better than 6).
- Without an exchange (S=1, ``--ceiling``, 8192x32768): RMSNorm 88.0% against the shipped 84.6%,
  softmax 81.2% (two per SM) against 73.8%: the ring itself reads and writes at ~88% of copy.
What made it win (runs 4-6, H200) was occupancy: the weight from L2 instead of shared memory and
smaller rings, so 5-6 programs share an SM (RMSNorm 65536: 75 -> 87%), then each chunk freed to
the TMA before the output math (89.4%). Best forms, H200 / H100 (run 7) against the shipped
kernels: RMSNorm 4096x65536 89.4 / 93.7% (78.9 / 93.5%), 1024x262144 81.0 / 87.1% (76.8 / 89.7%),
softmax 4096x131072 81.8 / 92.5% (77.1 / 91.1%).

Usage: python scripts/ring_probe.py [--compile] [--quick] [--ceiling]
"""
from __future__ import annotations

import sys

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from kernelset.ops.ring_sm90 import issue_chunk as _issue

_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

LOG2E = gl.constexpr(1.4426950408889634)


# the TMA issue of a chunk is the shipped kernels' (ops/ring_sm90.py, from this probe)


@gluon.jit
def _exchange(PART, SYNC, r, c, a, b, S: gl.constexpr, S_P2: gl.constexpr, NSLOT: gl.constexpr,
              v_layout: gl.constexpr):
    """Publish this portion's partials (a, b) of row r, wait for the row's S programs, return every
    portion's partials as two [S_P2] vectors (portions past S read as 0)."""
    base = PART + r * (2 * S_P2) + c
    gl.atomic_xchg(base, a, sem="relaxed", scope="gpu")
    if NSLOT > 1:
        gl.atomic_xchg(base + S_P2, b, sem="relaxed", scope="gpu")
    gl.atomic_add(SYNC + 1 + r, 1, sem="release", scope="gpu")
    n = gl.atomic_add(SYNC + 1 + r, 0, sem="acquire", scope="gpu")
    while n < S:
        n = gl.atomic_add(SYNC + 1 + r, 0, sem="acquire", scope="gpu")
    i = gl.arange(0, S_P2, layout=v_layout)
    ok = i < S
    pa = gl.load(PART + r * (2 * S_P2) + i, mask=ok, other=0.0, volatile=True)
    pb = pa
    if NSLOT > 1:
        pb = gl.load(PART + r * (2 * S_P2) + S_P2 + i, mask=ok, other=0.0, volatile=True)
    return pa, pb


@gluon.jit
def _ring_rows_kernel(x_desc, w_desc, W, Y, PART, SYNC, R, N, eps, inv_n,
                      IS_RMS: gl.constexpr, HAS_WEIGHT: gl.constexpr, W_SMEM: gl.constexpr, S: gl.constexpr, S_P2: gl.constexpr,
                      NCH: gl.constexpr, BOXR: gl.constexpr, NB: gl.constexpr, EARLY_FREE: gl.constexpr,
                      num_warps: gl.constexpr):
    # one chunk = [BOXR, 256] elements; a portion = NCH chunks; a row = S portions
    CH: gl.constexpr = BOXR * 256
    P_TILES: gl.constexpr = NCH * BOXR
    L: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[1, 32],
                                       warps_per_cta=[num_warps, 1], order=[1, 0])
    V: gl.constexpr = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[num_warps],
                                       order=[0])
    dt: gl.constexpr = x_desc.dtype
    row_tiles = N // 256

    t = gl.atomic_add(SYNC, 1, sem="relaxed", scope="gpu")
    G = gl.num_programs(0) // S
    g = t // S
    c = t % S
    n_my = gl.maximum((R - g + G - 1) // G, 0)
    K = n_my * NCH

    bars = gl.allocate_shared_memory(gl.int64, [NB + 1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NB + 1):
        mbarrier.init(bars.index(i), count=1)
    ring = gl.allocate_shared_memory(dt, [NB, BOXR, 256], x_desc.layout)
    fence_async_shared()
    for i in gl.static_range(NB):
        _issue(x_desc, ring, bars, i, K, g, G, c, row_tiles, P_TILES, NCH, BOXR, NB)
    if HAS_WEIGHT and W_SMEM:
        wsm = gl.allocate_shared_memory(dt, [NCH, BOXR, 256], w_desc.layout)
        wbar = bars.index(NB)
        mbarrier.expect(wbar, NCH * w_desc.block_type.nbytes)
        for q in gl.static_range(NCH):
            _tma_load(w_desc, [c * P_TILES + q * BOXR, 0], wbar, wsm.index(q))
        mbarrier.wait(wbar, 0)

    ri = gl.arange(0, BOXR, layout=gl.SliceLayout(1, L))
    ci = gl.arange(0, 256, layout=gl.SliceLayout(0, L))
    offs = ri[:, None] * 256 + ci[None, :]
    for j in range(n_my):
        r = g + j * G
        # statistics over the portion
        if IS_RMS:
            acc = gl.zeros([BOXR, 256], gl.float32, L)
            for q in gl.static_range(NCH):
                k = j * NCH + q
                mbarrier.wait(bars.index(k % NB), (k // NB) & 1)
                v = ring.index(k % NB).load(L).to(gl.float32)
                acc += v * v
            ssq = gl.sum(gl.sum(acc, axis=1), axis=0)
            if S > 1:
                pa, pb = _exchange(PART, SYNC, r, c, ssq, ssq, S, S_P2, 1, V)
                ssq = gl.sum(pa, axis=0)
            rstd = gl.rsqrt(ssq * inv_n + eps)
        else:
            m_run = gl.full([BOXR, 256], float("-inf"), gl.float32, L)
            s_run = gl.zeros([BOXR, 256], gl.float32, L)
            for q in gl.static_range(NCH):
                k = j * NCH + q
                mbarrier.wait(bars.index(k % NB), (k // NB) & 1)
                v = ring.index(k % NB).load(L).to(gl.float32) * LOG2E
                m_new = gl.maximum(m_run, v)
                s_run = s_run * gl.exp2(m_run - m_new) + gl.exp2(v - m_new)
                m_run = m_new
            m_c = gl.max(gl.max(m_run, axis=1), axis=0)
            s_c = gl.sum(gl.sum(s_run * gl.exp2(m_run - m_c), axis=1), axis=0)
            if S > 1:
                pm, ps = _exchange(PART, SYNC, r, c, m_c, s_c, S, S_P2, 2, V)
                pm = gl.where(gl.arange(0, S_P2, layout=V) < S, pm, float("-inf"))
                m_c = gl.max(pm, axis=0)
                s_c = gl.sum(ps * gl.exp2(pm - m_c), axis=0)
            inv_s = 1.0 / s_c
        # output pass; each chunk goes back to the TMA once every warp has read it
        ybase = Y + r.to(gl.int64) * N + c * (NCH * CH)
        for q in gl.static_range(NCH):
            k = j * NCH + q
            xv = ring.index(k % NB).load(L)
            if EARLY_FREE:  # the chunk is in registers: free its buffer before any other load
                _cta_barrier()
                fence_async_shared()
                _issue(x_desc, ring, bars, k + NB, K, g, G, c, row_tiles, P_TILES, NCH, BOXR, NB)
            v = xv.to(gl.float32)
            if IS_RMS:
                y = (v * rstd).to(dt)
                if HAS_WEIGHT:
                    if W_SMEM:
                        wv = wsm.index(q).load(L)
                    else:  # from L2 (L1 holds little next to the ring)
                        wv = gl.load(W + c * (NCH * CH) + q * CH + offs)
                    y = (y.to(gl.float32) * wv.to(gl.float32)).to(dt)
            else:
                y = (gl.exp2(v * LOG2E - m_c) * inv_s).to(dt)
            if not EARLY_FREE:
                _cta_barrier()
                fence_async_shared()
                _issue(x_desc, ring, bars, k + NB, K, g, G, c, row_tiles, P_TILES, NCH, BOXR, NB)
            gl.store(ybase + q * CH + offs, y)
    for i in gl.static_range(NB + 1):
        mbarrier.invalidate(bars.index(i))


# ---- host ---------------------------------------------------------------------------------------


def _layout(boxr):
    return gl.NVMMASharedLayout.get_default_for([boxr, 256], gl.bfloat16)


def _args(kind, x, w, y, split, boxr, w_smem):
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    r, n = x.shape
    ch = boxr * 256
    assert n % (split * ch) == 0, (n, split, ch)
    lay = _layout(boxr)
    x_desc = TensorDescriptor(x.view(-1, 256), [r * n // 256, 256], [256, 1], [boxr, 256], lay)
    w_desc = TensorDescriptor(w.view(-1, 256), [n // 256, 256], [256, 1], [boxr, 256], lay) if w is not None else x_desc
    s_p2 = triton.next_power_of_2(split)
    sync = torch.zeros(1 + r, dtype=torch.int32, device=x.device)
    part = torch.empty(r * 2 * s_p2, dtype=torch.float32, device=x.device)
    args = (x_desc, w_desc, w, y, part, sync, r, n, 1e-6, 1.0 / n)
    consts = dict(IS_RMS=kind == "rms", HAS_WEIGHT=kind == "rms" and w is not None, W_SMEM=w_smem, S=split,
                  S_P2=s_p2, NCH=n // split // ch, BOXR=boxr)
    return args, consts


def occupancy(kernel, warps) -> int:
    """Programs of this compiled kernel one SM holds at once (shared memory, registers, warps)."""
    smem = kernel.metadata.shared + 1024  # the driver reserves 1 KB per block
    by_smem = (228 * 1024) // smem
    by_regs = 65536 // max(1, getattr(kernel, "n_regs", 0) * 32 * warps)  # n_regs: once loaded on a GPU
    return max(1, min(by_smem, by_regs, 64 // warps))


def launch(kind, x, w, y, split, nb, warps, sms, per_sm=1, w_smem=True, boxr=32, early=False):
    """One launch of the ring kernel over x [R, N] (contiguous bf16) into y: per_sm programs per SM
    (the caller passes no more than fit: the groups of a persistent launch should all be resident).
    Returns the compiled kernel."""
    args, consts = _args(kind, x, w, y, split, boxr, w_smem)
    grid = (per_sm * sms // split) * split
    return _ring_rows_kernel[(grid,)](*args, NB=nb, EARLY_FREE=early, num_warps=warps, **consts)


def compile_check() -> int:
    """Compile every probed configuration for sm_90 (no GPU needed): shared memory, spills."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    fn = _ring_rows_kernel
    ok = True
    for kind, n, split, boxr, nb, warps, w_smem, early in _configs(_WIDE + _CEILING):
        nch = n // split // (boxr * 256)
        lay = _layout(boxr)
        sig = dict(x_desc=f"tensordesc<bf16[{boxr}, 256],{lay!r}>", w_desc=f"tensordesc<bf16[{boxr}, 256],{lay!r}>",
                   W="*bf16", Y="*bf16", PART="*fp32", SYNC="*i32", R="i32", N="i32", eps="fp32", inv_n="fp32")
        consts = dict(IS_RMS=kind == "rms", HAS_WEIGHT=kind == "rms", W_SMEM=w_smem, S=split,
                      S_P2=triton.next_power_of_2(split), NCH=nch, BOXR=boxr, NB=nb, EARLY_FREE=early,
                      num_warps=warps)
        full = {a: sig.get(a, "constexpr") for a in fn.arg_names}
        attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in ("W", "Y", "PART", "SYNC", "N")}
        label = f"{kind} N={n} S={split} box={boxr} NB={nb} warps={warps} w_smem={w_smem} early={early}"
        try:
            c = triton.compile(GluonASTSource(fn, signature=full, constexprs=consts, attrs=attrs),
                               target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))
        except Exception as exc:
            ok = False
            print(f"{label}: {type(exc).__name__}: {str(exc)[:2000]}")
            continue
        ptx = c.asm["ptx"]
        spill = "ld.local" in ptx or "st.local" in ptx
        ok &= not spill and c.metadata.shared <= 232448
        print(f"{label}: smem {c.metadata.shared} B, {occupancy(c, warps)}/SM by smem, spills {spill}, "
              f"tma {'cp.async.bulk.tensor' in ptx}")
    return 0 if ok else 1


# (kind, N, S, chunk rows of 256, ring buffers, warps, weight in shared memory): RMSNorm reads its
# weight from L2 unless w_smem (session 21, run 4: two programs per SM with w from L2 beat one
# with w on chip by 9 points at 65536)
_BEST = (  # session 21 run 5's best forms (the buffer freed after the output's stores)
    [("rms", 65536, 4, 16, 5, 8, False), ("rms", 65536, 4, 8, 10, 8, False), ("rms", 262144, 16, 16, 5, 8, False),
     ("softmax", 131072, 4, 16, 9, 8, False), ("softmax", 131072, 8, 16, 6, 8, False)]
)
_WIDE = (
    [c + (e,) for c in _BEST for e in (False, True)]
    + [("rms", 65536, 8, 8, 5, 8, False, True), ("rms", 65536, 8, 8, 6, 4, False, True),
       ("rms", 65536, 4, 8, 9, 4, False, True), ("rms", 65536, 4, 16, 5, 4, False, True),
       ("rms", 262144, 32, 8, 5, 8, False, True), ("rms", 262144, 16, 8, 9, 4, False, True),
       ("softmax", 131072, 8, 8, 9, 8, False, True), ("softmax", 131072, 4, 16, 9, 4, False, True)]
)
# no exchange (S = 1): what the ring itself reaches, against the shipped kernels at 32768 columns
_CEILING = (
    [("rms", 32768, 1, b, nb, 8, False, e) for b, nb in ((32, 6), (16, 9)) for e in (False, True)]
    + [("softmax", 32768, 1, b, nb, 8, False, e) for b, nb in ((16, 10), (16, 9)) for e in (False, True)]
)


def _configs(cases):
    # the ring holds a whole portion of whole chunks
    return [c for c in cases if c[4] * c[3] * 256 >= c[1] // c[2] and (c[1] // c[2]) % (c[3] * 256) == 0]


def main() -> int:
    if "--compile" in sys.argv:
        return compile_check()
    import torch
    from kernelset.bench.timing import copy_bandwidth_gbs, cuda_time_ms
    import kernelset as ks
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    copy = copy_bandwidth_gbs(dev)
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, Triton {triton.__version__}, "
          f"copy {copy:.0f} GB/s, {sms} SMs")
    if "--ceiling" in sys.argv:
        shapes = {("rms", 32768): 8192, ("softmax", 32768): 8192}
        configs = _configs(_CEILING)
    else:
        shapes = {("rms", 65536): 4096, ("rms", 262144): 1024, ("softmax", 131072): 4096}
        configs = _configs(_WIDE)
    for (kind, n), r in shapes.items():
        x = torch.randn(r, n, dtype=torch.bfloat16, device=dev)
        w = torch.randn(n, dtype=torch.bfloat16, device=dev) if kind == "rms" else None
        y = torch.empty_like(x)
        if kind == "rms":
            xf = x.float()
            want = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype).float() * w.float()
            del xf
            shipped = lambda: ks.rms_norm(x, w)  # noqa: E731
        else:
            want = torch.softmax(x.float(), -1)
            shipped = lambda: ks.softmax(x)  # noqa: E731
        nbytes = 2 * x.numel() * x.element_size()
        err = lambda out: ((out.float() - want).norm() / want.norm()).item()  # noqa: E731
        rows = [("shipped", cuda_time_ms(shipped), err(shipped()))]
        for kind2, n2, split, boxr, nb, warps, w_smem, early in configs:
            if (kind2, n2) != (kind, n):
                continue
            label = (f"ring S={split} chunk {boxr}x256 NB={nb} warps={warps}" + (" w on chip" if w_smem else "")
                     + (" early free" if early else ""))
            try:
                # one program per SM first (all resident whatever the kernel), then as many as fit
                k = launch(kind, x, w, y, split, nb, warps, sms, 1, w_smem, boxr, early)
                torch.cuda.synchronize()
                fit = occupancy(k, warps)
                for per_sm in sorted({1, fit}):
                    lab = f"{label} {per_sm}/SM (regs {k.n_regs}, smem {k.metadata.shared // 1024} KB)"
                    y.fill_(float("nan"))
                    launch(kind, x, w, y, split, nb, warps, sms, per_sm, w_smem, boxr, early)
                    torch.cuda.synchronize()
                    e = err(y)
                    if not e < 1e-2:
                        rows.append((lab + " WRONG", float("inf"), e))
                        continue
                    rows.append((lab, cuda_time_ms(
                        lambda: launch(kind, x, w, y, split, nb, warps, sms, per_sm, w_smem, boxr, early)), e))
            except Exception as exc:
                print(f"  {label}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
        print(f"\n{kind} {r}x{n} bf16 (% of copy, x read once + y written once; rel err vs fp32):")
        for label, ms, e in sorted(rows, key=lambda t: t[1]):
            pct = nbytes / ms / 1e6 / copy * 100 if ms != float("inf") else 0.0
            print(f"  {pct:5.1f}%  {ms * 1e3:8.1f} us  err {e:.1e}  {label}")
        del x, y, want
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
