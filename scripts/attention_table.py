"""Measure every flash_attention implementation on this GPU and regenerate the dispatch table.

    python scripts/attention_table.py                 # measure, rewrite src/kernelset/ops/attention/dispatch_table.py
    python scripts/attention_table.py --dry-run       # measure and print only

Per (dtype, head dims, causal, mode, shape class) it times each implementation that supports the
problem (a named backend: runs or is skipped with its reason), checks it against the fp32 reference
on one (batch, KV head) slice (a wrong implementation gets no row position), and writes the
implementations fastest first. mode "fwd": no LSE, no gradient (SDPA's backends compete);
"fwd+lse": return_lse=True (the forward of a training step whose backward is ours); "train": the
fwd+bwd step with q, k, v requiring grad and no LSE asked (SDPA's backends run their own backward,
the others our op's forward and backward), timed from the forward to the last gradient. Shape class
"decode" (mode "fwd" only): one query token against a KV cache that grows by one token per call, as
a decode step calls it (GQA 32/8, cache in HF's [B, Hkv, L, D] layout), timed as wall time per call
over calls in a row (host included: a backend that builds a plan per KV length pays at every step).
Rows of other archs already in the table are kept; rows of this arch, of the measured modes and
classes, are replaced. The device, date and versions go into ``measured_on``.

    python scripts/attention_table.py --classes decode --modes fwd   # the decode rows only
"""
from __future__ import annotations

import argparse
import datetime
import pathlib
import pprint
import sys

import torch

import kernelset as ks
from kernelset.bench import timing
from kernelset.core import registry
from kernelset.core.tolerance import rel_err, tolerance
from kernelset.ops.attention import backends as BK
from kernelset.ops.attention import dispatch_table
from kernelset.ops.attention import reference as R

TABLE_PATH = pathlib.Path(BK.__file__).with_name("dispatch_table.py")
# shape class -> (batch, seq): about 32K tokens each, Hq = Hkv = 32 (the bench cases' heads)
CLASSES = {"short": (32, 1024), "medium": (8, 4096), "long": (2, 16384)}
DIMS = ((64, 64), (128, 128), (256, 256), (192, 128), (80, 80), (96, 96))
HEADS = 32
DECODE = (16, 2048, 32, 8)  # batch, first KV length, q heads, KV heads of the decode rows


def _check(out, lse, q, k, v, causal, dtype):
    """out (and lse) of batch 0, head 0 against the fp32 reference."""
    o, l = R.attention(q[:1, :, :1].float(), k[:1, :, :1].float(), v[:1, :, :1].float(), causal=causal)
    ok = rel_err(out[:1, :, :1], o) <= tolerance("attention", dtype)
    if lse is not None:
        ok = ok and rel_err(lse[:1, :1], l.transpose(-1, -2)) <= 2e-3
    return ok


def _check_grads(grads, q, k, v, do, causal, dtype):
    """dq, dk, dv of batch 0, head 0 against the fp32 reference's."""
    ins = [t[:1, :, :1].detach().float().requires_grad_() for t in (q, k, v)]
    o, _ = R.attention(*ins, causal=causal)
    want = torch.autograd.grad(o, ins, do[:1, :, :1].float())
    return all(rel_err(g[:1, :, :1], w) <= tolerance("attention", dtype, grad=True) for g, w in zip(grads, want))


def measure(dtype, d, dv, causal, mode, cls, device):
    b, s = CLASSES[cls]
    q = torch.randn(b, s, HEADS, d, device=device, dtype=dtype)
    k = torch.randn(b, s, HEADS, d, device=device, dtype=dtype)
    v = torch.randn(b, s, HEADS, dv, device=device, dtype=dtype)
    lse = mode == "fwd+lse"
    train = mode == "train"
    if train:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        do = torch.randn(b, s, HEADS, dv, device=device, dtype=dtype)
    times, notes = {}, {}
    for impl in registry.impls("flash_attention"):
        name = str(impl.backend)
        if name == "reference":
            continue
        fwd = lambda: ks.flash_attention(q, k, v, causal=causal, return_lse=lse, backend=name)  # noqa: E731
        fn = (lambda: torch.autograd.grad(fwd(), (q, k, v), do)) if train else fwd  # noqa: E731
        try:
            res = fwd()
            if train:
                grads = torch.autograd.grad(res, (q, k, v), do)
        except ks.UnsupportedError as exc:
            notes[name] = exc.reason[:120]
            continue
        except Exception as exc:  # a crashing candidate is recorded, never ranked
            notes[name] = f"{type(exc).__name__}: {str(exc)[:120]}"
            continue
        out, l = (res.out, res.lse) if lse else (res, None)
        if not _check(out.detach(), l, q.detach(), k.detach(), v.detach(), causal, dtype) \
                or (train and not _check_grads(grads, q, k, v, do, causal, dtype)):
            notes[name] = "WRONG result: not ranked"
            continue
        times[name] = timing.cuda_time_ms(fn, warmup=2 if train else 3, reps=5 if train else 10,
                                          min_ms=20.0 if train else 50.0)
    return (b, s, HEADS, HEADS, d, dv), times, notes


