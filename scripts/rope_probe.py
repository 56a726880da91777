"""RoPE launch forms on the current GPU, bf16, % of copy, best first (issue 3's rope bars).

Serving layout (`ks.rotary_embedding`, in place, T=16384, 32 q / 8 k heads, D=128): the shipped
launch against probe forms: one launch for q and k with one tile size for both ([TOK, heads,
pairs] tiles, x loads before or after the position load), and the shipped form (tokens fastest,
tiles per tensor) at other tile sizes and warps, with and without ``evict_first``. HF layout
(`ks.apply_rotary`, out of place, [B, H, S, D] views, B4 S4096): the shipped kernel against
[TOK, heads, pairs] tiles. Ceilings: the 1 GiB copy, and copies / in-place ``mul_`` of exactly
the bytes each case moves (two launches and one). Last, ksctl bench's rotary_embedding case
through the harness, alone and with its peers (the eager call's host time shows there).

Session 20 on the H200 (docs/benchmarks/2026-11-27-s20): the serving kernel in two launches
87.6-89.4%; one launch with a token's q and k blocks adjacent 85.3%, tokens fastest 89.2%, plus
``evict_first`` 92.3% (shipped); no tile size or warp count moved it more than a point; a copy
of the same bytes 97.4% (one launch) / 94.2% (two). apply_rotary with k in a q-sized tile 82.7%,
tiles per tensor 88.8-89.1% (shipped). GPT-J pairs (16-byte rows split in registers since
commit 4a567f4) have a line each, not yet run.

Usage: python scripts/rope_probe.py [--quick] [--policy]
"""
from __future__ import annotations

import itertools
import sys

import torch
import triton
import triton.language as tl

from kernelset.bench.timing import copy_bandwidth_gbs, cuda_time_ms  # noqa: E402


@triton.jit
def _serve_qk(POS, Q, K, CACHE, HQ, HK, NBQ, T, max_pos, sqt, skt, sc, D: tl.constexpr, HALF: tl.constexpr,
              BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr, TOK: tl.constexpr, EVEN: tl.constexpr,
              XFIRST: tl.constexpr):
    # a [TOK, BLOCK_H, BLOCK_R] tile of q (head blocks [0, NBQ)) or k; XFIRST issues the x loads
    # before the position load and the cos/sin rows that depend on it
    hb = tl.program_id(1)
    if hb < NBQ:
        X = Q
        H = HQ
        st = sqt
        h0 = hb * BLOCK_H
    else:
        X = K
        H = HK
        st = skt
        h0 = (hb - NBQ) * BLOCK_H
    t0 = tl.program_id(0) * TOK
    j = tl.arange(0, TOK)
    hh = h0 + tl.arange(0, BLOCK_H)
    i = tl.arange(0, BLOCK_R)
    off = (j * st)[:, None, None] + (hh * D)[None, :, None] + i[None, None, :]  # int32 inside the tile
    base = X + t0.to(tl.int64) * st
    tmask = (t0 + j) < T
    if EVEN:
        m = None
    else:
        m = tmask[:, None, None] & (hh < H)[None, :, None] & (i < HALF)[None, None, :]
    if XFIRST:
        a = tl.load(base + off, mask=m).to(tl.float32)
        b = tl.load(base + HALF + off, mask=m).to(tl.float32)
    pos = tl.load(POS + t0 + j, mask=tmask, other=0).to(tl.int64)
    ok = (pos >= 0) & (pos < max_pos)
    crow = CACHE + tl.where(ok, pos, 0)[:, None] * sc + i[None, :]
    if EVEN:
        cos = tl.load(crow)
        sin = tl.load(crow + HALF)
    else:
        cos = tl.load(crow, mask=(i < HALF)[None, :], other=1.0)
        sin = tl.load(crow + HALF, mask=(i < HALF)[None, :], other=0.0)
    cos = tl.where(ok[:, None], cos, 1.0)[:, None, :]
    sin = tl.where(ok[:, None], sin, 0.0)[:, None, :]
    if not XFIRST:
        a = tl.load(base + off, mask=m).to(tl.float32)
        b = tl.load(base + HALF + off, mask=m).to(tl.float32)
    tl.store(base + off, (a * cos - b * sin).to(X.dtype.element_ty), mask=m)
    tl.store(base + HALF + off, (b * cos + a * sin).to(X.dtype.element_ty), mask=m)


