"""The softmax ring forward (ops/softmax/ring_sm90.py; on by default on H200-class GPUs; here forced on and off) against the forward that
runs without it, through ks.softmax / ks.log_softmax, bf16, ~512 MiB moved per call, at every
width its policy covers (32768-131072, multiples of 32768), plus the host time of one small call.
Usage (GPU): python scripts/softmax_ring_widths.py"""
import dataclasses, time, torch, kernelset as ks
from kernelset.ops.softmax import launch
from kernelset.bench.timing import copy_bandwidth_gbs, cuda_time_ms
dev = torch.device("cuda"); copy = copy_bandwidth_gbs(dev)
print(torch.cuda.get_device_name(), f"copy {copy:.0f} GB/s", flush=True)
on = dataclasses.replace(launch.active(), ring=True, ring_min_gbs_per_sm=0.0)
off = dataclasses.replace(launch.active(), ring=False)
for m, n in ((8192, 32768), (4096, 65536), (2730, 98304), (2048, 131072), (4096, 131072)):
    x = torch.randn(m, n, dtype=torch.bfloat16, device=dev) * 3
    nb = 2 * x.numel() * 2
    for log in (False, True):
        f = ks.log_softmax if log else ks.softmax
        want = (torch.log_softmax if log else torch.softmax)(x.float(), -1)
        res = []
        for name, t in (("ring", on), ("off", off)):
            with launch.use(t):
                y = f(x); e = ((y.float() - want).norm() / want.norm()).item()
                ms = cuda_time_ms(lambda: f(x))
                kern = "ring" if "ring forward" in str(ks.explain("log_softmax" if log else "softmax", x, verbose=False)) else "other"
            res.append(f"{name}({kern}) {nb / ms / 1e6 / copy * 100:5.1f}% err {e:.1e}")
        print(f"{'log_' if log else ''}softmax {m}x{n}: " + " | ".join(res), flush=True)
    del x, y, want; torch.cuda.empty_cache()
# host time of a small ring call (one row; the launch path's cost)
x = torch.randn(1, 65536, dtype=torch.bfloat16, device=dev)
for name, t in (("ring", on), ("off", off)):
    with launch.use(t):
        for _ in range(20):
            ks.softmax(x)
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(200):
            ks.softmax(x)
        host = (time.perf_counter() - t0) / 200 * 1e6; torch.cuda.synchronize()
    print(f"host per call 1x65536 softmax, {name}: {host:.1f} us", flush=True)
