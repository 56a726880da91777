#!/usr/bin/env python3
"""The C ABI's release build on a GPU: model shapes at batch sizes nobody recorded.

    python scripts/capi_release_check.py [--models a,b] [--samples N] [--no-build] [--jobs N] [--json FILE]

1. builds libkernelset.so with the generator's ``release`` set for the given presets (all by
   default): the test set plus the align16 fallback of every launch the models' shapes record
   (capi/aot/ops/models.py), unless --no-build;
2. for every exported op, draws --samples of the release cases (fixed seed), replaces each one's
   token / batch count by a random one that was not recorded (the fallback variants must serve
   any batch: that is the point of the release set), builds random inputs on the GPU and runs the
   op through the Python API (backend="triton") and through ks.capi; the outputs must be equal bit
   for bit (the fallback differs from the JIT's specialization only in what it assumes of ints);
3. prints a table: per op, cases run, bitwise equal, KS_ERR_NOT_IMPLEMENTED (a shape the build does
   not cover), other failures; and the build's variant count, image size and time.

Exit 0 when every drawn case ran through the C ABI and matched; 1 otherwise; 2 without a GPU.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "scripts"), os.path.join(ROOT, "src"), os.path.join(ROOT, "capi", "aot")]

import capi_gpu_check as chk  # noqa: E402

# the field holding a case's token / batch count, per generator op (None: nothing to vary)
COUNT_FIELD = {"norm_fwd": "m", "act_fwd": "m", "softmax_fwd": "m", "rope_fwd": "t", "rope_ext": "t",
               "reshape_and_cache": "t", "copy_blocks": None, "embedding_fwd": "m", "ce_fwd": "m",
               "paged_attention": "b", "merge_attn_states": "t", "flash_fwd": None,
               # the MLA kernel's split count is a constexpr: another batch is another variant
               "mla_decode": None}
MAX_BYTES = 3 << 30  # skip a drawn case whose inputs would exceed this


def build(models: str, jobs: int) -> str:
    cmd = ["bash", os.path.join(ROOT, "scripts", "build_capi.sh"), "--set", "release", "--jobs", str(jobs)]
    if models:
        cmd += ["--models", models]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=chk._env(), capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("capi/aot:", "build_capi.sh:"))]
    return f"{' | '.join(lines)} ({time.time() - t0:.0f} s)"


def vary(op: str, case: dict, rng: random.Random) -> dict:
    """The case with a token / batch count that the release set did not record."""
    from ops import models
    field = COUNT_FIELD[op]
    c = dict(case)
    if field is None:
        return c
    hi = 300 if op == "paged_attention" else 9000
    while True:
        n = rng.randint(1, hi)
        if n not in models.TOKENS:
            break
    if op == "paged_attention":
        if c["varlen"]:
            return c
        c["b"] = n
        c["nb"] = n * c["width"]
    else:
        c[field] = n
    if op == "reshape_and_cache":  # room for one distinct slot per token
        c["nb"] = max(c["nb"], -(-n // c["bs"]))
    return c


def input_bytes(op: str, c: dict) -> int:
    el = 4
    if op == "paged_attention":
        return 2 * c["nb"] * c["bs"] * c["hkv"] * c["d"] * el
    if op == "flash_fwd":
        return 4 * c["b"] * c["sq"] * c["hq"] * c["d"] * el
    if op == "mla_decode":
        return c["nb"] * c["bs"] * (c["r"] + c["p"]) * el
    if op == "ce_fwd":
        return c["m"] * c["v"] * el
    if op == "softmax_fwd":
        return 2 * c["m"] * c["n"] * el
    if op == "embedding_fwd":
        return c["v"] * c["d"] * el
    if op == "act_fwd":
        return 3 * c["m"] * c["i"] * el
    return 0


def draw(samples: int, seed: int) -> list[tuple[str, dict]]:
    import ops
    rng = random.Random(seed)
    out = []
    for op in ops.OPS:
        cases = op.cases("release")
        if op.name == "paged_attention":  # no workspace: the C path takes the one-pass policy, Python splits
            cases = [c for c in cases if c["ws"]]
        picked = []
        for c in rng.sample(cases, min(len(cases), 4 * samples)):
            v = vary(op.name, c, rng)
            if input_bytes(op.name, v) <= MAX_BYTES:
                picked.append(v)
            if len(picked) == samples:
                break
        out += [(op.name, dict(c, gpu=f"{op.name}#{i}")) for i, c in enumerate(picked)]
    return out


def describe(op: str, c: dict) -> str:
    keys = {"norm_fwd": ("m", "n", "x", "res", "gemma"), "act_fwd": ("op", "m", "i", "dtype"),
            "softmax_fwd": ("m", "n", "dtype", "log"), "rope_fwd": ("t", "hq", "hk", "d", "rot", "dtype", "cache"),
            "rope_ext": ("t", "hq", "hk", "d", "cast", "dtype"), "reshape_and_cache": ("t", "h", "d", "bs", "kv", "cache"),
            "copy_blocks": ("bs", "h", "d", "dtype"), "embedding_fwd": ("m", "d", "v", "w", "ids"),
            "ce_fwd": ("m", "v", "x", "t", "smoothing", "softcap", "reduction"),
            "paged_attention": ("b", "width", "hq", "hkv", "d", "bs", "dtype", "cache", "window", "softcap", "sinks",
                                "varlen", "max_q"),
            "merge_attn_states": ("t", "h", "d", "a", "lse"),
            "flash_fwd": ("sq", "hq", "hkv", "d", "dtype", "varlen", "window", "softcap", "sinks"),
            "mla_decode": ("b", "width", "h", "r", "p", "bs", "dtype", "cache")}[op]
    return " ".join(f"{k}={c[k]}" for k in keys if k in c)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="", help="comma-separated presets (default: every preset)")
    ap.add_argument("--samples", type=int, default=12, help="cases drawn per op")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    import torch
    if not torch.cuda.is_available():
        print("capi_release_check: no CUDA GPU here")
        return 2
    from ops import models
    if args.models:
        models.select(args.models.split(","))
    built = "not rebuilt" if args.no_build else build(args.models, args.jobs)
    print(f"capi_release_check: build: {built}", flush=True)
    from kernelset import capi
    print(f"capi_release_check: {capi.build_info()}")
    device = torch.device("cuda", 0)
    rows, per_op = [], collections.defaultdict(collections.Counter)
    for op, c in draw(args.samples, args.seed):
        status, detail = "ok", ""
        try:
            run = chk.make_run(op, c, device)
            ok, detail = chk.compare(run)
            status = "ok" if ok else "mismatch"
            del run
        except capi.KsError as exc:
            status = "not_implemented" if exc.status_name == "KS_ERR_NOT_IMPLEMENTED" else "error"
            detail = str(exc)[:300]
        except torch.cuda.OutOfMemoryError:
            status, detail = "skipped", "out of memory"
        except Exception as exc:  # noqa: BLE001 - reported, the other cases still run
            status, detail = "error", f"{type(exc).__name__}: {exc}"[:300]
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        per_op[op][status] += 1
        rows.append(dict(op=op, case=describe(op, c), status=status, detail=detail))
        if status != "ok":
            print(f"  {op}: {status}: {describe(op, c)}: {detail}", flush=True)
    head = f"{'op':20s} {'cases':>6s} {'bitwise':>8s} {'not impl':>9s} {'other':>6s}"
    print(head + "\n" + "-" * len(head))
    for op, cnt in per_op.items():
        n = sum(cnt.values())
        print(f"{op:20s} {n:6d} {cnt['ok']:8d} {cnt['not_implemented']:9d} {n - cnt['ok'] - cnt['not_implemented']:6d}")
    total = sum(sum(c.values()) for c in per_op.values())
    good = sum(c["ok"] for c in per_op.values())
    print(f"capi_release_check: {good}/{total} drawn model-shape cases ran through the C ABI and matched the Python "
          f"path bit for bit ({torch.cuda.get_device_name(device)}, models: {args.models or 'all presets'})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(build=built, device=torch.cuda.get_device_name(device), models=args.models or "all",
                           rows=rows), f, indent=1)
    return 0 if good == total else 1


if __name__ == "__main__":
    sys.exit(main())
