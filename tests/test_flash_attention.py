"""flash_attention / flash_attention_varlen against the fp32 reference, forward and every gradient.

Kernels run with 16x16 tiles (FLASH_TUNING) so small shapes cross query/key block boundaries, hit
the masked head/tail and the unmasked middle ranges. Properties: GQA equals MHA with repeated KV,
varlen equals per-sequence dense, Sq != Sk bottom-right causal alignment, rows with no visible key.
"""
from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
from aot import compile_report

import kernelset as ks
from kernelset.core import dispatch
from kernelset.core.tolerance import rel_err, tolerance
from kernelset.ops.attention import backends as BK
from kernelset.ops.attention import launch as L
from kernelset.ops.attention import reference as R

SMALL = L.FlashLaunch(16, 16, 4, 1, 16, 16, 4, 1, 16, 16, 4, 1)
BACKENDS = ["triton", "reference"]


@pytest.fixture(autouse=True)
def _small_tiles():
    with L.FLASH_TUNING.use(L.FlashTuning(None if torch.cuda.is_available() else SMALL)):
        yield


def _ref(q, k, v, **opts):
    out, lse = R.attention(q, k, v, **{"causal": False, **opts})  # the reference defaults to causal
    return out, lse.transpose(-1, -2)


def _grads(out, ins, cot):
    return torch.autograd.grad(out, [t for t in ins if t is not None], cot)


def _close(got, want, dtype, grad, what):
    assert got.shape == want.shape, what
    assert torch.isfinite(got).all(), f"{what}: non-finite"
    err = rel_err(got, want)
    assert err <= tolerance("attention", dtype, grad=grad), f"{what}: rel err {err:.2e}"


def _lse_close(got, want, dtype, what):
    fin = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), fin), f"{what}: -inf LSEs differ"
    assert rel_err(got[fin], want[fin]) <= (1e-5 if dtype == torch.float32 else 2e-3), what


# (id, B, Sq, Sk, Hq, Hkv, D, Dv, options, why)
CASES = [
    ("causal-gqa-d64", 2, 37, 37, 4, 2, 64, 64, dict(causal=True), "GQA 2, ragged last blocks, diagonal blocks"),
    ("causal-sq<sk", 1, 20, 45, 2, 1, 32, 32, dict(causal=True), "chunk after a prefix: bottom-right alignment"),
    ("causal-sq>sk", 1, 45, 20, 2, 1, 32, 32, dict(causal=True), "first 25 rows see no key: out 0, lse -inf"),
    ("window-softcap-sinks-d80", 1, 33, 50, 4, 1, 80, 80, dict(window=(7, 3), softcap=2.0, sinks=True),
     "non-causal window both sides, Gemma softcap, gpt-oss sinks, padded head size 80"),
    ("mqa-d96-left-window", 1, 40, 40, 4, 1, 96, 96, dict(causal=True, window=(5, -1)), "MQA, Mistral window"),
    ("mla-192-128", 1, 24, 24, 2, 2, 192, 128, dict(causal=True, scale=0.1), "MLA prefill: v head size differs"),
    ("full-d32", 2, 18, 29, 2, 2, 32, 32, dict(), "no mask at all, Sq != Sk"),
]


def _launch(d, dv, device):
    """The tiles tests run with here: 16x16 in the interpreter, the device's own policy on a GPU."""
    return SMALL if not torch.cuda.is_available() else L.flash_policy(d, dv, torch.cuda.get_device_capability())


def _case_inputs(case, dtype, device):
    """q, k, v (dtype, requiring grad), sinks or None, and the case's options without 'sinks'."""
    _, b, sq, sk, hq, hkv, d, dv, opts, _ = case
    opts = dict(opts)
    q = torch.randn(b, sq, hq, d, device=device).to(dtype).requires_grad_()
    k = torch.randn(b, sk, hkv, d, device=device).to(dtype).requires_grad_()
    v = torch.randn(b, sk, hkv, dv, device=device).to(dtype).requires_grad_()
    sinks = (torch.randn(hq, device=device) * 2).requires_grad_() if opts.pop("sinks", False) else None
    return q, k, v, sinks, opts


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_forward_and_grads(backend, dtype, case, device):
    _, b, sq, sk, hq, hkv, d, dv, _, _ = case
    q, k, v, sinks, opts = _case_inputs(case, dtype, device)
    got = ks.flash_attention(q, k, v, sinks=sinks, return_lse=True, backend=backend, **opts)
    assert got.out.dtype == dtype and got.out.shape == (b, sq, hq, dv) and got.lse.shape == (b, hq, sq)
    ins = [q, k, v, sinks]
    want = _ref(*(t.detach().float().requires_grad_() for t in (q, k, v)), sinks=None if sinks is None else
                sinks.detach().clone().requires_grad_(), **opts)
    _close(got.out, want[0], dtype, False, "out")
    _lse_close(got.lse, want[1], dtype, "lse")
    cot = torch.randn_like(want[0])
    g = _grads(got.out, ins, cot.to(dtype))
    ref_ins = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref_sinks = None if sinks is None else sinks.detach().clone().requires_grad_()
    w = _grads(_ref(*ref_ins, sinks=ref_sinks, **opts)[0], ref_ins + [ref_sinks], cot)
    for name, a, e in zip(("dq", "dk", "dv", "dsinks"), g, w):
        _close(a.float(), e, dtype, True, name)
    if case[0] == "causal-sq>sk":
        assert torch.equal(got.out[:, :25].float(), torch.zeros_like(got.out[:, :25]).float())
        assert torch.isneginf(got.lse[..., :25]).all() and torch.isfinite(got.lse[..., 25:]).all()


