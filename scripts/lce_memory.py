"""linear_cross_entropy on a GPU: time AND peak extra memory, ours (at several chunk budgets) and
the peers, one table. The bar (issue 3): time <= torch.compile's and extra memory <= Liger's.

"Extra memory" is torch.cuda.max_memory_allocated during one fwd+bwd above what was allocated
before it (inputs and the reference already exist), the returned loss and gradients included.
Every implementation is checked against the fp32 reference before it is timed.

    python scripts/lce_memory.py                          # T 8192, H 4096, V 128256, bf16
    python scripts/lce_memory.py --shape 4096 2560 262144 --budgets 32 64 128 256 512 --json out.json
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from kernelset.bench import timing
from kernelset.core.tolerance import rel_err, tolerance
from kernelset.ops.loss import linear
from kernelset.ops.loss.linear_bench import ADAPTERS, dims, peak_extra_bytes

GIB = 2**30


def _ours_at(adapter, inp, budget_mib: int):
    run = adapter.ours(inp, "fwd+bwd", "triton")
    tun = linear.LCETuning(chunk_bytes=budget_mib << 20)

    def call():
        with linear.use(tun):
            return run()
    return call


def _predicted(t: int, h: int, v: int, itemsize: int, budget_mib: int) -> int:
    with linear.use(linear.LCETuning(chunk_bytes=budget_mib << 20)):
        rows = linear.chunk_rows(t, v, itemsize)
    return rows * v * itemsize + (t * h + v * h) * itemsize + 8 * t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=int, nargs=3, default=(8192, 4096, 128256), metavar=("T", "H", "V"))
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    ap.add_argument("--budgets", type=int, nargs="+", default=(64, 128, 256, 512), help="chunk_bytes in MiB")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    dev = torch.device("cuda")
    t, h, v = dims(tuple(args.shape))
    adapter = ADAPTERS["linear_cross_entropy"]
    inp = adapter.inputs((t, h, v), dtype, dev, "fwd+bwd")
    refs = adapter.reference(inp, "fwd+bwd")
    torch.cuda.empty_cache()
    runs = {f"kernelset chunk<={b}MiB": _ours_at(adapter, inp, b) for b in args.budgets}
    if not args.no_peers:
        runs.update(adapter.peers(inp, "fwd+bwd"))
    props = torch.cuda.get_device_properties(dev)
    print(f"{props.name}, torch {torch.__version__}; linear_cross_entropy T {t} H {h} V {v} {args.dtype} fwd+bwd")
    print(f"{'implementation':<28} {'ms':>8} {'extra GiB':>10} {'formula GiB':>12} {'worst rel err':>14}  note")
    rows = []
    for name, run in runs.items():
        row = {"impl": name, "ms": None, "extra_bytes": None, "predicted_bytes": None, "err": None, "note": ""}
        if isinstance(run, str):
            row["note"] = run
        else:
            try:
                outs = run()  # warm-up (compilation, autotuning) and the correctness check
                torch.cuda.synchronize()
                errs = [(n, rel_err(o, r)) for n, o, r in zip(inp["names"], outs, refs)]
                del outs
                row["err"] = max(e for _, e in errs)
                bad = [f"{n} {e:.1e}" for n, e in errs if not e <= tolerance("norm", dtype, grad=n.startswith("d"))]
                torch.cuda.empty_cache()
                row["extra_bytes"] = peak_extra_bytes(run)
                if bad:
                    row["note"] = "WRONG: " + ", ".join(bad)
                else:
                    row["ms"] = timing.cuda_time_ms(run, warmup=3, reps=10, min_ms=300.0)
            except Exception as exc:  # a peer that fails (OOM, missing feature) is reported, not fatal
                row["note"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            torch.cuda.empty_cache()
        if name.startswith("kernelset"):
            row["predicted_bytes"] = _predicted(t, h, v, dtype.itemsize, int(name.split("<=")[1][:-3]))
        rows.append(row)
        fmt = lambda x, d: f"{x:.{d}f}" if x is not None else "-"  # noqa: E731
        print(f"{name:<28} {fmt(row['ms'], 2):>8} {fmt(row['extra_bytes'] and row['extra_bytes'] / GIB, 3):>10} "
              f"{fmt(row['predicted_bytes'] and row['predicted_bytes'] / GIB, 3):>12} "
              f"{fmt(row['err'], 6) if row['err'] is not None else '-':>14}  {row['note']}", flush=True)
    peer = {r["impl"]: r for r in rows}
    comp, liger = peer.get("torch.compile", {}), peer.get("liger", {})
    for r in rows:
        if not r["impl"].startswith("kernelset") or r["ms"] is None:
            continue
        time_ok = comp.get("ms") is not None and r["ms"] <= comp["ms"]
        mem_ref = liger.get("extra_bytes") if liger.get("ms") is not None else None
        mem_ok = mem_ref is not None and r["extra_bytes"] <= mem_ref
        print(f"  {r['impl']}: time {'<=' if time_ok else '>'} torch.compile"
              f" ({r['ms']:.2f} vs {comp.get('ms') or float('nan'):.2f} ms); extra memory "
              + (f"{'<=' if mem_ok else '>'} Liger ({r['extra_bytes'] / GIB:.3f} vs {mem_ref / GIB:.3f} GiB)"
                 if mem_ref is not None else f"{r['extra_bytes'] / GIB:.3f} GiB (Liger absent; 1.1 GiB in PEERS.md)"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": props.name, "shape": [t, h, v], "dtype": args.dtype, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
