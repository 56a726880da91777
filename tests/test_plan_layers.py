"""ksctl plan reads each layer's kind: hybrids (Qwen3-Next, Jamba, Falcon-H1, Bamba, Granite 4, Nemotron-H,
LFM2), state-space models (Mamba, Mamba-2) and multimodal configs (Gemma 3's vision tower) are planned,
counted and cached as what their layers are, and what kernelset does not cover is said (issue 35,
item 13). The parameter counts are checked against the model transformers builds from the same
config, saved with ``save_pretrained`` and read back from the directory as a user would."""
import json

import pytest
import torch

from kernelset import cli
from kernelset.hf.planning import plan
from kernelset.hf.presets import PRESETS, tiny


def _row(p, startswith):
    rows = [r for r in p.rows if r.logical.startswith(startswith)]
    assert rows, f"no row starting with {startswith!r}: {[r.logical for r in p.rows]}"
    return rows[0]


def _saved(tmp_path, model_type, **values):
    """A config saved by transformers (``save_pretrained``), as a user hands it to ``ksctl plan``."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.for_model(model_type, **values)
    cfg.save_pretrained(tmp_path)
    return cfg, str(tmp_path)


def _built_params(cfg):
    """Parameters of the model transformers builds from ``cfg`` (on the meta device: no memory),
    tied weights counted once."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


# ---- each kind of layer is planned as what it is --------------------------------------------------

def test_qwen3_next_linear_attention_layers_are_not_planned_as_attention(tmp_path, capsys):
    # Qwen3-Next-80B-A3B (transformers' defaults): 36 of 48 layers are gated DeltaNet linear
    # attention. plan used to list 48 flash_attention layers and no "not covered" line for them.
    _, path = _saved(tmp_path, "qwen3_next")
    p = plan(path)
    assert _row(p, "attention prefill").count == 12 and _row(p, "attention decode").count == 12
    assert p.kv_bytes_per_token == 2 * 12 * 2 * 256 * 2  # 12 attention layers, 2 KV heads of 256, bf16
    assert p.facts.mixer_counts() == {"gated_deltanet": 36, "full_attention": 12}
    # instead of a KV cache, a fixed state per sequence: 32 value heads x [128, 128] and the causal
    # conv's last 3 inputs of q/k/v (2 x 2048 + 4096 channels), bf16
    assert p.state_bytes_per_sequence == 36 * (32 * 128 * 128 + 8192 * 3) * 2
    delta = _row(p, "gated DeltaNet + conv1d")
    assert delta.count == 36 and delta.impl == "torch" and delta.kernelset_op is None
    assert any(n.startswith("gated DeltaNet + conv1d") and "no linear-attention kernel" in n for n in p.not_covered)
    assert _row(p, "QKV projection").logical == "QKV projection + output gate"  # q_proj is 2x wide
    assert cli.main(["plan", "--model", path]) == 0
    out = capsys.readouterr().out
    assert "layers: 36 gated_deltanet, 12 full_attention" in out
    assert "not covered by kernelset yet" in out and "(36 of 48 layers)" in out


def test_jamba_mamba_layers_have_no_kv_cache_and_their_own_parameters(tmp_path):
    # Jamba-v0.1: attention every 8th layer (4 of 32), Mamba in the other 28, experts every other
    # layer. plan used to count 32 attention layers: 92B parameters instead of ~52B and a KV
    # cache for 28 layers that keep none.
    _, path = _saved(tmp_path, "jamba")
    for spec in (path, "jamba-v0.1"):
        p = plan(spec)
        assert abs(p.params / 51.57e9 - 1) < 0.001  # Jamba-v0.1: 52B parameters (51.57B)
        assert p.kv_bytes_per_token == 2 * 4 * 8 * 128 * 2
        assert _row(p, "attention prefill").count == 4
        assert p.facts.mixer_counts() == {"mamba": 28, "full_attention": 4}
        assert p.facts.ffn_counts() == {"dense": 16, "moe": 16}
        assert _row(p, "Mamba selective scan").count == 28
        assert not any(r.logical.startswith("rotary") for r in p.rows)  # Jamba's attention has no RoPE
        assert any("no selective-scan (SSM) kernel" in n for n in p.not_covered)


