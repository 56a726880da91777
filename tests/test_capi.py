"""The C ABI (libkernelset.so) on CPU, through ks.capi (ctypes) and from C.

Builds the library with scripts/build_capi.sh when it is missing or older than its sources (once
per session), then checks:
- every op of the core families (norms, activations, softmax, cross-entropy, embedding) against
  the Python package's fp32 references over fp32/fp16/bf16, with strided and permuted inputs and
  strided outputs (outputs poisoned with NaN first);
- option structs of an older, smaller size (the fields they lack take their defaults);
- every failure class (NULL, ndim, negative dim, dtype, device, layout, option size, option value)
  returns its status with a message naming the argument, and ks_query_support answers the same
  as the call;
- ks_get_api version negotiation; the ctypes structs against the header's layout;
- the exports (nm -D: exactly the header's ks_* functions) and dependencies (ldd: libc/libdl/
  libpthread/libm only);
- the C test suite (capi/tests/test_core.c) and the example program (capi/examples/example.c).
"""
from __future__ import annotations

import ctypes
import math
import os
import re
import shutil
import subprocess

import pytest
import torch

from kernelset import capi
from kernelset.capi import _abi
from kernelset.ops.activation import reference as act_ref
from kernelset.ops.loss import reference as loss_ref
from kernelset.ops.norm import reference as norm_ref
from kernelset.ops.softmax import reference as softmax_ref

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(ROOT, "capi", "include", "kernelset.h")
LIBDIR = os.path.dirname(capi.library_path())

if not shutil.which("gcc"):
    pytest.skip("no gcc to build the C library", allow_module_level=True)


@pytest.fixture(scope="session", autouse=True)
def built(capi_library):
    """The library, built when missing or stale (tests/conftest.py)."""
    capi.load()


# ---- tolerances: one table per storage dtype; half types must also match bit for bit almost
# everywhere (a missing or extra rounding step shows up there, not in an ulp tolerance)

TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DT_IDS = ["fp32", "fp16", "bf16"]


def assert_matches(got: torch.Tensor, want: torch.Tensor, exact_frac: float = 0.98) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    rtol, atol = TOL.get(got.dtype, TOL[torch.float32])
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol, equal_nan=True)
    if got.dtype in (torch.float16, torch.bfloat16) and got.numel() >= 64:
        same = (got.view(torch.int16) == want.view(torch.int16)).float().mean().item()
        assert same >= exact_frac, f"only {same:.3f} of the elements are bitwise equal to the reference"


def poisoned(shape, dtype=torch.float32) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype)


def layouts(t: torch.Tensor):
    """(name, same values in another layout): contiguous; rows with a stride; leading dims permuted
    (rows that do not collapse to one stride: the CPU path honours any strides)."""
    yield "contiguous", t
    padded = torch.empty(*t.shape[:-1], t.shape[-1] + 7, dtype=t.dtype)[..., :t.shape[-1]]
    padded.copy_(t)
    yield "row_stride", padded
    if t.dim() >= 3:
        perm = t.transpose(0, 1).contiguous().transpose(0, 1)
        assert not perm.is_contiguous()
        yield "permuted", perm


# ---- norms


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("weight,cast,offset", [(True, "llama", 0.0), (True, "gemma", 1.0), (False, "llama", 0.0)],
                         ids=["llama", "gemma", "noweight"])
def test_rms_norm(dtype, weight, cast, offset):
    x = torch.randn(3, 5, 67).to(dtype)  # odd hidden size
    w = (torch.randn(67) * 0.5).to(dtype) if weight else None
    want = norm_ref.rms_norm_ref(x, w, 1e-6, offset, cast == "gemma")[0]
    for name, xl in layouts(x):
        out = poisoned(x.shape, dtype)
        got = capi.rms_norm(xl, w, eps=1e-6, offset=offset, cast=cast, out=out)
        assert got is out
        assert_matches(got, want)
    # strided output rows
    out = poisoned((3, 5, 80), dtype)[..., :67]
    assert_matches(capi.rms_norm(x, w, offset=offset, cast=cast, out=out), want)


def test_rms_norm_cast_is_observable():
    # the Llama and Gemma roundings differ on bf16: the exact-match check above can tell them apart
    x, w = torch.randn(64, 256).bfloat16(), torch.randn(256).bfloat16()
    llama = capi.rms_norm(x, w, cast="llama")
    gemma = norm_ref.rms_norm_ref(x, w, 1e-6, 0.0, True)[0]
    assert (llama.view(torch.int16) != gemma.view(torch.int16)).float().mean().item() > 0.05
    assert_matches(llama, norm_ref.rms_norm_ref(x, w, 1e-6, 0.0, False)[0])


