#!/usr/bin/env bash
# Fresh machine -> the main job. On a GPU: benchmarks against the peers present (table, JSON,
# PNG under bench-out/). On a CPU-only machine: every implementation verified against its fp32
# reference (Triton in the interpreter) and the dispatch plan printed.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/pip install -q torch==2.13.0 -e '.[bench]'
mkdir -p bench-out
exec .venv/bin/ksctl run --json bench-out/bench.json --png bench-out/bench.png "$@"