def test_mamba_config_without_attention_heads_is_planned(tmp_path, capsys):
    # a Mamba config has no num_attention_heads: plan used to refuse it
    _, path = _saved(tmp_path, "mamba", hidden_size=2560, num_hidden_layers=64, vocab_size=50280)
    assert cli.main(["plan", "--model", path]) == 0, capsys.readouterr().err
    assert "Mamba selective scan + conv1d" in capsys.readouterr().out
    p = plan(path)
    assert p.facts.mixer_counts() == {"mamba": 64} and p.facts.heads == 0
    assert p.kv_bytes_per_token == 0 and p.state_bytes_per_sequence == 64 * (5120 * 16 + 5120 * 3) * 2
    assert not any("attention" in r.logical for r in p.rows)
    assert _row(p, "decoder norms").count == 64 + 1  # one RMSNorm per layer, one final
    assert abs(p.params / 2.768e9 - 1) < 0.001  # mamba-2.8b
    assert "no attention" in p.table() and "no KV cache" in p.table()


def test_mamba2_config_saved_by_transformers_is_read_as_saved(tmp_path):
    # save_pretrained writes time_step_limit's infinity as {"__float__": "Infinity"}; plan handed the
    # tag back to transformers, whose validation rejected it, and repeated its error
    _, path = _saved(tmp_path, "mamba2")
    assert "__float__" in (tmp_path / "config.json").read_text()
    p = plan(path)
    assert p.facts.mixer_counts() == {"mamba2": 64}
    assert abs(p.params / 7.285e9 - 1) < 0.001 and p.kv_bytes_per_token == 0


def test_mamba2_config_transformers_rejects_gets_plans_own_message(tmp_path, capsys):
    pytest.importorskip("transformers")
    tag = {"__float__": "Infinity"}
    # stating the width but not the heads: transformers' defaults (128 heads of 64) cannot split a
    # 768-wide model's 1536-wide mixer, so its validation refuses the config; plan says why in its words
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mamba2", "hidden_size": 768, "num_hidden_layers": 24,
                                "vocab_size": 50280, "time_step_limit": [0.0, tag]}))
    with pytest.raises(ValueError) as err:
        plan(str(path))
    msg = str(err.value)
    assert cli.main(["plan", "--model", str(path)]) == 2 and msg in capsys.readouterr().err
    assert "inconsistent" in msg and "1536 wide" in msg and "num_heads, head_dim are not in the config" in msg
    assert "Validation" not in msg and "Strict" not in msg and "__float__" not in msg
    # with the heads stated, the fields left out are transformers' defaults and the config plans
    path.write_text(json.dumps({"model_type": "mamba2", "hidden_size": 768, "num_hidden_layers": 24,
                                "vocab_size": 50280, "num_heads": 24, "time_step_limit": [0.0, tag]}))
    p = plan(str(path))
    assert p.facts.ssm["mamba2"]["state"] == 128 and p.facts.ssm["mamba2"]["head_dim"] == 64


GEMMA3_VISION = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
                 "image_size": 896, "patch_size": 14, "vision_use_head": False, "model_type": "siglip_vision_model"}


def test_gemma3_multimodal_plans_the_vision_tower(tmp_path):
    # google/gemma-3-4b-it: the language model plus a 27-layer SigLIP vision tower; plan used to
    # plan the text model alone and never mention the tower
    text = {"hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34, "num_attention_heads": 8,
            "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262208, "sliding_window": 1024}
    cfg, path = _saved(tmp_path, "gemma3", text_config=text, vision_config=GEMMA3_VISION)
    p = plan(path)
    tower = _row(p, "vision tower (siglip_vision_model)")
    assert tower.impl == "torch" and any(n.startswith("vision tower") for n in p.not_covered)
    assert p.facts.towers["vision_config"]["layers"] == 27
    assert "vision tower siglip_vision_model (27 layers, hidden 1152)" in p.table()
    assert abs(p.params / 4.3e9 - 1) < 0.01  # Gemma 3 4B: 4.3B with the vision tower
    assert p.params == _built_params(cfg)


# ---- parameters: plan's count equals the model transformers builds -------------------------------

BASE = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
            vocab_size=128)
