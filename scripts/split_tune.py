"""Sweep the split kernels (ops/rowsync.py) against the looped ones on a GPU, at the wide-row bar
shapes: rms_norm / layer_norm forward, softmax forward and backward, cross-entropy forward with
gradient. Every variant's output is checked against an fp32 torch computation before it is timed
(a wrong variant gets no time). Prints % of the copy bandwidth measured in the same run, then one
line per case with the best variant.

    python scripts/split_tune.py [--quick]      # --quick: the default chunk/warps and the looped kernel only
"""
from __future__ import annotations

import dataclasses
import itertools
import sys

import torch

import kernelset as ks
from kernelset.bench.timing import copy_bandwidth_gbs, cuda_time_ms
from kernelset.core.tolerance import rel_err
from kernelset.ops.loss import launch as ce_launch
from kernelset.ops.norm import policy as norm_policy
from kernelset.ops.softmax import launch as sm_launch

QUICK = "--quick" in sys.argv[1:]
CHUNKS = (8192,) if QUICK else (4096, 8192, 16384)
if "--narrow" in sys.argv[1:]:
    CHUNKS = (8192, 16384)
WARPS = (8,) if QUICK else (4, 8, 16)
if "--narrow" in sys.argv[1:]:
    WARPS = (4, 8)
if "--fwd" in sys.argv[1:]:  # the forward bar shapes and cross-entropy only, chunks 4096/8192, 2-8 warps
    CHUNKS, WARPS = (4096, 8192), (2, 4, 8)
FWD_ONLY = "--fwd" in sys.argv[1:]
NORM_ONLY = "--norm" in sys.argv[1:]  # the norm cases only (rms_norm 1024x262144 and 2048x131072, layer_norm)
if NORM_ONLY:
    CHUNKS, WARPS = (8192, 16384), (4, 8, 16)


def time_pct(fn, nbytes, copy):
    ms = cuda_time_ms(fn, warmup=3, reps=20, min_ms=30)
    return ms, 100 * nbytes / ms / 1e6 / copy


