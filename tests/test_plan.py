"""ksctl plan --model and the GPU table: derived from config values only, no GPU, no transformers."""
import json
import math

import pytest
import torch

from kernelset import cli
from kernelset.core import gpus
from kernelset.hf import planning as planmod
from kernelset.hf.planning import load_config, plan
from kernelset.hf.presets import FAMILY_PRESETS, PRESETS, preset


def _row(p, startswith):
    rows = [r for r in p.rows if r.logical.startswith(startswith)]
    assert rows, f"no row starting with {startswith!r}: {[r.logical for r in p.rows]}"
    return rows[0]


# ---- the GPU table -------------------------------------------------------------------------------

@pytest.mark.parametrize("key,sm", [("t4", (7, 5)), ("a10", (8, 6)), ("a100", (8, 0)), ("l4", (8, 9)),
                                    ("rtx4090", (8, 9)), ("h100", (9, 0)), ("h200", (9, 0)), ("b200", (10, 0)),
                                    ("rtx5090", (12, 0)), ("rtx-pro-6000", (12, 0))])
def test_gpu_table_sm(key, sm):
    assert gpus.gpu(key).arch == sm


def test_gpu_features_follow_the_arch():
    assert not gpus.gpu("T4").features.bf16 and gpus.gpu("a10").features.bf16
    assert not gpus.gpu("A100").features.fp8 and gpus.gpu("L4").features.fp8 and gpus.gpu("RTX 4090").features.fp8
    h100 = gpus.gpu("h100").features
    assert h100.tma and h100.wgmma and not h100.tcgen05 and h100.smem_per_block_kib == 227
    b200 = gpus.gpu("b200").features
    assert b200.tma and b200.tcgen05 and b200.fp4 and not b200.wgmma  # wgmma is sm_90a only
    assert not gpus.gpu("rtx5090").features.wgmma and gpus.gpu("rtx5090").features.fp4
    assert gpus.arch_features((8, 7)).smem_per_sm_kib == gpus.ARCHS[(8, 6)].smem_per_sm_kib  # Orin -> sm_86 data
    assert gpus.arch_features((10, 3)).tcgen05
    assert gpus.gpu("h200").bandwidth_gbs > gpus.gpu("h100").bandwidth_gbs > gpus.gpu("a100").bandwidth_gbs
    with pytest.raises(ValueError, match="known: t4"):
        gpus.gpu("v100x")


def test_for_device_without_cuda_is_none():
    import torch
    if not torch.cuda.is_available():
        assert gpus.for_device(0) is None


# ---- presets and config loading -----------------------------------------------------------------