# (model_type, config values): every layer kind and option the family has that changes its
# parameters, at toy size
TOYS = {
    # linear attention in alternate layers, experts with a shared expert, one dense layer (mlp_only_layers)
    "qwen3_next": ("qwen3_next", dict(BASE, num_hidden_layers=4, layer_types=["linear_attention", "full_attention"] * 2,
                                      num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                      shared_expert_intermediate_size=64, mlp_only_layers=[2],
                                      linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                                      linear_value_head_dim=8)),
    "qwen3_5_text": ("qwen3_5_text", dict(BASE, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
                                          linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                                          linear_value_head_dim=8)),
    "qwen3_5_moe_text": ("qwen3_5_moe_text", dict(BASE, num_hidden_layers=2,
                                                  layer_types=["linear_attention", "full_attention"], num_experts=4,
                                                  num_experts_per_tok=2, moe_intermediate_size=32,
                                                  shared_expert_intermediate_size=64, linear_num_key_heads=2,
                                                  linear_num_value_heads=4, linear_key_head_dim=16,
                                                  linear_value_head_dim=8)),
    # Mamba and attention layers, each with and without experts (with the dt/B/C RMSNorms of Jamba's Mamba)
    "jamba": ("jamba", dict(BASE, num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                            expert_layer_offset=0, num_experts=4, num_experts_per_tok=2, mamba_d_state=8,
                            mamba_dt_rank=8)),
    "mamba": ("mamba", dict(hidden_size=64, num_hidden_layers=2, vocab_size=128, state_size=8, time_step_rank=8)),
    "mamba+bias": ("mamba", dict(hidden_size=64, num_hidden_layers=2, vocab_size=128, use_bias=True,
                                 use_conv_bias=False, tie_word_embeddings=False)),
    "falcon_mamba": ("falcon_mamba", dict(hidden_size=64, num_hidden_layers=2, vocab_size=128, state_size=8)),
    "mamba2": ("mamba2", dict(hidden_size=64, num_hidden_layers=2, vocab_size=128, num_heads=8, head_dim=16,
                              n_groups=2, state_size=16)),
    "bamba": ("bamba", dict(BASE, num_hidden_layers=3, attn_layer_indices=[1], mamba_n_heads=8, mamba_d_state=16,
                            mamba_n_groups=2)),
    # attention and Mamba-2 side by side in every layer; its mixer's norm and biases are options
    "falcon_h1": ("falcon_h1", dict(BASE, num_hidden_layers=2, mamba_d_ssm=96, mamba_n_heads=6, mamba_d_state=16,
                                    mamba_n_groups=2, mamba_rms_norm=True)),
    "falcon_h1+bias": ("falcon_h1", dict(BASE, num_hidden_layers=2, mamba_d_ssm=None, mamba_n_heads=8,
                                         mamba_d_state=16, mamba_n_groups=2, projectors_bias=True,
                                         mamba_proj_bias=True)),
    "granitemoehybrid": ("granitemoehybrid", dict(BASE, num_hidden_layers=2, layer_types=["mamba", "attention"],
                                                  mamba_n_heads=8, mamba_d_state=16, num_local_experts=4,
                                                  num_experts_per_tok=2, shared_intermediate_size=96)),
    "granitemoehybrid-dense": ("granitemoehybrid", dict(BASE, num_hidden_layers=2, layer_types=["mamba", "attention"],
                                                        mamba_n_heads=8, mamba_d_state=16, num_local_experts=0,
                                                        shared_intermediate_size=96)),
    # one block per layer: Mamba-2, experts, attention or a (non-gated relu2) MLP
    "nemotron_h": ("nemotron_h", dict(BASE, layers_block_type=["linear_attention", "moe", "full_attention", "mlp"],
                                      mamba_num_heads=8, mamba_head_dim=16, n_groups=2, ssm_state_size=16,
                                      n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                      moe_shared_expert_intermediate_size=48)),
    "nemotron_h+latent": ("nemotron_h", dict(BASE, layers_block_type=["linear_attention", "moe"], mamba_num_heads=8,
                                             mamba_head_dim=16, n_groups=2, ssm_state_size=16, n_routed_experts=4,
                                             num_experts_per_tok=2, moe_intermediate_size=32, moe_latent_size=24,
                                             moe_shared_expert_intermediate_size=48, mlp_bias=True)),
    # short convolutions and attention; the MLP resizes itself (2/3, rounded to block_multiple_of)
    "lfm2": ("lfm2", dict(BASE, num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"],
                          block_multiple_of=16)),
    # a vision tower (SigLIP with and without its pooling head) and the projector into the text model
    "gemma3": ("gemma3", dict(text_config=dict(BASE, num_hidden_layers=2, vocab_size=300),
                              vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                                 num_attention_heads=2, image_size=28, patch_size=7,
                                                 vision_use_head=False), mm_tokens_per_image=4)),
    "gemma3+head": ("gemma3", dict(text_config=dict(BASE, num_hidden_layers=2, vocab_size=300),
                                   vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                                      num_attention_heads=2, image_size=28, patch_size=7),
                                   mm_tokens_per_image=4)),
    # attention biases on q/k/v and o (Qwen2 has them on q/k/v only, gpt-oss everywhere: the presets)
    "llama+bias": ("llama", dict(BASE, num_hidden_layers=2, attention_bias=True, mlp_bias=True)),
}


