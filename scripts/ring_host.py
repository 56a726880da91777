"""Where the host time of a small ring launch goes: cProfile over 300 calls of ks.rms_norm on one
row of 65536 (the ring forward on an H200) and of ks.softmax with its ring on, top entries by own
time. Usage (GPU): python scripts/ring_host.py"""
import cProfile, dataclasses, pstats, time, torch, kernelset as ks
from kernelset.ops.softmax import launch as sl
dev = torch.device("cuda")
x = torch.randn(1, 65536, dtype=torch.bfloat16, device=dev); w = torch.randn(65536, dtype=torch.bfloat16, device=dev)
on = dataclasses.replace(sl.active(), ring=True)
cases = (("rms_norm", lambda: ks.rms_norm(x, w)), ("softmax ring", lambda: ks.softmax(x)))
for name, f in cases:
    with sl.use(on):
        for _ in range(30):
            f()
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(300):
            f()
        print(f"{name}: {(time.perf_counter() - t0) / 300 * 1e6:.1f} us per call", flush=True)
        torch.cuda.synchronize()
        pr = cProfile.Profile(); pr.enable()
        for _ in range(300):
            f()
        pr.disable(); torch.cuda.synchronize()
        pstats.Stats(pr).sort_stats("tottime").print_stats(14)
