"""Host cost of one decode-size attention call (GPU): kernelset's flash_attention against the
SDPA calls under it and what transformers' SDPA path calls, then a cProfile of ours.

    python scripts/attn_host.py [batch] [kv_len]

Llama-3-8B decode shapes: 1 query token, 32 query / 8 KV heads, head size 128; q, k, v passed
as the kernelset attention function gets them from transformers (transposed views of
[B, H, S, D] tensors). Wall time per call of calls in a row (one synchronize at the end): at
these sizes the host sets the pace, so it is the host's cost per call.
"""
from __future__ import annotations

import cProfile
import pstats
import sys

import torch
import torch.nn.functional as F

import kernelset as ks
from kernelset.bench.timing import host_us_per_call
from kernelset.ops.attention import api as A


def main() -> None:
    b, sk = (int(a) for a in (sys.argv[1:] + ["1", "2048"][len(sys.argv) - 1:])[:2])
    dev, dt = torch.device("cuda"), torch.bfloat16
    q = torch.randn(b, 32, 1, 128, device=dev, dtype=dt)
    k = torch.randn(b, 8, sk, 128, device=dev, dtype=dt)
    v = torch.randn(b, 8, sk, 128, device=dev, dtype=dt)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    aten = torch.ops.aten
    scale = 128 ** -0.5
    rows = [
        ("F.sdpa enable_gqa (HF's call)", lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True, scale=scale)),
        ("aten flash direct", lambda: aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False,
                                                                                scale=scale)[0]),
        ("ks.flash_attention auto", lambda: ks.flash_attention(qt, kt, vt, causal=False, scale=scale)),
        ("ks.flash_attention sdpa_flash", lambda: ks.flash_attention(qt, kt, vt, causal=False, scale=scale,
                                                                     backend="sdpa_flash")),
        ("  _check_qkv", lambda: A._check_qkv("flash_attention", qt, kt, vt, 4, "[B, S, H, D]")),
        ("  _options", lambda: A._options("flash_attention", qt, scale, 0.0, (-1, -1), None)),
        ("  _select", lambda: A._select("flash_attention", "auto", (qt, kt, vt, None, None),
                                        A._kw(False, -1, -1, 0.0, None, False, 1, sk))),
        ("  torch.empty lse", lambda: torch.empty((b, 32, 1), dtype=torch.float32, device=dev)),
    ]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: decode attention B{b} KV {sk}, "
          f"host us per call (median of 5 rounds)", flush=True)
    import statistics
    res = {label: [] for label, _ in rows}
    for _ in range(5):
        for label, fn in rows:
            res[label].append(host_us_per_call(fn, calls=2000))
    for label, _ in rows:
        print(f"  {label:<34} {statistics.median(res[label]):8.2f} us", flush=True)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(5000):
        ks.flash_attention(qt, kt, vt, causal=False, scale=scale)
    pr.disable()
    torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("tottime").print_stats(28)


if __name__ == "__main__":
    main()
