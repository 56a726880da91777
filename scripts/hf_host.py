"""Host time of a training step, by phase (GPU): how long Python takes to enqueue the forward, the
backward and the optimizer step, against the device time of the whole step.

    python scripts/hf_host.py [--seq 2048] [--sets "none;all;rms_norm;..."]

Each phase starts after a synchronize and is timed until its Python call returns (the kernels it
queued may still run): when the sum of the phases exceeds the device time, the step is host-bound.
Each set of kernelset ops is patched alone (kernelize(ops=...)), so the host cost of each op shows
as the difference to "none" (unpatched, torch.optim.AdamW) and "optim" (only kernelset's AdamW).
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--sets", default="none;optim;all;rms_norm;swiglu;apply_rotary;flash_attention;"
                                     "linear_cross_entropy,cross_entropy;embedding")
    args = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("hf_host: no CUDA device")
        return 0
    import kernelset as ks
    from kernelset.hf.evaluate import build_model, config_for
    dev = torch.device("cuda")
    print(f"device {torch.cuda.get_device_name()}; torch {torch.__version__}", flush=True)
    cfg = config_for("llama-3.2-1b")
    ids = torch.randint(0, cfg["vocab_size"], (1, args.seq), generator=torch.Generator().manual_seed(0)).to(dev)
    model = build_model(cfg, dtype=torch.bfloat16, device=dev).train()
    print(f"{'ops':<40} {'fwd':>8} {'bwd':>8} {'optim':>8} {'host sum':>9} {'step wall':>9}  (ms, medians)",
          flush=True)
    for spec in args.sets.split(";"):
        ops = None if spec in ("none", "optim") else (None if spec == "all" else spec.split(","))
        handle = None if spec in ("none", "optim") else ks.hf.kernelize(model, mode="training", ops=ops)
        opt = (torch.optim.AdamW if spec == "none" else ks.optim.AdamW)(model.parameters(), lr=1e-5)
        rows = []
        for i in range(args.repeats + 2):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            loss.backward()
            t3 = time.perf_counter()
            torch.cuda.synchronize()
            t4 = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            t5 = time.perf_counter()
            torch.cuda.synchronize()
            # the whole step without synchronizing between phases
            t6 = time.perf_counter()
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            t7 = time.perf_counter()
            if i >= 2:
                rows.append((t1 - t0, t3 - t2, t5 - t4, t7 - t6))
        med = [statistics.median(r[j] for r in rows) * 1e3 for j in range(4)]
        print(f"{spec:<40} {med[0]:8.2f} {med[1]:8.2f} {med[2]:8.2f} {sum(med[:3]):9.2f} {med[3]:9.2f}", flush=True)
        if handle is not None:
            handle.restore()
        del opt
        gc.collect()
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
