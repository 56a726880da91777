"""embedding: lookup and deterministic backward against torch, edge cases, bad ids."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from aot import compile_report

import kernelset as ks
from kernelset.core.registry import impls
from kernelset.core.tolerance import rel_err, tolerance

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
BACKENDS = [str(i.backend) for i in impls("embedding")]

# (id, ids shape, vocab, dim, ids dtype, why)
CASES = [
    ("tokens-2d", (4, 9), 100, 64, torch.int64, "[B, S] ids"),
    ("int32-ids", (17,), 50, 48, torch.int32, "int32 ids (vLLM)"),
    ("odd-dim", (8,), 30, 1001, torch.int64, "ragged column tile"),
    ("vocab1", (6,), 1, 16, torch.int64, "every id repeats: one long run in the backward"),
    ("empty", (0,), 10, 8, torch.int64, "no ids"),
    ("strided-weight", (12,), 40, 24, torch.int64, "weight rows of a wider table (row stride 40)"),
]


def _weight(v, d, dtype, device, strided):
    if strided:
        return torch.randn(v, d + 16, device=device).to(dtype)[:, :d]
    return torch.randn(v, d, device=device).to(dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_embedding(backend, dtype, case, device):
    _, shape, v, d, idt, _ = case
    w = _weight(v, d, dtype, device, case[0] == "strided-weight").requires_grad_(True)
    ids = torch.randint(0, v, shape, device=device, dtype=idt)
    if ids.numel() > 3:
        ids.view(-1)[:3] = ids.view(-1)[3]  # repeated ids: the backward must sum them
    y = ks.embedding(ids, w, backend=backend)
    assert torch.equal(y, w.detach()[ids.long()]), "the lookup is a copy: exact"
    dy = torch.randn_like(y)
    y.backward(dy)
    wr = w.detach().float().requires_grad_()
    F.embedding(ids.long(), wr).backward(dy.float())
    assert w.grad.dtype == dtype and w.grad.shape == (v, d)
    assert rel_err(w.grad, wr.grad) <= tolerance("elementwise", dtype, grad=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_is_deterministic(backend, device):
    w = torch.randn(20, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    ids = torch.randint(0, 20, (500,), device=device)
    dy = torch.randn(500, 64, device=device, dtype=torch.bfloat16)
    grads = []
    for _ in range(2):
        w.grad = None
        ks.embedding(ids, w, backend=backend).backward(dy)
        grads.append(w.grad.clone())
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_of_range_ids(backend, device):
    w = torch.randn(10, 8, device=device)
    for bad in ([10], [-1], [3, 11]):
        with pytest.raises(ks.ArgumentError, match=r"'ids' must be in \[0, 10\)"):
            ks.embedding(torch.tensor(bad, device=device), w, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["every-other", "expanded", "column"])
def test_strided_ids(backend, layout, device):
    # 1-D ids that are a view: reshape(-1) keeps the view, and the kernel once read them as if
    # dense (ids[::2] gave the rows of ids[:3]; an expand read past the one stored id)
    base = torch.tensor([[1, 9], [2, 8], [3, 7], [4, 6]], device=device)
    ids = {"every-other": base.view(-1)[::2], "expanded": base[1, :1].expand(5), "column": base[:, 1]}[layout]
    w = torch.randn(10, 6, device=device, requires_grad=True)
    y = ks.embedding(ids, w, backend=backend)
    assert torch.equal(y, w.detach()[ids])
    dy = torch.randn_like(y)
    y.backward(dy)
    want = torch.zeros(10, 6, device=device).index_add_(0, ids, dy)
    torch.testing.assert_close(w.grad, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_unchecked_out_of_range_id_is_never_read(backend, device):
    # every backend alike: the reference once wrapped -1 to the last row (torch indexing), and it
    # runs where the kernel cannot (strided weight, no Triton) and under torch.compile (unchecked)
    w = torch.randn(10, 8, device=device)
    y = ks.embedding(torch.tensor([2, 10, 3, -1], device=device), w, check_ids=False, backend=backend)
    assert y[1].isnan().all() and y[3].isnan().all() and torch.equal(y[[0, 2]], w[[2, 3]])


@pytest.mark.parametrize("backend", BACKENDS)
def test_unchecked_out_of_range_id_is_never_written_by_the_backward(backend, device):
    """The backward of an unchecked lookup gives in-range ids their summed rows and writes nothing
    for an id outside [0, V) (a guard value past the gradient's end stays untouched; the reference
    once raised torch's index error instead)."""
    buf = torch.full((11, 8), 7.0, device=device)
    w = buf[:10].clone().requires_grad_()
    ids = torch.tensor([2, 10, 3, 2, -1], device=device)
    y = ks.embedding(ids, w, check_ids=False, backend=backend)
    dy = torch.randn_like(y)
    (dw,) = torch.autograd.grad(y, (w,), dy)
    want = torch.zeros(10, 8, device=device)
    want[2] = dy[0] + dy[3]
    want[3] = dy[2]
    torch.testing.assert_close(dw, want)
    if backend != "triton":
        return
    # the kernel itself, into a gradient with guard rows on both sides
    from kernelset.ops.embedding import launch as EL
    guard = torch.full((12, 8), 7.0, device=device)
    sorted_ids, order = torch.sort(ids.long(), stable=True)
    EL._bwd((ids.numel(), 1), sorted_ids, order, dy.contiguous(), guard[1:11], ids.numel(), 8, 10, 8, BLOCK_D=8,
            num_warps=1)
    assert (guard[0] == 7.0).all() and (guard[11] == 7.0).all(), "an out-of-range id was written"
    torch.testing.assert_close(guard[3], want[2])  # row 2 of the gradient (stored, not added)


@pytest.mark.parametrize("ids,weight,match", [
    (torch.tensor([0.0]), torch.randn(4, 2), "ids"),
    (torch.tensor([0]), torch.randn(4), "weight"),
    (torch.tensor([0]), torch.randint(0, 2, (4, 2)), "weight"),
    (torch.tensor([0]), torch.randn(4, 2, 2), "weight"),
], ids=["float-ids", "1d-weight", "int-weight", "3d-weight"])
def test_bad_input(ids, weight, match):
    with pytest.raises((ValueError, TypeError), match=match):
        ks.embedding(ids, weight)


def test_compile_fullgraph_with_backward(device):
    w = torch.randn(30, 16, device=device, requires_grad=True)
    ids = torch.randint(0, 30, (5, 4), device=device)

    def f(t):
        return (ks.embedding(ids, t) * 2).pow(2).sum()

    (ge,) = torch.autograd.grad(f(w), (w,))
    (gc,) = torch.autograd.grad(torch.compile(f, fullgraph=True, backend="aot_eager")(w), (w,))
    assert torch.equal(gc, ge)


_AOT = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernelset.ops.embedding import kernels as K
out = []
f_sig = dict(IDS="*i64", W="*bf16", Y="*bf16", M="i32", V="i32", D="i32", stride_w="i32")
b_sig = dict(SORTED="*i64", ORDER="*i64", DY="*bf16", DW="*bf16", M="i32", D="i32", V="i32", stride_dw="i32")
for name, fn, sig, consts, warps in (("fwd", K._embedding_fwd_kernel, f_sig, dict(BLOCK_M=2, BLOCK_D=1024), 4),
                                     ("bwd", K._embedding_bwd_kernel, b_sig, dict(BLOCK_D=2048), 4)):
    attrs = {(k,): [["tt.divisibility", 16]] for k, (n, ty) in enumerate(sig.items())
             if ty.startswith("*") or n in ("D", "stride_w", "stride_dw")}
    src = ASTSource(fn, signature={**sig, **{k: "constexpr" for k in consts}}, constexprs=consts, attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps)).asm["ptx"]
    out.append(dict(case=name, local="ld.local" in ptx or "st.local" in ptx, vec=".v4" in ptx or ".v2" in ptx))
print(json.dumps(out))
"""


def test_kernels_compile_for_sm90():
    compile_report(_AOT, 2)
