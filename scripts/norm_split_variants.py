"""Experiment (GPU): variants of the split kernels (ops/rowsync.py) at the wide-row bar shapes:
RMSNorm forward 1024x262144, softmax forward 4096x131072, cross-entropy forward+backward
8192x128256. Each variant is checked against fp32 torch before it is timed; variants are
interleaved over rounds (median per variant, min-max shown).

A variant is the production kernel's source with its cache hints taken out and put back by choice
(the chunk load marked evict-first, the output stored streaming ``.cs``), optional extra textual
edits, written to a temporary module (Triton needs a source file), and a tuning (chunk, warps).

    python scripts/norm_split_variants.py [rounds] [ops...] [--dirty]  # ops: rms_norm softmax cross_entropy

--dirty times with a written 1 GiB fp32 buffer alive, as ``ksctl bench`` does (session 13 run 10: the
split kernels are about 2 points slower in that state).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import os
import re
import statistics
import sys
import tempfile

import torch

import kernelset as ks
from kernelset.bench.timing import copy_bandwidth_gbs, cuda_time_ms
from kernelset.core.tolerance import rel_err
from kernelset.ops import triton_launch
from kernelset.ops.loss import kernels as lk
from kernelset.ops.loss import launch as ll
from kernelset.ops.norm import kernels as nk
from kernelset.ops.norm import launch as nl
from kernelset.ops.norm import policy as npol
from kernelset.ops.softmax import kernels as sk
from kernelset.ops.softmax import launch as sl

EF, CS = ', eviction_policy="evict_first"', ', cache_modifier=".cs"'
# op: (launch module, kernel, plain load, plain store, tuning module, tuning field names (chunk, warps))
KERNELS = {
    "rms_norm": (nl, nk._norm_fwd_split_kernel, "x = tl.load(X + row * stride_x + cols, mask=m, other=0.0)",
                 "tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=m)", npol,
                 ("split_chunk_fwd", "split_warps_fwd")),
    "softmax": (sl, sk._softmax_fwd_split_kernel, 'z = tl.load(X + row * stride_x + cols, mask=cm, other=-float("inf"))',
                "tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=cm)", sl,
                ("split_chunk_fwd", "split_warps")),
    "cross_entropy": (ll, lk._ce_fwd_split_kernel, "x = tl.load(x_row + cols, mask=cm, other=0.0)",
                      "tl.store(DX + row * stride_dx + cols, g.to(DX.dtype.element_ty), mask=cm)", ll,
                      ("split_chunk", "split_warps")),
}
INV_S = ("y = tl.exp2((z - m) * 1.4426950408889634) / s", "y = tl.exp2((z - m) * 1.4426950408889634) * (1.0 / s)")
# softmax with the chunk kept 16-bit across the barrier, as the norm does (rowsync.rewiden)
SM_16BIT = (("z = tl.load(X + row * stride_x + cols", "xin = tl.load(X + row * stride_x + cols"),
            (".to(tl.float32) * inv_t\n    if PHASE != 2:", "\n    z = xin.to(tl.float32) * inv_t\n    if PHASE != 2:"),
            ("s = rowsync.tree_sum(ps * tl.exp2((pm - m) * 1.4426950408889634), SPLIT_P2)",
             "s = rowsync.tree_sum(ps * tl.exp2((pm - m) * 1.4426950408889634), SPLIT_P2)\n"
             "        z = rowsync.rewiden(xin, PHASE) * inv_t"))
# cross-entropy split: the target logit taken from the registers of the chunk that holds it (a sum
# over the chunk of z where the column is the target; every chunk publishes one, all but one 0)
# instead of chunk 0 loading it from memory at an address that depends on the target's own load
# (two memory latencies in a row before chunk 0 can publish, which every program of the row waits for)
CE_TARGET_REG = (("""        xt = 0.0
        if chunk == 0:
            xt = tl.load(x_row + tl.where(valid, t, 0)).to(tl.float32)""",
                  """        xt = tl.sum(tl.where(cols == t, z, 0.0), axis=0)"""),
                 ("zt = _softcapped(tl.sum(tl.where(i == 0, pt, 0.0), axis=0), softcap, SOFTCAP)",
                  "zt = rowsync.tree_sum(pt, SPLIT_P2)"))
W_LAST = ("w = tl.load(W + cols, mask=m, other=0.0)", 'w = tl.load(W + cols, mask=m, other=0.0, eviction_policy="evict_last")')
# op: [(label, evict_first, .cs, extra edits, chunk, warps)]; chunk None: the shipped tuning
VARIANTS = {
    "rms_norm": [("plain", 0, 0, (), None, None), ("hints", 1, 1, (), None, None),
                 ("hints + w evict_last", 1, 1, (W_LAST,), None, None), ("hints, 8 warps", 1, 1, (), 8192, 8),
                 ("hints, chunk 16384 8 warps", 1, 1, (), 16384, 8), ("hints, chunk 4096 2 warps", 1, 1, (), 4096, 2),
                 ("hints, chunk 4096 4 warps", 1, 1, (), 4096, 4), ("hints, chunk 8192 2 warps", 1, 1, (), 8192, 2),
                 ("hints, chunk 16384 4 warps", 1, 1, (), 16384, 4)],
    "softmax": [("plain", 0, 0, (), None, None), ("hints", 1, 1, (), None, None),
                ("hints, y = e * (1 / s)", 1, 1, (INV_S,), None, None),
                ("plain, y = e * (1 / s)", 0, 0, (INV_S,), None, None),
                ("hints, 1 / s, 8 warps", 1, 1, (INV_S,), 8192, 8),
                ("hints, chunk kept bf16", 1, 1, SM_16BIT, None, None),
                ("hints, chunk kept bf16, 1 / s", 1, 1, SM_16BIT + (INV_S,), None, None),
                ("hints, chunk 4096 2 warps", 1, 1, (), 4096, 2), ("hints, chunk 4096 4 warps", 1, 1, (), 4096, 4),
                ("hints, chunk 8192 2 warps", 1, 1, (), 8192, 2), ("hints, chunk 16384 8 warps", 1, 1, (), 16384, 8)],
    "cross_entropy": [("looped (shipped)", 0, 0, (), 0, None), ("split plain", 0, 0, (), 8192, 4),
                      ("split hints", 1, 1, (), 8192, 4), ("split hints 8 warps", 1, 1, (), 8192, 8),
                      ("split hints, target in registers", 1, 1, CE_TARGET_REG, 8192, 4),
                      ("split hints, target in reg., 8 warps", 1, 1, CE_TARGET_REG, 8192, 8),
                      ("split plain, target in registers", 0, 0, CE_TARGET_REG, 8192, 4),
                      ("split hints, target in reg., 16384", 1, 1, CE_TARGET_REG, 16384, 8)],
}


def build(kernel, load, store, ef, cs, extra, tmp, tag):
    src = inspect.getsource(kernel.fn)
    src = re.sub(r',\s*eviction_policy="evict_first"', "", src)  # back to the plain form first
    src = re.sub(r',\s*cache_modifier="\.cs"', "", src)
    assert load in src and store in src, (load, store)
    src = src.replace(load, load[:-1] + (EF if ef else "") + ")").replace(store, store[:-1] + (CS if cs else "") + ")")
    for a, b in extra:
        assert a in src, a
        src = src.replace(a, b)
    name = f"v_{kernel.fn.__name__}_{tag}"
    path = os.path.join(tmp, name + ".py")
    with open(path, "w") as f:
        f.write("import triton\nimport triton.language as tl\nfrom kernelset.ops import rowsync\n"
                "from kernelset.ops.loss.kernels import _softcapped, _LOG2E, _LN2\n\n\n" + src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, kernel.fn.__name__)


def case(op, dev):
    if op == "rms_norm":
        m, n = 1024, 262144
        x = torch.randn(m, n, dtype=torch.bfloat16, device=dev)
        w = torch.randn(n, dtype=torch.bfloat16, device=dev)
        ref = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
        return f"rms_norm fwd {m}x{n}", 4 * m * n, lambda: ks.rms_norm(x, w), ref
    if op == "softmax":
        m, n = 4096, 131072
        x = torch.randn(m, n, dtype=torch.bfloat16, device=dev)
        return f"softmax fwd {m}x{n}", 4 * m * n, lambda: ks.softmax(x), torch.softmax(x.float(), -1)
    m, v = 8192, 128256
    x = (torch.randn(m, v, device=dev) * 2).to(torch.bfloat16).requires_grad_()
    t = torch.randint(0, v, (m,), device=dev)
    xr = x.detach().float().requires_grad_()
    (gref,) = torch.autograd.grad(torch.nn.functional.cross_entropy(xr, t), (xr,))
    return (f"cross_entropy fwd+bwd {m}x{v}", 4 * m * v,
            lambda: torch.autograd.grad(ks.cross_entropy(x, t), (x,))[0], gref)


def main() -> int:
    args = sys.argv[1:]
    dirty = "--dirty" in args
    args = [a for a in args if a != "--dirty"]
    rounds = int(args.pop(0)) if args and args[0].isdigit() else 5
    ops = args or list(KERNELS)
    dev = torch.device("cuda")
    copy = copy_bandwidth_gbs(dev)
    print(f"{torch.cuda.get_device_name(dev)}; copy {copy:.0f} GB/s", flush=True)
    tmp = tempfile.mkdtemp()
    for op in ops:
        mod, kernel, load, store, tmod, (fchunk, fwarps) = KERNELS[op]
        base = tmod.active()
        variants = {}
        for i, (label, ef, cs, extra, chunk, warps) in enumerate(VARIANTS[op]):
            k = triton_launch.FastKernel(build(kernel, load, store, ef, cs, extra, tmp, i))
            tuning = base if chunk is None else dataclasses.replace(base, **{fchunk: chunk},
                                                                    **({fwarps: warps} if warps else {}))
            variants[label] = (k, tuning)
        name, nbytes, fn, ref = case(op, dev)
        if dirty:  # what ksctl bench holds while it times: a written 1 GiB fp32 buffer (its reference)
            name += ", a written 1 GiB buffer alive"
            spacer = torch.randn(1 << 28, device=dev)
        real = mod._fwd_split
        times = {v: [] for v in variants}
        try:
            for r in range(rounds):
                for label, (k, tuning) in variants.items():
                    if label not in times:
                        continue
                    mod._fwd_split = k
                    with tmod.use(tuning):
                        if r == 0:
                            err = rel_err(fn(), ref)
                            if not err < 2e-2:
                                print(f"{label}: WRONG {err:.3g}")
                                times.pop(label)
                                continue
                        times[label].append(cuda_time_ms(fn, warmup=3, reps=20, min_ms=40))
        finally:
            mod._fwd_split = real
        print(f"{name}, {rounds} interleaved rounds, median (min-max):", flush=True)
        for label, ts in times.items():
            med = statistics.median(ts)
            print(f"  {label:32s} {med:.4f} ms {100 * nbytes / med / 1e6 / copy:5.1f}% "
                  f"({min(ts):.4f}-{max(ts):.4f})", flush=True)
        del fn, ref
        if dirty:
            del spacer
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
