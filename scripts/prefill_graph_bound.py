"""How much of issue 5's prefill bar (1.3x over HF SDPA, Llama-3-8B shape, 1x2048 bf16) CUDA graphs
could buy: the kernelized model's whole cache-less forward captured as one CUDA graph and
replayed, against the same forward eager and against unpatched HF SDPA (eager and captured too).
kernelize runs with merge_projections=False here, so every graph reads the parameters where they
stay (the merged GEMMs measured the same at this size: 53.5 against 53.6 ms, session 25 run 4).
An upper bound for any per-layer graphing: no launch gap, no host time. Interleaved rounds, wall
time per call synchronized, medians.

Usage (GPU, transformers installed): python scripts/prefill_graph_bound.py [--layers 32] [--rounds 5]
"""
from __future__ import annotations

import argparse
import statistics

import torch
from hf_check import _median_time  # (this folder: python puts it on the path)

import kernelset as ks
from kernelset.hf.evaluate import build_model, config_for


def _wall(fn) -> float:
    return _median_time(fn, repeats=5, warmup=1) * 1e3


def _graphed(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    g.replay()
    same = torch.equal(out, fn())  # the replay's logits against an eager call's
    print(f"  captured; replay equals eager: {same}", flush=True)
    return g.replay


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    cfg = config_for("llama-3-8b", layers=args.layers)
    ids = torch.randint(0, cfg["vocab_size"], (1, args.seq), generator=torch.Generator().manual_seed(0)).cuda()
    model = build_model(cfg, dtype=torch.bfloat16, device="cuda")
    model.set_attn_implementation("sdpa")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; Llama-3-8B shape, {args.layers} layers, "
          f"1x{args.seq} bf16, no cache", flush=True)

    def fwd():
        return model(ids, use_cache=False).logits

    with torch.no_grad():
        variants = {"hf_sdpa": fwd}
        try:
            variants["hf_sdpa_graph"] = _graphed(fwd)
        except Exception as exc:  # noqa: BLE001
            print(f"hf_sdpa_graph: capture failed ({type(exc).__name__}: {exc})")
        handle = ks.hf.kernelize(model, merge_projections=False)
        variants["kernelset"] = fwd
        try:
            variants["kernelset_graph"] = _graphed(fwd)
        except Exception as exc:  # noqa: BLE001
            print(f"kernelset_graph: capture failed ({type(exc).__name__}: {exc})")
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                patched = name.startswith("kernelset")
                if patched and not handle.active:
                    handle = ks.hf.kernelize(model, merge_projections=False)
                if not patched and handle.active:
                    handle.restore()
                times[name].append(_wall(fn))
        handle.restore()
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["hf_sdpa"]
    for k, v in med.items():
        print(f"{k:18s} {v:7.2f} ms  {base / v:5.3f}x hf_sdpa  rounds {[round(t, 2) for t in times[k]]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
