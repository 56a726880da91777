"""What device a tensor lives on, as the dispatcher needs it: type and compute capability."""
from __future__ import annotations

import dataclasses
import functools

import torch

Arch = tuple[int, int]


@functools.lru_cache(maxsize=None)
def cuda_arch(index: int) -> Arch:
    return tuple(torch.cuda.get_device_capability(index))  # type: ignore[return-value]


@functools.lru_cache(maxsize=None)
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (persistent grids are sized from it); 4 on any
    other device, i.e. in the interpreter, so grid-stride loops run there too."""
    if device.type != "cuda":
        return 4
    return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())


def device_arch(device: torch.device) -> Arch | None:
    """Compute capability of a CUDA device, None for any other device."""
    if device.type != "cuda":
        return None
    return cuda_arch(device.index if device.index is not None else torch.cuda.current_device())


@dataclasses.dataclass(frozen=True)
class ArchRange:
    """Inclusive range of CUDA compute capabilities; None bounds are open. Non-CUDA devices pass."""

    min: Arch | None = None
    max: Arch | None = None

    def check(self, arch: Arch | None) -> str | None:
        if arch is None:
            return None
        if self.min is not None and arch < self.min:
            return f"needs sm_{self.min[0]}{self.min[1]} or newer, device is sm_{arch[0]}{arch[1]}"
        if self.max is not None and arch > self.max:
            return f"supports up to sm_{self.max[0]}{self.max[1]}, device is sm_{arch[0]}{arch[1]}"
        return None

    def __str__(self) -> str:
        lo = f"sm_{self.min[0]}{self.min[1]}" if self.min else "any"
        hi = f"sm_{self.max[0]}{self.max[1]}" if self.max else "newer"
        return "any" if not (self.min or self.max) else f"{lo}..{hi}"


ANY_ARCH = ArchRange()
