"""kernelize(mode="training", cuda_graphs=True): the fused decoder layers' CUDA graphs (hf/graphs.py).

On CPU the graphs are emulated (graphs.EMULATE: "replay" re-runs the captured function and copies
its tensors into the captured ones), which checks the bookkeeping: static inputs, when a call
may replay, gradient copies, accumulation, the retain_graph error. The GPU test captures real
CUDA graphs and compares them with the eager node."""
from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers")

from kernelset.core.tolerance import rel_err  # noqa: E402
from kernelset.hf import graphs, kernelize  # noqa: E402
from kernelset.hf.evaluate import build_model, config_for  # noqa: E402
from kernelset.hf.presets import FAMILY_PRESETS  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _model(dtype=torch.float32, **over):
    cfg = {**config_for(FAMILY_PRESETS["llama"], tiny_model=True, init_std=0.2), **over}
    return build_model(cfg, dtype=dtype, device=DEVICE).train()


@pytest.fixture
def emulate(monkeypatch):
    if DEVICE.type == "cpu":
        monkeypatch.setattr(graphs, "EMULATE", True)


def _pair():
    m0 = _model()
    return m0, copy.deepcopy(m0)


def _ids(seq=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 128, (2, seq), generator=g).to(DEVICE)


def _grads(model):
    return [p.grad.clone() if p.grad is not None else None for p in model.parameters()]


def _capture(model):
    """Two training steps: the layers' first calls run eagerly, the second ones capture."""
    for step in range(2):
        ids = _ids(seed=step)
        model(input_ids=ids, labels=ids).loss.backward()


def _layer_input(model):
    """A decoder layer's hidden states and rotary tables as the model passes them (2 x 12 tokens)."""
    x = torch.randn(2, 12, model.config.hidden_size, device=DEVICE, requires_grad=True)
    return x, model.model.rotary_emb(x, torch.arange(12, device=DEVICE)[None])


def _same_grads(m0, m1, tol=1e-5):
    for (name, p0), p1 in zip(m0.named_parameters(), m1.parameters()):
        assert rel_err(p1.grad, p0.grad) < tol, name


def test_graphed_steps_track_the_eager_node(emulate):
    m0, m1 = _pair()
    o0 = torch.optim.AdamW(m0.parameters(), lr=1e-3)
    o1 = torch.optim.AdamW(m1.parameters(), lr=1e-3)
    with kernelize(m0, mode="training"), kernelize(m1, mode="training", cuda_graphs=True) as h1:
        assert all("CUDA graphs" in p.behaviour for p in h1.patched if p.rule == "decoder_layer")
        for step in range(4):
            ids = _ids(seed=step)
            losses = []
            for model, opt in ((m0, o0), (m1, o1)):
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                losses.append(loss.detach())
            assert rel_err(losses[1], losses[0]) < 1e-6, step
            _same_grads(m0, m1)
            for opt in (o0, o1):
                opt.step()
                opt.zero_grad(set_to_none=True)
        # step 0 eager, step 1 captures (2 layers x forward and backward), steps 2-3 replay
        assert h1.graphs.stats == {"eager": 2, "captures": 4, "replays": 8}, h1.graphs.stats
        assert h1.counts["gated_mlp"] == 8
    for p0, p1 in zip(m0.parameters(), m1.parameters()):
        assert rel_err(p1, p0) < 1e-6


def test_gradient_accumulation_and_kept_grads(emulate):
    """Two micro-batches per step (grads summed into .grad), a reference to last step's grads kept."""
    m0, m1 = _pair()
    kept = None
    with kernelize(m0, mode="training"), kernelize(m1, mode="training", cuda_graphs=True) as h1:
        for step in range(3):
            for micro in range(2):
                ids = _ids(seed=10 * step + micro)
                for model in (m0, m1):
                    model(input_ids=ids, labels=ids).loss.backward()
            _same_grads(m0, m1)
            if kept is not None:  # last step's .grad tensors, not overwritten by this step's replays
                assert all(torch.equal(k, c) for k, c in zip(kept[0], kept[1]))
            kept = ([p.grad for p in m1.parameters()], _grads(m1))
            for model in (m0, m1):
                model.zero_grad(set_to_none=True)
        assert h1.graphs.stats["replays"] > 0


def test_two_forwards_before_a_backward_run_eagerly(emulate):
    m0, m1 = _pair()
    with kernelize(m0, mode="training"), kernelize(m1, mode="training", cuda_graphs=True) as h1:
        for step in range(2):  # eager, then capture
            for model in (m0, m1):
                ids = _ids(seed=step)
                model(input_ids=ids, labels=ids).loss.backward()
        for model in (m0, m1):
            model.zero_grad(set_to_none=True)
        before = dict(h1.graphs.stats)
        a, b = _ids(seed=5), _ids(seed=6)
        for model in (m0, m1):
            la = model(input_ids=a, labels=a).loss
            lb = model(input_ids=b, labels=b).loss  # the layers' graphs wait for la's backward: eager
            (la + lb).backward()
        _same_grads(m0, m1)
        assert h1.graphs.stats["eager"] == before["eager"] + 2  # the second forward's two layers
        assert h1.graphs.stats["replays"] == before["replays"] + 4


