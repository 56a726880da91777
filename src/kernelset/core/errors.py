"""Errors raised by kernelset: one place, so callers can catch them by type."""
from __future__ import annotations


class KernelsetError(Exception):
    """Base class of every kernelset error."""


class UnsupportedError(KernelsetError, RuntimeError):
    """An explicitly requested implementation cannot run this problem.

    ``reason`` says why; the dispatcher never falls back silently when a backend was named.
    """

    def __init__(self, op: str, backend: str, reason: str):
        self.op, self.backend, self.reason = op, backend, reason
        super().__init__(f"{op}: backend '{backend}' cannot run this problem: {reason}")

    def __reduce__(self):  # pickle and copy re-call __init__ with these, not with the message
        return type(self), (self.op, self.backend, self.reason)


class ArgumentError(KernelsetError, ValueError):
    """Bad input: names the argument, what was expected and what was given."""

    def __init__(self, op: str, arg: str, expected: str, got: object):
        self.op, self.arg, self.expected, self.got = op, arg, expected, got
        super().__init__(f"{op}: argument '{arg}' must be {expected}, got {got}")

    def __reduce__(self):  # (errors cross processes: DataLoader workers, multiprocessing, torch.distributed)
        return type(self), (self.op, self.arg, self.expected, self.got)


class ArgumentTypeError(ArgumentError, TypeError):
    """Bad input of the wrong kind (dtype, type): also a TypeError."""
