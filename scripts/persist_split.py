"""Experiment (GPU): persistent split kernels that load their next chunk while they wait at the
row barrier, against the shipped split / looped kernels, at the wide-row bar shapes.

The shipped split kernels (ops/rowsync.py) run one program per (row, chunk): a program loads its
chunk, publishes the chunk's partials, waits until every chunk of its row has, then writes its
output and exits. While it waits it has nothing in flight. Here a cooperative grid of G programs
(all resident at once, which the cooperative launch guarantees or refuses) walks the items
statically, item k = pid + i * G (rows of ``split`` chunks, G >= split): the next item's chunk is
loaded before the wait for this one's row, and its partials are published after this one's output.

Deadlock-free when every program is resident: take the lowest row not yet complete; each of its
chunks is a program's current item (published before that program waits) or its next item behind
a current item of a lower, hence complete, row (G >= split: a program never holds two chunks of
one row).

    python scripts/persist_split.py [rounds] [ops...]     # ops: rms_norm softmax cross_entropy
"""
from __future__ import annotations

import statistics
import sys

import torch
import triton
import triton.language as tl

from kernelset.ops import rowsync

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _item(k, split, total, cols0, N, CHUNK: tl.constexpr):
    row = (k // split).to(tl.int64)
    chunk = k % split
    cols = chunk * CHUNK + cols0
    m = (cols < N) & (cols0 * 0 + k < total)
    return row, chunk, cols, m


@triton.jit
def _rms_persist_kernel(X, W, Y, PART, SYNC, M, N, split, stride_x, stride_y, eps, CHUNK: tl.constexpr,
                        SPLIT_P2: tl.constexpr):
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    total = M * split
    cols0 = tl.arange(0, CHUNK)
    k = pid
    row, chunk, cols, m = _item(k, split, total, cols0, N, CHUNK)
    x = tl.load(X + row * stride_x + cols, mask=m, other=0.0, eviction_policy="evict_first")
    if k < total:
        xf = x.to(tl.float32)
        rowsync.publish(PART, SYNC, row, chunk, tl.sum(xf * xf, axis=0), 0.0, 0.0, 0.0, 1, SPLIT_P2, 0)
    for _ in range(0, tl.cdiv(total - pid, G)):
        kn = k + G
        rown, chunkn, colsn, mn = _item(kn, split, total, cols0, N, CHUNK)
        xn = tl.load(X + rown * stride_x + colsn, mask=mn, other=0.0, eviction_policy="evict_first")
        pa, _pb, _pc, _pd = rowsync.gather(PART, SYNC, row, split, 1, SPLIT_P2, 0)
        rstd = tl.rsqrt(rowsync.tree_sum(pa, SPLIT_P2) / N + eps)
        w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
        y = (rowsync.rewiden(x, 0) * rstd).to(Y.dtype.element_ty).to(tl.float32) * w
        tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=m, cache_modifier=".cs")
        if kn < total:
            xnf = xn.to(tl.float32)
            rowsync.publish(PART, SYNC, rown, chunkn, tl.sum(xnf * xnf, axis=0), 0.0, 0.0, 0.0, 1, SPLIT_P2, 0)
        k = kn
        row = rown
        cols = colsn
        m = mn
        x = xn


@triton.jit
def _softmax_partials(x, m):
    z = tl.where(m, x.to(tl.float32), -float("inf"))
    m_c = tl.max(z, axis=0)
    m_cs = tl.where(m_c == -float("inf"), 0.0, m_c)
    return m_c, tl.sum(tl.exp2((z - m_cs) * LOG2E), axis=0)


@triton.jit
def _softmax_persist_kernel(X, Y, PART, SYNC, M, N, split, stride_x, stride_y, CHUNK: tl.constexpr,
                            SPLIT_P2: tl.constexpr):
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    total = M * split
    cols0 = tl.arange(0, CHUNK)
    k = pid
    row, chunk, cols, m = _item(k, split, total, cols0, N, CHUNK)
    x = tl.load(X + row * stride_x + cols, mask=m, other=0.0, eviction_policy="evict_first")
    if k < total:
        m_c, s_c = _softmax_partials(x, m)
        rowsync.publish(PART, SYNC, row, chunk, m_c, s_c, 0.0, 0.0, 2, SPLIT_P2, 0)
    for _ in range(0, tl.cdiv(total - pid, G)):
        kn = k + G
        rown, chunkn, colsn, mn = _item(kn, split, total, cols0, N, CHUNK)
        xn = tl.load(X + rown * stride_x + colsn, mask=mn, other=0.0, eviction_policy="evict_first")
        pm, ps, _pc, _pd = rowsync.gather(PART, SYNC, row, split, 2, SPLIT_P2, 0)
        pm = tl.where(tl.arange(0, SPLIT_P2) < split, pm, -float("inf"))
        mx = tl.max(pm, axis=0)
        mx = tl.where(mx == -float("inf"), 0.0, mx)
        s = rowsync.tree_sum(ps * tl.exp2((pm - mx) * LOG2E), SPLIT_P2)
        y = tl.exp2((rowsync.rewiden(x, 0) - mx) * LOG2E) / s
        tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=m, cache_modifier=".cs")
        if kn < total:
            m_c, s_c = _softmax_partials(xn, mn)
            rowsync.publish(PART, SYNC, rown, chunkn, m_c, s_c, 0.0, 0.0, 2, SPLIT_P2, 0)
        k = kn
        row = rown
        cols = colsn
        m = mn
        x = xn


