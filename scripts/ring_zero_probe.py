"""How much of a ring / split launch's time is its row counters' zeroing launch.

Every one-launch split and ring kernel (``ops/rowsync.py``, ``ops/ring.py``) takes a ticket
counter and one arrival count per row, zeroed by a small kernel just before it (one more launch
per call). Each case below is timed through the public op as shipped, then with the counters
taken from a pool zeroed beforehand, outside the timed calls (``rowsync.launches`` patched where
it is bound: the same kernels, no zeroing launch). The difference bounds what self-cleaning counters (the kernel
resetting them itself) could gain; session 27 estimated 1.5-2 points of copy at 4096x65536 on the
H200 from other runs, this measures it in one. Written in session 28 after its device time was
spent: not yet run on a GPU.

Usage (GPU): python scripts/ring_zero_probe.py
"""
from __future__ import annotations

import contextlib

import torch

import kernelset as ks
from kernelset.bench.timing import copy_bandwidth_gbs, cuda_time_ms
from kernelset.ops import ring, rowsync
from kernelset.ops.loss import launch as loss_launch
from kernelset.ops.norm import launch as norm_launch
from kernelset.ops.softmax import launch as softmax_launch

# every module that binds rowsync.launches by name
_USERS = (rowsync, ring, norm_launch, softmax_launch, loss_launch)

POOL = 1200  # more than cuda_time_ms's calls (warm-up + at most 20 batches of 50)


@contextlib.contextmanager
def prezeroed(device: torch.device, rows_max: int):
    """rowsync.launches handing out counters zeroed in advance (one pool slice per call)."""
    real = rowsync.launches
    pool = torch.zeros(POOL, rows_max + 1, dtype=torch.int32, device=device)
    used = [0]

    def launches(dev, rows, nslot, split_p2):
        phases = real(dev, rows, nslot, split_p2)
        if len(phases) != 1:
            return phases
        _, _, part = phases[0]
        i = used[0]
        used[0] += 1
        if i >= POOL or rows + 1 > pool.shape[1]:
            raise RuntimeError("ring_zero_probe: the pre-zeroed pool is too small")
        return ((0, pool[i, : rows + 1], part),)

    for mod in _USERS:
        mod.launches = launches
    try:
        yield used
    finally:
        for mod in _USERS:
            mod.launches = real


def main() -> None:
    dev = torch.device("cuda")
    copy = copy_bandwidth_gbs(dev)
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, copy {copy:.0f} GB/s")
    bf = torch.bfloat16
    cases = []
    for m, n in ((4096, 65536), (1024, 262144)):
        x, w = torch.randn(m, n, dtype=bf, device=dev), torch.randn(n, dtype=bf, device=dev)
        cases.append((f"rms_norm {m}x{n}", 4 * m * n, m, lambda x=x, w=w: ks.rms_norm(x, w)))
    xs = torch.randn(4096, 131072, dtype=bf, device=dev)
    cases.append(("softmax 4096x131072", 4 * xs.numel(), 4096, lambda: ks.softmax(xs)))
    lg = torch.randn(8192, 128256, dtype=bf, device=dev, requires_grad=True)
    tg = torch.randint(0, 128256, (8192,), device=dev)
    # the fused pass writes the gradient in the forward: read logits, write dlogits
    cases.append(("cross_entropy fwd+bwd 8192x128256", 4 * lg.numel(), 8192, lambda: ks.cross_entropy(lg, tg)))
    for name, nbytes, rows, fn in cases:
        shipped = cuda_time_ms(fn)
        with prezeroed(dev, rows) as used:
            want = fn()
            pre = cuda_time_ms(fn)
        got = fn()
        same = torch.equal(want.detach(), got.detach())
        print(f"{name}: shipped {shipped * 1e3:7.1f} us ({nbytes / shipped / 1e6 / copy * 100:5.1f}% of copy), "
              f"counters pre-zeroed {pre * 1e3:7.1f} us ({nbytes / pre / 1e6 / copy * 100:5.1f}%); "
              f"{used[0]} patched launches; same result: {same}")


if __name__ == "__main__":
    main()
