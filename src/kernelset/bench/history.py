"""Benchmark history as data: one append-only JSON-lines file of results, and the tables rendered
from it.

    python -m kernelset.bench.history import RUN.json [...] [--results FILE] [--commit SHA] [--date D]
                                             [--backend B] [--dry-run]
    python -m kernelset.bench.history render [--results FILE] [--readme FILE] [--check]

Each line of the results file (``docs/benchmarks/results.jsonl``) is one :class:`Record`: one
implementation of one op on one case, measured on one GPU at one commit, with the run's
environment and its ceilings. Lines are only ever appended; a result is superseded by a later
line of the same (tool, GPU, op, case, impl), never edited. ``render`` writes the current tables (the
latest line per key) between the README's markers; ``--check`` fails when they are stale.

What ``import`` reads (the formats the repository's tools write):

- ``ksctl bench --json``: ``environment`` / ``ceilings`` / ``cases`` (and ``extra``: the host time
  of ``rms_norm`` 1x4096);
- ``scripts/hf_check.py --json``: prefill, decode step and training step times of HF models,
  unpatched against kernelize'd;
- ``scripts/capi_gpu_check.py --json``: each C ABI op against the Python path;
- ``scripts/lce_memory.py --json``: linear_cross_entropy time and extra memory per chunk size.

This module needs only the standard library: the file is read and rendered on any machine.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from typing import Any, Iterable, Sequence

OURS = "kernelset"
BENCH = "ksctl bench"
HF = "scripts/hf_check.py"
CAPI = "scripts/capi_gpu_check.py"
LCE = "scripts/lce_memory.py"

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
DEFAULT_RESULTS = os.path.join("docs", "benchmarks", "results.jsonl")
DEFAULT_README = os.path.join("docs", "benchmarks", "README.md")

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float8_e4m3fn": "fp8e4m3"}


@dataclasses.dataclass(frozen=True)
class Record:
    """One implementation of one op on one case, in one run.

    ``case`` is ``SHAPE MODE DTYPE`` (``32768x4096 fwd+bwd bf16``), ``graph`` appended when every
    implementation was timed as CUDA-graph replays. ``pct_of_roofline`` is a share of the ceiling
    named by ``roofline`` (``copy``: the copy bandwidth measured in the same run; ``matmul``: the
    bf16 matmul rate, where the case's FLOPs per byte exceed the machine's balance point); None
    where the time is not a device time against a ceiling (host time, a whole model step).
    ``copy_pct`` is the share of copy bandwidth whatever the roofline: the bars are stated on it.
    ``ratio_vs_best_peer`` is the strongest correct peer's time over this implementation's, from
    the same run (> 1: faster than every peer; 1.0 for the strongest peer itself).
    ``commit`` is the commit that recorded the run (for runs imported from the old log folders:
    the commit that added the run's JSON, which carried the code it measured; ``run`` then names
    that JSON, which git keeps at that commit)."""

    date: str  # "YYYY-MM-DD HH:MM UTC" from the run's environment, or "YYYY-MM-DD" when it had none
    commit: str | None
    gpu: str
    sms: int | None
    driver: str | None
    cuda: str | None
    torch: str | None
    triton: str | None
    op: str
    case: str
    impl: str
    ms: float | None
    gbs: float | None
    tflops: float | None
    pct_of_roofline: float | None
    roofline: str | None  # "copy" | "matmul" | None
    copy_pct: float | None
    ratio_vs_best_peer: float | None
    best_peer: str | None
    bar_pct: float | None  # the bar for this case, a share of copy; None: no bar
    correct: bool
    rel_err: float | None
    copy_gbs: float | None  # the run's measured ceilings
    matmul_tflops: float | None
    source: str  # the tool that measured it: "ksctl bench", "scripts/hf_check.py", ...
    run: str  # the run's identifier, shared by its records (the JSON it came from, or its date and GPU)
    note: str = ""
    versions: dict[str, str] = dataclasses.field(default_factory=dict)  # python, transformers, peers

    def key(self) -> tuple[str, str, str, str, str]:
        return (self.source, self.gpu, self.op, self.case, self.impl)

    def bar_met(self) -> bool | None:
        if self.bar_pct is None:
            return None
        return bool(self.correct and self.copy_pct is not None and self.copy_pct >= self.bar_pct)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(", ", ": "))


FIELDS = tuple(f.name for f in dataclasses.fields(Record))
REQUIRED = tuple(f.name for f in dataclasses.fields(Record)
                 if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)


def from_dict(d: dict[str, Any]) -> Record:
    missing = [k for k in REQUIRED if k not in d]
    if missing:
        raise ValueError(f"result record lacks {', '.join(missing)}: {d}")
    unknown = set(d) - set(FIELDS)
    if unknown:
        raise ValueError(f"result record has unknown fields {', '.join(sorted(unknown))}")
    return Record(**d)


# ---- conversion --------------------------------------------------------------------------------


def _num(v: Any) -> float | None:
    """A measured number, to 6 significant digits (timings repeat to 3-4); None for none or NaN."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return None
    return float(f"{float(v):.6g}")


