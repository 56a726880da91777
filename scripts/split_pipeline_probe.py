"""A pipelined, persistent form of the split-row kernels (``ops/rowsync.py``), probed against
the shipped softmax / RMSNorm forwards on the rows that miss their bars on the H200
(softmax 4096x131072: 76% of copy; RMSNorm 4096x65536 and 1024x262144: 78%).

Why: a split program holds its chunk of a row in registers while it waits at the row's
barrier, and issues no load meanwhile. If too few bytes are in flight on the GPU during those
waits, the kernel cannot reach copy bandwidth (Little's law); the shipped split kernels measure
70-78% on the H200. Here ``S`` programs form a group that walks rows g, g + G, g + 2G, ...
together (one chunk each): each program issues the loads of its chunk of the *next* row before
it waits at the current row's barrier, so a chunk is always in flight.

Deadlock-free without assuming co-residency: a program's group and chunk come from a ticket
taken in start order (as rowsync.claim), so at most one group has members that have not
started; the complete groups depend on no one else, finish their rows and free their SMs, and
the rest then start. (What must fit at once is one group, S programs.) No program ever waits
on a row it has not yet published to itself: its next row is another row.

Measured in session 21 on the H200 (docs/benchmarks/2026-11-27-s21/run1-split-pipeline.log):
correct everywhere, slower everywhere. Best forms against the shipped kernels: softmax
4096x131072 65.2% (77.6%), RMSNorm 4096x65536 75.2% (79.0%), 1024x262144 73.6% (77.8%); at 4
warps with few splits 7-25% (the held next chunk spills registers). Kept as the record.

Not shipped: a probe written without GPU access (session 20). It
checks each form against torch in fp32 before timing it. ``--check`` runs the math on the CPU
through the Triton interpreter with one program per row (S = 1: the interpreter runs programs
one after another, so a group of several would wait forever) and rowsync's unsynchronized
publish / gather forms (``SYNCED=False``: the interpreter has no float atomic exchange).

Usage: python scripts/split_pipeline_probe.py [--check] [--quick]
"""
from __future__ import annotations

import itertools
import os
import sys

import torch
import triton
import triton.language as tl

from kernelset.ops import rowsync

LOG2E = 1.4426950408889634


@triton.jit
def _softmax_fwd_pipe(X, Y, PART, SYNC, R, N, G, split, stride_x, stride_y, CHUNK: tl.constexpr,
                      SPLIT_P2: tl.constexpr, SYNCED: tl.constexpr):
    # ticket in start order (the row masks below compare vectors: the interpreter's scalar
    # atomic returns a 1-element array)
    t = tl.atomic_add(SYNC, 1, sem="relaxed", scope="gpu")
    g = t // split
    chunk = t % split
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    cm = cols < N
    r = g
    x = tl.load(X + r.to(tl.int64) * stride_x + cols, mask=cm & ((cols * 0 + r) < R), other=-float("inf"),
                eviction_policy="evict_first")
    while r < R:
        rn = r + G
        # the next row's chunk is in flight while this row's partials are exchanged
        xn = tl.load(X + rn.to(tl.int64) * stride_x + cols, mask=cm & ((cols * 0 + rn) < R), other=-float("inf"),
                     eviction_policy="evict_first")
        z = x.to(tl.float32)
        m_c = tl.max(z, axis=0)
        m_cs = tl.where(m_c == -float("inf"), 0.0, m_c)
        s_c = tl.sum(tl.exp2((z - m_cs) * 1.4426950408889634), axis=0)
        rowsync.publish(PART, SYNC, r, chunk, m_c, s_c, 0.0, 0.0, 2, SPLIT_P2, 0 if SYNCED else 1)
        pm, ps, _c, _d = rowsync.gather(PART, SYNC, r, split, 2, SPLIT_P2, 0 if SYNCED else 2)
        pm = tl.where(tl.arange(0, SPLIT_P2) < split, pm, -float("inf"))
        m = tl.max(pm, axis=0)
        m = tl.where(m == -float("inf"), 0.0, m)
        s = rowsync.tree_sum(ps * tl.exp2((pm - m) * 1.4426950408889634), SPLIT_P2)
        y = tl.exp2((z - m) * 1.4426950408889634) / s
        tl.store(Y + r.to(tl.int64) * stride_y + cols, y.to(Y.dtype.element_ty), mask=cm, cache_modifier=".cs")
        x = xn
        r = rn


