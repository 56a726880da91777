"""kernelize on every causal-LM family the installed transformers knows, not only the coverage list.

kernelize matches modules by behaviour, so it may meet families nobody wrote a test for. For each
model type in transformers' causal-LM mapping this builds a tiny random model from the config
class's defaults (``presets.tiny_from_defaults``), runs it in fp32 unpatched and kernelized on the same ids, and
reports the logits' relative error and what was patched. A family is:

- ``same``: logits within 1e-5 relative (the patched kernels computed what the modules did);
- ``WRONG``: patched logits differ: a module was matched to a behaviour it does not have (a bug);
- ``kernelize-error``: kernelize or the patched forward raised (a bug: unknown modules must be
  left alone);
- ``no-build``: the shrunk config did not build or run unpatched (the sweep's limit, not a finding).

Usage: python scripts/hf_family_sweep.py [--only a,b] [--verbose]   (CPU is enough)
"""
from __future__ import annotations

import argparse
import contextlib
import io
import warnings

import torch

def sweep(types: list[str], verbose: bool) -> dict[str, list[str]]:
    import kernelset as ks
    from kernelset.core.tolerance import rel_err
    from kernelset.hf.presets import tiny_from_defaults
    from transformers import AutoModelForCausalLM

    out: dict[str, list[str]] = {}
    for mt in types:
        try:
            with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
                warnings.simplefilter("ignore")
                torch.manual_seed(0)
                cfg = tiny_from_defaults(mt)
                with torch.device("meta"):  # count first: a size the shrinking missed would not fit
                    n = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
                if n > 20_000_000:
                    raise ValueError(f"{n / 1e6:.0f}M parameters after shrinking")
                model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
                ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1))
                with torch.no_grad():
                    ref = model(ids).logits
        except Exception as e:  # noqa: BLE001  (the sweep's own limit, reported)
            out.setdefault("no-build", []).append(f"{mt}: {type(e).__name__}: {str(e)[:100]}")
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with ks.hf.kernelize(model) as h, torch.no_grad():
                    got = model(ids).logits
                    counts = dict(h.counts)
                    rules = sorted({p.rule for p in h.patched})
        except Exception as e:  # noqa: BLE001
            out.setdefault("kernelize-error", []).append(f"{mt}: {type(e).__name__}: {str(e)[:160]}")
            continue
        err = rel_err(got.float(), ref.float())
        kind = "same" if err < 1e-5 else "WRONG"
        detail = f"{mt}: rel err {err:.1e}; rules {rules}; ops {counts}"
        out.setdefault(kind, []).append(detail if (verbose or kind != "same") else f"{mt} {sorted(counts)}")
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--only", default="")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    types = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) if not args.only else args.only.split(",")
    res = sweep(types, args.verbose)
    for kind in ("WRONG", "kernelize-error", "same", "no-build"):
        rows = res.get(kind, [])
        print(f"== {kind}: {len(rows)}")
        for r in rows:
            print("  ", r)
    return 1 if res.get("WRONG") or res.get("kernelize-error") else 0


if __name__ == "__main__":
    raise SystemExit(main())
