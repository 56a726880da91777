"""Where the prefill wall time goes (GPU): host-bound or GPU-bound, and where the GPU sits idle.

    python scripts/prefill_gaps.py [--layers 32] [--seq 2048]

For the Llama-3-8B-shaped bf16 prefill of issue 5 (unpatched HF SDPA and kernelized), per call:

- wall: time from the call to the end of its GPU work (synchronized), median of 5;
- enqueue: time until the call returns without synchronizing (the host's own work), median of 5;
  when it is close to wall, the host sets the pace;
- kernels: the sum of kernel times in the profiler; idle = the GPU time between the first kernel's
  start and the last kernel's end not covered by a kernel, split by the kernel that follows the
  gap (what the GPU was waiting for);
- synchronizing calls: torch's sync debug mode counts the host syncs inside one call;
- the 15 kernels with the most time.
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time
import warnings


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--seq", type=int, default=2048)
    args = p.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    import kernelset as ks
    from kernelset.hf.evaluate import build_model, config_for

    dev = torch.device("cuda")
    cfg = config_for("llama-3-8b", layers=args.layers)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg["vocab_size"], (1, args.seq), generator=g).to(dev)
    model = build_model(cfg, dtype=torch.bfloat16, device=dev)
    model.set_attn_implementation("sdpa")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; Llama-3-8B shape, {args.layers} layers, "
          f"1x{args.seq} bf16", flush=True)

    def fn():
        return model(ids, use_cache=False)

    def measure(name: str) -> None:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        walls, enq = [], []
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            enq.append((t1 - t0) * 1e3)
            walls.append((t2 - t0) * 1e3)
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
        torch.cuda.set_sync_debug_mode("default")
        syncs = collections.Counter(str(w.message).split("\n")[0][:90] for w in caught)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        kern = sorted(((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                       if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda k: k[0])
        busy = sum(e - s for s, e, _ in kern)
        idle = collections.Counter()
        count = collections.Counter()
        end = kern[0][1]
        for s, e, nm in kern[1:]:
            if s > end:
                idle[nm[:70]] += s - end
                count[nm[:70]] += 1
            end = max(end, e)
        span = (kern[-1][1] - kern[0][0]) / 1e3
        print(f"--- {name}: wall {statistics.median(walls):.2f} ms, enqueue {statistics.median(enq):.2f} ms "
              f"(host returns {statistics.median(walls) - statistics.median(enq):.2f} ms before the GPU ends); "
              f"GPU span {span:.2f} ms, kernels {busy / 1e3:.2f} ms, idle {sum(idle.values()) / 1e3:.2f} ms; "
              f"{len(kern)} kernels; synchronizing calls: {sum(syncs.values())}", flush=True)
        for msg, n in syncs.most_common(5):
            print(f"    sync x{n}: {msg}")
        for nm, us in idle.most_common(12):
            print(f"    idle {us / 1e3:7.3f} ms in {count[nm]:4d} gaps before {nm}")
        by_name, calls = collections.Counter(), collections.Counter()
        for s0, e0, nm in kern:
            by_name[nm[:80]] += e0 - s0
            calls[nm[:80]] += 1
        for nm, us in by_name.most_common(15):  # where the kernel time goes
            print(f"    kernel {us / 1e3:7.3f} ms in {calls[nm]:4d} calls: {nm}")

    with torch.no_grad():
        measure("HF sdpa")
        with ks.hf.kernelize(model) as h:
            measure("kernelset")
            print(f"    ops {dict(h.counts)}")
        with ks.hf.kernelize(model, merge_projections=False):  # HF's GEMM shapes
            measure("kernelset, projections not merged")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
