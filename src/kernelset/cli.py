"""ksctl: the command line of kernelset (also ``python -m kernelset``).

    ksctl list                      the catalog, from the registry
    ksctl explain OP --shape 4096x8192 --dtype bf16   what the user's own call runs here (the op's shape
                                                      grammar: ksctl explain --help)
    ksctl env                       device, versions, flags, which backends can run and why not
    ksctl verify                    every implementation against its fp32 reference (small shapes; on a
                                    CPU in Triton's interpreter, which ksctl switches on and says so)
    ksctl bench [OP ...]            benchmarks on a GPU: table, JSON, PNG
    ksctl run                       the main job: bench on a GPU; verify + dispatch plan on CPU
    ksctl plan [--json]             the dispatch decision per op on this machine
    ksctl plan --model llama-3.1-8b --gpu h100 [--dtype fp8] [--json]   what a model needs, per GPU
    ksctl eval --model qwen3-0.6b --tiny --dtype fp32 [--mode training] HF model unpatched vs kernelized
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import time

import torch

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "half": torch.float16, "fp32": torch.float32, "float32": torch.float32, "float": torch.float32}


def _dtype(text: str) -> torch.dtype:
    try:
        return DTYPES[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"dtype must be one of {', '.join(sorted(DTYPES))}, got {text!r}") from None


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.lower().replace(",", "x").split("x"))
    except ValueError:  # a part that is not an integer, or an empty one ("4xx")
        dims = ()
    if not dims or any(d < 0 for d in dims):
        raise argparse.ArgumentTypeError(f"shape must look like 4096x8192, got {text!r}")
    return dims


def _device(text: str) -> torch.device:
    try:
        return torch.device(text)
    except (RuntimeError, ValueError):  # torch's message lists every device type it was built with
        raise argparse.ArgumentTypeError(f"device must look like cpu, cuda or cuda:1, got {text!r}") from None


def _known_ops(names) -> None:
    """Each name is a declared op: a misspelt one must not select nothing and report success."""
    import kernelset  # noqa: F401  (declares the ops)
    from kernelset.core import registry
    for name in names or ():
        registry.op(name)  # ValueError naming the declared ops


def _table(rows: list[tuple[str, ...]], right: tuple[int, ...] = ()) -> list[str]:
    """Rows as lines, each column as wide as its widest cell (``right``: right-aligned columns);
    the last column is not padded."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))] if rows else []
    return [" ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def _use_interpreter_if_no_gpu() -> str | None:
    """ksctl verify / run / eval on a CPU-only machine run the Triton kernels in Triton's
    interpreter (checking them is their job there). Triton decides at decoration time (importing
    kernelset), so the process starts again with TRITON_INTERPRET=1 when it was not set; in-process
    callers (tests) set it before importing kernelset. Returns the line saying so (None on a GPU):
    a user's own code on the CPU runs no Triton kernel unless it sets TRITON_INTERPRET=1 too."""
    if torch.cuda.is_available():
        return None
    restarted = os.environ.pop("KS_CLI_REEXEC", None) == "1"
    if os.environ.get("TRITON_INTERPRET") != "1":
        if __name__ == "kernelset.cli" and sys.argv and not restarted:
            env = dict(os.environ, TRITON_INTERPRET="1", KS_CLI_REEXEC="1")
            sys.stdout.flush()
            os.execve(sys.executable, [sys.executable, "-m", "kernelset", *sys.argv[1:]], env)
        os.environ["TRITON_INTERPRET"] = "1"
        import kernelset as ks
        ks.config.reload()
        restarted = True
    # the interpreter's fp32->bf16 cast truncates; the GPU rounds to nearest even
    from kernelset.testing.interpreter import patch_bf16_rounding
    patch_bf16_rounding()
    if restarted:
        return ("no GPU: ksctl set TRITON_INTERPRET=1 for this run, so the Triton kernels run in Triton's "
                "interpreter (slow, for checking); your own code on a CPU runs them only with it set too")
    return "no GPU: the Triton kernels run in Triton's interpreter (TRITON_INTERPRET=1; slow, for checking)"


def _triton_note(device: torch.device) -> str | None:
    """What ``explain`` / ``plan`` add where Triton cannot run the device's tensors as the user's own
    call would: they answer for that call (no interpreter switched on behind the user's back)."""
    from kernelset.core import config
    if device.type != "cpu":
        return None
    if config.get().triton_interpret:
        return "Triton runs CPU tensors in its interpreter here (TRITON_INTERPRET=1): for checking, not speed"
    where = "no GPU" if not torch.cuda.is_available() else "CPU tensors"
    return f"Triton not run: {where}; set TRITON_INTERPRET=1 to run Triton kernels in its interpreter"


def cmd_list(args) -> int:
    import kernelset as ks
    rows = sorted((e.spec.family, e.name, ", ".join(e.backends), "yes" if e.spec.c_abi else "no", e.spec.doc)
                  for e in ks.catalog())
    if args.markdown:  # the README's catalog (tests/test_readme.py compares the two)
        from kernelset.core import registry
        print(registry.catalog_markdown(), end="")
        return 0
    if args.json:
        print(json.dumps([{"family": f, "op": n, "backends": b.split(", "), "c_abi": c == "yes", "doc": d,
                           "shape": _adapter(n).shape.full} for f, n, b, c, d in rows], indent=1))
        return 0
    for line in _table([("family", "op", "backends (priority order)", "C ABI", "formula"), *rows]):
        print(line)
    return 0


def _adapter(op: str):
    from kernelset.core import registry
    spec = registry.op(op)
    return importlib.import_module(f"kernelset.ops.{spec.family}.bench").ADAPTERS[op]


def _shape_help() -> str:
    """Every op's --shape grammar (explain's --help: computed when shown, it imports every family)."""
    import kernelset as ks
    rows = [(e.name, _adapter(e.name).shape) for e in ks.catalog()]
    width = max(len(n) for n, _ in rows)
    return "--shape per op (a shape of another length is refused):\n" + "\n".join(
        f"  {n:<{width}}  {g.describe()}" for n, g in rows)


def _example_inputs(op: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device):
    """(kernelset, the op's positional and keyword arguments) for ``shape`` read by the op's shape grammar."""
    import kernelset as ks
    adapter = _adapter(op)
    text = "x".join(map(str, shape))
    try:
        full = adapter.shape.parse(shape)
    except ValueError as exc:
        raise ValueError(f"{op}: --shape {text}: {exc}") from None
    try:
        inputs = adapter.inputs(full, dtype, device, "fwd")
    except (ValueError, TypeError, IndexError) as exc:  # values the op's example builder cannot use
        raise ValueError(f"{op}: cannot build example inputs from --shape {text} ({exc}); it takes "
                         f"{adapter.shape.describe()}") from None
    except (RuntimeError, MemoryError, AssertionError) as exc:  # too large, or a device this torch cannot use
        # (torch without CUDA raises AssertionError "Torch not compiled with CUDA enabled")
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{op}: cannot allocate example inputs of shape {'x'.join(map(str, shape))} on {device}: "
                         f"{why}") from None
    return ks, adapter.args(inputs), adapter.kwargs(inputs)