def case_label(shape: Sequence[int], mode: str, dtype: str, graph: bool = False) -> str:
    dt = _DTYPES.get(str(dtype).replace("torch.", ""), str(dtype).replace("torch.", ""))
    return f"{'x'.join(str(int(s)) for s in shape)} {mode} {dt}" + (" graph" if graph else "")


def _is_graph_case(case: dict[str, Any]) -> bool:
    """The harness notes "CUDA graph ..." on every implementation a graph case timed; the case
    itself carries ``graph`` from the harness versions that record it."""
    if "graph" in case:
        return bool(case["graph"])
    timed = [r for r in case.get("results", ()) if r.get("ms") is not None]
    return bool(timed) and all("CUDA graph" in (r.get("note") or "") for r in timed)


def _env_versions(env: dict[str, Any]) -> dict[str, str]:
    out = {}
    for k in ("python", "transformers", "liger_kernel", "flash_attn", "flashinfer"):
        if env.get(k):
            out[k] = str(env[k])
    return out


def _best(times: dict[str, float | None], peers: Iterable[str]) -> tuple[str | None, float | None]:
    cands = [(t, n) for n, t in times.items() if n in set(peers) and t]
    if not cands:
        return None, None
    t, n = min(cands)
    return n, t


def records_from_bench_json(doc: dict[str, Any], *, commit: str | None = None, backend: str | None = None,
                            run: str | None = None, source: str = BENCH) -> list[Record]:
    """The records of one ``ksctl bench --json`` document: one per implementation per case that
    was run (a peer that is not installed, which has neither a time nor a checked output, is left
    out: the environment lists what was installed), plus the host-time figures of ``extra``.
    ``backend``: the ``--backend`` the run forced (else the document's own ``backend``, if it
    records one); kernelset's records are then named ``kernelset[BACKEND]``."""
    env, ceil = doc["environment"], doc.get("ceilings") or {}
    backend = backend or doc.get("backend") or env.get("backend")
    ours = OURS if not backend or backend == "auto" else f"{OURS}[{backend}]"
    copy_gbs, mm = _num(ceil.get("copy_gbs")), _num(ceil.get("matmul_tflops"))
    base = dict(date=str(env.get("date", "")), commit=commit, gpu=str(env.get("device", "?")),
                sms=env.get("sms"), driver=env.get("driver"), cuda=env.get("cuda"),
                torch=env.get("torch"), triton=env.get("triton"), copy_gbs=copy_gbs,
                matmul_tflops=mm, source=source, versions=_env_versions(env),
                run=run or f"{env.get('date', '')} {env.get('device', '?')}")
    out: list[Record] = []
    for case in doc.get("cases", ()):
        label = case_label(case["shape"], case["mode"], case["dtype"], _is_graph_case(case))
        roofline = case.get("ceiling", "copy")
        results = case.get("results", ())
        peers = [r for r in results if r["impl"] != OURS and r.get("correct") and r.get("ms")]
        best = min(peers, key=lambda r: r["ms"]) if peers else None
        for r in results:
            ms = _num(r.get("ms"))
            if r["impl"] != OURS and ms is None and r.get("error") is None:
                continue  # not installed / not available here: never ran
            gbs = _num(r.get("gbs"))
            copy_pct = _num(r.get("copy_pct"))
            if copy_pct is None and gbs is not None and copy_gbs:
                copy_pct = _num(100.0 * gbs / copy_gbs)
            out.append(Record(
                **base, op=case["op"], case=label, impl=ours if r["impl"] == OURS else r["impl"], ms=ms, gbs=gbs,
                tflops=_num(r.get("tflops")), pct_of_roofline=_num(r.get("pct")),
                roofline=roofline, copy_pct=copy_pct,
                ratio_vs_best_peer=_num(best["ms"] / ms if best and ms and r.get("correct") else None),
                best_peer=best["impl"] if best else None, bar_pct=_num(case.get("bar_pct")),
                correct=bool(r.get("correct")), rel_err=_num(r.get("error")), note=r.get("note") or ""))
    out += _host_records(doc.get("extra") or {}, base)
    return out


