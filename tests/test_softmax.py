"""softmax / log_softmax: every implementation against the fp32 reference, forward and gradient,
properties (rows sum to one, stability at large logits, masked -inf entries)."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from aot import assert_ring_policy_fits, compile_report

import kernelset as ks
from kernelset.core.registry import impls
from kernelset.core.tolerance import rel_err, tolerance
from kernelset.ops.softmax import launch
from kernelset.ops.softmax import reference as sref

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DT_IDS = lambda d: str(d).replace("torch.", "")  # noqa: E731
SMALL = dataclasses.replace(launch.SoftmaxTuning(), max_block_fwd=256, max_block_bwd=256, looped_block=128,
                            split_chunk_fwd=0, split_chunk_bwd=0)
SPLIT = dataclasses.replace(SMALL, split_chunk_fwd=128, split_chunk_bwd=128, split_min_bwd=0)  # the split kernels instead of the looped ones

# (id, shape, how, dim, why)
CASES = [
    ("row1-4096", (1, 4096), "plain", -1, "a single row: sampling at decode"),
    ("odd-4097", (3, 4097), "plain", -1, "ragged masked tail"),
    ("hidden1", (5, 1), "plain", -1, "one element per row: y = 1, dx = 0"),
    ("rows33-n3", (33, 3), "plain", -1, "many short rows per program"),
    ("3d", (2, 3, 96), "plain", -1, "leading shape [B, S]"),
    ("strided", (6, 130), "slice", -1, "rows of a wider tensor"),
    ("empty", (0, 64), "plain", -1, "no rows"),
    ("dim0", (40, 7), "plain", 0, "reduce a non-last dim (through a view)"),
    ("looped", (3, 1000), "looped", -1, "online max/sum kernels, forced on a short row"),
    ("looped-odd", (2, 777), "looped", -1, "looped with a ragged last chunk"),
    ("looped-exact", (2, 1024), "looped", -1, "looped over whole chunks only: no tail"),
    ("looped-masked", (4, 700), "looped-masked", -1, "looped with -inf chunks and lanes: a lane max of -inf merges to 0"),
    ("split", (3, 1000), "split", -1, "split kernels (a row over 8 programs), forced on a short row"),
    ("split-odd", (2, 777), "split", -1, "split with a ragged last chunk"),
    ("split-strided", (3, 600), "split-slice", -1, "split over rows of a wider tensor"),
    ("split-masked", (4, 700), "split-masked", -1, "split with -inf chunks: a chunk max of -inf merges to 0"),
    ("large-logits", (4, 300), "large", -1, "logits of 1e3: max subtraction keeps exp finite"),
    ("masked", (4, 300), "masked", -1, "-inf entries (attention-style masks) get probability 0"),
]


def _x(shape, how, dtype, device):
    if how.endswith("slice"):
        return torch.randn(*shape[:-1], shape[-1] + 70, dtype=dtype, device=device)[..., : shape[-1]]
    x = torch.randn(*shape, device=device)
    if how == "large":
        x = x * 1000.0
    if how == "masked":
        x[..., ::3] = float("-inf")
    if how in ("split-masked", "looped-masked"):  # whole 128-wide chunks of -inf, and scattered ones
        x[..., 128:384] = float("-inf")
        x[..., ::5] = float("-inf")
    if how == "looped-masked":  # lanes (8 values) of -inf from the first chunk on
        x[..., :16] = float("-inf")
    return x.to(dtype)


def _use(how):
    if how.startswith("split"):
        return launch.use(SPLIT)
    return launch.use(SMALL) if how.startswith("looped") else launch.use(launch.active())


def _backends():
    return [str(i.backend) for i in impls("softmax")]


def _check(out, ref, dtype, what, grad=False):
    assert out.shape == ref.shape and out.dtype == dtype, f"{what}: {tuple(out.shape)} {out.dtype}"
    if out.numel() == 0:
        return
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(out), finite), f"{what}: non-finite where the reference is finite (or back)"
    err, tol = rel_err(out[finite], ref[finite]), tolerance("norm", dtype, grad=grad)
    assert err <= tol, f"{what}: rel err {err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_softmax(log, backend, dtype, case, device):
    _, shape, how, dim, _ = case
    x = _x(shape, how, dtype, device).requires_grad_(True)
    fn = ks.log_softmax if log else ks.softmax
    temperature = 0.7
    with _use(how):
        y = fn(x, dim=dim, temperature=temperature, backend=backend)
        dy = torch.randn_like(y)
        y.backward(dy)
    xr = x.detach().float().requires_grad_()
    yr = (torch.log_softmax if log else torch.softmax)(xr / temperature, dim=dim)
    yr.backward(dy.float())
    _check(y, yr, dtype, "y")
    if how == "large" and not log:
        # Near one-hot rows: softmax's true dx is ~1e-30, below fp16's range; judge it absolutely.
        assert (x.grad.float() - xr.grad).abs().max().item() <= 1e-3
    else:
        _check(x.grad, xr.grad, dtype, "dx", grad=True)


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("how", ["plain", "looped", "split"])
def test_rows_sum_to_one_in_fp32(backend, how, device):
    x = torch.randn(16, 1000, dtype=torch.bfloat16, device=device) * 5
    with _use(how):
        p = ks.softmax(x, out_dtype=torch.float32, backend=backend)
        lp = ks.log_softmax(x, out_dtype=torch.float32, backend=backend)
    assert p.dtype == torch.float32 and lp.dtype == torch.float32
    assert torch.allclose(p.sum(-1), torch.ones(16, device=device), atol=1e-5)
    assert torch.allclose(lp.exp().sum(-1), torch.ones(16, device=device), atol=1e-5)
    assert (p >= 0).all()


@pytest.mark.parametrize("fn,match", [
    (lambda: ks.softmax(torch.randn(2, 3), dim=2), "dim"),
    (lambda: ks.softmax(torch.randn(2, 3), temperature=0.0), "temperature"),
    (lambda: ks.softmax(torch.randint(0, 2, (2, 3))), "dtype"),
    (lambda: ks.log_softmax(torch.randn(2, 3), out_dtype=torch.int32), "out_dtype"),
    (lambda: ks.softmax(torch.randn(2, 3), backend="nope"), "backend"),
    # a non-int dim raised a bare TypeError from the range check, naming no argument
    (lambda: ks.softmax(torch.randn(2, 3), dim=1.0), "argument 'dim' must be an int"),
    (lambda: ks.log_softmax(torch.randn(2, 3), dim=None), "argument 'dim' must be an int"),
], ids=["dim-out-of-range", "zero-temperature", "int-dtype", "int-out-dtype", "unknown-backend", "float-dim",
        "none-dim"])
def test_bad_input(fn, match):
    with pytest.raises((ValueError, TypeError), match=match):
        fn()


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_empty_reduced_dim_keeps_the_graph(log, backend, device):
    """A zero-length reduced dim (x [4, 0]; here dim 0 of [0, 3] too) with x requiring grad: y
    was a fresh empty tensor off the graph, so backward raised "does not require grad" (or, next
    to other outputs, x silently got no grad). torch gives an empty y on the graph, x.grad empty."""
    fn = ks.log_softmax if log else ks.softmax
    for shape, dim in (((4, 0), -1), ((0, 3), 0)):
        x = torch.randn(shape, device=device, requires_grad=True)
        y = fn(x, dim=dim, out_dtype=torch.float32, backend=backend)
        assert y.shape == x.shape and y.dtype == torch.float32 and y.requires_grad
        (y.sum() + x.sum()).backward()
        assert x.grad is not None and x.grad.shape == x.shape


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("dim", [0, 1], ids=["dim0", "dim1"])
def test_other_dim_result_is_contiguous_like_torch(dim, backend, device):
    """The kernels reduce the last dim, so another dim is moved there; the result used to come back
    as a view of that moved layout, and ``.view(-1)`` (fine on torch's result) raised."""
    x = torch.randn(5, 7, 3, device=device)
    y = ks.softmax(x, dim=dim, backend=backend)
    want = torch.softmax(x, dim=dim)
    assert y.is_contiguous() and y.stride() == want.stride()
    assert rel_err(y.view(-1), want.view(-1)) < 1e-6


def test_compile_fullgraph_with_backward(device):
    x = torch.randn(6, 50, device=device, requires_grad=True)

    def f(t):
        return (ks.softmax(t, temperature=2.0) * ks.log_softmax(t, dim=0)).sum()

    (ge,) = torch.autograd.grad(f(x), (x,))
    (gc,) = torch.autograd.grad(torch.compile(f, fullgraph=True, backend="aot_eager")(x), (x,))
    assert rel_err(gc, ge) < 1e-6


_AOT = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernelset.ops.softmax import kernels as K
from kernelset.ops.softmax.launch import SoftmaxTuning, policy

t = SoftmaxTuning()
out = []
for n, max_block in ((8192, t.max_block_fwd), (131072, t.max_block_fwd), (8192, t.max_block_bwd), (65536, t.max_block_bwd)):
    p = policy(32768, n, max_block, 132, t)
    fwd = max_block == t.max_block_fwd
    if fwd:
        fn = K._softmax_fwd_looped_kernel if p.looped else K._softmax_fwd_kernel
        sig = dict(X="*bf16", Y="*bf16", M="i32", N="i32", stride_x="i32", stride_y="i32", inv_t="fp32")
    else:
        fn = K._softmax_bwd_looped_kernel if p.looped else K._softmax_bwd_kernel
        sig = dict(DY="*bf16", Y="*bf16", DX="*bf16", M="i32", N="i32", stride_dy="i32", stride_y="i32",
                   stride_dx="i32", inv_t="fp32")
    for log in (False, True):
        consts = dict(LOG=log, BLOCK_N=p.block_n) if p.looped else dict(LOG=log, ROWS=p.rows, BLOCK_N=p.block_n)
        if p.looped and fwd:
            consts["EPT"] = p.ept
        attrs = {(k,): [["tt.divisibility", 16]] for k, (name, ty) in enumerate(sig.items())
                 if ty.startswith("*") or name == "N" or name.startswith("stride")}
        src = ASTSource(fn, signature={**sig, **{k: "constexpr" for k in consts}}, constexprs=consts, attrs=attrs)
        c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=p.num_warps))
        ptx = c.asm["ptx"]
        out.append(dict(case=f"{fn.__name__}-n{n}-log{log}", local="ld.local" in ptx or "st.local" in ptx,
                        vec=".v4" in ptx))