@pytest.mark.parametrize("trans", [False, True], ids=["dsT-k", "kT-dsT"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_atomic_dq_gradients(dtype, case, trans, device, monkeypatch):
    """dQ added atomically by the dK/dV kernel (the GPU policy's path) equals the reference, and the
    separate dQ kernel does not run. trans: dQ^T = K^T dS^T (the launcher keeps it to head sizes
    <= 128; mla-192-128 runs the other product)."""
    _, b, sq, _, hq, _, d, dv, _, _ = case
    q, k, v, sinks, opts = _case_inputs(case, dtype, device)
    cot = torch.randn(b, sq, hq, dv, device=device)
    ref_ins = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref_sinks = None if sinks is None else sinks.detach().clone().requires_grad_()
    want = _grads(_ref(*ref_ins, sinks=ref_sinks, **opts)[0], ref_ins + [ref_sinks], cot)
    monkeypatch.setattr(L, "_flash_dq", lambda *a, **kw: pytest.fail("the dQ kernel ran on the atomic path"))
    with L.FLASH_TUNING.use(L.FlashTuning(dataclasses.replace(_launch(d, dv, device), atomic_dq=True,
                                                              dq_trans=trans))):
        out = ks.flash_attention(q, k, v, sinks=sinks, backend="triton", **opts)
        got = _grads(out, [q, k, v, sinks], cot.to(dtype))
    for name, a, e in zip(("dq", "dk", "dv", "dsinks"), got, want):
        _close(a.float(), e, dtype, True, name)


def test_atomic_dq_ragged_key_block_with_very_negative_scores(device):
    """Every score about -110: e^-lse overflows fp32, so a padded key past the ragged last block
    (k = 0, score 0) would put inf * 0 = NaN into dQ through the atomics unless it is masked."""
    k = (torch.ones(1, 29, 1, 32, device=device) + 0.1 * torch.randn(1, 29, 1, 32, device=device)).requires_grad_()
    q = (-20.0 + torch.randn(1, 18, 1, 32, device=device)).requires_grad_()
    v = torch.randn(1, 29, 1, 32, device=device).requires_grad_()
    cot = torch.randn(1, 18, 1, 32, device=device)
    with L.FLASH_TUNING.use(L.FlashTuning(dataclasses.replace(_launch(32, 32, device), atomic_dq=True))):
        got = _grads(ks.flash_attention(q, k, v, backend="triton"), [q, k, v], cot)
    ref_ins = [t.detach().requires_grad_() for t in (q, k, v)]
    want = _grads(_ref(*ref_ins)[0], ref_ins, cot)
    for name, a, e in zip("qkv", got, want):
        _close(a, e, torch.float32, True, "d" + name)


def test_deterministic_mode_uses_the_dq_kernel(device, monkeypatch):
    """torch.use_deterministic_algorithms(True): dQ comes from its own kernel, no atomics."""
    calls = []
    real = L._flash_dq
    monkeypatch.setattr(L, "_flash_dq", lambda *a, **kw: (calls.append(1), real(*a, **kw))[1])
    q, k, v = (torch.randn(1, 20, 2, 32, device=device).requires_grad_() for _ in range(3))
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with L.FLASH_TUNING.use(L.FlashTuning(dataclasses.replace(SMALL, atomic_dq=True))):
            out = ks.flash_attention(q, k, v, causal=True, backend="triton")
            got = _grads(out, [q, k, v], torch.ones_like(out))
    finally:
        torch.use_deterministic_algorithms(was)
    assert calls == [1]
    ref_ins = [t.detach().requires_grad_() for t in (q, k, v)]
    want = _grads(_ref(*ref_ins, causal=True)[0], ref_ins, torch.ones_like(out))
    for name, a, e in zip("qkv", got, want):
        _close(a, e, torch.float32, True, "d" + name)


def test_float16_and_default_scale(device):
    q, k, v = (torch.randn(1, 33, 2, 64, device=device).half() for _ in range(3))
    got = ks.flash_attention(q, k, v, causal=True, backend="triton")
    _close(got, _ref(q.float(), k.float(), v.float(), causal=True, scale=1 / 8)[0], torch.float16, False, "out")


def test_gqa_equals_mha_with_repeated_kv(device):
    q = torch.randn(1, 35, 8, 32, device=device, requires_grad=True)
    k = torch.randn(1, 35, 2, 32, device=device, requires_grad=True)
    v = torch.randn(1, 35, 2, 32, device=device, requires_grad=True)
    gqa = ks.flash_attention(q, k, v, causal=True, backend="triton")
    k4, v4 = k.repeat_interleave(4, 2), v.repeat_interleave(4, 2)
    mha = ks.flash_attention(q, k4, v4, causal=True, backend="triton")
    assert rel_err(gqa, mha) < 1e-6
    cot = torch.randn_like(gqa)
    g1 = torch.autograd.grad(gqa, (q, k, v), cot)
    g2 = torch.autograd.grad(mha, (q, k, v), cot)  # through repeat_interleave: sums the group
    for a, b in zip(g1, g2):
        assert rel_err(a, b) < 1e-5


def test_strided_inputs_are_honoured(device):
    """q, k, v from a fused qkv projection [B, S, 3, H, D], and q as a transposed [B, H, S, D]."""
    qkv = torch.randn(2, 21, 3, 2, 32, device=device)
    q, k, v = qkv.unbind(2)
    got = ks.flash_attention(q, k, v, causal=True, backend="triton")
    want = ks.flash_attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=True, backend="reference")
    assert rel_err(got, want) < 1e-5
    qt = torch.randn(2, 2, 21, 32, device=device).transpose(1, 2)
    got = ks.flash_attention(qt, k, v, backend="triton")
    assert rel_err(got, _ref(qt, k, v, causal=False)[0]) < 1e-5


@pytest.mark.parametrize("atomic", [False, True], ids=["dq-kernel", "atomic-dq"])
def test_strided_gradients(atomic, device):
    """Gradients of q, k, v that are views of a fused qkv [B, S, 3, H, D] (dQ's accumulator has its
    own contiguous layout on the atomic path)."""
    qkv = torch.randn(2, 37, 3, 2, 32, device=device).requires_grad_()
    q, k, v = qkv.unbind(2)
    cot = torch.randn(2, 37, 2, 32, device=device)
    with L.FLASH_TUNING.use(L.FlashTuning(dataclasses.replace(_launch(32, 32, device), atomic_dq=atomic))):
        (got,) = _grads(ks.flash_attention(q, k, v, causal=True, backend="triton"), [qkv], cot)
    ref = qkv.detach().clone().requires_grad_()
    (want,) = _grads(_ref(*ref.unbind(2), causal=True)[0], [ref], cot)
    _close(got, want, torch.float32, True, "dqkv")


# (id, query lengths, key lengths, options, why)
VARLEN = [
    ("causal", [0, 1, 17, 40], [0, 1, 30, 40], dict(causal=True), "empty, single token, chunk after a prefix, "
     "a sequence crossing three 16-row blocks"),
    ("window-sinks", [5, 19, 0], [5, 33, 7], dict(causal=True, window=(6, -1), sinks=True, softcap=3.0),
     "window + sinks + softcap per sequence; queries without keys of their own in the batch"),
    ("noncausal-no-keys", [3, 16], [0, 16], dict(), "a sequence with queries and no keys: out 0, lse -inf"),
]


@pytest.mark.parametrize("backend", BACKENDS + ["triton-atomic-dq"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("case", VARLEN, ids=lambda c: c[0])
def test_varlen_equals_per_sequence_dense(backend, dtype, case, device):
    if backend == "triton-atomic-dq":  # dQ by atomics into a [T, Hq, D] accumulator
        with L.FLASH_TUNING.use(L.FlashTuning(dataclasses.replace(_launch(32, 32, device), atomic_dq=True))):
            return test_varlen_equals_per_sequence_dense("triton", dtype, case, device)
    _, lq, lk, opts, _ = case
    opts = dict(opts)
    hq, hkv, d = 4, 2, 32
    cu_q = torch.tensor([0] + list(torch.tensor(lq).cumsum(0)), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + list(torch.tensor(lk).cumsum(0)), dtype=torch.int32, device=device)
    q = torch.randn(sum(lq), hq, d, device=device).to(dtype).requires_grad_()
    k = torch.randn(sum(lk), hkv, d, device=device).to(dtype).requires_grad_()
    v = torch.randn(sum(lk), hkv, d, device=device).to(dtype).requires_grad_()
    sinks = (torch.randn(hq, device=device)).requires_grad_() if opts.pop("sinks", False) else None
    got = ks.flash_attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk), sinks=sinks, return_lse=True,
                                    backend=backend, **opts)
    assert got.out.shape == q.shape and got.lse.shape == (hq, sum(lq))
    cot = torch.randn(got.out.shape, device=device)
    g = _grads(got.out, [q, k, v, sinks], cot.to(dtype))
    ref_ins = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref_sinks = None if sinks is None else sinks.detach().clone().requires_grad_()
    want, want_lse = R.attention_varlen(*ref_ins, cu_q, cu_k, sinks=ref_sinks, **{"causal": False, **opts})
    _close(got.out, want, dtype, False, "out")
    _lse_close(got.lse, want_lse, dtype, "lse")
    w = _grads(want, ref_ins + [ref_sinks], cot)
    for name, a, e in zip(("dq", "dk", "dv", "dsinks"), g, w):
        _close(a.float(), e, dtype, True, name)
    # per sequence, the dense op on that sequence gives the same rows
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for i in range(len(lq)):
        if lq[i] == 0:
            continue
        dense = ks.flash_attention(q[None, cq[i]:cq[i + 1]].detach(), k[None, ck[i]:ck[i + 1]].detach(),
                                   v[None, ck[i]:ck[i + 1]].detach(), sinks=None if sinks is None else sinks.detach(),
                                   backend=backend, **opts)
        assert rel_err(got.out[cq[i]:cq[i + 1]].detach(), dense[0]) < (1e-6 if dtype == torch.float32 else 1e-2)


def test_no_keys_dense(device):
    q = torch.randn(2, 5, 2, 16, device=device)
    k = torch.randn(2, 0, 1, 16, device=device)
    sinks = torch.randn(2, device=device)
    got = ks.flash_attention(q, k, k, sinks=sinks, return_lse=True, backend="triton")
    assert torch.equal(got.out, torch.zeros_like(got.out))
    assert torch.allclose(got.lse, sinks[None, :, None].expand(2, 2, 5))



def _masked_lse(lse):
    """The LSE with its -inf rows (no key, no sink) set to 0, so a loss can use it."""
    return lse.masked_fill(torch.isneginf(lse), 0.0)


# (id, lengths of the query sequences, of the key sequences (None: dense, one sequence), padding
# rows after the last query sequence, options, why)
LSE_GRAD_CASES = [
    ("dense-gqa-sinks-softcap", [20], None, 0, dict(causal=True, sinks=True, softcap=3.0),
     "d lse/d s = P: the gradient enters as delta - dlse in dK, dQ (both paths) and the sinks"),
    ("dense-sq>sk", [21], [9], 0, dict(causal=True), "rows without keys (lse -inf) take no LSE gradient"),
    ("dense-no-keys-sinks", [5], [0], 0, dict(sinks=True), "no key at all: lse = the sink, d lse/d sink = 1"),
    ("varlen-padded-sinks", [7, 0, 18], [7, 4, 30], 3, dict(causal=True, sinks=True, window=(5, -1)),
     "packed sequences with padding rows after them"),
]


@pytest.mark.parametrize("backend", BACKENDS + ["triton-atomic-dq"])
@pytest.mark.parametrize("case", LSE_GRAD_CASES, ids=lambda c: c[0])
def test_gradient_through_the_returned_lse(backend, case, device):
    """A loss that uses the returned LSE (ring / cascade attention merge partial results through it)
    gets its gradient: it used to be dropped without a word (q, k, sinks got the out-only gradient)."""
    atomic = backend == "triton-atomic-dq"
    backend = "triton" if atomic else backend
    _, lq, lk, pad, opts, _ = case
    opts = dict(opts)
    hq, hkv, d = 4, 2, 32
    varlen = lk is not None and len(lq) > 1
    lk = lk or lq
    q = torch.randn(sum(lq) + pad, hq, d, device=device)
    k = torch.randn(sum(lk), hkv, d, device=device)
    v = torch.randn(sum(lk), hkv, d, device=device)
    sinks = torch.randn(hq, device=device) if opts.pop("sinks", False) else None
    ins = [t.clone().requires_grad_() for t in (q, k, v)] + ([sinks.clone().requires_grad_()] if sinks is not None
                                                          else [])
    ref_ins = [t.clone().requires_grad_() for t in ins]
    s, rs = (ins[3], ref_ins[3]) if sinks is not None else (None, None)
    with L.FLASH_TUNING.use(L.FlashTuning(dataclasses.replace(_launch(d, d, device), atomic_dq=atomic))):
        if varlen:
            cu_q = torch.tensor([0] + torch.tensor(lq).cumsum(0).tolist(), dtype=torch.int32, device=device)
            cu_k = torch.tensor([0] + torch.tensor(lk).cumsum(0).tolist(), dtype=torch.int32, device=device)
            out, lse = ks.flash_attention_varlen(*ins[:3], cu_q, cu_k, max(lq), max(lk), sinks=s, return_lse=True,
                                                 backend=backend, **opts)
            want_out, want_lse = R.attention_varlen(*ref_ins[:3], cu_q, cu_k, sinks=rs, **{"causal": False, **opts})
            rows = sum(lq)  # padding rows are unspecified: no loss on them
            out, want_out, lse, want_lse = out[:rows], want_out[:rows], lse[:, :rows], want_lse[:, :rows]
        else:
            out, lse = ks.flash_attention(*(t[None] for t in ins[:3]), sinks=s, return_lse=True, backend=backend,
                                          **opts)
            want_out, want_lse = _ref(*(t[None] for t in ref_ins[:3]), sinks=rs, **opts)
        cot, cot_lse = torch.randn_like(want_out), torch.randn_like(want_lse)
        got = _grads([out, _masked_lse(lse)], ins, [cot, cot_lse])
    want = _grads([want_out, _masked_lse(want_lse)], ref_ins, [cot, cot_lse])
    for name, a, e in zip(("dq", "dk", "dv", "dsinks"), got, want):
        if name == "dq" and pad:
            a, e = a[:-pad], e[:-pad]
        _close(a, e, torch.float32, True, name)


def test_varlen_padding_rows_do_not_reach_the_sinks_gradient(device):
    """Rows past cu_seqlens_q[-1] (a packed batch padded to a fixed size) have unwritten out and lse
    (NaN under KS_POISON_OUTPUTS, stale memory on a GPU): the sinks' gradient, a sum over rows,
    used to take them in and came out NaN."""
    q = torch.randn(8, 2, 16, device=device, requires_grad=True)
    k = torch.randn(8, 2, 16, device=device, requires_grad=True)
    sinks = torch.randn(2, device=device, requires_grad=True)
    cu = torch.tensor([0, 5], dtype=torch.int32, device=device)
    out = ks.flash_attention_varlen(q, k, k, cu, cu, 5, 5, causal=True, sinks=sinks, backend="triton")
    cot = torch.randn(5, 2, 16, device=device)
    (got,) = _grads(out[:5], [sinks], cot)
    ref_s = sinks.detach().clone().requires_grad_()
    want, _ = R.attention_varlen(q.detach(), k.detach(), k.detach(), cu, cu, causal=True, sinks=ref_s)
    (want,) = _grads(want[:5], [ref_s], cot)
    _close(got, want, torch.float32, True, "dsinks")


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_strided_sinks_are_honoured(varlen, device):
    """sinks as a strided view (every other head's sink of a larger table): the kernels index the
    sinks by head with unit stride and used to read the wrong heads' logits."""
    table = torch.randn(8, device=device, requires_grad=True)
    sinks = table[::2]
    q, k, v = (torch.randn(1, 9, h, 16, device=device) for h in (4, 2, 2))
    cot = torch.randn(1, 9, 4, 16, device=device)
    if varlen:
        cu = torch.tensor([0, 9], dtype=torch.int32, device=device)
        out = ks.flash_attention_varlen(q[0], k[0], v[0], cu, cu, 9, 9, causal=True, sinks=sinks, backend="triton")[None]
    else:
        out = ks.flash_attention(q, k, v, causal=True, sinks=sinks, backend="triton")
    (got,) = _grads(out, [table], cot)
    ref_table = table.detach().clone().requires_grad_()
    want_out, _ = _ref(q, k, v, causal=True, sinks=ref_table[::2])
    (want,) = _grads(want_out, [ref_table], cot)
    _close(out, want_out, torch.float32, False, "out")
    _close(got, want, torch.float32, True, "dsinks")


def _base():
    return dict(q=torch.randn(2, 8, 4, 16), k=torch.randn(2, 8, 2, 16), v=torch.randn(2, 8, 2, 16))


@pytest.mark.parametrize("change,match", [
    (dict(q=torch.randn(2, 8, 4)), "4-D"),
    (dict(q=torch.randn(2, 8, 3, 16)), "multiple"),
    (dict(k=torch.randn(2, 8, 2, 8), v=torch.randn(2, 8, 2, 8)), "head size"),
    (dict(v=torch.randn(2, 9, 2, 16)), "'v'"),
    (dict(k=torch.randn(3, 8, 2, 16), v=torch.randn(3, 8, 2, 16)), "batch"),
    (dict(q=torch.randn(2, 8, 4, 16, dtype=torch.float16)), "dtype"),
    (dict(q=torch.randn(2, 8, 4, 32)[..., ::2]), "unit-stride"),
    (dict(scale=0.0), "scale"),
    (dict(softcap=-1.0), "softcap"),
    (dict(window=(1, 2, 3)), "window"),
    (dict(sinks=torch.randn(2)), "sinks"),
    (dict(q=torch.randint(0, 3, (2, 8, 4, 16))), "dtype"),
], ids=["q-3d", "heads", "head-size", "v-shape", "batch", "mixed-dtype", "strided-last", "scale", "softcap",
        "window", "sinks-shape", "int-q"])
def test_bad_input(change, match):
    args = _base()
    args.update(change)
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    with pytest.raises((ValueError, TypeError), match=match):
        ks.flash_attention(q, k, v, **args)


@pytest.mark.parametrize("change,match", [
    (dict(cu_seqlens_q=torch.tensor([0, 3, 9], dtype=torch.int32)), "cu_seqlens_q"),
    (dict(cu_seqlens_k=torch.tensor([0, 5, 2], dtype=torch.int32)), "cu_seqlens_k"),
    (dict(cu_seqlens_q=torch.tensor([0, 3], dtype=torch.int32)), "cu_seqlens_k"),
    (dict(cu_seqlens_q=torch.tensor([0, 3, 8], dtype=torch.int64)), "cu_seqlens_q"),
    (dict(max_seqlen_q=4), "max_seqlen_q"),
    (dict(max_seqlen_k=-1), "max_seqlen_k"),
], ids=["q-past-T", "k-decreasing", "lengths-differ", "int64", "max-q", "max-k-negative"])
def test_varlen_bad_input(change, match):
    args = dict(q=torch.randn(8, 4, 16), k=torch.randn(8, 2, 16), v=torch.randn(8, 2, 16),
                cu_seqlens_q=torch.tensor([0, 3, 8], dtype=torch.int32),
                cu_seqlens_k=torch.tensor([0, 2, 8], dtype=torch.int32), max_seqlen_q=5, max_seqlen_k=6)
    args.update(change)
    with pytest.raises((ValueError, TypeError), match=match):
        ks.flash_attention_varlen(**args)


def test_unknown_backend_and_sdpa_request_explains(device):
    q = torch.randn(1, 8, 2, 16, device=device)
    with pytest.raises(ValueError, match="sdpa_cudnn"):
        ks.flash_attention(q, q, q, backend="nope")
    if device.type == "cpu":
        with pytest.raises(ks.UnsupportedError, match="no CPU kernel"):
            ks.flash_attention(q, q, q, backend="sdpa_cudnn")
    with pytest.raises(ks.UnsupportedError, match="sinks"):
        ks.flash_attention(q, q, q, sinks=torch.zeros(2, device=device), backend="sdpa_cudnn")


def test_compile_fullgraph_with_backward(device):
    q = torch.randn(1, 20, 4, 32, device=device, requires_grad=True)
    k = torch.randn(1, 20, 2, 32, device=device, requires_grad=True)
    v = torch.randn(1, 20, 2, 32, device=device, requires_grad=True)
    sinks = torch.randn(4, device=device, requires_grad=True)

    def f(q, k, v, s):
        a = ks.flash_attention(q, k, v, causal=True, sinks=s, softcap=5.0, return_lse=True)
        return (a.out * 2).sum() + a.lse.sum() * 0

    eager = torch.autograd.grad(f(q, k, v, sinks), (q, k, v, sinks))
    comp = torch.autograd.grad(torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v, sinks), (q, k, v, sinks))
    for a, b in zip(eager, comp):
        assert rel_err(b, a) < 1e-6



