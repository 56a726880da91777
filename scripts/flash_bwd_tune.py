"""Sweep the Triton flash-attention backward's tiles (dQ by atomics or by its own kernel) on a GPU.

    python scripts/flash_bwd_tune.py                     # B8 S4096 H32 D128 causal, and the other shapes
    python scripts/flash_bwd_tune.py --quick             # the bar shape only
    python scripts/flash_bwd_tune.py --wide              # head sizes 256 and 192/128 (WIDE_CONFIGS)

For each shape: SDPA's flash and cuDNN backends (fwd+bwd, their own backward) and our Triton
forward + backward under each launch in CONFIGS, every gradient checked against SDPA flash's, or
the first implementation that ran where it cannot (a wrong config is printed WRONG and gets no time), timed with CUDA events (median). The backward
alone is timed by replaying autograd.grad over one saved forward. Prints the best config per
shape; the policy in ops/attention/launch.py takes the winner.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

import torch
import torch.nn.functional as F

import kernelset as ks
from kernelset.bench import timing
from kernelset.core.tolerance import rel_err
from kernelset.ops.attention import launch as L

# (dkdv_m, dkdv_n, warps, stages, atomic): ptxas on sm_90a (Triton 3.6) reports no spills for the
# 32x128 / 16x128 atomic tiles at 8 warps; 64x64 atomic spills 76 bytes; 64x128 spills 584
# (.., True, True): dQ as (K^T dS^T)^T, all wgmma (the 32-row dS^T K product is mma.sync), 32-64 B spilled.
# H100 runs (docs/benchmarks/2026-11-25-h100-s9): run 1 swept 64x64, 16x128, 64x128, 32x128 with and
# without atomics (32x128 atomic best, 9.9 ms bwd at B8 S4096 causal); run 2 added the transposed dQ
# product (8.6 ms) over five shapes; this list is what stayed in contention
CONFIGS = [
    (32, 128, 8, 3, True, True), (32, 128, 8, 2, True, True), (32, 128, 8, 4, True, True),
    (64, 128, 8, 2, True, True), (64, 128, 8, 2, True), (32, 128, 8, 3, True),
]
SHAPES = [  # (B, S, Hq, Hkv, D, causal)
    (8, 4096, 32, 32, 128, True), (1, 16384, 32, 32, 128, True), (4, 4096, 32, 32, 128, False),
    (8, 4096, 32, 8, 128, True), (16, 2048, 16, 16, 64, True),
]


def _sdpa(which):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def fn(q, k, v, causal):
        gqa = {"enable_gqa": True} if q.shape[2] != k.shape[2] else {}
        with sdpa_kernel([getattr(SDPBackend, which)]):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=causal, **gqa).transpose(1, 2)
    return fn


def _ours(q, k, v, causal):
    return ks.flash_attention(q, k, v, causal=causal, backend="triton")


WIDE_CONFIGS = [(32, 64, 8, 1, True), (32, 64, 8, 2, True), (16, 128, 8, 1, True), (16, 64, 4, 2, True),
                (32, 64, 8, 1, False)]  # head sizes 192 / 256 (padded to 256): dK/dV take most registers
WIDE_SHAPES = [(4, 4096, 16, 16, 256, True), (4, 4096, 16, 16, 192, 128, True)]  # Gemma; MLA prefill (qk 192, v 128)


def run_shape(shape, configs, device):
    if len(shape) == 7:  # (B, S, Hq, Hkv, D, Dv, causal)
        b, s, hq, hkv, d, dv, causal = shape
    else:
        b, s, hq, hkv, d, causal = shape
        dv = d
    gen = torch.Generator(device=device).manual_seed(0)
    mk = lambda h, e: torch.randn(b, s, h, e, device=device, dtype=torch.bfloat16, generator=gen)  # noqa: E731
    q, k, v = mk(hq, d).requires_grad_(), mk(hkv, d).requires_grad_(), mk(hkv, dv).requires_grad_()
    do = mk(hq, dv)
    flops = 2 * b * hq * s * s * (d + dv) // (2 if causal else 1)  # forward; the backward is 2.5x
    dims = f"D{d}" if d == dv else f"D{d}/{dv}"
    print(f"\n== B{b} S{s} H{hq}/{hkv} {dims} {'causal' if causal else 'full'}: fwd {flops / 1e12:.2f} TFLOP",
          flush=True)
    want = None
    rows = []

    def measure(name, fwd, check=True):
        nonlocal want
        try:
            out = fwd(q, k, v, causal)
            grads = torch.autograd.grad(out, (q, k, v), do)
            if want is None:  # SDPA flash's; where it has no kernel (192/128), the next that ran
                want = grads
                print(f"  (gradients checked against {name}'s)", flush=True)
            elif check:
                errs = [rel_err(g, w) for g, w in zip(grads, want)]
                if max(errs) > 2e-2:
                    print(f"  {name}: WRONG (rel err vs sdpa flash {['%.1e' % e for e in errs]})", flush=True)
                    return
            step = timing.cuda_time_ms(lambda: torch.autograd.grad(fwd(q, k, v, causal), (q, k, v), do),
                                       warmup=2, reps=10, min_ms=100.0)
            out = fwd(q, k, v, causal)
            bwd = timing.cuda_time_ms(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True),
                                      warmup=2, reps=10, min_ms=100.0)
        except Exception as exc:  # a config that does not compile or run is reported, not ranked
            print(f"  {name}: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
            return
        rows.append((name, step, bwd))
        print(f"  {name:38s} fwd+bwd {step:7.3f} ms ({3.5 * flops / step / 1e9:4.0f} TFLOP/s)   "
              f"bwd {bwd:7.3f} ms ({2.5 * flops / bwd / 1e9:4.0f} TFLOP/s)", flush=True)

    measure("sdpa-flash", _sdpa("FLASH_ATTENTION"))
    measure("sdpa-cudnn", _sdpa("CUDNN_ATTENTION"))
    base = L.flash_policy(d, dv, torch.cuda.get_device_capability(device))
    measure(f"ours policy {base.dkdv_m}x{base.dkdv_n} w{base.dkdv_warps} s{base.dkdv_stages} "
            f"{'atomic' if base.atomic_dq else 'dq-kernel'}{' trans' if base.dq_trans else ''}", _ours)
    for m, n, w, st, atomic, *trans in configs:
        trans = bool(trans and trans[0])
        cfg = dataclasses.replace(base, dkdv_m=m, dkdv_n=n, dkdv_warps=w, dkdv_stages=st, atomic_dq=atomic,
                                  dq_trans=trans)
        with L.FLASH_TUNING.use(L.FlashTuning(cfg)):
            measure(f"ours {m}x{n} w{w} s{st} {'atomic' if atomic else 'dq-kernel'}{' trans' if trans else ''}", _ours)
    flash = next((r for r in rows if r[0] == "sdpa-flash"), None)
    ours = [r for r in rows if r[0].startswith("ours")]
    if ours:
        best = min(ours, key=lambda r: r[1])
        ratio = f", {flash[1] / best[1]:.2f}x sdpa-flash fwd+bwd, bwd {flash[2] / best[2]:.2f}x" if flash else ""
        print(f"  best: {best[0]} {best[1]:.3f} ms{ratio}", flush=True)
    del q, k, v, do, want
    torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the bar shape only")
    ap.add_argument("--wide", action="store_true", help="head sizes 256 and 192/128 instead")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    print(torch.cuda.get_device_name(device), "torch", torch.__version__, "triton", __import__("triton").__version__)
    if args.wide:
        for shape in WIDE_SHAPES:
            run_shape(shape, WIDE_CONFIGS, device)
        return 0
    for shape in SHAPES[:1] if args.quick else SHAPES:
        run_shape(shape, CONFIGS, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
