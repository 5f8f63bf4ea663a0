#!/usr/bin/env bash
# Builds what the static performance model (`xtask perf-model --build DIR`)
# should read: the kernels as a release build ships them. Every cuda/*.cu
# is compiled for sm_90a with device asserts off (-DNDEBUG, as build.rs does
# for release profiles) and the flags of buildscript/nvcc.rs, into
# OUT/<name>.fatbin, with every ptxas report in OUT/ptxas-report.txt.
# A debug build's fatbins keep `FTN_ASSERT`'s device asserts, whose
# __assertfail calls change the hot loops' code (e.g. the LayerNorm fused
# backward reloads the global-memory descriptor and moves it to uniform
# registers once per load: 52 R2UR against 2). Register spills are listed
# as warnings (CI's FTN_DENY_SPILLS build checks the debug fatbins; on
# 2026-12-04 one release kernel spills 8 bytes: docs/perf.md).
#
# Usage (from the repository root): NVCC=/path/to/nvcc scripts/perf_model_fatbins.sh OUT [JOBS]
set -euo pipefail
out=${1:?usage: perf_model_fatbins.sh OUT_DIR [JOBS]}
jobs=${2:-$(nproc)}
nvcc=${NVCC:-nvcc}
nvcc=$(command -v "$nvcc") || { echo "nvcc not found: set NVCC" >&2; exit 1; }
cccl="$(dirname "$nvcc")/../include/cccl"
mkdir -p "$out"
rm -f "$out"/*.fatbin "$out"/*.log "$out/ptxas-report.txt"
export nvcc cccl out
compile() {
  local src=$1 name
  name=$(basename "$src" .cu)
  # shellcheck disable=SC2086
  "$nvcc" -fatbin -O3 -std=c++17 -Xptxas -v -lineinfo -I cuda -DNDEBUG \
    $( [ -d "$cccl" ] && echo "-I $cccl" ) \
    -gencode arch=compute_90a,code=sm_90a \
    -o "$out/$name.fatbin" "$src" 2> "$out/$name.log" \
    || { cat "$out/$name.log" >&2; echo "nvcc failed on $src" >&2; return 1; }
}
export -f compile
printf '%s\n' cuda/*.cu | xargs -P "$jobs" -I{} bash -c 'compile "$1"' _ {}
cat "$out"/*.log > "$out/ptxas-report.txt"
rm -f "$out"/*.log
n=$(grep -c "Compiling entry function" "$out/ptxas-report.txt" || true)
echo "perf_model_fatbins: $n kernels compiled for sm_90a (asserts off) into $out"
awk '/Compiling entry function/ { k = $0; sub(/.*function ./, "", k); sub(/. for .*/, "", k) }
     /bytes spill (stores|loads)/ && ($5 != 0 || $9 != 0) { print "warning: register spills (asserts off): " k ": " $0 }' \
  "$out/ptxas-report.txt"