def _host_records(extra: dict[str, Any], base: dict[str, Any]) -> list[Record]:
    """``extra["rms_norm_1x4096"]``: host time per eager call (kernelset and its peers), and per
    call replayed from a CUDA graph against the profiler's kernel time."""
    h = extra.get("rms_norm_1x4096")
    if not h:
        return []
    out = []
    host = {k[: -len("_host_us")]: _num(v) for k, v in h.items() if k.endswith("_host_us")}
    peer, peer_us = _best(host, [n for n in host if n != OURS])
    common = dict(base, op="rms_norm", gbs=None, tflops=None, pct_of_roofline=None, roofline=None,
                  copy_pct=None, bar_pct=None, correct=True, rel_err=None)
    for impl, us in sorted(host.items()):
        out.append(Record(**common, case="1x4096 bf16 host per eager call", impl=impl,
                          ms=None if us is None else _num(us / 1e3),
                          ratio_vs_best_peer=_num(peer_us / us if peer_us and us else None),
                          best_peer=peer, note="host wall time per eager call"))
    replay, kernel = _num(h.get("kernelset_graph_replay_us_per_call")), _num(h.get("kernelset_kernel_us"))
    if replay is not None:
        out.append(Record(**common, case="1x4096 bf16 graph replay per call", impl=OURS, ms=_num(replay / 1e3),
                          ratio_vs_best_peer=None, best_peer=None,
                          note="per call replayed from a CUDA graph" +
                               (f"; kernel {kernel:.2f} us (profiler)" if kernel is not None else "")))
    return out


def _plain(base: dict[str, Any], **kw: Any) -> Record:
    fields = dict(gbs=None, tflops=None, pct_of_roofline=None, roofline=None, copy_pct=None, bar_pct=None,
                  rel_err=None, correct=True, copy_gbs=None, matmul_tflops=None, note="")
    fields.update(base)
    fields.update(kw)
    return Record(**fields)


def _ratio_records(base: dict[str, Any], op: str, case: str, times: dict[str, float | None],
                   peers: Sequence[str], notes: dict[str, str] | None = None) -> list[Record]:
    peer, peer_ms = _best(times, peers)
    out = []
    for impl, ms in times.items():
        if ms is None:
            continue
        out.append(_plain(base, op=op, case=case, impl=impl, ms=ms,
                          ratio_vs_best_peer=_num(peer_ms / ms if peer_ms and ms else None), best_peer=peer,
                          note=(notes or {}).get(impl, "")))
    return out


