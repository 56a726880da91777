#!/usr/bin/env bash
# Fresh machine -> the test suite. Creates .venv, installs kernelset with its test extra (CPU
# torch 2.13.0, newest Triton) and runs pytest. Without a GPU, Triton kernels run in the
# interpreter and GPU-marked tests are skipped. CI (.ci/run) runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/pip install -q torch==2.13.0 -e '.[test]'
exec .venv/bin/python -m pytest -q "$@"
