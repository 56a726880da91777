"""The RMSNorm ring forward at every width its policy covers (and 32768, outside it) against the
forms that run with it turned off (ring_min_gbs_per_sm=0), through ks.rms_norm, bf16, ~512 MiB
moved per call. ``--wider``: the policy stretched to 32768-262144 (the same portion, chunks and
warps), to see where it would also win. Usage (GPU): python scripts/ring_widths.py [--wider]"""
import dataclasses, sys, torch, kernelset as ks
from kernelset.ops.norm import policy
from kernelset.bench.timing import copy_bandwidth_gbs, cuda_time_ms
dev = torch.device("cuda"); copy = copy_bandwidth_gbs(dev)
print(torch.cuda.get_device_name(), f"copy {copy:.0f} GB/s")
off = dataclasses.replace(policy.active(), ring_min_gbs_per_sm=0)
shapes = ((5461, 49152), (4096, 65536), (3276, 81920), (2730, 98304), (8192, 32768))
wider = dataclasses.replace(policy.active(), ring_from=32768, ring_to=262144)
if "--wider" in sys.argv:
    shapes = ((8192, 32768), (2048, 131072), (1024, 262144))
for m, n in shapes:
    x = torch.randn(m, n, dtype=torch.bfloat16, device=dev); w = torch.randn(n, dtype=torch.bfloat16, device=dev)
    xf = x.float(); want = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype).float() * w.float(); del xf
    nb = 2 * x.numel() * 2
    with policy.use(wider if "--wider" in sys.argv else policy.active()):
        y = ks.rms_norm(x, w); e = ((y.float() - want).norm() / want.norm()).item()
        t_on = cuda_time_ms(lambda: ks.rms_norm(x, w))
        kern = "ring" if "ring forward" in str(ks.explain("rms_norm", x, w, verbose=False)) else "other"
    with policy.use(off):
        y2 = ks.rms_norm(x, w); e2 = ((y2.float() - want).norm() / want.norm()).item()
        t_off = cuda_time_ms(lambda: ks.rms_norm(x, w))
    print(f"{m}x{n}: default ({kern}) {nb/t_on/1e6/copy*100:5.1f}% err {e:.1e} | ring off {nb/t_off/1e6/copy*100:5.1f}% err {e2:.1e}")
    del x, w, y, y2, want; torch.cuda.empty_cache()
# host time of a small call (one row of 65536: the ring's launch path against the looped kernel's)
import time
x = torch.randn(1, 65536, dtype=torch.bfloat16, device=dev); w = torch.randn(65536, dtype=torch.bfloat16, device=dev)
for name, t in (("default", policy.active()), ("ring off", off)):
    with policy.use(t):
        kern = "ring" if "ring forward" in str(ks.explain("rms_norm", x, w, verbose=False)) else "other"
        for _ in range(20):
            ks.rms_norm(x, w)
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(200):
            ks.rms_norm(x, w)
        host = (time.perf_counter() - t0) / 200 * 1e6; torch.cuda.synchronize()
    print(f"host per call 1x65536 rms_norm, {name} ({kern}): {host:.1f} us", flush=True)