def records_from_hf_json(doc: dict[str, Any], *, date: str, commit: str | None = None,
                         run: str | None = None) -> list[Record]:
    """``scripts/hf_check.py --json``: random-initialised Llama-3-8B-shaped model (``layers`` deep)
    for prefill and decode, Llama-3.2-1B-shaped for the training step; each variant's median round.
    The training baseline is the unpatched model with torch's fused AdamW where the run also
    reports the foreach one (``unpatched_foreach_adamw``); before that, "unpatched" ran foreach.
    Runs without ``kernelset_fp32_states`` predate ``state_dtype``: their kernelset AdamW kept fp32
    states."""
    base = dict(date=date, commit=commit, gpu=str(doc.get("device", "?")), sms=None, driver=None, cuda=None,
                torch=doc.get("torch"), triton=None, source=HF, run=run or f"{date} {doc.get('device', '?')}",
                versions={"transformers": str(doc["transformers"])} if doc.get("transformers") else {})
    layers, seq = doc.get("layers"), doc.get("seq")
    out: list[Record] = []
    p = doc.get("prefill_ms")
    if p:
        names = {"eager": "hf-eager", "sdpa": "hf-sdpa", "kernelset": OURS, "kernelset_unmerged": "kernelset-unmerged"}
        times = {names[k]: _num(v) for k, v in p.items() if k in names}
        out += _ratio_records(base, "hf.prefill", f"llama-3-8b shape {layers} layers 1x{seq} bf16", times,
                              ("hf-eager", "hf-sdpa"))
    for key, batch in (("decode_b1_ms", 1), ("decode_b32_ms", 32)):
        d = doc.get(key)
        if d:
            names = {"unpatched": "hf", "kernelset": OURS, "kernelset_unmerged": "kernelset-unmerged"}
            times = {names[k]: _num(v) for k, v in d.items() if k in names}
            out += _ratio_records(base, "hf.decode_step", f"llama-3-8b shape {layers} layers B{batch} bf16", times,
                                  ("hf",))
    t = doc.get("train_1b")
    if t:
        fused = "unpatched_foreach_adamw" in t
        new_states = "kernelset_fp32_states" in t
        names = {"unpatched": "hf+adamw-fused" if fused else "hf+adamw-foreach",
                 "unpatched_foreach_adamw": "hf+adamw-foreach",
                 "kernelset": OURS if new_states else "kernelset-fp32-states",
                 "kernelset_fp32_states": "kernelset-fp32-states",
                 "kernelset_cuda_graphs": "kernelset-cuda-graphs",
                 "kernelset_node_sdpa": "kernelset-node-sdpa"}
        times, notes = {}, {}
        for k, v in t.items():
            if k in names and isinstance(v, dict) and v.get("ms") is not None:
                times[names[k]] = _num(v["ms"])
                if v.get("peak_gib") is not None:
                    notes[names[k]] = f"peak {v['peak_gib']:.1f} GiB"
        out += _ratio_records(base, "hf.train_step", f"llama-3.2-1b shape seq {seq} bf16 adamw", times,
                              ("hf+adamw-fused", "hf+adamw-foreach"), notes)
    return out


def records_from_capi_json(doc: dict[str, Any], *, date: str, commit: str | None = None,
                           run: str | None = None) -> list[Record]:
    """``scripts/capi_gpu_check.py --json``: each exported op through libkernelset.so against the
    Python path on the same inputs (``status`` ok / slow / failed, ``detail`` bitwise or the error);
    ratio_vs_best_peer of the C record is Python's time over C's."""
    base = dict(date=date, commit=commit, gpu=str(doc.get("device", "?")), sms=None, driver=None, cuda=None,
                torch=None, triton=None, source=CAPI, versions={}, run=run or f"{date} {doc.get('device', '?')}")
    out = []
    for r in doc.get("results", ()):
        op = str(r.get("c_op", "")).removeprefix("ks_") or r["case_id"]
        gb = _num(r.get("gbytes"))
        ok = r.get("status") in ("ok", "slow")
        for impl, key in (("capi", "capi_us"), ("python", "python_us")):
            us = _num(r.get(key))
            if us is None:
                continue
            other = _num(r.get("python_us" if impl == "capi" else "capi_us"))
            out.append(_plain(base, op=op, case=str(r["case_id"]), impl=impl,
                              ms=_num(us / 1e3), gbs=_num(gb / (us * 1e-6) if gb else None),
                              ratio_vs_best_peer=_num(other / us if other and us else None),
                              best_peer="python" if impl == "capi" else "capi", correct=ok,
                              note=f"{r.get('status')}: {r.get('detail', '')}; timed {r.get('timing', '?')}"))
    return out


def records_from_lce_json(doc: dict[str, Any], *, date: str, commit: str | None = None,
                          run: str | None = None) -> list[Record]:
    """``scripts/lce_memory.py --json``: linear_cross_entropy fwd+bwd time and the extra memory
    over the inputs, per chunk budget, against torch eager / torch.compile."""
    base = dict(date=date, commit=commit, gpu=str(doc.get("device", "?")), sms=None, driver=None, cuda=None,
                torch=None, triton=None, source=LCE, versions={}, run=run or f"{date} {doc.get('device', '?')}")
    case = case_label(doc["shape"], "fwd+bwd", {"bf16": "bfloat16"}.get(doc.get("dtype"), doc.get("dtype", "")))
    rows = [r for r in doc.get("rows", ()) if r.get("ms") is not None]
    peer, peer_ms = _best({r["impl"]: r["ms"] for r in rows}, [r["impl"] for r in rows
                                                                if not r["impl"].startswith(OURS)])
    out = []
    for r in rows:
        extra = r.get("extra_bytes")
        out.append(_plain(base, op="linear_cross_entropy", case=case, impl=r["impl"], ms=_num(r["ms"]),
                          ratio_vs_best_peer=_num(peer_ms / r["ms"] if peer_ms else None), best_peer=peer,
                          rel_err=_num(r.get("err")),
                          note=(f"extra memory {extra / 2**30:.2f} GiB" if extra else "") +
                               (f"; {r['note']}" if r.get("note") else "")))
    return out


