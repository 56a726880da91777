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

Probe only (not shipped): compiled for sm_90 with Triton 3.6 on the CPU machine (``--compile``);
run on a GPU it checks each form against torch in fp32 first, then times it.

Session 21 on the H200 (docs/benchmarks/2026-11-27-s21, runs 2-3), every form correct (rel err
1.7e-3, as shipped), none better where the bars are:
- RMSNorm 4096x65536: best ring 75.3% (S=2, 6 buffers, 8 warps) against the shipped 78.6%;
  1024x262144: 72.0% (S=8) against 76.7%; softmax 4096x131072: 75.7% (S=4, two per SM) against
  75.8%. More portions per row (S=4, 16) costs 15-20 points: each row's exchange is paid per
  portion, and the lookahead does not hide it (10-12 buffers measured no better than 6).
- Without an exchange (S=1, ``--ceiling``, 8192x32768): RMSNorm 88.0% against the shipped 84.6%,
  softmax 81.2% (two per SM) against 73.8%: the ring itself reads and writes at ~88% of copy.

Usage: python scripts/ring_probe.py [--compile] [--quick] [--ceiling]
"""
from __future__ import annotations

import sys

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

LOG2E = gl.constexpr(1.4426950408889634)


@gluon.jit
def _issue(desc, ring, bars, k, K, g, G, c, row_tiles, P_TILES: gl.constexpr, NCH: gl.constexpr,
           BOXR: gl.constexpr, NB: gl.constexpr):
    """TMA chunk k of this program's sequence (row g + (k // NCH) G, chunk k % NCH of portion c)."""
    j = k // NCH
    q = k % NCH
    r = g + j * G
    st = k % NB
    bar = bars.index(st)
    ok = k < K
    mbarrier.expect(bar, desc.block_type.nbytes, pred=ok)
    _tma_load(desc, [r * row_tiles + c * P_TILES + q * BOXR, 0], bar, ring.index(st), pred=ok)


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
def _ring_rows_kernel(x_desc, w_desc, Y, PART, SYNC, R, N, eps, inv_n,
                      IS_RMS: gl.constexpr, HAS_WEIGHT: gl.constexpr, S: gl.constexpr, S_P2: gl.constexpr,
                      NCH: gl.constexpr, BOXR: gl.constexpr, NB: gl.constexpr, num_warps: gl.constexpr):
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
    if HAS_WEIGHT:
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
            v = ring.index(k % NB).load(L).to(gl.float32)
            if IS_RMS:
                y = (v * rstd).to(dt)
                if HAS_WEIGHT:
                    y = (y.to(gl.float32) * wsm.index(q).load(L).to(gl.float32)).to(dt)
            else:
                y = (gl.exp2(v * LOG2E - m_c) * inv_s).to(dt)
            _cta_barrier()
            fence_async_shared()
            _issue(x_desc, ring, bars, k + NB, K, g, G, c, row_tiles, P_TILES, NCH, BOXR, NB)
            gl.store(ybase + q * CH + offs, y)
    for i in gl.static_range(NB + 1):
        mbarrier.invalidate(bars.index(i))


# ---- host ---------------------------------------------------------------------------------------


def _layout(boxr):
    return gl.NVMMASharedLayout.get_default_for([boxr, 256], gl.bfloat16)


