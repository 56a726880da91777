"""Argument checks shared by every op. Each error names the op, the argument and what was expected."""
from __future__ import annotations

import math

import torch

from .errors import ArgumentError, ArgumentTypeError

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_DTYPE_NAMES = "float32, float16 or bfloat16"


def tensor(op: str, name: str, t: object, *, dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES,
           min_ndim: int = 1) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(op, name, "a torch.Tensor", type(t).__name__)
    if t.layout is not torch.strided:  # sparse, CSR, ...: the kernels and the reference read strided memory
        raise ArgumentTypeError(op, name, "a dense (strided) tensor", f"layout {str(t.layout).replace('torch.', '')}")
    if t.dtype not in dtypes:
        want = _DTYPE_NAMES if dtypes == FLOAT_DTYPES else " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ArgumentTypeError(op, name, f"of dtype {want}", str(t.dtype).replace("torch.", ""))
    if t.dim() < min_ndim:
        raise ArgumentError(op, name, f"at least {min_ndim}-D", f"shape {tuple(t.shape)}")
    return t


def same_device(op: str, name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    if t.device != ref.device:
        raise ArgumentError(op, name, f"on the same device as '{ref_name}' ({ref.device})", f"device {t.device}")


def same_dtype(op: str, name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    if t.dtype != ref.dtype:
        raise ArgumentTypeError(op, name, f"of the same dtype as '{ref_name}' ({ref.dtype})", str(t.dtype))


def shape(op: str, name: str, t: torch.Tensor, expected: tuple[int, ...], what: str = "") -> None:
    # torch.Size compares equal to a tuple directly: the tuple copies only when they differ
    # (or `expected` is a list); this runs on every call of most ops
    if t.shape != expected and tuple(t.shape) != tuple(expected):
        extra = f" ({what})" if what else ""
        raise ArgumentError(op, name, f"of shape {tuple(expected)}{extra}", f"shape {tuple(t.shape)}")


# Comparisons rather than math.isfinite: under torch.compile(dynamic=True) floats are symbolic
# and comparisons become guards; both are false for NaN.
def positive(op: str, name: str, value: object) -> float:
    if type(value) is float and 0.0 < value < math.inf:  # the common case, first
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ArgumentError(op, name, "a finite number > 0", repr(value))
    return _as_float(op, name, value, "a finite number > 0")


def finite(op: str, name: str, value: object) -> float:
    if type(value) is float and -math.inf < value < math.inf:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not -math.inf < value < math.inf:
        raise ArgumentError(op, name, "a finite number", repr(value))
    return _as_float(op, name, value, "a finite number")


def _as_float(op: str, name: str, value: int | float, expected: str) -> float:
    # an int compares below math.inf however large, but float() of one past ~1.8e308 overflows
    try:
        return float(value)
    except OverflowError:
        got = f"an integer of {value.bit_length()} bits, too large for a float"
        raise ArgumentError(op, name, expected, got) from None


def row_stride(t: torch.Tensor) -> int | None:
    """The one stride between consecutive rows of ``t`` viewed as [rows, t.shape[-1]], or None.

    None when the last dim is not unit-stride or the leading dims do not collapse to one
    stride (a permuted view); size-1 dims are ignored. A kernel given the result reads row r at
    ``r * stride``.
    """
    if t.dim() == 0:
        return None
    n = t.shape[-1]
    if t.is_contiguous():
        return n
    if t.stride(-1) != 1 and n > 1:
        return None
    stride = None
    expect = None
    for size, st in zip(reversed(t.shape[:-1]), reversed(t.stride()[:-1])):
        if size == 1:
            continue
        if stride is None:
            stride, expect = st, st * size
        elif st != expect:
            return None
        else:
            expect = st * size
    return n if stride is None else stride


def row_strided(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when its rows share one stride (what the row kernels take), else a contiguous
    copy. For gradients autograd hands over, which may be expanded (stride 0) or permuted."""
    return t if t.is_contiguous() or row_stride(t) is not None else t.contiguous()


def no_overlap(op: str, name: str, t: torch.Tensor) -> None:
    """An output written in place must have distinct elements (not an expanded or self-overlapping
    view), or the kernel writing it races. Sufficient test, as the C ABI's: sorted by stride, each
    dim's stride reaches past the extent of the smaller ones."""
    if torch.compiler.is_compiling() or t.is_contiguous():
        return  # (traced strides are symbolic; functionalization refuses such a mutation anyway)
    layout = (t.shape, t.stride())
    if layout in _DISTINCT:  # views of a fused projection repeat their layout on every call
        return
    extent = 1  # the largest offset the smaller dims reach, plus one
    for stride, size in sorted((abs(st), size) for size, st in zip(*layout) if size > 1):
        if stride < extent:
            raise ArgumentError(op, name, "a tensor of distinct elements (it is written in place)",
                                f"overlapping elements (shape {tuple(t.shape)}, strides {t.stride()})")
        extent += stride * (size - 1)
    if len(_DISTINCT) < 4096:
        _DISTINCT.add(layout)


_DISTINCT: set[tuple] = set()  # (shape, strides) that passed no_overlap


def _byte_extent(shape, strides, esize: int, period: int) -> tuple[int, int]:
    """Bytes a non-empty view can touch relative to its data pointer, [lo, hi); only dims whose
    byte stride is not a multiple of ``period`` count (period 0: every dim)."""
    lo = hi = 0
    for size, st in zip(shape, strides):
        if size <= 1:
            continue
        sb = st * esize
        if period > 0 and sb % period == 0:
            continue
        e = sb * (size - 1)
        if e < 0:
            lo += e
        else:
            hi += e
    return lo, hi + esize


def _residues(ptr: int, shape, strides, esize: int, period: int) -> tuple[int, int] | None:
    """(start, length) of the cyclic interval modulo ``period`` that holds the residues of every
    byte the view touches, or None when a dim not stepping by a multiple of period spans more."""
    lo, hi = _byte_extent(shape, strides, esize, period)
    if hi - lo > period:
        return None
    return (ptr + lo) % period, hi - lo


def views_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two views may share a byte (the C ABI's ``ks_views_overlap``). Views that interleave
    without meeting (slices of one fused buffer: q and k of a qkv projection, the k and v halves of
    a [num_blocks, 2, ...] cache) do not overlap: for a period some dim steps by, both stay in
    disjoint residue intervals modulo it. Empty views never overlap. Conservative: True may be
    answered for views that interleave in a way this test does not resolve."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    if a.is_meta or b.is_meta or a.device != b.device:
        # meta tensors have no memory (every data_ptr is 0): only views of one storage can meet,
        # placed by their storage offsets; tensors on two devices never share memory
        if not (a.is_meta and b.is_meta) or a.untyped_storage()._cdata != b.untyped_storage()._cdata:
            return False
        pa, pb = a.storage_offset() * a.element_size(), b.storage_offset() * b.element_size()
    else:
        pa, pb = a.data_ptr(), b.data_ptr()
    # the answer depends on the two layouts and the offset between them only (translating both
    # moves every residue alike): serving calls repeat one layout pair per step
    key = (a.shape, a.stride(), a.dtype, b.shape, b.stride(), b.dtype, pb - pa)
    hit = _OVERLAP.get(key)
    if hit is None:
        hit = _views_overlap(pa, pb, (tuple(a.shape), a.stride()), (tuple(b.shape), b.stride()), a.element_size(),
                             b.element_size())
        if len(_OVERLAP) < 4096:
            _OVERLAP[key] = hit
    return hit


_OVERLAP: dict[tuple, bool] = {}
_EXTENT: dict[tuple, tuple[int, int]] = {}  # (shape, strides, element size) -> _byte_extent(..., 0)


def _views_overlap(pa: int, pb: int, sa: tuple, sb: tuple, ea: int, eb: int) -> bool:
    alo, ahi = _byte_extent(*sa, ea, 0)
    blo, bhi = _byte_extent(*sb, eb, 0)
    if pa + ahi <= pb + blo or pb + bhi <= pa + alo:
        return False
    for shape, strides, esize in ((*sa, ea), (*sb, eb)):
        for size, st in zip(shape, strides):
            period = abs(st) * esize
            if size <= 1 or period == 0:
                continue
            ra = _residues(pa, *sa, ea, period)
            rb = _residues(pb, *sb, eb, period)
            if ra is None or rb is None:
                continue
            if (rb[0] - ra[0]) % period >= ra[1] and (ra[0] - rb[0]) % period >= rb[1]:
                return False
    return True


def disjoint(op: str, name: str, t: torch.Tensor, other_name: str, other: torch.Tensor, why: str) -> None:
    """``t`` (written in place) shares no memory with ``other``. Identity only under torch.compile
    (addresses are not traceable there)."""
    if t is other or (not torch.compiler.is_compiling() and views_overlap(t, other)):
        raise _shared(op, name, other_name, why)


def _shared(op: str, name: str, other_name: str, why: str) -> ArgumentError:
    return ArgumentError(op, name, f"a different tensor from {other_name} sharing no memory with it ({why})",
                         f"a view overlapping {other_name}")


def disjoint_all(op: str, named: list[tuple[str, torch.Tensor]], why: str) -> None:
    """No two of these tensors (each written in place) share memory: sorted by byte range, each is
    tested only against those whose ranges meet its own."""
    if torch.compiler.is_compiling():
        ids: dict[int, str] = {}
        for name, t in named:
            if id(t) in ids:
                raise _shared(op, name, ids[id(t)], why)
            ids[id(t)] = name
        return
    spans = []
    for name, t in named:
        if t.numel():
            layout = (t.shape, t.stride(), t.element_size())
            ext = _EXTENT.get(layout)
            if ext is None:  # (every layer's cache has one layout)
                ext = _byte_extent(*layout, 0)
                if len(_EXTENT) < 4096:
                    _EXTENT[layout] = ext
            p = t.data_ptr()
            spans.append((p + ext[0], p + ext[1], name, t))
    spans.sort(key=lambda s: s[0])
    active: list[tuple] = []
    for s in spans:
        active = [a for a in active if a[1] > s[0]]
        for a in active:
            if views_overlap(a[3], s[3]):
                raise _shared(op, s[2], a[2], why)
        active.append(s)
