"""Launch-tuning values a family can swap for a block (tests force rare kernel shapes on small
inputs; GPU sweeps compare candidates), one stack per family."""
from __future__ import annotations

import contextlib
from typing import Generic, Iterator, TypeVar

T = TypeVar("T")


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