def test_rms_norm_weight_dtype_and_inplace():
    x, w = torch.randn(8, 96).bfloat16(), torch.randn(96)  # fp32 weight with bf16 x
    want = norm_ref.rms_norm_ref(x, w, 1e-5, 0.0, False)[0]
    assert_matches(capi.rms_norm(x, w, eps=1e-5), want)
    xi = x.clone()
    assert capi.rms_norm(xi, w, eps=1e-5, out=xi) is xi  # out aliases x
    assert_matches(xi, want)
    w_strided = torch.randn(96 * 2)[::2]  # a weight with stride 2
    assert_matches(capi.rms_norm(x, w_strided), norm_ref.rms_norm_ref(x, w_strided, 1e-6, 0.0, False)[0])


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "inplace"])
def test_fused_add_rms_norm(dtype, in_place):
    x, r = torch.randn(4, 3, 130).to(dtype), torch.randn(4, 3, 130).to(dtype)
    w = torch.randn(130).to(dtype)
    want_y, want_h, _ = norm_ref.fused_add_rms_norm_ref(x, r, w, 1e-6, 1.0, True)
    for name, xl in layouts(x):
        xl = xl.clone() if in_place else xl
        res = torch.empty(*r.shape[:-1], 140, dtype=dtype)[..., :130]
        res.copy_(r)
        out = xl if in_place else poisoned(x.shape, dtype)
        y, h = capi.fused_add_rms_norm(xl, res, w, offset=1.0, cast="gemma", out=out)
        assert y is out and h is res
        assert_matches(y, want_y)
        assert_matches(h, want_h, exact_frac=1.0)  # h = x + residual rounded: exact


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("params", ["both", "weight", "bias", "none", "fp32_params"])
def test_layer_norm(dtype, params):
    x = (torch.randn(6, 2, 200) * 3 + 1).to(dtype)
    pdt = torch.float32 if params == "fp32_params" else dtype
    w = torch.randn(200).to(pdt) if params in ("both", "weight", "fp32_params") else None
    b = torch.randn(200).to(pdt) if params in ("both", "bias", "fp32_params") else None
    want = norm_ref.layer_norm_ref(x, w, b, 1e-5)[0]
    for name, xl in layouts(x):
        assert_matches(capi.layer_norm(xl, w, b, out=poisoned(x.shape, dtype)), want)


# ---- activations


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("op", ["silu_and_mul", "gelu_and_mul", "gelu_and_mul_tanh", "swiglu", "gelu", "gelu_tanh",
                                "swiglu_oai"])
def test_activation(dtype, op):
    x = (torch.randn(3, 4, 2 * 75) * 3).to(dtype)
    x[0, 0, :4] = torch.tensor([30.0, -30.0, 9.0, -9.0])  # saturation, and beyond swiglu_oai's limit
    for name, xl in layouts(x):
        i = x.shape[-1] // 2
        if op.startswith("silu_and_mul") or op.startswith("gelu_and_mul"):
            kind = "silu" if op == "silu_and_mul" else "gelu_tanh" if op.endswith("tanh") else "gelu"
            want = act_ref.fwd(x, None, kind, "halves", 0.0, 0.0)
            fn = capi.silu_and_mul if op == "silu_and_mul" else capi.gelu_and_mul
            kw = {} if op == "silu_and_mul" else {"approximate": "tanh" if op.endswith("tanh") else "none"}
            got = fn(xl, out=poisoned((*x.shape[:-1], i), dtype), **kw)
        elif op == "swiglu":
            gate, up = xl[..., :i], xl[..., i:]  # views with the parent's row stride
            want = act_ref.fwd(gate, up, "silu", "pair", 0.0, 0.0)
            got = capi.swiglu(gate, up, out=poisoned(gate.shape, dtype))
        elif op.startswith("gelu"):
            kind = "gelu_tanh" if op.endswith("tanh") else "gelu"
            want = act_ref.fwd(x, None, kind, "single", 0.0, 0.0)
            got = capi.gelu(xl, approximate="tanh" if op.endswith("tanh") else "none", out=poisoned(x.shape, dtype))
        else:
            want = act_ref.swiglu_oai(x, 1.5, 6.0)
            got = capi.swiglu_oai(xl, alpha=1.5, limit=6.0, out=poisoned((*x.shape[:-1], i), dtype))
        assert_matches(got, want)


# ---- softmax


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_softmax(dtype, log):
    x = (torch.randn(2, 3, 333) * 4).to(dtype)
    x[0, 0, 5] = -float("inf")
    fn = capi.log_softmax if log else capi.softmax
    for out_dtype in (dtype, torch.float32):
        want = softmax_ref.fwd(x, 0.7, log, out_dtype)
        for name, xl in layouts(x):
            assert_matches(fn(xl, temperature=0.7, out=poisoned(x.shape, out_dtype)), want)
    sums = capi.softmax(x.float()).sum(-1)
    torch.testing.assert_close(sums, torch.ones_like(sums))


