#!/usr/bin/env bash
# SASS check of the Hopper code: builds .ci/sm90_probe.cu (the building
# blocks of cuda/sm90.cuh) and cuda/gemm_sm90.cu (the wgmma + TMA GEMM) for
# sm_90a with $NVCC and requires HGMMA (wgmma), UTMALDG (TMA loads) and SYNCS
# (mbarrier) in their SASS, no register spills, no stack frame and no local
# memory (LDL/STL); prints the registers of each kernel. Needs no GPU.
# cuobjdump comes from $FTN_CI_CACHE/sass (installed by .ci/check_sass.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${FTN_CI_CACHE:-$PWD/.ci-cache}"
NVCC=${NVCC:-$CACHE/cuda/nvidia/cu13/bin/nvcc}
cuobjdump_bin=$(find -L "$CACHE/sass" -path '*/bin/cuobjdump' | head -n 1)
[[ -n "$cuobjdump_bin" ]] || { echo "check_sm90.sh: cuobjdump not found under $CACHE/sass (run .ci/check_sass.sh first)" >&2; exit 2; }
export PATH="$(dirname "$cuobjdump_bin"):$PATH"
work=$(mktemp -d "${TMPDIR:-/tmp}/ftn_sm90.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
# check NAME SOURCE: compile, then the ptxas and SASS requirements.
check() {
  local name=$1 src=$2
  "$NVCC" -cubin -O3 -std=c++20 -DNDEBUG -I"$(dirname "$NVCC")/../include/cccl" -Icuda -Iinclude \
    -arch=sm_90a -Xptxas -v -o "$work/$name.cubin" "$src" 2>"$work/$name.ptxas"
  cat "$work/$name.ptxas"
  if grep -E "[1-9][0-9]* bytes (spill (stores|loads)|stack frame)" "$work/$name.ptxas"; then
    echo "check_sm90.sh: FAIL: spills or a stack frame in $src" >&2; fail=1
  fi
  awk '/Compiling entry function/ { k = $7; gsub("\047", "", k) } /Used [0-9]+ registers/ { print "sm_90a " k ": " $5 " registers" }' \
    "$work/$name.ptxas"
  cuobjdump -sass "$work/$name.cubin" >"$work/$name.sass"
  local op n
  for op in HGMMA UTMALDG SYNCS; do
    n=$(grep -c "$op" "$work/$name.sass" || true)
    echo "sm_90a $name: $n $op instructions"
    [[ "$n" -gt 0 ]] || { echo "check_sm90.sh: FAIL: no $op in the SASS of $src" >&2; fail=1; }
  done
  if grep -qE "\b(LDL|STL)\b" "$work/$name.sass"; then
    echo "check_sm90.sh: FAIL: local memory (LDL/STL) in $src" >&2; fail=1
  fi
}
check probe .ci/sm90_probe.cu
check gemm_sm90 cuda/gemm_sm90.cu
exit $fail
