#!/usr/bin/env bash
# The one GPU job: the whole test suite on the GPU (gpu-marked tests included), optionally the
# norm tuning sweep, then the benchmarks. Writes logs, JSON and PNG under $OUT (or bench-out/)
# and prints a short table last. Usage: scripts/gpu_check.sh [--tune] [--quick] [bench args...]
# The whole suite takes over 30 minutes on an H100 (every test compiles its kernels), more than one
# 10-minute device call: KS_GPU_TESTS="tests/test_norm.py tests/test_loss.py" picks files, and
# bench args such as "--budget 300 rms_norm softmax" bound the benchmarks.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
TUNE=0; QUICK=0
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in --tune) TUNE=1; shift;; --quick) QUICK=1; shift;; *) break;; esac
done
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
echo "== tests on the GPU"
SEL=${KS_GPU_TESTS:-tests}
if [[ $QUICK == 1 ]]; then TESTS="$SEL -x -q -k 'not float16'"; else TESTS="$SEL -q"; fi
eval $PY -m pytest $TESTS -p no:cacheprovider 2>&1 | tee "$OUT/tests.log" | tail -15
test_rc=${PIPESTATUS[0]}
if [[ $TUNE == 1 ]]; then
  echo "== norm tuning sweep"
  $PY scripts/norm_tune.py 2>&1 | tee "$OUT/tune.log"
fi
echo "== C ABI: every exported op through libkernelset.so vs the Python path (bitwise, time within 5%)"
$PY scripts/capi_gpu_check.py --json "$OUT/capi_gpu.json" 2>&1 | tee "$OUT/capi_gpu.log" | tail -30
capi_rc=${PIPESTATUS[0]}
echo "== benchmarks"
$PY -m kernelset bench "$@" --json "$OUT/bench.json" --png "$OUT/bench.png" 2>"$OUT/bench.err" | tee "$OUT/bench.log"
bench_rc=${PIPESTATUS[0]}
tail -3 "$OUT/bench.err"
echo "== tests rc=$test_rc capi rc=$capi_rc bench rc=$bench_rc"
exit $(( test_rc || capi_rc || bench_rc ))
