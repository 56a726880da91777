"""Is issue 5's prefill power-bound? GEMM throughput with and without other work between GEMMs.

Session 25's profile of the Llama-3-8B-shaped 1x2048 bf16 prefill (H200) timed the same cuBLAS
kernel (nvjet 256x128) at ~797 TFLOP/s inside unpatched HF SDPA and ~706 TFLOP/s inside the
kernelized model, where the GEMMs run nearly back to back. A GPU at its power limit lowers its
clock while it multiplies without pause; HF's ~16 ms of elementwise kernels between GEMMs would
let it recover. This probe checks that in one run:

1. one model's GEMMs (q/k/v merged, o, gate/up merged, down: the kernelized model's shapes; a
   weight set per layer, so nothing stays in L2) chained over the layers: back to back; with a
   memory-bound copy after each GEMM; with the GPU idle (``torch.cuda._sleep``) after each GEMM.
   For each: the GEMM kernels' own time (profiler) as TFLOP/s, the chain's wall time, and the SM
   clock and board power sampled by ``nvidia-smi`` while the chain repeats for a few seconds.
2. the real prefill, unpatched HF SDPA and kernelized, measured the same way (transformers needed).

Usage (GPU): python scripts/prefill_power.py [--layers 32] [--seconds 3] [--no-model]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import torch
from torch.profiler import ProfilerActivity, profile

FIELDS = "clocks.sm,power.draw,clocks_event_reasons.sw_power_cap"


class Sampler:
    """nvidia-smi sampling the SM clock (MHz), board power (W) and the power-cap flag every 20 ms."""

    def __enter__(self):
        self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits",
                                      "-lms", "20", "-i", str(torch.cuda.current_device())],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        time.sleep(0.3)
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        rows = []
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            try:
                rows.append((float(parts[0]), float(parts[1]), parts[2] if len(parts) > 2 else "?"))
            except (ValueError, IndexError):
                continue
        rows = rows[len(rows) // 5:]  # skip the ramp-up
        if rows:
            self.clock = statistics.median(r[0] for r in rows)
            self.power = statistics.median(r[1] for r in rows)
            self.capped = sum(r[2].lower() == "active" for r in rows) / len(rows)
        else:
            self.clock = self.power = self.capped = float("nan")
        return False


def gemm_ms(prof, is_gemm) -> float:
    return sum(e.time_range.end - e.time_range.start for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA and is_gemm(e.name)) / 1e3


def event_ms(fn) -> float:
    """One call of fn between CUDA events, synchronized."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e)


