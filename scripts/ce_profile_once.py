"""One cross-entropy forward+backward at the bar shape (8192 x 128256 bf16), for ncu.

    ncu -k regex:_ce_ --launch-skip 1 --launch-count 1 python scripts/ce_profile_once.py [chain]

chain: the form-C kernel of scripts/pipe_tune.py instead of the production one (same inputs)."""
from __future__ import annotations

import sys

import torch

import kernelset as ks


def main() -> None:
    dev = torch.device("cuda")
    m, v = 8192, 128256
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(m, v, device=dev, dtype=torch.bfloat16, generator=g) * 2
    t = torch.randint(0, v, (m,), device=dev, generator=g)
    if "chain" in sys.argv[1:]:
        sys.path.insert(0, "scripts")
        from pipe_tune import _ce_chain_kernel
        dx = torch.empty_like(x)
        loss = torch.empty(m, device=dev)
        lse = torch.empty(m, device=dev)
        one = torch.ones((), device=dev)
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        for _ in range(2):
            _ce_chain_kernel[(4 * sms,)](x, t, loss, lse, dx, one, m, v, v, v, -100, 0.0, 0.0, 0.0, SOFTCAP=False,
                                         SMOOTH=False, BLOCK=16384, T_AHEAD=True, num_warps=32)
    else:
        x.requires_grad_(True)
        for _ in range(2):
            torch.autograd.grad(ks.cross_entropy(x, t), (x,))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
