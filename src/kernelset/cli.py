"""ksctl: the command line of kernelset (also ``python -m kernelset``).

    ksctl list                      the catalog, from the registry
    ksctl explain OP --shape 4096x8192 --dtype bf16
    ksctl env                       device, versions, flags, which backends can run and why not
    ksctl verify                    every implementation against its fp32 reference (small shapes)
    ksctl bench [OP ...]            benchmarks on a GPU: table, JSON, PNG
    ksctl run                       the main job: bench on a GPU; verify + dispatch plan on CPU
    ksctl plan --model llama-3.1-8b --gpu h100 [--dtype fp8] [--json]   what a model needs, per GPU
    ksctl eval --model qwen3-0.6b --tiny --dtype fp32                   HF model unpatched vs kernelized
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


def _use_interpreter_if_no_gpu() -> None:
    """On a CPU-only machine, run Triton kernels in the interpreter. Triton decides at decoration
    time (importing kernelset), so the process starts again with TRITON_INTERPRET=1 when it was
    not set; in-process callers (tests) set it before importing kernelset."""
    if torch.cuda.is_available():
        return
    if os.environ.get("TRITON_INTERPRET") != "1":
        if __name__ == "kernelset.cli" and sys.argv and not os.environ.get("KS_CLI_REEXEC"):
            env = dict(os.environ, TRITON_INTERPRET="1", KS_CLI_REEXEC="1")
            sys.stdout.flush()
            os.execve(sys.executable, [sys.executable, "-m", "kernelset", *sys.argv[1:]], env)
        os.environ["TRITON_INTERPRET"] = "1"
        import kernelset as ks
        ks.config.reload()
    # the interpreter's fp32->bf16 cast truncates; the GPU rounds to nearest even
    from kernelset.testing.interpreter import patch_bf16_rounding
    patch_bf16_rounding()


def cmd_list(args) -> int:
    import kernelset as ks
    rows = sorted((e.spec.family, e.name, ", ".join(e.backends), "yes" if e.spec.c_abi else "no", e.spec.doc)
                  for e in ks.catalog())
    if args.json:
        print(json.dumps([{"family": f, "op": n, "backends": b.split(", "), "c_abi": c == "yes", "doc": d}
                          for f, n, b, c, d in rows], indent=1))
        return 0
    print(f"{'family':<11} {'op':<20} {'backends (priority order)':<26} {'C ABI':<6} formula")
    for f, n, b, c, d in rows:
        print(f"{f:<11} {n:<20} {b:<26} {c:<6} {d}")
    return 0


def _example_inputs(op: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device):
    import kernelset as ks
    from kernelset.core import registry
    spec = registry.op(op)
    adapter = importlib.import_module(f"kernelset.ops.{spec.family}.bench").ADAPTERS[op]
    try:
        inputs = adapter.inputs(shape, dtype, device, "fwd")
    except (ValueError, TypeError, IndexError) as exc:  # a shape the op's example builder cannot read
        example = "x".join(map(str, spec.bench[0].shape)) if spec.bench else "4096x8192"
        raise ValueError(f"{op}: cannot build example inputs from --shape {'x'.join(map(str, shape))} "
                         f"({exc}); its benchmark cases use shapes like {example}") from None
    except (RuntimeError, MemoryError, AssertionError) as exc:  # too large, or a device this torch cannot use
        # (torch without CUDA raises AssertionError "Torch not compiled with CUDA enabled")
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{op}: cannot allocate example inputs of shape {'x'.join(map(str, shape))} on {device}: "
                         f"{why}") from None
    return ks, adapter.args(inputs)


def cmd_explain(args) -> int:
    _use_interpreter_if_no_gpu()
    device = args.device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ks, tensors = _example_inputs(args.op, args.shape, args.dtype, device)
    exp = ks.explain(args.op, *tensors, backend=args.backend, backward=args.backward, verbose=not args.json)
    if args.json:
        print(json.dumps(exp.to_dict(), indent=1))
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
        if b in config.get().disable:
            status += "; disabled by KS_DISABLE"
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
    for name, status in _backend_status():
        print(f"  {name:<11} {status}")
    print("\nflags:")
    for name, value, doc in ks.config.describe():
        print(f"  {name}={value}\n      {doc}")
    return 0


VERIFY_SHAPES = ((3, 1000), (2, 4097), (1, 64))


def cmd_verify(args) -> int:
    """Run every implementation of every op on small random inputs against the fp32 reference."""
    _use_interpreter_if_no_gpu()  # (first: it may restart the process, before kernelset is imported)
    _known_ops(args.ops)
    import kernelset as ks
    from kernelset.bench.harness import _check
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    failures, count = 0, 0
    print(f"verifying on {device} ({'GPU' if device.type == 'cuda' else 'CPU, Triton interpreter'})")
    print(f"{'op':<20} {'backend':<10} {'shape':<9} {'dtype':<9} {'mode':<8} {'worst rel err':>13}  result")
    for entry in ks.catalog():
        if args.ops and entry.name not in args.ops:
            continue
        adapter = importlib.import_module(f"kernelset.ops.{entry.spec.family}.bench").ADAPTERS[entry.name]
        for impl in entry.impls:
            for shape in VERIFY_SHAPES:
                for dtype in (torch.bfloat16, torch.float32):
                    for mode in ("fwd", "fwd+bwd") if entry.spec.differentiable else ("fwd",):
                        inp = adapter.inputs(shape, dtype, device, mode)
                        refs = adapter.reference(inp, mode)
                        row = (f"{entry.name:<20} {str(impl.backend):<10} {'x'.join(map(str, shape)):<9} "
                               f"{str(dtype)[6:]:<9} {mode:<8}")
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
    _use_interpreter_if_no_gpu()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    import kernelset as ks
    where = "" if device.type == "cuda" else " (no GPU: Triton runs in its interpreter, for checking only)"
    print(f"dispatch plan on {device}{where}:")
    for entry in ks.catalog():
        shape = entry.spec.bench[0].shape if entry.spec.bench else (4, 64)
        small = (min(shape[0], 8), shape[-1])
        _, tensors = _example_inputs(entry.name, small, torch.bfloat16, device)
        exp = ks.explain(entry.name, *tensors, verbose=False)
        rejected = "; ".join(f"{c.backend}: {c.reason}" for c in exp.candidates if c.status == "rejected")
        print(f"  {entry.name:<20} hidden {shape[-1]:<7} bf16 -> {exp.chosen}" + (f"  (rejected {rejected})"
                                                                                  if rejected else ""))
    return 0


def _plan_list(args) -> int:
    from kernelset.core.gpus import GPUS
    from kernelset.hf.planning import facts
    from kernelset.hf.presets import PRESETS
    rows = []
    for name, cfg in sorted(PRESETS.items()):
        f = facts(cfg)
        rows.append({"preset": name, "model_type": f.model_type, "layers": f.layers, "hidden": f.hidden,
                     "heads": f.heads, "kv_heads": f.kv_heads, "experts": f.experts, "mla": f.mla is not None})
    if getattr(args, "json", False):
        print(json.dumps({"presets": rows, "gpus": [g.to_dict() for g in GPUS]}, indent=1))
        return 0
    print(f"{len(rows)} presets (public config.json values):")
    for r in rows:
        moe = f", {r['experts']} experts" if r["experts"] else ""
        print(f"  {r['preset']:<20} {r['model_type']:<12} {r['layers']:>3} layers, hidden {r['hidden']:<6} "
              f"{r['heads']}/{r['kv_heads']} heads{moe}{', MLA' if r['mla'] else ''}")
    print("\nGPUs (--gpu):")
    for g in GPUS:
        print(f"  {g.key:<13} {g.name:<30} {g.sm:<7} {g.memory_gib:>4g} GiB {g.bandwidth_gbs:>5g} GB/s  "
              f"{', '.join(g.features.flags())}")
    return 0


def cmd_eval(args) -> int:
    """Unpatched vs kernelized on the same input: equality proof, op counts, speed (hf/evaluate.py)."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("ksctl eval needs transformers (pip install 'transformers>=4.50'); ksctl plan --model does not",
              file=sys.stderr)
        return 2
    _use_interpreter_if_no_gpu()
    from kernelset.hf.evaluate import evaluate, load_model
    device = args.device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 on both sides of the comparison
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
    print(f"model {what}; {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters", file=sys.stderr)
    res = evaluate(model, ids, new_tokens=args.tokens, mode=args.mode)
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
    return 0 if all(c.ours() and c.ours().correct for c in results) and not skipped else 1


def cmd_run(args) -> int:
    """The main job: benchmarks on a GPU; on CPU, verify every op and print the dispatch plan."""
    if torch.cuda.is_available():
        return cmd_bench(args)
    rc = cmd_verify(args)
    print()
    cmd_plan(args)
    return rc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ksctl", description="kernelset: fast LLM kernels with an explaining dispatcher")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("list", help="the op catalog")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_list)
    s = sub.add_parser("explain", help="which implementation runs a problem, and why")
    s.add_argument("op")
    s.add_argument("--shape", type=_shape, required=True, help="ROWSxHIDDEN, e.g. 4096x8192")
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
    s.add_argument("--mode", default="inference", choices=("inference", "training"))
    s.add_argument("--seed", type=int, default=0)
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
