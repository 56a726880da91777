"""``evaluate``: run a model unpatched and kernelized on the same input and prove they agree.

Reports the logits' relative error over the prompt, top-1 agreement over all prompt positions,
whether the greedy continuation (HF cache, one token at a time) is identical token for token, how
many times each kernelset op ran and on which backend, whether ``restore()`` gives the original
logits back bit for bit, and prefill / decode time both ways. In training mode the greedy
continuation gives way to one training step (loss and backward, labels = the input) on both
models: the loss and every parameter's gradient are compared, and the op counts are the step's.
Used by ``ksctl eval`` and scripts/hf_check.py.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import time
from typing import Any, Callable

import torch
from torch import nn

from ..core.tolerance import rel_err
from .patching import kernelize, require_transformers
from .presets import PRESETS, preset, tiny, tiny_from_defaults

# What "the proof holds" means per activation dtype: fp32 must reproduce the model (reduction order
# is the only difference); bf16/fp16 round differently inside fused kernels (fp32 math, one
# rounding), so the continuation may legitimately diverge after a near tie, and top-1 is the bar.
# A training step: the loss and each parameter's gradient (relative, norm-wise); fp32 as the
# training tests hold a patched model to (tests/test_hf.py); bf16/fp16 as their GPU bf16 test allows
# gradients that went through different roundings (seen on an H200, random init, 2 x 512 tokens:
# worst gradient 3.4e-2 for qwen3-0.6b, a k_norm weight, 1.7e-2 for llama-3.2-1b; loss ~1e-6).
CRITERIA: dict[torch.dtype, dict[str, float | bool]] = {
    torch.float32: {"max_rel_err": 1e-4, "min_top1": 0.999, "greedy_identical": True, "max_loss_rel_err": 1e-5,
                    "max_grad_rel_err": 1e-4},
    torch.bfloat16: {"max_rel_err": 3e-2, "min_top1": 0.99, "greedy_identical": False, "max_loss_rel_err": 1e-2,
                     "max_grad_rel_err": 5e-2},
    torch.float16: {"max_rel_err": 1e-2, "min_top1": 0.99, "greedy_identical": False, "max_loss_rel_err": 1e-2,
                    "max_grad_rel_err": 5e-2},
}
# the kernelize rules that route the loss through kernelset: when one is patched, a training step
# must have run linear_cross_entropy or cross_entropy
LOSS_RULES, LOSS_OPS = ("linear_cross_entropy", "causal_lm_loss"), ("linear_cross_entropy", "cross_entropy")


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


def parameter_estimate(spec: str, *, tiny_model: bool = False, layers: int | None = None) -> int | None:
    """Roughly how many parameters ``load_model`` would build, before anything is allocated: a
    preset's from its config's shapes (hf/planning), a model directory's or a .gguf file's from the
    size of its weight files at 2 bytes a parameter; None where it cannot tell."""
    if spec.strip().lower() in PRESETS:
        from .planning import facts, parameter_count
        try:
            return parameter_count(facts(config_for(spec, tiny_model=tiny_model, layers=layers)))
        except (KeyError, TypeError, ValueError):
            return None
    files = [spec] if spec.endswith(".gguf") and os.path.isfile(spec) else \
        [os.path.join(spec, f) for f in os.listdir(spec) if f.endswith((".safetensors", ".bin", ".pt", ".pth"))] \
        if os.path.isdir(spec) else []
    size = sum(os.path.getsize(f) for f in files)
    return size // 2 if size else None


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


def _measure(fn, device: torch.device, repeats: int) -> tuple[Any, float]:
    """(result, seconds): on a GPU ``_timed``'s median; on the CPU one call, timed (the interpreter's
    times say nothing about speed, and a full model's call takes minutes there)."""
    if device.type == "cuda":
        return _timed(fn, device, repeats)
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _cache_field() -> str:
    """The name of the cache in a model's outputs and arguments: ``cache`` in newer transformers,
    where ``past_key_values`` is a deprecated alias (5.24 warns it goes in 5.40), before that
    ``past_key_values`` (the oldest supported, 4.54)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast
    return "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"


@torch.no_grad()
def greedy(model: nn.Module, input_ids: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, float, float]:
    """Greedy continuation with transformers' cache: (tokens [B, n], prefill s, mean decode step s)."""
    device = input_ids.device
    field = _cache_field()
    _sync(device)
    t0 = time.perf_counter()
    out = model(input_ids, use_cache=True)
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    _sync(device)
    t1 = time.perf_counter()
    cache, toks = getattr(out, field, None), [nxt]
    for _ in range(new_tokens - 1):
        out = model(nxt, use_cache=True, **{field: cache})
        cache = getattr(out, field, None)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        toks.append(nxt)
    _sync(device)
    t2 = time.perf_counter()
    return torch.cat(toks, 1), t1 - t0, (t2 - t1) / max(new_tokens - 1, 1)


