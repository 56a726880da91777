"""torch.compile over kernelized HuggingFace models (issue 35, item 1).

e64e9d7 broke ``torch.compile(model, fullgraph=True)`` on a kernelized model (the mask function read
a ``types.SimpleNamespace``, which dynamo cannot build) and no test compiled one. Without fullgraph,
kernelset code broke graphs: the rotary probe and its tolerance check (``Tensor.item()``) at the first
call of a shape, the packed-sequence offsets (a host sync) that transformers asks for on every
compiled call without a cache, the padding check of the mask function, and lru_cache'd helpers that
dynamo warns about.

- fullgraph=True, inference and training mode, a few families: the compiled kernelized model gives
  the unpatched model's logits (rel err < 1e-5), or its loss (< 1e-5) and every gradient (< 1e-4),
  the bars of tests/test_hf.py; the kernelset ops ran inside the compiled graph. The first call of
  the kernelized model is the compiled one, so the rotary probe runs at trace time.
- fullgraph=False (``torch._dynamo.explain``) on the calls the fullgraph tests do not make (a padded
  batch, a cached decode step): no graph break with a kernelset frame in its stack.

``backend="aot_eager"``: dynamo and AOTAutograd trace the whole model and its backward (a fullgraph
failure fails the test) without Inductor's C++ build, ~10 s a graph on 2 CPU cores. One layer: a
layer more costs trace time, not coverage.
"""
import warnings

import pytest
import torch

pytest.importorskip("transformers")

import kernelset as ks  # noqa: E402
from kernelset.core.tolerance import rel_err  # noqa: E402
from kernelset.hf.evaluate import build_model, config_for  # noqa: E402
from kernelset.core.op import trace_constant  # noqa: E402
from kernelset.hf.presets import FAMILY_PRESETS  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _pair(family: str):
    """Two copies of the family's tiny model (one layer, wide init): unpatched and to kernelize."""
    cfg = config_for(FAMILY_PRESETS[family], tiny_model=True, init_std=0.2, layers=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m0 = build_model(cfg, attn_implementation="eager", device=DEVICE)
        m1 = build_model(cfg, attn_implementation="eager", device=DEVICE)
    m1.load_state_dict(m0.state_dict())
    ids = torch.randint(3, 128, (2, 8), generator=torch.Generator().manual_seed(7)).to(DEVICE)
    return m0, m1, ids


# family -> the attention op its layer runs compiled. llama: the repro; qwen3: per-head q/k
# norms; gemma2: a sliding-window layer, logit softcaps, the (1 + w) norm and the scaled embedding. Its
# window is in a closure of the mask function, which dynamo cannot read (``__closure__`` of a function
# made inside the graph): kernelset's attention runs transformers' SDPA on the dense mask there
ATTENTION = {"llama": "flash_attention", "qwen3": "flash_attention", "gemma2": "attention_fallback"}


@pytest.mark.parametrize("family", sorted(ATTENTION))
def test_compiled_inference_equals_unpatched(family):
    m0, m1, ids = _pair(family)
    with torch.no_grad():
        ref = m0(ids).logits
        with ks.hf.kernelize(m1) as h:
            got = torch.compile(m1, fullgraph=True, backend="aot_eager")(ids).logits
            counts = h.counts
    assert rel_err(got, ref) < 1e-5
    for op in ("embedding", "rms_norm", "apply_rotary", ATTENTION[family]):
        assert counts.get(op, 0) > 0, (op, counts)


# llama: the fused decoder layer's training path; qwen3: its q/k norms in the backward
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_compiled_training_equals_unpatched(family):
    m0, m1, ids = _pair(family)
    m0.train()
    m1.train()
    l0 = m0(input_ids=ids, labels=ids, use_cache=False).loss
    l0.backward()
    with ks.hf.kernelize(m1, mode="training") as h:
        compiled = torch.compile(m1, fullgraph=True, backend="aot_eager")
        l1 = compiled(input_ids=ids, labels=ids, use_cache=False).loss
        l1.backward()
        counts = h.counts
    assert rel_err(l1, l0) < 1e-5
    for (name, p0), p1 in zip(m0.named_parameters(), m1.parameters()):
        assert rel_err(p1.grad, p0.grad) < 1e-4, name
    for op in ("embedding", "rms_norm", "gated_mlp", "linear_cross_entropy"):
        assert counts.get(op, 0) > 0, (op, counts)


def _kernelset_breaks(explained) -> list[str]:
    """The graph breaks with a kernelset frame in their stack (transformers' own are not ours)."""
    out = []
    for b in explained.break_reasons:
        frames = [f"{f.filename}:{f.lineno}" for f in b.user_stack]
        if any("/kernelset/" in f for f in frames):
            out.append(f"{b.reason.splitlines()[0]} at {' <- '.join(reversed(frames[-4:]))}")
    return out


def test_no_graph_breaks_in_kernelset():
    """A padded batch (the mask function checked for padding with ``mask.all()``) and a cached decode
    step, compiled without fullgraph: no break in kernelset code."""
    _, m1, ids = _pair("llama")
    padding = torch.ones_like(ids)
    padding[0, :3] = 0
    with torch.no_grad(), ks.hf.kernelize(m1):
        padded = torch._dynamo.explain(lambda i, a: m1(i, attention_mask=a).logits)(ids, padding)
        cache = m1(ids, use_cache=True).past_key_values
        torch._dynamo.reset()
        decode = torch._dynamo.explain(lambda i: m1(i, past_key_values=cache, use_cache=True).logits)(ids[:, :1])
    assert _kernelset_breaks(padded) == [] and _kernelset_breaks(decode) == []


def test_trace_constant_marks_as_torch_does():
    """hf's trace_constant sets the attribute torch.compiler.assume_constant_result sets (without
    importing torch._dynamo at import time), so dynamo calls such a function instead of tracing it."""
    def a():
        return 1

    def b():
        return 1
    assert vars(torch.compiler.assume_constant_result(a)) == vars(trace_constant(b)) != {}