def test_at_least_30_presets_and_every_family_has_one():
    assert len(PRESETS) >= 30
    assert set(FAMILY_PRESETS.values()) <= set(PRESETS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_plans_on_every_gpu(name):
    for g in gpus.GPUS:
        p = plan(name, gpu=g.key)
        assert p.rows and p.params > 0
        assert json.loads(json.dumps(p.to_dict()))["gpu"]["sm"] == g.sm


def test_config_json_and_directory_equal_the_preset(tmp_path):
    cfg = preset("qwen3-8b")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    a, b, c = plan("qwen3-8b"), plan(str(tmp_path / "config.json")), plan(str(tmp_path))
    assert [r.logical for r in a.rows] == [r.logical for r in b.rows] == [r.logical for r in c.rows]
    assert a.params == b.params == c.params
    nested = {"model_type": "gemma3", "text_config": preset("gemma-3-27b"), "vision_config": {}}
    (tmp_path / "mm.json").write_text(json.dumps(nested))
    got, _ = load_config(str(tmp_path / "mm.json"))
    assert got["hidden_size"] == 5376
    with pytest.raises(ValueError, match="neither a preset"):
        load_config(str(tmp_path / "missing.json"))


# ---- what plan derives ---------------------------------------------------------------------------

def test_dense_model_llama3_8b_on_h100():
    p = plan("llama-3-8b", gpu="h100", dtype="bf16")
    assert abs(p.params / 8.03e9 - 1) < 0.01  # Llama-3-8B has 8.03B parameters
    assert p.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    norm = _row(p, "decoder norms")
    assert (norm.kernelset_op, norm.impl, norm.count) == ("rms_norm", "triton", 65)
    assert _row(p, "gated activation").kernelset_op == "swiglu"
    assert _row(p, "rotary embedding").kernelset_op == "apply_rotary"
    assert _row(p, "QKV projection").impl == "torch"
    assert any(n.startswith("QKV projection") for n in p.not_covered)
    assert not p.degraded and p.gemm_dtype == "bf16"
    assert "GQA 4" in p.table()


def test_gqa_with_rope_scaling_llama31():
    p = plan("llama-3.1-8b", gpu="a100")
    f = p.facts
    assert (f.heads, f.kv_heads, f.head_dim) == (32, 8, 128)
    assert f.rope["type"] == "llama3" and f.rope["factor"] == 8.0 and f.rope["theta"] == 500000.0
    assert "rope llama3 x8.0" in p.table()
    assert "shape" in p.to_dict()["ops"][0]


def test_moe_model_mixtral():
    p = plan("mixtral-8x7b", gpu="h100")
    f = p.facts
    assert (f.experts, f.experts_per_tok, f.moe_layers) == (8, 2, 32)
    assert abs(p.params / 46.7e9 - 1) < 0.01  # Mixtral-8x7B: 46.7B parameters
    assert any("expert GEMMs" in n for n in p.not_covered)
    assert _row(p, "expert gated activation").kernelset_op == "silu_and_mul"
    assert not p.weight_gb <= p.gpu.memory_gib * 1.0737  # 93 GB of bf16 weights do not fit in 80 GiB
    assert "does NOT fit" in p.table()


def test_mla_model_deepseek_v3():
    p = plan("deepseek-v3", gpu="h200")
    f = p.facts
    assert f.mla == {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                     "v_head_dim": 128}
    assert f.head_dim == 192 and f.rotary_dim == 64 and f.dense_layers == 3 and f.moe_layers == 58
    assert abs(p.params / 671e9 - 1) < 0.02  # DeepSeek-V3: 671B parameters
    assert p.kv_bytes_per_token == 61 * (512 + 64) * 2  # the latent cache
    assert "interleaved" in _row(p, "rope on the rope part").logical
    assert any(n.startswith("MLA projections") for n in p.not_covered)


def test_family_traits_reach_the_plan():
    gemma = plan("gemma-2-9b")
    assert "(1 + w)" in _row(gemma, "decoder norms").logical and _row(gemma, "decoder norms").count == 4 * 42 + 1
    assert "softcap 50.0" in _row(gemma, "attention prefill").why and gemma.facts.sliding_layers == 21
    assert _row(plan("qwen3-8b"), "per-head q/k RMSNorm").count == 2 * 36
    assert _row(plan("gpt-oss-20b"), "expert gated activation").kernelset_op == "swiglu_oai"
    assert plan("gemma-3-1b").facts.sliding_layers == 26 - 4  # every 6th layer is global
    assert plan("phi-3-mini-4k").rows[-2].logical == "LM head"


@pytest.mark.parametrize("gpu,dtype,gemm,degrades", [
    ("a100", "fp8", "bf16", True),  # no fp8 tensor cores before sm_89
    ("h100", "fp8", "fp8", False),
    ("l4", "fp8", "fp8", False),
    ("t4", "bf16", "fp16", True),  # Turing has no bf16
    ("a10", "int8", "int8", False),
    ("h100", "w4a16", "w4a16", True),  # weight-only: said, even where it runs
])
def test_degraded_precision(gpu, dtype, gemm, degrades):
    p = plan("llama-3-8b", gpu=gpu, dtype=dtype)
    assert p.gemm_dtype == gemm
    assert bool(p.degraded) == degrades
    if dtype == "fp8" and degrades:
        assert "no fp8 tensor cores" in p.degraded[0] and math.isclose(p.weight_gb, p.params * 2 / 1e9)


def test_training_mode_rows():
    p = plan("llama-3.2-1b", mode="training")
    logical = [r.logical for r in p.rows]
    assert "optimizer (AdamW, fp32 states)" in logical and "gradient clipping" in logical
    assert any(r.kernelset_op in ("linear_cross_entropy", "cross_entropy") for r in p.rows)


def test_dispatcher_arch_range_is_honoured(monkeypatch):
    # an implementation whose arch range excludes the target is rejected with its reason
    from kernelset.core import registry
    from kernelset.core.arch import ArchRange
    impls = list(registry._IMPLS["rms_norm"])
    import dataclasses
    monkeypatch.setitem(registry._IMPLS, "rms_norm", [dataclasses.replace(impls[0], arch=ArchRange(min=(9, 0)))]
                        + impls[1:])
    import torch
    assert planmod.choose("rms_norm", {"tokens": 8, "hidden": 4096}, torch.bfloat16, gpus.gpu("a100")).impl == \
        "reference"
    assert planmod.choose("rms_norm", {"tokens": 8, "hidden": 4096}, torch.bfloat16, gpus.gpu("h100")).impl == \
        "triton"


def test_bad_arguments():
    with pytest.raises(ValueError, match="dtype must be one of"):
        plan("llama-3-8b", dtype="fp6")
    with pytest.raises(ValueError, match="unknown GPU"):
        plan("llama-3-8b", gpu="tpu")
    # --tokens -5 used to reach torch.empty and end in a RuntimeError traceback
    for bad in (0, -5):
        with pytest.raises(ValueError, match="tokens must be a positive integer"):
            plan("llama-3-8b", tokens=bad)


# Gemma 3's config.json on the hub states in its text_config only what differs from the 4B model
# (no heads, kv heads, head_dim or vocab_size): plan used to end in KeyError 'num_attention_heads'
# (a traceback from ksctl). The missing fields come from transformers' config class, as the model
# itself would read them.
GEMMA3_4B_HUB = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                 "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                                 "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                                 "sliding_window": 1024},
                 "vision_config": {"model_type": "siglip_vision_model"}}


