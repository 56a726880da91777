"""One harness for every op: cases from the registry, peers from the family's ``bench.py``.

For each case: build inputs (larger than L2), compute the fp32 reference, run kernelset and each
peer once and check them against it (a wrong implementation gets no speed), then time each with
CUDA events. Speeds are reported as % of the copy bandwidth measured in the same run and as a
ratio to the strongest correct peer.
"""
from __future__ import annotations

import dataclasses
import datetime
import importlib
import json
import math
import platform
import sys
import time
from typing import Any, Iterable

import torch

from ..core import registry
from ..core.tolerance import rel_err, tolerance
from . import timing
from .adapter import BenchAdapter

OURS = "kernelset"


@dataclasses.dataclass
class Measurement:
    impl: str
    ms: float | None = None
    gbs: float | None = None
    pct: float | None = None  # % of the case's ceiling (copy bandwidth, or bf16 matmul when compute-bound)
    copy_pct: float | None = None  # % of the copy bandwidth whatever the ceiling: what the bars state
    tflops: float | None = None  # when the op declares FLOPs
    correct: bool = False
    error: float | None = None  # worst rel err over outputs
    note: str = ""


@dataclasses.dataclass
class CaseResult:
    op: str
    shape: tuple[int, ...]
    mode: str
    dtype: str
    bytes: int
    model: str
    bar_pct: float | None
    sweep: bool
    results: list[Measurement]
    ceiling: str = "copy"  # what pct is a share of: "copy" (memory-bound) or "matmul" (compute-bound)

    def ours(self) -> Measurement | None:
        return next((r for r in self.results if r.impl == OURS), None)

    def best_peer(self) -> Measurement | None:
        peers = [r for r in self.results if r.impl != OURS and r.correct and r.ms]
        return min(peers, key=lambda r: r.ms) if peers else None

    def speedup(self) -> float | None:
        ours, peer = self.ours(), self.best_peer()
        if not ours or not ours.correct or not ours.ms or not peer:
            return None
        return peer.ms / ours.ms

    def bar_met(self) -> bool | None:
        """Every bar of the issues is a share of the copy bandwidth (bytes of the op's model), so it
        is judged on ``copy_pct`` even where the case is compute-bound and ``pct`` is a share of the
        matmul rate (mla_decode at 128 heads on an H200: 71% of matmul, 51% of copy)."""
        ours = self.ours()
        if self.bar_pct is None or not ours:
            return None
        return bool(ours.correct and ours.copy_pct is not None and ours.copy_pct >= self.bar_pct)


def adapter_for(spec: registry.OpSpec) -> BenchAdapter:
    module = importlib.import_module(f"kernelset.ops.{spec.family}.bench")
    return module.ADAPTERS[spec.name]


# The norm-wise error of a whole output averages a local fault away: one zeroed row of 32768 is a
# relative error of 0.0055, inside bf16's 1e-2. Each output is also judged in pieces of at least
# LOCAL_MIN elements (at most LOCAL_PIECES of them), each against LOCAL_FACTOR x the tolerance.
# A piece's error is relative to its own reference norm plus 1% of an average piece's, so a piece
# whose reference is all zero (untouched embedding rows, ignored loss rows) must stay near zero.
LOCAL_MIN, LOCAL_PIECES, LOCAL_FACTOR = 4096, 4096, 4.0


