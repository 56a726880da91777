"""Why a training step timed after hf_check's inference phases is slower than one timed alone:
the 1B training step (patched and unpatched) is timed in a fresh process, then after
``hf_check.py``'s inference phases ran in the same process (8 layers), then again with Python's
garbage collector frozen, and the state that grew in between is printed (live Python objects,
kernelset's caches).

Usage (GPU, transformers installed): python scripts/train_after_inference.py
"""
from __future__ import annotations

import gc
import os
import statistics
import sys
import time

import torch

import kernelset as ks
from kernelset.hf.evaluate import build_model, config_for

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def step_ms(patched: bool) -> float:
    cfg = config_for("llama-3.2-1b")
    ids = torch.randint(0, cfg["vocab_size"], (1, 2048), generator=torch.Generator().manual_seed(0)).cuda()
    model = build_model(cfg, dtype=torch.bfloat16, device="cuda").train()
    handle = ks.hf.kernelize(model, mode="training") if patched else None
    opt = (ks.optim.AdamW(model.parameters(), lr=1e-5, state_dtype=None) if patched
           else torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True))  # the HF Trainer's default

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    for _ in range(3):
        step()
    ts = []
    for _ in range(7):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    if handle is not None:
        handle.restore()
    gc.collect()
    torch.cuda.empty_cache()
    return statistics.median(ts)


def state() -> str:
    from kernelset.core import dispatch
    from kernelset.ops import triton_launch as tl
    from kernelset.ops.norm import api as norm_api
    from kernelset.ops.rope import api as rope_api
    sites = sum(len(getattr(k, "sites", {}) or {}) for k in getattr(tl, "_ALL", []))
    return (f"live objects {len(gc.get_objects())}, gc counts {gc.get_count()}, dispatch cache "
            f"{len(dispatch._cache)}, bound sites {sites}, norm replays {len(norm_api._EAGER)}, rope replays "
            f"{len(rope_api._APPLY_EAGER)}")


def report(label: str) -> None:
    un, pa = step_ms(False), step_ms(True)
    un2, pa2 = step_ms(False), step_ms(True)
    print(f"{label}: unpatched {statistics.median([un, un2]):.1f} ms, patched {statistics.median([pa, pa2]):.1f} ms "
          f"({un:.1f}/{un2:.1f}, {pa:.1f}/{pa2:.1f}); {state()}", flush=True)


def main() -> int:
    print(torch.cuda.get_device_name(), flush=True)
    report("fresh process")
    import hf_check
    hf_check.main(["--layers", "8", "--skip", "train,fp32"])
    gc.collect()
    torch.cuda.empty_cache()
    report("after hf_check's inference phases")
    gc.freeze()
    report("the same, gc.freeze()")
    gc.unfreeze()
    return 0


if __name__ == "__main__":
    sys.exit(main())
