"""Every public op against adversarial layouts and bad input: the library's contract, op by op.

"Strided inputs are honoured or refused; bad input gets a clear error naming the argument, never a
crash or a wrong memory read." Each op is called on small valid inputs, then with one tensor
argument replaced at a time:

- by a view with the same values in another layout (every other element of a wider buffer, a
  transposed copy, one row broadcast with stride 0): every backend must give the result of the
  same values laid out contiguously, or refuse with a KernelsetError. The Triton rotary kernel once
  read a strided ``positions`` as if contiguous (found by this test's first form);
- by a tensor of a wrong dtype, on another device (meta), a 0-d tensor or a Python list: a
  KernelsetError (or TypeError / ValueError) whose message names an argument, or, where the op is
  defined for it, a result; never another exception type from deep inside torch or Triton.

In-place ops are compared on the tensors they write; index data (positions, slots, block tables)
keeps its values in every layout.
"""
from __future__ import annotations

import re

import pytest
import torch

import kernelset as ks
from kernelset.core.errors import KernelsetError
from kernelset.core.registry import impls

T, D = 5, 16
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the kernels' device (CPU: interpreter)


def _r(*shape):
    return torch.randn(*shape, device=DEV)


def _cache(max_pos, rot):
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2, device=DEV).float() / rot))
    f = torch.outer(torch.arange(max_pos, device=DEV).float(), inv)
    return torch.cat([f.cos(), f.sin()], -1)


def _ints(high, *shape):
    return torch.randint(0, high, shape, device=DEV)


def _int32(*rows):
    return torch.tensor(rows, dtype=torch.int32, device=DEV)


# op -> () -> (positional args, keyword args): small valid inputs, fresh each call
CASES = {
    "rms_norm": lambda: ((_r(3, 64), _r(64)), {}),
    "layer_norm": lambda: ((_r(3, 64), _r(64), _r(64)), {}),
    "fused_add_rms_norm": lambda: ((_r(3, 64), _r(3, 64), _r(64)), {}),
    "silu_and_mul": lambda: ((_r(3, 64),), {}),
    "gelu_and_mul": lambda: ((_r(3, 64),), {"approximate": "tanh"}),
    "swiglu": lambda: ((_r(3, 32), _r(3, 32)), {}),
    "gelu": lambda: ((_r(3, 32),), {}),
    "swiglu_oai": lambda: ((_r(3, 64),), {}),
    "softmax": lambda: ((_r(3, 70),), {"temperature": 0.7}),
    "log_softmax": lambda: ((_r(3, 70),), {}),
    "cross_entropy": lambda: ((_r(4, 50), _ints(50, 4)), {"reduction": "none"}),
    "linear_cross_entropy": lambda: ((_r(4, 16), _r(50, 16), _ints(50, 4)), {"reduction": "none"}),
    "embedding": lambda: ((_ints(20, 3, 4), _r(20, 16)), {}),
    "rotary_embedding": lambda: ((_ints(32, T), _r(T, 4, D), _r(T, 2, D), _cache(32, D)), {}),
    "apply_rotary": lambda: ((_r(1, 4, T, D), _r(1, 2, T, D), *_hf_tables()), {}),
    "mrope": lambda: ((_ints(32, 3, T), _r(T, 4, D), _r(T, 2, D), _cache(32, D), [2, 3, 3]), {}),
    "qk_norm_rope": lambda: ((_r(T, 4, D), _r(T, 2, D), _r(D), _r(D), _cache(32, D), _ints(32, T)), {}),
    "flash_attention": lambda: ((_r(1, 6, 4, D), _r(1, 6, 2, D), _r(1, 6, 2, D)), {"causal": True}),
    "flash_attention_varlen": lambda: ((_r(7, 4, D), _r(7, 2, D), _r(7, 2, D), _int32(0, 3, 7), _int32(0, 3, 7), 4, 4),
                                       {"causal": True}),
    "merge_attn_states": lambda: ((_r(T, 4, D), _r(T, 4), _r(T, 4, D), _r(T, 4)), {}),
    "paged_attention": lambda: ((_r(3, 4, D), _r(6, 16, 2, D), _r(6, 16, 2, D), _int32([0, 1], [2, 3], [4, 5]),
                                 _int32(5, 20, 32)), {}),
    "reshape_and_cache": lambda: ((_r(T, 2, D), _r(T, 2, D), _r(4, 16, 2, D), _r(4, 16, 2, D),
                                   torch.tensor([0, 3, 17, 40, 63], device=DEV)), {}),
    # the two training nodes (added when this table was checked against the registry)
    "gated_mlp": lambda: ((_r(3, 16), _r(32, 16), _r(32, 16), _r(16, 32)), {}),
    "qkv_rope": lambda: ((_r(1, T, 16), _r(4 * 8, 16), _r(2 * 8, 16), _r(2 * 8, 16), *_hf_rows(8)),
                         {"head_dim": 8}),
    "mla_decode": lambda: ((_r(2, 4, 32), _r(2, 4, 16), _r(4, 16, 48), _int32([0, 1], [2, 3]), _int32(7, 30)),
                           {"scale": 0.1, "kv_lora_rank": 32, "rope_dim": 16}),
}