def test_softmax_empty_rows():
    x = torch.randn(0, 16)
    assert capi.softmax(x).shape == (0, 16)
    assert capi.softmax(torch.randn(3, 0)).shape == (3, 0)


# ---- cross-entropy


CE_CASES = {
    "plain": dict(),
    "smoothing_zloss": dict(label_smoothing=0.1, z_loss=1e-3),
    "softcap": dict(softcap=30.0),
    "all_options": dict(label_smoothing=0.2, z_loss=1e-4, softcap=15.0, ignore_index=7),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", list(CE_CASES))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(dtype, case, reduction):
    kw = CE_CASES[case]
    ignore = kw.get("ignore_index", -100)
    logits = (torch.randn(2, 9, 301) * 5).to(dtype)
    target = torch.randint(0, 301, (2, 9))
    target[0, 3] = ignore
    target[1, :2] = ignore
    want = loss_ref.fwd(logits.reshape(-1, 301), target.reshape(-1), ignore, kw.get("label_smoothing", 0.0),
                        kw.get("z_loss", 0.0), kw.get("softcap", 0.0), reduction, False)[0]
    want = want.reshape(target.shape) if reduction == "none" else want
    for tdt in (torch.int64, torch.int32):
        for name, xl in layouts(logits):
            out = poisoned(want.shape)
            got = capi.cross_entropy(xl, target.to(tdt), reduction=reduction, out=out, **kw)
            assert got is out
            torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)


def test_cross_entropy_edge_rows():
    logits = torch.randn(3, 10)
    target = torch.tensor([-100, -100, -100])
    assert capi.cross_entropy(logits, target).item() == 0.0  # all ignored: mean is 0
    one = capi.cross_entropy(logits[0], torch.tensor(4), out=poisoned((1,)))  # 1-D logits, 0-d target, [1] loss
    torch.testing.assert_close(one[0], torch.nn.functional.cross_entropy(logits[0], torch.tensor(4)))


@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("tdt", [torch.int64, torch.int32], ids=["i64", "i32"])
def test_cross_entropy_bad_target_writes_nothing(reduction, tdt):
    """A target outside [0, V) that is not ignore_index is refused on CPU, naming it, before any
    loss is written (the Python API's check_target; the CPU path once wrote a NaN loss). An
    ignore_index inside [0, V) and targets equal to it stay valid."""
    logits = torch.randn(2, 3, 10)
    for t, msg in (([[1, 10, 2], [0, 0, 0]], "target 10 (flat index 1)"), ([[1, 2, 3], [4, -5, -7]],
                                                                            "target -5 (flat index 4)")):
        out = poisoned((2, 3) if reduction == "none" else ())
        with pytest.raises(capi.KsError) as e:
            capi.cross_entropy(logits, torch.tensor(t, dtype=tdt), reduction=reduction, out=out)
        assert e.value.status == _abi.INVALID_ARGUMENT
        assert e.value.message == (f"target: {msg} is outside [0, 10) (logits' last dim) and is not "
                                   "options.ignore_index (-100)")
        assert out.isnan().all()
    target = torch.tensor([[1, 7, 2], [7, 9, 0]], dtype=tdt)
    got = capi.cross_entropy(logits, target, ignore_index=7, reduction=reduction)
    want = torch.nn.functional.cross_entropy(logits.reshape(-1, 10), target.reshape(-1).long(), ignore_index=7,
                                             reduction=reduction)
    torch.testing.assert_close(got.reshape(want.shape), want, rtol=2e-5, atol=2e-5)


def test_cross_entropy_ignore_index_beyond_target_dtype():
    """An ignore_index no int32 target can equal (2**31) ignores no row: the mean divides by every
    row (the Python package's _ce_grad_scale_kernel once counted masked padding there). The CUDA
    kernels take an int32 ignore_index: a CUDA call's query refuses a wider one by the option's
    name, before any plan (no driver needed)."""
    from capi_helpers import on_cuda
    logits, target = torch.randn(5, 7), torch.tensor([1, 2, 3, 4, 6], dtype=torch.int32)
    want = torch.nn.functional.cross_entropy(logits, target.long())
    for ignore in (2**31, -2**31 - 1, 2**63 - 1):
        got = capi.cross_entropy(logits, target, ignore_index=ignore, out=poisoned(()))
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    loss = torch.empty(())
    for ignore in (2**31, -2**31 - 1):
        s = capi.query_support("cross_entropy", [on_cuda(logits), on_cuda(target), on_cuda(loss)],
                               capi.options("cross_entropy", ignore_index=ignore))
        assert s.name == "KS_ERR_UNSUPPORTED_SHAPE" and s.message.startswith("options.ignore_index:"), s


