"""Paged KV cache: reshape_and_cache, copy_blocks and swap_blocks against independent torch code."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from aot import compile_report

import kernelset as ks
from kernelset.core.registry import impls

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
FP8 = torch.float8_e4m3fn
BACKENDS = [str(i.backend) for i in impls("reshape_and_cache")]


@pytest.fixture(autouse=True, scope="module")
def _interpreter_rounds_fp8_like_the_gpu():
    """Triton's interpreter (3.9) rounds fp32 -> e4m3 without carrying into the exponent (7.9 ->
    4.0); GPUs round to nearest even with saturation, as torch does. Patch the interpreter's cast
    for this module so the fp8 tests compare bits on CPU too."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    import triton.language as tl
    from triton.runtime import interpreter
    builder = interpreter.InterpreterBuilder
    saved = {name: getattr(builder, name) for name in ("cast_impl", "create_fp_to_fp", "create_fp_trunc")}

    def to_fp8(src):
        data = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32)).to(FP8).view(torch.uint8)
        return interpreter.TensorHandle(data.numpy(), tl.float8e4nv)

    def wrap(original):
        def cast(self, src, dst_type, *rest):
            if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.float8e4nv:
                return to_fp8(src)
            return original(self, src, dst_type, *rest)
        return cast

    for name, fn in saved.items():
        setattr(builder, name, wrap(fn))
    yield
    for name, fn in saved.items():
        setattr(builder, name, fn)