def launch(kind, x, w, y, split, nb, warps, sms, per_sm=1, boxr=32):
    """One launch of the ring kernel over x [R, N] (contiguous bf16) into y."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    r, n = x.shape
    ch = boxr * 256
    assert n % (split * ch) == 0, (n, split, ch)
    nch = n // split // ch
    lay = _layout(boxr)
    x_desc = TensorDescriptor(x.view(-1, 256), [r * n // 256, 256], [256, 1], [boxr, 256], lay)
    w_desc = TensorDescriptor(w.view(-1, 256), [n // 256, 256], [256, 1], [boxr, 256], lay) if w is not None else x_desc
    s_p2 = triton.next_power_of_2(split)
    sync = torch.zeros(1 + r, dtype=torch.int32, device=x.device)
    part = torch.empty(r * 2 * s_p2, dtype=torch.float32, device=x.device)
    grid = (per_sm * sms // split) * split  # all resident: the launcher passes per_sm = 2 only where two fit
    _ring_rows_kernel[(grid,)](x_desc, w_desc, y, part, sync, r, n, 1e-6, 1.0 / n, IS_RMS=kind == "rms",
                               HAS_WEIGHT=kind == "rms" and w is not None, S=split, S_P2=s_p2, NCH=nch, BOXR=boxr,
                               NB=nb, num_warps=warps)


def compile_check() -> int:
    """Compile every probed configuration for sm_90 (no GPU needed): shared memory, spills."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    fn = _ring_rows_kernel
    ok = True
    for kind, n, split, nb, warps in _configs(quick=False):
        boxr = 32
        nch = n // split // (boxr * 256)
        lay = _layout(boxr)
        sig = dict(x_desc=f"tensordesc<bf16[{boxr}, 256],{lay!r}>", w_desc=f"tensordesc<bf16[{boxr}, 256],{lay!r}>",
                   Y="*bf16", PART="*fp32", SYNC="*i32", R="i32", N="i32", eps="fp32", inv_n="fp32")
        consts = dict(IS_RMS=kind == "rms", HAS_WEIGHT=kind == "rms", S=split, S_P2=triton.next_power_of_2(split),
                      NCH=nch, BOXR=boxr, NB=nb, num_warps=warps)
        full = {a: sig.get(a, "constexpr") for a in fn.arg_names}
        attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in ("Y", "PART", "SYNC", "N")}
        try:
            c = triton.compile(GluonASTSource(fn, signature=full, constexprs=consts, attrs=attrs),
                               target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))
        except Exception as exc:
            ok = False
            print(f"{kind} N={n} S={split} NB={nb} warps={warps}: {type(exc).__name__}: {str(exc)[:2000]}")
            continue
        ptx = c.asm["ptx"]
        spill = "ld.local" in ptx or "st.local" in ptx
        smem = c.metadata.shared
        ok &= not spill and smem <= 232448
        print(f"{kind} N={n} S={split} NB={nb} warps={warps}: smem {smem} B, spills {spill}, "
              f"tma {'cp.async.bulk.tensor' in ptx}, st.v4 {'st.global.v4' in ptx}")
    return 0 if ok else 1


_WIDE = (("rms", 65536, (2, 4)), ("rms", 262144, (8, 16)), ("softmax", 131072, (2, 4, 8)))
# no exchange (S = 1): what the ring itself reaches, against the shipped kernels at 32768 columns
_CEILING = (("rms", 32768, (1,)), ("softmax", 32768, (1,)))


def _configs(quick, cases=_WIDE):
    # (kind, N, split, ring buffers, warps): 16 KB chunks; RMSNorm keeps its weight portion too
    out = []
    for kind, n, splits in cases:
        for split in splits:
            portion = n // split * 2
            for nb in (6, 8, 10, 12):
                smem = nb * 16384 + (portion if kind == "rms" else 0)
                if smem > 200 * 1024 or nb * 16384 < portion:
                    continue
                for warps in (4, 8):
                    out.append((kind, n, split, nb, warps))
    if quick:
        out = [c for c in out if c[4] == 8]
    return out


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
    quick = "--quick" in sys.argv
    if "--ceiling" in sys.argv:
        shapes = {("rms", 32768): 8192, ("softmax", 32768): 8192}
        configs = _configs(quick, _CEILING)
    else:
        shapes = {("rms", 65536): 4096, ("rms", 262144): 1024, ("softmax", 131072): 4096}
        configs = _configs(quick)
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
        for kind2, n2, split, nb, warps in configs:
            if (kind2, n2) != (kind, n):
                continue
            smem = nb * 16384 + (n // split * 2 if kind == "rms" else 0)
            for per_sm in ((1, 2) if smem <= 110 * 1024 else (1,)):
                label = f"ring S={split} NB={nb} warps={warps} {per_sm}/SM"
                try:
                    y.fill_(float("nan"))
                    launch(kind, x, w, y, split, nb, warps, sms, per_sm)
                    torch.cuda.synchronize()
                    e = err(y)
                    if not e < 1e-2:
                        rows.append((label + " WRONG", float("inf"), e))
                        continue
                    rows.append((label, cuda_time_ms(lambda: launch(kind, x, w, y, split, nb, warps, sms, per_sm)), e))
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
