"""Outputs written in place may not share memory with another argument: checks.views_overlap
(the C ABI's ks_views_overlap in Python) and the refusals built on it. Slices of one fused
buffer that interleave without meeting (q and k of a qkv projection, the k and v halves of a
[num_blocks, 2, ...] cache) are accepted; a partial overlap is refused with the argument named,
before anything is written."""
from __future__ import annotations

import pytest
import torch

import kernelset as ks
from kernelset.core.checks import views_overlap


def test_views_overlap_cases():
    qkv = torch.empty(7, 48)
    q, k, v = qkv[:, :32], qkv[:, 32:40], qkv[:, 40:]
    assert not views_overlap(q, k) and not views_overlap(k, v) and not views_overlap(q, v)
    assert views_overlap(q, q) and views_overlap(qkv[:, :33], k) and views_overlap(qkv[:, 2:10], qkv[:, :8])
    cache = torch.empty(10, 2, 16, 4, 8)
    assert not views_overlap(cache[:, 0], cache[:, 1]) and views_overlap(cache[:, 0], cache[:, 0])
    assert not views_overlap(cache[:3, 0], cache[3:, 0]) and views_overlap(cache[:4, 0], cache[3:, 0])
    a = torch.empty(100)
    assert not views_overlap(a[::2], a[1::2]) and views_overlap(a[::2], a[2::2])
    assert not views_overlap(a[:0], a) and not views_overlap(torch.empty(4), torch.empty(4))
    assert views_overlap(a.view(10, 10).t(), a[55:56])


def _rope_args(device, t=5, d=16):
    cache = torch.randn(32, d, device=device)
    return torch.randint(0, 32, (t,), device=device), cache


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_rotary_k_overlapping_q(backend, device):
    pos, cache = _rope_args(device)
    buf = torch.randn(5, 12 * 16, device=device)
    before = buf.clone()
    with pytest.raises(ks.ArgumentError, match="'k' must be a different tensor from q sharing no memory"):
        ks.rotary_embedding(pos, buf[:, : 8 * 16].view(5, 8, 16), buf[:, 4 * 16:].view(5, 8, 16), cache,
                            backend=backend)
    assert torch.equal(buf, before)
    # q and k of one fused buffer: accepted
    q, k = buf[:, : 8 * 16].view(5, 8, 16), buf[:, 8 * 16:].view(5, 4, 16)
    ks.rotary_embedding(pos, q, k, cache, backend=backend)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_reshape_and_cache_v_overlapping_k(backend, device):
    big = torch.zeros(5, 4, 2, 8, device=device)
    key, value = torch.randn(3, 2, 8, device=device), torch.randn(3, 2, 8, device=device)
    slots = torch.tensor([0, 5, 9], device=device)
    with pytest.raises(ks.ArgumentError, match="'v_cache' must be a different tensor from k_cache sharing no memory"):
        ks.reshape_and_cache(key, value, big[:4], big[1:], slots, backend=backend)
    assert not big.any()


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_copy_blocks_caches_overlapping(backend, device):
    big = torch.zeros(6, 4, 2, 8, device=device)
    other = torch.zeros(4, 4, 2, 8, device=device)
    mapping = torch.tensor([[0, 1]], device=device)
    for ks_, vs_, name in (([big[:4], big[2:]], [other, torch.zeros_like(other)], "k_caches\\[1\\]"),
                           ([other], [other], "v_caches\\[0\\]")):
        with pytest.raises(ks.ArgumentError, match=f"'{name}' must be a different tensor from"):
            ks.copy_blocks(ks_, vs_, mapping, backend=backend)
    assert not big.any() and not other.any()
    # k and v halves of one [blocks, 2, ...] buffer per layer: accepted
    kv = torch.randn(4, 2, 4, 2, 8, device=device)
    ks.copy_blocks([kv[:, 0]], [kv[:, 1]], mapping, backend=backend)
    assert torch.equal(kv[1], kv[0])


def test_swap_blocks_src_overlapping_dst(device):
    big = torch.randn(6, 4, 8, device=device)
    before = big.clone()
    with pytest.raises(ks.ArgumentError, match="'dst' must be a different tensor from src sharing no memory"):
        ks.swap_blocks(big[:4], big[2:], torch.tensor([[0, 1]]))
    assert torch.equal(big, before)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_fused_add_in_place_residual_overlapping_x(backend, device):
    buf = torch.randn(5, 64, device=device)
    before = buf.clone()
    with pytest.raises(ks.ArgumentError, match="'residual' must be a different tensor from x sharing no memory"):
        ks.fused_add_rms_norm(buf[:4], buf[1:], None, in_place=True, backend=backend)
    assert torch.equal(buf, before)
