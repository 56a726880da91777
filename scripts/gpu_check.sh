#!/usr/bin/env bash
# The one GPU job: the whole test suite on the GPU (gpu-marked tests included), the C ABI against
# the Python path, then the benchmarks. Writes logs, JSON and PNG under $OUT (default
# bench-out/DATE-TIME), appends the run's records to docs/benchmarks/results.jsonl (KS_RESULTS
# names another file) and prints a short table last. Usage: scripts/gpu_check.sh [--quick] [bench args...]
# The whole suite takes over 30 minutes on an H100 (every test compiles its kernels), more than one
# 10-minute device call: KS_GPU_TESTS="tests/test_norm.py tests/test_loss.py" picks files, and
# bench args such as "--budget 300 rms_norm softmax" bound the benchmarks. On a machine whose
# checkout is thrown away, bring $OUT back and import its JSON there (the last line says how).
set -uo pipefail
cd "$(dirname "$0")/.."
DAY=$(date -u +%Y-%m-%d)
OUT=${OUT:-bench-out/$DAY-$(date -u +%H%M%S)}
RESULTS=${KS_RESULTS:-docs/benchmarks/results.jsonl}
mkdir -p "$OUT"
rm -f "$OUT/bench.json" "$OUT/capi_gpu.json"  # a JSON left by an earlier run must not be imported again
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
QUICK=0
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in --quick) QUICK=1; shift;; *) break;; esac
done
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"

echo "== tests on the GPU"
SECONDS=0
SEL=${KS_GPU_TESTS:-tests}
if [[ $QUICK == 1 ]]; then TESTS="$SEL -x -q -k 'not float16'"; else TESTS="$SEL -q"; fi
eval $PY -m pytest $TESTS -p no:cacheprovider 2>&1 | tee "$OUT/tests.log" | tail -15
test_rc=${PIPESTATUS[0]}; test_s=$SECONDS

echo "== C ABI: every exported op through libkernelset.so vs the Python path (bitwise, time within 5%)"
SECONDS=0
$PY scripts/capi_gpu_check.py --json "$OUT/capi_gpu.json" 2>&1 | tee "$OUT/capi_gpu.log" | tail -30
capi_rc=${PIPESTATUS[0]}; capi_s=$SECONDS

echo "== benchmarks"
SECONDS=0
$PY -m kernelset bench "$@" --json "$OUT/bench.json" --png "$OUT/bench.png" 2>"$OUT/bench.err" | tee "$OUT/bench.log"
bench_rc=${PIPESTATUS[0]}; bench_s=$SECONDS
tail -3 "$OUT/bench.err"

echo "== results: append to $RESULTS"
JSONS=()
for f in "$OUT/bench.json" "$OUT/capi_gpu.json"; do [[ -s $f ]] && JSONS+=("$f"); done
if [[ ${#JSONS[@]} -gt 0 ]]; then
  # the C ABI check's JSON carries no date; the bench JSON has its own
  $PY -m kernelset.bench.history import "${JSONS[@]}" --results "$RESULTS" --date "$DAY" 2>&1 | tee "$OUT/import.log"
  import_rc=${PIPESTATUS[0]}
else
  echo "no JSON written" | tee "$OUT/import.log"; import_rc=1
fi

row() { printf '%-8s %4s %6s  %s\n' "$1" "$2" "$3" "${4:0:110}"; }
last() { grep -E "$2" "$1" 2>/dev/null | tail -1; }
echo
echo "== summary: $(head -2 "$OUT/gpu.txt" | tail -1 | cut -d, -f1), logs in $OUT"
row step rc time result
row tests "$test_rc" "${test_s}s" "$(tail -1 "$OUT/tests.log" | tr -d '=' | sed -E 's/^ +| +$//g')"
row capi "$capi_rc" "${capi_s}s" "$(last "$OUT/capi_gpu.log" '^capi_gpu_check: smoke' | sed 's/^capi_gpu_check: //')"
row bench "$bench_rc" "${bench_s}s" "$(last "$OUT/bench.log" '^fast_1 ' | sed -E \
  's/^fast_1 ([^ ]+) of ([0-9]+) cases.*strongest peer ([^;]+); bars met ([^;]+);.*correct: (.*)$/fast_1 \1 of \2, geomean \3, bars met \4, all correct: \5/')"
row results "$import_rc" "" "$(last "$OUT/import.log" 'records appended|no JSON')"
echo "into another checkout: python -m kernelset.bench.history import $OUT/bench.json $OUT/capi_gpu.json --date $DAY"
exit $(( test_rc || capi_rc || bench_rc || import_rc ))
