"""The mapping from HuggingFace modules to kernelset ops: data, not a function per model.

A :class:`Rule` says which modules are candidates (by the attributes they carry, never by the
model family) and lists :class:`Behaviour` records: the computations such a module may perform,
each with the kernelset replacement that performs it. ``kernelize`` runs the module's own code and
every replacement (on the fp32 reference backends) on the same random inputs and keeps the
behaviour that matches; a module whose behaviour matches none, or whose method takes other
arguments than the replacement (Mamba-2's gated norm: ``forward(hidden_states, gate=None)``), is
left alone and reported with the reason. One probe per module class and shape, so a 32-layer
model probes each class once.

Rules (in the order they are tried on a module):

- ``layer_norm``: ``nn.LayerNorm`` over one dim -> ``layer_norm``.
- ``rms_norm``: a 1-D ``weight`` (or none) and an eps attribute (``variance_epsilon``/``eps``)
  -> ``rms_norm``; the probe picks ``w`` or Gemma's ``1 + w`` and where the result is rounded
  (Llama: before the weight; Gemma/OLMo-2/gpt-oss: after), from a bf16 and an fp32 copy with
  random weights. Covers per-head q/k norms (Qwen3, Gemma 3) and MLA's latent norms.
- ``gated_mlp``: ``gate_proj``/``up_proj``/``down_proj`` -> ``down(act(gate(x)) * up(x))`` with
  ``swiglu`` (SiLU) or ``gelu_and_mul`` on the two projections; a call recording gradients runs
  ``gated_mlp`` instead (the three products and the activation as one autograd node) where the
  projections are plain bias-free ``nn.Linear`` without hooks and ``ops`` allows it; ``gate_up_proj``/``down_proj``
  (Phi-3's fused projection, gate first) -> ``silu_and_mul`` / ``gelu_and_mul``.
- ``experts_gate``: an MoE experts module's ``_apply_gate`` (transformers' experts interface):
  concatenated gate/up -> ``silu_and_mul``/``gelu_and_mul``, gpt-oss's interleaved clamped gate
  -> ``swiglu_oai`` (inference only: it has no backward). The expert GEMMs and routing stay torch.
- ``embedding``: ``nn.Embedding`` lookups, plain or times ``embed_scale`` (Gemma) -> ``embedding``.
- ``rotary`` (functions): a modeling module's ``apply_rotary_pos_emb*`` -> ``apply_rotary``: rotate
  halves (Llama and most), half-width tables (gpt-oss), interleaved pairs written out as halves
  (DeepSeek-V3), partial rotary (Phi-3). Probed at the first call of each shape signature, since
  the table layout is only known then.
- ``causal_lm_loss``: the model's ``loss_function`` when it is transformers' ``ForCausalLMLoss``
  -> ``cross_entropy`` on the logits as they are (no fp32 copy of the logits).
- ``merged_projections`` (inference): sibling ``nn.Linear`` children read from the same input
  (``PROJECTION_GROUPS``: q/k/v, gate/up) -> one GEMM per group (projections.py).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

from ..core.op import trace_constant

Build = Callable[[nn.Module, Any], Callable[..., Any]]  # (module, counting ops) -> replacement


@dataclasses.dataclass(frozen=True)
class Behaviour:
    """One computation a candidate module may perform, and the kernelset replacement for it."""

    name: str
    ops: tuple[str, ...]
    build: Build
    applies: Callable[[nn.Module], bool] = lambda m: True  # attribute preconditions of this behaviour
    training: bool = True  # the ops have a backward


@dataclasses.dataclass(frozen=True)
class Rule:
    name: str
    doc: str
    candidate: Callable[[nn.Module], bool]  # attributes only: cheap, no forward run
    behaviours: tuple[Behaviour, ...]
    probe_inputs: Callable[[nn.Module, torch.dtype], tuple]  # random inputs for the behaviour probe
    probe_copy: bool = False  # probe a copy with random parameters in fp32 and bf16 (small modules only)
    # probe a CPU copy with a narrow random table: the module's forward indexes, and an out-of-range lookup
    # (a subclass adding an offset: BioGPT's and OPT's positions) is a device assert on a GPU, which ends the
    # process's CUDA context, where the CPU raises IndexError
    probe_on_cpu: bool = False
    method: str = "forward"  # the bound method replaced on each matching module


# ---- helpers ----------------------------------------------------------------------------------


EPS_ATTRS = ("variance_epsilon", "eps", "epsilon")
ACT_ATTRS = ("act_fn", "activation_fn", "act")


def eps_of(m: nn.Module) -> float | None:
    for a in EPS_ATTRS:
        v = getattr(m, a, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def act_of(m: nn.Module) -> nn.Module | Callable | None:
    return next((getattr(m, a) for a in ACT_ATTRS if callable(getattr(m, a, None))), None)


def _linear(m: nn.Module, name: str) -> bool:
    return isinstance(getattr(m, name, None), nn.Linear)


def _param_dtype(m: nn.Module) -> torch.dtype:
    p = next(m.parameters(), None)
    return p.dtype if p is not None else torch.float32


def _param_device(m: nn.Module) -> torch.device:
    p = next(m.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


# ---- norms ------------------------------------------------------------------------------------


def _is_rms_candidate(m: nn.Module) -> bool:
    if isinstance(m, (nn.LayerNorm, nn.GroupNorm, nn.Embedding, nn.Linear)) or eps_of(m) is None:
        return False
    w = getattr(m, "weight", None)
    own = [n for n, _ in m.named_parameters(recurse=False)]
    if w is None:
        return not own and not list(m.children())
    return isinstance(w, nn.Parameter) and w.dim() == 1 and own == ["weight"] and not list(m.children())


def rows_layout(x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...] | None]:
    """x, or a permutation of its leading dims that is contiguous (and the inverse permutation).

    Per-head q/k norms see ``[B, H, S, D]`` views of a ``[B, S, H, D]`` projection, whose rows share
    no single stride; a last-dim op does not care about the order of the leading dims, so it can run
    on the permuted (contiguous) view and hand back the same view order, with no copy."""
    if x.is_contiguous() or x.dim() < 3 or x.stride(-1) != 1:
        return x, None
    lead = sorted(range(x.dim() - 1), key=lambda d: -x.stride(d))
    perm = (*lead, x.dim() - 1)
    xp = x.permute(perm)
    if not xp.is_contiguous():
        return x, None
    inverse = tuple(perm.index(d) for d in range(x.dim()))
    return xp, inverse


_TORCH_ORDER: dict[int, bool] = {}


@trace_constant
def _torch_order(n: int) -> bool:
    """Whether an RMSNorm over ``n`` features runs in the module's own summation order: where our
    kernel reproduces torch's (hidden sizes of the residual stream) the output is the module's, bit
    for bit; per-head norms (head_dim <= 128) keep the fast kernel, within rounding of the module.
    (A constant under torch.compile: the policy behind it is lru_cache'd, which dynamo warns about.)"""
    got = _TORCH_ORDER.get(n)
    if got is None:
        from ..ops.norm.reference import torch_cuda_mean_lanes
        got = _TORCH_ORDER[n] = torch_cuda_mean_lanes(2, n) is not None
    return got


def _rms_build(offset: float, cast: str, weighted: bool = True) -> Build:
    from ..core.checks import row_stride

    from ..ops.norm.api import NormCast
    cast_e = NormCast.parse(cast)  # the enum member: eager no-grad calls are then kept for replay (ops/norm/api.py)

    def build(m: nn.Module, ops: Any) -> Callable:
        eps = eps_of(m)

        def forward(hidden_states: torch.Tensor) -> torch.Tensor:
            x, inverse = rows_layout(hidden_states)
            if inverse is None and row_stride(x) is None:
                # per-head norms of a merged q/k/v projection: [.., H, D] views whose rows have two
                # strides (head, token); the row kernels take one, so a copy (cheaper than the
                # reference path's several torch ops)
                x = x.contiguous()
            exact = _torch_order(x.shape[-1])
            y = ops.rms_norm(x, m.weight if weighted else None, eps=eps, offset=offset, cast=cast_e, torch_order=exact)
            return y if inverse is None else y.permute(inverse)
        return forward
    return build


def _has_weight(m: nn.Module) -> bool:
    return getattr(m, "weight", None) is not None


RMS_BEHAVIOURS = tuple(
    Behaviour(f"{'(1 + w)' if offset else 'w'}, {cast} rounding", ("rms_norm",), _rms_build(offset, cast), _has_weight)
    for offset in (0.0, 1.0) for cast in ("llama", "gemma")
) + (Behaviour("no weight", ("rms_norm",), _rms_build(0.0, "llama", weighted=False), lambda m: not _has_weight(m)),)


def _norm_inputs(m: nn.Module, dtype: torch.dtype) -> tuple:
    w = getattr(m, "weight", None)
    shape = getattr(m, "normalized_shape", None)  # (nn.LayerNorm without affine parameters)
    n = w.shape[0] if w is not None else int(shape[-1]) if shape else 64
    return (torch.randn(3, 5, n, dtype=dtype, device=_param_device(m)) * 3,)


def _ln_candidate(m: nn.Module) -> bool:
    return (type(m).forward is nn.LayerNorm.forward and isinstance(m, nn.LayerNorm)
            and len(m.normalized_shape) == 1)


def _ln_build(m: nn.Module, ops: Any) -> Callable:
    def forward(x: torch.Tensor) -> torch.Tensor:
        return ops.layer_norm(x, m.weight, m.bias, eps=m.eps)
    return forward


# ---- gated MLPs -------------------------------------------------------------------------------


def _split_candidate(m: nn.Module) -> bool:
    return all(_linear(m, a) for a in ("gate_proj", "up_proj", "down_proj")) and act_of(m) is not None


def _fused_candidate(m: nn.Module) -> bool:
    return _linear(m, "gate_up_proj") and _linear(m, "down_proj") and act_of(m) is not None


_MLP_ACTIVATION = {"silu": "silu", "tanh": "gelu_tanh", "none": "gelu"}  # ACT_KINDS -> gated_mlp's names


def unhooked(*mods: nn.Module, idle: Callable[[Any], bool] | None = None) -> bool:
    """No forward or backward hook on these modules, nor a global module hook: a replacement that
    reads their weights instead of calling them would skip it silently. Checked at every call a
    replacement takes that way (a hook may come after kernelize). ``idle(hook)``: True for a
    forward hook that may be skipped at this call (hf.layers: transformers' output capture while
    it records nothing)."""
    from torch.nn.modules import module as nn_module
    if (nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks or nn_module._global_backward_hooks
            or nn_module._global_backward_pre_hooks):
        return False
    for m in mods:
        if m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks:
            return False
        if m._forward_hooks and (idle is None or not all(idle(h) for h in m._forward_hooks.values())):
            return False
    return True


def _plain_linears(m: nn.Module) -> bool:
    """gate/up/down are bias-free nn.Linear children without hooks: gated_mlp may read their weights
    directly instead of calling them."""
    lins = (m.gate_proj, m.up_proj, m.down_proj)
    return all(type(lin) is nn.Linear and lin.bias is None and not lin._forward_hooks and not lin._forward_pre_hooks
               for lin in lins)


def _split_build(kind: str) -> Build:
    def build(m: nn.Module, ops: Any) -> Callable:
        fused = _plain_linears(m) and _allows(ops, "gated_mlp")

        def forward(x: torch.Tensor) -> torch.Tensor:
            # a training call: the three products and the activation as one autograd node
            # (gated_mlp), ~6 fewer nodes per layer to record and run on the host
            if (fused and torch.is_grad_enabled() and (x.requires_grad or m.down_proj.weight.requires_grad)
                    and unhooked(m.gate_proj, m.up_proj, m.down_proj)):
                return ops.gated_mlp(x, m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight,
                                     activation=_MLP_ACTIVATION[kind])
            gate, up = m.gate_proj(x), m.up_proj(x)
            if kind == "silu":
                h = ops.swiglu(gate, up)
            else:  # the GeGLU kernel reads one [.., 2I] buffer: the merged projection's, or a copy
                both = _adjacent_halves(gate, up)
                h = ops.gelu_and_mul(torch.cat((gate, up), -1) if both is None else both, approximate=kind)
            return m.down_proj(h)
        return forward
    return build


def _allows(ops: Any, name: str) -> bool:
    """Whether the kernelize call lets the replacement use op ``name`` (``ops=`` limits them)."""
    allowed = getattr(ops, "allowed", None)
    return allowed is None or name in allowed


def _adjacent_halves(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    """The ``[.., 2I]`` view whose halves are a and b, when b's columns follow a's in one buffer
    (the column blocks of a merged gate/up projection), else None."""
    i = a.shape[-1]
    if (a.shape != b.shape or a.stride() != b.stride() or a.dim() < 2 or a.stride(-1) != 1
            or a.stride(-2) != 2 * i or b.data_ptr() != a.data_ptr() + i * a.element_size()
            or a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()):
        return None
    return a.as_strided((*a.shape[:-1], 2 * i), a.stride())


def _fused_build(kind: str) -> Build:
    def build(m: nn.Module, ops: Any) -> Callable:
        def forward(x: torch.Tensor) -> torch.Tensor:
            gu = m.gate_up_proj(x)
            h = ops.silu_and_mul(gu) if kind == "silu" else ops.gelu_and_mul(gu, approximate=kind)
            return m.down_proj(h)
        return forward
    return build


ACT_KINDS = ("silu", "tanh", "none")  # SiLU, GELU (tanh approximation), GELU (erf)


def _mlp_inputs(m: nn.Module, dtype: torch.dtype) -> tuple:
    lin = m.gate_proj if hasattr(m, "gate_proj") else m.gate_up_proj
    return (torch.randn(2, 3, lin.in_features, dtype=_param_dtype(m), device=_param_device(m)),)


# ---- MoE experts' gate ------------------------------------------------------------------------


def _gate_candidate(m: nn.Module) -> bool:
    return callable(getattr(m, "_apply_gate", None)) and hasattr(m, "gate_up_proj")


def _gate_build(kind: str) -> Build:
    def build(m: nn.Module, ops: Any) -> Callable:
        if kind == "oai":
            alpha, limit = float(m.alpha), float(m.limit)
            return lambda gate_up: ops.swiglu_oai(gate_up, alpha=alpha, limit=limit)
        if kind == "silu":
            return lambda gate_up: ops.silu_and_mul(gate_up)
        return lambda gate_up: ops.gelu_and_mul(gate_up, approximate=kind)
    return build


def _gate_inputs(m: nn.Module, dtype: torch.dtype) -> tuple:
    # wide enough a spread that gpt-oss's clamp at +-limit (7) is exercised
    return (torch.randn(6, 32, dtype=_param_dtype(m), device=_param_device(m)) * 5,)


# ---- embeddings -------------------------------------------------------------------------------


def _emb_candidate(m: nn.Module) -> bool:
    return (isinstance(m, nn.Embedding) and m.max_norm is None and not m.scale_grad_by_freq and not m.sparse)


def _emb_build(scaled: bool) -> Build:
    def build(m: nn.Module, ops: Any) -> Callable:
        def forward(input_ids: torch.Tensor) -> torch.Tensor:
            # no host-side id check: nn.Embedding has none either (a device assert), and a host sync at
            # every forward would stall the queue; a bad id gives a NaN row and no gradient
            out = ops.embedding(input_ids, m.weight, check_ids=False)
            if not scaled:
                return out
            scale = m.embed_scale  # a buffer (Gemma) or a float (BioGPT)
            return out * (scale.to(m.weight.dtype) if isinstance(scale, torch.Tensor) else scale)
        return forward
    return build


def _emb_inputs(m: nn.Module, dtype: torch.dtype) -> tuple:
    return (torch.randint(0, m.num_embeddings, (2, 5), device=m.weight.device),)


def _no_padding_grad(m: nn.Module) -> bool:
    # kernelset's embedding backward gives the padding row a gradient; nn.Embedding does not
    return m.padding_idx is None


# ---- the table --------------------------------------------------------------------------------

RULES: tuple[Rule, ...] = (
    Rule("layer_norm", "nn.LayerNorm over the last dim", _ln_candidate,
         (Behaviour("affine", ("layer_norm",), _ln_build, _has_weight),
          Behaviour("no affine parameters", ("layer_norm",), _ln_build, lambda m: not _has_weight(m))),
         _norm_inputs, probe_copy=True),
    Rule("rms_norm", "RMSNorm modules (1-D weight, eps attribute)", _is_rms_candidate, RMS_BEHAVIOURS, _norm_inputs,
         probe_copy=True),
    Rule("gated_mlp", "gate/up/down projections with an activation", _split_candidate,
         tuple(Behaviour(f"{'swiglu' if k == 'silu' else 'gelu_and_mul ' + k}", ("swiglu",) if k == "silu"
                         else ("gelu_and_mul",), _split_build(k)) for k in ACT_KINDS), _mlp_inputs),
    Rule("gated_mlp_fused", "fused gate_up projection (gate first) and down projection", _fused_candidate,
         tuple(Behaviour(f"{'silu_and_mul' if k == 'silu' else 'gelu_and_mul ' + k}",
                         ("silu_and_mul",) if k == "silu" else ("gelu_and_mul",), _fused_build(k)) for k in ACT_KINDS),
         _mlp_inputs),
    Rule("experts_gate", "MoE experts' _apply_gate (expert GEMMs and routing stay torch)", _gate_candidate,
         (Behaviour("silu_and_mul", ("silu_and_mul",), _gate_build("silu")),
          Behaviour("gelu_and_mul tanh", ("gelu_and_mul",), _gate_build("tanh")),
          Behaviour("gelu_and_mul", ("gelu_and_mul",), _gate_build("none")),
          Behaviour("swiglu_oai", ("swiglu_oai",), _gate_build("oai"),
                    lambda m: hasattr(m, "alpha") and hasattr(m, "limit"), training=False)),
         _gate_inputs, method="_apply_gate"),
    Rule("embedding", "token embeddings (plain, or times embed_scale)", _emb_candidate,
         (Behaviour("lookup", ("embedding",), _emb_build(False)),
          Behaviour("lookup * embed_scale", ("embedding",), _emb_build(True), lambda m: hasattr(m, "embed_scale"))),
         _emb_inputs, probe_on_cpu=True),
)

TRAINING_PRECONDITIONS: dict[str, Callable[[nn.Module], str | None]] = {
    "embedding": lambda m: None if _no_padding_grad(m) else
    f"padding_idx={m.padding_idx}: nn.Embedding gives that row no gradient, kernelset's embedding does",
}


# ---- projections merged for inference ---------------------------------------------------------

# children of one module that read the same input, in the order their columns are concatenated
PROJECTION_GROUPS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


# ---- rotary functions -------------------------------------------------------------------------

ROTARY_FUNCTIONS = ("apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave")


@dataclasses.dataclass(frozen=True)
class RotaryVariant:
    name: str
    run: Callable[..., tuple[torch.Tensor, torch.Tensor]]  # (ops, q, k, cos, sin, unsqueeze_dim) -> (q, k)


def _deinterleave(x: torch.Tensor, r: int) -> torch.Tensor:
    """[.., (x0, x1), (x2, x3) ...] -> [.., x0, x2, ..., x1, x3, ...] over the first r features."""
    rot = x[..., :r]
    rot = torch.cat((rot[..., 0::2], rot[..., 1::2]), -1)
    return rot if r == x.shape[-1] else torch.cat((rot, x[..., r:]), -1)


def _rot_half(ops, q, k, cos, sin, u):
    return tuple(ops.apply_rotary(q, k, cos, sin, unsqueeze_dim=u))


def _rot_half_table(ops, q, k, cos, sin, u):
    return tuple(ops.apply_rotary(q, k, torch.cat((cos, cos), -1), torch.cat((sin, sin), -1), unsqueeze_dim=u))


def _rot_interleaved_to_halves(ops, q, k, cos, sin, u):
    r = cos.shape[-1]
    return tuple(ops.apply_rotary(_deinterleave(q, r), _deinterleave(k, r), cos, sin, unsqueeze_dim=u))


ROTARY_VARIANTS = (
    RotaryVariant("rotate halves", _rot_half),
    RotaryVariant("rotate halves, half-width table", _rot_half_table),
    RotaryVariant("interleaved pairs written as halves", _rot_interleaved_to_halves),
)


def rotary_call_key(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, u: int) -> tuple:
    """What a rotary call's variant may depend on: unsqueeze_dim, heads and head dims of q [B, H, S, D]
    (u=1) or [B, S, H, D], of k, the tables' middle dims and width, the dtypes and the device; not
    batch or length, so that under torch.compile with dynamic shapes it holds plain ints."""
    h = 1 if u == 1 else 2
    mid = tuple(cos.shape[1:-2]) if cos.dim() >= 3 else None
    return (u, q.shape[h], q.shape[-1], k.shape[h], k.shape[-1], mid, cos.shape[-1], q.dtype, cos.dtype, q.device)


def rotary_probe_inputs(key: tuple) -> tuple[torch.Tensor, ...]:
    """Random fp32 stand-ins for a call of ``rotary_call_key`` ``key``: q and k with batch 1 and 3
    positions, cos and sin as rotary modules build them (one angle per frequency, the halves
    duplicated)."""
    u, hq, dq, hk, dk, mid, width, _, _, device = key

    def qk(h: int, d: int) -> torch.Tensor:
        return torch.randn((1, h, 3, d) if u == 1 else (1, 3, h, d), device=device)

    a = torch.randn((3, width // 2) if mid is None else (1, *mid, 3, width // 2), device=device) * math.pi
    angles = torch.cat((a, a), -1)
    return qk(hq, dq), qk(hk, dk), angles.cos(), angles.sin()


# ---- the causal-LM loss -----------------------------------------------------------------------


def causal_lm_loss(ops: Any) -> Callable:
    """transformers' ForCausalLMLoss with kernelset's cross_entropy: shift, ignore -100, mean (or
    sum / num_items_in_batch); reads the logits in their own dtype (fp32 math inside)."""
    def loss_fn(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int, num_items_in_batch=None,
                ignore_index: int = -100, shift_labels: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        if shift_labels is None:
            labels = F.pad(labels, (0, 1), value=ignore_index)
            shift_labels = labels[..., 1:]
        target = shift_labels.reshape(-1).to(logits.device)
        flat = logits.reshape(-1, vocab_size)
        if num_items_in_batch is None:
            return ops.cross_entropy(flat, target, ignore_index=ignore_index, reduction="mean")
        loss = ops.cross_entropy(flat, target, ignore_index=ignore_index, reduction="sum")
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        return loss / num_items_in_batch
    return loss_fn