@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_compile_with_a_named_backend(backend, device):
    """torch.compile of a call naming its backend: the request used to be parsed through the enums'
    raise-and-catch lookup, which Dynamo cannot trace (InternalTorchDynamoError, with or without
    fullgraph)."""
    q = torch.randn(1, 12, 4, 32, device=device, requires_grad=True)
    k = torch.randn(1, 12, 2, 32, device=device, requires_grad=True)

    def f(q, k):
        return ks.flash_attention(q, k, k, causal=True, backend=backend).square().sum()

    eager = torch.autograd.grad(f(q, k), (q, k))
    comp = torch.autograd.grad(torch.compile(f, fullgraph=True, backend="aot_eager")(q, k), (q, k))
    for a, b in zip(eager, comp):
        assert rel_err(b, a) < 1e-6


def test_explain_lists_candidates_with_reasons(device):
    q = torch.randn(1, 8, 2, 16, device=device)
    exp = ks.explain("flash_attention", q, q, q, causal=True, softcap=3.0, verbose=False)
    names = [str(c.backend) for c in exp.candidates]
    assert names[0] == "triton" and names[-1] == "reference"
    assert {"sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "flash_attn"} <= set(names)
    sdpa = {str(c.backend): c.reason for c in exp.candidates if str(c.backend).startswith("sdpa")}
    assert all(r and "softcap" in r for r in sdpa.values()), sdpa


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors through the Triton interpreter (CI); on the GPU "
                    "machine Triton rejects CPU tensors and the expected ranking differs")
