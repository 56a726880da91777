"""Launch configurations of the cross-entropy ring kernel (ops/loss/ring_sm90.py), forward with its
gradient through launch.ce_fwd, bf16, % of copy (read logits + write the gradient); each checked
against the fp32 reference on its first 256 rows. Usage (GPU): python scripts/ce_ring_tune.py [0,2 (config indices)]"""
import dataclasses, torch
from kernelset.ops.loss import launch
from kernelset.ops.loss import reference as R
from kernelset.bench.timing import copy_bandwidth_gbs, cuda_time_ms
dev = torch.device("cuda"); copy = copy_bandwidth_gbs(dev)
print(torch.cuda.get_device_name(), f"copy {copy:.0f} GB/s", flush=True)
base = dataclasses.replace(launch.active(), ring_min_gbs_per_sm=0.001)  # the fields below
# (portion, box rows, buffers, warps, programs per SM); the first launch (s22), then the shipped one (third)
# (each fits an SM: shared memory <= 228 KB, 80 registers x threads <= 64K)
configs = ((32768, 16, 9, 8, 3), (16384, 16, 9, 8, 3), (16384, 8, 9, 4, 6), (32768, 8, 16, 8, 3),
           (32768, 16, 8, 8, 3), (16384, 8, 10, 4, 5),
           (32768, 16, 9, 8, 3, "row masks"), (16384, 8, 9, 4, 6, "row masks"))  # 6, 7: ring_row_masks
import sys
if len(sys.argv) > 1:  # indices of the configs to run (and only the first two shapes)
    configs = tuple(configs[int(i)] for i in sys.argv[1].split(","))
for m, v in ((8192, 128256), (4096, 262144), (16384, 65536))[:2 if len(sys.argv) > 1 else 3]:
    x = torch.randn(m, v, dtype=torch.bfloat16, device=dev) * 2
    t = torch.randint(0, v, (m,), device=dev)
    wl, wd = R.fwd(x[:256], t[:256], -100, 0.0, 0.0, None, "sum", True)
    nb = 2 * x.numel() * 2
    off = dataclasses.replace(base, ring_min_gbs_per_sm=0.0)
    with launch.use(off):
        ms = cuda_time_ms(lambda: launch.ce_fwd(x, t, -100, 0.0, 0.0, None, "mean", True))
    print(f"{m}x{v} looped {nb / ms / 1e6 / copy * 100:5.1f}%", flush=True)
    for portion, boxr, nbuf, warps, per_sm, *rm in configs:
        tune = dataclasses.replace(base, ring_portion=portion, ring_box_rows=boxr, ring_buffers=nbuf,
                                   ring_warps=warps, ring_programs_per_sm=per_sm, ring_row_masks=bool(rm))
        with launch.use(tune):
            if launch.ring_choice(v, x.dtype, dev, tune) is None:
                print(f"  {portion}/{boxr}x256/{nbuf}buf/{warps}w/{per_sm}{rm}: not a valid ring launch", flush=True)
                continue
            _, dx = launch.ce_fwd(x, t, -100, 0.0, 0.0, None, "mean", True)
            err = ((dx[:256].float() * m - wd).norm() / wd.norm()).item()
            ms = cuda_time_ms(lambda: launch.ce_fwd(x, t, -100, 0.0, 0.0, None, "mean", True))
            del dx
        print(f"  {portion}/{boxr}x256/{nbuf}buf/{warps}w/{per_sm}{rm}: {ms:.3f} ms {nb / ms / 1e6 / copy * 100:5.1f}% "
              f"dx err {err:.1e}", flush=True)
    del x; torch.cuda.empty_cache()
from kernelset.ops import ring
for lay in ring.gluon_kernel(*launch._RING)[0].layouts.values():
    for key, (kernel, _, _) in lay.cache.items():
        print("specialization regs", getattr(kernel, "n_regs", "?"), "spills", getattr(kernel, "n_spills", "?"),
              "shared", kernel.metadata.shared, flush=True)
