#!/usr/bin/env bash
# Fresh machine -> the test suite. Creates .venv, installs kernelset with its test extra (CPU
# torch 2.13.0, newest Triton), installs Go from Debian if it is missing (the C ABI's Go binding;
# gcc, cargo and node come with the image; koffi comes from npm in the binding's test) and runs
# pytest. Without a GPU, Triton kernels run in the interpreter and GPU-marked tests are skipped;
# libkernelset.so is built once per run by the capi_library fixture (scripts/build_capi.sh). CI (.ci/run) runs exactly
# this, with KS_REQUIRE_BINDINGS=1 so that a missing toolchain fails instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v go >/dev/null 2>&1; then
  SUDO=""; [[ $(id -u) != 0 ]] && command -v sudo >/dev/null 2>&1 && SUDO="sudo -n"
  { $SUDO apt-get install -y -q golang-go || { $SUDO apt-get update -q && $SUDO apt-get install -y -q golang-go; }; } \
    >/dev/null 2>&1 || echo "test.sh: could not install golang-go; the Go binding's test needs go" >&2
fi
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/pip install -q torch==2.13.0 -e '.[test]'
# one worker per core (KS_TEST_WORKERS overrides; 0 runs in this process); workers take tests one at a
# time and steal from a busy one (--dist worksteal): the model sweep of tests/test_hf_families.py is
# too long to stay on one worker
exec .venv/bin/python -m pytest -q -n "${KS_TEST_WORKERS:-auto}" --dist worksteal "$@"
