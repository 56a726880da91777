"""Experiment: wide-row kernels that keep the head of each row in registers between their two passes.

The looped kernels (one persistent program walks a row twice: statistics, then output) lose to
L2 misses on the second pass when the rows in flight outgrow L2; the split kernels (ops/rowsync.py)
read once but pay four L2 round trips per chunk. Here a program loads the first HOLD columns of its
row as one tensor, keeps them (bf16) in registers through both passes, and walks only the tail
twice, in reverse in pass 2 so the newest chunks come first. With one or two programs per SM the
tail of every row in flight fits L2 with room to spare.

    python scripts/hold_tune.py [--quick]       # GPU: sweep against the production kernels
    python scripts/hold_tune.py --ptxas         # CPU: registers/spills per variant for sm_90 (Triton 3.6 venv)

Every variant is checked against an fp32 torch computation before it is timed. The kernels here
are stripped down for the experiment (the cross-entropy one takes valid targets only: no ignore
index, smoothing, softcap or z-loss). Session 13 (docs/benchmarks, runs 1, 12-13): cross-entropy
85.0% of copy against 81.6%, but the same idea inside the production kernel, with every option, lost
to the looped kernel everywhere; softmax and RMSNorm lost here already.
"""
from __future__ import annotations

import itertools
import sys

import triton
import triton.language as tl

_LOG2E = 1.4426950408889634


@triton.jit
def _max_sumexp(x_row, head, N, n_tail, HOLD: tl.constexpr, BLOCK: tl.constexpr):
    """Pass 1 of the row: (max, sum of exp(x - max)) over the held head, then online over the tail
    chunks, the next chunk's load in flight while this one reduces."""
    cols0 = tl.arange(0, BLOCK)
    x_next = tl.load(x_row + HOLD + cols0, mask=HOLD + cols0 < N, other=-float("inf"), eviction_policy="evict_last")
    zh = head.to(tl.float32)
    m = tl.max(zh, axis=0)
    s = tl.sum(tl.exp2((zh - m) * 1.4426950408889634), axis=0)
    for i in range(0, n_tail):
        cols = HOLD + i * BLOCK + cols0
        z = x_next.to(tl.float32)
        x_next = tl.load(x_row + cols + BLOCK, mask=cols + BLOCK < N, other=-float("inf"), eviction_policy="evict_last")
        m_new = tl.maximum(m, tl.max(z, axis=0))
        s = s * tl.exp2((m - m_new) * 1.4426950408889634) + tl.sum(tl.exp2((z - m_new) * 1.4426950408889634), axis=0)
        m = m_new
    return m, s


@triton.jit
def _ce_hold_kernel(X, T, DX, LOSS, M, V, stride_x, scale, HOLD: tl.constexpr, BLOCK: tl.constexpr):
    hc = tl.arange(0, HOLD)
    cols0 = tl.arange(0, BLOCK)
    n_tail = tl.cdiv(tl.maximum(V - HOLD, 0), BLOCK)
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        x_row = X + tl.cast(row, tl.int64) * stride_x
        dx_row = DX + tl.cast(row, tl.int64) * stride_x
        t = tl.load(T + row).to(tl.int64)
        xt = tl.load(x_row + t).to(tl.float32)
        head = tl.load(x_row + hc)
        m, s = _max_sumexp(x_row, head, V, n_tail, HOLD, BLOCK)
        lse = m + tl.log2(s) * 0.6931471805599453
        tl.store(LOSS + row, (lse - xt) * scale)
        lse2 = lse * 1.4426950408889634
        last = HOLD + (n_tail - 1) * BLOCK + cols0
        x_next = tl.load(x_row + last, mask=(last >= HOLD) & (last < V), other=0.0, eviction_policy="evict_first")
        for i in range(0, n_tail):
            cols = HOLD + (n_tail - 1 - i) * BLOCK + cols0
            z = x_next.to(tl.float32)
            x_next = tl.load(x_row + cols - BLOCK, mask=(cols - BLOCK >= HOLD) & (cols - BLOCK < V), other=0.0,
                             eviction_policy="evict_first")
            g = tl.exp2(z * 1.4426950408889634 - lse2) * scale
            tl.store(dx_row + cols, g.to(DX.dtype.element_ty), mask=cols < V, cache_modifier=".cs")
        zh = head.to(tl.float32)
        g = tl.exp2(zh * 1.4426950408889634 - lse2) * scale
        tl.store(dx_row + hc, g.to(DX.dtype.element_ty), cache_modifier=".cs")
        # the target's own gradient: stored after a CTA barrier orders it behind the vector stores
        tl.debug_barrier()
        tl.store(dx_row + t, ((tl.exp2(xt * 1.4426950408889634 - lse2) - 1.0) * scale).to(DX.dtype.element_ty))