def test_measured_table_decides_auto_and_explain_names_the_row(monkeypatch):
    """A row ranking the reference first makes AUTO pick it (with the row in the reasons); a named
    backend still runs; without a matching row the priorities decide."""
    from kernelset.ops.attention import dispatch_table
    row = dict(arch="sm_90", dtype="float32", head_dim="16", causal=True, mode="fwd", shape_class="short",
               order=["reference", "triton"], ms={"reference": 1.0, "triton": 2.0}, shape=[1, 8, 2, 2, 16, 16])
    table = {"format": 1, "measured_on": [{"device": "test", "date": "today"}], "rows": [row]}
    monkeypatch.setattr(dispatch_table, "TABLE", table)
    monkeypatch.setattr(BK, "device_arch", lambda dev: (9, 0))
    dispatch.clear_cache()
    q = torch.randn(1, 8, 2, 16)
    exp = ks.explain("flash_attention", q, q, q, causal=True, verbose=False)
    assert str(exp.chosen) == "reference"
    reason = next(c.reason for c in exp.candidates if str(c.backend) == "triton")
    assert "table row sm_90/float32/d16/causal/fwd/short ranks reference first" in reason
    assert "table=sm_90/float32/d16/causal/fwd/short" in str(exp)
    assert str(dispatch.select("flash_attention", "auto", (q, q, q), dict(causal=True)).backend) == "reference"
    assert str(dispatch.select("flash_attention", "triton", (q, q, q), dict(causal=True, request="triton")).backend) \
        == "triton"
    ks.flash_attention(q, q, q, causal=True, backend="triton")  # a named backend ignores the table
    exp = ks.explain("flash_attention", q, q, q, causal=False, verbose=False)  # no row: priorities
    assert str(exp.chosen) == "triton"
    dispatch.clear_cache()


