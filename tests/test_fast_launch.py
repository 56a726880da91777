"""FastKernel (ops/common/fast_launch.py): the cached direct launch must never reuse a kernel compiled
for another specialization. The key function is checked on CPU; the launches on a GPU."""
import pytest
import torch
import triton
import triton.language as tl

from kernelset.ops.common.fast_launch import FastKernel, _fast_key

HEAD = (0, 4, None, True)


def _key(*args):
    return _fast_key(HEAD, args)


def test_key_separates_what_triton_specializes_on():
    x = torch.randn(64, dtype=torch.bfloat16)
    # dtype and 16-byte alignment of a pointer
    assert _key(x) == _key(torch.randn(64, dtype=torch.bfloat16))
    assert _key(x) != _key(x.to(torch.float16))
    assert _key(x) != _key(x[1:])  # 2 bytes off: not 16-byte aligned
    assert _key(x) == _key(x[8:])  # 16 bytes off: aligned
    # an absent pointer against a present one, in either position
    assert _key(None, x) != _key(x, None)
    assert _key(None, 1) != _key(x, 1)
    # ints: == 1, divisible by 16, fits int32
    codes = {v: _key(v) for v in (1, 2, 16, 17, 32, 2**31 - 16, 2**31, -16, 0)}
    assert codes[2] == codes[17] and codes[16] == codes[32] == codes[-16] == codes[0] == codes[2**31 - 16]
    assert len({codes[1], codes[2], codes[16], codes[2**31]}) == 4
    # floats by type only (Triton does not specialize on their value); bools by value
    assert _key(1e-6) == _key(1e-5) and _key(True) != _key(False) and _key(True) != _key(1)


def test_key_separates_tma_descriptors():
    """Host TMA descriptors (Gluon kernels): keyed on dtype, base alignment, block, layout, and each
    shape and stride as 1 / divisible by 16, never on the address or the exact extents."""
    hopper = pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    gl = pytest.importorskip("triton.experimental.gluon.language")
    lay = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)

    def desc(t, block=(64, 64), layout=lay):
        return hopper.TensorDescriptor(t, list(t.shape), list(t.stride()), list(block), layout)
    a = torch.randn(256, 128, dtype=torch.bfloat16)
    assert _key(desc(a)) == _key(desc(torch.randn(256, 128, dtype=torch.bfloat16)))
    assert _key(desc(a)) == _key(desc(torch.randn(512, 128, dtype=torch.bfloat16)))  # rows: 256, 512 both % 16
    assert _key(desc(a)) != _key(desc(torch.randn(200, 128, dtype=torch.bfloat16)))  # 200 is not
    assert _key(desc(a)) != _key(desc(torch.randn(256, 136, dtype=torch.bfloat16)[:, :128]))  # stride 136
    assert _key(desc(a)) != _key(desc(a.half(), layout=gl.NVMMASharedLayout.get_default_for([64, 64], gl.float16)))
    assert _key(desc(a)) != _key(desc(a, block=(32, 64), layout=gl.NVMMASharedLayout.get_default_for(
        [32, 64], gl.bfloat16)))


def test_key_includes_the_head():
    x = torch.randn(8)
    assert _fast_key((0, 4, None, True, ("BLOCK", 16)), (x,)) != _fast_key((0, 4, None, True, ("BLOCK", 32)), (x,))
    assert _fast_key((0, 4, None, True), (x,)) != _fast_key((1, 4, None, True), (x,))  # device