from kernelset.ops.softmax.launch import split_policy

for n, max_block, fwd in ((131072, t.max_block_fwd, True), (131072, t.max_block_bwd, False)):
    sp = split_policy(n, max_block, t.split_chunk_fwd if fwd else t.split_chunk_bwd,
                      t.split_min_fwd if fwd else t.split_min_bwd, 0, 2, 132, t)  # (fp32 rows take it at 131072)
    fn = K._softmax_fwd_split_kernel if fwd else K._softmax_bwd_split_kernel
    sig = (dict(X="*bf16", Y="*bf16", PART="*fp32", SYNC="*i32", M="i32", N="i32", split="i32", stride_x="i32",
                stride_y="i32", inv_t="fp32") if fwd else
           dict(DY="*bf16", Y="*bf16", DX="*bf16", PART="*fp32", SYNC="*i32", M="i32", N="i32", split="i32",
                stride_dy="i32", stride_y="i32", stride_dx="i32", inv_t="fp32"))
    for log in (False, True):
        consts = dict(LOG=log, CHUNK=sp.chunk, SPLIT_P2=sp.split_p2, PHASE=0)
        attrs = {(k,): [["tt.divisibility", 16]] for k, (name, ty) in enumerate(sig.items())
                 if ty.startswith("*") or name == "N" or name.startswith("stride")}
        src = ASTSource(fn, signature={**sig, **{k: "constexpr" for k in consts}}, constexprs=consts, attrs=attrs)
        c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=sp.num_warps))
        ptx = c.asm["ptx"]
        out.append(dict(case=f"{fn.__name__}-n{n}-log{log}", local="ld.local" in ptx or "st.local" in ptx,
                        vec=".v4" in ptx))