# ops that declare their example in the registry (OpSpec.example): the one description of the op
for _e in ks.catalog():
    if _e.spec.example is not None:
        assert _e.name not in CASES, f"{_e.name}: an example in the registry and a case here"
        CASES[_e.name] = (lambda ex: lambda: ex(DEV))(_e.spec.example)


def test_every_tensor_op_has_a_contract_case():
    """A new op gets its contract case from its declaration's ``example``; only the optimizers and the
    block copies (lists of tensors, parameters) are out of this test's reach, each said here."""
    outside = {"adamw": "an optimizer over parameters (tests/test_optim.py)",
               "clip_grad_norm": "takes parameters, not tensors (tests/test_optim.py)",
               "copy_blocks": "lists of caches (tests/test_kvcache.py)",
               "swap_blocks": "copies between devices (tests/test_kvcache.py)"}
    missing = [e.name for e in ks.catalog() if e.name not in CASES and e.name not in outside]
    assert not missing, f"ops without a contract case: {missing}"


def _hf_rows(d):
    cs = _cache(T, d)
    cos, sin = cs[:, : d // 2], cs[:, d // 2:]
    return torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)  # [S, D], transformers' halves repeated


def _hf_tables():
    cs = _cache(T, D)
    cos, sin = cs[:, : D // 2], cs[:, D // 2:]
    return torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)  # transformers' layout: halves repeated


def _strided(t):  # the same values at every other element of a wider buffer
    wide = torch.empty(*t.shape[:-1], 2 * t.shape[-1] + 1, dtype=t.dtype, device=t.device)[..., 1::2]
    wide.copy_(t)
    return wide


def _transposed(t):  # the same values, dims 0 and 1 swapped in memory
    return t.transpose(0, 1).contiguous().transpose(0, 1) if t.dim() >= 2 else None


def _broadcast(t):  # one leading slice repeated with stride 0 (new values: compared to a copy)
    return t[:1].expand_as(t) if t.dim() >= 1 and t.shape[0] > 1 else None


LAYOUTS = {"strided": _strided, "transposed": _transposed, "broadcast": _broadcast}


def _bad_dtype(t):
    return t.to(torch.int32) if t.is_floating_point() else t.float()


BAD = {"dtype": _bad_dtype, "meta": lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta"),
       "0-d": lambda t: t.reshape(-1)[0].clone(), "list": lambda t: t.tolist()}


def _tensor_slots(args):
    return [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]


def _call(op, args, kw, backend):
    out = getattr(ks, op)(*args, **kw, backend=backend)
    outs = [out] if isinstance(out, torch.Tensor) else [o for o in (out or ()) if isinstance(o, torch.Tensor)]
    # in-place ops write their arguments: compare those too
    return outs + [a for a in args if isinstance(a, torch.Tensor)]


def _same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        if g.is_floating_point():
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5, equal_nan=True)
        else:
            assert torch.equal(g, w)


def _layout_cases():
    for op, make in CASES.items():
        args, _ = make()
        for slot in _tensor_slots(args):
            for name, fn in LAYOUTS.items():
                if fn(args[slot]) is not None:
                    for impl in impls(op):
                        b = str(impl.backend)
                        yield pytest.param(op, slot, name, b, id=f"{op}-arg{slot}-{name}-{b}")


@pytest.mark.parametrize("op,slot,layout,backend", list(_layout_cases()))
def test_layouts_are_honoured_or_refused(op, slot, layout, backend):
    torch.manual_seed(0)
    args, kw = CASES[op]()
    view = LAYOUTS[layout](args[slot].clone())
    plain = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    plain[slot] = view.contiguous()
    got = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    got[slot] = view
    try:
        out = _call(op, got, kw, backend)
    except KernelsetError:
        return  # refused (with its reason): allowed
    _same(out, _call(op, plain, kw, backend))


def _bad_cases():
    for op, make in CASES.items():
        args, _ = make()
        for slot in _tensor_slots(args):
            for name in BAD:
                yield pytest.param(op, slot, name, id=f"{op}-arg{slot}-{name}")


@pytest.mark.parametrize("op,slot,bad", list(_bad_cases()))
def test_bad_input_gets_a_clear_error(op, slot, bad):
    torch.manual_seed(0)
    args, kw = CASES[op]()
    args = list(args)
    args[slot] = BAD[bad](args[slot])
    try:
        _call(op, args, kw, "auto")
    except (KernelsetError, TypeError, ValueError) as e:
        assert re.search(r"argument '\w+", str(e)) or isinstance(e, KernelsetError), f"unclear error: {e}"
        return
    # accepted: only where the op is defined for it (a pure elementwise op on meta tensors computes
    # on meta; embedding takes 0-d ids, as torch's does)
    assert (bad == "meta" and len(_tensor_slots(CASES[op]()[0])) == 1) or (op == "embedding" and bad == "0-d"), \
        f"{op} accepted argument {slot} as {bad}"