@triton.jit
def _scaled_copy(X, Y, n, stride, alpha, BLOCK: tl.constexpr, NEG: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(X + offs * stride, mask=m).to(tl.float32) * alpha
    if NEG:
        v = -v
    tl.store(Y + offs, v.to(Y.dtype.element_ty), mask=m)


def test_slow_path_on_cpu_runs_the_kernel(device):
    if device.type == "cuda":
        pytest.skip("checked by the GPU test below")
    k = FastKernel(_scaled_copy)
    x = torch.randn(40)
    y = torch.full((40,), float("nan"))
    k((1,), x, y, 40, 1, 2.0, BLOCK=64, NEG=True, num_warps=1)
    torch.testing.assert_close(y, -2.0 * x)


@pytest.mark.gpu
def test_direct_launches_follow_each_specialization():
    k = FastKernel(_scaled_copy)
    dev = torch.device("cuda")
    base = torch.randn(256, device=dev, dtype=torch.float32)
    cases = [  # (x, n, stride, alpha, NEG, out dtype): alignment, int and constexpr changes between calls
        (base, 64, 1, 2.0, False, torch.float32),
        (base[1:], 64, 1, 2.0, False, torch.float32),  # misaligned pointer
        (base, 1, 1, 3.0, False, torch.float32),  # n == 1
        (base, 17, 2, 0.5, True, torch.float32),  # stride 2, NEG
        (base, 48, 1, 1.5, False, torch.bfloat16),  # output dtype
        (base[4:], 64, 1, -1.0, True, torch.float32),
    ]
    for _ in range(2):  # second round: every call is a cache hit, launched directly
        for x, n, stride, alpha, neg, dt in cases:
            y = torch.full((64,), float("nan"), device=dev, dtype=dt)
            k((1,), x, y, n, stride, alpha, BLOCK=64, NEG=neg, num_warps=1)
            want = x[: n * stride : stride].float() * alpha * (-1 if neg else 1)
            torch.testing.assert_close(y[:n].float(), want.to(dt).float())
            assert torch.isnan(y[n:].float()).all()
    assert k.entries() == len(cases)


@pytest.mark.gpu
@pytest.mark.parametrize("direct", [True, False])
def test_direct_launch_matches_triton_launch(direct):
    """The direct C-launcher call (tensor addresses as ints) and Triton's own kernel.run give the
    same result; on a Triton whose launcher is a per-signature C module (3.6) the direct call is
    the one cached."""
    import kernelset as ks

    k = FastKernel(_scaled_copy)
    dev = torch.device("cuda")
    x = torch.randn(256, device=dev)
    with ks.config.override(direct_launch=direct):
        for i in range(3):  # first call compiles through Triton, the others launch from the cache
            y = torch.full((64,), float("nan"), device=dev)
            k((1,), x[i * 16:], y, 50, 1, 1.5, BLOCK=64, NEG=False, num_warps=1)
            torch.testing.assert_close(y[:50], x[i * 16:i * 16 + 50] * 1.5)
            assert torch.isnan(y[50:]).all()
    (entry,) = [e for lay in k.layouts.values() for e in lay.cache.values()]
    kernel, _, raw = entry
    launcher_module = getattr(getattr(getattr(kernel.run, "launch", None), "__self__", None), "__name__", "")
    if launcher_module == "__triton_launcher" and not getattr(kernel.run, "global_scratch_size", 0):
        assert raw is not None


def test_gluon_ring_kernels_take_the_direct_path():
    """The Gluon ring kernels name num_warps as a constexpr parameter and take a TMA descriptor
    first: FastKernel still launches them directly (every constexpr by name, num_warps from the
    launch option), not through Triton's binding on every call."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from kernelset.ops.loss import ring_sm90 as CE
    from kernelset.ops.norm import ring_sm90 as NORM
    from kernelset.ops.softmax import ring_sm90 as SM
    for fn in (CE._ce_ring_kernel, NORM._rms_ring_fwd_kernel, SM._softmax_ring_fwd_kernel):
        fk = FastKernel(fn)
        assert fk.direct and fk.positional_only and fk.nw_param, fn


def test_bound_launch_checks_what_triton_specializes_on(monkeypatch):
    """FastKernel.at's generated launcher (``_make_bound``): launches the bound kernel with tensor
    addresses and the constexpr tail, and launches nothing (returns False) where a later call
    differs in a tensor's dtype or 16-byte alignment, an int's class (== 1, divisible by 16, width),
    a None slot, a float slot's type or the device, or where a launch hook is installed."""
    from kernelset.ops.common import fast_launch as TL

    if TL._knobs is None:
        pytest.skip("this Triton has no knobs module (no direct launches at all)")
    monkeypatch.setattr(TL, "_raw_stream", lambda dev: 1000 + dev)
    launched = []

    class Kernel:
        function, packed_metadata = "fn", "meta"

    def launch(*a):
        launched.append(a)

    base = torch.randn(64)
    other = torch.randn(64, dtype=torch.float64)
    args = (base, None, 32, 7, 0.5)
    bound = TL._make_bound(args, Kernel(), (64, True), (launch, False, False), base.get_device())
    assert bound((3, 2), args)
    (call,) = launched
    assert call[:3] == (3, 2, 1) and call[3] == 1000 + base.get_device() and call[4] == "fn"
    assert call[9] == "meta" and call[13:] == (base.data_ptr(), None, 32, 7, 0.5, 64, True)
    assert bound((1,), (base[:32], None, 48, 9, 2.0))  # same classes: 32 and 48 divisible by 16, 7 and 9 not
    misses = [
        (base[1:], None, 32, 7, 0.5),  # misaligned address
        (other, None, 32, 7, 0.5),  # dtype
        (base, base, 32, 7, 0.5),  # a None slot given a tensor
        (base, None, 1, 7, 0.5),  # == 1
        (base, None, 33, 7, 0.5),  # no longer divisible by 16
        (base, None, 32, 2**40, 0.5),  # 64-bit
        (base, None, 32, 7, 1),  # an int where a float was
    ]
    for m in misses:
        n = len(launched)
        assert not bound((1,), m), m
        assert len(launched) == n
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 5)
    assert not bound((1,), args)  # another device
    monkeypatch.undo()
    monkeypatch.setattr(TL, "_raw_stream", lambda dev: 1000 + dev)

    class Hooks:
        calls = [print]

    monkeypatch.setattr(TL._knobs.runtime, "launch_enter_hook", Hooks())
    assert not bound((1,), args)


