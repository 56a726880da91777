"""kernelize on every causal-LM family the installed transformers knows, not only the coverage list.

kernelize matches modules by behaviour, so it may meet families nobody wrote a test for. For each
model type in transformers' causal-LM mapping this builds a tiny random model from the config
class's defaults (``evaluate.tiny_default_model``), runs it in fp32 unpatched and kernelized on the same ids, and
reports the logits' relative error and what was patched. A family is:

- ``same``: logits within 1e-5 relative (the patched kernels computed what the modules did);
- ``WRONG``: patched logits differ: a module was matched to a behaviour it does not have (a bug);
- ``kernelize-error``: kernelize raised, or the patched model raised where the unpatched one ran (a
  bug: a module whose call or behaviour differs from a replacement's must be left alone);
- ``hf-disagrees``: transformers' own eager and SDPA attention differ (no reference to hold to);
- ``no-build``: the shrunk config did not build or run unpatched (the sweep's limit, not a finding).

State-space and hybrid families (Mamba, Mamba-2, Jamba, Bamba, FalconH1, Zamba, Qwen3-Next ...) are
swept like the others: their mixers are shrunk by ``presets.tiny_from_defaults`` too.

``--mode decode`` compares a cached decode (teacher-forced, one token a step) instead of one
forward; ``--mode training`` kernelizes in training mode and compares the loss and every gradient
(within 1e-4).

Usage: python scripts/hf_family_sweep.py [--only a,b] [--mode forward|decode|training] [--verbose]
(CPU is enough)
"""
from __future__ import annotations

import argparse
import contextlib
import io
import warnings

import torch

def _run(model, ids, mode: str):
    """What the mode compares: forward logits; cached decode logits (8-token prefill, then one token
    at a time, teacher-forced); or the loss and every parameter gradient (eval mode, so no dropout or
    router noise, grad on)."""
    if mode == "forward":
        with torch.no_grad():
            return [model(ids).logits]
    if mode == "decode":
        from kernelset.hf.evaluate import cached_decode_logits
        return [cached_decode_logits(model, ids, 8)]
    model.zero_grad(set_to_none=True)
    loss = model(ids, labels=ids, use_cache=False).loss
    loss.backward()
    return [loss.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]


OPS = ("rms_norm", "layer_norm", "silu_and_mul", "swiglu", "gelu_and_mul", "swiglu_oai", "apply_rotary",
       "flash_attention", "embedding", "cross_entropy", "linear_cross_entropy", "gated_mlp", "qkv_rope")


def sweep(types: list[str], verbose: bool, mode: str, device: str = "cpu",
          one_by_one: bool = False) -> dict[str, list[str]]:
    import kernelset as ks
    from kernelset.core.tolerance import rel_err
    from kernelset.hf.evaluate import eager_sdpa_gap, tiny_default_model

    tol = 1e-4 if mode == "training" else 1e-5
    out: dict[str, list[str]] = {}
    for mt in types:
        try:
            with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
                warnings.simplefilter("ignore")
                model, ids = tiny_default_model(mt, device)
                ref = _run(model, ids, mode)
                # transformers' own eager and sdpa must agree first (5.17's Moshi: eager unmasked)
                disagree = eager_sdpa_gap(model, ids) > 1e-5
        except Exception as e:  # noqa: BLE001  (the sweep's own limit, reported)
            out.setdefault("no-build", []).append(f"{mt}: {type(e).__name__}: {str(e)[:100]}")
            continue
        if disagree:
            out.setdefault("hf-disagrees", []).append(f"{mt}: transformers' eager and sdpa differ")
            continue
        kmode = "training" if mode == "training" else "inference"
        if one_by_one:  # which op: each alone (merged projections count as "merge")
            for op in OPS + ("merge",):
                kw = dict(merge_projections=True, ops=["embedding"]) if op == "merge" else dict(ops=[op])
                if op == "merge" and kmode == "training":
                    continue
                try:
                    with warnings.catch_warnings(), ks.hf.kernelize(model, mode=kmode, **kw) as h:
                        warnings.simplefilter("ignore")
                        got = _run(model, ids, mode)
                        if h.counts:
                            err = max(rel_err(g.float(), r.float()) for g, r in zip(got, ref))
                            print(f"{mt} {op}: rel err {err:.1e} {dict(h.counts)}", flush=True)
                except Exception as e:  # noqa: BLE001
                    print(f"{mt} {op}: {type(e).__name__}: {str(e)[:160]}", flush=True)
        step = "kernelize"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with ks.hf.kernelize(model, mode=kmode) as h:
                    step = "the patched model (the unpatched one ran)"
                    got = _run(model, ids, mode)
                    counts = dict(h.counts)
                    rules = sorted({p.rule for p in h.patched})
        except Exception as e:  # noqa: BLE001
            out.setdefault("kernelize-error", []).append(f"{mt}: {step} raised {type(e).__name__}: {str(e)[:160]}")
            continue
        if len(got) != len(ref):
            errs = [float("inf")]
        elif mode == "training":
            # gradients: error over max(own norm, 1e-4 x all gradients' norm); a gradient that is zero in exact
            # math (a key bias: softmax ignores a constant per row) is rounding noise on both sides
            floor = 1e-4 * float(torch.stack([r.float().norm() for r in ref[1:]]).norm()) if len(ref) > 1 else 0.0
            errs = [rel_err(got[0].float(), ref[0].float())] + [
                float((g.float() - r.float()).norm()) / max(float(r.float().norm()), floor, 1e-30)
                for g, r in zip(got[1:], ref[1:])]
        else:
            errs = [rel_err(g.float(), r.float()) for g, r in zip(got, ref)]
        err = max(errs)
        kind = "same" if err < tol else "WRONG"
        detail = f"{mt}: rel err {err:.1e} (tensor {errs.index(err)}); rules {rules}; ops {counts}"
        out.setdefault(kind, []).append(detail if (verbose or kind != "same") else f"{mt} {sorted(counts)}")
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--only", default="")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--mode", choices=("forward", "decode", "training"), default="forward")
    p.add_argument("--device", default="cpu")
    p.add_argument("--one-by-one", action="store_true", help="also each op alone (which op differs)")
    args = p.parse_args()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    types = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) if not args.only else args.only.split(",")
    res = sweep(types, args.verbose, args.mode, args.device, args.one_by_one)
    for kind in ("WRONG", "kernelize-error", "same", "hf-disagrees", "no-build"):
        rows = res.get(kind, [])
        print(f"== {kind}: {len(rows)}")
        for r in rows:
            print("  ", r)
    return 1 if res.get("WRONG") or res.get("kernelize-error") else 0


if __name__ == "__main__":
    raise SystemExit(main())