# ---- training through SDPA's own autograd ------------------------------------------------------


def _qkv_grad(device, b=1, sq=24, sk=24, hq=4, hkv=2, d=32, dtype=torch.float32):
    return (torch.randn(b, sq, hq, d, device=device).to(dtype).requires_grad_(),
            torch.randn(b, sk, hkv, d, device=device).to(dtype).requires_grad_(),
            torch.randn(b, sk, hkv, d, device=device).to(dtype).requires_grad_())



# The refusals a named backend may give in the tests below, each with its reason; any other refusal
# fails the test: a backend that starts refusing a case it used to run must not turn into a skip.
EXPECTED_REFUSALS = (
    # (backend prefix, device type or None for any, pattern of the reason, why it is expected)
    ("sdpa_", "cpu", r"no CPU kernel", "torch has no CPU kernel for this SDPA backend"),
    ("flash_attn", None, r"cannot import flash_attn", "the flash-attn package is not installed (CI, the lent GPU image)"),
    # torch's own can_use_* verdict for its backend (fp32 for flash and cuDNN, GQA or a head size for the
    # efficient kernel on the lent H200's torch 2.11): kernelset asks torch and never overrides it
    ("sdpa_", "cuda", r"torch\.backends\.cuda\.can_use_\w+_attention", "torch's own check refuses this call"),
)


def _run_or_expected_refusal(fn, backend: str, device):
    """``fn()``, or a skip when the backend refuses for a reason EXPECTED_REFUSALS lists."""
    try:
        return fn()
    except ks.UnsupportedError as exc:
        kind = torch.device(device).type
        for prefix, dev, pattern, why in EXPECTED_REFUSALS:
            if backend.startswith(prefix) and dev in (None, kind) and re.search(pattern, exc.reason):
                pytest.skip(f"{backend} on {kind}: {why} ({exc.reason})")
        raise


def _through_sdpa(out) -> bool:
    """Our op records EagerAutograd (eager) or the custom op's backward; SDPA records its own nodes."""
    names = []
    fn = out.grad_fn
    while fn is not None and len(names) < 4:
        names.append(type(fn).__name__)
        fn = fn.next_functions[0][0] if fn.next_functions else None
    return not any("EagerAutograd" in n or "kernelset" in n for n in names)


