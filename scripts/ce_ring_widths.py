"""The cross-entropy ring kernel (ops/loss/ring_sm90.py) against the kernel that runs without it,
forward with its gradient (what a training step's loss runs: the backward only scales when the
incoming gradient is not 1), bf16, bytes = read logits + write the gradient. Turned on whatever
the GPU's bandwidth class (the default: SXM-class GPUs), with the launch of this GPU's class. Usage (GPU):
python scripts/ce_ring_widths.py"""
import dataclasses, torch
from kernelset.ops.loss import launch
from kernelset.ops.loss import reference as R
from kernelset.bench.timing import copy_bandwidth_gbs, cuda_time_ms
dev = torch.device("cuda"); copy = copy_bandwidth_gbs(dev)
print(torch.cuda.get_device_name(), f"copy {copy:.0f} GB/s", flush=True)
on = dataclasses.replace(launch.active(), ring_min_gbs_per_sm=0.001)
off = dataclasses.replace(launch.active(), ring_min_gbs_per_sm=0.0)
cases = ((8192, 128256, 0.0), (8192, 128256, 0.1), (4096, 262144, 0.0), (16384, 65536, 0.0), (32768, 32768, 0.0),
         (8192, 131072, 0.0))
for m, v, sm in cases:
    x = torch.randn(m, v, dtype=torch.bfloat16, device=dev) * 2
    t = torch.randint(0, v, (m,), device=dev)
    nb = 2 * x.numel() * 2
    res = []
    for name, tune in (("ring", on), ("off", off)):
        with launch.use(tune):
            loss, dx = launch.ce_fwd(x, t, -100, sm, 0.0, None, "mean", True)
            ms = cuda_time_ms(lambda: launch.ce_fwd(x, t, -100, sm, 0.0, None, "mean", True))
        ok = ""
        if m * v <= 8192 * 131072:
            wl, wd = R.fwd(x[:512], t[:512], -100, sm, 0.0, None, "sum", True)
            # mean over m rows, none ignored: the first 512 rows' gradient times m is their "sum" gradient
            ok = f" dx err {((dx[:512].float() * m - wd).norm() / wd.norm()).item():.1e}"
        res.append(f"{name} {ms:.3f} ms {nb / ms / 1e6 / copy * 100:5.1f}%{ok}")
        del dx
    print(f"ce fwd+grad {m}x{v} smoothing {sm}: " + " | ".join(res), flush=True)
    del x; torch.cuda.empty_cache()
# registers and spills of the ring kernel's compiled specializations (3 programs of 8 warps per SM
# need at most 85 registers a thread)
from kernelset.ops import ring
fk = ring.gluon_kernel(*launch._RING)[0]
for lay in fk.layouts.values():
    for key, (kernel, _, _) in lay.cache.items():
        print("ring kernel specialization",
              f"regs {getattr(kernel, 'n_regs', '?')} spills {getattr(kernel, 'n_spills', '?')}", flush=True)
