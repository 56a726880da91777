"""Triton kernels of the optimizer family: multi-tensor AdamW and the gradient-norm clip.

Every kernel walks a *table* (int64, ``ROW`` columns per tensor: numel, then the addresses of
param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, master, step) through a *chunk map* (int32
pairs: table row, chunk index within that tensor), so one launch updates any number of tensors
of one dtype combination. Addresses are cast back to typed pointers in the kernel; the element
types of param, grad and the moment states come from the prototype arguments ``P0`` / ``G0`` /
``S0`` (any tensor of that dtype: states are fp32 by default, or the param dtype as torch keeps
them); masters are fp32. Math is fp32 whatever the storage; a state is rounded once, when stored.
``ALIGNED`` promises 16-byte aligned bases (the launcher checks), which is what lets the compiler
emit 16-byte vector accesses on full blocks; the last, partial block of each tensor takes a masked
path.

AdamW (decoupled weight decay), fp32 math, as torch.optim.AdamW:
    g = grad / grad_scale; g = -g if maximize; t = step + 1
    p = p * (1 - lr * wd);  m = lerp(m, g, 1 - b1);  v = b2 v + (1 - b2) g^2;  vmax = max(vmax, v)
    p = p - (lr / (1 - b1^t)) * m / (sqrt(v or vmax) / sqrt(1 - b2^t) + eps)
The bias corrections are computed once per program in fp64 (b^t by binary powering of the
integer step; betas arrive as hi + lo fp32 pairs), like torch's double-precision host math.
"""
from __future__ import annotations

import triton
import triton.language as tl

# table columns
NUMEL, P, G, M, V, VMAX, MASTER, STEP = 0, 1, 2, 3, 4, 5, 6, 7


@triton.jit
def _pow_int(base, n):
    """base ** n for an fp64 scalar base and an int64 scalar n >= 0 (square-and-multiply)."""
    r = base * 0.0 + 1.0
    while n > 0:
        r = tl.where(n % 2 == 1, r * base, r)
        base = base * base
        n = n // 2
    return r


@triton.jit
def _ptr(row, col: tl.constexpr, ty, ALIGNED: tl.constexpr):
    p = tl.load(row + col).to(ty)
    if ALIGNED:
        p = tl.multiple_of(p, 16)
    return p


