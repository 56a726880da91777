"""Experiments behind the norm launch policy (kept so the numbers in docs/benchmarks can be
reproduced): 2-D block kernel vs a 1-D row kernel vs a persistent 1-D kernel, and where the host
time of an eager rms_norm call goes."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import kernelset as ks
from kernelset.bench.timing import copy_bandwidth_gbs, cuda_time_ms, host_us_per_call
from kernelset.core import dispatch
from kernelset.ops.norm import policy
from kernelset.ops.norm.kernels import _norm_fwd_kernel
from kernelset.ops.norm.launch import norm_fwd


@triton.jit
def _rms_row_kernel(X, W, Y, N, stride, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    m = cols < N
    x = tl.load(X + row * stride + cols, mask=m, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(Y + row * stride + cols, ((x * rstd).to(Y.dtype.element_ty).to(tl.float32) * w).to(Y.dtype.element_ty), mask=m)


@triton.jit
def _rms_persist_kernel(X, W, Y, M, N, stride, eps, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    m = cols < N
    w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
    for row in tl.range(pid, M, nprog, num_stages=2):
        r = row.to(tl.int64)
        x = tl.load(X + r * stride + cols, mask=m, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
        tl.store(Y + r * stride + cols, ((x * rstd).to(Y.dtype.element_ty).to(tl.float32) * w).to(Y.dtype.element_ty), mask=m)


def main():
    dev = torch.device("cuda")
    copy = copy_bandwidth_gbs(dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    print(f"copy {copy:.0f} GB/s, {sms} SMs")
    for m, n in [(32768, 4096), (16384, 8192), (8192, 16384)]:
        x = torch.randn(m, n, dtype=torch.bfloat16, device=dev)
        w = torch.randn(n, dtype=torch.bfloat16, device=dev)
        y = torch.empty_like(x)
        pct = lambda ms: 100 * 4 * m * n / ms / 1e6 / copy  # noqa: E731
        ms = cuda_time_ms(lambda: norm_fwd(x, w, None, eps=1e-6, is_rms=True, gemma_cast=False, stats=False))
        print(f"{m}x{n} current policy {policy.fwd_policy(m, n, sms, True, policy.active())}: {pct(ms):.1f}%")
        for warps in (4, 8, 16):
            ms = cuda_time_ms(lambda: _rms_row_kernel[(m,)](x, w, y, n, n, 1e-6, BLOCK_N=n, num_warps=warps))
            print(f"   1-D row kernel, {warps} warps: {pct(ms):.1f}%")
        for warps in (8, 16):
            for per_sm in (1, 2, 4, 8):
                try:
                    ms = cuda_time_ms(lambda: _rms_persist_kernel[(sms * per_sm,)](x, w, y, m, n, n, 1e-6, BLOCK_N=n,
                                                                                num_warps=warps))
                    print(f"   persistent, {warps} warps, {per_sm}/SM: {pct(ms):.1f}%")
                except Exception as exc:
                    print(f"   persistent {warps} warps {per_sm}/SM failed: {type(exc).__name__}: {exc}"[:200])
    # host time of one eager call at decode size, layer by layer
    x = torch.randn(1, 4096, dtype=torch.bfloat16, device=dev)
    w = torch.randn(4096, dtype=torch.bfloat16, device=dev)
    y = torch.empty_like(x)
    impl = dispatch.select("rms_norm", "auto", (x, w), {})
    p = policy.fwd_policy(1, 4096, sms, True, policy.active())

    per_call = host_us_per_call

    args = (x, x, w, y, y, y, y, y, 1, 4096, 4096, 4096, 4096, 4096, 1e-6, 0.0)
    flags = dict(IS_RMS=True, HAS_RESIDUAL=False, HAS_WEIGHT=True, HAS_BIAS=False, GEMMA_CAST=False,
                 STORE_STATS=False, ROWS=p.rows, BLOCK_N=p.block_n, num_warps=p.num_warps)
    print("host us per call at 1x4096:")
    print(f"   raw kernel[grid](...)      {per_call(lambda: _norm_fwd_kernel[(1,)](*args, **flags)):.1f}")
    print(f"   1-D row kernel (7 args)    {per_call(lambda: _rms_row_kernel[(1,)](x, w, y, 4096, 4096, 1e-6, BLOCK_N=4096, num_warps=8)):.1f}")
    print(f"   launch.norm_fwd            {per_call(lambda: norm_fwd(x, w, None, eps=1e-6, is_rms=True, gemma_cast=False, stats=False)):.1f}")
    print(f"   impl.forward               {per_call(lambda: impl.forward(x, w, 1e-6, 0.0, False, False)):.1f}")
    print(f"   dispatch.select            {per_call(lambda: dispatch.select('rms_norm', 'auto', (x, w), {})):.1f}")
    with torch.no_grad():
        print(f"   ks.rms_norm (no_grad)      {per_call(lambda: ks.rms_norm(x, w)):.1f}")
    print(f"   torch.empty_like           {per_call(lambda: torch.empty_like(x)):.1f}")
    print(f"   F.rms_norm                 {per_call(lambda: torch.nn.functional.rms_norm(x, (4096,), w, 1e-6)):.1f}")


if __name__ == "__main__":
    main()
