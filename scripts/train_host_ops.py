"""Host time of one forward call with gradients recorded (a training step's forward) per op, at
the shapes of the 1B training bar (Llama-3.2-1B: T 2048, hidden 2048, 32 / 8 heads of 64,
intermediate 8192, bf16), against the torch ops HuggingFace runs in its place. The forward is
enqueued only (no backward, outputs dropped), 300 calls per round, 5 interleaved rounds, medians;
the GPU work per call is far shorter than the host's except where noted, so host time is timed.

With ``--backward`` the same ops run forward and backward (``torch.autograd.grad`` of every input
that requires a gradient, the upstream gradient built once): host time to enqueue both, in bursts of
10 calls after a synchronize (short enough that the launch queue never fills, so the GPU's time
does not leak into the host's), 30 bursts, medians; and the GPU time per call of the same burst
(CUDA events), so a row whose GPU time exceeds its host time is known to be GPU-bound.

Usage (GPU): python scripts/train_host_ops.py [--backward]
"""
from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.nn.functional as F

import kernelset as ks
from hf_torch_ops import hf_rms, hf_rope  # (this folder: python puts it on the path)
from kernelset.hf.patching import CountingOps

dev = torch.device("cuda")
bf = torch.bfloat16
T, H, HQ, HK, D, I = 2048, 2048, 32, 8, 64, 8192
x = torch.randn(1, T, H, device=dev, dtype=bf, requires_grad=True)
w = torch.nn.Parameter(torch.randn(H, device=dev, dtype=bf))
q = torch.randn(1, HQ, T, D, device=dev, dtype=bf, requires_grad=True)
k = torch.randn(1, HK, T, D, device=dev, dtype=bf, requires_grad=True)
v = torch.randn(1, HK, T, D, device=dev, dtype=bf, requires_grad=True)
half = torch.randn(1, T, D // 2, device=dev, dtype=bf)
cos, sin = torch.cat([half.cos(), half.cos()], -1), torch.cat([half.sin(), half.sin()], -1)
gate = torch.randn(1, T, I, device=dev, dtype=bf, requires_grad=True)
up = torch.randn(1, T, I, device=dev, dtype=bf, requires_grad=True)
qs, ks_, vs = (t.transpose(1, 2) for t in (q, k, v))  # [B, S, H, D] for ks.flash_attention
counting = CountingOps()


CASES = {
    "ks.rms_norm (torch_order, llama cast string, as kernelize calls it)":
        lambda: ks.rms_norm(x, w, eps=1e-5, cast="llama", torch_order=True),
    "the same through kernelize's counting wrapper":
        lambda: counting.rms_norm(x, w, eps=1e-5, cast="llama", torch_order=True),
    "HF LlamaRMSNorm math (torch ops)": lambda: hf_rms(x, w),
    "ks.apply_rotary": lambda: ks.apply_rotary(q, k, cos, sin),
    "HF apply_rotary_pos_emb (torch ops)": lambda: hf_rope(q, k, cos, sin),
    "ks.swiglu": lambda: ks.swiglu(gate, up),
    "F.silu(gate) * up": lambda: F.silu(gate) * up,
    "ks.flash_attention (causal, GQA) [GPU-bound: ~0.1 ms]": lambda: ks.flash_attention(qs, ks_, vs, causal=True),
    "F.scaled_dot_product_attention (causal, GQA)": lambda: F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True),
}


W1 = torch.nn.Parameter(torch.randn(I, H, device=dev, dtype=bf) * 0.02)

BWD_CASES = {
    "ks.rms_norm (as kernelize calls it)": (lambda: ks.rms_norm(x, w, eps=1e-5, cast="llama", torch_order=True),
                                            (x, w)),
    "HF LlamaRMSNorm math": (lambda: hf_rms(x, w), (x, w)),
    "ks.apply_rotary": (lambda: ks.apply_rotary(q, k, cos, sin), (q, k)),
    "HF apply_rotary_pos_emb": (lambda: hf_rope(q, k, cos, sin), (q, k)),
    "ks.swiglu": (lambda: ks.swiglu(gate, up), (gate, up)),
    "F.silu(gate) * up": (lambda: F.silu(gate) * up, (gate, up)),
    "ks.flash_attention (causal, GQA)": (lambda: ks.flash_attention(qs, ks_, vs, causal=True), (q, k, v)),
    "F.sdpa (causal, GQA)": (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                             (q, k, v)),
    "F.linear 2048 -> 8192 (the same both ways)": (lambda: F.linear(x, W1), (x, W1)),
}


def backward_main() -> None:
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    print("host / GPU us per forward + backward call (median of 30 bursts of 10):")
    for name, (f, ins) in BWD_CASES.items():
        out = f()
        outs = out if isinstance(out, tuple) else (out,)
        grads = tuple(torch.randn_like(o) for o in outs)
        call = lambda: torch.autograd.grad(f() if not isinstance(out, tuple) else f(), ins, grads)  # noqa: E731
        for _ in range(5):
            call()
        hosts, gpus = [], []
        for _ in range(30):
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            e0.record()
            for _ in range(10):
                call()
            e1.record()
            hosts.append((time.perf_counter() - t0) / 10 * 1e6)
            torch.cuda.synchronize()
            gpus.append(e0.elapsed_time(e1) / 10 * 1e3)
        h, gt = statistics.median(hosts), statistics.median(gpus)
        print(f"  {name:45s} host {h:7.1f}  GPU {gt:7.1f}{'  (GPU-bound)' if gt > h else ''}", flush=True)


def main() -> None:
    if "--backward" in sys.argv:
        backward_main()
        return
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    times: dict[str, list[float]] = {c: [] for c in CASES}
    for f in CASES.values():
        for _ in range(20):
            f()
    torch.cuda.synchronize()
    for _ in range(5):
        for name, f in CASES.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(300):
                f()
            times[name].append((time.perf_counter() - t0) / 300 * 1e6)
    torch.cuda.synchronize()
    print("host us per forward call with gradients recorded (median of 5 rounds of 300, min-max):")
    for name, ts in times.items():
        print(f"  {name:70s} {statistics.median(ts):7.1f}  ({min(ts):.1f}-{max(ts):.1f})")


if __name__ == "__main__":
    main()