# ---- embedding


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_embedding(dtype):
    weight = torch.randn(50, 24).to(dtype)
    column_major = torch.randn(24, 50).to(dtype).t().copy_(weight)
    for idt in (torch.int32, torch.int64):
        ids = torch.randint(0, 50, (3, 8), dtype=idt)
        for w in (weight, column_major):
            out = poisoned((3, 8, 24), dtype)
            assert torch.equal(capi.embedding(ids, w, out=out), weight[ids.long()])
            # strided ids and a strided output
            out = poisoned((3, 8, 30), dtype)[:, ::2, :24]
            assert torch.equal(capi.embedding(ids[:, ::2], w, out=out), weight[ids[:, ::2].long()])
    scalar = capi.embedding(torch.tensor(4), weight)
    assert torch.equal(scalar, weight[4])
    # 1-D ids with a stride and with stride 0 (an expand): the Python package's Triton path once read
    # ids[row] unit-stride; the C path reads each id through its stride
    ids = torch.randint(0, 50, (16,))
    for view in (ids[::3], ids[2:3].expand(5)):
        assert torch.equal(capi.embedding(view, weight, out=poisoned((view.shape[0], 24), dtype)), weight[view])


def test_embedding_bad_id_writes_nothing():
    weight, out = torch.randn(5, 4), poisoned((3, 4))
    with pytest.raises(capi.KsError) as e:
        capi.embedding(torch.tensor([1, 5, 2]), weight, out=out)
    assert e.value.status == _abi.INVALID_ARGUMENT
    assert e.value.message == "ids: id 5 (flat index 1) is outside [0, 5) (num_embeddings)"
    assert out.isnan().all()


# ---- options of an older size


def test_older_option_structs():
    x, w = torch.randn(4, 64).bfloat16(), torch.randn(64).bfloat16()
    # a caller whose ks_rms_norm_options ended after eps: offset and cast take their defaults
    size = _abi.RmsNormOptions.eps.offset + 4
    old = capi.options("rms_norm", size=size, eps=1e-2)
    assert old.size == size and old.offset == 0.0
    old.offset, old.cast = 5.0, 1  # beyond its size: the library must not read them
    assert torch.equal(capi.rms_norm(x, w, options=old), capi.rms_norm(x, w, eps=1e-2))
    with pytest.raises(ValueError, match="beyond size"):
        capi.options("rms_norm", size=size, cast="gemma")
    # cross_entropy up to label_smoothing: z_loss, softcap and reduction (mean) take defaults
    logits, target = torch.randn(5, 30), torch.randint(0, 30, (5,))
    size = _abi.CrossEntropyOptions.label_smoothing.offset + 4
    old_ce = capi.options("cross_entropy", size=size, label_smoothing=0.1)
    old_ce.reduction, old_ce.z_loss = 0, 1.0
    torch.testing.assert_close(capi.cross_entropy(logits, target, options=old_ce),
                               capi.cross_entropy(logits, target, label_smoothing=0.1))
    # size with trailing padding (the sizeof of an older struct) is fine, inside a field is not
    for op, cls in _abi.OPTIONS.items():
        for f in cls._fields_[1:]:
            end = getattr(cls, f[0]).offset + getattr(cls, f[0]).size
            assert capi.options(op, size=end).size == end
        with pytest.raises(capi.KsError, match="ends inside a field"):
            capi.options(op, size=getattr(cls, cls._fields_[1][0]).offset + 1)


# ---- failure classes: status, message, and query_support agreeing with the call


