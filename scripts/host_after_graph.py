"""Host time of an eager rms_norm 1x4096 call, fresh and after CUDA-graph captures of a
fwd+bwd step (ours, then torch.compile's), to find what slows the eager path later in a process.
Usage (GPU machine): python scripts/host_after_graph.py"""
import torch

import kernelset as ks
from kernelset.bench import timing
from kernelset.ops.norm import launch
from kernelset.ops.triton_launch import _knobs, _no_hook

dev = torch.device("cuda")
x1 = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
w1 = torch.randn(4096, device=dev, dtype=torch.bfloat16)


def report(label):
    with torch.no_grad():
        us = timing.host_us_per_call(lambda: ks.rms_norm(x1, w1))
    rt = _knobs.runtime
    print(f"{label}: {us:.2f} us per call; hooks empty {_no_hook(rt.launch_enter_hook)} "
          f"{_no_hook(rt.launch_exit_hook)}; fwd cache {len(launch._fwd.cache)}", flush=True)


report("fresh")
report("again")
m, n = 32768, 4096
x = torch.randn(m, n, device=dev, dtype=torch.bfloat16, requires_grad=True)
w = (1 + 0.1 * torch.randn(n, device=dev)).to(torch.bfloat16).requires_grad_(True)
dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
timing.capture(lambda: torch.autograd.grad(ks.rms_norm(x, w), (x, w), dy)).replay()
torch.cuda.synchronize()
report("after capturing ours fwd+bwd")
for _ in range(3):
    torch.autograd.grad(ks.rms_norm(x, w), (x, w), dy)
report("after eager fwd+bwd")


def hf(x, w):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


c = torch.compile(hf, dynamic=False)
torch.autograd.grad(c(x, w), (x, w), dy)
report("after torch.compile fwd+bwd")
timing.capture(lambda: torch.autograd.grad(c(x, w), (x, w), dy)).replay()
torch.cuda.synchronize()
report("after capturing compile fwd+bwd")
import gc  # noqa: E402

gc.collect()
report("after gc.collect()")
gc.freeze()
report("after gc.freeze() (long-lived objects out of the collector's generations)")
gc.disable()
report("with gc disabled")
gc.enable()
torch.cuda.empty_cache()
report("after torch.cuda.empty_cache()")