def cmd_explain(args) -> int:
    """What the user's own call of the op would run on this machine, as it is set up (no
    interpreter switched on here: ``ksctl env`` and the user's code see the same)."""
    device = args.device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ks, tensors, kwargs = _example_inputs(args.op, args.shape, args.dtype, device)
    exp = ks.explain(args.op, *tensors, backend=args.backend, backward=args.backward, verbose=not args.json,
                     **kwargs)
    note = _triton_note(device)
    if args.json:
        print(json.dumps({**exp.to_dict(), "note": note}, indent=1))
    elif note:
        print(f"note: {note}")
    return 0 if exp.chosen else 1


def _backend_status() -> list[tuple[str, str]]:
    from kernelset.core import config
    from kernelset.core.enums import Backend
    rows = []
    for b in Backend:
        if b is Backend.REFERENCE:
            rows.append((b.value, "usable: fp32 torch ops, any device"))
            continue
        if b is Backend.TORCH:
            rows.append((b.value, f"usable: torch {torch.__version__}"))
            continue
        module = {"triton": "triton", "liger": "liger_kernel", "flash_attn": "flash_attn",
                  "flashinfer": "flashinfer"}[b.value]
        try:
            mod = importlib.import_module(module)
        except Exception as exc:
            rows.append((b.value, f"not usable: cannot import {module} ({type(exc).__name__})"))
            continue
        status = f"importable ({getattr(mod, '__version__', '?')})"
        if b is Backend.TRITON:
            if torch.cuda.is_available():
                status += "; CUDA device present"
            elif config.get().triton_interpret:
                status += "; no GPU: runs in the interpreter (TRITON_INTERPRET=1), for testing only"
            else:
                status += "; no GPU and TRITON_INTERPRET unset: AUTO skips it"
        disabled = config.get().disabled_reason(b)
        if disabled:
            status += f"; {disabled}"
        rows.append((b.value, status))
    return rows