def kind_of(doc: Any) -> str | None:
    """Which tool wrote a JSON document (None: a format this module does not import)."""
    if not isinstance(doc, dict):
        return None
    if {"environment", "ceilings", "cases"} <= set(doc):
        return BENCH
    if "bars" in doc and any(k in doc for k in ("prefill_ms", "decode_b1_ms", "train_1b")):
        return HF
    if "smoke_rc" in doc and "results" in doc:
        return CAPI
    if {"shape", "rows"} <= set(doc) and all("extra_bytes" in r for r in doc["rows"]):
        return LCE
    return None


def records_from_json(doc: dict[str, Any], *, date: str | None = None, commit: str | None = None,
                      backend: str | None = None, run: str | None = None) -> list[Record]:
    """Any supported document. ``date`` is needed by the formats that carry none (all but bench)."""
    kind = kind_of(doc)
    if kind == BENCH:
        return records_from_bench_json(doc, commit=commit, backend=backend, run=run)
    if kind is None:
        raise ValueError("not a format of ksctl bench, hf_check.py, capi_gpu_check.py or lce_memory.py")
    if not date:
        raise ValueError(f"a {kind} document carries no date: pass one")
    fn = {HF: records_from_hf_json, CAPI: records_from_capi_json, LCE: records_from_lce_json}[kind]
    return fn(doc, date=date, commit=commit, run=run)


# ---- the file ----------------------------------------------------------------------------------


def append(path: str | os.PathLike, records: Iterable[Record]) -> int:
    """Append records, one JSON object per line with sorted keys; lines already there are never
    rewritten. Returns how many were written."""
    lines = [r.to_json() + "\n" for r in records]
    if not lines:
        return 0
    prefix = ""
    if os.path.exists(path) and os.path.getsize(path):
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                prefix = "\n"  # a file someone edited by hand without its last newline
    with open(path, "a", encoding="utf-8") as f:
        f.write(prefix + "".join(lines))
    return len(lines)


