"""Kernel machinery shared by the op families (no ops of its own: nothing is declared here).

- ``fast_launch``: :class:`FastKernel`, the low-overhead launch of a compiled ``@triton.jit`` or
  Gluon kernel that every family's launchers go through.
- ``row_barrier``: rows split across programs that exchange per-chunk partials at a per-row
  barrier in global memory (Triton helpers used inside the split kernels of norm, softmax and
  cross-entropy, and the host side: counters, partials, one launch or two).
- ``tma_ring_sm90``: Gluon pieces of the sm_90 ring kernels (a row's portion streamed by TMA
  through a ring buffer in shared memory, the row's programs meeting at the same barrier); only
  imported where Gluon's Hopper module exists.
- ``ring_host``: the host side of those ring kernels (where they can run, TMA descriptor, grid,
  programs per SM that really fit).
"""