@triton.jit
def _softmax_hold_kernel(X, Y, M, N, stride_x, stride_y, HOLD: tl.constexpr, BLOCK: tl.constexpr):
    hc = tl.arange(0, HOLD)
    cols0 = tl.arange(0, BLOCK)
    n_tail = tl.cdiv(tl.maximum(N - HOLD, 0), BLOCK)
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        x_row = X + tl.cast(row, tl.int64) * stride_x
        y_row = Y + tl.cast(row, tl.int64) * stride_y
        head = tl.load(x_row + hc)
        m, s = _max_sumexp(x_row, head, N, n_tail, HOLD, BLOCK)
        inv_s = 1.0 / s
        last = HOLD + (n_tail - 1) * BLOCK + cols0
        x_next = tl.load(x_row + last, mask=(last >= HOLD) & (last < N), other=-float("inf"),
                         eviction_policy="evict_first")
        for i in range(0, n_tail):
            cols = HOLD + (n_tail - 1 - i) * BLOCK + cols0
            z = x_next.to(tl.float32)
            x_next = tl.load(x_row + cols - BLOCK, mask=(cols - BLOCK >= HOLD) & (cols - BLOCK < N),
                             other=-float("inf"), eviction_policy="evict_first")
            y = tl.exp2((z - m) * 1.4426950408889634) * inv_s
            tl.store(y_row + cols, y.to(Y.dtype.element_ty), mask=cols < N)
        zh = head.to(tl.float32)
        y = tl.exp2((zh - m) * 1.4426950408889634) * inv_s
        tl.store(y_row + hc, y.to(Y.dtype.element_ty))


@triton.jit
def _rms_hold_kernel(X, W, Y, M, N, stride_x, stride_y, eps, HOLD: tl.constexpr, BLOCK: tl.constexpr):
    hc = tl.arange(0, HOLD)
    cols0 = tl.arange(0, BLOCK)
    n_tail = tl.cdiv(tl.maximum(N - HOLD, 0), BLOCK)
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        x_row = X + tl.cast(row, tl.int64) * stride_x
        y_row = Y + tl.cast(row, tl.int64) * stride_y
        head = tl.load(x_row + hc)
        x_next = tl.load(x_row + HOLD + cols0, mask=HOLD + cols0 < N, other=0.0, eviction_policy="evict_last")
        xh = head.to(tl.float32)
        ss = tl.sum(xh * xh, axis=0)
        for i in range(0, n_tail):
            x = x_next.to(tl.float32)
            cols = HOLD + i * BLOCK + cols0
            x_next = tl.load(x_row + cols + BLOCK, mask=cols + BLOCK < N, other=0.0, eviction_policy="evict_last")
            ss += tl.sum(x * x, axis=0)
        r = 1.0 / tl.sqrt(ss / N + eps)
        last = HOLD + (n_tail - 1) * BLOCK + cols0
        x_next = tl.load(x_row + last, mask=(last >= HOLD) & (last < N), other=0.0, eviction_policy="evict_first")
        for i in range(0, n_tail):
            cols = HOLD + (n_tail - 1 - i) * BLOCK + cols0
            x = x_next.to(tl.float32)
            x_next = tl.load(x_row + cols - BLOCK, mask=(cols - BLOCK >= HOLD) & (cols - BLOCK < N), other=0.0,
                             eviction_policy="evict_first")
            w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)
            tl.store(y_row + cols, (x * r * w).to(Y.dtype.element_ty), mask=cols < N)
        xh = head.to(tl.float32)
        w = tl.load(W + hc).to(tl.float32)
        tl.store(y_row + hc, (xh * r * w).to(Y.dtype.element_ty))


