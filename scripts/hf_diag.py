"""Where the HF bars of issue 5 stand and why (GPU): a diagnosis beside scripts/hf_check.py.

    python scripts/hf_diag.py [--layers 8] [--skip top1,train,prefill] [--json out.json]

norm     rms_norm's llama rounding against transformers' LlamaRMSNorm: how many bf16 elements differ
top1     Llama-3-8B-shaped bf16 model (as hf_check builds it). Top-1 agreement and logits error
         against unpatched HF SDPA of: HF eager attention (two unpatched backends: the noise floor
         of bf16 itself), kernelize with each op alone, and all ops. The top-1/top-2 logit gap
         shows how flat random-init logits are.
train    torch.profiler over a training step of the Llama-3.2-1B shape, unpatched and patched: the
         kernels that take the time, the kernel total against the step's wall time (host-bound
         when the wall time is much longer), and a cProfile of the host side.
prefill  the same for the 1x2048 prefill of the 8B shape.
decode   host time of greedy decoding at batch 1 (HF generate's cache), cProfile both ways.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time


def _sync():
    import torch
    torch.cuda.synchronize()


def _free():
    import torch
    gc.collect()
    torch.cuda.empty_cache()


def _profile(fn, steps: int = 3, top: int = 18) -> dict:
    """Wall time per step, summed kernel time per step, and the top kernels by self device time."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    fn()
    _sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    _sync()
    wall = (time.perf_counter() - t0) / steps
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        _sync()
    rows = []
    total = 0.0
    for ev in prof.key_averages():
        dev = getattr(ev, "self_device_time_total", None)
        if dev is None:
            dev = getattr(ev, "self_cuda_time_total", 0.0)
        if dev <= 0 or getattr(ev, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        total += dev
        rows.append((dev / steps / 1e3, ev.count // steps, ev.key[:110]))
    rows.sort(reverse=True)
    return {"wall_ms": wall * 1e3, "kernel_ms": total / steps / 1e3, "top": rows[:top]}


def _print_profile(name: str, p: dict) -> None:
    print(f"--- {name}: wall {p['wall_ms']:.2f} ms/step, kernels {p['kernel_ms']:.2f} ms/step "
          f"({p['kernel_ms'] / p['wall_ms']:.0%} of wall)", flush=True)
    for ms, n, key in p["top"]:
        print(f"  {ms:8.3f} ms  x{n:<5} {key}", flush=True)


def _syncs(name: str, fn) -> None:
    """The synchronizing CUDA calls one call of ``fn`` makes (torch's sync debug mode), where from:
    a sync inside a step serializes the host's enqueueing with the kernels."""
    import warnings

    import torch
    fn()
    _sync()
    seen: dict[str, int] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    for w in caught:
        if "synchroniz" not in str(w.message):
            continue
        where = f"{w.filename}:{w.lineno}"
        seen[where] = seen.get(where, 0) + 1
    print(f"--- synchronizing calls in one {name}: {sum(seen.values())}", flush=True)
    for where, n in sorted(seen.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  x{n:<4} {where}", flush=True)


def _cprofile(name: str, fn, top: int = 30, sort: str = "tottime") -> None:
    """Host time: cProfile of one call (after a warm call), top functions by own time."""
    import cProfile
    import io
    import pstats
    fn()
    _sync()
    pr = cProfile.Profile()
    t0 = time.perf_counter()
    pr.enable()
    fn()
    pr.disable()
    host = time.perf_counter() - t0
    _sync()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats(sort).print_stats(top)
    print(f"--- cProfile {name}: {host * 1e3:.1f} ms of host time under the profiler", flush=True)
    print("\n".join(buf.getvalue().splitlines()[4:top + 12]), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--skip", default="")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("hf_diag: no CUDA device")
        return 0
    import kernelset as ks
    from kernelset.core.tolerance import rel_err
    from kernelset.hf.evaluate import build_model, config_for
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    skip = set(filter(None, args.skip.split(",")))
    dev = torch.device("cuda")
    out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    print(f"device {out['device']}; torch {torch.__version__}", flush=True)
    g = torch.Generator().manual_seed(0)
    cfg8 = config_for("llama-3-8b", layers=args.layers)
    ids = torch.randint(0, cfg8["vocab_size"], (1, args.seq), generator=g).to(dev)

    if "norm" not in skip:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
        m = LlamaRMSNorm(4096, eps=1e-5).to(dev, torch.bfloat16)
        with torch.no_grad():
            m.weight.copy_(torch.randn(4096, device=dev) * 0.3 + 1)
            x = (torch.randn(2048, 4096, device=dev) * 3).to(torch.bfloat16)
            want = m(x)
            out["norm_bits_differ"] = {}
            for order in (False, True):
                got = ks.rms_norm(x, m.weight, eps=1e-5, cast="llama", torch_order=order, backend="triton")
                nd = int((got != want).sum())
                print(f"rms_norm llama rounding (torch_order={order}) vs LlamaRMSNorm, 2048x4096 bf16: {nd} of "
                      f"{want.numel()} elements differ", flush=True)
                out["norm_bits_differ"][str(order)] = nd

    if "top1" not in skip:
        model = build_model(cfg8, dtype=torch.bfloat16, device=dev)
        res = {}

        def run(name: str, impl: str, ops) -> None:
            model.set_attn_implementation(impl)
            with torch.no_grad():
                if ops is None:
                    logits = model(ids).logits.float()
                else:
                    with ks.hf.kernelize(model, ops=ops):
                        logits = model(ids).logits.float()
            res[name] = logits

        run("hf sdpa", "sdpa", None)
        run("hf eager", "eager", None)
        for ops in (["rms_norm"], ["swiglu"], ["apply_rotary"], ["flash_attention"],
                    ["rms_norm", "swiglu", "apply_rotary", "flash_attention"]):
            run("ks " + "+".join(ops), "sdpa", ops)
        base = res["hf sdpa"]
        top2 = base.topk(2, dim=-1).values
        gap = (top2[..., 0] - top2[..., 1]).flatten()
        qs = torch.tensor([0.01, 0.05, 0.1, 0.5], device=dev)
        print(f"bf16 logits (HF sdpa): std per position {base.std(dim=-1).mean():.3e}; top1-top2 gap quantiles "
              f"(1/5/10/50%) {[f'{v:.2e}' for v in gap.quantile(qs).tolist()]}", flush=True)
        bmax = base.argmax(-1)
        rows = {}
        for name, lg in res.items():
            rows[name] = {"top1_vs_sdpa": (lg.argmax(-1) == bmax).float().mean().item(),
                          "rel_err_vs_sdpa": rel_err(lg, base), "bitwise": bool(torch.equal(lg, base))}
            r = rows[name]
            print(f"{name:<50} top1 vs HF sdpa {r['top1_vs_sdpa']:.4f}  rel err {r['rel_err_vs_sdpa']:.3e}  "
                  f"bitwise {r['bitwise']}", flush=True)
        out["top1"] = rows
        del model, res, base
        _free()

    if "decode" not in skip:
        import statistics

        from kernelset.hf.evaluate import greedy
        model = build_model(cfg8, dtype=torch.bfloat16, device=dev)
        prompt = ids[:, :128]
        res = {}
        for batch in (1, 32):
            prompt = ids[:, :128].repeat(batch, 1)
            for name in ("unpatched", "kernelset"):
                handle = ks.hf.kernelize(model) if name == "kernelset" else None
                greedy(model, prompt, 4)
                res[f"{name}_b{batch}"] = statistics.median(greedy(model, prompt, 33)[2] for _ in range(3)) * 1e3
                _print_profile(f"decode 8 tokens b{batch}, {name} (wall and kernels per 8-token generate)",
                               _profile(lambda: greedy(model, prompt, 9), steps=2, top=12))
                _cprofile(f"decode 32 tokens b{batch}, {name}", lambda: greedy(model, prompt, 33), top=40,
                          sort="cumtime")
                _cprofile(f"decode 32 tokens b{batch}, {name}", lambda: greedy(model, prompt, 33), top=30)
                if handle is not None:
                    print(f"counts {dict(handle.counts)}", flush=True)
                if handle is not None:
                    handle.restore()
            print(f"decode step b{batch}: unpatched {res[f'unpatched_b{batch}']:.2f} ms, kernelset "
                  f"{res[f'kernelset_b{batch}']:.2f} ms", flush=True)
        out["decode"] = res
        del model
        _free()

    if "prefill" not in skip:
        model = build_model(cfg8, dtype=torch.bfloat16, device=dev)
        model.set_attn_implementation("sdpa")
        with torch.no_grad():
            pa = _profile(lambda: model(ids, use_cache=False))
            _print_profile("prefill 1x2048, HF sdpa", pa)
            with ks.hf.kernelize(model):
                pb = _profile(lambda: model(ids, use_cache=False))
                _print_profile("prefill 1x2048, kernelset", pb)
                _cprofile("prefill 1x2048, kernelset", lambda: model(ids, use_cache=False))
        out["prefill"] = {"hf": pa, "ks": pb}
        del model
        _free()

    if "train" not in skip:
        cfg1 = config_for("llama-3.2-1b")
        tids = torch.randint(0, cfg1["vocab_size"], (1, args.seq), generator=g).to(dev)
        out["train"] = {}
        for patched in (False, True):
            model = build_model(cfg1, dtype=torch.bfloat16, device=dev).train()
            handle = ks.hf.kernelize(model, mode="training") if patched else None
            opt = (ks.optim.AdamW if patched else torch.optim.AdamW)(model.parameters(), lr=1e-5)

            def step():
                loss = model(input_ids=tids, labels=tids).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            name = "kernelset" if patched else "unpatched"
            prof = _profile(step)
            _print_profile(f"train step 1B seq {args.seq}, {name}", prof)
            out["train"][name] = prof
            _cprofile(f"train step, {name}", step)
            _syncs(f"train step, {name}", step)
            if handle is not None:
                print(handle.report(), flush=True)
                handle.restore()
            del model, opt, handle, step
            _free()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
