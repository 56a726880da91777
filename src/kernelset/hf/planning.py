"""``plan``: from a HuggingFace config.json (or a preset), every logical op a model needs, its shapes,
which implementation kernelset's dispatcher would pick on a given GPU and why, what precision
degrades there, and what kernelset does not cover yet. Needs neither a GPU nor transformers.

What the model is (each layer's mixer and feed-forward, sizes, parameters, caches) comes from
:mod:`.architecture`; this module turns it into the ops of one forward pass and the dispatcher's
choice for each on the target GPU.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..core import registry
from ..core.enums import Backend
from ..core.gpus import GPU, gpu as find_gpu
from .architecture import (ATTENTION_KINDS, CHECKED_FAMILIES, FAMILY_TRAITS, MIXER_LABELS, MIXERS, REQUIRED,
                           Facts, Part, facts, kv_bytes_per_token, load_config, parameter_breakdown,
                           parameter_count, state_bytes_per_sequence)

__all__ = ["ATTENTION_KINDS", "CHECKED_FAMILIES", "DTYPES", "FAMILY_TRAITS", "MIXERS", "REQUIRED", "Choice", "Facts",
           "ModelPlan", "OpRow", "Part", "choose", "facts", "kv_bytes_per_token", "load_config",
           "parameter_breakdown", "parameter_count", "plan", "state_bytes_per_sequence"]

DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8", "w4a16")
_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "w4a16": 0.5}
_TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# ---- what the dispatcher would pick on the target -----------------------------------------------


def _meta(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def _example(op: str, shape: dict[str, int], dt: torch.dtype) -> tuple | None:
    """Meta tensors for a call of ``op`` (None where the plan does not model the call's arguments)."""
    t, h = shape.get("tokens", 1), shape.get("hidden", 1)
    if op in ("rms_norm",):
        return _meta(t, h, dtype=dt), _meta(h, dtype=dt)
    if op == "layer_norm":
        return _meta(t, h, dtype=dt), _meta(h, dtype=dt), _meta(h, dtype=dt)
    if op in ("silu_and_mul", "gelu_and_mul", "swiglu_oai"):
        return _meta(t, 2 * shape["inter"], dtype=dt), None
    if op == "swiglu":
        return _meta(t, shape["inter"], dtype=dt), _meta(t, shape["inter"], dtype=dt)
    if op == "qkv_rope":
        d = shape["dim"]
        w = _meta((shape["heads"] + 2 * shape["kv_heads"]) * d, h, dtype=dt)
        return _meta(1, t, h, dtype=dt), w, _meta(1, t, d, dtype=dt), (shape["heads"], shape["kv_heads"], d)
    if op == "gated_mlp":
        i = shape["inter"]
        return _meta(t, h, dtype=dt), _meta(i, h, dtype=dt), _meta(i, h, dtype=dt), _meta(h, i, dtype=dt)
    if op == "apply_rotary":
        return (_meta(1, shape["heads"], t, shape["dim"], dtype=dt), _meta(1, shape["kv_heads"], t, shape["dim"], dtype=dt),
                _meta(1, t, shape["rot"], dtype=dt), _meta(1, t, shape["rot"], dtype=dt))
    if op == "embedding":
        return _meta(t, dtype=torch.int64), _meta(shape["vocab"], h, dtype=dt)
    if op == "cross_entropy":
        return _meta(t, shape["vocab"], dtype=dt), _meta(t, dtype=torch.int64)
    if op == "softmax":
        return (_meta(t, shape["vocab"], dtype=dt),)
    if op == "linear_cross_entropy":
        return _meta(t, h, dtype=dt), _meta(shape["vocab"], h, dtype=dt), _meta(t, dtype=torch.int64)
    if op == "flash_attention":
        q = _meta(1, t, shape["heads"], shape["dim"], dtype=dt)
        k = _meta(1, t, shape["kv_heads"], shape["dim"], dtype=dt)
        v = _meta(1, t, shape["kv_heads"], shape.get("v_dim", shape["dim"]), dtype=dt)
        return (q, k, v, None, None, {"causal": True, "window": shape.get("window", (-1, -1)),
                                      "softcap": shape.get("softcap", 0.0), "sinks": None, "need_lse": False,
                                      "max_seqlen_q": t, "max_seqlen_k": t})
    if op == "paged_attention":  # decode: B sequences, 16-token blocks
        b, kvh, d = shape["batch"], shape["kv_heads"], shape["dim"]
        cache = _meta(b, 16, kvh, d, dtype=dt)
        return (_meta(b, shape["heads"], d, dtype=dt), cache, cache, _meta(b, 1, dtype=torch.int32),
                _meta(b, dtype=torch.int32))
    if op == "mla_decode":  # decode: B sequences, 64-token blocks of the latent cache
        b, r, p = shape["batch"], shape["rank"], shape["rope"]
        return (_meta(b, shape["heads"], r, dtype=dt), _meta(b, shape["heads"], p, dtype=dt),
                _meta(b, 64, r + p, dtype=dt), _meta(b, 1, dtype=torch.int32), _meta(b, dtype=torch.int32))
    return None


@dataclasses.dataclass(frozen=True)
class Choice:
    impl: str  # the backend the dispatcher would pick, or "torch" when kernelset has no such op
    why: str


def choose(op: str | None, shape: dict[str, int], dt: torch.dtype, target: GPU) -> Choice:
    """The dispatcher's AUTO choice for ``op`` on ``target``: the registry's implementations in
    priority order, each checked for arch range and ``supports`` on a problem built from meta
    tensors and moved to the target arch. Backends that need a package are assumed installable
    there only for Triton (a kernelset dependency); others are named as optional."""
    if op is None:
        return Choice("torch", "kernelset has no such op yet")
    try:
        impls = registry.impls(op)
    except ValueError:
        return Choice("torch", f"{op} is not in this kernelset build")
    problem = None
    args = _example(op, shape, dt)
    if args is not None:
        try:
            kwargs = args[-1] if isinstance(args[-1], dict) else {}
            p = registry.op(op).problem(*(args[:-1] if kwargs else args), **kwargs)
            if kwargs.get("sinks") is None and "sinks" in p.attrs and shape.get("sinks"):
                p = dataclasses.replace(p, attrs={**p.attrs, "sinks": True})
            # the target's SM count and bandwidth per SM, for details that size launches (no GPU here)
            problem = dataclasses.replace(p, device=torch.device("cuda"), arch=target.arch,
                                          attrs={**p.attrs, "target_sms": target.sms,
                                                 "target_gbs_per_sm": target.bandwidth_gbs / target.sms})
        except Exception as exc:  # a problem() that cannot take meta tensors: decide on arch only
            problem = None
            note = f"supports() not evaluated ({type(exc).__name__})"
    rejected = []
    for impl in impls:
        if impl.backend is Backend.REFERENCE:
            return Choice("reference", "; ".join(rejected) or "the only implementation")
        reason = impl.arch.check(target.arch)
        if reason is None and problem is not None:
            try:
                reason = impl.supports(problem)
            except Exception as exc:
                reason = f"supports() raised {type(exc).__name__}"
        if reason is None and impl.backend is not Backend.TRITON and impl.requires:
            missing = impl.availability()
            if missing:
                reason = f"needs {', '.join(impl.requires)} installed"
        if reason is None:
            why = f"priority {impl.priority}, arch {impl.arch}"
            if impl.detail is not None and problem is not None:
                try:  # which kernel the implementation runs there (mla_decode: the sm_90 Gluon kernel)
                    why += "; " + impl.detail(problem)
                except Exception as exc:  # noqa: BLE001 - a detail is commentary; say it failed
                    why += f"; detail() raised {type(exc).__name__}"
            if problem is None:
                why += "; supports() " + ("not modelled for this op" if args is None else note)
            if rejected:
                why += "; rejected " + "; ".join(rejected)
            return Choice(str(impl.backend), why)
        rejected.append(f"{impl.backend}: {reason}")
    return Choice("none", "; ".join(rejected))


# ---- the plan ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OpRow:
    logical: str  # what the model computes
    kernelset_op: str | None  # the kernelset op that computes it (None: not covered)
    shape: str
    count: int  # calls per forward pass
    impl: str
    why: str


@dataclasses.dataclass(frozen=True)
class ModelPlan:
    model: str
    source: str
    gpu: GPU
    dtype: str
    compute_dtype: str  # activations and non-GEMM ops
    gemm_dtype: str  # what the GEMMs actually run in on this GPU
    mode: str
    tokens: int
    facts: Facts
    rows: tuple[OpRow, ...]
    degraded: tuple[str, ...]
    not_covered: tuple[str, ...]
    params: int
    weight_gb: float
    kv_bytes_per_token: float
    state_bytes_per_sequence: float = 0.0
    parts: tuple[Part, ...] = ()
    notes: tuple[str, ...] = ()  # what the plan could not model or check

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "source": self.source, "gpu": self.gpu.to_dict(), "dtype": self.dtype,
            "compute_dtype": self.compute_dtype, "gemm_dtype": self.gemm_dtype, "mode": self.mode,
            "tokens": self.tokens, "facts": dataclasses.asdict(self.facts), "params": self.params,
            "weight_gb": round(self.weight_gb, 2), "kv_bytes_per_token": self.kv_bytes_per_token,
            "fits": self.weight_gb <= self.gpu.memory_gib * 1.073741824,
            "ops": [dataclasses.asdict(r) for r in self.rows],
            "degraded": list(self.degraded), "not_covered": list(self.not_covered),
            "layers": {"mixers": self.facts.mixer_counts(), "ffn": self.facts.ffn_counts()},
            "parameters": [dataclasses.asdict(p) for p in self.parts],
            "state_bytes_per_sequence": self.state_bytes_per_sequence, "notes": list(self.notes),
        }

    def table(self) -> str:
        f, g = self.facts, self.gpu
        gqa = f"GQA {f.heads // max(f.kv_heads, 1)}" if f.kv_heads != f.heads else "MHA"
        extra = []
        if f.experts:
            extra.append(f"MoE {f.experts} experts top-{f.experts_per_tok} (expert MLP {f.moe_intermediate}"
                         + (f", shared {f.shared_intermediate}" if f.shared_intermediate else "")
                         + (f", {f.dense_layers} dense layers" if f.dense_layers else "") + ")")
        if f.mla:
            extra.append("MLA " + ", ".join(f"{k} {v}" for k, v in f.mla.items()))
        if f.sliding_window:
            extra.append(f"sliding window {f.sliding_window} on {f.sliding_layers}/{f.layers} layers")
        if f.attn_softcap or f.final_softcap:
            extra.append(f"softcap attn {f.attn_softcap} final {f.final_softcap}")
        rope = f"rope {f.rope['type']}" + (f" x{f.rope['factor']}" if f.rope.get("factor") else "") + \
            f" theta {f.rope['theta']:g}" + (f" on {f.rotary_dim}/{f.head_dim} dims" if f.rotary_dim != f.head_dim else "")
        if not f.rotary_dim:
            rope = "no rotary embedding"
        fits = "fits" if self.weight_gb <= g.memory_gib * 1.073741824 else "does NOT fit"
        attn = f"{f.heads}/{f.kv_heads} heads ({gqa}), head dim {f.head_dim}, " if f.heads else "no attention, "
        mlp = f"MLP {f.intermediate} {f.activation}, " if any(k != "none" for k in f.ffns) else "no MLP, "
        kinds = ", ".join(f"{n} {k}" for k, n in f.mixer_counts().items())
        ffns = ", ".join(f"{n} {k}" for k, n in f.ffn_counts().items())
        state = (f"; recurrent state {self.state_bytes_per_sequence / 2**20:.1f} MiB/sequence ({self.compute_dtype})"
                 if self.state_bytes_per_sequence else "")
        lines = [
            f"model {self.model} ({self.source}): {f.model_type}, {f.layers} layers, hidden {f.hidden}, "
            f"{attn}{mlp}vocab {f.vocab}" + (f", {rope}" if f.heads else "")
            + ("; " + "; ".join(extra) if extra else ""),
            f"layers: {kinds}; feed-forward: {ffns}" + "".join(
                f"; {t['name']} {t['model_type']} ({t['layers']} layers, hidden {t['hidden']})"
                for t in f.towers.values()),
            f"gpu {g.name} {g.sm} ({g.features.name}: {', '.join(g.features.flags())}), {g.memory_gib:g} GiB, "
            f"{g.bandwidth_gbs:g} GB/s, {g.sms} SMs, smem {g.features.smem_per_block_kib} KiB/block",
            f"dtype {self.dtype} (activations {self.compute_dtype}, GEMMs {self.gemm_dtype}); mode {self.mode}; "
            f"{self.tokens} tokens per forward",
            f"{self.params / 1e9:.2f}B parameters, weights {self.weight_gb:.1f} GB ({fits} in {g.memory_gib:g} GiB); "
            + (f"KV cache {self.kv_bytes_per_token / 1024:.0f} KiB/token"
             + (f" ({f.attention_layers} attention layers of {f.layers})" if f.attention_layers != f.layers else "")
             if f.attention_layers else "no KV cache (no attention layers)") + state
            + ("; the layers plan does not model are left out" if any(p.params is None for p in self.parts) else ""),
            "",
            "parameters by block:",
        ]
        for p in self.parts:
            size = "not counted" if p.params is None else (
                f"{p.params / 1e9:.3f}B" if p.params >= 1e8 else f"{p.params / 1e6:.3f}M") + (
                "" if p.exact else " (estimate)")
            lines.append(f"  {p.name:<48} {p.count:>5}  {size}")
        lines += [
            "",
            f"{'logical op':<34} {'calls':>5}  {'shape':<34} {'kernelset op':<22} {'picks':<11} why",
        ]
        for r in self.rows:
            lines.append(f"{r.logical:<34} {r.count:>5}  {r.shape:<34} {r.kernelset_op or '-':<22} {r.impl:<11} {r.why}")
        if self.degraded:
            lines += ["", "precision on this GPU:"] + [f"  {d}" for d in self.degraded]
        if self.notes:
            lines += ["", "notes:"] + [f"  {n}" for n in self.notes]
        if self.not_covered:
            lines += ["", "not covered by kernelset yet (runs in torch):"] + [f"  {n}" for n in self.not_covered]
        return "\n".join(lines)


