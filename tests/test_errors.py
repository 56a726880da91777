"""Bad input gives a clear error that names the op, the argument and what was expected.

Argument checks run before dispatch, so every backend (AUTO included) gives the same error;
the cases below are run through each op where the argument exists.
"""
from __future__ import annotations

import math

import pytest
import torch

import kernelset as ks

N = 64


def _x(dtype=torch.float32, shape=(4, N)):
    return torch.randn(shape, dtype=dtype) if dtype.is_floating_point else torch.ones(shape, dtype=dtype)


# Each op called with (x, weight, **kwargs); fused_add_rms_norm gets a valid residual.
CALLS = {
    "rms_norm": lambda x, w, **kw: ks.rms_norm(x, w, **kw),
    "fused_add_rms_norm": lambda x, w, **kw: ks.fused_add_rms_norm(x, torch.randn(4, N), w, **kw),
    "layer_norm": lambda x, w, **kw: ks.layer_norm(x, w, **kw),
}
OPS = list(CALLS)
RMS_OPS = ["rms_norm", "fused_add_rms_norm"]  # the ops with offset and cast
BACKENDS = ["auto", "reference"]


def test_errors_are_catchable_by_type():
    assert issubclass(ks.ArgumentError, ValueError) and issubclass(ks.ArgumentError, ks.KernelsetError)
    assert issubclass(ks.ArgumentTypeError, TypeError) and issubclass(ks.ArgumentTypeError, ks.ArgumentError)
    assert issubclass(ks.UnsupportedError, RuntimeError) and issubclass(ks.UnsupportedError, ks.KernelsetError)


# ---- x --------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool], ids=str)
def test_integer_x(op, dtype):
    with pytest.raises(ks.ArgumentTypeError, match=rf"{op}: argument 'x' must be of dtype float32, "
                                                   rf"float16 or bfloat16, got {str(dtype)[6:]}") as info:
        CALLS[op](_x(dtype), None)
    assert isinstance(info.value, TypeError) and info.value.arg == "x" and info.value.op == op


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("bad", [[1.0, 2.0], 3.0, None], ids=["list", "float", "None"])
def test_non_tensor_x(op, bad):
    with pytest.raises(ks.ArgumentTypeError, match=rf"argument 'x' must be a torch.Tensor, got {type(bad).__name__}"):
        CALLS[op](bad, None)


@pytest.mark.parametrize("op", OPS)
def test_hidden_size_zero(op):
    # [4, 0]: nothing to normalize over (an empty batch [0, N] is fine, see test_norm).
    with pytest.raises(ks.ArgumentError, match=r"argument 'x' must be of hidden size \(last dim\) >= 1, "
                                               r"got shape \(4, 0\)"):
        CALLS[op](_x(shape=(4, 0)), None)


@pytest.mark.parametrize("op", OPS)
def test_scalar_x(op):
    with pytest.raises(ks.ArgumentError, match=r"argument 'x' must be at least 1-D, got shape \(\)"):
        CALLS[op](torch.tensor(1.0), None)


# ---- weight and bias ------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(N // 2,), (N + 1,), (1, N)], ids=["short", "long", "2d"])
def test_weight_shape(op, backend, shape):
    with pytest.raises(ks.ArgumentError, match=rf"argument 'weight' must be of shape \({N},\) "
                                               rf"\(the hidden size, x.shape\[-1\]\), got shape"):
        CALLS[op](_x(), torch.randn(shape), backend=backend)


def test_bias_shape():
    with pytest.raises(ks.ArgumentError, match=rf"layer_norm: argument 'bias' must be of shape \({N},\)"):
        ks.layer_norm(_x(), torch.randn(N), torch.randn(N - 1))


@pytest.mark.parametrize("op", OPS)
def test_weight_on_another_device(op):
    # No GPU here: a 'meta' weight stands for "a different device than x".
    with pytest.raises(ks.ArgumentError, match=r"argument 'weight' must be on the same device as 'x' \(cpu\), "
                                               r"got device meta"):
        CALLS[op](_x(), torch.randn(N, device="meta"))


def test_bias_on_another_device():
    with pytest.raises(ks.ArgumentError, match="argument 'bias' must be on the same device as 'x'"):
        ks.layer_norm(_x(), torch.randn(N), torch.randn(N, device="meta"))