print(json.dumps(out))
"""


def test_kernels_compile_for_sm90():
    """Compile each kernel x LOG for sm_90 at the policy's sizes (child process without the
    interpreter): no spills, 16-byte vector accesses."""
    compile_report(_AOT, 12)


@pytest.mark.parametrize("how", ["plain", "looped", "split"])
def test_batch_invariance(how, device):
    """A row's probabilities do not depend on the rows batched with it (sampling needs this)."""
    x = torch.randn(37, 1000, dtype=torch.bfloat16, device=device)
    with _use(how):
        full = ks.softmax(x)
        for i in (0, 5, 36):
            assert torch.equal(ks.softmax(x[i:i + 1]), full[i:i + 1])


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_split_runs_and_has_one_launch_form(log, device, monkeypatch):
    """The split tuning really launches the split kernels (8 programs per row, forward and
    backward), and on a GPU their one-launch form gives the two-launch form's bits."""
    from kernelset.ops.common import row_barrier

    grids = []
    for name in ("_fwd_split", "_bwd_split"):
        real = getattr(launch, name)
        monkeypatch.setattr(launch, name, lambda grid, *a, _real=real, **kw: (grids.append(grid), _real(grid, *a, **kw))[1])
    x = torch.randn(5, 1000, dtype=torch.bfloat16, device=device, requires_grad=True)
    dy = torch.randn(5, 1000, dtype=torch.bfloat16, device=device)
    fn = ks.log_softmax if log else ks.softmax
    with _use("split"):
        run = lambda: [y := fn(x, backend="triton"), *torch.autograd.grad(y, (x,), dy)]  # noqa: E731
        one = run()
        with row_barrier.two_launches():
            two = run()
    assert len(grids) >= 4 and set(grids) == {(5 * 8,)}, grids
    for a, b in zip(one, two):
        assert torch.equal(a, b)