def load(path: str | os.PathLike) -> list[Record]:
    """Every record, in file order. A malformed line fails with its line number."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(from_dict(json.loads(line)))
            except (ValueError, TypeError) as e:
                raise ValueError(f"{path}:{n}: {e}") from None
    return out


def latest(records: Iterable[Record]) -> dict[tuple, Record]:
    """The latest record per (source, GPU, op, case, impl): by date, then by file order."""
    out: dict[tuple, Record] = {}
    for r in records:
        k = r.key()
        if k not in out or r.date >= out[k].date:
            out[k] = r
    return out


# ---- rendering ---------------------------------------------------------------------------------


def _f(v: float | None, spec: str, dash: str = "-") -> str:
    return dash if v is None else format(v, spec)


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    if v < 0.1:
        return f"{v * 1e3:.1f} us"
    return f"{v:.3f} ms" if v < 10 else f"{v:.1f} ms"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _geomean(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _short(commit: str | None) -> str:
    return commit[:7] if commit else "-"


def _when(r: Record) -> str:
    return f"{r.date[:10]} {_short(r.commit)}"


def _is_ours(impl: str) -> bool:
    return impl == OURS or impl.startswith(OURS + "[") or impl.startswith(OURS + "-")


def _short_gpu(gpu: str) -> str:
    return gpu.removeprefix("NVIDIA ")


def _bench_cell(r: Record | None) -> str:
    if r is None:
        return ""
    if not r.correct or r.ms is None:
        return "wrong: " + (r.note or "failed its check")[:60] + f" ({_when(r)})"
    parts = [_ms(r.ms)]
    if r.pct_of_roofline is not None:
        parts.append(f"{r.pct_of_roofline:.1f}% {r.roofline}")
    if r.ratio_vs_best_peer is not None:
        parts.append(f"{_x(r.ratio_vs_best_peer)} {r.best_peer}")
    if r.bar_pct is not None:
        parts.append(f"bar {r.bar_pct:g}% " + ("met" if r.bar_met() else "**not met**"))
    return ", ".join(parts) + f" ({_when(r)})"


def _gpu_line(gpu: str, rows: list[Record]) -> str:
    r = max(rows, key=lambda r: r.date)
    bits = [f"{r.sms} SMs" if r.sms else None,
            f"torch {r.torch}" if r.torch else None, f"Triton {r.triton}" if r.triton else None,
            f"CUDA {r.cuda}" if r.cuda else None, f"driver {r.driver}" if r.driver else None]
    copies = [x.copy_gbs for x in rows if x.copy_gbs]
    mms = [x.matmul_tflops for x in rows if x.matmul_tflops]
    if copies:
        bits.append(f"copy {min(copies):.0f}-{max(copies):.0f} GB/s")
    if mms:
        bits.append(f"bf16 matmul {min(mms):.0f}-{max(mms):.0f} TFLOP/s")
    return f"- {gpu}: " + ", ".join(b for b in bits if b) + " (latest run's versions; ceilings over its runs)"


def _bench_section(by_gpu: dict[str, list[Record]]) -> list[str]:
    gpus = sorted(by_gpu)
    ours = {g: {(r.op, r.case, r.impl): r for r in by_gpu[g] if _is_ours(r.impl)} for g in gpus}
    keys = sorted({k for g in gpus for k in ours[g]})
    lines = [_gpu_line(g, by_gpu[g]) for g in gpus] + [""]
    lines += ["| op | case | impl | " + " | ".join(_short_gpu(g) for g in gpus) + " |",
              "|---|---|---|" + "---|" * len(gpus)]
    for op, case, impl in keys:
        lines.append(f"| {op} | {case} | {impl} | "
                     + " | ".join(_bench_cell(ours[g].get((op, case, impl))) for g in gpus) + " |")
    lines += ["", "Per op with more than one case, over kernelset's device-time rows above (AUTO backend): geometric "
              "mean and worst of the ratio, lowest % of roofline, bars met.", "",
              "| op | " + " | ".join(_short_gpu(g) for g in gpus) + " |", "|---|" + "---|" * len(gpus)]
    for op in sorted({k[0] for k in keys}):
        if all(sum(1 for (o, _, i), r in ours[g].items() if o == op and i == OURS and r.roofline) <= 1 for g in gpus):
            continue  # one case per GPU: its row above says it all
        cells = []
        for g in gpus:
            rs = [r for (o, _, impl), r in ours[g].items() if o == op and impl == OURS and r.roofline]
            if not rs:
                cells.append("")
                continue
            ratios = [r for r in rs if r.ratio_vs_best_peer]
            worst = min(ratios, key=lambda r: r.ratio_vs_best_peer) if ratios else None
            pcts = [r for r in rs if r.pct_of_roofline is not None]
            low = min(pcts, key=lambda r: r.pct_of_roofline) if pcts else None
            bars = [r for r in rs if r.bar_pct is not None]
            geo = _geomean([r.ratio_vs_best_peer for r in ratios])
            cell = [f"{len(rs)} case{'s' if len(rs) > 1 else ''}", f"geomean {_x(geo)}"]
            if worst is not None and len(ratios) > 1:
                cell.append(f"worst {_x(worst.ratio_vs_best_peer)} ({worst.case})")
            if low is not None:
                cell.append(f"lowest {low.pct_of_roofline:.1f}% {low.roofline} ({low.case})")
            if bars:
                cell.append(f"bars {sum(1 for r in bars if r.bar_met())}/{len(bars)}")
            cells.append(", ".join(cell))
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    return lines


def _ratio_section(by_gpu: dict[str, list[Record]]) -> list[str]:
    """Model steps: kernelset's variants against the strongest unpatched baseline, GPUs side by side."""
    gpus = sorted(by_gpu)
    cur = {g: {(r.op, r.case, r.impl): r for r in by_gpu[g] if _is_ours(r.impl)} for g in gpus}
    keys = sorted({k for g in gpus for k in cur[g]})
    lines = ["| step | case | impl | " + " | ".join(_short_gpu(g) for g in gpus) + " |",
             "|---|---|---|" + "---|" * len(gpus)]
    for k in keys:
        cells = []
        for g in gpus:
            r = cur[g].get(k)
            if r is None:
                cells.append("")
                continue
            base = next((b for b in by_gpu[g] if (b.op, b.case, b.impl) == (k[0], k[1], r.best_peer)), None)
            same = base is not None and base.run == r.run
            cells.append(f"{_ms(r.ms)}, {_x(r.ratio_vs_best_peer)} {r.best_peer}"
                         + (f" ({_ms(base.ms)}" + (f", {base.note}" if base.note else "") + ")" if same else "")
                         + (f", {r.note}" if r.note else "") + f" ({_when(r)})")
        lines.append(f"| {k[0]} | {k[1]} | {k[2]} | " + " | ".join(cells) + " |")
    return lines