def cmd_env(args) -> int:
    import kernelset as ks
    print(f"kernelset {ks.__version__}; python {sys.version.split()[0]}; torch {torch.__version__}")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            print(f"cuda:{i} {p.name} sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, "
                  f"{p.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}")
    else:
        print("no CUDA device")
    print("\nbackends:")
    for line in _table(_backend_status()):
        print(f"  {line}")
    print("\nflags:")
    for name, value, doc in ks.config.describe():
        print(f"  {name}={value}\n      {doc}")
    return 0


VERIFY_SHAPES = ((3, 1000), (2, 4097), (1, 64))


def cmd_verify(args) -> int:
    """Run every implementation of every op on small random inputs against the fp32 reference."""
    interpreter = _use_interpreter_if_no_gpu()  # (first: it may restart the process, before kernelset is imported)
    _known_ops(args.ops)
    import kernelset as ks
    from kernelset.bench.harness import _check
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    failures, count = 0, 0
    print(f"verifying on {device}" + (f"; {interpreter}" if interpreter else ""))
    entries = [e for e in ks.catalog() if not args.ops or e.name in args.ops]
    widths = (max([len("op"), *(len(e.name) for e in entries)]),
              max([len("backend"), *(len(str(i.backend)) for e in entries for i in e.impls)]),
              max([len("shape"), *(len("x".join(map(str, s))) for s in VERIFY_SHAPES)]),
              len("bfloat16"), len("fwd+bwd"))
    cells = lambda *c: " ".join(f"{x:<{w}}" for x, w in zip(c, widths))  # noqa: E731
    print(f"{cells('op', 'backend', 'shape', 'dtype', 'mode')} {'worst rel err':>13}  result")
    for entry in entries:
        adapter = _adapter(entry.name)
        for impl in entry.impls:
            for shape in VERIFY_SHAPES:
                for dtype in (torch.bfloat16, torch.float32):
                    for mode in ("fwd", "fwd+bwd") if entry.spec.differentiable else ("fwd",):
                        inp = adapter.inputs(shape, dtype, device, mode)
                        refs = adapter.reference(inp, mode)
                        row = cells(entry.name, str(impl.backend), "x".join(map(str, shape)), str(dtype)[6:], mode)
                        try:
                            outs = adapter.ours(inp, mode, str(impl.backend))()
                            # the harness's check: as many outputs as references (zip() would pass a
                            # runner returning fewer), each within tolerance as a whole and in pieces
                            ok, worst, note = _check(outs, refs, inp["names"], entry.spec.tolerance, dtype, mode)
                        except ks.UnsupportedError as exc:
                            print(f"{row} {'-':>13}  skipped: {exc.reason}")
                            continue
                        except Exception as exc:  # a crash is this implementation's failure, not ksctl's
                            ok, worst, note = False, math.inf, f"{type(exc).__name__}: {exc}"
                        count += 1
                        failures += not ok
                        print(f"{row} {worst:>13.2e}  {'ok' if ok else 'FAIL: ' + note}")
    print(f"\n{count - failures} passed, {failures} failed")
    return 1 if failures else 0