@triton.jit
def _rot_inplace(X, t, hblock, H, stride_t, cos, sin, D: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                 EVICT: tl.constexpr):
    heads = hblock * BLOCK_H + tl.arange(0, BLOCK_H)
    i = tl.arange(0, HALF)
    mask = (heads < H)[:, None]
    pa = X + t * stride_t + heads[:, None] * D + i[None, :]
    pb = pa + HALF
    if EVICT:
        a = tl.load(pa, mask=mask, eviction_policy="evict_first").to(tl.float32)
        b = tl.load(pb, mask=mask, eviction_policy="evict_first").to(tl.float32)
        tl.store(pa, (a * cos[None, :] - b * sin[None, :]).to(X.dtype.element_ty), mask=mask,
                 eviction_policy="evict_first")
        tl.store(pb, (b * cos[None, :] + a * sin[None, :]).to(X.dtype.element_ty), mask=mask,
                 eviction_policy="evict_first")
    else:
        a = tl.load(pa, mask=mask).to(tl.float32)
        b = tl.load(pb, mask=mask).to(tl.float32)
        tl.store(pa, (a * cos[None, :] - b * sin[None, :]).to(X.dtype.element_ty), mask=mask)
        tl.store(pb, (b * cos[None, :] + a * sin[None, :]).to(X.dtype.element_ty), mask=mask)


@triton.jit
def _serve_grid2(POS, Q, K, CACHE, HQ, HK, NB1, max_pos, sqt, skt, sc, D: tl.constexpr, HALF: tl.constexpr,
                 BLOCK_H1: tl.constexpr, BLOCK_H2: tl.constexpr, EVICT: tl.constexpr):
    # the shipped form (tokens fastest, tiles per tensor; HALF a power of two) with eviction hints
    t = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    i = tl.arange(0, HALF)
    pos = tl.load(POS + t).to(tl.int64)
    ok = (pos >= 0) & (pos < max_pos)
    row = tl.where(ok, pos, 0)
    cos = tl.where(ok, tl.load(CACHE + row * sc + i), 1.0)
    sin = tl.where(ok, tl.load(CACHE + row * sc + HALF + i), 0.0)
    if hb < NB1:
        _rot_inplace(Q, t, hb, HQ, sqt, cos, sin, D, HALF, BLOCK_H1, EVICT)
    else:
        _rot_inplace(K, t, hb - NB1, HK, skt, cos, sin, D, HALF, BLOCK_H2, EVICT)


@triton.jit
def _tok_load(POS, Q, K, CACHE, t, T, max_pos, sqt, skt, sc, oq, okk, i, HALF: tl.constexpr):
    """Token t's position, cos/sin row and q/k halves (t clamped to the last token: a program's
    prefetch past its last item reads a valid row and is never stored)."""
    t = tl.minimum(t, T - 1).to(tl.int64)
    pos = tl.load(POS + t).to(tl.int64)
    ok = (pos >= 0) & (pos < max_pos)
    row = tl.where(ok, pos, 0)
    qa = tl.load(Q + t * sqt + oq, eviction_policy="evict_first")
    qb = tl.load(Q + t * sqt + HALF + oq, eviction_policy="evict_first")
    ka = tl.load(K + t * skt + okk, eviction_policy="evict_first")
    kb = tl.load(K + t * skt + HALF + okk, eviction_policy="evict_first")
    cos = tl.where(ok, tl.load(CACHE + row * sc + i), 1.0)
    sin = tl.where(ok, tl.load(CACHE + row * sc + HALF + i), 0.0)
    return qa, qb, ka, kb, cos, sin