def test_looped_forward_takes_131072_wide_two_byte_rows():
    """The forward's kernel choice past the block kernels: split everywhere but rows whose next
    power of two is looped_only_fwd with 2-byte elements (measured there: the looped kernel
    wins on the H100 and the H200, 2026-11-27); the backward never takes that exception."""
    t = launch.SoftmaxTuning()

    def split(n, esize, fwd=True):
        if fwd:
            return launch.split_policy(n, t.max_block_fwd, t.split_chunk_fwd, t.split_min_fwd, t.looped_only_fwd,
                                       esize, 132, t).split
        return launch.split_policy(n, t.max_block_bwd, t.split_chunk_bwd, t.split_min_bwd, 0, esize, 132, t).split

    assert t.looped_only_fwd == 131072
    for n in (65537, 100000, 131072):
        assert split(n, 2) == 0 and split(n, 4) > 0, n
        assert split(n, 2, fwd=False) > 0, n
    for n in (32768, 65536, 131073, 262144):
        assert split(n, 2) > 0 and split(n, 4) > 0, n
    p = launch.policy(4096, 131072, t.max_block_fwd, 132, t)
    assert p.looped and p.ept == t.looped_ept and p.block_n % p.ept == 0


# ---- the ring forward (ring_sm90.py: sm_90, Gluon; H200-class GPUs by default) ----------------

RING = dataclasses.replace(launch.SoftmaxTuning(), ring=True, ring_min_gbs_per_sm=0.0)  # any sm_90


def test_ring_policy():
    """2-byte rows of 32768..131072 columns in 32768-column portions; nothing when turned off."""
    assert launch.ring_policy(131072, 2, launch.SoftmaxTuning(ring=False)) is None
    rp = launch.ring_policy(131072, 2, RING)
    assert (rp.split, rp.split_p2, rp.chunks, rp.box_rows, rp.buffers, rp.num_warps) == (4, 4, 8, 16, 9, 8)
    assert launch.ring_policy(32768, 2, RING).split == 1
    assert launch.ring_policy(98304, 2, RING).split_p2 == 4
    for n in (16384, 40000, 262144):
        assert launch.ring_policy(n, 2, RING) is None, n
    assert launch.ring_policy(131072, 4, RING) is None  # fp32 rows


def test_ring_choice_needs_sm90_cuda_and_the_bandwidth_class(device, monkeypatch):
    if device.type != "cuda":
        assert launch.ring_choice(131072, torch.bfloat16, device, RING) is None
    from kernelset.ops.common import ring_host
    monkeypatch.setattr(ring_host, "on_sm90", lambda device, arch=None: True)
    monkeypatch.setattr(ring_host, "gluon_kernel", lambda mod, name: (object(), None))
    cuda, t = torch.device("cuda"), launch.SoftmaxTuning()
    assert launch.ring_choice(131072, torch.bfloat16, cuda, t, gbs_per_sm=36.0) is not None  # H200
    assert launch.ring_choice(131072, torch.bfloat16, cuda, t, gbs_per_sm=25.0) is None  # H100
    assert launch.ring_choice(131072, torch.bfloat16, cuda, RING, gbs_per_sm=25.0) is not None