@pytest.mark.parametrize("name", sorted(TOYS))
def test_parameter_count_equals_the_built_model(name, tmp_path):
    model_type, values = TOYS[name]
    cfg, path = _saved(tmp_path, model_type, **values)
    p = plan(path)
    assert p.params == _built_params(cfg), [(x.name, x.params) for x in p.parts]
    assert p.params == sum(x.params for x in p.parts) and all(x.exact for x in p.parts)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_parameter_count_equals_the_built_model_for_every_tiny_preset(name):
    # every preset's families (Llama, Qwen3, Qwen3-MoE, Mixtral, DeepSeek-V3's MLA, gpt-oss, Gemma,
    # and the hybrids) at toy size, their structure kept
    transformers = pytest.importorskip("transformers")
    values = tiny(name)
    cfg = transformers.AutoConfig.for_model(values.pop("model_type"), **values)
    assert plan(tiny(name)).params == _built_params(cfg)


def test_every_checked_family_is_checked():
    from kernelset.hf.architecture import CHECKED_FAMILIES
    tested = {mt for mt, _ in TOYS.values()} | {plan(tiny(n)).facts.model_type for n in PRESETS}
    assert set(CHECKED_FAMILIES) <= tested, set(CHECKED_FAMILIES) - tested
    assert {mt for mt, _ in TOYS.values()} <= set(CHECKED_FAMILIES)


@pytest.mark.parametrize("name,params,mixers", [
    ("jamba-v0.1", 51.57e9, {"mamba": 28, "full_attention": 4}),
    ("qwen3-next-80b-a3b", 79.67e9, {"gated_deltanet": 36, "full_attention": 12}),  # "80B"
    ("mamba-2.8b", 2.768e9, {"mamba": 64}),
    ("mamba-codestral-7b", 7.285e9, {"mamba2": 64}),  # "7.3B"
    ("lfm2-1.2b", 1.170e9, {"short_conv": 10, "full_attention": 6}),
])
def test_hybrid_presets_full_size(name, params, mixers):
    p = plan(name)
    assert abs(p.params / params - 1) < 0.001 and p.facts.mixer_counts() == mixers
    assert p.kv_bytes_per_token == 2 * p.facts.attention_layers * p.facts.kv_heads * p.facts.head_dim * 2


# ---- the per-layer-type breakdown and what plan does not know -----------------------------------

def test_breakdown_by_kind_of_layer_in_table_and_json(capsys):
    p = plan("jamba-v0.1")
    names = [x.name for x in p.parts]
    assert names == ["token embedding + LM head", "Mamba mixer", "attention (full_attention)", "dense MLP",
                     "MoE (16 experts)", "layer norms"]
    table = p.table()
    assert "parameters by block:" in table and "layers: 28 mamba, 4 full_attention; feed-forward: 16 dense, 16 moe" \
        in table
    assert cli.main(["plan", "--model", "jamba-v0.1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layers"] == {"mixers": {"mamba": 28, "full_attention": 4}, "ffn": {"dense": 16, "moe": 16}}
    assert sum(x["params"] for x in out["parameters"]) == out["params"]
    assert out["state_bytes_per_sequence"] == 28 * (8192 * 16 + 8192 * 3) * 2


def test_a_layer_kind_plan_does_not_model_is_said_not_planned_as_attention():
    # a hybrid plan has no formula for (MiniMax's lightning attention, Kimi's delta attention, ...):
    # its layers are named, left out of the KV cache and the count, and the plan says so
    cfg = dict(BASE, model_type="some_hybrid", num_hidden_layers=4,
               layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"])
    p = plan(cfg)
    assert _row(p, "attention prefill").count == 1 and p.kv_bytes_per_token == 2 * 1 * 2 * 16 * 2
    assert p.facts.mixer_counts() == {"linear_attention": 3, "full_attention": 1}
    assert _row(p, "linear_attention mixer").count == 3
    assert any(n.startswith("linear_attention mixer") for n in p.not_covered)
    assert any("linear_attention mixer (3) not counted" in n for n in p.notes)
    assert any("not for 'some_hybrid'" in n for n in p.notes)  # not among the checked families
    assert "not counted" in p.table()


def test_hybrid_presets_plan_without_transformers(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "transformers", None)  # import transformers -> ImportError
    for name in ("jamba-v0.1", "qwen3-next-80b-a3b", "mamba-2.8b", "mamba-codestral-7b", "lfm2-1.2b"):
        assert plan(name).params > 0


def test_training_does_not_claim_fused_layers_for_hybrids():
    # kernelize's fused training layer (norms inside qkv_rope and gated_mlp) is an attention + MLP
    # layer; a hybrid's norms stay separate calls
    lfm2 = dict(BASE, model_type="lfm2", num_hidden_layers=2, layer_types=["conv", "full_attention"], conv_L_cache=3)
    norms = _row(plan(lfm2, mode="training"), "decoder norms")
    assert "inside qkv_rope" not in norms.why
    assert "inside qkv_rope" in _row(plan("llama-3-8b", mode="training"), "decoder norms").why