@pytest.mark.parametrize("op", OPS)
def test_integer_weight(op):
    with pytest.raises(ks.ArgumentTypeError, match="argument 'weight' must be of dtype float32.*got int64"):
        CALLS[op](_x(), torch.ones(N, dtype=torch.int64))


@pytest.mark.parametrize("op", OPS)
def test_non_tensor_weight(op):
    with pytest.raises(ks.ArgumentTypeError, match="argument 'weight' must be a torch.Tensor, got list"):
        CALLS[op](_x(), [1.0] * N)


# ---- eps, offset, cast ----------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("eps", [0.0, -1e-6, math.nan, math.inf, True, "1e-6"],
                         ids=["zero", "negative", "nan", "inf", "bool", "str"])
def test_bad_eps(op, eps):
    with pytest.raises(ks.ArgumentError, match=rf"{op}: argument 'eps' must be a finite number > 0, got"):
        CALLS[op](_x(), None, eps=eps)


@pytest.mark.parametrize("op", RMS_OPS)
def test_offset_without_weight(op):
    with pytest.raises(ks.ArgumentError, match=r"argument 'offset' must be 0.0 when weight is None"):
        CALLS[op](_x(), None, offset=1.0)


@pytest.mark.parametrize("op", RMS_OPS)
@pytest.mark.parametrize("offset", [math.nan, -math.inf], ids=["nan", "-inf"])
def test_non_finite_offset(op, offset):
    with pytest.raises(ks.ArgumentError, match="argument 'offset' must be a finite number"):
        CALLS[op](_x(), torch.randn(N), offset=offset)


@pytest.mark.parametrize("op", RMS_OPS)
@pytest.mark.parametrize("cast", ["mistral", "", 1], ids=["unknown", "empty", "int"])
def test_unknown_cast(op, cast):
    with pytest.raises(ks.ArgumentError, match=rf"{op}: argument 'cast' must be one of 'llama', 'gemma', got"):
        CALLS[op](_x(), torch.randn(N), cast=cast)


# ---- residual -------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, N + 1), (2, N), (4, 1, N)], ids=["hidden", "rows", "rank"])
def test_residual_shape(shape):
    with pytest.raises(ks.ArgumentError, match=rf"argument 'residual' must be of shape \(4, {N}\) "
                                               rf"\(x's shape\), got shape"):
        ks.fused_add_rms_norm(_x(), torch.randn(shape), None)


def test_residual_dtype():
    with pytest.raises(ks.ArgumentTypeError, match=r"argument 'residual' must be of the same dtype as 'x' "
                                                   r"\(torch.float32\), got torch.bfloat16"):
        ks.fused_add_rms_norm(_x(), _x(torch.bfloat16), None)


def test_residual_device():
    with pytest.raises(ks.ArgumentError, match="argument 'residual' must be on the same device as 'x'"):
        ks.fused_add_rms_norm(_x(), torch.randn(4, N, device="meta"), None)


def test_residual_not_a_tensor():
    with pytest.raises(ks.ArgumentTypeError, match="argument 'residual' must be a torch.Tensor, got NoneType"):
        ks.fused_add_rms_norm(_x(), None, None)


