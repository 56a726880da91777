"""kernelize beyond the coverage list: every causal-LM family the installed transformers knows, and
the attention contracts that the 2026-11-28 sweep (``scripts/hf_family_sweep.py``) found broken.

- Every family in transformers' causal-LM mapping, built tiny from its config class's defaults
  (``presets.tiny_from_defaults``), fp32: the kernelized logits equal the unpatched ones (rel err
  < 1e-5), or kernelize leaves the part it cannot run alone; a patched forward that raises where
  the unpatched one ran fails. A config the shrinking cannot build is skipped (the test's limit, not
  a finding), except the state-space and hybrid families (``MUST_BUILD``): kernelize met them
  untested (Mamba-2's gated norm was patched as a plain one and raised, issue 35).
- Packed sequences (``position_ids`` restarting inside a row, no mask, no cache: transformers'
  padding-free training) stay apart: they attended across sequences before (rel err 0.9).
- A window that lives only in the mask (Phi-3.5-MoE passes no ``sliding_window`` to its attention).
- Models whose classes declare no FlashAttention support keep their attention (DeepSeek-V4, Doge,
  Inkling edit or combine the mask tensor in their attention code).
- A rotary function whose first parameters are not (q, k, cos, sin) is left alone.
- The attention's output is contiguous ``[B, S, H, D]`` (AFMoE ``.view()``s it).
- Training mode (loss and every gradient) and a cached decode on a handful of hard families
  (Llama 4's in-place add into its shared expert's output failed in training mode).
- Mamba-2 with one group (its gated norm then computes a plain RMSNorm on the probe's one input):
  left alone, and the report of a model without attention says nothing of attention.

AUTO dispatch (on CPU the references: these check what kernelize matches and how it routes; on a
GPU the kernels AUTO picks, in fp32).
"""
import warnings

import pytest
import torch

pytest.importorskip("transformers")

import kernelset as ks  # noqa: E402
from kernelset.core.tolerance import rel_err  # noqa: E402
from kernelset.hf import attention as hf_attention  # noqa: E402
from kernelset.hf.evaluate import (build_model, cached_decode_logits, config_for, eager_sdpa_gap,  # noqa: E402
                                   tiny_default_model)
from kernelset.hf.patching import _rotary_signature  # noqa: E402
from kernelset.hf.presets import FAMILY_PRESETS, tiny_from_defaults  # noqa: E402
from transformers import CONFIG_MAPPING, AutoModelForCausalLM  # noqa: E402
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


# state-space and hybrid families (Mamba / Mamba-2 / linear-recurrent layers beside attention or instead
# of it): each must build at toy size, so that kernelize is held to them rather than skipped
MUST_BUILD = sorted({"mamba", "mamba2", "falcon_mamba", "jamba", "bamba", "falcon_h1", "granitemoehybrid",
                     "nemotron_h", "zamba", "zamba2", "qwen3_next", "lfm2", "rwkv", "xlstm", "recurrent_gemma",
                     "kimi_linear", "olmo_hybrid", "bailing_hybrid"} & set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))


