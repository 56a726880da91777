"""rope_cache against transformers: inv_freq and attention scaling equal to ROPE_INIT_FUNCTIONS (bit for
bit), cos/sin equal to the models' rotary modules, and rotary_embedding / apply_rotary with the built
tables equal to transformers' apply_rotary_pos_emb. The transformers tests skip where it is not
installed (the GPU image); the rest run everywhere."""
from __future__ import annotations

import logging

import pytest
import torch

import kernelset as ks
from kernelset.core.registry import impls
from kernelset.core.tolerance import rel_err

BACKENDS = [str(i.backend) for i in impls("rotary_embedding")]
N_POS = 512  # table length in the tests (real tables are max_position_embeddings long)


def _hf():
    tf = pytest.importorskip("transformers", reason="transformers is not installed (e.g. the GPU image)")
    logging.getLogger("transformers").setLevel(logging.ERROR)  # validation warnings about test configs
    return tf


def _phi3_factors():
    """Phi-3-mini-128k-like LongRoPE factors (48 = head_dim 96 / 2): short near 1, long growing to ~20."""
    short = [round(1.0 + 0.01 * i + 0.0004 * i * i, 4) for i in range(48)]
    long = [round(1.0 + 0.05 * i + 0.0075 * i * i, 4) for i in range(48)]
    return short, long


def _case(name):
    """(config, model module name, rotary class name, transformers rope type) for a real-looking model."""
    tf = _hf()
    if name == "llama3.1":  # Llama-3.1-8B
        cfg = tf.LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                             max_position_embeddings=131072, rope_theta=500000.0,
                             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
        return cfg, "llama", "LlamaRotaryEmbedding", "llama3"
    if name == "qwen2-yarn":  # Qwen2.5-7B-Instruct with the YaRN block its model card suggests
        cfg = tf.Qwen2Config(hidden_size=3584, num_attention_heads=28, num_key_value_heads=4,
                             max_position_embeddings=131072, rope_theta=1000000.0,
                             rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
        return cfg, "qwen2", "Qwen2RotaryEmbedding", "yarn"
    if name == "phi3-longrope":  # Phi-3-mini-128k-instruct: head_dim 96, original context 4096
        short, long = _phi3_factors()
        cfg = tf.Phi3Config(hidden_size=3072, num_attention_heads=32, max_position_embeddings=131072,
                            original_max_position_embeddings=4096, rope_theta=10000.0,
                            rope_scaling={"type": "longrope", "short_factor": short, "long_factor": long})
        return cfg, "phi3", "Phi3RotaryEmbedding", "longrope"
    if name == "linear":  # a Llama-2 stretched 4x by position interpolation
        cfg = tf.LlamaConfig(hidden_size=4096, num_attention_heads=32, max_position_embeddings=16384,
                             rope_scaling={"rope_type": "linear", "factor": 4.0})
        return cfg, "llama", "LlamaRotaryEmbedding", "linear"
    if name == "dynamic":  # dynamic NTK on a 4k Llama-2
        cfg = tf.LlamaConfig(hidden_size=4096, num_attention_heads=32, max_position_embeddings=4096,
                             rope_scaling={"rope_type": "dynamic", "factor": 2.0})
        return cfg, "llama", "LlamaRotaryEmbedding", "dynamic"
    if name == "qwen3-default":  # Qwen3-8B: head_dim 128, theta 1e6, no scaling
        cfg = tf.Qwen3Config(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                             max_position_embeddings=40960, rope_theta=1000000.0)
        return cfg, "qwen3", "Qwen3RotaryEmbedding", "default"
    if name == "phi3-partial":  # partial rotary: 48 of 96 features rotate
        cfg = tf.Phi3Config(hidden_size=3072, num_attention_heads=32, max_position_embeddings=4096,
                            partial_rotary_factor=0.5)
        return cfg, "phi3", "Phi3RotaryEmbedding", "default"
    raise AssertionError(name)


CASES = ["llama3.1", "qwen2-yarn", "phi3-longrope", "linear", "dynamic", "qwen3-default", "phi3-partial"]


def _module(name):
    import importlib
    cfg, model, cls, kind = _case(name)
    mod = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    return cfg, getattr(mod, cls)(cfg), mod.apply_rotary_pos_emb, kind


@pytest.mark.parametrize("name", CASES)
def test_inv_freq_and_scaling_equal_transformers(name):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    cfg, rotary, _, kind = _module(name)
    want, att = (rotary.inv_freq, rotary.attention_scaling) if kind == "default" else ROPE_INIT_FUNCTIONS[kind](cfg)
    got = ks.rope_cache(cfg, max_positions=N_POS)
    assert got.rope_type == kind and got.inv_freq.dtype == torch.float32
    assert torch.equal(got.inv_freq, want), (got.inv_freq - want).abs().max()
    assert got.attention_scaling == att
    assert got.rotary_dim == 2 * want.numel() and got.cos_sin_cache.shape == (N_POS, got.rotary_dim)
    if kind in ("yarn", "longrope"):
        assert got.attention_scaling > 1.0, "these configs scale cos/sin"


@pytest.mark.parametrize("name", CASES)
def test_tables_equal_the_rotary_module(name):
    """cos_sin_cache rows and cos_sin() equal the rotary module's cos/sin (scaling included)."""
    cfg, rotary, _, _ = _module(name)
    got = ks.rope_cache(cfg, max_positions=N_POS)
    pos = torch.randint(0, min(N_POS, 4096), (2, 37))  # below every original length: no dynamic update
    cos, sin = rotary(torch.ones(1), pos)
    half = got.rotary_dim // 2
    rows = got.cos_sin_cache[pos]
    assert torch.equal(rows[..., :half], cos[..., :half]) and torch.equal(rows[..., half:], sin[..., :half])
    assert all(torch.equal(a, b) for a, b in zip(got.cos_sin(pos), (cos, sin)))
    cos16, sin16 = rotary(torch.ones(1, dtype=torch.bfloat16), pos)
    assert all(torch.equal(a, b) for a, b in zip(got.cos_sin(pos, dtype=torch.bfloat16), (cos16, sin16)))


def _serving(x):
    """[B, H, S, D] -> [B * S, H, D] (token-major, as a server holds q and k)."""
    return x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[3]).clone()  # never a view of x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", CASES)