def test_partial_text_config_gets_the_model_types_defaults(tmp_path):
    pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GEMMA3_4B_HUB))
    p = plan(str(path))
    f = p.facts
    assert (f.heads, f.kv_heads, f.head_dim, f.vocab, f.layers) == (8, 4, 256, 262208, 34)
    assert f.sliding_window == 1024 and f.sliding_layers == 29  # 5 sliding : 1 global over 34 layers
    assert f.rope["type"] == "linear" and f.rope["factor"] == 8.0
    assert json.loads(json.dumps(p.to_dict()))["facts"]["head_dim"] == 256


def test_missing_fields_without_transformers_get_a_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(__import__("sys").modules, "transformers", None)  # import transformers -> ImportError
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GEMMA3_4B_HUB))
    with pytest.raises(ValueError, match="no num_attention_heads, vocab_size .*transformers is not installed"):
        plan(str(path))
    assert cli.main(["plan", "--model", str(path)]) == 2
    assert "no num_attention_heads" in capsys.readouterr().err


# ---- the command line ----------------------------------------------------------------------------

def test_cli_plan_model_json(capsys):
    assert cli.main(["plan", "--model", "qwen3-30b-a3b", "--gpu", "a100", "--dtype", "fp8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpu"]["sm"] == "sm_80" and out["degraded"] and out["facts"]["experts"] == 128
    assert {r["kernelset_op"] for r in out["ops"]} >= {"rms_norm", "apply_rotary", "silu_and_mul"}


def test_cli_plan_table_list_and_errors(capsys):
    assert cli.main(["plan", "--model", "gemma-3-27b", "--gpu", "rtx-pro-6000"]) == 0
    out = capsys.readouterr().out
    assert "sm_120" in out and "logical op" in out
    assert cli.main(["plan", "--list"]) == 0
    out = capsys.readouterr().out
    assert "llama-3.1-8b" in out and "rtx5090" in out
    assert cli.main(["plan", "--model", "no-such-model"]) == 2


def test_cli_plan_without_model_keeps_the_dispatch_plan(capsys):
    assert cli.main(["plan"]) == 0
    assert "dispatch plan on" in capsys.readouterr().out


def test_plan_names_the_mla_kernel_per_gpu():
    """The chosen implementation's detail reaches the plan: on an H100 MLA decode is the sm_90
    Gluon kernel (where Gluon imports here), on an A100 the Triton kernel with the reason."""
    from kernelset.core import config
    from kernelset.ops.mla import launch as mla_launch
    with config.override(triton_interpret=False):
        h100 = _row(plan("deepseek-v3", gpu="h100"), "MLA decode").why
        a100 = _row(plan("deepseek-v3", gpu="a100"), "MLA decode").why
    gluon = mla_launch._wgmma_module() is not None
    assert ("kernel: warp-specialized Gluon wgmma" if gluon else "kernel: Triton tl.dot") in h100
    assert "kernel: Triton tl.dot (the sm_90 Gluon kernel needs sm_90" in a100


@pytest.mark.parametrize("gpu", ["h100", "h200", "a100", "l4"])
def test_plan_details_describe_the_named_gpu(gpu):
    """Every chosen implementation's detail is computed for the GPU the plan names, never from
    this machine's device (none here): no detail raises. An H200-class sm_90 GPU takes the RMSNorm
    ring forward at 65536 columns, an H100 the looped one."""
    from kernelset.core.gpus import gpu as gpu_named
    from kernelset.hf.planning import choose
    for name in ("llama-3-8b", "qwen3-8b", "deepseek-v3"):
        table = plan(name, gpu=gpu).table()
        assert "detail() raised" not in table, (name, gpu)
    why = choose("rms_norm", {"tokens": 8, "hidden": 65536}, torch.bfloat16, gpu_named(gpu)).why
    assert "detail() raised" not in why
    from kernelset.ops.common import ring_host
    gluon = ring_host.gluon_kernel("kernelset.ops.norm.ring_sm90", "_rms_ring_fwd_kernel")[0] is not None
    if gpu == "h200" and gluon:
        assert "kernels: ring forward on sm_90 (Gluon: 4 programs of 16384 columns per row" in why, why
    else:
        assert "kernels: looped forward; split backward" in why, why
    # the LM head's loss in training: the cross-entropy ring on SXM-class sm_90 GPUs (one launch for both since 2026-11-27)
    lce = [line for line in plan("llama-3-8b", gpu=gpu, mode="training").table().splitlines()
           if "linear_cross_entropy" in line]
    assert len(lce) == 1 and "chunks of 1024 tokens (250 MiB of logits" in lce[0], lce
    ce_gluon = ring_host.gluon_kernel("kernelset.ops.loss.ring_sm90", "_ce_ring_kernel")[0] is not None
    ring_says = {"h200": "ring kernel on sm_90 (Gluon: 8 programs of 16384 logits per row",
                 "h100": "ring kernel on sm_90 (Gluon: 8 programs of 16384 logits per row"}
    if gpu in ring_says and ce_gluon:
        assert ring_says[gpu] in lce[0], lce[0]
    else:
        assert "cross-entropy: the looped kernel" in lce[0], lce[0]


def test_runtime_hardware_checks_read_the_gpu_table(monkeypatch):
    """The dispatcher's fp8-cache checks and the sm_90 Gluon kernels' gates read gpus.ARCHS (the
    table ksctl plan prints), not their own arch numbers: editing the table moves them."""
    import dataclasses

    from kernelset.core import gpus
    from kernelset.ops.common import ring_host
    from kernelset.ops.kvcache import backends as kv

    class P(dict):
        arch = (8, 9)

    fp8_cache = P(cache_dtype="float8_e4m3fn")
    cuda = torch.device("cuda", 0)
    assert kv._fp8_reason(fp8_cache) is None and ring_host.on_sm90(cuda, (9, 0)) and not ring_host.on_sm90(cuda, (10, 0))
    P.arch = (8, 6)
    assert "needs sm_89 or newer (device is sm_86)" in kv._fp8_reason(fp8_cache)
    table = dict(gpus.ARCHS)
    table[(8, 6)] = dataclasses.replace(table[(8, 6)], fp8=True)
    table[(9, 0)] = dataclasses.replace(table[(9, 0)], wgmma=False)
    monkeypatch.setattr(gpus, "ARCHS", table)
    assert kv._fp8_reason(fp8_cache) is None
    assert not ring_host.on_sm90(cuda, (9, 0))