@pytest.mark.parametrize("backend", ["sdpa_flash", "sdpa_efficient", "sdpa_cudnn"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_sdpa_training_gradients_equal_reference(backend, dtype, causal, device):
    """A named SDPA backend under autograd (no return_lse) runs SDPA's own backward."""
    q, k, v = _qkv_grad(device, b=2, sq=37, sk=37, dtype=dtype)
    out = _run_or_expected_refusal(lambda: ks.flash_attention(q, k, v, causal=causal, backend=backend), backend,
                                   device)
    assert _through_sdpa(out), out.grad_fn
    assert out.shape == q.shape and out.dtype == dtype
    ref_ins = [t.detach().float().requires_grad_() for t in (q, k, v)]
    want = _ref(*ref_ins, causal=causal)[0]
    _close(out.float(), want, dtype, False, "out")
    cot = torch.randn_like(want)
    for name, a, e in zip(("dq", "dk", "dv"), torch.autograd.grad(out, (q, k, v), cot.to(dtype)),
                          torch.autograd.grad(want, ref_ins, cot)):
        _close(a.float(), e, dtype, True, name)


@pytest.mark.parametrize("opts,why", [
    (dict(return_lse=True), "no LSE"), (dict(sinks=True), "sinks"), (dict(softcap=2.0), "softcap"),
    (dict(window=(4, -1), causal=True), "sliding window"), (dict(causal=True, sk=30), "top-left"),
], ids=["return_lse", "sinks", "softcap", "window", "causal-sq!=sk"])
def test_sdpa_training_rejections(opts, why, device):
    opts = dict(opts)
    q, k, v = _qkv_grad(device, sk=opts.pop("sk", 24))
    if opts.pop("sinks", False):
        opts["sinks"] = torch.randn(4, device=device, requires_grad=True)
    with pytest.raises(ks.UnsupportedError, match=why):
        ks.flash_attention(q, k, v, backend="sdpa_flash", **opts)
    cu = torch.tensor([0, 24], dtype=torch.int32, device=device)
    with pytest.raises(ks.UnsupportedError, match="no such implementation|varlen"):
        ks.flash_attention_varlen(q[0], k[0], v[0], cu, cu, 24, 24, backend="sdpa_flash")


def _train_table(monkeypatch, order, head_dim=32):
    """The attention table replaced by a "train" row ranking ``order`` (and a "fwd" row ranking the
    reference first) for fp32, causal, short sequences of ``head_dim``, on a stand-in sm_90."""
    from kernelset.ops.attention import dispatch_table
    rows = [dict(arch="sm_90", dtype="float32", head_dim=str(head_dim), causal=True, mode=mode, shape_class="short",
                 order=order, ms={n: float(i + 1) for i, n in enumerate(order)},
                 shape=[1, 24, 4, 2, head_dim, head_dim])
            for mode in ("train", "fwd")]
    rows[1]["order"] = ["reference"]
    monkeypatch.setattr(dispatch_table, "TABLE", {"format": 1, "measured_on": [{"device": "test", "date": "today"}],
                                                  "rows": rows})
    monkeypatch.setattr(BK, "device_arch", lambda dev: (9, 0))
    dispatch.clear_cache()
    from kernelset.ops.attention import api
    api._family_cache.clear()


def test_auto_training_follows_the_train_row(monkeypatch):
    """A "train" row ranking SDPA first sends AUTO training calls to SDPA's autograd (explain names the
    row); inference and return_lse calls use their own modes; a train row ranking our op first keeps it.
    CPU tensors (torch's CPU flash kernel is sdpa_flash), also on the GPU machine."""
    _train_table(monkeypatch, ["sdpa_flash", "triton", "reference"])
    q, k, v = _qkv_grad("cpu")
    exp = ks.explain("flash_attention", q, k, v, causal=True, verbose=False)
    assert str(exp.chosen) == "sdpa_flash", str(exp)
    assert "table=sm_90/float32/d32/causal/train/short" in str(exp)
    reason = next(c.reason for c in exp.candidates if str(c.backend) == "triton")
    assert "table row sm_90/float32/d32/causal/train/short ranks sdpa_flash first" in reason or "CUDA" in reason
    out = ks.flash_attention(q, k, v, causal=True)
    assert _through_sdpa(out)
    ref_ins = [t.detach().requires_grad_() for t in (q, k, v)]
    want = ks.flash_attention(*ref_ins, causal=True, backend="reference")
    assert rel_err(out, want) < 1e-5
    cot = torch.randn_like(out)
    for a, e in zip(torch.autograd.grad(out, (q, k, v), cot), torch.autograd.grad(want, ref_ins, cot)):
        assert rel_err(a, e) < 1e-5
    with torch.no_grad():  # inference: the "fwd" row (the reference)
        exp = ks.explain("flash_attention", q, k, v, causal=True, verbose=False)
        assert str(exp.chosen) == "reference" and "fwd/short" in str(exp), str(exp)
    lse_out = ks.flash_attention(q, k, v, causal=True, return_lse=True)  # training with the LSE: our op
    assert not _through_sdpa(lse_out.out)
    exp = ks.explain("flash_attention", q, k, v, causal=True, return_lse=True, verbose=False)
    assert "no LSE" in next(c.reason for c in exp.candidates if str(c.backend) == "sdpa_flash")
    _train_table(monkeypatch, ["reference", "sdpa_flash"])  # a row ranking our op first keeps it
    assert not _through_sdpa(ks.flash_attention(q, k, v, causal=True))
    dispatch.clear_cache()


@pytest.mark.parametrize("backend", ["auto", "reference", "triton"])
def test_layout_bhsd_equals_bshd(backend, device):
    """layout="bhsd" takes and returns [B, H, S, D]: the same values and gradients as the [B, S, H, D]
    call on the same memory, and the same LSE."""
    q, k, v = _qkv_grad(device, b=2, sq=21, sk=21)
    want = _run_or_expected_refusal(lambda: ks.flash_attention(q, k, v, causal=True, return_lse=True,
                                                               backend=backend), backend, device)
    got = ks.flash_attention(*(t.transpose(1, 2) for t in (q, k, v)), causal=True, return_lse=True,
                             layout="bhsd", backend=backend)
    assert got.out.shape == (2, 4, 21, 32)
    assert torch.equal(got.out.transpose(1, 2), want.out) and torch.equal(got.lse, want.lse)
    cot = torch.randn_like(want.out)
    for a, b in zip(torch.autograd.grad(want.out, (q, k, v), cot),
                    torch.autograd.grad(got.out, (q, k, v), cot.transpose(1, 2))):
        assert torch.equal(a, b)


def test_layout_errors(device):
    q, k, v = _qkv_grad(device)
    with pytest.raises(ks.ArgumentError, match="layout"):
        ks.flash_attention(q, k, v, layout="nhd")
    with pytest.raises(ks.ArgumentError, match=r"'q'.*4-D"):
        ks.flash_attention(q[0], k, v, layout="bhsd")  # (named argument and rank)


def test_training_through_sdpa_bhsd_records_no_transpose(monkeypatch):
    """A training call SDPA runs with layout="bhsd" hands the caller's tensors to SDPA: the output's
    grad_fn is SDPA's own node (no TransposeBackward of ours above or below it), and the gradients
    equal the [B, S, H, D] call's."""
    _train_table(monkeypatch, ["sdpa_flash", "triton", "reference"])
    q, k, v = _qkv_grad("cpu")
    qh, kh, vh = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    out = ks.flash_attention(qh, kh, vh, causal=True, layout="bhsd")
    name = type(out.grad_fn).__name__
    assert "Attention" in name and "Transpose" not in name, name
    assert all("Transpose" not in type(f).__name__ for f, _ in out.grad_fn.next_functions if f is not None)
    want = ks.flash_attention(q, k, v, causal=True)
    assert rel_err(out.transpose(1, 2), want) < 1e-6
    cot = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(out, (qh, kh, vh), cot.transpose(1, 2)),
                    torch.autograd.grad(want, (q, k, v), cot)):
        assert rel_err(a.transpose(1, 2), b) < 1e-6
    dispatch.clear_cache()


def _record_sdpa_train(monkeypatch) -> list:
    """backends.sdpa_train wrapped: the returned list gets the backend of every call."""
    calls = []
    real = BK.sdpa_train

    def counting(*args):
        calls.append(args[0])
        return real(*args)

    monkeypatch.setattr(BK, "sdpa_train", counting)
    return calls


def test_compile_fullgraph_training_through_sdpa(monkeypatch):
    _train_table(monkeypatch, ["sdpa_flash", "triton"])
    q, k, v = _qkv_grad("cpu")
    traced = _record_sdpa_train(monkeypatch)

    def f(q, k, v):
        return (ks.flash_attention(q, k, v, causal=True) * 2).sum()

    eager = torch.autograd.grad(f(q, k, v), (q, k, v))
    comp = torch.autograd.grad(torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v), (q, k, v))
    for a, b in zip(eager, comp):
        assert rel_err(b, a) < 1e-6
    assert traced == ["sdpa_flash", "sdpa_flash"], traced  # eager, then the trace: both through SDPA
    dispatch.clear_cache()