def _tiny_default_model(model_type: str):
    """The family's tiny model in fp32 eval, or a skip when the shrunk config does not build or run
    (a failure for ``MUST_BUILD``), or when transformers' own eager and SDPA attention disagree on it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, ids = tiny_default_model(model_type, DEVICE)
    except Exception as e:  # noqa: BLE001  (a config the shrinking does not handle)
        why = f"{model_type} does not build at toy size: {type(e).__name__}: {str(e)[:120]}"
        if model_type in MUST_BUILD:
            pytest.fail(why)
        pytest.skip(why)
    gap = eager_sdpa_gap(model, ids)
    if gap > 1e-5:
        pytest.skip(f"transformers' eager and sdpa attention disagree on {model_type} (rel err {gap:.1e}): "
                    "no reference to hold kernelset to")
    with torch.no_grad():
        ref = model(ids).logits
    return model, ids, ref


@pytest.mark.parametrize("model_type", sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))
def test_every_installed_family_keeps_its_logits(model_type):
    model, ids, ref = _tiny_default_model(model_type)
    with ks.hf.kernelize(model) as h, torch.no_grad():
        report = h.report()
        try:
            got = model(ids).logits
        except Exception as e:  # noqa: BLE001  (named: the unpatched model ran these ids)
            pytest.fail(f"the patched forward raised where the unpatched one ran: {type(e).__name__}: {e}\n{report}")
    assert rel_err(got.float(), ref.float()) < 1e-5, report
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref)  # restore() gave every forward back


# families whose training or cached decode went wrong or failed before the 2026-11-28 fixes, or that
# exercise paths the coverage list does not (encoder-style LayerNorm models, a shared expert added into
# in place, a window only in the mask, models without FlashAttention support, Mamba layers and their
# cache beside attention and experts)
HARD = [t for t in ("llama4_text", "phimoe", "deepseek_v4", "afmoe", "doge", "bert", "opt", "gpt_neox", "cohere2",
                    "qwen3_next", "jamba") if t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES]


@pytest.mark.parametrize("model_type", HARD)
def test_hard_families_train_and_decode(model_type):
    """Training mode: the loss and every gradient (eval mode: no dropout or router noise) against the
    unpatched model, each gradient's error over max(its norm, 1e-4 x all gradients' norm): a gradient
    that is zero in exact math (a key bias) is rounding noise both ways. Inference: a cached decode,
    8-token prefill then one token a step, logits within 1e-5."""
    model, ids, _ = _tiny_default_model(model_type)

    def step():
        model.zero_grad(set_to_none=True)
        loss = model(ids, labels=ids, use_cache=False).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    l0, g0 = step()
    with ks.hf.kernelize(model, mode="training") as h:
        l1, g1 = step()
        report = h.report()
    assert rel_err(l1, l0) < 1e-5, report
    assert set(g1) == set(g0)
    floor = 1e-4 * float(torch.stack([g.norm() for g in g0.values()]).norm())
    for name, g in g0.items():
        assert float((g1[name] - g).norm()) / max(float(g.norm()), floor) < 1e-4, (name, report)
    d0 = cached_decode_logits(model, ids, 8)
    with ks.hf.kernelize(model):
        d1 = cached_decode_logits(model, ids, 8)
    assert rel_err(d1, d0) < 1e-5


@pytest.mark.skipif("mamba2" not in CONFIG_MAPPING, reason="this transformers has no mamba2")
def test_mamba2_gated_norm_left_alone():
    """Mamba-2 with one group: its gated norm (``forward(hidden_states, gate=None)``, called with the
    gate) is a plain RMSNorm on the probe's single input; patched as one, the forward raised
    TypeError. It is left alone; logits, a cached decode, and the loss and every gradient in
    training mode equal the unpatched model's. Mamba has no attention: the report says nothing of it."""
    cfg = config_for("mamba-codestral-7b", tiny_model=True, layers=1)
    cfg["n_groups"] = 1
    model = build_model(cfg, device=DEVICE)
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(6)).to(DEVICE)
    with torch.no_grad():
        ref = model(ids).logits
        d0 = cached_decode_logits(model, ids, 8)
    with ks.hf.kernelize(model) as h, torch.no_grad():
        got = model(ids).logits
        d1 = cached_decode_logits(model, ids, 8)
        report = h.report()
        gated = [s for s in h.skipped if s.where.endswith("mixer.norm")]
    assert rel_err(got, ref) < 1e-5 and rel_err(d1, d0) < 1e-5, report
    assert gated and all("gate=None" in s.reason for s in gated), report
    assert "rms_norm" in {p.rule for p in h.patched}, report  # the plain norms still are
    assert "attention" not in report.lower(), report

    def step():
        model.zero_grad(set_to_none=True)
        loss = model(ids, labels=ids, use_cache=False).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    l0, g0 = step()
    with ks.hf.kernelize(model, mode="training"):
        l1, g1 = step()
    assert rel_err(l1, l0) < 1e-5
    for a, b in zip(g1, g0):
        assert rel_err(a, b) < 1e-4


def _tiny(family, **kw):
    return build_model(config_for(FAMILY_PRESETS[family], tiny_model=True, init_std=0.2, **kw),
                       attn_implementation="eager", device=DEVICE)