def test_sites_are_dropped_when_the_configuration_changes():
    import kernelset as ks
    from kernelset.ops.common import fast_launch as TL

    fk = FastKernel(_scaled_copy)
    fk.sites["s"] = lambda grid, args: True
    assert fk.at("s", (1,))
    with ks.config.override(direct_launch=False):
        assert not fk.at("s", (1,))
    assert fk in TL._ALL


@pytest.mark.gpu
def test_bound_launches_follow_each_specialization():
    """A site bound by a full call launches through ``at``; a call that differs in what Triton
    specializes on is refused and the full call rebinds; results always match the full call's."""
    k = FastKernel(_scaled_copy)
    dev = torch.device("cuda")
    base = torch.randn(256, device=dev, dtype=torch.float32)
    cases = [(base, 64, 1, 2.0), (base[1:], 64, 1, 2.0), (base, 1, 1, 3.0), (base, 17, 2, 0.5), (base[4:], 48, 1, -1.0)]
    site = ("BLOCK 64", False)
    hits = 0
    for _ in range(3):
        for x, n, stride, alpha in cases:
            y = torch.full((64,), float("nan"), device=dev)
            if k.at(site, (1,), x, y, n, stride, alpha):
                hits += 1
            else:
                k((1,), x, y, n, stride, alpha, site=site, BLOCK=64, NEG=False, num_warps=1)
            torch.testing.assert_close(y[:n], x[: n * stride : stride] * alpha)
            assert torch.isnan(y[n:]).all()
    raws = [e[2] for lay in k.layouts.values() for e in lay.cache.values()]
    if all(r is not None for r in raws):  # a Triton with a per-signature C launcher (3.6): sites bind
        assert hits > 0