@triton.jit
def _tok_store(Q, K, t, sqt, skt, oq, okk, qa, qb, ka, kb, cos, sin, HALF: tl.constexpr):
    t = tl.cast(t, tl.int64)
    dt = Q.dtype.element_ty
    a = qa.to(tl.float32)
    b = qb.to(tl.float32)
    tl.store(Q + t * sqt + oq, (a * cos[None, :] - b * sin[None, :]).to(dt), eviction_policy="evict_first")
    tl.store(Q + t * sqt + HALF + oq, (b * cos[None, :] + a * sin[None, :]).to(dt), eviction_policy="evict_first")
    a = ka.to(tl.float32)
    b = kb.to(tl.float32)
    tl.store(K + t * skt + okk, (a * cos[None, :] - b * sin[None, :]).to(dt), eviction_policy="evict_first")
    tl.store(K + t * skt + HALF + okk, (b * cos[None, :] + a * sin[None, :]).to(dt), eviction_policy="evict_first")


@triton.jit
def _serve_persist(POS, Q, K, CACHE, T, max_pos, sqt, skt, sc, HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr,
                   HALF: tl.constexpr, PREFETCH: tl.constexpr):
    # persistent: program p rotates q and k of tokens p, p + G, ... (HQ, HK, HALF powers of two);
    # PREFETCH issues the next token's loads before the current token's math and stores
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    i = tl.arange(0, HALF)
    oq = tl.arange(0, HQ)[:, None] * D + i[None, :]
    okk = tl.arange(0, HK)[:, None] * D + i[None, :]
    if PREFETCH:
        qa, qb, ka, kb, cos, sin = _tok_load(POS, Q, K, CACHE, pid, T, max_pos, sqt, skt, sc, oq, okk, i, HALF)
        for t in range(pid, T, G):
            qa2, qb2, ka2, kb2, cos2, sin2 = _tok_load(POS, Q, K, CACHE, t + G, T, max_pos, sqt, skt, sc, oq, okk,
                                                       i, HALF)
            _tok_store(Q, K, t, sqt, skt, oq, okk, qa, qb, ka, kb, cos, sin, HALF)
            qa, qb, ka, kb, cos, sin = qa2, qb2, ka2, kb2, cos2, sin2
    else:
        for t in range(pid, T, G):
            qa, qb, ka, kb, cos, sin = _tok_load(POS, Q, K, CACHE, t, T, max_pos, sqt, skt, sc, oq, okk, i, HALF)
            _tok_store(Q, K, t, sqt, skt, oq, okk, qa, qb, ka, kb, cos, sin, HALF)


@triton.jit
def _serve_token(POS, Q, K, CACHE, T, max_pos, sqt, skt, sc, HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr,
                 HALF: tl.constexpr):
    # one program per token, q and k together (the shipped form gives q and k programs of their own)
    t = tl.program_id(0)
    i = tl.arange(0, HALF)
    oq = tl.arange(0, HQ)[:, None] * D + i[None, :]
    okk = tl.arange(0, HK)[:, None] * D + i[None, :]
    qa, qb, ka, kb, cos, sin = _tok_load(POS, Q, K, CACHE, t, T, max_pos, sqt, skt, sc, oq, okk, i, HALF)
    _tok_store(Q, K, t, sqt, skt, oq, okk, qa, qb, ka, kb, cos, sin, HALF)


@triton.jit
def _apply_qk(X1, Y1, X2, Y2, COS, SIN, S, H1, H2, NB1, sxb1, sxs1, sxh1, syb1, sys1, syh1, sxb2, sxs2, sxh2, syb2,
              sys2, syh2, scb, scs, sign, HALF: tl.constexpr, BLOCK_H: tl.constexpr, TOK: tl.constexpr):
    # a [TOK, BLOCK_H, HALF] tile (HALF a power of two, S a multiple of TOK: the probe's case)
    hb = tl.program_id(1)
    if hb < NB1:
        X = X1
        Y = Y1
        H = H1
        sxb = sxb1
        sxs = sxs1
        sxh = sxh1
        syb = syb1
        sys = sys1
        syh = syh1
        h0 = hb * BLOCK_H
    else:
        X = X2
        Y = Y2
        H = H2
        sxb = sxb2
        sxs = sxs2
        sxh = sxh2
        syb = syb2
        sys = sys2
        syh = syh2
        h0 = (hb - NB1) * BLOCK_H
    tok = (tl.program_id(0) * TOK).to(tl.int64)
    b = tok // S
    s = tok % S
    j = tl.arange(0, TOK)
    hh = h0 + tl.arange(0, BLOCK_H)
    i = tl.arange(0, HALF)
    m = (hh < H)[None, :, None] & (i < HALF)[None, None, :]
    xo = (j * sxs)[:, None, None] + (hh * sxh)[None, :, None] + i[None, None, :]
    yo = (j * sys)[:, None, None] + (hh * syh)[None, :, None] + i[None, None, :]
    xb = X + b * sxb + s * sxs
    yb = Y + b * syb + s * sys
    a = tl.load(xb + xo, mask=m).to(tl.float32)
    bb = tl.load(xb + HALF + xo, mask=m).to(tl.float32)
    co = b * scb + s * scs + (j * scs)[:, None] + i[None, :]
    cos = tl.load(COS + co).to(tl.float32)[:, None, :]
    sin = (tl.load(SIN + co).to(tl.float32) * sign)[:, None, :]
    dt = Y.dtype.element_ty
    ac = (a * cos).to(dt).to(tl.float32)
    bs = (bb * sin).to(dt).to(tl.float32)
    bc = (bb * cos).to(dt).to(tl.float32)
    as_ = (a * sin).to(dt).to(tl.float32)
    tl.store(yb + yo, (ac - bs).to(dt), mask=m)
    tl.store(yb + HALF + yo, (bc + as_).to(dt), mask=m)