HOLDS = (32768, 65536)
BLOCKS = (8192, 16384)
WARPS = (8, 16, 32)
PPS = (1, 2)


def variants(quick):
    if quick:
        return [(65536, 16384, 16, 1), (32768, 16384, 16, 2)]
    return list(itertools.product(HOLDS, BLOCKS, WARPS, PPS))


def ptxas_report():
    """Compile every variant for sm_90 on this CPU machine and print ptxas's register/spill report."""
    import os
    import re
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    target = GPUTarget("cuda", 90, 32)
    sigs = {
        "ce": (_ce_hold_kernel, {"X": "*bf16", "T": "*i64", "DX": "*bf16", "LOSS": "*fp32", "M": "i32", "V": "i32",
                                 "stride_x": "i32", "scale": "fp32", "HOLD": "constexpr", "BLOCK": "constexpr"}),
        "softmax": (_softmax_hold_kernel, {"X": "*bf16", "Y": "*bf16", "M": "i32", "N": "i32", "stride_x": "i32",
                                           "stride_y": "i32", "HOLD": "constexpr", "BLOCK": "constexpr"}),
        "rms": (_rms_hold_kernel, {"X": "*bf16", "W": "*bf16", "Y": "*bf16", "M": "i32", "N": "i32",
                                   "stride_x": "i32", "stride_y": "i32", "eps": "fp32", "HOLD": "constexpr",
                                   "BLOCK": "constexpr"}),
    }
    for name, (fn, sig) in sigs.items():
        for hold, block, warps in itertools.product(HOLDS, BLOCKS, WARPS):
            # pointers and strides divisible by 16, as the JIT specializes them at these shapes
            attrs = {(k,): [["tt.divisibility", 16]] for k, (n, ty) in enumerate(sig.items())
                     if ty.startswith("*") or n.startswith("stride") or n in ("N", "V")}
            src = ASTSource(fn, sig, constexprs={"HOLD": hold, "BLOCK": block}, attrs=attrs)
            k = triton.compile(src, target=target, options={"num_warps": warps})
            with tempfile.TemporaryDirectory() as d:
                p = os.path.join(d, "k.ptx")
                open(p, "w").write(k.asm["ptx"])
                out = subprocess.run([ptxas, "-arch=sm_90a", "-v", p, "-o", os.path.join(d, "k.o")],
                                     capture_output=True, text=True).stderr
            regs = re.search(r"Used (\d+) registers", out)
            spill = re.search(r"(\d+) bytes spill stores", out)
            print(f"{name:8s} hold {hold:6d} block {block:6d} warps {warps:2d}: "
                  f"{regs.group(1) if regs else '?'} regs, {spill.group(1) if spill else '?'} B spill", flush=True)


