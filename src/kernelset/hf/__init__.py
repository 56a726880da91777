"""kernelset in HuggingFace models: patch with proof, plan from any config, evaluate.

    import kernelset as ks
    with ks.hf.kernelize(model) as handle:       # needs transformers
        model.generate(...)
    print(handle.report(), handle.counts)
    ks.hf.plan("llama-3.1-8b", gpu="h100")       # needs only a config.json or a preset

Importing ``kernelset`` does not import this package, and importing this package does not import
transformers: ``kernelize`` and ``evaluate`` import it when called.
"""
from __future__ import annotations

from .patching import CountingOps, Kernelized, Mode, kernelize
from .planning import ModelPlan, load_config, plan
from .presets import PRESETS, preset, tiny

__all__ = ["CountingOps", "Kernelized", "Mode", "ModelPlan", "PRESETS", "kernelize", "load_config", "plan",
           "preset", "tiny"]
