#!/usr/bin/env bash
# SASS check of the Hopper building blocks (cuda/sm90.cuh): builds
# .ci/sm90_probe.cu for sm_90a with $NVCC and requires HGMMA (wgmma),
# UTMALDG (TMA loads) and SYNCS (mbarrier) in its SASS, no register spills
# and no local memory. Needs no GPU. cuobjdump comes from $FTN_CI_CACHE/sass
# (installed by .ci/check_sass.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${FTN_CI_CACHE:-$PWD/.ci-cache}"
NVCC=${NVCC:-$CACHE/cuda/nvidia/cu13/bin/nvcc}
cuobjdump_bin=$(find -L "$CACHE/sass" -path '*/bin/cuobjdump' | head -n 1)
[[ -n "$cuobjdump_bin" ]] || { echo "check_sm90.sh: cuobjdump not found under $CACHE/sass (run .ci/check_sass.sh first)" >&2; exit 2; }
export PATH="$(dirname "$cuobjdump_bin"):$PATH"
work=$(mktemp -d "${TMPDIR:-/tmp}/ftn_sm90.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$NVCC" -cubin -O3 -std=c++20 -I"$(dirname "$NVCC")/../include/cccl" -Icuda -Iinclude \
  -arch=sm_90a -Xptxas -v -o "$work/probe.cubin" .ci/sm90_probe.cu 2>"$work/ptxas.txt"
cat "$work/ptxas.txt"
if grep -E "[1-9][0-9]* bytes (spill (stores|loads)|stack frame)" "$work/ptxas.txt"; then
  echo "check_sm90.sh: FAIL: spills or a stack frame" >&2; exit 1
fi
cuobjdump -sass "$work/probe.cubin" >"$work/probe.sass"
fail=0
for op in HGMMA UTMALDG SYNCS; do
  n=$(grep -c "$op" "$work/probe.sass" || true)
  echo "sm_90a probe: $n $op instructions"
  [[ "$n" -gt 0 ]] || { echo "check_sm90.sh: FAIL: no $op in the probe's SASS" >&2; fail=1; }
done
if grep -qE "\b(LDL|STL)\b" "$work/probe.sass"; then
  echo "check_sm90.sh: FAIL: local memory (LDL/STL) in the probe" >&2; fail=1
fi
exit $fail
