"""Per-call wall time of the ops a decode step runs, kernelset against what HF runs unpatched (GPU).

    python scripts/decode_ops.py [--batches 1,32] [--rounds 7]

Decode is host-bound in HF's eager generate: what a call costs on the host decides. Each case is
timed as calls in a row with one synchronize at the end (wall time per call), in interleaved
rounds (the lent host's speed drifts), medians printed. Attention is called the way decode calls
it: one query token against a KV cache one token longer at every call (a backend that builds a
plan per shape pays for it at every step), for each flash_attention backend forced and AUTO.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import kernelset as ks


def _wall_us(fn, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(calls):
        fn(i)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,32")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=64)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("decode_ops: no CUDA device")
        return 0
    dev, dt = torch.device("cuda"), torch.bfloat16
    hq, hkv, d, hidden, inter = 32, 8, 128, 4096, 14336
    print(f"device {torch.cuda.get_device_name()}; torch {torch.__version__}; Llama-3-8B decode shapes", flush=True)
    for b in (int(s) for s in args.batches.split(",")):
        ctx0, maxlen = 2048, 2048 + args.calls * (args.rounds + 2) * 8
        kc = torch.randn(b, hkv, maxlen, d, device=dev, dtype=dt)  # HF's cache layout [B, Hkv, L, D]
        vc = torch.randn(b, hkv, maxlen, d, device=dev, dtype=dt)
        q = torch.randn(b, hq, 1, d, device=dev, dtype=dt)
        x = torch.randn(b, 1, hidden, device=dev, dtype=dt)
        w = torch.randn(hidden, device=dev, dtype=dt)
        gate = torch.randn(b, 1, inter, device=dev, dtype=dt)
        up = torch.randn(b, 1, inter, device=dev, dtype=dt)
        qr = torch.randn(b, hq, 1, d, device=dev, dtype=dt)
        kr = torch.randn(b, hkv, 1, d, device=dev, dtype=dt)
        cos = torch.randn(b, 1, d, device=dev, dtype=dt)
        sin = torch.randn(b, 1, d, device=dev, dtype=dt)
        offset = [ctx0]

        def attn(backend):
            def call(i):
                sk = offset[0] + i
                k = kc[:, :, :sk].transpose(1, 2)
                v = vc[:, :, :sk].transpose(1, 2)
                return ks.flash_attention(q.transpose(1, 2), k, v, causal=False, backend=backend)
            return call

        def hf_sdpa(i):  # transformers' sdpa_attention_forward at decode: enable_gqa, no mask
            sk = offset[0] + i
            return F.scaled_dot_product_attention(q, kc[:, :, :sk], vc[:, :, :sk], enable_gqa=True)

        def hf_rms(_):
            h = x.to(torch.float32)
            var = h.pow(2).mean(-1, keepdim=True)
            return w * (h * torch.rsqrt(var + 1e-5)).to(dt)

        def hf_rope(_):
            def rot(t):
                return torch.cat((-t[..., d // 2:], t[..., : d // 2]), dim=-1)
            c, s = cos.unsqueeze(1), sin.unsqueeze(1)
            return qr * c + rot(qr) * s, kr * c + rot(kr) * s

        cases = {
            "attention HF sdpa (F.sdpa, enable_gqa)": hf_sdpa,
            **{f"attention ks {name}": attn(name) for name in ("auto", "sdpa_cudnn", "sdpa_flash", "triton")},
            "rms_norm HF (7 ops)": hf_rms,
            "rms_norm ks": lambda _: ks.rms_norm(x, w, eps=1e-5),
            "swiglu torch (silu * up)": lambda _: F.silu(gate) * up,
            "swiglu ks": lambda _: ks.swiglu(gate, up),
            "rope HF (apply_rotary_pos_emb)": hf_rope,
            "rope ks apply_rotary": lambda _: ks.apply_rotary(qr, kr, cos, sin),
        }
        times: dict[str, list[float]] = {k: [] for k in cases}
        with torch.no_grad():
            for name, fn in cases.items():  # warm-up: compile, first dispatch
                try:
                    fn(0)
                except Exception as exc:
                    print(f"  {name}: {type(exc).__name__}: {str(exc)[:200]}")
                    times.pop(name)
            for _ in range(args.rounds):
                for name in list(times):
                    offset[0] += args.calls  # fresh KV lengths every round
                    times[name].append(_wall_us(cases[name], args.calls))
        print(f"\nbatch {b}: wall time per call (us, median of {args.rounds} rounds of {args.calls} calls)")
        for name, ts in times.items():
            print(f"  {name:<44} {statistics.median(ts):9.1f}")
        print("  AUTO picks:", ks.explain("flash_attention", q.transpose(1, 2), kc[:, :, :ctx0].transpose(1, 2),
                                           vc[:, :, :ctx0].transpose(1, 2), verbose=False).chosen, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