def _same(what, want, got) -> None:
    """The probe's result against the shipped kernel's: equal up to FMA contraction (a rounding)."""
    for w, g in zip(want, got):
        diff = (w.float() - g.float()).abs()
        ndiff = int((diff > 0).sum())
        assert float(diff.max()) <= 0.02 * float(w.float().abs().max()), f"{what}: wrong result"
        print(f"{what}: {ndiff} of {w.numel()} elements differ by a rounding from the shipped kernel")


def serving(copy: float, quick: bool) -> None:
    from kernelset.ops.rope import launch as rl
    dev = torch.device("cuda")
    t, hq, hk, d = 16384, 32, 8, 128
    half = d // 2
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d)
    f = torch.outer(torch.arange(t, device=dev, dtype=torch.float32), inv)
    cache = torch.cat([f.cos(), f.sin()], -1)
    pos = torch.randperm(t, device=dev)  # distinct positions: every cache row from HBM, as counted
    q0 = torch.randn(t, hq, d, dtype=torch.bfloat16, device=dev)
    k0 = torch.randn(t, hk, d, dtype=torch.bfloat16, device=dev)
    nbytes = 2 * t * (hq + hk) * d * 2 + t * d * 4

    # correctness of the probe kernel against the shipped one
    qa, ka, qb, kb = q0.clone(), k0.clone(), q0.clone(), k0.clone()
    rl.rope_fwd(pos, qa, ka, cache, False, d)

    def probe(q, k, bh, tok, warps, xfirst=True):
        nbq, nbk = -(-hq // bh), -(-hk // bh)
        even = hq % bh == 0 and hk % bh == 0 and t % tok == 0
        _serve_qk[(-(-t // tok), nbq + nbk)](pos, q, k, cache, hq, hk, nbq, t, cache.shape[0], q.stride(0), k.stride(0),
                                            cache.stride(0), D=d, HALF=half, BLOCK_H=bh, BLOCK_R=half, TOK=tok,
                                            EVEN=even, XFIRST=xfirst, num_warps=warps)

    probe(qb, kb, 8, 2, 4)
    _same("rotary_embedding probe", (qa, ka), (qb, kb))
    sms = torch.cuda.get_device_properties(dev).multi_processor_count

    def persist(q, k, per_sm, warps, prefetch):
        _serve_persist[(min(t, per_sm * sms),)](pos, q, k, cache, t, cache.shape[0], q.stride(0), k.stride(0),
                                               cache.stride(0), HQ=hq, HK=hk, D=d, HALF=half, PREFETCH=prefetch,
                                               num_warps=warps)

    def token(q, k, warps):
        _serve_token[(t,)](pos, q, k, cache, t, cache.shape[0], q.stride(0), k.stride(0), cache.stride(0), HQ=hq,
                           HK=hk, D=d, HALF=half, num_warps=warps)

    for what, fn in (("persistent, prefetch", lambda q, k: persist(q, k, 4, 4, True)),
                     ("persistent", lambda q, k: persist(q, k, 4, 4, False)),
                     ("token per program", lambda q, k: token(q, k, 4))):
        qb, kb = q0.clone(), k0.clone()
        fn(qb, kb)
        _same(f"rotary_embedding {what}", (qa, ka), (qb, kb))

    rows = []
    q, k = q0.clone(), k0.clone()
    rows.append(("shipped rope_fwd", cuda_time_ms(lambda: rl.rope_fwd(pos, q, k, cache, False, d))))
    rows.append(("shipped rope_fwd, GPT-J pairs", cuda_time_ms(lambda: rl.rope_fwd(pos, q, k, cache, True, d))))
    rows.append(("shipped kernel, q then k in two launches",
                 cuda_time_ms(lambda: (rl.rope_fwd(pos, q, None, cache, False, d), rl.rope_fwd(pos, k, None, cache, False, d)))))
    qd, kd = torch.empty_like(q), torch.empty_like(k)
    rows.append(("copy of q and k (2 launches)", cuda_time_ms(lambda: (qd.copy_(q), kd.copy_(k)))))
    flat = torch.empty(q.numel() + k.numel(), dtype=q.dtype, device=dev)
    flat2 = torch.empty_like(flat)
    rows.append(("copy of the same bytes (1 launch)", cuda_time_ms(lambda: flat2.copy_(flat))))
    configs = itertools.product((8, 16, 32), (1, 2, 4), (2, 4, 8), (True, False))
    if quick:
        configs = [(8, 1, 4, True), (8, 2, 4, True), (16, 2, 4, True), (8, 2, 4, False)]
    for bh, tok, warps, xfirst in configs:
        if tok * bh * half // (32 * warps) < 4 or tok * bh * half // (32 * warps) > 64:
            continue
        rows.append((f"one launch BLOCK_H={bh} TOK={tok} warps={warps} {'x first' if xfirst else 'pos first'}",
                     cuda_time_ms(lambda: probe(q, k, bh, tok, warps, xfirst))))
    for per_sm, warps, prefetch in itertools.product((2, 4, 8, 16), (4, 8), (True, False)):
        rows.append((f"persistent q+k per token, {per_sm} programs per SM, {warps} warps"
                     f"{', next token prefetched' if prefetch else ''}",
                     cuda_time_ms(lambda: persist(q, k, per_sm, warps, prefetch))))
    for warps in (2, 4, 8):
        rows.append((f"one program per token (q and k), {warps} warps", cuda_time_ms(lambda: token(q, k, warps))))

    def grid2(b1, b2, warps, evict):
        nb1 = hq // b1
        _serve_grid2[(t, nb1 + hk // b2)](pos, q, k, cache, hq, hk, nb1, cache.shape[0], q.stride(0), k.stride(0),
                                         cache.stride(0), D=d, HALF=half, BLOCK_H1=b1, BLOCK_H2=b2, EVICT=evict,
                                         num_warps=warps)

    for b1, b2, warps, evict in itertools.product((16, 32), (4, 8), (2, 4, 8), (False, True)):
        rows.append((f"tokens-fastest q {b1} / k {b2} heads per program, {warps} warps{', evict_first' if evict else ''}",
                     cuda_time_ms(lambda: grid2(b1, b2, warps, evict))))
    rows.append(("in-place q.mul_(1), k.mul_(1) (torch, 2 launches)", cuda_time_ms(lambda: (q.mul_(1.0), k.mul_(1.0)))))
    rows.append(("in-place mul_(1) of the same bytes (1 launch)", cuda_time_ms(lambda: flat.mul_(1.0))))
    import kernelset as ks
    from kernelset.bench.timing import host_us_per_call
    rows.append(("ks.rotary_embedding (the API, as ksctl bench times it)",
                 cuda_time_ms(lambda: ks.rotary_embedding(pos, q, k, cache))))
    host = host_us_per_call(lambda: ks.rotary_embedding(pos, q, k, cache), calls=300)
    host_launch = host_us_per_call(lambda: rl.rope_fwd(pos, q, k, cache, False, d), calls=300)
    print(f"host time per call: ks.rotary_embedding {host:.1f} us, rope_fwd alone {host_launch:.1f} us")
    print(f"\nrotary_embedding T={t} {hq}/{hk} heads D={d} bf16, {nbytes / 2**20:.0f} MiB moved:")
    for label, ms in sorted(rows, key=lambda r: r[1]):
        print(f"  {nbytes / ms / 1e6 / copy * 100:5.1f}%  {ms * 1e3:7.1f} us  {label}")


def policy(copy: float) -> None:
    """rope_fwd_policy's choice against each form and warp count, over model head shapes (T=16384,
    distinct positions): the (token, head block) grid at 2/4/8 warps, one program per token
    (qk_one) at 2/4/8/16 warps."""
    from kernelset.ops.rope import kernels as K
    from kernelset.ops.rope import launch as rl
    dev = torch.device("cuda")
    t = 16384
    print(f"\nrope_fwd_policy sweep, T={t}, bf16, fp32 cache, distinct positions (% of copy):")
    for hq, hk, d in ((32, 8, 128), (28, 4, 128), (64, 8, 128), (32, 4, 128), (32, 32, 96), (16, 16, 64), (8, 1, 256),
                      (40, 8, 128)):
        half = d // 2
        inv = 1.0 / 10000 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d)
        f = torch.outer(torch.arange(t, device=dev, dtype=torch.float32), inv)
        cache = torch.cat([f.cos(), f.sin()], -1)
        pos = torch.randperm(t, device=dev)
        q0 = torch.randn(t, hq, d, dtype=torch.bfloat16, device=dev)
        k0 = torch.randn(t, hk, d, dtype=torch.bfloat16, device=dev)
        nbytes = 2 * t * (hq + hk) * d * 2 + t * d * 4 + t * 8
        p = rl.rope_fwd_policy(t, hq, hk, half)
        block_r = rl._pow2(half)
        cap = max(1, 2048 // block_r)
        b1, b2 = rl._heads_per_program(hq, cap), rl._heads_per_program(hk, cap)
        nb1 = -(-hq // b1)

        def run(q, k, qk_one, warps):
            grid = (t, 1) if qk_one else (t, nb1 + -(-hk // b2))
            K._rope_fwd_kernel[grid](pos, q, k, cache, hq, hk, nb1, cache.shape[0], q.stride(0), k.stride(0),
                                     cache.stride(0), D=d, HALF=half, INTERLEAVED=False, BLOCK_H1=b1, BLOCK_H2=b2,
                                     BLOCK_R=block_r, QK_ONE=qk_one, num_warps=warps)

        qa, ka = q0.clone(), k0.clone()
        rl.rope_fwd(pos, qa, ka, cache, False, d)
        forms = [(False, w) for w in (2, 4, 8)] + ([(True, w) for w in (2, 4, 8, 16)] if nb1 == 1 and hk <= cap
                                                   else [])
        q, k = q0.clone(), k0.clone()
        res = [(f"policy ({'qk_one' if p.qk_one else 'grid'}, {p.num_warps} warps)",
                cuda_time_ms(lambda: rl.rope_fwd(pos, q, k, cache, False, d)))]
        for qk_one, w in forms:
            qb, kb = q0.clone(), k0.clone()
            run(qb, kb, qk_one, w)
            for a, b in ((qa, qb), (ka, kb)):  # the forms may contract FMAs differently: a rounding
                assert float((a.float() - b.float()).abs().max()) <= 0.02 * float(a.float().abs().max()), (hq, hk, d)
            res.append((f"{'qk_one' if qk_one else 'grid'} {w} warps", cuda_time_ms(lambda: run(q, k, qk_one, w))))
        if (hq, hk, d) == (32, 8, 128):  # the probe's maskless token form, for the masks' cost
            for w in (4, 8):
                res.append((f"probe token {w} warps", cuda_time_ms(lambda: _serve_token[(t,)](
                    pos, q, k, cache, t, cache.shape[0], q.stride(0), k.stride(0), cache.stride(0), HQ=hq, HK=hk, D=d,
                    HALF=half, num_warps=w))))
        line = "  ".join(f"{label} {nbytes / ms / 1e6 / copy * 100:.1f}" for label, ms in res)
        print(f"  {hq}/{hk} D{d}: {line}")


def apply(copy: float, quick: bool) -> None:
    from kernelset.ops.rope import launch as rl
    dev = torch.device("cuda")
    b, hq, hk, s, d = 4, 32, 8, 4096, 128
    half = d // 2
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d)
    f = torch.outer(torch.arange(s, device=dev, dtype=torch.float32), inv)
    emb = torch.cat([f, f], -1)
    cos = emb.cos()[None].expand(b, s, d).to(torch.bfloat16)
    sin = emb.sin()[None].expand(b, s, d).to(torch.bfloat16)
    q = torch.randn(b, hq, s, d, dtype=torch.bfloat16, device=dev)
    k = torch.randn(b, hk, s, d, dtype=torch.bfloat16, device=dev)
    nbytes = 2 * b * s * (hq + hk) * d * 2
    ya, yka = rl.rope_apply(q, k, cos, sin, False, d, 1)
    yq, yk = torch.empty_like(q), torch.empty_like(k)
    qs, ks_, yqs, yks = q.transpose(1, 2), k.transpose(1, 2), yq.transpose(1, 2), yk.transpose(1, 2)
    c3, s3 = cos, sin
    cb = c3.stride(0)

    def probe(bh, tok, warps):
        nb1 = -(-hq // bh)
        _apply_qk[(b * s // tok, nb1 + -(-hk // bh))](
            qs, yqs, ks_, yks, c3, s3, s, hq, hk, nb1, qs.stride(0), qs.stride(1), qs.stride(2), yqs.stride(0),
            yqs.stride(1), yqs.stride(2), ks_.stride(0), ks_.stride(1), ks_.stride(2), yks.stride(0), yks.stride(1),
            yks.stride(2), cb, c3.stride(1), 1.0, HALF=half, BLOCK_H=bh, TOK=tok, num_warps=warps,
            enable_fp_fusion=False)

    probe(8, 2, 4)
    _same("apply_rotary probe", (ya, yka), (yq, yk))
    rows = [("shipped rope_apply (1 launch, q and k)", cuda_time_ms(lambda: rl.rope_apply(q, k, cos, sin, False, d, 1)))]
    rows.append(("shipped rope_apply, GPT-J pairs", cuda_time_ms(lambda: rl.rope_apply(q, k, cos, sin, True, d, 1))))
    rows.append(("copy of q and k (2 launches)", cuda_time_ms(lambda: (yq.copy_(q), yk.copy_(k)))))
    configs = itertools.product((4, 8, 16, 32), (1, 2, 4), (2, 4, 8))
    if quick:
        configs = [(8, 1, 4), (8, 2, 4), (16, 2, 4), (8, 4, 4)]
    for bh, tok, warps in configs:
        if tok * bh * half // (32 * warps) < 4 or tok * bh * half // (32 * warps) > 64:
            continue
        rows.append((f"probe BLOCK_H={bh} TOK={tok} warps={warps}", cuda_time_ms(lambda: probe(bh, tok, warps))))
    print(f"\napply_rotary fwd B{b} S{s} {hq}/{hk} heads D={d} bf16 [B, H, S, D], {nbytes / 2**20:.0f} MiB moved:")
    for label, ms in sorted(rows, key=lambda r: r[1]):
        print(f"  {nbytes / ms / 1e6 / copy * 100:5.1f}%  {ms * 1e3:7.1f} us  {label}")


def bench_replica(copy: float) -> None:
    """ksctl bench's rotary_embedding case through the harness, alone (no peers) and with them."""
    from kernelset.bench import harness
    from kernelset.core import registry
    entry = [e for e in registry.catalog() if e.spec.name == "rotary_embedding"][0]
    case = entry.spec.bench[0]
    for peers in (False, True, False):
        r = harness.run_case(entry.spec, case, torch.device("cuda"), copy, peers=peers)
        ours = r.results[0]
        print(f"harness rotary_embedding peers={peers}: {ours.ms * 1e3:.1f} us, {ours.pct:.1f}% of copy")


def main() -> int:
    quick = "--quick" in sys.argv
    dev = torch.device("cuda")
    copy = copy_bandwidth_gbs(dev)
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, Triton {triton.__version__}, "
          f"copy {copy:.0f} GB/s")
    if "--policy" in sys.argv:
        policy(copy)
        return 0
    serving(copy, quick)
    apply(copy, quick)
    bench_replica(copy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