@torch.no_grad()
def cached_decode_logits(model: nn.Module, ids: torch.Tensor, prefill: int) -> torch.Tensor:
    """Logits of ``ids`` [B, S] through transformers' cache: the first ``prefill`` tokens in one call,
    then one token a call (teacher-forced: the next input is ids', not the argmax); [B, S, V]."""
    field = _cache_field()
    out = model(ids[:, :prefill], use_cache=True)
    logits, cache = [out.logits], getattr(out, field, None)  # None: a model without a cache (bert)
    for t in range(prefill, ids.shape[1]):
        out = model(ids[:, t:t + 1], use_cache=True, **{field: cache})
        logits.append(out.logits)
        cache = getattr(out, field, None)
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
    greedy_identical: bool | None  # None: not run (training mode)
    first_divergence: int | None  # index of the first differing generated token
    restored_exact: bool
    counts: dict[str, int]  # kernelset op calls (and merged_projections' GEMMs); training: the step's
    backends: dict[str, list[str]]
    prefill_ms: dict[str, float]  # unpatched / patched
    decode_ms: dict[str, float]  # (empty in training mode)
    report: str
    criteria: dict[str, Any]
    failures: list[str]
    mode: str = "inference"
    loss_rel_err: float | None = None  # training mode: the loss of one step, patched vs unpatched
    grad_rel_err: float | None = None  # training mode: the worst parameter's gradient
    worst_grad: str | None = None  # ... and its name
    step_ms: dict[str, float] = dataclasses.field(default_factory=dict)  # training step, unpatched / patched

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["passed"] = self.passed
        return d

    def _calls(self) -> list[str]:
        from ..core.registry import _OPS
        ops = [f"{k} {v}" + (f" [{'/'.join(self.backends[k])}]" if self.backends.get(k) else "")
               for k, v in sorted(self.counts.items()) if k in _OPS]
        # (an op without a backend ran inside a fused layer node, which dispatches it itself)
        other = [f"{k} {v}" for k, v in sorted(self.counts.items()) if k not in _OPS]
        step = " (one training step)" if self.mode == "training" else ""
        lines = ["kernelset op calls        " + (", ".join(ops) or "none") + step]
        if other:  # merged_projections: one torch GEMM for a group of projections, no kernelset op
            lines.append(f"torch calls (patched)     {', '.join(other)}")
        return lines

    def text(self) -> str:
        speed = lambda d: f"{d['unpatched']:.2f} ms -> {d['patched']:.2f} ms ({d['unpatched'] / d['patched']:.2f}x)"
        c = self.criteria
        lines = [
            self.report, "",
            f"device {self.device}, {self.dtype}, {self.mode}; prompt {self.prompt_tokens} tokens"
            + (f", {self.new_tokens} generated" if self.mode != "training" else ""),
            f"logits rel err (prompt)   {self.logits_rel_err:.3e}   (bar <= {c['max_rel_err']:g})",
            f"top-1 agreement           {self.top1_agreement:.4%}   (bar >= {c['min_top1']:.1%})",
        ]
        if self.mode == "training":
            lines += [f"training step loss        rel err {self.loss_rel_err:.3e}   (bar <= {c['max_loss_rel_err']:g})",
                      f"training step gradients   worst rel err {self.grad_rel_err:.3e} ({self.worst_grad})   "
                      f"(bar <= {c['max_grad_rel_err']:g})"]
        else:
            lines.append(f"greedy continuation       "
                         f"{'identical' if self.greedy_identical else f'differs from token {self.first_divergence}'}"
                         + ("" if c["greedy_identical"] else "   (reported; not a bar in this dtype)"))
        lines += [f"restore() exact           {self.restored_exact}", *self._calls(),
                  f"forward (prompt)          {speed(self.prefill_ms)}"]
        lines.append(f"training step             {speed(self.step_ms)}" if self.mode == "training" else
                     f"decode step               {speed(self.decode_ms)}")
        if self.device == "cpu":
            lines.append("(CPU: Triton runs in its interpreter; the times say nothing about GPU speed)")
        lines.append("PASS" if self.passed else "FAIL: " + "; ".join(self.failures))
        return "\n".join(lines)


