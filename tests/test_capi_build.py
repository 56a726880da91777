"""scripts/build_capi.sh's choice of Python, as the README runs it (no PYTHON, outside the venv).

Each case runs a copy of the script in a scratch tree (it works from the tree above its own folder),
so nothing is built and the repository's library is left alone: the project's .venv/bin/python is
taken (and named) when it exists, and a Python without torch/triton fails in one line that says what
to do, with no traceback. A Python "without torch" is this one with -S (no site-packages).
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if not shutil.which("bash"):
    pytest.skip("no bash", allow_module_level=True)


def _exe(path: str, body: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + body + "\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def tree(tmp_path):
    """A scratch tree with the script, and a python3 on PATH that cannot import torch."""
    os.makedirs(tmp_path / "scripts")
    shutil.copy(os.path.join(ROOT, "scripts", "build_capi.sh"), tmp_path / "scripts" / "build_capi.sh")
    bare = _exe(str(tmp_path / "bin" / "python3"), f'exec "{sys.executable}" -S "$@"')
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "TRITON_INTERPRET")}
    env["PATH"] = os.path.dirname(bare) + os.pathsep + "/usr/bin:/bin"
    return tmp_path, env, bare


def _run(root, env, *args):
    return subprocess.run(["bash", str(root / "scripts" / "build_capi.sh"), *args], env=env, capture_output=True,
                          text=True, timeout=300)


def _one_line_failure(p: subprocess.CompletedProcess, names: str) -> None:
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "Traceback" not in p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"build_capi.sh: {names}") and "cannot import torch and triton" in lines[0]
    assert "No module named 'torch'" in lines[0] and "set PYTHON" in lines[0], lines[0]


def test_python_without_torch_fails_in_one_line(tree):
    root, env, _ = tree
    _one_line_failure(_run(root, env), "python3 (python3 on PATH, no .venv here)")


def test_project_venv_is_the_default_and_named(tree):
    root, env, _ = tree
    _exe(str(root / ".venv" / "bin" / "python"), f'exec "{sys.executable}" "$@"')
    p = _run(root, env, "--set", "none")
    assert "build_capi.sh: using .venv/bin/python" in p.stdout, (p.stdout, p.stderr)
    assert "cannot import" not in p.stderr and "No module named 'triton'" not in p.stderr, p.stderr
    # (the scratch tree has no generator: the build stops there, after the interpreter was accepted)


def test_explicit_python_is_honoured_over_the_venv(tree):
    root, env, bare = tree
    _exe(str(root / ".venv" / "bin" / "python"), f'exec "{sys.executable}" "$@"')
    p = _run(root, dict(env, PYTHON=bare))
    assert "using .venv" not in p.stdout
    _one_line_failure(p, f"{bare} (PYTHON)")
