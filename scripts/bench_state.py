"""Why ``ksctl bench`` and the standalone scripts disagree on the wide-row forwards (GPU).

Session 13 and 14 measured the RMSNorm split forward at 1024x262144 at 89.8% of copy in
``ksctl bench`` and 91.3-92.0% in scripts, the softmax one at 4096x131072 at 87.0% against 89-89.8%.
This times kernelset's implementation of one case through the harness's own ``run_case``
(no peers) in several states of the process, each after ``empty_cache``:

1. first thing after the copy ceiling;
2. after the op's other forward cases (what ``ksctl bench OP`` runs before it);
3. the case's inputs and reference built as the harness builds them, then timed with the
   reference alive, and again after deleting it;
4. the op called directly (``ks.rms_norm(x, w)``), not through the harness's closure.

    python scripts/bench_state.py [rms_norm|softmax] [rounds]
"""
from __future__ import annotations

import statistics
import sys


def main() -> int:
    import torch

    from kernelset.bench import harness, timing
    from kernelset.core import registry

    op = sys.argv[1] if len(sys.argv) > 1 else "rms_norm"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    shape = {"rms_norm": (1024, 262144), "softmax": (4096, 131072)}[op]
    dev = torch.device("cuda")
    copy = timing.copy_bandwidth_gbs(dev)
    spec = registry.op(op)
    case = next(c for s, c in harness.select_cases([op], sweep=False) if c.shape == shape and c.mode == "fwd")
    cost = spec.cost(case.shape, case.dtype, case.mode)
    print(f"{torch.cuda.get_device_name()}, copy {copy:.0f} GB/s; {op} {shape} fwd, {cost.bytes / 1e6:.0f} MB moved")

    def pct(ms: float) -> float:
        return 100.0 * cost.bytes / ms / 1e6 / copy

    def via_harness(label: str) -> None:
        torch.cuda.empty_cache()
        r = harness.run_case(spec, case, dev, copy, peers=False)
        m = r.ours()
        print(f"  {label:58s} {m.ms:.4f} ms {m.pct:5.1f}%", flush=True)

    via_harness("1. run_case, first")
    for s, c in harness.select_cases([op], sweep=False):
        if c.mode == "fwd" and c.shape != shape:
            harness.run_case(s, c, dev, copy, peers=False)
    via_harness("2. run_case, after the op's other forward cases")

    adapter = harness.adapter_for(spec)
    torch.cuda.empty_cache()
    inputs = adapter.inputs(case.shape, case.dtype, dev, case.mode)
    refs = adapter.reference(inputs, case.mode)
    run = adapter.ours(inputs, case.mode, "auto")
    x = inputs["x"]
    import kernelset as ks
    if op == "rms_norm":
        w = inputs["w"]

        def run_out():
            return ks.rms_norm(x, w, eps=1e-6)
    else:
        def run_out():
            return ks.softmax(x)
    times = {"3. harness inputs, reference alive": [], "3. harness inputs, reference deleted + empty_cache": []}
    for _ in range(rounds):
        times["3. harness inputs, reference alive"].append(timing.cuda_time_ms(run))
    del refs
    torch.cuda.empty_cache()
    for _ in range(rounds):
        times["3. harness inputs, reference deleted + empty_cache"].append(timing.cuda_time_ms(run))
    for label, ts in times.items():
        ms = statistics.median(ts)
        print(f"  {label:58s} {ms:.4f} ms {pct(ms):5.1f}% ({min(ts):.4f}-{max(ts):.4f})", flush=True)
    # the same kernel timed with fewer calls per batch (the scripts' parameters)
    ts = [timing.cuda_time_ms(run, warmup=3, reps=20, min_ms=40) for _ in range(rounds)]
    ms = statistics.median(ts)
    print(f"  {'3. same, warmup 3 / reps 20 / 40 ms (the scripts)':58s} {ms:.4f} ms {pct(ms):5.1f}%", flush=True)
    ts = [timing.cuda_time_ms(run_out) for _ in range(rounds)]
    ms = statistics.median(ts)
    print(f"  {'4. direct call (ks.' + op + '), no harness closure':58s} {ms:.4f} ms {pct(ms):5.1f}%", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
