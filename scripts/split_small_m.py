"""Softmax and rms_norm at decode-sized batches (1-64 rows) over wide rows: the looped kernels
(one program per row) against the split ones (split_min 0), CUDA-graph replayed so host time
does not count. Prints microseconds per call and % of copy.

    python scripts/split_small_m.py
"""
from __future__ import annotations

import dataclasses

import torch

import kernelset as ks
from kernelset.bench.timing import copy_bandwidth_gbs, graph_replay_us
from kernelset.ops.norm import policy as norm_policy
from kernelset.ops.softmax import launch as sm_launch


def main() -> None:
    dev = torch.device("cuda")
    copy = copy_bandwidth_gbs(dev)
    print(f"{torch.cuda.get_device_name(dev)}; copy {copy:.0f} GB/s")
    sm_base, n_base = sm_launch.SoftmaxTuning(), norm_policy.DEFAULT_TUNING
    cfgs = {
        "looped": (dataclasses.replace(sm_base, split_chunk_fwd=0, split_chunk_bwd=0),
                   dataclasses.replace(n_base, split_chunk_fwd=0)),
        "split": (dataclasses.replace(sm_base, split_min_fwd=0, split_min_bwd=0), dataclasses.replace(n_base, split_min_fwd=0)),
    }
    for n in (32000, 65536, 128256, 262144):
        for m in (1, 8, 64, 512):
            x = torch.randn(m, n, dtype=torch.bfloat16, device=dev)
            w = torch.randn(n, dtype=torch.bfloat16, device=dev)
            line = f"{m:4d} x {n:6d}"
            for name, (st, nt) in cfgs.items():
                with sm_launch.use(st), norm_policy.use(nt):
                    ref = torch.softmax(x.float(), -1)
                    assert (ks.softmax(x).float() - ref).norm() / ref.norm() < 1e-2
                    us_s, _ = graph_replay_us(lambda: ks.softmax(x), calls_in_graph=20, replays=20)
                    us_r, _ = graph_replay_us(lambda: ks.rms_norm(x, w), calls_in_graph=20, replays=20)
                pct = lambda us: 100 * 4 * m * n / us / 1e3 / copy  # noqa: E731
                line += f" | {name}: softmax {us_s:7.1f} us ({pct(us_s):4.1f}%) rms {us_r:7.1f} us ({pct(us_r):4.1f}%)"
            print(line, flush=True)


if __name__ == "__main__":
    main()