def _train_step(model: nn.Module, ids: torch.Tensor, seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss, {parameter name: gradient}) of one forward and backward with labels = ``ids``; the
    gradients are taken out of ``.grad`` (left None). Dropout, where a model has any, draws the same
    masks on both sides (a seeded RNG of its own)."""
    params = dict(model.named_parameters())
    for p in params.values():
        p.grad = None
    with torch.random.fork_rng(devices=[ids.device] if ids.device.type == "cuda" else []):
        torch.manual_seed(seed)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    grads = {n: p.grad for n, p in params.items() if p.grad is not None}
    for p in params.values():
        p.grad = None
    return loss.detach(), grads


def _compare_steps(step0, step1) -> tuple[float, float, str | None, list[str]]:
    """(loss rel err, worst gradient rel err, its parameter, failures) of two training steps."""
    (l0, g0), (l1, g1) = step0, step1
    failures = []
    if set(g0) != set(g1):
        names = sorted(set(g0) ^ set(g1))
        failures.append(f"gradients of {', '.join(names[:3])}{' ...' if len(names) > 3 else ''} exist on one side only")
    worst, name = 0.0, None
    for n in sorted(set(g0) & set(g1)):
        e = rel_err(g1[n].float(), g0[n].float())
        if name is None or not e <= worst:  # (a NaN is the worst)
            worst, name = e, n
    return rel_err(l1.float(), l0.float()), worst, name, failures


def evaluate(model: nn.Module, input_ids: torch.Tensor, *, new_tokens: int = 64, mode: str = "inference",
             repeats: int = 3, progress: Callable[[str], None] | None = None) -> EvalResult:
    """Unpatched vs kernelized on ``input_ids`` [B, S]: the proof and the speed (``model`` is restored).
    Training mode: one training step each (``model`` left with the gradients it had, in its mode).
    ``progress(phase)`` is called as each phase starts (a full model on a CPU takes minutes)."""
    say = progress or (lambda phase: None)
    device = input_ids.device
    dtype = next(model.parameters()).dtype
    crit = dict(CRITERIA.get(dtype, CRITERIA[torch.bfloat16]))
    training = str(mode) == "training"
    was_training = model.training
    saved_grads = [p.grad for p in model.parameters()]
    seed = 0
    step_ms: dict[str, float] = {}
    dec0 = dec1 = float("nan")
    try:
        model.eval()
        with torch.no_grad():
            say("unpatched forward")
            base, t_pre0 = _measure(lambda: model(input_ids).logits, device, repeats)
            if not training:
                say(f"unpatched greedy decode ({new_tokens} tokens)")
                gen0, _, dec0 = greedy(model, input_ids, new_tokens)
        if training:
            say("unpatched training step")
            model.train()
            step0, t_step0 = _measure(lambda: _train_step(model, input_ids, seed), device, 0)
            if device.type == "cuda":
                _, t_step0 = _timed(lambda: _train_step(model, input_ids, seed), device, repeats)
        say(f"kernelize (mode={mode})")
        handle = kernelize(model, mode=mode)
        try:
            if training:
                say("patched training step")
                handle.reset_counts()
                step1, t_step1 = _measure(lambda: _train_step(model, input_ids, seed), device, 0)
                counts, backends = handle.counts, handle.backends  # (one step's)
                if device.type == "cuda":
                    _, t_step1 = _timed(lambda: _train_step(model, input_ids, seed), device, repeats)
                step_ms = {"unpatched": t_step0 * 1e3, "patched": t_step1 * 1e3}
                model.eval()
            elif device.type == "cuda":
                with torch.no_grad():
                    greedy(model, input_ids, 2)  # warm-up: compile the kernels outside the timing
            with torch.no_grad():
                if not training:
                    handle.reset_counts()
                say("patched forward")
                ours, t_pre1 = _measure(lambda: model(input_ids).logits, device, repeats)
                if not training:
                    say(f"patched greedy decode ({new_tokens} tokens)")
                    gen1, _, dec1 = greedy(model, input_ids, new_tokens)
                    counts, backends = handle.counts, handle.backends
            report = handle.report()
            patched_rules = {p.rule for p in handle.patched}
        finally:
            handle.restore()
        say("restore() check")
        with torch.no_grad():
            again = model(input_ids).logits
    finally:
        model.train(was_training)
        for p, g in zip(model.parameters(), saved_grads):
            p.grad = g
    agree = (ours.argmax(-1) == base.argmax(-1)).float().mean().item()
    if training:
        greedy_same, first = None, None
    else:
        diff = (gen0 != gen1).any(0).nonzero()
        greedy_same, first = bool(torch.equal(gen0, gen1)), (int(diff[0]) if len(diff) else None)
    res = EvalResult(
        device=device.type, dtype=str(dtype).replace("torch.", ""), prompt_tokens=input_ids.shape[1],
        new_tokens=0 if training else new_tokens, logits_rel_err=rel_err(ours.float(), base.float()),
        top1_agreement=agree, greedy_identical=greedy_same, first_divergence=first,
        restored_exact=bool(torch.equal(again, base)), counts=counts, backends=backends,
        prefill_ms={"unpatched": t_pre0 * 1e3, "patched": t_pre1 * 1e3},
        decode_ms={} if training else {"unpatched": dec0 * 1e3, "patched": dec1 * 1e3}, report=report,
        criteria=crit, failures=[], mode=str(mode), step_ms=step_ms)
    if not res.logits_rel_err <= crit["max_rel_err"]:
        res.failures.append(f"logits rel err {res.logits_rel_err:.3g} > {crit['max_rel_err']:g}")
    if res.top1_agreement < crit["min_top1"]:
        res.failures.append(f"top-1 agreement {res.top1_agreement:.4f} < {crit['min_top1']}")
    if crit["greedy_identical"] and res.greedy_identical is False:
        res.failures.append(f"greedy continuation differs from token {res.first_divergence}")
    if training:
        res.loss_rel_err, res.grad_rel_err, res.worst_grad, missing = _compare_steps(step0, step1)
        res.failures += missing
        if not res.loss_rel_err <= crit["max_loss_rel_err"]:
            res.failures.append(f"training loss rel err {res.loss_rel_err:.3g} > {crit['max_loss_rel_err']:g}")
        if not res.grad_rel_err <= crit["max_grad_rel_err"]:
            res.failures.append(f"gradient of {res.worst_grad} rel err {res.grad_rel_err:.3g} > "
                                f"{crit['max_grad_rel_err']:g}")
        if patched_rules & set(LOSS_RULES) and not any(counts.get(op) for op in LOSS_OPS):
            res.failures.append("the loss did not run through kernelset in the training step "
                                f"({', '.join(sorted(patched_rules & set(LOSS_RULES)))} patched)")
    if not res.restored_exact:
        res.failures.append("restore() did not give the original logits back")
    if not counts:
        res.failures.append("no kernelset op ran" + (" in the training step" if training else ""))
    only_ref = sorted(k for k, b in backends.items() if device.type == "cuda" and b == ["reference"])
    if only_ref:
        res.failures.append(f"only the fp32 reference ran for {', '.join(only_ref)} (no kernel)")
    return res