def report(name: str, fn, flops: float, is_gemm, seconds: float) -> None:
    """Everything under sustained load: the call repeats for ``seconds`` (clock and power sampled),
    each call timed by CUDA events (median); then, with calls still queued ahead of it (no idle
    GPU in between), one call under the profiler gives the GEMM kernels' own time. Before that,
    the same from rest: calls after a second of idle (wall: median of 3; GEMM time: one call)."""
    fn()
    torch.cuda.synchronize()
    rest = []
    for _ in range(3):  # an idle GPU first: calls from rest (a second apart), timed by CUDA events
        time.sleep(1.0)
        rest.append(event_ms(fn))
    time.sleep(1.0)  # and one from rest under the profiler
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    cold = gemm_ms(prof, is_gemm)
    walls = []
    with Sampler() as smp:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            walls.append(event_ms(fn))
        for _ in range(3):  # queued: the GPU stays busy while the profiler starts
            fn()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    g = gemm_ms(prof, is_gemm)
    w = statistics.median(walls[len(walls) // 4:])
    print(f"{name:44s} wall {w:7.2f} ms | GEMM kernels {g:7.2f} ms = {flops / g / 1e9:5.0f} TFLOP/s | "
          f"SM clock {smp.clock:5.0f} MHz, power {smp.power:4.0f} W, power cap active {smp.capped * 100:3.0f}% "
          f"of samples | from rest: wall {statistics.median(rest):7.2f} ms, GEMM kernels {cold:7.2f} ms = {flops / cold / 1e9:5.0f} TFLOP/s", flush=True)


def synthetic(layers: int, seconds: float) -> None:
    dev, bf = torch.device("cuda"), torch.bfloat16
    t, h, inter, q, kv = 2048, 4096, 14336, 4096, 1024
    shapes = [(h, q + 2 * kv), (q, h), (h, 2 * inter), (inter, h)]  # (K, N) per GEMM of a layer
    g = torch.Generator(device=dev).manual_seed(0)
    ins = {k: torch.randn(t, k, dtype=bf, device=dev, generator=g) for k in {s[0] for s in shapes}}
    weights = [[torch.randn(n, k, dtype=bf, device=dev, generator=g) * 0.02 for k, n in shapes]
               for _ in range(layers)]
    outs = [torch.empty(t, n, dtype=bf, device=dev) for _, n in shapes]
    flops = 2.0 * t * sum(k * n for k, n in shapes) * layers
    src = torch.randn(64 << 20 >> 1, dtype=bf, device=dev)  # 64 MiB: a memory-bound filler
    dst = torch.empty_like(src)
    cyc = 200_000  # ~100 us of idle at ~2 GHz

    def chain(between=None):
        for lw in weights:
            for (k, _), w, o in zip(shapes, lw, outs):
                torch.mm(ins[k], w.t(), out=o)
                if between is not None:
                    between()

    def copy():
        dst.copy_(src)

    def idle():
        torch.cuda._sleep(cyc)

    def is_gemm(nm: str) -> bool:
        return not any(s in nm for s in ("copy", "elementwise", "sleep", "spin"))

    print(f"-- one model's GEMMs ({layers} layers of 1x2048 Llama-3-8B shapes, {flops / 1e12:.1f} TFLOP)")
    report("back to back", chain, flops, is_gemm, seconds)
    report("a 64 MiB copy after each GEMM", lambda: chain(copy), flops, is_gemm, seconds)
    report("~100 us idle after each GEMM", lambda: chain(idle), flops, is_gemm, seconds)


def model(layers: int, seconds: float) -> None:
    import kernelset as ks
    from kernelset.hf.evaluate import build_model, config_for

    dev = torch.device("cuda")
    cfg = config_for("llama-3-8b", layers=layers)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg["vocab_size"], (1, 2048), generator=g).to(dev)
    m = build_model(cfg, dtype=torch.bfloat16, device=dev)
    m.set_attn_implementation("sdpa")
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    hd = h // cfg["num_attention_heads"]
    per_layer = h * hd * (cfg["num_attention_heads"] * 2 + cfg["num_key_value_heads"] * 2) + 3 * h * inter
    flops = 2.0 * 2048 * (per_layer * layers + h * cfg["vocab_size"])

    def is_gemm(nm: str) -> bool:
        return "nvjet" in nm or "gemm" in nm.lower() or "xmma" in nm

    def fn():
        return m(ids, use_cache=False)

    print(f"-- the prefill ({layers} layers, {flops / 1e12:.1f} TFLOP in its projections and lm_head)")
    with torch.no_grad():
        report("HF sdpa", fn, flops, is_gemm, seconds)
        with ks.hf.kernelize(m):
            report("kernelset", fn, flops, is_gemm, seconds)
        report("HF sdpa (again)", fn, flops, is_gemm, seconds)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--no-model", action="store_true")
    args = p.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    q = subprocess.run(["nvidia-smi", "--query-gpu=power.limit,clocks.max.sm", "--format=csv"],
                       capture_output=True, text=True)
    print(q.stdout.strip())
    synthetic(args.layers, args.seconds)
    torch.cuda.empty_cache()  # its weights are gone with it
    if not args.no_model:
        model(args.layers, args.seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