def measure_decode(dtype, d, dv, causal, device, calls: int = 32, rounds: int = 3):
    import statistics
    import time
    b, sk0, hq, hkv = DECODE
    maxlen = sk0 + calls * (rounds + 3)
    q = torch.randn(b, 1, hq, d, device=device, dtype=dtype)
    kc = torch.randn(b, hkv, maxlen, d, device=device, dtype=dtype)
    vc = torch.randn(b, hkv, maxlen, dv, device=device, dtype=dtype)
    at = [sk0]
    times, notes = {}, {}
    for impl in registry.impls("flash_attention"):
        name = str(impl.backend)
        if name == "reference":
            continue

        def call(i, name=name):
            sk = at[0] + i
            return ks.flash_attention(q, kc[:, :, :sk].transpose(1, 2), vc[:, :, :sk].transpose(1, 2),
                                      causal=causal, backend=name)
        try:
            out = call(0)
        except ks.UnsupportedError as exc:
            notes[name] = exc.reason[:120]
            continue
        except Exception as exc:
            notes[name] = f"{type(exc).__name__}: {str(exc)[:120]}"
            continue
        sk = at[0]
        if not _check(out, None, q, kc[:, :, :sk].transpose(1, 2), vc[:, :, :sk].transpose(1, 2), causal, dtype):
            notes[name] = "WRONG result: not ranked"
            continue
        n = 2 if name == "sdpa_cudnn" else calls  # tens of ms per call there (a plan per KV length)
        per = []
        for _ in range(rounds):
            at[0] += calls
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(n):
                call(i)
            torch.cuda.synchronize()
            per.append((time.perf_counter() - t0) / n * 1e3)
        times[name] = statistics.median(per)
    return (b, sk0, hq, hkv, d, dv), times, notes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="print, do not rewrite the table")
    ap.add_argument("--dtypes", default="bfloat16,float16")
    ap.add_argument("--quick", action="store_true", help="head dims 64/128 and bf16 only")
    ap.add_argument("--modes", default="fwd,fwd+lse,train", help="modes to measure (rows of other modes are kept)")
    ap.add_argument("--classes", default="short,medium,long,decode",
                    help="shape classes to measure (rows of other classes are kept)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    major, minor = torch.cuda.get_device_capability(device)
    arch = f"sm_{major}{minor}"
    dtypes = [getattr(torch, n) for n in (["bfloat16"] if args.quick else args.dtypes.split(","))]
    dims = DIMS[:2] if args.quick else DIMS
    rows = []
    for dtype in dtypes:
        for d, dv in dims:
            for causal in (True, False):
                for mode in args.modes.split(","):
                    for cls in args.classes.split(","):
                        if cls == "decode":
                            if mode != "fwd":
                                continue
                            shape, times, notes = measure_decode(dtype, d, dv, causal, device)
                        else:
                            shape, times, notes = measure(dtype, d, dv, causal, mode, cls, device)
                        order = sorted(times, key=times.get)
                        dims_s = str(d) if d == dv else f"{d}/{dv}"
                        dt = str(dtype).replace("torch.", "")
                        print(f"{arch} {dt} d{dims_s} {'causal' if causal else 'full'} {mode} {cls} {shape}: "
                              + ", ".join(f"{n} {times[n]:.3f}ms" for n in order)
                              + (f"  (not ranked: {notes})" if notes else ""), flush=True)
                        if order:
                            rows.append(dict(arch=arch, dtype=dt, head_dim=dims_s, causal=causal, mode=mode,
                                             shape_class=cls, order=order,
                                             ms={n: round(times[n], 4) for n in order}, shape=list(shape)))
                        torch.cuda.empty_cache()
    if args.dry_run:
        return 0
    props = torch.cuda.get_device_properties(device)
    import triton
    try:
        import flash_attn
        fa = getattr(flash_attn, "__version__", "installed")
    except Exception:
        fa = None
    env = dict(device=props.name, arch=arch, date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
               torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda,
               cudnn=torch.backends.cudnn.version(), flash_attn=fa)
    old = dispatch_table.TABLE
    kept = [r for r in old.get("rows", []) if not (r["arch"] == arch and r["mode"] in args.modes.split(",")
                                                   and r["shape_class"] in args.classes.split(","))]
    env["modes"], env["classes"] = args.modes.split(","), args.classes.split(",")
    # an earlier run of this arch stays listed while rows it measured remain
    earlier = [m for m in old.get("measured_on", []) if m.get("arch") != arch or any(
        r["arch"] == arch and r["mode"] in m.get("modes", [r["mode"]])
        and r["shape_class"] in m.get("classes", [r["shape_class"]]) for r in kept)]
    table = {"format": 1, "measured_on": earlier + [env], "rows": kept + rows}
    text = TABLE_PATH.read_text()
    head = text[: text.index("TABLE = ")]
    head = head.replace("Empty until the lead runs the script on the GPU machine (no row is guessed).\n", "")
    TABLE_PATH.write_text(head + "TABLE = " + pprint.pformat(table, width=116, sort_dicts=False) + "\n")
    print(f"wrote {len(rows)} rows for {arch} to {TABLE_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
