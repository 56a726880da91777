"""Where the patched training step of issue 5's bar goes (Llama-3.2-1B shape, seq 2048, bf16,
kernelize(mode="training") + ks.optim.AdamW with states in the param dtype): the step's wall time,
the host time to enqueue it (the step returns before the GPU is done: if enqueueing takes as long
as the step, the step is host-bound), the GPU time of its kernels (torch.profiler, CUDA self time)
by kernel family, and the Python functions with the most own time (cProfile over two steps).

Usage (GPU, transformers installed): python scripts/train_profile.py [--unpatched] [--cuda-graphs]
(--cuda-graphs: kernelize(..., cuda_graphs=True))
"""
from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time

import torch

import kernelset as ks
from kernelset.hf.evaluate import build_model, config_for


def main() -> int:
    patched = "--unpatched" not in sys.argv
    dev = torch.device("cuda")
    cfg = config_for("llama-3.2-1b")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg["vocab_size"], (1, 2048), generator=g).to(dev)
    model = build_model(cfg, dtype=torch.bfloat16, device=dev).train()
    handle = (ks.hf.kernelize(model, mode="training", cuda_graphs="--cuda-graphs" in sys.argv) if patched
              else None)
    opt = (ks.optim.AdamW(model.parameters(), lr=1e-5, state_dtype=None) if patched
           else torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True))  # the HF Trainer's default

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    walls, hosts = [], []
    for _ in range(7):
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        hosts.append((t1 - t0) * 1e3)
        walls.append((time.perf_counter() - t0) * 1e3)
    print(f"{torch.cuda.get_device_name()}, {'patched' if patched else 'unpatched'}: step {statistics.median(walls):.1f} ms "
          f"wall, {statistics.median(hosts):.1f} ms to enqueue (medians of 7)", flush=True)
    # host time per phase, each phase timed without a sync inside the step
    phases: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer step": [], "zero_grad": []}
    for _ in range(7):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        for k, a, b in (("forward", t0, t1), ("backward", t1, t2), ("optimizer step", t2, t3), ("zero_grad", t3, t4)):
            phases[k].append((b - a) * 1e3)
    print("host ms per phase (medians of 7): " + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in phases.items()),
          flush=True)

    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    fams: dict[str, float] = {}
    total = 0.0
    for e in prof.key_averages():
        us = e.self_device_time_total if hasattr(e, "self_device_time_total") else e.self_cuda_time_total
        if us <= 0:
            continue
        total += us
        name = e.key.lower()
        fam = next((f for f in ("gemm", "gemv", "nvjet", "cutlass", "flash", "fmha", "sdpa", "adam", "norm", "rope",
                                "rotary", "silu", "swiglu", "act", "ce_", "cross", "elementwise", "reduce", "copy",
                                "memset", "embedding") if f in name), "other")
        fams[fam] = fams.get(fam, 0.0) + us
    print(f"GPU kernel time of one step: {total / 1e3:.1f} ms", flush=True)
    for fam, us in sorted(fams.items(), key=lambda t: -t[1]):
        print(f"  {fam:12s} {us / 1e3:7.2f} ms")
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=18, max_name_column_width=60))

    pr = cProfile.Profile()
    pr.enable()
    for _ in range(2):
        step()
    pr.disable()
    torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)
    # the forward's CPU side by aten op and CUDA runtime call (counts and self CPU time), to set
    # against the other variant's
    with profile(activities=[ProfilerActivity.CPU]) as cprof:
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    print(cprof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=55))
    # the backward's CPU side likewise (the autograd engine's thread included)
    loss = model(input_ids=ids, labels=ids).loss
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as bprof:
        loss.backward()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    print("backward:")
    print(bprof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=55))
    # the forward alone, by cumulative time (which module or op spends the forward's host time)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(2):
        loss = model(input_ids=ids, labels=ids).loss
    pr.disable()
    loss.backward()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("cumtime").print_stats(40)
    if handle is not None:
        print("ops", handle.counts)
        if handle.graphs is not None:
            print("graphs", handle.graphs.stats, {id_: e.failed for id_, e in handle.graphs.entries.items() if e.failed})
        handle.restore()
    return 0


if __name__ == "__main__":
    sys.exit(main())
