"""Shared by the families' ``test_kernels_compile_for_sm90``: run a script that compiles kernels
for a real NVIDIA target in a child process (the interpreter that conftest turns on cannot
compile), and check what it reports."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


# Prepended to the rope families' compile scripts: whether the kernel's q/k streams (its
# evict_first accesses) move in vectors, none of them one 2-byte element at a time (GPT-J pairs
# loaded with stride 2 did; small tiles may hold only 2 elements per thread).
QK_VECTORS = r"""
import re


def qk_vectors(ptx):
    acc = re.findall(r"(?:ld|st)\.global\.L1::evict_first[\w:.]*", ptx)
    return bool(acc) and not any(a.endswith(".b16") for a in acc)
"""


def compile_report(script: str, expected: int) -> list[dict]:
    """Run ``script`` (it prints one JSON list of {case, local, vec} last) without TRITON_INTERPRET;
    skip when this Triton has no usable NVIDIA backend; fail on spills or scalar-only access."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        get_ptxas(90).path
    except Exception as exc:
        pytest.skip(f"Triton NVIDIA backend/ptxas not usable here: {exc}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == expected
    for r in results:
        assert not r["local"], f"{r['case']}: local-memory traffic (spills)"
        assert r["vec"], f"{r['case']}: no vectorized global access"
    return results


def assert_ring_policy_fits(ref: tuple[str, str]) -> None:
    """On the GPU, after launches of the ring kernel ``ref``: each compiled specialization fits the
    programs per SM its policy assumed (registers, shared memory: ``ops/common/ring_host.py`` learns it after
    the first launch), so a kernel change or a Triton that needs more registers shows here."""
    from kernelset.ops.common import ring_host
    learned = {k: v for k, v in ring_host._RESIDENT.items() if k[0] == ref}
    assert learned and all(v == k[1].programs_per_sm for k, v in learned.items()), learned
