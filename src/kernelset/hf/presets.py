"""Presets: the public config.json values of well-known open models, and tiny versions of them.

Each preset is only what the model's own ``config.json`` says (the fields ``plan`` and transformers
read); nothing here says which kernels a model needs: ``plan`` derives that. ``tiny(name)`` keeps
a preset's structure (GQA ratio, q/k norm, MoE, MLA, sliding window, softcaps, rope scaling) at toy
sizes, for the CPU tests and ``ksctl eval --tiny``.
"""
from __future__ import annotations

import copy
from typing import Any

_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}


def _cfg(model_type: str, hidden: int, layers: int, heads: int, kv: int, inter: int, vocab: int, **extra: Any) -> dict:
    out = {"model_type": model_type, "hidden_size": hidden, "num_hidden_layers": layers,
           "num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": inter, "vocab_size": vocab}
    out.update(extra)
    return out


PRESETS: dict[str, dict[str, Any]] = {
    # Llama family
    "llama-2-7b": _cfg("llama", 4096, 32, 32, 32, 11008, 32000, max_position_embeddings=4096, rms_norm_eps=1e-5,
                       rope_theta=10000.0, hidden_act="silu"),
    "llama-2-70b": _cfg("llama", 8192, 80, 64, 8, 28672, 32000, max_position_embeddings=4096, rms_norm_eps=1e-5,
                        rope_theta=10000.0, hidden_act="silu"),
    "llama-3-8b": _cfg("llama", 4096, 32, 32, 8, 14336, 128256, max_position_embeddings=8192, rms_norm_eps=1e-5,
                       rope_theta=500000.0, hidden_act="silu"),
    "llama-3.1-8b": _cfg("llama", 4096, 32, 32, 8, 14336, 128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
                         rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE, hidden_act="silu"),
    "llama-3.1-70b": _cfg("llama", 8192, 80, 64, 8, 28672, 128256, max_position_embeddings=131072,
                          rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE, hidden_act="silu"),
    "llama-3.1-405b": _cfg("llama", 16384, 126, 128, 8, 53248, 128256, max_position_embeddings=131072,
                           rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE, hidden_act="silu"),
    "llama-3.2-1b": _cfg("llama", 2048, 16, 32, 8, 8192, 128256, head_dim=64, max_position_embeddings=131072,
                         rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True, hidden_act="silu",
                         rope_scaling=dict(_LLAMA3_ROPE, factor=32.0)),
    "llama-3.2-3b": _cfg("llama", 3072, 28, 24, 8, 8192, 128256, head_dim=128, max_position_embeddings=131072,
                         rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True, hidden_act="silu",
                         rope_scaling=dict(_LLAMA3_ROPE, factor=32.0)),
    "tinyllama-1.1b": _cfg("llama", 2048, 22, 32, 4, 5632, 32000, max_position_embeddings=2048, rms_norm_eps=1e-5,
                           rope_theta=10000.0, hidden_act="silu"),
    "smollm2-1.7b": _cfg("llama", 2048, 24, 32, 32, 8192, 49152, max_position_embeddings=8192, rms_norm_eps=1e-5,
                         rope_theta=130000.0, tie_word_embeddings=True, hidden_act="silu"),
    # Mistral
    "mistral-7b-v0.1": _cfg("mistral", 4096, 32, 32, 8, 14336, 32000, max_position_embeddings=32768,
                            sliding_window=4096, rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu"),
    "mistral-7b-v0.3": _cfg("mistral", 4096, 32, 32, 8, 14336, 32768, max_position_embeddings=32768,
                            sliding_window=None, rms_norm_eps=1e-5, rope_theta=1000000.0, hidden_act="silu"),
    "mistral-nemo-12b": _cfg("mistral", 5120, 40, 32, 8, 14336, 131072, head_dim=128,
                             max_position_embeddings=1024000, sliding_window=None, rms_norm_eps=1e-5,
                             rope_theta=1000000.0, hidden_act="silu"),
    "mixtral-8x7b": _cfg("mixtral", 4096, 32, 32, 8, 14336, 32000, num_local_experts=8, num_experts_per_tok=2,
                         max_position_embeddings=32768, sliding_window=None, rms_norm_eps=1e-5, rope_theta=1000000.0,
                         hidden_act="silu"),
    "mixtral-8x22b": _cfg("mixtral", 6144, 56, 48, 8, 16384, 32768, num_local_experts=8, num_experts_per_tok=2,
                          max_position_embeddings=65536, sliding_window=None, rms_norm_eps=1e-5,
                          rope_theta=1000000.0, hidden_act="silu"),
    # Qwen
    "qwen2-7b": _cfg("qwen2", 3584, 28, 28, 4, 18944, 152064, max_position_embeddings=32768, rms_norm_eps=1e-6,
                     rope_theta=1000000.0, hidden_act="silu"),
    "qwen2.5-0.5b": _cfg("qwen2", 896, 24, 14, 2, 4864, 151936, max_position_embeddings=32768, rms_norm_eps=1e-6,
                         rope_theta=1000000.0, tie_word_embeddings=True, hidden_act="silu"),
    "qwen2.5-7b": _cfg("qwen2", 3584, 28, 28, 4, 18944, 152064, max_position_embeddings=32768, rms_norm_eps=1e-6,
                       rope_theta=1000000.0, hidden_act="silu"),
    "qwen2.5-72b": _cfg("qwen2", 8192, 80, 64, 8, 29568, 152064, max_position_embeddings=32768, rms_norm_eps=1e-6,
                        rope_theta=1000000.0, hidden_act="silu"),
    "qwen3-0.6b": _cfg("qwen3", 1024, 28, 16, 8, 3072, 151936, head_dim=128, max_position_embeddings=40960,
                       rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, hidden_act="silu"),
    "qwen3-8b": _cfg("qwen3", 4096, 36, 32, 8, 12288, 151936, head_dim=128, max_position_embeddings=40960,
                     rms_norm_eps=1e-6, rope_theta=1000000.0, hidden_act="silu"),
    "qwen3-32b": _cfg("qwen3", 5120, 64, 64, 8, 25600, 151936, head_dim=128, max_position_embeddings=40960,
                      rms_norm_eps=1e-6, rope_theta=1000000.0, hidden_act="silu"),
    "qwen3-30b-a3b": _cfg("qwen3_moe", 2048, 48, 32, 4, 6144, 151936, head_dim=128, moe_intermediate_size=768,
                          num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, max_position_embeddings=40960,
                          rms_norm_eps=1e-6, rope_theta=1000000.0, hidden_act="silu"),
    "qwen3-235b-a22b": _cfg("qwen3_moe", 4096, 94, 64, 4, 12288, 151936, head_dim=128, moe_intermediate_size=1536,
                            num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                            max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0, hidden_act="silu"),
    "qwen1.5-moe-a2.7b": _cfg("qwen2_moe", 2048, 24, 16, 16, 5632, 151936, moe_intermediate_size=1408,
                              shared_expert_intermediate_size=5632, num_experts=60, num_experts_per_tok=4,
                              max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=1000000.0,
                              hidden_act="silu"),
    # Gemma
    "gemma-2b": _cfg("gemma", 2048, 18, 8, 1, 16384, 256000, head_dim=256, max_position_embeddings=8192,
                     rms_norm_eps=1e-6, rope_theta=10000.0, hidden_activation="gelu_pytorch_tanh",
                     tie_word_embeddings=True),
    "gemma-7b": _cfg("gemma", 3072, 28, 16, 16, 24576, 256000, head_dim=256, max_position_embeddings=8192,
                     rms_norm_eps=1e-6, rope_theta=10000.0, hidden_activation="gelu_pytorch_tanh",
                     tie_word_embeddings=True),
    "gemma-2-9b": _cfg("gemma2", 3584, 42, 16, 8, 14336, 256000, head_dim=256, max_position_embeddings=8192,
                       rms_norm_eps=1e-6, rope_theta=10000.0, hidden_activation="gelu_pytorch_tanh",
                       sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                       query_pre_attn_scalar=256, tie_word_embeddings=True),
    "gemma-2-27b": _cfg("gemma2", 4608, 46, 32, 16, 36864, 256000, head_dim=128, max_position_embeddings=8192,
                        rms_norm_eps=1e-6, rope_theta=10000.0, hidden_activation="gelu_pytorch_tanh",
                        sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                        query_pre_attn_scalar=144, tie_word_embeddings=True),
    "gemma-3-1b": _cfg("gemma3_text", 1152, 26, 4, 1, 6912, 262144, head_dim=256, max_position_embeddings=32768,
                       rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                       hidden_activation="gelu_pytorch_tanh", sliding_window=512, sliding_window_pattern=6,
                       query_pre_attn_scalar=256, tie_word_embeddings=True),
    "gemma-3-27b": _cfg("gemma3_text", 5376, 62, 32, 16, 21504, 262208, head_dim=128, max_position_embeddings=131072,
                        rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                        rope_scaling={"rope_type": "linear", "factor": 8.0}, hidden_activation="gelu_pytorch_tanh",
                        sliding_window=1024, sliding_window_pattern=6, query_pre_attn_scalar=168,
                        tie_word_embeddings=True),
    # Phi, OLMo, Granite
    "phi-3-mini-4k": _cfg("phi3", 3072, 32, 32, 32, 8192, 32064, max_position_embeddings=4096, rms_norm_eps=1e-5,
                          rope_theta=10000.0, sliding_window=2047, hidden_act="silu"),
    "phi-3-medium-4k": _cfg("phi3", 5120, 40, 40, 10, 17920, 32064, max_position_embeddings=4096,
                            rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=2047, hidden_act="silu"),
    "phi-4": _cfg("phi3", 5120, 40, 40, 10, 17920, 100352, max_position_embeddings=16384, rms_norm_eps=1e-5,
                  rope_theta=250000.0, hidden_act="silu"),
    "olmo-2-7b": _cfg("olmo2", 4096, 32, 32, 32, 11008, 100352, max_position_embeddings=4096, rms_norm_eps=1e-6,
                      rope_theta=500000.0, hidden_act="silu"),
    "olmo-2-13b": _cfg("olmo2", 5120, 40, 40, 40, 13824, 100352, max_position_embeddings=4096, rms_norm_eps=1e-6,
                       rope_theta=500000.0, hidden_act="silu"),
    "granite-3.1-8b": _cfg("granite", 4096, 40, 32, 8, 12800, 49155, max_position_embeddings=131072,
                           rms_norm_eps=1e-5, rope_theta=10000000.0, embedding_multiplier=12.0, logits_scaling=16.0,
                           residual_multiplier=0.22, attention_multiplier=0.0078125, tie_word_embeddings=True,
                           hidden_act="silu"),
    # gpt-oss
    "gpt-oss-20b": _cfg("gpt_oss", 2880, 24, 64, 8, 2880, 201088, head_dim=64, num_local_experts=32,
                        num_experts_per_tok=4, sliding_window=128, max_position_embeddings=131072,
                        rms_norm_eps=1e-5, rope_theta=150000.0, swiglu_limit=7.0,
                        rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                      "original_max_position_embeddings": 4096, "truncate": False},
                        layer_types=["sliding_attention", "full_attention"] * 12),
    "gpt-oss-120b": _cfg("gpt_oss", 2880, 36, 64, 8, 2880, 201088, head_dim=64, num_local_experts=128,
                         num_experts_per_tok=4, sliding_window=128, max_position_embeddings=131072,
                         rms_norm_eps=1e-5, rope_theta=150000.0, swiglu_limit=7.0,
                         rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                       "original_max_position_embeddings": 4096, "truncate": False},
                         layer_types=["sliding_attention", "full_attention"] * 18),
    # DeepSeek (MLA + MoE)
    "deepseek-v3": _cfg("deepseek_v3", 7168, 61, 128, 128, 18432, 129280, moe_intermediate_size=2048,
                        n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8, n_group=8, topk_group=4,
                        first_k_dense_replace=3, routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=1536,
                        kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                        max_position_embeddings=163840, rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu",
                        rope_scaling={"rope_type": "yarn", "factor": 40.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                      "mscale": 1.0, "mscale_all_dim": 1.0,
                                      "original_max_position_embeddings": 4096}),
    "deepseek-r1": _cfg("deepseek_v3", 7168, 61, 128, 128, 18432, 129280, moe_intermediate_size=2048,
                        n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8, n_group=8, topk_group=4,
                        first_k_dense_replace=3, routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=1536,
                        kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                        max_position_embeddings=163840, rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu",
                        rope_scaling={"rope_type": "yarn", "factor": 40.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                      "mscale": 1.0, "mscale_all_dim": 1.0,
                                      "original_max_position_embeddings": 4096}),
    # Hybrids and state-space models: attention in some layers (or none), Mamba / Mamba-2 / gated
    # DeltaNet / short convolutions in the others
    "jamba-v0.1": {"model_type": "jamba", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 65536, "num_experts": 16,
                   "num_experts_per_tok": 2, "attn_layer_period": 8, "attn_layer_offset": 4,
                   "expert_layer_period": 2, "expert_layer_offset": 1, "mamba_d_state": 16, "mamba_d_conv": 4,
                   "mamba_expand": 2, "mamba_dt_rank": 256, "mamba_conv_bias": True, "mamba_proj_bias": False,
                   "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "hidden_act": "silu",
                   "tie_word_embeddings": False},
    "qwen3-next-80b-a3b": _cfg("qwen3_next", 2048, 48, 16, 2, 5120, 151936, head_dim=256, num_experts=512,
                               num_experts_per_tok=10, moe_intermediate_size=512, shared_expert_intermediate_size=512,
                               decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
                               full_attention_interval=4, linear_conv_kernel_dim=4, linear_key_head_dim=128,
                               linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32,
                               partial_rotary_factor=0.25, max_position_embeddings=262144, rms_norm_eps=1e-6,
                               rope_theta=10000000.0, hidden_act="silu", tie_word_embeddings=False),
    "mamba-2.8b": {"model_type": "mamba", "hidden_size": 2560, "num_hidden_layers": 64, "vocab_size": 50280,
                   "state_size": 16, "expand": 2, "conv_kernel": 4, "time_step_rank": 160, "use_bias": False,
                   "use_conv_bias": True, "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True},
    "mamba-codestral-7b": {"model_type": "mamba2", "hidden_size": 4096, "num_hidden_layers": 64, "vocab_size": 32768,
                           "num_heads": 128, "head_dim": 64, "n_groups": 8, "state_size": 128, "expand": 2,
                           "conv_kernel": 4, "chunk_size": 256, "use_bias": False, "use_conv_bias": True,
                           "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False},
    "lfm2-1.2b": _cfg("lfm2", 2048, 16, 32, 8, 12288, 65536, full_attn_idxs=[2, 5, 8, 10, 12, 14], conv_L_cache=3,
                      conv_bias=False, block_auto_adjust_ff_dim=True, block_ffn_dim_multiplier=1.0,
                      block_multiple_of=256, norm_eps=1e-5, rope_theta=1000000.0, max_position_embeddings=128000,
                      tie_word_embeddings=True),
}


def preset(name: str) -> dict[str, Any]:
    """A copy of a preset's config values; the error lists the presets."""
    key = name.strip().lower()
    if key not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(sorted(PRESETS))}")
    return copy.deepcopy(PRESETS[key])