def _precision(dtype: str, g: GPU) -> tuple[str, str, list[str]]:
    """(activation dtype, GEMM dtype, degradations) for a requested precision on a GPU."""
    feats = g.features
    notes = []
    act = "fp16" if dtype == "fp16" else "fp32" if dtype == "fp32" else "bf16"
    if act == "bf16" and not feats.bf16:
        notes.append(f"bf16: {g.sm} has no bf16 tensor cores; activations and GEMMs degrade to fp16 "
                     "(overflow risk on models trained in bf16) or to fp32 (slow)")
        act = "fp16"
    gemm = act
    if dtype == "fp8":
        if feats.fp8:
            gemm = "fp8"
        else:
            notes.append(f"fp8: {g.name} ({g.sm}) has no fp8 tensor cores (sm_89+); fp8 weights are "
                         f"dequantized and GEMMs run in {act} (2x the weight bytes of fp8)")
    elif dtype == "int8":
        gemm = "int8" if feats.int8 else act
        if not feats.int8:
            notes.append(f"int8: {g.sm} has no int8 tensor cores; GEMMs run in {act}")
    elif dtype == "w4a16":
        gemm = "w4a16"
        notes.append("w4a16: weight-only 4-bit needs a dequantizing GEMM; tensor cores run in " + act)
    return act, gemm, notes