def test_rotary_embedding_with_the_cache_equals_transformers(name, backend, device):
    cfg, rotary, apply_fn, _ = _module(name)
    got = ks.rope_cache(cfg, max_positions=N_POS, device=device)
    b, s, hq, hk = 2, 5, 3, 1
    d = got.head_dim
    pos = torch.randint(0, N_POS, (b, s))
    q, k = torch.randn(b, hq, s, d), torch.randn(b, hk, s, d)
    want_q, want_k = apply_fn(q, k, *rotary(q, pos))
    sq, sk = _serving(q).to(device), _serving(k).to(device)
    ks.rotary_embedding(pos.reshape(-1).to(device), sq, sk, got.cos_sin_cache, backend=backend)
    assert rel_err(sq, _serving(want_q)) < 2e-6 and rel_err(sk, _serving(want_k)) < 2e-6
    # and transformers' layout through apply_rotary with cos_sin()
    cos, sin = got.cos_sin(pos.to(device))
    aq, ak = ks.apply_rotary(q.to(device), k.to(device), cos, sin, backend=backend)
    assert rel_err(aq, want_q) < 2e-6 and rel_err(ak, want_k) < 2e-6


def test_dynamic_ntk_depends_on_the_sequence_length():
    """transformers' dynamic rotary module recomputes inv_freq for seq_len = max(position) + 1 once
    that exceeds max_position_embeddings; rope_cache(seq_len=N) is that table."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    tf = _hf()
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
    cfg = tf.LlamaConfig(hidden_size=512, num_attention_heads=4, max_position_embeddings=256,
                         rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    init = ks.rope_cache(cfg)
    assert init.cos_sin_cache.shape[0] == 256 and init.seq_len is None
    assert torch.equal(init.inv_freq, ks.rope_cache(cfg, rope_type="default").inv_freq), "no scaling at init"
    assert torch.equal(ks.rope_cache(cfg, seq_len=200).inv_freq, init.inv_freq), "no scaling within the max"
    n = 400
    long = ks.rope_cache(cfg, seq_len=n)
    assert long.cos_sin_cache.shape[0] == n and long.seq_len == n
    assert torch.equal(long.inv_freq, ROPE_INIT_FUNCTIONS["dynamic"](cfg, seq_len=n)[0])
    assert not torch.allclose(long.inv_freq, init.inv_freq), "a longer sequence must lower the frequencies"
    rotary = LlamaRotaryEmbedding(cfg)
    pos = torch.arange(n)[None]
    q, k = torch.randn(1, 2, n, 128), torch.randn(1, 1, n, 128)
    want_q, want_k = apply_rotary_pos_emb(q, k, *rotary(q, pos))
    assert torch.allclose(rotary.inv_freq, long.inv_freq, rtol=1e-6, atol=0)  # its base is computed in fp32
    sq, sk = _serving(q), _serving(k)
    ks.rotary_embedding(pos[0], sq, sk, long.cos_sin_cache, backend="reference")
    assert rel_err(sq, _serving(want_q)) < 1e-5 and rel_err(sk, _serving(want_k)) < 1e-5


def test_longrope_picks_short_or_long_factors_by_length():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    cfg, rotary, apply_fn, _ = _module("phi3-longrope")
    short, long = ks.rope_cache(cfg, max_positions=8), ks.rope_cache(cfg, seq_len=4097, max_positions=8)
    assert torch.equal(ks.rope_cache(cfg, seq_len=4096, max_positions=8).inv_freq, short.inv_freq)
    assert torch.equal(short.inv_freq, ROPE_INIT_FUNCTIONS["longrope"](cfg)[0])
    assert torch.equal(long.inv_freq, ROPE_INIT_FUNCTIONS["longrope"](cfg, seq_len=4097)[0])
    assert not torch.equal(long.inv_freq, short.inv_freq)
    assert long.attention_scaling == short.attention_scaling > 1.0
    # a sequence longer than 4096 switches transformers' module to the long factors
    pos = torch.tensor([[0, 17, 1000, 4100]])
    q, k = torch.randn(1, 2, 4, 96), torch.randn(1, 1, 4, 96)
    want_q, want_k = apply_fn(q, k, *rotary(q, pos))
    assert torch.equal(rotary.inv_freq, long.inv_freq)
    table = ks.rope_cache(cfg, seq_len=4101)
    sq, sk = _serving(q), _serving(k)
    ks.rotary_embedding(pos[0], sq, sk, table.cos_sin_cache, backend="reference")
    assert rel_err(sq, _serving(want_q)) < 2e-6 and rel_err(sk, _serving(want_k)) < 2e-6


def test_yarn_variants_equal_transformers():
    """DeepSeek-style mscale / mscale_all_dim, an explicit attention_factor, truncate=False, beta values."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    tf = _hf()
    for extra in ({"mscale": 1.0, "mscale_all_dim": 0.707}, {"attention_factor": 1.25},
                  {"truncate": False}, {"beta_fast": 16, "beta_slow": 2}):
        params = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, **extra}
        cfg = tf.LlamaConfig(hidden_size=2048, num_attention_heads=32, max_position_embeddings=163840,
                             rope_theta=10000.0, rope_scaling=dict(params))
        inv, att = ROPE_INIT_FUNCTIONS["yarn"](cfg)
        got = ks.rope_cache(cfg, max_positions=4)
        assert torch.equal(got.inv_freq, inv) and got.attention_scaling == att, extra
        kw = ks.rope_cache(head_dim=64, rope_theta=10000.0, max_positions=4, max_position_embeddings=163840,
                           **{k: v for k, v in params.items() if k != "rope_type"}, rope_type="yarn")
        assert torch.equal(kw.inv_freq, inv) and kw.attention_scaling == att, "keywords only"


