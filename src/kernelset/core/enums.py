"""Choices are enums, parsed once at the boundary; the error lists the valid values."""
from __future__ import annotations

from enum import Enum
from typing import TypeVar

E = TypeVar("E", bound="KsEnum")


class KsEnum(str, Enum):
    """A string enum whose ``parse`` accepts a member or its value, case-insensitively."""

    @classmethod
    def parse(cls: type[E], value: object, *, what: str | None = None, op: str | None = None) -> E:
        """The member for ``value``; else a ValueError, an ``ArgumentError`` naming ``op`` and the
        argument ``what`` where ``op`` is given (a public function's argument)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls(value.strip().lower())
            except ValueError:
                pass
        valid = ", ".join(repr(m.value) for m in cls)
        if op is not None:
            from .errors import ArgumentError
            raise ArgumentError(op, what or cls.__name__, f"one of {valid}", repr(value))
        raise ValueError(f"{what or cls.__name__} must be one of {valid}, got {value!r}")

    def __str__(self) -> str:
        return self.value


class Backend(KsEnum):
    """Where an implementation comes from. The reference is always last and always works."""

    TRITON = "triton"  # kernelset's own Triton kernels
    TORCH = "torch"  # PyTorch natives (F.*, SDPA, cuBLAS through torch)
    LIGER = "liger"  # liger-kernel, when importable
    FLASH_ATTN = "flash_attn"  # flash-attn, when importable
    FLASHINFER = "flashinfer"  # flashinfer, when importable
    REFERENCE = "reference"  # fp32 reference in plain torch ops; runs on any device


AUTO = "auto"