@triton.jit
def _rms_fwd_pipe(X, W, Y, PART, SYNC, R, N, G, split, stride_x, stride_y, eps, CHUNK: tl.constexpr,
                  SPLIT_P2: tl.constexpr, SYNCED: tl.constexpr):
    t = tl.atomic_add(SYNC, 1, sem="relaxed", scope="gpu")
    g = t // split
    chunk = t % split
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    cm = cols < N
    w = tl.load(W + cols, mask=cm, other=0.0).to(tl.float32)
    r = g
    x = tl.load(X + r.to(tl.int64) * stride_x + cols, mask=cm & ((cols * 0 + r) < R), other=0.0, eviction_policy="evict_first")
    while r < R:
        rn = r + G
        xn = tl.load(X + rn.to(tl.int64) * stride_x + cols, mask=cm & ((cols * 0 + rn) < R), other=0.0,
                     eviction_policy="evict_first")
        xf = x.to(tl.float32)
        rowsync.publish(PART, SYNC, r, chunk, tl.sum(xf * xf, axis=0), 0.0, 0.0, 0.0, 1, SPLIT_P2, 0 if SYNCED else 1)
        pss, _b, _c, _d = rowsync.gather(PART, SYNC, r, split, 1, SPLIT_P2, 0 if SYNCED else 2)
        rstd = tl.rsqrt(rowsync.tree_sum(pss, SPLIT_P2) / N + eps)
        tl.store(Y + r.to(tl.int64) * stride_y + cols, (xf * rstd * w).to(Y.dtype.element_ty), mask=cm,
                 cache_modifier=".cs")
        x = xn
        r = rn


def _launch(kind, x, w, y, split, per_sm, warps, sms, synced=True):
    r, n = x.shape
    chunk = triton.next_power_of_2(-(-n // split))
    split_p2 = triton.next_power_of_2(split)
    groups = max(1, min(r, (sms * per_sm) // split))
    sync = torch.zeros(r + 1, dtype=torch.int32, device=x.device)
    part = torch.empty(r * 2 * split_p2, dtype=torch.float32, device=x.device)
    grid = (groups * split,)
    if kind == "softmax":
        _softmax_fwd_pipe[grid](x, y, part, sync, r, n, groups, split, x.stride(0), y.stride(0), CHUNK=chunk,
                                SPLIT_P2=split_p2, SYNCED=synced, num_warps=warps)
    else:
        _rms_fwd_pipe[grid](x, w, y, part, sync, r, n, groups, split, x.stride(0), y.stride(0), 1e-6, CHUNK=chunk,
                            SPLIT_P2=split_p2, SYNCED=synced, num_warps=warps)


def _want(kind, x, w):
    xf = x.float()
    if kind == "softmax":
        return torch.softmax(xf, -1)
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()


def _rel(a, b):
    return float((a.float() - b).norm() / b.norm())


def check() -> int:
    """The math on the CPU (Triton interpreter), one program per row: S = 1."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    ok = True
    for kind, (r, n) in (("softmax", (5, 300)), ("rms", (7, 129))):
        x = torch.randn(r, n, dtype=torch.bfloat16)
        w = torch.randn(n, dtype=torch.bfloat16)
        for per_sm in (1, 3):  # G < R and G >= R groups
            y = torch.full_like(x, float("nan"))
            _launch(kind, x, w, y, 1, per_sm, 4, 2, synced=False)
            err = _rel(y, _want(kind, x, w))
            print(f"{kind} {r}x{n} groups of one, {2 * per_sm} programs: rel err {err:.2e}")
            ok &= err < 1e-2
    return 0 if ok else 1


def main() -> int:
    if "--check" in sys.argv:
        return check()
    from kernelset.bench.timing import copy_bandwidth_gbs, cuda_time_ms
    import kernelset as ks
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    copy = copy_bandwidth_gbs(dev)
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, Triton {triton.__version__}, "
          f"copy {copy:.0f} GB/s, {sms} SMs")
    quick = "--quick" in sys.argv
    cases = [("softmax", 4096, 131072, (4, 8, 16)), ("rms", 4096, 65536, (2, 4, 8)), ("rms", 1024, 262144, (8, 16, 32))]
    for kind, r, n, splits in cases:
        x = torch.randn(r, n, dtype=torch.bfloat16, device=dev)
        w = torch.randn(n, dtype=torch.bfloat16, device=dev)
        y = torch.empty_like(x)
        want = _want(kind, x, w)
        nbytes = 2 * x.numel() * x.element_size()
        rows = []
        shipped = (lambda: ks.softmax(x)) if kind == "softmax" else (lambda: ks.rms_norm(x, w))
        rows.append(("shipped", cuda_time_ms(shipped), _rel(shipped(), want)))
        configs = itertools.product(splits, (1, 2, 3, 4), (4, 8, 16))
        if quick:
            configs = [(splits[1], 2, 8), (splits[1], 3, 8), (splits[2], 2, 8)]
        for split, per_sm, warps in configs:
            label = f"pipelined split {split}, {per_sm} per SM, {warps} warps"
            try:
                y.fill_(float("nan"))
                _launch(kind, x, w, y, split, per_sm, warps, sms)
                torch.cuda.synchronize()
                err = _rel(y, want)
                if not err < 1e-2:
                    rows.append((label + " WRONG", float("inf"), err))
                    continue
                rows.append((label, cuda_time_ms(lambda: _launch(kind, x, w, y, split, per_sm, warps, sms)), err))
            except Exception as exc:  # too many registers for a chunk, ...
                print(f"  {label}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
        print(f"\n{kind} {r}x{n} bf16 (% of copy, read x once and write y once; rel err vs fp32):")
        for label, ms, err in sorted(rows, key=lambda t: t[1]):
            pct = nbytes / ms / 1e6 / copy * 100 if ms != float("inf") else 0.0
            print(f"  {pct:5.1f}%  {ms * 1e3:8.1f} us  err {err:.1e}  {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