_RING_AOT = r"""
import json, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from kernelset.ops.softmax import ring_sm90 as K
from kernelset.ops.softmax.launch import SoftmaxTuning, ring_policy

out = []
fn = K._softmax_ring_fwd_kernel
for n, dt, log, ydt in ((131072, "bf16", False, "bf16"), (131072, "fp16", True, "fp16"), (32768, "bf16", False, "fp32")):
    rp = ring_policy(n, 2, SoftmaxTuning(ring=True))
    lay = gl.NVMMASharedLayout.get_default_for([rp.box_rows, 256], gl.bfloat16 if dt == "bf16" else gl.float16)
    sig = dict(x_desc=f"tensordesc<{dt}[{rp.box_rows}, 256],{lay!r}>", Y=f"*{ydt}", PART="*fp32", SYNC="*i32",
               R="i32", N="i32", inv_t="fp32")
    consts = dict(LOG=log, S=rp.split, S_P2=rp.split_p2, NCH=rp.chunks, BOXR=rp.box_rows, NB=rp.buffers,
                  num_warps=rp.num_warps)
    full = {a: sig.get(a) or "constexpr" for a in fn.arg_names}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in ("Y", "PART", "SYNC", "N")}
    c = triton.compile(GluonASTSource(fn, signature=full, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=dict(num_warps=rp.num_warps))
    ptx = c.asm["ptx"]
    out.append(dict(case=f"{n}-{dt}-log{int(log)}-{ydt}", local="ld.local" in ptx or "st.local" in ptx,
                    vec="st.global.v4" in ptx, tma="cp.async.bulk.tensor" in ptx, smem=c.metadata.shared,
                    acquire=("ld.global.gpu.acquire" in ptx) or rp.split == 1, per_sm=rp.programs_per_sm))
print(json.dumps(out))
"""


def test_ring_kernel_compiles_for_sm90():
    """The softmax ring forward compiles for sm_90 with this machine's Triton (Gluon): TMA loads,
    16-byte stores, the row's count polled with acquire loads where a row has several portions, no
    spills, and the policy's programs per SM fit an SM's 228 KB of shared memory."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    for r in compile_report(_RING_AOT, 3):
        assert r["tma"] and r["acquire"], r
        assert r["per_sm"] * (r["smem"] + 1024) <= 228 * 1024, r


def _ring_gpu(device):
    if device.type != "cuda" or launch.ring_choice(131072, torch.bfloat16, device, RING) is None:
        pytest.skip("the ring forward needs an sm_90 GPU with Gluon")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("n", [32768, 131072])
def test_ring_forward_matches_reference(n, log, dtype, device, monkeypatch):
    """The ring forward (turned on) against the fp32 reference with a temperature, the output
    poisoned first; a row of -inf gives NaN as torch does, a row with -inf entries does not; a
    row's result is the same bits in any batch; strided rows take the other forward."""
    _ring_gpu(device)
    launched = []
    real = launch._ring_fwd
    monkeypatch.setattr(launch, "_ring_fwd", lambda *a: launched.append(real(*a)) or launched[-1])
    m = 200
    x = torch.randn(m, n, dtype=dtype, device=device) * 3
    x[5] = float("-inf")
    x[6, ::3] = float("-inf")
    with launch.use(RING):
        poisoned = torch.full_like(x, float("nan"))
        del poisoned  # y gets this block from torch's caching allocator: NaN until written
        y = launch.softmax_fwd(x, 0.7, log, dtype)
        one = launch.softmax_fwd(x[9:10].clone(), 0.7, log, dtype)
        wide = torch.randn(4, 2 * n, dtype=dtype, device=device)[:, :n]
        ys = launch.softmax_fwd(wide, 0.7, log, dtype)
    assert launched == [True, True, False], launched
    assert_ring_policy_fits(launch._RING)
    want = sref.fwd(x, 0.7, log, torch.float32)
    assert y[5].isnan().all()
    keep = torch.ones(m, dtype=torch.bool, device=device)
    keep[5] = False
    assert not y[keep].isnan().any()
    finite = want[keep].isfinite()
    assert torch.equal(y[keep].isfinite(), finite)
    assert rel_err(y[keep].float()[finite], want[keep][finite]) <= tolerance("norm", dtype)
    assert torch.equal(one[0], y[9])
    assert rel_err(ys, sref.fwd(wide, 0.7, log, torch.float32)) <= tolerance("norm", dtype)


