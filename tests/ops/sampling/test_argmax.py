"""ks.argmax against its fp32 reference (torch.argmax in fp32) for every backend: exact ids, ties
(the first maximal index), NaN (the first NaN wins), -inf rows, rows longer than one chunk, strided
and batched inputs, bad input."""
from __future__ import annotations

import pytest
import torch

import kernelset as ks
from kernelset.core.registry import impls

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BACKENDS = [str(i.backend) for i in impls("argmax")]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("shape", [(1, 1), (3, 70), (2, 4097), (5, 9000), (4, 3 * 4096 + 5), (2, 3, 33)],
                         ids=["one-element", "small", "chunk-plus-one", "three-chunks", "long-rows", "batched-3d"])
def test_matches_torch_argmax(backend, dtype, shape):
    x = torch.randn(*shape, device=DEVICE).to(dtype)
    got = ks.argmax(x, backend=backend)
    assert got.dtype == torch.int64 and got.shape == shape[:-1]
    assert torch.equal(got, torch.argmax(x.float(), dim=-1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_ties_take_the_first_index_across_chunks(backend):
    # the maximum appears in several lanes and chunks: the first column must win
    x = torch.zeros(4, 9000, device=DEVICE)
    x[0, [4100, 17, 8999]] = 5.0           # lane 17 of chunk 0 first
    x[1, [4096 + 17, 4096 + 3]] = 5.0      # two lanes of chunk 1
    x[2] = 1.0                             # all equal: 0
    x[3, [8999, 8998]] = 2.0
    assert ks.argmax(x, backend=backend).tolist() == [17, 4099, 0, 8998]


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_and_infinities_follow_torch(backend):
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([[1.0, nan, 3.0, nan], [-inf, -inf, -inf, -inf], [inf, 1.0, inf, nan], [2.0, inf, inf, 0.0]],
                     device=DEVICE)
    want = torch.argmax(x, dim=-1)
    assert ks.argmax(x, backend=backend).tolist() == want.tolist() == [1, 0, 3, 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_rows_and_a_non_unit_last_stride(backend):
    base = torch.randn(6, 2 * 300, device=DEVICE)
    for view in (base[::2, :300], base[:, ::2], base.t()[:100]):
        assert torch.equal(ks.argmax(view, backend=backend), torch.argmax(view, dim=-1))


def test_empty_batch_and_bad_input():
    assert ks.argmax(torch.randn(0, 7, device=DEVICE)).shape == (0,)
    with pytest.raises(ks.ArgumentError, match="argument 'x'"):
        ks.argmax(torch.randn(3, 0, device=DEVICE))
    with pytest.raises(ks.ArgumentTypeError, match="argument 'x'"):
        ks.argmax(torch.arange(5, device=DEVICE))


def test_compiles_without_graph_breaks_and_ignores_grad():
    x = torch.randn(4, 100, device=DEVICE, requires_grad=True)
    got = torch.compile(lambda t: ks.argmax(t), fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(got, torch.argmax(x.detach(), dim=-1))
    eager = ks.argmax(x)  # an input requiring grad: ids carry no gradient
    assert not eager.requires_grad and torch.equal(eager, got)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_and_minus_inf_across_splits(backend):
    # rows long enough to be split over several programs: the merge must keep torch's order
    nan, inf = float("nan"), float("inf")
    x = torch.randn(4, 3 * 4096 + 5, device=DEVICE)
    x[0, 9000], x[0, 5000] = nan, inf          # a NaN in a later split beats an inf in an earlier one
    x[1, [8200, 4097, 12000]] = nan            # the first NaN, in the second split
    x[2] = -inf                                # all -inf: 0
    x[3, 4096 * 3 + 4] = inf                   # the maximum in the last, short split
    want = torch.argmax(x, dim=-1)
    assert want.tolist() == [9000, 4097, 0, 4096 * 3 + 4]
    assert ks.argmax(x, backend=backend).tolist() == want.tolist()