def _last_run(records: list[Record]) -> list[Record]:
    """The records of the last run in ``records``: the latest date, the last in file order."""
    last = None
    for r in records:
        if last is None or r.date >= last.date:
            last = r
    return [r for r in records if r.run == last.run]


def _capi_lines(by_gpu: dict[str, list[Record]]) -> list[str]:
    """The last run per GPU: the check is one run over every exported op."""
    out = []
    for g in sorted(by_gpu):
        cs = [r for r in _last_run(by_gpu[g]) if r.impl == "capi"]
        if not cs:
            continue
        bitwise = sum(1 for r in cs if "bitwise" in r.note)
        ratios = [1.0 / r.ratio_vs_best_peer for r in cs if r.ratio_vs_best_peer]
        runs = sorted({_when(r) for r in cs})
        bad = sorted(r.case for r in cs if not r.note.startswith("ok"))
        out.append(f"- {g}: {len(cs)} cases, {bitwise} bitwise equal to the Python path; C time / Python time "
                   f"{min(ratios):.3f}-{max(ratios):.3f}" + (f"; not ok: {', '.join(bad)}" if bad else "")
                   + f" ({'; '.join(runs)})")
    return out


def _lce_lines(by_gpu: dict[str, list[Record]]) -> list[str]:
    out = []
    for g in sorted(by_gpu):
        rs = _last_run(by_gpu[g])
        out.append(f"- {g}, {rs[0].case} ({_when(rs[0])}): " + "; ".join(
            f"{r.impl} {_ms(r.ms)}" + (f" ({r.note})" if r.note else "") for r in rs))
    return out


def render_markdown(records: Iterable[Record], *, heading_level: int = 3) -> str:
    """The current tables: per GPU, the latest record per (op, case, impl). ``ksctl bench``: one row
    per case and kernelset implementation, one column per GPU (time, % of roofline, ratio to the
    strongest correct peer of the same run, the bar the case carried, date and commit), then per op
    the geometric mean and worst case of that ratio and the lowest % of roofline. HF model steps:
    kernelset's variants against the unpatched baseline. C ABI and linear_cross_entropy memory: a
    line per GPU. Deterministic: the same records give the same text."""
    records = list(records)
    cur = latest(records)
    h = "#" * heading_level
    by_src: dict[str, dict[str, list[Record]]] = {}
    for r in cur.values():
        by_src.setdefault(r.source, {}).setdefault(r.gpu, []).append(r)
    runs: dict[str, dict[str, list[Record]]] = {}  # every record, for the sources shown run by run
    for r in records:
        if r.source in (CAPI, LCE):
            runs.setdefault(r.source, {}).setdefault(r.gpu, []).append(r)
    out: list[str] = []
    bench = by_src.pop(BENCH, {})
    if bench:
        out += [f"{h} Kernels against their peers (`ksctl bench`)", "",
                "Latest record per case, kernelset implementation and GPU: time; % of roofline (of the copy "
                "bandwidth, or of the bf16 matmul rate where the case is compute-bound, both measured in that run); "
                "the strongest correct peer's time over kernelset's in the same run (> 1: faster); the bar the case "
                "carried then, judged on % of copy; date and commit. `graph`: every implementation timed as CUDA-graph "
                "replays; `kernelset[triton]`: the backend forced. Host-time rows are wall time per call.", ""]
        out += _bench_section(bench) + [""]
    hf = by_src.pop(HF, {})
    if hf:
        out += [f"{h} HuggingFace models (`scripts/hf_check.py`)", "",
                "Random-initialised models, each variant's median round (rounds interleaved from 2026-11-25 on); "
                "ratio: the faster unpatched variant's time over kernelset's, its time in brackets.", ""]
        out += _ratio_section(hf) + [""]
    if by_src.pop(CAPI, None):
        out += [f"{h} C ABI against the Python path (`scripts/capi_gpu_check.py`, last run per GPU)", ""]
        out += _capi_lines(runs[CAPI]) + [""]
    if by_src.pop(LCE, None):
        out += [f"{h} linear_cross_entropy time and extra memory (`scripts/lce_memory.py`, last run per GPU)", ""]
        out += _lce_lines(runs[LCE]) + [""]
    for src in sorted(by_src):  # a source without a layout of its own: every latest record
        out += [f"{h} {src}", "", "| gpu | op | case | impl | time | ratio | date |", "|---|---|---|---|---|---|---|"]
        for g in sorted(by_src[src]):
            for r in sorted(by_src[src][g], key=lambda r: (r.op, r.case, r.impl)):
                out.append(f"| {_short_gpu(g)} | {r.op} | {r.case} | {r.impl} | {_ms(r.ms)} | "
                           f"{_x(r.ratio_vs_best_peer)} | {_when(r)} |")
        out += [""]
    while out and not out[-1]:
        out.pop()
    return "\n".join(out) + "\n"


