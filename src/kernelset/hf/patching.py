"""``kernelize``: swap kernelset ops into a HuggingFace model, with a handle that undoes it.

    handle = ks.hf.kernelize(model)            # or: with ks.hf.kernelize(model) as handle: ...
    print(handle.report())                     # what was patched, what was left alone and why
    model.generate(...)
    handle.counts                              # calls per kernelset op (and the backends that ran)
    handle.restore()                           # every original forward back

The mapping is data (mapping.py); modules are matched by their attributes, their call signature and
a behaviour probe (their own code against the replacement on the same random inputs, on the
reference backends), so any decoder whose modules compute what Llama's, Gemma's, Phi-3's or
gpt-oss's do is patched. A kernelized model compiles with ``torch.compile(fullgraph=True)``: probes
that run at a first call are constants of the graph (``core.op.trace_constant``).
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import inspect
import re
import sys
import threading
from typing import Any, Callable, Iterable

import torch
from torch import nn

from ..core import config, dispatch
from ..core.enums import AUTO, Backend, KsEnum
from ..core.op import trace_constant
from ..core.tolerance import rel_err, tolerance
from . import mapping
from .mapping import Behaviour, Rule

# AttentionInterface and the loss_function setter (4.50), masking_utils' mask interface (4.53),
# PreTrainedModel.set_attn_implementation (4.54). Checked on 4.54.0 (2026-11-27): the family proofs
# give the same logits and greedy tokens there; fewer modules match (MoE experts kept as a list of
# MLPs, Gemma's scaled embedding, Qwen2-MoE's attention) and the report lists what is left; gpt_oss
# needs 4.55. CI and the GPU runs use transformers 5.
MIN_TRANSFORMERS = (4, 54)


class Mode(KsEnum):
    INFERENCE = "inference"  # every rule, forward-only ops included
    TRAINING = "training"  # only replacements with a backward that matches torch's gradients


def transformers_version() -> tuple[int, ...] | None:
    """The installed transformers version as integers, None if it is not installed."""
    try:
        import transformers
    except ImportError:
        return None
    return tuple(int(p) for p in re.findall(r"\d+", transformers.__version__)[:3])


def require_transformers() -> None:
    v = transformers_version()
    if v is None:
        raise ImportError(f"kernelset.hf needs transformers (pip install 'transformers>={_min()}'); "
                          "ksctl plan --model works without it")
    if v[:2] < MIN_TRANSFORMERS:
        have = ".".join(map(str, v))
        raise RuntimeError(f"kernelset.hf needs transformers >= {_min()}, found {have} (the attention and "
                           "mask interfaces, set_attn_implementation and the loss_function hook it patches "
                           "through are missing or different in older versions)")


def _min() -> str:
    return ".".join(map(str, MIN_TRANSFORMERS))


# ---- counting ----------------------------------------------------------------------------------

# the arguments each op's dispatcher keys on, from the public call's arguments
_DISPATCH_ARGS: dict[str, Callable[..., tuple]] = {
    "rms_norm": lambda x, weight=None, *, torch_order=False, **kw: (x, weight, {"torch_order": torch_order}),
    "layer_norm": lambda x, weight=None, bias=None, **kw: (x, weight, bias),
    "swiglu": lambda gate, up, **kw: (gate, up),
    "gated_mlp": lambda x, w_gate, w_up, w_down, **kw: (x.reshape(-1, x.shape[-1]), w_gate, w_up, w_down),
    "silu_and_mul": lambda x, **kw: (x, None),
    "gelu_and_mul": lambda x, **kw: (x, None),
    "swiglu_oai": lambda x, **kw: (x, None),
    "apply_rotary": lambda q, k, cos, sin, **kw: (q, k, cos, sin),
    "embedding": lambda ids, weight, **kw: (ids, weight),
    "cross_entropy": lambda logits, target, **kw: (logits.reshape(-1, logits.shape[-1]), target.reshape(-1)),
    "flash_attention": lambda q, k, v, *, layout="bshd", **kw: _attention_args(
        *((q, k, v) if layout == "bshd" else (t.transpose(1, 2) for t in (q, k, v))), **kw),
    "linear_cross_entropy": lambda hidden, weight, target, **kw: (hidden.reshape(-1, hidden.shape[-1]), weight,
                                                                  target.reshape(-1).contiguous()),
}


def _attention_args(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, sinks=None, **kw) -> tuple:
    return (q, k, v, None, None, {"causal": causal, "window": window, "softcap": softcap, "sinks": sinks,
                                  "need_lse": False, "max_seqlen_q": q.shape[1], "max_seqlen_k": k.shape[1],
                                  "request": AUTO})


class CountingOps:
    """kernelset's public ops, each call counted with the backend the dispatcher picks for it.

    The backend is looked up once per op and input shape class (dtype, last dim), from the
    dispatcher's own cached choice, so the count costs a dict update per call."""

    def __init__(self) -> None:
        self.allowed: frozenset[str] | None = None  # kernelize's ``ops``: the ops replacements may use
        self.counts: collections.Counter[str] = collections.Counter()
        self.backends: dict[str, set[str]] = collections.defaultdict(set)
        self._seen: set[tuple] = set()
        self._fns: dict[str, Callable] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Callable:
        if name.startswith("_"):
            raise AttributeError(name)
        fn = self._fns.get(name)
        if fn is None:
            import kernelset as ks
            fn = self._fns[name] = self._wrap(name, getattr(ks, name))
        return fn

    def _wrap(self, name: str, fn: Callable) -> Callable:
        args_of = _DISPATCH_ARGS.get(name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.counts[name] += 1
            if args_of is not None and not torch.compiler.is_compiling():
                first = args[0]
                key = (name, first.dtype, first.shape[-1] if first.dim() else 0, first.device.type)
                if key not in self._seen:
                    with self._lock:
                        self._seen.add(key)
                    try:
                        dargs = args_of(*args, **kwargs)
                        dkw = dargs[-1] if isinstance(dargs[-1], dict) else {}
                        impl = dispatch.select(name, kwargs.get("backend", AUTO), dargs[:-1] if dkw else dargs, dkw)
                        self.backends[name].add(str(impl.backend))
                    except Exception as exc:  # the call below raises the real error
                        self.backends[name].add(f"error: {type(exc).__name__}")
            return fn(*args, **kwargs)
        counted.__name__ = name
        return counted

    def reset(self) -> None:
        self.counts.clear()
        self.backends.clear()
        self._seen.clear()


# ---- behaviour probes ------------------------------------------------------------------------


def _reference_only() -> Any:
    """Run a block on the fp32 references: the probe checks what a replacement computes, not a kernel."""
    return config.override(disable={b for b in Backend if b is not Backend.REFERENCE})


class _Plain:
    """Uncounted ops for probes."""

    def __getattr__(self, name: str) -> Callable:
        import kernelset as ks
        return getattr(ks, name)


_PLAIN = _Plain()


def _compare(a: Any, b: Any) -> float:
    if isinstance(a, (tuple, list)):
        return max(_compare(x, y) for x, y in zip(a, b)) if len(a) == len(b) else math_inf()
    if not (torch.is_tensor(a) and torch.is_tensor(b)) or a.shape != b.shape or a.dtype != b.dtype:
        return math_inf()
    return rel_err(b, a)


def math_inf() -> float:
    return float("inf")


def _probe_modules(rule: Rule, m: nn.Module) -> list[tuple[nn.Module, torch.dtype]]:
    """The module itself, or (small modules) copies with random parameters in fp32 and bf16: random
    weights tell ``w`` from ``1 + w``, bf16 tells where the result is rounded."""
    if rule.probe_on_cpu:
        return [(_cpu_narrow_copy(m), mapping._param_dtype(m))]
    if not rule.probe_copy:
        return [(m, mapping._param_dtype(m))]
    out = []
    for dt in (torch.float32, torch.bfloat16):
        c = copy.deepcopy(m).to(dt)
        with torch.no_grad():
            for p in c.parameters():
                p.copy_(torch.randn_like(p) * 0.5 + 0.3)
        out.append((c, dt))
    return out


def _cpu_narrow_copy(m: nn.Module) -> nn.Module:
    """A shallow copy of a lookup module on the CPU: its weight a random [rows, 8] table in its dtype,
    its buffers and tensor attributes (``embed_scale``) copied to the CPU; same class, same forward."""
    c = copy.copy(m)
    c._parameters, c._buffers = {}, {k: (None if v is None else v.detach().cpu()) for k, v in m._buffers.items()}
    for k, v in list(vars(c).items()):
        if isinstance(v, torch.Tensor):
            setattr(c, k, v.detach().cpu())
    w = m.weight
    g = torch.Generator().manual_seed(0)
    c.weight = nn.Parameter(torch.randn(w.shape[0], 8, generator=g).to(w.dtype), requires_grad=False)
    if hasattr(c, "embedding_dim"):
        c.embedding_dim = 8
    return c


def _call_differs(method: Callable, name: str, n: int) -> str | None:
    """None when ``method`` (unbound) takes self and exactly ``n`` required positional parameters, as a
    replacement does (the probe's inputs), else why not. A module whose method takes more (Mamba-2's
    gated RMSNorm: ``forward(hidden_states, gate=None)``) is called with more: the replacement would
    raise there, or drop the argument. Names are not compared: a replacement is called positionally,
    as transformers calls norms, MLPs, embeddings and experts' gates."""
    try:
        params = list(inspect.signature(method).parameters.values())[1:]
    except (TypeError, ValueError):
        return f"its {name} signature cannot be read"
    plain = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    if len(params) == n and len(plain) == n:
        return None
    return (f"its {name}({', '.join(str(p) for p in params)}) takes other arguments than the replacement's "
            f"{n} tensor{'s' if n > 1 else ''}")


def probe(rule: Rule, m: nn.Module, mode: Mode) -> tuple[Behaviour | None, str]:
    """The behaviour of ``m`` among the rule's (the best match within tolerance), or None and why:
    the module's method must take what the replacement takes (``_call_differs``) and compute what it
    computes on random inputs."""
    original = getattr(type(m), rule.method)
    scored: list[tuple[float, Behaviour]] = []
    errors: list[str] = []
    probes = []
    for pm, dt in _probe_modules(rule, m):
        inputs = rule.probe_inputs(pm, dt)
        why = _call_differs(original, rule.method, len(inputs))
        if why is not None:
            return None, why
        with torch.no_grad():
            try:
                want = original(pm, *inputs)
            except Exception as exc:
                return None, f"its {rule.method} failed on probe inputs ({type(exc).__name__}: {exc})"
        probes.append((pm, dt, inputs, want))
    for b in rule.behaviours:
        if not b.applies(m):
            continue
        score = 0.0
        for pm, dt, inputs, want in probes:
            try:
                with torch.no_grad(), _reference_only():
                    got = b.build(pm, _PLAIN)(*inputs)
            except Exception as exc:
                score = math_inf()
                errors.append(f"{b.name}: {type(exc).__name__}: {exc}")
                break
            score = max(score, _compare(want, got) / tolerance("norm", dt))
        scored.append((score, b))
    if not scored:
        return None, "no behaviour's preconditions hold"
    score, best = min(scored, key=lambda s: s[0])
    if score > 1.0:
        why = "; ".join(f"{b.name}: err/tol {s:.3g}" for s, b in scored)
        return None, f"behaviour matches none of the known ones ({why}{'; ' + '; '.join(errors) if errors else ''})"
    if mode is Mode.TRAINING and not best.training:
        return None, f"{best.name} has no backward (inference only)"
    return best, f"{best.name} (probe err/tol {score:.2g})"


# ---- the handle --------------------------------------------------------------------------------


@dataclasses.dataclass
class Patched:
    rule: str
    where: str  # module path, or module:function
    behaviour: str
    ops: tuple[str, ...]


@dataclasses.dataclass
class Skipped:
    rule: str
    where: str
    reason: str


class Kernelized:
    """What ``kernelize`` did to a model, and how to undo it (``restore()`` or leave the ``with`` block)."""

    def __init__(self, model: nn.Module, mode: Mode) -> None:
        self.model = model
        self.mode = mode
        self.ops = CountingOps()
        self.scope = _Scope()
        self.patched: list[Patched] = []
        self.skipped: list[Skipped] = []
        self.left_to_torch: list[str] = []  # whole ops kernelset does not provide yet
        self._undo: list[Callable[[], None]] = []
        # what a copy of the model must not carry over (``copies.PlainCopies``): instance attributes set
        # on modules (module, name, had one before, the value before), hooks (module, hook id), and
        # the attention implementation of every config (config, its value before)
        self._attrs: list[tuple[nn.Module, str, bool, Any]] = []
        self._hooks: list[tuple[nn.Module, int]] = []
        self._configs: list[tuple[Any, Any]] = []
        self.active = True
        self.graphs = None  # graphs.LayerGraphs with cuda_graphs=True

    @property
    def counts(self) -> dict[str, int]:
        return dict(self.ops.counts)

    @property
    def backends(self) -> dict[str, list[str]]:
        return {k: sorted(v) for k, v in self.ops.backends.items()}

    def reset_counts(self) -> None:
        self.ops.reset()

    def restore(self) -> None:
        """Give back every original forward, function and hook; idempotent."""
        while self._undo:
            self._undo.pop()()
        if self.graphs is not None:  # the layers' graphs and the memory they hold
            self.graphs.entries.clear()
        if self.active and getattr(self.model, "_ks_kernelized", None) is self:
            del self.model._ks_kernelized
        self.active = False

    def __enter__(self) -> "Kernelized":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.restore()

    def summary(self) -> dict[str, Any]:
        by_rule: dict[str, dict[str, Any]] = {}
        for p in self.patched:
            e = by_rule.setdefault(p.rule, {"count": 0, "behaviours": set(), "ops": set()})
            e["count"] += 1
            e["behaviours"].add(p.behaviour)
            e["ops"].update(p.ops)
        return {
            "mode": str(self.mode),
            "patched": {r: {"count": e["count"], "behaviours": sorted(e["behaviours"]), "ops": sorted(e["ops"])}
                        for r, e in by_rule.items()},
            "skipped": [dataclasses.asdict(s) for s in self.skipped],
            "left_to_torch": list(self.left_to_torch),
            "counts": self.counts, "backends": self.backends,
        }

    def report(self) -> str:
        s = self.summary()
        lines = [f"kernelset.hf.kernelize ({s['mode']}):"]
        for rule, e in s["patched"].items():
            lines.append(f"  patched {rule:<16} x{e['count']:<4} -> {', '.join(e['ops']) or 'torch GEMM'}  [{'; '.join(e['behaviours'])}]")
        seen: set[tuple[str, str]] = set()
        for sk in self.skipped:  # one line per (rule, reason), not per layer
            if (sk.rule, sk.reason) in seen:
                continue
            seen.add((sk.rule, sk.reason))
            lines.append(f"  left    {sk.rule:<16} {sk.where}: {sk.reason}")
        for what in self.left_to_torch:
            lines.append(f"  torch   {what}")
        return "\n".join(lines)


# ---- kernelize ---------------------------------------------------------------------------------


def _set_method(handle: Kernelized, m: nn.Module, name: str, fn: Callable) -> None:
    had = name in m.__dict__
    old = m.__dict__.get(name)
    object.__setattr__(m, name, fn)
    handle._attrs.append((m, name, had, old))

    def undo() -> None:
        if had:
            object.__setattr__(m, name, old)
        else:
            m.__dict__.pop(name, None)
    handle._undo.append(undo)


def _wanted(b: Behaviour, ops: frozenset[str] | None) -> bool:
    return ops is None or set(b.ops) <= ops


def _patch_modules(handle: Kernelized, model: nn.Module, ops: frozenset[str] | None) -> None:
    cache: dict[tuple, tuple[Behaviour | None, str]] = {}
    claimed: set[int] = set()
    for path, m in model.named_modules():
        for rule in mapping.RULES:
            if id(m) in claimed or not rule.candidate(m):
                continue
            claimed.add(id(m))
            where = path or "<model>"
            if ops is not None and not any(_wanted(b, ops) for b in rule.behaviours):
                handle.skipped.append(Skipped(rule.name, where, "not among the requested ops"))
                break
            pre = mapping.TRAINING_PRECONDITIONS.get(rule.name)
            if handle.mode is Mode.TRAINING and pre is not None and pre(m):
                handle.skipped.append(Skipped(rule.name, where, pre(m)))
                break
            w = getattr(m, "weight", None)
            key = (rule.name, type(m), tuple(w.shape) if torch.is_tensor(w) else None,
                   getattr(m, "padding_idx", None), hasattr(m, "embed_scale"))
            if key not in cache:
                cache[key] = probe(rule, m, handle.mode)
            behaviour, why = cache[key]
            if behaviour is None or not _wanted(behaviour, ops):
                handle.skipped.append(Skipped(rule.name, where, why if behaviour is None else
                                              f"{behaviour.name} needs {behaviour.ops}, not requested"))
                break
            _set_method(handle, m, rule.method, behaviour.build(m, handle.ops))
            handle.patched.append(Patched(rule.name, where, behaviour.name, behaviour.ops))
            break


class _Scope:
    """Whether the current thread is inside the kernelized model's forward.

    Rotary functions are module globals of a modeling file, shared by every model of the family in
    the process; their replacement uses kernelset only inside this model (a depth counter kept by
    hooks on the model and its base model, which also run when the forward raises)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def inside(self) -> bool:
        return getattr(self._local, "depth", 0) > 0

    def enter(self, *_: Any) -> None:
        self._local.depth = getattr(self._local, "depth", 0) + 1

    def leave(self, *_: Any) -> None:
        self._local.depth = max(0, getattr(self._local, "depth", 0) - 1)

    def attach(self, handle: "Kernelized", model: nn.Module) -> None:
        roots = [model]
        base = getattr(model, getattr(model, "base_model_prefix", ""), None)
        if isinstance(base, nn.Module) and base is not model:
            roots.append(base)
        for r in roots:
            pre = r.register_forward_pre_hook(self.enter)
            post = r.register_forward_hook(self.leave, always_call=True)
            handle._undo.append(pre.remove)
            handle._undo.append(post.remove)
            handle._hooks += [(r, pre.id), (r, post.id)]


class _RotaryPatch:
    """A modeling module's ``apply_rotary_pos_emb*`` replaced by kernelset's ``apply_rotary``.

    The table layout (full, half-width, interleaved) is known only from a real call, so each new
    shape signature is probed once against the original (fp32, reference backend) and the
    matching variant is cached; a signature no variant matches runs the original and is reported.
    One patch per function serves every kernelized model of the family (``handles``): a call runs
    kernelset's op, counted for the model it is inside, and the original outside them all."""

    def __init__(self, handle: Kernelized, module: Any, name: str, original: Callable) -> None:
        self.handles, self.module, self.name, self.original = [handle], module, name, original
        self.where = f"{module.__name__.rsplit('.', 1)[-1]}.{name}"
        sig = inspect.signature(original)
        self.params = list(sig.parameters)
        p = sig.parameters.get("unsqueeze_dim")
        self.default_u = p.default if p is not None and p.default is not inspect.Parameter.empty else 1
        self.choice: dict[tuple, int | None] = {}  # rotary_call_key -> variant index
        self.outcomes: dict[str, str] = {}

    def _unsqueeze(self, args: tuple, kwargs: dict) -> int:
        if "unsqueeze_dim" in kwargs:
            return int(kwargs["unsqueeze_dim"])
        if "unsqueeze_dim" in self.params:
            i = self.params.index("unsqueeze_dim") - 4
            if 0 <= i < len(args):
                return int(args[i])
        return int(self.default_u)

    @trace_constant
    def _variant(self, sig: tuple, extra_args: tuple, extra_kwargs: dict) -> int | None:
        """The index in ``mapping.ROTARY_VARIANTS`` of the variant that computes what the original does
        for calls of this signature (probed at its first call, fp32 stand-ins on the reference
        backend), None if none does. A constant under torch.compile: dynamo calls it with the
        signature's values instead of tracing the probe."""
        if sig in self.choice:
            return self.choice[sig]
        u, what = sig[0], f"head {sig[2]}, table {sig[6]}"
        pq, pk, pc, ps = mapping.rotary_probe_inputs(sig)
        found, errs = None, []
        with torch.no_grad():
            try:
                want = self.original(pq, pk, pc, ps, *extra_args, **extra_kwargs)
            except Exception as exc:
                errs.append(f"original failed: {type(exc).__name__}: {exc}")
                want = None
            for i, v in enumerate(mapping.ROTARY_VARIANTS if want is not None else ()):
                try:
                    with _reference_only():
                        got = v.run(_PLAIN, pq, pk, pc, ps, u)
                except Exception as exc:
                    errs.append(f"{v.name}: {type(exc).__name__}")
                    continue
                err = _compare(tuple(want), got)
                if err <= tolerance("elementwise", torch.float32):
                    found = i
                    break
                errs.append(f"{v.name}: err {err:.2g}")
        self.choice[sig] = found
        self.outcomes[what] = mapping.ROTARY_VARIANTS[found].name if found is not None else \
            "no variant matches (" + "; ".join(errs) + ")"
        return found

    def __call__(self, q, k, cos, sin, *args, **kwargs):
        handle = next((h for h in reversed(self.handles) if h.scope.inside()), None)
        if handle is None or not all(isinstance(t, torch.Tensor) for t in (q, k, cos, sin)):
            # another model of this family, not kernelized; or a call without both q and k
            return self.original(q, k, cos, sin, *args, **kwargs)
        if q.dim() != 4 or k.dim() != 4 or q.dtype != k.dtype or (torch.compiler.is_compiling() and any(
                isinstance(a, torch.Tensor) for a in (*args, *kwargs.values()))):
            # (a tensor among the other arguments: the probe, a constant of a compiled graph, cannot take it)
            return self.original(q, k, cos, sin, *args, **kwargs)
        u = self._unsqueeze(args, kwargs)
        i = self._variant(mapping.rotary_call_key(q, k, cos, u), args, kwargs)
        if i is None:
            return self.original(q, k, cos, sin, *args, **kwargs)
        return mapping.ROTARY_VARIANTS[i].run(handle.ops, q, k, cos, sin, u)


def _rotary_signature(fn: Callable) -> str | None:
    """None when ``fn`` takes (q, k, cos, sin, ...) as its first four parameters, else why not."""
    try:
        params = list(inspect.signature(fn).parameters.values())[:4]
    except (TypeError, ValueError):
        return "its signature cannot be read"
    names = [p.name for p in params]
    positional = all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    if names != ["q", "k", "cos", "sin"] or not positional:
        return f"its parameters ({', '.join(names)}, ...) are not (q, k, cos, sin, ...)"
    return None


def _model_modules(model: nn.Module) -> list[Any]:
    names = {type(m).__module__ for m in model.modules()}
    return [sys.modules[n] for n in sorted(names) if n.startswith("transformers.models.") and n in sys.modules]


def _patch_rotary(handle: Kernelized, model: nn.Module, ops: frozenset[str] | None) -> list[_RotaryPatch]:
    out = []
    if ops is not None and "apply_rotary" not in ops:
        return out
    handle.scope.attach(handle, model)
    for mod in _model_modules(model):
        for name in mapping.ROTARY_FUNCTIONS:
            fn = mod.__dict__.get(name)
            if isinstance(fn, _RotaryPatch):  # another kernelized model of this family patched it
                patch = fn
                patch.handles.append(handle)
            elif callable(fn):
                why = _rotary_signature(fn)
                if why is not None:  # e.g. DeepSeek-V4's apply_rotary_pos_emb(x, cos, sin): one tensor
                    handle.skipped.append(Skipped("rotary", f"{mod.__name__.rsplit('.', 1)[-1]}.{name}", why))
                    continue
                patch = _RotaryPatch(handle, mod, name, fn)
                setattr(mod, name, patch)
            else:
                continue

            def undo(mod=mod, name=name, patch=patch) -> None:  # the original back with the last model
                if handle in patch.handles:
                    patch.handles.remove(handle)
                if not patch.handles and mod.__dict__.get(name) is patch:
                    setattr(mod, name, patch.original)
            handle._undo.append(undo)
            handle.patched.append(Patched("rotary", patch.where, "variant probed per shape at first call",
                                          ("apply_rotary",)))
            out.append(patch)
    return out


def _patch_loss(handle: Kernelized, model: nn.Module, ops: frozenset[str] | None) -> None:
    from transformers.loss.loss_utils import LOSS_MAPPING
    if not hasattr(type(model), "loss_function"):
        return
    if ops is not None and "cross_entropy" not in ops:
        handle.skipped.append(Skipped("causal_lm_loss", "loss_function", "not among the requested ops"))
        return
    current = model.loss_function
    if current is not LOSS_MAPPING.get("ForCausalLM"):
        handle.skipped.append(Skipped("causal_lm_loss", "loss_function",
                                      f"{getattr(current, '__name__', current)} is not ForCausalLMLoss"))
        return
    vocab = 37
    logits = torch.randn(2, 5, vocab)
    labels = torch.randint(0, vocab, (2, 5))
    labels[0, 1] = -100
    ours = mapping.causal_lm_loss(_PLAIN)
    with torch.no_grad(), _reference_only():
        for kw in ({}, {"num_items_in_batch": torch.tensor(7)}):
            err = rel_err(ours(logits, labels, vocab, **kw), current(logits, labels, vocab, **kw))
            if err > tolerance("norm", torch.float32):
                handle.skipped.append(Skipped("causal_lm_loss", "loss_function", f"probe err {err:.2g}"))
                return
    had = "_loss_function" in model.__dict__
    old = model.__dict__.get("_loss_function")
    model.loss_function = mapping.causal_lm_loss(handle.ops)
    handle._attrs.append((model, "_loss_function", had, old))

    def undo() -> None:
        if had:
            model.__dict__["_loss_function"] = old
        else:
            model.__dict__.pop("_loss_function", None)
    handle._undo.append(undo)
    handle.patched.append(Patched("causal_lm_loss", "loss_function", "ForCausalLMLoss", ("cross_entropy",)))


def _lce_forward(model: nn.Module, ops: Any, original: Callable, *, probe: bool = False) -> Callable:
    """The causal LM's forward with the LM head and the loss fused (``linear_cross_entropy``) when
    labels are given to the model in training mode: the ``[T, V]`` logits are never materialized
    and ``logits`` is None. Otherwise (generation; evaluation, whose metrics read the logits; a
    ``return_dict=False`` call, whose tuple has the logits at index 1) the original forward runs.
    ``probe``: fuse whenever labels are given (kernelize's probe, on a model that may be in eval mode)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast
    base = getattr(model, model.base_model_prefix)
    head = model.lm_head
    cap = getattr(model.config, "final_logit_softcapping", None)
    # the outputs' cache field: `cache` in newer transformers (`past_key_values` there is a deprecated
    # alias that logs a warning), `past_key_values` before
    import dataclasses
    cache_field = "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} \
        else "past_key_values"

    def forward(input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, inputs_embeds=None,
                labels=None, use_cache=None, logits_to_keep=0, **kwargs):
        if past_key_values is not None:  # (passed on only when given: newer transformers names it `cache`)
            kwargs["past_key_values"] = past_key_values
        if labels is None or not (model.training or probe) or kwargs.get("return_dict") is False:
            if labels is not None:
                kwargs["labels"] = labels
            return original(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            inputs_embeds=inputs_embeds, use_cache=use_cache, logits_to_keep=logits_to_keep, **kwargs)
        num_items = kwargs.pop("num_items_in_batch", None)
        if use_cache is None and kwargs.get("past_key_values") is None and kwargs.get("cache") is None \
                and model.training and torch.is_grad_enabled():
            # a training forward: transformers' default (config.use_cache) builds a DynamicCache and
            # copies every layer's k and v into it (two concatenations per layer, recorded by
            # autograd), for a cache nobody reads
            use_cache = False
        out = base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
        target = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].to(out.last_hidden_state.device)
        loss = ops.linear_cross_entropy(out.last_hidden_state, head.weight, target, bias=head.bias, softcap=cap,
                                        reduction="mean" if num_items is None else "sum")
        if num_items is not None:
            loss = loss / (num_items.to(loss.device) if torch.is_tensor(num_items) else num_items)
        return CausalLMOutputWithPast(loss=loss, logits=None, hidden_states=out.hidden_states,
                                      attentions=out.attentions, **{cache_field: getattr(out, cache_field, None)})
    return forward


def _patch_lce(handle: Kernelized, model: nn.Module, ops: frozenset[str] | None) -> None:
    """Training only: fuse the LM head and the loss when this build has ``linear_cross_entropy`` and
    the model's loss behaves as ``cross_entropy(softcap(lm_head(h)))`` (a probe on a short batch)."""
    import kernelset as ks
    if handle.mode is not Mode.TRAINING or not hasattr(ks, "linear_cross_entropy"):
        return
    if ops is not None and "linear_cross_entropy" not in ops:
        return
    where = type(model).__name__
    if not isinstance(getattr(model, "lm_head", None), nn.Linear) or not hasattr(model, "base_model_prefix") \
            or not hasattr(model, getattr(model, "base_model_prefix", "")):
        handle.skipped.append(Skipped("linear_cross_entropy", where, "no lm_head / base model to split at"))
        return
    original = model.forward
    ours = _lce_forward(model, _PLAIN, original, probe=True)
    vocab = model.lm_head.out_features
    dev = model.lm_head.weight.device
    ids = torch.randint(0, vocab, (2, 6), device=dev)
    labels = ids.clone()
    labels[0, 2] = -100
    try:
        with torch.no_grad(), _reference_only():
            want = original(input_ids=ids, labels=labels).loss
            got = ours(input_ids=ids, labels=labels).loss
        err = rel_err(got.float(), want.float())
    except Exception as exc:
        handle.skipped.append(Skipped("linear_cross_entropy", where, f"probe failed: {type(exc).__name__}: {exc}"))
        return
    if err > 10 * tolerance("norm", model.lm_head.weight.dtype):
        handle.skipped.append(Skipped("linear_cross_entropy", where, f"the model's loss is not cross_entropy of "
                                      f"lm_head's logits (probe err {err:.2g}; logit scaling or an auxiliary loss)"))
        return
    _set_method(handle, model, "forward", _lce_forward(model, handle.ops, original))
    handle.patched.append(Patched("linear_cross_entropy", where, "lm_head + loss fused when labels are given",
                                  ("linear_cross_entropy",)))


def _merge_projections(handle: Kernelized, model: nn.Module) -> None:
    """Inference: each module's sibling projections (``mapping.PROJECTION_GROUPS``) as one GEMM."""
    from .projections import MergedGroup, why_not
    for path, m in model.named_modules():
        for names in mapping.PROJECTION_GROUPS:
            if not all(isinstance(getattr(m, n, None), nn.Module) for n in names):
                continue
            where, what = path or "<model>", "+".join(names)
            reason = why_not(m, names)
            if reason is not None:
                handle.skipped.append(Skipped("merged_projections", where, f"{what}: {reason}"))
                continue
            group = MergedGroup([getattr(m, n) for n in names], handle.ops.counts)
            handle._undo.append(group.unmerge)
            for i, n in enumerate(names):
                _set_method(handle, getattr(m, n), "forward", group.member_forward(i))
            handle.patched.append(Patched("merged_projections", where, f"{what} -> one GEMM", ()))


def _note_unpatched(handle: Kernelized, model: nn.Module) -> None:
    """Name the compute kernelset leaves to torch, so the report says it up front."""
    from . import attention
    cfg = getattr(model, "config", None)
    if not attention.available() and attention.has_attention(model):
        impl = getattr(cfg, "_attn_implementation", "?")
        handle.left_to_torch.append(f"attention: transformers' {impl!r} implementation "
                                    "(kernelset.flash_attention is not in this build)")
    kinds = {type(m).__name__ for m in model.modules()}
    experts = sorted(k for k in kinds if k.endswith("Experts"))
    if experts:
        handle.left_to_torch.append(f"MoE routing and expert GEMMs ({', '.join(experts)}): no kernelset MoE kernels yet")
    mixers = sorted(k for k in kinds if k.endswith("Mixer"))  # transformers' name for Mamba-style layers
    if mixers:
        handle.left_to_torch.append(f"state-space mixers ({', '.join(mixers)}): no kernelset scan kernels yet")
    if cfg is not None and getattr(cfg, "kv_lora_rank", None):
        handle.left_to_torch.append("MLA projections and latent attention: no kernelset MLA prefill kernel yet "
                                    "(mla_decode is serving-layout only)")
    if handle.mode is Mode.TRAINING:
        import kernelset as ks
        if not hasattr(ks, "linear_cross_entropy"):
            handle.left_to_torch.append("lm_head + loss: logits are materialized (kernelset.linear_cross_entropy "
                                        "is not in this build)")
    handle.left_to_torch.append("linear layers (GEMMs): torch/cuBLAS")


def kernelize(model: nn.Module, *, mode: Mode | str = Mode.INFERENCE,
              ops: Iterable[str] | None = None, merge_projections: bool | None = None,
              cuda_graphs: bool = False) -> Kernelized:
    """Swap kernelset ops into ``model`` in place; returns a handle whose ``restore()`` undoes it.

    ``mode="training"`` keeps only replacements with a backward (gpt-oss's forward-only gate stays
    torch); ``ops`` limits the patch to those kernelset ops (e.g. ``{"rms_norm", "apply_rotary"}``).
    ``merge_projections`` (default: in inference mode when ``ops`` is not given) runs each module's
    q/k/v and gate/up projections as one GEMM, their weights moved into one matrix that the
    parameters view (projections.py); ``restore()`` gives them separate storage back.
    ``cuda_graphs=True`` (training mode) replays each fused decoder layer's forward and backward as
    CUDA graphs where their contract holds (graphs.py: one captured signature per layer, the
    activations kept between steps) and runs the layer eagerly elsewhere.
    Modules whose behaviour matches no rule are left alone and listed in ``handle.report()``.
    """
    require_transformers()
    mode = Mode.parse(mode, what="mode", op="kernelize")
    if not isinstance(model, nn.Module):
        raise TypeError(f"kernelize: argument 'model' must be a torch.nn.Module, got {type(model).__name__}")
    if getattr(model, "_ks_kernelized", None) is not None:
        raise RuntimeError("kernelize: this model is already kernelized; call restore() on its handle first")
    from .copies import PlainCopies, guarded
    inner = guarded(model)
    if inner is not None:  # a part of it (or a model it is part of) kernelized by another handle
        raise RuntimeError(f"kernelize: module '{inner}' of this model is already kernelized by another handle; "
                           "call restore() on that handle first")
    import kernelset as ks
    wanted = None if ops is None else frozenset(ops)
    if wanted is not None:
        unknown = sorted(o for o in wanted if not hasattr(ks, o))
        if unknown:
            raise ValueError(f"kernelize: argument 'ops' names unknown op(s) {', '.join(unknown)}")
    if merge_projections is None:
        merge_projections = mode is Mode.INFERENCE and wanted is None
    elif merge_projections not in (True, False):
        raise ValueError(f"kernelize: argument 'merge_projections' must be a bool or None, got {merge_projections!r}")
    elif merge_projections and mode is Mode.TRAINING:
        raise ValueError("kernelize: merge_projections=True is for mode='inference' (a training forward needs "
                         "each projection's own GEMM for its weight gradient)")
    if cuda_graphs not in (True, False):
        raise ValueError(f"kernelize: argument 'cuda_graphs' must be a bool, got {cuda_graphs!r}")
    if cuda_graphs and mode is not Mode.TRAINING:
        raise ValueError("kernelize: cuda_graphs=True is for mode='training' (it graphs the fused decoder layers' "
                         "training calls)")
    handle = Kernelized(model, mode)
    handle.ops.allowed = wanted
    if cuda_graphs:
        from .graphs import LayerGraphs
        handle.graphs = LayerGraphs()
    try:
        if merge_projections:
            _merge_projections(handle, model)
        _patch_modules(handle, model, wanted)
        _patch_rotary(handle, model, wanted)
        _patch_loss(handle, model, wanted)
        _patch_lce(handle, model, wanted)
        from . import attention
        attention.patch(handle, model, wanted)
        attention.patch_qkv(handle, model, wanted)
        from . import layers
        layers.patch(handle, model, wanted)
        _note_unpatched(handle, model)
    except BaseException:
        handle.restore()
        raise
    object.__setattr__(model, "_ks_kernelized", handle)
    PlainCopies(handle).install()  # a deep copy, pickle or torch.save of the model: the plain model
    handle.reset_counts()  # the probes ran patched modules on the reference backends
    return handle


def attention_available() -> bool:
    """Whether this build registers kernelset's attention (it has ``flash_attention``)."""
    from . import attention
    return attention.available()