def main() -> int:
    if "--ptxas" in sys.argv[1:]:
        ptxas_report()
        return 0
    import torch

    import kernelset as ks
    from kernelset.bench.timing import copy_bandwidth_gbs, cuda_time_ms
    from kernelset.core.tolerance import rel_err

    quick = "--quick" in sys.argv[1:]
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    copy = copy_bandwidth_gbs(dev)
    print(f"{torch.cuda.get_device_name(dev)}; {sms} SMs; copy {copy:.0f} GB/s; triton {triton.__version__}",
          flush=True)
    best = {}

    def bench(case, label, nbytes, run, check):
        try:
            err = check(run())
            if not err < 2e-2:
                print(f"{case:28s} {label:34s} WRONG rel err {err:.3g}", flush=True)
                return
            ms = cuda_time_ms(run, warmup=3, reps=20, min_ms=40)
        except Exception as exc:  # noqa: BLE001 - a variant that fails to compile is reported, not fatal
            print(f"{case:28s} {label:34s} failed: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
            return
        pct = 100 * nbytes / ms / 1e6 / copy
        print(f"{case:28s} {label:34s} {ms:8.4f} ms {pct:6.1f}%", flush=True)
        if case not in best or pct > best[case][2]:
            best[case] = (label, ms, pct)

    # cross-entropy fwd+bwd (gradient of the mean loss), 8192 x 128256
    m, v = 8192, 128256
    x = (torch.randn(m, v, device=dev) * 2).to(torch.bfloat16)
    t = torch.randint(0, v, (m,), device=dev)
    xr = x.float().requires_grad_()
    (gref,) = torch.autograd.grad(torch.nn.functional.cross_entropy(xr, t), (xr,))
    del xr
    case = f"ce fwd+bwd {m}x{v}"
    xg = x.clone().requires_grad_()
    bench(case, "production", 4 * m * v, lambda: torch.autograd.grad(ks.cross_entropy(xg, t), (xg,))[0],
          lambda g: rel_err(g, gref))
    del xg
    dx = torch.empty_like(x)
    loss = torch.empty(m, device=dev)
    for hold, block, warps, pps in variants(quick):
        def run(hold=hold, block=block, warps=warps, pps=pps):
            dx.fill_(float("nan")) if run.first else None
            run.first = False
            _ce_hold_kernel[(min(m, pps * sms),)](x, t, dx, loss, m, v, x.stride(0), 1.0 / m, HOLD=hold,
                                                  BLOCK=block, num_warps=warps)
            return dx
        run.first = True
        bench(case, f"hold {hold} block {block} w{warps} pps{pps}", 4 * m * v, run, lambda g: rel_err(g, gref))
    del x, dx, gref

    # softmax fwd 4096 x 131072
    m, n = 4096, 131072
    x = torch.randn(m, n, dtype=torch.bfloat16, device=dev)
    ref = torch.softmax(x.float(), -1)
    case = f"softmax fwd {m}x{n}"
    bench(case, "production", 4 * m * n, lambda: ks.softmax(x), lambda y: rel_err(y, ref))
    y = torch.full_like(x, float("nan"))
    for hold, block, warps, pps in variants(quick):
        def run(hold=hold, block=block, warps=warps, pps=pps):
            _softmax_hold_kernel[(min(m, pps * sms),)](x, y, m, n, x.stride(0), y.stride(0), HOLD=hold, BLOCK=block,
                                                       num_warps=warps)
            return y
        bench(case, f"hold {hold} block {block} w{warps} pps{pps}", 4 * m * n, run, lambda y: rel_err(y, ref))
    del x, y, ref

    # rms_norm fwd 1024 x 262144
    m, n = 1024, 262144
    x = torch.randn(m, n, dtype=torch.bfloat16, device=dev)
    w = torch.randn(n, dtype=torch.bfloat16, device=dev)
    ref = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    case = f"rms_norm fwd {m}x{n}"
    bench(case, "production", 4 * m * n, lambda: ks.rms_norm(x, w), lambda y: rel_err(y, ref))
    y = torch.full_like(x, float("nan"))
    for hold, block, warps, pps in variants(quick):
        def run(hold=hold, block=block, warps=warps, pps=pps):
            _rms_hold_kernel[(min(m, pps * sms),)](x, w, y, m, n, x.stride(0), y.stride(0), 1e-6, HOLD=hold,
                                                   BLOCK=block, num_warps=warps)
            return y
        bench(case, f"hold {hold} block {block} w{warps} pps{pps}", 4 * m * n, run, lambda y: rel_err(y, ref))
    print("\nbest per case (% of copy; bytes: read the input once, write the output once)")
    for case, (label, ms, pct) in best.items():
        print(f"  {case:28s} {label:34s} {ms:.4f} ms {pct:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
