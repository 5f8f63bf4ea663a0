#!/usr/bin/env bash
# SASS check of the GEMM kernels (issue 4): every ftn_gemm_<tile>_* kernel
# must contain tensor-core instructions (HMMA) for sm_80 and sm_90a, and no
# kernel in the file may spill registers or use local memory.
#
#   .ci/check_sass.sh [FATBIN]
#
# With FATBIN (e.g. target/*/build/ferrotron-*/out/gemm.fatbin) it inspects
# that file; without, it builds cuda/gemm.cu with $NVCC (default: the nvcc
# of .ci/run's cache) for sm_80 and sm_90a with ptxas -v. cuobjdump and
# nvdisasm come from the nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm wheels,
# installed into $FTN_CI_CACHE/sass (default .ci-cache/sass) on first use.
# Prints, per kernel and arch: registers, local (spill) bytes, HMMA count.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE="${FTN_CI_CACHE:-$ROOT/.ci-cache}"
ARCHS=(sm_80 sm_90a)

tools="$CACHE/sass/nvidia/cu13/bin"
if [[ ! -x "$tools/cuobjdump" || ! -x "$tools/nvdisasm" ]]; then
  echo "== installing cuobjdump and nvdisasm into $CACHE/sass"
  python3 -m pip install -q --disable-pip-version-check --target "$CACHE/sass" \
    nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
fi
cuobjdump_bin=$(find -L "$CACHE/sass" -path '*/bin/cuobjdump' | head -n 1)
[[ -n "$cuobjdump_bin" ]] || { echo "check_sass.sh: cuobjdump not found under $CACHE/sass" >&2; exit 2; }
tools=$(dirname "$cuobjdump_bin")
export PATH="$tools:$PATH"  # cuobjdump -sass runs nvdisasm from PATH

work=$(mktemp -d "${TMPDIR:-/tmp}/ftn_sass.XXXXXX")
trap 'rm -rf "$work"' EXIT
fatbin=${1:-}
if [[ -z "$fatbin" ]]; then
  NVCC=${NVCC:-$CACHE/cuda/nvidia/cu13/bin/nvcc}
  [[ -x "$NVCC" ]] || { echo "check_sass.sh: no FATBIN given and no nvcc at $NVCC (set NVCC)" >&2; exit 2; }
  cccl=$(dirname "$NVCC")/../include/cccl
  fatbin="$work/gemm.fatbin"
  echo "== building cuda/gemm.cu with $NVCC"
  "$NVCC" -fatbin -O3 -std=c++17 -I"$cccl" -Icuda -Iinclude \
    -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a \
    -Xptxas -v -o "$fatbin" cuda/gemm.cu 2>"$work/ptxas.txt"
  if grep -E "[1-9][0-9]* bytes spill (stores|loads)" "$work/ptxas.txt"; then
    echo "check_sass.sh: FAIL: ptxas reports register spills" >&2
    exit 1
  fi
  echo "ptxas: $(grep -c 'bytes spill' "$work/ptxas.txt") kernel builds, none spill"
fi

fail=0
for arch in "${ARCHS[@]}"; do
  cuobjdump -sass -arch "$arch" "$fatbin" >"$work/$arch.sass"
  cuobjdump -res-usage -arch "$arch" "$fatbin" >"$work/$arch.res"
  # Split the SASS per function and count HMMA in each GEMM kernel.
  awk -v arch="$arch" '
    /Function : / { fn = $3; next }
    fn != "" && /HMMA/ { hmma[fn]++ }
    fn != "" { seen[fn] = 1 }
    END { for (f in seen) printf "%s %s %d\n", arch, f, hmma[f] + 0 }' "$work/$arch.sass" \
    | sort >"$work/$arch.hmma"
  n=$(grep -c " ftn_gemm_[0-9]" "$work/$arch.hmma" || true)
  if [[ "$n" -eq 0 ]]; then
    echo "check_sass.sh: FAIL: no ftn_gemm_<tile>_* kernels in the $arch SASS" >&2
    fail=1
  fi
  while read -r a f count; do
    res=$(grep -A1 "Function $f:" "$work/$arch.res" | tail -n 1)
    reg=$(sed -nE 's/.*REG:([0-9]+).*/\1/p' <<<"$res")
    loc=$(sed -nE 's/.*LOCAL:([0-9]+).*/\1/p' <<<"$res")
    printf "%-6s %-36s REG %-4s LOCAL %-4s HMMA %s\n" "$a" "$f" "${reg:-?}" "${loc:-?}" "$count"
    if [[ "$f" == ftn_gemm_[0-9]* && "$count" -eq 0 ]]; then
      echo "check_sass.sh: FAIL: $f has no HMMA for $a" >&2
      fail=1
    fi
    if [[ -n "$loc" && "$loc" -ne 0 ]]; then
      echo "check_sass.sh: FAIL: $f uses $loc bytes of local memory (spills) for $a" >&2
      fail=1
    fi
  done <"$work/$arch.hmma"
done
[[ $fail -eq 0 ]] || exit 1
echo "check_sass.sh: OK (HMMA in every GEMM kernel for ${ARCHS[*]}; no local memory)"