@triton.jit
def _adamw_block(offs, mask, p_ptr, g_ptr, m_ptr, v_ptr, vmax_ptr, w_ptr, step_size, bc2_sqrt, decay, w1, b2, w2,
                 eps, scale, AMSGRAD: tl.constexpr, MAXIMIZE: tl.constexpr, MASTER: tl.constexpr,
                 HAS_SCALE: tl.constexpr, MASKED: tl.constexpr):
    if MASKED:
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        m = tl.load(m_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if MASTER:
            p = tl.load(w_ptr + offs, mask=mask, other=0.0)
        else:
            p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        g = tl.load(g_ptr + offs, eviction_policy="evict_first").to(tl.float32)
        m = tl.load(m_ptr + offs, eviction_policy="evict_first").to(tl.float32)
        v = tl.load(v_ptr + offs, eviction_policy="evict_first").to(tl.float32)
        if MASTER:
            p = tl.load(w_ptr + offs, eviction_policy="evict_first")
        else:
            p = tl.load(p_ptr + offs, eviction_policy="evict_first").to(tl.float32)
    if HAS_SCALE:
        g = tl.div_rn(g, scale)
        if MASKED:
            tl.store(g_ptr + offs, g.to(g_ptr.dtype.element_ty), mask=mask)
        else:
            tl.store(g_ptr + offs, g.to(g_ptr.dtype.element_ty))
    if MAXIMIZE:
        g = -g
    p = p * decay
    # torch's lerp: self + w (end - self) for w < 0.5, end - (end - self)(1 - w) otherwise
    d = g - m
    m = tl.where(w1 < 0.5, m + w1 * d, g - d * (1.0 - w1))
    v = v * b2 + w2 * (g * g)  # w2 = 1 - b2 from the host's double math, as torch
    if AMSGRAD:
        if MASKED:
            # NaN kept, as torch.maximum keeps it (by default the other operand is returned)
            vm = tl.maximum(tl.load(vmax_ptr + offs, mask=mask, other=0.0).to(tl.float32), v,
                            propagate_nan=tl.PropagateNan.ALL)
            tl.store(vmax_ptr + offs, vm.to(vmax_ptr.dtype.element_ty), mask=mask)
        else:
            vm = tl.maximum(tl.load(vmax_ptr + offs, eviction_policy="evict_first").to(tl.float32), v,
                            propagate_nan=tl.PropagateNan.ALL)
            tl.store(vmax_ptr + offs, vm.to(vmax_ptr.dtype.element_ty))
        denom = tl.div_rn(tl.sqrt_rn(vm), bc2_sqrt) + eps
    else:
        denom = tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
    p = p - step_size * tl.div_rn(m, denom)
    if MASKED:
        tl.store(m_ptr + offs, m.to(m_ptr.dtype.element_ty), mask=mask)
        tl.store(v_ptr + offs, v.to(v_ptr.dtype.element_ty), mask=mask)
        if MASTER:
            tl.store(w_ptr + offs, p, mask=mask)
        tl.store(p_ptr + offs, p.to(p_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(m_ptr + offs, m.to(m_ptr.dtype.element_ty))
        tl.store(v_ptr + offs, v.to(v_ptr.dtype.element_ty))
        if MASTER:
            tl.store(w_ptr + offs, p)
        tl.store(p_ptr + offs, p.to(p_ptr.dtype.element_ty))


@triton.jit
def _adamw_fwd_kernel(TABLE, CHUNKS, P0, G0, S0, LR, SCALE, FOUND_INF, lr_hi, lr_lo, b1_hi, b1_lo, b2_hi, b2_lo, w1, b2,
                      w2, eps, wd, decay, ROW: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr,
                      AMSGRAD: tl.constexpr, MAXIMIZE: tl.constexpr, MASTER: tl.constexpr, LR_TENSOR: tl.constexpr,
                      HAS_SCALE: tl.constexpr, HAS_INF: tl.constexpr, ALIGNED: tl.constexpr):
    # One program: chunk ``c`` (BLOCK * ITERS elements) of tensor ``r``. found_inf != 0 skips the
    # whole step on the device (GradScaler), leaving params, states and grads untouched.
    go = True
    if HAS_INF:
        go = tl.load(FOUND_INF) == 0
    if go:
        pid = tl.program_id(0)
        r = tl.load(CHUNKS + 2 * pid).to(tl.int64)
        c = tl.load(CHUNKS + 2 * pid + 1).to(tl.int64)
        row = TABLE + r * ROW
        numel = tl.load(row + 0)
        p_ptr = _ptr(row, 1, P0.dtype, ALIGNED)
        g_ptr = _ptr(row, 2, G0.dtype, ALIGNED)
        m_ptr = _ptr(row, 3, S0.dtype, ALIGNED)
        v_ptr = _ptr(row, 4, S0.dtype, ALIGNED)
        vmax_ptr = m_ptr
        if AMSGRAD:
            vmax_ptr = _ptr(row, 5, S0.dtype, ALIGNED)
        w_ptr = _ptr(row, 3, tl.pointer_type(tl.float32), ALIGNED)  # (unused without MASTER)
        if MASTER:
            w_ptr = _ptr(row, 6, tl.pointer_type(tl.float32), ALIGNED)
        step = tl.load(tl.load(row + 7).to(tl.pointer_type(tl.float32))) + 1.0
        n = step.to(tl.int64)
        bc1 = 1.0 - _pow_int(tl.cast(b1_hi, tl.float64) + tl.cast(b1_lo, tl.float64), n)
        bc2 = 1.0 - _pow_int(tl.cast(b2_hi, tl.float64) + tl.cast(b2_lo, tl.float64), n)
        if LR_TENSOR:
            lr32 = tl.load(LR).to(tl.float32)
            lr = lr32.to(tl.float64)
            dec = 1.0 - lr32 * wd
        else:
            lr = tl.cast(lr_hi, tl.float64) + tl.cast(lr_lo, tl.float64)
            dec = decay
        step_size = (lr / bc1).to(tl.float32)
        bc2_sqrt = tl.sqrt(bc2).to(tl.float32)  # fp64 sqrt is IEEE-rounded
        scale = 1.0
        if HAS_SCALE:
            scale = tl.load(SCALE).to(tl.float32)
        start = c * (BLOCK * ITERS)
        lanes = tl.arange(0, BLOCK)
        n_full = tl.minimum((numel - start) // BLOCK, ITERS)
        for i in range(0, n_full):
            offs = start + i * BLOCK + lanes
            _adamw_block(offs, None, p_ptr, g_ptr, m_ptr, v_ptr, vmax_ptr, w_ptr, step_size, bc2_sqrt, dec, w1,
                         b2, w2, eps, scale, AMSGRAD, MAXIMIZE, MASTER, HAS_SCALE, False)
        tail = start + n_full * BLOCK
        if (n_full < ITERS) & (tail < numel):
            offs = tail + lanes
            _adamw_block(offs, offs < numel, p_ptr, g_ptr, m_ptr, v_ptr, vmax_ptr, w_ptr, step_size, bc2_sqrt, dec,
                         w1, b2, w2, eps, scale, AMSGRAD, MAXIMIZE, MASTER, HAS_SCALE, True)


@triton.jit
def _adamw_steps_kernel(TABLE, N, FOUND_INF, ROW: tl.constexpr, HAS_INF: tl.constexpr, BLOCK: tl.constexpr):
    # step += 1 for every tensor of the table (after the update kernel read the old values);
    # unchanged when found_inf != 0.
    inc = 1.0
    if HAS_INF:
        inc = tl.where(tl.load(FOUND_INF) == 0, 1.0, 0.0)
    for start in range(0, N, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        mask = rows < N
        addr = tl.load(TABLE + rows.to(tl.int64) * ROW + 7, mask=mask, other=0)
        ptrs = addr.to(tl.pointer_type(tl.float32))
        s = tl.load(ptrs, mask=mask, other=0.0)
        tl.store(ptrs, s + inc, mask=mask)


@triton.jit
def _max_nan(a, b):
    # max that keeps NaN (the inf-norm of a grad holding NaN is NaN, as in torch)
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _abs_pow(x, p, NORM: tl.constexpr):
    # NORM: 0 -> x^2, 1 -> |x|, 2 -> |x| (max-reduced), 3 -> |x|^p
    if NORM == 0:
        return x * x
    elif NORM == 3:
        a = tl.abs(x)
        return tl.where(a == 0.0, 0.0, tl.exp2(p * tl.log2(a)))  # NaN stays NaN (a > 0 would drop it)
    else:
        return tl.abs(x)


@triton.jit
def _norm_partial_kernel(TABLE, CHUNKS, G0, PARTIAL, p, ROW: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr,
                         NORM: tl.constexpr, ALIGNED: tl.constexpr):
    # PARTIAL[pid] = sum (or max) over the program's chunk of |g|^p, fp32.
    pid = tl.program_id(0)
    r = tl.load(CHUNKS + 2 * pid).to(tl.int64)
    c = tl.load(CHUNKS + 2 * pid + 1).to(tl.int64)
    row = TABLE + r * ROW
    numel = tl.load(row + 0)
    g_ptr = _ptr(row, 2, G0.dtype, ALIGNED)
    start = c * (BLOCK * ITERS)
    lanes = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    n_full = tl.minimum((numel - start) // BLOCK, ITERS)
    for i in range(0, n_full):
        x = _abs_pow(tl.load(g_ptr + start + i * BLOCK + lanes).to(tl.float32), p, NORM)
        if NORM == 2:
            acc = tl.maximum(acc, x, propagate_nan=tl.PropagateNan.ALL)
        else:
            acc += x
    tail = start + n_full * BLOCK
    if (n_full < ITERS) & (tail < numel):
        offs = tail + lanes
        x = _abs_pow(tl.load(g_ptr + offs, mask=offs < numel, other=0.0).to(tl.float32), p, NORM)
        if NORM == 2:
            acc = tl.maximum(acc, x, propagate_nan=tl.PropagateNan.ALL)
        else:
            acc += x
    if NORM == 2:
        tl.store(PARTIAL + pid, tl.reduce(acc, 0, _max_nan))
    else:
        tl.store(PARTIAL + pid, tl.sum(acc, axis=0))


@triton.jit
def _norm_finalize_kernel(PARTIAL, N, TOTAL, COEF, max_norm, p, NORM: tl.constexpr, BLOCK: tl.constexpr):
    # One program: total = (sum partials)^(1/p) (max for inf), rounded to TOTAL's dtype;
    # coef = min(max_norm / (total + 1e-6), 1), NaN kept (as torch.clamp keeps it).
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(PARTIAL + offs, mask=offs < N, other=0.0)
        if NORM == 2:
            acc = tl.maximum(acc, x, propagate_nan=tl.PropagateNan.ALL)
        else:
            acc += x
    if NORM == 2:
        s = tl.reduce(acc, 0, _max_nan)
    else:
        s = tl.sum(acc, axis=0)
    if NORM == 0:
        total = tl.sqrt_rn(s)
    elif NORM == 3:
        total = tl.where(s > 0.0, tl.exp2(tl.log2(s) / p), s)
    else:
        total = s
    total = total.to(TOTAL.dtype.element_ty)
    tl.store(TOTAL, total)
    coef = max_norm / (total.to(tl.float32) + 1e-6)
    tl.store(COEF, tl.where(coef > 1.0, 1.0, coef))


@triton.jit
def _scale_kernel(TABLE, CHUNKS, G0, COEF, ROW: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr,
                  ALIGNED: tl.constexpr):
    # g *= coef over the program's chunk (coef read on the device: no host sync).
    pid = tl.program_id(0)
    r = tl.load(CHUNKS + 2 * pid).to(tl.int64)
    c = tl.load(CHUNKS + 2 * pid + 1).to(tl.int64)
    row = TABLE + r * ROW
    numel = tl.load(row + 0)
    g_ptr = _ptr(row, 2, G0.dtype, ALIGNED)
    coef = tl.load(COEF)
    start = c * (BLOCK * ITERS)
    lanes = tl.arange(0, BLOCK)
    n_full = tl.minimum((numel - start) // BLOCK, ITERS)
    for i in range(0, n_full):
        offs = start + i * BLOCK + lanes
        g = tl.load(g_ptr + offs, eviction_policy="evict_first").to(tl.float32)
        tl.store(g_ptr + offs, (g * coef).to(g_ptr.dtype.element_ty))
    tail = start + n_full * BLOCK
    if (n_full < ITERS) & (tail < numel):
        offs = tail + lanes
        mask = offs < numel
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(g_ptr + offs, (g * coef).to(g_ptr.dtype.element_ty), mask=mask)