# ---- in_place -------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["x", "residual", "weight"])
def test_in_place_with_requires_grad(which):
    t = {"x": _x(), "residual": _x(), "weight": torch.randn(N)}
    t[which].requires_grad_(True)
    with pytest.raises(ks.ArgumentError, match="argument 'in_place' must be False when gradients are needed"):
        ks.fused_add_rms_norm(t["x"], t["residual"], t["weight"], in_place=True)
    # Under no_grad the same call is inference and is allowed (shows the check is about grads).
    with torch.no_grad():
        out, res = ks.fused_add_rms_norm(t["x"], t["residual"], t["weight"], in_place=True)
    assert out is t["x"] and res is t["residual"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_place_residual_is_x(backend):
    x = _x()
    before = x.clone()
    with pytest.raises(ks.ArgumentError, match="argument 'residual' must be a different tensor from x "
                                               "sharing no memory with it"):
        ks.fused_add_rms_norm(x, x, None, in_place=True, backend=backend)
    assert torch.equal(x, before), "a refused call must not have written anything"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("which", ["x", "residual"])
def test_in_place_expanded_output(backend, which):
    # in place, an expanded x or residual would have every row write the same elements
    args = {"x": _x(), "residual": _x()}
    args[which] = args[which][:1].expand_as(args[which])
    with pytest.raises(ks.ArgumentError, match=f"argument '{which}' must be a tensor of distinct elements"):
        ks.fused_add_rms_norm(args["x"], args["residual"], None, in_place=True, backend=backend)


# ---- backend --------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_backend_that_does_not_exist(op):
    with pytest.raises(ValueError, match=rf"{op}: argument 'backend' must be one of auto, triton, torch, "
                                         rf"liger, flash_attn, flashinfer, reference, got 'cudnn'"):
        CALLS[op](_x(), None, backend="cudnn")


@pytest.mark.parametrize("op", OPS)
def test_backend_without_an_implementation(op):
    with pytest.raises(ks.UnsupportedError, match=rf"{op}: backend 'flashinfer' cannot run this problem: "
                                                  r"no such implementation \(have: triton, reference\)"):
        CALLS[op](_x(), None, backend="flashinfer")


def test_explain_unknown_op():
    with pytest.raises(ValueError, match="unknown op 'rmsnorm'; declared ops: .*fused_add_rms_norm.*, rms_norm"):
        ks.explain("rmsnorm", _x(), verbose=False)


# ---- checks at the edges of their types ---------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_sparse_x(op):
    # a sparse x passed the dtype check and failed inside torch ("Could not run 'aten::mean.dim'")
    with pytest.raises(ks.ArgumentTypeError, match=r"argument 'x' must be a dense \(strided\) tensor, "
                                                   r"got layout sparse_coo"):
        CALLS[op](_x().to_sparse(), None)


@pytest.mark.parametrize("value", [10 ** 400, -(10 ** 400)], ids=["huge", "huge-negative"])
@pytest.mark.parametrize("check", ["positive", "finite"])
def test_integer_too_large_for_a_float(check, value):
    # an int compares below math.inf however large; float() of it raised OverflowError
    from kernelset.core import checks
    with pytest.raises(ks.ArgumentError, match=r"op: argument 'eps' must be a finite number"):
        getattr(checks, check)("op", "eps", value)


@pytest.mark.parametrize("op", OPS)
def test_huge_integer_eps(op):
    with pytest.raises(ks.ArgumentError, match=rf"{op}: argument 'eps' must be a finite number > 0, got an integer"):
        CALLS[op](_x(), None, eps=10 ** 400)


@pytest.mark.parametrize("error", [ks.ArgumentError("rms_norm", "x", "a torch.Tensor", "list"),
                                   ks.ArgumentTypeError("rms_norm", "x", "of dtype float32", "int32"),
                                   ks.UnsupportedError("rms_norm", "triton", "x is on meta")],
                         ids=["ArgumentError", "ArgumentTypeError", "UnsupportedError"])
def test_errors_survive_pickling(error):
    # a DataLoader worker or a multiprocessing pool sends its exception back pickled; __init__ was
    # called again with only the message ("missing 3 required positional arguments")
    import copy
    import pickle
    for back in (pickle.loads(pickle.dumps(error)), copy.copy(error)):
        assert type(back) is type(error) and str(back) == str(error) and back.__dict__ == error.__dict__


def test_in_place_on_meta_tensors():
    # meta tensors have no memory and every data_ptr() is 0: two distinct ones were refused as
    # "a view overlapping x"; views of one meta storage must still be refused
    x, residual = torch.empty(4, N, device="meta"), torch.empty(4, N, device="meta")
    out = ks.fused_add_rms_norm(x, residual, None, in_place=True, backend="reference")
    assert out.out.shape == (4, N) and out.out.is_meta
    with pytest.raises(ks.ArgumentError, match="argument 'residual' must be a different tensor from x sharing no"):
        ks.fused_add_rms_norm(x, x[:], None, in_place=True, backend="reference")


def test_views_overlap_across_devices_and_meta_storages():
    from kernelset.core import checks
    m = torch.empty(4, N, device="meta")
    assert not checks.views_overlap(m, torch.empty(4, N, device="meta"))  # two storages
    assert not checks.views_overlap(m[:2], m[2:])  # one storage, disjoint rows
    assert checks.views_overlap(m[:3], m[2:])  # one storage, row 2 shared
    assert not checks.views_overlap(m, torch.empty(4, N))  # meta and cpu


def test_row_stride_of_a_scalar():
    # the 0-d case was tested after t.shape[-1], which raised IndexError first
    from kernelset.core import checks
    assert checks.row_stride(torch.tensor(1.0)) is None