def test_proportional_equals_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    tf = _hf()
    cfg = tf.LlamaConfig(hidden_size=1024, num_attention_heads=4, head_dim=256,
                         rope_parameters={"rope_type": "proportional", "rope_theta": 1e6,
                                          "partial_rotary_factor": 0.25})
    inv, att = ROPE_INIT_FUNCTIONS["proportional"](cfg)
    got = ks.rope_cache(cfg, max_positions=16)
    assert torch.equal(got.inv_freq, inv) and got.rotary_dim == 256 and att == got.attention_scaling
    assert torch.equal(got.cos_sin_cache[:, 32:128], torch.ones(16, 96)), "the non-rotating angles: cos 1"


def test_gemma3_per_layer_parameters():
    tf = _hf()
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding
    cfg = tf.Gemma3TextConfig(hidden_size=2560, num_attention_heads=8, head_dim=256, max_position_embeddings=131072,
                              rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                               "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                  "rope_theta": 1000000.0}})
    rotary = Gemma3RotaryEmbedding(cfg)
    pos = torch.randint(0, 64, (1, 9))
    for layer in ("sliding_attention", "full_attention"):
        got = ks.rope_cache(cfg, layer_type=layer, max_positions=64)
        assert all(torch.equal(a, b) for a, b in zip(got.cos_sin(pos), rotary(torch.ones(1), pos, layer)))
    with pytest.raises(ValueError, match="layer_type"):
        ks.rope_cache(cfg, max_positions=4)


def test_config_forms_agree():
    """A transformers config, a config.json dict (old rope_scaling / new rope_parameters) and keywords."""
    tf = _hf()
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    as_json = {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072,
               "rope_theta": 500000.0, "rope_scaling": dict(scaling)}
    tables = [
        ks.rope_cache(tf.LlamaConfig(**as_json), max_positions=32),
        ks.rope_cache(as_json, max_positions=32),
        ks.rope_cache({"head_dim": 128, "max_position_embeddings": 131072,
                       "rope_parameters": {**scaling, "rope_theta": 500000.0}}, max_positions=32),
        ks.rope_cache(head_dim=128, rope_theta=500000.0, max_positions=32, **scaling),
    ]
    for t in tables[1:]:
        assert torch.equal(t.inv_freq, tables[0].inv_freq) and torch.equal(t.cos_sin_cache, tables[0].cos_sin_cache)


def test_keywords_without_transformers():
    """The formulas themselves, written out independently for the default and linear types."""
    t = ks.rope_cache(head_dim=64, rope_theta=10000.0, max_positions=10)
    inv = 1.0 / 10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    assert torch.allclose(t.inv_freq.double(), inv, rtol=1e-6)
    ang = torch.arange(10, dtype=torch.float64)[:, None] * inv
    assert torch.allclose(t.cos_sin_cache.double(), torch.cat([ang.cos(), ang.sin()], -1), atol=1e-6)
    lin = ks.rope_cache(head_dim=64, rope_type="linear", factor=4.0, max_positions=10)
    assert torch.allclose(lin.inv_freq * 4, t.inv_freq, rtol=1e-6)
    part = ks.rope_cache(head_dim=80, partial_rotary_factor=0.4, max_positions=3)
    assert part.rotary_dim == 32 and part.cos_sin_cache.shape == (3, 32) and part.head_dim == 80
    # deterministic: the same call twice gives the same bits
    assert torch.equal(ks.rope_cache(head_dim=64, max_positions=10).cos_sin_cache, t.cos_sin_cache)


def test_device_tables(device):
    """inv_freq is computed on the CPU wherever the table goes (as transformers does); cos/sin on the device."""
    cpu = ks.rope_cache(head_dim=128, rope_theta=500000.0, max_positions=300)
    dev = ks.rope_cache(head_dim=128, rope_theta=500000.0, max_positions=300, device=device)
    assert dev.cos_sin_cache.device.type == device.type and dev.inv_freq.device.type == device.type
    assert torch.equal(dev.inv_freq.cpu(), cpu.inv_freq)
    assert (dev.cos_sin_cache.cpu() - cpu.cos_sin_cache).abs().max() < 1e-5


@pytest.mark.parametrize("kwargs,match", [
    (dict(head_dim=64, rope_type="ntk", max_positions=4), "rope_type"),
    (dict(head_dim=64, rope_type="linear", max_positions=4), "factor"),
    (dict(rope_theta=1e4, max_positions=4), "head_dim"),
    (dict(head_dim=64), "max_positions"),
    (dict(head_dim=64, max_positions=-1), "max_positions"),
    (dict(head_dim=64, rotary_dim=96, max_positions=4), "rotary_dim"),
    (dict(head_dim=64, rope_theta=-2.0, max_positions=4), "rope_theta"),
    (dict(head_dim=64, rope_type="longrope", short_factor=[1.0] * 31, long_factor=[1.0] * 32, factor=2.0,
          original_max_position_embeddings=8, max_positions=4), "short_factor"),
    (dict(head_dim=64, rope_type="llama3", factor=8.0, low_freq_factor=1.0, original_max_position_embeddings=8192,
          max_positions=4), "high_freq_factor"),
], ids=["unknown-type", "linear-no-factor", "no-head-dim", "no-length", "negative-length", "rotary-dim-too-big",
        "negative-theta", "longrope-factor-length", "llama3-missing-key"])
def test_bad_input(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        ks.rope_cache(**kwargs)
