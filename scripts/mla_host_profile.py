"""cProfile of eager MLA decode calls through the sm_90 Gluon kernel (where its host time goes).
Usage (GPU machine): python scripts/mla_host_profile.py"""
import cProfile
import pstats

import torch

from kernelset.ops.mla import launch as L
from kernelset.ops.mla.bench import ADAPTERS

inp = ADAPTERS["mla_decode"].inputs((8, 4096, 128, 512, 64, 64, 16), torch.bfloat16, torch.device("cuda"), "fwd")
with L.TUNING.use(L.MlaTuning(wgmma_eager_min_work=0)):
    fn = ADAPTERS["mla_decode"].ours(inp, "fwd", "triton")
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    prof.disable()
pstats.Stats(prof).sort_stats("tottime").print_stats(18)
