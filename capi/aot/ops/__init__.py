"""The ops whose kernels the C ABI embeds: for each, the Python launcher it mirrors, the Triton
kernels and policies involved, the C plan function (glue from the policy's fields to the kernel's
constexprs and grid, written line for line after the launcher), and the cases that enumerate its
variants (``test``: what the CPU tests, the GPU checks and the smoke program run; ``full``: what a
release build embeds; ``sweep``: the wider set, never compiled, on which tests compare C plans
with the launcher).

Everything a launch depends on, beyond the glue, comes from the package itself: the policy
functions are translated to C (transpile.py), the variants are the launcher's recorded choices
(record.py), the enum values (activation kinds and layouts) are read from the launch modules.
One module per family; a case that the GPU checks run carries ``gpu`` (its id there).
"""
from __future__ import annotations

from . import activation, attention, embedding, kvcache, loss, mla, norm, rope, softmax
from .base import KernelRef, Op, PolicyRef

OPS: list[Op] = [norm.NORM_FWD, activation.ACT_FWD, softmax.SOFTMAX_FWD, rope.ROPE_FWD, rope.ROPE_EXT,
                 kvcache.RESHAPE_AND_CACHE, kvcache.COPY_BLOCKS, embedding.EMBEDDING_FWD, loss.CE_FWD,
                 attention.PAGED_ATTENTION, attention.MERGE_ATTN_STATES, attention.FLASH_FWD,
                 mla.MLA_DECODE]

# enums the C callers need, read from the launch modules: (module, dict attribute, C prefix)
ENUMS = [("kernelset.ops.activation.launch", "ACTS", "KS_ACT_"),
         ("kernelset.ops.activation.launch", "LAYOUTS", "KS_ACT_LAYOUT_"),
         ("kernelset.ops.rope.launch", "_CASTS", "KS_ROPE_CAST_")]

__all__ = ["ENUMS", "OPS", "KernelRef", "Op", "PolicyRef"]