def test_policy_covers_every_head_size():
    for d, dv in ((64, 64), (80, 80), (96, 96), (128, 128), (192, 128), (256, 256)):
        for arch in ((8, 0), (9, 0)):
            p = L.flash_policy(d, dv, arch)
            assert p.block_m >= 16 and p.block_n >= 16 and p.dkdv_m >= 16 and p.dq_n >= 16


# ---- GPU-only: real sizes, peers, CUDA graphs ----------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 1024, 16, 4, 128), (1, 777, 8, 8, 64), (1, 512, 8, 2, 256)],
                         ids=["gqa-d128", "odd-len-d64", "d256"])
def test_gpu_real_size_forward_backward(shape):
    b, s, hq, hkv, d = shape
    q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = ks.flash_attention(q, k, v, causal=True, backend="triton")
    ref_ins = [t.detach().float().requires_grad_() for t in (q, k, v)]
    want = _ref(*ref_ins, causal=True)[0]
    _close(out, want, torch.bfloat16, False, "out")
    cot = torch.randn_like(want)
    for name, a, e in zip("qkv", torch.autograd.grad(out, (q, k, v), cot.bfloat16()),
                          torch.autograd.grad(want, ref_ins, cot)):
        _close(a.float(), e, torch.bfloat16, True, "d" + name)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "flash_attn", "auto"])
def test_gpu_candidates_agree_with_reference(backend):
    q, k, v = (torch.randn(2, 512, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = _run_or_expected_refusal(lambda: ks.flash_attention(q, k, v, causal=True, backend=backend), backend, "cuda")
    _close(out, _ref(q.float(), k.float(), v.float(), causal=True)[0], torch.bfloat16, False, backend)


def test_decode_shape_class_and_auto_skips_cudnn(device):
    """A few query tokens against a longer KV sequence is the "decode" class (its own table rows);
    AUTO never picks cuDNN there (a plan per KV length), and explain says why."""
    assert BK.shape_class(4096, 1) == "decode" and BK.shape_class(17, 16) == "decode"
    assert BK.shape_class(16, 16) == "short" and BK.shape_class(4096, 17) == "medium"
    q = torch.randn(2, 1, 4, 32, device=device)
    k, v = torch.randn(2, 40, 2, 32, device=device), torch.randn(2, 40, 2, 32, device=device)
    exp = ks.explain("flash_attention", q, k, v, verbose=False)
    assert exp.problem["shape_class"] == "decode"
    reason = next(c.reason for c in exp.candidates if str(c.backend) == "sdpa_cudnn")
    assert "decode" in reason and "execution plan" in reason, reason
    out = ks.flash_attention(q, k, v)
    torch.testing.assert_close(out, _ref(q, k, v, causal=False)[0], atol=2e-5, rtol=2e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["sdpa_cudnn", "sdpa_flash", "sdpa_efficient"])
@pytest.mark.parametrize("shape", [(3, 1, 32, 8, 700, 128), (2, 64, 16, 16, 64, 64), (1, 5, 8, 2, 300, 128)],
                         ids=["decode-gqa", "square", "verify-gqa"])
def test_gpu_sdpa_direct_call_equals_f_sdpa(backend, shape, monkeypatch):
    """The direct call of SDPA's kernel gives F.scaled_dot_product_attention's bits (under the same
    pinned backend), for decode-shaped GQA calls too."""
    b, sq, hq, hkv, sk, d = shape
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(b, hkv, sk + 7, d, device="cuda", dtype=torch.bfloat16)  # HF's cache layout, sliced
    vc = torch.randn(b, hkv, sk + 7, d, device="cuda", dtype=torch.bfloat16)
    k, v = kc[:, :, :sk].transpose(1, 2), vc[:, :, :sk].transpose(1, 2)
    direct = _run_or_expected_refusal(lambda: ks.flash_attention(q, k, v, backend=backend), backend, "cuda")
    monkeypatch.setattr(BK, "_DIRECT_SDPA", False)
    pinned = ks.flash_attention(q, k, v, backend=backend)
    assert torch.equal(direct, pinned)
    _close(direct, _ref(q.float(), k.float(), v.float(), causal=False)[0], torch.bfloat16, False, backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["sdpa_cudnn", "sdpa_flash"])
@pytest.mark.parametrize("hkv", [8, 2], ids=["mha", "gqa"])
def test_gpu_sdpa_training_direct_equals_f_sdpa(backend, hkv, monkeypatch):
    """A training call through SDPA's kernel op directly (no sdpa_kernel context) gives
    F.scaled_dot_product_attention's output bit for bit, in both layouts, and its gradients (torch's
    flash backward accumulates dQ with atomics: not bitwise even run to run, so within tolerance)."""
    b, s, hq, d = 2, 300, 8, 64
    base = [torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for h in (hq, hkv, hkv)]
    cot = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16)
    res = []
    for direct in (True, False):
        monkeypatch.setattr(BK, "_DIRECT_SDPA", direct)
        for layout in ("bshd", "bhsd"):
            q, k, v = (t.clone().requires_grad_() for t in base)
            ins = (q, k, v) if layout == "bshd" else tuple(t.transpose(1, 2) for t in (q, k, v))
            out = _run_or_expected_refusal(lambda: ks.flash_attention(*ins, causal=True, layout=layout,
                                                                      backend=backend), backend, "cuda")
            out = out if layout == "bshd" else out.transpose(1, 2)
            res.append((out.detach(), *torch.autograd.grad(out, (q, k, v), cot)))
    for other in res[1:]:
        assert torch.equal(res[0][0], other[0])
        for name, a, e in zip(("dq", "dk", "dv"), res[0][1:], other[1:]):
            assert rel_err(a.float(), e.float()) < 1e-2, name
    ref_ins = [t.float().requires_grad_() for t in base]
    want = _ref(*ref_ins, causal=True)[0]
    _close(res[0][0], want, torch.bfloat16, False, backend)


@pytest.mark.gpu
def test_gpu_cuda_graph_varlen():
    lens = [100, 0, 700, 1]
    cu = torch.tensor([0, 100, 100, 800, 801], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(801, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    kw = dict(causal=True, check_bounds=False)
    ks.flash_attention_varlen(q, k, v, cu, cu, 1024, 1024, **kw)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ks.flash_attention_varlen(q, k, v, cu, cu, 1024, 1024, **kw)
    g.replay()
    torch.cuda.synchronize()
    want = R.attention_varlen(q, k, v, cu, cu, causal=True)[0]
    _close(out, want, torch.bfloat16, False, f"graph {lens}")


_AOT = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernelset.ops.attention import kernels as K
from kernelset.ops.attention.launch import flash_policy

def run(fn, sig, consts, warps, stages, arch, name):
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n, ty in sig.items()
             if ty is not None and (ty.startswith("*") or n.startswith("stride"))}
    consts = {**consts, **{n: None for n, ty in sig.items() if ty is None}}
    full = {n: sig[n] if sig.get(n) is not None else "constexpr" for n in fn.arg_names}
    src = ASTSource(fn, signature=full, constexprs=consts, attrs=attrs)
    c = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=warps, num_stages=stages))
    ptx = c.asm["ptx"]
    return dict(case=name, local="ld.local" in ptx or "st.local" in ptx, vec=".v4" in ptx or ".v2" in ptx)

