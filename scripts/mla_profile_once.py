"""One MLA decode call at the bar shape (B64 ctx4096 H128, bf16 cache), for ncu. PREFETCH=1: the prefetch variant."""
import os
import torch
import kernelset as ks
from kernelset.ops.mla import launch as L
from kernelset.ops.mla.bench import ADAPTERS

inp = ADAPTERS["mla_decode"].inputs((64, 4096, 128, 512, 64, 64, 16), torch.bfloat16, torch.device("cuda"), "fwd")
with L.TUNING.use(L.MlaTuning(prefetch_pages=os.environ.get("PREFETCH") == "1")):
    fn = ADAPTERS["mla_decode"].ours(inp, "fwd", "triton")
    fn()
    torch.cuda.synchronize()