@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_packed_sequences_stay_apart(family, mode):
    """Two sequences packed in each row (position_ids restart, no mask, no cache): transformers builds a
    block-diagonal mask from position_ids. kernelset ran one causal sequence over both (rel err 0.9);
    now its mask function recognises the packed pattern and the attention runs flash_attention_varlen
    per sequence; loss and gradients included in training."""
    m0, m1 = _tiny(family), _tiny(family)
    m1.load_state_dict(m0.state_dict())
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    pos = torch.stack([torch.cat([torch.arange(5), torch.arange(7)]),  # rows packed differently
                       torch.cat([torch.arange(3), torch.arange(2), torch.arange(7)])]).to(DEVICE)
    if mode == "inference":
        with torch.no_grad():
            ref = m0(ids, position_ids=pos, use_cache=False).logits
            with ks.hf.kernelize(m1) as h:
                got = m1(ids, position_ids=pos, use_cache=False).logits
                counts = dict(h.counts)
        assert rel_err(got, ref) < 1e-5
        # causal layers run flash_attention_varlen over the packed rows; Gemma 2's sliding layers (a
        # window within packed sequences) go to SDPA with the dense mask
        layers = m1.config.num_hidden_layers
        windowed = layers // 2 if family == "gemma2" else 0
        assert counts.get("flash_attention_varlen", 0) == layers - windowed, counts
        assert counts.get("attention_fallback", 0) == windowed, counts
        return
    m0.train()
    m1.train()
    labels = ids.clone()
    with ks.hf.kernelize(m1, mode="training"):
        l1 = m1(ids, position_ids=pos, labels=labels, use_cache=False).loss
        l1.backward()
    l0 = m0(ids, position_ids=pos, labels=labels, use_cache=False).loss
    l0.backward()
    assert rel_err(l1, l0) < 1e-5
    for (name, p0), p1 in zip(m0.named_parameters(), m1.parameters()):
        assert rel_err(p1.grad, p0.grad) < 1e-4, name


@pytest.mark.skipif("phimoe" not in CONFIG_MAPPING, reason="this transformers has no phimoe")
def test_window_given_only_by_the_mask():
    """Phi-3.5-MoE builds a sliding-window mask but passes no sliding_window to its attention: with
    no padding the mask function used to return None, and the window was lost past 8 tokens."""
    cfg = tiny_from_defaults("phimoe")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval().to(DEVICE)
    ids = torch.randint(3, 128, (2, 20), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    with torch.no_grad():
        ref = model(ids).logits
        with ks.hf.kernelize(model) as h:
            got = model(ids).logits
            assert h.counts.get("flash_attention") == cfg.num_hidden_layers  # the kernel, not a fallback
    assert rel_err(got, ref) < 1e-5


def test_mask_function_patterns():
    from transformers import masking_utils as mu
    assert hf_attention.window_of(mu.causal_mask_function) is None
    assert hf_attention.window_of(mu.sliding_window_causal_mask_function(37)) == 37
    assert hf_attention.window_of(mu.and_masks(mu.causal_mask_function, mu.sliding_window_overlay(5))) == 5
    unknown = [mu.and_masks(mu.causal_mask_function, mu.padding_mask_function(torch.ones(1, 4, dtype=torch.bool))),
               mu.or_masks(mu.causal_mask_function, mu.sliding_window_overlay(5)),
               mu.sliding_window_bidirectional_mask_function(5), mu.bidirectional_mask_function,
               lambda b, h, q, kv: kv <= q]
    for fn in unknown:
        assert hf_attention.window_of(fn) is hf_attention.UNKNOWN
        assert hf_attention.packed_of(fn) is None
    ids = torch.tensor([[0, 0, 1, 1, 1]])
    packed = mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(ids))
    assert hf_attention.window_of(packed) is hf_attention.UNKNOWN and hf_attention.packed_of(packed) is ids
    if hasattr(mu, "remap_positions_for_packed_sequence"):  # newer transformers remap positions per sequence
        pos = torch.tensor([[0, 1, 0, 1, 2]])
        remapped = mu.and_masks(mu.remap_positions_for_packed_sequence(mu.causal_mask_function, pos),
                                mu.packed_sequence_mask_function(ids))
        assert hf_attention.packed_of(remapped) is ids
        windowed = mu.and_masks(mu.remap_positions_for_packed_sequence(mu.sliding_window_causal_mask_function(3), pos),
                                mu.packed_sequence_mask_function(ids))
        assert hf_attention.packed_of(windowed) is None  # a window within packed sequences: the dense mask


