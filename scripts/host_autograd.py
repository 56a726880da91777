"""Host cost of one training call (forward with gradients recorded + its backward) per op, at
tiny shapes so the GPU's work is negligible and the time measured is the host's: kernelset's op
against the torch ops HuggingFace runs in its place, with F.linear as the yardstick of one plain
torch autograd node. Each sample enqueues 16 independent calls on the same inputs, one backward
over all 16 outputs, then synchronizes; the per-call cost is that time over 16 (the backward
engine's start is shared, as it is in a training step). Cases alternate in rounds; medians.

Usage (GPU): python scripts/host_autograd.py [rounds] [--profile NAME]
"""
from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import kernelset as ks
from hf_torch_ops import hf_rms, hf_rope  # (this folder: python puts it on the path)

dev = torch.device("cuda")
bf = torch.bfloat16
T, H, HQ, HK, D, I = 16, 2048, 32, 8, 64, 8192
N = 16


def leaf(*shape, scale=1.0):
    return (torch.randn(*shape, device=dev, dtype=bf) * scale).requires_grad_()


x = leaf(1, T, H)
w = leaf(H)
q = leaf(1, HQ, T, D)
k = leaf(1, HK, T, D)
v = leaf(1, HK, T, D)
half = torch.randn(1, T, D // 2, device=dev, dtype=bf)
cos, sin = torch.cat([half.cos(), half.cos()], -1), torch.cat([half.sin(), half.sin()], -1)
gate = leaf(1, T, I)
up = leaf(1, T, I)
wl = leaf(I, H, scale=0.02)
wg, wu, wd = leaf(I, H, scale=0.02), leaf(I, H, scale=0.02), leaf(H, I, scale=0.02)


def hf_attn(q, k, v):  # transformers' sdpa_attention_forward, causal, no mask, GQA through enable_gqa
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return out.transpose(1, 2).contiguous()


def ks_attn(q, k, v):  # as kernelize's attention function calls it ([B, H, S, D] in, [B, S, H, D] out)
    return ks.flash_attention(q, k, v, causal=True, layout="bhsd").transpose(1, 2)


def hf_mlp(x):
    return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)


def ks_mlp(x):
    return F.linear(ks.swiglu(F.linear(x, wg), F.linear(x, wu)), wd)


class _Bare(torch.autograd.Function):  # the floor of a Python autograd.Function: one allocation each way
    @staticmethod
    def forward(ctx, t):
        return torch.empty_like(t)

    @staticmethod
    def backward(ctx, g):
        return torch.empty_like(g)


_c_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, _Bare)


def _cudnn_direct(q, k, v):
    o = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True, False)[0]
    return o.transpose(1, 2).contiguous()


def _sdpa_pinned(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return hf_attn(q, k, v)


CASES = {
    "bare autograd.Function (Function.apply)": lambda: _Bare.apply(x),
    "bare autograd.Function (C apply)": lambda: _c_apply(x),
    "F.linear 2048 -> 8192 (one torch node)": lambda: F.linear(x, wl),
    "ks.rms_norm (torch_order, as kernelize)": lambda: ks.rms_norm(x, w, eps=1e-5, cast=ks.NormCast.LLAMA,
                                                                  torch_order=True),
    "HF LlamaRMSNorm math": lambda: hf_rms(x, w),
    "ks.apply_rotary": lambda: ks.apply_rotary(q, k, cos, sin),
    "HF apply_rotary_pos_emb": lambda: hf_rope(q, k, cos, sin),
    "ks.swiglu": lambda: ks.swiglu(gate, up),
    "F.silu(gate) * up": lambda: F.silu(gate) * up,
    "ks.flash_attention (as kernelize)": lambda: ks_attn(q, k, v),
    "HF sdpa attention (enable_gqa)": lambda: hf_attn(q, k, v),
    "the same under sdpa_kernel(CUDNN)": lambda: _sdpa_pinned(q, k, v),
    "aten cuDNN attention op direct": lambda: _cudnn_direct(q, k, v),
    "MLP: 3 linears + ks.swiglu": lambda: ks_mlp(x),
    "MLP: 3 linears + silu * up (HF)": lambda: hf_mlp(x),
    "MLP: ks.gated_mlp (one node)": lambda: ks.gated_mlp(x, wg, wu, wd),
}


def sample(f) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = []
    for _ in range(N):
        o = f()
        outs.extend(o if isinstance(o, tuple) else (o,))
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / N * 1e6


def clear():
    for t in (x, w, q, k, v, gate, up, wl, wg, wu, wd):
        t.grad = None


def main() -> int:
    argv = sys.argv[1:]
    prof = argv.index("--profile") if "--profile" in argv else None
    args = [a for i, a in enumerate(argv) if not a.startswith("--") and (prof is None or i != prof + 1)]
    rounds = int(args[0]) if args else 30
    if "--profile" in sys.argv:
        name = sys.argv[sys.argv.index("--profile") + 1]
        f = next(f for n, f in CASES.items() if n.startswith(name))
        for _ in range(5):
            sample(f)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(20):
            sample(f)
            clear()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(30)
        return 0
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    times: dict[str, list[float]] = {c: [] for c in CASES}
    for f in CASES.values():
        for _ in range(5):
            sample(f)
            clear()
    for _ in range(rounds):
        for name, f in CASES.items():
            times[name].append(sample(f))
            clear()
    print(f"host us per training call (forward + backward; {N} calls per sample, median of {rounds} rounds, "
          "min):")
    for name, ts in times.items():
        print(f"  {name:45s} {statistics.median(ts):7.1f}  ({min(ts):.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