def sweep(name, nbytes, copy, variants, run, check):
    """variants: [(label, context manager factory)]; run() -> output; check(out) -> rel err."""
    best = None
    for label, ctx in variants:
        try:
            with ctx():
                err = check(run())
                if not err < 2e-2:
                    print(f"{name:34s} {label:28s} WRONG rel err {err:.3g}", flush=True)
                    continue
                ms, pct = time_pct(run, nbytes, copy)
        except Exception as exc:  # noqa: BLE001 - a variant that fails to compile or run is reported
            print(f"{name:34s} {label:28s} failed: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            continue
        print(f"{name:34s} {label:28s} {ms:8.4f} ms {pct:6.1f}% copy", flush=True)
        if best is None or pct > best[2]:
            best = (label, ms, pct)
    return best


def main() -> int:
    dev = torch.device("cuda")
    copy = copy_bandwidth_gbs(dev)
    print(f"{torch.cuda.get_device_name(dev)}; copy {copy:.0f} GB/s", flush=True)
    summary = []
    base_n = norm_policy.DEFAULT_TUNING
    norm_variants = [("looped", lambda: norm_policy.use(dataclasses.replace(base_n, split_chunk_fwd=0)))] + [
        (f"split chunk {c} warps {w}",
         lambda c=c, w=w: norm_policy.use(dataclasses.replace(base_n, split_chunk_fwd=c, split_warps_fwd=w,
                                                              split_min_fwd=0)))
        for c, w in itertools.product(CHUNKS, WARPS)]
    norm_shapes = ((1024, 262144), (2048, 131072), (4096, 65536))
    norm_shapes = norm_shapes[:1] if FWD_ONLY else norm_shapes[:2] if NORM_ONLY else norm_shapes
    for m, n in norm_shapes:
        x = torch.randn(m, n, dtype=torch.bfloat16, device=dev)
        w = torch.randn(n, dtype=torch.bfloat16, device=dev)
        ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)) * w.float()
        b = sweep(f"rms_norm fwd {m}x{n}", 4 * m * n, copy, norm_variants, lambda: ks.rms_norm(x, w),
                  lambda y: rel_err(y, ref))
        summary.append((f"rms_norm fwd {m}x{n}", b))
        del ref
    if not FWD_ONLY:
        m, n = 1024, 262144
        x = torch.randn(m, n, dtype=torch.bfloat16, device=dev) + 1
        w = torch.randn(n, dtype=torch.bfloat16, device=dev)
        ref = torch.nn.functional.layer_norm(x.float(), (n,), w.float(), w.float(), 1e-5)
        b = sweep(f"layer_norm fwd {m}x{n}", 4 * m * n, copy, norm_variants, lambda: ks.layer_norm(x, w, w),
                  lambda y: rel_err(y, ref))
        summary.append((f"layer_norm fwd {m}x{n}", b))
        del x, ref

    if NORM_ONLY:
        return _summary(summary)
    base_s = sm_launch.SoftmaxTuning()
    sm_variants = [("looped", lambda: sm_launch.use(dataclasses.replace(base_s, split_chunk_fwd=0,
                                                                         split_chunk_bwd=0)))] + [
        (f"split chunk {c} warps {w}",
         lambda c=c, w=w: sm_launch.use(dataclasses.replace(base_s, split_chunk_fwd=c, split_chunk_bwd=c,
                                                            split_warps=w, split_min_fwd=0, split_min_bwd=0)))
        for c, w in itertools.product(CHUNKS, WARPS)]
    from kernelset.ops.softmax.launch import softmax_bwd
    for m, n in ((4096, 131072),) if FWD_ONLY else ((8192, 16384), (4096, 32768), (4096, 65536), (4096, 131072),
                                                    (1024, 262144)):
        x = torch.randn(m, n, dtype=torch.bfloat16, device=dev)
        if n == 131072:
            ref = torch.softmax(x.float(), -1)
            b = sweep(f"softmax fwd {m}x{n}", 4 * m * n, copy, sm_variants, lambda: ks.softmax(x),
                      lambda y: rel_err(y, ref))
            summary.append((f"softmax fwd {m}x{n}", b))
            del ref
        if FWD_ONLY:
            del x
            continue
        y = torch.softmax(x.float(), -1).to(torch.bfloat16)
        dy = torch.randn_like(y)
        yf = y.float()
        dref = yf * (dy.float() - (dy.float() * yf).sum(-1, keepdim=True))
        b = sweep(f"softmax bwd {m}x{n}", 6 * m * n, copy, sm_variants,
                  lambda: softmax_bwd(dy, y, 1.0, False, torch.bfloat16), lambda d: rel_err(d, dref))
        summary.append((f"softmax bwd {m}x{n}", b))
        del x, y, dy, yf, dref

    base_c = ce_launch.CETuning()
    ce_variants = [("looped", lambda: ce_launch.use(dataclasses.replace(base_c, split_chunk=0)))] + [
        (f"split chunk {c} warps {w}",
         lambda c=c, w=w: ce_launch.use(dataclasses.replace(base_c, split_chunk=c, split_warps=w)))
        for c, w in itertools.product(CHUNKS, WARPS)]
    for m, v in ((8192, 128256),):
        x = (torch.randn(m, v, device=dev) * 2).to(torch.bfloat16).requires_grad_()
        t = torch.randint(0, v, (m,), device=dev)
        xr = x.detach().float().requires_grad_()
        (gref,) = torch.autograd.grad(torch.nn.functional.cross_entropy(xr, t), (xr,))
        b = sweep(f"cross_entropy fwd+bwd {m}x{v}", 4 * m * v, copy, ce_variants,
                  lambda: torch.autograd.grad(ks.cross_entropy(x, t), (x,))[0], lambda g: rel_err(g, gref))
        summary.append((f"cross_entropy fwd+bwd {m}x{v}", b))
        del x, xr, gref
    return _summary(summary)


def _summary(summary):
    print("\nbest per case (bytes: norm/softmax fwd read x + write y; softmax bwd read dy, y + write dx; "
          "cross-entropy read logits + write the gradient)")
    for name, b in summary:
        print(f"  {name:34s} " + (f"{b[0]:28s} {b[1]:.4f} ms {b[2]:.1f}% copy" if b else "no variant passed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
