"""MLA decode at small batches: eager wall time per call (host-bound there) against CUDA-graph
replay time, for the sm_90 Gluon kernel and the Triton kernel, interleaved in rounds.
Usage (GPU machine): python scripts/mla_host.py"""
from __future__ import annotations

import statistics

import torch

from kernelset.bench import timing
from kernelset.ops.mla import launch as L
from kernelset.ops.mla.bench import ADAPTERS

KERNELS = {"default": L.MlaTuning(), "gluon-ws": L.MlaTuning(wgmma_eager_min_work=0),
           "triton": L.MlaTuning(wgmma=False)}


def main() -> None:
    dev = torch.device("cuda")
    for shape in ((1, 1024, 128, 512, 64, 64, 16), (8, 4096, 128, 512, 64, 64, 16), (32, 2048, 128, 512, 64, 64, 16),
                  (64, 4096, 128, 512, 64, 64, 16)):
        inp = ADAPTERS["mla_decode"].inputs(shape, torch.bfloat16, dev, "fwd")
        res = {k: {"eager": [], "graph": []} for k in KERNELS}
        for _ in range(3):
            for name, t in KERNELS.items():
                with L.TUNING.use(t):
                    fn = ADAPTERS["mla_decode"].ours(inp, "fwd", "triton")
                    res[name]["eager"].append(timing.host_us_per_call(fn, calls=200))
                    g = timing.capture(fn, 20)
                    res[name]["graph"].append(timing.cuda_time_ms(g.replay, warmup=2, reps=10, min_ms=20.0) * 1e3 / 20)
        for name in KERNELS:
            e, g = statistics.median(res[name]["eager"]), statistics.median(res[name]["graph"])
            print(f"{shape}  {name:9s} eager {e:7.1f} us/call  graph {g:7.1f} us/call", flush=True)


if __name__ == "__main__":
    main()