def plan(model: str | dict, *, gpu: str | GPU = "h100", dtype: str = "bf16", mode: str = "inference",
         tokens: int = 4096, decode_batch: int = 32) -> ModelPlan:
    """The plan for a config.json / model directory / preset (``model``) on ``gpu``."""
    cfg, source = load_config(model)
    name = model if isinstance(model, str) else cfg.get("_name_or_path", "config")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if mode not in ("inference", "training"):
        raise ValueError(f"mode must be 'inference' or 'training', got {mode!r}")
    for arg, v in (("tokens", tokens), ("decode_batch", decode_batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{arg} must be a positive integer, got {v!r}")
    g = gpu if isinstance(gpu, GPU) else find_gpu(gpu)
    try:
        f = facts(cfg)
    except ValueError as exc:
        raise ValueError(f"--model {name!r}: {exc}") from None
    except (KeyError, TypeError) as exc:  # a field of a layout plan does not read (Gemma 3n's per-layer widths)
        raise ValueError(f"--model {name!r}: plan cannot read this {cfg.get('model_type')!r} config "
                         f"({type(exc).__name__}: {exc})") from None
    act, gemm, degraded = _precision(dtype, g)
    dt = _TORCH[act]
    T, L, H = tokens, f.layers, f.hidden
    rows: list[OpRow] = []
    not_covered: list[str] = []

    def row(logical: str, op: str | None, shape_text: str, count: int, shape: dict[str, int] | None = None,
            note: str = "", why: str | None = None) -> None:
        c = choose(op, shape or {}, dt, g) if why is None else Choice("torch", why)
        why = c.why + (f"; {note}" if note else "")
        rows.append(OpRow(logical, op if c.impl != "torch" or op is None else None, shape_text, count, c.impl, why))
        if c.impl == "torch":
            not_covered.append(f"{logical}: {c.why}" + (f" ({note})" if note else ""))

    norm_op = f.norm
    norm_shape = {"tokens": T, "hidden": H}
    for t in f.towers.values():
        row(f"{t['name']} ({t['model_type']})", None, f"{t['layers']} layers, hidden {t['hidden']}", 1,
            why=f"kernelset does not cover {t['name']}s yet: the encoder runs in torch")
        if t["projector_params"]:
            row(f"{t['name']} projector", None, f"[{t['hidden']}] -> [{H}]", 1, note=f"GEMM in {gemm}")
    emb_note = "times sqrt(hidden) (embed_scale)" if f.traits.get("embed_scale") else ""
    row("token embedding", "embedding", f"ids [{T}] -> [{T}, {H}]", 1, {"tokens": T, "hidden": H, "vocab": f.vocab},
        emb_note)
    per_layer = int(f.traits.get("norms_per_layer", 4 if f.traits.get("sandwich_norms") else 2))
    norm_desc = f"{norm_op}" + (" (1 + w)" if f.norm_offset else "") + (
        ", rounded after the weight" if f.traits.get("norm_cast") == "gemma" else "")
    layer_fused = (mode == "training" and norm_op == "rms_norm" and not f.norm_offset and per_layer == 2
                   and f.traits.get("norm_cast") != "gemma" and not f.mla and not f.qk_norm and not f.sliding_window
                   and not f.attn_softcap and not f.sinks and f.rotary_dim == f.head_dim and not f.moe_layers
                   and f.activation in ("silu", "gelu_tanh", "gelu") and not f.traits.get("fused_gate_up")
                   and not f.hybrid and _has("qkv_rope") and _has("gated_mlp"))
    row(f"decoder norms ({norm_desc})", norm_op, f"[{T}, {H}]", per_layer * L + 1, norm_shape,
        "kernelize's training calls run each layer's two inside qkv_rope and gated_mlp (norm_weight)" if layer_fused
        else "fused_add_rms_norm fuses the residual add where the engine owns the layer loop")
    attn_layers = f.attention_layers  # layers with attention (a hybrid's others are SSM / linear)
    if f.mla and attn_layers:
        m = f.mla
        qk = m["qk_nope_head_dim"] + m["qk_rope_head_dim"]
        row("MLA latent norms", "rms_norm", f"[{T}, {m['kv_lora_rank']}], [{T}, {m['q_lora_rank']}]",
            attn_layers * (2 if m["q_lora_rank"] else 1), {"tokens": T, "hidden": m["kv_lora_rank"]})
        row("MLA projections (q_a/q_b/kv_a/kv_b/o)", None, f"ranks q {m['q_lora_rank']} kv {m['kv_lora_rank']}",
            5 * attn_layers, note=f"GEMMs in {gemm}")
        interleaved = bool(cfg.get("rope_interleave", f.traits.get("rope_interleave_default", False)))
        row("rope on the rope part" + (" (interleaved pairs)" if interleaved else ""), "apply_rotary",
            f"q [{T}, {f.heads}, {m['qk_rope_head_dim']}], k [{T}, 1, {m['qk_rope_head_dim']}]", attn_layers,
            {"tokens": T, "heads": f.heads, "kv_heads": 1, "dim": m["qk_rope_head_dim"], "rot": m["qk_rope_head_dim"]})
        row("MLA prefill attention", "flash_attention" if _has("flash_attention") else None,
            f"q/k dim {qk}, v dim {m['v_head_dim']}, {f.heads} heads", attn_layers,
            {"tokens": T, "heads": f.heads, "kv_heads": f.heads, "dim": qk, "v_dim": m["v_head_dim"]},
            note="qk 192 / v 128 through flash_attention's Dv" if qk == 192 else "")
        row("MLA decode over the latent cache", "mla_decode" if _has("mla_decode") else None,
            f"[B={decode_batch}] latent {m['kv_lora_rank']}+{m['qk_rope_head_dim']}", attn_layers,
            {"batch": decode_batch, "heads": f.heads, "rank": m["kv_lora_rank"], "rope": m["qk_rope_head_dim"]})
    elif attn_layers:
        qkv = (f.heads + 2 * f.kv_heads) * f.head_dim
        # training: kernelize runs the projections and the rotation of LLaMA-style attention (full
        # rotary, no q/k norm, window, softcap or sinks) as one autograd node
        fused_qkv = (mode == "training" and _has("qkv_rope") and not f.qk_norm and not f.sliding_window
                     and not f.attn_softcap and not f.sinks and f.rotary_dim == f.head_dim
                     and not f.traits.get("attn_output_gate"))
        if fused_qkv:
            row("QKV projection + rotary embedding", "qkv_rope", f"[{T}, {H}] x [{H}, {qkv}]", attn_layers,
                {"tokens": T, "hidden": H, "heads": f.heads, "kv_heads": f.kv_heads, "dim": f.head_dim},
                f"one autograd node (kernelize's training calls); GEMM cuBLAS in {gemm}; "
                f"{f.rope['type']} tables from the model's rotary module")
        else:
            if f.traits.get("attn_output_gate"):
                qkv += f.heads * f.head_dim
            row("QKV projection" + (" + output gate" if f.traits.get("attn_output_gate") else ""), None,
                f"[{T}, {H}] x [{H}, {qkv}]", attn_layers,
                note=f"GEMM in {gemm}" + (", with bias" if f.traits.get("attention_bias") else "")
                + "; kernelize merges q/k/v into one GEMM for inference")
        if f.qk_norm == "head":
            row("per-head q/k RMSNorm" + (" (1 + w)" if f.norm_offset else ""), "rms_norm",
                f"[{T}, {f.heads}+{f.kv_heads}, {f.head_dim}]", 2 * attn_layers,
                {"tokens": T * f.heads, "hidden": f.head_dim},
                "qk_norm_rope fuses it with RoPE in serving layout")
        elif f.qk_norm == "full":
            row("q/k RMSNorm over all heads", "rms_norm", f"[{T}, {f.heads * f.head_dim}]", 2 * attn_layers,
                {"tokens": T, "hidden": f.heads * f.head_dim})
        rope_note = f"{f.rope['type']} tables from rope_cache"
        if not fused_qkv and f.rotary_dim:
            row(f"rotary embedding ({f.rotary_dim}/{f.head_dim} dims)", "apply_rotary",
                f"q [{T}, {f.heads}, {f.head_dim}], k [{T}, {f.kv_heads}, {f.head_dim}]", attn_layers,
                {"tokens": T, "heads": f.heads, "kv_heads": f.kv_heads, "dim": f.head_dim, "rot": f.rotary_dim},
                rope_note)
        opts = [o for o, on in (("causal", True), (f"window {f.sliding_window} on {f.sliding_layers} layers",
                                                     bool(f.sliding_window)),
                                (f"softcap {f.attn_softcap}", bool(f.attn_softcap)), ("sinks", f.sinks)) if on]
        row("attention prefill", "flash_attention" if _has("flash_attention") else None,
            f"{f.heads}/{f.kv_heads} heads, D {f.head_dim}, S {T}", attn_layers,
            {"tokens": T, "heads": f.heads, "kv_heads": f.kv_heads, "dim": f.head_dim,
             "window": (f.sliding_window - 1, 0) if f.sliding_window else (-1, -1),
             "softcap": float(f.attn_softcap or 0.0), "sinks": f.sinks},
            ", ".join(opts) + "; AUTO also consults the measured attention table on the device")
        row("KV cache write (paged)", "reshape_and_cache" if _has("reshape_and_cache") else None,
            f"[{decode_batch}, {f.kv_heads}, {f.head_dim}]", attn_layers)
        row("attention decode (paged KV)", "paged_attention" if _has("paged_attention") else None,
            f"B {decode_batch}, {f.heads}/{f.kv_heads} heads, D {f.head_dim}", attn_layers,
            {"batch": decode_batch, "heads": f.heads, "kv_heads": f.kv_heads, "dim": f.head_dim},
            note=", ".join(opts[1:]))
        row("output projection", None, f"[{T}, {f.heads * f.head_dim}] x [{f.heads * f.head_dim}, {H}]", attn_layers,
            note=f"GEMM in {gemm}")
    for kind, n in f.mixer_counts().items():
        for sub in kind.split("+"):
            if sub not in ATTENTION_KINDS and sub != "none":
                _mixer_rows(row, sub, f, n, T, gemm)
    dense_layers = f.ffn_counts().get("dense", 0)
    act_op = {"silu": "swiglu", "gelu_tanh": "gelu_and_mul", "gelu": "gelu_and_mul", "swiglu_oai": "swiglu_oai"}.get(
        f.activation)
    if f.traits.get("fused_gate_up") and f.activation == "silu":
        act_op = "silu_and_mul"
    fused_mlp = (mode == "training" and not f.traits.get("fused_gate_up")
                 and f.activation in ("silu", "gelu_tanh", "gelu") and _has("gated_mlp"))
    if dense_layers and fused_mlp:
        row(f"MLP gate/up/down + {f.activation}", "gated_mlp", f"[{T}, {H}] x [{H}, {f.intermediate}]",
            dense_layers, {"tokens": T, "hidden": H, "inter": f.intermediate},
            f"one autograd node (kernelize's training calls); GEMMs cuBLAS in {gemm}")
    elif dense_layers and not f.traits.get("gated_mlp", True):
        row("MLP up + down projections", None, f"[{T}, {H}] x [{H}, {f.intermediate}]", 2 * dense_layers,
            note=f"GEMMs in {gemm}")
        row(f"activation ({f.activation})", act_op, f"[{T}, {f.intermediate}]", dense_layers,
            {"tokens": T, "inter": f.intermediate})
    elif dense_layers:
        row("MLP gate/up + down projections", None, f"[{T}, {H}] x [{H}, 2x{f.intermediate}]", 2 * dense_layers,
            note=f"GEMMs in {gemm}" + ("" if f.traits.get("fused_gate_up")
                                       else "; kernelize merges gate/up into one GEMM for inference"))
        row(f"gated activation ({f.activation})", act_op, f"[{T}, {f.intermediate}]", dense_layers,
            {"tokens": T, "inter": f.intermediate})
    if f.moe_layers:
        row("MoE router (logits, softmax, top-k)", None, f"[{T}, {H}] x [{H}, {f.experts}], top-{f.experts_per_tok}",
            f.moe_layers, note="softmax exists; routing and top-k are not fused")
        row("MoE expert GEMMs (grouped)", None, f"{f.experts} x [{H}, 2x{f.moe_intermediate}]", 2 * f.moe_layers,
            note=f"grouped GEMM in {gemm}")
        moe_act = "swiglu_oai" if f.activation == "swiglu_oai" else "silu_and_mul" if f.activation == "silu" \
            else "gelu_and_mul"
        row(f"expert gated activation ({f.activation})", moe_act,
            f"[{T * f.experts_per_tok}, {f.moe_intermediate}]", f.moe_layers,
            {"tokens": T * f.experts_per_tok, "inter": f.moe_intermediate},
            "forward only: training keeps torch" if moe_act == "swiglu_oai" and mode == "training" else "")
        if f.shared_intermediate:
            row("shared expert activation", act_op, f"[{T}, {f.shared_intermediate}]", f.moe_layers,
                {"tokens": T, "inter": f.shared_intermediate})
    row("LM head", None, f"[{T}, {H}] x [{H}, {f.vocab}]", 1,
        note=f"GEMM in {gemm}" + (f"; final softcap {f.final_softcap}" if f.final_softcap else ""))
    if mode == "training":
        if _has("linear_cross_entropy"):
            row("LM head + loss, logits never stored", "linear_cross_entropy", f"[{T}, {H}] x [{H}, {f.vocab}]", 1,
                {"tokens": T, "hidden": H, "vocab": f.vocab}, "softcap fused" if f.final_softcap else "")
        else:
            row("causal-LM loss", "cross_entropy", f"[{T}, {f.vocab}]", 1, {"tokens": T, "vocab": f.vocab})
        row("optimizer (AdamW, fp32 states)", "adamw", f"{parameter_count(f) / 1e9:.2f}B params", 1)
        row("gradient clipping", "clip_grad_norm", "global 2-norm", 1)
    else:
        row("sampling softmax", "softmax", f"[{decode_batch}, {f.vocab}]", 1, {"tokens": decode_batch, "vocab": f.vocab})
    params = parameter_count(f)
    weight_gb = params * _BYTES[dtype if dtype in _BYTES else "bf16"] / 1e9
    if dtype == "fp8" and gemm != "fp8":
        weight_gb = params * 2 / 1e9
    if mode == "training":
        weight_gb = params * (2 + 2 + 12) / 1e9  # bf16 weights + grads, fp32 master + two moments
        degraded.append("training memory counts bf16 weights and gradients plus fp32 master weights and AdamW "
                        "moments (16 bytes/parameter), activations excluded")
    kv = kv_bytes_per_token(f, 1 if dtype == "fp8" and g.features.fp8 else 2)
    parts = parameter_breakdown(f)
    notes = []
    if f.model_type not in CHECKED_FAMILIES:
        notes.append(f"parameters: plan's count is checked against transformers for {len(CHECKED_FAMILIES)} "
                        f"families, not for {f.model_type!r}: it may miss what this family adds")
    for p in parts:
        if p.params is None:
            why = "plan cannot size it from the config" if "tower" in p.name else "plan does not model this mixer"
            notes.append(f"parameters: {p.name} ({p.count}) not counted ({why}): the total and the memory are low")
        elif not p.exact:
            notes.append(f"parameters: the {p.name} is an estimate (counted as a plain ViT)")
    return ModelPlan(model=name, source=source, gpu=g, dtype=dtype, compute_dtype=act, gemm_dtype=gemm, mode=mode,
                     tokens=tokens, facts=f, rows=tuple(rows), degraded=tuple(degraded),
                     not_covered=tuple(not_covered), params=params, weight_gb=weight_gb, kv_bytes_per_token=kv,
                     state_bytes_per_sequence=state_bytes_per_sequence(f, 4 if act == "fp32" else 2), parts=parts,
                     notes=tuple(notes))


_MIXER_GEMMS = {"mamba": ("in/x/dt/out", 4), "mamba2": ("in/out", 2), "gated_deltanet": ("in/out", 3),
                "short_conv": ("in/out", 2)}


def _mixer_rows(row: Any, kind: str, f: Facts, n: int, T: int, gemm: str) -> None:
    """The rows of ``n`` layers of a non-attention mixer: its projections (GEMMs) and the recurrence
    kernelset has no kernel for."""
    s = f.ssm.get(kind)
    if s is None:
        row(f"{kind} mixer", None, "-", n, why="plan does not model this mixer and kernelset has no kernel for it")
        return
    label = MIXER_LABELS[kind]
    if kind == "mamba":
        shape = f"inner {s['inner']}, state {s['state']}, dt rank {s['dt_rank']}, conv {s['conv']}"
    elif kind == "mamba2":
        shape = f"{s['heads']} heads x {s['head_dim']}, state {s['state']}, {s['groups']} groups, conv {s['conv']}"
    elif kind == "gated_deltanet":
        shape = f"{s['k_heads']}/{s['v_heads']} heads, k {s['k_dim']} v {s['v_dim']}, conv {s['conv']}"
    else:
        shape = f"[{T}, {f.hidden}], kernel {s['conv']}"
    names, per_layer = _MIXER_GEMMS[kind]
    if kind == "mamba":
        width = 2 * s["inner"]
    elif kind == "mamba2":
        width = 2 * s["inner"] + 2 * s["groups"] * s["state"] + s["heads"]
    elif kind == "gated_deltanet":
        width = 2 * s["k_heads"] * s["k_dim"] + 2 * s["v_heads"] * s["v_dim"] + 2 * s["v_heads"]
    else:
        width = 3 * f.hidden
    row(f"{label} {names} projections", None, f"in [{T}, {f.hidden}] x [{f.hidden}, {width}]", per_layer * n,
        note=f"GEMMs in {gemm}")
    what = {"mamba": "selective-scan (SSM)", "mamba2": "SSM (SSD) scan", "gated_deltanet": "linear-attention",
            "short_conv": "short-convolution"}[kind]
    row(MIXERS[kind], None, shape, n, why=f"kernelset has no {what} kernel yet ({n} of {f.layers} layers)")


def _has(op: str) -> bool:
    try:
        registry.op(op)
        return True
    except ValueError:
        return False
