"""Sibling projections merged into one GEMM for inference: q/k/v, gate/up.

A module whose listed children (``mapping.PROJECTION_GROUPS``) are plain ``nn.Linear`` layers of
the same input width, dtype and device gets their weights (and biases) copied into one matrix, and
each child's parameter becomes a row-block view of it: no extra memory, the same values. The first
child called on an input runs one GEMM for the whole group and hands back its own columns; its
siblings called next on the same tensor (same object, not modified since) take theirs from that
result without a GEMM. The slices are views with the merged row stride; every kernelset op that
reads them (rms_norm, apply_rotary, swiglu, flash_attention) takes row-strided inputs.

The separate GEMMs run instead (the module's own behaviour) when a gradient for the weights is
being recorded, under torch.compile, or when a parameter no longer points into the merged matrix
(the model was moved or cast after ``kernelize``). ``restore()`` gives each parameter its own
storage again (a copy of its current values).

Why: at prefill the k and v projections alone fill half of an H100 (1024 output columns), and at
decode every launch costs host time; one GEMM per group is 3 launches fewer per layer.
"""
from __future__ import annotations

import threading
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


def _plain_linear(m: Any) -> bool:
    return (isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward and not m._forward_hooks
            and not m._forward_pre_hooks and not hasattr(m, "_hf_hook"))


def why_not(module: nn.Module, names: tuple[str, ...]) -> str | None:
    """None when the children ``names`` of ``module`` can be merged, else why not (attributes only)."""
    lins = [getattr(module, n, None) for n in names]
    if not all(_plain_linear(m) for m in lins):
        return "not all plain nn.Linear without hooks"
    w0 = lins[0].weight
    for m in lins:
        w = m.weight
        if w.shape[1] != w0.shape[1] or w.dtype != w0.dtype or w.device != w0.device:
            return "input width, dtype or device differ"
        if w.device.type == "meta" or not w.is_contiguous():
            return "weights on the meta device or not contiguous"
        if (m.bias is None) != (lins[0].bias is None):
            return "some have a bias and some do not"
    return None


class MergedGroup:
    """One module's merged projections: the matrix, the children's views of it, the hand-off state."""

    def __init__(self, linears: list[nn.Linear], counts: Any) -> None:
        self.linears = linears
        self.sizes = [m.out_features for m in linears]
        self.counts = counts
        with torch.no_grad():
            self.weight = torch.cat([m.weight.detach() for m in linears])
            self.bias = None if linears[0].bias is None else torch.cat([m.bias.detach() for m in linears])
            start = 0
            for m, n in zip(linears, self.sizes):
                m.weight.data = self.weight[start:start + n]
                if self.bias is not None:
                    m.bias.data = self.bias[start:start + n]
                start += n
        self.ptrs = tuple(m.weight.data_ptr() for m in linears)
        self.bias_ptrs = tuple(m.bias.data_ptr() for m in linears) if self.bias is not None else ()
        self.local = threading.local()

    def usable(self) -> bool:
        if self.weight is None:
            return False
        for m, p in zip(self.linears, self.ptrs):
            if m.weight.data_ptr() != p:
                self.drop()  # moved or cast since: the children's own GEMMs from now on
                return False
        for m, p in zip(self.linears, self.bias_ptrs):
            if m.bias.data_ptr() != p:
                self.drop()
                return False
        if torch.is_grad_enabled() and any(m.weight.requires_grad for m in self.linears):
            return False  # the weights' gradients need the children's own GEMMs
        return True

    def drop(self) -> None:
        self.weight = self.bias = None
        self.local = threading.local()

    def member_forward(self, i: int) -> Any:
        lin = self.linears[i]

        def forward(x: torch.Tensor) -> torch.Tensor:
            if torch.compiler.is_compiling():
                return F.linear(x, lin.weight, lin.bias)
            st = self.local
            outs = getattr(st, "outs", None)
            version = None if x.is_inference() else x._version
            if (outs is not None and outs[i] is not None and st.x is x and st.version == version
                    and not (torch.is_grad_enabled() and lin.weight.requires_grad)):
                # a sibling ran the group's GEMM on this very input (it checked usable()) moments ago
                y = outs[i]
                outs[i] = None
                st.left -= 1
                if st.left == 0:
                    st.outs = st.x = None
                return y
            if not self.usable():
                return F.linear(x, lin.weight, lin.bias)
            ys = list(F.linear(x, self.weight, self.bias).split(self.sizes, -1))
            self.counts["merged_projections"] += 1
            y, ys[i] = ys[i], None
            st.outs, st.x, st.version, st.left = ys, x, version, len(ys) - 1
            return y
        return forward

    def unmerge(self) -> None:
        """Each child's parameters in their own storage again (their current values)."""
        with torch.no_grad():
            for m, p in zip(self.linears, self.ptrs):
                if m.weight.data_ptr() == p:
                    m.weight.data = m.weight.data.clone()
            for m, p in zip(self.linears, self.bias_ptrs):
                if m.bias.data_ptr() == p:
                    m.bias.data = m.bias.data.clone()
        self.drop()