@triton.jit
def _ce_persist_kernel(X, T, LOSS, DX, PART, SYNC, M, V, split, stride_x, stride_dx, scale, CHUNK: tl.constexpr,
                       SPLIT_P2: tl.constexpr):
    # plain cross-entropy (no ignore index, smoothing, softcap or z-loss): loss per row, dx = dloss/dx * scale
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    total = M * split
    cols0 = tl.arange(0, CHUNK)
    k = pid
    row, chunk, cols, m = _item(k, split, total, cols0, V, CHUNK)
    x = tl.load(X + row * stride_x + cols, mask=m, other=0.0, eviction_policy="evict_first")
    t = tl.load(T + row, mask=k < total, other=0)
    if k < total:
        m_c, s_c = _softmax_partials(x, m)
        xt = 0.0
        if chunk == 0:
            xt = tl.load(X + row * stride_x + t).to(tl.float32)
        rowsync.publish(PART, SYNC, row, chunk, m_c, s_c, xt, 0.0, 3, SPLIT_P2, 0)
    for _ in range(0, tl.cdiv(total - pid, G)):
        kn = k + G
        rown, chunkn, colsn, mn = _item(kn, split, total, cols0, V, CHUNK)
        xn = tl.load(X + rown * stride_x + colsn, mask=mn, other=0.0, eviction_policy="evict_first")
        tn = tl.load(T + rown, mask=kn < total, other=0)
        pm, ps, pt, _pd = rowsync.gather(PART, SYNC, row, split, 3, SPLIT_P2, 0)
        i = tl.arange(0, SPLIT_P2)
        pm = tl.where(i < split, pm, -float("inf"))
        mx = tl.max(pm, axis=0)
        lse = mx + tl.log2(rowsync.tree_sum(ps * tl.exp2((pm - mx) * LOG2E), SPLIT_P2)) * 0.6931471805599453
        if k % split == 0:
            tl.store(LOSS + row, lse - tl.sum(tl.where(i == 0, pt, 0.0), axis=0))
        g = tl.exp2(rowsync.rewiden(x, 0) * LOG2E - lse * LOG2E) * scale
        g = tl.where(cols == t, g - scale, g)
        tl.store(DX + row * stride_dx + cols, g.to(DX.dtype.element_ty), mask=m, cache_modifier=".cs")
        if kn < total:
            m_c, s_c = _softmax_partials(xn, mn)
            xt = 0.0
            if kn % split == 0:
                xt = tl.load(X + rown * stride_x + tn).to(tl.float32)
            rowsync.publish(PART, SYNC, rown, chunkn, m_c, s_c, xt, 0.0, 3, SPLIT_P2, 0)
        k = kn
        row = rown
        cols = colsn
        m = mn
        x = xn
        t = tn


# (chunk, warps)
CONFIGS = [(8192, 4), (4096, 4), (8192, 8), (4096, 2), (16384, 8), (2048, 2)]
SHAPES = {"rms_norm": (1024, 262144), "softmax": (4096, 131072), "cross_entropy": (8192, 128256)}