def local_err(out: torch.Tensor, ref: torch.Tensor, *, block: int = 1 << 24) -> float:
    """The worst piece's ||out - ref|| / sqrt(||ref||^2 + 1% of an average piece's ||ref||^2),
    float64 on the tensors' device, ``block`` elements at a time. Elements equal in both (an inf
    where the reference has it) count as no error; a NaN/inf the reference lacks gives inf."""
    o, r = out.detach().reshape(-1), ref.detach().reshape(-1)
    if r.device != o.device:
        r = r.to(o.device)
    n = o.numel()
    if n == 0:
        return 0.0
    piece = max(LOCAL_MIN, -(-n // LOCAL_PIECES))
    block = max(piece, block // piece * piece)
    nums, dens = [], []
    for i in range(0, n, block):
        oc, rc = o[i:i + block].to(torch.float64), r[i:i + block].to(torch.float64)
        d = torch.where(oc == rc, torch.zeros_like(oc), oc - rc)
        d = torch.where(torch.isnan(d), torch.full_like(d, float("inf")), d)
        full = oc.numel() // piece * piece  # whole pieces, then the tail (the last block's) as one
        if full:
            nums.append(d[:full].square().reshape(-1, piece).sum(1))
            dens.append(rc[:full].square().reshape(-1, piece).sum(1))
        if full < oc.numel():
            nums.append(d[full:].square().sum().reshape(1))
            dens.append(rc[full:].square().sum().reshape(1))
    num, den = torch.cat(nums), torch.cat(dens)
    den = den + 0.01 * float(den.sum()) / den.numel()
    if float(den.sum()) == 0.0:
        return float(num.sum().sqrt())
    return float((num / den).max().sqrt())


def _check(outs, refs, names, tol_class, dtype, mode) -> tuple[bool, float, str]:
    worst, notes = 0.0, []
    if len(outs) != len(refs) or len(outs) != len(names):
        return False, math.inf, f"{len(outs)} outputs for {len(refs)} references and {len(names)} names"
    for name, out, ref in zip(names, outs, refs):
        err = rel_err(out, ref)
        tol = tolerance(tol_class, dtype, grad=name.startswith("d"))
        worst = max(worst, err)
        if not err <= tol:
            notes.append(f"{name} rel err {err:.2e} > {tol:.0e}")
            continue
        local = local_err(out, ref)
        if not local <= LOCAL_FACTOR * tol:
            notes.append(f"{name} rel err {local:.2e} > {LOCAL_FACTOR * tol:.0e} in a piece of the output "
                         f"(whole output {err:.2e})")
    return (not notes), worst, "; ".join(notes)


GRAPH_CALLS = 10  # calls captured per CUDA graph for the cases timed as graphs


def _check_replay(graph, graph_outs, run, calls, names, tol_class, dtype, mode) -> tuple[bool, str]:
    """Whether one replay of the ``calls`` captured calls computes what as many eager calls
    compute from the same state. The reference check ran on the eager path, and a capture can take
    another (bounds checks skipped, a cached plan, a scratch buffer outside the graph's pool). In-place
    runners return their state (rotated q and k, the written cache), so the state before the replay
    is put back before the eager calls; other runners' graph outputs are rewritten by a replay."""
    before = [o.detach().clone() for o in graph_outs]
    graph.replay()
    torch.cuda.synchronize()
    replayed = [o.detach().clone() for o in graph_outs]
    with torch.no_grad():
        for o, b in zip(graph_outs, before):
            o.copy_(b)
    del before
    for _ in range(calls):
        eager = run()
    torch.cuda.synchronize()
    ok, _, note = _check(replayed, eager, names, tol_class, dtype, mode)
    return ok, ("" if ok else f"CUDA graph replay differs from the eager call: {note}")


def run_case(spec: registry.OpSpec, case: registry.BenchCase, device: torch.device, copy_gbs: float,
             backend: str = "auto", peers: bool = True, matmul_tflops: float | None = None) -> CaseResult:
    """Check and time one case. A case whose FLOPs per byte exceed the machine's balance point
    (matmul rate / copy bandwidth) is compute-bound: its pct is then a share of the bf16 matmul
    rate, else of the copy bandwidth."""
    adapter = adapter_for(spec)
    cost = spec.cost(case.shape, case.dtype, case.mode)
    balance = matmul_tflops * 1e3 / copy_gbs if matmul_tflops else None  # FLOPs per byte
    compute_bound = bool(balance and cost.flops and cost.flops / max(cost.bytes, 1) > balance)
    inputs = adapter.inputs(case.shape, case.dtype, device, case.mode)
    refs = adapter.reference(inputs, case.mode)
    names = inputs["names"]
    runners: dict[str, Any] = {OURS: adapter.ours(inputs, case.mode, backend)}
    if peers:
        runners.update(adapter.peers(inputs, case.mode))
    results = []
    for name, run in runners.items():
        # every implementation starts from the same allocator state: the reference's freed
        # temporaries (gigabytes at the wide shapes) would otherwise sit in torch's cache for the
        # first one timed only, and a written block there slows the wide-row kernels by about 2
        # points (H100, 2026-11-25); the references stay alive for all
        torch.cuda.empty_cache()
        t0 = time.time()
        m = Measurement(name)
        if isinstance(run, str):
            m.note = run
            results.append(m)
            continue
        try:
            outs = run()
            torch.cuda.synchronize()
            m.correct, m.error, m.note = _check(outs, refs, names, spec.tolerance, case.dtype, case.mode)
            del outs
            calls = 1
            if m.correct and case.graph:
                # several calls per replay: a replay's own launch gap (3-5 us on the lent H200
                # host, 5% of a 90 us kernel) is not the op's time; every implementation alike
                calls = GRAPH_CALLS
                graph, graph_outs = timing.capture_outputs(run, calls)
                ok, note = _check_replay(graph, graph_outs, run, calls, names, spec.tolerance, case.dtype, case.mode)
                m.correct = ok
                run, m.note = graph.replay, note or f"CUDA graph ({calls} calls per replay)"
                del graph_outs
            if m.correct:
                m.ms = timing.cuda_time_ms(run) / calls
                m.gbs = cost.bytes / m.ms / 1e6
                m.tflops = cost.flops / m.ms / 1e9 if cost.flops else None
                m.copy_pct = 100.0 * m.gbs / copy_gbs
                m.pct = 100.0 * m.tflops / matmul_tflops if compute_bound else m.copy_pct
        except Exception as exc:  # a peer that crashes is reported, not fatal
            m.note = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        results.append(m)
        torch.cuda.empty_cache()
        print(f"    {name}: {time.time() - t0:.1f}s", file=sys.stderr, flush=True)
    del inputs, refs
    torch.cuda.empty_cache()
    return CaseResult(spec.name, case.shape, case.mode, str(case.dtype).replace("torch.", ""), cost.bytes,
                      cost.model, case.bar_pct, case.sweep, results, "matmul" if compute_bound else "copy")


def select_cases(ops: Iterable[str] | None, *, sweep: bool = True) -> list[tuple[registry.OpSpec, registry.BenchCase]]:
    chosen = set(ops) if ops else None
    out = []
    for entry in registry.catalog():
        if chosen is not None and entry.name not in chosen:
            continue
        seen = set()
        for case in entry.spec.bench:
            if case.sweep and not sweep:
                continue
            k = (case.shape, case.mode, case.dtype, case.graph)  # eager and graph timings are two cases
            if k in seen:  # a sweep point that is also a barred case is measured once
                continue
            seen.add(k)
            bar = next((c.bar_pct for c in entry.spec.bench
                        if (c.shape, c.mode, c.dtype, c.graph) == k and c.bar_pct), None)
            is_sweep = any(c.sweep for c in entry.spec.bench if (c.shape, c.mode, c.dtype, c.graph) == k)
            out.append((entry.spec, dataclasses.replace(case, bar_pct=bar, sweep=is_sweep)))
    if chosen:
        unknown = chosen - {s.name for s, _ in out}
        if unknown:
            raise ValueError(f"no benchmark cases for {', '.join(sorted(unknown))}")
    return out


def environment(device: torch.device) -> dict[str, Any]:
    import triton  # noqa: F401  (the GPU machine has it; bench needs CUDA)
    props = torch.cuda.get_device_properties(device)
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": props.name, "sm": f"sm_{props.major}{props.minor}", "sms": props.multi_processor_count,
        "l2_mb": round(getattr(props, "L2_cache_size", 0) / 2**20, 1),
        "torch": torch.__version__, "triton": sys.modules["triton"].__version__, "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }
    for name in ("liger_kernel", "flash_attn", "flashinfer"):
        try:
            mod = importlib.import_module(name)
            env[name] = getattr(mod, "__version__", "installed")
        except Exception:
            env[name] = None
    return env


def summarize(cases: list[CaseResult]) -> dict[str, Any]:
    """fast_1: share of cases where kernelset is correct and at least as fast as the strongest peer
    present; geomean speedup over that peer; bars met."""
    with_peer = [c for c in cases if c.best_peer() is not None]
    fast = [c for c in with_peer if (c.speedup() or 0.0) >= 1.0]
    speedups = [c.speedup() for c in with_peer if c.speedup()]
    geo = math.exp(sum(math.log(s) for s in speedups) / len(speedups)) if speedups else None
    bars = [c for c in cases if c.bar_pct is not None]
    return {
        "cases": len(cases), "cases_with_peer": len(with_peer),
        "fast_1": (len(fast) / len(with_peer)) if with_peer else None,
        "geomean_speedup": geo,
        "bars": len(bars), "bars_met": sum(1 for c in bars if c.bar_met()),
        "all_correct": all((c.ours() and c.ours().correct) for c in cases),
    }


def to_json(env: dict[str, Any], ceilings: dict[str, float], cases: list[CaseResult], extra: dict[str, Any]) -> str:
    return json.dumps({
        "environment": env, "ceilings": ceilings, "summary": summarize(cases), "extra": extra,
        "cases": [dataclasses.asdict(c) | {"speedup_vs_best_peer": c.speedup(),
                                           "best_peer": (c.best_peer().impl if c.best_peer() else None),
                                           "bar_met": c.bar_met()} for c in cases],
    }, indent=1, default=str)
