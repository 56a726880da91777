"""Rejection reasons shared by the ``supports`` functions of every family's Triton backend."""
from __future__ import annotations

from . import config
from .registry import Problem


def triton_device(p: Problem, what: str = "x") -> str | None:
    """Triton runs CUDA tensors, and CPU tensors only in the interpreter (TRITON_INTERPRET=1)."""
    if p.device.type == "cuda" or (p.device.type == "cpu" and config.get().triton_interpret):
        return None
    return (f"Triton kernels need a CUDA tensor ({what} is on {p.device}); "
            "set TRITON_INTERPRET=1 to run them on CPU tensors")


_ROWS = "the rows of a tensor do not share one stride with a unit-stride last dim (pass .contiguous())"


def triton_rows(p: Problem, flag: str = "rows_ok", what: str = "x", message: str = _ROWS) -> str | None:
    """The device check plus the layout the kernel needs, a boolean fact of the problem (``flag``);
    families bind their own flag and message with functools.partial."""
    reason = triton_device(p, what)
    if reason is None and not p[flag]:
        return message
    return reason