@pytest.mark.gpu
def test_ring_forward_through_the_api_and_autograd(device):
    """``ks.softmax`` takes the ring forward when it is on (explain says so), and the backward
    from its output matches the reference."""
    _ring_gpu(device)
    x = torch.randn(64, 65536, dtype=torch.bfloat16, device=device, requires_grad=True)
    dy = torch.randn_like(x)
    with launch.use(RING):
        assert "ring forward on sm_90 (Gluon: 2 programs of 32768 columns per row" in str(
            ks.explain("softmax", x, verbose=False))
        y = ks.softmax(x, backend="triton")
        y.backward(dy)
    xr = x.detach().float().requires_grad_()
    yr = torch.softmax(xr, -1)
    yr.backward(dy.float())
    assert rel_err(y, yr) <= tolerance("norm", torch.bfloat16)
    assert rel_err(x.grad, xr.grad) <= tolerance("norm", torch.bfloat16, grad=True)


def test_ring_unavailable_without_gluon(monkeypatch):
    """A Triton whose Gluon does not import: the ring kernels are unavailable, with the reason."""
    from kernelset.ops.common import ring_host
    ring_host.gluon_kernel.cache_clear()
    real = ring_host.importlib.import_module

    def fail(name):
        if name.endswith("ring_sm90"):
            raise ImportError("no gluon here")
        return real(name)

    monkeypatch.setattr(ring_host.importlib, "import_module", fail)
    try:
        kernel, why = ring_host.gluon_kernel("kernelset.ops.softmax.ring_sm90", "_softmax_ring_fwd_kernel")
        assert kernel is None and why == "ImportError: no gluon here"
        monkeypatch.setattr(ring_host, "on_sm90", lambda device, arch=None: True)
        assert launch.ring_choice(131072, torch.bfloat16, torch.device("cuda"), RING) is None
    finally:
        ring_host.gluon_kernel.cache_clear()


def test_ring_launcher_binds_the_kernel_signature(monkeypatch):
    """softmax_fwd down to the ring kernel's launch on any machine (an sm_90 GPU and the kernel
    stood in for, the ring turned on): every kernel parameter gets the right tensor or value."""
    pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from kernelset.ops.common import ring_host
    from kernelset.ops.softmax import ring_sm90 as K
    calls = []
    monkeypatch.setattr(ring_host, "gluon_kernel", lambda mod, name: (lambda grid, *a, **kw: calls.append((grid, a, kw)), None))
    monkeypatch.setattr(ring_host, "on_sm90", lambda device, arch=None: True)
    sync, part = torch.zeros(6, dtype=torch.int32), torch.empty(40)
    monkeypatch.setattr(ring_host, "launches", lambda dev, m, nslot, p2: ((0, sync, part),))
    x = torch.randn(5, 131072, dtype=torch.bfloat16)
    with launch.use(RING):
        y = launch.softmax_fwd(x, 2.0, True, torch.float32)
    (grid, args, kw), = calls
    bound = dict(zip(K._softmax_ring_fwd_kernel.arg_names, args), **kw)
    assert set(bound) == set(K._softmax_ring_fwd_kernel.arg_names)
    assert bound["x_desc"].base.data_ptr() == x.data_ptr() and bound["Y"] is y and y.dtype == torch.float32
    assert bound["PART"] is part and bound["SYNC"] is sync
    assert (bound["R"], bound["N"], bound["inv_t"], bound["LOG"]) == (5, 131072, 0.5, True)
    assert (bound["S"], bound["S_P2"], bound["NCH"], bound["BOXR"], bound["NB"], bound["num_warps"]) == (4, 4, 8, 16, 9, 8)
    assert grid == (12,)  # 4 "SMs" off the GPU x 3 programs each = 3 groups of 4 programs (5 rows)