# The families the CPU tests cover, each by its smallest preset (kernelize must patch these).
FAMILY_PRESETS: dict[str, str] = {
    "llama": "llama-3.2-1b", "mistral": "mistral-7b-v0.1", "qwen2": "qwen2.5-0.5b", "qwen3": "qwen3-0.6b",
    "gemma": "gemma-2b", "gemma2": "gemma-2-9b", "gemma3_text": "gemma-3-1b", "phi3": "phi-3-mini-4k",
    "olmo2": "olmo-2-7b", "granite": "granite-3.1-8b", "mixtral": "mixtral-8x7b", "qwen2_moe": "qwen1.5-moe-a2.7b",
    "qwen3_moe": "qwen3-30b-a3b", "gpt_oss": "gpt-oss-20b", "deepseek_v3": "deepseek-v3",
}


def tiny(name: str, *, hidden: int = 64, layers: int = 2, vocab: int = 128, window: int = 8) -> dict[str, Any]:
    """A preset at toy size with its structure kept: 4 query heads with the preset's GQA ratio
    (1, 2 or 4 KV heads), head dim hidden/4, 2x hidden MLP, 4 experts (top 2), MLA ranks of 32,
    a sliding window of ``window`` tokens (so a 32-token continuation crosses it), state-space and
    linear-attention mixers of 16-wide heads, every layer kind still present (a hybrid's attention
    and other layers alternate). Random-init only: the values say nothing about the real model."""
    cfg = preset(name)
    cfg.update(hidden_size=hidden, num_hidden_layers=layers, vocab_size=vocab, pad_token_id=None, bos_token_id=1,
               eos_token_id=2)
    heads = 4
    if "num_attention_heads" in cfg:
        ratio = max(1, cfg["num_attention_heads"] // cfg.get("num_key_value_heads", cfg["num_attention_heads"]))
        cfg.update(num_attention_heads=heads, num_key_value_heads=max(1, heads // min(ratio, heads)),
                   intermediate_size=2 * hidden, head_dim=hidden // heads)
    if cfg.get("sliding_window"):
        cfg["sliding_window"] = window
    if "layer_types" in cfg:  # every kind, in the order they first appear
        kinds = list(dict.fromkeys(cfg["layer_types"]))
        cfg["layer_types"] = (kinds * layers)[:layers]
    _tiny_mixers(cfg, hidden, layers)
    if "sliding_window_pattern" in cfg:
        cfg["sliding_window_pattern"] = 2
    for k in ("num_local_experts", "num_experts", "n_routed_experts"):
        if k in cfg:
            cfg[k] = 4
    if "num_experts_per_tok" in cfg:
        cfg["num_experts_per_tok"] = 2
    if "moe_intermediate_size" in cfg:
        cfg["moe_intermediate_size"] = hidden // 2
    if "shared_expert_intermediate_size" in cfg:
        cfg["shared_expert_intermediate_size"] = hidden
    if "kv_lora_rank" in cfg:
        cfg.update(q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                   n_group=1, topk_group=1, first_k_dense_replace=1, head_dim=8)
    if "query_pre_attn_scalar" in cfg:
        cfg["query_pre_attn_scalar"] = hidden // heads
    if cfg.get("model_type") == "gpt_oss":
        cfg["intermediate_size"] = hidden  # gpt-oss's experts are hidden wide
    return cfg


def _tiny_mixers(cfg: dict[str, Any], hidden: int, layers: int) -> None:
    """``tiny``'s sizes for the non-attention layers of a hybrid or state-space preset, in place."""
    if "attn_layer_period" in cfg:  # Jamba: attention every other layer, experts in the others
        cfg.update(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=0)
    if "mamba_dt_rank" in cfg:
        cfg["mamba_dt_rank"] = 8
    if "time_step_rank" in cfg:
        cfg["time_step_rank"] = 8
    if cfg.get("model_type") == "mamba2":
        cfg.update(head_dim=16, num_heads=cfg.get("expand", 2) * hidden // 16, n_groups=2, state_size=16)
    if "full_attention_interval" in cfg:
        cfg["full_attention_interval"] = 2
    if "linear_num_key_heads" in cfg:
        cfg.update(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)
    if "full_attn_idxs" in cfg:
        cfg["full_attn_idxs"] = list(range(1, layers, 2))
    if "block_multiple_of" in cfg:
        cfg["block_multiple_of"] = 16


# sizes for tiny_from_defaults: every field a config class may have that sets a dimension or a count
_TINY_FIELDS = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    intermediate_size=128, vocab_size=128, head_dim=16, max_position_embeddings=256,
                    num_local_experts=4, num_experts=4, n_routed_experts=4, num_experts_per_tok=2,
                    moe_intermediate_size=32, shared_expert_intermediate_size=64, kv_lora_rank=32, q_lora_rank=32,
                    qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_group=1, topk_group=1,
                    first_k_dense_replace=1, sliding_window=8, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                    rotary_dim=8, decoder_layers=2, encoder_layers=2, decoder_attention_heads=4,
                    encoder_attention_heads=4, decoder_ffn_dim=128, encoder_ffn_dim=128, d_model=64)


def _tiny_state_space(cfg: Any) -> None:
    """``tiny_from_defaults``' sizes for the state-space and linear-recurrent layers of a config object,
    in place (their defaults are full size, and their head counts must divide the shrunk width), and
    every layer kind present in the 2 layers (a hybrid's defaults may put attention past layer 2)."""
    hidden = getattr(cfg, "hidden_size", None)
    if not isinstance(hidden, int):  # (a composite config: its text model's config is another one)
        return

    def put(**values):
        for k, v in values.items():
            if hasattr(cfg, k):
                try:
                    setattr(cfg, k, v)
                except (AttributeError, ValueError, TypeError):
                    pass

    # Mamba-2 heads of 16 over the expanded width, one group (the gated norm then spans the whole
    # width: the case where it looks like a plain RMSNorm), 16 states
    for heads, dim, groups, state, expand in (("num_heads", "head_dim", "n_groups", "state_size", "expand"),
                                              ("mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state",
                                               "mamba_expand"),
                                              ("n_mamba_heads", "mamba_headdim", "mamba_ngroups", "mamba_d_state",
                                               "mamba_expand"),
                                              ("mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size",
                                               "expand")):
        if all(hasattr(cfg, a) for a in (heads, dim, state)) and hasattr(cfg, expand):
            inner = int(getattr(cfg, expand) * hidden)
            put(**{heads: inner // 16, dim: 16, groups: 1, state: 16})
    put(mamba_d_ssm=int(getattr(cfg, "mamba_expand", 2) * hidden), mamba_dt_rank=8, time_step_rank=8,
        moe_shared_expert_intermediate_size=2 * hidden, shared_intermediate_size=2 * hidden, adapter_rank=8)
    # widths kept apart from hidden_size: RWKV's time mixing (hidden), Zamba's attention (2x hidden)
    if hasattr(cfg, "attention_head_dim") and hasattr(cfg, "num_attention_heads"):
        put(attention_hidden_size=2 * hidden, attention_head_dim=2 * hidden // cfg.num_attention_heads)
    else:
        put(attention_hidden_size=hidden)
    put(embedding_dim=hidden, num_blocks=cfg.num_hidden_layers)  # xLSTM
    if getattr(cfg, "model_type", "") == "xlstm":  # (its q/k width rounds up to 64: a factor of 1 keeps it 64)
        put(num_heads=4, qk_dim_factor=1.0)
    # an attention layer among the two
    put(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=0,
        attn_layer_indices=[1], block_types=["recurrent", "attention"])
    if getattr(cfg, "model_type", "") == "granitemoehybrid":
        put(layer_types=["linear_attention", "full_attention"])
    if "hybrid" in (getattr(cfg, "layers_block_type", None) or ()):  # Zamba: a shared transformer (tied to the
        # first one's) in each layer, and a mamba layer in each; transformers wants two such layers to tie
        put(layers_block_type=["hybrid", "hybrid"], hybrid_layer_ids=[0, 1])


def tiny_from_defaults(model_type: str) -> Any:
    """A transformers config of ``model_type`` at toy size: the config class's defaults with every
    size field it has shrunk (hidden 64, 2 layers of two kinds where it has layer types, 4/2 heads,
    vocab 128, sliding window 8; state-space mixers of 16-wide heads, ``_tiny_state_space``). Unlike
    ``tiny``, any family transformers knows; the shrunk config may not build (fields this does not
    know): the caller finds out."""
    from transformers import CONFIG_MAPPING
    cfg = CONFIG_MAPPING[model_type]()
    fields = dict(_TINY_FIELDS)
    if hasattr(cfg, "qk_rope_head_dim"):  # MLA: the rotary part is the head dim rope tables are built for,
        fields["head_dim"] = fields["qk_rope_head_dim"]  # and k has every query head
        fields["num_key_value_heads"] = fields["num_attention_heads"]
    for k, v in fields.items():
        try:
            if hasattr(cfg, k) and not isinstance(getattr(cfg, k), (list, dict)):
                setattr(cfg, k, v)
        except (AttributeError, ValueError, TypeError):  # read-only or per-layer fields stay as they are
            pass
    if hasattr(cfg, "qk_head_dim") and hasattr(cfg, "qk_nope_head_dim"):  # derived at init from the defaults
        try:
            cfg.qk_head_dim = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        except (AttributeError, ValueError, TypeError):
            pass
    try:
        if isinstance(getattr(cfg, "layer_types", None), list):
            kinds = sorted(set(cfg.layer_types))
            cfg.layer_types = (kinds * 2)[:2]
    except (AttributeError, ValueError, TypeError):
        pass
    _tiny_state_space(cfg)
    return cfg