def _launcher(op, fn, args, chunk, warps, sms, n):
    """A closure launching fn on a cooperative grid of as many programs as fit at once, or None."""
    m = args[0].shape[0]
    split = -(-n // chunk)
    split_p2 = 1 << (split - 1).bit_length()
    nslot = {"rms_norm": 1, "softmax": 2, "cross_entropy": 3}[op]

    def launch(grid):
        (_phase, sync, part), = rowsync.launches(args[0].device, m, nslot, split_p2)
        return fn[(grid,)](*args[:-1], part, sync, *args[-1], CHUNK=chunk, SPLIT_P2=split_p2, num_warps=warps,
                           launch_cooperative_grid=True)

    k = launch(split)  # compiles; split programs cover the first row, so this launch completes
    regs = max(k.n_regs, 1)
    per_sm = min(65536 // (((regs + 7) // 8 * 8) * 32 * warps), 64 // warps, 32)
    if k.metadata.shared:
        per_sm = min(per_sm, (227 * 1024) // k.metadata.shared)
    while per_sm * sms >= split:  # the cooperative launch refuses a grid that cannot be resident at once
        try:
            launch(per_sm * sms)
            break
        except RuntimeError as exc:
            if "cooperative" not in str(exc):
                raise
            per_sm -= 1
    grid = per_sm * sms
    if grid < split:
        return None, regs, per_sm
    return (lambda: launch(grid)), regs, per_sm


def main() -> int:
    import kernelset as ks
    from kernelset.bench.timing import copy_bandwidth_gbs, cuda_time_ms
    from kernelset.core.tolerance import rel_err

    args = sys.argv[1:]
    rounds = int(args.pop(0)) if args and args[0].isdigit() else 3
    ops = args or list(SHAPES)
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    copy = copy_bandwidth_gbs(dev)
    print(f"{torch.cuda.get_device_name()} copy {copy:.0f} GB/s, triton {triton.__version__}", flush=True)
    g = torch.Generator(device=dev).manual_seed(0)
    for op in ops:
        m, n = SHAPES[op]
        x = (torch.randn(m, n, device=dev, generator=g) * 2).to(torch.bfloat16)
        fns = {}
        if op == "rms_norm":
            w = torch.randn(n, device=dev, dtype=torch.bfloat16, generator=g)
            y = torch.empty_like(x)
            xf = x.float()
            ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)) * w.float()
            del xf
            fns["shipped"] = (lambda: ks.rms_norm(x, w), lambda: ks.rms_norm(x, w))
            kern, kargs, out = _rms_persist_kernel, (x, w, y, (m, n, None, n, n, 1e-6)), lambda: y
        elif op == "softmax":
            y = torch.empty_like(x)
            ref = torch.softmax(x.float(), -1)
            fns["shipped"] = (lambda: ks.softmax(x), lambda: ks.softmax(x))
            kern, kargs, out = _softmax_persist_kernel, (x, y, (m, n, None, n, n)), lambda: y
        else:
            t = torch.randint(0, n, (m,), device=dev, generator=g)
            dx = torch.empty_like(x)
            loss = torch.empty(m, device=dev)
            xr = x.float().requires_grad_(True)
            (ref,) = torch.autograd.grad(torch.nn.functional.cross_entropy(xr, t, reduction="sum"), (xr,))
            del xr
            xg = x.detach().requires_grad_(True)

            def shipped():
                return torch.autograd.grad(ks.cross_entropy(xg, t, reduction="sum"), (xg,))[0]
            fns["shipped"] = (shipped, shipped)
            kern, kargs, out = _ce_persist_kernel, (x, t, loss, dx, (m, n, None, n, n, 1.0)), lambda: dx
        for chunk, warps in CONFIGS:
            split = -(-n // chunk)
            tail = tuple(split if a is None else a for a in kargs[-1])
            try:
                run, regs, per_sm = _launcher(op, kern, kargs[:-1] + (tail,), chunk, warps, sms, n)
            except Exception as exc:  # noqa: BLE001 (an experiment: report and go on)
                print(f"  persistent {chunk}x{warps}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            if run is None:
                print(f"  persistent {chunk}x{warps}: {regs} regs, {per_sm}/SM: grid below split, skipped")
                continue
            label = f"persistent {chunk}x{warps} ({regs} regs, {per_sm}/SM)"
            fns[label] = (run, out)
        errs = {}
        for label, (run, get) in list(fns.items()):
            if label != "shipped":
                out().fill_(float("nan"))
            res = run() if label == "shipped" else (run(), get())[1]
            torch.cuda.synchronize()
            errs[label] = rel_err(res.float(), ref.float())
            if not errs[label] < 2e-2:
                print(f"  {label}: WRONG rel err {errs[label]:.3g}", flush=True)
                fns.pop(label)
        del ref
        torch.cuda.empty_cache()
        times = {k: [] for k in fns}
        for _ in range(rounds):
            for label, (run, _get) in fns.items():
                times[label].append(cuda_time_ms(run, warmup=3, reps=20, min_ms=40))
        nbytes = 4 * m * n
        print(f"{op} {m}x{n} bf16 ({'fwd+bwd' if op == 'cross_entropy' else 'fwd'}), {rounds} rounds, median "
              f"(min-max), % of copy:", flush=True)
        for label, ts in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
            med = statistics.median(ts)
            print(f"  {label:40s} {med:.4f} ms {100 * nbytes / med / 1e6 / copy:5.1f}% ({min(ts):.4f}-{max(ts):.4f}) "
                  f"rel err {errs[label]:.1e}", flush=True)
        del x, fns
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