def strides(*names):
    return {f"stride_{n}{x}": "i32" for n in names for x in "bsh"}

out = []
for arch in (90, 80):
    for d, dv, extra in ((64, 64, False), (128, 128, False), (128, 128, True), (256, 256, False), (192, 128, False)):
        if arch == 80 and (d, extra) != (128, False) and d != 256:
            continue
        p = flash_policy(d, dv, (arch // 10, arch % 10))
        bd, bdv = max(triton.next_power_of_2(d), 16), max(triton.next_power_of_2(dv), 16)
        flags = dict(VARLEN=extra, MASK_RIGHT=True, MASK_LEFT=extra, SOFTCAP=extra, F32=False)
        common = dict(G=4, D=d, BLOCK_D=bd, BLOCK_DV=bdv, **flags)
        tag = f"d{d}{'/' + str(dv) if dv != d else ''}{'-opts' if extra else ''}-sm{arch}"
        base = dict(CUQ="*i32" if extra else None, CUK="*i32" if extra else None, qk_mul="fp32", cap_mul="fp32")
        sig = dict(Q="*bf16", K="*bf16", V="*bf16", O="*bf16", LSE="*fp32", SINKS="*fp32" if extra else None, **base,
                   window_left="i32", window_right="i32", seq_q="i32", seq_k="i32", **strides("q", "k", "v", "o"),
                   stride_lb="i32", stride_lh="i32", Hq="i32")
        out.append(run(K._flash_attn_fwd_kernel, sig, dict(DV=dv, BLOCK_M=p.block_m, BLOCK_N=p.block_n,
                       HAS_SINKS=extra, **common), p.num_warps, p.num_stages, arch, "fwd-" + tag))
        sig = dict(Q="*bf16", K="*bf16", V="*bf16", DO="*bf16", LSE="*fp32", DELTA="*fp32", DK="*bf16", DV="*bf16",
                   DQA="*fp32" if p.atomic_dq else "*bf16", **base, dk_mul="fp32", dq_mul="fp32", window_left="i32",
                   window_right="i32", seq_q="i32", seq_k="i32", **strides("q", "k", "v", "do", "dk", "dv", "dqa"),
                   stride_lb="i32", stride_lh="i32", Hkv="i32")
        out.append(run(K._flash_attn_bwd_dkdv_kernel, sig, dict(DVH=dv, BLOCK_M=p.dkdv_m, BLOCK_N=p.dkdv_n,
                       ATOMIC_DQ=p.atomic_dq, DQ_TRANS=p.dq_trans, **common), p.dkdv_warps, p.dkdv_stages, arch,
                       "dkdv-" + tag))
        sig = dict(Q="*bf16", K="*bf16", V="*bf16", DO="*bf16", LSE="*fp32", DELTA="*fp32", DQ="*bf16", **base,
                   dq_mul="fp32", window_left="i32", window_right="i32", seq_q="i32", seq_k="i32",
                   **strides("q", "k", "v", "do", "dq"), stride_lb="i32", stride_lh="i32", Hq="i32")
        out.append(run(K._flash_attn_bwd_dq_kernel, sig, dict(DVH=dv, BLOCK_M=p.dq_m, BLOCK_N=p.dq_n, **common),
                       p.dq_warps, p.dq_stages, arch, "dq-" + tag))
sig = dict(O="*bf16", DO="*bf16", DELTA="*fp32", R="i32", Hq="i32", seq_q="i32", stride_ot="i32", stride_oh="i32",
           stride_dot="i32", stride_doh="i32", stride_lb="i32", stride_lh="i32")
out.append(run(K._flash_attn_bwd_pre_kernel, sig, dict(DV=128, BLOCK_R=32, BLOCK_DV=128, VARLEN=False), 4, 1, 90,
               "bwd-pre"))
print(json.dumps(out))
"""


def test_kernels_compile_for_sm90_and_sm80():
    """Forward, dK/dV and dQ kernels compile for sm_90 (D 64, 128 with every option, 192/128, 256)
    and sm_80 (D 128, 256) with the policy's tiles, without spills, with vector loads."""
    compile_report(_AOT, 22)


@pytest.mark.gpu
@pytest.mark.parametrize("how", ["pointer+2", "row-of-65"], ids=["unaligned-pointer", "unaligned-row-stride"])
def test_gpu_auto_on_misaligned_views_matches_reference(how):
    """SDPA's CUDA kernels assume 16-byte aligned pointers and strides without checking: on such
    bf16 views AUTO used to pick cuDNN, which returned wrong results with no error (H100, torch
    2.11; flash faulted). Those views now go to a backend that honours them."""
    b, s, h, d = 2, 256, 8, 64
    if how == "pointer+2":
        bufs = [torch.randn(b * s * h * d + 1, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        q, k, v = (t[1:].view(b, s, h, d) for t in bufs)
    else:
        q, k, v = (torch.randn(b, s, h, d + 1, device="cuda", dtype=torch.bfloat16)[..., :d] for _ in range(3))
    assert not BK._aligned16(q, k, v)
    out = ks.flash_attention(q, k, v, causal=True)
    want = _ref(*(t.float() for t in (q, k, v)), causal=True)[0]
    _close(out.float(), want, torch.bfloat16, False, f"out ({ks.explain('flash_attention', q, k, v, causal=True, verbose=False).chosen})")


@pytest.mark.gpu
def test_gpu_empty_batch_and_sequences_after_a_cached_choice():
    """Decisions are cached per key: an empty batch or empty sequences after a cached SDPA choice
    used to run SDPA anyway (cuDNN returned no output: AttributeError; empty sequences: "No
    available kernel")."""
    q, k, v = (torch.randn(2, 256, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ks.flash_attention(q, k, v, causal=True)
    for shape in ((0, 256, 8, 64), (2, 0, 8, 64), (2, 1, 8, 64)):
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out = ks.flash_attention(q, k, v, causal=True)
        assert out.shape == shape
        if out.numel():
            _close(out.float(), _ref(*(t.float() for t in (q, k, v)), causal=True)[0], torch.bfloat16, False,
                   str(shape))