def cmd_plan(args) -> int:
    """With --model: what a model needs on a GPU (hf/planning.py); without: the dispatch decision for
    each op at its benchmark shapes on this machine."""
    if getattr(args, "list", False):
        return _plan_list(args)
    if getattr(args, "model", None):
        from kernelset.hf.planning import plan
        try:
            p = plan(args.model, gpu=args.gpu, dtype=args.dtype, mode=args.mode, tokens=args.tokens)
        except ValueError as exc:
            print(f"ksctl plan: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(p.to_dict(), indent=1) if args.json else p.table())
        return 0
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    import kernelset as ks
    rows, exps = [], []
    for entry in ks.catalog():
        # a small example of each op (ksctl verify's: a 2-D shape the op's example builder fills
        # out), as the user's own call on this machine would be decided
        shape, adapter = entry.spec.bench[0].shape if entry.spec.bench else (4, 64), _adapter(entry.name)
        inputs = adapter.inputs((min(shape[0], 8), shape[-1]), torch.bfloat16, device, "fwd")
        exp = ks.explain(entry.name, *adapter.args(inputs), verbose=False, **adapter.kwargs(inputs))
        exps.append(exp)
        rejected = "; ".join(f"{c.backend}: {c.reason}" for c in exp.candidates if c.status == "rejected")
        rows.append((entry.name, "[" + "x".join(map(str, exp.problem.shape)) + "]", "bf16", "->",
                     str(exp.chosen), f"(rejected {rejected})" if rejected else ""))
    note = _triton_note(device)
    if args.json:
        print(json.dumps({"device": str(device), "note": note, "ops": [e.to_dict() for e in exps]}, indent=1))
        return 0
    print(f"dispatch plan on {device}:")
    for line in _table(rows):
        print(f"  {line}")
    if note:
        print(f"note: {note}")
    return 0


def _mixers(counts: dict[str, int]) -> str:
    """A hybrid's layer kinds (``36 linear_attention + 12 attention``); nothing for attention-only models."""
    if set(counts) <= {"attention", "full_attention"}:
        return ""
    return " + ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _plan_list(args) -> int:
    from kernelset.core.gpus import GPUS
    from kernelset.hf.planning import facts
    from kernelset.hf.presets import PRESETS
    rows = []
    for name, cfg in sorted(PRESETS.items()):
        f = facts(cfg)
        rows.append({"preset": name, "model_type": f.model_type, "layers": f.layers, "hidden": f.hidden,
                     "heads": f.heads, "kv_heads": f.kv_heads, "experts": f.experts, "mla": f.mla is not None,
                     "mixers": f.mixer_counts()})
    if getattr(args, "json", False):
        print(json.dumps({"presets": rows, "gpus": [g.to_dict() for g in GPUS]}, indent=1))
        return 0
    print(f"{len(rows)} presets (public config.json values):")
    for line in _table([(r["preset"], r["model_type"], str(r["layers"]), "layers, hidden", str(r["hidden"]),
                         f"{r['heads']}/{r['kv_heads']} heads" if r["heads"] else "no attention",
                         f"{r['experts']} experts" if r["experts"] else "", "MLA" if r["mla"] else "",
                         _mixers(r["mixers"])) for r in rows], right=(2, 4)):
        print(f"  {line}")
    print("\nGPUs (--gpu):")
    for line in _table([(g.key, g.name, g.sm, f"{g.memory_gib:g} GiB", f"{g.bandwidth_gbs:g} GB/s",
                         ", ".join(g.features.flags())) for g in GPUS], right=(3, 4)):
        print(f"  {line}")
    return 0


# Past this many parameters ksctl eval on a CPU (kernels in Triton's interpreter) refuses without
# --allow-full-on-cpu: qwen3-0.6b (596M) took 12 minutes there, printing nothing.
CPU_MAX_PARAMS = 50_000_000


def cmd_eval(args) -> int:
    """Unpatched vs kernelized on the same input: equality proof, op counts, speed (hf/evaluate.py)."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("ksctl eval needs transformers (pip install 'transformers>=4.54'); ksctl plan --model does not",
              file=sys.stderr)
        return 2
    interpreter = _use_interpreter_if_no_gpu()
    from kernelset.hf.evaluate import evaluate, load_model, parameter_estimate
    t0 = time.perf_counter()

    def progress(phase: str) -> None:  # each phase as it starts, on stderr (a CPU run takes minutes)
        print(f"[{time.perf_counter() - t0:6.1f}s] {phase}", file=sys.stderr, flush=True)

    device = args.device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 on both sides of the comparison
    elif interpreter:
        progress(interpreter)
    n = parameter_estimate(args.model, tiny_model=args.tiny, layers=args.layers)
    size = "size unknown" if not n else f"~{n / 1e6:.1f}M parameters" if n < 10**7 else \
        f"~{n / 1e6:,.0f}M parameters, ~{n * args.dtype.itemsize / 1e9:.1f} GB in {str(args.dtype)[6:]}"
    if device.type == "cpu" and n and n > CPU_MAX_PARAMS and not args.allow_full_on_cpu:
        print(f"ksctl eval: {args.model} has {size}: on a CPU, with the kernels in Triton's interpreter, each "
              "phase takes minutes to hours. Use --tiny for the preset at toy size (its structure kept), or "
              "--allow-full-on-cpu to run it anyway", file=sys.stderr)
        return 2
    progress(f"building {args.model}{' (tiny)' if args.tiny else ''} on {device} ({size})")
    model, tok, what = load_model(args.model, dtype=args.dtype, device=device, tiny_model=args.tiny,
                                  layers=args.layers, init_std=args.init_std, seed=args.seed)
    if args.prompt is not None:
        if tok is None:
            print("ksctl eval: --prompt needs a tokenizer in the model directory (presets have none)",
                  file=sys.stderr)
            return 2
        ids = tok(args.prompt, return_tensors="pt").input_ids.to(device)
    else:
        g = torch.Generator().manual_seed(args.seed)
        ids = torch.randint(0, model.config.vocab_size, (args.batch, args.prompt_tokens), generator=g).to(device)
    progress(f"model {what}; {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
    res = evaluate(model, ids, new_tokens=args.tokens, mode=args.mode, progress=progress)
    progress("done")
    print(json.dumps(res.to_dict(), indent=1) if args.json else res.text())
    return 0 if res.passed else 1


def cmd_bench(args) -> int:
    if not torch.cuda.is_available():
        print("ksctl bench needs a CUDA GPU (speed is only claimed on a GPU); on CPU use 'ksctl verify'",
              file=sys.stderr)
        return 2
    _known_ops(args.ops)
    from kernelset.bench import harness, report, timing
    device = torch.device("cuda")
    env = harness.environment(device)
    print(f"device {env['device']} {env['sm']}; torch {env['torch']}; triton {env['triton']}", file=sys.stderr)
    ceilings = {"copy_gbs": timing.copy_bandwidth_gbs(device), "matmul_tflops": timing.matmul_tflops(device)}
    print(f"copy {ceilings['copy_gbs']:.0f} GB/s, bf16 matmul {ceilings['matmul_tflops']:.0f} TFLOP/s",
          file=sys.stderr)
    cases = harness.select_cases(args.ops, sweep=not args.no_sweep)
    results: list = []
    extra: dict = {}
    skipped = []
    t0 = time.time()

    def save() -> None:  # after every case, so a run cut short still leaves its results
        if args.json:
            with open(args.json, "w") as f:
                f.write(harness.to_json(env, ceilings, results, extra | ({"skipped": skipped} if skipped else {})))

    print(report.HEADER, flush=True)
    for i, (spec, case) in enumerate(cases, 1):
        label = f"{spec.name} {'x'.join(map(str, case.shape))} {case.mode}"
        if args.budget and time.time() - t0 > args.budget:
            skipped.append(label)
            continue
        print(f"[{i}/{len(cases)}] {label} ({time.time() - t0:.0f}s)", file=sys.stderr, flush=True)
        results.append(harness.run_case(spec, case, device, ceilings["copy_gbs"], backend=args.backend,
                                        matmul_tflops=ceilings["matmul_tflops"],
                                        peers=not args.no_peers))
        print("\n".join(report.case_rows(results[-1])), flush=True)
        save()
    if (not args.ops or "rms_norm" in args.ops) and not skipped:
        from kernelset.ops.norm.bench import host_overhead
        extra["rms_norm_1x4096"] = host_overhead(device)
    print()
    print(report.table(results, ceilings))
    for k, v in extra.items():
        print(f"{k}: " + ", ".join(f"{n} {x:.2f}" for n, x in v.items()))
    if skipped:
        print(f"not run (past --budget {args.budget:.0f}s): " + "; ".join(skipped))
    save()
    if args.png:
        report.plot(results, args.png, env)
    print(report.summary_line(results))
    if args.record:
        from kernelset.bench import history
        doc = json.loads(harness.to_json(env, ceilings, results, extra))
        n = history.append(args.record, history.records_from_bench_json(doc, commit=history.head_commit(),
                                                                       backend=None if args.backend == "auto"
                                                                       else args.backend))
        print(f"recorded {n} results in {args.record}", file=sys.stderr)
    return 0 if all(c.ours() and c.ours().correct for c in results) and not skipped else 1


def cmd_results(args) -> int:
    from kernelset.bench import history
    return history.main(args.rest)


def cmd_run(args) -> int:
    """The main job: benchmarks on a GPU; on CPU, verify every op and print the dispatch plan."""
    if torch.cuda.is_available():
        return cmd_bench(args)
    rc = cmd_verify(args)
    print()
    cmd_plan(argparse.Namespace(model=None, list=False, json=False))  # (run's --json names a results file)
    return rc


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose epilog may be computed when the help is shown (explain's shape
    grammars import every op family: too slow for every start of ksctl)."""

    def __init__(self, *args, epilog_fn=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.epilog_fn = epilog_fn

    def format_help(self) -> str:
        if self.epilog_fn is not None:
            self.epilog = self.epilog_fn()
        return super().format_help()


def main(argv: list[str] | None = None) -> int:
    """ksctl's entry point. Output piped into a reader that stops early (``ksctl list | head``)
    ends quietly with 141 (128 + SIGPIPE, as a shell reports a command killed by it), not a
    BrokenPipeError traceback."""
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # inside the try: buffered output meets the closed pipe here
    except BrokenPipeError:
        try:  # Python flushes stdout again at exit: point it at /dev/null so that finds nothing to say
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):  # a stdout without a descriptor (captured in-process)
            pass
        return 141


def _main(argv: list[str] | None) -> int:
    p = _Parser(prog="ksctl", description="kernelset: fast LLM kernels with an explaining dispatcher")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("list", help="the op catalog")
    s.add_argument("--json", action="store_true")
    s.add_argument("--markdown", action="store_true", help="the README's catalog table")
    s.set_defaults(fn=cmd_list)
    s = sub.add_parser("results", help="benchmark history: import run JSONs into docs/benchmarks/results.jsonl, "
                                        "render its tables",
                       description="ksctl results import FILE.json... [--results PATH]  |  "
                                   "ksctl results render [--readme docs/benchmarks/README.md] [--check]")
    s.add_argument("rest", nargs=argparse.REMAINDER)
    s.set_defaults(fn=cmd_results)
    s = sub.add_parser("explain", help="which implementation runs a problem, and why",
                       description="Which implementation the op's own call would run here, as this machine is\n"
                                   "set up, and why each other one does not.",
                       epilog_fn=_shape_help, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("op")
    s.add_argument("--shape", type=_shape, required=True,
                   help="the op's dims in its own grammar (listed below): ROWSxHIDDEN for rms_norm, e.g. "
                        "4096x8192; BxSxHqxHkvxD for flash_attention, e.g. 2x4096x32x8x128")
    s.add_argument("--dtype", type=_dtype, default=torch.bfloat16)
    s.add_argument("--device", type=_device, default=None)
    s.add_argument("--backend", default="auto")
    s.add_argument("--backward", action="store_true", help="explain the backward's choice")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_explain)
    s = sub.add_parser("env", help="device, versions, flags, usable backends")
    s.set_defaults(fn=cmd_env)
    s = sub.add_parser("verify", help="every implementation against its fp32 reference, small shapes")
    s.add_argument("ops", nargs="*")
    s.set_defaults(fn=cmd_verify)
    s = sub.add_parser("plan", help="the dispatch decision per op on this machine; with --model, what a model "
                                    "needs on a GPU")
    s.add_argument("--model", default=None, help="a preset (see --list), a config.json or a model directory")
    s.add_argument("--gpu", default="h100", help="target GPU (see --list)")
    s.add_argument("--dtype", default="bf16", choices=("fp32", "bf16", "fp16", "fp8", "int8", "w4a16"))
    s.add_argument("--mode", default="inference", choices=("inference", "training"))
    s.add_argument("--tokens", type=int, default=4096, help="tokens per forward pass for the shapes")
    s.add_argument("--list", action="store_true", help="the presets and GPUs")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_plan)
    s = sub.add_parser("eval", help="a HuggingFace model unpatched vs kernelized: equality proof, op counts, speed")
    s.add_argument("--model", required=True, help="a preset (random init), a model directory or a .gguf file")
    s.add_argument("--dtype", type=_dtype, default=torch.bfloat16)
    s.add_argument("--tokens", type=int, default=64, help="greedy tokens to generate")
    s.add_argument("--prompt", default=None, help="text prompt (needs the model's tokenizer)")
    s.add_argument("--prompt-tokens", type=int, default=128, help="random prompt length without --prompt")
    s.add_argument("--batch", type=int, default=1)
    s.add_argument("--tiny", action="store_true", help="a preset at toy size (structure kept): runs on CPU")
    s.add_argument("--layers", type=int, default=None, help="override the preset's layer count")
    s.add_argument("--init-std", type=float, default=None, help="initializer_range of the random init")
    s.add_argument("--mode", default="inference", choices=("inference", "training"),
                   help="training: one training step (loss and every gradient) instead of the greedy decode")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--allow-full-on-cpu", action="store_true",
                   help=f"run a model of more than {CPU_MAX_PARAMS // 10**6}M parameters on a CPU (minutes to hours)")
    s.add_argument("--device", type=_device, default=None)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_eval)
    for name, fn, help_ in (("bench", cmd_bench, "benchmarks on a GPU"),
                            ("run", cmd_run, "the main job: bench on GPU, verify + plan on CPU")):
        s = sub.add_parser(name, help=help_)
        s.add_argument("ops", nargs="*")
        s.add_argument("--no-sweep", action="store_true", help="skip the hidden-size sweep")
        s.add_argument("--no-peers", action="store_true")
        s.add_argument("--backend", default="auto")
        s.add_argument("--json", default=None, help="write results as JSON here")
        s.add_argument("--png", default=None, help="write the %%-of-copy plot here")
        s.add_argument("--record", nargs="?", const="docs/benchmarks/results.jsonl", default=None, metavar="PATH",
                       help="append the run's results to the history file (default docs/benchmarks/results.jsonl)")
        s.add_argument("--budget", type=float, default=0.0,
                       help="seconds: start no new case after this long (the rest are listed as not run)")
        s.set_defaults(fn=fn)
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, TypeError) as exc:
        print(f"ksctl: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