def _raw(shape, dtype=(2, 32), ndim=None, data=1, device=(1, 0), strides=None, byte_offset=0) -> capi.DLTensor:
    """A hand-made DLTensor (for what torch cannot express: ndim 9, negative dims, NULL data ...)."""
    t = capi.DLTensor()
    arr = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    t.shape = ctypes.cast(arr, ctypes.POINTER(ctypes.c_int64))
    t.ndim = len(shape) if ndim is None else ndim
    t.dtype = _abi.DLDataType(dtype[0], dtype[1], 1)
    buf = None
    if data:
        buf = torch.zeros(4096)
        t.data = buf.data_ptr()
    t.device = _abi.DLDevice(*device)
    st = None
    if strides is not None:
        st = (ctypes.c_int64 * len(strides))(*strides)
        t.strides = ctypes.cast(st, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = byte_offset
    t._keep = (arr, buf, st)
    return t


def _cuda(shape, dtype=(2, 32), strides=None, data=1 << 20) -> capi.DLTensor:
    """A CUDA DLTensor with a made-up device address: only for calls refused before any launch (or
    queries, which never touch data)."""
    t = _raw(shape, dtype, data=0, device=(2, 0), strides=strides)
    t.data = data or None
    return t


X, W, Y = torch.randn(3, 8), torch.randn(8), torch.empty(3, 8)
FAILURES = [
    # (id, op, call tensors, options, expected status, message start)
    ("null_x", "rms_norm", [None, W, Y], None, _abi.INVALID_ARGUMENT, "x: required tensor is NULL"),
    ("null_out", "softmax", [X, None], None, _abi.INVALID_ARGUMENT, "out: required tensor is NULL"),
    ("ndim9", "rms_norm", [_raw([1] * 8 + [8]), W, Y], None, _abi.INVALID_ARGUMENT, "x: ndim 9 is outside [0, 8]"),
    ("ndim_negative", "gelu", [_raw([3, 8], ndim=-2), Y], None, _abi.INVALID_ARGUMENT, "x: ndim -2"),
    ("negative_dim", "layer_norm", [X, None, _raw([-8]), Y], None, _abi.INVALID_ARGUMENT, "bias: dim 0 is negative"),
    ("null_data", "silu_and_mul", [_raw([3, 8], data=0), torch.empty(3, 4)], None, _abi.INVALID_ARGUMENT,
     "x: data is NULL"),
    ("dtype_float64", "rms_norm", [X.double(), W, Y], None, _abi.UNSUPPORTED_DTYPE, "x: dtype float64 is not supported"),
    ("dtype_int", "softmax", [X.int(), Y], None, _abi.UNSUPPORTED_DTYPE,
     "x: expected float32, float16 or bfloat16, got int32"),
    ("dtype_mismatch", "swiglu", [X, X.half(), Y], None, _abi.UNSUPPORTED_DTYPE,
     "up: expected float32 (the dtype of gate), got float16"),
    ("dtype_target", "cross_entropy", [X, torch.zeros(3), torch.empty(())], None, _abi.UNSUPPORTED_DTYPE,
     "target: expected int32 or int64, got float32"),
    ("dtype_loss", "cross_entropy", [X, torch.zeros(3, dtype=torch.long), torch.empty((), dtype=torch.half)], None,
     _abi.UNSUPPORTED_DTYPE, "loss: expected float32, got float16"),
    ("dtype_fp8_x", "gelu", [X.to(torch.float8_e4m3fn), Y], None, _abi.UNSUPPORTED_DTYPE, "x: expected float32"),
    ("shape_weight", "rms_norm", [X, torch.randn(7), Y], None, _abi.INVALID_ARGUMENT,
     "weight: dim 0 must be 8 (the hidden size, x.shape[-1])"),
    ("shape_out", "gelu_and_mul", [X, Y], None, _abi.INVALID_ARGUMENT, "out: dim 1 must be 4 (x.shape[-1] / 2)"),
    ("odd_last", "swiglu_oai", [torch.randn(3, 7), torch.empty(3, 3)], None, _abi.INVALID_ARGUMENT,
     "x: expected an even last dim"),
    ("ids_weight_1d", "embedding", [torch.zeros(3, dtype=torch.long), W, Y], None, _abi.INVALID_ARGUMENT,
     "weight: expected 2 dims, got 1"),
    ("hidden_zero", "rms_norm", [torch.randn(3, 0), None, torch.empty(3, 0)], None, _abi.INVALID_ARGUMENT,
     "x: expected a hidden size (last dim) >= 1"),
    ("device_mismatch", "rms_norm", [X, _cuda([8]), Y], None, _abi.UNSUPPORTED_DEVICE,
     "weight: on cuda:0 but x is on cpu:0"),
    ("device_type", "softmax", [X, _raw([3, 8], device=(9, 0))], None, _abi.UNSUPPORTED_DEVICE,
     "out: device type 9 is not supported"),
    ("layout_byte_offset", "rms_norm", [_raw([3, 8], byte_offset=6), W, Y], None, _abi.UNSUPPORTED_LAYOUT,
     "x: byte_offset 6 is not a multiple of the element size 4"),
    ("layout_overlap", "layer_norm", [X, None, None, torch.empty(1, 8).expand(3, 8)], None, _abi.UNSUPPORTED_LAYOUT,
     "out: elements overlap"),
    ("layout_cuda_rows", "softmax", [_cuda([4, 3, 8], strides=[8, 32, 1]), _cuda([4, 3, 8])], None,
     _abi.UNSUPPORTED_LAYOUT, "x: its leading dims do not collapse into rows of one stride"),
    ("layout_cuda_inner", "rms_norm", [_cuda([3, 8], strides=[1, 3]), None, _cuda([3, 8])], None,
     _abi.UNSUPPORTED_LAYOUT, "x: the last dim must have stride 1, got 3"),
    ("alias_residual", "fused_add_rms_norm", [X, X, W, Y], None, _abi.INVALID_ARGUMENT, "residual: must not alias x"),
    ("option_size_small", "rms_norm", [X, W, Y], "size=4", _abi.INVALID_ARGUMENT,
     "options: size 4 is smaller than its size field"),
    ("option_size_large", "softmax", [X, Y], "size=64", _abi.INVALID_ARGUMENT,
     "options: size 64 is larger than this library's ks_softmax_options"),
    ("option_eps", "layer_norm", [X, None, None, Y], dict(eps=0.0), _abi.INVALID_ARGUMENT,
     "options.eps: expected a finite number > 0, got 0"),
    ("option_temperature", "log_softmax", [X, Y], dict(temperature=float("nan")), _abi.INVALID_ARGUMENT,
     "options.temperature"),
    ("option_cast", "rms_norm", [X, W, Y], dict(cast=3), _abi.INVALID_ARGUMENT, "options.cast: expected 0 to 1, got 3"),
    ("option_offset_no_weight", "rms_norm", [X, None, Y], dict(offset=1.0), _abi.INVALID_ARGUMENT,
     "options.offset: expected 0 when weight is NULL"),
    ("option_approximate", "gelu", [X, Y], dict(approximate=2), _abi.INVALID_ARGUMENT, "options.approximate"),
    ("option_limit", "swiglu_oai", [X, torch.empty(3, 4)], dict(limit=-1.0), _abi.INVALID_ARGUMENT,
     "options.limit: expected a finite number > 0"),
    ("option_reduction", "cross_entropy", [X, torch.zeros(3, dtype=torch.long), torch.empty(())], dict(reduction=5),
     _abi.INVALID_ARGUMENT, "options.reduction: expected 0 to 2, got 5"),
    ("option_softcap", "cross_entropy", [X, torch.zeros(3, dtype=torch.long), torch.empty(())], dict(softcap=-2.0),
     _abi.INVALID_ARGUMENT, "options.softcap"),
    ("loss_shape", "cross_entropy", [X, torch.zeros(3, dtype=torch.long), torch.empty(3)], None,
     _abi.INVALID_ARGUMENT, "loss: expected a 0-d or [1] tensor"),
]

_CALL_ARITY = {"rms_norm": 3, "fused_add_rms_norm": 4, "layer_norm": 4, "silu_and_mul": 2, "gelu_and_mul": 2,
               "swiglu": 3, "gelu": 2, "swiglu_oai": 2, "softmax": 2, "log_softmax": 2, "cross_entropy": 3,
               "embedding": 3}


def _options_arg(op, spec):
    if spec is None:
        return capi.options(op) if op in _abi.OPTIONS else None
    if isinstance(spec, str):  # "size=N": a struct whose size field says N
        o = capi.options(op)
        o.size = int(spec.split("=")[1])
        return o
    o = capi.options(op)
    for k, v in spec.items():
        setattr(o, k, v)
    return o


def _raw_call(op, tensors, opts):
    """The C function itself with these tensors (the wrappers would allocate or convert)."""
    lib = capi.load()
    keep: list = []
    args = [capi._dl(t, keep) for t in tensors]
    if op in _abi.OPTIONS:
        args.append(ctypes.addressof(opts))
    args.append(None)  # stream
    status = getattr(lib, "ks_" + op)(*args)
    return status, capi.last_error()


@pytest.mark.parametrize("case", FAILURES, ids=[c[0] for c in FAILURES])
def test_failure(case):
    _, op, tensors, spec, status, message = case
    assert len(tensors) == _CALL_ARITY[op]
    opts = _options_arg(op, spec)
    got_status, got_message = _raw_call(op, tensors, opts)
    assert (capi.STATUS.get(got_status), got_message[:len(message)]) == (capi.STATUS[status], message), got_message
    q = capi.query_support(op, tensors, opts)
    if case[0] == "null_data":
        assert q.ok  # a query reads only metadata: data may be NULL there
    else:
        assert (q.status, q.message) == (got_status, got_message)


def test_query_support_agrees_on_success():
    cases = [("rms_norm", [X, W, Y]), ("fused_add_rms_norm", [X, X.clone(), None, Y]),
             ("layer_norm", [X.bfloat16(), W, None, Y.bfloat16()]), ("silu_and_mul", [X, torch.empty(3, 4)]),
             ("swiglu", [X, X, Y]), ("softmax", [X.half(), Y]), ("cross_entropy", [X, torch.zeros(3).long(),
                                                                                   torch.empty(3)]),
             ("embedding", [torch.zeros(2, dtype=torch.int32), X, torch.empty(2, 8)])]
    for op, tensors in cases:
        opts = capi.options(op, reduction="none") if op == "cross_entropy" else _options_arg(op, None)
        assert capi.query_support(op, tensors, opts).ok, op
        assert _raw_call(op, tensors, opts) == (0, "")
    # metadata only: NULL data is fine in a query
    assert capi.query_support("rms_norm", [_raw([3, 8], data=0), None, _raw([3, 8], data=0)]).ok


def test_query_support_arity_and_op():
    q = capi.query_support("softmax", [X])
    assert (q.name, q.message) == ("KS_ERR_INVALID_ARGUMENT", "tensors: softmax takes 2 tensors, got 1")
    q = capi.query_support(99, [X])
    assert (q.name, q.message) == ("KS_ERR_INVALID_ARGUMENT", "op: unknown op id 99")


def test_cuda_tensors_without_driver():
    if torch.cuda.is_available() or _has_libcuda():
        pytest.skip("a CUDA driver is present: the GPU suite runs the kernels")
    # the plan is computed (validation passed); the device query needs libcuda
    q = capi.query_support("rms_norm", [_cuda([3, 8], (4, 16), data=0), None, _cuda([3, 8], (4, 16), data=0)])
    assert q.name == "KS_ERR_CUDA" and "libcuda.so.1" in q.message
    status, message = _raw_call("rms_norm", [_raw([3, 8], (4, 16), device=(2, 0)), None,
                                             _raw([3, 8], (4, 16), device=(2, 0))], capi.options("rms_norm"))
    assert (capi.STATUS[status], message) == ("KS_ERR_CUDA", q.message)
    # cross_entropy's mean and sum have a CUDA plan too (the per-row kernel, then the reduction)
    for red in ("mean", "sum"):
        q = capi.query_support("cross_entropy", [_cuda([3, 8]), _cuda([3], (0, 64)), _cuda([])],
                               capi.options("cross_entropy", reduction=red))
        assert q.name == "KS_ERR_CUDA" and "libcuda.so.1" in q.message, q.message


def _has_libcuda() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def test_ks_error_and_python_side():
    with pytest.raises(capi.KsError) as e:
        capi.softmax(X, temperature=-1.0)
    assert e.value.status == _abi.INVALID_ARGUMENT and e.value.status_name == "KS_ERR_INVALID_ARGUMENT"
    assert e.value.message.startswith("options.temperature") and "ks_softmax" in str(e.value)
    with pytest.raises(ValueError, match="takes no options"):
        capi.options("silu_and_mul")
    with pytest.raises(TypeError, match="no field"):
        capi.options("rms_norm", epsilon=1.0)
    with pytest.raises(ValueError, match="cast must be one of"):
        capi.options("rms_norm", cast="mistral")


# ---- tensors through to_dltensor


def test_to_dltensor():
    base = torch.arange(40, dtype=torch.float32).reshape(4, 10)
    view = base[1:, 2:9:2]  # storage offset 12, strides (10, 2)
    dl = capi.to_dltensor(view)
    assert dl.byte_offset == 12 * 4 and dl.data == base.data_ptr() and dl.ndim == 2
    assert [dl.shape[i] for i in range(2)] == [3, 4] and [dl.strides[i] for i in range(2)] == [10, 2]
    fp8 = capi.to_dltensor(torch.zeros(2, dtype=torch.float8_e4m3fn))
    assert (fp8.dtype.code, fp8.dtype.bits, fp8.dtype.lanes) == (_abi.KDL_FLOAT8_E4M3FN, 8, 1)
    bf = capi.to_dltensor(torch.zeros(2, dtype=torch.bfloat16))
    assert (bf.dtype.code, bf.dtype.bits) == (_abi.KDL_BFLOAT, 16) and bf.device.device_type == _abi.KDL_CPU
    # the C side reads through the offset and strides
    assert torch.equal(capi.gelu(view, out=poisoned(view.shape)), act_ref.fwd(view, None, "gelu", "single", 0, 0))


# ---- versioning, table, build info


def test_versions_and_table():
    assert capi.abi_version() == (1, 1)
    info = capi.build_info()
    assert re.match(r"kernelset \d+\.\d+\.\d+; abi 1\.1; cuda: ", info), info
    table = capi.api_table(1, 0)  # a 1.0 caller gets the 1.1 table (a prefix of it is 1.0's)
    assert (table.size, table.abi_major, table.abi_minor) == (ctypes.sizeof(capi.ApiTable), 1, 1)
    assert capi.api_table(1, 1).abi_minor == 1
    lib = capi.load()
    for name in _abi.API_TABLE:
        assert getattr(table, name) == ctypes.cast(getattr(lib, "ks_" + name), ctypes.c_void_p).value, name
    for major, minor, what in ((2, 0, "major"), (0, 0, "major"), (1, 2, "min_minor")):
        with pytest.raises(capi.KsError) as e:
            capi.api_table(major, minor)
        assert e.value.status == _abi.VERSION and e.value.message.startswith(what)
    assert capi.status_name(4) == "KS_ERR_UNSUPPORTED_LAYOUT" and capi.status_name(-3) == "KS_ERR_UNKNOWN"


# ---- the binary: exports, dependencies, struct layouts, C programs


def _header_functions() -> set[str]:
    text = open(HEADER).read()
    return set(re.findall(r"KS_API\s+[^;(]*?\b(ks_\w+)\s*\(", text))


def test_exports_are_the_header_functions():
    if not shutil.which("nm"):
        pytest.skip("no nm")
    out = subprocess.run(["nm", "-D", "--defined-only", capi.library_path()], capture_output=True, text=True,
                         check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
    declared = _header_functions()
    # the header declares exactly what the one declaration of the ABI lists (capi/abi/ksabi/ops.py)
    import sys
    sys.path.insert(0, os.path.join(ROOT, "capi", "abi"))
    try:
        from ksabi.ops import GET_API, LIBRARY, OPS
    finally:
        sys.path.pop(0)
    assert declared == {f.c_name for f in (*LIBRARY, *OPS, GET_API)}
    assert exported == declared


def test_dependencies():
    if not shutil.which("ldd"):
        pytest.skip("no ldd")
    out = subprocess.run(["ldd", capi.library_path()], capture_output=True, text=True, check=True).stdout
    libs = {re.split(r"\s", line.strip())[0] for line in out.splitlines() if line.strip()}
    allowed = re.compile(r"^(linux-vdso\.so\.1|linux-gate\.so\.1|/lib.*/ld-linux[-\w.]*\.so\.\d|"
                         r"lib(c|dl|pthread|m)\.so\.\d+)$")
    assert libs and all(allowed.match(lib) for lib in libs), libs


def _compile(tmp_path, name, sources, *extra):
    exe = str(tmp_path / name)
    cmd = ["gcc", "-std=c99", "-Wall", "-Wextra", "-Werror", f"-I{ROOT}/capi/include", f"-I{ROOT}/capi/src/core",
           f"-I{ROOT}/capi/src/cuda", *sources, "-o", exe, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return exe


def test_struct_layouts_match_header(tmp_path):
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "kernelset.h"', "int main(void) {"]
    structs = {"DLTensor": capi.DLTensor, "ks_api_t": capi.ApiTable}
    names = {_abi.RmsNormOptions: "ks_rms_norm_options", _abi.LayerNormOptions: "ks_layer_norm_options",
             _abi.GeluOptions: "ks_gelu_options", _abi.SwigluOaiOptions: "ks_swiglu_oai_options",
             _abi.SoftmaxOptions: "ks_softmax_options", _abi.CrossEntropyOptions: "ks_cross_entropy_options",
             _abi.RopeOptions: "ks_rope_options", _abi.MropeOptions: "ks_mrope_options",
             _abi.QkNormRopeOptions: "ks_qk_norm_rope_options", _abi.AttentionOptions: "ks_attention_options"}
    structs.update({c: cls for cls, c in names.items()})
    want = []
    for cname, cls in structs.items():
        lines.append(f'  printf("{cname} %zu\\n", sizeof({cname}));')
        want.append(f"{cname} {ctypes.sizeof(cls)}")
        for field, _ in cls._fields_:
            lines.append(f'  printf("{cname}.{field} %zu\\n", offsetof({cname}, {field}));')
            want.append(f"{cname}.{field} {getattr(cls, field).offset}")
    lines += ["  return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = _compile(tmp_path, "layout", [str(src)])
    got = subprocess.run([exe], capture_output=True, text=True, check=True).stdout.split("\n")
    assert [g for g in got if g] == want


def test_c_suite(tmp_path):
    exe = _compile(tmp_path, "test_core", [f"{ROOT}/capi/tests/test_core.c", f"{ROOT}/capi/src/core/halfs.c"],
                   f"-L{LIBDIR}", "-lkernelset", "-ldl", "-lpthread", "-lm")
    proc = subprocess.run([exe], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, LD_LIBRARY_PATH=LIBDIR))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"test_core: \d{2,} checks, 0 failures", proc.stdout), proc.stdout


def test_example(tmp_path):
    exe = _compile(tmp_path, "example", [f"{ROOT}/capi/examples/example.c"], "-ldl", "-lm")
    proc = subprocess.run([exe, capi.library_path()], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "example: ok" in proc.stdout and "KS_ERR_INVALID_ARGUMENT: weight: dim 0 must be 4" in proc.stdout


def test_library_path_and_not_built(monkeypatch, tmp_path):
    assert capi.library_path().endswith(os.path.join("kernelset", "capi", "lib", "libkernelset.so"))
    assert capi.available()
    monkeypatch.setattr(capi, "_lib", None)
    monkeypatch.setattr(capi, "library_path", lambda: str(tmp_path / "libkernelset.so"))
    with pytest.raises(capi.LibraryNotBuilt, match="scripts/build_capi.sh"):
        capi.load()
    assert not capi.available()


def test_math_sanity():
    # the tolerance table is not so loose that a plainly wrong kernel passes
    x = torch.randn(4, 64).bfloat16()
    good = capi.silu_and_mul(x)
    wrong = act_ref.fwd(x, None, "gelu", "halves", 0.0, 0.0)
    with pytest.raises(AssertionError):
        assert_matches(good, wrong)
    assert math.isfinite(good.float().sum().item())