def _expected_cache(cache, x, slots, scale=None):
    """The cache after writing x [T, H, D] to slots, in a loop (independent of the implementation)."""
    out = cache.clone()
    bs = cache.shape[1]
    for t, s in enumerate(slots.tolist()):
        if 0 <= s < cache.shape[0] * bs:
            row = x[t].float()
            if cache.dtype == FP8:
                row = (row / scale).clamp(-448, 448)
            out[s // bs, s % bs] = row.to(cache.dtype)
    return out


# (id, tokens, Hkv, D, block size, blocks, why)
CASES = [
    ("llama-d128", 37, 8, 128, 16, 4, "GQA KV heads, tokens spanning blocks"),
    ("d80-bs32", 20, 3, 80, 32, 2, "non power-of-two heads and head size"),
    ("mqa-d64", 9, 1, 64, 16, 3, "one KV head: several tokens per program"),
    ("d256-bs64", 5, 2, 256, 64, 1, "wide heads, one 64-token block"),
    ("one-token", 1, 8, 128, 16, 5, "decode: one new token"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_reshape_and_cache(backend, dtype, case, device):
    _, t, h, d, bs, nb, _ = case
    # key/value as vLLM passes them: token-strided slices of one fused qkv projection
    qkv = torch.randn(t, (2 * h + 2 * h) * d, device=device).to(dtype)
    key, value = qkv[:, 2 * h * d: 3 * h * d].view(t, h, d), qkv[:, 3 * h * d:].view(t, h, d)
    k_cache = torch.randn(nb, bs, h, d, device=device).to(dtype)
    v_cache = torch.randn(nb, bs, h, d, device=device).to(dtype)
    slots = torch.randperm(nb * bs, device=device)[:t]
    if t > 2:
        slots[1] = -1  # padding token
    want_k, want_v = _expected_cache(k_cache, key, slots), _expected_cache(v_cache, value, slots)
    ks.reshape_and_cache(key, value, k_cache, v_cache, slots, backend=backend)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v), "a copy: exact, untouched slots kept"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_reshape_and_cache_fp8(backend, dtype, device):
    t, h, d, bs, nb = 30, 2, 64, 16, 3
    key = (torch.randn(t, h, d, device=device) * 8).to(dtype)
    value = (torch.randn(t, h, d, device=device) * 8).to(dtype)
    key[0, 0, :4] = torch.tensor([1e4, -1e4, 7.9 * 0.05, 0.0])  # saturation both ways, a carry into the exponent
    k_scale, v_scale = torch.tensor(0.05, device=device), torch.tensor(0.3, device=device)
    k_cache = torch.randn(nb, bs, h, d, device=device).to(FP8)
    v_cache = torch.randn(nb, bs, h, d, device=device).to(FP8)
    slots = torch.randperm(nb * bs, device=device)[:t].to(torch.int32)
    want_k = _expected_cache(k_cache, key, slots, k_scale)
    want_v = _expected_cache(v_cache, value, slots, v_scale)
    ks.reshape_and_cache(key, value, k_cache, v_cache, slots, k_scale=k_scale, v_scale=v_scale, backend=backend)
    assert torch.equal(k_cache.view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), want_v.view(torch.uint8))
    blk, off = divmod(slots[0].item(), bs)
    assert k_cache[blk, off, 0, :2].float().tolist() == [448.0, -448.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_cache_view(backend, device):
    """k/v caches as views of one [NB, 2, BS, H, D] allocation (block stride 2 * BS * H * D)."""
    kv = torch.randn(3, 2, 16, 2, 32, device=device)
    key, value = torch.randn(10, 2, 32, device=device), torch.randn(10, 2, 32, device=device)
    slots = torch.randperm(48, device=device)[:10]
    want = kv.clone()
    want[:, 0] = _expected_cache(kv[:, 0], key, slots)
    want[:, 1] = _expected_cache(kv[:, 1], value, slots)
    ks.reshape_and_cache(key, value, kv[:, 0], kv[:, 1], slots, backend=backend)
    assert torch.equal(kv, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_of_range_slots(backend, device):
    k_cache = torch.randn(2, 16, 1, 32, device=device)
    v_cache = torch.randn(2, 16, 1, 32, device=device)
    key, value = torch.randn(3, 1, 32, device=device), torch.randn(3, 1, 32, device=device)
    for bad in (32, -2):
        slots = torch.tensor([0, bad, 5], device=device)
        with pytest.raises(ks.ArgumentError, match="slot_mapping"):
            ks.reshape_and_cache(key, value, k_cache, v_cache, slots, backend=backend)
    # unchecked (the hot path): the bad token is skipped, nothing outside the cache is written
    big_k = torch.randn(3, 16, 1, 32, device=device)
    before = big_k.clone()
    slots = torch.tensor([0, 32, 5], device=device)
    ks.reshape_and_cache(key, value, big_k[:2], v_cache, slots, check_slots=False, backend=backend)
    assert torch.equal(big_k[2], before[2]), "wrote past the cache"
    assert torch.equal(big_k[0, 0], key[0]) and torch.equal(big_k[0, 5], key[2])


def _base():
    kc = torch.randn(2, 16, 2, 32)
    return dict(key=torch.randn(3, 2, 32), value=torch.randn(3, 2, 32), k_cache=kc, v_cache=kc.clone(),
                slot_mapping=torch.tensor([0, 1, 2]))


@pytest.mark.parametrize("change,match", [
    (dict(key=torch.randn(3, 2, 16)), "key"),
    (dict(value=torch.randn(3, 2, 32, dtype=torch.float16)), "value"),
    (dict(k_cache=torch.randn(2, 16, 64)), "k_cache"),
    (dict(v_cache=torch.randn(3, 16, 2, 32)), "v_cache"),
    (dict(k_cache=torch.randn(2, 16, 2, 32, dtype=torch.float16), v_cache=torch.randn(2, 16, 2, 32,
                                                                                        dtype=torch.float16)),
     "k_cache"),
    (dict(slot_mapping=torch.tensor([0.0, 1.0, 2.0])), "slot_mapping"),
    (dict(slot_mapping=torch.tensor([0, 1])), "slot_mapping"),
    (dict(k_scale=torch.tensor(1.0)), "k_scale"),
    (dict(key=torch.randn(3, 2, 64)[..., ::2], value=torch.randn(3, 2, 64)[..., ::2]), "unit-stride"),
    # written in place: every block of an expanded cache is the same memory
    (dict(k_cache=torch.randn(1, 16, 2, 32).expand(2, 16, 2, 32)), "'k_cache' must be a tensor of distinct"),
    (dict(v_cache=torch.randn(2, 1, 2, 32).expand(2, 16, 2, 32)), "'v_cache' must be a tensor of distinct"),
    (dict(v_cache="k_cache"), "'v_cache' must be a different tensor from k_cache"),
], ids=["head-size", "value-dtype", "cache-3d", "v-cache-shape", "cache-dtype", "float-slots", "slots-length",
        "scale-without-fp8", "strided-features", "expanded-k-cache", "expanded-v-cache", "v-cache-is-k-cache"])
def test_bad_input(change, match):
    args = _base()
    args.update(change)
    args.update({k: args[v] for k, v in change.items() if isinstance(v, str)})
    pos = [args.pop(k) for k in ("key", "value", "k_cache", "v_cache", "slot_mapping")]
    with pytest.raises((ValueError, TypeError), match=match):
        ks.reshape_and_cache(*pos, **args)


def test_fp8_cache_needs_scales():
    kc = torch.randn(2, 16, 2, 32).to(FP8)
    args = (torch.randn(3, 2, 32, dtype=torch.bfloat16), torch.randn(3, 2, 32, dtype=torch.bfloat16), kc, kc.clone(),
            torch.tensor([0, 1, 2]))
    with pytest.raises(ks.ArgumentError, match="k_scale"):
        ks.reshape_and_cache(*args)
    with pytest.raises(ks.ArgumentError, match="v_scale"):
        ks.reshape_and_cache(*args, k_scale=torch.tensor(1.0), v_scale=torch.tensor([1.0, 2.0]))


def test_compile_fullgraph_in_place(device):
    k_cache, v_cache = torch.randn(2, 16, 2, 32, device=device), torch.randn(2, 16, 2, 32, device=device)
    slots = torch.tensor([3, 17, -1], device=device)

    def f(k, v):
        ks.reshape_and_cache(k, v, k_cache, v_cache, slots)
        return k_cache.sum() + v_cache.sum()

    k, v = torch.randn(3, 2, 32, device=device), torch.randn(3, 2, 32, device=device)
    want_k, want_v = _expected_cache(k_cache, k, slots), _expected_cache(v_cache, v, slots)
    total = torch.compile(f, fullgraph=True, backend="aot_eager")(k, v)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    assert torch.allclose(total, want_k.sum() + want_v.sum())


@pytest.mark.parametrize("backend", BACKENDS)
def test_writes_bump_autograd_versions(backend, device):
    # torch's in-place writes bump a tensor's version counter, so a graph that saved the tensor
    # refuses to back-propagate through the new values; kernels writing through pointers must bump
    # it themselves (the Triton paths did not: the backward silently used the overwritten cache)
    h, d, bs, nb = 2, 64, 16, 2
    key, value = torch.randn(3, h, d, device=device), torch.randn(3, h, d, device=device)
    k_cache, v_cache = torch.randn(nb, bs, h, d, device=device), torch.randn(nb, bs, h, d, device=device)
    w = torch.randn(d, 4, device=device, requires_grad=True)
    saved = [k_cache @ w, v_cache @ w]  # both caches saved for w's gradient
    ks.reshape_and_cache(key, value, k_cache, v_cache, torch.tensor([0, 5, 17], device=device), backend=backend)
    for out in saved:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()
    saved = [k_cache @ w, v_cache @ w]
    ks.copy_blocks([k_cache], [v_cache], torch.tensor([[0, 1]], device=device), backend=backend)
    for out in saved:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


# ---- copy_blocks / swap_blocks -----------------------------------------------------------------


@pytest.mark.parametrize("backend", [str(i.backend) for i in impls("copy_blocks")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, FP8], ids=["bfloat16", "float32", "fp8"])
def test_copy_blocks(backend, dtype, device):
    # layers of different block shapes (allowed: one launch per layer)
    shapes = [(6, 16, 2, 64), (6, 16, 2, 64), (6, 4, 1, 80)]
    k_caches = [torch.randn(s, device=device).to(dtype) for s in shapes]
    v_caches = [torch.randn(s, device=device).to(dtype) for s in shapes]
    mapping = torch.tensor([[0, 3], [2, 5], [0, 4]], device=device)
    want_k, want_v = [c.clone() for c in k_caches], [c.clone() for c in v_caches]
    for c in (*want_k, *want_v):
        for s, d in mapping.tolist():
            c[d] = c[s]
    ks.copy_blocks(k_caches, v_caches, mapping, backend=backend)
    for got, want in zip((*k_caches, *v_caches), (*want_k, *want_v)):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_copy_blocks_bad_input(device):
    kc = [torch.randn(4, 16, 2, 32, device=device)]
    vc = [torch.randn(4, 16, 2, 32, device=device)]
    with pytest.raises(ks.ArgumentError, match="destination"):
        ks.copy_blocks(kc, vc, torch.tensor([[0, 4]], device=device))
    with pytest.raises(ks.ArgumentError, match="source"):
        ks.copy_blocks(kc, vc, torch.tensor([[-1, 2]], device=device))
    with pytest.raises(ks.ArgumentError, match=r"\[N, 2\]"):
        ks.copy_blocks(kc, vc, torch.tensor([[0, 1, 2]], device=device))
    with pytest.raises(ks.ArgumentError, match="layers"):
        ks.copy_blocks(kc, vc * 2, torch.tensor([[0, 1]], device=device))
    with pytest.raises(ks.ArgumentError, match=r"v_caches\[0\]"):
        ks.copy_blocks(kc, [torch.randn(4, 16, 2, 16, device=device)], torch.tensor([[0, 1]], device=device))
    with pytest.raises(TypeError, match="k_caches"):
        ks.copy_blocks(kc[0], vc, torch.tensor([[0, 1]], device=device))
    with pytest.raises(ks.ArgumentError, match=r"'v_caches\[0\]' must be a tensor of distinct elements"):
        ks.copy_blocks(kc, [vc[0][:1].expand(4, 16, 2, 32)], torch.tensor([[0, 1]], device=device))
    before = kc[0].clone()
    ks.copy_blocks(kc, vc, torch.tensor([[0, 9], [1, 2]], device=device), check_blocks=False, backend="triton")
    assert torch.equal(kc[0][2], before[1]) and torch.equal(kc[0][:2], before[:2]), "bad pair skipped"


@pytest.mark.parametrize("backend", [str(i.backend) for i in impls("copy_blocks")])
@pytest.mark.parametrize("pairs,match", [
    ([[0, 1], [1, 2]], "also a source"),  # block 1 written while pair 2 reads it
    ([[2, 0], [3, 2]], "also a source"),  # the same race, the writer listed second
    ([[0, 3], [1, 3]], "repeated destination"),
], ids=["chain", "chain-reversed", "two-writers"])
def test_copy_blocks_racing_pairs_refused(backend, pairs, match, device):
    # the pairs run in parallel on the GPU: such mappings gave backend- and timing-dependent blocks
    # (the interpreter's program order copied block 0 into block 2, the reference block 1), silently
    kc = [torch.randn(4, 2, 1, 8, device=device)]
    vc = [torch.randn(4, 2, 1, 8, device=device)]
    before = kc[0].clone()
    with pytest.raises(ks.ArgumentError, match=rf"'block_mapping'.*{match}"):
        ks.copy_blocks(kc, vc, torch.tensor(pairs, device=device), backend=backend)
    assert torch.equal(kc[0], before), "nothing copied"
    # a block copied onto itself, or one source read by several pairs, is no race
    ks.copy_blocks(kc, vc, torch.tensor([[1, 1], [0, 2], [0, 3]], device=device), backend=backend)
    assert torch.equal(kc[0][[0, 1, 2, 3]], before[[0, 1, 0, 0]])


def test_swap_blocks_round_trip(device):
    src = torch.randn(8, 4, 2, 32, device=device).to(torch.bfloat16)
    host = torch.zeros(5, 4, 2, 32, dtype=torch.bfloat16)
    if device.type == "cuda":
        host = host.pin_memory()
    out_map = torch.tensor([[1, 0], [2, 1], [3, 2], [7, 4]])  # a run of three, then one
    ks.swap_blocks(src, host, out_map)
    if device.type == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(host[[0, 1, 2, 4]], src[[1, 2, 3, 7]].cpu()) and not host[3].any()
    back = torch.zeros_like(src)
    ks.swap_blocks(host, back, torch.tensor([[4, 0], [0, 5]]))
    if device.type == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(back[0], src[7]) and torch.equal(back[5], src[1])


def test_swap_blocks_bad_input(device):
    src, dst = torch.randn(4, 4, 2, 32, device=device), torch.randn(3, 4, 2, 32)
    with pytest.raises(ks.ArgumentError, match="source"):
        ks.swap_blocks(src, dst, torch.tensor([[4, 0]]))
    with pytest.raises(ks.ArgumentError, match="destination"):
        ks.swap_blocks(src, dst, torch.tensor([[0, 3]]))
    with pytest.raises(ks.ArgumentError, match="dst"):
        ks.swap_blocks(src, torch.randn(3, 4, 2, 16), torch.tensor([[0, 0]]))
    with pytest.raises(TypeError, match="dst"):
        ks.swap_blocks(src, dst.half(), torch.tensor([[0, 0]]))
    with pytest.raises(TypeError, match="block_mapping"):
        ks.swap_blocks(src, dst, torch.tensor([[0, 0]], dtype=torch.int32))
    with pytest.raises(ks.ArgumentError, match="'dst' must be a tensor of distinct elements"):
        ks.swap_blocks(src, dst[:1].expand(3, 4, 2, 32), torch.tensor([[0, 0]]))


@pytest.mark.gpu
def test_gpu_cuda_graph_reshape_and_cache_follows_new_slots():
    k_cache = torch.zeros(64, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    key = torch.randn(32, 8, 128, device="cuda", dtype=torch.bfloat16)
    value = torch.randn_like(key)
    slots = torch.arange(32, device="cuda")
    ks.reshape_and_cache(key, value, k_cache, v_cache, slots)  # warm up outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ks.reshape_and_cache(key, value, k_cache, v_cache, slots)
    slots.copy_(torch.randperm(64 * 16, device="cuda")[:32])
    k_cache.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(k_cache.view(-1, 8, 128)[slots], key)


_AOT = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernelset.ops.kvcache import kernels as K
from kernelset.ops.kvcache.launch import cache_policy

def run(fn, sig, consts, warps, arch, name):
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n, ty in sig.items()
             if ty is not None and (ty.startswith("*") or n.startswith("stride"))}
    consts = {**consts, **{n: None for n, ty in sig.items() if ty is None}}
    full = {n: sig[n] if sig.get(n) is not None else "constexpr" for n in fn.arg_names}
    ptx = triton.compile(ASTSource(fn, signature=full, constexprs=consts, attrs=attrs),
                         target=GPUTarget("cuda", arch, 32), options=dict(num_warps=warps)).asm["ptx"]
    return dict(case=name, local="ld.local" in ptx or "st.local" in ptx, vec=".v4" in ptx or ".v2" in ptx)

out = []
for name, arch, h, d, cache in (("bf16-h8-d128-sm90", 90, 8, 128, "bf16"), ("fp8-h8-d128-sm90", 90, 8, 128, "fp8e4nv"),
                                ("bf16-h1-d80-sm90", 90, 1, 80, "bf16"), ("bf16-h8-d128-sm80", 80, 8, 128, "bf16")):
    p = cache_policy(h, d)
    fp8 = cache.startswith("fp8")
    sig = dict(K="*bf16", V="*bf16", KC=f"*{cache}", VC=f"*{cache}", SLOTS="*i64", KSCALE="*fp32" if fp8 else None,
               VSCALE="*fp32" if fp8 else None, T="i32", H="i32", num_slots="i32", stride_kt="i32", stride_kh="i32",
               stride_vt="i32", stride_vh="i32", stride_kcb="i32", stride_kcs="i32", stride_kch="i32",
               stride_vcb="i32", stride_vcs="i32", stride_vch="i32")
    consts = dict(BS=16, D=d, BLOCK_T=p.block_t, BLOCK_H=p.block_h, BLOCK_D=p.block_d, FP8=fp8)
    out.append(run(K._reshape_and_cache_kernel, sig, consts, p.num_warps, arch, name))
csig = dict(KC="*bf16", VC="*bf16", PAIRS="*i64", num_blocks="i32", stride_kb="i32", stride_vb="i32")
out.append(run(K._copy_blocks_kernel, csig, dict(BLOCK_ELEMS=16 * 8 * 128, CHUNK=4096), 4, 90, "copy-blocks"))
print(json.dumps(out))
"""


def test_kernels_compile_for_sm90():
    compile_report(_AOT, 5)
