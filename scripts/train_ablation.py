"""Which kernelset op moves the training step of issue 5's bar, and by how much: the Llama-3.2-1B
shaped model (seq 2048, bf16) built once, then stepped (forward, backward, AdamW, zero_grad) under
``kernelize(mode="training", ops=...)`` with one op left out at a time, against the unpatched model.
Each variant reports the step's wall time (synchronized) and its host time to enqueue the step
(the step returns before the GPU is done; when enqueueing takes as long as the step, the step is
host-bound), and the host time of each phase after a synchronize (forward, backward, optimizer).
Variants alternate in rounds (the lent host's speed drifts); medians over rounds.

``--seq 128`` makes the GPU's work small enough that every variant is host-bound: the step's time
is then the host's cost of the model and of each op's Python, shape aside.

Usage (GPU, transformers installed): python scripts/train_ablation.py [rounds] [--batch B] [--seq S]
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

import kernelset as ks
from kernelset.hf.evaluate import build_model, config_for

ALL = ("embedding", "rms_norm", "apply_rotary", "qkv_rope", "swiglu", "gated_mlp", "flash_attention",
       "linear_cross_entropy", "cross_entropy")


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    rounds = int(args[0]) if args else 3
    batch = int(sys.argv[sys.argv.index("--batch") + 1]) if "--batch" in sys.argv else 1
    seq = int(sys.argv[sys.argv.index("--seq") + 1]) if "--seq" in sys.argv else 2048
    dev = torch.device("cuda")
    cfg = config_for("llama-3.2-1b")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg["vocab_size"], (batch, seq), generator=g).to(dev)
    model = build_model(cfg, dtype=torch.bfloat16, device=dev).train()
    variants: list[tuple[str, tuple[str, ...] | None, str]] = [
        ("unpatched, torch fused AdamW", None, "fused"),
        ("unpatched, torch AdamW", None, "torch"),
        ("unpatched, ks AdamW", None, "ks"),
        ("all ops, ks AdamW", ALL, "ks"),
    ] + [(f"all but {op}", tuple(o for o in ALL if o != op), "ks") for op in ALL if op != "cross_entropy"]
    res: dict[str, dict[str, list[float]]] = {v[0]: {"wall": [], "enqueue": [], "fwd": [], "bwd": [], "opt": []}
                                              for v in variants}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, batch {batch} x {seq}, {rounds} rounds",
          flush=True)
    for r in range(rounds):
        for name, ops, optim in variants:
            handle = ks.hf.kernelize(model, mode="training", ops=ops) if ops is not None else None
            opt = (ks.optim.AdamW(model.parameters(), lr=1e-5, state_dtype=None) if optim == "ks"
                   else torch.optim.AdamW(model.parameters(), lr=1e-5, fused=optim == "fused"))

            def step():
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            for _ in range(3):
                step()
            torch.cuda.synchronize()
            walls, hosts = [], []
            for _ in range(5):
                t0 = time.perf_counter()
                step()
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                hosts.append(t1 - t0)
                walls.append(time.perf_counter() - t0)
            ph: dict[str, list[float]] = {"fwd": [], "bwd": [], "opt": []}
            for _ in range(3):
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
                t5 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                ph["fwd"].append(t1 - t0)
                ph["bwd"].append(t3 - t2)
                ph["opt"].append(t5 - t4)
            torch.cuda.synchronize()
            d = res[name]
            d["wall"].append(statistics.median(walls))
            d["enqueue"].append(statistics.median(hosts))
            for k, v in ph.items():
                d[k].append(statistics.median(v))
            if handle is not None:
                handle.restore()
            torch.cuda.empty_cache()
        print(f"round {r + 1} done", flush=True)
    base = statistics.median(res[variants[0][0]]["wall"])
    print("\nstep ms per round:")
    for name, *_ in variants:
        print(f"  {name:32s} " + " ".join(f"{t * 1e3:6.1f}" for t in res[name]["wall"]))
    print(f"\nms, medians over {rounds} rounds (each a median of 5 steps; phases: host time after a sync, "
          "median of 3)")
    print(f"  {'variant':32s} {'step':>7s} {'x unp.':>7s} {'enqueue':>8s} {'fwd host':>9s} {'bwd host':>9s} "
          f"{'opt host':>9s}")
    for name, *_ in variants:
        d = {k: statistics.median(v) * 1e3 for k, v in res[name].items()}
        print(f"  {name:32s} {d['wall']:7.1f} {base * 1e3 / d['wall']:7.2f} {d['enqueue']:8.1f} {d['fwd']:9.1f} "
              f"{d['bwd']:9.1f} {d['opt']:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