def test_no_flash_support_keeps_the_attention(monkeypatch):
    model = _tiny("llama")
    monkeypatch.setattr(type(model), "_supports_flash_attn", False)
    ids = torch.randint(3, 128, (1, 10), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    with torch.no_grad():
        ref = model(ids).logits
        with ks.hf.kernelize(model) as h:
            got = model(ids).logits
            assert "flash_attention" not in h.counts and "attention_fallback" not in h.counts
            assert any(s.rule == "attention" and "_supports_flash_attn" in s.reason for s in h.skipped)
            assert model.config._attn_implementation == "eager"
    assert rel_err(got, ref) < 1e-5


def test_rotary_signature():
    def qkcs(q, k, cos, sin, unsqueeze_dim=1): ...
    def one(x, cos, sin, unsqueeze_dim=1): ...
    def swapped(tensor, sin, cos): ...
    def with_v(q, k, v, cos, sin, position_ids, unsqueeze_dim=1): ...
    def keyword_only(q, k, *, cos, sin): ...
    assert _rotary_signature(qkcs) is None
    for fn in (one, swapped, with_v, keyword_only):
        assert _rotary_signature(fn) is not None, fn.__name__


def test_attention_output_is_contiguous_bshd():
    model = _tiny("llama")
    attn = model.model.layers[0].self_attn
    b, h, s, d = 2, model.config.num_attention_heads, 6, model.config.head_dim
    kv = model.config.num_key_value_heads
    g = torch.Generator().manual_seed(4)
    q = torch.randn(b, h, s, d, generator=g).to(DEVICE)
    k, v = torch.randn(b, kv, s, d, generator=g).to(DEVICE), torch.randn(b, kv, s, d, generator=g).to(DEVICE)
    k_strided = torch.randn(b, kv, d, s, generator=g).to(DEVICE).transpose(2, 3)  # head dim not unit-stride
    for key in (k, k_strided):
        out, _ = hf_attention.make_attention(ks.hf.patching._PLAIN)(attn, q, key, v, None, scaling=d ** -0.5)
        assert out.shape == (b, s, h, d) and out.is_contiguous()
        out.view(b, s, -1)


def test_lookup_probe_runs_on_the_cpu():
    """An embedding subclass that adds an offset to its ids (BioGPT's and OPT's learned positions)
    indexes past its table on the probe's ids: probed on the model's GPU that was a device assert,
    which ended the process's CUDA context inside kernelize. The probe runs on a CPU copy with a
    narrow table, where the lookup raises and the module is left alone."""
    class Offset(torch.nn.Embedding):
        def forward(self, ids):
            return super().forward(ids + 2)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pos = Offset(16, 8)
            self.tok = torch.nn.Embedding(16, 8)

        def forward(self, ids):
            return self.tok(ids) + self.pos(ids.clamp(max=13))

    net = Net().to(DEVICE)
    ids = torch.randint(0, 14, (2, 5), generator=torch.Generator().manual_seed(5)).to(DEVICE)
    with torch.no_grad():
        ref = net(ids)
    from kernelset.hf.patching import _cpu_narrow_copy
    assert _cpu_narrow_copy(net.pos).weight.device.type == "cpu" and net.pos.weight.device.type == DEVICE.type
    with ks.hf.kernelize(net, ops={"embedding"}) as h, torch.no_grad():
        got = net(ids)
        assert any(s.where == "pos" and "IndexError" in s.reason for s in h.skipped), h.report()
        assert [p.where for p in h.patched if p.rule == "embedding"] == ["tok"]
    assert torch.equal(got, ref)
