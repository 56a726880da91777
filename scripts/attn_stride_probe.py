"""Which q/k/v layouts a family hands kernelset's attention, and whether the kernel gives the same
result on contiguous copies (a strided-input check on real call sites).

Usage: python scripts/attn_stride_probe.py [--family moshi] [--device cuda]
"""
from __future__ import annotations

import argparse
import warnings

import torch

import kernelset as ks
from kernelset.core.tolerance import rel_err
from kernelset.hf import attention as hfa
from kernelset.hf.presets import tiny_from_defaults


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--family", default="moshi")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    warnings.simplefilter("ignore")
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(tiny_from_defaults(args.family), attn_implementation="eager")
    m = m.float().eval().to(args.device)
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1)).to(args.device)
    real = hfa.make_attention

    def spy_make(ops=None):
        inner = real(ops)

        def attention(module, q, k, v, mask, **kw):
            out, w = inner(module, q, k, v, mask, **kw)
            again, _ = inner(module, q.contiguous(), k.contiguous(), v.contiguous(), mask, **kw)
            print(f"q {tuple(q.shape)} {q.stride()} k {k.stride()} v {v.stride()} mask {type(mask).__name__} "
                  f"kw {sorted(kw)}: strided vs contiguous rel err {rel_err(out, again):.1e}", flush=True)
            return out, w
        return attention
    hfa.make_attention = spy_make
    with torch.no_grad():
        ref = m(ids).logits
        with ks.hf.kernelize(m, ops={"flash_attention"}):
            got = m(ids).logits
    print(f"{args.family}: rel err {rel_err(got, ref):.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