def replace_block(text: str, block: str) -> str:
    """``text`` with what lies between the results markers replaced by ``block``."""
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        raise ValueError(f"no {BEGIN} ... {END} block")
    return text[: i + len(BEGIN)] + "\n" + block + text[j:]


def block_of(text: str) -> str:
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        raise ValueError(f"no {BEGIN} ... {END} block")
    return text[i + len(BEGIN) + 1: j]


# ---- command line ------------------------------------------------------------------------------


def commit_that_added(path: str) -> str | None:
    """The commit that added ``path`` to git (None outside a repository or for an untracked file)."""
    try:
        full = os.path.abspath(path)
        out = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--", full], capture_output=True,
                             text=True, check=True, cwd=os.path.dirname(full)).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    lines = out.split()
    return lines[-1] if lines else None


def head_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def _date_from_path(path: str) -> str | None:
    m = re.search(r"(\d{4}-\d{2}-\d{2})", path)
    return m.group(1) if m else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernelset.bench.history",
                                description="benchmark results as data: import runs, render tables")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("import", help="append the records of benchmark JSON files to the results file")
    s.add_argument("files", nargs="+")
    s.add_argument("--results", default=DEFAULT_RESULTS)
    s.add_argument("--commit", default=None,
                   help="commit measured (default: the commit that added the file, else HEAD)")
    s.add_argument("--date", default=None, help="for formats that carry no date (default: a date in the path)")
    s.add_argument("--backend", default=None, help="the --backend a ksctl bench run forced (default: auto)")
    s.add_argument("--dry-run", action="store_true", help="print the records, append nothing")
    s = sub.add_parser("render", help="print the tables, or write them into the README's results block")
    s.add_argument("--results", default=DEFAULT_RESULTS)
    s.add_argument("--readme", default=None, help=f"write between the markers of this file (e.g. {DEFAULT_README})")
    s.add_argument("--check", action="store_true", help="with --readme: exit 1 if its block is stale, write nothing")
    args = p.parse_args(argv)

    if args.cmd == "import":
        total = 0
        for path in args.files:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
            if kind_of(doc) is None:
                print(f"{path}: not a supported format, skipped", file=sys.stderr)
                continue
            commit = args.commit or commit_that_added(path) or head_commit()
            recs = records_from_json(doc, date=args.date or _date_from_path(path), commit=commit,
                                     backend=args.backend, run=path)
            if args.dry_run:
                for r in recs:
                    print(r.to_json())
            else:
                total += append(args.results, recs)
            print(f"{path}: {len(recs)} records ({kind_of(doc)}, commit {_short(commit)})", file=sys.stderr)
        if not args.dry_run:
            print(f"{total} records appended to {args.results}", file=sys.stderr)
        return 0

    text = render_markdown(load(args.results))
    if not args.readme:
        sys.stdout.write(text)
        return 0
    with open(args.readme, encoding="utf-8") as f:
        old = f.read()
    new = replace_block(old, text)
    if args.check:
        if new != old:
            print(f"{args.readme}: results block is stale; run: python -m kernelset.bench.history render "
                  f"--results {args.results} --readme {args.readme}", file=sys.stderr)
            return 1
        return 0
    if new != old:
        with open(args.readme, "w", encoding="utf-8") as f:
            f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
