"""The policy transpiler of the C ABI (capi/aot/transpile.py) on its own: what it must refuse.
Needs no compiler and no GPU; tests/test_capi_aot.py checks that every translated policy equals
the Python one over a sweep, on the built library."""
from __future__ import annotations

import dataclasses as dc
import os
import sys

import pytest

AOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "capi", "aot")


def test_transpiler_refuses_what_it_cannot_translate():
    if AOT not in sys.path:
        sys.path.insert(0, AOT)
    from transpile import TranspileError, translate

    @dc.dataclass(frozen=True)
    class P:
        a: int

    def uses_a_loop(n):
        for _ in range(n):
            pass
        return P(n)

    def floats_a_field(n):
        return P(n / 2)

    for fn in (uses_a_loop, floats_a_field):
        fn.__globals__["P"] = P
        with pytest.raises(TranspileError):
            translate(fn, "ks_pol_x")