def test_another_sequence_length_runs_eagerly(emulate):
    m0, m1 = _pair()
    with kernelize(m0, mode="training"), kernelize(m1, mode="training", cuda_graphs=True) as h1:
        for step, seq in enumerate((12, 12, 12, 7, 12)):
            ids = _ids(seq=seq, seed=step)
            for model in (m0, m1):
                model(input_ids=ids, labels=ids).loss.backward()
            _same_grads(m0, m1)
            for model in (m0, m1):
                model.zero_grad(set_to_none=True)
        assert h1.graphs.stats == {"eager": 4, "captures": 4, "replays": 8}, h1.graphs.stats


def test_backward_after_a_later_forward_replay_raises(emulate):
    m1 = _model()
    with kernelize(m1, mode="training", cuda_graphs=True):
        _capture(m1)
        ids = _ids(seed=3)
        old = m1(input_ids=ids, use_cache=False).logits.square().mean()  # (the fused LCE: no double backward)
        old.backward(retain_graph=True)
        old.backward(retain_graph=True)  # no forward in between: the graphs' activations are still there
        m1(input_ids=ids, labels=ids).loss.backward()  # replays: the old graph's activations are gone
        with pytest.raises(RuntimeError, match="overwrote the activations"):
            old.backward()
        # a layer called alone (its graphs captured above): nothing after it saved its output
        layer = m1.model.layers[0]
        x, pe = _layer_input(m1)
        old = layer(x, position_embeddings=pe).sum()
        old.backward(retain_graph=True)
        layer(x, position_embeddings=pe).sum().backward()
        with pytest.raises(RuntimeError, match="overwrote the activations"):
            old.backward()


def test_a_replay_marks_later_captured_layers_stale(emulate):
    """Layer 0's forward replay may overwrite what layer 1's graph saved (layer 1 was captured
    after it, in the same pool): a retained backward through layer 1 raises. (The emulation fills
    NaN where a replay may write, so without the check the gradients would be NaN, silently.)"""
    m1 = _model()
    with kernelize(m1, mode="training", cuda_graphs=True):
        _capture(m1)
        ids = _ids(seed=3)
        old = m1(input_ids=ids, use_cache=False).logits.square().mean()
        old.backward(retain_graph=True)
        x, pe = _layer_input(m1)
        m1.model.layers[0](x, position_embeddings=pe).sum().backward()  # replays layer 0 alone
        with pytest.raises(RuntimeError, match="overwrote the activations"):  # (runs layer 1's backward only)
            torch.autograd.grad(old, [m1.model.layers[1].mlp.down_proj.weight])


def test_parameters_replaced_between_forward_and_backward_raise(emulate):
    m1 = _model()
    with kernelize(m1, mode="training", cuda_graphs=True):
        _capture(m1)
        ids = _ids(seed=3)
        loss = m1(input_ids=ids, labels=ids).loss
        w = m1.model.layers[1].mlp.down_proj.weight
        w.data = w.data.clone()
        with pytest.raises(RuntimeError, match="parameters were replaced or moved"):
            loss.backward()


def test_cuda_graphs_argument_is_checked():
    m = _model()
    with pytest.raises(ValueError, match="cuda_graphs=True is for mode='training'"):
        kernelize(m, cuda_graphs=True)
    with pytest.raises(ValueError, match="'cuda_graphs' must be a bool"):
        kernelize(m, mode="training", cuda_graphs="yes")


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE.type != "cuda", reason="captures CUDA graphs")
def test_cuda_graphs_on_gpu_equal_the_eager_node():
    """bf16, real CUDA graphs: the same kernels as the eager node, so the same losses and gradients."""
    over = {"head_dim": 64, "hidden_size": 256, "initializer_range": 0.02}
    m0 = _model(torch.bfloat16, **over)
    m1 = copy.deepcopy(m0)
    with kernelize(m0, mode="training"), kernelize(m1, mode="training", cuda_graphs=True) as h1:
        for step in range(4):
            ids = _ids(seq=256, seed=step)
            losses = []
            for model in (m0, m1):
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                losses.append(loss.detach().float())
            assert rel_err(losses[1], losses[0]) < 1e-3, step
            for (name, p0), p1 in zip(m0.named_parameters(), m1.parameters()):
                assert rel_err(p1.grad.float(), p0.grad.float()) < 1e-2, (step, name)
            for model in (m0, m1):
                model.zero_grad(set_to_none=True)
        assert h1.graphs.stats == {"eager": 2, "captures": 4, "replays": 8}, h1.graphs.stats
