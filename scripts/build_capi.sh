#!/usr/bin/env bash
# Builds libkernelset.so, the C ABI (capi/include/kernelset.h), into src/kernelset/capi/lib/ where
# ks.capi.library_path() finds it. Works on a machine without a GPU.
#
#   scripts/build_capi.sh [--set test|release|full|none] [--models a,b] [--jobs N]
#
# 1. capi/aot/generate.py compiles the package's Triton kernels ahead of time into capi/generated/
#    (set `test` by default: what the tests and the GPU smoke program run; `release`: plus the
#    shapes of every known model, or of the presets named by --models, on every known GPU; see
#    capi/aot/README.md for sizes). When Triton's NVIDIA
#    backend or ptxas is unusable here, the build says so and uses `--set none` (empty kernel
#    tables: CUDA tensors get KS_ERR_NOT_IMPLEMENTED, the CPU path is complete). A generator that
#    fails for any other reason fails the build.
# 2. gcc compiles capi/src/{core,ops,cuda}/*.c and capi/generated/*.c as C99 with every warning
#    an error, hidden visibility (only the ks_* API is exported) and --no-undefined, linking
#    nothing but libc/libdl/libpthread/libm (libcuda is dlopen'ed at run time).
# 3. The exported symbols are checked: anything but ks_* fails the build.
# Environment: PYTHON (needs torch and triton, as the package does; default: the project's .venv/bin/python
# when it exists, else python3), CC (gcc).
set -euo pipefail
cd "$(dirname "$0")/.."

SET=test
JOBS=""
MODELS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --set) SET="$2"; shift 2 ;;
    --jobs) JOBS="--jobs $2"; shift 2 ;;
    --models) MODELS="--models $2"; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "build_capi.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$SET" in test|release|full|none) ;; *) echo "build_capi.sh: --set must be test, release, full or none" >&2; exit 2 ;; esac

# The interpreter: PYTHON, else the project's venv (scripts/test.sh makes it; a bare `python3` outside it
# usually lacks torch and triton), else python3. One line says which when it was not asked for, and
# one line (no traceback) says what to do when it cannot import torch and triton.
if [ -n "${PYTHON:-}" ]; then
  PY="$PYTHON"; PY_FROM="PYTHON"
elif [ -x .venv/bin/python ]; then
  PY=.venv/bin/python; PY_FROM="the project's venv"
  echo "build_capi.sh: using .venv/bin/python (the project's venv; set PYTHON to use another)"
else
  PY=python3; PY_FROM="python3 on PATH, no .venv here"
fi
if ! py_err="$("$PY" -c 'import torch, triton' 2>&1)"; then
  py_err="$(printf '%s\n' "$py_err" | grep -v '^[[:space:]]*$' | tail -n 1)"
  echo "build_capi.sh: $PY ($PY_FROM) cannot import torch and triton (${py_err:-no message}); create the" \
       "project's venv (scripts/test.sh makes .venv) or set PYTHON to a python that has them" >&2
  exit 1
fi
CC="${CC:-gcc}"
GEN=capi/generated
LIBDIR=src/kernelset/capi/lib
LIB="$LIBDIR/libkernelset.so"

# Triton decides at import whether kernels are compiled or interpreted: the generator needs the
# real NVIDIA backend, so the interpreter flag of CPU test runs must not leak into it.
unset TRITON_INTERPRET

if [ "$SET" != none ]; then
  why="$("$PY" - <<'EOF'
try:
    from triton.backends import backends
    if "nvidia" not in backends:
        print("this Triton has no NVIDIA backend")
    else:
        from triton.backends.nvidia.compiler import get_ptxas
        for arch in (80, 90):
            get_ptxas(arch).path
except Exception as exc:
    print(f"Triton's NVIDIA backend/ptxas is not usable: {type(exc).__name__}: {exc}")
EOF
)"
  if [ -n "$why" ]; then
    echo "build_capi.sh: $why; building without CUDA kernels (--set none)" >&2
    SET=none
  fi
fi
# shellcheck disable=SC2086
"$PY" capi/aot/generate.py --set "$SET" --out "$GEN" $JOBS $MODELS

VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n 1)"
shopt -s nullglob
SRCS=(capi/src/core/*.c capi/src/ops/*.c capi/src/cuda/*.c "$GEN"/*.c)
shopt -u nullglob

mkdir -p "$LIBDIR"
TMP="$LIB.tmp.$$"
trap 'rm -f "$TMP"' EXIT
"$CC" -std=c99 -O2 -fPIC -fvisibility=hidden -Wall -Wextra -Werror \
  -DKS_VERSION_STRING="\"${VERSION:-unknown}\"" \
  -Icapi/include -Icapi/src/core -Icapi/src/cuda -I"$GEN" \
  -shared -Wl,--no-undefined -Wl,--as-needed -o "$TMP" "${SRCS[@]}" -ldl -lpthread -lm

bad="$(nm -D --defined-only "$TMP" | awk '{print $NF}' | grep -v '^ks_' || true)"
if [ -n "$bad" ]; then
  echo "build_capi.sh: symbols other than ks_* are exported:" >&2
  echo "$bad" >&2
  exit 1
fi
mv -f "$TMP" "$LIB" # a new inode: processes that loaded the old library keep it
trap - EXIT
echo "build_capi.sh: $LIB ($(nm -D --defined-only "$LIB" | grep -c ' T ks_') ks_* functions, kernels: --set $SET)"
