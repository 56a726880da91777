"""Launch-tuning values a family can swap for a block (tests force rare kernel shapes on small
inputs; GPU sweeps compare candidates), one stack per family."""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Generic, Iterator, TypeVar

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class SplitLaunch:
    """A split kernel's launch (kernelset/ops/common/row_barrier.py), what every family's split policy
    returns (the C ABI translates them to one struct)."""
    chunk: int  # columns (logits) per program
    split: int  # programs per row; 0: no split launch
    split_p2: int  # next power of two: the partials' row pitch
    num_warps: int


@dataclasses.dataclass(frozen=True)
class RingLaunch:
    """A ring kernel's launch (kernelset/ops/common/tma_ring_sm90.py: rows held in a TMA ring in shared
    memory on sm_90), what the ring policies of the norm and softmax families return."""
    split: int  # programs per row (portions of equal width)
    split_p2: int  # next power of two: the partials' row pitch
    chunks: int  # TMA chunks of box_rows x 256 elements per portion
    box_rows: int
    buffers: int  # chunks of the ring
    num_warps: int
    programs_per_sm: int  # what the kernel's shared memory and registers let one SM hold


def ring_launch(n: int, portion: int, box_rows: int, buffers: int, num_warps: int,
                programs_per_sm: int, *, ragged: bool = False) -> RingLaunch | None:
    """Rows of n in portions of ``portion`` columns, or None where n does not split so.
    ``ragged``: n need only be a multiple of 256, the last portion running past the row (a
    kernel that masks those columns: the cross-entropy ring)."""
    chunk = box_rows * 256
    if portion % chunk or buffers * chunk < portion:
        return None
    if ragged:
        if n % 256:
            return None
        split = -(-n // portion)
    elif n % portion:
        return None
    else:
        split = n // portion
    return RingLaunch(split, 1 << max(0, (split - 1).bit_length()), portion // chunk, box_rows, buffers, num_warps,
                      programs_per_sm)


def hash_once(cls: type[T]) -> type[T]:
    """Class decorator for a frozen tuning dataclass: its hash is computed once per instance.
    Launch policies are ``lru_cache``d on (shape..., tuning) on every call, and a generated
    dataclass hash re-hashes every field each time (about 1 us for 17 fields)."""
    names = tuple(f.name for f in dataclasses.fields(cls))

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, n) for n in names))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:  # the cached hash may not survive another process's str hashing
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    cls.__hash__ = __hash__  # type: ignore[assignment]
    cls.__getstate__ = __getstate__  # type: ignore[attr-defined]
    return cls


class TuningStack(Generic[T]):
    def __init__(self, default: T):
        self.default = default
        self._stack = [default]

    def active(self) -> T:
        return self._stack[-1]

    @contextlib.contextmanager
    def use(self, tuning: T) -> Iterator[T]:
        self._stack.append(tuning)
        try:
            yield tuning
        finally:
            self._stack.pop()
