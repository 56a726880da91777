"""What a HuggingFace config.json (or a preset) says a model is, for ``plan``: every layer's token
mixer (attention, Mamba / Mamba-2 state-space, gated DeltaNet linear attention, short convolution)
and feed-forward (dense, MoE, none), their sizes, a multimodal model's towers, the parameters by
kind of block, the KV cache of the attention layers and the fixed state of the others. Needs
neither a GPU nor transformers (transformers, where installed, fills in what a config leaves out).

The only per-family data is :data:`FAMILY_TRAITS` (facts of an architecture that config.json does
not state: Gemma's ``1 + w`` norms, Qwen3's q/k norms, the same facts ``kernelize`` discovers by
probing the modules) and the field names each family gives its layer layout and mixer sizes
(:func:`_layout`, :func:`_mixer_sizes`), read as transformers reads them. The parameter count of
every family in :data:`CHECKED_FAMILIES` equals the model transformers builds (tests/test_plan_layers.py).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

from .presets import PRESETS, preset

# Architecture facts config.json leaves implicit (kernelize finds the same by probing modules).
# attention_bias: q/k/v projections have biases whatever the config says; o_bias: so does o_proj;
# attn_output_gate: q_proj also produces a sigmoid gate for the attention output (2x its width);
# shared_expert_gate: a [1, hidden] gate scales the shared expert; router_bias / expert_bias: the
# router and the experts' GEMMs have biases; norms_per_layer: RMSNorms per decoder layer (2 unless
# stated); gated_mlp False: up/down only (no gate); no_rope: attention without rotary embedding.
FAMILY_TRAITS: dict[str, dict[str, Any]] = {
    "gemma": {"norm_offset": 1.0, "norm_cast": "gemma", "embed_scale": True},
    "gemma2": {"norm_offset": 1.0, "norm_cast": "gemma", "embed_scale": True, "sandwich_norms": True},
    "gemma3_text": {"norm_offset": 1.0, "norm_cast": "gemma", "embed_scale": True, "sandwich_norms": True,
                    "qk_norm": "head"},
    "qwen3": {"qk_norm": "head"},
    "qwen3_moe": {"qk_norm": "head"},
    "olmo2": {"qk_norm": "full", "norm_cast": "gemma", "post_norms_only": True},
    "gpt_oss": {"norm_cast": "gemma", "attention_sinks": True, "expert_gate": "swiglu_oai", "attention_bias": True,
                "o_bias": True, "router_bias": True, "expert_bias": True},
    "phi3": {"fused_gate_up": True},
    "qwen2": {"attention_bias": True},
    "qwen2_moe": {"attention_bias": True, "shared_expert_gate": True},
    "deepseek_v3": {"rope_interleave_default": True},
    "deepseek_v2": {"rope_interleave_default": True},
    "qwen3_next": {"norm_offset": 1.0, "qk_norm": "head", "attn_output_gate": True, "shared_expert_gate": True},
    "qwen3_5_text": {"norm_offset": 1.0, "qk_norm": "head", "attn_output_gate": True},
    "qwen3_5_moe_text": {"norm_offset": 1.0, "qk_norm": "head", "attn_output_gate": True,
                         "shared_expert_gate": True},
    "lfm2": {"qk_norm": "head"},
    "jamba": {"no_rope": True},
    "mamba": {"norms_per_layer": 1},
    "falcon_mamba": {"norms_per_layer": 1},
    "mamba2": {"norms_per_layer": 1},
    "nemotron_h": {"norms_per_layer": 1, "gated_mlp": False, "no_rope": True},
}

# The token mixers a layer can have besides attention, and the work in each that kernelset has no
# kernel for yet (the plan's "not covered" lines).
ATTENTION_KINDS = ("full_attention", "sliding_attention", "chunked_attention")
MIXERS: dict[str, str] = {
    "mamba": "Mamba selective scan + conv1d",
    "mamba2": "Mamba-2 SSD scan + conv1d + norm",
    "gated_deltanet": "gated DeltaNet + conv1d + norm",
    "short_conv": "gated short convolution",
}
MIXER_LABELS = {"mamba": "Mamba", "mamba2": "Mamba-2", "gated_deltanet": "gated DeltaNet", "short_conv": "short conv"}
# transformers calls every non-attention mixer "linear_attention" in layer_types; which one a family has
_LINEAR_KIND = {"jamba": "mamba", "mamba": "mamba", "falcon_mamba": "mamba", "mamba2": "mamba2", "bamba": "mamba2",
                "falcon_h1": "mamba2", "granitemoehybrid": "mamba2", "nemotron_h": "mamba2",
                "qwen3_next": "gated_deltanet", "qwen3_5_text": "gated_deltanet", "qwen3_5_moe_text": "gated_deltanet",
                "lfm2": "short_conv", "lfm2_moe": "short_conv"}
# the families whose parameter count tests/test_plan_layers.py checks against the model transformers builds
CHECKED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "gemma3", "phi3", "olmo2",
                    "granite", "mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "deepseek_v3", "qwen3_next",
                    "qwen3_5_text", "qwen3_5_moe_text", "jamba", "mamba", "falcon_mamba", "mamba2", "bamba",
                    "falcon_h1", "granitemoehybrid", "nemotron_h", "lfm2")
_NO_ATTENTION = ("mamba", "falcon_mamba", "mamba2")  # families without attention layers (no heads to read)
# the fields each family's layer layout and mixer sizes are read from (filled in from transformers'
# config class when a config.json leaves them out)
_FAMILY_FIELDS: dict[str, tuple[str, ...]] = {
    "mamba": ("state_size", "expand", "conv_kernel"),
    "falcon_mamba": ("state_size", "expand", "conv_kernel"),
    "mamba2": ("state_size", "expand", "conv_kernel", "num_heads", "head_dim", "n_groups"),
    "jamba": ("attn_layer_period", "attn_layer_offset", "mamba_d_state", "mamba_d_conv", "mamba_expand"),
    "bamba": ("mamba_n_heads", "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_n_groups"),
    "granitemoehybrid": ("mamba_n_heads", "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_n_groups",
                         "shared_intermediate_size"),
    "falcon_h1": ("mamba_n_heads", "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_n_groups"),
    "nemotron_h": ("ssm_state_size", "mamba_num_heads", "mamba_head_dim", "n_groups", "conv_kernel"),
    "qwen3_next": ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                   "linear_value_head_dim", "linear_conv_kernel_dim"),
    "lfm2": ("conv_L_cache",),
    "lfm2_moe": ("conv_L_cache",),
}
for _mt in ("qwen3_5_text", "qwen3_5_moe_text"):
    _FAMILY_FIELDS[_mt] = _FAMILY_FIELDS["qwen3_next"]
_TOWER_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "patch_size", "image_size")


def load_config(spec: str | dict) -> tuple[dict[str, Any], str]:
    """(config dict, where it came from) from a preset name, a config.json path or a model directory.
    A multimodal config's ``text_config`` is used for the language model; its other towers
    (``vision_config``, ...) are kept under ``_towers`` for the parameter count and the plan's
    "not covered" lines."""
    if isinstance(spec, dict):
        cfg, source = dict(spec), "config dict"
    elif spec.strip().lower() in PRESETS:
        cfg, source = preset(spec), f"preset {spec.strip().lower()}"
    else:
        path = os.path.join(spec, "config.json") if os.path.isdir(spec) else spec
        if not os.path.isfile(path):
            raise ValueError(f"--model {spec!r} is neither a preset ({len(PRESETS)}: see 'ksctl plan --list') "
                             "nor a config.json / model directory")
        try:
            with open(path) as f:
                cfg, source = json.load(f), path
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"--model {spec!r}: {path} is not a readable JSON config ({exc})") from None
        if not isinstance(cfg, dict):
            raise ValueError(f"--model {spec!r}: {path} holds a JSON {type(cfg).__name__}, not a config object")
    cfg = _untag(cfg)
    what = spec if isinstance(spec, str) else source
    if isinstance(cfg.get("text_config"), dict):
        parent = cfg
        text = dict(parent["text_config"])
        text.setdefault("model_type", parent.get("model_type", "?") + "_text")
        towers = {k: _with_defaults(dict(v), f"{what}: {k}", _TOWER_FIELDS, lenient=True) for k, v in parent.items()
                  if k.endswith("_config") and k != "text_config" and isinstance(v, dict)}
        cfg = _with_defaults(text, what)
        cfg["_towers"] = towers
        cfg["_parent"] = {k: v for k, v in parent.items() if not isinstance(v, dict)}
        return cfg, source
    return _with_defaults(cfg, what), source


def _untag(value: Any) -> Any:
    """``value`` with transformers' JSON tags for floats JSON cannot hold (``{"__float__": "Infinity"}``,
    written by ``save_pretrained`` for Mamba-2's ``time_step_limit``) read back as floats."""
    if isinstance(value, dict):
        if set(value) == {"__float__"} and value["__float__"] in ("Infinity", "-Infinity", "NaN"):
            return float(value["__float__"])
        return {k: _untag(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_untag(v) for v in value]
    return value


# the fields ``facts`` cannot do without (with the family's own, :data:`_FAMILY_FIELDS`); a
# config.json may leave them out where they equal the defaults of the model's transformers config
# class (Gemma 3's ``text_config`` states only what differs from the 4B model: no heads, head_dim or
# vocab_size)
REQUIRED = ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size")


def _required(cfg: dict[str, Any]) -> tuple[str, ...]:
    mt = cfg.get("model_type")
    base = tuple(k for k in REQUIRED if not (k == "num_attention_heads" and mt in _NO_ATTENTION))
    if mt == "nemotron_h" and (cfg.get("layers_block_type") or cfg.get("hybrid_override_pattern")):
        base = tuple(k for k in base if k != "num_hidden_layers")  # the length of its layer list
    return base + _FAMILY_FIELDS.get(mt, ())


def _with_defaults(cfg: dict[str, Any], what: str, required: tuple[str, ...] | None = None, *,
                   lenient: bool = False) -> dict[str, Any]:
    """``cfg`` as transformers reads it when a required field is missing: the values of its config
    class (built from ``cfg``, so derived fields such as ``layer_types`` follow the stated layer
    count) under the stated ones. Where transformers refuses to build the class from ``cfg`` (its
    validation), the class's declared defaults are read without building it: plan reads a config
    as saved, it does not validate it. Without transformers, or for an unknown model_type, a
    ValueError names the missing fields (``lenient``: ``cfg`` is returned with what could be filled).
    The filled-in fields are listed under ``_defaulted``."""
    required = _required(cfg) if required is None else required
    missing = [k for k in required if cfg.get(k) is None]
    if not missing:
        return cfg
    mt = cfg.get("model_type")
    why = "transformers is not installed"
    full = None
    try:
        from transformers import CONFIG_MAPPING, AutoConfig
    except ImportError:
        CONFIG_MAPPING = None
    if CONFIG_MAPPING is not None and mt not in CONFIG_MAPPING:
        why = f"transformers has no model_type {mt!r}"
    elif CONFIG_MAPPING is not None:
        values = {k: v for k, v in cfg.items() if k != "model_type" and not k.startswith("_")}
        try:
            obj = AutoConfig.for_model(mt, **values)
            # (and the class's own names for them: GPT-2's n_embd is read as hidden_size)
            full = {**obj.to_dict(), **{k: getattr(obj, k, None) for k in missing}}
        except Exception:  # noqa: BLE001 - values its validation rejects: read the declared defaults
            full = _declared_defaults(CONFIG_MAPPING[mt])
    if full is not None:
        filled = {**full, **{k: v for k, v in cfg.items() if v is not None or k not in full}}
        filled["_defaulted"] = [k for k in full if cfg.get(k) is None and full[k] is not None]
        if lenient or all(filled.get(k) is not None for k in required):
            return filled
        why = f"transformers' {mt!r} config class has no default for them either"
    if lenient:
        return cfg
    raise ValueError(f"--model {what!r}: the config has no {', '.join(missing)} and they cannot be filled in "
                     f"from its model_type's defaults ({why})" + (
                         "; plan reads attention, Mamba, Mamba-2, gated DeltaNet and short-convolution layers and "
                         f"finds no attention heads in this {mt} config" if "num_attention_heads" in missing else ""))


def _declared_defaults(cls: type) -> dict[str, Any]:
    """The defaults a transformers config class declares, read without constructing it (so without
    its validation)."""
    out = {}
    if dataclasses.is_dataclass(cls):
        for fld in dataclasses.fields(cls):
            if fld.default is not dataclasses.MISSING:
                out[fld.name] = fld.default
            elif fld.default_factory is not dataclasses.MISSING:
                out[fld.name] = fld.default_factory()
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


def _rope(cfg: dict) -> dict[str, Any]:
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        params = params.get("full_attention") or next(iter(params.values()))  # per layer type (Gemma 3)
    kind = scaling.get("rope_type") or scaling.get("type") or params.get("rope_type") or "default"
    theta = cfg.get("rope_theta") or params.get("rope_theta") or 10000.0
    factor = scaling.get("factor") or params.get("factor")
    return {"type": kind, "theta": theta, "factor": factor}


@dataclasses.dataclass(frozen=True)
class Facts:
    """The shapes and features of a model, as the config states them. ``mixers`` and ``ffns`` say
    what each layer is; ``heads``/``kv_heads``/``head_dim`` describe its attention layers (0 when it
    has none), ``ssm`` the sizes of its other mixers, ``towers`` the encoders of a multimodal model."""

    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    activation: str  # silu | gelu_tanh | gelu | swiglu_oai | relu2
    norm: str  # rms_norm | layer_norm
    norm_offset: float
    qk_norm: str | None  # head | full | None
    rope: dict[str, Any]
    rotary_dim: int
    sliding_window: int | None
    sliding_layers: int
    attn_softcap: float | None
    final_softcap: float | None
    tie_embeddings: bool
    experts: int
    experts_per_tok: int
    moe_intermediate: int
    shared_intermediate: int
    dense_layers: int
    mla: dict[str, int] | None
    sinks: bool
    traits: dict[str, Any]
    # per layer: its token mixer, one of ATTENTION_KINDS, MIXERS' keys, "full_attention+mamba2" (both
    # in parallel: Falcon-H1), "none" (an FFN-only layer), or a kind plan does not model, as the
    # config names it; and its feed-forward: "dense", "moe" or "none"
    mixers: tuple[str, ...] = ()
    ffns: tuple[str, ...] = ()
    ssm: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    towers: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    moe_latent: int = 0  # the width experts work in where it is not the hidden size

    @property
    def moe_layers(self) -> int:
        return sum(k == "moe" for k in self.ffns) if self.ffns else (self.layers - self.dense_layers if self.experts
                                                                     else 0)

    @property
    def attention_layers(self) -> int:
        return sum(any(a in k for a in ATTENTION_KINDS) for k in self.mixers) if self.mixers else self.layers

    @property
    def hybrid(self) -> bool:
        """Whether any layer is other than attention followed by an MLP."""
        return self.attention_layers != self.layers or any(k == "none" for k in self.ffns) or any(
            "+" in k for k in self.mixers)

    def mixer_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for k in self.mixers:
            out[k] = out.get(k, 0) + 1
        return out

    def ffn_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for k in self.ffns:
            out[k] = out.get(k, 0) + 1
        return out


def _num(cfg: dict, key: str, default: Any = None) -> Any:
    """A config value, ``default`` where it is absent or null."""
    v = cfg.get(key)
    return default if v is None else v


def _layout(cfg: dict, mt: str, L: int, experts: int, window: int | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(token mixer, feed-forward) of every layer, from the fields the family states them in."""
    linear = _LINEAR_KIND.get(mt, "linear_attention")
    names = {"attention": "full_attention"}  # (legacy name)
    if mt in _LINEAR_KIND:  # else a non-attention layer keeps the config's name: a kind plan does not size
        names.update(linear_attention=linear, mamba=linear, conv=linear, hybrid="full_attention+" + linear)
    mixers: list[str]
    ffns: list[str] | None = None
    if mt in _NO_ATTENTION:
        mixers, ffns = [linear] * L, ["none"] * L
    elif mt == "falcon_h1":  # attention and a Mamba-2 mixer side by side in every layer
        mixers = ["full_attention+mamba2"] * L
    elif mt == "jamba":
        period, offset = int(cfg["attn_layer_period"]), int(cfg["attn_layer_offset"])
        mixers = ["full_attention" if i % period == offset else "mamba" for i in range(L)]
        if experts > 1:
            ep, eo = int(_num(cfg, "expert_layer_period", 2)), int(_num(cfg, "expert_layer_offset", 1))
            ffns = ["moe" if i % ep == eo else "dense" for i in range(L)]
        else:
            ffns = ["dense"] * L
    elif mt == "bamba":
        idx = set(cfg.get("attn_layer_indices") or ())
        mixers = ["full_attention" if i in idx else "mamba2" for i in range(L)]
    elif mt == "nemotron_h":  # one block per layer: a mixer or an FFN
        pattern = cfg.get("layers_block_type") or cfg.get("layer_types")
        if not pattern and cfg.get("hybrid_override_pattern"):
            pattern = [{"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}[c]
                       for c in cfg["hybrid_override_pattern"]]
        pattern = [{"mamba": "linear_attention", "attention": "full_attention"}.get(t, t) for t in pattern or ()]
        mixers = [names.get(t, t) if t not in ("moe", "mlp") else "none" for t in pattern]
        ffns = ["moe" if t == "moe" else "dense" if t == "mlp" else "none" for t in pattern]
    elif mt in ("zamba", "zamba2"):  # Mamba layers, some also running a transformer block shared by all
        kinds = cfg.get("layers_block_type") or cfg.get("layer_types") or ()
        mixers = [f"shared_transformer+{mt}_mamba" if t == "hybrid" else f"{mt}_mamba" for t in kinds]
        ffns = ["none"] * len(mixers)  # (the MLP is the shared block's)
    elif cfg.get("layer_types"):
        mixers = [names.get(t, t) for t in cfg["layer_types"]]
    elif cfg.get("block_types"):  # RecurrentGemma: its attention is local
        kinds = (list(cfg["block_types"]) * L)[:L]
        mixers = ["sliding_attention" if t == "attention" else t for t in kinds]
    elif linear == "gated_deltanet":
        interval = int(_num(cfg, "full_attention_interval", 4))
        mixers = ["full_attention" if (i + 1) % interval == 0 else linear for i in range(L)]
    elif mt in ("lfm2", "lfm2_moe"):
        idx = cfg.get("full_attn_idxs")
        mixers = ["full_attention" if idx is None or i in idx else "short_conv" for i in range(L)]
    elif window and cfg.get("sliding_window_pattern"):
        p = int(cfg["sliding_window_pattern"])
        mixers = ["sliding_attention" if (i + 1) % p != 0 else "full_attention" for i in range(L)]
    elif window and mt == "gemma2":
        mixers = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(L)]
    else:
        mixers = ["sliding_attention" if window else "full_attention"] * L
    if ffns is None:
        mlp_only = set(cfg.get("mlp_only_layers") or ())
        step = int(_num(cfg, "decoder_sparse_step", 1))
        first_dense = int(_num(cfg, "first_k_dense_replace", 0))
        ffns = ["moe" if experts and i not in mlp_only and (i + 1) % step == 0 and i >= first_dense else "dense"
                for i in range(len(mixers))]
    return tuple(mixers), tuple(ffns)


def _mixer_sizes(cfg: dict, mt: str, h: int, kinds: set[str]) -> dict[str, dict[str, int]]:
    """The sizes of each non-attention mixer the layers have, under the names its formulas use."""
    out: dict[str, dict[str, int]] = {}
    if "mamba" in kinds:
        if mt == "jamba":
            inner, state, conv = int(cfg["mamba_expand"]) * h, int(cfg["mamba_d_state"]), int(cfg["mamba_d_conv"])
            rank, conv_bias, bias = cfg.get("mamba_dt_rank"), _num(cfg, "mamba_conv_bias", True), _num(
                cfg, "mamba_proj_bias", False)
        else:
            inner = int(cfg["expand"]) * h  # (their config classes overwrite intermediate_size with it)
            state, conv = int(cfg["state_size"]), int(cfg["conv_kernel"])
            rank, conv_bias, bias = cfg.get("time_step_rank"), _num(cfg, "use_conv_bias", True), _num(
                cfg, "use_bias", False)
        rank = math.ceil(h / 16) if rank in (None, "auto") else int(rank)
        out["mamba"] = {"inner": inner, "state": state, "conv": conv, "dt_rank": rank, "conv_bias": int(conv_bias),
                        "bias": int(bias), "bcdt_norms": int(mt == "jamba")}
    if "mamba2" in kinds:
        if mt == "mamba2":
            inner, heads, hd = int(cfg["expand"]) * h, int(cfg["num_heads"]), int(cfg["head_dim"])
            groups, state, conv = int(cfg["n_groups"]), int(cfg["state_size"]), int(cfg["conv_kernel"])
            conv_bias, bias, out_bias, norm = _num(cfg, "use_conv_bias", True), _num(cfg, "use_bias", False), None, True
        elif mt == "nemotron_h":
            heads, hd = int(cfg["mamba_num_heads"]), int(cfg["mamba_head_dim"])
            inner, groups, state, conv = heads * hd, int(cfg["n_groups"]), int(cfg["ssm_state_size"]), int(
                cfg["conv_kernel"])
            conv_bias, bias, out_bias, norm = (_num(cfg, "use_conv_bias", True), _num(cfg, "mamba_proj_bias", False),
                                               _num(cfg, "use_bias", False), True)
        else:  # bamba, granitemoehybrid, falcon_h1: mamba_* fields
            inner = int(cfg.get("mamba_d_ssm") or int(cfg["mamba_expand"]) * h)
            heads = int(cfg["mamba_n_heads"])
            hd = cfg.get("mamba_d_head")
            hd = inner // heads if hd in (None, "auto") else int(hd)
            groups, state, conv = int(cfg["mamba_n_groups"]), int(cfg["mamba_d_state"]), int(cfg["mamba_d_conv"])
            conv_bias, bias = _num(cfg, "mamba_conv_bias", True), _num(cfg, "mamba_proj_bias", False)
            out_bias = _num(cfg, "projectors_bias", False) if mt == "falcon_h1" else None
            norm = bool(_num(cfg, "mamba_rms_norm", False)) if mt == "falcon_h1" else True
        if inner != heads * hd:
            named = ("expand", "num_heads", "head_dim", "mamba_expand", "mamba_d_ssm", "mamba_n_heads", "mamba_d_head")
            defaulted = [k for k in named if k in cfg.get("_defaulted", ())]
            raise ValueError(
                f"the {mt} config is inconsistent: its Mamba-2 mixers are {inner} wide (the hidden size times "
                f"expand) but have {heads} heads of {hd} = {heads * hd}, and each SSM head takes head_dim of the "
                "width: no model can be built from it"
                + (f"; {', '.join(defaulted)} are not in the config: these are transformers' defaults for {mt}, "
                   "state them" if defaulted else ""))
        out["mamba2"] = {"inner": inner, "heads": heads, "head_dim": hd, "groups": groups, "state": state,
                         "conv": conv, "conv_bias": int(conv_bias), "bias": int(bias),
                         "out_bias": int(bias if out_bias is None else out_bias), "norm": int(norm)}
    if "gated_deltanet" in kinds:
        out["gated_deltanet"] = {"k_heads": int(cfg["linear_num_key_heads"]),
                                 "v_heads": int(cfg["linear_num_value_heads"]),
                                 "k_dim": int(cfg["linear_key_head_dim"]), "v_dim": int(cfg["linear_value_head_dim"]),
                                 "conv": int(cfg["linear_conv_kernel_dim"])}
    if "short_conv" in kinds:
        out["short_conv"] = {"conv": int(cfg["conv_L_cache"]), "bias": int(_num(cfg, "conv_bias", False))}
    return out


def _tower(name: str, t: dict[str, Any], parent: dict[str, Any], text_hidden: int) -> dict[str, Any]:
    """A multimodal config's encoder (vision / audio tower) and its projector into the language
    model: sizes and parameters. SigLIP (Gemma 3's vision tower) is counted exactly; any other
    tower as a plain ViT (``exact`` False)."""
    mt = str(t.get("model_type") or name.replace("_config", ""))
    h, i, L = int(_num(t, "hidden_size", 0)), int(_num(t, "intermediate_size", 0)), int(
        _num(t, "num_hidden_layers", _num(t, "depth", 0)))
    patch, image, chans = t.get("patch_size"), t.get("image_size"), int(_num(t, "num_channels", 3))
    patch = patch[0] if isinstance(patch, (list, tuple)) else patch
    image = image[0] if isinstance(image, (list, tuple)) else image
    if not (h and i and L):
        return {"name": name.replace("_config", " tower"), "model_type": mt, "layers": L, "hidden": h,
                "intermediate": i, "params": None, "projector_params": 0, "exact": False}
    params = L * (4 * h * h + 4 * h + 2 * h * i + i + h + 4 * h) + 2 * h  # pre-norm ViT layers, post layernorm
    if patch:
        params += chans * patch * patch * h + h
        if image:
            params += (image // patch) ** 2 * h  # learned position embeddings
    exact = mt == "siglip_vision_model"
    if exact and _num(t, "vision_use_head", True):  # the attention-pooling head
        params += h + 3 * h * h + 3 * h + h * h + h + 2 * h + 2 * h * i + i + h
    projector, proj_exact = 0, False
    if parent.get("model_type") == "gemma3" and name == "vision_config":
        projector, proj_exact = h * text_hidden + h, True  # mm_input_projection_weight + mm_soft_emb_norm
    return {"name": name.replace("_config", " tower"), "model_type": mt, "layers": L, "hidden": h,
            "intermediate": i, "params": params, "projector_params": projector, "exact": exact and proj_exact}


def facts(cfg: dict) -> Facts:
    mt = cfg.get("model_type", "unknown")
    traits = FAMILY_TRAITS.get(mt, {})
    h = int(cfg["hidden_size"])
    heads = 0 if mt in _NO_ATTENTION else int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    hd = int(cfg.get("head_dim") or (h // heads if heads else 0))
    act_name = str(cfg.get("hidden_activation") or cfg.get("mlp_hidden_act") or cfg.get("hidden_act") or "silu")
    act = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
           "gelu_fast": "gelu_tanh", "gelu": "gelu"}.get(act_name, act_name)
    if traits.get("expert_gate") == "swiglu_oai":
        act = "swiglu_oai"
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) is not False else None
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0)
    if mt == "jamba" and experts <= 1:
        experts = 0
    L = int(cfg["num_hidden_layers"]) if cfg.get("num_hidden_layers") is not None else 0
    mixers, ffns = _layout(cfg, mt, L, experts, window)
    L = len(mixers)
    if not any(k == "moe" for k in ffns):
        experts = 0
    sliding = sum(k == "sliding_attention" for k in mixers)
    mla = None
    if cfg.get("kv_lora_rank"):
        mla = {k: int(cfg.get(k) or 0) for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                                  "qk_rope_head_dim", "v_head_dim")}
    moe_inter = int(cfg.get("moe_intermediate_size") or (cfg.get("intermediate_size") if experts else 0) or 0)
    shared = int(cfg.get("shared_expert_intermediate_size") or cfg.get("moe_shared_expert_intermediate_size")
                 or (cfg.get("n_shared_experts") or 0) * moe_inter)
    inter = int(cfg.get("intermediate_size") or 4 * h)
    if mt == "granitemoehybrid":  # a shared MLP beside the experts, the only MLP without experts
        shared = int(cfg["shared_intermediate_size"])
        if not experts:
            inter, shared = shared, 0
    elif mt in ("lfm2", "lfm2_moe") and _num(cfg, "block_auto_adjust_ff_dim", True):
        inter = int(2 * inter / 3)  # as Lfm2MLP sizes itself
        if cfg.get("block_ffn_dim_multiplier", 1.0) is not None:
            m = int(_num(cfg, "block_multiple_of", 256))
            inter = m * ((int(float(_num(cfg, "block_ffn_dim_multiplier", 1.0)) * inter) + m - 1) // m)
    if mla:
        hd = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
    params = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    partial = cfg.get("partial_rotary_factor") or params.get("partial_rotary_factor") or (
        0.25 if _LINEAR_KIND.get(mt) == "gated_deltanet" else 0.5 if mt == "bamba" else 1.0)
    rot = mla["qk_rope_head_dim"] if mla else int(hd * float(partial))
    if traits.get("no_rope") or (mt == "granitemoehybrid" and cfg.get("position_embedding_type") != "rope"):
        rot = 0  # attention without positions: the SSM layers order the tokens
    norm = "layer_norm" if ("layer_norm_eps" in cfg or "layer_norm_epsilon" in cfg) and "rms_norm_eps" not in cfg \
        and mt not in ("mamba", "falcon_mamba", "mamba2", "nemotron_h") else "rms_norm"
    tie = cfg.get("tie_word_embeddings", cfg.get("tie_embedding"))
    if tie is None:
        tie = mt in ("mamba", "falcon_mamba")  # their config classes tie by default
    parent = cfg.get("_parent") or {}
    if parent.get("tie_word_embeddings") is not None:
        tie = parent["tie_word_embeddings"]
    towers = {k: _tower(k, t, parent, h) for k, t in (cfg.get("_towers") or {}).items()}
    attn_bias = bool(cfg.get("attention_bias"))
    return Facts(
        model_type=mt, hidden=h, layers=L, heads=heads, kv_heads=kv if heads else 0, head_dim=hd, intermediate=inter,
        vocab=int(cfg["vocab_size"]), activation=act, norm=norm, norm_offset=float(traits.get("norm_offset", 0.0)),
        qk_norm=traits.get("qk_norm"), rope=_rope(cfg), rotary_dim=rot,
        sliding_window=int(window) if window and sliding else None, sliding_layers=sliding,
        attn_softcap=cfg.get("attn_logit_softcapping"), final_softcap=cfg.get("final_logit_softcapping"),
        tie_embeddings=bool(tie), experts=experts,
        experts_per_tok=int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 0) if experts else 0,
        moe_intermediate=moe_inter if experts else 0, shared_intermediate=shared if experts else 0,
        dense_layers=sum(k == "dense" for k in ffns) if experts else 0, mla=mla,
        sinks=bool(traits.get("attention_sinks")), traits=traits, mixers=mixers, ffns=ffns,
        ssm=_mixer_sizes(cfg, mt, h, {sub for k in mixers for sub in k.split("+")}) if mt in _LINEAR_KIND else {},
        towers=towers,
        qkv_bias=bool(traits.get("attention_bias")) or attn_bias,
        o_bias=bool(traits.get("o_bias")) or (attn_bias and not traits.get("attention_bias")),
        mlp_bias=bool(cfg.get("mlp_bias")), moe_latent=int(_num(cfg, "moe_latent_size", 0)) if experts else 0)


@dataclasses.dataclass(frozen=True)
class Part:
    """The parameters of one kind of block: ``count`` blocks, ``params`` in all (None: a kind plan
    does not model), ``exact`` False where they are an estimate."""

    name: str
    count: int
    params: int | None
    exact: bool = True


def _attention_params(f: Facts) -> int:
    h = f.hidden
    if f.mla:
        m = f.mla
        qk = m["qk_nope_head_dim"] + m["qk_rope_head_dim"]
        q = (h * m["q_lora_rank"] + m["q_lora_rank"] + m["q_lora_rank"] * f.heads * qk) if m["q_lora_rank"] \
            else h * f.heads * qk
        return q + h * (m["kv_lora_rank"] + m["qk_rope_head_dim"]) + m["kv_lora_rank"] + m["kv_lora_rank"] * f.heads * (
            m["qk_nope_head_dim"] + m["v_head_dim"]) + f.heads * m["v_head_dim"] * h
    q = f.heads * f.head_dim * (2 if f.traits.get("attn_output_gate") else 1)
    kvw = f.kv_heads * f.head_dim
    n = h * (q + 2 * kvw) + f.heads * f.head_dim * h
    n += (q + 2 * kvw) * f.qkv_bias + h * f.o_bias + f.heads * f.sinks
    n += {"head": 2 * f.head_dim, "full": f.heads * f.head_dim + kvw}.get(f.qk_norm or "", 0)
    return n


def _mixer_params(kind: str, f: Facts) -> int | None:
    """One layer's parameters of a non-attention mixer (None: not a kind plan models)."""
    h, s = f.hidden, f.ssm.get(kind)
    if s is None:
        return None
    if kind == "mamba":
        i, n, r = s["inner"], s["state"], s["dt_rank"]
        return (h * 2 * i + (2 * i + h) * s["bias"] + i * s["conv"] + i * s["conv_bias"] + i * (r + 2 * n)
                + r * i + i + i * n + i + i * h + s["bcdt_norms"] * (r + 2 * n))
    if kind == "mamba2":
        i, nh = s["inner"], s["heads"]
        conv_dim = i + 2 * s["groups"] * s["state"]
        proj = i + conv_dim + nh  # z, x/B/C, dt
        return (h * proj + proj * s["bias"] + conv_dim * s["conv"] + conv_dim * s["conv_bias"] + 3 * nh
                + i * s["norm"] + i * h + h * s["out_bias"])
    if kind == "gated_deltanet":
        kd, vd, vh = s["k_heads"] * s["k_dim"], s["v_heads"] * s["v_dim"], s["v_heads"]
        return h * (2 * kd + 2 * vd) + h * 2 * vh + (2 * kd + vd) * s["conv"] + 2 * vh + s["v_dim"] + vd * h
    if kind == "short_conv":
        return 3 * h * h + h * s["conv"] + h * h + (3 * h + h + h) * s["bias"]
    return None


def _mlp_params(f: Facts, inter: int) -> int:
    mats = 3 if f.traits.get("gated_mlp", True) else 2
    return mats * f.hidden * inter + ((mats - 1) * inter + f.hidden) * f.mlp_bias


def parameter_breakdown(f: Facts) -> tuple[Part, ...]:
    """The model's parameters by kind of block: embeddings, each kind of token mixer, each kind of
    feed-forward, the norms, and a multimodal model's towers."""
    h = f.hidden
    parts = [Part("token embedding" + ("" if f.tie_embeddings else " + LM head"), 1,
                  f.vocab * h * (1 if f.tie_embeddings else 2))]
    attn = _attention_params(f) if f.heads else 0
    for kind, n in f.mixer_counts().items():
        if kind == "none":
            continue
        each: int | None = 0
        for sub in kind.split("+"):
            p = attn if sub in ATTENTION_KINDS else _mixer_params(sub, f)
            each = None if p is None or each is None else each + p
        label = " + ".join(("MLA" if f.mla else "attention") + f" ({sub})" if sub in ATTENTION_KINDS
                           else MIXER_LABELS.get(sub, sub) + " mixer" for sub in kind.split("+"))
        parts.append(Part(label, n, None if each is None else n * each))
    counts = f.ffn_counts()
    if counts.get("dense"):
        parts.append(Part("dense MLP", counts["dense"], counts["dense"] * _mlp_params(f, f.intermediate)))
    if counts.get("moe"):
        e, mi = f.experts, f.moe_intermediate
        mats = 3 if f.traits.get("gated_mlp", True) else 2
        d = f.moe_latent or h  # (Nemotron-H's experts may work in a smaller latent space)
        each = e * mats * d * mi + h * e  # experts, router
        each += (2 * h * d + (d + h) * f.mlp_bias) if f.moe_latent else 0  # in/out of the latent space
        each += (e * ((mats - 1) * mi + h) if f.traits.get("expert_bias") else 0) + (e if f.traits.get(
            "router_bias") else 0)
        if f.shared_intermediate:
            each += _mlp_params(f, f.shared_intermediate) + (h if f.traits.get("shared_expert_gate") else 0)
        parts.append(Part(f"MoE ({e} experts)", counts["moe"], counts["moe"] * each))
    per_layer = int(f.traits.get("norms_per_layer", 4 if f.traits.get("sandwich_norms") else 2))
    norm = (2 if f.norm == "layer_norm" else 1) * h
    parts.append(Part("layer norms", per_layer * f.layers + 1, (per_layer * f.layers + 1) * norm))
    for t in f.towers.values():
        parts.append(Part(f"{t['name']} ({t['model_type']}, {t['layers']} layers)", 1,
                          None if t["params"] is None else t["params"] + t["projector_params"], t["exact"]))
    return tuple(parts)


def parameter_count(f: Facts) -> int:
    """Parameters from the shapes, every weight, bias and norm counted (a kind of layer plan does not
    model counts as 0: :func:`parameter_breakdown` says which)."""
    return sum(p.params or 0 for p in parameter_breakdown(f))


def kv_bytes_per_token(f: Facts, elem: float) -> float:
    """KV cache bytes per token: attention layers only (SSM and linear-attention layers keep a fixed
    state instead, :func:`state_bytes_per_sequence`)."""
    if f.mla:
        return f.attention_layers * (f.mla["kv_lora_rank"] + f.mla["qk_rope_head_dim"]) * elem
    return 2 * f.attention_layers * f.kv_heads * f.head_dim * elem


def state_bytes_per_sequence(f: Facts, elem: float) -> float:
    """Recurrent state bytes per sequence, whatever its length: the SSM / linear-attention state and
    the causal convolution's last ``conv - 1`` inputs of every non-attention mixer."""
    total = 0
    for kind, n in f.mixer_counts().items():
        for sub in kind.split("+"):
            s = f.ssm.get(sub)
            if s is None:
                continue
            if sub == "mamba":
                each = s["inner"] * s["state"] + s["inner"] * (s["conv"] - 1)
            elif sub == "mamba2":
                each = s["inner"] * s["state"] + (s["inner"] + 2 * s["groups"] * s["state"]) * (s["conv"] - 1)
            elif sub == "gated_deltanet":
                kd, vd = s["k_heads"] * s["k_dim"], s["v_heads"] * s["v_dim"]
                each = s["v_heads"] * s["k_dim"] * s["v_dim"] + (2 * kd + vd) * (s["conv"] - 1)
            else:  # short_conv
                each = f.hidden * (s["conv"] - 1)
            total += n * each
    return total * elem
