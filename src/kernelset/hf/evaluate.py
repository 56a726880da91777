"""``evaluate``: run a model unpatched and kernelized on the same input and prove they agree.

Reports the logits' relative error over the prompt, top-1 agreement over all prompt positions,
whether the greedy continuation (HF cache, one token at a time) is identical token for token, how
many times each kernelset op ran and on which backend, whether ``restore()`` gives the original
logits back bit for bit, and prefill / decode time both ways. Used by ``ksctl eval`` and
scripts/hf_check.py.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import time
from typing import Any

import torch
from torch import nn

from ..core.tolerance import rel_err
from .patching import kernelize, require_transformers
from .presets import PRESETS, preset, tiny, tiny_from_defaults

# What "the proof holds" means per activation dtype: fp32 must reproduce the model (reduction order
# is the only difference); bf16/fp16 round differently inside fused kernels (fp32 math, one
# rounding), so the continuation may legitimately diverge after a near tie, and top-1 is the bar.
CRITERIA: dict[torch.dtype, dict[str, float | bool]] = {
    torch.float32: {"max_rel_err": 1e-4, "min_top1": 0.999, "greedy_identical": True},
    torch.bfloat16: {"max_rel_err": 3e-2, "min_top1": 0.99, "greedy_identical": False},
    torch.float16: {"max_rel_err": 1e-2, "min_top1": 0.99, "greedy_identical": False},
}


def config_for(spec: str, *, tiny_model: bool = False, layers: int | None = None,
               init_std: float | None = None) -> dict[str, Any]:
    cfg = tiny(spec) if tiny_model else preset(spec)
    if layers is not None:
        cfg["num_hidden_layers"] = layers
        if "layer_types" in cfg:
            cfg["layer_types"] = cfg["layer_types"][:layers]
        if cfg.get("first_k_dense_replace", 0) >= layers:
            cfg["first_k_dense_replace"] = max(0, layers - 1)
    if init_std is not None:
        cfg["initializer_range"] = init_std
    return cfg


def build_model(cfg: dict[str, Any], *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                seed: int = 0, attn_implementation: str | None = None) -> nn.Module:
    """A random-initialised causal LM from config values (transformers' own init), in eval mode.
    ``attn_implementation`` (e.g. "eager"): transformers' attention for the unpatched model; None
    lets transformers choose (SDPA where it can, which for some versions and models skips the
    attention logit softcap: Gemma 2 on a GPU with transformers 5.17)."""
    require_transformers()
    from transformers import AutoConfig, AutoModelForCausalLM
    values = dict(cfg)
    model_type = values.pop("model_type")
    config = AutoConfig.for_model(model_type, **values)
    torch.manual_seed(seed)
    with torch.device(device):
        extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
        model = AutoModelForCausalLM.from_config(config, **_dtype_kwarg(dtype), **extra)
    return model.eval()


def _dtype_kwarg(dtype: torch.dtype) -> dict[str, torch.dtype]:
    """transformers' dtype argument of from_config / from_pretrained: ``dtype`` from 4.56, before
    that ``torch_dtype``."""
    from .patching import transformers_version
    return {"dtype" if (transformers_version() or (5,)) >= (4, 56) else "torch_dtype": dtype}


def load_model(spec: str, *, dtype: torch.dtype, device: str | torch.device, tiny_model: bool = False,
               layers: int | None = None, init_std: float | None = None, seed: int = 0) -> tuple[nn.Module, Any, str]:
    """(model, tokenizer or None, description) from a preset name, a model directory or a .gguf file."""
    require_transformers()
    if spec.strip().lower() in PRESETS:
        cfg = config_for(spec, tiny_model=tiny_model, layers=layers, init_std=init_std)
        what = f"preset {spec}{' (tiny)' if tiny_model else ''}{f', {layers} layers' if layers else ''}, random init"
        return build_model(cfg, dtype=dtype, device=device, seed=seed), None, what
    from transformers import AutoModelForCausalLM, AutoTokenizer
    kwargs: dict[str, Any] = _dtype_kwarg(dtype)
    path = spec
    if spec.endswith(".gguf"):
        import importlib.util
        missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
        if missing:  # transformers' GGUF loader needs both
            raise ValueError(f"{spec}: loading GGUF files needs the package(s) {', '.join(missing)} "
                             "(pip install 'kernelset[gguf]')")
        path, kwargs["gguf_file"] = os.path.dirname(spec) or ".", os.path.basename(spec)
    elif not os.path.isdir(spec):
        raise ValueError(f"--model {spec!r} is neither a preset nor a model directory / .gguf file")
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs).to(device).eval()
    try:
        tok = AutoTokenizer.from_pretrained(path, **({"gguf_file": kwargs["gguf_file"]} if "gguf_file" in kwargs else {}))
    except Exception:
        tok = None
    return model, tok, spec


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device, repeats: int) -> tuple[Any, float]:
    """(last result, median seconds) over ``repeats`` runs after one warm-up run."""
    out = fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times) if times else float("nan")


@torch.no_grad()
def greedy(model: nn.Module, input_ids: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, float, float]:
    """Greedy continuation with transformers' cache: (tokens [B, n], prefill s, mean decode step s)."""
    device = input_ids.device
    _sync(device)
    t0 = time.perf_counter()
    out = model(input_ids, use_cache=True)
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    _sync(device)
    t1 = time.perf_counter()
    cache, toks = out.past_key_values, [nxt]
    for _ in range(new_tokens - 1):
        out = model(nxt, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        toks.append(nxt)
    _sync(device)
    t2 = time.perf_counter()
    return torch.cat(toks, 1), t1 - t0, (t2 - t1) / max(new_tokens - 1, 1)


@torch.no_grad()
def cached_decode_logits(model: nn.Module, ids: torch.Tensor, prefill: int) -> torch.Tensor:
    """Logits of ``ids`` [B, S] through transformers' cache: the first ``prefill`` tokens in one call,
    then one token a call (teacher-forced: the next input is ids', not the argmax); [B, S, V]."""
    out = model(ids[:, :prefill], use_cache=True)
    logits, cache = [out.logits], out.past_key_values
    for t in range(prefill, ids.shape[1]):
        out = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
        logits.append(out.logits)
        cache = out.past_key_values
    return torch.cat(logits, 1)


def tiny_default_model(model_type: str, device: str | torch.device = "cpu",
                       max_params: int = 20_000_000) -> tuple[nn.Module, torch.Tensor]:
    """(model, ids [2, 12]): a random fp32 eval model of ``model_type`` from ``tiny_from_defaults``
    (eager attention) on ``device``. Raises where the shrunk config does not build or run: it is
    counted on the meta device first, and run once on the CPU before the move (a bad lookup raises
    there instead of a device assert)."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    cfg = tiny_from_defaults(model_type)
    with torch.device("meta"):
        n = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
    if n > max_params:
        raise ValueError(f"{n / 1e6:.0f}M parameters after shrinking")
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(ids)
    return model.to(device), ids.to(device)


@torch.no_grad()
def eager_sdpa_gap(model: nn.Module, ids: torch.Tensor) -> float:
    """Relative error between the model's logits under transformers' eager and SDPA attention (0 where
    SDPA does not run for it); the model is left on eager. Where they differ (transformers 5.17's
    Moshi runs eager unmasked, i.e. not causal, without a mask) there is no one reference."""
    ref = model(ids).logits
    try:
        model.set_attn_implementation("sdpa")
        other = model(ids).logits
    except Exception:  # noqa: BLE001  (no SDPA for this family)
        other = ref
    finally:
        model.set_attn_implementation("eager")
    return rel_err(other.float(), ref.float())


@dataclasses.dataclass
class EvalResult:
    device: str
    dtype: str
    prompt_tokens: int
    new_tokens: int
    logits_rel_err: float
    top1_agreement: float
    greedy_identical: bool
    first_divergence: int | None  # index of the first differing generated token
    restored_exact: bool
    counts: dict[str, int]
    backends: dict[str, list[str]]
    prefill_ms: dict[str, float]  # unpatched / patched
    decode_ms: dict[str, float]
    report: str
    criteria: dict[str, Any]
    failures: list[str]

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["passed"] = self.passed
        return d

    def text(self) -> str:
        speed = lambda d: f"{d['unpatched']:.2f} ms -> {d['patched']:.2f} ms ({d['unpatched'] / d['patched']:.2f}x)"
        lines = [
            self.report, "",
            f"device {self.device}, {self.dtype}; prompt {self.prompt_tokens} tokens, {self.new_tokens} generated",
            f"logits rel err (prompt)   {self.logits_rel_err:.3e}   (bar <= {self.criteria['max_rel_err']:g})",
            f"top-1 agreement           {self.top1_agreement:.4%}   (bar >= {self.criteria['min_top1']:.1%})",
            f"greedy continuation       {'identical' if self.greedy_identical else f'differs from token {self.first_divergence}'}"
            + ("" if self.criteria["greedy_identical"] else "   (reported; not a bar in this dtype)"),
            f"restore() exact           {self.restored_exact}",
            "kernelset op calls        " + ", ".join(f"{k} {v} [{'/'.join(self.backends.get(k, ['?']))}]"
                                                     for k, v in sorted(self.counts.items())),
            f"prefill                   {speed(self.prefill_ms)}",
            f"decode step               {speed(self.decode_ms)}",
        ]
        if self.device == "cpu":
            lines.append("(CPU: Triton runs in its interpreter; the times say nothing about GPU speed)")
        lines.append("PASS" if self.passed else "FAIL: " + "; ".join(self.failures))
        return "\n".join(lines)


def evaluate(model: nn.Module, input_ids: torch.Tensor, *, new_tokens: int = 64, mode: str = "inference",
             repeats: int = 3) -> EvalResult:
    """Unpatched vs kernelized on ``input_ids`` [B, S]: the proof and the speed (``model`` is restored)."""
    device = input_ids.device
    dtype = next(model.parameters()).dtype
    crit = dict(CRITERIA.get(dtype, CRITERIA[torch.bfloat16]))
    reps = repeats if device.type == "cuda" else 1
    with torch.no_grad():
        base, t_pre0 = _timed(lambda: model(input_ids).logits, device, reps)
        gen0, _, dec0 = greedy(model, input_ids, new_tokens)
        handle = kernelize(model, mode=mode)
        try:
            if device.type == "cuda":
                greedy(model, input_ids, 2)  # warm-up: compile the kernels outside the timing
            handle.reset_counts()
            ours, t_pre1 = _timed(lambda: model(input_ids).logits, device, reps)
            gen1, _, dec1 = greedy(model, input_ids, new_tokens)
            counts, backends, report = handle.counts, handle.backends, handle.report()
        finally:
            handle.restore()
        again = model(input_ids).logits
    agree = (ours.argmax(-1) == base.argmax(-1)).float().mean().item()
    diff = (gen0 != gen1).any(0).nonzero()
    res = EvalResult(
        device=device.type, dtype=str(dtype).replace("torch.", ""), prompt_tokens=input_ids.shape[1],
        new_tokens=new_tokens, logits_rel_err=rel_err(ours.float(), base.float()), top1_agreement=agree,
        greedy_identical=bool(torch.equal(gen0, gen1)), first_divergence=int(diff[0]) if len(diff) else None,
        restored_exact=bool(torch.equal(again, base)), counts=counts, backends=backends,
        prefill_ms={"unpatched": t_pre0 * 1e3, "patched": t_pre1 * 1e3},
        decode_ms={"unpatched": dec0 * 1e3, "patched": dec1 * 1e3}, report=report, criteria=crit, failures=[])
    if not res.logits_rel_err <= crit["max_rel_err"]:
        res.failures.append(f"logits rel err {res.logits_rel_err:.3g} > {crit['max_rel_err']:g}")
    if res.top1_agreement < crit["min_top1"]:
        res.failures.append(f"top-1 agreement {res.top1_agreement:.4f} < {crit['min_top1']}")
    if crit["greedy_identical"] and not res.greedy_identical:
        res.failures.append(f"greedy continuation differs from token {res.first_divergence}")
    if not res.restored_exact:
        res.failures.append("restore() did not give the original logits back")
    if not counts:
        res.failures.append("no kernelset op ran")
    only_ref = sorted(k for k, b in backends.items() if device.type == "cuda" and b == ["reference"])
    if only_ref:
        res.failures.append(f"only the fp32 reference ran for {', '.join(only_ref)} (no kernel)")
    return res
